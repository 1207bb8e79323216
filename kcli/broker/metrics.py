"""Counters, latency summaries and gauges the broker exposes to `kcli broker metrics`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Summary:
    """Count, sum and a bounded reservoir of recent values for percentiles."""

    count: int = 0
    total: float = 0.0
    recent: list[float] = field(default_factory=list)
    limit: int = 2048

    def observe(self, value: float) -> None:
        self.count += 1
        self.total += value
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

    def register_gauge(self, name: str, fn: Callable[[], Any]) -> None:
        """A point-in-time value read at each snapshot (e.g. partitions in back-off)."""
        self.gauges[name] = fn

    def inc(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def observe(self, name: str, value: float) -> None:
        s = self.summaries.get(name)
        if s is None:
            s = self.summaries[name] = Summary()
        s.observe(value)

    def snapshot(self) -> dict[str, Any]:
        return {"counters": dict(sorted(self.counters.items())),
                "summaries": {k: v.snapshot() for k, v in sorted(self.summaries.items())},
                "gauges": {k: fn() for k, fn in sorted(self.gauges.items())}}
