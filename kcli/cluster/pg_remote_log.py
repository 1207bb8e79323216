"""Remote log segment metadata (the RLMM) of a cluster, in PostgreSQL (issue #16, "What lives in
PostgreSQL" 4): no tiered segment is lost with a broker's disk.

The single-node RLMM (:mod:`kcli.tiered.metadata`) is an event file in the data dir; here the
same events are rows of the cluster database (schema step 3 in :mod:`kcli.cluster.migrations`):

- ``remote_log_segments``: one row per remote segment copy, its state and its metadata in the
  file store's JSON form. A row that reaches DELETE_SEGMENT_FINISHED stays (other brokers learn
  of the end from it) and leaves every query.
- ``remote_log_partition_stops``: KIP-950 marks, "partition P has done its part of disabling
  tiered epoch E", so whichever broker decides DISABLED knows every host is done.

Every write runs in one transaction under an advisory lock: it reads the rows it changes from the
database (not from this broker's memory), validates the transition (Kafka's rules, as the file
store does) and only then writes, and it returns once committed. Writes take ``version`` numbers
from one sequence while holding the lock, so commit order equals version order and a broker that
has seen version N never later meets a smaller one: :meth:`refresh` reads only rows above the
highest version it knows. Queries answer from the in-memory view (:class:`MaterializedSegments`),
as the file store does, so fetches never wait on the database.

Every wait is bounded by the cluster store's pool (checkout timeout, statement_timeout, connect
timeout); a database error is a :class:`RemoteLogMetadataError` (the caller's task backs off and
retries), and a write whose commit outcome is unknown is learned by the next refresh.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import PoolTimeout

from kcli.tiered.metadata import (
    MaterializedSegments,
    RemoteLogMetadataError,
    segment_from_json,
    segment_to_json,
)
from plugins.rsm.base import RemoteLogSegmentMetadata, RemoteLogSegmentState

RLMM_LOCK_ID = 0x6B636C6904  # pg_advisory_xact_lock key serialising remote log metadata writes
DB_ERRORS = (psycopg.Error, PoolTimeout, OSError)
S = RemoteLogSegmentState

Connect = Callable[[], AbstractContextManager[Any]]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _reason(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


class PgRemoteLogMetadataStore(MaterializedSegments):
    """The :class:`kcli.tiered.metadata.RemoteLogMetadata` of a cluster. ``connect`` lends a
    connection of the cluster store's pool (autocommit, statement_timeout set)."""

    def __init__(self, connect: Connect) -> None:
        super().__init__()
        self._connect = connect
        self._seen = 0  # highest version applied to the in-memory view

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self) -> PgRemoteLogMetadataStore:
        try:
            with self._connect() as conn, conn.transaction():
                # under the write lock: no write can commit between the two reads
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (RLMM_LOCK_ID,))
                top = conn.execute("SELECT coalesce(max(version), 0) FROM remote_log_segments").fetchone()
                rows = conn.execute("SELECT metadata FROM remote_log_segments WHERE state <> %s",
                                    (S.DELETE_SEGMENT_FINISHED.value,)).fetchall()
        except DB_ERRORS as err:
            raise self._error("read", err) from None
        with self._lock:
            for (d,) in rows:
                self._put(segment_from_json(d))
            self._seen = int(top[0])
        return self

    def close(self) -> None:
        """Nothing of its own to release: the connections are the cluster store's."""

    def refresh(self) -> None:
        try:
            with self._connect() as conn:
                rows = conn.execute("SELECT version, metadata FROM remote_log_segments WHERE version > %s ORDER BY version",
                                    (self._seen,)).fetchall()
        except DB_ERRORS as err:
            raise self._error("read", err) from None
        self._learn(rows)

    def _learn(self, rows: Iterable[tuple[int, Any]]) -> None:
        """Apply rows read in version order; :attr:`_seen` moves past them."""
        with self._lock:
            for version, d in rows:
                if version > self._seen:
                    self._put(segment_from_json(d))
                    self._seen = int(version)

    def _wrote(self, mds: Iterable[RemoteLogSegmentMetadata]) -> None:
        """Apply this broker's own committed writes. :attr:`_seen` stays: rows of other brokers
        may lie between it and these versions; the next refresh reads both (again, harmlessly)."""
        with self._lock:
            for md in mds:
                self._put(md)

    @staticmethod
    def _error(what: str, err: BaseException) -> RemoteLogMetadataError:
        return RemoteLogMetadataError(f"cannot {what} remote log metadata in the cluster database: {_reason(err)}")

    # -- writes --------------------------------------------------------------------------------
    def add_copy_started(self, md: RemoteLogSegmentMetadata) -> None:
        """Record a new segment copy (Kafka's addRemoteLogSegmentMetadata), committed on return."""
        if md.state is not S.COPY_SEGMENT_STARTED:
            raise RemoteLogMetadataError(f"a new remote segment must be {S.COPY_SEGMENT_STARTED.value}, got {md.state.value}")
        sid = md.segment_id
        try:
            with self._connect() as conn, conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (RLMM_LOCK_ID,))
                row = conn.execute(
                    """INSERT INTO remote_log_segments (segment_id, topic_id, partition, start_offset, end_offset,
                                                        state, broker_id, metadata, version)
                       VALUES (%s, %s, %s, %s, %s, %s, %s, %s, nextval('remote_log_segments_version'))
                       ON CONFLICT (segment_id) DO NOTHING RETURNING segment_id""",
                    (sid.id, sid.topic_id, sid.partition, md.start_offset, md.end_offset, md.state.value,
                     md.broker_id, Jsonb(segment_to_json(md)))).fetchone()
        except DB_ERRORS as err:
            raise self._error("write", err) from None
        if row is None:
            raise RemoteLogMetadataError(f"remote segment {sid.id} already exists")
        self._wrote([md])

    def update_state(self, mds: Iterable[RemoteLogSegmentMetadata], state: RemoteLogSegmentState) -> list[RemoteLogSegmentMetadata]:
        """Move segments to ``state`` in one transaction (Kafka's updateRemoteLogSegmentMetadata);
        returns the updated metadata. The transition is checked against the rows as the database
        has them (another broker may have moved a segment on), before anything is written."""
        mds = list(mds)
        if not mds:
            return []
        try:
            with self._connect() as conn, conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (RLMM_LOCK_ID,))
                rows = conn.execute("SELECT metadata FROM remote_log_segments WHERE segment_id = ANY(%s)",
                                    ([md.segment_id.id for md in mds],)).fetchall()
                found = {m.segment_id.id: m for m in (segment_from_json(d) for (d,) in rows)
                         if m.state is not S.DELETE_SEGMENT_FINISHED}

                def finished(topic_id: uuid.UUID, partition: int) -> list[RemoteLogSegmentMetadata]:
                    # under the RLMM lock: no other broker finishes a copy of this partition meanwhile
                    return [segment_from_json(d) for (d,) in conn.execute(
                        "SELECT metadata FROM remote_log_segments WHERE topic_id = %s AND partition = %s"
                        " AND state = %s", (topic_id, partition, S.COPY_SEGMENT_FINISHED.value)).fetchall()]

                out = self._transitions(mds, state, found.get, _now_ms(), finished)  # raises: rolled back
                for md in out:
                    conn.execute("""UPDATE remote_log_segments SET state = %s, metadata = %s, updated_at = now(),
                                           version = nextval('remote_log_segments_version')
                                    WHERE segment_id = %s""",
                                 (state.value, Jsonb(segment_to_json(md)), md.segment_id.id))
        except DB_ERRORS as err:
            raise self._error("write", err) from None
        self._wrote(out)
        return out

    # -- KIP-950 marks -------------------------------------------------------------------------
    def mark_partitions_stopped(self, topic_id: uuid.UUID, tiered_epoch: int, partitions: Iterable[int]) -> None:
        parts = sorted(set(partitions))
        if not parts:
            return
        try:
            with self._connect() as conn, conn.transaction():
                for p in parts:
                    conn.execute("""INSERT INTO remote_log_partition_stops (topic_id, partition, tiered_epoch)
                                    VALUES (%s, %s, %s) ON CONFLICT DO NOTHING""", (topic_id, p, tiered_epoch))
        except DB_ERRORS as err:
            raise self._error("write", err) from None

    def stopped_partitions(self, topic_id: uuid.UUID, tiered_epoch: int) -> set[int]:
        try:
            with self._connect() as conn:
                rows = conn.execute("""SELECT partition FROM remote_log_partition_stops
                                       WHERE topic_id = %s AND tiered_epoch = %s""", (topic_id, tiered_epoch)).fetchall()
        except DB_ERRORS as err:
            raise self._error("read", err) from None
        return {int(p) for (p,) in rows}
