"""Evidence for issue #27 in a cluster: 3 brokers over PostgreSQL (batch coordinator, remote log
metadata, cluster metadata) and one shared object store, a diskless topic with remote storage and
long retention.

After producing about 13× the topic's local retention: the coordinator's batch count and the WAL
object count stay bounded (the tiering trims the WAL as it copies), a consumer from offset 0 reads
every record once in order (remote tier, then WAL), a tail fetch on a replica is served from its
local cache, and a reassignment of the diskless replica is metadata only and immediate, the new
replica filling by the start policy and joining the ISR. Figures over longer runs:
bench/diskless_tiering_bench.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kcli.diskless import admin_api
from kcli.protocol.client import WireClient
from tests.brokerproc import BrokerProcess
from tests.diskless_helpers import FAST as DISKLESS_FAST
from tests.diskless_helpers import admin, counter, wait_until
from tests.fixtures_pg import pg_server  # noqa: F401 - fixture
from tests.test_cluster_state import FAST as CLUSTER_FAST
from tests.test_tiered import TIERED_BROKER

LOCAL_RETENTION = 16384
TOPIC = {"diskless.enable": "true", "remote.storage.enable": "true", "segment.bytes": "8192",
         "local.retention.bytes": str(LOCAL_RETENTION), "retention.ms": str(30 * 24 * 3600 * 1000)}
WAVES, PER_WAVE = 6, 300  # ~115 bytes a record: ~210 KB, about 13x local retention
BOUND = 30  # batches in the coordinator, WAL objects in the store: local retention + what is being copied


@pytest.fixture(scope="module")
def cluster(pg_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, BrokerProcess]]:  # noqa: F811
    root = tmp_path_factory.mktemp("diskless-cluster-tiering")
    url = pg_server.url(pg_server.create_database())
    configs = {**DISKLESS_FAST, **CLUSTER_FAST, **TIERED_BROKER, "replica.lag.time.max.ms": "3000",
               "diskless.replica.cache.start.bytes": "20000"}
    brokers = {node: BrokerProcess(root / f"node{node}", configs, [
        "--cluster", url, "--node-id", str(node), "--rack", rack, "--object-store", (root / "objects").as_uri()])
        for node, rack in {1: "a", 2: "b", 3: "c"}.items()}
    with ThreadPoolExecutor(3) as pool:  # stopped side by side: the module's wall time
        try:
            for b in brokers.values():
                b.start()
            wait_until(lambda: all(len(AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=10).brokers)
                                   == 3 for b in brokers.values()), 20, what="three registered brokers")
            yield brokers
        finally:
            list(pool.map(lambda b: b.stop(), brokers.values()))


def value(i: int) -> bytes:
    return b"rec-%06d-" % i + b"y" * 100


def produce(bootstrap: str, topic: str, start: int, count: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "batch.size": 4000, "enable.idempotence": True})
    errors: list[Any] = []
    for i in range(start, start + count):
        while True:
            try:
                p.produce(topic, value(i), partition=0, on_delivery=lambda err, _m: errors.append(err) if err else None)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(30) == 0 and not errors, errors[:3]


def describe(b: BrokerProcess, topic: str) -> dict[str, Any]:
    return admin(b.bootstrap, admin_api.DISKLESS_DESCRIBE_KEY, {"topics": [topic], "replicas": True})["topics"][0]


def rows_and_objects(b: BrokerProcess, topic: str) -> tuple[int, int]:
    d = describe(b, topic)
    return int(d["partitions"][0]["batch_count"]), int(d["storage"]["file_count"])


def consume_all(bootstrap: str, topic: str, expected: int) -> list[tuple[int, bytes]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "fetch.max.bytes": 1 << 20})
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 20
    try:
        while len(out) < expected and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                raise KafkaException(m.error())
            out.append((m.offset(), m.value()))
        m = c.poll(0.3)
        assert m is None or m.error() is not None, (m.offset(), m.value())  # nothing more: every record once
    finally:
        c.close()
    return out


def fetch(bootstrap: str, topic: str, offset: int) -> tuple[int, bytes]:
    with WireClient(bootstrap, timeout=20) as client:
        resp = client.request(1, 4, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
            "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "fetch_offset": offset, "partition_max_bytes": 1 << 20}]}]})
    part = resp.responses[0].partitions[0]
    return int(part.error_code), bytes(part.records or b"")


def kcli(b: BrokerProcess, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "kcli", "-b", b.bootstrap, *args], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def replicas_of(b: BrokerProcess, topic: str) -> list[int]:
    md = AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(topic, timeout=10)
    return list(md.topics[topic].partitions[0].replicas)


def test_diskless_tiered_topic_stays_bounded_reads_once_and_reassigns(cluster: dict[int, BrokerProcess]) -> None:
    b1 = cluster[1]
    topic = "dtier"
    a = AdminClient({"bootstrap.servers": b1.bootstrap})
    a.create_topics([NewTopic(topic, 1, 2, config=TOPIC)])[topic].result(20)
    wait_until(lambda: all(len(replicas_of(b, topic)) == 2 for b in cluster.values()), 10, what="the topic everywhere")
    removed, kept = replicas_of(b1, topic)
    new = next(n for n in cluster if n not in (removed, kept))

    samples = []
    for w in range(WAVES):
        produce(b1.bootstrap, topic, w * PER_WAVE, PER_WAVE)
        samples.append(rows_and_objects(b1, topic))
        time.sleep(0.1)
    total = WAVES * PER_WAVE
    print("coordinator batches, WAL objects after each wave:", samples)
    # the tiering keeps up: the WAL holds local retention plus what is being copied, not 20x it
    wait_until(lambda: (s := rows_and_objects(b1, topic))[0] <= BOUND and s[1] <= BOUND, 20,
               what=f"at most {BOUND} batches and objects")
    assert max(r for r, _o in samples[WAVES // 2:]) <= 2 * BOUND, samples  # bounded while producing, not growing
    d = describe(b1, topic)["partitions"][0]
    assert d["log_start_offset"] > total // 2 and d["highest_tiered_offset"] >= d["log_start_offset"] - 1, d

    # a consumer from offset 0: every record once, in order, the remote tier first, then the WAL
    def remote_reads() -> int:  # the client fetches from the broker Metadata names: any of the three
        return sum(counter(b.bootstrap, "diskless.tiered.remote.reads") for b in cluster.values())

    before = remote_reads()
    assert consume_all(b1.bootstrap, topic, total) == [(i, value(i)) for i in range(total)]
    assert remote_reads() > before

    # a tail fetch on a replica is served from its local cache
    wait_until(lambda: sorted(describe(cluster[kept], topic)["partitions"][0]["isr"]) == sorted([removed, kept]), 15,
               what="both replicas in the ISR")
    before = counter(cluster[kept].bootstrap, "diskless.replica.cache.reads")
    err, records = fetch(cluster[kept].bootstrap, topic, total - 5)
    assert err == 0 and value(total - 1) in records
    assert counter(cluster[kept].bootstrap, "diskless.replica.cache.reads") == before + 1

    # reassignment: metadata only, immediate; the new replica fills by the start policy and joins the ISR
    started = time.monotonic()
    kcli(b1, "partitions", "reassign", "execute", "--topic", topic, "--partition", "0", "--replicas", f"{new},{kept}")
    assert replicas_of(b1, topic) == [new, kept]  # no adding/removing phase
    assert "No partition reassignments" in kcli(b1, "partitions", "reassign", "list") or \
        topic not in kcli(b1, "partitions", "reassign", "list")

    def joined() -> dict[str, Any] | None:
        p = describe(cluster[new], topic)["partitions"][0]
        own = next(c for c in p["replica_caches"] if c["broker"] == new)
        return own if own["in_sync"] and new in p["isr"] else None

    own = wait_until(joined, 20, what="the new replica in the ISR")
    print(f"new diskless replica in sync after {time.monotonic() - started:.2f} s: cache {own}")
    lso = describe(cluster[new], topic)["partitions"][0]["log_start_offset"]
    assert lso <= own["log_start_offset"] < total and own["log_end_offset"] == total  # near the end, not from 0
    wait_until(lambda: not (Path(cluster[removed].data_dir) / "diskless-cache" / f"{topic}-0").exists(), 15,
               what="the removed replica's cache dropped")
    before = counter(cluster[new].bootstrap, "diskless.replica.cache.reads")  # and serves the tail from it
    err, records = fetch(cluster[new].bootstrap, topic, total - 5)
    assert err == 0 and value(total - 1) in records
    assert counter(cluster[new].bootstrap, "diskless.replica.cache.reads") == before + 1
