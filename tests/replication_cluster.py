"""The module-scoped three-broker replication cluster over one PostgreSQL database, shared by
tests/test_replication.py and tests/test_replication_faults.py (real kcli broker processes,
``replica.lag.time.max.ms=3000``), and the few helpers their tests use."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import BrokerProcess
from tests.fixtures_pg import pg_server  # noqa: F401 - fixture
from tests.test_cluster_state import FAST, brokers_of, controller_of, wait_for

LAG_MS = 3000  # replica.lag.time.max.ms of the cluster: a paused follower leaves the ISR after this
CONFIGS = {**FAST, "replica.lag.time.max.ms": str(LAG_MS), "replica.fetch.backoff.ms": "200",
           "log.cleaner.backoff.ms": "500"}


class Cluster:
    def __init__(self, url: str, root: Path) -> None:
        self.url, self.root = url, root
        self.brokers: dict[int, BrokerProcess] = {}

    def make(self, node: int) -> BrokerProcess:
        rack = "abc"[node - 1]
        return BrokerProcess(self.root / f"node{node}", CONFIGS,
                             ["--cluster", self.url, "--node-id", str(node), "--rack", rack])

    def start(self, node: int) -> BrokerProcess:
        b = self.brokers.get(node) or self.make(node)
        self.brokers[node] = b
        return b.start()

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values() if b.alive())

    def live(self) -> list[int]:
        return [n for n, b in self.brokers.items() if b.alive()]

    def wait_live(self, nodes: set[int], timeout: float = 20) -> None:
        for n in nodes:
            b = self.brokers[n]
            wait_for(lambda b=b: set(brokers_of(b.bootstrap)) == nodes, timeout, f"broker {n} to see {sorted(nodes)}")


@pytest.fixture(scope="module")
def cluster(pg_server, tmp_path_factory) -> Iterator[Cluster]:  # noqa: F811
    url = pg_server.url(pg_server.create_database())
    c = Cluster(url, tmp_path_factory.mktemp("replication"))
    c.start(1)
    wait_for(lambda: controller_of(c.brokers[1].bootstrap) == 1, 15, "broker 1 to be the controller")
    c.start(2)
    c.start(3)
    c.wait_live({1, 2, 3})
    time.sleep(1)  # registrations settle (a lease renewed late on a loaded machine would flap the live set)
    c.wait_live({1, 2, 3})
    yield c
    for b in c.brokers.values():
        if b.proc is not None:
            try:
                b.proc.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
        b.stop()


def create(bootstrap: str, name: str, partitions: int, rf: int, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, rf, config=configs)])[name].result(20)


def describe(bootstrap: str, topic: str) -> dict[int, Any]:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return dict(md.topics[topic].partitions)


def isr_full(bootstrap: str, topic: str, rf: int) -> bool:
    parts = describe(bootstrap, topic)
    return bool(parts) and all(len(p.isrs) == rf and p.leader >= 0 for p in parts.values())


def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    return describe(bootstrap, topic)[partition].leader


def produce_once(bootstrap: str, topic: str, partition: int, timeout: float = 15) -> KafkaError | None:
    """One acks=all record without retries: the broker's first answer (None when acknowledged)."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "retries": 0, "enable.idempotence": False,
                  "message.timeout.ms": int(timeout * 1000)})
    out: list[Any] = []
    p.produce(topic, b"probe", partition=partition, on_delivery=lambda err, msg: out.append(err))
    p.flush(timeout + 5)
    return out[0] if out else KafkaError(KafkaError._MSG_TIMED_OUT)


# ---- one three-broker cluster for the KIP-392, throttle and tiered-replica modules -------------
# tests/test_follower_fetching.py, tests/test_replication_throttle.py and
# tests/test_replication_tiered.py share it when run together (one start instead of three; the
# tiered module, which kills and wipes broker 1, runs last by name): rack-aware replica selection,
# a 2-second replication quota window, tiered storage over one shared object store, partition
# deletion, and a Prometheus endpoint on every broker.
RACK_AWARE_SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"
FEATURE_CONFIGS = {
    **CONFIGS, "auto.leader.rebalance.enable": "false", "group.initial.rebalance.delay.ms": "0",
    "replica.selector.class": RACK_AWARE_SELECTOR,
    "replica.fetch.max.bytes": "65536", "replication.quota.window.num": "2", "replication.quota.window.size.seconds": "1",
    "remote.log.storage.system.enable": "true", "remote.log.manager.task.interval.ms": "200",
    "log.retention.check.interval.ms": "200",
    "delete.topic.partition.enable": "true", "delete.topic.partition.interval.delay.ms": "200",
}


class FeatureCluster(Cluster):
    def make(self, node: int) -> BrokerProcess:
        return BrokerProcess(self.root / f"node{node}", FEATURE_CONFIGS,
                             ["--cluster", self.url, "--node-id", str(node), "--rack", "abc"[node - 1],
                              "--object-store", (self.root / "objects").as_uri(), "--metrics-listen", "127.0.0.1:0"])


_FEATURE_CLUSTER: list[FeatureCluster] = []  # the session's one (each importing module has its own fixture def)


@pytest.fixture(scope="session")
def feature_cluster(request, tmp_path_factory) -> Iterator[FeatureCluster]:
    if _FEATURE_CLUSTER:
        yield _FEATURE_CLUSTER[0]
        return
    pg = request.getfixturevalue("pg_server")  # only for the first module: one server, not one per module
    c = FeatureCluster(pg.url(pg.create_database()), tmp_path_factory.mktemp("features"))
    c.start(1)
    wait_for(lambda: controller_of(c.brokers[1].bootstrap) == 1, 15, "broker 1 to be the controller")
    c.start(2)
    c.start(3)
    c.wait_live({1, 2, 3})
    time.sleep(1)  # registrations settle
    c.wait_live({1, 2, 3})
    _FEATURE_CLUSTER.append(c)
    try:
        yield c
    finally:
        _FEATURE_CLUSTER.clear()
        for b in c.brokers.values():
            b.stop()


def metrics_url(b: BrokerProcess) -> str:
    """The broker's Prometheus endpoint (the latest start's: a restart listens on a new port)."""
    found = re.findall(r"metrics (http://\S+/metrics)", b.log_text())
    assert found, "no metrics line in the broker's log"
    return found[-1]
