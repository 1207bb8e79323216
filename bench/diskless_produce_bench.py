"""Diskless produce throughput and delivery latency next to a classic topic, same broker.

Workload: confluent-kafka producers (acks=all), values of --value-bytes (16 KiB default, so the
Python client loop is not what is measured), --partitions partitions, local object store,
default diskless.append.commit.interval.ms (250) unless --interval-ms is given.

1. Throughput: --producers producers (one process each) send --mib MiB as fast as they can;
   MB/s = bytes / time until every delivery report arrived. --repeat runs per kind, the two
   kinds alternating (a shared machine's background load then hits both alike); the median.
2. Latency: one producer at a steady --rate-mib MiB/s for --seconds; the delivery-report
   latency of every message (produce() call → delivery callback), P50 and P99.
3. Broker CPU: MB moved per second of the broker process's CPU (all threads) during the
   throughput runs — the figure a busy shared machine distorts least.

Targets (issue 3, 2 cores): diskless ≥ 100 MB/s sustained; latency P50 ≤ interval + 30 ms and
P99 ≤ 2 × interval. Usage: python3 bench/diskless_produce_bench.py [--mib 512] [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from brokers import kcli_broker, machine  # noqa: E402
from report import record  # noqa: E402


def _producer_conf(bootstrap: str, idempotent: bool) -> dict:
    return {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": idempotent,
            "queue.buffering.max.kbytes": 262144, "batch.size": 1000000}


def blast(bootstrap: str, topic: str, total_bytes: int, value_bytes: int, idempotent: bool, out: "mp.Queue",
          client_id: str | None = None) -> None:
    """One producer process: ``total_bytes`` of ``value_bytes`` values as fast as acks=all allows;
    puts seconds, bytes, the first errors and what was left unflushed on ``out`` (also used by
    bench/cluster_bench.py, whose producers name their rack in ``client_id``)."""
    from confluent_kafka import Producer

    conf = _producer_conf(bootstrap, idempotent)
    if client_id is not None:
        conf["client.id"] = client_id
    p = Producer(conf)
    value = os.urandom(value_bytes)
    n = max(1, total_bytes // value_bytes)
    errors: list[str] = []

    def cb(err, _msg):  # noqa: ANN001
        if err is not None:
            errors.append(str(err))

    start = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, value, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.005)
        p.poll(0)
    left = p.flush(300)
    out.put({"seconds": time.perf_counter() - start, "bytes": n * value_bytes, "errors": errors[:3], "left": left})


def throughput(bootstrap: str, topic: str, mib: int, producers: int, value_bytes: int, idempotent: bool) -> dict:
    q: mp.Queue = mp.Queue()
    share = (mib << 20) // producers
    procs = [mp.Process(target=blast, args=(bootstrap, topic, share, value_bytes, idempotent, q)) for _ in range(producers)]
    start = time.perf_counter()
    for pr in procs:
        pr.start()
    results = [q.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - start
    for pr in procs:
        pr.join()
    failed = [r for r in results if r["errors"] or r["left"]]
    if failed:
        raise SystemExit(f"{topic}: delivery failed: {failed[0]}")
    total = sum(r["bytes"] for r in results)
    slowest = max(r["seconds"] for r in results)
    return {"mb_s": total / slowest / 1e6, "bytes": total, "seconds": slowest, "wall_seconds": wall}


def latency(bootstrap: str, topic: str, rate_mib: float, seconds: float, value_bytes: int, idempotent: bool) -> dict:
    from confluent_kafka import Producer

    p = Producer(_producer_conf(bootstrap, idempotent))
    value = os.urandom(value_bytes)
    lat: list[float] = []
    errors: list[str] = []

    def cb_for(sent: float):
        def cb(err, _msg):  # noqa: ANN001
            if err is not None:
                errors.append(str(err))
            else:
                lat.append((time.perf_counter() - sent) * 1000)
        return cb

    per_s = max(1.0, rate_mib * (1 << 20) / value_bytes)
    gap = 1.0 / per_s
    start = time.perf_counter()
    sent = 0
    while time.perf_counter() - start < seconds:
        due = start + sent * gap
        now = time.perf_counter()
        if now < due:
            p.poll(min(due - now, 0.005))
            continue
        p.produce(topic, value, on_delivery=cb_for(time.perf_counter()))
        sent += 1
        p.poll(0)
    p.flush(60)
    if errors:
        raise SystemExit(f"{topic}: delivery failed: {errors[:3]}")
    lat.sort()

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))]

    return {"messages": len(lat), "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": lat[-1],
            "mean_ms": statistics.fmean(lat)}


def broker_metrics(bootstrap: str) -> dict:
    from kcli.diskless.admin_api import BROKER_METRICS_KEY, call

    return call(bootstrap, BROKER_METRICS_KEY, {})


def record_rows(args: argparse.Namespace, interval: int, results: dict[str, dict], summaries: dict) -> None:
    """Every figure of the table for bench/run_all: diskless with the classic topic as its peer."""
    d, c = results["diskless"], results["classic"]
    load = (f"{args.value_bytes / 1024:g} KiB values, {args.partitions} partitions, {args.producers} producers, "
            f"acks=all{', idempotent' if args.idempotent else ''}, {args.mib} MiB, median of {args.repeat}")
    steady = f"one producer at {args.rate_mib:g} MiB/s for {args.seconds:g} s, commit interval {interval} ms"
    peer = {"peer_name": "classic topic"}
    record(f"diskless produce MB/s ({load})", round(d["throughput"]["mb_s"], 1),
           peer=round(c["throughput"]["mb_s"], 1), unit="MB/s", target=">= 100 MB/s", **peer)
    record(f"diskless produce MB per broker CPU-second ({load})", round(d["throughput"]["mb_per_broker_cpu_s"], 1),
           peer=round(c["throughput"]["mb_per_broker_cpu_s"], 1), unit="MB/cpu-s", **peer)
    for key, label, target in (("p50_ms", "P50", f"<= {interval + 30} ms"), ("p99_ms", "P99", f"<= {2 * interval} ms"),
                               ("max_ms", "max", "")):
        record(f"diskless delivery latency {label} ({steady})", round(d["latency"][key], 1),
               peer=round(c["latency"][key], 1), unit="ms", target=target, better="lower", **peer)
    for name, unit in (("diskless.upload.latency_ms", "ms"), ("diskless.commit.latency_ms", "ms"),
                       ("diskless.upload.object_bytes", "B")):
        if name in summaries:
            for q in ("p50", "p99"):
                record(f"broker {name} {q.upper()} (whole run, {summaries[name]['count']} samples)",
                       summaries[name][q], unit=unit, better="lower" if unit == "ms" else "higher")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=512, help="MiB per throughput run (default 512)")
    ap.add_argument("--repeat", type=int, default=3, help="throughput runs per topic kind; the median is shown")
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--value-bytes", type=int, default=16384)
    ap.add_argument("--rate-mib", type=float, default=5.0, help="steady rate of the latency run, MiB/s")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of the latency run")
    ap.add_argument("--interval-ms", type=int, default=None, help="diskless.append.commit.interval.ms (default 250)")
    ap.add_argument("--idempotent", action="store_true", help="enable.idempotence=true")
    ap.add_argument("--quick", action="store_true", help="256 MiB and a 10 s latency run")
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = ap.parse_args()
    if args.quick:
        args.mib, args.seconds, args.repeat = min(args.mib, 256), min(args.seconds, 10.0), 1

    from kcli.config.definitions import BROKER_CONFIGS

    interval = args.interval_ms or int(BROKER_CONFIGS["diskless.append.commit.interval.ms"].default)
    configs = {"diskless.append.commit.interval.ms": str(interval)} if args.interval_ms else {}
    from tests.kafka_helpers import create_topic

    print(f"machine: {machine()}; value {args.value_bytes} B, {args.partitions} partitions, acks=all, "
          f"idempotent={args.idempotent}, commit interval {interval} ms")
    kinds = {"diskless": {"diskless.enable": "true"}, "classic": {}}
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    results: dict[str, dict] = {}
    with kcli_broker(configs) as bootstrap:
        for kind, cfg in kinds.items():
            create_topic(bootstrap, f"bench-{kind}", args.partitions, cfg)
        time.sleep(0.5)
        # Alternate the two kinds so both see the same background load on a shared machine.
        for _ in range(args.repeat):
            for kind in kinds:
                cpu0 = broker_metrics(bootstrap)["process_cpu_s"]
                run = throughput(bootstrap, f"bench-{kind}", args.mib, args.producers, args.value_bytes,
                                 args.idempotent)
                run["broker_cpu_s"] = broker_metrics(bootstrap)["process_cpu_s"] - cpu0
                runs[kind].append(run)
        for kind in kinds:
            rates = sorted(r["mb_s"] for r in runs[kind])
            # Load-independent: MB the broker moves per second of its own CPU (all threads).
            per_cpu = sorted(r["bytes"] / r["broker_cpu_s"] / 1e6 for r in runs[kind])
            lt = latency(bootstrap, f"bench-{kind}", args.rate_mib, args.seconds, args.value_bytes, args.idempotent)
            results[kind] = {"throughput": {"mb_s": statistics.median(rates), "runs_mb_s": rates,
                                            "mb_per_broker_cpu_s": statistics.median(per_cpu)}, "latency": lt}
        m = broker_metrics(bootstrap)
    s = m["summaries"]
    print(f"\n{'topic':9} {'MB/s':>8} {'MB/cpu-s':>9} {'P50 ms':>8} {'P99 ms':>8} {'max ms':>8}   "
          f"(MB/s: median of {args.repeat} runs; MB per broker CPU-second; latency at {args.rate_mib} MiB/s)")
    for kind, r in results.items():
        runs_text = ", ".join(f"{x:.0f}" for x in r["throughput"]["runs_mb_s"])
        print(f"{kind:9} {r['throughput']['mb_s']:8.1f} {r['throughput']['mb_per_broker_cpu_s']:9.1f} "
              f"{r['latency']['p50_ms']:8.1f} {r['latency']['p99_ms']:8.1f} {r['latency']['max_ms']:8.1f}   "
              f"runs: {runs_text}")
    print(f"load average after the runs: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    d = results["diskless"]
    print(f"\ndiskless targets: throughput {d['throughput']['mb_s']:.1f} MB/s (>= 100: "
          f"{'ok' if d['throughput']['mb_s'] >= 100 else 'MISSED'}); P50 {d['latency']['p50_ms']:.1f} ms "
          f"(<= {interval + 30}: {'ok' if d['latency']['p50_ms'] <= interval + 30 else 'MISSED'}); "
          f"P99 {d['latency']['p99_ms']:.1f} ms (<= {2 * interval}: "
          f"{'ok' if d['latency']['p99_ms'] <= 2 * interval else 'MISSED'})")
    for name in ("diskless.upload.latency_ms", "diskless.commit.latency_ms", "diskless.upload.object_bytes"):
        if name in s:
            print(f"broker {name}: count {s[name]['count']} p50 {s[name]['p50']} p99 {s[name]['p99']}")
    record_rows(args, interval, results, s)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
