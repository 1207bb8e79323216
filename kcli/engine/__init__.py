"""Where heavy scans run: in kcli's own process ("local") or on PySpark ("spark").

``kcli dump-log`` over many objects and ``kcli diskless verify|gc`` cut their work into
per-object units that a picklable :class:`~kcli.engine.chunks.ChunkTask` knows how to do. The local
engine runs those units in this process; the Spark engine ships the same task object and the
object keys to executors (each opens its own storage from a URI), so both engines give identical
results by construction. ``auto`` picks Spark only where the cost lines measured by
bench/engine_crossover_bench.py say it wins for the scan's size and the master's cores (see
:mod:`kcli.engine.select`). Nothing here imports pyspark:
that happens in :mod:`spark_tasks` on first use, because Spark's cold start costs many seconds.
"""

from kcli.engine.chunks import ChunkTask, plan_chunks
from kcli.engine.run import run_task
from kcli.engine.select import DEFAULT_SPARK_MASTER, Choice, Engine, Workload, choose

__all__ = [
    "DEFAULT_SPARK_MASTER",
    "Choice",
    "ChunkTask",
    "Engine",
    "Workload",
    "choose",
    "plan_chunks",
    "run_task",
]
