"""The request versions Kafka 4 clients send (#28 item 4), at the wire level against one real
broker: Metadata v13, DescribeTopicPartitions with its cursor, ListOffsets v10, Fetch v16/v17,
the telemetry APIs without a receiver, ApiVersions' feature levels — written only to clients
that read tagged fields — and librdkafka / kafka-python still working."""

from __future__ import annotations

import socket
import struct
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from confluent_kafka import Consumer, Producer
from kio.schema.errors import ErrorCode

from kcli.protocol import codec
from kcli.protocol.client import WireClient
from tests.brokerproc import BrokerProcess
from tests.diskless_helpers import DISKLESS, FAST
from tests.kafka_helpers import create_topic


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("kafka4") / "data", FAST).start()
    try:
        create_topic(b.bootstrap, "k4-a", 3)
        create_topic(b.bootstrap, "k4-b", 2)
        create_topic(b.bootstrap, "k4-c", 1)
        create_topic(b.bootstrap, "k4-d", 1, DISKLESS)
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
        now = int(time.time() * 1000)
        for i in range(5):  # increasing timestamps: ListOffsets -3 finds the last record
            p.produce("k4-a", b"v%d" % i, partition=0, timestamp=now + i)
            p.produce("k4-d", b"d%d" % i, partition=0, timestamp=now + i)
        assert p.flush(30) == 0
        yield b
    finally:
        b.stop()


def api_versions_raw(bootstrap: str, version: int, name: str, sw_version: str) -> bytes:
    """One ApiVersions request with the given client software; the raw response body (after the
    size, correlation id), to look at the bytes the client would parse."""
    body = {"client_software_name": name, "client_software_version": sw_version}
    cls = codec.request_class(18, version)
    from kio.serial import entity_writer
    import io

    out = io.BytesIO()
    entity_writer(cls)(out, codec.build(cls, body))
    client_id = b"t"
    header = struct.pack(">hhih", 18, version, 7, len(client_id)) + client_id + b"\0"  # header v2: tags
    frame = header + out.getvalue()
    host, port = bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _recv(s, 4))[0]
        data = _recv(s, size)
    assert struct.unpack(">i", data[:4])[0] == 7
    return data[4:]


def _recv(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, "connection closed"
        buf += chunk
    return buf


def _tail_tags(body: bytes, version: int) -> Any:
    """Decode the response and return (entity, bytes of its top-level tagged-field section)."""
    data = struct.pack(">i", 1) + body
    entity = codec.decode_response(18, version, data, 1)
    # Without features the body ends with an empty tag section: one 0 byte after throttle_time.
    return entity


@pytest.mark.parametrize("version", [3, 4])
def test_api_versions_features_only_for_clients_that_read_tagged_fields(broker: BrokerProcess, version: int) -> None:
    plain = api_versions_raw(broker.bootstrap, version, "librdkafka", "2.0.2")
    old_wrapper = api_versions_raw(broker.bootstrap, version, "confluent-kafka-python", "1.9.2-rdkafka-1.9.2")
    new_wrapper = api_versions_raw(broker.bootstrap, version, "confluent-kafka-python", "2.16.1-rdkafka-2.16.0")
    java = api_versions_raw(broker.bootstrap, version, "apache-kafka-java", "4.0.0")
    for raw in (plain, old_wrapper):  # librdkafka < 2.2: no tagged field at all, the section is empty
        assert raw.endswith(b"\x00\x00\x00\x00\x00"), raw[-8:].hex()  # throttle_time 0, then 0 tags
        e = _tail_tags(raw, version)
        assert e.supported_features == () and e.finalized_features == () and e.finalized_features_epoch == -1
    for raw in (new_wrapper, java):
        assert len(raw) > len(plain)
        e = _tail_tags(raw, version)
        supported = {f.name: (int(f.min_version), int(f.max_version)) for f in e.supported_features}
        finalized = {f.name: (int(f.min_version_level), int(f.max_version_level)) for f in e.finalized_features}
        if version >= 4:
            assert supported["transaction.version"] == (0, 2)
        else:  # a minimum of 0 is left out before v4 (KAFKA-17492), as Kafka does
            assert supported == {}
        assert finalized["transaction.version"] == (2, 2)  # Kafka 4.0's level for a new cluster
        keys = {int(k.api_key) for k in e.api_keys}
        if 68 in keys:  # the consumer group protocol is served: group.version 1, as Kafka 4
            assert finalized["group.version"] == (1, 1)
        assert ("share.version" in finalized) == (76 in keys)
        assert int(e.finalized_features_epoch) >= 0
    # what the lists say is served
    e = _tail_tags(java, version)
    listed = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in e.api_keys}
    assert listed[3] == (0, 13) and listed[1] == (4, 17) and listed[2] == (1, 10) and listed[75] == (0, 0)
    assert listed[18] == (0, 4) and listed[0][1] == 12 and listed[26][1] == 5
    assert 71 not in listed and 72 not in listed  # no telemetry receiver: not announced, as Kafka


def test_api_versions_v0_to_v2_carry_no_features(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        for v in (0, 1, 2):
            resp = c.request(18, v, {})
            assert resp.error_code == 0 and any(int(k.api_key) == 75 for k in resp.api_keys)


def test_metadata_v13_and_v12(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        for v in (12, 13):
            md = c.request(3, v, {"topics": None, "allow_auto_topic_creation": False,
                                  "include_topic_authorized_operations": False})
            names = {t.name: t for t in md.topics}
            assert {"k4-a", "k4-b", "k4-c", "k4-d"} <= set(names)
            assert len(names["k4-a"].partitions) == 3 and names["k4-a"].topic_id.int != 0
            if v == 13:
                assert md.error_code == 0  # v13's top-level error code (KIP-1102)
        md = c.request(3, 13, {"topics": [{"name": "nope-k4", "topic_id": None}], "allow_auto_topic_creation": False,
                               "include_topic_authorized_operations": False})
        assert md.topics[0].error_code == ErrorCode.unknown_topic_or_partition


def _dtp(c: WireClient, topics: list[str], limit: int, cursor: tuple[str, int] | None = None) -> Any:
    return c.request(75, 0, {"topics": [{"name": n} for n in topics], "response_partition_limit": limit,
                             "cursor": {"topic_name": cursor[0], "partition_index": cursor[1]} if cursor else None})


def test_describe_topic_partitions_pages_with_its_cursor(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        # all topics, two partitions a page: a, a | a, b | b, c | d
        pages, cursor = [], None
        for _ in range(10):
            resp = _dtp(c, [], 2, cursor)
            pages.append([(t.name, int(p.partition_index)) for t in resp.topics for p in t.partitions
                          if t.name.startswith("k4-")])
            if resp.next_cursor is None:
                break
            cursor = (resp.next_cursor.topic_name, int(resp.next_cursor.partition_index))
        seen = [tp for page in pages for tp in page]
        assert seen == [("k4-a", 0), ("k4-a", 1), ("k4-a", 2), ("k4-b", 0), ("k4-b", 1), ("k4-c", 0), ("k4-d", 0)]
        assert all(len(page) <= 2 for page in pages)
        # named topics (one unknown), a cursor in the middle of a topic
        resp = _dtp(c, ["k4-b", "k4-a", "k4-zz"], 10, ("k4-a", 1))
        got = {t.name: t for t in resp.topics}
        assert [int(p.partition_index) for p in got["k4-a"].partitions] == [1, 2]
        assert got["k4-a"].partitions[0].leader_id >= 0 and got["k4-a"].topic_id.int != 0
        assert got["k4-a"].partitions[0].eligible_leader_replicas == ()
        assert len(got["k4-b"].partitions) == 2 and resp.next_cursor is None
        assert got["k4-zz"].error_code == ErrorCode.unknown_topic_or_partition
        # a page that ends exactly at a topic's end points at the next topic
        resp = _dtp(c, ["k4-a", "k4-b"], 3)
        assert (resp.next_cursor.topic_name, int(resp.next_cursor.partition_index)) == ("k4-b", 0)
        # the cursor's topic must be one of those asked for (INVALID_REQUEST, the connection stays)
        resp = _dtp(c, ["k4-b"], 3, ("k4-a", 0))
        assert {int(t.error_code) for t in resp.topics} == {ErrorCode.invalid_request}
        resp = _dtp(c, ["k4-a"], 3, ("k4-a", -1))
        assert {int(t.error_code) for t in resp.topics} == {ErrorCode.invalid_request}
        assert _dtp(c, ["k4-c"], 1).topics[0].error_code == 0


def test_list_offsets_v10_and_v9(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        for v, extra in ((9, {}), (10, {"timeout": 5000})):
            for topic in ("k4-a", "k4-d"):
                resp = c.request(2, v, {"replica_id": -1, "isolation_level": 0, **extra, "topics": [
                    {"name": topic, "partitions": [
                        {"partition_index": 0, "current_leader_epoch": -1, "timestamp": ts}
                        for ts in (-1, -2, -3)]}]})
                offsets = [int(p.offset) for p in resp.topics[0].partitions]
                assert [int(p.error_code) for p in resp.topics[0].partitions] == [0, 0, 0]
                assert offsets[0] == 5 and offsets[1] == 0 and offsets[2] == 4, (v, topic, offsets)
            # -5 LATEST_TIERED on a topic without tiering: nothing tiered
            resp = c.request(2, v, {"replica_id": -1, "isolation_level": 0, **extra, "topics": [
                {"name": "k4-a", "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": -5}]}]})
            assert resp.topics[0].partitions[0].error_code == 0
            assert int(resp.topics[0].partitions[0].offset) == -1


@pytest.mark.parametrize("version", [16, 17])
def test_fetch_v16_v17_by_topic_id(broker: BrokerProcess, version: int) -> None:
    with WireClient(broker.bootstrap) as c:
        md = c.request(3, 12, {"topics": [{"name": "k4-a", "topic_id": None}, {"name": "k4-d", "topic_id": None}],
                               "allow_auto_topic_creation": False, "include_topic_authorized_operations": False})
        ids = {t.name: t.topic_id for t in md.topics}
        resp = c.request(1, version, {
            "max_wait": 100, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 1, "session_id": 0,
            "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [], "topics": [
                {"topic_id": ids[n], "partitions": [{"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                                                     "last_fetched_epoch": -1, "log_start_offset": -1,
                                                     "partition_max_bytes": 1 << 20}]} for n in ("k4-a", "k4-d")] +
            [{"topic_id": uuid.uuid4(), "partitions": [{"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                                                         "last_fetched_epoch": -1, "log_start_offset": -1,
                                                         "partition_max_bytes": 100}]}]})
        assert resp.error_code == 0 and resp.node_endpoints == ()
        by_id = {r.topic_id: r.partitions[0] for r in resp.responses}
        for n in ("k4-a", "k4-d"):
            p = by_id[ids[n]]
            assert p.error_code == 0 and p.high_watermark == 5 and p.last_stable_offset == 5 and p.records
        unknown = [r for r in resp.responses if r.topic_id not in ids.values()]
        assert unknown[0].partitions[0].error_code == ErrorCode.unknown_topic_id


def test_telemetry_apis_answer_as_kafka_without_a_receiver(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        sub = c.request(71, 0, {"client_instance_id": uuid.UUID(int=0)})
        assert sub.error_code == 0 and sub.client_instance_id.int != 0 and sub.requested_metrics == ()
        again = c.request(71, 0, {"client_instance_id": sub.client_instance_id})
        assert again.client_instance_id == sub.client_instance_id and again.subscription_id == sub.subscription_id
        push = {"client_instance_id": sub.client_instance_id, "subscription_id": sub.subscription_id,
                "terminating": False, "compression_type": 0, "metrics": b""}
        assert c.request(72, 0, push).error_code == 0
        assert c.request(72, 0, {**push, "subscription_id": sub.subscription_id + 1}).error_code == \
            ErrorCode.unknown_subscription_id
        assert c.request(72, 0, {**push, "client_instance_id": uuid.UUID(int=0)}).error_code == ErrorCode.invalid_request


def test_librdkafka_2_16_reads_features_and_kcat_with_librdkafka_2_0_does_not_break(broker: BrokerProcess,
                                                                                      tmp_path: Path) -> None:
    """librdkafka 2.16 gets the feature tags (it reads them); kcat, built on the system's
    librdkafka 2.0 which mis-parses tagged fields, gets none and still lists and consumes."""
    import shutil
    import subprocess

    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "k4-g", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    try:
        md = c.list_topics(timeout=20)
        assert {"k4-a", "k4-d"} <= set(md.topics)
        c.subscribe(["k4-a", "k4-d"])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 10 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append(m.value())
        assert len(got) == 10
    finally:
        c.close()
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed")
    out = subprocess.run([kcat, "-b", broker.bootstrap, "-L", "-t", "k4-a"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "k4-a" in out.stdout and "3 partitions" in out.stdout, out.stderr
    out = subprocess.run([kcat, "-b", broker.bootstrap, "-C", "-t", "k4-a", "-p", "0", "-o", "beginning", "-e", "-q"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.split() == [f"v{i}" for i in range(5)], out.stderr


def test_kafka_python_with_the_new_metadata_versions(broker: BrokerProcess) -> None:
    kafka = pytest.importorskip("kafka")
    consumer = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, consumer_timeout_ms=10000,
                                   enable_auto_commit=False)
    values: list[bytes] = []
    try:
        assert {"k4-a", "k4-d"} <= consumer.topics()  # Metadata at the highest version both speak
        tp = kafka.TopicPartition("k4-a", 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        for m in consumer:
            values.append(m.value)
            if len(values) == 5:
                break
    finally:
        consumer.close()
    assert values == [b"v%d" % i for i in range(5)]


def test_describe_topic_partitions_checks_describe_on_each_topic(tmp_path: Path) -> None:
    """With an authorizer: a topic the principal may not describe is left out of an all-topics
    page (and does not count towards its limit) and refused by name; telemetry needs no ACL."""
    from confluent_kafka.admin import (
        AclBinding, AclOperation, AclPermissionType, AdminClient, ResourcePatternType, ResourceType,
    )

    b = BrokerProcess(tmp_path / "data", {**FAST, "allow.everyone.if.no.acl.found": "true",
                                          "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer"}).start()
    try:
        create_topic(b.bootstrap, "open-t", 2)
        create_topic(b.bootstrap, "secret-t", 2)
        acl = AclBinding(ResourceType.TOPIC, "secret-t", ResourcePatternType.LITERAL, "User:alice", "*",
                         AclOperation.DESCRIBE, AclPermissionType.ALLOW)  # named by an ACL: closed to others
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_acls([acl])[acl].result(15)
        with WireClient(b.bootstrap) as c:
            page = _dtp(c, [], 2)
            assert [(t.name, len(t.partitions)) for t in page.topics] == [("open-t", 2)] and page.next_cursor is None
            assert page.topics[0].topic_authorized_operations > 0
            named = {t.name: t for t in _dtp(c, ["open-t", "secret-t"], 10).topics}
            assert named["secret-t"].error_code == ErrorCode.topic_authorization_failed
            assert named["secret-t"].partitions == () and named["open-t"].error_code == 0
            assert c.request(71, 0, {"client_instance_id": uuid.UUID(int=0)}).error_code == 0
    finally:
        b.stop()
