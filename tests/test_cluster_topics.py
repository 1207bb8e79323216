"""Topics in a cluster (issue #16 "Topics in a cluster"): where partitions live and where Metadata
sends clients, with real broker processes over one PostgreSQL and one object store."""

from __future__ import annotations

import datetime
import time

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from kcli.protocol.client import WireClient
from tests.fixtures_pg import pg_database, pg_server  # noqa: F401 - fixtures
from tests.kafka_helpers import consume_all, produce
from tests.test_cluster_state import DISKLESS, FAST, wait_for
from tests.wire_helpers import batch, produce_body, produce_result


def start(broker_factory, url: str, node_id: int, rack: str, objects) -> object:  # noqa: ANN001
    return broker_factory(FAST, name=f"node{node_id}",
                          extra_args=["--cluster", url, "--node-id", str(node_id), "--rack", rack,
                                      "--object-store", objects.as_uri()])


def partitions_of(bootstrap: str, topic: str, client_id: str = "t") -> dict[int, object]:
    md = AdminClient({"bootstrap.servers": bootstrap, "client.id": client_id}).list_topics(topic, timeout=10)
    return dict(md.topics[topic].partitions)


def create(bootstrap: str, topic: NewTopic) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([topic])[topic.topic].result(15)


def create_error(bootstrap: str, topic: NewTopic) -> KafkaError:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    with pytest.raises(KafkaException) as err:
        admin.create_topics([topic])[topic.topic].result(15)
    return err.value.args[0]


@pytest.fixture
def two_brokers(broker_factory, pg_database, tmp_path):  # noqa: F811
    b1 = start(broker_factory, pg_database, 1, "rack-a", tmp_path / "objects")
    b2 = start(broker_factory, pg_database, 2, "rack-b", tmp_path / "objects")
    wait_for(lambda: len(AdminClient({"bootstrap.servers": b1.bootstrap}).list_topics(timeout=10).brokers) == 2,
             10, "both brokers registered")
    return b1, b2


def test_classic_partitions_are_hosted_by_one_broker_each(two_brokers):
    """Each classic partition's log lives on one broker (spread over the brokers); the other one
    answers NOT_LEADER_OR_FOLLOWER and Metadata names the host; while the host is down its
    partitions are offline (LEADER_NOT_AVAILABLE), and they come back with it."""
    b1, b2 = two_brokers
    create(b1.bootstrap, NewTopic("classic", 4, 1))
    parts = wait_for(lambda: (p := partitions_of(b2.bootstrap, "classic")) and len(p) == 4 and p, 10, "topic on broker 2")
    hosts = {i: p.leader for i, p in parts.items()}
    assert set(hosts.values()) == {1, 2}, hosts  # spread
    assert all(p.replicas == [p.leader] for p in parts.values())
    by_node = {1: b1, 2: b2}
    for i, host in hosts.items():
        other = by_node[3 - host]
        wait_for(lambda i=i, host=host: (by_node[host].data_dir / f"classic-{i}").is_dir(), 10, "the host's log dir")
        assert not (other.data_dir / f"classic-{i}").exists()
        with WireClient(other.bootstrap) as client:
            err, _ = produce_result(client.request(0, 9, produce_body("classic", i, batch([b"x"]))))
        assert err == ErrorCode.not_leader_or_follower
    values = [b"v%03d" % i for i in range(200)]
    produce(b1.bootstrap, "classic", values, keys=[b"%d" % i for i in range(200)], **{"enable.idempotence": True})
    got = consume_all(b2.bootstrap, "classic", len(values), timeout=60)
    assert sorted(m.value() for m in got) == values

    b2.kill9()
    offline = [i for i, h in hosts.items() if h == 2]
    after = wait_for(lambda: (p := partitions_of(b1.bootstrap, "classic")) and all(p[i].leader == -1 for i in offline) and p,
                     12, "broker 2's partitions to go offline")
    assert all(after[i].leader == 1 for i, h in hosts.items() if h == 1)
    assert all(after[i].error is not None and after[i].error.code() == KafkaError.LEADER_NOT_AVAILABLE for i in offline)
    b2.start()
    wait_for(lambda: all(p.leader == hosts[i] for i, p in partitions_of(b1.bootstrap, "classic").items()), 15,
             "broker 2's partitions to come back")
    got = consume_all(b1.bootstrap, "classic", len(values), timeout=60)
    assert sorted(m.value() for m in got) == values  # nothing lost with the restart


def test_replication_factor_rules_in_a_cluster(two_brokers):
    b1, _ = two_brokers
    create(b1.bootstrap, NewTopic("rf2", 1, 2))  # classic partitions are replicated in a cluster (docs/replication.md)
    assert sorted(partitions_of(b1.bootstrap, "rf2")[0].replicas) == [1, 2]
    err = create_error(b1.bootstrap, NewTopic("rf3c", 1, 3))
    assert err.code() == KafkaError.INVALID_REPLICATION_FACTOR and "only 2 broker(s) are registered" in err.str()
    err = create_error(b1.bootstrap, NewTopic("rf3", 1, 3, config=DISKLESS))
    assert err.code() == KafkaError.INVALID_REPLICATION_FACTOR and "only 2 broker(s) are registered" in err.str()
    create(b1.bootstrap, NewTopic("d2", 6, 2, config=DISKLESS))  # metadata-only replicas in both racks
    parts = partitions_of(b1.bootstrap, "d2")
    assert all(sorted(p.replicas) == [1, 2] for p in parts.values())
    assert {p.replicas[0] for p in parts.values()} == {1, 2}  # preferred leaders spread
    err = create_error(b1.bootstrap, NewTopic("tiered", 1, 1, config={"remote.storage.enable": "true"}))
    assert err.code() == KafkaError.INVALID_CONFIG  # these brokers have no tiered storage configured


def test_diskless_leaders_follow_the_clients_rack_and_the_live_brokers(two_brokers):
    b1, b2 = two_brokers
    create(b1.bootstrap, NewTopic("dl", 8, 1, config=DISKLESS))
    plain = wait_for(lambda: (p := partitions_of(b1.bootstrap, "dl")) and len(p) == 8 and p, 10, "the topic")
    assert {p.leader for p in plain.values()} == {1, 2}  # spread
    assert {i: p.leader for i, p in partitions_of(b2.bootstrap, "dl").items()} == {i: p.leader for i, p in plain.items()}
    for rack, node in (("rack-a", 1), ("rack-b", 2)):
        hinted = partitions_of(b1.bootstrap, "dl", client_id=f"app,diskless_rack_id={rack}")
        assert {p.leader for p in hinted.values()} == {node}

    # KIP-392: a Fetch carrying client.rack is pointed at a broker of that rack
    topic_id = None
    with WireClient(b1.bootstrap) as client:
        md = client.request(3, 12, {"topics": [{"name": "dl", "topic_id": None}], "allow_auto_topic_creation": False,
                                    "include_topic_authorized_operations": False})
        topic_id = md.topics[0].topic_id
        resp = client.request(1, 12, {
            "replica_id": -1, "max_wait": datetime.timedelta(milliseconds=100), "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1, "cluster_id": None, "replica_state": None,
            "topics": [{"topic": "dl", "topic_id": topic_id, "partitions": [
                {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
                 "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": "rack-b"})
    assert resp.responses[0].partitions[0].preferred_read_replica == 2
    values = [b"%04d" % i for i in range(200)]
    produce(b1.bootstrap, "dl", values, **{"enable.idempotence": True, "client.id": "p,diskless_rack_id=rack-a"})
    got = consume_all(b1.bootstrap, "dl", len(values), timeout=60, **{"client.rack": "rack-b"})
    assert sorted(m.value() for m in got) == values

    b2.kill9()
    wait_for(lambda: {p.leader for p in partitions_of(b1.bootstrap, "dl").values()} == {1}, 12,
             "every partition led by the survivor")
    hinted = partitions_of(b1.bootstrap, "dl", client_id="app,diskless_rack_id=rack-b")
    assert {p.leader for p in hinted.values()} == {1}  # the rack has no live broker: any live one
    started = time.monotonic()
    produce(b1.bootstrap, "dl", [b"after"], **{"enable.idempotence": True})
    assert time.monotonic() - started < 30


def test_a_fetch_waiting_on_one_broker_wakes_when_another_commits(two_brokers):
    """Broker 2 learns of broker 1's commits through the shared state at once (NOTIFY), not at
    its next refresh from the coordinator (diskless.retention.check.interval.ms, 60 s)."""
    from confluent_kafka import Consumer, TopicPartition

    b1, b2 = two_brokers
    create(b1.bootstrap, NewTopic("tail", 1, 1, config=DISKLESS))
    wait_for(lambda: partitions_of(b2.bootstrap, "tail"), 10, "broker 2 to learn the topic")
    c = Consumer({"bootstrap.servers": b2.bootstrap, "group.id": "tail", "client.id": "c,diskless_rack_id=rack-b",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition("tail", 0, 0)])
        assert c.poll(2.0) is None  # at the log end on broker 2
        produce(b1.bootstrap, "tail", [b"one", b"two"], **{"client.id": "p,diskless_rack_id=rack-a"})
        got: list[bytes] = []
        deadline = time.monotonic() + 15
        while len(got) < 2 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and not m.error():
                got.append(m.value())
    finally:
        c.close()
    assert got == [b"one", b"two"]


def test_a_single_node_data_dir_keeps_its_logs_under_another_node_id(broker_factory):
    """A single broker holds every partition of its data dir, whatever node.id made them: a
    restart with another node.id serves the same classic logs (no NOT_LEADER, nothing hidden)."""
    b = broker_factory({"node.id": "1"})
    create(b.bootstrap, NewTopic("kept", 2, 1))
    produce(b.bootstrap, "kept", [b"a", b"b", b"c"], keys=[b"1", b"2", b"3"])
    b.stop()
    b.configs["node.id"] = "7"
    b.start()
    parts = partitions_of(b.bootstrap, "kept")
    assert {p.leader for p in parts.values()} == {7}
    assert sorted(m.value() for m in consume_all(b.bootstrap, "kept", 3, timeout=30)) == [b"a", b"b", b"c"]
