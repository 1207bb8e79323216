"""Failure isolation for the broker's background tasks: one failing partition never stalls the rest.

Every periodic task (tier copies, local and remote retention, KIP-950 disable work, KIP-694
partition deletion, diskless retention, WAL file deletion) runs its round as one *step* per
partition (or per topic, or per object batch — whatever the unit of independent work is)
through a :class:`TaskGuard`. A step that raises does not end the round: the guard

- logs ONE warning line with the exception text when the key starts failing (the traceback only
  at DEBUG; later failures of the same streak only at DEBUG), and one INFO line when it recovers;
- keeps the key out of later rounds for an exponential back-off (1 s doubling up to 60 s, the way
  Kafka's RemoteLogManager backs off a failing copy task) so a broken partition costs nothing;
- counts the failure in ``background.task.failures{task=<task>}`` and shows the keys waiting in
  back-off as the gauge ``background.task.partitions.in.backoff{task=<task>}``.

Whole-round failures (the object store cannot be listed, the coordinator is down) go through
:meth:`TaskGuard.round` and get the same once-per-streak logging and back-off under the key
``ROUND``. Streaks of keys a round no longer visits (a deleted topic) are dropped at its end.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable, Hashable, TypeVar

if TYPE_CHECKING:
    from kcli.broker.metrics import Metrics

T = TypeVar("T")

BASE_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
FAILURES_METRIC = "background.task.failures"
BACKOFF_GAUGE = "background.task.partitions.in.backoff"
ROUND: Hashable = ("<round>",)


def metric_name(name: str, task: str) -> str:
    """Kafka-style tagged name, e.g. ``background.task.failures{task=tiered-copy}``."""
    return f"{name}{{task={task}}}"


@dataclass
class Streak:
    """A key that is failing: how often in a row, and when it may be tried again."""

    label: str
    failures: int
    retry_at: float  # monotonic seconds
    error: str


class TaskGuard:
    """Runs one background task's steps key by key; see the module docstring."""

    def __init__(self, task: str, metrics: "Metrics", logger: logging.Logger, *,
                 base_s: float = BASE_BACKOFF_S, max_s: float = MAX_BACKOFF_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.task = task
        self.metrics = metrics
        self.log = logger
        self.base_s = base_s
        self.max_s = max_s
        self.clock = clock
        self.streaks: dict[Hashable, Streak] = {}
        self._visited: set[Hashable] | None = None
        metrics.register_gauge(metric_name(BACKOFF_GAUGE, task), self.in_backoff)

    # ---- what callers use ------------------------------------------------------------------
    def ready(self, key: Hashable) -> bool:
        """False while ``key`` waits out its back-off (the caller skips it this round)."""
        if self._visited is not None:
            self._visited.add(key)
        s = self.streaks.get(key)
        return s is None or self.clock() >= s.retry_at

    async def step(self, key: Hashable, label: str, fn: Callable[[], Awaitable[T]]) -> T | None:
        """``await fn()`` for ``key`` unless it is backing off; None when skipped or failed."""
        if not self.ready(key):
            return None
        try:
            result = await fn()
        except Exception as err:  # noqa: BLE001 - isolated: logged, counted, backed off
            self.failed(key, label, err)
            return None
        self.succeeded(key)
        return result

    def step_sync(self, key: Hashable, label: str, fn: Callable[[], T]) -> T | None:
        """:meth:`step` for a synchronous step."""
        if not self.ready(key):
            return None
        try:
            result = fn()
        except Exception as err:  # noqa: BLE001
            self.failed(key, label, err)
            return None
        self.succeeded(key)
        return result

    async def round(self, fn: Callable[[], Awaitable[T]], label: str = "round") -> T | None:
        """One whole round: a failure outside any step is logged once per streak and backs off
        the next rounds; keys the round did not visit lose their streaks (they are gone)."""
        if not self.ready(ROUND):
            return None
        self._visited = set()
        try:
            result = await fn()
        except Exception as err:  # noqa: BLE001
            self.failed(ROUND, label, err)
            return None
        finally:
            visited, self._visited = self._visited, None
        for key in [k for k in self.streaks if k != ROUND and k not in visited]:
            del self.streaks[key]
        self.succeeded(ROUND)
        return result

    # ---- bookkeeping -------------------------------------------------------------------------
    def failed(self, key: Hashable, label: str, err: BaseException | str) -> None:
        """Record one failure of ``key`` (also for errors that come back as codes, not raises)."""
        text = err if isinstance(err, str) else (str(err) or type(err).__name__)
        self.metrics.inc(metric_name(FAILURES_METRIC, self.task))
        s = self.streaks.get(key)
        failures = 1 if s is None else s.failures + 1
        delay = min(self.max_s, self.base_s * (2 ** min(failures - 1, 30)))
        self.streaks[key] = Streak(label, failures, self.clock() + delay, text)
        exc_info = err if isinstance(err, BaseException) and self.log.isEnabledFor(logging.DEBUG) else None
        if s is None:
            self.log.warning("%s of %s failed, retrying in %.0f s with back-off: %s",
                             self.task, label, delay, text)
            if exc_info is not None:
                self.log.debug("%s of %s failed", self.task, label, exc_info=exc_info)
        else:
            self.log.debug("%s of %s failed again (%d in a row), next try in %.0f s: %s",
                           self.task, label, failures, delay, text, exc_info=exc_info)

    def succeeded(self, key: Hashable) -> None:
        s = self.streaks.pop(key, None)
        if s is not None:
            self.log.info("%s of %s recovered after %d failure(s)", self.task, s.label, s.failures)

    def failing(self, key: Hashable) -> bool:
        return key in self.streaks

    def retry_in(self, key: Hashable) -> float:
        """Seconds until ``key`` may run again (0 when it is not backing off)."""
        s = self.streaks.get(key)
        return 0.0 if s is None else max(0.0, s.retry_at - self.clock())

    def forget(self, key: Hashable) -> None:
        """Drop ``key``'s streak without a log line (its topic or task is gone)."""
        self.streaks.pop(key, None)

    def in_backoff(self) -> int:
        """Keys (partitions, topics; the round itself counts too) now failing."""
        return len(self.streaks)
