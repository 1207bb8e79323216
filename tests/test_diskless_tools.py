"""`kcli diskless describe|objects|verify|gc`: online (a real broker, over kcli's admin API) and
offline (its coordinator database after the broker stopped), in table, json and yaml.

Spark and the engine comparisons live in tests/test_spark_engine.py; here every offline scan
runs on the local engine.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import yaml
from confluent_kafka import Producer, TopicPartition

from tests.diskless_helpers import DISKLESS, FAST, record_upload_intent, wait_until
from tests.fixtures_cli import assert_one_line_error, cli_env, run_kcli  # noqa: F401 - cli_env is a fixture
from tests.fixtures_engine import damaged_dataset, kcli_inproc, without_ages
from tests.fixtures_s3 import moto_server, s3_bucket, s3_env  # noqa: F401 - fixtures
from tests.kafka_helpers import admin as kafka_admin
from tests.kafka_helpers import create_topic, produce

# The broker's own cleaner never runs during a test (the interval is long): gc happens only
# when a test asks for it.
QUIET_CLEANER = {**FAST, "diskless.file.cleaner.interval.ms": "600000",
                 "diskless.append.commit.interval.ms": "200"}


def coordinator_uri(data_dir: Path) -> str:
    return f"sqlite://{data_dir / 'diskless' / 'coordinator.db'}"


def produce_together(bootstrap: str, topics: dict[str, list[bytes]]) -> None:
    """One producer, one flush: the broker's next WAL object holds every topic's batches."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for topic, values in topics.items():
        for v in values:
            p.produce(topic, value=v)
    assert p.flush(30) == 0


def delete_all_records(bootstrap: str, topic: str, partitions: int, hwm: int) -> None:
    a = kafka_admin(bootstrap)
    fs = a.delete_records([TopicPartition(topic, p, hwm) for p in range(partitions)])
    for f in fs.values():
        f.result(20)


# ---- describe / objects ------------------------------------------------------------------------


def test_describe_and_objects_online_equal_offline_in_every_format(broker_factory):
    b = broker_factory(QUIET_CLEANER)
    create_topic(b.bootstrap, "orders", 3, DISKLESS)
    create_topic(b.bootstrap, "audit", 1, DISKLESS)
    produce_together(b.bootstrap, {"orders": [b"o%d" % i for i in range(30)], "audit": [b"a%d" % i for i in range(5)]})
    produce(b.bootstrap, "audit", [b"solo%d" % i for i in range(5)])
    produce(b.bootstrap, "orders", [b"more%d" % i for i in range(12)], partition=1)
    delete_all_records(b.bootstrap, "audit", 1, 10)
    bs = ("-b", b.bootstrap)

    online = {
        "describe": kcli_inproc(*bs, "diskless", "describe", "-o", "json"),
        "describe-orders": kcli_inproc(*bs, "diskless", "describe", "--topic", "orders", "-o", "json"),
        "objects": kcli_inproc(*bs, "diskless", "objects", "-o", "json"),
        "objects-deleting": kcli_inproc(*bs, "diskless", "objects", "--state", "deleting", "-o", "json"),
        "objects-orders": kcli_inproc(*bs, "diskless", "objects", "--topic", "orders", "--batches", "-o", "json"),
    }
    for name, run in online.items():
        assert run.code == 0, (name, run.err)
    desc = {t["name"]: t for t in online["describe"].json()["topics"]}
    assert sorted(desc) == ["audit", "orders"]
    orders, audit = desc["orders"], desc["audit"]
    assert [p["partition"] for p in orders["partitions"]] == [0, 1, 2]
    assert orders["totals"]["messages"] == 42 and orders["totals"]["partitions"] == 3
    assert orders["totals"]["batch_count"] == sum(p["batch_count"] for p in orders["partitions"]) >= 2
    assert orders["storage"]["live_bytes"] == orders["totals"]["byte_size"] > 0
    assert audit["partitions"] == [{"partition": 0, "log_start_offset": 10, "high_watermark": 10,
                                    "batch_count": 0, "byte_size": 0}]
    # audit's batches are all deleted, but the objects it was part of are still stored
    assert audit["storage"]["live_bytes"] == 0 and audit["storage"]["file_count"] == 0
    assert audit["storage"]["dead_file_count"] >= 1 and audit["storage"]["dead_files_size"] > 0
    objects = online["objects"].json()["objects"]
    deleting = online["objects-deleting"].json()["objects"]
    assert deleting and all(o["state"] == "deleting" and o["marked_for_deletion_at_ms"] for o in deleting)
    assert all(o["used_size"] == 0 and o["batch_count"] == 0 for o in deleting)
    with_orders = online["objects-orders"].json()["objects"]
    assert with_orders and all(any(p.startswith("orders-") for p in o["partitions"]) for o in with_orders)
    assert sum(len(o["batches"]) for o in with_orders) == orders["totals"]["batch_count"]
    key = objects[0]["object_key"]
    one = kcli_inproc(*bs, "diskless", "objects", "--key", key, "-o", "json").json()["objects"]
    assert [o["object_key"] for o in one] == [key]

    table = kcli_inproc(*bs, "diskless", "describe").out
    assert "LOG-START-OFFSET" in table and "HIGH-WATERMARK" in table and "DEAD-OBJECTS-BYTES" in table
    assert any(line.split()[:3] == ["orders", "total", str(orders["totals"]["batch_count"])]
               for line in table.splitlines())
    obj_table = kcli_inproc(*bs, "diskless", "objects", "--state", "deleting").out
    assert "MARKED-FOR-DELETION" in obj_table and deleting[0]["object_key"] in obj_table and "Z  " in obj_table

    assert b.stop() == 0
    coord = ("--coordinator", coordinator_uri(b.data_dir))
    offline = {
        "describe": kcli_inproc("diskless", "describe", *coord, "-o", "json"),
        "describe-orders": kcli_inproc("diskless", "describe", "--topic", "orders", *coord, "-o", "json"),
        "objects": kcli_inproc("diskless", "objects", *coord, "-o", "json"),
        "objects-deleting": kcli_inproc("diskless", "objects", "--state", "deleting", *coord, "-o", "json"),
        "objects-orders": kcli_inproc("diskless", "objects", "--topic", "orders", "--batches", *coord, "-o", "json"),
    }
    for name in online:
        assert offline[name].code == 0, (name, offline[name].err)
        assert offline[name].json() == online[name].json(), name
    assert offline["objects"].json()["storage"] == (b.data_dir / "objects").absolute().as_uri()
    as_yaml = kcli_inproc("diskless", "describe", *coord, "-o", "yaml")
    assert yaml.safe_load(as_yaml.out) == online["describe"].json()
    assert kcli_inproc("diskless", "describe", *coord).out == table


# ---- verify ------------------------------------------------------------------------------------


def test_verify_finds_a_flipped_byte_online_and_offline_naming_object_and_position(broker_factory):
    b = broker_factory(QUIET_CLEANER)
    create_topic(b.bootstrap, "v", 2, DISKLESS)
    produce(b.bootstrap, "v", [b"first-%d" % i for i in range(20)])
    produce(b.bootstrap, "v", [b"second-%d" % i for i in range(20)])
    bs = ("-b", b.bootstrap)
    ok = kcli_inproc(*bs, "diskless", "verify")
    assert ok.code == 0 and ": OK" in ok.out, ok.err
    objects = kcli_inproc(*bs, "diskless", "objects", "--batches", "-o", "json").json()["objects"]
    assert len(objects) == 2
    victim = objects[1]
    batch = victim["batches"][-1]
    path = b.data_dir / "objects" / victim["object_key"]
    data = bytearray(path.read_bytes())
    data[batch["byte_offset"] + batch["byte_size"] - 1] ^= 0xFF  # the last payload byte
    path.write_bytes(bytes(data))

    expected = [{"object_key": victim["object_key"], "byte_offset": batch["byte_offset"],
                 "byte_size": batch["byte_size"], "partition": f"v-{batch['partition']}", "problem": "CRC-32C mismatch"}]
    online = kcli_inproc(*bs, "diskless", "verify", "-o", "json")
    assert online.code == 1
    doc = online.json()
    assert doc["ok"] is False and doc["problems"] == expected
    assert doc["objects_checked"] == 2 and doc["batches_checked"] == sum(len(o["batches"]) for o in objects)
    assert online.err.strip() == "kcli: error: verify found 1 problem(s) in 1 object(s)"
    table = kcli_inproc(*bs, "diskless", "verify")
    assert table.code == 1
    row = next(line for line in table.out.splitlines() if line.startswith(victim["object_key"]))
    assert row.split()[1] == str(batch["byte_offset"]) and "CRC-32C mismatch" in row

    assert b.stop() == 0
    coord = ("--coordinator", coordinator_uri(b.data_dir))
    offline = kcli_inproc("diskless", "verify", *coord, "-o", "json")
    assert offline.code == 1
    assert without_ages(offline.json()) == without_ages(doc)
    assert yaml.safe_load(kcli_inproc("diskless", "verify", *coord, "-o", "yaml").out)["problems"] == expected
    # offline only: an object gone from the store
    os.remove(b.data_dir / "objects" / objects[0]["object_key"])
    gone = kcli_inproc("diskless", "verify", *coord, "--key", objects[0]["object_key"], "-o", "json")
    assert gone.code == 1
    assert gone.json()["problems"] == [{"object_key": objects[0]["object_key"],
                                        "problem": "missing from object storage"}]


# ---- gc ----------------------------------------------------------------------------------------


def test_gc_online_deletes_orphans_past_grace_and_offline_deletes_marked_objects(broker_factory):
    b = broker_factory(QUIET_CLEANER)  # grace: diskless.file.cleaner.retention.period.ms = 800
    create_topic(b.bootstrap, "g", 1, DISKLESS)
    create_topic(b.bootstrap, "h", 1, DISKLESS)
    produce(b.bootstrap, "g", [b"g1"] * 5)
    produce(b.bootstrap, "g", [b"g2"] * 5)
    wal = b.data_dir / "objects" / "wal"
    old = wal / str(uuid.uuid4())
    old.write_bytes(b"\x00orphan")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    record_upload_intent(b.data_dir, f"wal/{old.name}", at_ms=int(time.time() * 1000) - 3_600_000)  # orphan
    young = wal / str(uuid.uuid4())
    young.write_bytes(b"\x00young")
    os.utime(young, (time.time() + 3600, time.time() + 3600))  # never past the grace period
    young_orphan = wal / str(uuid.uuid4())  # an intent and no commit, inside the grace period
    young_orphan.write_bytes(b"\x00young-orphan")
    os.utime(young_orphan, (time.time() + 3600, time.time() + 3600))
    record_upload_intent(b.data_dir, f"wal/{young_orphan.name}", at_ms=int(time.time() * 1000) + 3_600_000)
    bs = ("-b", b.bootstrap)
    g_objects = kcli_inproc(*bs, "diskless", "objects", "--topic", "g", "-o", "json").json()["objects"]
    assert len(g_objects) == 2
    delete_all_records(b.bootstrap, "g", 1, 10)
    time.sleep(1.0)  # past the 800 ms grace

    dry = kcli_inproc(*bs, "diskless", "gc", "--dry-run", "-o", "json")
    assert dry.code == 0, dry.err
    report = dry.json()
    assert report["dry_run"] is True and report["orphans"] == [f"wal/{old.name}"]
    assert report["orphans_waiting"] == [f"wal/{young_orphan.name}"]  # listed, marked as inside the grace period
    dry_table = kcli_inproc(*bs, "diskless", "gc", "--dry-run")
    assert "Orphans inside the grace period (kept until it is over): 1 object(s)" in dry_table.out
    assert f"  orphans_waiting: wal/{young_orphan.name}" in dry_table.out
    assert report["orphans_bytes"] == len(b"\x00orphan")
    assert sorted(report["deleted"]) == sorted(o["object_key"] for o in g_objects)
    assert report["deleted_bytes"] == sum(o["file_size"] for o in g_objects)
    assert old.exists() and all((b.data_dir / "objects" / o["object_key"]).exists() for o in g_objects)

    done = kcli_inproc(*bs, "diskless", "gc")
    assert done.code == 0, done.err
    assert f"Deleted 2 object(s) marked for deletion ({report['deleted_bytes']} B)" in done.out
    assert "Deleted 1 orphan object(s) (7 B)" in done.out
    assert not old.exists() and young.exists() and young_orphan.exists()
    assert not any((b.data_dir / "objects" / o["object_key"]).exists() for o in g_objects)

    # offline: objects marked while the broker ran, deleted after it stopped
    produce(b.bootstrap, "h", [b"h"] * 5)
    (h_object,) = kcli_inproc(*bs, "diskless", "objects", "--topic", "h", "-o", "json").json()["objects"]
    delete_all_records(b.bootstrap, "h", 1, 5)
    assert b.stop() == 0
    coord = ("--coordinator", coordinator_uri(b.data_dir))
    orphan2 = wal / str(uuid.uuid4())
    orphan2.write_bytes(b"\x00orphan-two")
    record_upload_intent(b.data_dir, f"wal/{orphan2.name}")
    waiting = kcli_inproc("diskless", "gc", "--dry-run", *coord, "-o", "json").json()  # default grace 60 s
    assert waiting["waiting"] == [h_object["object_key"]] and waiting["deleted"] == [] and waiting["orphans"] == []
    assert waiting["waiting_bytes"] == h_object["file_size"]
    assert sorted(waiting["orphans_waiting"]) == sorted([f"wal/{orphan2.name}", f"wal/{young_orphan.name}"])
    dry = kcli_inproc("diskless", "gc", "--dry-run", "--grace-ms", "0", *coord, "-o", "yaml")
    assert dry.code == 0, dry.err
    as_doc = yaml.safe_load(dry.out)
    assert as_doc["deleted"] == [h_object["object_key"]] and as_doc["orphans"] == [f"wal/{orphan2.name}"]
    assert (b.data_dir / "objects" / h_object["object_key"]).exists() and orphan2.exists()
    real = kcli_inproc("diskless", "gc", "--grace-ms", "0", *coord, "-o", "json")
    assert real.code == 0, real.err
    assert real.json()["deleted"] == [h_object["object_key"]] and real.json()["orphans"] == [f"wal/{orphan2.name}"]
    assert not (b.data_dir / "objects" / h_object["object_key"]).exists() and not orphan2.exists()
    assert young.exists()
    assert kcli_inproc("diskless", "objects", "--state", "deleting", *coord, "-o", "json").json()["objects"] == []
    b.start()  # the broker comes back on the cleaned store and serves what is left
    wait_until(lambda: kcli_inproc("-b", b.bootstrap, "diskless", "verify").code == 0, 10, what="verify after restart")


# ---- offline store on S3 (moto's server), local engine -------------------------------------------


def test_offline_verify_and_gc_against_an_s3_store(tmp_path, s3_bucket):
    import boto3

    bad = damaged_dataset(tmp_path / "ds", objects=8, object_bytes=64 << 10)
    s3 = boto3.client("s3")
    for path in sorted((bad.ds.objects_dir / "wal").iterdir()):
        s3.put_object(Bucket=s3_bucket, Key=f"kcli/wal/{path.name}", Body=path.read_bytes())
    coord = ("--coordinator", bad.ds.coordinator_uri)
    on_s3 = kcli_inproc("diskless", "verify", *coord, "--object-store", f"s3://{s3_bucket}/kcli", "-o", "json")
    on_disk = kcli_inproc("diskless", "verify", *coord, "-o", "json")
    assert on_s3.code == on_disk.code == 1
    s3_doc, disk_doc = on_s3.json(), on_disk.json()
    assert s3_doc["storage"].rstrip("/") == f"s3://{s3_bucket}/kcli" and disk_doc["storage"] == bad.ds.store_uri
    assert s3_doc["problems"] == disk_doc["problems"]
    problems = {(p["object_key"], p["problem"].split(" ")[0]) for p in s3_doc["problems"]}
    assert (bad.crc_key, "CRC-32C") in problems and (bad.missing_key, "missing") in problems
    assert (bad.short_key, "size") in problems
    # moto stamps uploads "now": every listed orphan is young, so gc with grace 0 takes them all
    report = kcli_inproc("diskless", "gc", *coord, "--object-store", f"s3://{s3_bucket}/kcli", "--grace-ms", "0",
                         "-o", "json")
    assert report.code == 0, report.err
    doc = report.json()
    assert sorted(doc["orphans"]) == sorted(bad.old_orphans + [bad.young_orphan])
    assert sorted(doc["deleted"]) == sorted(bad.marked)
    left = {o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket, Prefix="kcli/wal/").get("Contents", [])}
    assert not left & {f"kcli/{k}" for k in doc["orphans"] + doc["deleted"]}
    assert len(left) == 8 - len(bad.marked) - 1  # the missing object was never uploaded


# ---- usage and errors ----------------------------------------------------------------------------


def test_usage_errors_exit_2_and_failures_exit_1(tmp_path, cli_env):  # noqa: F811
    bad = damaged_dataset(tmp_path / "ds", objects=8, object_bytes=64 << 10)
    coord = ("--coordinator", bad.ds.coordinator_uri)
    cases = [
        (("diskless", "verify", "--engine", "spark"), 2, "--coordinator"),
        (("diskless", "gc", "--object-store", "file:///tmp"), 2, "--coordinator"),
        (("diskless", "objects", "--key", "k", "--topic", "t", *coord), 2, "--key or --topic"),
        (("diskless", "describe", "--coordinator", f"sqlite://{tmp_path}/nope.db"), 2, "no database"),
        (("diskless", "describe", "--coordinator", "mysql://x/y"), 2, "--coordinator expects"),
        (("diskless", "describe", "--coordinator", "postgresql://kcli@127.0.0.1:1/x"), 2,
         "cannot open coordinator database postgresql://kcli@127.0.0.1:1/x"),
        (("diskless", "gc", *coord, "--object-store", "ftp://x"), 2, "unsupported object store URI"),
        (("diskless", "describe", "--topic", "nope", *coord), 1, "UNKNOWN_TOPIC_OR_PARTITION"),
        (("diskless", "objects", "--topic", "nope", *coord), 1, "UNKNOWN_TOPIC_OR_PARTITION"),
    ]
    for args, code, needle in cases:
        run = kcli_inproc(*args)
        assert run.code == code, (args, run.code, run.out, run.err)
        lines = [ln for ln in run.err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("kcli: error: ") and needle in lines[0], (args, run.err)
    bare = tmp_path / "bare"
    (bare / "diskless").mkdir(parents=True)
    (bare / "diskless" / "coordinator.db").touch()  # no objects/ next to it: verify needs --object-store
    run = kcli_inproc("diskless", "verify", "--coordinator", f"sqlite://{bare}/diskless/coordinator.db")
    assert run.code == 2 and "--object-store" in run.err
    # the real entry point: bad --state is click's usage error, damage is exit 1 with one line
    assert_one_line_error(run_kcli(cli_env, "diskless", "objects", "--state", "bogus", *coord), 2, "bogus")
    proc = run_kcli(cli_env, "-v", "diskless", "verify", *coord)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "engine: local" in proc.stderr and "auto:" in proc.stderr
    assert bad.crc_key in proc.stdout and "CRC-32C mismatch" in proc.stdout
