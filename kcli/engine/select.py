"""Choosing the engine: ``--engine auto|local|spark``, and the measured costs ``auto`` weighs.

A kcli command that uses Spark pays Spark's cold start every time (JVM, SparkContext, Python
workers), so Spark only pays off when the master has enough cores and the scan is long enough
for them to win that time back. ``auto`` compares the two engines' measured time lines (below;
bench/engine_crossover_bench.py, end to end, cold start included) for the scan's size and the
master's cores (kcli.engine.cores); docs/spark-engine.md has the tables and how to re-measure.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from enum import Enum

from kcli.engine.cores import MasterCores, master_cores
from kcli.errors import OperationError, UsageError

DEFAULT_SPARK_MASTER = "local[*]"


class Engine(str, Enum):
    auto = "auto"
    local = "local"
    spark = "spark"


@dataclass(frozen=True)
class Cost:
    """Measured end-to-end seconds of one workload kind on each engine, as straight lines.

    The local engine: ``local_start_s + GiB * local_s_per_gib``. Spark: its cold start plus,
    per GiB, the executors' core-seconds shared by the master's cores (tasks are independent
    per object, so they spread over cores) and a serial part in the driver that more cores do
    not shorten (dump-log's text all passes through the driver). ``auto`` picks Spark where its
    line is below the local one for the master's cores."""

    local_start_s: float
    local_s_per_gib: float
    spark_start_s: float
    spark_core_s_per_gib: float
    spark_driver_s_per_gib: float = 0.0

    def local_s(self, gib: float) -> float:
        return self.local_start_s + gib * self.local_s_per_gib

    def spark_s(self, gib: float, cores: int) -> float:
        return self.spark_start_s + gib * (self.spark_driver_s_per_gib + self.spark_core_s_per_gib / max(1, cores))

    def crossover_gib(self, cores: int) -> float | None:
        """The size from which Spark on ``cores`` cores is faster (None: never)."""
        gain = self.local_s_per_gib - self.spark_driver_s_per_gib - self.spark_core_s_per_gib / max(1, cores)
        if gain <= 0:
            return None
        return max(0.0, (self.spark_start_s - self.local_start_s) / gain)


GiB = 1 << 30
MiB = 1 << 20

# Measured with bench/engine_crossover_bench.py --spark-master spark://… on 2026-11-27: a Spark
# standalone cluster on 127.0.0.1 (a master, 2 workers x 1 core, 1 GiB each), 4 MiB WAL objects on
# the local filesystem, end to end with Spark's cold start, on the 2-vCPU development host (load
# average 6-9 from other suites). Lines through the 0.5 and 4 GiB points (verify, dump-log,
# dump-log-deep) and the 0.25 and 1 GiB points (gc); Spark's per-GiB time on 2 cores, doubled, is
# its core-seconds per GiB. Where Spark's slope could not be read (<= 0: its cold start varies more
# than the work costs): gc --dry-run reads no object bytes, so Spark has nothing to spread over
# cores; dump-log --deep-iteration ships every printed line through the driver (1.2 GB of text
# for 4 GiB), which alone is the local engine's whole per-GiB cost, so it is a driver cost and
# Spark never wins it. Table and how to re-measure: docs/spark-engine.md.
COSTS: dict[str, Cost] = {
    "verify": Cost(local_start_s=1.0, local_s_per_gib=1.4, spark_start_s=48.9, spark_core_s_per_gib=17.8),
    "gc": Cost(local_start_s=1.4, local_s_per_gib=0.0, spark_start_s=62.1, spark_core_s_per_gib=0.0),
    "dump-log": Cost(local_start_s=1.8, local_s_per_gib=1.2, spark_start_s=60.6, spark_core_s_per_gib=7.2),
    "dump-log-deep": Cost(local_start_s=2.0, local_s_per_gib=1.2, spark_start_s=124.3, spark_core_s_per_gib=0.0,
                          spark_driver_s_per_gib=1.2),
}


@dataclass(frozen=True)
class Workload:
    """How much a command is about to scan (what ``auto`` decides on)."""

    kind: str  # "verify" | "gc" | "dump-log" | "dump-log-deep" (--deep-iteration / --print-data-log)
    objects: int
    bytes: int
    bytes_estimated: bool = False


@dataclass(frozen=True)
class Choice:
    engine: Engine
    reason: str
    master: str = DEFAULT_SPARK_MASTER

    def describe(self) -> str:
        where = f" ({self.master})" if self.engine is Engine.spark else ""
        return f"engine: {self.engine.value}{where}: {self.reason}"


def spark_available() -> bool:
    return importlib.util.find_spec("pyspark") is not None


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def choose(requested: Engine | str | None, work: Workload, master: str | None = None,
           cores: MasterCores | None = None) -> Choice:
    """The engine to run ``work`` on, with the reason ``-v`` prints. ``auto`` weighs the cores
    of ``master`` (asked via :func:`kcli.engine.cores.master_cores` unless given)."""
    try:
        engine = Engine(requested or Engine.auto)
    except ValueError:
        raise UsageError(f"--engine must be auto, local or spark, got {requested!r}") from None
    master = master or DEFAULT_SPARK_MASTER
    size = f"{human_bytes(work.bytes)}{' (estimated)' if work.bytes_estimated else ''} in {work.objects} object(s)"
    if engine is Engine.local:
        return Choice(Engine.local, f"--engine local; {size}", master)
    if engine is Engine.spark:
        if not spark_available():
            raise OperationError("--engine spark needs pyspark: pip install 'kcli-kafka[spark]'")
        return Choice(Engine.spark, f"--engine spark; {size}", master)
    cost = COSTS.get(work.kind)
    if cost is None:
        return Choice(Engine.local, f"auto: no measured costs for {work.kind}", master)
    cores = cores or master_cores(master)
    if cores.cores is None:
        return Choice(Engine.local, f"auto: {size}; {cores.source}; pass --engine spark to use it", master)
    usable = max(1, min(cores.cores, work.objects))  # one object is one task: no more cores than objects
    gib = work.bytes / GiB
    local_s, spark_s = cost.local_s(gib), cost.spark_s(gib, usable)
    at = cost.crossover_gib(usable)
    where = (f"Spark never beats the local engine for {work.kind} on {usable} core(s)" if at is None
             else f"Spark wins for {work.kind} from {at:.1f} GiB on {usable} core(s)")
    why = f"auto: {size}; {cores.source}; estimated local {local_s:.0f} s, Spark {spark_s:.0f} s ({where})"
    if spark_s >= local_s:
        return Choice(Engine.local, why, master)
    if not spark_available():
        return Choice(Engine.local, f"{why}, but pyspark is not installed", master)
    return Choice(Engine.spark, why, master)
