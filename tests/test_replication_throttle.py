"""Replication throttles (KIP-73) applied to a reassignment: with Kafka's broker configs
``leader.replication.throttled.rate`` / ``follower.replication.throttled.rate`` and topic configs
``leader.replication.throttled.replicas`` / ``follower.replication.throttled.replicas`` set (as
kafka-reassign-partitions --throttle sets them), a new replica catches up at the throttled byte
rate; with the configs removed (what --verify does once the move is done) at full speed. Two real
brokers over one PostgreSQL; rates are measured in bytes/s, not absolute times."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from kcli.protocol.client import WireClient
from tests.fixtures_pg import pg_server  # noqa: F401 - fixture
from tests.replication_cluster import FEATURE_CONFIGS, FeatureCluster, describe, feature_cluster  # noqa: F401
from tests.test_cluster_state import wait_for

RATE = 250_000  # bytes/s
RECORDS, SIZE = 1200, 1000  # ~1.2 MB per topic


@pytest.fixture
def tc(feature_cluster: FeatureCluster) -> FeatureCluster:  # noqa: F811
    assert FEATURE_CONFIGS["replication.quota.window.num"] == "2"  # a short window: a short burst
    return feature_cluster


def alter(bootstrap: str, kind: ResourceType, name: str, sets: dict[str, str | None]) -> None:
    ops = [ConfigEntry(k, v or "", incremental_operation=AlterConfigOpType.SET if v is not None
                       else AlterConfigOpType.DELETE) for k, v in sets.items()]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.incremental_alter_configs([ConfigResource(kind, name, incremental_configs=ops)]).values():
        fut.result(20)


def fill(bootstrap: str, topic: str) -> int:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "none",
                  "batch.size": 16384})  # batches well below replica.fetch.max.bytes
    for i in range(RECORDS):
        while True:
            try:
                p.produce(topic, f"{i:08d}".encode() + b"z" * (SIZE - 8), partition=0)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(30) == 0
    return RECORDS * SIZE


def move_rate(tc: FeatureCluster, topic: str, nbytes: int) -> float:
    """Reassign ``topic``-0 from [1] to [1, 2]; bytes/s until broker 2 is in the ISR."""
    start = time.monotonic()
    with WireClient(tc.brokers[1].bootstrap) as c:
        resp = c.request(45, 0, {"timeout_ms": 10000, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "replicas": [1, 2]}]}]})
    assert int(resp.responses[0].partitions[0].error_code) == 0
    wait_for(lambda: sorted(describe(tc.bootstrap, topic)[0].isrs) == [1, 2], 60, f"{topic} moved")
    return nbytes / (time.monotonic() - start)


def test_a_throttled_reassignment_catches_up_at_the_throttled_rate_and_unthrottled_after(tc):
    admin = AdminClient({"bootstrap.servers": tc.bootstrap})
    for topic in ("th1", "th2"):
        admin.create_topics([NewTopic(topic, 1, replica_assignment=[[1]])])[topic].result(20)
    sizes = {topic: fill(tc.bootstrap, topic) for topic in ("th1", "th2")}

    # what kafka-reassign-partitions --execute --throttle sets
    for node in ("1", "2"):
        alter(tc.bootstrap, ResourceType.BROKER, node, {"leader.replication.throttled.rate": str(RATE),
                                                       "follower.replication.throttled.rate": str(RATE)})
    alter(tc.bootstrap, ResourceType.TOPIC, "th1", {"leader.replication.throttled.replicas": "0:1",
                                                   "follower.replication.throttled.replicas": "0:2"})
    throttled = move_rate(tc, "th1", sizes["th1"])
    # the rate's window admits one sample's worth at once; beyond that the throttle holds
    assert throttled <= 1.6 * RATE, throttled
    assert throttled >= 0.3 * RATE, throttled  # and it does progress

    # what --verify removes once the move is done: the same move goes at full speed
    for node in ("1", "2"):
        alter(tc.bootstrap, ResourceType.BROKER, node, {"leader.replication.throttled.rate": None,
                                                       "follower.replication.throttled.rate": None})
    alter(tc.bootstrap, ResourceType.TOPIC, "th1", {"leader.replication.throttled.replicas": None,
                                                   "follower.replication.throttled.replicas": None})
    free = move_rate(tc, "th2", sizes["th2"])
    assert free >= 2.5 * throttled, (free, throttled)
    print(f"throttled catch-up {throttled / 1e3:.0f} kB/s (throttle {RATE / 1e3:.0f} kB/s), unthrottled "
          f"{free / 1e3:.0f} kB/s")
