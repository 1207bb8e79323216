"""Committed consumer-group offsets in the cluster's PostgreSQL database (the cluster's
:class:`kcli.coordinator.group.offsets.CommittedOffsetStore`), so that no commit is lost with a broker's disk.

Tables (migration step 2, :mod:`kcli.cluster.migrations`):

- ``consumer_groups``: one row per group a broker has loaded: its protocol type and the
  ``claim`` of the broker that coordinates it now. Loading a group writes a fresh claim and
  reads the group's offsets in the same transaction.
- ``consumer_offsets``: (group, topic, partition) → offset, leader epoch, metadata, commit
  timestamp (and an expire timestamp column for Kafka's v1 retention, unused: offsets.retention
  applies).
- ``consumer_offsets_topic_deletions``: topic ids whose offsets were dropped, so that the
  deletion runs once whichever broker applies the RemoveTopicRecord first.

Why a claim: when the live brokers change, two brokers may for a moment both think they
coordinate a group. Every write locks the group's row (``FOR SHARE``) and goes through only
while the row holds this broker's claim, and loading takes the row for update: so a write of the
old coordinator either committed before the new one read the group, or it is refused (fenced)
and its client is told NOT_COORDINATOR. A commit is answered only after its transaction
committed; writes are batched like the file store's fsyncs (one transaction per batch).

Every wait is bounded: the pool's timeout, ``connect_timeout``, ``statement_timeout`` (which
also bounds lock waits). An unreachable database is COORDINATOR_NOT_AVAILABLE to clients.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from kio.schema.errors import ErrorCode

from kcli.coordinator.group.offsets import OffsetAndMetadata, OffsetStoreError, apply_offset_record
from kcli.cluster.pgconn import check_connection

log = logging.getLogger("kcli.cluster.offsets")

DB_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout, OSError)
# Records that change one group's state: written only under this broker's claim of the group.
GROUP_RECORDS = frozenset({"offset", "offset_delete", "group", "group_delete"})
_OK = "ok"
_FENCED = "fenced"

Entry = tuple[list[dict[str, Any]], "asyncio.Future[None] | None"]


def _reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


class PostgresOffsetStore:
    """Offsets of the groups this broker coordinates, loaded from and written to PostgreSQL."""

    def __init__(self, url: str, node_id: int, *, label: str, connect_kwargs: dict[str, Any],
                 timeout_s: float) -> None:
        self.url = url
        self.node_id = node_id
        self.label = label  # the database URL without a password, for messages
        self.offsets: dict[str, dict[tuple[str, int], OffsetAndMetadata]] = {}
        self.protocol_types: dict[str, str] = {}
        self._kwargs = connect_kwargs
        self._timeout = timeout_s
        self._pool: ConnectionPool | None = None
        self._claims: dict[str, uuid.UUID] = {}
        self._pending: list[Entry] = []
        self._flusher: asyncio.Task[None] | None = None
        self._db_ok = True

    @property
    def location(self) -> str:
        return f"offsets in the cluster database {self.label}"

    # -- lifecycle
    def open(self) -> None:
        # Connections come up in the background: the first load or commit waits for one (bounded).
        if self._pool is not None:
            return
        self._pool = ConnectionPool(self.url, kwargs=self._kwargs, min_size=1, max_size=2, timeout=self._timeout,
                                    open=False, check=check_connection, name="kcli-offsets",
                                    reconnect_timeout=max(60.0, self._timeout * 4))
        self._pool.open(wait=False)

    async def close(self) -> None:
        try:
            await self._drain()
        except Exception:
            log.exception("%s: flush failed", self.location)
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(pool.close, self._timeout)

    def _conn(self) -> Any:
        if self._pool is None:
            raise OffsetStoreError(f"{self.location} is closed", ErrorCode.coordinator_not_available)
        return self._pool.connection(timeout=self._timeout)

    def _unavailable(self, err: BaseException) -> OffsetStoreError:
        if self._db_ok:
            log.error("%s: the database is unavailable: %s", self.location, _reason(err))
        self._db_ok = False
        return OffsetStoreError(f"the cluster database is unavailable: {_reason(err)}", ErrorCode.coordinator_not_available)

    def _reachable(self) -> None:
        if not self._db_ok:
            log.warning("%s: the database is reachable again", self.location)
        self._db_ok = True

    # -- groups
    async def load_group(self, group_id: str) -> None:
        """Claim the group (fencing the previous coordinator) and read its state, in one transaction."""
        claim = uuid.uuid4()
        try:
            protocol_type, rows = await asyncio.to_thread(self._claim_and_read, group_id, claim)
        except DB_ERRORS as err:
            raise self._unavailable(err) from None
        except psycopg.Error as err:  # e.g. a group id PostgreSQL's text cannot hold (NUL)
            raise OffsetStoreError(f"cannot load group {group_id!r}: {_reason(err)}", ErrorCode.coordinator_not_available) from None
        self._reachable()
        self._claims[group_id] = claim
        offs = {(t, int(p)): OffsetAndMetadata(int(o), int(e), m or "", int(ts)) for t, p, o, e, m, ts in rows}
        if offs:
            self.offsets[group_id] = offs
        else:
            self.offsets.pop(group_id, None)
        if protocol_type:
            self.protocol_types[group_id] = protocol_type
        else:
            self.protocol_types.pop(group_id, None)

    def _claim_and_read(self, group_id: str, claim: uuid.UUID) -> tuple[str | None, list[tuple[Any, ...]]]:
        with self._conn() as conn, conn.transaction():
            row = conn.execute(
                """INSERT INTO consumer_groups (group_id, coordinator_node, claim) VALUES (%s, %s, %s)
                   ON CONFLICT (group_id) DO UPDATE SET coordinator_node = EXCLUDED.coordinator_node,
                       claim = EXCLUDED.claim, claimed_at = now()
                   RETURNING protocol_type""", (group_id, self.node_id, claim)).fetchone()
            rows = conn.execute(
                """SELECT topic, partition, committed_offset, leader_epoch, metadata, commit_timestamp_ms
                   FROM consumer_offsets WHERE group_id = %s""", (group_id,)).fetchall()
        return (row[0] if row else None), rows

    def unload_group(self, group_id: str) -> None:
        claim = self._claims.pop(group_id, None)
        self.offsets.pop(group_id, None)
        self.protocol_types.pop(group_id, None)
        if claim is not None:  # a claim row with nothing stored is dropped, so unused ids leave no rows
            self._enqueue([{"type": "release", "group": group_id, "claim": str(claim)}], None)

    async def _drain(self) -> None:
        """Wait for this broker's queued writes, so that a read sees them (bounded like them)."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    async def stored_groups(self) -> dict[str, str]:
        await self._drain()
        try:
            rows = await asyncio.to_thread(self._read_groups)
        except DB_ERRORS as err:
            raise self._unavailable(err) from None
        self._reachable()
        return {str(gid): str(pt or "") for gid, pt in rows}

    def _read_groups(self) -> list[tuple[Any, ...]]:
        with self._conn() as conn:
            return conn.execute(
                """SELECT g.group_id, g.protocol_type FROM consumer_groups g
                   WHERE g.protocol_type IS NOT NULL
                      OR EXISTS (SELECT 1 FROM consumer_offsets o WHERE o.group_id = g.group_id)""").fetchall()

    async def lost_groups(self, group_ids: Iterable[str]) -> set[str]:
        mine = {gid: self._claims[gid] for gid in group_ids if gid in self._claims}
        if not mine:
            return set()
        try:
            held = await asyncio.to_thread(self._read_claims, sorted(mine))
        except DB_ERRORS as err:
            raise self._unavailable(err) from None
        self._reachable()
        # Only groups whose claim has not changed here meanwhile (a reload makes a new one).
        return {gid for gid, claim in mine.items() if held.get(gid) != claim and self._claims.get(gid) == claim}

    def _read_claims(self, group_ids: list[str]) -> dict[str, uuid.UUID]:
        with self._conn() as conn:
            rows = conn.execute("SELECT group_id, claim FROM consumer_groups WHERE group_id = ANY(%s)",
                                (group_ids,)).fetchall()
        return {str(g): c for g, c in rows}

    # -- reading
    def group_offsets(self, group_id: str) -> dict[tuple[str, int], OffsetAndMetadata]:
        return self.offsets.get(group_id, {})

    def has_offsets(self, group_id: str) -> bool:
        return bool(self.offsets.get(group_id))

    # -- writing
    async def append(self, records: list[dict[str, Any]]) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._enqueue(records, fut)
        await fut

    def append_behind(self, records: list[dict[str, Any]]) -> None:
        for rec in records:
            self._apply(rec)
        self._enqueue(records, None)

    def _enqueue(self, records: list[dict[str, Any]], fut: asyncio.Future[None] | None) -> None:
        self._pending.append((records, fut))
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (shutdown paths): write now
            batch, self._pending = self._pending, []
            try:
                self._write(batch, dict(self._claims))
            except (DB_ERRORS + (psycopg.Error, OffsetStoreError)) as err:
                log.error("%s: write failed: %s", self.location, _reason(err))
            return
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush_loop())

    async def _flush_loop(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            claims = dict(self._claims)
            try:
                results = await asyncio.to_thread(self._write, batch, claims)
            except (DB_ERRORS + (OffsetStoreError,)) as err:
                failure = err if isinstance(err, OffsetStoreError) else self._unavailable(err)
                for _recs, fut in batch:
                    if fut is not None and not fut.done():
                        fut.set_exception(OffsetStoreError(str(failure), failure.error_code))
                continue
            self._reachable()
            for (recs, fut), result in zip(batch, results):
                if result == _OK:
                    # In batch order, also the written-behind records, so memory ends as the
                    # database does whatever was queued in between.
                    for rec in recs:
                        if self._still_claimed(rec, claims):
                            self._apply(rec)
                    if fut is not None and not fut.done():
                        fut.set_result(None)
                elif fut is not None and not fut.done():
                    if result == _FENCED:
                        fut.set_exception(OffsetStoreError("another broker coordinates this group now",
                                                           ErrorCode.not_coordinator, fenced=True))
                    else:
                        fut.set_exception(OffsetStoreError(result, ErrorCode.coordinator_not_available))
                elif result != _OK:
                    log.warning("%s: a written-behind change was not stored: %s", self.location, result)

    def _still_claimed(self, rec: dict[str, Any], claims: dict[str, uuid.UUID]) -> bool:
        if rec.get("type") not in GROUP_RECORDS:
            return rec.get("type") == "topic_delete"
        gid = rec["group"]
        return gid in claims and self._claims.get(gid) == claims[gid]

    def _write(self, batch: list[Entry], claims: dict[str, uuid.UUID]) -> list[str]:
        """One transaction for the batch; returns per entry "ok", "fenced" or an error message.
        An entry PostgreSQL refuses (not a connection problem) fails alone."""
        with self._conn() as conn:
            try:
                with conn.transaction():
                    return self._write_entries(conn, batch, claims)
            except DB_ERRORS:
                raise
            except psycopg.Error as err:
                if len(batch) == 1:
                    return [f"the cluster database refused the change: {_reason(err)}"]
            out: list[str] = []
            for entry in batch:
                try:
                    with conn.transaction():
                        out += self._write_entries(conn, [entry], claims)
                except DB_ERRORS:
                    raise
                except psycopg.Error as err:
                    out.append(f"the cluster database refused the change: {_reason(err)}")
            return out

    def _write_entries(self, conn: Any, entries: list[Entry], claims: dict[str, uuid.UUID]) -> list[str]:
        groups = sorted({rec["group"] for recs, _ in entries for rec in recs if rec.get("type") in GROUP_RECORDS})
        held: dict[str, uuid.UUID] = {}
        if groups:  # FOR SHARE: a broker taking a group over waits for these writes, then reads them
            rows = conn.execute("SELECT group_id, claim FROM consumer_groups WHERE group_id = ANY(%s) "
                                "ORDER BY group_id FOR SHARE", (groups,)).fetchall()
            held = {str(g): c for g, c in rows}
        out: list[str] = []
        upserts: list[tuple[Any, ...]] = []

        def flush_upserts() -> None:
            if upserts:
                with conn.cursor() as cur:
                    cur.executemany(
                        """INSERT INTO consumer_offsets (group_id, topic, partition, committed_offset, leader_epoch,
                                                         metadata, commit_timestamp_ms)
                           VALUES (%s, %s, %s, %s, %s, %s, %s)
                           ON CONFLICT (group_id, topic, partition) DO UPDATE SET
                               committed_offset = EXCLUDED.committed_offset, leader_epoch = EXCLUDED.leader_epoch,
                               metadata = EXCLUDED.metadata, commit_timestamp_ms = EXCLUDED.commit_timestamp_ms,
                               expire_timestamp_ms = NULL""", upserts)
                upserts.clear()

        for recs, _fut in entries:
            if any(rec.get("type") in GROUP_RECORDS and (rec["group"] not in claims or held.get(rec["group"]) != claims[rec["group"]])
                   for rec in recs):
                out.append(_FENCED)
                continue
            for rec in recs:
                kind = rec.get("type")
                if kind == "offset":
                    upserts.append((rec["group"], rec["topic"], int(rec["partition"]), int(rec["offset"]),
                                    int(rec.get("leader_epoch", -1)), rec.get("metadata") or "",
                                    int(rec.get("commit_timestamp", 0))))
                    continue
                flush_upserts()
                self._execute(conn, rec)
            out.append(_OK)
        flush_upserts()
        return out

    @staticmethod
    def _execute(conn: Any, rec: dict[str, Any]) -> None:
        kind = rec.get("type")
        if kind == "offset_delete":
            conn.execute("DELETE FROM consumer_offsets WHERE group_id = %s AND topic = %s AND partition = %s",
                         (rec["group"], rec["topic"], int(rec["partition"])))
        elif kind == "group":
            conn.execute("UPDATE consumer_groups SET protocol_type = %s WHERE group_id = %s",
                         (rec.get("protocol_type") or None, rec["group"]))
        elif kind == "group_delete":
            conn.execute("DELETE FROM consumer_offsets WHERE group_id = %s", (rec["group"],))
            conn.execute("DELETE FROM share_group_state WHERE group_id = %s", (rec["group"],))
            conn.execute("UPDATE consumer_groups SET protocol_type = NULL WHERE group_id = %s", (rec["group"],))
        elif kind == "topic_delete":
            if rec.get("topic_id"):  # once per deleted topic, whichever broker gets here first
                first = conn.execute("""INSERT INTO consumer_offsets_topic_deletions (topic_id, topic) VALUES (%s, %s)
                                        ON CONFLICT (topic_id) DO NOTHING RETURNING topic_id""",
                                     (uuid.UUID(str(rec["topic_id"])), rec["topic"])).fetchone()
                if first is None:
                    return
            conn.execute("DELETE FROM consumer_offsets WHERE topic = %s", (rec["topic"],))
            conn.execute("DELETE FROM share_group_state WHERE topic = %s", (rec["topic"],))
        elif kind == "release":
            conn.execute("""DELETE FROM consumer_groups g WHERE g.group_id = %s AND g.claim = %s
                                AND g.protocol_type IS NULL
                                AND NOT EXISTS (SELECT 1 FROM consumer_offsets o WHERE o.group_id = g.group_id)""",
                         (rec["group"], uuid.UUID(rec["claim"])))
        else:
            log.warning("offsets in the cluster database: skipping unknown record type %r", kind)

    # -- share-partition state (table share_group_state, migration step 5): written by each share
    # partition's leader straight to the database (not under the group's claim: the group's
    # coordinator and the partition's leader are often different brokers); a write carrying an
    # older state epoch than the stored one is refused (the writer was replaced or reset).
    async def share_state_read(self, group_id: str, topic: str, partition: int) -> dict[str, Any] | None:
        rows = await self._share_query(
            "SELECT topic, partition, state_epoch, start_offset, batches, group_id FROM share_group_state "
            "WHERE group_id = %s AND topic = %s AND partition = %s", (group_id, topic, int(partition)))
        return _share_row(rows[0]) if rows else None

    async def share_state_write(self, group_id: str, topic: str, partition: int, state: dict[str, Any]) -> bool:
        from psycopg.types.json import Jsonb

        rows = await self._share_query(
            """INSERT INTO share_group_state (group_id, topic, partition, state_epoch, start_offset, batches, writer_node)
               VALUES (%s, %s, %s, %s, %s, %s, %s)
               ON CONFLICT (group_id, topic, partition) DO UPDATE SET state_epoch = EXCLUDED.state_epoch,
                   start_offset = EXCLUDED.start_offset, batches = EXCLUDED.batches,
                   writer_node = EXCLUDED.writer_node, updated_at = now()
               WHERE share_group_state.state_epoch <= EXCLUDED.state_epoch
               RETURNING state_epoch""",
            (group_id, topic, int(partition), int(state.get("state_epoch", 0)), int(state.get("start_offset", 0)),
             Jsonb({"configs": state["configs"]} if "configs" in state else state.get("batches", [])), self.node_id),
            write=True)
        return bool(rows)

    async def share_states(self, group_id: str | None = None) -> dict[tuple[str, str, int], dict[str, Any]]:
        sql = "SELECT topic, partition, state_epoch, start_offset, batches, group_id FROM share_group_state"
        rows = await self._share_query(sql + (" WHERE group_id = %s" if group_id is not None else ""),
                                       (group_id,) if group_id is not None else ())
        return {(str(r[5]), str(r[0]), int(r[1])): _share_row(r) for r in rows}

    async def share_state_delete(self, group_id: str, topic: str | None = None) -> None:
        if topic is None:
            await self._share_query("DELETE FROM share_group_state WHERE group_id = %s", (group_id,), write=True)
        else:
            await self._share_query("DELETE FROM share_group_state WHERE group_id = %s AND topic = %s",
                                    (group_id, topic), write=True)

    async def _share_query(self, sql: str, args: tuple[Any, ...], *, write: bool = False) -> list[tuple[Any, ...]]:
        def run() -> list[tuple[Any, ...]]:
            with self._conn() as conn:
                cur = conn.execute(sql, args)
                rows = cur.fetchall() if cur.description is not None else []
                if write:
                    conn.commit()
                return rows

        try:
            rows = await asyncio.to_thread(run)
        except DB_ERRORS as err:
            raise self._unavailable(err) from None
        except psycopg.Error as err:
            raise OffsetStoreError(f"the cluster database refused the share state: {_reason(err)}",
                                   ErrorCode.coordinator_not_available) from None
        self._reachable()
        return rows

    # -- state (the loaded groups only)
    def _apply(self, rec: dict[str, Any]) -> None:
        apply_offset_record(self.offsets, self.protocol_types, rec)


def _share_row(row: tuple[Any, ...]) -> dict[str, Any]:
    if isinstance(row[4], dict):  # a share group's configs (kcli/coordinator/share/persister.py)
        return {"state_epoch": int(row[2]), "start_offset": int(row[3]), "batches": [], "configs": row[4].get("configs", {})}
    return {"state_epoch": int(row[2]), "start_offset": int(row[3]),
            "batches": [list(map(int, b)) for b in (row[4] or [])]}
