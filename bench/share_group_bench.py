"""Share-consumer throughput (KIP-932 queues) with 1, 2 and 4 members on one partition.

A fresh kcli broker; for each member count a fresh 1-partition topic gets ``--records`` records
of ``--size`` bytes (batches of 100 records: a share fetch acquires whole batches, so the batch
size is the grain at which members share a partition), the share group's start offset is set to
the earliest offset (AlterShareGroupOffsets, as ``kcli share-groups reset-offsets --to-earliest``),
and N confluent-kafka ShareConsumers, each in its own process, consume with implicit
acknowledgement until the backlog is drained. Throughput = records / (last record received -
first record received) over all members; each record must be delivered exactly once (no lock
expires at the default 30 s). Every member also reports how many records it got.

Usage: python3 bench/share_group_bench.py [--records 60000] [--size 256] [--members 1,2,4] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from brokers import kcli_broker  # noqa: E402
from report import record  # noqa: E402

from confluent_kafka import Producer  # noqa: E402

from kcli.protocol.client import WireClient  # noqa: E402
from tests.kafka_helpers import create_topic  # noqa: E402

MEMBER = r"""
import json, sys, time
from confluent_kafka import ShareConsumer
bootstrap, group, topic, total = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3})
c.subscribe([topic])
print("ready", flush=True)
n, first, last, idle_since = 0, None, None, None
offsets = []
while True:
    msgs = c.poll(0.2)
    got = [m for m in msgs if m.error() is None]
    now = time.time()
    if got:
        if first is None:
            first = now
        last = now
        n += len(got)
        offsets.extend(m.offset() for m in got)
        idle_since = None
    elif first is not None:
        idle_since = idle_since or now
        if now - idle_since > 3.0:
            break
    elif now - (idle_since or now) > 60:
        break
    else:
        idle_since = idle_since or now
c.commit_sync(30)
c.close()
print(json.dumps({"count": n, "first": first, "last": last, "offsets": offsets}), flush=True)
"""


def produce(bootstrap: str, topic: str, records: int, size: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": 100,
                  "queue.buffering.max.messages": 1_000_000})
    value = b"x" * size
    for _ in range(records):
        while True:
            try:
                p.produce(topic, value, partition=0)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


def reset_to_earliest(bootstrap: str, group: str, topic: str) -> None:
    with WireClient(bootstrap) as w:
        resp = w.request(91, 0, {"group_id": group, "topics": [
            {"topic_name": topic, "partitions": [{"partition_index": 0, "start_offset": 0}]}]})
    assert resp.error_code == 0 and not resp.responses[0].partitions[0].error_code, resp


def run(bootstrap: str, members: int, records: int, size: int) -> dict:
    topic, group = f"share-bench-{members}", f"share-bench-{members}"
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, records, size)
    reset_to_earliest(bootstrap, group, topic)
    procs = [subprocess.Popen([sys.executable, "-c", MEMBER, bootstrap, group, topic, str(records)],
                              stdout=subprocess.PIPE, text=True) for _ in range(members)]
    results = []
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:
        out, _ = p.communicate(timeout=600)
        results.append(json.loads(out.strip().splitlines()[-1]))
    offsets = [o for r in results for o in r["offsets"]]
    first = min(r["first"] for r in results if r["first"] is not None)
    last = max(r["last"] for r in results if r["last"] is not None)
    return {"members": members, "records": len(offsets), "distinct": len(set(offsets)),
            "per_member": sorted((r["count"] for r in results), reverse=True),
            "seconds": round(last - first, 3), "records_per_s": round(len(offsets) / max(last - first, 1e-6)),
            "mb_per_s": round(len(offsets) * size / max(last - first, 1e-6) / 1e6, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=60000)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--members", default="1,2,4")
    ap.add_argument("--quick", action="store_true", help="20,000 records")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.records = 20000
    rows = []
    with kcli_broker() as bootstrap:
        for m in [int(x) for x in args.members.split(",")]:
            rows.append(run(bootstrap, m, args.records, args.size))
    base = rows[0]["records_per_s"] if rows else 0
    for r in rows:
        record(f"share consumers on one partition, {r['members']} member(s) ({args.size} B records), records/s",
               r["records_per_s"], unit="records/s", target="each record once")
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'members':>7}  {'records/s':>10}  {'MB/s':>6}  {'vs 1':>5}  {'seconds':>7}  per member  (exactly once)")
    for r in rows:
        once = r["records"] == r["distinct"] == args.records
        print(f"{r['members']:>7}  {r['records_per_s']:>10}  {r['mb_per_s']:>6}  {r['records_per_s'] / base:>5.2f}  "
              f"{r['seconds']:>7}  {r['per_member']}  ({'yes' if once else 'NO: ' + str(r['records']) + ' / ' + str(r['distinct'])})")


if __name__ == "__main__":
    main()
