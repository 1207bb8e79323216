"""Diskless replica cache (issue #27): object GETs per fetch and fetch latency, with and without.

One run, both modes side by side on the same host (alternating per round):

* ``cache``    — diskless.replica.cache.enable=true (the default): local segments per replica;
* ``no-cache`` — diskless.replica.cache.enable=false: every read below the in-memory tail is a
  coordinator query plus object GETs (the behaviour before issue #27).

Both run with the fetch path's range cache off (diskless.fetch.cache.max.bytes=0). With it on,
the broker that *produced* a batch finds it in that cache anyway; every other broker of a
cluster does not, so "range cache off" is what a consumer of any other broker sees.

1. Tail consumer: a confluent-kafka consumer at the log end while a producer sends --tail-msgs
   messages, one commit each (linger 0, flush, --gap-ms apart). Figures: fetch-path GETs per
   partition read (the target: < 0.1 with the cache), and all GETs (the cache's own fill
   included) per partition read.
   The store is a local file store behind FaultyObjectStorage adding --store-latency-ms (20) to
   every call, a first-byte latency of the order of S3's; --store-latency-ms 0 measures the bare
   file store, whose GET costs a pread like a cache segment's.
2. Fetch latency: --fetches raw Fetch v4 requests (max_wait 0, 64 KiB per partition) at random
   offsets inside the last --hot-mib MiB of a --log-mib MiB partition (the range the cache holds:
   start.bytes is set to hold it). P50 / P99 client-side, ms.

Usage: python3 bench/diskless_cache_bench.py [--runs 2] [--tail-msgs 300] [--fetches 400] [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from brokers import machine  # noqa: E402

from kcli.diskless import admin_api  # noqa: E402
from kcli.protocol.client import WireClient  # noqa: E402
from tests.brokerproc import BrokerProcess  # noqa: E402

BASE = {
    "diskless.append.commit.interval.ms": "50",
    "diskless.fetch.cache.max.bytes": "0",
    "group.initial.rebalance.delay.ms": "0",
}


def counters(bootstrap: str) -> dict[str, int]:
    return admin_api.call(bootstrap, admin_api.BROKER_METRICS_KEY, {})["counters"]


def create(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    a = AdminClient({"bootstrap.servers": bootstrap})
    a.create_topics([NewTopic(topic, 1, 1, config={"diskless.enable": "true"})])[topic].result(30)


def tail_run(bootstrap: str, msgs: int, gap_ms: int) -> dict[str, float]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = f"tail-{time.monotonic_ns()}"
    create(bootstrap, topic)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    p.produce(topic, value=b"warm")
    p.flush(10)
    got: list[bytes] = []
    stop = threading.Event()

    def consume() -> None:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "enable.auto.commit": False,
                      "fetch.wait.max.ms": 500})
        c.assign([TopicPartition(topic, 0, 1)])
        while not stop.is_set():
            m = c.poll(0.2)
            if m is not None and not m.error():
                got.append(m.value())
        c.close()

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(2.0)
    before = counters(bootstrap)
    for i in range(msgs):
        p.produce(topic, value=b"%06d" % i + b"v" * 1000)
        p.flush(10)
        time.sleep(gap_ms / 1000)
    deadline = time.monotonic() + 30
    while len(got) < msgs and time.monotonic() < deadline:
        time.sleep(0.05)
    after = counters(bootstrap)
    stop.set()
    t.join(10)

    def d(name: str) -> int:
        return after.get(name, 0) - before.get(name, 0)

    reads = max(1, d("diskless.fetch.partition.reads"))
    fill = d("diskless.replica.cache.gets")
    return {"reads": reads, "fetch_gets_per_read": (d("diskless.get.count") - fill) / reads,
            "all_gets_per_read": d("diskless.get.count") / reads, "received": len(got)}


def fill_log(bootstrap: str, topic: str, mib: int) -> int:
    from confluent_kafka import Producer

    create(bootstrap, topic)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 65536})
    n = mib * 1024
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=b"%08d" % i + b"x" * 1016)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    p.flush(60)
    return n


def latency_run(bootstrap: str, topic: str, end: int, hot: int, fetches: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    times = []
    with WireClient(bootstrap, timeout=30) as client:
        for _ in range(fetches):
            offset = rng.randrange(end - hot, end - 1)
            t0 = time.perf_counter()
            resp = client.request(1, 4, {
                "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
                "topics": [{"topic": topic, "partitions": [
                    {"partition": 0, "fetch_offset": offset, "partition_max_bytes": 65536}]}]})
            times.append((time.perf_counter() - t0) * 1000)
            assert resp.responses[0].partitions[0].error_code == 0
    times.sort()
    return {"p50": statistics.median(times), "p99": times[int(len(times) * 0.99) - 1]}


def wait_cached(bootstrap: str, topic: str, end: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = admin_api.call(bootstrap, admin_api.DISKLESS_DESCRIBE_KEY, {"topics": [topic], "replicas": True})
        caches = doc["topics"][0]["partitions"][0].get("replica_caches") or [{}]
        if caches[0].get("log_end_offset") == end:
            return
        time.sleep(0.2)
    raise SystemExit(f"the cache of {topic} did not reach {end}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--tail-msgs", type=int, default=300)
    ap.add_argument("--gap-ms", type=int, default=20)
    ap.add_argument("--fetches", type=int, default=400)
    ap.add_argument("--log-mib", type=int, default=24)
    ap.add_argument("--hot-mib", type=int, default=8)
    ap.add_argument("--store-latency-ms", type=int, default=20,
                    help="latency added to every object-store call (FaultyObjectStorage over a file store; "
                         "0: the bare local file store, whose GET is a page-cache pread)")
    ap.add_argument("--quick", action="store_true", help="1 run, 150 tail messages, 200 fetches, 12 MiB log")
    args = ap.parse_args()
    if args.quick:
        args.runs, args.tail_msgs, args.fetches, args.log_mib, args.hot_mib = 1, 150, 200, 12, 4
    print(f"host: {machine()}; object-store latency {args.store_latency_ms} ms per call")
    results: dict[str, list[dict[str, float]]] = {"cache": [], "no-cache": []}
    lat: dict[str, list[dict[str, float]]] = {"cache": [], "no-cache": []}
    for r in range(args.runs):
        for mode in (("cache", "no-cache") if r % 2 == 0 else ("no-cache", "cache")):
            with tempfile.TemporaryDirectory(prefix="kcli-cache-bench-") as tmp:
                cfg = {**BASE, "diskless.replica.cache.enable": "true" if mode == "cache" else "false",
                       "diskless.replica.cache.start.bytes": str(args.hot_mib * 1024 * 1024 + 65536)}
                if args.store_latency_ms > 0:
                    cfg.update({"diskless.storage.class.name": "plugins.objectstore.faulty.FaultyObjectStorage",
                                "diskless.storage.delegate.uri": (Path(tmp) / "objects").as_uri(),
                                "diskless.storage.latency.ms": str(args.store_latency_ms)})
                b = BrokerProcess(Path(tmp) / "data", cfg).start(timeout=60)
                try:
                    results[mode].append(tail_run(b.bootstrap, args.tail_msgs, args.gap_ms))
                    end = fill_log(b.bootstrap, "hist", args.log_mib)
                    if mode == "cache":
                        # a fresh replica: restart without the cache dir, so it starts by the start policy
                        b.stop()
                        import shutil

                        shutil.rmtree(b.data_dir / "diskless-cache", ignore_errors=True)
                        b.start(timeout=60)
                        wait_cached(b.bootstrap, "hist", end)
                    lat[mode].append(latency_run(b.bootstrap, "hist", end, args.hot_mib * 1024, args.fetches, r))
                finally:
                    b.stop()
            print(f"run {r + 1} {mode:8s}: tail {results[mode][-1]}  fetch latency {lat[mode][-1]}", flush=True)

    def med(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(x[key] for x in rows)

    print()
    print(f"{'figure':58s} {'cache':>10s} {'no-cache':>10s}")
    for label, key in (("tail consumer: fetch-path GETs per partition read", "fetch_gets_per_read"),
                       ("tail consumer: all GETs (cache fill included) per read", "all_gets_per_read")):
        print(f"{label:58s} {med(results['cache'], key):10.3f} {med(results['no-cache'], key):10.3f}")
    for label, key in (("fetch P50 ms (random offsets in the cached range)", "p50"),
                       ("fetch P99 ms (random offsets in the cached range)", "p99")):
        print(f"{label:58s} {med(lat['cache'], key):10.2f} {med(lat['no-cache'], key):10.2f}")


if __name__ == "__main__":
    main()
