"""The one SparkSession a kcli process uses, created on first need, quiet, and the ordered runner.

Spark's cold start (JVM, SparkContext, Python workers) costs 10-30 s on a quiet host, so the
session is created lazily, once per process, and reused by every job (tests share it through a
session-scoped fixture). It is made quiet: no console progress bar, log level ERROR from the
first line on (a log4j2 file, not just setLogLevel, which comes too late for start-up warnings),
the JVM's own stdout/stderr go to /dev/null (or to stderr with ``-v``) so nothing Spark prints
can land in kcli's stdout, and py4j's Python logging is silenced.

Local masters also get JVM flags that halve the cold start on small hosts (C1-only JIT, serial
GC: the driver JVM only moves bytes between Python processes here) and bind to 127.0.0.1.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from kcli.errors import OperationError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from kcli.engine.progress import Progress
    from kcli.engine.chunks import ChunkTask

LOCAL_JVM_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
SHIPPED_ENV_PREFIXES = ("AWS_",)  # object-store settings executors need (local masters only)
PACKAGES = ("kcli", "plugins", "spark_tasks")

_LOG4J2 = """\
status = error
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = spark: %p %c{1}: %m%n
"""

_lock = threading.Lock()
_session: "SparkSession | None" = None
_master: str | None = None
_tmpdir: str | None = None


class SparkJobError(OperationError):
    """A Spark job failed; the message is the task's Python error, on one line."""


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def get_session(master: str = "local[*]", *, verbose: bool = False) -> "SparkSession":
    """The process's SparkSession, created on first call. A later call with another master gets
    the existing session (one SparkContext per JVM); ``active_master()`` tells which."""
    global _session, _master
    with _lock:
        if _session is not None and _session.sparkContext._jsc is not None:
            return _session
        _session = _create(master, verbose)
        _master = master
        return _session


def active_master() -> str | None:
    return _master if _session is not None else None


def stop() -> None:
    """Stop the session (tests and benchmarks; a CLI run just exits)."""
    global _session, _master
    with _lock:
        if _session is not None:
            _session.stop()
        _session = None
        _master = None


def _create(master: str, verbose: bool) -> "SparkSession":
    logging.getLogger("py4j").setLevel(logging.ERROR)
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    local = is_local(master)
    conf = SparkConf().setMaster(master).setAppName("kcli")
    conf.set("spark.ui.showConsoleProgress", "false")
    conf.set("spark.ui.enabled", "false")
    conf.set("spark.python.worker.reuse", "true")
    java_options = f"-Dlog4j2.configurationFile={_log4j2_file()}"
    if local:
        java_options = f"{LOCAL_JVM_OPTIONS} {java_options}"
        conf.set("spark.driver.host", "127.0.0.1")
        conf.set("spark.driver.bindAddress", "127.0.0.1")
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Workers run this interpreter (PySpark's default is whatever "python3" is on PATH,
        # which in a virtualenv may lack kcli's dependencies).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf.set("spark.driver.extraJavaOptions", java_options)
    sink: Any = 2 if verbose else subprocess.DEVNULL  # never our stdout
    gateway = launch_gateway(conf, popen_kwargs={"stdout": sink, "stderr": sink})
    root = str(Path(__file__).resolve().parents[1])
    sc = SparkContext(conf=conf, gateway=gateway, environment={"PYTHONPATH": root})
    sc.setLogLevel("ERROR")
    if not local:
        sc.addPyFile(_package_zip())
    return SparkSession(sc)


def _scratch() -> str:
    global _tmpdir
    if _tmpdir is None:
        import atexit
        import shutil

        _tmpdir = tempfile.mkdtemp(prefix="kcli-spark-")
        atexit.register(shutil.rmtree, _tmpdir, True)
    return _tmpdir


def _log4j2_file() -> str:
    path = os.path.join(_scratch(), "log4j2.properties")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(_LOG4J2)
    return path


def _package_zip() -> str:
    """kcli, plugins and spark_tasks as one zip for executors of a cluster master."""
    root = Path(__file__).resolve().parents[1]
    path = os.path.join(_scratch(), "kcli-packages.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for package in PACKAGES:
            for file in sorted((root / package).rglob("*.py")):
                z.write(file, file.relative_to(root).as_posix())
    return path


# -- running a task ----------------------------------------------------------------------------


def shipped_env(master: str) -> dict[str, str] | None:
    """Object-store settings to apply in executors. Local masters share this host, so the
    driver's current AWS_* settings are exactly right (workers outlive a single command in
    tests, and may have started with other ones); a cluster's executors use their own."""
    if not is_local(master):
        return None
    return {k: v for k, v in os.environ.items() if k.startswith(SHIPPED_ENV_PREFIXES)}


def _apply_env(env: dict[str, str] | None) -> None:
    if env is None:
        return
    for key in [k for k in os.environ if k.startswith(SHIPPED_ENV_PREFIXES) and k not in env]:
        del os.environ[key]
    os.environ.update(env)


def partition_runner(task: "ChunkTask", env: dict[str, str] | None) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The function each Spark partition runs: open the task's resources, run every item."""

    def run_partition(chunks: Iterator[list[Any]]) -> Iterator[Any]:
        _apply_env(env)
        resource = task.open()
        try:
            for chunk in chunks:
                yield from task.run_chunk(resource, chunk)
        finally:
            task.close(resource)

    return run_partition


def run_task(task: "ChunkTask", items: Sequence[Any], sizes: Sequence[int], master: str,
             progress: "Progress", verbose: bool = False) -> Iterator[Any]:
    """Start (or reuse) the session, then hand the task to its job module (spark_tasks.<job>_job)."""
    import importlib

    label = progress.description
    progress.status(f"starting Spark ({master})…")
    spark = get_session(master, verbose=verbose)
    progress.status(label)
    if verbose and active_master() != master:
        sys.stderr.write(f"kcli: reusing this process's Spark session on {active_master()}\n")
    job = importlib.import_module(f"spark_tasks.{task.job}_job")
    return job.run(spark, task, items, sizes, progress)


def run_ordered(spark: "SparkSession", task: "ChunkTask", items: Sequence[Any], sizes: Sequence[int],
                progress: "Progress") -> Iterator[Any]:
    """Run ``task`` over ``items`` as byte-balanced partitions; yield results in item order.

    Partitions run in waves of ``task.spark_wave_per_core`` per core (one runJob each, the next
    wave already running while this one's results are handed out): tasks with small results
    (verify, gc) take all partitions in one or few jobs, dump-log's large text results never
    have to fit in the driver at once. The progress bar follows completed Spark tasks."""
    import uuid

    from kcli.engine.chunks import plan_chunks

    sc = spark.sparkContext
    parallelism = max(1, sc.defaultParallelism)
    ranges = plan_chunks(sizes, parallelism)
    chunks = [[items[i] for i in r] for r in ranges]
    rdd = sc.parallelize(chunks, len(chunks))
    runner = partition_runner(task, shipped_env(active_master() or "local"))
    wave = max(1, parallelism * task.spark_wave_per_core)
    waves = [list(range(i, min(i + wave, len(chunks)))) for i in range(0, len(chunks), wave)]

    def run_wave(partitions: list[int], group: str) -> list[Any]:
        sc.setJobGroup(group, f"kcli {task.job}", interruptOnCancel=True)  # thread-local in PySpark
        try:
            return sc.runJob(rdd, runner, partitions)
        except Exception as err:  # noqa: BLE001 - Py4JJavaError and friends: one line for the CLI
            raise SparkJobError(_job_error(err)) from None

    done = 0
    with ThreadPoolExecutor(1, thread_name_prefix="kcli-spark-wave") as pool:
        groups = [f"kcli-{task.job}-{uuid.uuid4().hex[:8]}-{i}" for i in range(len(waves))]
        pending = pool.submit(run_wave, waves[0], groups[0])
        for index, partitions in enumerate(waves):
            per_task = sum(len(chunks[p]) for p in partitions) / len(partitions)
            while not _wait(pending, 0.5):
                progress.set_completed(done + int(_completed_tasks(sc, groups[index]) * per_task))
            results = pending.result()
            if index + 1 < len(waves):
                pending = pool.submit(run_wave, waves[index + 1], groups[index + 1])
            done += len(results)
            progress.set_completed(done)
            yield from results


def _wait(future: Any, timeout: float) -> bool:
    from concurrent.futures import wait

    return bool(wait([future], timeout=timeout).done)


def _completed_tasks(sc: Any, group: str) -> int:
    """Finished Spark tasks of a job group (for the progress bar; 0 if Spark cannot tell)."""
    try:
        tracker = sc.statusTracker()
        total = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job else ():
                stage = tracker.getStageInfo(stage_id)
                total += stage.numCompletedTasks if stage else 0
        return total
    except Exception:  # noqa: BLE001 - progress only
        return 0


def _job_error(err: BaseException) -> str:
    """The last line of the Python traceback a failed task sent back, else the first line."""
    text = str(err)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if not line.startswith(("at ", "...", "Caused by", "Driver stacktrace")) and ":" in line \
                and not line.startswith(("File ", "org.apache", "java.")):
            return f"Spark job failed: {line}"
    return f"Spark job failed: {lines[0] if lines else type(err).__name__}"


