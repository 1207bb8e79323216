"""The batch coordinator materialised in one SQLite file (KIP-1164's reference state store).

KIP-1164 keeps coordinator state in SQLite because it must survive restarts, outgrow memory and
answer range queries ("batches of this log from offset N") fast. kcli runs a single coordinator
inside its embedded broker, so the SQLite file IS the source of truth here: every mutating
operation is one transaction, committed durably (WAL journal, synchronous=FULL) before it returns.
Schema and semantics: docs/batch-coordinator.md.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
import time
import uuid
import weakref
from contextlib import contextmanager
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

from kio.schema.errors import ErrorCode

from kcli import faults
from plugins.coordinator.base import AbortedTransaction, NO_SEQUENCE, NO_TIMESTAMP, TXN_COMMIT, TXN_DATA, UNKNOWN_OFFSET, BatchCoordinator, BatchInfo, BatchMetadata, CommitBatchRequest, CommitBatchResponse, CoordinatorException, CreateTopicAndPartitionsRequest, DeleteFilesRequest, DeleteRecordsRequest, DeleteRecordsResponse, FileInfo, FileToDelete, FindBatchRequest, FindBatchResponse, ListOffsetsRequest, ListOffsetsResponse, LogInfo, ProducerInfo, RetentionRequest, RetentionResult, TopicIdPartition, TopicStorageInfo, UploadIntent
from plugins.coordinator.producers import (
    ACCEPT,
    FRESH,
    INT32_MAX,
    PRODUCER_SNAPSHOT_INTERVAL_MS,
    PRODUCER_STATE_BATCHES,
    RING,
    RING_SLOT,
    Producer as _Producer,
    describe as describe_producer_states,
    fields_fit,
    replay,
    verdict,
)
from plugins.coordinator.shared import (
    TIMESTAMP_TYPES as _TIMESTAMP_TYPES,
    FetchBudget,
    already_committed,
    bad_batch,
    check_cluster_id,
    check_commit,
    check_file_state,
    check_intent_key,
    check_replacement,
    checkpoint_key as _checkpoint_key,
    delete_records_target,
    foreign_cluster,
    intent_gone,
    list_offsets_answer,
    not_a_partition,
    partition_rows,
    retention_cut,
    retention_nothing_to_do,
    sql_filters,
    topic_storage,
)
from plugins.coordinator.txn import TxnEvent, apply_events

SCHEMA_VERSION = 4
_PRODUCER_ID = attrgetter("producer_id")
_BYTE_SIZE = attrgetter("metadata.byte_size")

# Tables whose layout changed in version 2 are created under a suffix during a migration and
# renamed afterwards (SQLite's recommended way to change a table), hence the {t} placeholder.
_LOGS_DDL = """
CREATE TABLE IF NOT EXISTS logs{t} (
    log_id           INTEGER PRIMARY KEY AUTOINCREMENT,
    topic_id         TEXT    NOT NULL,
    partition        INTEGER NOT NULL,
    topic_name       TEXT    NOT NULL,
    log_start_offset INTEGER NOT NULL DEFAULT 0,
    high_watermark   INTEGER NOT NULL DEFAULT 0,
    byte_size        INTEGER NOT NULL DEFAULT 0
)"""
_BATCHES_DDL = """
CREATE TABLE IF NOT EXISTS batches{t} (
    log_id              INTEGER NOT NULL,
    last_offset         INTEGER NOT NULL,
    base_offset         INTEGER NOT NULL,
    file_id             INTEGER NOT NULL,
    byte_offset         INTEGER NOT NULL,
    byte_size           INTEGER NOT NULL,
    log_append_time     INTEGER NOT NULL,
    batch_max_timestamp INTEGER NOT NULL,
    timestamp_type      INTEGER NOT NULL,
    producer_id         INTEGER NOT NULL,
    producer_epoch      INTEGER NOT NULL,
    base_sequence       INTEGER NOT NULL,
    last_sequence       INTEGER NOT NULL,
    batch_id            INTEGER NOT NULL,
    PRIMARY KEY (log_id, last_offset)
) WITHOUT ROWID"""
_PRODUCER_STATE_DDL = """
CREATE TABLE IF NOT EXISTS producer_state{t} (
    log_id         INTEGER NOT NULL REFERENCES logs{t} (log_id) ON DELETE CASCADE,
    producer_id    INTEGER NOT NULL,
    producer_epoch INTEGER NOT NULL,
    batches        BLOB    NOT NULL,
    PRIMARY KEY (log_id, producer_id)
) WITHOUT ROWID"""
_FILE_LOGS_DDL = """
CREATE TABLE IF NOT EXISTS file_logs (
    file_id         INTEGER NOT NULL REFERENCES files (file_id) ON DELETE CASCADE,
    log_id          INTEGER NOT NULL,
    min_last_offset INTEGER NOT NULL,
    max_last_offset INTEGER NOT NULL,
    PRIMARY KEY (file_id, log_id)
) WITHOUT ROWID"""
_FILES_DDL = """
CREATE TABLE IF NOT EXISTS files (
    file_id                INTEGER PRIMARY KEY,
    object_key             TEXT    NOT NULL UNIQUE,
    uploader               INTEGER NOT NULL,
    file_size              INTEGER NOT NULL,
    used_size              INTEGER NOT NULL,
    state                  TEXT    NOT NULL CHECK (state IN ('uploaded', 'deleting')),
    committed_at           INTEGER NOT NULL,
    marked_for_deletion_at INTEGER,
    next_batch_id          INTEGER NOT NULL DEFAULT 1,
    producer_batches       INTEGER NOT NULL DEFAULT 0
)"""
_FILE_TOPICS_DDL = """
CREATE TABLE IF NOT EXISTS file_topics (
    file_id         INTEGER NOT NULL REFERENCES files (file_id) ON DELETE CASCADE,
    topic_id        TEXT    NOT NULL,
    topic_name      TEXT    NOT NULL,
    committed_bytes INTEGER NOT NULL,
    live_bytes      INTEGER NOT NULL,
    PRIMARY KEY (file_id, topic_id)
) WITHOUT ROWID"""
# Version 3: a broker records its intent to upload an object before the PUT (see UploadIntent);
# commit_file deletes the row, so the table holds only uploads in flight or abandoned.
_UPLOAD_INTENTS_DDL = """
CREATE TABLE IF NOT EXISTS upload_intents (
    object_key TEXT    PRIMARY KEY,
    broker_id  INTEGER NOT NULL,
    created_at INTEGER NOT NULL
) WITHOUT ROWID"""
# Version 4: transactions of diskless partitions (plugins/coordinator/txn.py). Open ones by
# (log, producer); aborted ranges by the ABORT marker's offset, so a fetch reads those at or
# above its offset.
_TXN_DDL = (
    """CREATE TABLE IF NOT EXISTS txn_open (
    log_id       INTEGER NOT NULL REFERENCES logs (log_id) ON DELETE CASCADE,
    producer_id  INTEGER NOT NULL,
    first_offset INTEGER NOT NULL,
    PRIMARY KEY (log_id, producer_id)
) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS txn_aborted (
    log_id       INTEGER NOT NULL REFERENCES logs (log_id) ON DELETE CASCADE,
    last_offset  INTEGER NOT NULL,
    producer_id  INTEGER NOT NULL,
    first_offset INTEGER NOT NULL,
    PRIMARY KEY (log_id, last_offset)
) WITHOUT ROWID""",
)
_INDEXES = (
    "CREATE UNIQUE INDEX IF NOT EXISTS logs_by_partition ON logs (topic_id, partition)",
    "CREATE INDEX IF NOT EXISTS files_by_state ON files (state, marked_for_deletion_at)",
    "CREATE INDEX IF NOT EXISTS file_topics_by_topic ON file_topics (topic_id)",
)
SCHEMA: tuple[str, ...] = (
    "CREATE TABLE IF NOT EXISTS kcli_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    _LOGS_DDL.format(t=""),
    _FILES_DDL,
    _BATCHES_DDL.format(t=""),
    _FILE_LOGS_DDL,
    _FILE_TOPICS_DDL,
    _PRODUCER_STATE_DDL.format(t=""),
    _UPLOAD_INTENTS_DDL,
    *_TXN_DDL,
    *_INDEXES,
)

_INSERT_BATCH = (
    "INSERT INTO batches (log_id, last_offset, base_offset, file_id, byte_offset, byte_size, log_append_time,"
    " batch_max_timestamp, timestamp_type, producer_id, producer_epoch, base_sequence, last_sequence, batch_id)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_BATCH_COLUMNS = (
    "b.batch_id, f.object_key, b.byte_offset, b.byte_size, b.base_offset, b.last_offset, b.log_append_time,"
    " b.batch_max_timestamp, b.timestamp_type, b.producer_id, b.producer_epoch, b.base_sequence, b.last_sequence"
)
# The batches of one object: its file_logs rows bound each log's offset range (a commit gives a
# log's batches consecutive offsets), the file_id test keeps the join exact whatever the ranges.
_FILE_BATCHES = (
    "file_logs fl JOIN batches b ON b.log_id = fl.log_id"
    " AND b.last_offset BETWEEN fl.min_last_offset AND fl.max_last_offset AND b.file_id = fl.file_id"
)
# Kafka reports the append time as the batch timestamp under LogAppendTime.
_EFFECTIVE_TS = "(CASE WHEN timestamp_type = 1 THEN log_append_time ELSE batch_max_timestamp END)"

F = TypeVar("F", bound=Callable[..., Any])


def _guarded(func: F) -> F:
    """One lock per coordinator, and SQLite errors surface as CoordinatorException (the
    transaction rolled back: nothing changed)."""

    @functools.wraps(func)
    def wrapper(self: "SqliteBatchCoordinator", *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            try:
                return func(self, *args, **kwargs)
            except (sqlite3.Error, OverflowError) as err:  # OverflowError: an int SQLite cannot store
                raise CoordinatorException(f"{func.__name__} failed on {self._path}: {err}") from None

    return wrapper  # type: ignore[return-value]


class _Log:
    """A cached ``logs`` row (write path). Not a dataclass: hashing by identity is wanted."""

    __slots__ = ("log_id", "topic_id", "topic_name", "log_start_offset", "high_watermark", "byte_size")

    def __init__(self, log_id: int, topic_id: str, topic_name: str, log_start_offset: int, high_watermark: int,
                 byte_size: int) -> None:
        self.log_id = log_id
        self.topic_id = topic_id
        self.topic_name = topic_name
        self.log_start_offset = log_start_offset
        self.high_watermark = high_watermark
        self.byte_size = byte_size


class _ProducerStates:
    """Idempotence state of every (log, producer id), like Kafka's ProducerStateManager.

    Kept in memory and persisted the way Kafka does it: the ``producer_state`` table is a
    snapshot taken as of batch id ``producer_snapshot_batch_id``; loading reads the snapshot
    and replays the (idempotent) batches committed after it. Commits therefore write no
    producer rows at all: one row per producer and commit would land on as many random B-tree
    pages as there are producers. Snapshots are written at most every
    PRODUCER_SNAPSHOT_INTERVAL_MS by a commit, before batches are deleted (so state outlives
    the data, as in Kafka), and on close. ``map`` is log_id → producer id → state; ``dirty``
    holds the log ids whose producers changed since the last snapshot.
    """

    def __init__(self) -> None:
        self.map: dict[int, dict[int, _Producer]] | None = None
        self.dirty: set[int] = set()
        self.snapshot_at_ms = 0

    def reset(self) -> None:
        self.map = None
        self.dirty = set()

    def loaded(self, db: sqlite3.Connection, now_ms: int) -> dict[int, dict[int, _Producer]]:
        if self.map is None:
            states: dict[int, dict[int, _Producer]] = {}
            for log_id, pid, epoch, blob in db.execute(
                    "SELECT log_id, producer_id, producer_epoch, batches FROM producer_state"):
                states.setdefault(log_id, {})[pid] = _Producer.decode(epoch, blob)
            row = db.execute("SELECT value FROM kcli_meta WHERE key = 'producer_snapshot_batch_id'").fetchone()
            snapshot_id = int(row[0]) if row else 0
            # Objects with idempotent batches committed after the snapshot, found newest first
            # (next_batch_id grows with file_id): only their batches are read.
            files = []
            for file_id, next_batch_id, producer_batches in db.execute(
                    "SELECT file_id, next_batch_id, producer_batches FROM files ORDER BY file_id DESC"):
                if next_batch_id - 1 <= snapshot_id:
                    break
                if producer_batches:
                    files.append(file_id)
            files.reverse()  # replay oldest first; within a chunk, ORDER BY batch_id
            dirty = set()
            for chunk in range(0, len(files), 500):
                ids = files[chunk:chunk + 500]
                for log_id, pid, epoch, base_seq, last_seq, base, last, append_time in db.execute(
                    "SELECT b.log_id, b.producer_id, b.producer_epoch, b.base_sequence, b.last_sequence,"
                    f" b.base_offset, b.last_offset, b.log_append_time FROM {_FILE_BATCHES}"
                    f" WHERE fl.file_id IN ({','.join('?' * len(ids))}) AND b.batch_id > ? AND b.producer_id >= 0"
                    " ORDER BY b.batch_id",
                    (*ids, snapshot_id),
                ):
                    replay(states.setdefault(log_id, {}), pid, epoch, base_seq, last_seq, base, last, append_time)
                    dirty.add(log_id)
            self.map, self.dirty, self.snapshot_at_ms = states, dirty, now_ms
        return self.map

    def snapshot(self, db: sqlite3.Connection, now_ms: int, last_batch_id: int) -> None:
        """Persist the producers of logs changed since the last snapshot (as of ``last_batch_id``),
        inside the caller's transaction."""
        states = self.loaded(db, now_ms)
        if self.dirty:
            db.executemany(
                "INSERT OR REPLACE INTO producer_state (log_id, producer_id, producer_epoch, batches)"
                " VALUES (?, ?, ?, ?)",
                [(log_id, pid, producer.epoch, producer.encode())
                 for log_id in self.dirty for pid, producer in states.get(log_id, {}).items()],
            )
            db.execute(
                "INSERT OR REPLACE INTO kcli_meta (key, value) VALUES ('producer_snapshot_batch_id', ?)",
                (str(last_batch_id),),
            )
            self.dirty = set()
        self.snapshot_at_ms = now_ms

    def drop(self, db: sqlite3.Connection, log_id: int) -> None:
        """Forget the producers of a deleted log, in memory and on disk."""
        db.execute("DELETE FROM producer_state WHERE log_id = ?", (log_id,))
        if self.map is not None:
            self.map.pop(log_id, None)
        self.dirty.discard(log_id)


def _schema_version(db: sqlite3.Connection) -> int | None:
    try:
        row = db.execute("SELECT value FROM kcli_meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.OperationalError:
        return None
    return None if row is None else int(row[0])


def _migrate_v1(db: sqlite3.Connection) -> None:
    """Schema 1 → 2 inside the caller's transaction (foreign keys off, as SQLite requires for
    rebuilding tables): logs get an integer log_id, batches are clustered by (log_id,
    last_offset) and keep their batch ids, objects get file_logs rows and a batch id counter.
    Any row that would not carry over aborts the migration instead of being dropped."""
    db.execute(_LOGS_DDL.format(t="_v2"))
    db.execute(
        "INSERT INTO logs_v2 (topic_id, partition, topic_name, log_start_offset, high_watermark, byte_size)"
        " SELECT topic_id, partition, topic_name, log_start_offset, high_watermark, byte_size FROM logs"
        " ORDER BY topic_name, topic_id, partition"
    )
    db.execute(_BATCHES_DDL.format(t="_v2"))
    db.execute(
        "INSERT INTO batches_v2 SELECT l.log_id, b.last_offset, b.base_offset, b.file_id, b.byte_offset, b.byte_size,"
        " b.log_append_time, b.batch_max_timestamp, b.timestamp_type, b.producer_id, b.producer_epoch,"
        " b.base_sequence, b.last_sequence, b.batch_id"
        " FROM batches b JOIN logs_v2 l ON l.topic_id = b.topic_id AND l.partition = b.partition"
    )
    db.execute(_PRODUCER_STATE_DDL.format(t="_v2"))
    db.execute(
        "INSERT INTO producer_state_v2 SELECT l.log_id, p.producer_id, p.producer_epoch, p.batches"
        " FROM producer_state p JOIN logs_v2 l ON l.topic_id = p.topic_id AND l.partition = p.partition"
    )
    for old, new in (("batches", "batches_v2"), ("producer_state", "producer_state_v2")):
        before, after = (db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in (old, new))
        if before != after:
            raise sqlite3.DatabaseError(
                f"cannot migrate schema 1 to 2: {before - after} {old} row(s) belong to no log")
    # Every object gets the batch id counter as it stood after its commit (ids grew with file ids).
    db.execute("ALTER TABLE files ADD COLUMN next_batch_id INTEGER NOT NULL DEFAULT 1")
    db.execute("ALTER TABLE files ADD COLUMN producer_batches INTEGER NOT NULL DEFAULT 0")
    counter = 1
    updates = []
    for file_id, max_batch_id, producer_batches in db.execute(
            "SELECT file_id, (SELECT MAX(batch_id) FROM batches b WHERE b.file_id = f.file_id),"
            " (SELECT COUNT(*) FROM batches b WHERE b.file_id = f.file_id AND b.producer_id >= 0) FROM files f"
            " ORDER BY file_id").fetchall():
        counter = max(counter, (max_batch_id or 0) + 1)
        updates.append((counter, producer_batches, file_id))
    db.executemany("UPDATE files SET next_batch_id = ?, producer_batches = ? WHERE file_id = ?", updates)
    row = db.execute("SELECT MAX(seq) FROM sqlite_sequence WHERE name = 'batches'").fetchone()
    floor = max(counter, (row[0] or 0) + 1)
    db.execute(_FILE_LOGS_DDL)
    db.execute(
        "INSERT INTO file_logs SELECT file_id, log_id, MIN(last_offset), MAX(last_offset) FROM batches_v2"
        " GROUP BY file_id, log_id"
    )
    for table in ("batches", "producer_state", "logs"):
        db.execute(f"DROP TABLE {table}")
    for table in ("logs", "batches", "producer_state"):
        db.execute(f"ALTER TABLE {table}_v2 RENAME TO {table}")
    for statement in _INDEXES:
        db.execute(statement)
    db.execute("INSERT OR REPLACE INTO kcli_meta (key, value) VALUES ('next_batch_id', ?)", (str(floor),))
    db.execute("UPDATE kcli_meta SET value = '2' WHERE key = 'schema_version'")
    problems = db.execute("PRAGMA foreign_key_check").fetchall()
    if problems:
        raise sqlite3.DatabaseError(f"cannot migrate schema 1 to 2: foreign key violations {problems[:3]}")


def _migrate_v2(db: sqlite3.Connection) -> None:
    """Schema 2 → 3 inside the caller's transaction: only adds the upload_intents table (objects
    uploaded before it have no intent, so they become "unknown objects": reported, never
    collected automatically)."""
    db.execute(_UPLOAD_INTENTS_DDL)
    db.execute("UPDATE kcli_meta SET value = '3' WHERE key = 'schema_version'")


def _migrate_v3(db: sqlite3.Connection) -> None:
    """Schema 3 → 4 inside the caller's transaction: adds the transaction tables (empty: no
    transactional batch could reach a diskless partition before)."""
    for statement in _TXN_DDL:
        db.execute(statement)
    db.execute("UPDATE kcli_meta SET value = '4' WHERE key = 'schema_version'")


def _migrate(db: sqlite3.Connection, version: int) -> None:
    """Every step from ``version`` to SCHEMA_VERSION, in the caller's transaction."""
    if version == 1:
        _migrate_v1(db)
        version = 2
    if version == 2:
        _migrate_v2(db)
        version = 3
    if version == 3:
        _migrate_v3(db)


class _Checkpointer:
    """Copies the WAL back into the database from a second connection, off the commit path, and
    makes SQLite restart the WAL under sustained load.

    SQLite's automatic checkpoint runs inside whichever COMMIT crosses the threshold, adding the
    copy and the database fsync to that commit's latency; this thread does it between commits.
    But SQLite writes the WAL from its start again only when a write transaction begins with
    every frame copied, which never happens while commits follow each other (the copy trails
    the newest commit): the WAL grew to the auto-checkpoint threshold, every commit extending
    the file (an extending fdatasync also commits the file system's journal), and the COMMIT
    crossing it paid the foreground checkpoint (~5 ms, every ~55th commit of the bench). So once
    a pass finds RESTART_FRAMES in the WAL, the thread copies what is left while holding the
    coordinator's lock (no commit in between: the frames of a commit or two, ~2 ms), and the
    next commit restarts the WAL, overwriting blocks the file already has. Every copy is SQLite's
    own PASSIVE checkpoint, synced as always: what a crash leaves behind is unchanged. The
    auto-checkpoint stays as a fallback (e.g. for another process writing the same file)."""

    MIN_INTERVAL_S = 0.05
    RESTART_FRAMES = 4096  # 16 MiB of 4 KiB pages
    # The WAL file keeps its size across restarts (rewriting allocated blocks is cheaper than
    # growing the file); what a burst leaves beyond this is truncated at the next restart.
    SIZE_LIMIT = 64 << 20

    def __init__(self, path: str, lock: threading.RLock) -> None:
        self._path = path
        self._lock = lock
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kcli-coordinator-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False, timeout=30.0)
        except sqlite3.Error:
            return
        try:
            db.execute("PRAGMA synchronous=FULL")
            while True:
                self._wake.wait()
                if self._stop.is_set():
                    return
                self._wake.clear()
                try:
                    frames = self._checkpoint(db)
                    if frames >= self.RESTART_FRAMES:
                        self._checkpoint(db)  # what was committed during the first pass, still unlocked
                        if self._acquire():
                            try:
                                self._checkpoint(db)
                            finally:
                                self._lock.release()
                except sqlite3.Error:
                    pass  # busy or failing: the main connection's auto-checkpoint still bounds the WAL
                if self._stop.wait(self.MIN_INTERVAL_S):
                    return
        finally:
            db.close()

    @staticmethod
    def _checkpoint(db: sqlite3.Connection) -> int:
        """One PASSIVE checkpoint; the WAL's frame count (-1 when it was busy)."""
        busy, frames, _copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return -1 if busy else frames

    def _acquire(self) -> bool:
        """The coordinator's lock, unless stop() is called meanwhile (close() holds the lock
        while it joins this thread)."""
        while not self._stop.is_set():
            if self._lock.acquire(timeout=0.05):
                return True
        return False

    def poke(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join()


class SqliteBatchCoordinator(BatchCoordinator):
    """KIP-1164 BatchCoordinator over SQLite. Config key: ``path`` (the database file).

    Thread-safe: one connection guarded by one lock, so a broker worker thread and inspection
    commands in the same process can share an instance.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        read_only: bool = False,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self._path: str = "<unconfigured>"
        self._read_only = read_only
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        # Write-path state in memory (log rows, producer state, the batch id counter), valid while
        # no other connection writes: PRAGMA data_version tells us when one did. Dropped on any
        # failed transaction.
        self._logs: dict[tuple[str, int], _Log | None] = {}
        # The same entries by the identity of the caller's TopicIdPartition objects (kept
        # referenced, so an id cannot be reused): brokers reuse one per partition.
        self._logs_by_tip: dict[int, tuple[object, _Log | None]] = {}
        self._producers = _ProducerStates()
        self._next_batch_id: int | None = None
        self._data_version: int | None = None
        self._checkpointer: _Checkpointer | None = None
        if path is not None:
            self._open(Path(path))

    # -- lifecycle ------------------------------------------------------------------------------

    def configure(self, configs: dict[str, str]) -> None:
        unknown = set(configs) - {"path"}
        if unknown:
            raise CoordinatorException(f"unknown SqliteBatchCoordinator config(s): {', '.join(sorted(unknown))}")
        if not configs.get("path"):
            raise CoordinatorException("SqliteBatchCoordinator needs config path (the SQLite database file)")
        with self._lock:
            self.close()
            self._open(Path(configs["path"]))

    def _open(self, path: Path) -> None:
        path = path.absolute()
        self._path = str(path)
        try:
            if self._read_only:
                if not path.is_file():
                    raise CoordinatorException(f"coordinator database {path} does not exist")
                db = sqlite3.connect(
                    f"{path.as_uri()}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
                )
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
        except (OSError, sqlite3.Error) as err:
            raise CoordinatorException(f"cannot open coordinator database {path}: {err}") from None
        try:
            if not self._read_only:
                mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise CoordinatorException(f"coordinator database {path}: cannot enable WAL journal ({mode})")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA cache_size=-65536")  # 64 MiB: keep the hot index pages in memory
            # A fallback only (see _Checkpointer): the checkpoint would run inside a COMMIT.
            db.execute(f"PRAGMA wal_autocheckpoint={4 * _Checkpointer.RESTART_FRAMES}")
            db.execute(f"PRAGMA journal_size_limit={_Checkpointer.SIZE_LIMIT}")
            if self._read_only:
                version = _schema_version(db)
                if version is not None and version < SCHEMA_VERSION:
                    db = self._migrated_copy(db, version)
                self._check_schema(db)
            else:
                self._create_or_migrate(db)
            db.execute("PRAGMA foreign_keys=ON")
        except sqlite3.DatabaseError as err:
            db.close()
            raise CoordinatorException(f"{path} is not a usable coordinator database: {err}") from None
        except BaseException:
            db.close()
            raise
        self._db = db
        if not self._read_only:
            self._checkpointer = _Checkpointer(self._path, self._lock)
            # A coordinator dropped without close() must not leave its thread behind.
            self._finalizer = weakref.finalize(self, self._checkpointer.stop)

    def _create_or_migrate(self, db: sqlite3.Connection) -> None:
        """Create the schema, or migrate an older one, in one IMMEDIATE transaction (so two
        processes opening one old file do not both migrate it). Foreign keys stay off until
        the end: rebuilding a referenced table with them on would cascade deletes."""
        db.execute("PRAGMA foreign_keys=OFF")
        db.execute("BEGIN IMMEDIATE")
        try:
            version = _schema_version(db)
            if version is not None and version < SCHEMA_VERSION:
                _migrate(db, version)
            elif version is None:
                for statement in SCHEMA:
                    db.execute(statement)
                db.execute("INSERT OR IGNORE INTO kcli_meta (key, value) VALUES ('schema_version', ?)",
                           (str(SCHEMA_VERSION),))
            self._check_schema(db)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    @staticmethod
    def _migrated_copy(db: sqlite3.Connection, version: int) -> sqlite3.Connection:
        """A read-only open of an older database: inspect a migrated in-memory copy (the file
        is never written; the first read-write open migrates it for good)."""
        copy = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        try:
            db.backup(copy)
            db.close()
            copy.execute("PRAGMA foreign_keys=OFF")
            copy.execute("BEGIN")
            _migrate(copy, version)
            copy.execute("COMMIT")
        except BaseException:
            copy.close()
            raise
        return copy

    @staticmethod
    def _check_schema(db: sqlite3.Connection) -> None:
        version = _schema_version(db)
        if version is None:
            raise sqlite3.DatabaseError("not a kcli coordinator database (no schema version)")
        if version != SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"schema version {version}, this kcli understands {SCHEMA_VERSION}")

    def close(self) -> None:
        with self._lock:
            if self._db is not None and not self._read_only and self._producers.dirty:
                try:  # a clean shutdown leaves nothing to replay
                    with self._tx() as db:
                        self._producers.snapshot(db, self._clock(), self._batch_counter(db) - 1)
                except (sqlite3.Error, CoordinatorException):
                    pass  # the next open replays instead
            self._invalidate()
            checkpointer, self._checkpointer = self._checkpointer, None
            if checkpointer is not None:
                self._finalizer.detach()
                checkpointer.stop()
            db, self._db = self._db, None
            if db is not None:
                db.close()

    @property
    def path(self) -> str:
        return self._path

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise CoordinatorException("SqliteBatchCoordinator is not open: configure path first")
        return self._db

    def _invalidate(self) -> None:
        self._logs.clear()
        self._logs_by_tip.clear()
        self._producers.reset()
        self._next_batch_id = None
        self._data_version = None

    def _forget_logs(self) -> None:
        self._logs.clear()
        self._logs_by_tip.clear()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: concurrent writers (another process) wait instead of failing.

        In-memory state is dropped when another connection has committed since we last looked,
        and after any failure (memory may be ahead of the rolled-back database)."""
        db = self._conn()
        if self._read_only:  # also covers a migrated in-memory copy, which SQLite would let us write
            raise sqlite3.OperationalError("attempt to write a readonly database")
        db.execute("BEGIN IMMEDIATE")
        try:
            version = db.execute("PRAGMA data_version").fetchone()[0]
            if version != self._data_version:
                self._invalidate()
                self._data_version = version
            yield db
            db.execute("COMMIT")
        except BaseException:
            self._invalidate()
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    # -- helpers -------------------------------------------------------------------------------

    def _batch_counter(self, db: sqlite3.Connection) -> int:
        """The next batch id. Each object row records the counter after its commit; kcli_meta
        keeps a floor for when the newest objects have been deleted. Ids are never reused."""
        if self._next_batch_id is None:
            row = db.execute("SELECT value FROM kcli_meta WHERE key = 'next_batch_id'").fetchone()
            last = db.execute("SELECT next_batch_id FROM files ORDER BY file_id DESC LIMIT 1").fetchone()
            self._next_batch_id = max(int(row[0]) if row else 1, last[0] if last else 1)
        return self._next_batch_id

    @staticmethod
    def _end_intent(db: sqlite3.Connection, object_key: str, require_intent: bool) -> None:
        """The upload intent ends with the commit (one primary-key delete in a tiny table);
        ``require_intent``: refused if it was claimed as an orphan meanwhile."""
        gone = db.execute("DELETE FROM upload_intents WHERE object_key = ?", (object_key,)).rowcount == 0
        if require_intent and gone:
            raise intent_gone(object_key)

    @staticmethod
    def _log_row(db: sqlite3.Connection, topic_id: str, partition: int) -> tuple | None:
        """(log_id, topic_name, log_start_offset, high_watermark, byte_size) or None."""
        return db.execute(
            "SELECT log_id, topic_name, log_start_offset, high_watermark, byte_size FROM logs"
            " WHERE topic_id = ? AND partition = ?",
            (topic_id, partition),
        ).fetchone()

    def _delete_batches(self, db: sqlite3.Connection, log_id: int, topic_id: str, below: int | None, now: int,
                        update_logs: bool = True) -> tuple[int, int]:
        """Delete the log's batches (those with last_offset < ``below``, or all) and keep every
        derived size right: files' used size, per-topic live bytes, the log's byte size;
        objects left empty are marked 'deleting'. Aborted transactions that end below ``below``
        go too: no fetch can overlap them any more (Kafka drops a .txnindex with its segment)."""
        where, params = ("log_id = ?", (log_id,)) if below is None else \
            ("log_id = ? AND last_offset < ?", (log_id, below))
        if below is not None:
            db.execute(f"DELETE FROM txn_aborted WHERE {where}", params)
        per_file = db.execute(
            f"SELECT file_id, SUM(byte_size), COUNT(*) FROM batches WHERE {where} GROUP BY file_id", params
        ).fetchall()
        if not per_file:
            return 0, 0
        freed = sum(row[1] for row in per_file)
        if update_logs:
            # The log lives on, so must its producers' idempotence state: snapshot it before
            # the batches it was replayed from disappear.
            self._producers.snapshot(db, now, self._batch_counter(db) - 1)
            db.execute("UPDATE logs SET byte_size = byte_size - ? WHERE log_id = ?", (freed, log_id))
        db.execute(f"DELETE FROM batches WHERE {where}", params)
        db.executemany(
            "UPDATE file_topics SET live_bytes = live_bytes - ? WHERE file_id = ? AND topic_id = ?",
            [(size, file_id, topic_id) for file_id, size, _ in per_file],
        )
        db.executemany("UPDATE files SET used_size = used_size - ? WHERE file_id = ?",
                       [(size, file_id) for file_id, size, _ in per_file])
        db.executemany(
            "UPDATE files SET state = 'deleting', marked_for_deletion_at = ?"
            " WHERE file_id = ? AND used_size = 0 AND state = 'uploaded'",
            [(now, file_id) for file_id, _, _ in per_file],
        )
        return sum(row[2] for row in per_file), freed

    def _drop_log(self, db: sqlite3.Connection, log_id: int, topic_id: str, now: int) -> int:
        """Delete one log with its batches and producer state; returns the batches deleted.
        Its file_logs rows stay until their objects go (they match no batch any more)."""
        count, _ = self._delete_batches(db, log_id, topic_id, None, now, update_logs=False)
        self._producers.drop(db, log_id)
        db.execute("DELETE FROM kcli_meta WHERE key = ?", (_checkpoint_key(log_id),))
        db.execute("DELETE FROM logs WHERE log_id = ?", (log_id,))
        return count

    @staticmethod
    def _batch_info(row: tuple, tip: TopicIdPartition) -> BatchInfo:
        (batch_id, object_key, byte_offset, byte_size, base, last, append_time, max_ts, ts_type,
         pid, epoch, base_seq, last_seq) = row
        return BatchInfo(
            batch_id,
            object_key,
            BatchMetadata(tip, byte_offset, byte_size, base, last, append_time, max_ts, ts_type, pid, epoch,
                          base_seq, last_seq),
        )

    # -- KIP-1164 operations -------------------------------------------------------------------

    @_guarded
    def create_topic_and_partitions(self, requests: Iterable[CreateTopicAndPartitionsRequest]) -> None:
        rows = [(str(tid), p, name) for tid, p, name in partition_rows(requests)]
        with self._tx() as db:
            db.executemany("INSERT OR IGNORE INTO logs (topic_id, partition, topic_name) VALUES (?, ?, ?)", rows)
            self._forget_logs()  # partitions cached as unknown may exist now

    @_guarded
    def commit_file(
        self,
        object_key: str,
        uploader_broker_id: int,
        file_size: int,
        batches: list[CommitBatchRequest],
        *,
        require_intent: bool = False,
    ) -> list[CommitBatchResponse]:
        check_commit(object_key, file_size)
        now = self._clock()
        with self._tx() as db:
            # Both read the newest object rows: before this object's row exists.
            first_batch_id = batch_id = self._batch_counter(db)
            idempotent = max(map(_PRODUCER_ID, batches), default=-1) >= 0
            producers = self._producers.loaded(db, now) if idempotent else {}
            self._end_intent(db, object_key, require_intent)
            try:
                file_id = db.execute(
                    "INSERT INTO files (object_key, uploader, file_size, used_size, state, committed_at,"
                    " next_batch_id) VALUES (?, ?, ?, 0, 'uploaded', ?, ?)",
                    (object_key, uploader_broker_id, file_size, now, first_batch_id),
                ).lastrowid
            except sqlite3.IntegrityError:
                raise already_committed(object_key) from None
            dirty = self._producers.dirty
            # The loop runs once per batch, so it works on locals: the current log's high watermark
            # and byte size live in variables until the partition changes (brokers send an object's
            # batches grouped by partition). Logs are found by the request's TopicIdPartition object
            # identity: hashing it (UUID included) costs more than the rest of the loop.
            by_tip = self._logs_by_tip
            if len(by_tip) > 100_000:  # callers that make new TopicIdPartitions per request
                by_tip.clear()
            started: dict[int, tuple[_Log, int, int]] = {}  # log_id → (log, hwm, byte size) before
            responses: list[CommitBatchResponse] = []
            rows: list[tuple] = []
            respond = responses.append
            add_row = rows.append
            response = CommitBatchResponse
            ts_types = _TIMESTAMP_TYPES
            prev_tip: object = None
            ring_pack, ring_slot, ring_batches = RING.pack_into, RING_SLOT, PRODUCER_STATE_BATCHES
            producer_batches = 0
            log: _Log | None = None
            log_id = lso = hwm = log_bytes = 0
            per_log: dict[int, _Producer] = {}
            txn_events: list[TxnEvent] = []
            for i, req in enumerate(batches):
                tip = req.topic_id_partition
                if tip is not prev_tip:
                    if log is not None:
                        log.high_watermark, log.byte_size = hwm, log_bytes
                    prev_tip = tip
                    cached = by_tip.get(id(tip))
                    if cached is not None:
                        log = cached[1]
                    else:
                        log = self._cached_log(db, tip, object_key, i)
                        by_tip[id(tip)] = (tip, log)
                    if log is not None:
                        log_id, lso, hwm, log_bytes = log.log_id, log.log_start_offset, log.high_watermark, log.byte_size
                        if log_id not in started:
                            started[log_id] = (log, hwm, log_bytes)
                        if idempotent:
                            per_log = producers.get(log_id) or producers.setdefault(log_id, {})
                size = req.size
                byte_offset = req.byte_offset
                delta = req.last_offset - req.base_offset
                if size <= 0 or byte_offset < 0 or byte_offset + size > file_size or delta < 0 \
                        or req.message_timestamp_type not in ts_types:
                    raise bad_batch(object_key, i, req, file_size)
                if log is None:
                    respond(response.of_error(ErrorCode.unknown_topic_or_partition, req))
                    continue
                pid = req.producer_id
                if pid >= 0:
                    producer = per_log.get(pid)
                    base_seq, last_seq, epoch = req.base_sequence, req.last_sequence, req.producer_epoch
                    if producer is not None and base_seq == producer.next_sequence and epoch == producer.epoch \
                            and not req.transaction and base_seq <= last_seq <= INT32_MAX:
                        # The fast path: the next batch of the producer's sequence (see Producer in
                        # producers.py): appended as Producer.append would, without its checks.
                        base = hwm
                        hwm = last = base + delta
                        hwm += 1
                        log_bytes += size
                        n = producer.count
                        ring_pack(producer.ring, n % ring_batches * ring_slot, base_seq, last_seq, base, last, now)
                        producer.count = n + 1
                        producer.last_sequence = last_seq
                        producer.next_sequence = last_seq + 1
                        dirty.add(log_id)
                        add_row((log_id, last, base, file_id, byte_offset, size, now, req.batch_max_timestamp,
                                 req.message_timestamp_type, pid, epoch, base_seq, last_seq, batch_id))
                        producer_batches += 1
                        batch_id += 1
                        respond(response(ErrorCode.none, base, now, lso, False, req))
                        continue
                    if not fields_fit(req):
                        raise bad_batch(object_key, i, req, file_size)
                    answer = verdict(producer, req)
                    if answer != ACCEPT and answer != FRESH:
                        if isinstance(answer, tuple):  # a duplicate: the original batch's answer
                            respond(response(ErrorCode.none, answer[2], answer[4], lso, True, req))
                        else:
                            respond(response.of_error(answer, req))
                        continue
                    if answer == FRESH:
                        producer = per_log[pid] = _Producer(epoch)
                        dirty.add(log_id)
                    base = hwm
                    hwm = last = base + delta
                    hwm += 1
                    log_bytes += size
                    kind = req.transaction
                    if kind >= TXN_COMMIT:  # a marker: no sequence, its epoch only (see verdict)
                        base_seq = last_seq = NO_SEQUENCE
                        txn_events.append(TxnEvent(log_id, pid, kind, base))
                    else:
                        producer.append(base_seq, last_seq, base, last, now)
                        dirty.add(log_id)
                        if kind:
                            txn_events.append(TxnEvent(log_id, pid, TXN_DATA, base))
                    add_row((log_id, last, base, file_id, byte_offset, size, now, req.batch_max_timestamp,
                             req.message_timestamp_type, pid, epoch, base_seq, last_seq, batch_id))
                    producer_batches += 1
                else:
                    base = hwm
                    hwm = last = base + delta
                    hwm += 1
                    log_bytes += size
                    add_row((log_id, last, base, file_id, byte_offset, size, now, req.batch_max_timestamp,
                             req.message_timestamp_type, pid, req.producer_epoch, req.base_sequence,
                             req.last_sequence, batch_id))
                batch_id += 1
                respond(response(ErrorCode.none, base, now, lso, False, req))
            if log is not None:
                log.high_watermark, log.byte_size = hwm, log_bytes
            if rows:
                db.executemany(_INSERT_BATCH, rows)
            if txn_events:
                self._apply_txn_events(db, txn_events)
            self._next_batch_id = batch_id
            # What this object added per log and per topic, from the logs' state before and after.
            log_updates, spans = [], []
            topic_bytes: dict[str, list] = {}
            for log_id, (log, hwm_before, bytes_before) in started.items():
                if log.high_watermark == hwm_before:
                    continue
                log_updates.append((log.high_watermark, log.byte_size, log_id))
                spans.append((file_id, log_id, hwm_before, log.high_watermark - 1))
                acc = topic_bytes.get(log.topic_id)
                if acc is None:
                    topic_bytes[log.topic_id] = [log.topic_name, log.byte_size - bytes_before]
                else:
                    acc[1] += log.byte_size - bytes_before
            db.executemany("UPDATE logs SET high_watermark = ?, byte_size = ? WHERE log_id = ?", log_updates)
            db.executemany("INSERT INTO file_logs (file_id, log_id, min_last_offset, max_last_offset)"
                           " VALUES (?, ?, ?, ?)", spans)
            used = sum(acc[1] for acc in topic_bytes.values())
            if used:
                db.execute("UPDATE files SET used_size = ?, next_batch_id = ?, producer_batches = ? WHERE file_id = ?",
                           (used, batch_id, producer_batches, file_id))
            else:  # nothing committed (all failed or duplicates): the object is garbage already
                db.execute(
                    "UPDATE files SET state = 'deleting', marked_for_deletion_at = ? WHERE file_id = ?",
                    (now, file_id),
                )
            db.executemany(
                "INSERT INTO file_topics (file_id, topic_id, topic_name, committed_bytes, live_bytes)"
                " VALUES (?, ?, ?, ?, ?)",
                [(file_id, tid, name, size, size) for tid, (name, size) in topic_bytes.items()],
            )
            if self._producers.dirty and now - self._producers.snapshot_at_ms >= PRODUCER_SNAPSHOT_INTERVAL_MS:
                self._producers.snapshot(db, now, batch_id - 1)
            faults.pause("diskless.commit")  # crash tests only (kcli/faults.py): before COMMIT
        if self._checkpointer is not None:
            self._checkpointer.poke()
        return responses

    @staticmethod
    def _apply_txn_events(db: sqlite3.Connection, events: list[TxnEvent]) -> None:
        """Open/close the transactions the commit's transactional batches and markers touch."""
        stored: dict[tuple[int, int], int] = {}
        for pair in {(e.log_id, e.producer_id) for e in events}:
            row = db.execute("SELECT first_offset FROM txn_open WHERE log_id = ? AND producer_id = ?", pair).fetchone()
            if row is not None:
                stored[pair] = row[0]
        changes = apply_events(stored, events)
        db.executemany("DELETE FROM txn_open WHERE log_id = ? AND producer_id = ?", changes.deleted)
        db.executemany("INSERT INTO txn_open (log_id, producer_id, first_offset) VALUES (?, ?, ?)",
                       [(*pair, first) for pair, first in changes.inserted.items()])
        db.executemany("INSERT OR REPLACE INTO txn_aborted (log_id, producer_id, first_offset, last_offset)"
                       " VALUES (?, ?, ?, ?)", changes.aborted)

    @staticmethod
    def _stable_offset(db: sqlite3.Connection, log_id: int, hwm: int) -> int:
        """The log's last stable offset: its earliest open transaction's first offset, else hwm."""
        row = db.execute("SELECT MIN(first_offset) FROM txn_open WHERE log_id = ?", (log_id,)).fetchone()
        return hwm if row[0] is None else min(row[0], hwm)

    def _cached_log(self, db: sqlite3.Connection, tip: object, object_key: str, index: int) -> _Log | None:
        """The write-path cache entry of a partition's log (None: unknown partition)."""
        if not isinstance(tip, TopicIdPartition):
            raise not_a_partition(object_key, index)
        key = (str(tip.topic_id), tip.partition)
        if key in self._logs:
            return self._logs[key]
        row = self._log_row(db, *key)
        log = self._logs[key] = None if row is None else _Log(row[0], key[0], *row[1:])
        return log

    @_guarded
    def find_batches(self, requests: list[FindBatchRequest], fetch_max_bytes: int) -> list[FindBatchResponse]:
        db = self._conn()
        out: list[FindBatchResponse] = []
        fetch = FetchBudget(fetch_max_bytes)
        db.execute("BEGIN")  # one snapshot for the whole fetch
        try:
            for req in requests:
                tip = req.topic_id_partition
                tid = str(tip.topic_id)
                row = db.execute(
                    "SELECT log_id, log_start_offset, high_watermark FROM logs WHERE topic_id = ? AND partition = ?",
                    (tid, tip.partition),
                ).fetchone()
                if row is None:
                    out.append(FindBatchResponse(ErrorCode.unknown_topic_or_partition, [], UNKNOWN_OFFSET, UNKNOWN_OFFSET))
                    continue
                log_id, lso, hwm = row
                if req.offset < lso or req.offset > hwm:
                    out.append(FindBatchResponse(ErrorCode.offset_out_of_range, [], lso, hwm))
                    continue
                stable = self._stable_offset(db, log_id, hwm)
                end = stable if req.read_committed else hwm
                budget = fetch.wants(req.max_partition_fetch_bytes)
                found: list[BatchInfo] = []
                if req.offset < end and budget is not None:
                    cursor = db.execute(
                        f"SELECT {_BATCH_COLUMNS} FROM batches b JOIN files f ON f.file_id = b.file_id"
                        " WHERE b.log_id = ? AND b.last_offset >= ? AND b.base_offset < ? ORDER BY b.last_offset",
                        (log_id, req.offset, end),
                    )
                    found = fetch.take((self._batch_info(row, tip) for row in cursor), _BYTE_SIZE, budget)
                    cursor.close()
                aborted: list[AbortedTransaction] = []
                if req.read_committed and found:
                    aborted = [AbortedTransaction(*r) for r in db.execute(
                        "SELECT producer_id, first_offset, last_offset FROM txn_aborted WHERE log_id = ?"
                        " AND last_offset >= ? AND first_offset <= ? ORDER BY first_offset",
                        (log_id, req.offset, found[-1].metadata.last_offset))]
                out.append(FindBatchResponse(ErrorCode.none, found, lso, hwm, stable, aborted))
        finally:
            db.execute("COMMIT")
        return out

    @_guarded
    def list_offsets(self, requests: list[ListOffsetsRequest]) -> list[ListOffsetsResponse]:
        db = self._conn()
        out: list[ListOffsetsResponse] = []
        db.execute("BEGIN")
        try:
            for req in requests:
                tip = req.topic_id_partition
                key = (str(tip.topic_id), tip.partition)
                row = db.execute(
                    "SELECT log_id, log_start_offset, high_watermark FROM logs WHERE topic_id = ? AND partition = ?",
                    key,
                ).fetchone()
                if row is None:
                    out.append(ListOffsetsResponse(ErrorCode.unknown_topic_or_partition, tip, NO_TIMESTAMP, UNKNOWN_OFFSET))
                    continue
                log_id, lso, hwm = row
                out.append(list_offsets_answer(
                    tip, req, lso, hwm, lambda: self._stable_offset(db, log_id, hwm),
                    # the earliest batch holding the max timestamp: its last offset
                    lambda: db.execute(f"SELECT last_offset, {_EFFECTIVE_TS} AS ts FROM batches WHERE log_id = ?"
                                       " ORDER BY ts DESC, last_offset ASC LIMIT 1", (log_id,)).fetchone(),
                    # the first batch whose timestamp reaches ts: its base offset
                    lambda ts: db.execute(f"SELECT base_offset, {_EFFECTIVE_TS} FROM batches WHERE log_id = ?"
                                          f" AND {_EFFECTIVE_TS} >= ? ORDER BY last_offset LIMIT 1",
                                          (log_id, ts)).fetchone()))
        finally:
            db.execute("COMMIT")
        return out

    @_guarded
    def delete_records(self, requests: list[DeleteRecordsRequest]) -> list[DeleteRecordsResponse]:
        now = self._clock()
        out: list[DeleteRecordsResponse] = []
        with self._tx() as db:
            self._forget_logs()  # log rows change below
            for req in requests:
                tip = req.topic_id_partition
                key = (str(tip.topic_id), tip.partition)
                row = self._log_row(db, *key)
                if row is None:
                    out.append(DeleteRecordsResponse(ErrorCode.unknown_topic_or_partition, UNKNOWN_OFFSET))
                    continue
                log_id, _name, lso, hwm, _size = row
                target = delete_records_target(req, lso, hwm)
                if isinstance(target, DeleteRecordsResponse):
                    out.append(target)
                    continue
                self._delete_batches(db, log_id, key[0], target, now)
                db.execute("UPDATE logs SET log_start_offset = ? WHERE log_id = ?", (target, log_id))
                out.append(DeleteRecordsResponse(ErrorCode.none, target))
            faults.pause("diskless.delete.records")  # crash tests only (kcli/faults.py): before COMMIT
        return out

    @_guarded
    def delete_topics(self, topic_ids: Iterable[uuid.UUID]) -> None:
        now = self._clock()
        with self._tx() as db:
            self._forget_logs()  # log rows change below
            for topic_id in set(topic_ids):
                tid = str(topic_id)
                for (log_id,) in db.execute("SELECT log_id FROM logs WHERE topic_id = ?", (tid,)).fetchall():
                    self._drop_log(db, log_id, tid, now)

    @_guarded
    def get_files_to_delete(self) -> list[FileToDelete]:
        rows = self._conn().execute(
            "SELECT object_key, marked_for_deletion_at FROM files WHERE state = 'deleting'"
            " ORDER BY marked_for_deletion_at, file_id"
        ).fetchall()
        return [FileToDelete(key, at) for key, at in rows]

    @_guarded
    def delete_files(self, request: DeleteFilesRequest) -> None:
        # Only rows already marked 'deleting' (hence without batches) go; live objects stay.
        with self._tx() as db:
            # Batch ids stay unique after the newest objects are gone: keep the counter as a floor.
            db.execute("INSERT OR REPLACE INTO kcli_meta (key, value) VALUES ('next_batch_id', ?)",
                       (str(self._batch_counter(db)),))
            db.executemany(
                "DELETE FROM files WHERE object_key = ? AND state = 'deleting'"
                f" AND NOT EXISTS (SELECT 1 FROM {_FILE_BATCHES} WHERE fl.file_id = files.file_id)",
                [(key,) for key in sorted(request.object_key_paths)],
            )

    @_guarded
    def is_safe_to_delete_file(self, object_key: str) -> bool:
        row = self._conn().execute(
            f"SELECT EXISTS (SELECT 1 FROM files f, {_FILE_BATCHES} WHERE fl.file_id = f.file_id AND f.object_key = ?)",
            (object_key,),
        ).fetchone()
        return not row[0]

    # -- kcli extras ---------------------------------------------------------------------------

    @_guarded
    def delete_partitions(self, topic_id: uuid.UUID, partitions: set[int]) -> int:
        now = self._clock()
        tid = str(topic_id)
        deleted = 0
        with self._tx() as db:
            self._forget_logs()  # log rows change below
            for partition in sorted(partitions):
                row = self._log_row(db, tid, partition)
                if row is not None:
                    deleted += self._drop_log(db, row[0], tid, now)
        return deleted

    @_guarded
    def enforce_retention(
        self, requests: Iterable[RetentionRequest | tuple[TopicIdPartition, int, int]], now_ms: int
    ) -> list[RetentionResult]:
        out: list[RetentionResult] = []
        with self._tx() as db:
            self._forget_logs()  # log rows change below
            for request in requests:
                tip, retention_ms, retention_bytes = request
                key = (str(tip.topic_id), tip.partition)
                row = self._log_row(db, *key)
                if row is None:
                    out.append(RetentionResult(tip, ErrorCode.unknown_topic_or_partition, UNKNOWN_OFFSET, 0, 0))
                    continue
                log_id, _name, lso, _hwm, size = row
                if retention_nothing_to_do(retention_ms, retention_bytes, size):
                    out.append(RetentionResult(tip, ErrorCode.none, lso, 0, 0))
                    continue
                cursor = db.execute(
                    f"SELECT last_offset, byte_size, {_EFFECTIVE_TS} FROM batches WHERE log_id = ? ORDER BY last_offset",
                    (log_id,),
                )
                cutoff, count, freed = retention_cut(cursor, size, retention_ms, retention_bytes, now_ms)
                cursor.close()
                if cutoff is None:
                    out.append(RetentionResult(tip, ErrorCode.none, lso, 0, 0))
                    continue
                self._delete_batches(db, log_id, key[0], cutoff, now_ms)
                new_lso = max(lso, cutoff)
                db.execute("UPDATE logs SET log_start_offset = ? WHERE log_id = ?", (new_lso, log_id))
                out.append(RetentionResult(tip, ErrorCode.none, new_lso, count, freed))
        return out

    @_guarded
    def describe_logs(self, topic_ids: Iterable[uuid.UUID] | None = None) -> list[LogInfo]:
        sql = (
            "SELECT l.topic_id, l.topic_name, l.partition, l.log_start_offset, l.high_watermark, l.byte_size,"
            " (SELECT COUNT(*) FROM batches b WHERE b.log_id = l.log_id)"
            " FROM logs l"
        )
        params: list[Any] = []
        if topic_ids is not None:
            ids = [str(t) for t in topic_ids]
            if not ids:
                return []
            sql += f" WHERE l.topic_id IN ({','.join('?' * len(ids))})"
            params = ids
        sql += " ORDER BY l.topic_name, l.topic_id, l.partition"
        return [
            LogInfo(TopicIdPartition(uuid.UUID(tid), name, part), lso, hwm, count, size)
            for tid, name, part, lso, hwm, size, count in self._conn().execute(sql, params)
        ]

    @_guarded
    def describe_files(
        self,
        state: str | None = None,
        object_key: str | None = None,
        topic_id: uuid.UUID | None = None,
    ) -> list[FileInfo]:
        check_file_state(state)
        db = self._conn()
        where, params = sql_filters((
            ("f.state = ?", state), ("f.object_key = ?", object_key),
            ("EXISTS (SELECT 1 FROM file_topics ft WHERE ft.file_id = f.file_id AND ft.topic_id = ?)",
             None if topic_id is None else str(topic_id))))
        sql = (
            "SELECT f.file_id, f.object_key, f.file_size, f.used_size, f.state, f.committed_at,"
            " f.marked_for_deletion_at, f.uploader,"
            f" (SELECT COUNT(*) FROM {_FILE_BATCHES} WHERE fl.file_id = f.file_id) FROM files f{where}"
            " ORDER BY f.committed_at, f.file_id"
        )
        out = []
        db.execute("BEGIN")
        try:
            for file_id, key, fsize, used, st, committed, marked, uploader, count in db.execute(sql, params).fetchall():
                parts = db.execute(
                    "SELECT l.topic_id, l.topic_name, l.partition FROM file_logs fl JOIN logs l ON l.log_id = fl.log_id"
                    " WHERE fl.file_id = ? AND EXISTS (SELECT 1 FROM batches b WHERE b.log_id = fl.log_id"
                    " AND b.last_offset BETWEEN fl.min_last_offset AND fl.max_last_offset AND b.file_id = fl.file_id)"
                    " ORDER BY l.topic_name, l.partition",
                    (file_id,),
                ).fetchall()
                tips = [TopicIdPartition(uuid.UUID(t), n, p) for t, n, p in parts]
                out.append(FileInfo(key, fsize, used, st, committed, marked, count, tips, uploader))
        finally:
            db.execute("COMMIT")
        return out

    @_guarded
    def batches_in_file(self, object_key: str) -> list[BatchInfo]:
        rows = self._conn().execute(
            f"SELECT {_BATCH_COLUMNS}, l.topic_id, l.topic_name, l.partition FROM files f, {_FILE_BATCHES}"
            " JOIN logs l ON l.log_id = b.log_id WHERE fl.file_id = f.file_id AND f.object_key = ? ORDER BY b.byte_offset",
            (object_key,),
        ).fetchall()
        tips: dict[tuple[str, int], TopicIdPartition] = {}
        out = []
        for row in rows:
            tid, name, part = row[-3:]
            tip = tips.get((tid, part))
            if tip is None:
                tip = tips[(tid, part)] = TopicIdPartition(uuid.UUID(tid), name, part)
            out.append(self._batch_info(row[:-3], tip))
        return out

    @_guarded
    def known_object_keys(self) -> set[str]:
        return {row[0] for row in self._conn().execute("SELECT object_key FROM files")}

    # -- diskless replica caches ------------------------------------------------------------------

    @_guarded
    def report_replica_caches(self, broker_id: int, report: str) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO kcli_meta (key, value) VALUES (?, ?)",
                       (f"replica.caches.{int(broker_id)}", report))

    @_guarded
    def replica_cache_reports(self) -> dict[int, str]:
        rows = self._conn().execute("SELECT key, value FROM kcli_meta WHERE key LIKE 'replica.caches.%'")
        return {int(k.rsplit(".", 1)[1]): v for k, v in rows}

    # -- identity and upload intents -------------------------------------------------------------

    @_guarded
    def cluster_id(self) -> str | None:
        row = self._conn().execute("SELECT value FROM kcli_meta WHERE key = 'cluster_id'").fetchone()
        return None if row is None else str(row[0])

    @_guarded
    def claim_cluster_id(self, cluster_id: str) -> None:
        check_cluster_id(cluster_id)
        with self._tx() as db:
            row = db.execute("SELECT value FROM kcli_meta WHERE key = 'cluster_id'").fetchone()
            if row is None:
                db.execute("INSERT INTO kcli_meta (key, value) VALUES ('cluster_id', ?)", (cluster_id,))
            elif row[0] != cluster_id:
                raise foreign_cluster(self._path, row[0], cluster_id)

    @_guarded
    def register_upload_intent(self, object_key: str, broker_id: int, time_ms: int) -> None:
        check_intent_key(object_key)
        # No fsync of its own: the commit that follows (synchronous=FULL) syncs the WAL file,
        # this frame included. Lost only with the OS (power loss) before that commit, and then
        # the object is merely "unknown" (reported, kept), never wrongly deleted.
        db = self._conn()
        db.execute("PRAGMA synchronous=NORMAL")
        try:
            with self._tx() as tx:
                tx.execute("INSERT OR REPLACE INTO upload_intents (object_key, broker_id, created_at) VALUES (?, ?, ?)",
                           (object_key, broker_id, time_ms))
        finally:
            db.execute("PRAGMA synchronous=FULL")

    @_guarded
    def list_upload_intents(self) -> list[UploadIntent]:
        rows = self._conn().execute(
            "SELECT i.object_key, i.broker_id, i.created_at FROM upload_intents i"
            " WHERE NOT EXISTS (SELECT 1 FROM files f WHERE f.object_key = i.object_key)"
            " ORDER BY i.created_at, i.object_key"
        ).fetchall()
        return [UploadIntent(key, broker, at) for key, broker, at in rows]

    @_guarded
    def delete_upload_intents(self, object_keys: Iterable[str]) -> None:
        keys = sorted(set(object_keys))
        if not keys:
            return
        with self._tx() as db:
            db.executemany("DELETE FROM upload_intents WHERE object_key = ?", [(k,) for k in keys])

    @_guarded
    def claim_orphans(self, object_sizes: dict[str, int], now_ms: int) -> list[str]:
        claimed: list[str] = []
        with self._tx() as db:
            counter = self._batch_counter(db)  # the newest row keeps the batch-id floor (_batch_counter)
            for key in sorted(object_sizes):
                row = db.execute("SELECT broker_id FROM upload_intents WHERE object_key = ?"
                                 " AND NOT EXISTS (SELECT 1 FROM files WHERE object_key = ?)", (key, key)).fetchone()
                if row is None:
                    continue  # committed meanwhile, or already claimed
                db.execute("DELETE FROM upload_intents WHERE object_key = ?", (key,))
                db.execute(
                    "INSERT INTO files (object_key, uploader, file_size, used_size, state, committed_at,"
                    " marked_for_deletion_at, next_batch_id) VALUES (?, ?, ?, 0, 'deleting', ?, ?, ?)",
                    (key, row[0], max(0, int(object_sizes[key])), now_ms, now_ms, counter))
                claimed.append(key)
        return claimed

    # -- log compaction --------------------------------------------------------------------------

    @_guarded
    def replace_batches(
        self,
        topic_id_partition: TopicIdPartition,
        replaced: list[BatchInfo],
        object_key: str,
        uploader_broker_id: int,
        file_size: int,
        batches: list[BatchMetadata],
        now_ms: int,
        *,
        require_intent: bool = True,
    ) -> bool:
        tip = topic_id_partition
        check_replacement(tip, replaced, batches, file_size)
        with self._tx() as db:
            self._forget_logs()  # the log's byte size changes below
            self._end_intent(db, object_key, require_intent)
            try:
                file_id = db.execute(
                    "INSERT INTO files (object_key, uploader, file_size, used_size, state, committed_at,"
                    " marked_for_deletion_at, next_batch_id) VALUES (?, ?, ?, 0, 'deleting', ?, ?, ?)",
                    (object_key, uploader_broker_id, file_size, now_ms, now_ms, self._batch_counter(db)),
                ).lastrowid
            except sqlite3.IntegrityError:
                raise already_committed(object_key) from None
            tid = str(tip.topic_id)
            row = self._log_row(db, tid, tip.partition)
            if row is None or not replaced:
                return False
            log_id, topic_name = row[0], row[1]
            lo = min(b.metadata.last_offset for b in replaced)
            hi = max(b.metadata.last_offset for b in replaced)
            live = {(last, batch_id) for last, batch_id in db.execute(
                "SELECT last_offset, batch_id FROM batches WHERE log_id = ? AND last_offset BETWEEN ? AND ?",
                (log_id, lo, hi))}
            if live != {(b.metadata.last_offset, b.batch_id) for b in replaced}:
                return False  # the range changed since it was read: the new object is garbage
            # Producers' idempotence state as of now: the rewrites (producer_batches = 0) are never
            # replayed into it, and the batches it was replayed from are going.
            self._producers.snapshot(db, now_ms, self._batch_counter(db) - 1)
            freed = db.execute(
                "SELECT file_id, SUM(byte_size) FROM batches WHERE log_id = ? AND last_offset BETWEEN ? AND ?"
                " GROUP BY file_id", (log_id, lo, hi)).fetchall()
            db.execute("DELETE FROM batches WHERE log_id = ? AND last_offset BETWEEN ? AND ?", (log_id, lo, hi))
            db.executemany("UPDATE file_topics SET live_bytes = live_bytes - ? WHERE file_id = ? AND topic_id = ?",
                           [(size, fid, tid) for fid, size in freed])
            db.executemany("UPDATE files SET used_size = used_size - ? WHERE file_id = ?",
                           [(size, fid) for fid, size in freed])
            db.executemany("UPDATE files SET state = 'deleting', marked_for_deletion_at = ?"
                           " WHERE file_id = ? AND used_size = 0 AND state = 'uploaded'",
                           [(now_ms, fid) for fid, _ in freed])
            batch_id = self._batch_counter(db)
            rows = []
            for md in batches:
                rows.append((log_id, md.last_offset, md.base_offset, file_id, md.byte_offset, md.byte_size,
                             md.log_append_timestamp, md.batch_max_timestamp, md.timestamp_type, md.producer_id,
                             md.producer_epoch, md.base_sequence, md.last_sequence, batch_id))
                batch_id += 1
            db.executemany(_INSERT_BATCH, rows)
            self._next_batch_id = batch_id
            used = sum(md.byte_size for md in batches)
            db.execute("UPDATE logs SET byte_size = byte_size - ? + ? WHERE log_id = ?",
                       (sum(size for _, size in freed), used, log_id))
            if batches:
                db.execute("UPDATE files SET used_size = ?, state = 'uploaded', marked_for_deletion_at = NULL,"
                           " next_batch_id = ? WHERE file_id = ?", (used, batch_id, file_id))
                db.execute("INSERT INTO file_logs (file_id, log_id, min_last_offset, max_last_offset)"
                           " VALUES (?, ?, ?, ?)", (file_id, log_id, batches[0].last_offset, batches[-1].last_offset))
                db.execute("INSERT INTO file_topics (file_id, topic_id, topic_name, committed_bytes, live_bytes)"
                           " VALUES (?, ?, ?, ?, ?)", (file_id, tid, topic_name, used, used))
        if self._checkpointer is not None:
            self._checkpointer.poke()
        return True

    @_guarded
    def cleaner_checkpoint(self, topic_id_partition: TopicIdPartition) -> int | None:
        db = self._conn()
        row = self._log_row(db, str(topic_id_partition.topic_id), topic_id_partition.partition)
        if row is None:
            return None
        value = db.execute("SELECT value FROM kcli_meta WHERE key = ?", (_checkpoint_key(row[0]),)).fetchone()
        return None if value is None else int(value[0])

    @_guarded
    def set_cleaner_checkpoint(self, topic_id_partition: TopicIdPartition, offset: int) -> None:
        with self._tx() as db:
            row = self._log_row(db, str(topic_id_partition.topic_id), topic_id_partition.partition)
            if row is not None:
                db.execute("INSERT OR REPLACE INTO kcli_meta (key, value) VALUES (?, ?)",
                           (_checkpoint_key(row[0]), str(offset)))

    @_guarded
    def describe_producers(self, topic_id_partition: TopicIdPartition) -> list[ProducerInfo] | None:
        tip = topic_id_partition
        with self._tx() as db:  # loading the producers may replay batches: one consistent view
            row = self._log_row(db, str(tip.topic_id), tip.partition)
            if row is None:
                return None
            log_id = row[0]
            producers = self._producers.loaded(db, self._clock()).get(log_id, {})
            open_txns = dict(db.execute("SELECT producer_id, first_offset FROM txn_open WHERE log_id = ?", (log_id,)))
        return describe_producer_states(producers, open_txns)

    @_guarded
    def describe_topic_storage(self, topic_ids: Iterable[uuid.UUID] | None = None) -> list[TopicStorageInfo]:
        db = self._conn()
        wanted = None if topic_ids is None else {str(t) for t in topic_ids}
        db.execute("BEGIN")
        try:
            names = {tid: name for tid, name in db.execute("SELECT DISTINCT topic_id, topic_name FROM logs")}
            stats = db.execute(
                "SELECT ft.topic_id, MAX(ft.topic_name), SUM(ft.live_bytes),"
                " SUM(ft.live_bytes > 0), SUM(CASE WHEN ft.live_bytes > 0 THEN f.file_size ELSE 0 END),"
                " SUM(ft.live_bytes = 0), SUM(CASE WHEN ft.live_bytes = 0 THEN f.file_size ELSE 0 END)"
                " FROM file_topics ft JOIN files f ON f.file_id = ft.file_id GROUP BY ft.topic_id"
            ).fetchall()
        finally:
            db.execute("COMMIT")
        return topic_storage(names, stats, wanted, uuid.UUID)
