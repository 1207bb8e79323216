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

from kcli.errors import OperationError, UsageError

DEFAULT_SPARK_MASTER = "local[*]"


class Engine(str, Enum):
    auto = "auto"
    local = "local"
    spark = "spark"


@dataclass(frozen=True)
class Threshold:
    """Spark runs under ``auto`` only when BOTH limits are reached (None: never)."""

    min_bytes: int | None
    min_objects: int


GiB = 1 << 30
MiB = 1 << 20

# Measured with bench/engine_crossover_bench.py, full run (0.5 .. 10 GiB of 4 MiB WAL objects on the
# local filesystem, end to end, cold Spark start in every Spark run) on 2026-11-22, on the 2-vCPU
# host kcli is developed on (load average 5-10 from other test suites). Spark (local[*]) lost at
# every size for every kind; at 10 GiB: verify 18 s local vs 59 s Spark, gc --dry-run 1.0 vs 37,
# dump-log 12 vs 35, dump-log --deep-iteration 134 vs 237. Its per-GiB cost was not lower either
# (verify 1.8 vs 1.9 s/GiB, deep dump 12.4 vs 17.2 s/GiB): with two cores the local engine already
# uses both (verify) and Spark pays for shipping output to the driver (dump-log), so no size makes
# Spark win on such a host and auto stays local (None). Table and how to re-measure on bigger
# hosts: docs/spark-engine.md.
THRESHOLDS: dict[str, Threshold] = {
    "verify": Threshold(min_bytes=None, min_objects=0),
    "gc": Threshold(min_bytes=None, min_objects=0),
    "dump-log": Threshold(min_bytes=None, min_objects=0),
    "dump-log-deep": Threshold(min_bytes=None, min_objects=0),
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


def choose(requested: Engine | str | None, work: Workload, master: str | None = None) -> Choice:
    """The engine to run ``work`` on, with the reason ``-v`` prints."""
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
    limit = THRESHOLDS.get(work.kind, Threshold(None, 0))
    if limit.min_bytes is None:
        return Choice(Engine.local, f"auto: {size}; Spark never beat the local engine for {work.kind} in the "
                                    "crossover bench", master)
    if work.bytes < limit.min_bytes or work.objects < limit.min_objects:
        return Choice(Engine.local, f"auto: {size} is below the Spark threshold for {work.kind} "
                                    f"({human_bytes(limit.min_bytes)} and {limit.min_objects} objects)", master)
    if not spark_available():
        return Choice(Engine.local, f"auto: {size} is above the Spark threshold for {work.kind}, "
                                    "but pyspark is not installed", master)
    return Choice(Engine.spark, f"auto: {size} reaches the Spark threshold for {work.kind} "
                                f"({human_bytes(limit.min_bytes)} and {limit.min_objects} objects)", master)
