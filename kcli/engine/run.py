"""Running one picklable task over many items on the chosen engine, results in item order.

A :class:`ChunkTask` is the contract between a command and the engines: ``open`` makes the
per-worker resources (an ObjectStorage from a URI, a coordinator lookup), ``run`` does one item,
``close`` releases. The local engine calls it in this process (optionally on a few threads, to
overlap object-store I/O); the Spark engine pickles the same task to executors and calls it per
partition. Results always come back in item order, so output does not depend on the engine.
"""

from __future__ import annotations

import abc
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Iterator, Sequence

from kcli.engine.progress import NoProgress, Progress
from kcli.engine.select import Choice, Engine

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


def run_task(task: ChunkTask, items: Sequence[Any], sizes: Sequence[int], choice: Choice,
             progress: Progress | None = None, *, verbose: bool = False) -> Iterator[Any]:
    """Yield ``task.run(item)`` for every item, in order, on ``choice.engine``."""
    progress = progress or NoProgress()
    if not items:
        return iter(())
    if choice.engine is Engine.spark:
        from spark_tasks import session

        return session.run_task(task, items, sizes, choice.master, progress, verbose)
    return _run_local(task, items, sizes, progress)


def _run_local(task: ChunkTask, items: Sequence[Any], sizes: Sequence[int], progress: Progress) -> Iterator[Any]:
    resource = task.open()
    try:
        if task.local_threads > 1 and len(items) > 1:
            with ThreadPoolExecutor(task.local_threads, thread_name_prefix=f"kcli-{task.job}") as pool:
                for result in pool.map(lambda item: task.run(resource, item), items):
                    progress.advance()
                    yield result
        else:
            for chunk in plan_chunks(sizes, 1):
                results = task.run_chunk(resource, [items[i] for i in chunk])
                for result in results:
                    progress.advance()
                    yield result
    finally:
        task.close(resource)
