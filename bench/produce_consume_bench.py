"""Produce and consume throughput with confluent-kafka: kcli's broker vs tansu, side by side.

Workload (issue 2): 1 KiB values, acks=all, one partition; consume msg/s from the beginning;
a group consumer's time to first message after subscribe. Prints a table and the ratios.
Usage: python bench/produce_consume_bench.py [--messages N]
"""

from __future__ import annotations

import argparse
import time
import uuid

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from brokers import kcli_broker, machine, tansu_broker
from report import record


def create(bootstrap: str, topic: str) -> None:
    a = AdminClient({"bootstrap.servers": bootstrap})
    a.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    time.sleep(0.5)


def produce(bootstrap: str, topic: str, n: int, size: int) -> float:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1048576,
                  "queue.buffering.max.kbytes": 1048576, "enable.idempotence": False})
    value = b"x" * size
    failures = []

    def cb(err, msg):  # noqa: ANN001
        if err is not None:
            failures.append(err)

    start = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, value, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.01)
    p.flush(300)
    elapsed = time.perf_counter() - start
    if failures:
        raise SystemExit(f"produce failed: {failures[:3]}")
    return elapsed


def consume(bootstrap: str, topic: str, n: int) -> float:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 10485760})
    c.subscribe([topic])
    got = 0
    start = None
    deadline = time.monotonic() + 300
    while got < n and time.monotonic() < deadline:
        msgs = c.consume(10000, 1.0)
        if msgs and start is None:
            start = time.perf_counter()
            got -= 0
        got += sum(1 for m in msgs if not m.error())
    elapsed = time.perf_counter() - (start or time.perf_counter())
    c.close()
    return elapsed if got >= n else float("nan")


def first_message_latency(bootstrap: str, topic: str) -> float:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"first-{uuid.uuid4()}", "auto.offset.reset": "earliest"})
    start = time.perf_counter()
    c.subscribe([topic])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = c.poll(0.1)
        if m is not None and not m.error():
            break
    elapsed = time.perf_counter() - start
    c.close()
    return elapsed


def run(bootstrap: str, n: int, size: int) -> dict[str, float]:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    create(bootstrap, topic)
    p = produce(bootstrap, topic, n, size)
    c = consume(bootstrap, topic, n)
    f = first_message_latency(bootstrap, topic)
    mb = n * size / 1e6
    return {"produce_mb_s": mb / p, "produce_msg_s": n / p, "consume_mb_s": mb / c, "consume_msg_s": n / c,
            "group_first_message_s": f}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--quick", action="store_true", help="50,000 messages")
    args = ap.parse_args()
    if args.quick:
        args.messages = min(args.messages, 50_000)
    with kcli_broker() as b:
        ours = run(b, args.messages, args.size)
    with tansu_broker() as t:
        peer = run(t, args.messages, args.size) if t else {}
    print(f"# produce/consume, {args.messages} x {args.size} B, acks=all, 1 partition — {machine()}")
    print(f"{'figure':28} {'kcli':>12} {'tansu':>12} {'ratio':>8}")
    for k, v in ours.items():
        pv = peer.get(k)
        ratio = (v / pv) if pv else float("nan")
        print(f"{k:28} {v:12.2f} {pv if pv is not None else float('nan'):12.2f} {ratio:8.2f}")
    targets = {"produce_mb_s": ("MB/s", ">= tansu", "higher"), "produce_msg_s": ("msg/s", "", "higher"),
               "consume_mb_s": ("MB/s", "", "higher"), "consume_msg_s": ("msg/s", ">= tansu", "higher"),
               "group_first_message_s": ("s", "<= 3.5 s", "lower")}
    for k, v in ours.items():
        unit, target, better = targets[k]
        record(f"classic {k} (1 KiB, acks=all, 1 partition)", round(v, 2), peer=round(peer[k], 2) if k in peer else None,
               peer_name="tansu" if peer else "", unit=unit, target=target, better=better)


if __name__ == "__main__":
    main()
