"""Cluster state in PostgreSQL: one ordered table of metadata records, broker leases, controller.

- ``metadata_records``: every record in one total order. An append takes a transaction-level
  advisory lock, catches up on records it has not applied, checks its own records against
  that state (:mod:`kcli.cluster.conflicts`), inserts them and sends ``NOTIFY kcli_metadata``,
  then commits. The lock makes commit order equal ``offset`` order, so a reader that saw offset
  N never later meets a record below N. Other brokers wake on the NOTIFY, or at the latest at
  the next poll (every ``poll_interval_ms``) when a notification was missed.
- ``brokers``: registrations with a lease renewed every ``broker.heartbeat.interval.ms``; a lease
  older than ``broker.session.timeout.ms`` no longer counts, and a node id with a live lease of
  another process (incarnation) cannot be registered (Kafka's DuplicateBrokerRegistration).
- Liveness: each broker also holds a session-level advisory lock on its node id (``NODE_LOCK_CLASS``,
  node id) on a dedicated connection. A process that dies (kill -9, OOM) has its sockets closed by
  the kernel, PostgreSQL ends the session and the lock goes at once, so the others drop the broker
  at their next refresh (~1 s) instead of waiting out its lease; a live broker is one with a live
  lease *and* its node lock held. The lease stays the authority for a broker that hangs or is cut
  off while its session lingers. The lock also lets a restarted broker take its node id back at
  once: whoever holds it is the only live process with that id.
- Controller: whoever holds the session-level controller advisory lock on that same dedicated
  connection; when the connection ends (process dead, connection killed) PostgreSQL releases it
  and another broker takes it at its next tick.

Every wait is bounded: connect_timeout, statement_timeout on every session, the pool's timeout.
When the database is down, appends fail with a retriable error and reads go on from the state
already applied; connections come back by themselves.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psycopg
from kio.schema.errors import ErrorCode
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from kcli.metadata.metadata_log import (
    ClusterState,
    InvalidRecordError,
    apply_record,
    check_record,
)
from kcli.cluster.conflicts import check_conflicts
from kcli.cluster.migrations import migrate
from kcli.cluster.pg_offsets import PostgresOffsetStore
from kcli.cluster.pg_remote_log import PgRemoteLogMetadataStore
from kcli.cluster.pg_transactions import PgTransactionStore
from kcli.cluster.pgconn import check_connection, redact
from kcli.cluster.state import (
    BrokerRegistration,
    ClusterStoreError,
    NodeIdInUseError,
    OffsetChange,
    OffsetsListener,
    RecordsListener,
    StoreSettings,
    endpoints_of,
)
from kcli.protocol.errors import BrokerError

log = logging.getLogger("kcli.cluster")
# The pool logs every failed reconnect attempt; kcli reports an outage once (and its end) itself.
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)

METADATA_LOCK_ID = 0x6B636C6902  # pg_advisory_xact_lock key serialising metadata appends
CONTROLLER_LOCK_ID = 0x6B636C6903  # session-level pg advisory lock held by the controller
NODE_LOCK_CLASS = 0x6B636C69  # pg_advisory_lock(NODE_LOCK_CLASS, node_id): held by the live broker of node_id
# A live registration: lease not expired and the node's session lock held (pg_locks: a two-int4
# advisory key shows as classid, objid with objsubid 2).
_LIVE_BROKERS = f"""SELECT node_id, rack, listeners, incarnation FROM brokers b
    WHERE b.lease_expires_at > now() AND EXISTS (
        SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.classid = {NODE_LOCK_CLASS}
           AND l.objid = b.node_id AND l.objsubid = 2
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
    ORDER BY node_id"""
CHANNEL = "kcli_metadata"
# Diskless offsets a broker committed, for the others: "<node id>|<topic id hex>:<p>:<hwm>:<lso>;..."
OFFSETS_CHANNEL = "kcli_offsets"
NOTIFY_PAYLOAD_MAX = 7900  # PostgreSQL's limit is 8000 bytes
FETCH_BATCH = 5000
REFRESH_S = 1.0  # live brokers and controller election are refreshed this often
DB_ERRORS = (psycopg.Error, PoolTimeout, OSError)


def reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


class PostgresClusterStore:
    """The :class:`kcli.cluster.state.ClusterStateStore` of a cluster whose state is in PostgreSQL."""

    single_broker = False

    def __init__(self, url: str, node_id: int, settings: StoreSettings | None = None) -> None:
        self.url = url
        self.node_id = node_id
        self.settings = settings or StoreSettings()
        self.state = ClusterState()
        self.applied = 0  # offset of the last record applied to self.state
        self.incarnation = uuid.uuid4()
        self._pool: ConnectionPool | None = None
        self._listener: RecordsListener | None = None
        self._me: BrokerRegistration | None = None
        self._live: list[BrokerRegistration] = []
        self._ctl_conn: psycopg.Connection[Any] | None = None  # the dedicated session: node lock, controller lock
        self._node_locked = False
        self._node_lock_warned = False
        self._is_controller = False
        self._controller_id = -1
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._db_ok = True
        self._closed = False
        self._offsets_listener: OffsetsListener | None = None
        self._offsets_gap: Callable[[], None] | None = None
        self._outbox: dict[tuple[uuid.UUID, int], tuple[int, int]] = {}
        self._outbox_ready: asyncio.Event | None = None

    # ---- connections -----------------------------------------------------------------------
    def _kwargs(self, role: str) -> dict[str, Any]:
        s = self.settings
        return {
            "connect_timeout": s.connect_timeout_s,
            "options": f"-c statement_timeout={s.statement_timeout_ms}",
            "application_name": f"kcli-broker-{self.node_id}-{role}",
            "keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
            "autocommit": True,
        }

    def _connect(self, role: str) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, **self._kwargs(role))

    def _conn(self) -> Any:
        if self._pool is None:
            raise ClusterStoreError("the cluster state store is not open")
        return self._pool.connection(timeout=self.settings.connect_timeout_s)

    def _unavailable(self, err: BaseException) -> BrokerError:
        if self._db_ok:
            log.error("cluster database %s is unavailable: %s", redact(self.url), reason(err))
        self._db_ok = False
        return BrokerError(ErrorCode.request_timed_out, f"the cluster database is unavailable: {reason(err)}")

    # ---- metadata --------------------------------------------------------------------------
    def open(self) -> ClusterState:
        try:
            with self._connect("migrate") as conn:
                migrate(conn)
            self._pool = ConnectionPool(self.url, kwargs=self._kwargs("pool"), min_size=1, max_size=4,
                                        timeout=self.settings.connect_timeout_s, open=False,
                                        check=check_connection, name="kcli-cluster",
                                        reconnect_timeout=max(60.0, self.settings.connect_timeout_s * 4))
            self._pool.open(wait=True, timeout=self.settings.connect_timeout_s)
            while True:
                with self._conn() as conn:
                    rows = self._fetch(conn, self.applied)
                if not rows:
                    break
                self._apply_rows(rows, notify=False)
        except DB_ERRORS as err:
            self.close()
            raise ClusterStoreError(f"cannot use the cluster database {redact(self.url)}: {reason(err)}") from None
        except RuntimeError as err:  # a schema newer than this kcli
            self.close()
            raise ClusterStoreError(str(err)) from None
        return self.state

    def set_listener(self, listener: RecordsListener | None) -> None:
        self._listener = listener

    @staticmethod
    def _fetch(conn: Any, after: int) -> list[tuple[int, Any]]:
        cur = conn.execute('SELECT "offset", record FROM metadata_records WHERE "offset" > %s ORDER BY "offset" LIMIT %s',
                           (after, FETCH_BATCH))
        return [(int(o), r) for o, r in cur.fetchall()]

    def _apply_rows(self, rows: list[tuple[int, Any]], *, notify: bool = True) -> list[dict[str, Any]]:
        """Apply rows after :attr:`applied`, in order; a whole but unusable record is skipped
        with one log line, as the local log's replay does."""
        done: list[dict[str, Any]] = []
        for offset, rec in rows:
            if offset <= self.applied:
                continue  # already applied (an append's catch-up raced with a poll)
            try:
                check_record(rec)
                apply_record(self.state, rec)
                done.append(rec)
            except (InvalidRecordError, KeyError, TypeError, ValueError) as err:
                kind = rec.get("type") if isinstance(rec, dict) else None
                log.error("ignoring metadata record %s at offset %d: %s", kind, offset, getattr(err, "message", None) or err)
            self.applied = offset
        if notify and done and self._listener is not None:
            try:
                self._listener(done)
            except Exception:  # one broker's local trouble must not stop it following the log
                log.exception("acting on %d metadata record(s) from the cluster failed", len(done))
        return done

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        records = list(records)
        if not records:
            return
        for rec in records:  # refused before anything is written
            check_record(rec)
        if not self._db_ok and self._wake is not None:
            # Known down: fail at once instead of holding the event loop for the pool timeout;
            # the background task clears this as soon as it reaches the database again.
            raise BrokerError(ErrorCode.request_timed_out, "the cluster database is unavailable")
        learned: list[tuple[int, Any]] = []
        try:
            with self._conn() as conn:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (METADATA_LOCK_ID,))
                    while True:
                        rows = self._fetch(conn, learned[-1][0] if learned else self.applied)
                        if not rows:
                            break
                        learned += rows
                    base = self.applied
                    if learned:  # check against the state the new records will follow
                        self._apply_rows(learned, notify=False)
                    check_conflicts(self.state, records)
                    last = base
                    for rec in records:
                        row = conn.execute('INSERT INTO metadata_records (record, node_id) VALUES (%s, %s) RETURNING "offset"',
                                           (Jsonb(rec), self.node_id)).fetchone()
                        last = int(row[0])
                    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, str(last)))
        except DB_ERRORS as err:
            self._notify_learned(learned)
            raise self._unavailable(err) from None
        except BaseException:
            self._notify_learned(learned)
            raise
        self._db_ok = True
        self._notify_learned(learned)
        for rec in records:
            apply_record(self.state, rec)
        self.applied = max(self.applied, last)
        if self._listener is not None:
            self._listener(records)

    def _notify_learned(self, rows: list[tuple[int, Any]]) -> None:
        if rows and self._listener is not None:
            recs = [r for _, r in rows]
            try:
                self._listener(recs)
            except Exception:
                log.exception("acting on %d metadata record(s) from the cluster failed", len(recs))

    def _fetch_new(self, after: int) -> list[tuple[int, Any]]:
        with self._conn() as conn:
            return self._fetch(conn, after)

    def poll(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            with self._conn() as conn:
                rows = self._fetch(conn, self.applied)
            if not rows:
                return out
            out += self._apply_rows(rows)

    # ---- registrations ---------------------------------------------------------------------
    # ---- diskless offsets between brokers ----------------------------------------------------
    def publish_offsets(self, changes: list[OffsetChange]) -> None:
        for tid, partition, hwm, lso in changes:
            old = self._outbox.get((tid, partition))
            self._outbox[(tid, partition)] = (hwm, lso) if old is None else (max(old[0], hwm), max(old[1], lso))
        if self._loop is not None and self._outbox_ready is not None:
            self._loop.call_soon_threadsafe(self._outbox_ready.set)

    def set_offsets_listener(self, listener: OffsetsListener | None,
                             on_gap: Callable[[], None] | None = None) -> None:
        self._offsets_listener = listener
        self._offsets_gap = on_gap

    def _offset_payloads(self, outbox: dict[tuple[uuid.UUID, int], tuple[int, int]]) -> list[str]:
        head = f"{self.node_id}|"
        payloads, items = [], []
        size = len(head)
        for (tid, p), (hwm, lso) in outbox.items():
            item = f"{tid.hex}:{p}:{hwm}:{lso}"
            if items and size + len(item) + 1 > NOTIFY_PAYLOAD_MAX:
                payloads.append(head + ";".join(items))
                items, size = [], len(head)
            items.append(item)
            size += len(item) + 1
        if items:
            payloads.append(head + ";".join(items))
        return payloads

    def _send_payloads(self, payloads: list[str]) -> None:
        with self._conn() as conn:
            for payload in payloads:
                conn.execute("SELECT pg_notify(%s, %s)", (OFFSETS_CHANNEL, payload))

    async def _send_offsets(self, stopping: Callable[[], bool]) -> None:
        """Coalesce published offsets and NOTIFY them, one statement per 7.9 KB of changes."""
        assert self._outbox_ready is not None and self._loop is not None
        while not stopping() and not self._closed:
            try:
                await asyncio.wait_for(self._outbox_ready.wait(), 0.25)
            except asyncio.TimeoutError:
                continue
            self._outbox_ready.clear()
            outbox, self._outbox = self._outbox, {}
            try:
                await self._loop.run_in_executor(None, self._send_payloads, self._offset_payloads(outbox))
            except DB_ERRORS as err:
                # Kept (merged with newer changes, one entry per partition: bounded) and sent again
                # once the database answers: the other brokers' fetches at the log end wait on it.
                log.debug("cannot publish diskless offsets, retrying in 1 s: %s", reason(err))
                for key, (hwm, lso) in outbox.items():
                    new = self._outbox.get(key)
                    self._outbox[key] = (hwm, lso) if new is None else (max(new[0], hwm), max(new[1], lso))
                await asyncio.sleep(1.0)
                self._outbox_ready.set()

    def _offsets_received(self, payload: str) -> None:
        sender, _, body = payload.partition("|")
        if self._offsets_listener is None or sender == str(self.node_id) or not body:
            return
        changes: list[OffsetChange] = []
        try:
            for item in body.split(";"):
                tid, p, hwm, lso = item.split(":")
                changes.append((uuid.UUID(hex=tid), int(p), int(hwm), int(lso)))
        except ValueError:
            log.debug("ignoring a malformed %s message: %.80s", OFFSETS_CHANNEL, payload)
            return
        self._offsets_listener(changes)

    def register_broker(self, node_id: int, rack: str | None, host: str, port: int,
                        listeners: list[dict[str, Any]] | None = None) -> None:
        listeners = listeners or [{"name": "PLAINTEXT", "host": host, "port": port}]
        try:
            self.node_id = node_id
            # Holding the node lock proves every other registration of node_id is a dead process's:
            # take the row over at once. Without it, only an expired lease may be taken over.
            owner = self._hold_node_lock(warn=False)
            with self._conn() as conn:
                row = conn.execute(
                    """INSERT INTO brokers (node_id, rack, listeners, incarnation, lease_expires_at)
                       VALUES (%s, %s, %s, %s, now() + %s * interval '1 millisecond')
                       ON CONFLICT (node_id) DO UPDATE SET rack = EXCLUDED.rack, listeners = EXCLUDED.listeners,
                           incarnation = EXCLUDED.incarnation, registered_at = now(),
                           lease_expires_at = EXCLUDED.lease_expires_at
                       WHERE %s OR brokers.lease_expires_at < now() OR brokers.incarnation = EXCLUDED.incarnation
                       RETURNING node_id""",
                    (node_id, rack, Jsonb(listeners), self.incarnation, self.settings.session_timeout_ms, owner)).fetchone()
                if row is None:
                    left = conn.execute("SELECT extract(epoch FROM lease_expires_at - now()) FROM brokers WHERE node_id = %s",
                                        (node_id,)).fetchone()
                    secs = max(0.0, float(left[0])) if left and left[0] is not None else 0.0
                    raise NodeIdInUseError(
                        f"node id {node_id} is registered by another live broker (its lease runs {secs:.1f} s more); "
                        "use another --node-id or stop that broker")
        except DB_ERRORS as err:
            raise ClusterStoreError(f"cannot register with the cluster database {redact(self.url)}: {reason(err)}") from None
        self._me = BrokerRegistration(node_id, host, port, rack, str(self.incarnation), endpoints_of(listeners))
        self.refresh_brokers()

    def renew_lease(self) -> None:
        if self._me is None:
            return
        with self._conn() as conn:
            cur = conn.execute("""UPDATE brokers SET lease_expires_at = now() + %s * interval '1 millisecond'
                                  WHERE node_id = %s AND incarnation = %s""",
                               (self.settings.session_timeout_ms, self._me.node_id, self.incarnation))
            renewed = cur.rowcount == 1
        if not renewed:  # our lease ran out (database unreachable too long) and the row was replaced or removed
            log.error("the registration of node %d was lost; registering again", self._me.node_id)
            try:
                self.register_broker(self._me.node_id, self._me.rack, self._me.host, self._me.port,
                                     [{"name": n, "host": h, "port": p} for n, h, p in self._me.listeners] or None)
            except ClusterStoreError as err:
                log.error("%s", err)

    def refresh_brokers(self) -> None:
        with self._conn() as conn:
            rows = conn.execute(_LIVE_BROKERS).fetchall()
        live = []
        for node_id, rack, listeners, inc in rows:
            entries = listeners if isinstance(listeners, list) else json.loads(listeners)
            first = (entries or [{}])[0]
            live.append(BrokerRegistration(int(node_id), str(first.get("host", "")), int(first.get("port", 0)),
                                           rack, str(inc), endpoints_of(entries)))
        self._live = live

    def live_brokers(self) -> list[BrokerRegistration]:
        live = list(self._live)
        if self._me is not None and all(b.node_id != self._me.node_id for b in live):
            live.append(self._me)  # this broker serves the request, so it is alive
            live.sort(key=lambda b: b.node_id)
        return live

    def partition_host(self, leader: int) -> int:
        return leader

    def offset_store(self, data_dir: Path) -> PostgresOffsetStore:
        """Committed offsets in this database, over connections of their own (commits never
        queue behind metadata work); ``data_dir`` holds none of them."""
        return PostgresOffsetStore(self.url, self.node_id, label=redact(self.url), connect_kwargs=self._kwargs("offsets"),
                                   timeout_s=self.settings.connect_timeout_s)

    def transaction_store(self, data_dir: Path) -> PgTransactionStore:
        """Transaction coordinator state in this database, over connections of its own, so that
        a transaction survives its coordinator's death; ``data_dir`` holds none of it."""
        return PgTransactionStore(self.url, self.node_id, label=redact(self.url),
                                  connect_kwargs=self._kwargs("transactions"), timeout_s=self.settings.connect_timeout_s)

    def remote_log_metadata(self, data_dir: Path) -> PgRemoteLogMetadataStore:
        """Remote segment metadata in this database, over this store's pool; ``data_dir`` holds none."""
        return PgRemoteLogMetadataStore(self._conn)

    # ---- the dedicated session: liveness and controller -------------------------------------
    def _session(self) -> psycopg.Connection[Any]:
        """The dedicated connection (reconnected when it broke: the locks it held are gone then)."""
        if self._ctl_conn is not None:
            try:
                self._ctl_conn.execute("SELECT 1")
            except DB_ERRORS:
                if self._is_controller:
                    log.warning("node %d lost its controller connection; no longer controller", self.node_id)
                self._drop_ctl_conn()
        if self._ctl_conn is None:
            self._ctl_conn = self._connect("controller")
        return self._ctl_conn

    def _hold_node_lock(self, *, warn: bool = True) -> bool:
        """Take this node's session lock if not held yet; False while another session holds it
        (a hung or cut-off process of the same node id whose session PostgreSQL has not ended).
        Registration asks with ``warn=False``: there a held lock is answered by the lease check."""
        conn = self._session()
        if not self._node_locked:
            got = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (NODE_LOCK_CLASS, self.node_id)).fetchone()
            self._node_locked = bool(got and got[0])
            if not self._node_locked and warn and not self._node_lock_warned:
                log.warning("the session lock of node %d is held by another session; other brokers see this "
                            "broker as live only while that session lasts", self.node_id)
            if warn:
                self._node_lock_warned = not self._node_locked
        return self._node_locked

    def elect(self) -> bool:
        """One election step: check the dedicated session, keep the node lock, else try to take
        the controller lock."""
        try:
            self._hold_node_lock()
            if not self._is_controller:
                got = self._session().execute("SELECT pg_try_advisory_lock(%s)", (CONTROLLER_LOCK_ID,)).fetchone()
                self._is_controller = bool(got and got[0])
                if self._is_controller:
                    log.info("node %d is now the controller", self.node_id)
        except DB_ERRORS:
            self._drop_ctl_conn()
        self._controller_id = self.node_id if self._is_controller else self._find_controller()
        return self._is_controller

    def _drop_ctl_conn(self) -> None:
        self._is_controller = self._node_locked = False
        if self._ctl_conn is not None:
            try:
                self._ctl_conn.close()
            except Exception:  # pragma: no cover
                pass
        self._ctl_conn = None

    def _find_controller(self) -> int:
        hi, lo = CONTROLLER_LOCK_ID >> 32, CONTROLLER_LOCK_ID & 0xFFFFFFFF
        try:
            with self._conn() as conn:
                row = conn.execute("""SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                                      WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s AND l.objid = %s
                                        AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())""",
                                   (hi, lo)).fetchone()
        except DB_ERRORS:
            return -1
        if row is None or not row[0]:
            return -1
        try:  # kcli-broker-<node>-controller
            return int(str(row[0]).split("-")[2])
        except (IndexError, ValueError):
            return -1

    def is_controller(self) -> bool:
        return self._is_controller

    def controller_id(self) -> int:
        return self._controller_id

    # ---- background ------------------------------------------------------------------------
    def tick(self, *, heartbeat: bool) -> None:
        """Blocking background step (runs in a worker thread): lease, registrations, election."""
        if heartbeat:
            self.renew_lease()
        self.refresh_brokers()
        self.elect()

    async def run(self, stopping: Callable[[], bool]) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._wake = asyncio.Event()
        self._outbox_ready = asyncio.Event()
        if self._outbox:
            self._outbox_ready.set()
        listen = asyncio.create_task(self._listen(stopping), name="cluster-listen") if self.settings.listen else None
        sender = asyncio.create_task(self._send_offsets(stopping), name="cluster-offsets")
        poll_s = self.settings.poll_interval_ms / 1000
        beat_s = self.settings.heartbeat_interval_ms / 1000
        next_poll = next_tick = last_beat = 0.0
        try:
            while not stopping() and not self._closed:
                try:  # short slices: a stop request is seen within a quarter second
                    await asyncio.wait_for(self._wake.wait(), 0.25)
                except asyncio.TimeoutError:
                    pass
                now = time.monotonic()
                catch_up = self._wake.is_set() or now >= next_poll
                if not catch_up and now < next_tick:
                    continue
                try:
                    if catch_up:  # a NOTIFY arrived, or the polling fallback is due
                        self._wake.clear()
                        next_poll = now + poll_s
                        await self._catch_up(loop)
                    if now >= next_tick:  # lease, live brokers, election: every REFRESH_S at most
                        next_tick = now + min(REFRESH_S, beat_s)
                        beat = now - last_beat >= beat_s
                        await loop.run_in_executor(None, functools.partial(self.tick, heartbeat=beat))
                        if beat:
                            last_beat = now
                    if not self._db_ok:
                        log.warning("cluster database %s is reachable again", redact(self.url))
                    self._db_ok = True
                except DB_ERRORS as err:
                    self._unavailable(err)
                except ClusterStoreError:
                    return  # closed under us
        finally:
            tasks = [t for t in (listen, sender) if t is not None]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _catch_up(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            rows = await loop.run_in_executor(None, self._fetch_new, self.applied)
            if not rows:
                return
            self._apply_rows(rows)  # on the event loop, like local appends

    async def _listen(self, stopping: Callable[[], bool]) -> None:
        """Wake the catch-up on every metadata NOTIFY and pass on diskless offsets; reconnects by
        itself (polling covers the gaps)."""
        assert self._wake is not None
        lost = False
        while not stopping() and not self._closed:
            try:
                aconn = await psycopg.AsyncConnection.connect(self.url, **self._kwargs("listen"))
                async with aconn:
                    await aconn.execute(f"LISTEN {CHANNEL}")
                    await aconn.execute(f"LISTEN {OFFSETS_CHANNEL}")
                    self._wake.set()  # records appended while we were not listening
                    if lost and self._offsets_gap is not None:
                        self._offsets_gap()  # offsets published while we were not listening
                    lost = False
                    while not stopping() and not self._closed:
                        async for n in aconn.notifies(timeout=5.0):
                            if n.channel == OFFSETS_CHANNEL:
                                self._offsets_received(n.payload)
                            else:
                                self._wake.set()
            except DB_ERRORS as err:
                log.debug("LISTEN connection failed: %s", reason(err))
                lost = True
                await asyncio.sleep(1.0)

    def close(self) -> None:
        """Leave the cluster: drop the registration (Kafka's controlled shutdown) and the lock."""
        self._closed = True
        if self._pool is not None and self._me is not None and self._db_ok:  # down: the lease just runs out
            try:
                with self._conn() as conn:
                    conn.execute("DELETE FROM brokers WHERE node_id = %s AND incarnation = %s",
                                 (self._me.node_id, self.incarnation))
            except DB_ERRORS as err:
                log.warning("cannot remove the registration of node %d: %s", self._me.node_id, reason(err))
        self._drop_ctl_conn()
        if self._pool is not None:
            try:
                self._pool.close(timeout=self.settings.connect_timeout_s)
            except Exception:  # pragma: no cover
                pass
            self._pool = None
