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
import struct
import threading
import time
import uuid
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

from kcli import faults
from plugins.coordinator.base import (
    FILE_STATE_DELETING,
    FILE_STATE_UPLOADED,
    INVALID_PRODUCER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    NONE,
    OFFSET_OUT_OF_RANGE,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    UNKNOWN_OFFSET,
    UNKNOWN_TOPIC_OR_PARTITION,
    BatchCoordinator,
    BatchInfo,
    BatchMetadata,
    CommitBatchRequest,
    CommitBatchResponse,
    CoordinatorException,
    CreateTopicAndPartitionsRequest,
    DeleteFilesRequest,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    FileInfo,
    FileToDelete,
    FindBatchRequest,
    FindBatchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    LogInfo,
    RetentionRequest,
    RetentionResult,
    TopicIdPartition,
    TopicStorageInfo,
)

SCHEMA_VERSION = 1
PRODUCER_STATE_BATCHES = 5  # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN
PRODUCER_SNAPSHOT_INTERVAL_MS = 60_000  # bounds the batches replayed after a crash
INT32_MAX = 0x7FFFFFFF
_ENTRY = struct.Struct(">iiqqq")  # base_sequence, last_sequence, base_offset, last_offset, append_time

SCHEMA = """
CREATE TABLE IF NOT EXISTS kcli_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS logs (
    topic_id         TEXT    NOT NULL,
    partition        INTEGER NOT NULL,
    topic_name       TEXT    NOT NULL,
    log_start_offset INTEGER NOT NULL DEFAULT 0,
    high_watermark   INTEGER NOT NULL DEFAULT 0,
    byte_size        INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (topic_id, partition)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS files (
    file_id                INTEGER PRIMARY KEY,
    object_key             TEXT    NOT NULL UNIQUE,
    uploader               INTEGER NOT NULL,
    file_size              INTEGER NOT NULL,
    used_size              INTEGER NOT NULL,
    state                  TEXT    NOT NULL CHECK (state IN ('uploaded', 'deleting')),
    committed_at           INTEGER NOT NULL,
    marked_for_deletion_at INTEGER
);
CREATE INDEX IF NOT EXISTS files_by_state ON files (state, marked_for_deletion_at);
CREATE TABLE IF NOT EXISTS batches (
    batch_id            INTEGER PRIMARY KEY AUTOINCREMENT,
    topic_id            TEXT    NOT NULL,
    partition           INTEGER NOT NULL,
    base_offset         INTEGER NOT NULL,
    last_offset         INTEGER NOT NULL,
    file_id             INTEGER NOT NULL,
    byte_offset         INTEGER NOT NULL,
    byte_size           INTEGER NOT NULL,
    log_append_time     INTEGER NOT NULL,
    batch_max_timestamp INTEGER NOT NULL,
    timestamp_type      INTEGER NOT NULL,
    producer_id         INTEGER NOT NULL,
    producer_epoch      INTEGER NOT NULL,
    base_sequence       INTEGER NOT NULL,
    last_sequence       INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS batches_by_log ON batches (topic_id, partition, last_offset);
CREATE INDEX IF NOT EXISTS batches_by_file ON batches (file_id, byte_offset);
CREATE TABLE IF NOT EXISTS file_topics (
    file_id         INTEGER NOT NULL REFERENCES files (file_id) ON DELETE CASCADE,
    topic_id        TEXT    NOT NULL,
    topic_name      TEXT    NOT NULL,
    committed_bytes INTEGER NOT NULL,
    live_bytes      INTEGER NOT NULL,
    PRIMARY KEY (file_id, topic_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS file_topics_by_topic ON file_topics (topic_id);
CREATE TABLE IF NOT EXISTS producer_state (
    topic_id       TEXT    NOT NULL,
    partition      INTEGER NOT NULL,
    producer_id    INTEGER NOT NULL,
    producer_epoch INTEGER NOT NULL,
    batches        BLOB    NOT NULL,
    PRIMARY KEY (topic_id, partition, producer_id),
    FOREIGN KEY (topic_id, partition) REFERENCES logs (topic_id, partition) ON DELETE CASCADE
) WITHOUT ROWID;
"""

_INSERT_BATCH = (
    "INSERT INTO batches (topic_id, partition, base_offset, last_offset, file_id, byte_offset, byte_size,"
    " log_append_time, batch_max_timestamp, timestamp_type, producer_id, producer_epoch, base_sequence,"
    " last_sequence) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_BATCH_COLUMNS = (
    "b.batch_id, f.object_key, b.byte_offset, b.byte_size, b.base_offset, b.last_offset, b.log_append_time,"
    " b.batch_max_timestamp, b.timestamp_type, b.producer_id, b.producer_epoch, b.base_sequence, b.last_sequence"
)
# Kafka reports the append time as the batch timestamp under LogAppendTime.
_EFFECTIVE_TS = "(CASE WHEN timestamp_type = 1 THEN log_append_time ELSE batch_max_timestamp END)"

F = TypeVar("F", bound=Callable[..., Any])


def _guarded(func: F) -> F:
    """One lock per coordinator, and SQLite errors surface as CoordinatorException."""

    @functools.wraps(func)
    def wrapper(self: "SqliteBatchCoordinator", *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            try:
                return func(self, *args, **kwargs)
            except sqlite3.Error as err:
                raise CoordinatorException(f"{func.__name__} failed on {self._path}: {err}") from None

    return wrapper  # type: ignore[return-value]


@dataclass
class _Log:
    topic_name: str
    log_start_offset: int
    high_watermark: int
    byte_size: int


@dataclass
class _Producer:
    """Kafka's ProducerStateEntry: the epoch and the last 5 batches (for duplicate detection)."""

    epoch: int
    batches: list[tuple[int, int, int, int, int]] = field(default_factory=list)

    @classmethod
    def decode(cls, epoch: int, blob: bytes) -> "_Producer":
        return cls(epoch, [_ENTRY.unpack_from(blob, i) for i in range(0, len(blob), _ENTRY.size)])

    def encode(self) -> bytes:
        return b"".join(_ENTRY.pack(*entry) for entry in self.batches)

    def append(self, entry: tuple[int, int, int, int, int]) -> None:
        self.batches.append(entry)
        if len(self.batches) > PRODUCER_STATE_BATCHES:
            del self.batches[0]


class _ProducerStates:
    """Idempotence state of every (partition, producer id), like Kafka's ProducerStateManager.

    Kept in memory and persisted the way Kafka does it: the ``producer_state`` table is a
    snapshot taken as of batch id ``producer_snapshot_batch_id``; loading reads the snapshot
    and replays the (idempotent) batches committed after it. Commits therefore write no
    producer rows at all: one row per producer and commit would land on as many random B-tree
    pages as there are producers. Snapshots are written at most every
    PRODUCER_SNAPSHOT_INTERVAL_MS by a commit, before batches are deleted (so state outlives
    the data, as in Kafka), and on close.
    """

    def __init__(self) -> None:
        self.map: dict[tuple[str, int, int], _Producer] | None = None
        self.dirty: set[tuple[str, int, int]] = set()
        self.snapshot_at_ms = 0

    def reset(self) -> None:
        self.map = None
        self.dirty = set()

    def loaded(self, db: sqlite3.Connection, now_ms: int) -> dict[tuple[str, int, int], _Producer]:
        if self.map is None:
            states = {
                (tid, part, pid): _Producer.decode(epoch, blob)
                for tid, part, pid, epoch, blob in db.execute(
                    "SELECT topic_id, partition, producer_id, producer_epoch, batches FROM producer_state")
            }
            row = db.execute("SELECT value FROM kcli_meta WHERE key = 'producer_snapshot_batch_id'").fetchone()
            dirty = set()
            for tid, part, pid, epoch, base_seq, last_seq, base, last, append_time in db.execute(
                "SELECT topic_id, partition, producer_id, producer_epoch, base_sequence, last_sequence,"
                " base_offset, last_offset, log_append_time FROM batches WHERE batch_id > ? AND producer_id >= 0"
                " ORDER BY batch_id",
                (int(row[0]) if row else 0,),
            ):
                key = (tid, part, pid)
                producer = states.get(key)
                if producer is None or producer.epoch != epoch:
                    producer = states[key] = _Producer(epoch)
                producer.append((base_seq, last_seq, base, last, append_time))
                dirty.add(key)
            self.map, self.dirty, self.snapshot_at_ms = states, dirty, now_ms
        return self.map

    def snapshot(self, db: sqlite3.Connection, now_ms: int) -> None:
        """Persist the producers changed since the last snapshot, inside the caller's transaction."""
        states = self.loaded(db, now_ms)
        if self.dirty:
            db.executemany(
                "INSERT OR REPLACE INTO producer_state (topic_id, partition, producer_id, producer_epoch, batches)"
                " VALUES (?, ?, ?, ?, ?)",
                [(*key, states[key].epoch, states[key].encode()) for key in self.dirty if key in states],
            )
            row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'batches'").fetchone()
            db.execute(
                "INSERT OR REPLACE INTO kcli_meta (key, value) VALUES ('producer_snapshot_batch_id', ?)",
                (str(row[0] if row else 0),),
            )
            self.dirty = set()
        self.snapshot_at_ms = now_ms

    def drop(self, db: sqlite3.Connection, topic_id: str, partition: int | None = None) -> None:
        """Forget the producers of a deleted topic or partition, in memory and on disk."""
        if partition is None:
            db.execute("DELETE FROM producer_state WHERE topic_id = ?", (topic_id,))
        else:
            db.execute("DELETE FROM producer_state WHERE topic_id = ? AND partition = ?", (topic_id, partition))
        if self.map is not None:
            for key in [k for k in self.map if k[0] == topic_id and (partition is None or k[1] == partition)]:
                del self.map[key]
                self.dirty.discard(key)


def _describe_bad(req: CommitBatchRequest, file_size: int) -> str:
    """Why a commit request is malformed (a broker bug, so the whole commit is refused)."""
    if req.size <= 0 or req.byte_offset < 0 or req.byte_offset + req.size > file_size:
        return (f"byte range [{req.byte_offset}, {req.byte_offset + req.size}) is empty or outside"
                f" the object of {file_size} bytes")
    if req.last_offset < req.base_offset:
        return f"last offset {req.last_offset} before base offset {req.base_offset}"
    return f"unknown timestamp type {req.message_timestamp_type}"


def _in_sequence(last_sequence: int, next_sequence: int) -> bool:
    return next_sequence == last_sequence + 1 or (last_sequence == INT32_MAX and next_sequence == 0)


class _Checkpointer:
    """Copies the WAL back into the database from a second connection, off the commit path.

    SQLite's automatic checkpoint runs inside whichever COMMIT crosses the threshold, adding the
    database fsync to that commit's latency; this thread does it after commits instead. The main
    connection keeps a high auto-checkpoint threshold as a fallback."""

    MIN_INTERVAL_S = 0.2

    def __init__(self, path: str) -> None:
        self._path = path
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
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error:
                    pass  # busy or failing: the main connection's auto-checkpoint still bounds the WAL
                if self._stop.wait(self.MIN_INTERVAL_S):
                    return
        finally:
            db.close()

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
        # Write-path state in memory (log rows, producer state), valid while no other connection
        # writes: PRAGMA data_version tells us when one did. Dropped on any failed transaction.
        self._logs: dict[tuple[str, int], _Log | None] = {}
        self._producers = _ProducerStates()
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
            db.execute("PRAGMA foreign_keys=ON")
            db.execute("PRAGMA cache_size=-65536")  # 64 MiB: keep the hot index pages in memory
            db.execute("PRAGMA wal_autocheckpoint=16384")  # fallback only; see _Checkpointer
            if self._read_only:
                self._check_schema(db)
            else:
                # executescript commits any open transaction first, so the script carries its own.
                db.executescript(
                    "BEGIN IMMEDIATE;" + SCHEMA
                    + f"INSERT OR IGNORE INTO kcli_meta (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}');"
                    + "COMMIT;"
                )
                self._check_schema(db)
        except sqlite3.DatabaseError as err:
            db.close()
            raise CoordinatorException(f"{path} is not a usable coordinator database: {err}") from None
        except BaseException:
            db.close()
            raise
        self._db = db
        if not self._read_only:
            self._checkpointer = _Checkpointer(self._path)
            # A coordinator dropped without close() must not leave its thread behind.
            self._finalizer = weakref.finalize(self, self._checkpointer.stop)

    @staticmethod
    def _check_schema(db: sqlite3.Connection) -> None:
        try:
            row = db.execute("SELECT value FROM kcli_meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.OperationalError:
            row = None
        if row is None:
            raise sqlite3.DatabaseError("not a kcli coordinator database (no schema version)")
        if int(row[0]) != SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"schema version {row[0]}, this kcli understands {SCHEMA_VERSION}")

    def close(self) -> None:
        with self._lock:
            if self._db is not None and not self._read_only and self._producers.dirty:
                try:  # a clean shutdown leaves nothing to replay
                    with self._tx() as db:
                        self._producers.snapshot(db, self._clock())
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
        self._producers.reset()
        self._data_version = None

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: concurrent writers (another process) wait instead of failing.

        In-memory state is dropped when another connection has committed since we last looked,
        and after any failure (memory may be ahead of the rolled-back database)."""
        db = self._conn()
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

    @staticmethod
    def _log_row(db: sqlite3.Connection, topic_id: str, partition: int) -> tuple | None:
        return db.execute(
            "SELECT topic_name, log_start_offset, high_watermark, byte_size FROM logs"
            " WHERE topic_id = ? AND partition = ?",
            (topic_id, partition),
        ).fetchone()

    def _delete_batches(self, db: sqlite3.Connection, where: str, params: tuple, now: int,
                        update_logs: bool = True) -> tuple[int, int]:
        """Delete the batches matching ``where`` and keep every derived size right: files' used
        size, per-topic live bytes, logs' byte size; objects left empty are marked 'deleting'."""
        per_file = db.execute(
            f"SELECT file_id, topic_id, SUM(byte_size), COUNT(*) FROM batches WHERE {where}"
            " GROUP BY file_id, topic_id",
            params,
        ).fetchall()
        if not per_file:
            return 0, 0
        if update_logs:
            # The logs live on, so must their producers' idempotence state: snapshot it before
            # the batches it was replayed from disappear.
            self._producers.snapshot(db, now)
            per_log = db.execute(
                f"SELECT topic_id, partition, SUM(byte_size) FROM batches WHERE {where} GROUP BY topic_id, partition",
                params,
            ).fetchall()
            db.executemany(
                "UPDATE logs SET byte_size = byte_size - ? WHERE topic_id = ? AND partition = ?",
                [(size, tid, part) for tid, part, size in per_log],
            )
        db.execute(f"DELETE FROM batches WHERE {where}", params)
        db.executemany(
            "UPDATE file_topics SET live_bytes = live_bytes - ? WHERE file_id = ? AND topic_id = ?",
            [(size, file_id, tid) for file_id, tid, size, _ in per_file],
        )
        by_file: dict[int, int] = {}
        for file_id, _tid, size, _count in per_file:
            by_file[file_id] = by_file.get(file_id, 0) + size
        db.executemany("UPDATE files SET used_size = used_size - ? WHERE file_id = ?",
                       [(size, file_id) for file_id, size in by_file.items()])
        db.executemany(
            "UPDATE files SET state = 'deleting', marked_for_deletion_at = ?"
            " WHERE file_id = ? AND used_size = 0 AND state = 'uploaded'",
            [(now, file_id) for file_id in by_file],
        )
        return sum(row[3] for row in per_file), sum(by_file.values())

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
        rows = []
        for req in requests:
            if req.num_partitions < 0:
                raise CoordinatorException(f"topic {req.topic_name}: negative partition count {req.num_partitions}")
            rows.extend((str(req.topic_id), p, req.topic_name) for p in range(req.num_partitions))
        with self._tx() as db:
            db.executemany("INSERT OR IGNORE INTO logs (topic_id, partition, topic_name) VALUES (?, ?, ?)", rows)
            self._logs.clear()  # partitions cached as unknown may exist now

    @_guarded
    def commit_file(
        self,
        object_key: str,
        uploader_broker_id: int,
        file_size: int,
        batches: list[CommitBatchRequest],
    ) -> list[CommitBatchResponse]:
        if not isinstance(object_key, str) or not object_key:
            raise CoordinatorException(f"invalid commit: object key {object_key!r}")
        if file_size < 0:
            raise CoordinatorException(f"invalid commit of {object_key}: file size {file_size}")
        now = self._clock()
        with self._tx() as db:
            try:
                file_id = db.execute(
                    "INSERT INTO files (object_key, uploader, file_size, used_size, state, committed_at)"
                    " VALUES (?, ?, ?, 0, 'uploaded', ?)",
                    (object_key, uploader_broker_id, file_size, now),
                ).lastrowid
            except sqlite3.IntegrityError:
                raise CoordinatorException(f"object {object_key} is already committed") from None
            logs = self._logs
            producers = self._producers.loaded(db, now) if any(r.producer_id >= 0 for r in batches) else {}
            dirty = self._producers.dirty
            # Keyed by object identity: brokers reuse one TopicIdPartition per partition, and
            # hashing the dataclass (UUID included) per batch costs more than the rest of the loop.
            by_tip: dict[int, tuple[tuple[str, int], _Log | None]] = {}
            touched: dict[tuple[str, int], _Log] = {}
            responses: list[CommitBatchResponse] = []
            rows: list[tuple] = []
            topic_bytes: dict[str, list] = {}
            for i, req in enumerate(batches):
                tip = req.topic_id_partition
                entry = by_tip.get(id(tip))
                if entry is None:
                    if not isinstance(tip, TopicIdPartition):
                        raise CoordinatorException(
                            f"invalid commit of {object_key}: batch {i}: topic_id_partition is not a TopicIdPartition")
                    key = (str(tip.topic_id), tip.partition)
                    if key in logs:
                        log = logs[key]
                    else:
                        row = db.execute(
                            "SELECT topic_name, log_start_offset, high_watermark, byte_size FROM logs"
                            " WHERE topic_id = ? AND partition = ?",
                            key,
                        ).fetchone()
                        log = logs[key] = _Log(*row) if row else None
                    entry = by_tip[id(tip)] = (key, log)
                key, log = entry
                size = req.size
                offset_delta = req.last_offset - req.base_offset
                if size <= 0 or req.byte_offset < 0 or req.byte_offset + size > file_size or offset_delta < 0 \
                        or req.message_timestamp_type not in (-1, 0, 1):
                    raise CoordinatorException(f"invalid commit of {object_key}: batch {i}: {_describe_bad(req, file_size)}")
                if log is None:
                    responses.append(CommitBatchResponse.of_error(UNKNOWN_TOPIC_OR_PARTITION, req))
                    continue
                pid = req.producer_id
                producer = None
                if pid >= 0:
                    pkey = (key[0], key[1], pid)
                    producer = producers.get(pkey)
                    if producer is not None:
                        verdict = self._check_producer(producer, req)
                        if verdict.__class__ is tuple:  # duplicate: the original batch's answer
                            responses.append(CommitBatchResponse(NONE, verdict[2], verdict[4],  # type: ignore[index]
                                                                 log.log_start_offset, True, req))
                            continue
                        if verdict != NONE:
                            responses.append(CommitBatchResponse.of_error(verdict, req))  # type: ignore[arg-type]
                            continue
                base = log.high_watermark
                last = base + offset_delta
                log.high_watermark = last + 1
                log.byte_size += size
                touched[key] = log
                rows.append((key[0], key[1], base, last, file_id, req.byte_offset, size, now,
                             req.batch_max_timestamp, req.message_timestamp_type, pid, req.producer_epoch,
                             req.base_sequence, req.last_sequence))
                acc = topic_bytes.get(key[0])
                if acc is None:
                    topic_bytes[key[0]] = [log.topic_name, size]
                else:
                    acc[1] += size
                if pid >= 0:
                    if producer is None or producer.epoch != req.producer_epoch:
                        producer = producers[pkey] = _Producer(req.producer_epoch)
                    producer.append((req.base_sequence, req.last_sequence, base, last, now))
                    dirty.add(pkey)
                responses.append(CommitBatchResponse(NONE, base, now, log.log_start_offset, False, req))
            if rows:
                db.executemany(_INSERT_BATCH, rows)
            db.executemany(
                "UPDATE logs SET high_watermark = ?, byte_size = ? WHERE topic_id = ? AND partition = ?",
                [(log.high_watermark, log.byte_size, k[0], k[1]) for k, log in touched.items()],
            )
            used = sum(acc[1] for acc in topic_bytes.values())
            if used:
                db.execute("UPDATE files SET used_size = ? WHERE file_id = ?", (used, file_id))
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
                self._producers.snapshot(db, now)
            faults.pause("diskless.commit")  # crash tests only (kcli/faults.py): before COMMIT
        if self._checkpointer is not None:
            self._checkpointer.poke()
        return responses

    @staticmethod
    def _check_producer(producer: _Producer, req: CommitBatchRequest) -> int | tuple:
        """Kafka's idempotence checks (ProducerAppendInfo): a duplicate returns the cached batch,
        otherwise an error code (NONE when the batch may be appended)."""
        epoch = req.producer_epoch
        if epoch < producer.epoch:
            return INVALID_PRODUCER_EPOCH
        if epoch > producer.epoch:
            # A bumped epoch must restart its sequence at 0.
            if req.base_sequence != 0 and producer.epoch != NO_PRODUCER_EPOCH:
                return OUT_OF_ORDER_SEQUENCE_NUMBER
            return NONE
        for cached in producer.batches:
            if cached[0] == req.base_sequence and cached[1] == req.last_sequence:
                return cached
        if producer.batches:
            last_sequence = producer.batches[-1][1]
            if last_sequence != NO_SEQUENCE and not _in_sequence(last_sequence, req.base_sequence):
                return OUT_OF_ORDER_SEQUENCE_NUMBER
        return NONE

    @_guarded
    def find_batches(self, requests: list[FindBatchRequest], fetch_max_bytes: int) -> list[FindBatchResponse]:
        db = self._conn()
        out: list[FindBatchResponse] = []
        remaining = fetch_max_bytes
        min_one = True  # KIP-74: the first batch of the first non-empty partition always comes back
        db.execute("BEGIN")  # one snapshot for the whole fetch
        try:
            for req in requests:
                tip = req.topic_id_partition
                tid = str(tip.topic_id)
                row = db.execute(
                    "SELECT log_start_offset, high_watermark FROM logs WHERE topic_id = ? AND partition = ?",
                    (tid, tip.partition),
                ).fetchone()
                if row is None:
                    out.append(FindBatchResponse(UNKNOWN_TOPIC_OR_PARTITION, [], UNKNOWN_OFFSET, UNKNOWN_OFFSET))
                    continue
                lso, hwm = row
                if req.offset < lso or req.offset > hwm:
                    out.append(FindBatchResponse(OFFSET_OUT_OF_RANGE, [], lso, hwm))
                    continue
                budget = min(req.max_partition_fetch_bytes, remaining)
                found: list[BatchInfo] = []
                if req.offset < hwm and (budget > 0 or min_one):
                    taken = 0
                    cursor = db.execute(
                        f"SELECT {_BATCH_COLUMNS} FROM batches b JOIN files f ON f.file_id = b.file_id"
                        " WHERE b.topic_id = ? AND b.partition = ? AND b.last_offset >= ? ORDER BY b.last_offset",
                        (tid, tip.partition, req.offset),
                    )
                    for (batch_id, key, byte_offset, size, base, last, append_time, max_ts, ts_type,
                         pid, epoch, base_seq, last_seq) in cursor:
                        if taken + size > budget and not (min_one and not found):
                            break
                        found.append(BatchInfo(batch_id, key, BatchMetadata(
                            tip, byte_offset, size, base, last, append_time, max_ts, ts_type, pid, epoch,
                            base_seq, last_seq)))
                        taken += size
                        if taken >= budget:
                            break
                    cursor.close()
                    if found:
                        min_one = False
                        remaining -= taken
                out.append(FindBatchResponse(NONE, found, lso, hwm))
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
                    "SELECT log_start_offset, high_watermark FROM logs WHERE topic_id = ? AND partition = ?", key
                ).fetchone()
                if row is None:
                    out.append(ListOffsetsResponse(UNKNOWN_TOPIC_OR_PARTITION, tip, NO_TIMESTAMP, UNKNOWN_OFFSET))
                    continue
                lso, hwm = row
                ts = req.timestamp
                if ts in (ListOffsetsRequest.EARLIEST_TIMESTAMP, ListOffsetsRequest.EARLIEST_LOCAL_TIMESTAMP):
                    # Diskless logs have no local/remote split: the earliest local offset is the earliest.
                    out.append(ListOffsetsResponse(NONE, tip, NO_TIMESTAMP, lso))
                elif ts == ListOffsetsRequest.LATEST_TIMESTAMP:
                    out.append(ListOffsetsResponse(NONE, tip, NO_TIMESTAMP, hwm))
                elif ts == ListOffsetsRequest.LATEST_TIERED_TIMESTAMP:
                    out.append(ListOffsetsResponse(NONE, tip, NO_TIMESTAMP, UNKNOWN_OFFSET))  # nothing tiered
                elif ts == ListOffsetsRequest.MAX_TIMESTAMP:
                    # Batch granularity: the last offset of the earliest batch holding the max timestamp.
                    hit = db.execute(
                        f"SELECT last_offset, {_EFFECTIVE_TS} AS ts FROM batches WHERE topic_id = ? AND partition = ?"
                        " ORDER BY ts DESC, last_offset ASC LIMIT 1",
                        key,
                    ).fetchone()
                    if hit is None:
                        out.append(ListOffsetsResponse(NONE, tip, NO_TIMESTAMP, UNKNOWN_OFFSET))
                    else:
                        out.append(ListOffsetsResponse(NONE, tip, hit[1], max(hit[0], lso)))
                else:
                    # Batch granularity: the first batch whose timestamp reaches ts; its base offset.
                    hit = db.execute(
                        f"SELECT base_offset, {_EFFECTIVE_TS} FROM batches WHERE topic_id = ? AND partition = ?"
                        f" AND {_EFFECTIVE_TS} >= ? ORDER BY last_offset LIMIT 1",
                        (*key, ts),
                    ).fetchone()
                    if hit is None:
                        out.append(ListOffsetsResponse(NONE, tip, NO_TIMESTAMP, UNKNOWN_OFFSET))
                    else:
                        out.append(ListOffsetsResponse(NONE, tip, hit[1], max(hit[0], lso)))
        finally:
            db.execute("COMMIT")
        return out

    @_guarded
    def delete_records(self, requests: list[DeleteRecordsRequest]) -> list[DeleteRecordsResponse]:
        now = self._clock()
        out: list[DeleteRecordsResponse] = []
        with self._tx() as db:
            self._logs.clear()  # log rows change below
            for req in requests:
                tip = req.topic_id_partition
                key = (str(tip.topic_id), tip.partition)
                row = self._log_row(db, *key)
                if row is None:
                    out.append(DeleteRecordsResponse(UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_OFFSET))
                    continue
                _name, lso, hwm, _size = row
                target = hwm if req.offset == DeleteRecordsRequest.HIGH_WATERMARK else req.offset
                if target < 0 or target > hwm:
                    out.append(DeleteRecordsResponse(OFFSET_OUT_OF_RANGE, UNKNOWN_OFFSET))
                    continue
                if target <= lso:
                    out.append(DeleteRecordsResponse(NONE, lso))
                    continue
                self._delete_batches(db, "topic_id = ? AND partition = ? AND last_offset < ?", (*key, target), now)
                db.execute("UPDATE logs SET log_start_offset = ? WHERE topic_id = ? AND partition = ?",
                           (target, *key))
                out.append(DeleteRecordsResponse(NONE, target))
        return out

    @_guarded
    def delete_topics(self, topic_ids: Iterable[uuid.UUID]) -> None:
        now = self._clock()
        with self._tx() as db:
            self._logs.clear()  # log rows change below
            for topic_id in set(topic_ids):
                tid = str(topic_id)
                self._delete_batches(db, "topic_id = ?", (tid,), now, update_logs=False)
                self._producers.drop(db, tid)
                db.execute("DELETE FROM logs WHERE topic_id = ?", (tid,))

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
            db.executemany(
                "DELETE FROM files WHERE object_key = ? AND state = 'deleting'"
                " AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.file_id = files.file_id)",
                [(key,) for key in sorted(request.object_key_paths)],
            )

    @_guarded
    def is_safe_to_delete_file(self, object_key: str) -> bool:
        row = self._conn().execute(
            "SELECT EXISTS (SELECT 1 FROM batches b JOIN files f ON f.file_id = b.file_id WHERE f.object_key = ?)",
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
            self._logs.clear()  # log rows change below
            for partition in sorted(partitions):
                count, _ = self._delete_batches(db, "topic_id = ? AND partition = ?", (tid, partition), now,
                                                update_logs=False)
                deleted += count
                self._producers.drop(db, tid, partition)
                db.execute("DELETE FROM logs WHERE topic_id = ? AND partition = ?", (tid, partition))
        return deleted

    @_guarded
    def enforce_retention(
        self, requests: Iterable[RetentionRequest | tuple[TopicIdPartition, int, int]], now_ms: int
    ) -> list[RetentionResult]:
        out: list[RetentionResult] = []
        with self._tx() as db:
            self._logs.clear()  # log rows change below
            for request in requests:
                tip, retention_ms, retention_bytes = request
                key = (str(tip.topic_id), tip.partition)
                row = self._log_row(db, *key)
                if row is None:
                    out.append(RetentionResult(tip, UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_OFFSET, 0, 0))
                    continue
                _name, lso, _hwm, size = row
                if retention_ms < 0 and (retention_bytes < 0 or size <= retention_bytes):
                    out.append(RetentionResult(tip, NONE, lso, 0, 0))
                    continue
                cutoff = None  # first offset kept
                count = freed = 0
                remaining = size
                horizon = now_ms - retention_ms
                cursor = db.execute(
                    f"SELECT last_offset, byte_size, {_EFFECTIVE_TS} FROM batches"
                    " WHERE topic_id = ? AND partition = ? ORDER BY last_offset",
                    key,
                )
                for last, bsize, ts in cursor:
                    by_time = retention_ms >= 0 and ts < horizon
                    # Kafka's size rule: drop a batch only if what stays is still >= retention.bytes.
                    by_size = retention_bytes >= 0 and remaining - bsize >= retention_bytes
                    if not (by_time or by_size):
                        break
                    cutoff = last + 1
                    count += 1
                    freed += bsize
                    remaining -= bsize
                cursor.close()
                if cutoff is None:
                    out.append(RetentionResult(tip, NONE, lso, 0, 0))
                    continue
                self._delete_batches(db, "topic_id = ? AND partition = ? AND last_offset < ?", (*key, cutoff),
                                     now_ms)
                new_lso = max(lso, cutoff)
                db.execute("UPDATE logs SET log_start_offset = ? WHERE topic_id = ? AND partition = ?",
                           (new_lso, *key))
                out.append(RetentionResult(tip, NONE, new_lso, count, freed))
        return out

    @_guarded
    def describe_logs(self, topic_ids: Iterable[uuid.UUID] | None = None) -> list[LogInfo]:
        sql = (
            "SELECT l.topic_id, l.topic_name, l.partition, l.log_start_offset, l.high_watermark, l.byte_size,"
            " (SELECT COUNT(*) FROM batches b WHERE b.topic_id = l.topic_id AND b.partition = l.partition)"
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
        if state is not None and state not in (FILE_STATE_UPLOADED, FILE_STATE_DELETING):
            raise CoordinatorException(f"unknown file state {state!r} (expected uploaded or deleting)")
        db = self._conn()
        clauses, params = [], []
        if state is not None:
            clauses.append("f.state = ?")
            params.append(state)
        if object_key is not None:
            clauses.append("f.object_key = ?")
            params.append(object_key)
        if topic_id is not None:
            clauses.append("EXISTS (SELECT 1 FROM file_topics ft WHERE ft.file_id = f.file_id AND ft.topic_id = ?)")
            params.append(str(topic_id))
        sql = (
            "SELECT f.file_id, f.object_key, f.file_size, f.used_size, f.state, f.committed_at,"
            " f.marked_for_deletion_at, f.uploader,"
            " (SELECT COUNT(*) FROM batches b WHERE b.file_id = f.file_id) FROM files f"
        )
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        sql += " ORDER BY f.committed_at, f.file_id"
        out = []
        db.execute("BEGIN")
        try:
            for file_id, key, fsize, used, st, committed, marked, uploader, count in db.execute(sql, params).fetchall():
                parts = db.execute(
                    "SELECT DISTINCT b.topic_id, l.topic_name, b.partition FROM batches b"
                    " JOIN logs l ON l.topic_id = b.topic_id AND l.partition = b.partition"
                    " WHERE b.file_id = ? ORDER BY l.topic_name, b.partition",
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
            f"SELECT {_BATCH_COLUMNS}, b.topic_id, l.topic_name, b.partition FROM batches b"
            " JOIN files f ON f.file_id = b.file_id"
            " JOIN logs l ON l.topic_id = b.topic_id AND l.partition = b.partition"
            " WHERE f.object_key = ? ORDER BY b.byte_offset",
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
        out: dict[str, TopicStorageInfo] = {}
        for tid, name, live, nfiles, fsize, ndead, dsize in stats:
            out[tid] = TopicStorageInfo(uuid.UUID(tid), names.get(tid, name), live, nfiles, fsize, ndead, dsize)
        for tid, name in names.items():
            if tid not in out:
                out[tid] = TopicStorageInfo(uuid.UUID(tid), name, 0, 0, 0, 0, 0)
        result = [info for tid, info in out.items() if wanted is None or tid in wanted]
        result.sort(key=lambda info: (info.topic, str(info.topic_id)))
        return result

