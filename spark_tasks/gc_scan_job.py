"""``kcli diskless gc`` on Spark: the listed WAL objects are split across executors, which pick
the orphans (unknown to the coordinator, older than the grace period) and delete them unless
``--dry-run``. The coordinator's key set, which every task needs whole, travels once as a
broadcast variable instead of inside every task (kcli.ops.diskless.GcScanTask)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from spark_tasks.session import run_ordered

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from kcli.engine.progress import Progress
    from kcli.engine.chunks import ChunkTask


def run(spark: "SparkSession", task: "ChunkTask", items: Sequence[Any], sizes: Sequence[int],
        progress: "Progress") -> Iterator[Any]:
    known = spark.sparkContext.broadcast(task.known_keys)  # type: ignore[attr-defined]
    try:
        yield from run_ordered(spark, dataclasses.replace(task, known_keys=known), items, sizes, progress)
    finally:
        known.destroy()
