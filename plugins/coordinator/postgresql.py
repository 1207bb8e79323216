"""The batch coordinator in PostgreSQL: one shared state for several brokers (cluster mode).

Same semantics as the SQLite coordinator (plugins/coordinator/sqlite.py, docs/batch-coordinator.md);
what differs is that any number of brokers (processes, each with its own instance) commit to the
same partitions at once. Nothing that another broker can change is cached: every commit reads the
logs it appends to and their producers' idempotence state under row locks (``SELECT ... FOR
UPDATE``, always in log_id order, so two commits never deadlock), in one READ COMMITTED
transaction. Commits of the same partition therefore serialise; commits of different partitions
do not (no global lock, no global counter: batch ids come from a sequence). This is the design of
Aiven's Inkless control plane (``commit_file_v1``), with the per-batch logic in Python.

Every wait on the database is bounded: ``connect.timeout.ms`` (libpq connect_timeout),
``statement.timeout.ms`` (server-side statement_timeout, which also bounds lock waits) and
``pool.timeout.ms`` (waiting for a free pooled connection). Any failure is a CoordinatorException;
the broker answers the produce with a retriable error, and the next call gets a checked (or new)
connection, so the coordinator recovers by itself when the server is back.

Schema: versioned migrations (``schema_version`` table) applied at open under a transaction-level
advisory lock with ``SET LOCAL lock_timeout`` (see _migrate).
"""

from __future__ import annotations

import functools
import struct
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from plugins.coordinator.base import (
    FILE_STATE_DELETING,
    FILE_STATE_UPLOADED,
    INVALID_PRODUCER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    NONE,
    OFFSET_OUT_OF_RANGE,
    TXN_COMMIT,
    TXN_DATA,
    UNKNOWN_OFFSET,
    AbortedTransaction,
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
    ProducerInfo,
    RetentionRequest,
    RetentionResult,
    TopicIdPartition,
    TopicStorageInfo,
    UploadIntent,
)

# Kafka's idempotence rules and the malformed-batch messages are the SQLite coordinator's, shared
# so that both answer exactly alike (the contract tests run against both).
from plugins.coordinator.sqlite import (
    _ENTRY,
    _TIMESTAMP_TYPES,
    INT32_MAX,
    PRODUCER_STATE_BATCHES,
    SqliteBatchCoordinator,
    _checkpoint_key,
    _describe_bad,
    check_replacement,
    _Producer,
)
from plugins.coordinator.txn import TxnChanges, TxnEvent, apply_events

SCHEMA_VERSION = 2
SCHEMES = ("postgresql", "postgres")
# pg_advisory_xact_lock key of the migration (any constant; "kcli" in ASCII).
MIGRATION_LOCK_KEY = 0x6B636C69
MIGRATION_LOCK_TIMEOUT_MS = 2000
MIGRATION_ATTEMPTS = 10
FIND_FIRST_CHUNK = 100  # batch rows read with the log row (a 1 MiB fetch of 16 KiB batches needs 64)
FIND_CHUNK = 500  # batch rows per further query while filling a fetch

# Version 1. Offsets, sizes and times are bigint (Kafka's int64); sequences int (int32), epochs
# smallint (int16), timestamp types smallint. batches is keyed like SQLite's (one B-tree range
# per fetch); the index on file_id finds an object's batches (inspection, is_safe_to_delete).
_V1 = (
    "CREATE TABLE kcli_meta (key text PRIMARY KEY, value text NOT NULL)",
    """CREATE TABLE logs (
        log_id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        topic_id         uuid    NOT NULL,
        partition        integer NOT NULL,
        topic_name       text    NOT NULL,
        log_start_offset bigint  NOT NULL DEFAULT 0,
        high_watermark   bigint  NOT NULL DEFAULT 0,
        byte_size        bigint  NOT NULL DEFAULT 0,
        UNIQUE (topic_id, partition)) WITH (fillfactor = 50)""",
    """CREATE TABLE files (
        file_id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        object_key             text    NOT NULL UNIQUE,
        uploader               integer NOT NULL,
        file_size              bigint  NOT NULL,
        used_size              bigint  NOT NULL,
        state                  text    NOT NULL CHECK (state IN ('uploaded', 'deleting')),
        committed_at           bigint  NOT NULL,
        marked_for_deletion_at bigint)""",
    "CREATE INDEX files_by_state ON files (state, marked_for_deletion_at)",
    "CREATE SEQUENCE batch_ids",
    """CREATE TABLE batches (
        log_id              bigint   NOT NULL,
        last_offset         bigint   NOT NULL,
        base_offset         bigint   NOT NULL,
        file_id             bigint   NOT NULL,
        byte_offset         bigint   NOT NULL,
        byte_size           bigint   NOT NULL,
        log_append_time     bigint   NOT NULL,
        batch_max_timestamp bigint   NOT NULL,
        timestamp_type      smallint NOT NULL,
        producer_id         bigint   NOT NULL,
        producer_epoch      smallint NOT NULL,
        base_sequence       integer  NOT NULL,
        last_sequence       integer  NOT NULL,
        batch_id            bigint   NOT NULL DEFAULT nextval('batch_ids'),
        PRIMARY KEY (log_id, last_offset))""",
    "CREATE INDEX batches_by_file ON batches (file_id)",
    """CREATE TABLE producer_state (
        log_id         bigint   NOT NULL REFERENCES logs (log_id) ON DELETE CASCADE,
        producer_id    bigint   NOT NULL,
        producer_epoch smallint NOT NULL,
        batches        bytea    NOT NULL,
        PRIMARY KEY (log_id, producer_id)) WITH (fillfactor = 50)""",
    """CREATE TABLE file_topics (
        file_id         bigint NOT NULL REFERENCES files (file_id) ON DELETE CASCADE,
        topic_id        uuid   NOT NULL,
        topic_name      text   NOT NULL,
        committed_bytes bigint NOT NULL,
        live_bytes      bigint NOT NULL,
        PRIMARY KEY (file_id, topic_id))""",
    "CREATE INDEX file_topics_by_topic ON file_topics (topic_id)",
    """CREATE TABLE upload_intents (
        object_key text    PRIMARY KEY,
        broker_id  integer NOT NULL,
        created_at bigint  NOT NULL)""",
)
# Version N's statements at index N - 1. A step must be quick under the migration's lock_timeout:
# add nullable columns or new tables, build indexes on big tables CONCURRENTLY (outside the
# transaction, a separate step), never rewrite a table in place (docs/batch-coordinator.md).
# Version 2: transactions of diskless partitions (plugins/coordinator/txn.py), two new tables.
_V2 = (
    """CREATE TABLE txn_open (
        log_id       bigint NOT NULL REFERENCES logs (log_id) ON DELETE CASCADE,
        producer_id  bigint NOT NULL,
        first_offset bigint NOT NULL,
        PRIMARY KEY (log_id, producer_id))""",
    """CREATE TABLE txn_aborted (
        log_id       bigint NOT NULL REFERENCES logs (log_id) ON DELETE CASCADE,
        last_offset  bigint NOT NULL,
        producer_id  bigint NOT NULL,
        first_offset bigint NOT NULL,
        PRIMARY KEY (log_id, last_offset))""",
)
MIGRATIONS: tuple[tuple[str, ...], ...] = (_V1, _V2)

_BATCH_COLUMNS = (
    "b.batch_id, f.object_key, b.byte_offset, b.byte_size, b.base_offset, b.last_offset, b.log_append_time,"
    " b.batch_max_timestamp, b.timestamp_type, b.producer_id, b.producer_epoch, b.base_sequence, b.last_sequence"
)
_FIND_FIRST = (
    "SELECT l.log_id, l.log_start_offset, l.high_watermark,"
    " (SELECT min(first_offset) FROM txn_open t WHERE t.log_id = l.log_id),"
    " x.batch_id, x.object_key, x.byte_offset, x.byte_size, x.base_offset, x.last_offset, x.log_append_time,"
    " x.batch_max_timestamp, x.timestamp_type, x.producer_id,"
    " x.producer_epoch, x.base_sequence, x.last_sequence"
    " FROM logs l LEFT JOIN LATERAL (SELECT b.*, f.object_key FROM (SELECT * FROM batches"
    "  WHERE log_id = l.log_id AND last_offset >= %s AND last_offset < l.high_watermark"
    "  ORDER BY last_offset LIMIT %s) b JOIN files f ON f.file_id = b.file_id) x ON l.log_start_offset <= %s"
    " WHERE l.topic_id = %s AND l.partition = %s ORDER BY x.last_offset"
)
_EFFECTIVE_TS = "(CASE WHEN timestamp_type = 1 THEN log_append_time ELSE batch_max_timestamp END)"
_COPY_BATCHES = (
    "COPY batches (log_id, last_offset, base_offset, file_id, byte_offset, byte_size, log_append_time,"
    " batch_max_timestamp, timestamp_type, producer_id, producer_epoch, base_sequence, last_sequence)"
    " FROM STDIN (FORMAT BINARY)"
)
_COPY_TYPES = ("int8", "int8", "int8", "int8", "int8", "int8", "int8", "int8", "int2", "int8", "int2", "int4", "int4")

# Lock the logs' rows in log_id order: two commits never wait for each other crosswise (no deadlock).
_LOCK_LOGS = (
    "SELECT l.log_id, l.topic_id, l.partition, l.topic_name, l.log_start_offset, l.high_watermark, l.byte_size"
    " FROM logs l JOIN unnest(%b::uuid[], %b::integer[]) AS k (topic_id, partition)"
    " ON l.topic_id = k.topic_id AND l.partition = k.partition ORDER BY l.log_id FOR UPDATE OF l"
)

# A commit's producer state goes in two statements: rows read under the logs' locks are UPDATEd
# (a HOT update each: fillfactor 50, no indexed column changes), new producers INSERTed. One
# INSERT ... ON CONFLICT DO UPDATE for both cost a speculative-insertion check and a tuple lock
# (one more WAL record) per row. The insert keeps ON CONFLICT only as a guard: a producer's row
# changes only under its log's row lock, which this commit holds.
_UPDATE_PRODUCERS = (
    "UPDATE producer_state p SET producer_epoch = v.epoch, batches = v.batches"
    " FROM unnest(%b::bigint[], %b::bigint[], %b::smallint[], %b::bytea[]) AS v (log_id, producer_id, epoch, batches)"
    " WHERE p.log_id = v.log_id AND p.producer_id = v.producer_id"
)
_INSERT_PRODUCERS = (
    "INSERT INTO producer_state (log_id, producer_id, producer_epoch, batches)"
    " SELECT * FROM unnest(%b::bigint[], %b::bigint[], %b::smallint[], %b::bytea[])"
    " ON CONFLICT (log_id, producer_id) DO UPDATE"
    " SET producer_epoch = excluded.producer_epoch, batches = excluded.batches"
)

# The stored state of the (partition, producer) pairs of a commit. Partitions are sent once, as
# the lock statement has them; pairs refer to them by position (a slot + 1, as ORDINALITY counts).
# prepare=False where it runs: a prepared statement's generic plan, made for arrays of unknown
# length, joined ~900 pairs 2-3x slower than a plan for the actual arrays.
_READ_PRODUCERS = (
    "SELECT l.log_id, p.producer_id, p.producer_epoch, p.batches"
    " FROM unnest(%b::uuid[], %b::integer[]) WITH ORDINALITY AS k (topic_id, partition, slot)"
    " JOIN logs l ON l.topic_id = k.topic_id AND l.partition = k.partition"
    " JOIN unnest(%b::bigint[], %b::bigint[]) AS t (slot, producer_id) ON t.slot = k.slot"
    " JOIN producer_state p ON p.log_id = l.log_id AND p.producer_id = t.producer_id"
)

F = TypeVar("F", bound=Callable[..., Any])


_STATE_BYTES = _ENTRY.size * PRODUCER_STATE_BATCHES
# A stored state of n entries unpacked in one call (n = 1..5): half the CPU of iter_unpack, and a
# commit reads ~900 of them in the bench's idempotent objects.
_STATES = {n: struct.Struct(">" + _ENTRY.format.lstrip(">") * n) for n in range(1, PRODUCER_STATE_BATCHES + 1)}


class _PackedProducer:
    """A producer's stored state kept as its bytes while its batches arrive in order.

    A commit reads and rewrites the state of every (partition, producer) it touches (~900 in the
    bench's idempotent objects): decoding each into a _Producer ring and encoding it back cost
    ~5 ms of CPU per commit, and garbage-collector churn. ``next_sequence`` means what it means
    for _Producer: set while the stored batches form one chain (each base <= its last, each base =
    the previous last + 1), so a batch starting there is in order and no duplicate. Only such a
    batch, or the first batch of a new producer, is appended here; for anything else the commit
    loop decodes a _Producer and runs Kafka's full checks."""

    __slots__ = ("blob", "epoch", "next_sequence")

    def __init__(self, epoch: int, blob: bytes = b"") -> None:
        self.epoch = epoch
        self.blob = blob
        self.next_sequence: int | None = None
        layout = _STATES.get(len(blob) // _ENTRY.size)
        if layout is None or layout.size != len(blob):  # empty (or not whole entries: the full checks)
            return
        values = layout.unpack(blob)
        prev_last: int | None = None
        for base_seq, last_seq in zip(values[0::5], values[1::5]):  # 5 fields an entry (_ENTRY)
            if base_seq > last_seq or (prev_last is not None and base_seq != prev_last + 1):
                return
            prev_last = last_seq
        self.next_sequence = prev_last + 1

    def append(self, base_seq: int, last_seq: int, base_offset: int, last_offset: int, append_time: int) -> None:
        """Only for a new producer or a batch at ``next_sequence`` (see the class docstring)."""
        blob = self.blob + _ENTRY.pack(base_seq, last_seq, base_offset, last_offset, append_time)
        self.blob = blob[-_STATE_BYTES:] if len(blob) > _STATE_BYTES else blob
        self.next_sequence = last_seq + 1 if base_seq <= last_seq else None

    def encode(self) -> bytes:
        return self.blob


def _rollback(conn: psycopg.Connection) -> None:
    """End a manually begun transaction after a failure (a broken connection is discarded by the
    pool anyway)."""
    try:
        if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.rollback()
    except psycopg.Error:
        pass


def _guarded(func: F) -> F:
    """Database and pool failures surface as CoordinatorException (the transaction rolled back:
    nothing changed, unless the connection broke during COMMIT — then the outcome is unknown, as
    for any remote commit, and an idempotent producer's retry is recognised as a duplicate)."""

    @functools.wraps(func)
    def wrapper(self: PostgresBatchCoordinator, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(self, *args, **kwargs)
        except PoolTimeout as err:
            raise CoordinatorException(
                f"{func.__name__} failed on {self.path}: no database connection within"
                f" {self._pool_timeout_ms} ms ({err})") from None
        except (psycopg.Error, OverflowError) as err:
            message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise CoordinatorException(f"{func.__name__} failed on {self.path}: {message}") from None

    return wrapper  # type: ignore[return-value]


def redact(url: str) -> str:
    """The URL without its password (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _positive_int(configs: dict[str, str], key: str, default: int) -> int:
    raw = configs.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(str(raw))
    except ValueError:
        raise CoordinatorException(f"PostgresBatchCoordinator config {key}: not an integer: {raw!r}") from None
    if value <= 0:
        raise CoordinatorException(f"PostgresBatchCoordinator config {key}: must be positive, got {value}")
    return value


class PostgresBatchCoordinator(BatchCoordinator):
    """KIP-1164 BatchCoordinator over PostgreSQL (psycopg 3 with its connection pool).

    Configs (``diskless.coordinator.`` stripped): ``url`` (``postgresql://user@host:port/db``),
    ``pool.min.size`` (1), ``pool.max.size`` (4), ``pool.timeout.ms`` (10000),
    ``connect.timeout.ms`` (5000), ``statement.timeout.ms`` (30000). Thread-safe.
    """

    CONFIGS = frozenset({"url", "pool.min.size", "pool.max.size", "pool.timeout.ms", "connect.timeout.ms",
                         "statement.timeout.ms"})

    def __init__(
        self,
        url: str | None = None,
        *,
        read_only: bool = False,
        clock: Callable[[], int] | None = None,
        **settings: str,
    ) -> None:
        self._pool: ConnectionPool | None = None
        self._url = "<unconfigured>"
        self._read_only = read_only
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self._pool_timeout_ms = 10_000
        self._lock = threading.Lock()
        if url is not None:
            self.configure({"url": url, **settings})

    # -- lifecycle ------------------------------------------------------------------------------

    def configure(self, configs: dict[str, str]) -> None:
        unknown = set(configs) - self.CONFIGS
        if unknown:
            raise CoordinatorException(f"unknown PostgresBatchCoordinator config(s): {', '.join(sorted(unknown))}")
        url = configs.get("url") or ""
        if urlsplit(url).scheme.lower() not in SCHEMES:
            raise CoordinatorException(
                "PostgresBatchCoordinator needs config url (postgresql://user@host:port/database), got"
                f" {redact(url)!r}")
        min_size = _positive_int(configs, "pool.min.size", 1)
        max_size = _positive_int(configs, "pool.max.size", 4)
        if max_size < min_size:
            raise CoordinatorException(f"PostgresBatchCoordinator: pool.max.size {max_size} < pool.min.size {min_size}")
        pool_timeout_ms = _positive_int(configs, "pool.timeout.ms", 10_000)
        connect_timeout_s = max(1, -(-_positive_int(configs, "connect.timeout.ms", 5000) // 1000))  # libpq: seconds
        statement_timeout_ms = _positive_int(configs, "statement.timeout.ms", 30_000)
        with self._lock:
            self.close()
            self._url = url
            self._pool_timeout_ms = pool_timeout_ms
            # enable_bitmapscan=off: every hot query reads a key range of a primary key in order
            # (a log's batches from an offset, LIMIT n). With statistics that lag behind a
            # fast-growing batches table, the planner preferred a bitmap scan of the whole range
            # plus a sort: 40-150 ms instead of 0.3 ms for a fetch from a 300,000-batch log.
            options = f"-c statement_timeout={statement_timeout_ms} -c idle_in_transaction_session_timeout=" \
                      f"{max(statement_timeout_ms, 60_000)} -c enable_bitmapscan=off"
            if self._read_only:
                options += " -c default_transaction_read_only=on"
            kwargs = {"autocommit": True, "connect_timeout": connect_timeout_s, "options": options,
                      "application_name": "kcli-coordinator"}
            try:
                # One connection first: a wrong URL or a dead server fails here, with its reason,
                # instead of as a pool timeout.
                with psycopg.connect(url, **kwargs) as conn:  # type: ignore[arg-type]
                    if self._read_only:
                        self._check_schema(conn)
                    else:
                        self._migrate(conn)
            except psycopg.Error as err:
                raise CoordinatorException(f"cannot open coordinator database {redact(url)}: "
                                           f"{str(err).strip().splitlines()[0] if str(err).strip() else err!r}") from None
            self._pool = ConnectionPool(
                url, min_size=min_size, max_size=max_size, kwargs=kwargs, timeout=pool_timeout_ms / 1000,
                # A connection broken by a server restart is found (and replaced) at checkout,
                # not by the caller's statement: calls succeed again once the server is back.
                check=ConnectionPool.check_connection,
                reconnect_timeout=max(pool_timeout_ms / 1000, 1.0), name="kcli-coordinator", open=False,
            )
            self._pool.open(wait=False)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close(timeout=5.0)

    @property
    def path(self) -> str:
        """Where the state lives (messages; kcli/diskless/identity.py names it so)."""
        return redact(self._url)

    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection]:
        pool = self._pool
        if pool is None:
            raise CoordinatorException("PostgresBatchCoordinator is not open: configure url first")
        with pool.connection() as conn:
            yield conn

    @contextmanager
    def _tx(self) -> Iterator[psycopg.Cursor]:
        """One READ COMMITTED transaction; rolled back on any exception."""
        if self._read_only:
            raise CoordinatorException(f"coordinator {self.path} is open read-only (readonly)")
        with self._conn() as conn, conn.transaction(), conn.cursor() as cur:
            yield cur

    # -- schema ----------------------------------------------------------------------------------

    @staticmethod
    def _version(conn: psycopg.Connection) -> int | None:
        row = conn.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone()
        if not row or not row[0]:
            return None
        row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def _check_schema(self, conn: psycopg.Connection) -> None:
        version = self._version(conn)
        if version is None:
            raise CoordinatorException(f"{self.path} is not a kcli coordinator database (no schema version)")
        if version != SCHEMA_VERSION:
            raise CoordinatorException(
                f"{self.path}: schema version {version}, this kcli understands {SCHEMA_VERSION}")

    def _migrate(self, conn: psycopg.Connection) -> None:
        """Apply the missing migration steps, each version in its own transaction.

        pg_advisory_xact_lock makes brokers that start together take turns (the second finds
        the work done). ``SET LOCAL lock_timeout`` bounds how long a step may queue for a table
        lock: DDL waiting for an ACCESS EXCLUSIVE lock would block every commit queued behind it,
        so a step that cannot get its locks within MIGRATION_LOCK_TIMEOUT_MS gives up, lets
        produce through, and is retried after a pause (MIGRATION_ATTEMPTS times)."""
        for attempt in range(MIGRATION_ATTEMPTS):
            try:
                while True:
                    with conn.transaction():
                        conn.execute(f"SET LOCAL lock_timeout = {MIGRATION_LOCK_TIMEOUT_MS}")
                        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
                        conn.execute("CREATE TABLE IF NOT EXISTS schema_version ("
                                     " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
                        version = self._version(conn) or 0
                        if version > SCHEMA_VERSION:
                            raise CoordinatorException(
                                f"{self.path}: schema version {version}, this kcli understands {SCHEMA_VERSION}")
                        if version == SCHEMA_VERSION:
                            return
                        for statement in MIGRATIONS[version]:
                            conn.execute(statement)
                        conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (version + 1,))
            except psycopg.errors.LockNotAvailable:
                if attempt == MIGRATION_ATTEMPTS - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))

    # -- helpers ---------------------------------------------------------------------------------

    @staticmethod
    def _lock_logs(cur: psycopg.Cursor, keys: Iterable[tuple[uuid.UUID, int]]) -> dict[tuple[uuid.UUID, int], tuple]:
        """Lock the logs' rows in log_id order (no deadlocks between brokers); returns
        (topic_id, partition) → (log_id, topic_name, log_start_offset, high_watermark, byte_size)."""
        keys = list(keys)
        if not keys:
            return {}
        rows = cur.execute(_LOCK_LOGS, ([k[0] for k in keys], [k[1] for k in keys])).fetchall()
        return {(tid, part): (log_id, name, lso, hwm, size) for log_id, tid, part, name, lso, hwm, size in rows}

    @staticmethod
    def _lock_logs_of_topics(cur: psycopg.Cursor, topic_ids: list[uuid.UUID]) -> list[tuple[int, uuid.UUID, int]]:
        return cur.execute(
            "SELECT log_id, topic_id, partition FROM logs WHERE topic_id = ANY(%s) ORDER BY log_id FOR UPDATE",
            (topic_ids,),
        ).fetchall()

    @staticmethod
    def _delete_batches(cur: psycopg.Cursor, log_id: int, topic_id: uuid.UUID, below: int | None,
                        freed_per_file: dict[tuple[int, uuid.UUID], int]) -> tuple[int, int]:
        """Delete the log's batches (last_offset < ``below``, or all); adds the bytes freed per
        (file, topic) to ``freed_per_file`` for _release_files. Returns (batches, bytes). Aborted
        transactions that end below ``below`` go too (no fetch can overlap them any more)."""
        if below is not None:
            cur.execute("DELETE FROM txn_aborted WHERE log_id = %s AND last_offset < %s", (log_id, below))
        if below is None:
            rows = cur.execute(
                "WITH d AS (DELETE FROM batches WHERE log_id = %s RETURNING file_id, byte_size)"
                " SELECT file_id, sum(byte_size), count(*) FROM d GROUP BY file_id", (log_id,)).fetchall()
        else:
            rows = cur.execute(
                "WITH d AS (DELETE FROM batches WHERE log_id = %s AND last_offset < %s RETURNING file_id, byte_size)"
                " SELECT file_id, sum(byte_size), count(*) FROM d GROUP BY file_id", (log_id, below)).fetchall()
        count = freed = 0
        for file_id, size, n in rows:
            key = (file_id, topic_id)
            freed_per_file[key] = freed_per_file.get(key, 0) + int(size)
            count += n
            freed += int(size)
        return count, freed

    @staticmethod
    def _release_files(cur: psycopg.Cursor, freed_per_file: dict[tuple[int, uuid.UUID], int], now: int) -> None:
        """Subtract freed bytes from the objects' used size and their topics' live bytes, and
        mark objects left empty 'deleting'. The files rows are locked in file_id order first:
        brokers deleting from shared objects take the same locks in the same order."""
        if not freed_per_file:
            return
        per_file: dict[int, int] = {}
        for (file_id, _tid), size in freed_per_file.items():
            per_file[file_id] = per_file.get(file_id, 0) + size
        ids = sorted(per_file)
        cur.execute("SELECT file_id FROM files WHERE file_id = ANY(%s) ORDER BY file_id FOR UPDATE", (ids,))
        keys = sorted(freed_per_file)
        cur.execute(
            "UPDATE file_topics ft SET live_bytes = ft.live_bytes - v.size"
            " FROM unnest(%b::bigint[], %b::uuid[], %b::bigint[]) AS v (file_id, topic_id, size)"
            " WHERE ft.file_id = v.file_id AND ft.topic_id = v.topic_id",
            ([k[0] for k in keys], [k[1] for k in keys], [freed_per_file[k] for k in keys]),
        )
        cur.execute(
            "UPDATE files f SET used_size = f.used_size - v.size,"
            " state = CASE WHEN f.used_size - v.size = 0 AND f.state = 'uploaded' THEN 'deleting' ELSE f.state END,"
            " marked_for_deletion_at = CASE WHEN f.used_size - v.size = 0 AND f.state = 'uploaded' THEN %s"
            " ELSE f.marked_for_deletion_at END"
            " FROM unnest(%b::bigint[], %b::bigint[]) AS v (file_id, size) WHERE f.file_id = v.file_id",
            (now, ids, [per_file[i] for i in ids]),
        )

    @staticmethod
    def _batch_info(row: tuple, tip: TopicIdPartition) -> BatchInfo:
        (batch_id, object_key, byte_offset, byte_size, base, last, append_time, max_ts, ts_type,
         pid, epoch, base_seq, last_seq) = row
        return BatchInfo(batch_id, object_key, BatchMetadata(
            tip, byte_offset, byte_size, base, last, append_time, max_ts, ts_type, pid, epoch, base_seq, last_seq))

    # -- KIP-1164 operations -------------------------------------------------------------------

    @_guarded
    def create_topic_and_partitions(self, requests: Iterable[CreateTopicAndPartitionsRequest]) -> None:
        tids, parts, names = [], [], []
        for req in requests:
            if req.num_partitions < 0:
                raise CoordinatorException(f"topic {req.topic_name}: negative partition count {req.num_partitions}")
            for p in range(req.num_partitions):
                tids.append(req.topic_id)
                parts.append(p)
                names.append(req.topic_name)
        if not tids:
            return
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO logs (topic_id, partition, topic_name)"
                " SELECT * FROM unnest(%b::uuid[], %b::integer[], %b::text[]) ORDER BY 1, 2"
                " ON CONFLICT (topic_id, partition) DO NOTHING",
                (tids, parts, names),
            )

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
        if not isinstance(object_key, str) or not object_key:
            raise CoordinatorException(f"invalid commit: object key {object_key!r}")
        if file_size < 0:
            raise CoordinatorException(f"invalid commit of {object_key}: file size {file_size}")
        # Each partition of the object gets a slot (0, 1, ...); batches and producers refer to it,
        # so the loops below hash ints, not UUIDs (Python-level hashing: ~1 ms per 1,000 batches).
        # An object's batches share their TopicIdPartition objects, hence the lookup by identity.
        keys: dict[tuple[uuid.UUID, int], int] = {}
        by_tip: dict[int, int] = {}
        slots: list[int] = []
        pairs: set[tuple[int, int]] = set()  # (slot, producer id) of the idempotent batches
        for i, req in enumerate(batches):
            tip = req.topic_id_partition
            slot = by_tip.get(id(tip))
            if slot is None:
                if not isinstance(tip, TopicIdPartition):
                    raise CoordinatorException(
                        f"invalid commit of {object_key}: batch {i}: topic_id_partition is not a TopicIdPartition")
                slot = by_tip[id(tip)] = keys.setdefault((tip.topic_id, tip.partition), len(keys))
            slots.append(slot)
            if req.producer_id >= 0:
                pairs.add((slot, req.producer_id))
        if self._read_only:
            raise CoordinatorException(f"coordinator {self.path} is open read-only (readonly)")
        now = self._clock()
        # Round trips cost most under load (each wakes the server and this process): the
        # statements before the batch rows go in one pipeline, the COPY follows, and the updates
        # after it go with the COMMIT in another.
        with self._conn() as conn, conn.cursor() as cur:
            try:
                return self._commit(conn, cur, object_key, uploader_broker_id, file_size, batches, keys, slots,
                                    sorted(pairs), now, require_intent)
            except BaseException:
                _rollback(conn)
                raise

    def _commit(self, conn: psycopg.Connection, cur: psycopg.Cursor, object_key: str, uploader_broker_id: int,
                file_size: int, batches: list[CommitBatchRequest], keys: dict[tuple[uuid.UUID, int], int],
                slots: list[int], pairs: list[tuple[int, int]], now: int,
                require_intent: bool = False) -> list[CommitBatchResponse]:
        file_cur, log_cur, producer_cur = conn.cursor(), conn.cursor(), conn.cursor(binary=True)
        with conn.pipeline():
            cur.execute("BEGIN")
            file_cur.execute(
                # The intent's row lock orders this against claim_orphans: with require_intent,
                # a commit whose intent was claimed inserts nothing.
                "WITH intent AS (DELETE FROM upload_intents WHERE object_key = %(key)s RETURNING 1),"
                " file AS (INSERT INTO files (object_key, uploader, file_size, used_size, state, committed_at)"
                " SELECT %(key)s::text, %(uploader)s::integer, %(size)s::bigint, 0, 'uploaded', %(now)s::bigint"
                " WHERE NOT %(require)s::boolean OR EXISTS (SELECT 1 FROM intent)"
                " ON CONFLICT (object_key) DO NOTHING RETURNING file_id)"
                " SELECT (SELECT file_id FROM file), EXISTS (SELECT 1 FROM intent)",
                {"key": object_key, "uploader": uploader_broker_id, "size": file_size, "now": now,
                 "require": require_intent},
            )
            topic_ids, partitions = [k[0] for k in keys], [k[1] for k in keys]
            log_cur.execute(_LOCK_LOGS, (topic_ids, partitions))
            if pairs:
                # Runs after the lock above (a pipeline keeps the order): the state read is current.
                producer_cur.execute(_READ_PRODUCERS, (topic_ids, partitions, [p[0] + 1 for p in pairs],
                                                       [p[1] for p in pairs]), prepare=False)
        row = file_cur.fetchone()
        if row[0] is None:
            if require_intent and not row[1]:
                raise CoordinatorException(f"upload intent of {object_key} is gone: the object was claimed as an orphan")
            raise CoordinatorException(f"object {object_key} is already committed")
        file_id = row[0]
        logs: list[tuple | None] = [None] * len(keys)  # by slot
        for log_id, tid, part, name, lso, hwm, size in log_cur.fetchall():
            logs[keys[(tid, part)]] = (log_id, name, lso, hwm, size)
        producers: dict[tuple[int, int], _Producer | _PackedProducer] = {}
        if pairs:
            for log_id, pid, epoch, blob in producer_cur.fetchall():
                producers[(log_id, pid)] = _PackedProducer(epoch, bytes(blob))
        stored = set(producers)  # rows to UPDATE; the others are INSERTed
        # log_id → [topic_id, topic_name, hwm, byte size, hwm before, byte size before]
        state: dict[int, list] = {}
        changed_producers: set[tuple[int, int]] = set()
        responses: list[CommitBatchResponse] = []
        rows: list[tuple] = []
        txn_events: list[TxnEvent] = []
        for i, req in enumerate(batches):
            tip = req.topic_id_partition
            size, byte_offset, delta = req.size, req.byte_offset, req.last_offset - req.base_offset
            if size <= 0 or byte_offset < 0 or byte_offset + size > file_size or delta < 0 \
                    or req.message_timestamp_type not in _TIMESTAMP_TYPES:
                raise CoordinatorException(f"invalid commit of {object_key}: batch {i}: {_describe_bad(req, file_size)}")
            log = logs[slots[i]]
            if log is None:
                responses.append(CommitBatchResponse.of_error(UNKNOWN_TOPIC_OR_PARTITION, req))
                continue
            log_id, name, lso, hwm0, bytes0 = log
            st = state.get(log_id)
            if st is None:
                st = state[log_id] = [tip.topic_id, name, hwm0, bytes0, hwm0, bytes0]
            pid = req.producer_id
            if pid >= 0:
                epoch, base_seq, last_seq = req.producer_epoch, req.base_sequence, req.last_sequence
                if not (-0x8000 <= epoch <= 0x7FFF and -0x80000000 <= base_seq <= INT32_MAX
                        and -0x80000000 <= last_seq <= INT32_MAX):
                    raise CoordinatorException(
                        f"invalid commit of {object_key}: batch {i}: {_describe_bad(req, file_size)}")
                producer = producers.get((log_id, pid))
                kind = req.transaction
                if kind >= TXN_COMMIT:  # a marker: no sequence; only the epoch is checked
                    if producer is not None and epoch < producer.epoch:
                        responses.append(CommitBatchResponse.of_error(INVALID_PRODUCER_EPOCH, req))
                        continue
                    if producer is None or epoch > producer.epoch:
                        producers[(log_id, pid)] = _PackedProducer(epoch)
                        changed_producers.add((log_id, pid))
                    base = st[2]
                    st[2] = base + delta + 1
                    st[3] += size
                    rows.append((log_id, base + delta, base, file_id, byte_offset, size, now, req.batch_max_timestamp,
                                 req.message_timestamp_type, pid, epoch, NO_SEQUENCE, NO_SEQUENCE))
                    txn_events.append(TxnEvent(log_id, pid, kind, base))
                    responses.append(CommitBatchResponse(NONE, base, now, lso, False, req))
                    continue
                if producer is not None and (base_seq != producer.next_sequence or epoch != producer.epoch):
                    if type(producer) is _PackedProducer:  # not simply the next batch: the full ring
                        producer = producers[(log_id, pid)] = _Producer.decode(producer.epoch, producer.blob)
                    verdict = SqliteBatchCoordinator._check_producer(producer, req)
                    if verdict != NONE:
                        if isinstance(verdict, tuple):  # a duplicate: the original batch's answer
                            responses.append(CommitBatchResponse(NONE, verdict[2], verdict[4], lso, True, req))
                        else:
                            responses.append(CommitBatchResponse.of_error(verdict, req))
                        continue
                    if epoch != producer.epoch:
                        producer = None  # a bumped epoch starts afresh
                base = st[2]
                last = base + delta
                if producer is None:
                    producer = producers[(log_id, pid)] = _PackedProducer(epoch)
                producer.append(base_seq, last_seq, base, last, now)
                changed_producers.add((log_id, pid))
                if kind:
                    txn_events.append(TxnEvent(log_id, pid, TXN_DATA, base))
            else:
                base = st[2]
                last = base + delta
            st[2] = last + 1
            st[3] += size
            rows.append((log_id, last, base, file_id, byte_offset, size, now, req.batch_max_timestamp,
                         req.message_timestamp_type, pid, req.producer_epoch, req.base_sequence,
                         req.last_sequence))
            responses.append(CommitBatchResponse(NONE, base, now, lso, False, req))
        if rows:
            with cur.copy(_COPY_BATCHES) as copy:
                copy.set_types(_COPY_TYPES)
                write = copy.write_row
                for r in rows:
                    write(r)
        grown = [(log_id, st) for log_id, st in sorted(state.items()) if st[2] != st[4]]
        topic_bytes: dict[uuid.UUID, list] = {}
        for _log_id, st in grown:
            acc = topic_bytes.setdefault(st[0], [st[1], 0])
            acc[1] += st[3] - st[5]
        used = sum(acc[1] for acc in topic_bytes.values())
        updated = sorted(changed_producers & stored)
        inserted = sorted(changed_producers - stored)
        txn = self._txn_changes(cur, txn_events) if txn_events else None
        with conn.pipeline():
            if txn is not None:
                self._write_txn_changes(cur, txn)
            if grown:
                cur.execute(
                    "UPDATE logs l SET high_watermark = v.hwm, byte_size = v.size"
                    " FROM unnest(%b::bigint[], %b::bigint[], %b::bigint[]) AS v (log_id, hwm, size)"
                    " WHERE l.log_id = v.log_id",
                    ([g[0] for g in grown], [g[1][2] for g in grown], [g[1][3] for g in grown]),
                )
            if used:
                cur.execute("UPDATE files SET used_size = %s WHERE file_id = %s", (used, file_id))
                tids = sorted(topic_bytes)
                cur.execute(
                    "INSERT INTO file_topics (file_id, topic_id, topic_name, committed_bytes, live_bytes)"
                    " SELECT %s, t, n, s, s FROM unnest(%b::uuid[], %b::text[], %b::bigint[]) AS v (t, n, s)",
                    (file_id, tids, [topic_bytes[t][0] for t in tids], [topic_bytes[t][1] for t in tids]),
                )
            else:  # nothing committed (all failed or duplicates): the object is garbage already
                cur.execute("UPDATE files SET state = 'deleting', marked_for_deletion_at = %s WHERE file_id = %s",
                            (now, file_id))
            if updated:
                cur.execute(_UPDATE_PRODUCERS, ([k[0] for k in updated], [k[1] for k in updated],
                                                [producers[k].epoch for k in updated],
                                                [producers[k].encode() for k in updated]))
            if inserted:
                cur.execute(_INSERT_PRODUCERS, ([k[0] for k in inserted], [k[1] for k in inserted],
                                                [producers[k].epoch for k in inserted],
                                                [producers[k].encode() for k in inserted]))
            cur.execute("COMMIT")
        return responses

    @staticmethod
    def _txn_changes(cur: psycopg.Cursor, events: list[TxnEvent]) -> TxnChanges:
        """The open transactions of the events' (log, producer) pairs, read under the logs' row
        locks this commit holds, folded with the events."""
        pairs = sorted({(e.log_id, e.producer_id) for e in events})
        stored = {(log_id, pid): first for log_id, pid, first in cur.execute(
            "SELECT t.log_id, t.producer_id, t.first_offset FROM txn_open t"
            " JOIN unnest(%b::bigint[], %b::bigint[]) AS k (log_id, producer_id)"
            " ON t.log_id = k.log_id AND t.producer_id = k.producer_id",
            ([p[0] for p in pairs], [p[1] for p in pairs])).fetchall()}
        return apply_events(stored, events)

    @staticmethod
    def _write_txn_changes(cur: psycopg.Cursor, changes: TxnChanges) -> None:
        if changes.deleted:
            cur.execute("DELETE FROM txn_open t USING unnest(%b::bigint[], %b::bigint[]) AS k (log_id, producer_id)"
                        " WHERE t.log_id = k.log_id AND t.producer_id = k.producer_id",
                        ([p[0] for p in changes.deleted], [p[1] for p in changes.deleted]))
        if changes.inserted:
            keys = sorted(changes.inserted)
            cur.execute("INSERT INTO txn_open (log_id, producer_id, first_offset)"
                        " SELECT * FROM unnest(%b::bigint[], %b::bigint[], %b::bigint[])",
                        ([k[0] for k in keys], [k[1] for k in keys], [changes.inserted[k] for k in keys]))
        if changes.aborted:
            rows = changes.aborted
            cur.execute("INSERT INTO txn_aborted (log_id, producer_id, first_offset, last_offset)"
                        " SELECT * FROM unnest(%b::bigint[], %b::bigint[], %b::bigint[], %b::bigint[])"
                        " ON CONFLICT (log_id, last_offset) DO UPDATE SET producer_id = excluded.producer_id,"
                        " first_offset = excluded.first_offset",
                        ([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]))

    @_guarded
    def find_batches(self, requests: list[FindBatchRequest], fetch_max_bytes: int) -> list[FindBatchResponse]:
        out: list[FindBatchResponse] = []
        remaining = fetch_max_bytes
        min_one = True  # KIP-74: the first batch of the first non-empty partition always comes back
        if not requests:
            return out
        with self._conn() as conn:
            for req in requests:
                tip = req.topic_id_partition
                # One round trip per partition: the log row and its first batches from the offset.
                # Batches are read only below the high watermark read with them, so a commit landing
                # meanwhile never shows half-way.
                rows = conn.execute(
                    _FIND_FIRST, (req.offset, FIND_FIRST_CHUNK, req.offset, tip.topic_id, tip.partition)).fetchall()
                if not rows:
                    out.append(FindBatchResponse(UNKNOWN_TOPIC_OR_PARTITION, [], UNKNOWN_OFFSET, UNKNOWN_OFFSET))
                    continue
                log_id, lso, hwm, first_open = rows[0][:4]
                if req.offset < lso or req.offset > hwm:
                    out.append(FindBatchResponse(OFFSET_OUT_OF_RANGE, [], lso, hwm))
                    continue
                stable = hwm if first_open is None else min(first_open, hwm)
                end = stable if req.read_committed else hwm
                budget = min(req.max_partition_fetch_bytes, remaining)
                found: list[BatchInfo] = []
                if req.offset < end and (budget > 0 or min_one):
                    taken = 0
                    chunk = [row[4:] for row in rows if row[4] is not None]
                    limit = FIND_FIRST_CHUNK
                    while True:
                        done = False
                        for row in chunk:
                            size = row[3]
                            if row[4] >= end or (taken + size > budget and not (min_one and not found)):
                                done = True
                                break
                            found.append(self._batch_info(row, tip))
                            taken += size
                            if taken >= budget:
                                done = True
                                break
                        if done or len(chunk) < limit:
                            break
                        limit = FIND_CHUNK
                        chunk = conn.execute(
                            f"SELECT {_BATCH_COLUMNS} FROM (SELECT * FROM batches WHERE log_id = %s"
                            " AND last_offset > %s AND last_offset < %s ORDER BY last_offset LIMIT %s) b"
                            " JOIN files f ON f.file_id = b.file_id ORDER BY b.last_offset",
                            (log_id, chunk[-1][5], hwm, limit),
                        ).fetchall()
                    if found:
                        min_one = False
                        remaining -= taken
                aborted: list[AbortedTransaction] = []
                if req.read_committed and found:
                    aborted = [AbortedTransaction(*r) for r in conn.execute(
                        "SELECT producer_id, first_offset, last_offset FROM txn_aborted WHERE log_id = %s"
                        " AND last_offset >= %s AND first_offset <= %s ORDER BY first_offset",
                        (log_id, req.offset, found[-1].metadata.last_offset)).fetchall()]
                out.append(FindBatchResponse(NONE, found, lso, hwm, stable, aborted))
        return out

    @_guarded
    def list_offsets(self, requests: list[ListOffsetsRequest]) -> list[ListOffsetsResponse]:
        out: list[ListOffsetsResponse] = []
        with self._conn() as conn:
            for req in requests:
                tip = req.topic_id_partition
                row = conn.execute(
                    "SELECT log_id, log_start_offset, high_watermark FROM logs WHERE topic_id = %s AND partition = %s",
                    (tip.topic_id, tip.partition),
                ).fetchone()
                if row is None:
                    out.append(ListOffsetsResponse(UNKNOWN_TOPIC_OR_PARTITION, tip, NO_TIMESTAMP, UNKNOWN_OFFSET))
                    continue
                log_id, lso, hwm = row
                ts = req.timestamp
                if ts in (ListOffsetsRequest.EARLIEST_TIMESTAMP, ListOffsetsRequest.EARLIEST_LOCAL_TIMESTAMP):
                    out.append(ListOffsetsResponse(NONE, tip, NO_TIMESTAMP, lso))
                elif ts == ListOffsetsRequest.LATEST_TIMESTAMP:
                    latest = hwm
                    if req.read_committed:
                        first = conn.execute("SELECT min(first_offset) FROM txn_open WHERE log_id = %s",
                                             (log_id,)).fetchone()[0]
                        latest = hwm if first is None else min(first, hwm)
                    out.append(ListOffsetsResponse(NONE, tip, NO_TIMESTAMP, latest))
                elif ts == ListOffsetsRequest.LATEST_TIERED_TIMESTAMP:
                    out.append(ListOffsetsResponse(NONE, tip, NO_TIMESTAMP, UNKNOWN_OFFSET))  # nothing tiered
                else:
                    if ts == ListOffsetsRequest.MAX_TIMESTAMP:
                        # Batch granularity: the last offset of the earliest batch holding the max timestamp.
                        hit = conn.execute(
                            f"SELECT last_offset, {_EFFECTIVE_TS} AS ts FROM batches WHERE log_id = %s"
                            " ORDER BY ts DESC, last_offset ASC LIMIT 1", (log_id,)).fetchone()
                    else:
                        # The first batch whose timestamp reaches ts; its base offset.
                        hit = conn.execute(
                            f"SELECT base_offset, {_EFFECTIVE_TS} FROM batches WHERE log_id = %s"
                            f" AND {_EFFECTIVE_TS} >= %s ORDER BY last_offset LIMIT 1", (log_id, ts)).fetchone()
                    if hit is None:
                        out.append(ListOffsetsResponse(NONE, tip, NO_TIMESTAMP, UNKNOWN_OFFSET))
                    else:
                        out.append(ListOffsetsResponse(NONE, tip, hit[1], max(hit[0], lso)))
        return out

    @_guarded
    def delete_records(self, requests: list[DeleteRecordsRequest]) -> list[DeleteRecordsResponse]:
        now = self._clock()
        out: list[DeleteRecordsResponse] = []
        with self._tx() as cur:
            logs = self._lock_logs(cur, {(r.topic_id_partition.topic_id, r.topic_id_partition.partition): None
                                         for r in requests})
            freed_per_file: dict[tuple[int, uuid.UUID], int] = {}
            for req in requests:
                tip = req.topic_id_partition
                key = (tip.topic_id, tip.partition)
                log = logs.get(key)
                if log is None:
                    out.append(DeleteRecordsResponse(UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_OFFSET))
                    continue
                log_id, name, lso, hwm, size = log
                target = hwm if req.offset == DeleteRecordsRequest.HIGH_WATERMARK else req.offset
                if target < 0 or target > hwm:
                    out.append(DeleteRecordsResponse(OFFSET_OUT_OF_RANGE, UNKNOWN_OFFSET))
                    continue
                if target <= lso:
                    out.append(DeleteRecordsResponse(NONE, lso))
                    continue
                _count, freed = self._delete_batches(cur, log_id, tip.topic_id, target, freed_per_file)
                cur.execute("UPDATE logs SET log_start_offset = %s, byte_size = byte_size - %s WHERE log_id = %s",
                            (target, freed, log_id))
                logs[key] = (log_id, name, target, hwm, size - freed)
                out.append(DeleteRecordsResponse(NONE, target))
            self._release_files(cur, freed_per_file, now)
        return out

    @_guarded
    def delete_topics(self, topic_ids: Iterable[uuid.UUID]) -> None:
        ids = sorted(set(topic_ids))
        if not ids:
            return
        now = self._clock()
        with self._tx() as cur:
            self._drop_logs(cur, self._lock_logs_of_topics(cur, ids), now)

    def _drop_logs(self, cur: psycopg.Cursor, logs: list[tuple[int, uuid.UUID, int]], now: int) -> int:
        """Delete locked logs with their batches and producer state (cascade); batches deleted."""
        freed_per_file: dict[tuple[int, uuid.UUID], int] = {}
        deleted = 0
        for log_id, topic_id, _partition in logs:
            deleted += self._delete_batches(cur, log_id, topic_id, None, freed_per_file)[0]
        if logs:
            cur.execute("DELETE FROM logs WHERE log_id = ANY(%s)", ([row[0] for row in logs],))
            cur.execute("DELETE FROM kcli_meta WHERE key = ANY(%s)", ([_checkpoint_key(row[0]) for row in logs],))
        self._release_files(cur, freed_per_file, now)
        return deleted

    @_guarded
    def get_files_to_delete(self) -> list[FileToDelete]:
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT object_key, marked_for_deletion_at FROM files WHERE state = 'deleting'"
                " ORDER BY marked_for_deletion_at, file_id").fetchall()
        return [FileToDelete(key, at) for key, at in rows]

    @_guarded
    def delete_files(self, request: DeleteFilesRequest) -> None:
        keys = sorted(request.object_key_paths)
        if not keys:
            return
        # Only rows already marked 'deleting' (hence without batches) go; live objects stay.
        with self._tx() as cur:
            cur.execute(
                "DELETE FROM files WHERE object_key = ANY(%s) AND state = 'deleting'"
                " AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.file_id = files.file_id)", (keys,))

    @_guarded
    def is_safe_to_delete_file(self, object_key: str) -> bool:
        with self._conn() as conn:
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM files f JOIN batches b ON b.file_id = f.file_id WHERE f.object_key = %s)",
                (object_key,)).fetchone()
        return not row[0]

    # -- kcli extras ---------------------------------------------------------------------------

    @_guarded
    def delete_partitions(self, topic_id: uuid.UUID, partitions: set[int]) -> int:
        now = self._clock()
        with self._tx() as cur:
            logs = self._lock_logs(cur, [(topic_id, p) for p in sorted(partitions)])
            rows = sorted((log[0], topic_id, part) for (_tid, part), log in logs.items())
            return self._drop_logs(cur, rows, now)

    @_guarded
    def enforce_retention(
        self, requests: Iterable[RetentionRequest | tuple[TopicIdPartition, int, int]], now_ms: int
    ) -> list[RetentionResult]:
        requests = [tuple(r) for r in requests]
        out: list[RetentionResult] = []
        with self._tx() as cur:
            logs = self._lock_logs(cur, {(r[0].topic_id, r[0].partition): None for r in requests})
            freed_per_file: dict[tuple[int, uuid.UUID], int] = {}
            for tip, retention_ms, retention_bytes in requests:
                key = (tip.topic_id, tip.partition)
                log = logs.get(key)
                if log is None:
                    out.append(RetentionResult(tip, UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_OFFSET, 0, 0))
                    continue
                log_id, name, lso, hwm, size = log
                if retention_ms < 0 and (retention_bytes < 0 or size <= retention_bytes):
                    out.append(RetentionResult(tip, NONE, lso, 0, 0))
                    continue
                cutoff = None  # first offset kept
                count = freed = 0
                remaining = size
                horizon = now_ms - retention_ms
                after = -1
                scanning = True
                while scanning:
                    chunk = cur.execute(
                        f"SELECT last_offset, byte_size, {_EFFECTIVE_TS} FROM batches WHERE log_id = %s"
                        " AND last_offset > %s ORDER BY last_offset LIMIT %s", (log_id, after, FIND_CHUNK)).fetchall()
                    for last, bsize, ts in chunk:
                        by_time = retention_ms >= 0 and ts < horizon
                        # Kafka's size rule: drop a batch only if what stays is still >= retention.bytes.
                        by_size = retention_bytes >= 0 and remaining - bsize >= retention_bytes
                        if not (by_time or by_size):
                            scanning = False
                            break
                        cutoff = last + 1
                        count += 1
                        freed += bsize
                        remaining -= bsize
                    if len(chunk) < FIND_CHUNK:
                        break
                    after = chunk[-1][0]
                if cutoff is None:
                    out.append(RetentionResult(tip, NONE, lso, 0, 0))
                    continue
                self._delete_batches(cur, log_id, tip.topic_id, cutoff, freed_per_file)
                new_lso = max(lso, cutoff)
                cur.execute("UPDATE logs SET log_start_offset = %s, byte_size = byte_size - %s WHERE log_id = %s",
                            (new_lso, freed, log_id))
                logs[key] = (log_id, name, new_lso, hwm, size - freed)
                out.append(RetentionResult(tip, NONE, new_lso, count, freed))
            self._release_files(cur, freed_per_file, now_ms)
        return out

    @_guarded
    def describe_logs(self, topic_ids: Iterable[uuid.UUID] | None = None) -> list[LogInfo]:
        query = (
            "SELECT l.topic_id, l.topic_name, l.partition, l.log_start_offset, l.high_watermark, l.byte_size,"
            " (SELECT count(*) FROM batches b WHERE b.log_id = l.log_id) FROM logs l"
        )
        params: tuple = ()
        if topic_ids is not None:
            ids = list(topic_ids)
            if not ids:
                return []
            query += " WHERE l.topic_id = ANY(%s)"
            params = (ids,)
        query += " ORDER BY l.topic_name, l.topic_id::text, l.partition"
        with self._conn() as conn:
            rows = conn.execute(query, params).fetchall()
        return [LogInfo(TopicIdPartition(tid, name, part), lso, hwm, count, size)
                for tid, name, part, lso, hwm, size, count in rows]

    @_guarded
    def describe_files(
        self,
        state: str | None = None,
        object_key: str | None = None,
        topic_id: uuid.UUID | None = None,
    ) -> list[FileInfo]:
        if state is not None and state not in (FILE_STATE_UPLOADED, FILE_STATE_DELETING):
            raise CoordinatorException(f"unknown file state {state!r} (expected uploaded or deleting)")
        clauses, params = [], []
        if state is not None:
            clauses.append("f.state = %s")
            params.append(state)
        if object_key is not None:
            clauses.append("f.object_key = %s")
            params.append(object_key)
        if topic_id is not None:
            clauses.append("EXISTS (SELECT 1 FROM file_topics ft WHERE ft.file_id = f.file_id AND ft.topic_id = %s)")
            params.append(topic_id)
        query = (
            "SELECT f.file_id, f.object_key, f.file_size, f.used_size, f.state, f.committed_at,"
            " f.marked_for_deletion_at, f.uploader, (SELECT count(*) FROM batches b WHERE b.file_id = f.file_id)"
            " FROM files f"
        )
        if clauses:
            query += " WHERE " + " AND ".join(clauses)
        query += " ORDER BY f.committed_at, f.file_id"
        out = []
        with self._conn() as conn:
            rows = conn.execute(query, params).fetchall()
            for file_id, key, fsize, used, st, committed, marked, uploader, count in rows:
                parts = conn.execute(
                    "SELECT DISTINCT l.topic_id, l.topic_name, l.partition FROM batches b JOIN logs l"
                    " ON l.log_id = b.log_id WHERE b.file_id = %s ORDER BY l.topic_name, l.partition", (file_id,),
                ).fetchall()
                tips = [TopicIdPartition(t, n, p) for t, n, p in parts]
                out.append(FileInfo(key, fsize, used, st, committed, marked, count, tips, uploader))
        return out

    @_guarded
    def batches_in_file(self, object_key: str) -> list[BatchInfo]:
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {_BATCH_COLUMNS}, l.topic_id, l.topic_name, l.partition FROM files f"
                " JOIN batches b ON b.file_id = f.file_id JOIN logs l ON l.log_id = b.log_id"
                " WHERE f.object_key = %s ORDER BY b.byte_offset", (object_key,)).fetchall()
        tips: dict[tuple[uuid.UUID, int], TopicIdPartition] = {}
        out = []
        for row in rows:
            tid, name, part = row[-3:]
            tip = tips.get((tid, part))
            if tip is None:
                tip = tips[(tid, part)] = TopicIdPartition(tid, name, part)
            out.append(self._batch_info(row[:-3], tip))
        return out

    @_guarded
    def known_object_keys(self) -> set[str]:
        with self._conn() as conn:
            return {row[0] for row in conn.execute("SELECT object_key FROM files")}

    # -- identity and upload intents -------------------------------------------------------------

    @_guarded
    def cluster_id(self) -> str | None:
        with self._conn() as conn:
            row = conn.execute("SELECT value FROM kcli_meta WHERE key = 'cluster_id'").fetchone()
        return None if row is None else str(row[0])

    @_guarded
    def claim_cluster_id(self, cluster_id: str) -> None:
        if not isinstance(cluster_id, str) or not cluster_id:
            raise CoordinatorException(f"invalid cluster id {cluster_id!r}")
        with self._tx() as cur:
            # Two brokers claiming at once: the second waits on the key, then reads the first's.
            cur.execute("INSERT INTO kcli_meta (key, value) VALUES ('cluster_id', %s) ON CONFLICT (key) DO NOTHING",
                        (cluster_id,))
            stored = cur.execute("SELECT value FROM kcli_meta WHERE key = 'cluster_id'").fetchone()[0]
            if stored != cluster_id:
                raise CoordinatorException(
                    f"coordinator database {self.path} belongs to cluster {stored}, not to this broker's"
                    f" cluster {cluster_id}")

    @_guarded
    def register_upload_intent(self, object_key: str, broker_id: int, time_ms: int) -> None:
        if not isinstance(object_key, str) or not object_key:
            raise CoordinatorException(f"invalid upload intent: object key {object_key!r}")
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO upload_intents (object_key, broker_id, created_at) VALUES (%s, %s, %s)"
                " ON CONFLICT (object_key) DO UPDATE SET broker_id = excluded.broker_id, created_at = excluded.created_at",
                (object_key, broker_id, time_ms))

    @_guarded
    def list_upload_intents(self) -> list[UploadIntent]:
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT i.object_key, i.broker_id, i.created_at FROM upload_intents i"
                " WHERE NOT EXISTS (SELECT 1 FROM files f WHERE f.object_key = i.object_key)"
                " ORDER BY i.created_at, i.object_key").fetchall()
        return [UploadIntent(key, broker, at) for key, broker, at in rows]

    @_guarded
    def delete_upload_intents(self, object_keys: Iterable[str]) -> None:
        keys = sorted(set(object_keys))
        if not keys:
            return
        with self._tx() as cur:
            cur.execute("DELETE FROM upload_intents WHERE object_key = ANY(%s)", (keys,))

    @_guarded
    def claim_orphans(self, object_sizes: dict[str, int], now_ms: int) -> list[str]:
        keys = sorted(object_sizes)
        if not keys:
            return []
        # The intent's row lock orders this against commit_file (which deletes the same row): a
        # commit that went first leaves nothing to claim; one that comes after meets the files row.
        with self._tx() as cur:
            rows = cur.execute(
                "WITH gone AS (DELETE FROM upload_intents i WHERE i.object_key = ANY(%s)"
                " AND NOT EXISTS (SELECT 1 FROM files f WHERE f.object_key = i.object_key)"
                " RETURNING i.object_key, i.broker_id)"
                " INSERT INTO files (object_key, uploader, file_size, used_size, state, committed_at, marked_for_deletion_at)"
                " SELECT g.object_key, g.broker_id, s.size, 0, 'deleting', %s, %s"
                " FROM gone g JOIN unnest(%s::text[], %s::bigint[]) AS s (object_key, size) USING (object_key)"
                " ON CONFLICT (object_key) DO NOTHING RETURNING object_key",
                (keys, now_ms, now_ms, keys, [max(0, int(object_sizes[k])) for k in keys])).fetchall()
        return sorted(r[0] for r in rows)

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
        with self._tx() as cur:
            # The log's row lock orders this against commits, retention and DeleteRecords of the log.
            row = self._lock_logs(cur, [(tip.topic_id, tip.partition)]).get((tip.topic_id, tip.partition))
            gone = cur.execute("DELETE FROM upload_intents WHERE object_key = %s", (object_key,)).rowcount == 0
            if require_intent and gone:
                raise CoordinatorException(f"upload intent of {object_key} is gone: the object was claimed as an orphan")
            try:
                file_id = cur.execute(
                    "INSERT INTO files (object_key, uploader, file_size, used_size, state, committed_at,"
                    " marked_for_deletion_at) VALUES (%s, %s, %s, 0, 'deleting', %s, %s) RETURNING file_id",
                    (object_key, uploader_broker_id, file_size, now_ms, now_ms)).fetchone()[0]
            except psycopg.errors.UniqueViolation:
                raise CoordinatorException(f"object {object_key} is already committed") from None
            if row is None or not replaced:
                return False
            log_id, topic_name = row[0], row[1]
            lo = min(b.metadata.last_offset for b in replaced)
            hi = max(b.metadata.last_offset for b in replaced)
            live = {(int(last), int(bid)) for last, bid in cur.execute(
                "SELECT last_offset, batch_id FROM batches WHERE log_id = %s AND last_offset BETWEEN %s AND %s",
                (log_id, lo, hi)).fetchall()}
            if live != {(b.metadata.last_offset, b.batch_id) for b in replaced}:
                return False  # the range changed since it was read: the new object is garbage
            freed_per_file: dict[tuple[int, uuid.UUID], int] = {}
            for fid, size in cur.execute(
                    "WITH d AS (DELETE FROM batches WHERE log_id = %s AND last_offset BETWEEN %s AND %s"
                    " RETURNING file_id, byte_size) SELECT file_id, sum(byte_size) FROM d GROUP BY file_id",
                    (log_id, lo, hi)).fetchall():
                freed_per_file[(fid, tip.topic_id)] = int(size)
            self._release_files(cur, freed_per_file, now_ms)
            used = sum(md.byte_size for md in batches)
            cur.execute("UPDATE logs SET byte_size = byte_size - %s + %s WHERE log_id = %s",
                        (sum(freed_per_file.values()), used, log_id))
            if batches:
                with cur.copy(_COPY_BATCHES) as copy:
                    copy.set_types(_COPY_TYPES)
                    for md in batches:
                        copy.write_row((log_id, md.last_offset, md.base_offset, file_id, md.byte_offset, md.byte_size,
                                        md.log_append_timestamp, md.batch_max_timestamp, md.timestamp_type,
                                        md.producer_id, md.producer_epoch, md.base_sequence, md.last_sequence))
                cur.execute("UPDATE files SET used_size = %s, state = 'uploaded', marked_for_deletion_at = NULL"
                            " WHERE file_id = %s", (used, file_id))
                cur.execute("INSERT INTO file_topics (file_id, topic_id, topic_name, committed_bytes, live_bytes)"
                            " VALUES (%s, %s, %s, %s, %s)", (file_id, tip.topic_id, topic_name, used, used))
        return True

    @_guarded
    def cleaner_checkpoint(self, topic_id_partition: TopicIdPartition) -> int | None:
        with self._conn() as conn:
            row = conn.execute(
                "SELECT m.value FROM logs l JOIN kcli_meta m ON m.key = 'cleaner.checkpoint.' || l.log_id"
                " WHERE l.topic_id = %s AND l.partition = %s",
                (topic_id_partition.topic_id, topic_id_partition.partition)).fetchone()
        return None if row is None else int(row[0])

    @_guarded
    def set_cleaner_checkpoint(self, topic_id_partition: TopicIdPartition, offset: int) -> None:
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO kcli_meta (key, value) SELECT 'cleaner.checkpoint.' || log_id, %s FROM logs"
                " WHERE topic_id = %s AND partition = %s ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(offset), topic_id_partition.topic_id, topic_id_partition.partition))

    @_guarded
    def describe_producers(self, topic_id_partition: TopicIdPartition) -> list[ProducerInfo] | None:
        tip = topic_id_partition
        with self._conn() as conn, conn.transaction():
            row = conn.execute("SELECT log_id FROM logs WHERE topic_id = %s AND partition = %s",
                               (tip.topic_id, tip.partition)).fetchone()
            if row is None:
                return None
            states = {pid: (epoch, bytes(blob)) for pid, epoch, blob in conn.execute(
                "SELECT producer_id, producer_epoch, batches FROM producer_state WHERE log_id = %s", (row[0],))}
            open_txns = dict(conn.execute(
                "SELECT producer_id, first_offset FROM txn_open WHERE log_id = %s", (row[0],)).fetchall())
        out = []
        for pid in sorted(set(states) | set(open_txns)):
            epoch, blob = states.get(pid, (NO_PRODUCER_EPOCH, b""))
            batches = _Producer.decode(epoch, blob).batches
            last = batches[-1] if batches else None
            out.append(ProducerInfo(pid, epoch, last[1] if last else NO_SEQUENCE, last[4] if last else NO_TIMESTAMP,
                                    open_txns.get(pid, UNKNOWN_OFFSET)))
        return out

    @_guarded
    def describe_topic_storage(self, topic_ids: Iterable[uuid.UUID] | None = None) -> list[TopicStorageInfo]:
        wanted = None if topic_ids is None else set(topic_ids)
        with self._conn() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")  # both reads: one snapshot
            names = {tid: name for tid, name in conn.execute("SELECT DISTINCT topic_id, topic_name FROM logs")}
            stats = conn.execute(
                "SELECT ft.topic_id, max(ft.topic_name), sum(ft.live_bytes),"
                " count(*) FILTER (WHERE ft.live_bytes > 0),"
                " coalesce(sum(f.file_size) FILTER (WHERE ft.live_bytes > 0), 0),"
                " count(*) FILTER (WHERE ft.live_bytes = 0),"
                " coalesce(sum(f.file_size) FILTER (WHERE ft.live_bytes = 0), 0)"
                " FROM file_topics ft JOIN files f ON f.file_id = ft.file_id GROUP BY ft.topic_id"
            ).fetchall()
        out: dict[uuid.UUID, TopicStorageInfo] = {}
        for tid, name, live, nfiles, fsize, ndead, dsize in stats:
            out[tid] = TopicStorageInfo(tid, names.get(tid, name), int(live), nfiles, int(fsize), ndead, int(dsize))
        for tid, name in names.items():
            if tid not in out:
                out[tid] = TopicStorageInfo(tid, name, 0, 0, 0, 0, 0)
        result = [info for tid, info in out.items() if wanted is None or tid in wanted]
        result.sort(key=lambda info: (info.topic, str(info.topic_id)))
        return result
