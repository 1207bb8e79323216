"""Local segments of diskless replicas (issue #27, KIP-1163 "Replicas" and "Consume path").

Real broker processes, real clients. The single broker runs with the fetch path's range cache
off (``diskless.fetch.cache.max.bytes=0``), so every read that is not served by the replica cache
is a real object GET and a damaged object is really read.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kcli.diskless import admin_api
from kcli.protocol.client import WireClient
from tests.brokerproc import BrokerProcess
from tests.diskless_helpers import DISKLESS, FAST, admin, metrics, wait_until
from tests.fixtures_pg import pg_server  # noqa: F401 - fixture
from tests.kafka_helpers import create_topic, partition_values

START_BYTES = 20000
CONFIGS = {
    **FAST,
    "diskless.fetch.cache.max.bytes": "0",
    "replica.lag.time.max.ms": "1500",
    "log.retention.check.interval.ms": "300",
    "diskless.replica.cache.start.bytes": str(START_BYTES),
}
CORRUPT_MESSAGE = 2


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    b = BrokerProcess(tmp_path_factory.mktemp("diskless-cache") / "data", CONFIGS).start()
    yield b
    b.stop()


# ---- helpers -----------------------------------------------------------------------------------
def describe(b: BrokerProcess, topic: str, partition: int = 0) -> dict[str, Any]:
    doc = admin(b.bootstrap, admin_api.DISKLESS_DESCRIBE_KEY, {"topics": [topic], "replicas": True})
    return next(p for p in doc["topics"][0]["partitions"] if p["partition"] == partition)


def own_cache(b: BrokerProcess, topic: str, partition: int = 0) -> dict[str, Any]:
    return describe(b, topic, partition)["replica_caches"][0]


def wait_cached(b: BrokerProcess, topic: str, end: int, partition: int = 0) -> dict[str, Any]:
    return wait_until(lambda: (c := own_cache(b, topic, partition))["log_end_offset"] == end and c,
                      20, what=f"the cache of {topic}-{partition} to reach {end}")


def cache_dir(b: BrokerProcess, topic: str, partition: int = 0) -> Path:
    return b.data_dir / "diskless-cache" / f"{topic}-{partition}"


def produce_batches(bootstrap: str, topic: str, batches: list[list[bytes]], partition: int = 0,
                    timestamps: list[int] | None = None) -> None:
    """Each inner list becomes (at least) one batch: flushed before the next."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    i = 0
    for values in batches:
        for v in values:
            kw: dict[str, Any] = {"partition": partition}
            if timestamps is not None:
                kw["timestamp"] = timestamps[i]
            p.produce(topic, value=v, **kw)
            i += 1
        assert p.flush(30) == 0


def isr(bootstrap: str, topic: str, partition: int = 0) -> list[int]:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return sorted(md.topics[topic].partitions[partition].isrs)


def dump_records(segment: Path) -> list[tuple[int, str, int]]:
    out = subprocess.run([sys.executable, "-m", "kcli", "dump-log", "--deep-iteration", str(segment)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [(int(o), kind, int(ts)) for o, kind, ts in
            re.findall(r"\| offset: (\d+) (CreateTime|LogAppendTime): (-?\d+)", out.stdout)]


def fetch(bootstrap: str, topic: str, offset: int) -> tuple[int, bytes]:
    with WireClient(bootstrap, timeout=20) as client:
        resp = client.request(1, 4, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
            "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "fetch_offset": offset, "partition_max_bytes": 1 << 20}]}]})
    part = resp.responses[0].partitions[0]
    return int(part.error_code), bytes(part.records or b"")


def counters(b: BrokerProcess) -> dict[str, int]:
    return metrics(b.bootstrap)["counters"]


# ---- the cache fills: offsets, timestamps, dump-log ----------------------------------------------
def test_cache_segments_hold_the_assigned_offsets_and_timestamps(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "ts", 1, DISKLESS)
    base = int(time.time() * 1000) - 120_000  # recent: retention.ms (7 days) keeps them
    stamps = [base + i * 1000 for i in range(60)]
    produce_batches(broker.bootstrap, "ts", [[b"v%d" % i for i in range(j, j + 20)] for j in (0, 20, 40)],
                    timestamps=stamps)
    cache = wait_cached(broker, "ts", 60)
    assert cache["log_start_offset"] == 0 and cache["in_sync"] and cache["problem"] is None
    segment = cache_dir(broker, "ts") / "00000000000000000000.log"
    assert (cache_dir(broker, "ts") / "00000000000000000000.index").exists()
    assert dump_records(segment) == [(i, "CreateTime", stamps[i]) for i in range(60)]

    # LogAppendTime: the coordinator's append time, as consumers see it, is in the cache too
    create_topic(broker.bootstrap, "lat", 1, {**DISKLESS, "message.timestamp.type": "LogAppendTime"})
    produce_batches(broker.bootstrap, "lat", [[b"a", b"b"], [b"c"]], timestamps=[1, 2, 3])
    wait_cached(broker, "lat", 3)
    dumped = dump_records(cache_dir(broker, "lat") / "00000000000000000000.log")
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "lat", "enable.auto.commit": False})
    c.assign([TopicPartition("lat", 0, 0)])
    seen = []
    deadline = time.monotonic() + 20
    while len(seen) < 3 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            seen.append((m.offset(), m.timestamp()[1]))
    c.close()
    assert [(o, ts) for o, _k, ts in dumped] == seen
    assert {k for _o, k, _ts in dumped} == {"LogAppendTime"} and all(ts > base for _o, ts in seen)
    assert isr(broker.bootstrap, "ts") == [1]


# ---- consume path: a tail consumer is served from the cache ----------------------------------------
def test_tail_consumer_is_served_from_the_cache(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "tail", 1, DISKLESS)
    produce_batches(broker.bootstrap, "tail", [[b"warm"]])
    wait_cached(broker, "tail", 1)
    got: list[bytes] = []
    stop = threading.Event()

    def tail() -> None:
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "tail", "enable.auto.commit": False,
                      "fetch.wait.max.ms": 500})
        c.assign([TopicPartition("tail", 0, 1)])
        while not stop.is_set():
            m = c.poll(0.2)
            if m is not None and not m.error():
                got.append(m.value())
        c.close()

    before = counters(broker)
    t = threading.Thread(target=tail)
    t.start()
    time.sleep(1.5)  # the consumer is at the tail
    values = [b"t%03d" % i for i in range(60)]
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for v in values:
        p.produce("tail", value=v)
        p.flush(10)
        time.sleep(0.03)
    wait_until(lambda: len(got) >= len(values), 30, what="the tail consumer")
    stop.set()
    t.join(10)
    after = counters(broker)

    def delta(name: str) -> int:
        return after.get(name, 0) - before.get(name, 0)

    assert got == values
    reads = delta("diskless.fetch.partition.reads")
    fetch_gets = delta("diskless.get.count") - delta("diskless.replica.cache.gets")
    assert reads >= 30, reads
    assert fetch_gets / reads < 0.1, (fetch_gets, reads)
    assert delta("diskless.replica.cache.reads") >= 30
    # the objects were read once each, by the cache fill, whatever the number of fetches
    assert 0 < delta("diskless.replica.cache.gets") <= delta("diskless.upload.count") + 2


# ---- losing the cache loses nothing; a new replica starts from the start policy ---------------------
def test_deleting_the_cache_loses_nothing_and_a_new_cache_starts_near_the_end(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "big", 1, DISKLESS)
    values = [b"%04d-" % i + b"x" * 495 for i in range(400)]
    produce_batches(broker.bootstrap, "big", [values[i:i + 10] for i in range(0, 400, 10)])
    first = wait_cached(broker, "big", 400)
    assert first["log_start_offset"] == 0  # ~200 KB > START_BYTES, but the cache was there from offset 0
    broker.stop()
    shutil.rmtree(broker.data_dir / "diskless-cache")
    broker.start()
    assert partition_values(broker.bootstrap, "big", 0, 400, timeout=30) == values
    cache = wait_cached(broker, "big", 400)
    # seed 004 policy 3: START_BYTES before the log end (batches of 10 records of ~5 KB)
    start = cache["log_start_offset"]
    assert start > 0 and start % 10 == 0, start
    assert START_BYTES * 0.5 <= cache["size_bytes"] <= START_BYTES * 1.5, cache
    assert dump_records(next(cache_dir(broker, "big").glob("*.log")))[0][0] == start
    # reads below the cache come from the object store, at and above it from the cache
    before = counters(broker)
    err, below = fetch(broker.bootstrap, "big", 0)
    middle = counters(broker)
    assert err == 0 and below.count(b"x" * 495) == 400  # one fetch from the store: everything
    assert middle["diskless.read.count"] == before["diskless.read.count"] + 1
    err, cached = fetch(broker.bootstrap, "big", start)
    after = counters(broker)
    assert err == 0 and cached.count(b"x" * 495) == 400 - start and b"%04d-" % start in cached
    assert after.get("diskless.replica.cache.reads", 0) == before.get("diskless.replica.cache.reads", 0) + 1
    assert after["diskless.read.count"] == middle["diskless.read.count"]
    assert isr(broker.bootstrap, "big") == [1]


def test_local_retention_expires_cache_segments(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "short", 1, {**DISKLESS, "segment.bytes": "3000", "local.retention.bytes": "6000"})
    values = [b"%03d-" % i + b"y" * 196 for i in range(100)]
    produce_batches(broker.bootstrap, "short", [values[i:i + 5] for i in range(0, 100, 5)])
    # retention may have run while the fill was still adding segments: wait for a round after it
    wait_until(lambda: (c := own_cache(broker, "short"))["log_end_offset"] == 100 and c["log_start_offset"] > 0
               and c["size_bytes"] <= 9000 and len(list(cache_dir(broker, "short").glob("*.log"))) <= 3, 45,
               what="local retention of the cache")
    assert len(list(cache_dir(broker, "short").glob("*.log"))) <= 3
    assert describe(broker, "short")["log_start_offset"] == 0  # the coordinator keeps everything
    assert partition_values(broker.bootstrap, "short", 0, 100, timeout=30) == values


# ---- a damaged object: never served, the replica leaves the ISR, other partitions go on -------------
def test_corrupt_object_keeps_the_replica_out_of_the_isr(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "bad", 2, DISKLESS)
    produce_batches(broker.bootstrap, "bad", [[b"a%02d" % i for i in range(j, j + 10)] for j in (0, 10, 20)])
    produce_batches(broker.bootstrap, "bad", [[b"other"]], partition=1)
    wait_cached(broker, "bad", 30)
    objects = admin(broker.bootstrap, admin_api.DISKLESS_OBJECTS_KEY, {"topic": "bad", "batches": True})["objects"]
    damaged, key = next((b, o["object_key"]) for o in objects for b in o["batches"]
                        if b["topic"] == "bad" and b["partition"] == 0 and b["base_offset"] == 10)
    broker.stop()
    shutil.rmtree(cache_dir(broker, "bad"))  # a fresh replica: it fills from the store
    obj = broker.data_dir / "objects" / key
    data = bytearray(obj.read_bytes())
    data[damaged["byte_offset"] + damaged["byte_size"] - 2] ^= 0x01  # a record byte: the CRC fails
    obj.write_bytes(bytes(data))
    broker.start()
    cache = wait_until(lambda: (c := own_cache(broker, "bad"))["problem"] and c, 20, what="the damage")
    assert cache["log_end_offset"] == 10 and not cache["in_sync"]
    wait_until(lambda: isr(broker.bootstrap, "bad") == [], 10, what="the replica out of the ISR")
    assert describe(broker, "bad")["isr"] == []
    # the cache holds nothing past the damage, and a fetch of it is CORRUPT_MESSAGE, not the bad record
    assert [o for o, _k, _t in dump_records(next(cache_dir(broker, "bad").glob("*.log")))] == list(range(10))
    assert fetch(broker.bootstrap, "bad", 10)[0] == CORRUPT_MESSAGE
    err, records = fetch(broker.bootstrap, "bad", 0)
    assert err == 0 and b"a09" in records and b"a10" not in records
    # the other partition is unaffected: it fills and stays in the ISR
    produce_batches(broker.bootstrap, "bad", [[b"later"]], partition=1)
    wait_cached(broker, "bad", 2, partition=1)
    assert isr(broker.bootstrap, "bad", 1) == [1]
    assert own_cache(broker, "bad")["log_end_offset"] == 10


# ---- a cluster: replicas on some brokers, ISR reported through the coordinator -----------------------
@pytest.fixture(scope="module")
def cluster(pg_server, tmp_path_factory: pytest.TempPathFactory) -> Any:  # noqa: F811
    root = tmp_path_factory.mktemp("diskless-cache-cluster")
    url = pg_server.url(pg_server.create_database())
    brokers: dict[int, BrokerProcess] = {}
    try:
        for node, rack in {1: "a", 2: "b", 3: "c"}.items():
            brokers[node] = BrokerProcess(root / f"node{node}", {**FAST, "replica.lag.time.max.ms": "3000"}, [
                "--cluster", url, "--node-id", str(node), "--rack", rack,
                "--object-store", (root / "objects").as_uri()]).start()
        wait_until(lambda: all(len(AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=10).brokers) == 3
                               for b in brokers.values()), 20, what="three registered brokers")
        yield brokers
    finally:
        for b in brokers.values():
            b.stop()


def test_cluster_replicas_cache_and_report_their_isr(cluster: dict[int, BrokerProcess]) -> None:
    b1 = cluster[1]
    a = AdminClient({"bootstrap.servers": b1.bootstrap})
    a.create_topics([NewTopic("rep", 1, 2, config=DISKLESS)])["rep"].result(20)
    md = wait_until(lambda: (t := a.list_topics("rep", timeout=10).topics.get("rep")) and t.partitions and t, 10)
    replicas = sorted(md.partitions[0].replicas)
    other = next(n for n in cluster if n not in replicas)
    produce_batches(b1.bootstrap, "rep", [[b"r%02d" % i for i in range(j, j + 10)] for j in (0, 10)])
    for n in replicas:  # every replica holds a local copy; the other broker none
        wait_cached(cluster[n], "rep", 20)
        assert cache_dir(cluster[n], "rep").is_dir()
    assert not cache_dir(cluster[other], "rep").exists()
    for b in cluster.values():  # every broker reports the ISR from the replicas' reports
        wait_until(lambda b=b: isr(b.bootstrap, "rep") == replicas, 15, what=f"ISR on {b.bootstrap}")
    def reported() -> dict[str, Any] | None:
        d = describe(cluster[other], "rep")
        return d if all(c["log_end_offset"] == 20 for c in d["replica_caches"]) else None

    caches = wait_until(reported, 15, what="the replicas' reports")
    assert [c["broker"] for c in caches["replica_caches"]] == list(md.partitions[0].replicas)
    assert sorted(caches["isr"]) == replicas
    out = subprocess.run([sys.executable, "-m", "kcli", "-b", cluster[other].bootstrap, "diskless", "describe",
                          "-t", "rep", "--replicas"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert re.search(r"rep\s+0\s+0\s+20\s+.*%s\s+%d:0-20 %d:0-20" % (",".join(map(str, md.partitions[0].replicas)),
                     *md.partitions[0].replicas), out.stdout), out.stdout
    # a consumer of a non-replica broker reads the store; of a replica, its cache
    assert partition_values(cluster[other].bootstrap, "rep", 0, 20) == [b"r%02d" % i for i in range(20)]
    for n in replicas:  # a Fetch sent to a replica (as follower fetching does) is served by its cache
        before = counters(cluster[n]).get("diskless.replica.cache.reads", 0)
        err, records = fetch(cluster[n].bootstrap, "rep", 0)
        assert err == 0 and b"r00" in records and b"r19" in records
        assert counters(cluster[n])["diskless.replica.cache.reads"] == before + 1
    before = counters(cluster[other]).get("diskless.read.count", 0)
    assert fetch(cluster[other].bootstrap, "rep", 0)[0] == 0
    assert counters(cluster[other])["diskless.read.count"] == before + 1  # no cache there: the store
    json.dumps(caches)  # the describe document is plain JSON
