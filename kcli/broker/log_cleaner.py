"""The broker's log cleaner task: compacts classic partitions whose cleanup.policy includes compact.

Kafka's LogCleaner thread, as a broker extension: every ``log.cleaner.backoff.ms`` it offers each
local compacted log to :class:`kcli.storage.cleaner.LogCleaner` (which decides whether the log is
due: dirty ratio, max compaction lag, a tombstone's delete horizon). The pass itself reads and
rewrites segment files, so it runs in a worker thread; the event loop keeps serving. One
partition whose cleaning fails is logged once and backed off by a :class:`TaskGuard` (task
``log-cleaner``) while the others go on. ``log.cleaner.enable=false`` stops the passes; the dirty
ratio is still reported.

Metrics (``kcli broker metrics``): counters ``log.cleaner.runs``, ``log.cleaner.bytes.read``,
``log.cleaner.bytes.written``, ``log.cleaner.records.removed``; gauge
``log.cleaner.max.dirty.percent`` (Kafka's max-dirty-percent, as of the last round).
DescribeConfigs shows ``kcli.cleaner.dirty.ratio`` (``<partition>:<ratio>`` pairs) for a
compacted topic, which ``kcli topics describe`` prints per partition.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Callable

from kcli.broker.background import TaskGuard
from kcli.broker.extension import BrokerExtension
from kcli.storage.cleaner import LogCleaner

if TYPE_CHECKING:
    from kcli.broker.broker import Broker
    from kcli.metadata.metadata_log import TopicState

log = logging.getLogger("kcli.broker.log_cleaner")

DIRTY_RATIO_STATE_KEY = "kcli.cleaner.dirty.ratio"


class LogCleanerExtension(BrokerExtension):
    def __init__(self, broker: "Broker") -> None:
        super().__init__(broker)
        cfg = broker.config
        self.cleaner = LogCleaner.open(broker.data_dir, cfg.get_int("log.cleaner.dedupe.buffer.size"))
        self.enabled = cfg.get_bool("log.cleaner.enable")
        self.backoff_s = cfg.get_int("log.cleaner.backoff.ms") / 1000
        self.guard = TaskGuard("log-cleaner", broker.metrics, log)
        self.max_dirty_percent = 0.0
        self._task: asyncio.Task[None] | None = None
        self._running: asyncio.Future[Any] | None = None
        broker.metrics.register_gauge("log.cleaner.max.dirty.percent", lambda: round(self.max_dirty_percent, 2))

    async def start(self) -> None:
        if self.enabled:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="log-cleaner")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._running is not None:  # a pass in a worker thread finishes before the logs close
            await asyncio.gather(self._running, return_exceptions=True)

    def topic_deleted(self, topic: "TopicState") -> None:
        """A topic of that name created later starts with every offset dirty."""
        self.cleaner.forget({k for k in self.cleaner.checkpoints if k[0] != topic.name})

    def topic_state(self, topic: "TopicState") -> dict[str, str]:
        b = self.broker
        pairs = []
        now = _now_ms()
        for p in sorted(topic.partitions):
            lg = b.get_log(topic.name, p)
            if lg is None or not lg.config.compact:
                continue
            try:
                ratio = self.cleaner.dirty_ratio((topic.name, p), lg, now).ratio
            except Exception as err:  # noqa: BLE001 - a describe never fails for it
                log.debug("dirty ratio of %s-%d: %s", topic.name, p, err)
                continue
            pairs.append(f"{p}:{ratio:.4f}")
        return {DIRTY_RATIO_STATE_KEY: ",".join(pairs)} if pairs else {}

    # ---- the task ------------------------------------------------------------------------------
    async def _loop(self) -> None:
        while not self.broker.stopping:
            await asyncio.sleep(self.backoff_s)
            await self.guard.round(self.run_round, "cleaner round")

    def _compacted_logs(self) -> list[tuple[tuple[str, int], Any]]:
        b = self.broker
        out = []
        for key, lg in list(b.logs.items()):
            t = b.topic(key[0])
            if t is None or not lg.config.compact or b.topic_kind(t) != "classic":
                continue
            out.append((key, lg))
        return out

    async def run_round(self) -> int:
        """Offer every compacted log to the cleaner once; returns the passes made."""
        logs = self._compacted_logs()
        self.cleaner.forget(set(self.broker.logs))
        passes = 0
        worst = 0.0
        for key, lg in logs:
            if self.broker.stopping:
                break
            result = await self.guard.step(
                key, f"{key[0]}-{key[1]}", lambda k=key, lg=lg: self._in_thread(self.cleaner.clean, k, lg, _now_ms()))
            if result is not None:
                passes += 1
                result.count(self.broker.metrics, "log.cleaner")
                worst = max(worst, result.ratio)
        self.max_dirty_percent = 100.0 * worst
        return passes

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        fut = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        self._running = fut
        try:
            return await asyncio.shield(fut)
        finally:
            if fut.done():
                self._running = None


def _now_ms() -> int:
    return int(time.time() * 1000)
