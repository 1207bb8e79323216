"""The Spark engine on a real Spark standalone cluster: a master and two 1-core workers started
from pyspark's own ``spark-class`` on 127.0.0.1 (tests/spark_cluster.py), once per test session
and always torn down; and ``--engine auto`` weighing that master's cores.

The cluster job runs kcli in a subprocess: this pytest process may already hold the local[2]
session of tests/test_spark_engine.py (one SparkContext per process).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from kcli.engine import Engine, Workload, choose
from kcli.engine import select
from kcli.engine.cores import MasterCores, master_cores
from tests.fixtures_engine import Damaged, damaged_dataset, kcli_inproc

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def standalone() -> Iterator[object]:
    pytest.importorskip("pyspark")
    from tests.spark_cluster import StandaloneCluster

    cluster = StandaloneCluster(workers=2, cores=1, memory="1g").start(timeout=180)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def webui(standalone, monkeypatch) -> str:
    monkeypatch.setenv("SPARK_MASTER_WEBUI_PORT", str(standalone.webui_port))
    return standalone.master_url


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Damaged:
    return damaged_dataset(tmp_path_factory.mktemp("standalone-ds"), objects=10, object_bytes=128 << 10)


# ---- no Spark needed ---------------------------------------------------------------------------


def test_local_masters_name_their_cores_and_others_are_unknown():
    assert master_cores("local") == MasterCores(1, "local")
    assert master_cores("local[3]").cores == 3 and master_cores("local[4, 2]").cores == 4
    assert master_cores("local[*]").cores == os.cpu_count()
    assert master_cores("yarn").cores is None and master_cores("k8s://https://h:6443").cores is None


def test_auto_weighs_the_cores_of_the_master():
    verify = select.COSTS["verify"]
    few, many = verify.crossover_gib(2), verify.crossover_gib(64)
    assert many is not None and (few is None or few > many)  # more cores: Spark pays off sooner
    big = Workload("verify", 100_000, 400 << 30)
    on_two = choose("auto", big, "spark://h:7077", MasterCores(2, "two"))
    on_many = choose("auto", big, "spark://h:7077", MasterCores(64, "sixty-four"))
    assert on_two.engine is Engine.local and on_many.engine is Engine.spark
    assert "sixty-four; estimated local" in on_many.reason and "on 64 core(s)" in on_many.reason
    # Cores beyond the object count do not help: one object is one task.
    assert choose("auto", Workload("verify", 2, 400 << 30), "spark://h:7077", MasterCores(64, "x")).engine \
        is Engine.local
    assert choose("auto", Workload("verify", 10, 1 << 20), "local[64]").engine is Engine.local  # small input
    assert choose("auto", big, "local[64]").engine is Engine.spark
    unknown = choose("auto", big, "yarn")
    assert unknown.engine is Engine.local and "pass --engine spark" in unknown.reason
    for kind, cost in select.COSTS.items():  # every kind has a line; gc never gains from Spark
        assert cost.local_s(1) > 0 and cost.spark_s(1, 1) >= cost.spark_start_s, kind
    assert select.COSTS["gc"].crossover_gib(1024) is None


def test_an_unreachable_master_is_unknown_within_the_timeout(monkeypatch, damaged):
    from tests.spark_cluster import free_port

    monkeypatch.setenv("SPARK_MASTER_WEBUI_PORT", str(free_port()))
    start = time.monotonic()
    found = master_cores("spark://127.0.0.1:7077", timeout=1.0)
    assert found.cores is None and "could not ask the master" in found.source
    assert time.monotonic() - start < 5
    run = kcli_inproc("-v", "diskless", "verify", "--coordinator", damaged.ds.coordinator_uri,
                      "--spark-master", "spark://127.0.0.1:7077", "-o", "json")
    assert run.code == 1 and run.json()["objects_checked"] == 10 - len(damaged.marked)
    assert "engine: local: auto: " in run.err and "could not ask the master" in run.err, run.err


# ---- the real standalone cluster ---------------------------------------------------------------


@pytest.mark.spark
def test_master_cores_come_from_the_running_standalone_master(webui, standalone):
    found = master_cores(webui)
    assert found.cores == 2 == standalone.state()["cores"], found
    assert "2 core(s) on 2 alive worker(s)" in found.source
    assert master_cores(f"spark://10.255.255.1:7077,127.0.0.1:{standalone.port}", timeout=0.5).cores == 2  # HA list


@pytest.mark.spark
def test_auto_asks_the_real_master_and_says_what_it_weighed(webui, damaged):
    run = kcli_inproc("-v", "diskless", "verify", "--coordinator", damaged.ds.coordinator_uri,
                      "--spark-master", webui, "-o", "json")
    assert run.code == 1 and run.json()["objects_checked"] == 10 - len(damaged.marked)
    assert "engine: local: auto: " in run.err and "2 core(s) on 2 alive worker(s)" in run.err, run.err
    big = choose("auto", Workload("verify", 100_000, 400 << 30), webui)
    assert big.engine is Engine.local and "on 2 core(s)" in big.reason  # measured: 2 cores never win


@pytest.mark.spark
def test_dump_log_on_the_standalone_cluster_equals_the_local_engine(webui, standalone, damaged):
    """One real job on the cluster's executors (a fresh kcli process, its own SparkContext)."""
    wal = str(damaged.ds.objects_dir / "wal")
    before = {a["id"] for a in standalone.state()["completedapps"]}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "kcli", "dump-log", wal, "--coordinator",
                           damaged.ds.coordinator_uri, "--engine", "spark", "--spark-master", webui],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=400)
    local = kcli_inproc("dump-log", wal, "--coordinator", damaged.ds.coordinator_uri, "--engine", "local")
    assert proc.returncode == local.code == 1, proc.stderr[-2000:]  # the damaged objects fail the run
    assert proc.stdout == local.out and proc.stderr == local.err
    assert local.out.count(damaged.ds.objects_dir.as_posix()) >= 9
    apps = [a for a in standalone.state()["completedapps"] if a["id"] not in before]
    assert [(a["name"], a["state"], a["cores"]) for a in apps] == [("kcli", "FINISHED", 2)]
    work = list((Path(standalone.log_dir) / "work0").glob(f"{apps[0]['id']}/*/stderr")) + \
        list((Path(standalone.log_dir) / "work1").glob(f"{apps[0]['id']}/*/stderr"))
    assert len(work) == 2  # an executor on each worker
