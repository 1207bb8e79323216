"""Counters, latency summaries and gauges the broker exposes to `kcli broker metrics` and, on
the same objects, to Prometheus (kcli/broker/prometheus.py): one set of counters, two readers.

Series with labels (per API, per topic) go only to Prometheus; `kcli broker metrics` shows the
unlabelled ones, as before. Every summary also keeps histogram buckets, so Prometheus can sum
latencies over brokers and compute quantiles; the recent-values reservoir serves P50/P99 here.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Callable

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs

# Upper bounds (le) of histogram buckets, by what a summary measures (its name's suffix).
LATENCY_MS_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0)
BYTES_BUCKETS = tuple(float(4 ** i * 1024) for i in range(9))  # 1 KiB .. 64 MiB
COUNT_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)


def buckets_for(name: str) -> tuple[float, ...]:
    if name.endswith(("_ms", "ms")):
        return LATENCY_MS_BUCKETS
    if name.endswith("bytes"):
        return BYTES_BUCKETS
    return COUNT_BUCKETS


def labels_of(labels: dict[str, str]) -> Labels:
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


@dataclass
class Summary:
    """Count, sum and a bounded reservoir of recent values for percentiles."""

    count: int = 0
    total: float = 0.0
    recent: list[float] = field(default_factory=list)
    limit: int = 2048
    bounds: tuple[float, ...] = LATENCY_MS_BUCKETS
    buckets: list[int] = field(default_factory=list)  # per bound, not cumulative; values above the last: count only

    def observe(self, value: float) -> None:
        self.count += 1
        self.total += value
        if not self.buckets:
            self.buckets = [0] * len(self.bounds)
        i = bisect.bisect_left(self.bounds, value)
        if i < len(self.bounds):
            self.buckets[i] += 1
        self.recent.append(value)
        if len(self.recent) > self.limit:
            del self.recent[: len(self.recent) - self.limit]

    def snapshot(self) -> dict[str, Any]:
        vals = sorted(self.recent)

        def pct(p: float) -> float | None:
            if not vals:
                return None
            return round(vals[min(len(vals) - 1, int(p * len(vals)))], 3)

        return {"count": self.count, "sum": round(self.total, 3),
                "avg": round(self.total / self.count, 3) if self.count else None,
                "p50": pct(0.50), "p99": pct(0.99), "max": round(vals[-1], 3) if vals else None}


class Metrics:
    def __init__(self) -> None:
        self.counters: dict[str, int] = {}
        self.summaries: dict[str, Summary] = {}
        self.gauges: dict[str, Callable[[], Any]] = {}
        self.labelled_counters: dict[str, dict[Labels, int]] = {}
        self.labelled_summaries: dict[str, dict[Labels, Summary]] = {}

    def register_gauge(self, name: str, fn: Callable[[], Any]) -> None:
        """A point-in-time value read at each snapshot (e.g. partitions in back-off)."""
        self.gauges[name] = fn

    def inc(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def observe(self, name: str, value: float) -> None:
        s = self.summaries.get(name)
        if s is None:
            s = self.summaries[name] = Summary(bounds=buckets_for(name))
        s.observe(value)

    def inc_labelled(self, name: str, labels: dict[str, str], n: int = 1) -> None:
        """A counter per label set (e.g. bytes per topic): exported to Prometheus only."""
        series = self.labelled_counters.setdefault(name, {})
        key = labels_of(labels)
        series[key] = series.get(key, 0) + n

    def observe_labelled(self, name: str, labels: dict[str, str], value: float) -> None:
        series = self.labelled_summaries.setdefault(name, {})
        key = labels_of(labels)
        s = series.get(key)
        if s is None:
            s = series[key] = Summary(limit=0, bounds=buckets_for(name))
        s.observe(value)

    def forget_label(self, label: str, value: str) -> None:
        """Drop every labelled series with ``label=value`` (a deleted topic's)."""
        for table in (*self.labelled_counters.values(), *self.labelled_summaries.values()):
            for key in [k for k in table if (label, value) in k]:
                del table[key]

    def snapshot(self) -> dict[str, Any]:
        return {"counters": dict(sorted(self.counters.items())),
                "summaries": {k: v.snapshot() for k, v in sorted(self.summaries.items())},
                "gauges": {k: fn() for k, fn in sorted(self.gauges.items())}}
