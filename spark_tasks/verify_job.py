"""``kcli diskless verify`` on Spark: object keys and their committed batch coordinates go to
executors; each task opens its own ObjectStorage from the store URI (boto3 for S3: this pyspark
has no hadoop-aws jars, and the storage plugin is the one code path that reads WAL objects) and
checks every batch's range and CRC (kcli.ops.diskless.VerifyTask)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Sequence

from spark_tasks.session import run_ordered

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from kcli.engine.progress import Progress
    from kcli.engine.chunks import ChunkTask


def run(spark: "SparkSession", task: "ChunkTask", items: Sequence[Any], sizes: Sequence[int],
        progress: "Progress") -> Iterator[Any]:
    return run_ordered(spark, task, items, sizes, progress)
