"""Diskless topics in the broker (KIP-1163): real broker processes, real clients, local store.

The S3 variant of the core round trip lives in tests/test_diskless_s3.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
import warnings

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from kcli.diskless import admin_api
from kcli.diskless.appender import validate_batches
from kcli.diskless.rack import client_rack
from kcli.diskless.reader import RangeCache, coalesce
from kcli.protocol.client import WireClient
from kcli.protocol.errors import BrokerError
from tests.diskless_helpers import (
    CODECS,
    DISKLESS,
    FAST,
    admin,
    check_partition_order,
    counter,
    local_wal_objects,
    metrics,
    record_upload_intent,
    values_in_objects,
    wait_until,
)
from tests.kafka_helpers import admin as kafka_admin
from tests.kafka_helpers import consume_all, create_topic, produce
from tests.wire_helpers import batch, produce_body

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def batch_now(values: list[bytes]) -> bytes:
    """A batch stamped now: wire_helpers' fixed 2023 timestamps fall to retention.ms at once."""
    return batch(values, timestamp=int(time.time() * 1000))


# ---- pure pieces ---------------------------------------------------------------------------


def test_validate_batches_refuses_what_kafka_refuses():
    good = batch([b"a", b"b"])
    assert validate_batches(good + good, 1 << 20) == [(0, len(good)), (len(good), len(good))]
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 0xFF
    cases = [(bytes(bad_crc), 2, "CRC"), (good[:-3], 2, "remain"), (good + b"xyz", 2, "trailing")]
    with pytest.raises(BrokerError) as err:
        validate_batches(good, 10)
    assert err.value.code == 10  # MESSAGE_TOO_LARGE
    for data, code, text in cases:
        with pytest.raises(BrokerError, match=text) as err:
            validate_batches(data, 1 << 20)
        assert err.value.code == code
    nonzero = bytearray(good)
    nonzero[7] = 5  # base offset 5: clients must send 0
    with pytest.raises(BrokerError, match="base offset") as err:
        validate_batches(bytes(nonzero), 1 << 20)
    assert err.value.code == 87


def test_range_cache_is_exact_per_batch_bounded_and_lru():
    c = RangeCache(100)
    c.put("a", 1, bytes(range(60)))
    assert c.get("a", 1, 60) == bytes(range(60))
    assert c.get("a", 1, 59) is None and c.get("a", 2, 10) is None  # entries are whole batches
    c.put("b", 1, b"x" * 50)  # 110 > 100: evicts "a", the least recently used
    assert c.get("a", 1, 60) is None and c.size == 50
    c.put("c", 10, b"y" * 40)
    assert c.get("b", 1, 50) == b"x" * 50
    c.put("d", 1, b"z" * 30)  # evicts "c" (b was used more recently)
    assert c.get("c", 10, 40) is None and c.get("b", 1, 50) is not None
    c.drop("b")
    assert c.size == 30 and c.get("b", 1, 50) is None and len(c) == 1
    c.put("huge", 1, b"h" * 101)  # larger than the cache: never stored
    assert c.get("huge", 1, 101) is None


def test_coalesce_merges_only_back_to_back_batches_of_one_object():
    from plugins.coordinator.base import BatchInfo, BatchMetadata, TopicIdPartition

    tip = TopicIdPartition(uuid.uuid4(), "t", 0)

    def bi(key: str, offset: int, size: int) -> BatchInfo:
        return BatchInfo(0, key, BatchMetadata(tip, offset, size, 0, 0, -1, -1, 0, -1, -1, -1, -1))

    got = coalesce([bi("a", 1, 10), bi("a", 11, 5), bi("b", 1, 7), bi("a", 16, 4), bi("a", 30, 2)])
    assert got == [("a", 1, 19), ("b", 1, 7), ("a", 30, 2)]


def test_chunk_stream_reads_and_seeks_without_joining():
    from kcli.diskless.chunkstream import ChunkStream

    chunks = [b"\x00", b"abc", b"", b"defgh"]
    s = ChunkStream(chunks)
    assert len(s) == 9 and s.seekable() and s.readable()
    assert bytes(s.read(2)) == b"\x00" and bytes(s.read(10)) == b"abc"  # a read never crosses a chunk
    assert s.read() == b"defgh" and s.read(1) == b""
    assert s.seek(0, 2) == 9 and s.seek(-4, 1) == 5 and s.tell() == 5
    buf = bytearray(6)
    s.seek(1)
    assert s.readinto(buf) == 6 and bytes(buf) == b"abcdef"
    import tempfile

    from plugins.objectstore.local import LocalObjectStorage

    with tempfile.TemporaryDirectory() as d:
        store = LocalObjectStorage(d)
        store.upload("wal/x", ChunkStream(chunks), 9)
        assert store.fetch("wal/x") == b"".join(chunks)
        with pytest.raises(Exception, match="streamed"):
            store.upload("wal/y", ChunkStream(chunks), 10)


def test_rack_hint_in_client_id():
    assert client_rack("app,diskless_rack_id=eu-1a") == "eu-1a"
    assert client_rack("diskless_rack_id=r2;x") == "r2"
    assert client_rack("plain-client") is None and client_rack(None) is None


def test_broker_metrics_without_a_broker_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    from kcli.cli.app import main

    monkeypatch.setenv("KCLI_CONFIG", str(tmp_path / "config.yaml"))
    monkeypatch.setenv("KCLI_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("KCLI_BOOTSTRAP_SERVER", raising=False)
    monkeypatch.setattr(sys, "argv", ["kcli", "broker", "metrics"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no broker to ask" in err


# ---- the broker ----------------------------------------------------------------------------


def test_confluent_idempotent_every_codec_in_order_and_objects_hold_the_batches(broker_factory):
    b = broker_factory(FAST)
    create_topic(b.bootstrap, "dl", 3, DISKLESS)
    produced: list[bytes] = []
    acks: list[tuple[int, int]] = []
    for codec in CODECS:
        values = [f"{codec}-{i}".encode() * 4 for i in range(150)]
        keys = [str(i % 7).encode() for i in range(150)]
        acks += produce(b.bootstrap, "dl", values, keys=keys,
                        **{"compression.type": codec, "enable.idempotence": True})
        produced += values
    msgs = consume_all(b.bootstrap, "dl", len(produced), **{"check.crcs": True})
    assert len(msgs) == len(produced)
    assert sorted(m.value() for m in msgs) == sorted(produced)
    by_part = check_partition_order(msgs)
    assert all(offs[0] == 0 for offs in by_part.values())
    assert sorted(acks) == sorted((m.partition(), m.offset()) for m in msgs)
    position = {v: i for i, v in enumerate(produced)}
    for part in by_part:  # each partition holds its records in produce order
        seq = [position[m.value()] for m in msgs if m.partition() == part]
        assert seq == sorted(seq)

    objects = local_wal_objects(b.data_dir)
    assert objects, "WAL objects are written under <data_dir>/objects/wal"
    stored = values_in_objects(p.read_bytes() for p in objects)
    assert set(stored) == set(produced)
    report = admin(b.bootstrap, admin_api.DISKLESS_VERIFY_KEY)
    assert report["ok"], report["problems"]
    assert report["objects_checked"] == len(objects) and report["orphans"] == []
    desc = admin(b.bootstrap, admin_api.DISKLESS_DESCRIBE_KEY, {"topics": ["dl"]})["topics"][0]
    assert sum(p["high_watermark"] for p in desc["partitions"]) == len(produced)
    assert desc["storage"]["live_bytes"] > 0 and desc["storage"]["file_count"] >= 1
    assert not (b.data_dir / "dl-0").exists(), "no classic log directory for a diskless partition"


def test_kafka_python_log_append_time_and_offsets_for_times(broker_factory):
    kafka = pytest.importorskip("kafka")
    b = broker_factory(FAST)
    create_topic(b.bootstrap, "kp", 2, {**DISKLESS, "message.timestamp.type": "LogAppendTime"})
    create_topic(b.bootstrap, "ts", 1, DISKLESS)
    prod = kafka.KafkaProducer(bootstrap_servers=b.bootstrap, acks="all", compression_type="gzip")
    before = int(time.time() * 1000)
    futures = [prod.send("kp", key=b"%d" % (i % 3), value=b"kp-%d" % i) for i in range(100)]
    metas = [f.get(timeout=30) for f in futures]
    prod.flush(30)
    prod.close()
    base = int(time.time() * 1000) - 60_000  # recent: retention.ms (7 days) must not take it
    with WireClient(b.bootstrap) as client:  # ONE batch, CreateTime timestamps base+0 .. base+19
        resp = client.request(0, 9, produce_body("ts", 0, batch([b"t%d" % i for i in range(20)], timestamp=base)))
        assert int(resp.responses[0].partition_responses[0].error_code) == 0
    assert all(m.timestamp >= before for m in metas), "LogAppendTime is returned in the produce response"

    cons = kafka.KafkaConsumer("kp", bootstrap_servers=b.bootstrap, auto_offset_reset="earliest",
                               consumer_timeout_ms=10000, group_id=None, check_crcs=True)
    got = [m for _, m in zip(range(100), cons)]
    cons.close()
    assert sorted(m.value for m in got) == sorted(b"kp-%d" % i for i in range(100))
    assert all(m.timestamp_type == 1 and m.timestamp >= before for m in got)
    acked = {(m.partition, m.offset): m.timestamp for m in metas}
    assert all(acked[(m.partition, m.offset)] == m.timestamp for m in got)

    # confluent checks the rewritten CRC of LogAppendTime batches too
    msgs = consume_all(b.bootstrap, "kp", 100, **{"check.crcs": True})
    assert {m.timestamp()[0] for m in msgs} == {2}  # TIMESTAMP_LOG_APPEND_TIME

    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "ts-probe"})
    try:
        found = c.offsets_for_times([TopicPartition("ts", 0, base + 5)], timeout=20)[0]
        assert found.offset == 5, "refined inside the batch: first record with ts >= base+5"
        assert c.offsets_for_times([TopicPartition("ts", 0, base + 10_000)], timeout=20)[0].offset == -1
        low, high = c.get_watermark_offsets(TopicPartition("ts", 0), timeout=20)
        assert (low, high) == (0, 20)
    finally:
        c.close()


def test_request_mixing_classic_and_diskless_and_long_poll(broker_factory):
    b = broker_factory({"diskless.append.commit.interval.ms": "300"})
    create_topic(b.bootstrap, "classic", 1)
    create_topic(b.bootstrap, "dlm", 1, DISKLESS)
    body = produce_body("classic", 0, batch_now([b"c0", b"c1"]))
    body["topic_data"].append({"name": "dlm", "partition_data": [{"index": 0, "records": batch_now([b"d0", b"d1", b"d2"])}]})
    with WireClient(b.bootstrap) as client:
        started = time.monotonic()
        resp = client.request(0, 9, body)
        waited = time.monotonic() - started
        results = {(t.name, p.index): (int(p.error_code), int(p.base_offset))
                   for t in resp.responses for p in t.partition_responses}
        assert results == {("classic", 0): (0, 0), ("dlm", 0): (0, 0)}
        assert waited >= 0.25, "the classic partition is answered together with the diskless one"
        resp = client.request(0, 9, produce_body("dlm", 0, batch_now([b"d3"])))
        assert (int(resp.responses[0].partition_responses[0].error_code),
                int(resp.responses[0].partition_responses[0].base_offset)) == (0, 3)
        bad = bytearray(batch_now([b"x"]))
        bad[-1] ^= 1
        resp = client.request(0, 9, produce_body("dlm", 0, bytes(bad)))
        assert int(resp.responses[0].partition_responses[0].error_code) == 2  # CORRUPT_MESSAGE

    # a consumer at the log end is woken by the commit, well before its fetch.wait.max.ms
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "lp", "auto.offset.reset": "latest",
                  "fetch.wait.max.ms": 5000, "enable.auto.commit": False})
    c.assign([TopicPartition("dlm", 0, 4)])
    try:
        c.poll(1.0)
        time.sleep(0.5)
        produce(b.bootstrap, "dlm", [b"late"])
        acked = time.monotonic()
        m = None
        while m is None and time.monotonic() - acked < 10:
            m = c.poll(0.1)
        assert m is not None and m.value() == b"late" and m.offset() == 4
        assert time.monotonic() - acked < 2.5, "woken by the commit, not by the 5 s fetch.wait.max.ms"
    finally:
        c.close()


def test_alter_of_diskless_enable_is_refused(broker):
    create_topic(broker.bootstrap, "fixed", 1, DISKLESS)
    create_topic(broker.bootstrap, "plain", 1)
    a = kafka_admin(broker.bootstrap)
    for topic, op, value in (("fixed", AlterConfigOpType.SET, "false"), ("fixed", AlterConfigOpType.DELETE, None),
                             ("plain", AlterConfigOpType.SET, "true")):
        res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
            ConfigEntry("diskless.enable", value, incremental_operation=op)])
        with pytest.raises(KafkaException) as err:
            a.incremental_alter_configs([res])[res].result(20)
        assert "diskless.enable can only be set when a topic is created" in str(err.value)
        assert err.value.args[0].name() == "INVALID_CONFIG"
    res = ConfigResource(ConfigResource.Type.TOPIC, "fixed", set_config={"retention.ms": "1000"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        a.alter_configs([res])[res].result(20)  # a full replace (AlterConfigs) keeps diskless.enable
    cfg = a.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "fixed")])
    assert list(cfg.values())[0].result(20)["diskless.enable"].value == "true"


def test_delete_records_retention_topic_deletion_and_orphans_end_in_object_deletion(broker_factory):
    b = broker_factory(FAST)
    create_topic(b.bootstrap, "dr", 1, DISKLESS)
    create_topic(b.bootstrap, "ret", 1, {**DISKLESS, "retention.ms": "1500"})
    create_topic(b.bootstrap, "gone", 1, DISKLESS)
    for i in range(3):  # three produce rounds: three objects
        produce(b.bootstrap, "dr", [b"dr-%d-%d" % (i, j) for j in range(10)])
    produce(b.bootstrap, "gone", [b"g"] * 5)

    def keys(topic: str, state: str | None = None) -> set[str]:
        doc = {"topic": topic, **({"state": state} if state else {})}
        return {o["object_key"] for o in admin(b.bootstrap, admin_api.DISKLESS_OBJECTS_KEY, doc)["objects"]}

    def on_disk(key: str) -> bool:
        return (b.data_dir / "objects" / key).exists()

    dr_keys = keys("dr")
    assert len(dr_keys) == 3 and all(on_disk(k) for k in dr_keys)
    a = kafka_admin(b.bootstrap)
    low = list(a.delete_records([TopicPartition("dr", 0, 30)]).values())[0].result(20).low_watermark
    assert low == 30
    with pytest.raises(KafkaException, match="OFFSET_OUT_OF_RANGE|offset"):
        list(a.delete_records([TopicPartition("dr", 0, 31)]).values())[0].result(20)
    marked = admin(b.bootstrap, admin_api.DISKLESS_OBJECTS_KEY, {"state": "deleting"})["objects"]
    assert {o["object_key"] for o in marked} >= dr_keys, "emptied objects are marked for deletion"
    assert all(on_disk(k) for k in dr_keys), "kept for the grace period"
    wait_until(lambda: not any(on_disk(k) for k in dr_keys), 15, what="DeleteRecords objects deleted")
    assert not admin(b.bootstrap, admin_api.DISKLESS_OBJECTS_KEY, {"object_key": sorted(dr_keys)[0]})["objects"]

    produce(b.bootstrap, "ret", [b"r%d" % i for i in range(20)])
    ret_keys = keys("ret")
    assert ret_keys
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "wm"})
    try:
        wait_until(lambda: c.get_watermark_offsets(TopicPartition("ret", 0), timeout=10) == (20, 20), 15,
                   what="retention.ms moves the log start")
    finally:
        c.close()
    wait_until(lambda: not any(on_disk(k) for k in ret_keys), 15, what="retention objects deleted")

    gone_keys = keys("gone")
    a.delete_topics(["gone"])["gone"].result(20)
    wait_until(lambda: not any(on_disk(k) for k in gone_keys), 15, what="deleted topic's objects deleted")

    # orphans: objects under wal/ with an upload intent the coordinator never committed, once older
    # than the grace period; an object with no record at all is only reported (an unknown object)
    old = b.data_dir / "objects" / "wal" / str(uuid.uuid4())
    old.parent.mkdir(exist_ok=True)  # the store removes directories its deletes leave empty
    old.write_bytes(b"\x00orphan")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    record_upload_intent(b.data_dir, f"wal/{old.name}", at_ms=int(time.time() * 1000) - 3_600_000)
    unknown = b.data_dir / "objects" / "wal" / str(uuid.uuid4())
    unknown.write_bytes(b"\x00unknown")
    os.utime(unknown, (time.time() - 3600, time.time() - 3600))
    foreign = b.data_dir / "objects" / "tiered" / "keep-me"
    foreign.parent.mkdir(parents=True, exist_ok=True)
    foreign.write_bytes(b"not a WAL object")
    os.utime(foreign, (time.time() - 3600, time.time() - 3600))
    wait_until(lambda: not old.exists(), 15, what="orphan collected")
    assert foreign.exists(), "only the WAL prefix is garbage collected"
    assert unknown.exists(), "an object without an upload intent is never collected automatically"
    assert counter(b.bootstrap, "diskless.cleaner.orphans_deleted") >= 1
    assert counter(b.bootstrap, "diskless.cleaner.deleted_objects") >= len(dr_keys) + len(ret_keys) + len(gone_keys)
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "wm2"})
    try:
        assert c.get_watermark_offsets(TopicPartition("dr", 0), timeout=10) == (30, 30)
    finally:
        c.close()


def test_partition_reduction_drops_the_partitions_batches_and_their_objects(broker_factory):
    from kcli.protocol import kcli_schemas as schemas
    b = broker_factory({**FAST, "delete.topic.partition.enable": "true"})
    create_topic(b.bootstrap, "shrink", 3, DISKLESS)
    produce(b.bootstrap, "shrink", [b"keep-%d" % i for i in range(10)], partition=0)
    produce(b.bootstrap, "shrink", [b"drop-%d" % i for i in range(10)], partition=2)
    doomed = {o["object_key"] for o in admin(b.bootstrap, admin_api.DISKLESS_OBJECTS_KEY, {"topic": "shrink"})["objects"]
              if o["partitions"] == ["shrink-2"]}
    assert doomed
    with WireClient(b.bootstrap) as client:
        resp = client.request(schemas.DELETE_PARTITIONS_KEY, 0, {
            "timeout_ms": 30000, "delete_partitions_delay": 0, "topics": [{"name": "shrink", "partitions": [2]}]})
    assert int(resp.error_code) == 0
    assert [int(p.error_code) for t in resp.responses for p in t.partitions] == [0]
    desc = admin(b.bootstrap, admin_api.DISKLESS_DESCRIBE_KEY, {"topics": ["shrink"]})["topics"][0]
    assert [p["partition"] for p in desc["partitions"]] == [0, 1]
    wait_until(lambda: not any((b.data_dir / "objects" / k).exists() for k in doomed), 15,
               what="the removed partition's objects deleted")
    assert sorted(m.value() for m in consume_all(b.bootstrap, "shrink", 10)) == sorted(b"keep-%d" % i for i in range(10))


def test_gc_and_verify_api_on_demand(broker_factory):
    b = broker_factory({**FAST, "diskless.file.cleaner.interval.ms": "600000"})
    create_topic(b.bootstrap, "v", 1, DISKLESS)
    produce(b.bootstrap, "v", [b"v%d" % i for i in range(10)])
    young = b.data_dir / "objects" / "wal" / str(uuid.uuid4())
    young.write_bytes(b"\x00young")
    os.utime(young, (time.time() + 3600, time.time() + 3600))  # stays younger than the grace period
    old = b.data_dir / "objects" / "wal" / str(uuid.uuid4())
    old.write_bytes(b"\x00old")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    record_upload_intent(b.data_dir, f"wal/{old.name}", at_ms=int(time.time() * 1000) - 3_600_000)
    dry = admin(b.bootstrap, admin_api.DISKLESS_GC_KEY, {"dry_run": True})
    assert dry["dry_run"] and dry["orphans"] == [f"wal/{old.name}"]
    assert old.exists()
    done = admin(b.bootstrap, admin_api.DISKLESS_GC_KEY, {})
    assert done["orphans"] == [f"wal/{old.name}"] and not old.exists() and young.exists()

    (key,) = [o["object_key"] for o in admin(b.bootstrap, admin_api.DISKLESS_OBJECTS_KEY, {"batches": True})["objects"]]
    path = b.data_dir / "objects" / key
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # flip a payload byte
    path.write_bytes(bytes(data))
    report = admin(b.bootstrap, admin_api.DISKLESS_VERIFY_KEY)
    assert not report["ok"]
    assert [p["problem"] for p in report["problems"]] == ["CRC-32C mismatch"]
    assert report["orphans"] == []
    assert {o["object_key"] for o in report["unknown_objects"]} == {f"wal/{young.name}"}
    with pytest.raises(Exception, match="UNKNOWN_TOPIC_OR_PARTITION"):
        admin(b.bootstrap, admin_api.DISKLESS_DESCRIBE_KEY, {"topics": ["nope"]})


def test_upload_failure_is_retriable_and_the_idempotent_producer_recovers(broker_factory):
    b = broker_factory(FAST)
    create_topic(b.bootstrap, "uf", 2, DISKLESS)
    produce(b.bootstrap, "uf", [b"first"], partition=0)
    wal = b.data_dir / "objects" / "wal"
    moved = b.data_dir / "objects" / "wal.moved"
    wal.rename(moved)
    wal.write_bytes(b"a file where the WAL directory was: every upload fails")
    try:
        with WireClient(b.bootstrap) as client:
            resp = client.request(0, 9, produce_body("uf", 0, batch_now([b"raw"])))
        assert int(resp.responses[0].partition_responses[0].error_code) == 56  # KAFKA_STORAGE_ERROR
        delivered: list[bytes] = []
        errors: list[object] = []

        def cb(err, msg):  # noqa: ANN001
            (errors if err is not None else delivered).append(err if err is not None else msg.value())

        p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "linger.ms": 5,
                      "retry.backoff.ms": 50, "message.timeout.ms": 60000})
        values = [b"uf-%d" % i for i in range(200)]
        for i, v in enumerate(values):
            p.produce("uf", v, key=b"%d" % (i % 5), on_delivery=cb)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            p.poll(0.1)
        assert delivered == [] and errors == [], "nothing acknowledged while uploads fail, nothing given up"
        assert counter(b.bootstrap, "diskless.upload.errors") >= 1
    finally:
        wal.unlink()
        moved.rename(wal)
    assert p.flush(30) == 0
    assert errors == [] and sorted(delivered) == sorted(values)
    msgs = consume_all(b.bootstrap, "uf", 201)
    assert sorted(m.value() for m in msgs) == sorted(values + [b"first"]), "no loss, no duplicate"
    check_partition_order(msgs)
    desc = admin(b.bootstrap, admin_api.DISKLESS_DESCRIBE_KEY, {"topics": ["uf"]})["topics"][0]
    assert sum(p["high_watermark"] for p in desc["partitions"]) == 201, "nothing beyond what was consumed"


def test_commit_failure_is_retriable_and_leaves_an_orphan_that_is_collected(broker_factory):
    b = broker_factory(FAST)
    create_topic(b.bootstrap, "cf", 1, DISKLESS)
    produce(b.bootstrap, "cf", [b"before"])
    # A trigger (added from a second connection to the broker's database) makes every commit_file
    # fail while upload intents still go in: the uploads happen, their commits do not.
    import sqlite3

    db = sqlite3.connect(b.data_dir / "diskless" / "coordinator.db", timeout=30, isolation_level=None)
    db.execute("CREATE TRIGGER fail_commits BEFORE INSERT ON files BEGIN SELECT RAISE(ABORT, 'injected'); END")
    try:
        with WireClient(b.bootstrap) as client:
            resp = client.request(0, 9, produce_body("cf", 0, batch_now([b"raw"])))
        assert int(resp.responses[0].partition_responses[0].error_code) == 7  # REQUEST_TIMED_OUT
        delivered: list[bytes] = []
        errors: list[object] = []

        def cb(err, msg):  # noqa: ANN001
            (errors if err is not None else delivered).append(err if err is not None else msg.value())

        p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "linger.ms": 5,
                      "retry.backoff.ms": 50, "message.timeout.ms": 60000})
        values = [b"cf-%d" % i for i in range(50)]
        for v in values:
            p.produce("cf", v, on_delivery=cb)
        p.poll(1.0)
        assert delivered == [] and errors == []
        assert counter(b.bootstrap, "diskless.commit.errors") >= 1
    finally:
        db.execute("DROP TRIGGER IF EXISTS fail_commits")
        db.close()
    assert p.flush(30) == 0
    assert errors == [] and sorted(delivered) == sorted(values)
    msgs = consume_all(b.bootstrap, "cf", 51)
    assert [m.value() for m in msgs] == [b"before"] + values, "in order, no loss, no duplicate"
    # the uploaded-but-uncommitted objects are orphans; the collector removes them after the grace
    wait_until(lambda: admin(b.bootstrap, admin_api.DISKLESS_VERIFY_KEY)["orphans"] == [], 15,
               what="orphans of failed commits collected")
    assert counter(b.bootstrap, "diskless.cleaner.orphans_deleted") >= 1


def test_kill9_mid_stream_keeps_every_acknowledged_message_without_duplicates(broker_factory):
    b = broker_factory(FAST)
    create_topic(b.bootstrap, "k9", 2, DISKLESS)
    acked: list[bytes] = []
    failed: list[object] = []
    p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "linger.ms": 5,
                  "message.timeout.ms": 60000, "retry.backoff.ms": 50, "reconnect.backoff.ms": 50})

    def cb(err, msg):  # noqa: ANN001
        (failed if err is not None else acked).append(err if err is not None else msg.value())

    stop = threading.Event()
    sent: list[bytes] = []

    def run() -> None:
        i = 0
        while not stop.is_set():
            v = b"k9-%06d" % i
            p.produce("k9", v, key=b"%d" % (i % 4), on_delivery=cb)
            sent.append(v)
            i += 1
            p.poll(0.001)

    t = threading.Thread(target=run)
    t.start()
    try:
        wait_until(lambda: len(acked) > 300, 20, what="first acknowledgements")
        b.kill9()
        acked_at_kill = len(acked)
        time.sleep(0.5)
        b.start()
        wait_until(lambda: len(acked) > acked_at_kill + 300, 30, what="acknowledgements after restart")
    finally:
        stop.set()
        t.join()
    assert p.flush(60) == 0
    assert failed == []
    msgs = consume_all(b.bootstrap, "k9", len(sent), timeout=30)
    got = [m.value() for m in msgs]
    assert len(got) == len(set(got)), "no duplicate from the idempotent producer"
    assert set(acked) <= set(got), "every acknowledged message survives kill -9"
    assert sorted(got) == sorted(sent)
    check_partition_order(msgs)


def test_restart_group_resume_gets_per_fetch_and_metrics_cli(broker_factory):
    b = broker_factory({**FAST, "diskless.append.commit.interval.ms": "400", "broker.rack": "r1"})
    create_topic(b.bootstrap, "gr", 2, DISKLESS)
    with WireClient(b.bootstrap) as client:  # four batches in one request: adjacent in one object
        records = b"".join(batch_now([b"g%d" % i]) for i in range(4))
        resp = client.request(0, 9, produce_body("gr", 0, records))
        assert int(resp.responses[0].partition_responses[0].error_code) == 0
    produce(b.bootstrap, "gr", [b"h%d" % i for i in range(50)], partition=1)
    objs = admin(b.bootstrap, admin_api.DISKLESS_OBJECTS_KEY, {"topic": "gr", "batches": True})["objects"]
    first = [o for o in objs if any(bt["partition"] == 0 for bt in o["batches"])]
    assert len(first) == 1 and len(first[0]["batches"]) == 4

    md = Producer({"bootstrap.servers": b.bootstrap, "client.id": "svc,diskless_rack_id=r1"}).list_topics("gr", 10)
    assert {p.leader for p in md.topics["gr"].partitions.values()} == {1}

    conf = {"bootstrap.servers": b.bootstrap, "group.id": "grp", "auto.offset.reset": "earliest",
            "enable.auto.commit": False}
    c = Consumer(conf)
    c.subscribe(["gr"])
    seen = []
    deadline = time.monotonic() + 20
    while len(seen) < 30 and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            seen.append(m)
    c.commit(asynchronous=False)
    c.close()

    b.restart()  # empty cache: the next fetches need GETs
    c = Consumer(conf)
    c.subscribe(["gr"])
    rest = []
    deadline = time.monotonic() + 20
    while len(seen) + len(rest) < 54 and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            rest.append(m)
    c.close()
    assert counter(b.bootstrap, "diskless.get.count") >= 1, "after a restart the cache is empty"
    both = sorted(m.value() for m in seen + rest)
    assert both == sorted([b"g%d" % i for i in range(4)] + [b"h%d" % i for i in range(50)]), "resumed, no re-read"

    produce(b.bootstrap, "gr", [b"after-restart"], partition=1)
    fresh = consume_all(b.bootstrap, "gr", 55)  # from offset 0 again: partition 0 is 4 adjacent batches
    assert len(fresh) == 55
    m = metrics(b.bootstrap)
    assert m["counters"]["diskless.get.count"] >= 1
    gets = m["summaries"]["diskless.fetch.gets_per_request"]
    assert gets["count"] >= 1 and gets["max"] <= 2, "adjacent batches of an object come in one GET"

    out = subprocess.run([sys.executable, "-m", "kcli", "-b", b.bootstrap, "broker", "metrics", "-o", "json"],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    import json

    doc = json.loads(out.stdout)
    for name in ("diskless.upload.count", "diskless.commit.count", "diskless.read.count", "diskless.get.count"):
        assert doc["counters"][name] >= 1, name
    for name in ("diskless.upload.latency_ms", "diskless.commit.latency_ms", "diskless.get.latency_ms"):
        assert doc["summaries"][name]["p99"] is not None, name
    from typer.testing import CliRunner

    from kcli.cli.app import app

    table = CliRunner().invoke(app, ["-b", b.bootstrap, "broker", "metrics"])
    assert table.exit_code == 0, table.output
    assert "diskless.upload.latency_ms" in table.output and "P99" in table.output
