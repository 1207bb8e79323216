"""Benchmark the batch coordinator (SQLite, or PostgreSQL): commit_file and find_batches latency, commit throughput.

KIP-1163 budgets P50 ~10 ms / P99 ~20-50 ms for committing an object's batch coordinates; kcli's
targets for its embedded coordinator are commit P99 <= 10 ms for a 1,000-batch object and
find_batches P99 <= 2 ms. Run:  python3 bench/coordinator_bench.py [--dir DIR] [--commits N]
PostgreSQL:  ... --postgres (a temporary local server, as the tests start one) or
--coordinator postgresql://user@host:port/db (an existing, preferably empty, database).

A server that has been running recycles its WAL segment files at each checkpoint; a fresh one
(initdb'd for the bench) must create and zero-fill a new 16 MiB segment, and fsync it, whenever
the WAL crosses into the next one (~10-15 ms, paid by the committing session). A 1,000-batch commit
writes ~270 KiB of WAL (~550 KiB idempotent), so on a fresh server ~1.6 % (~3 %) of commits pay
it: the P99 of a short run on a fresh server measures segment creation. With --postgres the bench
therefore first makes the server recycle as many segments as the run needs (pg_switch_wal, then
CHECKPOINT), as on a server that ran for a while; --fresh-wal skips that. Either way, with
PostgreSQL the diagnostics say which timed commits crossed into a new WAL segment.

Wall-clock latency includes fsync and anything else the machine is doing; the CPU column is this
thread's CPU time, which is steadier on a shared host. The first line prints a CPU calibration
(``sum(range(10**6))``; ~10 ms on a current laptop core) so figures from different machines can be
compared, and the filesystem the database ran on (fsync cost depends on it). The max column and the
lines after the table are diagnostics: which timed calls contained a full (generation 2) garbage
collection of the process, counted from ``gc.get_stats()`` outside the timed window. Each object's
requests are built just before its commit, and what setup left alive is frozen (``gc.freeze()``)
so that those collections cost what the coordinator's own garbage costs, not the bench's.

With PostgreSQL two more diagnostics say how much of a commit faster client code could remove:
each commit scenario's time spent waiting on the database (wall minus this thread's CPU: the
server's work, loopback and the scheduler), and the server's floor on this host, measured after the
scenarios on the same server: a round trip (``SELECT 1``) and a durable commit of one WAL record
(see database_floor).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from plugins.coordinator.base import (  # noqa: E402
    CommitBatchRequest,
    CreateTopicAndPartitionsRequest,
    FindBatchRequest,
    TopicIdPartition,
)
from plugins.coordinator.base import BatchCoordinator  # noqa: E402
from plugins.coordinator.sqlite import SqliteBatchCoordinator  # noqa: E402
from report import record  # noqa: E402

COMMIT_TARGET_P99_MS = 10.0  # the SQLite coordinator's; PostgreSQL's are the ratios of print_ratios
FIND_TARGET_P99_MS = 2.0
BATCH_SIZE = 16 * 1024  # a producer batch.size-sized batch
PRODUCERS = 50


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def filesystem_of(path: Path) -> str:
    try:
        out = subprocess.run(["df", "-T", str(path)], capture_output=True, text=True, check=True).stdout
        return out.splitlines()[-1].split()[1]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "?"


def build_object(tips: list[TopicIdPartition], n: int, rng: random.Random, sequences: dict | None
                 ) -> tuple[int, list[CommitBatchRequest]]:
    """One WAL object's commit requests, grouped by partition as WalBuilder lays them out.
    With ``sequences`` every batch comes from one of PRODUCERS idempotent producers."""
    chosen = sorted(rng.choices(range(len(tips)), k=n))
    requests = []
    position = 1
    records = 10
    for i, t in enumerate(chosen):
        if sequences is not None:
            pid = rng.randrange(PRODUCERS)
            seq = sequences.get((t, pid), 0)
            sequences[(t, pid)] = seq + records
            producer = (1000 + pid, 0, seq, seq + records - 1)
        else:
            producer = (-1, -1, -1, -1)
        requests.append(CommitBatchRequest(i, tips[t], position, BATCH_SIZE, 0, records - 1,
                                           1_700_000_000_000 + i, 0, *producer))
        position += BATCH_SIZE
    return position, requests


def full_collections() -> int:
    return gc.get_stats()[2]["collections"]


def timed(fn, wall: list[float], cpu: list[float], full_gc: list[int] | None = None):
    """Time one call; with ``full_gc``, note its index when a full collection ran during it."""
    before = full_collections() if full_gc is not None else 0
    w0, c0 = time.perf_counter(), time.thread_time()
    result = fn()
    cpu.append((time.thread_time() - c0) * 1000)
    wall.append((time.perf_counter() - w0) * 1000)
    if full_gc is not None and full_collections() != before:
        full_gc.append(len(wall) - 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to put the database (default: temp dir)")
    parser.add_argument("--commits", type=int, default=150, help="1,000-batch objects per commit scenario")
    parser.add_argument("--batches", type=int, default=1000, help="batches per object")
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--finds", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--coordinator", default=None,
                        help="bench this coordinator URI instead of a new SQLite file (postgresql://user@host:port/db)")
    parser.add_argument("--postgres", action="store_true",
                        help="bench the PostgreSQL coordinator on a temporary local server (initdb + pg_ctl)")
    parser.add_argument("--alone", action="store_true",
                        help="with PostgreSQL: skip the SQLite coordinator's run in the same process (its figures"
                             " are the reference of the PostgreSQL targets)")
    parser.add_argument("--fresh-wal", action="store_true",
                        help="with --postgres: do not make the new server recycle WAL segments first (see above)")
    args = parser.parse_args()
    if args.postgres and args.coordinator:
        parser.error("--postgres starts its own server: give either it or --coordinator")
    if args.fresh_wal and not args.postgres:
        parser.error("--fresh-wal is about the server --postgres starts")

    calibration_ms = min(timeit.repeat("sum(range(10**6))", number=1, repeat=5)) * 1000
    rng = random.Random(args.seed)
    results: list[tuple[str, list[float], list[float], float | None, list[int] | None]] = []
    reference = None
    if (args.postgres or args.coordinator) and not args.alone:
        reference = sqlite_reference(args)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        db_path = Path(tmp) / "coordinator.db"
        server = None
        url = args.coordinator
        if args.postgres:
            from tests.fixtures_pg import start_pg_server

            server = start_pg_server(Path(tempfile.mkdtemp(prefix="kcli-pg-bench-")))  # chowned to postgres
            url = server.url(server.create_database())
            if not args.fresh_wal:
                recycle_wal_segments(url, args)
        coord: BatchCoordinator
        wal = None
        if url:
            from plugins.coordinator import open_coordinator

            coord = open_coordinator(url)
            wal = WalProbe(url)
        else:
            coord = SqliteBatchCoordinator(db_path)
        try:
            throughput, crossings = run_scenarios(args, coord, rng, results, wal)
            coord.close()
            floor = database_floor(url, args.finds) if url else None
            if url:
                import psycopg

                with psycopg.connect(url, connect_timeout=10) as conn:
                    db_size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
                    version = conn.execute("SHOW server_version").fetchone()[0]
                    sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
                    fsync = conn.execute("SHOW fsync").fetchone()[0]
                kind = (f"PostgreSQL batch coordinator  PostgreSQL {version} over loopback TCP,"
                        f" synchronous_commit={sync}, fsync={fsync}, WAL segments "
                        + ("recycled (as on a running server)" if args.postgres and not args.fresh_wal
                           else "fresh (new server)" if args.postgres else "as the server has them"))
            else:
                db_size = sum(f.stat().st_size for f in Path(tmp).iterdir() if f.is_file())
                kind = (f"SQLite batch coordinator  sqlite {sqlite3.sqlite_version}, db on "
                        f"{filesystem_of(Path(args.dir or tempfile.gettempdir()))}, synchronous=FULL, WAL journal")
        finally:
            coord.close()
            if wal is not None:
                wal.close()
            if server is not None:
                from tests.fixtures_pg import stop_pg_server

                stop_pg_server(server)
                shutil.rmtree(server.data_dir.parent, ignore_errors=True)
    report(args, calibration_ms, results, throughput, kind, db_size, crossings, floor)
    if reference is not None:
        report(args, calibration_ms, *reference, {})
        print_ratios(results, reference[0])


def sqlite_reference(args: argparse.Namespace) -> tuple:
    """The SQLite coordinator's run, in this process and just before PostgreSQL's, with the same
    requests: the reference the PostgreSQL targets are ratios to (this host's speed varies 2-3x
    between days, so only figures measured side by side compare)."""
    results: list = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        coord = SqliteBatchCoordinator(Path(tmp) / "coordinator.db")
        try:
            throughput, _ = run_scenarios(args, coord, random.Random(args.seed), results)
        finally:
            coord.close()
        db_size = sum(f.stat().st_size for f in Path(tmp).iterdir() if f.is_file())
    gc.unfreeze()
    kind = (f"SQLite batch coordinator (reference, same run)  sqlite {sqlite3.sqlite_version}, db on "
            f"{filesystem_of(Path(args.dir or tempfile.gettempdir()))}, synchronous=FULL, WAL journal")
    return results, throughput, kind, db_size


def print_ratios(postgres: list, sqlite: list) -> None:
    """The PostgreSQL coordinator's idempotent-commit targets, as ratios measured in this run:
    P99 <= SQLite's idempotent P99, and <= 1.5x its own P99 without producer ids."""
    p99 = {name: pct(wall, 99) for name, wall, *_ in postgres}
    ref = {name: pct(wall, 99) for name, wall, *_ in sqlite}
    idem = next(n for n in p99 if n.startswith("commit_file") and "idempotent" in n)
    plain = next(n for n in p99 if n.startswith("commit_file") and "no producer ids" in n)
    for label, value, target in (
            ("PostgreSQL idempotent commit P99 / SQLite idempotent commit P99", p99[idem] / ref[idem], 1.0),
            ("PostgreSQL idempotent commit P99 / PostgreSQL commit P99 without producer ids",
             p99[idem] / p99[plain], 1.5)):
        met = "met" if value <= target else "NOT MET"
        print(f"ratio {label}: {value:.2f} (target <= {target:g}: {met})")
        record(f"postgresql coordinator ratio, {label}", round(value, 2), target=f"<= {target:g}", better="lower")


class WalProbe:
    """Which timed PostgreSQL commits crossed into a new WAL segment (read outside the timed window)."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
        self.segment_bytes = int(self.conn.execute(
            "SELECT pg_size_bytes(current_setting('wal_segment_size'))").fetchone()[0])

    def segment(self) -> int:
        lsn = self.conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')").fetchone()[0]
        return int(lsn) // self.segment_bytes

    def close(self) -> None:
        self.conn.close()


def recycle_wal_segments(url: str, args: argparse.Namespace) -> None:
    """Make a new server hold recycled WAL segments for the whole run, as a running one does.

    Each pg_switch_wal() after a write makes the server create (zero-fill) the next segment; the
    CHECKPOINT then renames the ones before it to future segment names instead of deleting them
    (it keeps ~2x the WAL written since the last checkpoint, at most max_wal_size)."""
    import psycopg

    per_batch = 1200  # WAL bytes per batch over the three commit scenarios together, with room
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        segment = int(conn.execute("SELECT pg_size_bytes(current_setting('wal_segment_size'))").fetchone()[0])
        wanted = min(48, -(-args.commits * args.batches * per_batch // segment) + 4)
        conn.execute("CREATE TABLE kcli_bench_wal_warmup (x int)")
        for _ in range(wanted):
            conn.execute("INSERT INTO kcli_bench_wal_warmup VALUES (1)")
            conn.execute("SELECT pg_switch_wal()")
        conn.execute("DROP TABLE kcli_bench_wal_warmup")
        conn.execute("CHECKPOINT")


def database_floor(url: str, calls: int) -> dict[str, list[float]]:
    """What any call pays on this server and host, whatever the coordinator does: a round trip
    (``SELECT 1``) and a durable commit. A transaction whose only WAL is its commit record is not
    flushed; one transactional logical message (no table needed, any wal_level) makes it flush, as
    a commit that wrote rows does. That function wants a superuser: without one, that line is left out."""
    import psycopg

    floor: dict[str, list[float]] = {}
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        for name, sql in (("round trip (SELECT 1)", "SELECT 1"),
                          ("durable commit (one WAL record, its flush)",
                           "SELECT pg_logical_emit_message(true, 'kcli-bench', '')")):
            wall: list[float] = []
            try:
                for _ in range(calls):
                    timed(lambda: conn.execute(sql).fetchall(), wall, [])
            except psycopg.errors.InsufficientPrivilege:
                continue
            floor[name] = wall
    return floor


def run_scenarios(args: argparse.Namespace, coord: BatchCoordinator, rng: random.Random, results: list,
                  wal: WalProbe | None = None) -> tuple[dict[str, float], dict[str, list[int]]]:
    """The commit and find scenarios (timings appended to ``results``); commit throughputs, and
    per commit scenario the indexes of the calls that crossed into a new WAL segment (with ``wal``)."""
    topic = uuid.uuid4()
    coord.create_topic_and_partitions([CreateTopicAndPartitionsRequest(topic, "bench", args.partitions)])
    tips = [TopicIdPartition(topic, "bench", p) for p in range(args.partitions)]

    throughput = {}
    crossings: dict[str, list[int]] = {}
    # What setup left alive (imported modules: psycopg, pytest with --postgres, ...) is never
    # garbage: frozen, a full collection during a timed call traverses only what the run allocated
    # instead of ~45,000 more objects (~7 ms per full collection on a 10 ms-calibration core).
    gc.collect()
    gc.freeze()
    for label, sequences in (("no producer ids", None), (f"idempotent, {PRODUCERS} producers", {})):
        wall: list[float] = []
        cpu: list[float] = []
        full_gc: list[int] = []
        new_segment: list[int] = []
        spent = 0.0
        for _ in range(args.commits):
            # Built just before its call (outside the timed window): requests prepared for the whole
            # scenario up front would be what the timed calls' full garbage collections traverse.
            size, requests = build_object(tips, args.batches, rng, sequences)
            segment = wal.segment() if wal else 0
            start = time.perf_counter()
            responses = timed(lambda: coord.commit_file(f"wal/{uuid.uuid4()}", 0, size, requests), wall, cpu,
                              full_gc)
            spent += time.perf_counter() - start
            assert all(r.errors == 0 and not r.is_duplicate for r in responses), "commit failed"
            if wal and wal.segment() != segment:
                new_segment.append(len(wall) - 1)
        throughput[label] = args.commits * args.batches / spent
        name = f"commit_file 1,000 batches, {label}"
        results.append((name, wall, cpu, COMMIT_TARGET_P99_MS, full_gc))
        if wal:
            crossings[name] = new_segment

    # A hot log with many batches: find_batches is a range lookup whatever the log's length.
    hot_topic = uuid.uuid4()
    coord.create_topic_and_partitions([CreateTopicAndPartitionsRequest(hot_topic, "hot", 1)])
    hot = TopicIdPartition(hot_topic, "hot", 0)
    for c in range(args.commits):
        requests = [CommitBatchRequest(i, hot, 1 + i * BATCH_SIZE, BATCH_SIZE, 0, 99, 1_700_000_000_000 + i, 0)
                    for i in range(args.batches)]
        coord.commit_file(f"wal/hot-{c}", 0, 1 + args.batches * BATCH_SIZE, requests)
    hot_batches = args.commits * args.batches
    wall, cpu = [], []
    returned = 0
    for _ in range(args.finds):
        offset = rng.randrange(hot_batches * 100)
        resp = timed(lambda: coord.find_batches([FindBatchRequest(hot, offset, 1 << 20)], 50 << 20), wall, cpu)
        returned += len(resp[0].batches)
    results.append((f"find_batches 1 partition, 1 MiB ({returned // args.finds} batches)", wall, cpu,
                    FIND_TARGET_P99_MS, None))

    hwms = {i.topic_id_partition.partition: i.high_watermark for i in coord.describe_logs([topic])}
    wall, cpu = [], []
    returned = 0
    for _ in range(args.finds // 4):
        reqs = [FindBatchRequest(tips[p], rng.randrange(max(1, hwms[p])), 256 << 10)
                for p in rng.sample(range(args.partitions), 10)]
        resp = timed(lambda: coord.find_batches(reqs, 50 << 20), wall, cpu)
        returned += sum(len(r.batches) for r in resp)
    results.append((f"find_batches 10 partitions x 256 KiB ({returned // (args.finds // 4)} batches)",
                    wall, cpu, None, None))
    return throughput, crossings


def report(args: argparse.Namespace, calibration_ms: float, results: list, throughput: dict[str, float], kind: str,
           db_size: float, crossings: dict[str, list[int]], floor: dict[str, list[float]] | None = None) -> None:
    # Figures of the PostgreSQL run are recorded under their own names (the SQLite ones stay).
    prefix = "coordinator" if kind.startswith("SQLite") else "postgresql coordinator"
    print(f"{kind}; CPU calibration sum(range(10**6)) = {calibration_ms:.1f} ms; load average"
          f" {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    if prefix == "coordinator":
        record("coordinator bench CPU calibration, sum(range(10**6))", round(calibration_ms, 1), unit="ms",
               better="lower")
    print(f"{'operation':<58}{'P50 ms':>8}{'P99 ms':>8}{'CPU P50':>9}{'CPU P99':>9}{'target':>8}  met{'max ms':>9}")
    for name, wall, cpu, target, _ in results:
        met = "-" if target is None else ("yes" if pct(wall, 99) <= target else "NO")
        print(f"{name:<58}{statistics.median(wall):>8.2f}{pct(wall, 99):>8.2f}{statistics.median(cpu):>9.2f}"
              f"{pct(cpu, 99):>9.2f}{'' if target is None else f'{target:.0f}':>8}  {met:<3}{max(wall):>9.2f}")
        goal = "" if target is None else f"P99 <= {target:.0f}"
        for clock, values in (("wall", wall), ("CPU", cpu)):
            for p in (50, 99):
                value = statistics.median(values) if p == 50 else pct(values, 99)
                record(f"{prefix} {name}, {clock} P{p}", round(value, 2), unit="ms",
                       target=goal if p == 99 and clock == "wall" else "", better="lower")
    for name, wall, _, _, full_gc in results:
        if full_gc:
            print(f"  {name}: {len(full_gc)} of {len(wall)} calls ran a full garbage collection"
                  f" ({', '.join(f'{wall[i]:.1f}' for i in full_gc)} ms wall)")
    for name, wall, _, _, _ in results:
        if name in crossings:
            crossed = crossings[name]
            others = [w for i, w in enumerate(wall) if i not in set(crossed)] or [0.0]
            print(f"  {name}: {len(crossed)} of {len(wall)} calls crossed into a new WAL segment"
                  f" ({', '.join(f'{wall[i]:.1f}' for i in crossed) or '-'} ms wall); P99 of the others"
                  f" {pct(others, 99):.2f} ms")
    if floor is not None:
        # A remote coordinator's call is this thread's CPU plus waiting (the server's work, the
        # network, the scheduler): the wait's P99 bounds what faster client code could reach.
        for name, wall, cpu, _, _ in results:
            if name.startswith("commit_file"):
                waited = [w - c for w, c in zip(wall, cpu)]
                print(f"  {name}: waiting on the database (wall - CPU) P50 {statistics.median(waited):.2f},"
                      f" P99 {pct(waited, 99):.2f} ms")
                record(f"{prefix} {name}, waiting P99", round(pct(waited, 99), 2), unit="ms", better="lower")
        for name, wall in floor.items():
            print(f"  floor, {name}: P50 {statistics.median(wall):.2f}, P99 {pct(wall, 99):.2f} ms")
            record(f"{prefix} floor, {name}, wall P99", round(pct(wall, 99), 2), unit="ms", better="lower")
    for label, rate in throughput.items():
        print(f"commit throughput, {label:<38}{rate:>12,.0f} batches/s")
        record(f"{prefix} commit throughput, {label}", round(rate), unit="batches/s")
    print(f"database size after {2 * args.commits + args.commits} objects:{db_size / (1 << 20):>24.1f} MiB")


if __name__ == "__main__":
    main()
