"""The embedded broker against unmodified clients: confluent-kafka, kafka-python, kcat."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource, NewPartitions

from tests.kafka_helpers import admin, consume_all, create_topic, produce

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


@pytest.mark.parametrize("codec", CODECS)
def test_produce_consume_every_codec_idempotent(broker, codec):
    create_topic(broker.bootstrap, "t", 3)
    values = [f"{codec}-{i}".encode() * 5 for i in range(300)]
    keys = [str(i % 7).encode() for i in range(300)]
    acks = produce(broker.bootstrap, "t", values, keys=keys, **{"compression.type": codec, "enable.idempotence": True})
    msgs = consume_all(broker.bootstrap, "t", 300)
    assert sorted(m.value() for m in msgs) == sorted(values)
    # per partition, offsets are gapless and in produce order
    by_part: dict[int, list[int]] = {}
    for m in msgs:
        by_part.setdefault(m.partition(), []).append(m.offset())
    for offs in by_part.values():
        assert offs == list(range(len(offs)))
    assert sorted(acks) == sorted((m.partition(), m.offset()) for m in msgs)


def test_plain_producer_acks_0_and_1(broker):
    create_topic(broker.bootstrap, "plain")
    produce(broker.bootstrap, "plain", [b"a%d" % i for i in range(50)], acks=1)
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": 0})
    for i in range(50):
        p.produce("plain", b"z%d" % i)
    assert p.flush(30) == 0
    msgs = consume_all(broker.bootstrap, "plain", 100)
    assert len(msgs) == 100


def test_group_of_two_rebalances_and_offsets_survive_restart(broker):
    create_topic(broker.bootstrap, "g", 4)
    produce(broker.bootstrap, "g", [b"m%d" % i for i in range(200)], keys=[b"%d" % i for i in range(200)])
    conf = {"bootstrap.servers": broker.bootstrap, "group.id": "grp", "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": 10000, "heartbeat.interval.ms": 500}
    c1, c2 = Consumer(conf), Consumer(conf)
    c1.subscribe(["g"])
    c2.subscribe(["g"])
    seen: list[bytes] = []
    owners: dict[int, set[int]] = {0: set(), 1: set()}
    deadline = time.monotonic() + 40
    while len(seen) < 200 and time.monotonic() < deadline:
        for i, c in enumerate((c1, c2)):
            m = c.poll(0.2)
            if m is not None and not m.error():
                seen.append(m.value())
                owners[i].add(m.partition())
                c.commit(m, asynchronous=False)
    assert sorted(seen) == sorted(b"m%d" % i for i in range(200)), "each message consumed exactly once"
    assert owners[0] and owners[1] and not owners[0] & owners[1], "both members got disjoint partitions"
    c1.close()
    c2.close()
    broker.restart()
    c3 = Consumer(conf)
    committed = c3.committed([TopicPartition("g", p) for p in range(4)], timeout=20)
    assert sum(tp.offset for tp in committed) == 200
    c3.close()


def test_admin_client_operations(broker):
    a = admin(broker.bootstrap)
    create_topic(broker.bootstrap, "adm", 2, {"retention.ms": "3600000"})
    res = ConfigResource(ConfigResource.Type.TOPIC, "adm")
    cfg = a.describe_configs([res])[res].result(20)
    assert cfg["retention.ms"].value == "3600000"
    assert cfg["segment.bytes"].value == "1073741824"
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry
    res2 = ConfigResource(ConfigResource.Type.TOPIC, "adm", incremental_configs=[
        ConfigEntry("retention.bytes", "1048576", incremental_operation=AlterConfigOpType.SET)])
    a.incremental_alter_configs([res2])[res2].result(20)
    assert a.describe_configs([res])[res].result(20)["retention.bytes"].value == "1048576"
    bad = ConfigResource(ConfigResource.Type.TOPIC, "adm", incremental_configs=[
        ConfigEntry("retention.bytes", "lots", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(Exception, match="retention.bytes"):
        a.incremental_alter_configs([bad])[bad].result(20)
    a.create_partitions([NewPartitions("adm", 5)])["adm"].result(20)
    md = a.list_topics("adm", timeout=10)
    assert len(md.topics["adm"].partitions) == 5
    produce(broker.bootstrap, "adm", [b"x%d" % i for i in range(10)], partition=0)
    from confluent_kafka import TopicPartition as TP
    out = a.delete_records([TP("adm", 0, 4)])
    assert list(out.values())[0].result(20).low_watermark == 4
    msgs = consume_all(broker.bootstrap, "adm", 6)
    assert [m.offset() for m in msgs if m.partition() == 0] == [4, 5, 6, 7, 8, 9]
    a.delete_topics(["adm"])["adm"].result(20)
    assert "adm" not in a.list_topics(timeout=10).topics
    assert not (broker.data_dir / "adm-0").exists()


def test_create_topic_errors(broker):
    create_topic(broker.bootstrap, "dup")
    with pytest.raises(Exception, match="TOPIC_ALREADY_EXISTS|already exists"):
        create_topic(broker.bootstrap, "dup")
    with pytest.raises(Exception, match="cleanup.policy"):  # compact is accepted (tests/test_compaction.py)
        create_topic(broker.bootstrap, "cmp", 1, {"cleanup.policy": "keep"})
    with pytest.raises(Exception, match="no.such.config"):
        create_topic(broker.bootstrap, "bad", 1, {"no.such.config": "1"})


def test_kafka_python_producer_and_consumer(broker):
    kafka = pytest.importorskip("kafka")
    create_topic(broker.bootstrap, "kp", 2)
    prod = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", compression_type="gzip")
    for i in range(100):
        prod.send("kp", key=b"%d" % (i % 5), value=b"v%d" % i)
    prod.flush(30)
    prod.close()
    cons = kafka.KafkaConsumer("kp", bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                               group_id="kpg", consumer_timeout_ms=15000)
    got = []
    for m in cons:
        got.append(m.value)
        if len(got) == 100:
            break
    cons.close()
    assert sorted(got) == sorted(b"v%d" % i for i in range(100))


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is installed by the README test command")
def test_kcat_metadata_produce_consume(broker):
    create_topic(broker.bootstrap, "kc", 1)
    md = subprocess.run(["kcat", "-b", broker.bootstrap, "-L", "-J"], capture_output=True, timeout=30, check=True)
    meta = json.loads(md.stdout)
    assert any(t["topic"] == "kc" for t in meta["topics"])
    subprocess.run(["kcat", "-b", broker.bootstrap, "-P", "-t", "kc", "-K:"], input=b"k1:v1\nk2:v2\n",
                   timeout=30, check=True)
    out = subprocess.run(["kcat", "-b", broker.bootstrap, "-C", "-t", "kc", "-e", "-f", "%k=%s\\n"],
                         capture_output=True, timeout=30, check=True)
    assert out.stdout.decode().splitlines() == ["k1=v1", "k2=v2"]


def test_restart_keeps_topics_configs_and_data(broker):
    create_topic(broker.bootstrap, "keep", 2, {"retention.ms": "7200000"})
    produce(broker.bootstrap, "keep", [b"r%d" % i for i in range(100)])
    broker.restart()
    res = ConfigResource(ConfigResource.Type.TOPIC, "keep")
    a = admin(broker.bootstrap)
    assert a.describe_configs([res])[res].result(20)["retention.ms"].value == "7200000"
    assert len(consume_all(broker.bootstrap, "keep", 100)) == 100


def test_kill9_after_acks_all_loses_nothing(broker):
    create_topic(broker.bootstrap, "dur", 1)
    acked = produce(broker.bootstrap, "dur", [b"d%d" % i for i in range(500)], acks="all", **{"enable.idempotence": True})
    assert len(acked) == 500
    broker.kill9()
    broker.start()
    msgs = consume_all(broker.bootstrap, "dur", 500)
    assert [m.value() for m in msgs] == [b"d%d" % i for i in range(500)]


def test_large_produce_requests_roundtrip(broker):
    """1 MiB batches arrive in frames far larger than the socket buffer (read in place)."""
    create_topic(broker.bootstrap, "big")
    values = [bytes([i % 251]) * 1000 + b"%06d" % i for i in range(4000)]
    produce(broker.bootstrap, "big", values, **{"batch.size": 1048576, "linger.ms": 50, "compression.type": "none"})
    msgs = consume_all(broker.bootstrap, "big", 4000)
    assert [m.value() for m in msgs] == values
