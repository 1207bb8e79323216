"""The batch coordinator in PostgreSQL: one shared state for several brokers (cluster mode).

Same semantics as the SQLite coordinator (plugins/coordinator/sqlite.py, docs/batch-coordinator.md);
what differs is that any number of brokers (processes, each with its own instance) commit to the
same partitions at once. Nothing that another broker can change is cached: every commit reads the
logs it appends to and their producers' idempotence state under row locks (``SELECT ... FOR
UPDATE``, always in log_id order, so two commits never deadlock), in one READ COMMITTED
transaction. Commits of the same partition therefore serialise; commits of different partitions
do not (no global lock, no global counter: a batch id is its object's file_id and its index).
An object's batches of one partition are stored as one row, a *run* (table ``batch_runs``). This
is the design of Aiven's Inkless control plane (``commit_file_v1``), with the per-batch logic in
Python and the batch coordinates packed per run.

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
import operator
import struct
import threading
import time
import uuid
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, TypeVar
from urllib.parse import urlsplit

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from kio.schema.errors import ErrorCode

from kcli.cluster.pgconn import check_connection, redact
from plugins.coordinator.base import NO_SEQUENCE, NO_TIMESTAMP, TXN_COMMIT, TXN_DATA, UNKNOWN_OFFSET, AbortedTransaction, BatchCoordinator, BatchInfo, BatchMetadata, CommitBatchRequest, CommitBatchResponse, CoordinatorException, CreateTopicAndPartitionsRequest, DeleteFilesRequest, DeleteRecordsRequest, DeleteRecordsResponse, FileInfo, FileToDelete, FindBatchRequest, FindBatchResponse, ListOffsetsRequest, ListOffsetsResponse, LogInfo, ProducerInfo, RetentionRequest, RetentionResult, TopicIdPartition, TopicStorageInfo, UploadIntent

from plugins.coordinator.producers import (
    ACCEPT,
    FRESH,
    INT32_MAX,
    PRODUCER_SNAPSHOT_INTERVAL_MS,
    PRODUCER_STATE_BATCHES,
    RING,
    RING_SLOT,
    Producer,
    describe as describe_producer_states,
    fields_fit,
    replay,
    restore,
    verdict,
)
from plugins.coordinator.shared import (
    TIMESTAMP_TYPES,
    FetchBudget,
    already_committed,
    bad_batch,
    check_cluster_id,
    check_commit,
    check_file_state,
    check_intent_key,
    check_replacement,
    checkpoint_key,
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
from plugins.coordinator.txn import TxnChanges, TxnEvent, apply_events

SCHEMA_VERSION = 4
SCHEMES = ("postgresql", "postgres")
# pg_advisory_xact_lock key of the migration (any constant; "kcli" in ASCII).
MIGRATION_LOCK_KEY = 0x6B636C69
MIGRATION_LOCK_TIMEOUT_MS = 2000
MIGRATION_ATTEMPTS = 10
MIGRATION_STATEMENT_TIMEOUT_MS = 30 * 60_000  # bounds a step's statements (a copy of the batch rows)
# Runs read with the log row. A run holds up to RUN_MAX_BATCHES batches (7.2 KB of coordinates),
# so the first read is small: 8 runs of a hot partition hold 800 batches, more than a fetch takes.
# Each further read takes 8x more runs, up to FIND_CHUNK (a log of one-batch runs, e.g. a quiet
# partition, needs 64 runs for a 1 MiB fetch of 16 KiB batches: two reads).
FIND_FIRST_CHUNK = 8
FIND_CHUNK = 256  # runs per query at most, while filling a fetch or scanning for retention

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
# Version 3: batch coordinates stored as runs, one row per (object, partition) instead of one
# per batch (docs/batch-coordinator.md, "Schema and migrations"). A commit of a 1,000-batch object over 100
# partitions inserts 100 rows, not 1,000: the row and index inserts were most of its time. Each
# version-2 batch row becomes a run of one batch (numbered within its object, so its id follows
# the new scheme); the old table and its id sequence go. The step rewrites the batch
# table (a copy, then DROP): it runs before a broker serves, and every broker of a cluster runs
# the same kcli (a version-2 broker could not read runs, and refuses a version-3 database).
_V3 = (
    """CREATE TABLE batch_runs (
        log_id        bigint  NOT NULL,
        last_offset   bigint  NOT NULL,
        base_offset   bigint  NOT NULL,
        file_id       bigint  NOT NULL,
        batch_count   integer NOT NULL,
        byte_size     bigint  NOT NULL,
        max_timestamp bigint  NOT NULL,
        batches       bytea   NOT NULL,
        PRIMARY KEY (log_id, last_offset)) WITH (toast_tuple_target = 8160)""",
    # A run holds at most RUN_MAX_BATCHES batches (7.2 KB), so with the target above it stays in
    # its heap row: no TOAST table writes or reads, and no compression CPU (EXTERNAL).
    "ALTER TABLE batch_runs ALTER COLUMN batches SET STORAGE EXTERNAL",
    "CREATE INDEX batch_runs_by_file ON batch_runs (file_id)",
    """INSERT INTO batch_runs (log_id, last_offset, base_offset, file_id, batch_count, byte_size, max_timestamp,
                               batches)
       SELECT log_id, last_offset, base_offset, file_id, 1, byte_size,
              CASE WHEN timestamp_type = 1 THEN log_append_time ELSE batch_max_timestamp END,
              int8send(row_number() OVER (PARTITION BY file_id ORDER BY batch_id) - 1) || int8send(0)
              || int8send(last_offset - base_offset)
              || int8send(byte_offset) || int4send(byte_size::integer) || int8send(log_append_time)
              || int8send(batch_max_timestamp) || int2send(timestamp_type) || int8send(producer_id)
              || int2send(producer_epoch) || int4send(base_sequence) || int4send(last_sequence)
       FROM batches""",
    "DROP TABLE batches",
    "DROP SEQUENCE batch_ids",
)
# Version 4: producer state derived from the batch runs (as Kafka derives it from its log) plus
# periodic snapshots, instead of a producer_state row rewritten per (partition, producer) and
# commit. producer_state becomes the snapshot as of each log's producer_snapshot_offset (the rows
# were current as of the high watermark: every version-3 commit wrote them); the state of a log is
# its snapshot plus the idempotent batches of the runs at or after that offset. ``producers``
# marks runs holding any batch with a producer id (NULL: not known, an older run), so rebuilding
# a log's state skips the runs of plain produce. Catalogue changes and one UPDATE of the logs
# (one row per partition): nothing is rewritten.
_V4 = (
    "ALTER TABLE logs ADD COLUMN producer_snapshot_offset bigint NOT NULL DEFAULT 0",
    "UPDATE logs SET producer_snapshot_offset = high_watermark",
    "ALTER TABLE batch_runs ADD COLUMN producers boolean",
)
MIGRATIONS: tuple[tuple[str, ...], ...] = (_V1, _V2, _V3, _V4)

# One batch in a run's ``batches`` bytes, big-endian as int8send & co. write them (the version-3
# migration builds them in SQL): the batch's index in its object, base and last offset relative
# to the run's base_offset, byte offset, byte size, log append time, max timestamp, timestamp
# type, producer id, producer epoch, base and last sequence. Nothing in an entry depends on the
# log's high watermark or the object's file_id, so a commit packs its entries before it knows
# either, and sends them with the statement that learns both (_COMMIT_PLAIN). _run_entries
# decodes entries to absolute form: (batch id, base, last, ...the rest as stored).
_RUN_ENTRY = struct.Struct(">qqqqiqqhqhii")
_LAST_OFFSET_AT = struct.Struct(">16xq")  # an entry's (relative) last offset, read in place
# A batch's id: its object's file_id shifted left by this, or-ed with the batch's index in the
# commit (2^24 batches of at least 61 bytes each would make a 1 GiB object; more is refused). Ids
# stay unique without a sequence round trip per batch.
BATCH_INDEX_BITS = 24
MAX_BATCHES_PER_OBJECT = 1 << BATCH_INDEX_BITS
_INDEX_MASK = MAX_BATCHES_PER_OBJECT - 1
# Batches per run at most: a fetch reads a run whole, so a hot partition's 1,000 batches of one
# object are 10 runs, not one 72 KB row decoded for the 64 batches of a 1 MiB fetch.
RUN_MAX_BATCHES = 100
_BYTE_SIZE = operator.attrgetter("metadata.byte_size")
_PID_OF_CHANGE = operator.itemgetter(0)  # the producer id of an undo record (see _Packed)

# The log row and its first runs from the offset (the run holding the offset may start before it).
_FIND_FIRST = (
    "SELECT l.log_id, l.log_start_offset, l.high_watermark,"
    " (SELECT min(first_offset) FROM txn_open t WHERE t.log_id = l.log_id),"
    " x.last_offset, x.object_key, x.batches, x.base_offset, x.file_id"
    " FROM logs l LEFT JOIN LATERAL (SELECT r.last_offset, r.batches, r.base_offset, r.file_id, f.object_key"
    " FROM (SELECT * FROM batch_runs"
    "  WHERE log_id = l.log_id AND last_offset >= %s AND last_offset < l.high_watermark"
    "  ORDER BY last_offset LIMIT %s) r JOIN files f ON f.file_id = r.file_id) x ON l.log_start_offset <= %s"
    " WHERE l.topic_id = %s AND l.partition = %s ORDER BY x.last_offset"
)
_INSERT_RUNS = (
    "INSERT INTO batch_runs (log_id, last_offset, base_offset, file_id, batch_count, byte_size, max_timestamp, batches,"
    " producers) SELECT * FROM unnest(%b::bigint[], %b::bigint[], %b::bigint[], %b::bigint[], %b::integer[],"
    " %b::bigint[], %b::bigint[], %b::bytea[], %b::boolean[])"
)

# Lock the logs' rows in log_id order: two commits never wait for each other crosswise (no deadlock).
_LOCK_LOGS = (
    "SELECT l.log_id, l.topic_id, l.partition, l.topic_name, l.log_start_offset, l.high_watermark, l.byte_size"
    " FROM logs l JOIN unnest(%b::uuid[], %b::integer[]) AS k (topic_id, partition)"
    " ON l.topic_id = k.topic_id AND l.partition = k.partition ORDER BY l.log_id FOR UPDATE OF l"
)

# A commit, whole, in one statement and so one round trip (autocommit: the statement is its own
# transaction, unless the caller began one: the locked path below). The entries arrive packed
# (relative to their runs, see _RUN_ENTRY) and the offsets come from the logs' rows locked here,
# in log_id order as _LOCK_LOGS does. Slots (the object's partitions, in first-seen order) carry
# each partition's offset and byte growth, and for a partition whose idempotent batches were
# checked against producer state in memory, the log and high watermark that state is as of
# (%(elog)s, %(ehwm)s; NULL: nothing checked). If any such log moved on (another broker, or a
# deleted and re-created partition), the statement is *stale* and writes nothing, not even the
# intent's delete: the caller checks again under the logs' locks. Runs refer to their slot by
# ordinality and to their entries by position in %(blob)s. Every write depends on the files row:
# a conflicting key (a commit that already happened), a claimed intent or staleness writes
# nothing. The upload intent goes unless stale (an intent must not outlive its object's commit).
# Integer arrays travel as text ('{1,2}'): the server parses them faster than psycopg dumps
# Python lists. Returns one row per known slot (file_id, intent, stale, slot, log_id, high
# watermark before, log start offset), or a single row without a slot when nothing was written.
_COMMIT = (
    "WITH slot AS (SELECT * FROM unnest(%(tids)b::uuid[], %(parts)s::integer[], %(grow)s::bigint[], %(bytes)s::bigint[],"
    "  %(elog)s::bigint[], %(ehwm)s::bigint[]) WITH ORDINALITY AS s (topic_id, partition, grow, bytes, elog, ehwm, slot)),"
    " locked AS MATERIALIZED (SELECT l.log_id, l.topic_id, l.topic_name, l.log_start_offset, l.high_watermark,"
    "  s.slot, s.grow, s.bytes FROM logs l JOIN slot s ON l.topic_id = s.topic_id AND l.partition = s.partition"
    "  ORDER BY l.log_id FOR UPDATE OF l),"
    " stale AS MATERIALIZED (SELECT EXISTS (SELECT 1 FROM slot s LEFT JOIN locked k ON k.slot = s.slot"
    "  WHERE s.elog IS NOT NULL AND (k.log_id IS DISTINCT FROM s.elog OR k.high_watermark <> s.ehwm)) AS stale),"
    " intent AS (DELETE FROM upload_intents WHERE object_key = %(key)s AND NOT (SELECT stale FROM stale) RETURNING 1),"
    " file AS (INSERT INTO files (object_key, uploader, file_size, used_size, state, committed_at,"
    "  marked_for_deletion_at)"
    "  SELECT %(key)s, %(uploader)s, %(size)s, u.used, CASE WHEN u.used > 0 THEN 'uploaded' ELSE 'deleting' END,"
    "  %(now)s, CASE WHEN u.used > 0 THEN NULL ELSE %(now)s::bigint END"
    "  FROM (SELECT coalesce(sum(bytes), 0)::bigint AS used FROM locked) u"
    "  WHERE NOT (SELECT stale FROM stale) AND (NOT %(require)s::boolean OR EXISTS (SELECT 1 FROM intent))"
    "  ON CONFLICT (object_key) DO NOTHING RETURNING file_id),"
    " grown AS (UPDATE logs l SET high_watermark = l.high_watermark + k.grow, byte_size = l.byte_size + k.bytes"
    "  FROM locked k, file WHERE l.log_id = k.log_id),"
    " runs AS (INSERT INTO batch_runs (log_id, last_offset, base_offset, file_id, batch_count, byte_size,"
    "  max_timestamp, batches, producers)"
    "  SELECT k.log_id, k.high_watermark + r.last, k.high_watermark + r.first, f.file_id, r.count, r.bytes, r.max_ts,"
    f"  substring(%(blob)s::bytea FROM (r.start * {_RUN_ENTRY.size} + 1)::integer"
    f"  FOR (r.count * {_RUN_ENTRY.size})::integer), r.producers"
    "  FROM (SELECT *, sum(count) OVER (ORDER BY n) - count AS start FROM unnest(%(r_slot)s::bigint[],"
    "   %(r_first)s::bigint[], %(r_last)s::bigint[], %(r_count)s::bigint[], %(r_bytes)s::bigint[],"
    "   %(r_max_ts)s::bigint[], %(r_prod)s::boolean[]) WITH ORDINALITY AS r (slot, first, last, count, bytes, max_ts,"
    "   producers, n)) r"
    "  JOIN locked k ON k.slot = r.slot CROSS JOIN file f),"
    " topics AS (INSERT INTO file_topics (file_id, topic_id, topic_name, committed_bytes, live_bytes)"
    "  SELECT f.file_id, k.topic_id, min(k.topic_name), sum(k.bytes), sum(k.bytes)"
    "  FROM locked k CROSS JOIN file f GROUP BY f.file_id, k.topic_id)"
    " SELECT f.file_id, f.intent, f.stale, k.slot, k.log_id, k.high_watermark, k.log_start_offset"
    " FROM (SELECT (SELECT file_id FROM file), EXISTS (SELECT 1 FROM intent), (SELECT stale FROM stale))"
    " f (file_id, intent, stale) LEFT JOIN locked k ON f.file_id IS NOT NULL"
)

# The producer state of some partitions, brought up to their high watermark (one statement: one
# snapshot of the database). Per partition (slot = its position + 1) the caller says which state
# it holds: (log_id, offset) when it has the state as of that offset, NULLs when none. That state
# is brought forward by the runs from its offset on (*incremental*) when it belongs to the same
# log and the log's snapshot is not newer: every deletion or rewrite of runs (retention,
# DeleteRecords, compaction) first snapshots the log at its high watermark, so the runs at or
# after any offset from the snapshot's on are intact. Otherwise (*full*) the snapshot rows are
# read and the runs from the snapshot's offset. Rows: (0, slot, log_id, hwm, snapshot offset,
# incremental from, NULL) per log; (1, slot, producer_id, epoch, ...batches) per snapshot row;
# (2, slot, last_offset, base_offset, ...batches) per run, in offset order. Runs of plain
# produce (producers = false) are skipped. Planned per call (prepare=False): the arrays vary.
_REFRESH = (
    "WITH k AS MATERIALIZED (SELECT l.log_id, l.high_watermark, l.producer_snapshot_offset AS snap, k.slot,"
    "  CASE WHEN l.log_id = k.clog AND l.producer_snapshot_offset <= k.chwm THEN k.chwm END AS since"
    "  FROM unnest(%b::uuid[], %b::integer[], %b::bigint[], %b::bigint[]) WITH ORDINALITY AS k"
    "  (topic_id, partition, clog, chwm, slot) JOIN logs l ON l.topic_id = k.topic_id AND l.partition = k.partition)"
    " SELECT 0, k.slot, k.log_id, k.high_watermark, k.snap, k.since, NULL::bytea FROM k"
    " UNION ALL SELECT 1, k.slot, p.producer_id, p.producer_epoch, NULL, NULL, p.batches"
    "  FROM k JOIN producer_state p ON p.log_id = k.log_id WHERE k.since IS NULL"
    " UNION ALL SELECT 2, k.slot, r.last_offset, r.base_offset, NULL, NULL, r.batches"
    "  FROM k JOIN batch_runs r ON r.log_id = k.log_id AND r.last_offset >= coalesce(k.since, k.snap)"
    "  AND r.last_offset < k.high_watermark AND r.producers IS NOT FALSE"
    " ORDER BY 1, 2, 3"
)
_UPSERT_PRODUCERS = (
    "INSERT INTO producer_state (log_id, producer_id, producer_epoch, batches)"
    " SELECT * FROM unnest(%b::bigint[], %b::bigint[], %b::smallint[], %b::bytea[])"
    " ON CONFLICT (log_id, producer_id) DO UPDATE"
    " SET producer_epoch = excluded.producer_epoch, batches = excluded.batches"
)


def _array(values: Iterable[int | None]) -> str:
    """A PostgreSQL array literal of integers or NULLs (see _COMMIT)."""
    return "{" + ",".join("NULL" if v is None else str(v) for v in values) + "}"


def _ints(values: Iterable[int]) -> str:
    """A PostgreSQL array literal of integers (no NULL): _array without a test per value."""
    return "{" + ",".join(map(str, values)) + "}"


def _bools(values: Iterable[bool]) -> str:
    return "{" + ",".join("t" if v else "f" for v in values) + "}"


@dataclass(slots=True)
class _LogProducers:
    """A log's producer state in memory, as of ``hwm`` (every batch below it applied): what a
    commit checks idempotent batches against. ``dirty``: producers changed since the snapshot
    this state was loaded from or last wrote (the next snapshot writes only those rows)."""

    log_id: int
    hwm: int
    producers: dict[int, Producer]
    dirty: set[int]


class _NeedLock(Exception):
    """The commit cannot be checked against memory alone (a partition's producer state is not
    cached, or a batch is transactional): it takes the locked path."""


_UNSET = object()


@dataclass(slots=True)
class _Packed:
    """A commit checked and packed before its statement: per batch its slot and offset relative to
    its partition's first offset here (-1: refused, see ``refused``); per slot the producer state
    it was checked against and the undo records of the changes made to it in place (kept once the
    commit is done, put back by ``undo`` when it is not); the transaction events (slot, producer
    id, kind, relative offset); _COMMIT's parameters."""

    slots: list[int]
    rels: list[int]
    refused: dict[int, int | tuple]
    keys: list[tuple[uuid.UUID, int]]
    grow: list[int]
    checked: list[Any]
    changes: list[list[tuple] | None]
    txn_events: list[tuple[int, int, int, int]]
    params: dict[str, Any]

    def undo(self) -> None:
        """Put the producer state in memory back as it was before _pack (the commit did not
        happen: stale, refused, or failed). The caller holds _producers_lock, as _pack's did."""
        for state, changes in zip(self.checked, self.changes):
            if changes:
                restore(state.producers, changes)
        self.changes = [None] * len(self.changes)


def _new_slot(keys: dict[tuple[uuid.UUID, int], int], tip: TopicIdPartition, object_key: str, i: int) -> int:
    """The slot of a partition met under a TopicIdPartition object not seen before in the commit
    (the same partition may come as several equal objects): its first-seen position."""
    if not isinstance(tip, TopicIdPartition):
        raise not_a_partition(object_key, i)
    return keys.setdefault((tip.topic_id, tip.partition), len(keys))


def _pack(object_key: str, file_size: int, batches: list[CommitBatchRequest], now: int,
          view: Callable[[tuple[uuid.UUID, int]], _LogProducers | None] | None = None,
          locked: bool = False) -> _Packed | None:
    """Check and pack a commit before any database work. Raises CoordinatorException for a
    malformed batch and struct.error for a field its entry cannot hold.

    Without ``view``: None at the first batch with a producer id (a plain commit needs no state).
    With it, idempotent batches are checked against ``view(partition)`` — the producer state of
    the partition's log (None: the partition is unknown; _NeedLock: not cached) — as Kafka does
    (producers.verdict), and appended to it in place, each change with an undo record (so a commit
    that does not happen puts memory back: _Packed.undo; the caller holds _producers_lock
    throughout). A batch that continues its producer's sequence takes the fast path inlined here
    (see producers.Producer); anything else verdict(). Transactional batches need the logs' locks
    (``locked``): their open transactions are read under them. If _pack raises, it has put memory
    back itself.

    Batches come grouped by partition, so the loop keeps the current partition's state in locals
    and files it per slot (partition, by first appearance) when the partition changes: [next
    relative offset, bytes, max effective timestamp, packed entries, producer state, undo
    records, has producer ids]. An object's batches share their TopicIdPartition objects, hence
    the lookup by identity first."""
    keys: dict[tuple[uuid.UUID, int], int] = {}
    by_tip: dict[int, int] = {}
    states: list[list] = []
    slots: list[int] = []
    rels: list[int] = []
    refused: dict[int, int | tuple] = {}
    txn_events: list[tuple[int, int, int, int]] = []
    pack = _RUN_ENTRY.pack
    ring_pack, ring_slot, ring_batches = RING.pack_into, RING_SLOT, PRODUCER_STATE_BATCHES
    add_slot, add_rel = slots.append, rels.append
    prev = None
    slot, rel, size_sum, max_effective, entries = -1, 0, 0, NO_TIMESTAMP, []
    log_state: Any = _UNSET
    producers: dict[int, Producer] = {}
    hwm = 0
    changes: list[tuple] = []
    record = changes.append
    has_pid = False
    try:
        for i, req in enumerate(batches):
            tip = req.topic_id_partition
            if tip is not prev:
                if slot >= 0:
                    states[slot][:3] = rel, size_sum, max_effective
                    states[slot][6] = has_pid
                slot = by_tip.get(id(tip), -1)
                if slot < 0:
                    slot = by_tip[id(tip)] = _new_slot(keys, tip, object_key, i)
                    if slot == len(states):
                        states.append([0, 0, NO_TIMESTAMP, [], _UNSET, [], False])
                rel, size_sum, max_effective, entries, log_state, changes, has_pid = states[slot]
                record = changes.append
                if log_state is not _UNSET and log_state is not None:
                    producers, hwm = log_state.producers, log_state.hwm
                prev = tip
            size, byte_offset, delta, ts_type = req.size, req.byte_offset, req.last_offset - req.base_offset, \
                req.message_timestamp_type
            if size <= 0 or byte_offset < 0 or byte_offset + size > file_size or delta < 0 \
                    or ts_type not in TIMESTAMP_TYPES:
                raise bad_batch(object_key, i, req, file_size)
            pid = req.producer_id
            base_seq, last_seq, epoch = req.base_sequence, req.last_sequence, req.producer_epoch
            if pid >= 0:
                if view is None:
                    return None
                if log_state is _UNSET:
                    log_state = states[slot][4] = view((tip.topic_id, tip.partition))
                    if log_state is not None:
                        producers, hwm = log_state.producers, log_state.hwm
                if log_state is not None:  # None: an unknown partition, answered after the statement
                    has_pid = True
                    kind = req.transaction
                    producer = producers.get(pid)
                    if producer is not None and base_seq == producer.next_sequence and epoch == producer.epoch \
                            and not kind and base_seq <= last_seq <= INT32_MAX:
                        # The fast path: the next batch of the producer's sequence (see Producer),
                        # appended in place; the undo record as Producer.undo_record makes it.
                        n = producer.count
                        ring = producer.ring
                        at = n % ring_batches * ring_slot
                        record((pid, producer, n, producer.chain_start, producer.last_sequence, base_seq,
                                ring[at:at + ring_slot] if n >= ring_batches else None))
                        base = hwm + rel
                        ring_pack(ring, at, base_seq, last_seq, base, base + delta, now)
                        producer.count = n + 1
                        producer.last_sequence = last_seq
                        producer.next_sequence = last_seq + 1
                    else:
                        if not fields_fit(req):
                            raise bad_batch(object_key, i, req, file_size)
                        if kind and not locked:
                            raise _NeedLock()
                        answer = verdict(producer, req)
                        if answer != ACCEPT and answer != FRESH:  # an error, or a duplicate's original batch
                            refused[i] = answer
                            add_slot(slot)
                            add_rel(-1)
                            continue
                        if answer == FRESH:
                            record((pid, producer))
                            producer = producers[pid] = Producer(epoch)
                        if kind >= TXN_COMMIT:  # a marker: no sequence, its epoch only (see verdict)
                            base_seq = last_seq = NO_SEQUENCE
                            txn_events.append((slot, pid, kind, rel))
                        else:
                            if answer != FRESH:
                                record(producer.undo_record(pid))  # type: ignore[union-attr]
                            base = hwm + rel
                            producer.append(base_seq, last_seq, base, base + delta, now)  # type: ignore[union-attr]
                            if kind:
                                txn_events.append((slot, pid, TXN_DATA, rel))
            max_ts = req.batch_max_timestamp
            entries.append(pack(i, rel, rel + delta, byte_offset, size, now, max_ts, ts_type, pid, epoch,
                                base_seq, last_seq))
            ts = now if ts_type == 1 else max_ts
            if ts > max_effective:
                max_effective = ts
            add_slot(slot)
            add_rel(rel)
            rel += delta + 1
            size_sum += size
        if slot >= 0:
            states[slot][:3] = rel, size_sum, max_effective
            states[slot][6] = has_pid
    except BaseException:
        for st in states:
            if st[5]:
                restore(st[4].producers, st[5])
        raise
    # The runs: a partition's entries are relative to its first offset in this object, so a
    # partition of RUN_MAX_BATCHES batches or fewer is one run as packed; a hot one is cut into
    # runs whose entries are re-based on each run's first offset.
    r_slot, r_first, r_last, r_count, r_bytes, r_max_ts, r_prod, blobs = [], [], [], [], [], [], [], []
    for n, (end, size_sum, max_effective, entries, _log_state, _changes, has_pid) in enumerate(states, 1):
        if not entries:
            continue
        if len(entries) <= RUN_MAX_BATCHES:  # one run, as packed (a list of one entry per batch)
            runs = [(0, end - 1, entries, len(entries), size_sum, max_effective, has_pid)]
        else:
            runs = [(row[2], row[1], [row[7]], row[4], row[5], row[6], row[8])
                    for row in _run_rows(0, 0, list(_run_entries(b"".join(entries), 0, 0)))]
        for first, last, packed, count, size_sum, max_effective, producers_in in runs:
            r_slot.append(n)
            r_first.append(first)
            r_last.append(last)
            r_count.append(count)
            r_bytes.append(size_sum)
            r_max_ts.append(max_effective)
            r_prod.append(producers_in)
            blobs.extend(packed)
    checked = [st[4] if st[6] and isinstance(st[4], _LogProducers) else None for st in states]
    return _Packed(slots, rels, refused, list(keys), [st[0] for st in states], checked,
                   [st[5] or None for st in states], txn_events, {
        "tids": [k[0] for k in keys], "parts": _ints([k[1] for k in keys]),
        "grow": _ints([st[0] for st in states]), "bytes": _ints([st[1] for st in states]),
        "elog": _array(c.log_id if c is not None else None for c in checked),
        "ehwm": _array(c.hwm if c is not None else None for c in checked),
        "r_slot": _ints(r_slot), "r_first": _ints(r_first), "r_last": _ints(r_last),
        "r_count": _ints(r_count), "r_bytes": _ints(r_bytes), "r_max_ts": _ints(r_max_ts),
        "r_prod": _bools(r_prod), "blob": b"".join(blobs)})


def _fold_refresh(rows: list[tuple], keys: list[tuple[uuid.UUID, int]], cached: list[_LogProducers | None]
                  ) -> dict[tuple[uuid.UUID, int], _LogProducers | None]:
    """The state of each partition after _REFRESH's rows (None: no such log). A cached state
    brought forward incrementally is changed in place; otherwise a new one is built from the
    snapshot rows. Producers the replayed runs change become dirty."""
    out: dict[tuple[uuid.UUID, int], _LogProducers | None] = {k: None for k in keys}
    by_slot: dict[int, tuple[_LogProducers, int]] = {}
    for kind, slot, a, b, snap, since, blob in rows:
        if kind == 0:
            old = cached[slot - 1]
            if since is not None and old is not None:
                state, start = old, since
            else:
                state, start = _LogProducers(a, b, {}, set()), snap
            state.hwm = b
            by_slot[slot] = (state, start)
            out[keys[slot - 1]] = state
        elif kind == 1:
            by_slot[slot][0].producers[a] = Producer.decode(b, bytes(blob))
        else:
            state, start = by_slot[slot]
            producers, dirty = state.producers, state.dirty
            for _i, rel_base, rel_last, _bo, _size, append_time, _ts, _tt, pid, epoch, base_seq, last_seq \
                    in _RUN_ENTRY.iter_unpack(blob):
                if pid >= 0 and b + rel_base >= start:
                    replay(producers, pid, epoch, base_seq, last_seq, b + rel_base, b + rel_last, append_time)
                    dirty.add(pid)
    return out


def _info(entry: tuple, object_key: str, tip: TopicIdPartition) -> BatchInfo:
    """A run entry (see _RUN_ENTRY) as the interface's BatchInfo."""
    (batch_id, base, last, byte_offset, byte_size, append_time, max_ts, ts_type,
     pid, epoch, base_seq, last_seq) = entry
    return BatchInfo(batch_id, object_key, BatchMetadata(
        tip, byte_offset, byte_size, base, last, append_time, max_ts, ts_type, pid, epoch, base_seq, last_seq))


def _run_entries(blob: bytes | memoryview, base: int, file_id: int) -> Iterator[tuple]:
    """A run's entries (of the run starting at ``base``, in object ``file_id``) in absolute form."""
    first_id = file_id << BATCH_INDEX_BITS
    return ((first_id | index, base + rel_base, base + rel_last, byte_offset, size, append_time, max_ts, ts_type, pid,
             epoch, base_seq, last_seq)  # fields named, not *rest: half the CPU per entry
            for index, rel_base, rel_last, byte_offset, size, append_time, max_ts, ts_type, pid, epoch, base_seq,
            last_seq in _RUN_ENTRY.iter_unpack(blob))


def _entries_from(blob: bytes, base: int, file_id: int, offset: int) -> Iterator[tuple]:
    """A run's entries from the first whose last offset reaches ``offset`` (a binary search: a
    fetch starting inside a run of 100 batches neither decodes nor allocates the ones before)."""
    size = _RUN_ENTRY.size
    lo, hi = 0, len(blob) // size
    rel = offset - base
    if rel > _LAST_OFFSET_AT.unpack_from(blob, 0)[0]:
        while lo < hi:
            mid = (lo + hi) // 2
            if _LAST_OFFSET_AT.unpack_from(blob, mid * size)[0] < rel:
                lo = mid + 1
            else:
                hi = mid
    return _run_entries(memoryview(blob)[lo * size:], base, file_id)


def _effective_ts(entry: tuple) -> int:
    """The batch's timestamp as ListOffsets sees it: the append time under LogAppendTime."""
    return entry[5] if entry[7] == 1 else entry[6]


def _run_rows(log_id: int, file_id: int, entries: list[tuple]) -> list[tuple]:
    """batch_runs rows (in _INSERT_RUNS's column order) holding ``entries`` (absolute form, of
    object ``file_id``, in offset order), RUN_MAX_BATCHES at most each."""
    pack = _RUN_ENTRY.pack
    rows = []
    for i in range(0, len(entries), RUN_MAX_BATCHES):
        run = entries[i:i + RUN_MAX_BATCHES]
        base = run[0][1]
        try:
            blob = b"".join(pack(e[0] & _INDEX_MASK, e[1] - base, e[2] - base, *e[3:]) for e in run)
        except struct.error as err:
            raise CoordinatorException(f"a batch field outside Kafka's types ({err})") from None
        rows.append((log_id, run[-1][2], base, file_id, len(run), sum(e[4] for e in run),
                     max(_effective_ts(e) for e in run), blob, any(e[8] >= 0 for e in run)))
    return rows


def _insert_runs(cur: psycopg.Cursor, rows: list[tuple]) -> None:
    cur.execute(_INSERT_RUNS, tuple([r[i] for r in rows] for i in range(9)))


def _entries_between(cur: psycopg.Cursor, log_id: int, lo: int, hi: int) -> list[tuple]:
    """The log's batches (run entries) whose last offset lies in [lo, hi], in offset order."""
    rows = cur.execute(
        "SELECT batches, base_offset, file_id FROM batch_runs WHERE log_id = %s AND last_offset >= %s"
        " AND last_offset <= coalesce((SELECT min(last_offset) FROM batch_runs WHERE log_id = %s"
        " AND last_offset > %s), %s) ORDER BY last_offset",
        (log_id, lo, log_id, hi, hi)).fetchall()
    return [e for row in rows for e in _run_entries(*row) if lo <= e[2] <= hi]


def _cut_runs(cur: psycopg.Cursor, log_id: int, lo: int | None, hi: int | None) -> dict[int, list[int]]:
    """Remove the log's batches whose last offset lies in [lo, hi] (None: unbounded); the caller
    holds the log's row lock. Returns file_id → [bytes, batches] removed.

    Runs of one log never overlap, so at most two straddle a bound: the first run ending at or
    after ``lo`` when it starts before it, and the first ending after ``hi`` when it starts at or
    before it. Those are cut in Python and their kept parts written back as runs; the runs wholly
    inside go in one statement."""
    freed: dict[int, list[int]] = {}
    edges: list[tuple] = []
    if lo is not None:
        row = cur.execute("SELECT last_offset, base_offset, file_id, batches FROM batch_runs WHERE log_id = %s"
                          " AND last_offset >= %s ORDER BY last_offset LIMIT 1", (log_id, lo)).fetchone()
        if row is not None and row[1] < lo:
            edges.append(row)
    if hi is not None:
        row = cur.execute("SELECT last_offset, base_offset, file_id, batches FROM batch_runs WHERE log_id = %s"
                          " AND last_offset > %s ORDER BY last_offset LIMIT 1", (log_id, hi)).fetchone()
        if row is not None and row[1] <= hi and not (edges and edges[0][0] == row[0]):
            edges.append(row)
    pieces: list[tuple] = []
    for last, base, file_id, blob in edges:
        entries = list(_run_entries(blob, base, file_id))
        gone = [e for e in entries if (lo is None or e[2] >= lo) and (hi is None or e[2] <= hi)]
        if not gone:
            continue
        cur.execute("DELETE FROM batch_runs WHERE log_id = %s AND last_offset = %s", (log_id, last))
        acc = freed.setdefault(file_id, [0, 0])
        acc[0] += sum(e[4] for e in gone)
        acc[1] += len(gone)
        for part in ([e for e in entries if lo is not None and e[2] < lo],
                     [e for e in entries if hi is not None and e[2] > hi]):
            if part:
                pieces.extend(_run_rows(log_id, file_id, part))
    where, params = sql_filters((("log_id = %s", log_id), ("base_offset >= %s", lo), ("last_offset <= %s", hi)))
    for file_id, size, count in cur.execute(
            f"WITH d AS (DELETE FROM batch_runs{where} RETURNING file_id, byte_size,"
            " batch_count) SELECT file_id, sum(byte_size), sum(batch_count) FROM d GROUP BY file_id", params).fetchall():
        acc = freed.setdefault(file_id, [0, 0])
        acc[0] += int(size)
        acc[1] += int(count)
    if pieces:
        _insert_runs(cur, pieces)
    return freed


F = TypeVar("F", bound=Callable[..., Any])


class _Snapshotter:
    """Snapshots the producer state every ``interval_s`` from its own thread, off the commit
    path (a snapshot of ~5,000 producers takes tens of milliseconds; no commit waits for it, except
    on the row locks of the logs it updates, for the moment its short transaction holds them)."""

    def __init__(self, coordinator: "PostgresBatchCoordinator", interval_s: float) -> None:
        self._coordinator = weakref.ref(coordinator)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kcli-coordinator-snapshot", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            coordinator = self._coordinator()
            if coordinator is None:
                return
            try:
                coordinator._snapshot_producers()
            except (CoordinatorException, psycopg.Error, PoolTimeout):
                pass  # the database is away: the state stays dirty, the next pass writes it
            del coordinator

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


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
    ``connect.timeout.ms`` (5000), ``statement.timeout.ms`` (30000),
    ``producer.snapshot.interval.ms`` (60000: how often the producer state changed in memory is
    snapshotted to the database, which bounds what a restart or another broker replays). Thread-safe.
    """

    CONFIGS = frozenset({"url", "pool.min.size", "pool.max.size", "pool.timeout.ms", "connect.timeout.ms",
                         "statement.timeout.ms", "producer.snapshot.interval.ms"})

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
        # Producer state in memory, by partition (see _LogProducers), as of each log's high
        # watermark when this instance last committed or looked; _producers_lock guards it.
        self._states: dict[tuple[uuid.UUID, int], _LogProducers] = {}
        self._producers_lock = threading.RLock()
        self._snapshotter: _Snapshotter | None = None
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
        snapshot_interval_ms = _positive_int(configs, "producer.snapshot.interval.ms", PRODUCER_SNAPSHOT_INTERVAL_MS)
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
                check=check_connection,
                reconnect_timeout=max(pool_timeout_ms / 1000, 1.0), name="kcli-coordinator", open=False,
            )
            self._pool.open(wait=False)
            if not self._read_only:
                self._snapshotter = _Snapshotter(self, snapshot_interval_ms / 1000)

    def close(self) -> None:
        snapshotter, self._snapshotter = self._snapshotter, None
        if snapshotter is not None:
            snapshotter.stop()
            try:  # a clean shutdown leaves less to replay
                self._snapshot_producers()
            except CoordinatorException:
                pass
            except (psycopg.Error, PoolTimeout):
                pass  # the next open replays instead
        with self._producers_lock:
            self._states.clear()
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
                        # a step that copies rows (version 3) may outlast statement.timeout.ms
                        conn.execute(f"SET LOCAL statement_timeout = {MIGRATION_STATEMENT_TIMEOUT_MS}")
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
    def _entries(cur: psycopg.Cursor, log_id: int, after: int = -1, below: int | None = None,
                 first_chunk: int = FIND_CHUNK) -> Iterator[tuple]:
        """The log's batches (run entries, absolute) from the run ending after ``after`` on, in
        offset order, read a chunk of runs at a time (growing 8x up to FIND_CHUNK) while the
        caller keeps taking them; runs ending at or after ``below`` are not read."""
        limit = first_chunk
        while True:
            chunk = cur.execute(
                "SELECT last_offset, batches, base_offset, file_id FROM batch_runs WHERE log_id = %s"
                " AND last_offset > %s AND last_offset < %s ORDER BY last_offset LIMIT %s",
                (log_id, after, (1 << 63) - 1 if below is None else below, limit)).fetchall()
            for _last, blob, base, file_id in chunk:
                yield from _run_entries(blob, base, file_id)
            if len(chunk) < limit:
                return
            after = chunk[-1][0]
            limit = min(limit * 8, FIND_CHUNK)

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
        count = freed = 0
        for file_id, (size, n) in _cut_runs(cur, log_id, None, None if below is None else below - 1).items():
            key = (file_id, topic_id)
            freed_per_file[key] = freed_per_file.get(key, 0) + size
            count += n
            freed += size
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

    # -- KIP-1164 operations -------------------------------------------------------------------

    @_guarded
    def create_topic_and_partitions(self, requests: Iterable[CreateTopicAndPartitionsRequest]) -> None:
        rows = partition_rows(requests)
        if not rows:
            return
        tids, parts, names = ([r[i] for r in rows] for i in range(3))
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
        check_commit(object_key, file_size)
        if len(batches) >= MAX_BATCHES_PER_OBJECT:
            raise CoordinatorException(f"invalid commit of {object_key}: {len(batches)} batches in one object")
        if self._read_only:
            raise CoordinatorException(f"coordinator {self.path} is open read-only (readonly)")
        now = self._clock()
        args = (object_key, uploader_broker_id, file_size, batches, now, require_intent)
        try:
            packed = _pack(object_key, file_size, batches, now)
            if packed is not None:  # no producer ids: no state to check
                return self._commit_once(packed, *args)
            # Idempotent: checked against the producer state in memory, then one statement that
            # writes only if no log moved on meanwhile; otherwise under the logs' locks. A broker
            # commits its objects one at a time (in object order), so holding this lock costs it
            # nothing; it keeps the memory consistent with what each statement checked.
            with self._producers_lock:
                try:
                    packed = _pack(object_key, file_size, batches, now, self._cached_state)
                except _NeedLock:
                    return self._commit_locked(*args)
                assert packed is not None
                try:
                    answer = self._commit_once(packed, *args)
                except BaseException:
                    packed.undo()  # not written (or not known to be): memory as it was
                    raise
                if answer is not None:
                    return answer
                packed.undo()  # stale: nothing written; checked again under the logs' locks
                return self._commit_locked(*args)
        except struct.error as err:  # a field that does not fit its run entry (see _RUN_ENTRY)
            raise CoordinatorException(f"invalid commit of {object_key}: a batch field outside Kafka's types"
                                       f" ({err})") from None

    def _cached_state(self, key: tuple[uuid.UUID, int]) -> _LogProducers:
        state = self._states.get(key)
        if state is None:
            raise _NeedLock()
        return state

    def _commit_once(self, packed: _Packed, object_key: str, uploader_broker_id: int, file_size: int,
                     batches: list[CommitBatchRequest], now: int, require_intent: bool
                     ) -> list[CommitBatchResponse] | None:
        """_COMMIT as its own transaction, one round trip; None when it was stale (nothing written)."""
        with self._conn() as conn:
            rows = conn.execute(_COMMIT, {
                "key": object_key, "uploader": uploader_broker_id, "size": file_size, "now": now,
                "require": require_intent, **packed.params}).fetchall()
        if rows[0][2]:
            return None
        return self._answer(object_key, batches, packed, rows, now, require_intent)

    def _commit_locked(self, object_key: str, uploader_broker_id: int, file_size: int,
                       batches: list[CommitBatchRequest], now: int, require_intent: bool) -> list[CommitBatchResponse]:
        """The commit under its logs' row locks (transactional batches, producer state not in
        memory, or another broker's commit to the same partitions since): the state is brought up
        to date while the locks hold (only the runs committed since, in the usual case), the
        batches are checked against it, then the same statement writes (it cannot be stale now),
        and the transactions' rows, in the same transaction."""
        keys = list(dict.fromkeys((r.topic_id_partition.topic_id, r.topic_id_partition.partition) for r in batches
                                  if isinstance(r.topic_id_partition, TopicIdPartition)))
        with self._conn() as conn, conn.cursor() as cur:
            try:
                lock_cur, refresh_cur = conn.cursor(), conn.cursor(binary=True)
                cached = [self._states.get(k) for k in keys]
                with conn.pipeline():
                    cur.execute("BEGIN")
                    lock_cur.execute(_LOCK_LOGS, ([k[0] for k in keys], [k[1] for k in keys]))
                    self._execute_refresh(refresh_cur, keys, cached)
                states = self._install_refresh(keys, cached, refresh_cur.fetchall())
                packed = None
                packed = _pack(object_key, file_size, batches, now, states.__getitem__, locked=True)
                assert packed is not None
                txn = None
                if packed.txn_events:
                    events = [TxnEvent(packed.checked[slot].log_id, pid, kind, packed.checked[slot].hwm + rel)
                              for slot, pid, kind, rel in packed.txn_events]
                    txn = self._txn_changes(cur, events)
                rows = cur.execute(_COMMIT, {
                    "key": object_key, "uploader": uploader_broker_id, "size": file_size, "now": now,
                    "require": require_intent, **packed.params}).fetchall()
                if rows[0][0] is None:
                    raise intent_gone(object_key) if require_intent and not rows[0][1] else already_committed(object_key)
                with conn.pipeline():
                    if txn is not None:
                        self._write_txn_changes(cur, txn)
                    cur.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                if packed is not None:
                    packed.undo()
                raise
        answer = self._answer(object_key, batches, packed, rows, now, require_intent)
        assert answer is not None
        return answer

    def _answer(self, object_key: str, batches: list[CommitBatchRequest], packed: _Packed, rows: list[tuple],
                now: int, require_intent: bool) -> list[CommitBatchResponse]:
        """The responses of a written commit, from the high watermarks its statement returned;
        the producer state in memory moves on with it (the copies the commit changed go in)."""
        file_id, intent = rows[0][:2]
        if file_id is None:
            if require_intent and not intent:
                raise intent_gone(object_key)
            raise already_committed(object_key)
        count = len(packed.keys)
        bases: list[int | None] = [None] * count
        starts = [0] * count
        log_ids = [0] * count
        for _fid, _intent, _stale, slot, log_id, hwm, lso in rows:
            if slot is not None:
                bases[slot - 1], starts[slot - 1], log_ids[slot - 1] = hwm, lso, log_id
        with self._producers_lock:
            states = self._states
            for slot, key in enumerate(packed.keys):
                state = states.get(key)
                if state is None or bases[slot] is None:
                    continue
                changes = packed.changes[slot]
                if state.log_id == log_ids[slot] and state.hwm == bases[slot] \
                        and (not changes or state is packed.checked[slot]):
                    # Plain batches change no producer; checked ones changed this state in place.
                    if changes:
                        state.dirty.update(map(_PID_OF_CHANGE, changes))
                    state.hwm = bases[slot] + packed.grow[slot]  # type: ignore[operator]
                elif changes:
                    del states[key]  # cannot happen (the statement checked it); never keep a doubt
            packed.changes = [None] * count  # kept: nothing left to undo
        ok, unknown, refused = CommitBatchResponse, CommitBatchResponse.of_error, packed.refused
        none = ErrorCode.none
        out = []
        add = out.append
        for i, (req, slot, rel) in enumerate(zip(batches, packed.slots, packed.rels)):
            base = bases[slot]
            if base is None:
                add(unknown(ErrorCode.unknown_topic_or_partition, req))
            elif rel >= 0:
                add(ok(none, base + rel, now, starts[slot], False, req))
            else:
                answer = refused[i]  # a duplicate gets the original batch's answer
                out.append(ok(ErrorCode.none, answer[2], answer[4], starts[slot], True, req)
                           if isinstance(answer, tuple) else unknown(answer, req))
        return out

    @staticmethod
    def _execute_refresh(cur: psycopg.Cursor, keys: list[tuple[uuid.UUID, int]],
                         cached: list[_LogProducers | None]) -> None:
        cur.execute(_REFRESH, ([k[0] for k in keys], [k[1] for k in keys],
                               [None if c is None else c.log_id for c in cached],
                               [None if c is None else c.hwm for c in cached]), prepare=False)

    def _install_refresh(self, keys: list[tuple[uuid.UUID, int]], cached: list[_LogProducers | None],
                         rows: list[tuple]) -> dict[tuple[uuid.UUID, int], _LogProducers | None]:
        """_REFRESH's answer folded into memory (the caller holds _producers_lock)."""
        states = _fold_refresh(rows, keys, cached)
        for key, state in states.items():
            if state is None:
                self._states.pop(key, None)
            else:
                self._states[key] = state
        return states

    def _snapshot_producers(self) -> int:
        """Write the producer state changed in memory since the last snapshot, as of each log's
        high watermark in memory, and move the logs' snapshot offsets there; returns the logs
        written. A log whose snapshot is already at or past that offset (another broker's, or a
        deletion's) is left alone. The rows written cover every producer that changed since the
        database's snapshot (ours, or one we loaded), so after it the rows are the state as of the
        new offset. Called every ``producer.snapshot.interval.ms`` and on close."""
        with self._producers_lock:
            work = []
            for state in self._states.values():
                if state.dirty:
                    work.append((state, state.hwm, state.dirty,
                                 [(pid, state.producers[pid].epoch, state.producers[pid].encode())
                                  for pid in sorted(state.dirty)]))
                    state.dirty = set()
        if not work:
            return 0
        try:
            with self._tx() as cur:
                work.sort(key=lambda w: w[0].log_id)
                ids = [w[0].log_id for w in work]
                cur.execute("SELECT log_id FROM logs WHERE log_id = ANY(%s) ORDER BY log_id FOR UPDATE", (ids,))
                done = {row[0] for row in cur.execute(
                    "UPDATE logs l SET producer_snapshot_offset = v.hwm FROM unnest(%b::bigint[], %b::bigint[])"
                    " AS v (log_id, hwm) WHERE l.log_id = v.log_id AND l.producer_snapshot_offset < v.hwm"
                    " RETURNING l.log_id", (ids, [w[1] for w in work])).fetchall()}
                rows = [(state.log_id, pid, epoch, blob) for state, _hwm, _dirty, entries in work
                        if state.log_id in done for pid, epoch, blob in entries]
                if rows:
                    cur.execute(_UPSERT_PRODUCERS, tuple([r[i] for r in rows] for i in range(4)))
        except BaseException:
            with self._producers_lock:
                for state, _hwm, dirty, _entries in work:
                    state.dirty |= dirty
            raise
        with self._producers_lock:
            for state, _hwm, dirty, _entries in work:
                if state.log_id not in done:
                    state.dirty |= dirty  # not written: still to write (a superset is harmless)
        return len(done)

    @staticmethod
    def _snapshot_log(cur: psycopg.Cursor, topic_id: uuid.UUID, partition: int) -> None:
        """Snapshot one log's producer state at its high watermark, from the database alone
        (the caller holds the log's row lock): before runs are deleted or rewritten, so that the
        runs a state is rebuilt from are always intact (see _REFRESH). Producer state outlives
        the batches, as Kafka's outlives its segments."""
        cur.execute(_REFRESH, ([topic_id], [partition], [None], [None]), binary=True, prepare=False)
        state = _fold_refresh(cur.fetchall(), [(topic_id, partition)], [None])[(topic_id, partition)]
        if state is None:
            return
        if state.dirty:
            pids = sorted(state.dirty)
            cur.execute(_UPSERT_PRODUCERS, ([state.log_id] * len(pids), pids,
                                            [state.producers[p].epoch for p in pids],
                                            [state.producers[p].encode() for p in pids]))
        cur.execute("UPDATE logs SET producer_snapshot_offset = high_watermark WHERE log_id = %s"
                    " AND producer_snapshot_offset < high_watermark", (state.log_id,))

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
        fetch = FetchBudget(fetch_max_bytes)
        if not requests:
            return out
        with self._conn() as conn:
            for req in requests:
                tip = req.topic_id_partition
                # One round trip per partition: the log row and its first runs from the offset.
                # Batches are read only below the high watermark read with them, so a commit landing
                # meanwhile never shows half-way.
                rows = conn.execute(
                    _FIND_FIRST, (req.offset, FIND_FIRST_CHUNK, req.offset, tip.topic_id, tip.partition)).fetchall()
                if not rows:
                    out.append(FindBatchResponse(ErrorCode.unknown_topic_or_partition, [], UNKNOWN_OFFSET, UNKNOWN_OFFSET))
                    continue
                log_id, lso, hwm, first_open = rows[0][:4]
                if req.offset < lso or req.offset > hwm:
                    out.append(FindBatchResponse(ErrorCode.offset_out_of_range, [], lso, hwm))
                    continue
                stable = hwm if first_open is None else min(first_open, hwm)
                end = stable if req.read_committed else hwm
                budget = fetch.wants(req.max_partition_fetch_bytes)
                found: list[BatchInfo] = []
                if req.offset < end and budget is not None:
                    # (last offset, key, entries, base offset, file_id) of the first runs
                    first = [row[4:] for row in rows if row[4] is not None]
                    found = fetch.take(self._batches_from(conn, tip, log_id, req.offset, end, hwm, first),
                                       _BYTE_SIZE, budget)
                aborted: list[AbortedTransaction] = []
                if req.read_committed and found:
                    aborted = [AbortedTransaction(*r) for r in conn.execute(
                        "SELECT producer_id, first_offset, last_offset FROM txn_aborted WHERE log_id = %s"
                        " AND last_offset >= %s AND first_offset <= %s ORDER BY first_offset",
                        (log_id, req.offset, found[-1].metadata.last_offset)).fetchall()]
                out.append(FindBatchResponse(ErrorCode.none, found, lso, hwm, stable, aborted))
        return out

    @staticmethod
    def _batches_from(conn: psycopg.Connection, tip: TopicIdPartition, log_id: int, offset: int, end: int, hwm: int,
                      chunk: list[tuple]) -> Iterator[BatchInfo]:
        """The log's batches from the one holding ``offset`` up to ``end``: the runs read with the
        log row first, then FIND_FIRST_CHUNK x 8 more runs per query, while the caller takes."""
        limit = FIND_FIRST_CHUNK
        while True:
            for _last, key, blob, base, file_id in chunk:
                for e in _entries_from(blob, base, file_id, offset):  # the first run may start before it
                    if e[1] >= end:
                        return
                    yield _info(e, key, tip)
            if len(chunk) < limit:
                return
            limit = min(limit * 8, FIND_CHUNK)
            chunk = conn.execute(
                "SELECT r.last_offset, f.object_key, r.batches, r.base_offset, r.file_id"
                " FROM (SELECT * FROM batch_runs"
                " WHERE log_id = %s AND last_offset > %s AND last_offset < %s ORDER BY last_offset"
                " LIMIT %s) r JOIN files f ON f.file_id = r.file_id ORDER BY r.last_offset",
                (log_id, chunk[-1][0], hwm, limit),
            ).fetchall()

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
                    out.append(ListOffsetsResponse(ErrorCode.unknown_topic_or_partition, tip, NO_TIMESTAMP, UNKNOWN_OFFSET))
                    continue
                log_id, lso, hwm = row
                out.append(list_offsets_answer(tip, req, lso, hwm, functools.partial(self._stable, conn, log_id, hwm),
                                               functools.partial(self._max_timestamp, conn, log_id),
                                               functools.partial(self._first_at, conn, log_id)))
        return out

    @staticmethod
    def _stable(conn: psycopg.Connection, log_id: int, hwm: int) -> int:
        first = conn.execute("SELECT min(first_offset) FROM txn_open WHERE log_id = %s", (log_id,)).fetchone()[0]
        return hwm if first is None else min(first, hwm)

    @staticmethod
    def _max_timestamp(conn: psycopg.Connection, log_id: int) -> tuple[int, int] | None:
        """(last offset, timestamp) of the earliest batch holding the log's largest timestamp."""
        row = conn.execute("SELECT max_timestamp, batches, base_offset, file_id FROM batch_runs WHERE log_id = %s"
                           " ORDER BY max_timestamp DESC, last_offset ASC LIMIT 1", (log_id,)).fetchone()
        if row is None:
            return None
        return next((e[2], row[0]) for e in _run_entries(*row[1:]) if _effective_ts(e) == row[0])

    @staticmethod
    def _first_at(conn: psycopg.Connection, log_id: int, ts: int) -> tuple[int, int] | None:
        """(base offset, timestamp) of the first batch whose timestamp reaches ``ts``."""
        row = conn.execute("SELECT batches, base_offset, file_id FROM batch_runs WHERE log_id = %s"
                           " AND max_timestamp >= %s ORDER BY last_offset LIMIT 1", (log_id, ts)).fetchone()
        if row is None:
            return None
        return next((e[1], _effective_ts(e)) for e in _run_entries(*row) if _effective_ts(e) >= ts)

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
                    out.append(DeleteRecordsResponse(ErrorCode.unknown_topic_or_partition, UNKNOWN_OFFSET))
                    continue
                log_id, name, lso, hwm, size = log
                target = delete_records_target(req, lso, hwm)
                if isinstance(target, DeleteRecordsResponse):
                    out.append(target)
                    continue
                self._snapshot_log(cur, tip.topic_id, tip.partition)
                _count, freed = self._delete_batches(cur, log_id, tip.topic_id, target, freed_per_file)
                cur.execute("UPDATE logs SET log_start_offset = %s, byte_size = byte_size - %s WHERE log_id = %s",
                            (target, freed, log_id))
                logs[key] = (log_id, name, target, hwm, size - freed)
                out.append(DeleteRecordsResponse(ErrorCode.none, target))
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
        self._forget_states(lambda key: key[0] in ids)

    def _forget_states(self, gone: Callable[[tuple[uuid.UUID, int]], bool]) -> None:
        """Drop the producer state in memory of deleted logs (a re-created partition is a new log:
        its state would be reloaded anyway, its log_id being new)."""
        with self._producers_lock:
            for key in [k for k in self._states if gone(k)]:
                del self._states[key]

    def _drop_logs(self, cur: psycopg.Cursor, logs: list[tuple[int, uuid.UUID, int]], now: int) -> int:
        """Delete locked logs with their batches and producer state (cascade); batches deleted."""
        freed_per_file: dict[tuple[int, uuid.UUID], int] = {}
        deleted = 0
        for log_id, topic_id, _partition in logs:
            deleted += self._delete_batches(cur, log_id, topic_id, None, freed_per_file)[0]
        if logs:
            cur.execute("DELETE FROM logs WHERE log_id = ANY(%s)", ([row[0] for row in logs],))
            cur.execute("DELETE FROM kcli_meta WHERE key = ANY(%s)", ([checkpoint_key(row[0]) for row in logs],))
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
                " AND NOT EXISTS (SELECT 1 FROM batch_runs r WHERE r.file_id = files.file_id)", (keys,))

    @_guarded
    def is_safe_to_delete_file(self, object_key: str) -> bool:
        with self._conn() as conn:
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM files f JOIN batch_runs r ON r.file_id = f.file_id WHERE f.object_key = %s)",
                (object_key,)).fetchone()
        return not row[0]

    # -- kcli extras ---------------------------------------------------------------------------

    @_guarded
    def delete_partitions(self, topic_id: uuid.UUID, partitions: set[int]) -> int:
        now = self._clock()
        with self._tx() as cur:
            logs = self._lock_logs(cur, [(topic_id, p) for p in sorted(partitions)])
            rows = sorted((log[0], topic_id, part) for (_tid, part), log in logs.items())
            deleted = self._drop_logs(cur, rows, now)
        self._forget_states(lambda key: key[0] == topic_id and key[1] in partitions)
        return deleted

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
                    out.append(RetentionResult(tip, ErrorCode.unknown_topic_or_partition, UNKNOWN_OFFSET, 0, 0))
                    continue
                log_id, name, lso, hwm, size = log
                if retention_nothing_to_do(retention_ms, retention_bytes, size):
                    out.append(RetentionResult(tip, ErrorCode.none, lso, 0, 0))
                    continue
                cutoff, count, freed = retention_cut(((e[2], e[4], _effective_ts(e)) for e in self._entries(cur, log_id)),
                                                     size, retention_ms, retention_bytes, now_ms)
                if cutoff is None:
                    out.append(RetentionResult(tip, ErrorCode.none, lso, 0, 0))
                    continue
                self._snapshot_log(cur, tip.topic_id, tip.partition)
                self._delete_batches(cur, log_id, tip.topic_id, cutoff, freed_per_file)
                new_lso = max(lso, cutoff)
                cur.execute("UPDATE logs SET log_start_offset = %s, byte_size = byte_size - %s WHERE log_id = %s",
                            (new_lso, freed, log_id))
                logs[key] = (log_id, name, new_lso, hwm, size - freed)
                out.append(RetentionResult(tip, ErrorCode.none, new_lso, count, freed))
            self._release_files(cur, freed_per_file, now_ms)
        return out

    @_guarded
    def describe_logs(self, topic_ids: Iterable[uuid.UUID] | None = None) -> list[LogInfo]:
        query = (
            "SELECT l.topic_id, l.topic_name, l.partition, l.log_start_offset, l.high_watermark, l.byte_size,"
            " (SELECT coalesce(sum(batch_count), 0) FROM batch_runs r WHERE r.log_id = l.log_id) FROM logs l"
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
        check_file_state(state)
        where, params = sql_filters((
            ("f.state = %s", state), ("f.object_key = %s", object_key),
            ("EXISTS (SELECT 1 FROM file_topics ft WHERE ft.file_id = f.file_id AND ft.topic_id = %s)", topic_id)))
        query = (
            "SELECT f.file_id, f.object_key, f.file_size, f.used_size, f.state, f.committed_at,"
            " f.marked_for_deletion_at, f.uploader,"
            " (SELECT coalesce(sum(batch_count), 0) FROM batch_runs r WHERE r.file_id = f.file_id)"
            f" FROM files f{where} ORDER BY f.committed_at, f.file_id"
        )
        out = []
        with self._conn() as conn:
            rows = conn.execute(query, params).fetchall()
            for file_id, key, fsize, used, st, committed, marked, uploader, count in rows:
                parts = conn.execute(
                    "SELECT DISTINCT l.topic_id, l.topic_name, l.partition FROM batch_runs r JOIN logs l"
                    " ON l.log_id = r.log_id WHERE r.file_id = %s ORDER BY l.topic_name, l.partition", (file_id,),
                ).fetchall()
                tips = [TopicIdPartition(t, n, p) for t, n, p in parts]
                out.append(FileInfo(key, fsize, used, st, committed, marked, count, tips, uploader))
        return out

    @_guarded
    def batches_in_file(self, object_key: str) -> list[BatchInfo]:
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT r.batches, r.base_offset, r.file_id, l.topic_id, l.topic_name, l.partition FROM files f"
                " JOIN batch_runs r ON r.file_id = f.file_id JOIN logs l ON l.log_id = r.log_id"
                " WHERE f.object_key = %s", (object_key,)).fetchall()
        out = []
        for blob, base, file_id, tid, name, part in rows:
            tip = TopicIdPartition(tid, name, part)
            out.extend(_info(e, object_key, tip) for e in _run_entries(blob, base, file_id))
        out.sort(key=lambda b: b.metadata.byte_offset)
        return out

    @_guarded
    def known_object_keys(self) -> set[str]:
        with self._conn() as conn:
            return {row[0] for row in conn.execute("SELECT object_key FROM files")}

    # -- diskless replica caches ------------------------------------------------------------------

    @_guarded
    def report_replica_caches(self, broker_id: int, report: str) -> None:
        with self._tx() as cur:
            cur.execute("INSERT INTO kcli_meta (key, value) VALUES (%s, %s)"
                        " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                        (f"replica.caches.{int(broker_id)}", report))

    @_guarded
    def replica_cache_reports(self) -> dict[int, str]:
        with self._conn() as conn:
            rows = conn.execute("SELECT key, value FROM kcli_meta WHERE key LIKE 'replica.caches.%%'").fetchall()
        return {int(k.rsplit(".", 1)[1]): v for k, v in rows}

    # -- identity and upload intents -------------------------------------------------------------

    @_guarded
    def cluster_id(self) -> str | None:
        with self._conn() as conn:
            row = conn.execute("SELECT value FROM kcli_meta WHERE key = 'cluster_id'").fetchone()
        return None if row is None else str(row[0])

    @_guarded
    def claim_cluster_id(self, cluster_id: str) -> None:
        check_cluster_id(cluster_id)
        with self._tx() as cur:
            # Two brokers claiming at once: the second waits on the key, then reads the first's.
            cur.execute("INSERT INTO kcli_meta (key, value) VALUES ('cluster_id', %s) ON CONFLICT (key) DO NOTHING",
                        (cluster_id,))
            stored = cur.execute("SELECT value FROM kcli_meta WHERE key = 'cluster_id'").fetchone()[0]
            if stored != cluster_id:
                raise foreign_cluster(self.path, stored, cluster_id)

    @_guarded
    def register_upload_intent(self, object_key: str, broker_id: int, time_ms: int) -> None:
        check_intent_key(object_key)
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
        if len(batches) >= MAX_BATCHES_PER_OBJECT:
            raise CoordinatorException(f"replace_batches of {tip}: {len(batches)} batches in one object")
        with self._tx() as cur:
            # The log's row lock orders this against commits, retention and DeleteRecords of the log.
            row = self._lock_logs(cur, [(tip.topic_id, tip.partition)]).get((tip.topic_id, tip.partition))
            gone = cur.execute("DELETE FROM upload_intents WHERE object_key = %s", (object_key,)).rowcount == 0
            if require_intent and gone:
                raise intent_gone(object_key)
            try:
                file_id = cur.execute(
                    "INSERT INTO files (object_key, uploader, file_size, used_size, state, committed_at,"
                    " marked_for_deletion_at) VALUES (%s, %s, %s, 0, 'deleting', %s, %s) RETURNING file_id",
                    (object_key, uploader_broker_id, file_size, now_ms, now_ms)).fetchone()[0]
            except psycopg.errors.UniqueViolation:
                raise already_committed(object_key) from None
            if row is None or not replaced:
                return False
            log_id, topic_name = row[0], row[1]
            lo = min(b.metadata.last_offset for b in replaced)
            hi = max(b.metadata.last_offset for b in replaced)
            live = {(e[2], e[0]) for e in _entries_between(cur, log_id, lo, hi)}
            if live != {(b.metadata.last_offset, b.batch_id) for b in replaced}:
                return False  # the range changed since it was read: the new object is garbage
            # Rewrites are never replayed into producer state: the runs they replace go below the snapshot.
            self._snapshot_log(cur, tip.topic_id, tip.partition)
            freed_per_file = {(fid, tip.topic_id): size for fid, (size, _n) in _cut_runs(cur, log_id, lo, hi).items()}
            self._release_files(cur, freed_per_file, now_ms)
            used = sum(md.byte_size for md in batches)
            cur.execute("UPDATE logs SET byte_size = byte_size - %s + %s WHERE log_id = %s",
                        (sum(freed_per_file.values()), used, log_id))
            if batches:
                first_id = file_id << BATCH_INDEX_BITS
                _insert_runs(cur, _run_rows(log_id, file_id, [
                    (first_id | i, md.base_offset, md.last_offset, md.byte_offset, md.byte_size,
                     md.log_append_timestamp, md.batch_max_timestamp, md.timestamp_type, md.producer_id,
                     md.producer_epoch, md.base_sequence, md.last_sequence) for i, md in enumerate(batches)]))
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
        key = (tip.topic_id, tip.partition)
        with self._producers_lock, self._conn() as conn, conn.transaction():
            # the state in memory brought up to the high watermark (the runs since, in the usual case)
            cached = [self._states.get(key)]
            with conn.cursor(binary=True) as cur:
                self._execute_refresh(cur, [key], cached)
                state = self._install_refresh([key], cached, cur.fetchall())[key]
            if state is None:
                return None
            open_txns = dict(conn.execute(
                "SELECT producer_id, first_offset FROM txn_open WHERE log_id = %s", (state.log_id,)).fetchall())
            return describe_producer_states(state.producers, open_txns)

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
        return topic_storage(names, stats, wanted, lambda tid: tid)
