"""dump-log throughput against ``cat FILE > /dev/null`` on generated segments.

Targets (from the dump-log brief):
  * batch-level dump >= 0.5 x cat's MB/s on the same file;
  * deep iteration >= 1,000,000 records/s.

Files (written to a temp dir, removed afterwards; --size-mb each):
  * large-batches.log  ~1 MiB batches (high-throughput producers: big batch.size + linger)
  * small-batches.log  ~16 KiB batches (Kafka's default batch.size)
  * zstd-batches.log   ~16 KiB zstd-compressed batches (deep iteration pays decompression)
Records are 100-byte hex values with short keys; timestamps advance 1 ms every 50 records.

dump-log is timed in-process (dump_file, output written to /dev/null) so interpreter start-up
(~0.5 s, constant per run) does not hide throughput; one end-to-end CLI run per file is printed
too. Each figure is the best of --repeat runs with the page cache warm, like cat's.

Usage: python3 bench/dumplog_bench.py [--size-mb 256] [--repeat 3] [--jobs 1,auto]
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kcli.dumplog import DumpOptions, LocalSource, dump_file  # noqa: E402
from kcli.dumplog.dump import default_jobs  # noqa: E402
from kcli.dumplog.synth import build_batch  # noqa: E402

T0 = 1_700_000_000_000


def generate(path: Path, size: int, records_per_batch: int, compression: str = "none") -> int:
    """Repeat one template batch with increasing base offsets (base offset is outside the CRC);
    returns the number of records written."""
    # 100-byte hex values: compress about 2:1, like typical text payloads (not 50:1 like repeats)
    recs = [(b"key-%d" % i, os.urandom(50).hex().encode(), []) for i in range(records_per_batch)]
    template = bytearray(
        build_batch(recs, 0, [T0 + i // 50 for i in range(records_per_batch)], compression=compression)
    )
    offset = written = 0
    with open(path, "wb") as f:
        while written < size:
            struct.pack_into(">q", template, 0, offset)
            f.write(template)
            written += len(template)
            offset += records_per_batch
    return offset


def best_of(repeat: int, fn) -> float:  # noqa: ANN001
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def time_cat(path: Path, repeat: int) -> float:
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    return best_of(repeat, lambda: subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True))


def time_dump(path: Path, deep: bool, jobs: int, repeat: int) -> tuple[float, int, int]:
    devnull = open(os.devnull, "w")  # noqa: SIM115
    result = {}

    def run() -> None:
        src = LocalSource(str(path))
        try:
            result["r"] = dump_file(src, DumpOptions(deep_iteration=deep, jobs=jobs), emit=devnull.write)
        finally:
            src.close()

    elapsed = best_of(repeat, run)
    devnull.close()
    r = result["r"]
    assert not r.invalid, r.errors
    return elapsed, r.batches, r.records


def time_cli(path: Path, deep: bool) -> float:
    args = [sys.executable, "-m", "kcli", "dump-log", str(path)] + (["--deep-iteration"] if deep else [])
    env = dict(os.environ, PYTHONPATH=str(REPO))
    t = time.perf_counter()
    subprocess.run(args, stdout=subprocess.DEVNULL, check=True, cwd=REPO, env=env)
    return time.perf_counter() - t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", default="1,2", help="worker counts for deep iteration; auto = kcli's default")
    args = parser.parse_args()
    jobs_list = sorted({default_jobs() if j == "auto" else int(j) for j in args.jobs.split(",")})
    size = args.size_mb << 20
    tmp = Path(tempfile.mkdtemp(prefix="kcli-dumplog-bench-"))
    rows = []
    try:
        files = {
            "large-batches.log": (9000, "none"),
            "small-batches.log": (140, "none"),
            "zstd-batches.log": (280, "zstd"),
        }
        counts = {}
        for name, (n, codec) in files.items():
            counts[name] = generate(tmp / name, size if codec == "none" else size // 4, n, codec)
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"# {os.cpu_count()} CPUs (load average {load}), default --jobs {default_jobs()}, "
              f"files of ~{args.size_mb} MiB in {tmp}")
        print("# batch-mode records/s = records covered by the batches dumped per second (not decoded)")
        print(f"{'file':<19} {'mode':<6} {'jobs':>4} {'MB/s':>8} {'records/s':>11} {'cat MB/s':>9} "
              f"{'vs cat':>7} {'cli s':>6}  target")
        for name in files:
            path = tmp / name
            fsize = path.stat().st_size
            cat_mbs = fsize / time_cat(path, args.repeat) / 1e6
            for deep in (False, True):
                if deep and name == "large-batches.log":
                    continue  # same records as small-batches; keeps the run short
                # Batch-level dumps always run in one process (see docs/dump-log.md).
                for jobs in (jobs_list if deep else [1]):
                    elapsed, _batches, records = time_dump(path, deep, jobs, args.repeat)
                    mbs = fsize / elapsed / 1e6
                    rps = (records if deep else counts[name]) / elapsed
                    cli = time_cli(path, deep) if jobs == (jobs_list[-1] if deep else 1) else float("nan")
                    if deep:
                        ok = rps >= 1_000_000
                        target = f">= 1,000,000 rec/s: {'PASS' if ok else 'FAIL'}"
                    else:
                        ok = mbs >= 0.5 * cat_mbs
                        target = f">= 0.5 x cat: {'PASS' if ok else 'FAIL'}"
                    rows.append(ok)
                    print(f"{name:<19} {'deep' if deep else 'batch':<6} {jobs:>4} {mbs:>8.0f} {rps:>11,.0f} "
                          f"{cat_mbs:>9.0f} {mbs / cat_mbs:>7.2f} {cli:>6.2f}  {target}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"# load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; "
          f"{sum(rows)}/{len(rows)} targets met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
