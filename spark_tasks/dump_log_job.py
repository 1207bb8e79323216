"""``kcli dump-log`` over many files or objects on Spark: each task reopens its inputs by name
(a local path, or s3://bucket/key through the S3 storage plugin) and runs dump-log's pure
per-file function; output comes back per file, in argument order, and the driver prints it as
the local engine would (kcli.engine.dump.DumpTask). With ``--coordinator``, each task opens the
SQLite coordinator read-only itself: on a cluster master that path must be readable on the
executors (a shared filesystem)."""

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
