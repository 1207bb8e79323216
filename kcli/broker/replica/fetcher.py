"""A follower's fetcher (Kafka's ReplicaFetcherThread): one asyncio task and one persistent
connection per source broker, for every partition this broker follows there.

Each round: partitions that met a new leader epoch are truncated to the leader first
(OffsetForLeaderEpoch, Kafka's KIP-101/KIP-279 loop), then one Fetch (v12, ``replica_id`` = this
broker) asks for every partition from its log end; the batches are appended with the leader's
offsets and epochs and the high watermark is taken from the answer. Every wait has a timeout: the
connect, each request (the fetch's ``max_wait`` plus ``REQUEST_TIMEOUT_S``) and the back-off.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.broker.replica.throttle import FOLLOWER, is_throttled
from kcli.protocol import codec
from kcli.protocol.interbroker import INTER_BROKER_CLIENT_ID, InterBrokerError, endpoint_of
from kcli.storage.errors import LogError
from kcli.storage.log import AppendOrigin

log = logging.getLogger("kcli.broker.replica")

CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 10.0
FETCH_API, OFFSET_FOR_LEADER_EPOCH_API = 1, 23
FETCH_VERSION, OFFSET_FOR_LEADER_EPOCH_VERSION = 12, 4
MAX_TRUNCATION_ROUNDS = 16
THROTTLED_PAUSE_S = 0.05  # every partition held back by the follower throttle: wait before trying again


def unsupported_listener(b: Any) -> str | None:
    """Why this broker cannot replicate over its inter-broker listener, or None: the follower's
    fetcher speaks PLAINTEXT only (no TLS, no SASL yet, docs/replication.md)."""
    try:
        name = b.config.get_str("inter.broker.listener.name")
    except Exception:  # noqa: BLE001 - a config without the name: the first listener
        name = ""
    endpoints = list(getattr(b, "endpoints", None) or [])
    ep = next((e for e in endpoints if e.name == name), None) if name else (endpoints[0] if endpoints else None)
    if ep is None or ep.protocol == "PLAINTEXT":
        return None
    return (f"the inter-broker listener {ep.name} is {ep.protocol}, and kcli replicates over PLAINTEXT only: "
            f"add a PLAINTEXT listener and name it in inter.broker.listener.name")


@dataclass
class Following:
    """One partition this broker follows: the leader and epoch it follows in."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    truncate_pending: bool = True  # a new leader epoch: match the leader's log before fetching
    tier_checked: bool = False  # an empty log looked for a remote tier to start from (KIP-1023)
    leader_high_watermark: int = -1  # the leader's, from its last answer (KIP-392: a consumer ahead of us)
    backoff_until: float = 0.0

    @property
    def key(self) -> tuple[str, int]:
        return self.topic, self.partition


class Connection:
    """Kafka's protocol over one asyncio stream, requests one at a time."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self._correlation = 0

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port),
                                                          CONNECT_TIMEOUT_S)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def request(self, api_key: int, version: int, body: dict[str, Any], timeout_s: float) -> Any:
        from kcli.protocol.client import WireClient

        assert self.reader is not None and self.writer is not None
        encoder = WireClient(f"{self.host}:{self.port}", client_id=INTER_BROKER_CLIENT_ID)
        encoder._correlation = self._correlation
        correlation, frame = encoder.encode_request(api_key, version, body)
        self._correlation = correlation
        self.writer.write(frame)

        async def exchange() -> bytes:
            assert self.reader is not None and self.writer is not None
            await self.writer.drain()
            (size,) = struct.unpack(">i", await self.reader.readexactly(4))
            return await self.reader.readexactly(size)

        data = await asyncio.wait_for(exchange(), timeout_s)
        try:
            return codec.decode_response(api_key, version, data, correlation)
        except ValueError as err:
            raise OSError(str(err)) from None


class ReplicaFetcher:
    """Fetches every partition this broker follows from broker ``leader_id``."""

    def __init__(self, manager: Any, leader_id: int) -> None:
        self.m = manager
        self.b = manager.b
        self.leader_id = leader_id
        self.wake = asyncio.Event()
        self.conn: Connection | None = None
        self.stopped = False
        self._failing_since: float | None = None
        self._refused_logged = -1e9
        self.task = asyncio.create_task(self.run(), name=f"replica-fetcher-{leader_id}")

    async def stop(self) -> None:
        self.stopped = True
        self.wake.set()
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    # ---- the loop --------------------------------------------------------------------------
    async def run(self) -> None:
        backoff_s = self.b.config.get_int("replica.fetch.backoff.ms") / 1000
        while not self.stopped and not self.b.stopping:
            parts = self.m.followed_from(self.leader_id)
            if not parts:
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), 1.0)
                except asyncio.TimeoutError:
                    pass
                continue
            refused = unsupported_listener(self.b)
            if refused:  # a clear error, repeated every minute, instead of a silent stall
                now = time.monotonic()
                if now - self._refused_logged >= 60:
                    self._refused_logged = now
                    log.error("[ReplicaFetcher broker=%d leader=%d] cannot replicate %d partition(s) from broker %d: %s",
                              self.b.node_id, self.leader_id, len(parts), self.leader_id, refused)
                self.b.metrics.inc("replica.fetcher.unsupported_listener")
                await asyncio.sleep(backoff_s)
                continue
            try:
                if self.conn is None:
                    host, port = endpoint_of(self.b, self.leader_id)
                    conn = Connection(host, port)
                    await conn.open()
                    self.conn = conn
                pending = [f for f in parts if f.truncate_pending]
                if pending:
                    await self._truncate(pending)
                now = time.monotonic()
                ready = [f for f in parts if not f.truncate_pending and f.backoff_until <= now]
                if not ready:
                    self.wake.clear()
                    try:
                        await asyncio.wait_for(self.wake.wait(), 0.1)
                    except asyncio.TimeoutError:
                        pass
                    continue
                await self._fetch(ready)
                if self._failing_since is not None:
                    log.info("[ReplicaFetcher broker=%d leader=%d] fetching again", self.b.node_id, self.leader_id)
                    self._failing_since = None
            except asyncio.CancelledError:
                raise
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, InterBrokerError) as err:
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
                    log.warning("[ReplicaFetcher broker=%d leader=%d] cannot fetch: %s", self.b.node_id,
                                self.leader_id, err or type(err).__name__)
                if self.conn is not None:
                    self.conn.close()
                    self.conn = None
                await asyncio.sleep(backoff_s)
            except Exception:  # noqa: BLE001 - a bug must not end replication for good
                log.exception("[ReplicaFetcher broker=%d leader=%d] fetch round failed", self.b.node_id, self.leader_id)
                if self.conn is not None:
                    self.conn.close()
                    self.conn = None
                await asyncio.sleep(backoff_s)

    def _current(self, f: Following) -> Any:
        """The log of ``f`` if this broker still follows it from this leader in this epoch."""
        if self.m.following.get(f.key) is not f or f.leader != self.leader_id:
            return None
        return self.b.logs.get(f.key)

    # ---- truncation ------------------------------------------------------------------------
    async def _truncate(self, pending: list[Following]) -> None:
        asking: dict[tuple[str, int], int] = {}
        for f in pending:
            lg = self._current(f)
            if lg is None:
                continue
            if lg.latest_epoch < 0:  # nothing with an epoch here: nothing can diverge
                f.truncate_pending = False
                continue
            asking[f.key] = lg.latest_epoch
        by_key = {f.key: f for f in pending}
        for _round in range(MAX_TRUNCATION_ROUNDS):
            if not asking:
                return
            topics: dict[str, list[dict[str, int]]] = {}
            for (topic, idx), epoch in asking.items():
                topics.setdefault(topic, []).append({"partition": idx, "current_leader_epoch": by_key[(topic, idx)].leader_epoch,
                                                     "leader_epoch": epoch})
            assert self.conn is not None
            resp = await self.conn.request(OFFSET_FOR_LEADER_EPOCH_API, OFFSET_FOR_LEADER_EPOCH_VERSION, {
                "replica_id": self.b.node_id,
                "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()]}, REQUEST_TIMEOUT_S)
            nxt: dict[tuple[str, int], int] = {}
            for rt in resp.topics:
                for rp in rt.partitions:
                    key = (rt.topic, int(rp.partition))
                    f = by_key.get(key)
                    lg = self._current(f) if f is not None else None
                    if f is None or lg is None:
                        continue
                    code = int(rp.error_code)
                    if code:
                        f.backoff_until = time.monotonic() + 0.5
                        continue
                    leader_epoch, end = int(rp.leader_epoch), int(rp.end_offset)
                    if end < 0:  # the leader knows nothing of it: Kafka truncates to the high watermark
                        self._cut(f, lg, lg.high_watermark, "the leader has no end offset for epoch %d" % asking[key])
                        f.truncate_pending = False
                        continue
                    mine_epoch, mine_end = lg.end_offset_for_epoch(leader_epoch)
                    if mine_epoch == leader_epoch or mine_epoch < 0:
                        target = min(end, mine_end) if mine_epoch >= 0 else min(end, lg.log_end_offset)
                        self._cut(f, lg, target, f"leader epoch {leader_epoch} ends at {end} on the leader")
                        f.truncate_pending = False
                    else:  # the follower does not have that epoch: cut to its own older epoch, ask again
                        self._cut(f, lg, mine_end, f"epoch {leader_epoch} unknown here")
                        if lg.latest_epoch < 0:
                            f.truncate_pending = False
                        else:
                            nxt[key] = lg.latest_epoch
            asking = nxt

    def _cut(self, f: Following, lg: Any, offset: int, why: str) -> None:
        if offset < lg.log_end_offset:
            log.info("[ReplicaFetcher broker=%d leader=%d] truncating %s-%d from %d to %d: %s", self.b.node_id,
                     self.leader_id, f.topic, f.partition, lg.log_end_offset, offset, why)
            lg.truncate_to(offset)

    # ---- fetch -----------------------------------------------------------------------------
    async def _fetch(self, ready: list[Following]) -> None:
        cfg = self.b.config
        wait_ms = cfg.get_int("replica.fetch.wait.max.ms")
        max_bytes = cfg.get_int("replica.fetch.max.bytes")
        topics: dict[str, list[dict[str, Any]]] = {}
        sent: dict[tuple[str, int], Following] = {}
        throttled: set[tuple[str, int]] = set()
        held_back = 0
        for f in ready:
            lg = self._current(f)
            if lg is None:
                continue
            if self._throttled(f):
                if self.m.follower_quota.exceeded():
                    held_back += 1  # follower.replication.throttled.rate reached: not in this fetch
                    continue
                throttled.add(f.key)
            if lg.log_end_offset == lg.log_start_offset and not f.tier_checked:
                f.tier_checked = True  # an empty replica (new, or its disk replaced): KIP-1023
                if self._start_from_tier(f, lg, None):
                    lg = self._current(f)
                    if lg is None:
                        continue
            sent[f.key] = f
            topics.setdefault(f.topic, []).append({
                "partition": f.partition, "current_leader_epoch": f.leader_epoch, "fetch_offset": lg.log_end_offset,
                "last_fetched_epoch": lg.latest_epoch, "log_start_offset": lg.log_start_offset,
                "partition_max_bytes": max_bytes})
        if not sent:
            if held_back:
                await asyncio.sleep(THROTTLED_PAUSE_S)
            return
        assert self.conn is not None
        resp = await self.conn.request(FETCH_API, FETCH_VERSION, {
            "replica_id": self.b.node_id, "max_wait": wait_ms, "min_bytes": 1, "max_bytes": 10 * max_bytes + (1 << 20),
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
            "forgotten_topics_data": [], "rack_id": ""}, wait_ms / 1000 + REQUEST_TIMEOUT_S)
        if int(resp.error_code):
            raise OSError(f"Fetch answered error {int(resp.error_code)}")
        for rt in resp.responses:
            for pd in rt.partitions:
                f = sent.get((rt.topic, int(pd.partition_index)))
                if f is not None:
                    if f.key in throttled and pd.records:
                        self.m.follower_quota.record(len(pd.records))
                    self._handle(f, pd)

    def _throttled(self, f: Following) -> bool:
        """This replica is outside the ISR and named by follower.replication.throttled.replicas."""
        t = self.b.topic(f.topic)
        p = t.partitions.get(f.partition) if t is not None else None
        return p is not None and self.b.node_id not in p.isr and is_throttled(self.b, t, f.partition, FOLLOWER)

    def _handle(self, f: Following, pd: Any) -> None:
        lg = self._current(f)
        if lg is None:
            return
        code = int(pd.error_code)
        if code == ErrorCode.none:
            records = pd.records
            if records:
                try:
                    lg.append(bytes(records), now_ms=int(time.time() * 1000), origin=AppendOrigin.REPLICATION)
                except LogError as err:
                    log.warning("[ReplicaFetcher broker=%d leader=%d] %s-%d: cannot append what the leader sent: %s; "
                                "matching the leader's log again", self.b.node_id, self.leader_id, f.topic, f.partition,
                                err.message)
                    f.truncate_pending = True
                    return
            leader_start = int(pd.log_start_offset)
            if lg.log_start_offset < leader_start <= lg.log_end_offset:
                lg.set_log_start_offset(leader_start)  # DeleteRecords or retention on the leader
            f.leader_high_watermark = int(pd.high_watermark)
            hw = min(int(pd.high_watermark), lg.log_end_offset)
            if hw > lg.high_watermark:
                lg.set_high_watermark(hw)
                self.b.notifier.notify(f.topic, f.partition)  # consumers reading this follower (KIP-392)
            self.m.follower_progress(f, lg)
        elif code == ErrorCode.offset_moved_to_tiered_storage:
            if not self._start_from_tier(f, lg, int(pd.log_start_offset)):
                f.backoff_until = time.monotonic() + 0.5  # the remote log metadata is not here yet
        elif code == ErrorCode.offset_out_of_range:
            leader_start = int(pd.log_start_offset)
            if lg.log_end_offset < leader_start:
                log.info("[ReplicaFetcher broker=%d leader=%d] %s-%d: the leader's log starts at %d, past this log's "
                         "end %d: starting over there", self.b.node_id, self.leader_id, f.topic, f.partition,
                         leader_start, lg.log_end_offset)
                lg.truncate_fully_and_start_at(leader_start)
            else:
                f.truncate_pending = True  # ahead of the leader: match its log
        else:
            # not the leader (yet), an epoch the leader does not know (yet), a moved partition:
            # the metadata will tell this broker what to do; try again shortly
            f.backoff_until = time.monotonic() + 0.2

    # ---- tiered partitions (KIP-405 follower side, KIP-1023) -------------------------------
    def _start_from_tier(self, f: Following, lg: Any, leader_log_start: int | None) -> bool:
        """Kafka's buildRemoteLogAuxState: a replica whose fetch offset is only in the remote tier
        (the leader answered OFFSET_MOVED_TO_TIERED_STORAGE), or an empty one (KIP-1023: a new
        replica does not copy what the tier holds), starts after the last tiered offset: the
        log truncated fully and started at its end + 1, its log start the leader's, and the
        leader epoch of that remote segment (from its segment leader epochs, the segment's
        leader-epoch checkpoint) as its latest. kcli keeps no producer snapshot remotely: the
        producer state is rebuilt from the records fetched from there on (docs/replication.md).
        False when the shared remote log metadata has nothing past this log's end."""
        rlm = getattr(self.b, "tiered", None)
        t = self.b.topic(f.topic)
        if rlm is None or t is None or not (self.b.is_tiered(t) or rlm.has_remote(t, f.partition)):
            return False
        rlm.metadata.refresh()  # what the leader copied (the shared RLMM)
        segs = rlm.metadata.segments(t.topic_id, f.partition)
        if not segs:
            return False
        last = max(segs, key=lambda s: s.end_offset)
        if last.end_offset < lg.log_end_offset:
            return False
        start = min(s.start_offset for s in segs)
        log_start = max(start, leader_log_start) if leader_log_start is not None and leader_log_start >= 0 else start
        next_offset = last.end_offset + 1
        log.info("[ReplicaFetcher broker=%d leader=%d] %s-%d: offsets below %d are in the remote tier; building the "
                 "replica's state from remote segment %d-%d (leader epochs %s) and fetching from %d (log start %d)",
                 self.b.node_id, self.leader_id, f.topic, f.partition, next_offset, last.start_offset,
                 last.end_offset, dict(sorted(last.segment_leader_epochs.items())), next_offset, log_start)
        lg.truncate_fully_and_start_at(next_offset)
        if log_start < next_offset:
            lg.set_log_start_offset(log_start)
        if last.segment_leader_epochs:
            lg.assign_epoch(max(last.segment_leader_epochs))
        self.b.metrics.inc("replica.fetcher.built_from_remote_tier")
        return True

