"""Running one picklable task over many items on the chosen engine, results in item order.

A :class:`ChunkTask` is the contract between a command and the engines: ``open`` makes the
per-worker resources (an ObjectStorage from a URI, a coordinator lookup), ``run`` does one item,
``close`` releases. The local engine calls it in this process (optionally on a few threads, to
overlap object-store I/O); the Spark engine pickles the same task to executors and calls it per
partition. Results always come back in item order, so output does not depend on the engine.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Sequence

from kcli.engine.chunks import ChunkTask, plan_chunks
from kcli.engine.progress import NoProgress, Progress
from kcli.engine.select import Choice, Engine

__all__ = ["ChunkTask", "plan_chunks", "run_task"]


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
