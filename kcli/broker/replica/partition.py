"""The leader's side of one replicated partition (Kafka's Partition): follower fetch state, the
ISR it would keep, the high watermark, and the acks=all waiters."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any


def now_ms() -> int:
    return int(time.monotonic() * 1000)


@dataclass
class FollowerState:
    """What the leader knows of one follower (Kafka's Replica.ReplicaState)."""

    log_end_offset: int = -1  # unknown until its first fetch in this leader epoch
    last_caught_up_ms: int = 0
    last_fetch_leader_leo: int = -1
    last_fetch_ms: int = 0
    log_start_offset: int = -1  # from its fetches: a consumer it may serve (KIP-392) needs the offset there


class LeaderPartition:
    """State of a partition this broker leads in ``leader_epoch``. The ISR is the committed one
    from the metadata; changes are proposed by the manager and take effect when applied."""

    def __init__(self, topic: str, partition: int, lg: Any, leader_epoch: int, replicas: list[int],
                 isr: list[int], node_id: int, lag_max_ms: int = 30000) -> None:
        self.topic = topic
        self.lag_max_ms = lag_max_ms  # replica.lag.time.max.ms: how long a caught-up follower holds back the HW
        # Kafka's isReplicaIsrEligible: a follower whose broker is not live (dead, fenced, restarted
        # under a new incarnation) never holds the high watermark back from outside the ISR; the
        # replica manager sets it (found by the replication bench: a killed follower, dropped from
        # the ISR, held every acks=all produce of its partitions for replica.lag.time.max.ms)
        self.eligible: Any = lambda _r: True
        self.partition = partition
        self.log = lg
        self.leader_epoch = leader_epoch
        self.node_id = node_id
        self.replicas = list(replicas)
        self.isr = list(isr)
        now = now_ms()
        # Kafka resets follower state on becoming leader: ISR members count as caught up now
        self.followers: dict[int, FollowerState] = {
            r: FollowerState(last_caught_up_ms=now if r in isr else 0) for r in replicas if r != node_id}
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self.pending_change = False  # an ISR change is being committed
        self.closed = False
        self.successor: LeaderPartition | None = None  # this broker leads on in a new epoch (same log)

    # ---- metadata -------------------------------------------------------------------------
    def update_isr(self, isr: list[int], replicas: list[int]) -> None:
        self.isr = list(isr)
        self.replicas = list(replicas)
        for r in replicas:
            if r != self.node_id and r not in self.followers:
                self.followers[r] = FollowerState()

    # ---- follower fetches -----------------------------------------------------------------
    def follower_fetched(self, replica_id: int, fetch_offset: int) -> None:
        """Kafka's Replica.updateFetchStateOrThrow: the follower has everything below
        ``fetch_offset``; it is caught up now if that is the leader's log end, or caught up as of
        its previous fetch if it reached the log end the leader had then."""
        f = self.followers.get(replica_id)
        if f is None:
            return
        now = now_ms()
        leo = self.log.log_end_offset
        if fetch_offset >= leo:
            f.last_caught_up_ms = max(f.last_caught_up_ms, now)
        elif f.last_fetch_leader_leo >= 0 and fetch_offset >= f.last_fetch_leader_leo:
            f.last_caught_up_ms = max(f.last_caught_up_ms, f.last_fetch_ms)
        f.log_end_offset = fetch_offset
        f.last_fetch_leader_leo = leo
        f.last_fetch_ms = now

    def expand_candidates(self) -> list[int]:
        """Followers outside the ISR that caught up to the high watermark (Kafka's
        isFollowerInSync: log end >= HW, and within the current leader epoch's data)."""
        hw = self.log.high_watermark
        return [r for r, f in self.followers.items()
                if r not in self.isr and r in self.replicas and f.log_end_offset >= hw and f.log_end_offset >= 0]

    def out_of_sync(self, lag_max_ms: int) -> list[int]:
        """ISR followers that have not caught up for longer than ``lag_max_ms`` (Kafka's
        getOutOfSyncReplicas)."""
        now = now_ms()
        return [r for r in self.isr if r != self.node_id
                and now - self.followers.get(r, FollowerState()).last_caught_up_ms > lag_max_ms]

    # ---- high watermark -------------------------------------------------------------------
    def maybe_increase_hw(self) -> bool:
        """HW = the lowest log end of the ISR (the leader's included), and of the followers outside
        the ISR that are caught up (fetched the leader's log end within ``lag_max_ms``): Kafka's
        maybeIncrementLeaderHW since KAFKA-7128. Without the latter, a follower catching up while
        producers run finds the HW moved past its log end at every fetch (the ISR members fetched
        more meanwhile) and never joins the ISR. It never goes back."""
        ends = [self.log.log_end_offset]
        for r in self.isr:
            if r != self.node_id:
                f = self.followers.get(r)
                ends.append(f.log_end_offset if f is not None else -1)
        now = now_ms()
        for r, f in self.followers.items():
            if (r not in self.isr and r in self.replicas and f.log_end_offset >= 0 and f.last_caught_up_ms > 0
                    and now - f.last_caught_up_ms <= self.lag_max_ms and self.eligible(r)):
                ends.append(f.log_end_offset)
        new_hw = min(ends)
        if new_hw > self.log.high_watermark:
            self.log.set_high_watermark(new_hw)
            self._wake()
            return True
        return False

    def _wake(self) -> None:
        hw = self.log.high_watermark
        keep = []
        for offset, fut in self._waiters:
            if fut.done():
                continue
            if hw >= offset or self.closed:
                fut.set_result(None)
            else:
                keep.append((offset, fut))
        self._waiters = keep

    async def wait_for_hw(self, offset: int, timeout_s: float) -> bool:
        """Wait until the high watermark reaches ``offset``; False on timeout or loss of leadership."""
        if self.log.high_watermark >= offset:
            return True
        if self.closed or timeout_s <= 0:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((offset, fut))
        try:
            await asyncio.wait_for(fut, timeout_s)
        except asyncio.TimeoutError:
            return False
        return not self.closed and self.log.high_watermark >= offset

    def close(self) -> None:
        """Leadership ended: every waiter is answered (with a failure) at once."""
        self.closed = True
        self._wake()

    def max_lag(self) -> int:
        leo = self.log.log_end_offset
        return max((leo - f.log_end_offset for f in self.followers.values() if f.log_end_offset >= 0), default=0)
