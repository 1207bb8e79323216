"""The engines behind ``--engine auto|local|spark``: selection, chunking, and the Spark engine
giving exactly the local engine's results for verify, gc --dry-run and dump-log over many objects
(local files and S3 through moto's server).

Every Spark test shares ONE session (the session-scoped ``spark`` fixture; kcli commands run in
this process and reuse it): Spark's cold start is 10-30 s here, each job after it about a second.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterator

import pytest

from kcli.engine import Choice, ChunkTask, Engine, Workload, choose, plan_chunks, run_task
from kcli.engine import select
from kcli.errors import OperationError, UsageError
from tests.diskless_helpers import CODECS, DISKLESS, FAST
from tests.fixtures_engine import Damaged, damaged_dataset, kcli_inproc, without_ages
from tests.fixtures_s3 import moto_server, s3_bucket, s3_env  # noqa: F401 - fixtures
from tests.kafka_helpers import create_topic, produce

# ---- no Spark needed ---------------------------------------------------------------------------


def test_plan_chunks_are_contiguous_cover_everything_and_balance_bytes():
    sizes = [10] * 50 + [1000] * 5 + [10] * 45
    chunks = plan_chunks(sizes, 2, target_bytes=500)
    assert [i for r in chunks for i in r] == list(range(100))
    assert all(len(r) for r in chunks)
    weights = [sum(sizes[i] for i in r) for r in chunks]
    assert max(weights) <= 1000 + 500  # one big object may stand alone, nothing piles up
    assert len(plan_chunks([1] * 3, 8)) == 3  # never more chunks than items
    assert plan_chunks([], 4) == []
    assert all(len(r) <= 7 for r in plan_chunks([1] * 100, 1, max_items=7))


def test_choose_local_spark_and_auto_costs(monkeypatch):
    small = Workload("verify", 10, 10 << 20)
    assert choose("local", small).engine is Engine.local
    forced = choose("spark", small, "local[2]")
    assert forced.engine is Engine.spark and forced.master == "local[2]" and "--engine spark" in forced.reason
    with pytest.raises(UsageError):
        choose("turbo", small)
    # Spark costs 10 s to start and 1 core-second per GiB; local 1 s per GiB.
    monkeypatch.setitem(select.COSTS, "verify", select.Cost(0.0, 1.0, 10.0, 1.0))
    assert select.COSTS["verify"].crossover_gib(2) == pytest.approx(20.0)
    assert select.COSTS["verify"].crossover_gib(1) is None
    assert choose("auto", small, "local[2]").engine is Engine.local
    assert "estimated local 0 s, Spark 10 s (Spark wins for verify from 20.0 GiB on 2 core(s))" in \
        choose("auto", small, "local[2]").reason
    assert choose("auto", Workload("verify", 1, 40 << 30), "local[2]").engine is Engine.local  # one object: 1 core
    big = choose("auto", Workload("verify", 600, 40 << 30), "local[2]")
    assert big.engine is Engine.spark and "local[2]; estimated local 40 s, Spark 30 s" in big.reason
    monkeypatch.setattr(select, "spark_available", lambda: False)
    assert choose("auto", Workload("verify", 600, 40 << 30), "local[2]").engine is Engine.local
    with pytest.raises(OperationError, match="pyspark"):
        choose("spark", small)


def test_costs_cover_every_workload_kind():
    assert set(select.COSTS) == {"verify", "gc", "dump-log", "dump-log-deep"}
    for cost in select.COSTS.values():
        assert cost.spark_start_s > cost.local_start_s >= 0  # Spark's cold start is never free


def test_kcli_import_does_not_import_pyspark():
    import subprocess
    import sys

    code = ("import sys, kcli.cli.app, kcli.ops.diskless, kcli.engine, kcli.engine.dump; "
            "print('pyspark' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# ---- one shared Spark session ------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from spark_tasks import session

    yield session.get_session("local[2]")
    session.stop()


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Damaged:
    return damaged_dataset(tmp_path_factory.mktemp("spark-ds"), objects=12, object_bytes=192 << 10)


def both_engines(*args: str) -> tuple[Any, Any]:
    local = kcli_inproc(*args, "--engine", "local")
    spark_run = kcli_inproc(*args, "--engine", "spark")
    return local, spark_run


@pytest.mark.spark
def test_verify_spark_equals_local_and_finds_every_damage(spark, damaged):
    local, on_spark = both_engines("diskless", "verify", "--coordinator", damaged.ds.coordinator_uri, "-o", "json")
    assert local.code == on_spark.code == 1, (local.err, on_spark.err)
    assert without_ages(on_spark.json()) == without_ages(local.json())
    doc = local.json()
    assert doc["objects_checked"] == 12 - len(damaged.marked)
    found = {(p["object_key"], p.get("byte_offset"), p["problem"].split(" ")[0]) for p in doc["problems"]}
    assert (damaged.crc_key, damaged.crc_offset, "CRC-32C") in found
    assert (damaged.missing_key, None, "missing") in found
    assert (damaged.short_key, None, "size") in found
    assert {o["object_key"] for o in doc["orphans"]} == set(damaged.old_orphans) | {damaged.young_orphan}
    assert on_spark.err.strip().endswith("kcli: error: verify found "
                                         f"{len(doc['problems'])} problem(s) in 3 object(s)")


@pytest.mark.spark
def test_gc_dry_run_spark_equals_local(spark, damaged):
    local, on_spark = both_engines("diskless", "gc", "--dry-run", "--grace-ms", "1000",
                                   "--coordinator", damaged.ds.coordinator_uri, "-o", "json")
    assert local.code == on_spark.code == 0, (local.err, on_spark.err)
    assert on_spark.json() == local.json()
    doc = local.json()
    assert doc["orphans"] == damaged.old_orphans  # the young one is inside the grace period
    assert sorted(doc["deleted"] + doc["waiting"]) == sorted(damaged.marked)
    assert doc["orphans_bytes"] == sum(damaged.ds.path(k).stat().st_size for k in damaged.old_orphans)
    assert all(damaged.ds.path(k).exists() for k in damaged.old_orphans + damaged.marked)


@pytest.mark.spark
def test_dump_log_over_many_objects_spark_equals_local(spark, damaged):
    wal = str(damaged.ds.objects_dir / "wal")
    for pre, post in (((), ()), (("-o", "json"), ("--deep-iteration",))):
        local, on_spark = both_engines(*pre, "dump-log", wal, "--coordinator", damaged.ds.coordinator_uri, *post)
        assert local.code == on_spark.code == 1  # the damaged objects make the run fail
        assert on_spark.out == local.out and on_spark.err == local.err
        assert local.out.count(damaged.ds.objects_dir.as_posix()) >= 11
    first = json.loads(on_spark.out.splitlines()[0])
    assert first["type"] == "file" and first["kind"] == "wal"
    assert "isvalid: false" in kcli_inproc("dump-log", wal, "--engine", "spark").out


@pytest.mark.spark
def test_broker_written_objects_spark_equals_local(spark, broker_factory):
    """Objects a real broker wrote (every codec, idempotent producer), read offline after it stopped."""
    b = broker_factory({**FAST, "diskless.file.cleaner.interval.ms": "600000"})
    create_topic(b.bootstrap, "s", 3, DISKLESS)
    for codec in CODECS:
        produce(b.bootstrap, "s", [f"{codec}-{i}".encode() * 3 for i in range(60)],
                **{"compression.type": codec, "enable.idempotence": True})
    assert b.stop() == 0
    coord = ("--coordinator", f"sqlite://{b.data_dir / 'diskless' / 'coordinator.db'}")
    local, on_spark = both_engines("diskless", "verify", *coord, "-o", "json")
    assert local.code == on_spark.code == 0, (local.err, on_spark.err)
    assert without_ages(on_spark.json()) == without_ages(local.json())
    assert local.json()["objects_checked"] == len(CODECS) and local.json()["batches_checked"] >= len(CODECS)
    local, on_spark = both_engines("diskless", "gc", "--dry-run", "--grace-ms", "0", *coord, "-o", "json")
    assert on_spark.json() == local.json() and local.json()["orphans"] == []
    wal = str(b.data_dir / "objects" / "wal")
    local, on_spark = both_engines("dump-log", wal, *coord, "--print-data-log")
    assert local.code == on_spark.code == 0, (local.err, on_spark.err)
    assert on_spark.out == local.out and on_spark.out.count("| offset: ") == 60 * len(CODECS)
    assert "compresscodec: zstd" in on_spark.out and "topic: s partition:" in on_spark.out


@pytest.mark.spark
def test_s3_store_read_by_executors_through_boto3(spark, damaged, tmp_path, s3_bucket):
    """Executors get object keys and open the store from its URI; the AWS settings of this
    test (set after the shared session started) reach them."""
    import boto3

    s3 = boto3.client("s3")
    for path in sorted((damaged.ds.objects_dir / "wal").iterdir()):
        s3.put_object(Bucket=s3_bucket, Key=f"p/wal/{path.name}", Body=path.read_bytes())
    store = ("--object-store", f"s3://{s3_bucket}/p")
    local, on_spark = both_engines("diskless", "verify", "--coordinator", damaged.ds.coordinator_uri, *store,
                                   "-o", "json")
    assert local.code == on_spark.code == 1, on_spark.err
    assert without_ages(on_spark.json()) == without_ages(local.json())
    on_disk = kcli_inproc("diskless", "verify", "--coordinator", damaged.ds.coordinator_uri, "-o", "json").json()
    assert on_spark.json()["problems"] == on_disk["problems"]
    local_gc, spark_gc = both_engines("diskless", "gc", "--dry-run", "--grace-ms", "0", "--coordinator",
                                      damaged.ds.coordinator_uri, *store, "-o", "json")
    assert spark_gc.json() == local_gc.json()
    assert set(spark_gc.json()["orphans"]) == set(damaged.old_orphans) | {damaged.young_orphan}
    dump_local, dump_spark = both_engines("dump-log", f"s3://{s3_bucket}/p/wal/")
    assert dump_spark.out == dump_local.out and dump_spark.out.count(f"Dumping s3://{s3_bucket}/p/wal/") == 14


@pytest.mark.spark
def test_auto_picks_spark_where_its_estimate_is_lower_and_says_why(spark, damaged, monkeypatch):
    monkeypatch.setitem(select.COSTS, "verify", select.Cost(0.0, 1000.0, 1.0, 1.0))
    run = kcli_inproc("-v", "diskless", "verify", "--coordinator", damaged.ds.coordinator_uri, "-o", "json")
    assert run.code == 1
    assert "engine: spark (local[*]): auto:" in run.err and "local[*]: this host's CPUs; estimated" in run.err
    assert run.json()["objects_checked"] == 12 - len(damaged.marked)  # stdout is only the document


@dataclass(frozen=True)
class Boom(ChunkTask):
    job: ClassVar[str] = "verify"

    def run(self, resource: Any, item: Any) -> Any:
        if item == 3:
            raise ValueError(f"boom at {item}")
        return item * 2


@pytest.mark.spark
def test_spark_runs_tasks_in_order_and_a_failing_task_is_one_line(spark):
    choice = Choice(Engine.spark, "test", "local[2]")
    items = list(range(40))
    assert list(run_task(Boom(), [i for i in items if i != 3], [1] * 39, choice)) == [2 * i for i in items if i != 3]
    with pytest.raises(OperationError, match=r"^Spark job failed: ValueError: boom at 3$"):
        list(run_task(Boom(), items, [1] * 40, choice))
    assert list(run_task(Boom(), [i for i in items if i != 3], [1] * 39, Choice(Engine.local, "t"))) == \
        [2 * i for i in items if i != 3]


def test_dump_workload_estimates_remote_sizes(tmp_path: Path):
    from kcli.engine.dump import DumpItem, workload

    (tmp_path / "a").write_bytes(b"x" * 100)
    work, sizes = workload([DumpItem(str(tmp_path / "a"), True), DumpItem(str(tmp_path / "missing"), True)])
    assert (work.objects, work.bytes, sizes, work.bytes_estimated) == (2, 100, [100, 0], False)
