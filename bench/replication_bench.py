"""Replication figures (issue #26, docs/replication.md), in one run on one three-broker cluster.

Everything runs on this machine: a temporary PostgreSQL server (kcli/cluster/pgserver.py) for the
cluster metadata, three kcli brokers in racks a, b, c with default settings.

1. Throughput: one confluent-kafka producer (acks=all, idempotent, linger.ms 5) sends ``--mib``
   MiB of ``--value-bytes`` values to a 3-partition topic with replication factor 3
   (``min.insync.replicas=2``), then the same to a 3-partition topic with replication factor 1, on
   the same cluster, alternating ``--repeat`` times; MB/s = bytes / time until every delivery
   report arrived. Target: RF=3 at least half of RF=1.
2. Latency: a paced load (``--rate`` records/s of 1 KiB for ``--latency-s`` seconds, acks=all) to
   each topic; P50 / P99 of the time from produce() to the delivery report.
3. Failover: an idempotent producer sends a record every 5 ms to a replicated topic; the leader of
   partition 0 is killed with SIGKILL; the figure is the time from the kill to the first
   acknowledgement on a partition it led (necessarily from a new leader). ``--failovers`` runs,
   the broker restarted and back in every ISR between them. Target: within 10 s.
4. Rejoin: ``--rejoin-mib`` MiB in a replicated topic; a follower (not the controller) is killed,
   its data dir deleted, and once the controller dropped it from the ISR it is started again; the
   figure is the time from the start to every partition's ISR holding it again, and that time per
   GiB copied.

Usage: python3 bench/replication_bench.py [--mib 64] [--repeat 3] [--failovers 3] [--rejoin-mib 256]
       [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from brokers import machine
from cluster_bench import cpu_seconds, postgres
from report import record

from tests.brokerproc import BrokerProcess

RACKS = "abc"


@contextmanager
def three_brokers(server: Any, root: Path) -> Iterator[dict[int, BrokerProcess]]:
    url = server.url(server.create_database())
    brokers: dict[int, BrokerProcess] = {}
    try:
        for n in (1, 2, 3):
            brokers[n] = BrokerProcess(root / f"node{n}", {}, ["--cluster", url, "--node-id", str(n),
                                                            "--rack", RACKS[n - 1]]).start()
        for b in brokers.values():  # every broker sees the other two
            wait(lambda b=b: len(md(b.bootstrap).brokers) == 3, 30, "three live brokers")
        yield brokers
    finally:
        for b in brokers.values():
            b.stop()


def boot(brokers: dict[int, BrokerProcess]) -> str:
    return ",".join(b.bootstrap for b in brokers.values() if b.alive())


def md(bootstrap: str, topic: str | None = None) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)


def wait(cond: Any, timeout: float, what: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if cond():
                return time.monotonic() - start
        except Exception:  # noqa: BLE001 - a broker going away mid-question: ask again
            pass
        time.sleep(0.05)
    raise SystemExit(f"timed out after {timeout} s waiting for {what}")


def create(bootstrap: str, name: str, partitions: int, rf: int, **configs: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the result
    for attempt in range(20):  # a broker that just started may not see every registration yet
        try:
            admin.create_topics([NewTopic(name, partitions, rf, config=configs)])[name].result(30)
            break
        except Exception as err:  # noqa: BLE001
            if "INVALID_REPLICATION_FACTOR" not in str(err) or attempt == 19:
                raise
            time.sleep(0.5)
    wait(lambda: isr_full(bootstrap, name, rf), 30, f"the ISR of {name}")


def isr_full(bootstrap: str, topic: str, rf: int) -> bool:
    parts = md(bootstrap, topic).topics[topic].partitions
    return bool(parts) and all(len(p.isrs) == rf and p.leader >= 0 for p in parts.values())


# ---- throughput and latency -----------------------------------------------------------------------
def blast(bootstrap: str, topic: str, mib: int, value_bytes: int) -> float:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5,
                  "batch.size": 1 << 20, "queue.buffering.max.kbytes": 1 << 20})
    value = os.urandom(value_bytes)
    n = (mib << 20) // value_bytes
    failed = []
    start = time.monotonic()
    for i in range(n):
        while True:
            try:
                p.produce(topic, value, partition=i % 3, on_delivery=lambda err, _m: err and failed.append(err))
                break
            except BufferError:
                p.poll(0.01)
        if i % 256 == 0:
            p.poll(0)
    left = p.flush(120)
    elapsed = time.monotonic() - start
    if left or failed:
        raise SystemExit(f"{topic}: {left} undelivered, {len(failed)} failed ({failed[:1]})")
    return n * value_bytes / elapsed / 1e6


def latencies(bootstrap: str, topic: str, rate: float, seconds: float) -> tuple[float, float]:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 0})
    lat: list[float] = []
    value = os.urandom(1024)
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        t0 = time.monotonic()
        p.produce(topic, value, partition=i % 3, on_delivery=lambda err, _m, t0=t0: err is None and lat.append(time.monotonic() - t0))
        i += 1
        p.poll(max(0.0, 1 / rate - (time.monotonic() - t0)))
    p.flush(30)
    lat.sort()
    return lat[len(lat) // 2] * 1000, lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000


# ---- failover ------------------------------------------------------------------------------------
def failover(brokers: dict[int, BrokerProcess], topic: str) -> tuple[float, int, bool]:
    from confluent_kafka import Producer

    parts = md(boot(brokers), topic).topics[topic].partitions
    victim = parts[0].leader
    led = [i for i, p in parts.items() if p.leader == victim]
    was_controller = md(boot(brokers)).controller_id == victim
    acks: list[tuple[float, int]] = []
    stop = threading.Event()
    p = Producer({"bootstrap.servers": boot(brokers), "acks": "all", "enable.idempotence": True, "linger.ms": 0,
                  "retry.backoff.ms": 50, "topic.metadata.refresh.interval.ms": 1000})

    def run() -> None:
        i = 0
        while not stop.is_set():
            p.produce(topic, b"x" * 100, partition=i % 3,
                      on_delivery=lambda err, m: err is None and acks.append((time.monotonic(), m.partition())))
            i += 1
            p.poll(0.005)
        p.flush(30)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    time.sleep(2)
    brokers[victim].kill9()
    killed = time.monotonic()
    wait(lambda: any(at > killed and part in led for at, part in list(acks)), 60, "an acknowledgement after the kill")
    took = min(at for at, part in list(acks) if at > killed and part in led) - killed
    stop.set()
    t.join(40)
    brokers[victim].start()
    wait(lambda: isr_full(boot(brokers), topic, 3), 60, "the killed broker back in the ISR")
    return took, victim, was_controller


# ---- rejoin ---------------------------------------------------------------------------------------
def rejoin(brokers: dict[int, BrokerProcess], topic: str, mib: int) -> tuple[float, float]:
    blast(boot(brokers), topic, mib, 16384)
    wait(lambda: isr_full(boot(brokers), topic, 3), 60, "the ISR of the filled topic")
    ctl = md(boot(brokers)).controller_id
    victim = next(n for n in (3, 2, 1) if n != ctl)
    b = brokers[victim]
    size = sum(f.stat().st_size for f in b.data_dir.glob(f"{topic}-*/*.log"))
    b.kill9()
    shutil.rmtree(b.data_dir)
    others = ",".join(brokers[n].bootstrap for n in brokers if n != victim)
    wait(lambda: all(victim not in p.isrs for p in md(others, topic).topics[topic].partitions.values()), 30,
         "the wiped broker to leave the ISR")
    started = time.monotonic()
    b.start()
    wait(lambda: isr_full(boot(brokers), topic, 3), 600, "the wiped broker back in every ISR")
    took = time.monotonic() - started
    return took, took / (size / (1 << 30))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--value-bytes", type=int, default=16384)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rate", type=float, default=500)
    ap.add_argument("--latency-s", type=float, default=6)
    ap.add_argument("--failovers", type=int, default=3)
    ap.add_argument("--rejoin-mib", type=int, default=256)
    ap.add_argument("--quick", action="store_true", help="--mib 32 --repeat 1 --failovers 2 --rejoin-mib 96")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.mib, args.repeat, args.failovers, args.rejoin_mib = 32, 1, 2, 96
    out: dict[str, Any] = {"machine": machine(), "load": os.getloadavg()[0]}
    with postgres() as server, tempfile.TemporaryDirectory(prefix="kcli-replication-bench-") as tmp:
        with three_brokers(server, Path(tmp)) as brokers:
            bs = boot(brokers)
            create(bs, "rf3", 3, 3, **{"min.insync.replicas": "2"})
            create(bs, "rf1", 3, 1)
            runs = []
            procs = list(brokers.values())
            for _ in range(args.repeat):
                row = []
                for topic in ("rf3", "rf1"):
                    cpu0 = cpu_seconds(procs)
                    row.append(blast(bs, topic, args.mib, args.value_bytes))
                    row.append(args.mib * 1.048576 / max(1e-9, cpu_seconds(procs) - cpu0))  # MB per broker CPU-second
                runs.append(row)
            out["produce_mb_s"] = [{"rf3": round(a, 1), "rf1": round(b, 1), "ratio": round(a / b, 2),
                                    "mb_per_broker_cpu_s": {"rf3": round(ca, 1), "rf1": round(cb, 1)}}
                                   for a, ca, b, cb in runs]
            lat3, lat1 = latencies(bs, "rf3", args.rate, args.latency_s), latencies(bs, "rf1", args.rate, args.latency_s)
            out["latency_ms"] = {"rf3": [round(x, 1) for x in lat3], "rf1": [round(x, 1) for x in lat1]}
            create(bs, "fo", 3, 3, **{"min.insync.replicas": "2"})
            out["failover_s"] = []
            for _ in range(args.failovers):
                took, victim, ctl = failover(brokers, "fo")
                out["failover_s"].append({"s": round(took, 2), "victim": victim, "controller": ctl})
            create(bs, "rejoin", 3, 3, **{"min.insync.replicas": "2"})
            took, per_gib = rejoin(brokers, "rejoin", args.rejoin_mib)
            out["rejoin"] = {"mib": args.rejoin_mib, "s": round(took, 2), "s_per_gib": round(per_gib, 1)}
    out["load_after"] = os.getloadavg()[0]
    ratios = [r["ratio"] for r in out["produce_mb_s"]]
    record("replication: acks=all produce MB/s, RF=3 vs RF=1 (median)", statistics.median(r["rf3"] for r in out["produce_mb_s"]),
           peer=statistics.median(r["rf1"] for r in out["produce_mb_s"]), peer_name="RF=1", unit="MB/s", target=">= 0.5 x RF=1")
    record("replication: kill -9 of a leader to acknowledged again (s, max)", max(f["s"] for f in out["failover_s"]),
           unit="s", target="<= 10", better="lower")
    if args.json:
        print(json.dumps(out))
        return
    print(f"machine: {out['machine']}, load {out['load']:.1f} -> {out['load_after']:.1f}")
    print("acks=all produce MB/s (RF=3 | RF=1 | ratio), each run:", out["produce_mb_s"], "median ratio", statistics.median(ratios))
    print(f"acks=all latency P50/P99 ms at {args.rate:g}/s: RF=3 {out['latency_ms']['rf3']}, RF=1 {out['latency_ms']['rf1']}")
    print("kill -9 of a leader -> acknowledged again (s):", out["failover_s"])
    print(f"empty replica rejoining the ISR: {out['rejoin']['s']} s for {args.rejoin_mib} MiB "
          f"= {out['rejoin']['s_per_gib']} s per GiB")


if __name__ == "__main__":
    main()
