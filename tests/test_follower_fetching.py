"""KIP-392 follower fetching on replicated classic partitions: with
``replica.selector.class=org.apache.kafka.common.replica.RackAwareReplicaSelector`` the leader
points a consumer with ``client.rack`` at the replica of its rack (Fetch's preferred_read_replica)
and that follower serves the records up to its high watermark; a follower answers a stale or a
future leader epoch as Kafka does. Three real brokers in racks a, b, c over one PostgreSQL."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, ElectionType, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kcli.protocol.client import WireClient
from kcli.protocol.errors import ErrorCode
from tests.brokerproc import BrokerProcess
from tests.fixtures_pg import pg_server  # noqa: F401 - fixture
from tests.replication_cluster import FEATURE_CONFIGS, FeatureCluster, describe, feature_cluster  # noqa: F401
from tests.replication_cluster import metrics_url
from tests.test_cluster_state import wait_for
from tests.test_observability import scrape

RACK_AWARE = "org.apache.kafka.common.replica.RackAwareReplicaSelector"
COUNT = 300


@pytest.fixture
def rc(feature_cluster: FeatureCluster) -> FeatureCluster:  # noqa: F811
    assert FEATURE_CONFIGS["replica.selector.class"] == RACK_AWARE
    return feature_cluster


def bytes_out(b: BrokerProcess, topic: str) -> float:
    """BrokerTopicMetrics BytesOutPerSec of ``topic`` on ``b``: what its Fetch answers carried."""
    return sum(v for (name, labels), v in scrape(metrics_url(b)).items()
               if name.startswith("kafka_server_brokertopicmetrics_bytesout") and ("topic", topic) in labels)


def produce(bootstrap: str, topic: str, count: int) -> list[bytes]:
    values = [f"ff-{i:05d}-".encode() + b"y" * 60 for i in range(count)]
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for v in values:
        p.produce(topic, v, partition=0)
    assert p.flush(30) == 0
    return values


def consume(bootstrap: str, topic: str, count: int, rack: str | None) -> list[bytes]:
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "group.id": f"ff-{uuid.uuid4()}",
                            "enable.auto.commit": False}
    if rack:
        conf["client.rack"] = rack
    c = Consumer(conf)
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(out) < count and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                out.append(m.value())
    finally:
        c.close()
    return out


def wire_fetch(bootstrap: str, topic: str, offset: int, rack: str, epoch: int = -1) -> Any:
    """One Fetch v11 partition answer, as a consumer (replica_id -1) of ``rack`` sends it."""
    with WireClient(bootstrap) as c:
        resp = c.request(1, 11, {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                                 "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                                 "topics": [{"topic": topic, "partitions": [{
                                     "partition": 0, "current_leader_epoch": epoch, "fetch_offset": offset,
                                     "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
                                 "forgotten_topics_data": [], "rack_id": rack})
    return resp.responses[0].partitions[0]


def test_a_consumer_with_client_rack_reads_from_the_follower_of_its_rack(rc):
    admin = AdminClient({"bootstrap.servers": rc.bootstrap})
    admin.create_topics([NewTopic("ff", 1, replica_assignment=[[1, 2, 3]])])["ff"].result(20)
    wait_for(lambda: len(describe(rc.bootstrap, "ff")[0].isrs) == 3, 20, "the ISR of ff")
    values = produce(rc.bootstrap, "ff", COUNT)
    b1, b2, b3 = (rc.brokers[n] for n in (1, 2, 3))

    # the leader (rack a) points a rack-c consumer at broker 3, and serves a rack-a one itself
    wait_for(lambda: int(wire_fetch(b1.bootstrap, "ff", 0, "c").preferred_read_replica) == 3, 10,
             "the leader to know broker 3 has the records")
    redirect = wire_fetch(b1.bootstrap, "ff", 0, "c")
    assert int(redirect.error_code) == 0 and not redirect.records
    own = wire_fetch(b1.bootstrap, "ff", 0, "a")
    assert int(own.preferred_read_replica) == -1 and own.records
    assert int(wire_fetch(b1.bootstrap, "ff", 0, "nowhere").preferred_read_replica) == -1

    # a confluent-kafka consumer in rack b: every record, and broker 2 (a follower) sent them
    before2, before3 = bytes_out(b2, "ff"), bytes_out(b3, "ff")
    assert consume(rc.bootstrap, "ff", COUNT, "b") == values
    served2 = bytes_out(b2, "ff") - before2
    assert served2 >= sum(len(v) for v in values), served2  # at least the values themselves
    assert bytes_out(b3, "ff") == before3  # the other follower served nothing

    # without client.rack the leader serves: the followers send nothing more
    assert consume(rc.bootstrap, "ff", COUNT, None) == values
    assert bytes_out(b2, "ff") - before2 == served2

    # the follower serves up to its high watermark; past the leader's too: OFFSET_OUT_OF_RANGE
    direct = wire_fetch(b2.bootstrap, "ff", COUNT - 1, "b")
    assert int(direct.error_code) == 0 and int(direct.high_watermark) == COUNT and direct.records
    assert int(wire_fetch(b2.bootstrap, "ff", COUNT + 50, "b").error_code) == ErrorCode.offset_out_of_range
    assert int(wire_fetch(b2.bootstrap, "ff", 0, "b", epoch=7).error_code) == ErrorCode.unknown_leader_epoch

    # a leader change: a consumer still at the old leader epoch is fenced by the follower
    with WireClient(b1.bootstrap) as c:
        resp = c.request(45, 0, {"timeout_ms": 10000, "topics": [
            {"name": "ff", "partitions": [{"partition_index": 0, "replicas": [2, 1, 3]}]}]})
    assert int(resp.responses[0].partitions[0].error_code) == 0

    def elected() -> bool:
        a = AdminClient({"bootstrap.servers": rc.bootstrap})  # kept alive until the result
        a.elect_leaders(ElectionType.PREFERRED, None).result(20)
        return describe(rc.bootstrap, "ff")[0].leader == 2

    wait_for(elected, 20, "broker 2 to lead ff")
    wait_for(lambda: int(wire_fetch(b3.bootstrap, "ff", 0, "c", epoch=1).error_code) == 0, 10,
             "broker 3 to follow in epoch 1")
    assert int(wire_fetch(b3.bootstrap, "ff", 0, "c", epoch=0).error_code) == ErrorCode.fenced_leader_epoch


def test_a_follower_behind_the_consumer_answers_offset_not_available(rc):
    """A replica still catching up (a reassignment added it, its fetches throttled) has not the
    consumer's offset: it answers OFFSET_NOT_AVAILABLE, and the leader does not point a consumer
    of its rack at it for that offset (only for one it has)."""
    from tests.test_replication_throttle import alter
    from confluent_kafka.admin import ResourceType

    b1, b3 = rc.brokers[1], rc.brokers[3]
    admin = AdminClient({"bootstrap.servers": rc.bootstrap})
    admin.create_topics([NewTopic("fb", 1, replica_assignment=[[1, 2]])])["fb"].result(20)
    p = Producer({"bootstrap.servers": rc.bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 8192})
    for i in range(2000):
        p.produce("fb", b"%06d-" % i + b"w" * 120, partition=0)
    assert p.flush(30) == 0
    alter(rc.bootstrap, ResourceType.BROKER, "3", {"follower.replication.throttled.rate": "20000"})
    alter(rc.bootstrap, ResourceType.TOPIC, "fb", {"follower.replication.throttled.replicas": "0:3"})
    try:
        with WireClient(b1.bootstrap) as c:
            resp = c.request(45, 0, {"timeout_ms": 10000, "topics": [
                {"name": "fb", "partitions": [{"partition_index": 0, "replicas": [1, 2, 3]}]}]})
        assert int(resp.responses[0].partitions[0].error_code) == 0
        wait_for(lambda: int(wire_fetch(b3.bootstrap, "fb", 1999, "c").error_code) == ErrorCode.offset_not_available,
                 10, "broker 3, behind, to answer OFFSET_NOT_AVAILABLE")
        ahead = wire_fetch(b1.bootstrap, "fb", 1999, "c")  # the leader serves what broker 3 lacks
        assert int(ahead.preferred_read_replica) == -1 and ahead.records
        assert int(wire_fetch(b1.bootstrap, "fb", 0, "c").preferred_read_replica) == 3  # it has offset 0
    finally:
        alter(rc.bootstrap, ResourceType.BROKER, "3", {"follower.replication.throttled.rate": None})
        alter(rc.bootstrap, ResourceType.TOPIC, "fb", {"follower.replication.throttled.replicas": None})
    wait_for(lambda: len(describe(rc.bootstrap, "fb")[0].isrs) == 3, 30, "broker 3 in the ISR of fb")
