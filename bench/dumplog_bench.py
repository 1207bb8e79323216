"""dump-log throughput against ``cat FILE > /dev/null`` on generated segments.

Targets (issue 6):
  * batch-level dump >= 0.5 x cat's MB/s on the same file (large and small batches);
  * deep iteration >= 1,000,000 records/s.

Files (written to a temp dir, removed afterwards; --size-mb each, the zstd one a quarter of that):
  * large-batches.log  ~1 MiB batches (high-throughput producers: big batch.size + linger)
  * small-batches.log  ~16 KiB batches (Kafka's default batch.size)
  * zstd-batches.log   ~16 KiB zstd-compressed batches (deep iteration pays decompression)
Records are 100-byte hex values with short keys; timestamps advance 1 ms every 50 records.
Every batch gets its own base offset, timestamps and CRC, so nothing repeats from batch to batch;
``--producer idempotent`` (the default, as Kafka >= 3.0 producers are) also gives each batch a
producer id and a running base sequence, ``--producer plain`` leaves them at -1.

The machine this runs on is shared and noisy, so the figures are CPU time, not wall time:
dump-log runs in-process (``dump_file``, output to /dev/null) and is timed with
``time.process_time`` plus the CPU of any worker processes; cat is timed by the CPU its process
used (RUSAGE_CHILDREN). Runs are interleaved (cat, dump, cat, dump, ...) with the page cache warm,
and each figure is the median of --repeat runs. Wall-clock medians and one end-to-end CLI run
per file (wall, includes interpreter start-up) are printed for reference.

Usage: python3 bench/dumplog_bench.py [--size-mb 256] [--repeat 5] [--jobs 1] [--quick]
           [--producer idempotent|plain] [--root DIR]   # DIR: a kcli tree to time instead
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import record  # noqa: E402

T0 = 1_700_000_000_000
_Q = struct.Struct(">q")
_I = struct.Struct(">i")


def generate(path: Path, size: int, records_per_batch: int, compression: str = "none",
             idempotent: bool = True) -> int:
    """Write ~size bytes of batches built from one template, each patched to be distinct (base
    offset, timestamps, producer sequence, CRC); returns the number of records written."""
    from crc32c import crc32c

    from kcli.dumplog.synth import build_batch

    # 100-byte hex values: compress about 2:1, like typical text payloads (not 50:1 like repeats)
    recs = [(b"key-%d" % i, os.urandom(50).hex().encode(), []) for i in range(records_per_batch)]
    pid, epoch, seq = (4242, 0, 0) if idempotent else (-1, -1, -1)
    template = bytearray(build_batch(recs, 0, [T0 + i // 50 for i in range(records_per_batch)],
                                     compression=compression, producer_id=pid, producer_epoch=epoch,
                                     base_sequence=seq))
    span = (records_per_batch - 1) // 50  # maxTimestamp - baseTimestamp
    offset = written = 0
    body = memoryview(template)[21:]
    with open(path, "wb") as f:
        while written < size:
            ts = T0 + offset // 50
            _Q.pack_into(template, 0, offset)
            _Q.pack_into(template, 27, ts)
            _Q.pack_into(template, 35, ts + span)
            if idempotent:
                _I.pack_into(template, 53, offset & 0x7FFFFFFF)
            struct.pack_into(">I", template, 17, crc32c(body))
            f.write(template)
            written += len(template)
            offset += records_per_batch
    return offset


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_cat(path: Path) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one ``cat FILE > /dev/null``."""
    c, w = _children_cpu(), time.perf_counter()
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
    return _children_cpu() - c, time.perf_counter() - w


def run_dump(path: Path, deep: bool, jobs: int, devnull) -> tuple[float, float, object]:  # noqa: ANN001
    """(CPU seconds incl. worker processes, wall seconds, FileResult) of one in-process dump."""
    from kcli.dumplog import DumpOptions, LocalSource, dump_file

    c, p, w = _children_cpu(), time.process_time(), time.perf_counter()
    src = LocalSource(str(path))
    try:
        r = dump_file(src, DumpOptions(deep_iteration=deep, jobs=jobs), emit=devnull.write)
    finally:
        src.close()
    return time.process_time() - p + _children_cpu() - c, time.perf_counter() - w, r


def time_cli(path: Path, deep: bool, root: Path) -> float:
    args = [sys.executable, "-m", "kcli", "dump-log", str(path)] + (["--deep-iteration"] if deep else [])
    env = dict(os.environ, PYTHONPATH=str(root))
    t = time.perf_counter()
    subprocess.run(args, stdout=subprocess.DEVNULL, check=True, cwd=root, env=env)
    return time.perf_counter() - t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--jobs", default="1", help="worker counts for deep iteration; auto = kcli's default")
    parser.add_argument("--producer", choices=("idempotent", "plain"), default="idempotent")
    parser.add_argument("--root", type=Path, default=REPO, help="kcli source tree to time (default: this one)")
    parser.add_argument("--no-cli", action="store_true", help="skip the end-to-end CLI runs")
    parser.add_argument("--quick", action="store_true", help="64 MiB files, 3 runs")
    args = parser.parse_args()
    if args.quick:
        args.size_mb, args.repeat = min(args.size_mb, 64), min(args.repeat, 3)
    sys.path.insert(0, str(args.root.resolve()))
    from kcli.dumplog.dump import default_jobs

    jobs_list = sorted({default_jobs() if j == "auto" else int(j) for j in args.jobs.split(",")})
    size = args.size_mb << 20
    tmp = Path(tempfile.mkdtemp(prefix="kcli-dumplog-bench-"))
    rows = []
    devnull = open(os.devnull, "w")  # noqa: SIM115
    try:
        files = {
            "large-batches.log": (9000, "none"),
            "small-batches.log": (140, "none"),
            "zstd-batches.log": (280, "zstd"),
        }
        counts = {}
        for name, (n, codec) in files.items():
            counts[name] = generate(tmp / name, size if codec == "none" else size // 4, n, codec,
                                    idempotent=args.producer == "idempotent")
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"# kcli from {args.root.resolve()}; {os.cpu_count()} CPUs (load average {load}), "
              f"default --jobs {default_jobs()}, files of ~{args.size_mb} MiB ({args.producer} producer) in {tmp}")
        print(f"# CPU-time medians of {args.repeat} interleaved runs; batch-mode records/s = records covered "
              "by the batches dumped per second (not decoded)")
        print(f"{'file':<19} {'mode':<6} {'jobs':>4} {'MB/s':>7} {'records/s':>11} {'cat MB/s':>9} "
              f"{'vs cat':>6} {'wall vs cat':>11} {'cli s':>6}  target")
        for name in files:
            path = tmp / name
            fsize = path.stat().st_size
            run_cat(path)  # warm the page cache
            for deep in (False, True):
                if deep and name == "large-batches.log":
                    continue  # same records as small-batches; keeps the run short
                # Batch-level dumps always run in one process (see docs/dump-log.md).
                for jobs in (jobs_list if deep else [1]):
                    cat_cpu, cat_wall, cpu, wall = [], [], [], []
                    result = None
                    for _ in range(args.repeat):
                        c, w = run_cat(path)
                        cat_cpu.append(c)
                        cat_wall.append(w)
                        c, w, result = run_dump(path, deep, jobs, devnull)
                        cpu.append(c)
                        wall.append(w)
                    assert result is not None and not result.invalid, result.errors if result else None
                    elapsed = statistics.median(cpu)
                    cat_s = statistics.median(cat_cpu)
                    mbs, cat_mbs = fsize / elapsed / 1e6, fsize / cat_s / 1e6
                    rps = (result.records if deep else counts[name]) / elapsed
                    wall_ratio = statistics.median(cat_wall) / statistics.median(wall)
                    cli = float("nan")
                    if not args.no_cli and jobs == (jobs_list[-1] if deep else 1):
                        cli = time_cli(path, deep, args.root.resolve())
                    what = f"dump-log {name.split('.')[0]} ({args.producer}), CPU time"
                    if deep:
                        ok = rps >= 1_000_000
                        target = f">= 1,000,000 rec/s: {'PASS' if ok else 'FAIL'}"
                        record(f"{what}, --deep-iteration, --jobs {jobs}", round(rps), unit="records/s",
                               target=">= 1,000,000")
                    else:
                        ok = mbs >= 0.5 * cat_mbs
                        target = f">= 0.5 x cat: {'PASS' if ok else 'FAIL'}"
                        record(f"{what}, batch level", round(mbs, 1), peer=round(cat_mbs, 1), peer_name="cat",
                               unit="MB/s", target=">= 0.5 x cat")
                    rows.append(ok)
                    print(f"{name:<19} {'deep' if deep else 'batch':<6} {jobs:>4} {mbs:>7.0f} {rps:>11,.0f} "
                          f"{cat_mbs:>9.0f} {mbs / cat_mbs:>6.2f} {wall_ratio:>11.2f} {cli:>6.2f}  {target}",
                          flush=True)
    finally:
        devnull.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"# load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
          f"{sum(rows)}/{len(rows)} targets met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
