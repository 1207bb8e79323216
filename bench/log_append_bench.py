"""Append and read throughput of one PartitionLog with ~1 MiB batches of 1 KiB records.

Measures the storage engine alone (no network, no request decoding): the broker's produce
path must stay above 220 MB/s on 2 cores, so this number needs ample headroom.

    python3 bench/log_append_bench.py [--mib 1024] [--dir /tmp/x] [--flush-every 0] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka.record.default_records import DefaultRecordBatchBuilder  # noqa: E402

from kcli.storage.log import PartitionLog  # noqa: E402
from kcli.storage.log_config import LogConfig  # noqa: E402
from report import record  # noqa: E402

RECORD_SIZE = 1024
BATCH_BYTES = 1 << 20


def build_batch(records: int, *, producer_id: int = -1, epoch: int = -1, seq: int = -1) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=0, producer_id=producer_id,
        producer_epoch=epoch, base_sequence=seq, batch_size=1 << 30,
    )
    value = os.urandom(RECORD_SIZE)
    now = int(time.time() * 1000)
    for i in range(records):
        builder.append(i, timestamp=now, key=None, value=value, headers=[])
    return bytes(builder.build())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="MiB to append (default 1024)")
    parser.add_argument("--dir", type=Path, default=None, help="parent directory (default: a temp dir)")
    parser.add_argument("--flush-every", type=int, default=0, help="flush() every N appends (0 = never)")
    parser.add_argument("--idempotent", action="store_true", help="use producer id / sequences")
    parser.add_argument("--segment-bytes", type=int, default=256 << 20)
    parser.add_argument("--quick", action="store_true", help="256 MiB instead of --mib")
    args = parser.parse_args()
    if args.quick:
        args.mib = min(args.mib, 256)

    parent = Path(tempfile.mkdtemp(dir=args.dir))
    try:
        records_per_batch = BATCH_BYTES // (RECORD_SIZE + 12)  # ~12 bytes record framing
        plain = build_batch(records_per_batch)
        config = LogConfig.from_dict({"segment.bytes": str(args.segment_bytes)})
        plog = PartitionLog.open(parent / "bench-0", config)
        appends = max(1, (args.mib << 20) // len(plain))
        seq = 0
        batches = []
        if args.idempotent:
            for i in range(appends):
                batches.append(build_batch(records_per_batch, producer_id=7, epoch=0, seq=seq))
                seq = (seq + records_per_batch) & 0x7FFFFFFF
        else:
            # 64 distinct buffers (64 MiB, far beyond CPU caches): like fresh network buffers.
            pool = [plain] + [build_batch(records_per_batch) for _ in range(63)]
            batches = [pool[i % len(pool)] for i in range(appends)]
        now_ms = int(time.time() * 1000)
        cpu0 = time.process_time()
        start = time.perf_counter()
        for i, batch in enumerate(batches):
            plog.append(batch, now_ms=now_ms)
            if args.flush_every and (i + 1) % args.flush_every == 0:
                plog.flush()
        appended = time.perf_counter() - start
        cpu = time.process_time() - cpu0
        plog.flush()
        elapsed = time.perf_counter() - start
        total = sum(len(b) for b in batches)
        flushing = f"flush() every {args.flush_every} appends" if args.flush_every else "no flush until the end"
        print(f"append: {appends} x {len(plain) / 2**20:.2f} MiB batches ({records_per_batch} x 1 KiB records), "
              f"{flushing}")
        print(f"  appends: {total / appended / 1e6:.0f} MB/s wall, {total / cpu / 1e6:.0f} MB/s per CPU-second "
              f"({appended:.2f} s)")
        print(f"  incl. final flush: {total / elapsed / 1e6:.0f} MB/s ({elapsed:.2f} s; disk-bound)")
        what = (f"partition log append, {total / 2**20:.0f} MiB in ~1 MiB batches of 1 KiB records, "
                f"{flushing}{', idempotent' if args.idempotent else ''}")
        record(f"{what}: appends, wall (page cache)", round(total / appended / 1e6, 1), unit="MB/s")
        record(f"{what}: appends per CPU-second", round(total / cpu / 1e6, 1), unit="MB/s")
        record(f"{what}: incl. final flush (disk-bound)", round(total / elapsed / 1e6, 1), unit="MB/s")

        start = time.perf_counter()
        offset, read_bytes = 0, 0
        while offset < plog.log_end_offset:
            result = plog.read(offset, BATCH_BYTES)
            read_bytes += len(result.records)
            offset = result.next_offset
        elapsed = time.perf_counter() - start
        print(f"read (1 MiB fetches, page cache): {read_bytes / elapsed / 1e6:.0f} MB/s ({elapsed:.2f} s)")
        record(f"partition log read, {read_bytes / 2**20:.0f} MiB in 1 MiB fetches, page cache",
               round(read_bytes / elapsed / 1e6, 1), unit="MB/s")

        plog.close()
        start = time.perf_counter()
        plog = PartitionLog.open(parent / "bench-0", config)
        reopen = time.perf_counter() - start
        segments = len(plog.segments())
        print(f"reopen after clean close ({segments} segments): {reopen:.3f} s")
        record(f"partition log reopen after clean close, {segments} segment{'s' if segments != 1 else ''}",
               round(reopen, 3), unit="s", better="lower")
        plog.close()
    finally:
        shutil.rmtree(parent, ignore_errors=True)


if __name__ == "__main__":
    main()
