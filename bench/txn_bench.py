"""Transactional produce MB/s vs idempotent produce MB/s on one classic (or diskless) partition.

One producer (confluent-kafka, acks=all, 1 KiB values, linger.ms=5) sends ``--mib`` MiB to a
fresh topic of a fresh kcli broker: once idempotent (enable.idempotence=true), once
transactional, committing a transaction every ``--commit-ms`` ms (begin, produce for that long,
commit_transaction). MB/s = bytes / time until the last delivery report (idempotent) or the last
commit returned (transactional); the measured wall time per transaction is printed too. ``--repeat`` alternating runs, the median of each.
Target: transactional >= 0.8 x idempotent at one commit per 100 ms.

With ``--diskless`` both topics are diskless (WAL objects on the broker's local object store,
the SQLite batch coordinator; markers are WAL objects too).

Usage: python3 bench/txn_bench.py [--mib 64] [--commit-ms 100] [--repeat 3] [--quick] [--diskless] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from brokers import kcli_broker
from report import record

from confluent_kafka import Producer

from tests.kafka_helpers import create_topic

VALUE = b"x" * 1024
# A small client queue (both producers): records are enqueued about as fast as they are sent,
# so a transaction's wall time is close to --commit-ms instead of the time to drain a large queue.
QUEUE = {"queue.buffering.max.kbytes": 1024}
COMMIT_LATENCY: list[float] = []  # seconds each commit_transaction() took (flush + EndTxn)


def _send(p: Producer, topic: str, n: int) -> None:
    for _ in range(n):
        while True:
            try:
                p.produce(topic, VALUE, partition=0)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)


def idempotent(bootstrap: str, topic: str, count: int) -> float:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                  **QUEUE})
    t0 = time.monotonic()
    _send(p, topic, count)
    assert p.flush(120) == 0
    return count * len(VALUE) / (time.monotonic() - t0) / 1e6


def transactional(bootstrap: str, topic: str, count: int, commit_ms: int) -> tuple[float, int]:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{topic}", "acks": "all", "linger.ms": 5,
                  **QUEUE})
    p.init_transactions(30)
    t0 = time.monotonic()
    sent = commits = 0
    commit_s: list[float] = []
    while sent < count:
        p.begin_transaction()
        until = time.monotonic() + commit_ms / 1000
        while sent < count and time.monotonic() < until:
            step = min(200, count - sent)
            _send(p, topic, step)
            sent += step
        c0 = time.monotonic()
        p.commit_transaction(60)
        commit_s.append(time.monotonic() - c0)
        commits += 1
    elapsed = time.monotonic() - t0
    COMMIT_LATENCY.extend(commit_s)
    return count * len(VALUE) / elapsed / 1e6, round(elapsed * 1000 / commits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--commit-ms", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="16 MiB, 1 run")
    ap.add_argument("--diskless", action="store_true", help="diskless topics instead of classic ones")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.mib, args.repeat = 16, 1
    count = args.mib * 1024 * 1024 // len(VALUE)
    idem, txn, txn_ms = [], [], []
    with kcli_broker() as bootstrap:
        for i in range(args.repeat):
            configs = {"diskless.enable": "true"} if args.diskless else None
            create_topic(bootstrap, f"idem-{i}", 1, configs)
            create_topic(bootstrap, f"txn-{i}", 1, configs)
            idem.append(idempotent(bootstrap, f"idem-{i}", count))
            mbs, n = transactional(bootstrap, f"txn-{i}", count, args.commit_ms)
            txn.append(mbs)
            txn_ms.append(n)
    i_med, t_med = statistics.median(idem), statistics.median(txn)
    ratio = t_med / i_med
    commit_ms = round(statistics.median(COMMIT_LATENCY) * 1000, 1)
    out = {"topic": "diskless" if args.diskless else "classic", "commit_latency_ms_median": commit_ms, "mib": args.mib, "commit_ms": args.commit_ms, "idempotent_mb_s": round(i_med, 2),
           "transactional_mb_s": round(t_med, 2), "ratio": round(ratio, 3), "ms_per_transaction": txn_ms,
           "runs": {"idempotent": [round(x, 2) for x in idem], "transactional": [round(x, 2) for x in txn]}}
    kind = "diskless " if args.diskless else ""
    record(f"transactional produce, 1 commit / {args.commit_ms} ms (1 KiB, acks=all, 1 {kind}partition)", round(t_med, 2),
           peer=round(i_med, 2), peer_name="kcli idempotent", unit="MB/s", target=">= 0.8 x idempotent")
    if args.json:
        print(json.dumps(out))
    else:
        print(f"idempotent:    {i_med:.2f} MB/s  (runs {out['runs']['idempotent']})")
        print(f"transactional: {t_med:.2f} MB/s  (runs {out['runs']['transactional']}, commit every {args.commit_ms} ms, "
              f"measured ms per transaction {txn_ms})")
        print(f"commit_transaction() median: {commit_ms} ms (flush of the last records + EndTxn)")
        print(f"ratio: {ratio:.2f} (target >= 0.80)")


if __name__ == "__main__":
    main()
