"""Local vs Spark engine for kcli's heavy scans: where does Spark start to pay off?

For growing synthetic diskless datasets (kcli.engine.synth: WAL objects of --object-mb each plus
a real SQLite coordinator, written to a temp dir on the local filesystem) it times, end to end
as an operator runs them (a fresh ``python3 -m kcli`` process each, so Spark's cold start is
included), the commands that take ``--engine``:

  verify     kcli diskless verify --coordinator … --engine E
  gc         kcli diskless gc --dry-run --coordinator … --engine E
  dump       kcli dump-log <objects/wal> --coordinator … --engine E      (batch level)
  dump-deep  kcli dump-log <objects/wal> --deep-iteration --engine E     (every record)

with E = local, spark and auto, then prints per operation the crossover (the size where a
straight-line fit of Spark's time meets the local engine's) and whether ``auto`` stayed within
1.2x of the better engine at every size. The cost lines in kcli/engine/select.py come from this.

Datasets grow in place (each size adds objects to the previous one) and are removed at the end
(--keep to keep). Free disk is checked first (df); sizes that do not fit are skipped.

Usage:
  python3 bench/engine_crossover_bench.py --quick                  # 64 MiB .. 1 GiB, ~10 min
  python3 bench/engine_crossover_bench.py --standalone --sizes 0.5,4   # on a 2 x 1-core standalone cluster
  python3 bench/engine_crossover_bench.py                          # 0.5 .. 10 GiB (full run)
  python3 bench/engine_crossover_bench.py --sizes 1,4 --ops verify --repeat 2 --json-out r.json

Local and auto points are the best of --repeat runs (3; one when a run takes over 15 s): on a
busy host a 1-second run varies by half a second, which would otherwise decide the auto/best
ratio at small sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))

from report import record  # noqa: E402

QUICK_SIZES_GIB = [0.0625, 0.25, 1.0]
FULL_SIZES_GIB = [0.5, 1.0, 2.5, 5.0, 10.0]
OPS = ["verify", "gc", "dump", "dump-deep"]
ENGINES = ["local", "spark", "auto"]
AUTO_TARGET = 1.2
REPEAT_BELOW_S = 15.0
GiB = 1 << 30


def command(op: str, ds_root: Path, engine: str, master: str | None = None) -> list[str]:
    coord = f"sqlite://{ds_root / 'diskless' / 'coordinator.db'}"
    base = [sys.executable, "-m", "kcli", "-v"]
    eng = ["--engine", engine] + (["--spark-master", master] if master else [])
    if op == "verify":
        return base + ["diskless", "verify", "--coordinator", coord, *eng, "-o", "json"]
    if op == "gc":
        return base + ["diskless", "gc", "--dry-run", "--coordinator", coord, *eng, "-o", "json"]
    wal = str(ds_root / "objects" / "wal")
    if op == "dump":
        return base + ["dump-log", wal, "--coordinator", coord, *eng]
    if op == "dump-deep":
        return base + ["dump-log", wal, "--deep-iteration", *eng]
    raise ValueError(op)


def run_once(cmd: list[str]) -> tuple[float, str, int]:
    """Wall time, the -v engine line, and the stdout byte count (output goes nowhere else)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
    out_bytes = 0
    assert proc.stdout is not None
    while chunk := proc.stdout.read(1 << 20):
        out_bytes += len(chunk)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    rc = proc.wait()
    elapsed = time.perf_counter() - start
    if rc not in (0,):
        raise RuntimeError(f"{' '.join(cmd)} exited {rc}: {err[-2000:]}")
    engine_line = next((ln for ln in err.splitlines() if "engine:" in ln), "")
    return elapsed, engine_line, out_bytes


def auto_overhead_ms(op: str, ds_root: Path, master: str | None = None) -> float:
    """What ``auto`` costs on top of the engine it picks, timed in-process: sizing the input
    (dump-log stats every file; verify/gc already know their sizes) and the choice itself."""
    from kcli.engine.dump import DumpItem, workload
    from kcli.engine.select import Workload, choose

    start = time.perf_counter()
    if op.startswith("dump"):
        wal = ds_root / "objects" / "wal"
        items = [DumpItem(str(p), False) for p in sorted(wal.iterdir())]
        work, _ = workload(items, "dump-log-deep" if op == "dump-deep" else "dump-log")
    else:
        work = Workload(op, 1, 1)
    choose("auto", work, master)
    return (time.perf_counter() - start) * 1000


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line y = a + b x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def crossover(rows: list[dict], op: str) -> tuple[str, str, float | None]:
    """The verdict (long and short) and the size in GiB where the fitted lines cross (None if they do not)."""
    pts = [r for r in rows if r["op"] == op and r.get("local") and r.get("spark")]
    if len(pts) < 2:
        return "not enough sizes", "not enough sizes", None
    xs = [r["gib"] for r in pts]
    al, bl = fit(xs, [r["local"] for r in pts])
    as_, bs = fit(xs, [r["spark"] for r in pts])
    wins = [r["gib"] for r in pts if r["spark"] < r["local"]]
    measured = f"Spark faster at {', '.join(f'{g:g}' for g in wins)} GiB" if wins else "Spark never faster"
    lines = f"{measured}; local {al:.1f}s + {bl:.1f}s/GiB, spark {as_:.1f}s + {bs:.1f}s/GiB"
    if bl <= 0 or bs <= 0:
        return (f"{lines}: no crossover can be read (a slope <= 0: start-up time and host load dominate)",
                "none read: a slope <= 0", None)
    if bl <= bs:
        return f"{lines}: the lines do not cross (Spark's slope is not lower)", "none: Spark's slope is not lower", None
    x = (as_ - al) / (bl - bs)
    return f"{lines}: lines cross at {x:.2f} GiB", f"local {bl:.1f} s/GiB, spark {bs:.1f} s/GiB", x


def record_point(row: dict) -> None:
    """One size x operation for bench/run_all: Spark against local, auto against the better engine."""
    on = f" on {row['master']}" if row.get("master") else ""
    at = f"engine crossover{on}: {row['op']} at {row['gib']:g} GiB ({row['objects']} objects)"
    if "local" in row and "spark" in row:
        record(f"{at}, spark (cold start) vs local", round(row["spark"], 2), peer=round(row["local"], 2),
               peer_name="local engine", unit="s", better="lower")
    else:
        for engine in ("local", "spark"):
            if engine in row:
                record(f"{at}, {engine}", round(row[engine], 2), unit="s", better="lower")
    if "auto" not in row:
        return
    if "auto_ratio" in row:
        best = min(("local", "spark"), key=lambda e: row.get(e, float("inf")))
        record(f"{at}, auto (chose {row.get('auto_chose', '-')}; its own cost {row['auto_overhead_ms']:.1f} ms)",
               round(row["auto"], 2), peer=round(row[best], 2), peer_name=f"better engine ({best})", unit="s",
               target=f"<= {AUTO_TARGET:g} x better", better="lower")
    else:
        record(f"{at}, auto (chose {row.get('auto_chose', '-')})", round(row["auto"], 2), unit="s", better="lower")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (64 MiB .. 1 GiB)")
    ap.add_argument("--sizes", help="comma-separated GiB, overrides --quick/full")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--object-mb", type=float, default=4.0, help="object size (the broker's buffer default: 4 MiB)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N per point (local and auto runs)")
    ap.add_argument("--spark-repeat", type=int, default=1, help="best of N for Spark runs (each pays the cold start)")
    ap.add_argument("--dir", default=None, help="parent of the temp dir (default: $TMPDIR)")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json-out", help="also write the measurements here")
    ap.add_argument("--spark-master", help="Spark master for the spark and auto runs (default: kcli's, local[*])")
    ap.add_argument("--standalone", action="store_true",
                    help="start a Spark standalone cluster on 127.0.0.1 (a master, 2 workers x 1 core, 1 GiB) "
                         "for the run and use it as --spark-master")
    args = ap.parse_args()
    cluster = None
    if args.standalone:
        from tests.spark_cluster import StandaloneCluster

        cluster = StandaloneCluster().start()
        args.spark_master = cluster.master_url
        os.environ["SPARK_MASTER_WEBUI_PORT"] = str(cluster.webui_port)  # for auto's core count
        print(f"standalone cluster {cluster.master_url}: {cluster.state()['cores']} cores")
    try:
        run(args)
    finally:
        if cluster is not None:
            cluster.stop()


def run(args: argparse.Namespace) -> None:
    from kcli.engine.synth import make_dataset

    sizes = [float(s) for s in args.sizes.split(",")] if args.sizes else (QUICK_SIZES_GIB if args.quick else FULL_SIZES_GIB)
    ops = [o for o in args.ops.split(",") if o]
    engines = [e for e in args.engines.split(",") if e]
    parent = args.dir or tempfile.gettempdir()
    df = subprocess.run(["df", "-h", parent], capture_output=True, text=True).stdout.strip()
    print(df)
    free = shutil.disk_usage(parent).free
    budget = free - 2 * GiB  # keep room for everyone else
    fitting = [s for s in sizes if s * GiB * 1.05 < budget]
    for s in sizes:
        if s not in fitting:
            print(f"skipping {s:g} GiB: {free / GiB:.1f} GiB free on {parent}")
    root = Path(tempfile.mkdtemp(prefix="kcli-crossover-", dir=parent))
    object_bytes = int(args.object_mb * (1 << 20))
    rows: list[dict] = []
    print(f"spark master: {args.spark_master or 'local[*]'}")
    print(f"host: {os.cpu_count()} CPUs; dataset in {root}; objects of {args.object_mb:g} MiB")
    print(f"{'GiB':>7} {'objects':>7} {'op':<9} " + " ".join(f"{e + ' s':>9}" for e in engines)
          + "  auto/best  auto chose  auto cost")
    try:
        have_objects = 0
        seed = 100
        for gib in fitting:
            want = max(1, int(round(gib * GiB / object_bytes)))
            if want > have_objects:
                t0 = time.perf_counter()
                make_dataset(root, objects=want - have_objects, object_bytes=object_bytes, seed=seed)
                seed += 1
                have_objects = want
                print(f"  (generated {gib:g} GiB in {time.perf_counter() - t0:.0f}s)", flush=True)
            for op in ops:
                row: dict = {"gib": gib, "objects": have_objects, "op": op, "master": args.spark_master}
                # Interleaved (local, spark, auto, local, auto, ...): the host's load drifts over
                # minutes, and every engine should see the same drift.
                for rep in range(max(args.repeat, args.spark_repeat)):
                    for engine in engines:
                        limit = args.spark_repeat if engine == "spark" else args.repeat
                        if rep >= limit or row.get(f"{engine}_done"):
                            continue
                        elapsed, line, out = run_once(command(op, root, engine, args.spark_master))
                        row[engine] = elapsed if engine not in row else min(row[engine], elapsed)
                        row[f"{engine}_out_bytes"] = out
                        if engine == "auto":
                            row["auto_chose"] = "spark" if "engine: spark" in line else "local"
                        if elapsed > REPEAT_BELOW_S:
                            row[f"{engine}_done"] = True  # noise is small next to the run: one is enough
                row["auto_overhead_ms"] = auto_overhead_ms(op, root, args.spark_master)
                better = min(row[e] for e in ("local", "spark") if e in row) if ("local" in row or "spark" in row) else None
                if "auto" in row and better:
                    row["auto_ratio"] = row["auto"] / better
                    chosen = row.get(row.get("auto_chose", ""))
                    if chosen:  # the chosen engine's own best time plus auto's measured cost
                        row["auto_model_ratio"] = (chosen + row["auto_overhead_ms"] / 1000) / better
                rows.append(row)
                record_point(row)
                print(f"{gib:7g} {have_objects:7d} {op:<9} " + " ".join(f"{row.get(e, float('nan')):9.1f}" for e in engines)
                      + (f"  {row['auto_ratio']:9.2f}  {row.get('auto_chose', '-'):<10} {row['auto_overhead_ms']:6.1f} ms"
                         if "auto_ratio" in row else ""),
                      flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print("\ncrossover (end to end, cold Spark start included):")
    for op in ops:
        text, short, at = crossover(rows, op)
        print(f"  {op:<9} {text}")
        if any(r["op"] == op for r in rows):
            record(f"engine crossover: {op}, size where Spark's fitted line meets local's ({short})",
                   None if at is None else round(at, 2), unit="GiB")
    ratios = [r["auto_ratio"] for r in rows if "auto_ratio" in r]
    if ratios:
        worst = max(ratios)
        verdict = "OK" if worst <= AUTO_TARGET else "MISSED"
        print(f"auto vs the better engine, measured: worst {worst:.2f}x (target <= {AUTO_TARGET}x): {verdict}")
        record(f"engine crossover: auto / better engine, worst over {len(ratios)} points (measured)", round(worst, 2),
               unit="x", target=f"<= {AUTO_TARGET:g}", better="lower")
        model = [r["auto_model_ratio"] for r in rows if "auto_model_ratio" in r]
        if model:
            worst_model = max(model)
            print(f"auto vs the better engine, chosen engine's best time + auto's own cost: worst "
                  f"{worst_model:.2f}x: {'OK' if worst_model <= AUTO_TARGET else 'MISSED'}")
            record(f"engine crossover: auto / better engine, worst over {len(model)} points "
                   "(chosen engine's best time + auto's own cost)", round(worst_model, 2), unit="x",
                   target=f"<= {AUTO_TARGET:g}", better="lower")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"cpus": os.cpu_count(), "object_mb": args.object_mb,
                                                   "spark_master": args.spark_master, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
