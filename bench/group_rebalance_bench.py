"""Group rebalance time: the KIP-848 consumer protocol vs the classic protocol, 10 members.

A fresh kcli broker (``group.initial.rebalance.delay.ms=0``, every other setting Kafka's default);
for each protocol a fresh topic of ``--partitions`` partitions and ``--members`` confluent-kafka
consumers, each in its own process, subscribe at once. Each member prints its assignment as it
changes (its rebalance callbacks, with the time). Figures per protocol:

- **join**: from the moment the first member subscribed until every member owns a partition,
  every partition has exactly one owner and the assignment holds still for 2 s (the time of its
  last change);
- **scale-out**: one more member joins; the same, from its subscription;
- **moved / paused**: in that scale-out, how many partitions changed owner, and how many
  partition-seconds the members that kept a partition were without it (the eager classic
  protocol revokes everything, the consumer protocol only what moves).

The classic members use librdkafka's default assignors (eager range/roundrobin), the consumer
members the broker's default assignor (uniform). Defaults for session and heartbeat timing
on both sides (classic heartbeat.interval.ms 3000, group.consumer.heartbeat.interval.ms 5000).

Usage: python3 bench/group_rebalance_bench.py [--members 10] [--partitions 20] [--repeat 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from brokers import kcli_broker  # noqa: E402
from report import record  # noqa: E402

from tests.kafka_helpers import create_topic  # noqa: E402

MEMBER = r"""
import json, sys, time
from confluent_kafka import Consumer
bootstrap, group, topic, protocol = sys.argv[1:5]
conf = {"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3, "enable.auto.commit": False}
if protocol == "consumer":
    conf["group.protocol"] = "consumer"
c = Consumer(conf)
owned = set()

def say():
    print(json.dumps({"t": time.time(), "owned": sorted(owned)}), flush=True)

def on_assign(consumer, partitions):
    owned.update(p.partition for p in partitions)
    if protocol == "classic":
        consumer.assign(partitions)
    say()

def on_revoke(consumer, partitions):
    owned.difference_update(p.partition for p in partitions)
    say()

c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
print(json.dumps({"subscribed": time.time()}), flush=True)
end = time.time() + float(sys.argv[5])
while time.time() < end:
    c.poll(0.1)
c.close()
"""


class Member:
    def __init__(self, bootstrap: str, group: str, topic: str, protocol: str, lifetime_s: float) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", MEMBER, bootstrap, group, topic, protocol, str(lifetime_s)],
                                     stdout=subprocess.PIPE, text=True)
        self.events: list[tuple[float, set[int]]] = []
        self.subscribed: float | None = None
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            doc = json.loads(line)
            with self.lock:
                if "subscribed" in doc:
                    self.subscribed = doc["subscribed"]
                else:
                    self.events.append((doc["t"], set(doc["owned"])))

    def owned_at(self, t: float) -> set[int]:
        with self.lock:
            owned: set[int] = set()
            for when, parts in self.events:
                if when > t:
                    break
                owned = parts
            return owned

    def last_change(self) -> float:
        with self.lock:
            return self.events[-1][0] if self.events else 0.0

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def settled(members: list[Member], partitions: int, hold_s: float = 2.0, timeout_s: float = 90.0) -> float:
    """Wait until every member owns a partition and every partition has exactly one owner,
    unchanged for ``hold_s``; returns the time of the last change."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        now = time.time()
        owners = [p for m in members for p in m.owned_at(now)]
        last = max(m.last_change() for m in members)
        if sorted(owners) == list(range(partitions)) and all(m.owned_at(now) for m in members) \
                and now - last >= hold_s:
            return last
        time.sleep(0.1)
    raise SystemExit(f"the group did not settle in {timeout_s} s")


def paused_partition_seconds(members: list[Member], start: float, end: float, step: float = 0.05) -> float:
    """Partition-seconds during [start, end] in which a member that owned a partition at
    ``start`` and owns it again at ``end`` was without it."""
    kept = [(m, m.owned_at(start) & m.owned_at(end)) for m in members]
    total, t = 0.0, start
    while t < end:
        total += sum(len(parts - m.owned_at(t)) for m, parts in kept) * step
        t += step
    return total


def one_run(bootstrap: str, protocol: str, members: int, partitions: int) -> dict[str, Any]:
    topic = f"rebalance-{protocol}-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, partitions)
    group = f"g-{topic}"
    crew = [Member(bootstrap, group, topic, protocol, 120) for _ in range(members)]
    try:
        deadline = time.time() + 60
        while any(m.subscribed is None for m in crew) and time.time() < deadline:
            time.sleep(0.05)
        subscribed = min(m.subscribed or 0 for m in crew)
        joined = settled(crew, partitions)
        before = {id(m): m.owned_at(joined) for m in crew}
        newcomer = Member(bootstrap, group, topic, protocol, 120)
        while newcomer.subscribed is None:
            time.sleep(0.05)
        start = newcomer.subscribed
        crew.append(newcomer)
        done = settled(crew, partitions)
        moved = sum(len(before.get(id(m), set()) - m.owned_at(done)) for m in crew)
        return {"protocol": protocol, "join_s": round(joined - subscribed, 2), "scale_out_s": round(done - start, 2),
                "moved": moved, "paused_partition_s": round(paused_partition_seconds(crew[:-1], start, done), 1)}
    finally:
        for m in crew:
            m.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=10)
    ap.add_argument("--partitions", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with kcli_broker({"group.initial.rebalance.delay.ms": "0"}) as bootstrap:
        for _ in range(args.repeat):
            for protocol in ("classic", "consumer"):
                row = one_run(bootstrap, protocol, args.members, args.partitions)
                rows.append(row)
                if not args.json:
                    print(f"{protocol:8s} join {row['join_s']:6.2f} s  scale-out {row['scale_out_s']:6.2f} s  "
                          f"moved {row['moved']:3d}  paused {row['paused_partition_s']:6.1f} partition-s", flush=True)
    for protocol in ("classic", "consumer"):
        mine = [r for r in rows if r["protocol"] == protocol]
        record(f"group join, {args.members} members ({protocol})", min(r["join_s"] for r in mine), unit="s", better="lower")
        record(f"group scale-out to {args.members + 1} members ({protocol})", min(r["scale_out_s"] for r in mine),
               unit="s", better="lower")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
