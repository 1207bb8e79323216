"""Cost of the read integrity check (issue #25, item 1) on diskless consume throughput.

Every batch a broker reads from the object store is checked before it is cached or served
(header against the batch coordinator, CRC-32C as Kafka's DefaultRecordBatch.isValid). This
script measures diskless consume with the check on and off in one run, side by side:

1. Produce --mib MiB of --value-bytes values to a diskless topic of --partitions partitions
   (confluent-kafka, acks=all, batch.size --batch-bytes), local file object store.
2. --runs rounds; each round restarts the broker once with the check on and once with it off
   (environment KCLI_BENCH_UNCHECKED_READS=1, read only by kcli/diskless/reader.py, for this
   bench), in alternating order, and consumes every partition from offset 0 to its end with one
   assigned confluent-kafka consumer. The fetch cache is off (diskless.fetch.cache.max.bytes=0),
   so every fetched byte comes from a ranged GET and is checked: the worst case. (With the cache
   on, each batch is checked once when it goes in and never again.)
   Figures per mode: consume MB/s (median) and the broker process's CPU seconds per GB served
   (median; the steadier figure on a shared host).
3. The check alone: kcli.diskless.reader.batch_problem over every stored batch, in-process —
   its CPU cost per GB, independent of the broker and the client.

Target: the check costs at most 10% of consume throughput.
Usage: python3 bench/fetch_crc_bench.py [--mib 256] [--value-bytes 16384] [--batch-bytes 1000000] [--runs 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from brokers import machine  # noqa: E402
from report import record  # noqa: E402

from kcli.diskless.reader import UNCHECKED_READS_ENV, batch_problem  # noqa: E402
from kcli.diskless.wal import parse_wal  # noqa: E402
from tests.brokerproc import BrokerProcess  # noqa: E402

TOPIC = "crc-bench"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def steal_percent(seconds: float = 1.0) -> float:
    """CPU steal over ``seconds`` (a busy hypervisor slows every figure)."""
    def read() -> list[int]:
        return [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    a = read()
    time.sleep(seconds)
    b = read()
    d = [y - x for x, y in zip(a, b)]
    return 100.0 * d[7] / max(1, sum(d)) if len(d) > 7 else 0.0


def produce(bootstrap: str, total: int, value_bytes: int, batch_bytes: int) -> int:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": batch_bytes,
                  "queue.buffering.max.kbytes": 262144})
    value = os.urandom(value_bytes)
    errors: list[str] = []
    n = max(1, total // value_bytes)
    for _ in range(n):
        while True:
            try:
                p.produce(TOPIC, value, on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
                break
            except BufferError:
                p.poll(0.01)
    if p.flush(600) or errors:
        raise SystemExit(f"produce failed: {errors[:3]}")
    return n


def consume_all(bootstrap: str, partitions: int) -> tuple[int, float]:
    """(value bytes, seconds) to read every partition from 0 to its end."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}", "enable.auto.commit": False,
                  "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 10485760,
                  "queued.max.messages.kbytes": 262144})
    ends = {p: c.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)[1] for p in range(partitions)}
    c.assign([TopicPartition(TOPIC, p, 0) for p in range(partitions)])
    left = {p for p, e in ends.items() if e > 0}
    got = 0
    t0 = time.perf_counter()
    deadline = time.monotonic() + 600
    while left and time.monotonic() < deadline:
        for m in c.consume(10000, 1.0):
            err = m.error()
            if err is not None:
                raise SystemExit(f"consume failed: {err}")
            got += len(m.value())
            if m.offset() >= ends[m.partition()] - 1:
                left.discard(m.partition())
    secs = time.perf_counter() - t0
    c.close()
    if left:
        raise SystemExit(f"consume did not finish: partitions {sorted(left)}")
    return got, secs


def check_alone(objects_dir: Path, repeat: int = 3) -> tuple[float, int, int]:
    """(CPU seconds per GB, batches, bytes) of batch_problem over every stored batch."""
    blobs = [p.read_bytes() for p in sorted((objects_dir / "wal").glob("*"))]
    spans = [(memoryview(blob), h.position, h.size, h.last_offset_delta)
             for blob in blobs for h in parse_wal(blob).batches]
    total = sum(s for _v, _p, s, _d in spans)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        for view, pos, size, delta in spans:
            if batch_problem(view, pos, size, delta) is not None:
                raise SystemExit("a stored batch fails the check")
        best = min(best, time.process_time() - t0)
    return best / (total / 1e9), len(spans), total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=256, help="data produced, MiB")
    ap.add_argument("--value-bytes", type=int, default=16384)
    ap.add_argument("--batch-bytes", type=int, default=1000000, help="producer batch.size")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3, help="rounds (each: one consume with the check on, one off)")
    ap.add_argument("--quick", action="store_true", help="64 MiB, 2 rounds")
    args = ap.parse_args()
    if args.quick:
        args.mib, args.runs = min(args.mib, 64), min(args.runs, 2)
    configs = {"diskless.fetch.cache.max.bytes": "0", "group.initial.rebalance.delay.ms": "0"}
    rates: dict[str, list[float]] = {"on": [], "off": []}
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    steal = steal_percent()
    with tempfile.TemporaryDirectory(prefix="kcli-crc-bench-") as tmp:
        data_dir = Path(tmp) / "data"
        b = BrokerProcess(data_dir, configs).start()
        try:
            from confluent_kafka.admin import AdminClient, NewTopic

            admin = AdminClient({"bootstrap.servers": b.bootstrap})
            admin.create_topics([NewTopic(TOPIC, args.partitions, 1, config={"diskless.enable": "true"})])[TOPIC].result(30)
            del admin  # no client left reconnecting to the brokers this script restarts
            n = produce(b.bootstrap, args.mib << 20, args.value_bytes, args.batch_bytes)
        finally:
            b.stop()
        for r in range(args.runs):
            for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
                env = {UNCHECKED_READS_ENV: "1"} if mode == "off" else {UNCHECKED_READS_ENV: "0"}
                b = BrokerProcess(data_dir, configs, env=env)
                b.start()
                try:
                    assert b.proc is not None
                    before = cpu_seconds(b.proc.pid)
                    got, secs = consume_all(b.bootstrap, args.partitions)
                    used = cpu_seconds(b.proc.pid) - before
                finally:
                    b.stop()
                rates[mode].append(got / 1e6 / secs)
                cpu[mode].append(used / (got / 1e9))
                print(f"  round {r + 1} check {mode:3}: {got / 1e6:8.1f} MB in {secs:6.2f} s = {got / 1e6 / secs:7.1f} MB/s, "
                      f"broker {used:5.2f} CPU-s ({used / (got / 1e9):5.2f} s/GB)", file=sys.stderr)
        alone, batches, stored = check_alone(data_dir / "objects")
    steal = max(steal, steal_percent())
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    cpu_on, cpu_off = statistics.median(cpu["on"]), statistics.median(cpu["off"])
    print(f"# diskless consume, check on vs off: {n:,} x {args.value_bytes} B, {args.partitions} partitions, "
          f"batch.size {args.batch_bytes}, {stored / 1e6:.0f} MB in {batches:,} batches, fetch cache off, "
          f"{args.runs} rounds — {machine()}, CPU steal {steal:.1f}%")
    print(f"{'check':6} {'MB/s (median)':>14} {'runs':>28} {'broker CPU-s/GB':>16}")
    for mode, rate, c in (("on", on, cpu_on), ("off", off, cpu_off)):
        runs = ", ".join(f"{x:.0f}" for x in rates[mode])
        print(f"{mode:6} {rate:14.1f} {runs:>28} {c:16.3f}")
    print(f"throughput on/off: {on / off:.3f} (cost {100 * (1 - on / off):+.1f}%; target: cost <= 10%)")
    print(f"broker CPU per GB on/off: {cpu_on / cpu_off:.3f}")
    print(f"the check alone (batch_problem, in-process): {alone:.3f} CPU-s per GB "
          f"({100 * alone / cpu_on:.1f}% of the broker's CPU per GB with the check on)")
    what = (f"{args.mib} MiB, {args.value_bytes} B values, batch.size {args.batch_bytes}, {args.partitions} partitions, "
            f"fetch cache off, median of {args.runs}")
    record(f"diskless consume MB/s with the read CRC check ({what})", round(on, 1), peer=round(off, 1),
           peer_name="check off, same run", unit="MB/s", target="cost <= 10%")
    record(f"broker CPU-s per GB served, check on ({what})", round(cpu_on, 3), peer=round(cpu_off, 3),
           peer_name="check off, same run", unit="CPU-s/GB", better="lower")
    record("read check alone (batch_problem), CPU-s per GB", round(alone, 3), unit="CPU-s/GB", better="lower")


if __name__ == "__main__":
    sys.exit(main())
