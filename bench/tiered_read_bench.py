"""Consume throughput from the remote tier vs the local log, on the same tiered topic.

Workload: one partition, 1 KiB values, segment.bytes 8 MiB, local.retention.bytes half of the
data, so after tiering the first half of the offsets is only in remote storage and the second
half is local. A confluent-kafka consumer then reads each half (assigned, from its first
offset to its last) and the table shows MB/s for both and their ratio.
Usage: python bench/tiered_read_bench.py [--messages N] [--size B] [--object-store URI] [--runs R] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from brokers import machine  # also puts the repo on sys.path
from report import record

from kcli.protocol.client import WireClient  # noqa: E402
from tests.brokerproc import BrokerProcess  # noqa: E402

SEGMENT_BYTES = 8 * 1024 * 1024


def list_offset(bootstrap: str, topic: str, timestamp: int) -> int:
    with WireClient(bootstrap) as c:
        resp = c.request(2, 9, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": timestamp}]}]})
    return int(resp.topics[0].partitions[0].offset)


def produce(bootstrap: str, topic: str, n: int, size: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1048576,
                  "queue.buffering.max.kbytes": 1048576})
    value = b"x" * size
    for _ in range(n):
        while True:
            try:
                p.produce(topic, value)
                break
            except BufferError:
                p.poll(0.01)
    if p.flush(300):
        raise SystemExit("produce did not finish")


def consume_range(bootstrap: str, topic: str, start: int, end: int) -> tuple[int, float]:
    """(bytes of values, seconds) to read offsets start..end-1 from an assigned consumer."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}", "enable.auto.commit": False,
                  "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 10485760,
                  "queued.max.messages.kbytes": 262144})
    c.assign([TopicPartition(topic, 0, start)])
    got = 0
    t0 = time.perf_counter()
    deadline = time.monotonic() + 600
    last = start - 1
    while last < end - 1 and time.monotonic() < deadline:
        for m in c.consume(10000, 1.0):
            if m.error() or m.offset() >= end:
                continue
            got += len(m.value())
            last = m.offset()
    elapsed = time.perf_counter() - t0
    c.close()
    if last < end - 1:
        raise SystemExit(f"consume stopped at offset {last}, wanted {end - 1}")
    return got, elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3, help="reads of each half; the median is shown")
    ap.add_argument("--object-store", default=None, help="object store URI (default: file:// under the data dir)")
    ap.add_argument("--quick", action="store_true", help="30,000 messages, one read of each half")
    args = ap.parse_args()
    if args.quick:
        args.messages, args.runs = min(args.messages, 30_000), 1
    total = args.messages * args.size
    configs = {"remote.log.storage.system.enable": "true", "remote.log.manager.task.interval.ms": "200",
               "log.retention.check.interval.ms": "200"}
    extra = ["--object-store", args.object_store] if args.object_store else []
    with tempfile.TemporaryDirectory(prefix="kcli-tiered-bench-") as tmp:
        b = BrokerProcess(Path(tmp) / "data", configs, extra).start()
        try:
            topic = "tiered-bench"
            admin = AdminClient({"bootstrap.servers": b.bootstrap})  # keep it alive until the result
            admin.create_topics([NewTopic(topic, 1, 1, config={
                "remote.storage.enable": "true", "segment.bytes": str(SEGMENT_BYTES),
                "local.retention.bytes": str(total // 2)})])[topic].result(30)
            produce(b.bootstrap, topic, args.messages, args.size)
            end = list_offset(b.bootstrap, topic, -1)
            deadline = time.monotonic() + 300
            while True:  # every rolled segment copied, local log cut to local retention
                local_start = list_offset(b.bootstrap, topic, -4)
                tiered = list_offset(b.bootstrap, topic, -5)
                local_bytes = sum(p.stat().st_size for p in (b.data_dir / f"{topic}-0").glob("*.log"))
                if local_start > 0 and local_bytes < total // 2 + SEGMENT_BYTES and tiered >= local_start - 1:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit("tiering did not settle within 300 s")
                time.sleep(0.2)
            rows = []
            for name, lo, hi in (("remote", 0, local_start), ("local", local_start, end)):
                rates, size = [], 0
                for _ in range(args.runs):
                    size, secs = consume_range(b.bootstrap, topic, lo, hi)
                    rates.append(size / 1e6 / secs)
                rows.append((name, lo, hi, size / 1e6, statistics.median(rates)))
        finally:
            b.stop()
    store = args.object_store or "file:// (local disk)"
    print(f"# tiered read, {args.messages} x {args.size} B, segment.bytes {SEGMENT_BYTES}, store {store} — {machine()}")
    print(f"{'tier':8} {'offsets':>17} {'MB':>9} {'MB/s':>9}")
    for name, lo, hi, mb, rate in rows:
        print(f"{name:8} {f'{lo}-{hi - 1}':>17} {mb:9.1f} {rate:9.1f}")
    print(f"remote/local: {rows[0][4] / rows[1][4]:.2f}")
    (_, _, _, r_mb, remote), (_, _, _, l_mb, local) = rows
    record(f"tiered remote-read consume MB/s ({args.messages:,} x {args.size} B, 1 partition, "
           f"{r_mb:.0f} MB remote / {l_mb:.0f} MB local, store {store}, median of {args.runs})",
           round(remote, 1), peer=round(local, 1), peer_name="local read, same topic", unit="MB/s")


if __name__ == "__main__":
    sys.exit(main())
