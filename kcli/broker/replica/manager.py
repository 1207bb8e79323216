"""The replica manager (Kafka's ReplicaManager, reduced): which replicated partitions this broker
leads or follows, the fetchers, the ISR upkeep of the partitions it leads, and — on the
controller — leader elections when brokers leave.

It learns every change from the metadata (:meth:`ReplicaManager.metadata_changed`, called by the
broker after each applied batch of records) and starts its tasks only once a replicated
partition exists on this broker: a cluster of replication-factor-1 topics runs nothing here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.broker.replica.controller import describe, election_records, is_replicated
from kcli.broker.replica.fetcher import Following, ReplicaFetcher
from kcli.broker.replica import read_replica
from kcli.broker.replica.partition import LeaderPartition
from kcli.broker.replica.throttle import FOLLOWER, LEADER, ReplicationQuota, is_throttled
from kcli.broker.replica.controller import fence_incarnation
from kcli.broker.replica.reassignment import controller_lost, controller_round
from kcli.metadata.metadata_log import record
from kcli.protocol.errors import BrokerError

log = logging.getLogger("kcli.broker.replica")

TICK_S = 0.25  # controller elections, high-watermark upkeep
ELECTION_RETRY_S = 0.25


class ReplicaManager:
    def __init__(self, broker: Any) -> None:
        self.b = broker
        self.node_id = broker.node_id
        self.leaders: dict[tuple[str, int], LeaderPartition] = {}
        self.following: dict[tuple[str, int], Following] = {}
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self._task: asyncio.Task[Any] | None = None
        self._changes: set[asyncio.Task[Any]] = set()
        self._last_shrink_check = 0.0
        self.closed = False
        # Broker epochs: this process is a new incarnation of its node. The partitions whose ISR
        # held the node at start (its previous incarnation's memberships) are fenced first
        # (_fence_previous_incarnation); until the fence is committed and seen, none is led here.
        # Value: None (to fence), or the partition epoch the fence was made from. The controller
        # fences peers it sees restarted (_fenced_peers).
        self._to_fence: dict[tuple[str, int], int | None] | None = None
        self._incarnations: dict[int, str] = {}  # controller: the accepted incarnation of each node
        self._fenced_parts: dict[tuple[int, str], set[tuple[str, int]]] = {}  # controller: done per new incarnation
        self._hw_checkpoint_s = broker.config.get_int("replica.high.watermark.checkpoint.interval.ms") / 1000
        self._last_hw_checkpoint = time.monotonic()
        self._live_at = 0.0
        self._live: set[int] = set()  # is_live's cache
        # KIP-73 replication throttles (throttle.py): what this broker sends to / fetches for
        # the throttled replicas outside the ISR
        self.leader_quota = ReplicationQuota(broker, LEADER)
        self.follower_quota = ReplicationQuota(broker, FOLLOWER)
        m = broker.metrics
        m.register_gauge("replica.under_replicated_partitions", self.under_replicated_count)
        m.register_gauge("replica.under_min_isr_partitions", self.under_min_isr_count)
        m.register_gauge("replica.offline_partitions", self.offline_count)
        m.register_gauge("replica.leader_count", lambda: len(self.leaders))
        m.register_gauge("replica.max_lag", self.max_lag)

    # ---- what this broker holds ----------------------------------------------------------
    def replicated_here(self) -> list[tuple[Any, Any]]:
        out = []
        for t in list(self.b.state.topics.values()):
            if self.b.is_diskless(t):
                continue
            for p in list(t.partitions.values()):
                if is_replicated(p) and self.node_id in p.replicas:
                    out.append((t, p))
        return out

    def metadata_changed(self) -> None:
        """Become leader or follower of each replicated partition as the metadata says; called
        on the event loop after every batch of applied records."""
        if self.closed:
            return
        seen: set[tuple[str, int]] = set()
        here = self.replicated_here()
        if self._to_fence is None:  # the first look after the start: what the previous incarnation held
            self._to_fence = {(t.name, p.partition): None for t, p in here if self.node_id in p.isr}
        for t, p in here:
            key = (t.name, p.partition)
            lg = self.b.logs.get(key)
            if lg is None:
                continue
            seen.add(key)
            if key in self._to_fence:
                fenced_from = self._to_fence[key]
                if fenced_from is not None and p.partition_epoch > fenced_from:
                    del self._to_fence[key]  # the fence (or a later change) is applied here
            if p.leader == self.node_id:
                if key in self._to_fence:  # led by this node's previous incarnation: not before it is fenced
                    self.following.pop(key, None)
                    continue
                self._lead(t, p, lg)
            else:
                self._follow(t, p, lg)
        for key in [k for k in self.leaders if k not in seen]:
            self.leaders.pop(key).close()
        for key in [k for k in self.following if k not in seen]:
            del self.following[key]
        if seen or any(is_replicated(p) or p.adding_replicas for t in self.b.state.topics.values()
                       for p in t.partitions.values()):
            self._ensure_task()  # a controller holding no replica still elects and completes moves
        self._sync_fetchers()

    def _lead(self, t: Any, p: Any, lg: Any) -> None:
        key = (t.name, p.partition)
        self.following.pop(key, None)
        lp = self.leaders.get(key)
        if lp is None or lp.leader_epoch != p.leader_epoch or lp.log is not lg:
            old = lp
            if not lg.replicated:
                # after a start: the checkpointed one (Kafka's replication-offset-checkpoint), else
                # the log start; it rises to the ISR's lowest log end as the followers report
                lg.set_high_watermark(start_high_watermark(lg))
            lg.assign_epoch(p.leader_epoch)  # Kafka's leaderEpochCache.assign on becoming leader
            lp = LeaderPartition(t.name, p.partition, lg, p.leader_epoch, p.replicas, p.isr, self.node_id,
                                 lag_max_ms=self.b.config.get_int("replica.lag.time.max.ms"))
            lp.eligible = self.is_live  # a dead follower never holds the high watermark back
            self.leaders[key] = lp
            if old is not None:
                if old.log is lg:  # leader again in a new epoch: acks=all waiters carry on with the new one
                    old.successor = lp
                old.close()
            log.info("[Partition %s-%d broker=%d] leader in epoch %d with ISR %s (log end %d, high watermark %d)",
                     t.name, p.partition, self.node_id, p.leader_epoch, p.isr, lg.log_end_offset, lg.high_watermark)
        else:
            lp.update_isr(p.isr, p.replicas)
        if lp.maybe_increase_hw():
            self.b.notifier.notify(t.name, p.partition)

    def _follow(self, t: Any, p: Any, lg: Any) -> None:
        key = (t.name, p.partition)
        lp = self.leaders.pop(key, None)
        if lp is not None:
            lp.close()
        if not lg.replicated:
            lg.set_high_watermark(start_high_watermark(lg))
        f = self.following.get(key)
        if f is None or f.leader != p.leader or f.leader_epoch != p.leader_epoch:
            self.following[key] = Following(t.name, p.partition, p.leader, p.leader_epoch)
            if p.leader >= 0:
                log.info("[Partition %s-%d broker=%d] follower of broker %d in epoch %d (log end %d)",
                         t.name, p.partition, self.node_id, p.leader, p.leader_epoch, lg.log_end_offset)

    def followed_from(self, leader_id: int) -> list[Following]:
        return [f for f in self.following.values() if f.leader == leader_id]

    def _sync_fetchers(self) -> None:
        wanted = {f.leader for f in self.following.values() if f.leader >= 0 and f.leader != self.node_id}
        for leader in wanted:
            fetcher = self.fetchers.get(leader)
            if fetcher is None:
                self.fetchers[leader] = ReplicaFetcher(self, leader)
            else:
                fetcher.wake.set()
        for leader in [k for k in self.fetchers if k not in wanted]:
            fetcher = self.fetchers.pop(leader)
            self._spawn(fetcher.stop())

    def follower_progress(self, f: Following, lg: Any) -> None:
        """A follower appended: nothing to do on this side (its leader learns it at the next fetch)."""

    # ---- the leader's side of a follower's fetch -----------------------------------------
    def fetch_for_follower(self, t: Any, idx: int, fp: Any, replica_id: int, max_bytes: int,
                           min_one: bool) -> dict[str, Any]:
        """Answer one partition of a follower's Fetch: records up to the log end (not the high
        watermark), and the follower's fetch offset recorded for the ISR and the high watermark."""
        key = (t.name, idx)
        lp = self.leaders.get(key)
        p = t.partitions.get(idx)
        base = {"partition_index": idx, "high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1,
                "aborted_transactions": None, "preferred_read_replica": -1, "records": b""}
        if lp is None or p is None or p.leader != self.node_id:
            return {**base, "error_code": ErrorCode.not_leader_or_follower}
        epoch = int(getattr(fp, "current_leader_epoch", -1))
        if 0 <= epoch < lp.leader_epoch:
            return {**base, "error_code": ErrorCode.fenced_leader_epoch}
        if epoch > lp.leader_epoch:
            return {**base, "error_code": ErrorCode.unknown_leader_epoch}
        if replica_id not in p.replicas:
            return {**base, "error_code": ErrorCode.not_leader_or_follower}
        lg = lp.log
        offset = int(fp.fetch_offset)
        if lg.log_start_offset <= offset < lg.local_log_start_offset and self._tiered(t, idx):
            # KIP-405: what the follower asks for is only in the remote tier; it builds its state
            # from there and starts at the tier's end (Kafka's OFFSET_MOVED_TO_TIERED_STORAGE)
            return {**base, "error_code": ErrorCode.offset_moved_to_tiered_storage, "high_watermark": lg.high_watermark,
                    "last_stable_offset": lg.high_watermark, "log_start_offset": lg.log_start_offset}
        throttled = replica_id not in p.isr and is_throttled(self.b, t, idx, LEADER)
        try:
            if throttled and self.leader_quota.exceeded():
                # leader.replication.throttled.rate reached: nothing for this follower this time
                # (its fetch state still counts), as Kafka's shouldLeaderThrottle
                lp.follower_fetched(replica_id, offset)
                self._after_fetch(lp, t, p, replica_id)
                return {**base, "error_code": 0, "high_watermark": lg.high_watermark,
                        "last_stable_offset": lg.last_stable_offset, "log_start_offset": lg.log_start_offset}
            res = lg.read(offset, max_bytes, min_one_batch=min_one, upper_bound=lg.log_end_offset)
        except BrokerError as err:
            return {**base, "error_code": err.code, "high_watermark": lg.high_watermark,
                    "last_stable_offset": lg.high_watermark, "log_start_offset": lg.log_start_offset}
        except Exception as err:  # LogError (OffsetOutOfRange, damage) carries a Kafka code
            code = getattr(err, "code", None)
            if code is None:
                raise
            return {**base, "error_code": code, "high_watermark": lg.high_watermark,
                    "last_stable_offset": lg.high_watermark, "log_start_offset": lg.log_start_offset}
        if throttled and res.records:
            self.leader_quota.record(len(res.records))
        lp.follower_fetched(replica_id, offset)
        state = lp.followers.get(replica_id)
        if state is not None:
            state.log_start_offset = int(getattr(fp, "log_start_offset", -1))
        self._after_fetch(lp, t, p, replica_id)
        return {**base, "error_code": 0, "high_watermark": lg.high_watermark,
                "last_stable_offset": lg.last_stable_offset, "log_start_offset": lg.log_start_offset,
                "records": bytes(res.records) if res.records else b""}

    # ---- KIP-392: consumers fetching from followers (read_replica.py) ----------------------
    def preferred_read_replica(self, t: Any, idx: int, rack: str, fetch_offset: int) -> int:
        return read_replica.preferred_read_replica(self, t, idx, rack, fetch_offset)

    def serves_as_follower(self, t: Any, idx: int) -> bool:
        return read_replica.serves_as_follower(self, t, idx)

    async def read_as_follower(self, t: Any, idx: int, fp: Any, max_bytes: int, *, min_one: bool,
                               read_committed: bool) -> Any:
        return await read_replica.read_as_follower(self, t, idx, fp, max_bytes, min_one=min_one,
                                                   read_committed=read_committed)

    def _tiered(self, t: Any, idx: int) -> bool:
        """The partition has segments in the remote tier (KIP-405)."""
        rlm = getattr(self.b, "tiered", None)
        return rlm is not None and bool(rlm.has_remote(t, idx))

    def is_live(self, node: int) -> bool:
        """Whether ``node`` is a live broker (the store's view, cached for 100 ms)."""
        now = time.monotonic()
        if now - self._live_at > 0.1:
            self._live_at, self._live = now, {r.node_id for r in self.b.live_brokers()}
        return node in self._live

    def _after_fetch(self, lp: LeaderPartition, t: Any, p: Any, replica_id: int | None = None) -> None:
        if lp.maybe_increase_hw():
            self.b.notifier.notify(lp.topic, lp.partition)
        grow = lp.expand_candidates()
        if replica_id is not None:
            # Kafka's maybeExpandIsr runs for the follower that fetched: another follower's state
            # may be that of a broker that died since (its last log end still at the HW)
            grow = [r for r in grow if r == replica_id]
        if grow:  # only live brokers join (Kafka's controller refuses fenced or shutting-down ones)
            live = {r.node_id for r in self.b.live_brokers()}
            grow = [r for r in grow if r in live]
        if grow and not lp.pending_change:
            self._change_isr(lp, sorted(set(lp.isr) | set(grow)), "expand", grow)

    # ---- produce --------------------------------------------------------------------------
    def min_isr(self, t: Any) -> int:
        return int(self.b.topic_config_value(t, "min.insync.replicas"))

    def check_min_isr(self, t: Any, p: Any) -> BrokerError | None:
        """acks=all before the append: Kafka's NOT_ENOUGH_REPLICAS when the ISR is below
        min.insync.replicas (None when fine, or when the partition has one replica)."""
        if not is_replicated(p):
            return None
        lp = self.leaders.get((t.name, p.partition))
        if lp is None:
            return BrokerError(ErrorCode.not_leader_or_follower, f"Broker {self.node_id} is not the leader of {t.name}-{p.partition}")
        need = self.min_isr(t)
        if len(lp.isr) < need:
            return BrokerError(ErrorCode.not_enough_replicas,
                               f"The size of the current ISR {sorted(lp.isr)} is insufficient to satisfy the min.isr "
                               f"requirement of {need} for partition {t.name}-{p.partition} (replication factor "
                               f"{len(p.replicas)})")
        return None

    def appended(self, t: Any, p: Any) -> None:
        """After a leader append: a leader alone in its ISR moves its high watermark at once."""
        lp = self.leaders.get((t.name, p.partition))
        if lp is not None and lp.maybe_increase_hw():
            self.b.notifier.notify(t.name, p.partition)

    async def wait_for_acks(self, t: Any, p: Any, offset: int, timeout_s: float) -> BrokerError | None:
        """acks=all after the append: wait (up to the request timeout) until the high watermark
        passes ``offset``; then NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR shrank below
        min.insync.replicas meanwhile (Kafka's checkEnoughReplicasReachOffset)."""
        key = (t.name, p.partition)
        lp = self.leaders.get(key)
        if lp is None:
            return BrokerError(ErrorCode.not_leader_or_follower, f"Broker {self.node_id} is not the leader of {t.name}-{p.partition}")
        if lp.maybe_increase_hw():
            self.b.notifier.notify(t.name, p.partition)
        deadline = time.monotonic() + timeout_s
        ok = await lp.wait_for_hw(offset, timeout_s)
        while not ok and lp.successor is not None:
            # still the leader, in a new leader epoch (a reassignment dropped replicas): the append
            # stays in this log, so wait on (Kafka's delayed produce outlives makeLeader)
            lp = lp.successor
            ok = await lp.wait_for_hw(offset, deadline - time.monotonic())
        if lp.closed or self.leaders.get(key) is not lp:
            return BrokerError(ErrorCode.not_leader_or_follower,
                               f"Broker {self.node_id} is no longer the leader of {t.name}-{p.partition}")
        if not ok:
            return BrokerError(ErrorCode.request_timed_out,
                               f"the in-sync replicas {sorted(lp.isr)} of {t.name}-{p.partition} did not reach offset "
                               f"{offset - 1} within the request timeout")
        need = self.min_isr(t)
        if len(lp.isr) < need:
            return BrokerError(ErrorCode.not_enough_replicas_after_append,
                               f"The size of the current ISR {sorted(lp.isr)} is insufficient to satisfy the min.isr "
                               f"requirement of {need} for partition {t.name}-{p.partition}")
        return None

    # ---- ISR changes (the leader's AlterPartition) ----------------------------------------
    def _change_isr(self, lp: LeaderPartition, new_isr: list[int], kind: str, which: list[int]) -> None:
        t = self.b.topic(lp.topic)
        p = t.partitions.get(lp.partition) if t is not None else None
        if p is None or p.leader != self.node_id or p.leader_epoch != lp.leader_epoch or sorted(new_isr) == sorted(p.isr):
            return
        lg = lp.log
        lp.pending_change = True
        try:
            self.b.metadata.append([record("PartitionChangeRecord", topicId=t.topic_id, partitionId=p.partition,
                                           isr=new_isr, expectedPartitionEpoch=p.partition_epoch,
                                           expectedLeaderEpoch=p.leader_epoch)])
        except BrokerError as err:
            # fenced (a newer partition epoch: the controller or a new leader got in first) or the
            # database is unreachable: the ISR stays, so acks=all keeps waiting for the old one
            log.warning("[Partition %s-%d broker=%d] ISR change to %s refused: %s", lp.topic, lp.partition,
                        self.node_id, new_isr, err.message or err.code)
            return
        finally:
            lp.pending_change = False
        if kind == "shrink":
            self.b.metrics.inc("replica.isr_shrinks")
            lagging = ", ".join(f"(brokerId: {r}, endOffset: {lp.followers[r].log_end_offset}, lastCaughtUpTimeMs: "
                                f"{lp.followers[r].last_caught_up_ms})" for r in which if r in lp.followers)
            log.info("[Partition %s-%d broker=%d] Shrinking ISR from %s to %s. Leader: (highWatermark: %d, endOffset: %d). "
                     "Out of sync replicas: %s.", lp.topic, lp.partition, self.node_id, ",".join(map(str, sorted(set(new_isr) | set(which)))), ",".join(map(str, new_isr)), lg.high_watermark,
                     lg.log_end_offset, lagging)
        else:
            self.b.metrics.inc("replica.isr_expands")
            log.info("[Partition %s-%d broker=%d] Expanding ISR to %s (added %s). Leader: (highWatermark: %d, endOffset: %d).",
                     lp.topic, lp.partition, self.node_id, ",".join(map(str, new_isr)), ",".join(map(str, which)),
                     lg.high_watermark, lg.log_end_offset)

    def _shrink_isrs(self) -> None:
        lag_max = self.b.config.get_int("replica.lag.time.max.ms")
        for lp in list(self.leaders.values()):
            out = lp.out_of_sync(lag_max)
            if out and not lp.pending_change:
                self._change_isr(lp, [r for r in lp.isr if r not in out], "shrink", out)

    # ---- the controller's elections -------------------------------------------------------
    def _elect(self) -> None:
        b = self.b
        if not b.metadata.is_controller():
            controller_lost(b)
            return
        regs = b.live_brokers()
        live = {r.node_id for r in regs} - self._fenced_peers(regs)
        recs = election_records(b.state, live, lambda t: not b.is_diskless(t),
                                lambda t: bool(b.topic_config_value(t, "unclean.leader.election.enable")))
        busy = {(r["data"]["topicId"], r["data"]["partitionId"]) for r in recs}
        recs += [r for r in controller_round(b, live) if (r["data"]["topicId"], r["data"]["partitionId"]) not in busy]
        for rec in recs:  # one at a time: a refused change must not hold back the others
            try:
                lines = describe([rec], b.state)
                b.metadata.append([rec])
                log.info("[Controller id=%d] partition change: %s (live brokers %s)", self.node_id, lines[0],
                         ",".join(map(str, sorted(live))))
                if rec["data"].get("leader") == -1:
                    log.warning("[Controller id=%d] %s is offline: no live replica in its ISR (unclean.leader.election."
                                "enable=false)", self.node_id, lines[0].split(":")[0])
            except BrokerError as err:
                log.info("[Controller id=%d] partition change refused, retrying: %s", self.node_id, err.message or err.code)

    # ---- broker epochs --------------------------------------------------------------------
    def _fence_previous_incarnation(self) -> None:
        """Once registered: leave every ISR this node's previous incarnation was in (where another
        live member remains) and hand over its leaderships, in new leader epochs (fence_incarnation),
        as Kafka's controller does when a broker registers with a new epoch. A broker back on an
        empty disk at once after kill -9 is so never elected as the replica that had the data.
        Until every change is committed this broker leads nothing; refused changes are retried."""
        b = self.b
        me = str(getattr(b.metadata, "incarnation", ""))
        regs = b.metadata.live_brokers()
        if not any(r.node_id == self.node_id and r.incarnation == me for r in regs):
            return  # not registered yet
        live = {r.node_id for r in regs}
        todo = self._to_fence or {}
        here = {(t.name, p.partition): (t, p) for t, p in self.replicated_here()}
        for key in [k for k in todo if k not in here]:
            del todo[key]  # deleted meanwhile
        for key, fenced_from in list(todo.items()):
            if fenced_from is not None:
                continue
            t, p = here[key]
            rec = fence_incarnation(t.topic_id, p, self.node_id, live)
            if rec is None:
                del todo[key]
                continue
            base = p.partition_epoch  # (the append may apply the change to p at once)
            try:
                b.metadata.append([rec])
                todo[key] = base
                log.info("[Partition %s-%d broker=%d] new incarnation %s: %s", t.name, p.partition, self.node_id, me,
                         describe([rec], b.state)[0].split(": ", 1)[-1])
            except BrokerError as err:
                log.info("[Partition %s-%d broker=%d] fencing the previous incarnation refused, retrying: %s",
                         t.name, p.partition, self.node_id, err.message or err.code)
        self.metadata_changed()

    def _fenced_peers(self, regs: list[Any]) -> set[int]:
        """The controller's side of broker epochs: a node seen under a new incarnation is not the
        ISR member its previous one was. Fence it (fence_incarnation) before it counts as live for
        elections; returns the nodes whose fencing is not committed yet."""
        b = self.b
        live = {r.node_id for r in regs}
        for gone in [n for n in self._incarnations if n not in live]:
            # seen leaving: the elections treated it as dead (it left every ISR but the last)
            del self._incarnations[gone]
        pending: set[int] = set()
        for r in regs:
            old = self._incarnations.get(r.node_id)
            if old is None or old == r.incarnation or r.node_id == self.node_id or not r.incarnation:
                if r.incarnation:
                    self._incarnations[r.node_id] = r.incarnation
                continue
            done = self._fenced_parts.setdefault((r.node_id, r.incarnation), set())
            ok = True
            for t, p in self.replicated_here_all():
                if (t.name, p.partition) in done:
                    continue
                rec = fence_incarnation(t.topic_id, p, r.node_id, live - {r.node_id})
                if rec is None:
                    done.add((t.name, p.partition))
                    continue
                try:
                    b.metadata.append([rec])
                    done.add((t.name, p.partition))
                    log.info("[Controller id=%d] broker %d registered again (new incarnation): %s", self.node_id,
                             r.node_id, describe([rec], b.state)[0])
                except BrokerError as err:
                    ok = False
                    log.info("[Controller id=%d] fencing broker %d refused, retrying: %s", self.node_id, r.node_id,
                             err.message or err.code)
            if ok:
                self._incarnations[r.node_id] = r.incarnation
                self._fenced_parts.pop((r.node_id, r.incarnation), None)
            else:
                pending.add(r.node_id)
        return pending

    def replicated_here_all(self) -> list[tuple[Any, Any]]:
        """Every replicated classic partition of the cluster (the controller's view)."""
        from kcli.metadata.metadata_log import MODE_NONE

        return [(t, p) for t in list(self.b.state.topics.values()) if not self.b.is_diskless(t)
                for p in list(t.partitions.values()) if is_replicated(p) and p.mode != MODE_NONE]

    # ---- the high-watermark checkpoint ----------------------------------------------------
    def _replicated_logs(self) -> list[Any]:
        keys = list(self.leaders) + list(self.following)
        return [lg for lg in (self.b.logs.get(k) for k in keys) if lg is not None]

    @staticmethod
    def _checkpoint_hws(logs: list[Any]) -> None:
        for lg in logs:
            try:
                lg.checkpoint_high_watermark()
            except Exception as err:  # noqa: BLE001 - a failed write keeps the previous checkpoint
                log.warning("cannot checkpoint the high watermark of %s: %s", getattr(lg, "dir", lg), err)

    # ---- the background task --------------------------------------------------------------
    def _ensure_task(self) -> None:
        if self._task is None and not self.closed:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="replica-manager")

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._changes.add(task)
        task.add_done_callback(self._changes.discard)

    async def _run(self) -> None:
        lag_max_s = self.b.config.get_int("replica.lag.time.max.ms") / 1000
        while not self.closed and not self.b.stopping:
            await asyncio.sleep(TICK_S)
            try:
                if self._to_fence:
                    self._fence_previous_incarnation()
                self._elect()
                for lp in list(self.leaders.values()):
                    if lp.maybe_increase_hw():
                        self.b.notifier.notify(lp.topic, lp.partition)
                now = time.monotonic()
                if now - self._last_shrink_check >= min(lag_max_s / 2, 1.0):
                    self._last_shrink_check = now
                    self._shrink_isrs()
                if now - self._last_hw_checkpoint >= self._hw_checkpoint_s:
                    self._last_hw_checkpoint = now
                    await asyncio.to_thread(self._checkpoint_hws, self._replicated_logs())
            except Exception:  # noqa: BLE001 - logged; the next round tries again
                log.exception("replica manager round failed")

    async def close(self) -> None:
        self.closed = True
        for lp in self.leaders.values():
            lp.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.gather(*(f.stop() for f in self.fetchers.values()), *self._changes, return_exceptions=True)
        self.fetchers.clear()
        self._checkpoint_hws(self._replicated_logs())  # a clean stop: the next start begins here

    # ---- metrics --------------------------------------------------------------------------
    def under_replicated_count(self) -> int:
        return sum(1 for key, lp in self.leaders.items() if len(lp.isr) < len(lp.replicas))

    def under_min_isr_count(self) -> int:
        n = 0
        for (topic, _idx), lp in self.leaders.items():
            t = self.b.topic(topic)
            if t is not None and len(lp.isr) < self.min_isr(t):
                n += 1
        return n

    def offline_count(self) -> int:
        """Kafka's OfflinePartitionsCount, reported by the controller only."""
        if not self.b.metadata.is_controller():
            return 0
        live = {r.node_id for r in self.b.live_brokers()}
        return sum(1 for t in self.b.state.topics.values() if not self.b.is_diskless(t)
                   for p in t.partitions.values() if is_replicated(p) and (p.leader < 0 or p.leader not in live))

    def max_lag(self) -> int:
        return max((lp.max_lag() for lp in self.leaders.values()), default=0)


def start_high_watermark(lg: Any) -> int:
    """A replica's high watermark when it starts leading or following after a start: its
    checkpoint (clamped to the log by set_high_watermark), else the log start."""
    ckpt = lg.checkpointed_high_watermark
    return lg.log_start_offset if ckpt is None else max(ckpt, lg.log_start_offset)
