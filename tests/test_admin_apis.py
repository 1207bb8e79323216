"""Admin APIs that operators' tools call (#17), with real clients against real broker processes:
ListOffsets max timestamp (KIP-734) on classic, tiered and diskless partitions, OffsetDelete,
OffsetForLeaderEpoch, DescribeLogDirs, and the answer to an API kcli does not serve."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import OffsetSpec
from kio.schema.errors import ErrorCode

from kcli.protocol.client import WireClient
from tests.diskless_helpers import DISKLESS, FAST
from tests.diskless_helpers import wait_until
from tests.kafka_helpers import admin, create_topic

NOW = int(time.time() * 1000) - 600_000  # inside the default retention


def produce_timestamps(bootstrap: str, topic: str, timestamps: list[int], **conf: Any) -> None:
    """One record per timestamp, in order, each its own batch (so batches interleave timestamps)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1, **conf})
    errors: list[Any] = []
    for i, ts in enumerate(timestamps):
        p.produce(topic, b"v%04d-" % i + b"x" * 100, partition=0, timestamp=ts,
                  on_delivery=lambda err, _m: errors.append(err) if err else None)
        p.poll(0)
    assert p.flush(30) == 0 and not errors, errors[:3]


def max_timestamp(bootstrap: str, topic: str) -> tuple[int, int]:
    """confluent-kafka's AdminClient.list_offsets with OffsetSpec.max_timestamp() (ListOffsets v7+, -3)."""
    a = admin(bootstrap)
    tp = TopicPartition(topic, 0)
    info = a.list_offsets({tp: OffsetSpec.max_timestamp()}, request_timeout=20)[tp].result(20)
    return info.offset, info.timestamp


# Offsets 0..29: the largest timestamp sits at offset 17 and again at 25 (the first one counts),
# inside a run of smaller ones, so neither the last record nor the last batch holds it.
TIMESTAMPS = [NOW + i for i in range(30)]
TIMESTAMPS[17] = TIMESTAMPS[25] = NOW + 5000


@pytest.mark.parametrize("kind", ["classic", "diskless"])
def test_list_offsets_max_timestamp(broker_factory, kind: str) -> None:  # noqa: ANN001
    b = broker_factory(FAST)
    config = {"segment.bytes": "1024"} if kind == "classic" else dict(DISKLESS)  # several classic segments
    create_topic(b.bootstrap, "ts", config=config)
    assert max_timestamp(b.bootstrap, "ts") == (-1, -1)  # an empty partition: no record
    produce_timestamps(b.bootstrap, "ts", TIMESTAMPS)
    if kind == "classic":
        assert len(list((b.data_dir / "ts-0").glob("*.log"))) > 2
    assert max_timestamp(b.bootstrap, "ts") == (17, NOW + 5000)
    # a later, larger timestamp takes over; kept across a restart
    produce_timestamps(b.bootstrap, "ts", [NOW + 9000, NOW + 1])
    assert max_timestamp(b.bootstrap, "ts") == (30, NOW + 9000)
    b.restart()
    assert max_timestamp(b.bootstrap, "ts") == (30, NOW + 9000)


def test_list_offsets_max_timestamp_tiered(broker_factory) -> None:  # noqa: ANN001
    """The largest timestamp sits in a segment that is only in remote storage now."""
    from tests.test_tiered import TIERED_BROKER, list_offset, remote_segments

    b = broker_factory(TIERED_BROKER)
    create_topic(b.bootstrap, "tt", config={"remote.storage.enable": "true", "segment.bytes": "1024",
                                             "local.retention.bytes": "1"})
    produce_timestamps(b.bootstrap, "tt", TIMESTAMPS + [NOW + 100 + i for i in range(30)])
    wait_until(lambda: list_offset(b.bootstrap, "tt", -4) > 25, 30, what="offset 25 only in remote storage")
    assert remote_segments(b.data_dir)
    assert max_timestamp(b.bootstrap, "tt") == (17, NOW + 5000)


# ---- OffsetForLeaderEpoch ---------------------------------------------------------------------------
def epoch_end(bootstrap: str, topic: str, partition: int, requested: int, current: int = -1, version: int = 4) -> tuple[int, int, int]:
    body = {"replica_id": -1, "topics": [{"topic": topic, "partitions": [
        {"partition": partition, "current_leader_epoch": current, "leader_epoch": requested}]}]}
    if version < 3:
        body.pop("replica_id")
    with WireClient(bootstrap) as c:
        p = c.request(23, version, body).topics[0].partitions[0]
    return int(p.error_code), int(p.leader_epoch), int(p.end_offset)


@pytest.mark.parametrize("kind", ["classic", "diskless"])
def test_offset_for_leader_epoch(broker_factory, kind: str) -> None:  # noqa: ANN001
    b = broker_factory(FAST)
    create_topic(b.bootstrap, "e", config=DISKLESS if kind == "diskless" else None)
    produce_timestamps(b.bootstrap, "e", [NOW] * 7)
    epoch = admin(b.bootstrap).list_topics("e", timeout=20).topics["e"].partitions[0]
    assert epoch.error is None
    for version in (2, 3, 4):
        assert epoch_end(b.bootstrap, "e", 0, 0, version=version) == (0, 0, 7)  # the current epoch ends at the log end
    assert epoch_end(b.bootstrap, "e", 0, 0, current=0) == (0, 0, 7)
    assert epoch_end(b.bootstrap, "e", 0, 5) == (0, -1, -1)  # an epoch the partition never had
    assert epoch_end(b.bootstrap, "e", 0, -1) == (0, -1, -1)
    assert epoch_end(b.bootstrap, "e", 0, 0, current=3) == (ErrorCode.unknown_leader_epoch, -1, -1)
    assert epoch_end(b.bootstrap, "e", 7, 0) == (ErrorCode.unknown_topic_or_partition, -1, -1)
    assert epoch_end(b.bootstrap, "nope", 0, 0) == (ErrorCode.unknown_topic_or_partition, -1, -1)


def test_consumer_validates_its_position_with_offset_for_leader_epoch(broker) -> None:  # noqa: ANN001
    """librdkafka (KIP-320) validates a position that carries a leader epoch (an assign or seek
    with one, a leader change) with OffsetForLeaderEpoch before it fetches; with the epoch's end
    at the log end nothing was truncated, and the consumer goes on from that position."""
    import logging

    create_topic(broker.bootstrap, "v")
    produce_timestamps(broker.bootstrap, "v", [NOW] * 10)
    first = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "val", "auto.offset.reset": "earliest",
                      "enable.auto.commit": False})
    first.assign([TopicPartition("v", 0, 0)])
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < 4 and time.monotonic() < deadline:
        m = first.poll(0.5)
        if m is not None and not m.error():
            got.append(m)
    assert [m.offset() for m in got] == [0, 1, 2, 3] and got[-1].leader_epoch() == 0
    first.commit(message=got[-1], asynchronous=False)  # offset 4 with leader epoch 0
    first.close()

    lines: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    log = logging.getLogger("rdkafka-validate")
    log.addHandler(Capture())
    log.setLevel(logging.DEBUG)
    second = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "val", "enable.auto.commit": False,
                       "debug": "protocol,consumer,fetch", "logger": log})
    try:
        committed = second.committed([TopicPartition("v", 0)], timeout=20)[0]
        assert (committed.offset, committed.leader_epoch) == (4, 0)
        second.assign([committed])  # a position with a leader epoch: validated first
        msgs = []
        deadline = time.monotonic() + 30
        while len(msgs) < 6 and time.monotonic() < deadline:
            m = second.poll(0.5)
            if m is not None:
                assert not m.error(), m.error()
                msgs.append(m.offset())
    finally:
        second.close()
    assert msgs == [4, 5, 6, 7, 8, 9]
    sent = [ln for ln in lines if "OffsetForLeaderEpoch" in ln]
    assert any("Sent OffsetForLeaderEpochRequest" in ln for ln in sent), lines[-40:]
    assert not [ln for ln in sent if "error" in ln.lower() and "NO_ERROR" not in ln], sent


# ---- DescribeLogDirs --------------------------------------------------------------------------------
def test_describe_log_dirs(broker_factory) -> None:  # noqa: ANN001
    from kafka import KafkaAdminClient

    b = broker_factory(FAST)
    create_topic(b.bootstrap, "two", partitions=2)
    create_topic(b.bootstrap, "dl", config=DISKLESS)
    produce_timestamps(b.bootstrap, "two", [NOW] * 5)
    produce_timestamps(b.bootstrap, "dl", [NOW] * 5)
    a = KafkaAdminClient(bootstrap_servers=b.bootstrap)
    try:
        out = a.describe_log_dirs()
    finally:
        a.close()
    assert [x["broker"] for x in out] == [1]
    [kp_dir] = out[0]["log_dirs"]
    with WireClient(b.bootstrap) as c:
        everything = c.request(35, 4, {"topics": None})
        one = c.request(35, 4, {"topics": [{"topic": "two", "partitions": [1]}, {"topic": "nope", "partitions": [0]}]})
        v1 = c.request(35, 1, {"topics": None})
    assert everything.error_code == 0 and len(everything.results) == 1
    d = everything.results[0]
    assert d.error_code == 0 and d.log_dir == str(b.data_dir.resolve())
    assert 0 < d.usable_bytes <= d.total_bytes
    sizes = {(t.name, p.partition_index): (p.partition_size, p.offset_lag, p.is_future_key) for t in d.topics for p in t.partitions}
    # classic partitions with their local size; the diskless topic has no local log
    expected = sum(f.stat().st_size for f in (b.data_dir / "two-0").glob("*.log"))
    assert sizes == {("two", 0): (expected, 0, False), ("two", 1): (0, 0, False)}
    assert expected > 500
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in one.results[0].topics] == [("two", [1])]
    assert {t.name for t in v1.results[0].topics} == {"two"}
    # kafka-python's call sees the same
    assert kp_dir["log_dir"] == d.log_dir and kp_dir["total_bytes"] == d.total_bytes
    assert {(t["name"], p["partition_index"]): (p["partition_size"], p["offset_lag"], p["is_future_key"])
            for t in kp_dir["topics"] for p in t["partitions"]} == sizes


# ---- OffsetDelete -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["classic", "diskless"])
def test_offset_delete_with_kafka_python(broker_factory, kind: str) -> None:  # noqa: ANN001
    """OffsetDelete (KIP-496) as kafka-python's delete_group_offsets sends it, after offsets set with
    confluent-kafka's alter_consumer_group_offsets; the answers of Kafka's handleDeleteOffsets."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KpTP
    from kafka.errors import GroupIdNotFoundError, GroupSubscribedToTopicError, NoError, UnknownTopicOrPartitionError

    b = broker_factory(FAST)
    config = DISKLESS if kind == "diskless" else None
    create_topic(b.bootstrap, "a", partitions=2, config=config)
    create_topic(b.bootstrap, "b", config=config)
    produce_timestamps(b.bootstrap, "a", [NOW] * 3)
    produce_timestamps(b.bootstrap, "b", [NOW] * 3)
    a = admin(b.bootstrap)
    offsets = [TopicPartition("a", 0, 2), TopicPartition("a", 1, 0), TopicPartition("b", 0, 3)]
    a.alter_consumer_group_offsets([ConsumerGroupTopicPartitions("ops", offsets)])["ops"].result(20)

    def committed() -> dict[tuple[str, int], int]:
        res = a.list_consumer_group_offsets([ConsumerGroupTopicPartitions("ops")])["ops"].result(20)
        return {(tp.topic, tp.partition): tp.offset for tp in res.topic_partitions if tp.offset >= 0}

    assert committed() == {("a", 0): 2, ("a", 1): 0, ("b", 0): 3}
    kp = KafkaAdminClient(bootstrap_servers=b.bootstrap)
    try:
        out = kp.delete_group_offsets("ops", [KpTP("a", 0), KpTP("a", 5), KpTP("gone", 0)])
        assert out == {KpTP("a", 0): NoError, KpTP("a", 5): UnknownTopicOrPartitionError,
                       KpTP("gone", 0): UnknownTopicOrPartitionError}
        assert committed() == {("a", 1): 0, ("b", 0): 3}
        with pytest.raises(GroupIdNotFoundError):
            kp.delete_group_offsets("no-such-group", [KpTP("a", 0)])
        # a live consumer subscribed to "b": its offsets stay, the others go
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "ops", "enable.auto.commit": False,
                      "auto.offset.reset": "earliest"})
        c.subscribe(["b"])
        try:
            wait_until(lambda: (c.poll(0.2), c.assignment())[1], 30, what="consumer joined")
            out = kp.delete_group_offsets("ops", [KpTP("a", 1), KpTP("b", 0)])
            assert out == {KpTP("a", 1): NoError, KpTP("b", 0): GroupSubscribedToTopicError}
        finally:
            c.close()
        assert committed() == {("b", 0): 3}
    finally:
        kp.close()


# ---- an API kcli does not serve ---------------------------------------------------------------------
# (api key, version, body): Kafka APIs kcli lacks, and versions below what kcli serves of one it has
UNSERVED = [
    (48, 1, {"components": [], "strict": False}),                                    # DescribeClientQuotas
    (2, 11, {"replica_id": -1, "isolation_level": 0, "timeout_ms": 1000, "topics": [  # ListOffsets v11 (kcli: 1-10)
        {"name": "t", "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1}]}]}),
]


def test_unserved_api_answers_unsupported_version_and_keeps_the_connection(broker) -> None:  # noqa: ANN001
    create_topic(broker.bootstrap, "t")
    with WireClient(broker.bootstrap) as c:
        listed = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in c.request(18, 3, {
            "client_software_name": "t", "client_software_version": "1"}).api_keys}
        for key, version, body in UNSERVED:
            assert key not in listed or not listed[key][0] <= version <= listed[key][1]
            resp = c.request(key, version, body)  # answered, on the same connection
            codes = [int(v) for v in _error_codes(resp)]
            assert codes and set(codes) == {ErrorCode.unsupported_version}, (key, resp)
        md = c.request(3, 12, {"topics": [{"name": "t", "topic_id": None}], "allow_auto_topic_creation": False,
                               "include_topic_authorized_operations": False})
    assert md.topics[0].error_code == 0
    assert {23, 35, 47}.issubset(listed) and listed[23] == (2, 4) and listed[35] == (1, 4)


def test_elect_leaders_on_one_broker_is_never_needed(broker) -> None:  # noqa: ANN001
    """ElectLeaders on a single broker (every partition has one replica, its preferred leader):
    ELECTION_NOT_NEEDED, and the broker keeps serving."""
    from confluent_kafka import ElectionType

    create_topic(broker.bootstrap, "t")
    a = admin(broker.bootstrap)
    got = a.elect_leaders(ElectionType.PREFERRED, [TopicPartition("t", 0)]).result(20)
    assert got[TopicPartition("t", 0)] is not None and "ELECTION_NOT_NEEDED" in got[TopicPartition("t", 0)].name()
    assert a.list_topics("t", timeout=20).topics["t"].error is None


def _error_codes(entity: Any) -> list[int]:
    """Every error_code field in a response entity, nested ones included."""
    import dataclasses

    out: list[int] = []
    for f in dataclasses.fields(entity):
        v = getattr(entity, f.name)
        if f.name == "error_code":
            out.append(v)
        elif isinstance(v, tuple):
            for item in v:
                if dataclasses.is_dataclass(item):
                    out += _error_codes(item)
    return out
