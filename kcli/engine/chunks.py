"""The unit of work both engines run, and how items are cut into Spark partitions.

Kept apart from :mod:`kcli.engine.run` so that :mod:`spark_tasks` (which run imports lazily to
reach Spark) can use the contract without importing run back: imports flow run → spark_tasks → chunks.
"""

from __future__ import annotations

import abc
import math
from typing import Any, ClassVar, Sequence

CHUNK_TARGET_BYTES = 64 << 20  # per Spark partition: big enough to amortise a task's overhead
CHUNK_MAX_ITEMS = 2000
CHUNKS_PER_CORE = 4  # several partitions per core so a slow object does not idle the others


class ChunkTask(abc.ABC):
    """One kind of per-item work. Subclasses are dataclasses of plain values (they are pickled)."""

    job: ClassVar[str]  # the spark_tasks module that runs it: "verify", "gc_scan", "dump_log"
    local_threads: ClassVar[int] = 1  # >1: the local engine overlaps I/O with a thread pool
    spark_wave_per_core: ClassVar[int] = 8  # partitions per core per Spark job (results held at once)

    def open(self) -> Any:
        """Per-worker resources, made where the work runs (never shipped)."""
        return None

    @abc.abstractmethod
    def run(self, resource: Any, item: Any) -> Any:
        """Do one item; must not raise for bad data (report it in the result)."""

    def run_chunk(self, resource: Any, items: Sequence[Any]) -> list[Any]:
        """Do consecutive items, one result each; override to batch storage calls."""
        return [self.run(resource, item) for item in items]

    def close(self, resource: Any) -> None:
        """Release what ``open`` made."""


def plan_chunks(sizes: Sequence[int], parallelism: int, *, target_bytes: int = CHUNK_TARGET_BYTES,
                max_items: int = CHUNK_MAX_ITEMS) -> list[range]:
    """Cut items (in order) into contiguous ranges of about equal bytes: Spark's partitions."""
    n = len(sizes)
    if n == 0:
        return []
    total = sum(max(s, 1) for s in sizes)
    want = max(parallelism * CHUNKS_PER_CORE, math.ceil(total / target_bytes), math.ceil(n / max_items))
    want = min(want, n)
    per = total / want
    chunks: list[range] = []
    start = acc = 0
    for i, s in enumerate(sizes):
        acc += max(s, 1)
        if i + 1 < n and (acc >= per * (len(chunks) + 1) or i + 1 - start >= max_items):
            chunks.append(range(start, i + 1))
            start = i + 1
    chunks.append(range(start, n))
    return chunks
