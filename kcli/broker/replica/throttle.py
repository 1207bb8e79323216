"""Replication throttles (Kafka's ReplicationQuotaManager, KIP-73): the broker configs
``leader.replication.throttled.rate`` / ``follower.replication.throttled.rate`` (bytes/s, dynamic)
bound the replication traffic of the replicas the topic configs
``leader.replication.throttled.replicas`` / ``follower.replication.throttled.replicas`` name
(``partition:broker`` entries, or ``*`` for every replica of the topic).

As in Kafka only replicas outside the ISR are throttled (a catching-up or moving replica; the
ISR's own traffic never is): a leader whose throttled rate is exceeded answers such a follower's
partition with no records, and a follower whose rate is exceeded leaves the partition out of its
next Fetch. The rate is measured as Kafka's Rate over ``replication.quota.window.num`` samples of
``replication.quota.window.size.seconds`` (its window counts as at least ``num - 1`` samples long,
so a burst at the start is bounded too).
"""

from __future__ import annotations

import time
from typing import Any

LEADER, FOLLOWER = "leader", "follower"
UNBOUNDED = 9223372036854775807


def throttled_replicas(value: Any) -> tuple[bool, set[tuple[int, int]]]:
    """(every replica, {(partition, broker)}) of a ``*.replication.throttled.replicas`` value
    (a list, or its comma-separated text); entries that are not ``p:b`` are ignored."""
    items = value if isinstance(value, list) else str(value or "").split(",")
    out: set[tuple[int, int]] = set()
    every = False
    for item in (str(i).strip() for i in items):
        if item == "*":
            every = True
        elif ":" in item:
            p, _, b = item.partition(":")
            if p.strip().isdigit() and b.strip().lstrip("-").isdigit():
                out.add((int(p), int(b)))
    return every, out


class ReplicationQuota:
    """One side's byte rate (leader or follower) over a sliding window of samples."""

    def __init__(self, b: Any, side: str) -> None:
        self.b = b
        self.side = side
        self._samples: list[list[float]] = []  # [sample start (monotonic s), bytes]

    def bound(self) -> int:
        try:
            value, _source = self.b.broker_config_levels(f"{self.side}.replication.throttled.rate")[0]
            return int(value) if value is not None else UNBOUNDED
        except Exception:  # noqa: BLE001 - a broker without dynamic configs: the static value
            return self.b.config.get_int(f"{self.side}.replication.throttled.rate")

    def _window(self) -> tuple[int, float]:
        cfg = self.b.config
        return cfg.get_int("replication.quota.window.num"), float(cfg.get_int("replication.quota.window.size.seconds"))

    def rate(self, now: float | None = None) -> float:
        """Bytes/s over the window (Kafka's Rate: elapsed counted as at least num - 1 samples)."""
        now = time.monotonic() if now is None else now
        num, size = self._window()
        self._samples = [s for s in self._samples if now - s[0] < num * size]
        if not self._samples:
            return 0.0
        elapsed = now - self._samples[0][0]
        elapsed = max(elapsed, (num - 1) * size, size)
        return sum(s[1] for s in self._samples) / elapsed

    def exceeded(self) -> bool:
        bound = self.bound()
        return bound < UNBOUNDED and self.rate() > bound

    def record(self, nbytes: int) -> None:
        if nbytes <= 0:
            return
        now = time.monotonic()
        _num, size = self._window()
        if self._samples and now - self._samples[-1][0] < size:
            self._samples[-1][1] += nbytes
        else:
            self._samples.append([now, float(nbytes)])


def is_throttled(b: Any, t: Any, partition: int, side: str) -> bool:
    """This broker's replica of ``t``-``partition`` is named by the topic's ``<side>`` list."""
    try:
        value = b.topic_config_value(t, f"{side}.replication.throttled.replicas")
    except Exception:  # noqa: BLE001 - no such config: not throttled
        return False
    every, entries = throttled_replicas(value)
    return every or (partition, b.node_id) in entries
