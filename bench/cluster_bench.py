"""Cluster mode figures: diskless produce MB/s through 3 brokers vs 1, and failover after kill -9.

Everything runs on this machine: a temporary PostgreSQL server (kcli/cluster/pgserver.py; the
cluster metadata and the batch coordinator share its database) and a local-directory object
store shared by the brokers (``--object-store file:///...``).

1. Throughput: ``--producers`` producer processes (acks=all; ``--idempotent``: idempotent ones;
   one per rack a, b, c, ... in turn, client.id ``diskless_rack_id=<rack>``, so each writes
   through its own rack's broker) send ``--mib`` MiB
   of ``--value-bytes`` values to one diskless topic; MB/s = bytes / time until every delivery
   report arrived. Once with one broker (every rack's producer on it), once with three brokers
   in racks a, b, c; the same load both times, fresh database and store each run, ``--repeat``
   runs alternating, the median. Target: three brokers no worse than one.
2. Failover: three brokers; one producer in rack b (so it writes through broker 2) sends a
   small record every ``--gap-ms``; broker 2 is killed with SIGKILL; the figure is the time from
   the kill to the first acknowledgement after it (necessarily through another broker), and
   the time until broker 2 left Metadata. Once with Kafka's default broker.session.timeout.ms
   (9000, heartbeat 2000) and once with ``--short-session-ms`` (heartbeat a sixth of it).
   Target: acknowledged again within 10 s.

Usage: python3 bench/cluster_bench.py [--mib 128] [--repeat 3] [--idempotent] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
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
from diskless_produce_bench import blast
from report import record

from tests.brokerproc import BrokerProcess

RACKS = "abcdefgh"


def rack_client(rack: str) -> str:
    return f"bench-{rack},diskless_rack_id={rack}"


@contextmanager
def postgres() -> Iterator[Any]:
    from kcli.cluster.pgserver import start_server

    root = Path(tempfile.mkdtemp(prefix="kcli-pg-"))  # under /tmp: as root the server runs as `postgres`
    server = start_server(root)
    try:
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def cluster(server: Any, brokers: int, configs: dict[str, str] | None = None) -> Iterator[list[BrokerProcess]]:
    """``brokers`` brokers in racks a, b, c, ... on a fresh database and a fresh shared store."""
    url = server.url(server.create_database())
    with tempfile.TemporaryDirectory(prefix="kcli-cluster-bench-") as tmp:
        store = (Path(tmp) / "objects").as_uri()
        started: list[BrokerProcess] = []
        try:
            for n in range(1, brokers + 1):
                args = ["--cluster", url, "--node-id", str(n), "--rack", RACKS[n - 1], "--object-store", store]
                started.append(BrokerProcess(Path(tmp) / f"node{n}", configs, args).start())
            wait_brokers(started[0].bootstrap, set(range(1, brokers + 1)), 20)
            yield started
        finally:
            for b in started:
                b.stop()


def live_brokers(bootstrap: str) -> set[int]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).brokers)


def wait_brokers(bootstrap: str, want: set[int], timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if live_brokers(bootstrap) == want:
            return time.monotonic() - start
        time.sleep(0.05)
    raise SystemExit(f"brokers {sorted(want)} not live after {timeout} s")


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1, config={"diskless.enable": "true"})])[name].result(30)


# ---- throughput ---------------------------------------------------------------------------------


def cpu_seconds(brokers: list[BrokerProcess]) -> float:
    """User + system CPU of the broker processes so far (Linux /proc), all threads."""
    total = 0
    for b in brokers:
        assert b.proc is not None
        fields = Path(f"/proc/{b.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / os.sysconf("SC_CLK_TCK")


def throughput(brokers: list[BrokerProcess], args: argparse.Namespace) -> tuple[float, float]:
    """(MB/s, MB per CPU-second of all brokers together)."""
    create_topic(brokers[0].bootstrap, "bench", args.partitions)
    time.sleep(0.5)  # every broker learns the topic
    cpu0 = cpu_seconds(brokers)
    q: mp.Queue = mp.Queue()
    share = (args.mib << 20) // args.producers
    procs = []
    for i in range(args.producers):
        rack = RACKS[i % 3]
        bootstrap = brokers[i % len(brokers)].bootstrap  # with one broker: every rack's producer on it
        procs.append(mp.Process(target=blast, args=(bootstrap, "bench", share, args.value_bytes, args.idempotent, q,
                                                            rack_client(rack))))
    for pr in procs:
        pr.start()
    results = [q.get(timeout=600) for _ in procs]
    for pr in procs:
        pr.join()
    cpu = cpu_seconds(brokers) - cpu0
    failed = [r for r in results if r["errors"] or r["left"]]
    if failed:
        raise SystemExit(f"delivery failed: {failed[0]}")
    total = sum(r["bytes"] for r in results)
    return total / max(r["seconds"] for r in results) / 1e6, total / cpu / 1e6


# ---- failover -----------------------------------------------------------------------------------


def failover(server: Any, session_ms: int, heartbeat_ms: int, gap_ms: float) -> dict[str, float]:
    from confluent_kafka import Producer

    configs = {"broker.session.timeout.ms": str(session_ms), "broker.heartbeat.interval.ms": str(heartbeat_ms)}
    with cluster(server, 3, configs) as brokers:
        create_topic(brokers[0].bootstrap, "failover", 3)
        time.sleep(0.5)
        acks: list[float] = []
        errors: list[str] = []
        stop = threading.Event()

        def cb(err, _msg):
            (errors.append(str(err)) if err is not None else acks.append(time.monotonic()))

        p = Producer({"bootstrap.servers": brokers[1].bootstrap, "client.id": rack_client("b"), "linger.ms": 0,
                      "enable.idempotence": True, "message.timeout.ms": 120000})

        def run() -> None:
            while not stop.is_set():
                p.produce("failover", b"x" * 100, on_delivery=cb)
                p.poll(gap_ms / 1000)
            p.flush(120)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        deadline = time.monotonic() + 30
        while len(acks) < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        killed = time.monotonic()
        brokers[1].kill9()
        left = wait_brokers(brokers[0].bootstrap, {1, 3}, session_ms / 1000 + 30)
        deadline = time.monotonic() + 60
        while not any(a > killed for a in acks) and time.monotonic() < deadline:
            time.sleep(0.01)
        again = min((a for a in acks if a > killed), default=float("nan")) - killed
        stop.set()
        t.join(150)
        if errors:
            raise SystemExit(f"failover: delivery failed: {errors[:3]}")
        return {"acked_again_s": again, "left_metadata_s": left}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=128, help="MiB per throughput run (default 128)")
    ap.add_argument("--repeat", type=int, default=3, help="throughput runs per cluster size; the median is shown")
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--value-bytes", type=int, default=16384)
    ap.add_argument("--idempotent", action="store_true", help="throughput producers with enable.idempotence=true")
    ap.add_argument("--gap-ms", type=float, default=5.0, help="failover producer: one record every this many ms")
    ap.add_argument("--short-session-ms", type=int, default=3000)
    ap.add_argument("--quick", action="store_true", help="64 MiB, one run each")
    ap.add_argument("--failover-only", action="store_true", help="skip the throughput runs")
    ap.add_argument("--failover-runs", type=int, default=1, help="kill -9 runs per session timeout")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.mib, args.repeat = min(args.mib, 64), 1
    print(f"machine: {machine()}; {args.producers} producers (acks=all, idempotent={args.idempotent}), {args.value_bytes} B values, "
          f"{args.partitions} partitions, {args.mib} MiB per run, local PostgreSQL + local file store")
    out: dict[str, Any] = {}
    with postgres() as server:
        if not args.failover_only:
            produce_figures(server, args, out)
        for session, beat in ((9000, 2000), (args.short_session_ms, max(100, args.short_session_ms // 6))):
            for _ in range(args.failover_runs):
                f = failover(server, session, beat, args.gap_ms)
                out.setdefault(f"failover_session_{session}", []).append(f)
                print(f"kill -9, broker.session.timeout.ms={session} (heartbeat {beat}): acknowledged again after "
                      f"{f['acked_again_s']:.2f} s; broker left Metadata after {f['left_metadata_s']:.2f} s "
                      f"({'ok' if f['acked_again_s'] <= 10 else 'MISSED'}: <= 10 s)")
                record(f"cluster kill -9 to producer acknowledged again (broker.session.timeout.ms={session})",
                       round(f["acked_again_s"], 2), unit="s", target="<= 10 s", better="lower")
    print(f"load average after the runs: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.json:
        print(json.dumps(out, indent=2))


def produce_figures(server: Any, args: argparse.Namespace, out: dict[str, Any]) -> None:
    """Diskless produce MB/s and MB per broker CPU-second, 3 brokers vs 1 (alternating runs)."""
    runs: dict[int, list[float]] = {1: [], 3: []}
    per_cpu: dict[int, list[float]] = {1: [], 3: []}
    for _ in range(args.repeat):  # alternating: a shared machine's background load hits both alike
        for n in (1, 3):
            with cluster(server, n) as brokers:
                rate, eff = throughput(brokers, args)
                runs[n].append(rate)
                per_cpu[n].append(eff)
    mb = {n: statistics.median(r) for n, r in runs.items()}
    eff_mb = {n: statistics.median(r) for n, r in per_cpu.items()}
    out["throughput_mb_s"] = {"1 broker": mb[1], "3 brokers": mb[3], "runs": runs}
    out["mb_per_broker_cpu_s"] = {"1 broker": eff_mb[1], "3 brokers": eff_mb[3], "runs": per_cpu}
    print(f"\ndiskless produce MB/s, median of {args.repeat}: 1 broker {mb[1]:.1f} "
          f"(runs {', '.join(f'{x:.0f}' for x in runs[1])}), 3 brokers {mb[3]:.1f} "
          f"(runs {', '.join(f'{x:.0f}' for x in runs[3])}); 3 vs 1: {mb[3] / mb[1]:.2f}x "
          f"({'ok' if mb[3] >= 0.95 * mb[1] else 'MISSED'}: no worse)")
    print(f"MB per CPU-second of all brokers together, median: 1 broker {eff_mb[1]:.1f} "
          f"(runs {', '.join(f'{x:.0f}' for x in per_cpu[1])}), 3 brokers {eff_mb[3]:.1f} "
          f"(runs {', '.join(f'{x:.0f}' for x in per_cpu[3])})")
    kind = "idempotent producers" if args.idempotent else "producers, acks=all"
    load = f"{args.producers} {kind}, {args.value_bytes // 1024} KiB values, {args.mib} MiB"
    record(f"cluster diskless produce MB/s, 3 brokers ({load})", round(mb[3], 1), peer=round(mb[1], 1),
           peer_name="1 broker", unit="MB/s", target=">= 1 broker")
    record(f"cluster diskless produce MB per CPU-second of all brokers, 3 brokers ({load})", round(eff_mb[3], 1),
           peer=round(eff_mb[1], 1), peer_name="1 broker", unit="MB/cpu-s")


if __name__ == "__main__":
    main()
