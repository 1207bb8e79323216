"""Diskless topics moving to tiered storage (issue #27 "Evidence"): figures over a longer run.

1. **Bounded WAL.** A 3-broker cluster (PostgreSQL: batch coordinator, remote log metadata,
   cluster metadata; one shared file object store), a diskless topic with
   ``remote.storage.enable=true``, ``local.retention.bytes`` = --local-kib and a 30-day
   ``retention.ms``. A producer writes --times × local retention; every second the coordinator's
   batch count for the partition and the topic's WAL object count are printed. Target: bounded,
   not growing with what was produced.
2. **New replica in sync.** The partition is then reassigned (AlterPartitionReassignments through
   ``kcli partitions reassign execute``) to take in the third broker: the time until that broker's
   replica cache is in the ISR (metadata only; the cache starts
   ``diskless.replica.cache.start.bytes`` before the end).
3. **Tail consumer GETs per fetch, cache vs no cache**: bench/diskless_cache_bench.py's tail run
   (one broker each way, the fetch path's range cache off), reused rather than duplicated.

Usage: python3 bench/diskless_tiering_bench.py [--times 10] [--local-kib 256] [--quick]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from brokers import machine  # noqa: E402
from cluster_bench import cluster, postgres  # noqa: E402
from diskless_cache_bench import BASE as CACHE_BASE  # noqa: E402
from diskless_cache_bench import tail_run  # noqa: E402

from kcli.diskless import admin_api  # noqa: E402
from tests.brokerproc import BrokerProcess  # noqa: E402

RECORD = 1024
CONFIGS = {
    "diskless.append.commit.interval.ms": "50",
    "diskless.file.cleaner.interval.ms": "500",
    "diskless.file.cleaner.retention.period.ms": "2000",
    "remote.log.storage.system.enable": "true",
    "remote.log.manager.task.interval.ms": "500",
    "replica.lag.time.max.ms": "5000",
    "broker.session.timeout.ms": "6000",
    "broker.heartbeat.interval.ms": "500",
    "group.initial.rebalance.delay.ms": "0",
}


def describe(bootstrap: str, topic: str) -> dict[str, Any]:
    doc = admin_api.call(bootstrap, admin_api.DISKLESS_DESCRIBE_KEY, {"topics": [topic], "replicas": True})
    return doc["topics"][0]


def sample(bootstrap: str, topic: str) -> tuple[int, int, int, int]:
    """(coordinator batches, WAL objects, coordinator log start, tiered up to)."""
    d = describe(bootstrap, topic)
    p = d["partitions"][0]
    return int(p["batch_count"]), int(d["storage"]["file_count"]), int(p["log_start_offset"]), \
        int(p.get("highest_tiered_offset", -1))


def produce(bootstrap: str, topic: str, total_bytes: int, rate_bps: int) -> int:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 32768})
    n = total_bytes // RECORD
    start = time.monotonic()
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=b"%08d" % i + b"x" * (RECORD - 8), partition=0)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
        ahead = (i + 1) * RECORD / rate_bps - (time.monotonic() - start)
        if ahead > 0:
            time.sleep(ahead)
    assert p.flush(60) == 0
    return n


def kcli(bootstrap: str, *args: str) -> None:
    out = subprocess.run([sys.executable, "-m", "kcli", "-b", bootstrap, *args], capture_output=True, text=True,
                         timeout=60)
    if out.returncode != 0:
        raise SystemExit(out.stdout + out.stderr)


def bounded_and_new_replica(times: int, local_kib: int, rate_kib: int) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient, NewTopic

    local = local_kib * 1024
    start_bytes = 4 * local
    topic = "tiered-wal"
    with postgres() as server, cluster(server, 3, {**CONFIGS, "diskless.replica.cache.start.bytes": str(start_bytes)}) \
            as brokers:
        b1 = brokers[0]
        a = AdminClient({"bootstrap.servers": b1.bootstrap})
        a.create_topics([NewTopic(topic, 1, 2, config={
            "diskless.enable": "true", "remote.storage.enable": "true", "segment.bytes": str(max(16384, local // 4)),
            "local.retention.bytes": str(local), "retention.ms": str(30 * 24 * 3600 * 1000)})])[topic].result(30)
        time.sleep(1)
        total = times * local
        print(f"producing {total // 1024} KiB ({times}x local.retention.bytes={local_kib} KiB) at {rate_kib} KiB/s")
        print(f"{'t (s)':>6s} {'produced KiB':>13s} {'batches':>8s} {'objects':>8s} {'log start':>10s} "
              f"{'tiered up to':>13s}")
        done = threading.Event()
        result: dict[str, int] = {}

        def run() -> None:
            result["records"] = produce(b1.bootstrap, topic, total, rate_kib * 1024)
            done.set()

        t0 = time.monotonic()
        threading.Thread(target=run, daemon=True).start()
        rows: list[tuple[int, int]] = []
        while True:
            time.sleep(1.0)
            s = sample(b1.bootstrap, topic)
            end = describe(b1.bootstrap, topic)["partitions"][0]["high_watermark"]
            rows.append((s[0], s[1]))
            print(f"{time.monotonic() - t0:6.1f} {end * RECORD // 1024:13d} {s[0]:8d} {s[1]:8d} {s[2]:10d} {s[3]:13d}",
                  flush=True)
            if done.is_set() and "done_at" not in result:
                result["done_at"] = len(rows)
            if done.is_set() and len(rows) >= result["done_at"] + 5 and s[2] >= end - 2 * local // RECORD:
                break  # five more samples after the producer finished: the WAL settles, not grows
            if time.monotonic() - t0 > 600:
                raise SystemExit("the WAL was not trimmed within 600 s")
        n = len(rows)
        first_half, second_half = rows[: n // 2], rows[n // 2:]
        # new replica: reassign to take in the broker that holds none
        md = a.list_topics(topic, timeout=10).topics[topic].partitions[0]
        removed, kept = list(md.replicas)
        new = next(b for b in range(1, 4) if b not in (removed, kept))
        t1 = time.monotonic()
        kcli(b1.bootstrap, "partitions", "reassign", "execute", "--topic", topic, "--partition", "0",
             "--replicas", f"{new},{kept}")
        metadata_s = time.monotonic() - t1  # the kcli process's wall time, its Python start included
        t1 = time.monotonic()
        nb: BrokerProcess = brokers[new - 1]
        while True:
            p = describe(nb.bootstrap, topic)["partitions"][0]
            own = next((c for c in p["replica_caches"] if c["broker"] == new), None)
            if own and own["in_sync"] and new in p["isr"]:
                break
            if time.monotonic() - t1 > 120:
                raise SystemExit("the new replica did not join the ISR within 120 s")
            time.sleep(0.05)
        in_sync_s = time.monotonic() - t1
        return {"records": result["records"], "max_batches_first_half": max(r for r, _ in first_half),
                "max_batches_second_half": max(r for r, _ in second_half),
                "max_objects_first_half": max(o for _, o in first_half),
                "max_objects_second_half": max(o for _, o in second_half),
                "final": rows[-1], "reassign_s": metadata_s, "in_sync_s": in_sync_s,
                "cache_range": (own["log_start_offset"], own["log_end_offset"]), "start_bytes": start_bytes}


def tail_gets(msgs: int) -> dict[str, dict[str, float]]:
    out = {}
    for mode in ("cache", "no-cache"):
        with tempfile.TemporaryDirectory(prefix="kcli-tiering-bench-") as tmp:
            cfg = {**CACHE_BASE, "diskless.replica.cache.enable": "true" if mode == "cache" else "false"}
            b = BrokerProcess(Path(tmp) / "data", cfg).start(timeout=60)
            try:
                out[mode] = tail_run(b.bootstrap, msgs, 20)
            finally:
                b.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--times", type=int, default=10, help="produce this many times local retention")
    ap.add_argument("--local-kib", type=int, default=256, help="local.retention.bytes of the topic, KiB")
    ap.add_argument("--rate-kib", type=int, default=128, help="produce rate, KiB/s")
    ap.add_argument("--tail-msgs", type=int, default=300)
    ap.add_argument("--quick", action="store_true", help="--local-kib 128, --tail-msgs 150")
    args = ap.parse_args()
    if args.quick:
        args.local_kib, args.tail_msgs = 128, 150
    print(f"host: {machine()}")
    r = bounded_and_new_replica(args.times, args.local_kib, args.rate_kib)
    tail = tail_gets(args.tail_msgs)
    print()
    print(f"records produced: {r['records']} ({args.times}x local retention)")
    print(f"coordinator batches, max first half / second half / final: {r['max_batches_first_half']} / "
          f"{r['max_batches_second_half']} / {r['final'][0]}")
    print(f"WAL objects, max first half / second half / final: {r['max_objects_first_half']} / "
          f"{r['max_objects_second_half']} / {r['final'][1]}")
    print(f"reassignment (metadata only): `kcli partitions reassign execute` took {r['reassign_s']:.2f} s (its "
          f"Python start included); the new replica was in the ISR {r['in_sync_s']:.2f} s after it returned"
          f" (cache {r['cache_range'][0]}-{r['cache_range'][1]}, start.bytes "
          f"{r['start_bytes'] // 1024} KiB)")
    for mode in ("cache", "no-cache"):
        t = tail[mode]
        print(f"tail consumer, {mode:8s}: fetch-path GETs per partition read {t['fetch_gets_per_read']:.3f}, "
              f"all GETs per read {t['all_gets_per_read']:.3f} ({int(t['reads'])} reads)")


if __name__ == "__main__":
    main()
