"""What only the PostgreSQL batch coordinator has: several brokers (separate instances, each with
its own connection pool) committing to the same partitions at once, a database outage, bounded
waits, migrations, and a real broker started with ``--coordinator postgresql://``.

The contract every coordinator keeps runs against PostgreSQL too (tests/test_coordinator.py).
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kio.schema.errors import ErrorCode

from plugins.coordinator import open_coordinator
from plugins.coordinator.base import (
    BatchMetadata, CommitBatchRequest, CoordinatorException, CreateTopicAndPartitionsRequest,
    DeleteFilesRequest, DeleteRecordsRequest, FindBatchRequest, ListOffsetsRequest, RetentionRequest,
    TXN_ABORT, TXN_DATA, TopicIdPartition,
)
from plugins.coordinator.postgresql import (
    BATCH_INDEX_BITS,
    MIGRATION_LOCK_KEY,
    MIGRATIONS,
    SCHEMA_VERSION,
    PostgresBatchCoordinator,
    _RUN_ENTRY,
)
from plugins.coordinator.producers import ENTRY
from tests.diskless_helpers import DISKLESS, FAST
from tests.fixtures_cli import assert_one_line_error, cli_env, run_kcli  # noqa: F401 - fixture
from tests.fixtures_pg import PgServer, pg_database, pg_server  # noqa: F401 - fixtures
from tests.kafka_helpers import consume_all, create_topic, produce
from tests.test_coordinator import operation

T0 = 1_700_000_000_000


def batch(tip: TopicIdPartition, i: int, records: int = 3, *, pid: int = -1, epoch: int = -1,
          seq: int = -1) -> CommitBatchRequest:
    last_seq = -1 if seq < 0 else seq + records - 1
    return CommitBatchRequest(i, tip, 1 + 100 * i, 100, 0, records - 1, T0, 0, pid, epoch, seq, last_seq)


def new_topic(c: PostgresBatchCoordinator, partitions: int) -> list[TopicIdPartition]:
    tid = uuid.uuid4()
    c.create_topic_and_partitions([CreateTopicAndPartitionsRequest(tid, "t", partitions)])
    return [TopicIdPartition(tid, "t", p) for p in range(partitions)]


def all_batches(c: PostgresBatchCoordinator, tip: TopicIdPartition) -> list:
    return c.find_batches([FindBatchRequest(tip, 0, 1 << 40)], 1 << 40)[0].batches


def run_threads(work: Callable[[int], None], n: int, timeout: float = 120.0) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded(k: int) -> None:
        try:
            work(k)
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(k,), daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a commit hung"
    return errors


# -- several brokers on one database ----------------------------------------------------------


def test_brokers_committing_to_the_same_partitions_get_gapless_unique_offsets(pg_database: str) -> None:
    """Four brokers (instances) commit objects holding batches of the same three partitions, in
    different partition orders (lock order must not deadlock), at the same time."""
    brokers = [PostgresBatchCoordinator(pg_database, **{"pool.max.size": "2"}) for _ in range(4)]
    tips = new_topic(brokers[0], 3)
    answers: list[tuple[TopicIdPartition, int, int]] = []  # (partition, assigned base, records)
    lock = threading.Lock()

    def work(k: int) -> None:
        c = brokers[k]
        order = tips if k % 2 == 0 else tips[::-1]
        for n in range(15):
            requests = [batch(tip, j, records=1 + (k + n + j) % 4) for j, tip in enumerate(order * 2)]
            responses = c.commit_file(f"wal/{k}-{n}-{uuid.uuid4()}", k, 601, requests)
            with lock:
                answers.extend((r.request.topic_id_partition, r.assigned_base_offset, r.request.last_offset + 1)
                               for r in responses)
            assert all(r.errors == 0 and not r.is_duplicate for r in responses)

    assert run_threads(work, 4) == []
    for tip in tips:
        stored = [(b.metadata.base_offset, b.metadata.last_offset) for b in all_batches(brokers[1], tip)]
        answered = sorted((base, base + n - 1) for t, base, n in answers if t == tip)
        assert stored == answered, "every answer is a stored batch, nothing else is"
        assert stored[0][0] == 0
        for (_, last), (base, _) in zip(stored, stored[1:]):
            assert base == last + 1, "offsets are gapless and unique"
        (log,) = [i for i in brokers[2].describe_logs([tip.topic_id]) if i.topic_id_partition == tip]
        assert log.high_watermark == stored[-1][1] + 1 and log.batch_count == len(stored) == 4 * 15 * 2
    assert len({f.object_key for f in brokers[3].describe_files()}) == 60
    for c in brokers:
        c.close()


def test_idempotent_producer_moving_between_brokers_stays_exact(pg_database: str) -> None:
    """A producer's retry may reach another broker, even while the first is still committing the
    original: exactly one copy is stored, and the retry gets the original's offset."""
    a = PostgresBatchCoordinator(pg_database)
    b = PostgresBatchCoordinator(pg_database)
    (tip,) = new_topic(a, 1)
    # Sequential: write through a, retry and continue through b, back to a.
    r1 = a.commit_file("wal/1", 1, 101, [batch(tip, 0, 5, pid=9, epoch=0, seq=0)])[0]
    dup = b.commit_file("wal/2", 2, 101, [batch(tip, 0, 5, pid=9, epoch=0, seq=0)])[0]
    assert (dup.errors, dup.is_duplicate, dup.assigned_base_offset) == (0, True, r1.assigned_base_offset)
    nxt = b.commit_file("wal/3", 2, 101, [batch(tip, 0, 5, pid=9, epoch=0, seq=5)])[0]
    assert (nxt.is_duplicate, nxt.assigned_base_offset) == (False, 5)
    gap = a.commit_file("wal/4", 1, 101, [batch(tip, 0, 5, pid=9, epoch=0, seq=20)])[0]
    assert gap.errors != 0, "broker a must see b's batches: seq 20 is out of order after 9"
    # Concurrent: the same batch committed through both brokers at once, many times.
    seq = 10
    for round_ in range(12):
        results: list = [None, None]
        barrier = threading.Barrier(2)

        def work(k: int, barrier: threading.Barrier = barrier, results: list = results, round_: int = round_,
                 seq: int = seq) -> None:
            barrier.wait(10)
            c = (a, b)[k]
            results[k] = c.commit_file(f"wal/r{round_}-{k}", k, 101, [batch(tip, 0, 5, pid=9, epoch=0, seq=seq)])[0]

        assert run_threads(work, 2) == []
        assert sorted(r.is_duplicate for r in results) == [False, True], round_
        assert results[0].assigned_base_offset == results[1].assigned_base_offset
        seq += 5
    stored = all_batches(a, tip)
    assert [bt.metadata.base_sequence for bt in stored] == list(range(0, seq, 5))
    assert [bt.metadata.base_offset for bt in stored] == list(range(0, seq, 5))
    a.close()
    b.close()


def stored_batches(raw: psycopg.Connection) -> list[tuple]:
    """Every stored batch as (log_id, file_id, run base, run last, batch entry), from the runs; the
    entries made absolute (id = file_id and index, offsets = the run's base + relative ones)."""
    out = []
    for log_id, file_id, base, last, count, size, max_ts, blob in raw.execute(
            "SELECT log_id, file_id, base_offset, last_offset, batch_count, byte_size, max_timestamp, batches"
            " FROM batch_runs ORDER BY log_id, last_offset").fetchall():
        raw_entries = list(_RUN_ENTRY.iter_unpack(blob))
        assert len(raw_entries) == count and raw_entries, "a run's count must match its entries"
        assert all(0 <= e[0] < 1 << BATCH_INDEX_BITS for e in raw_entries), "an entry holds its index in the object"
        entries = [(file_id << BATCH_INDEX_BITS | e[0], base + e[1], base + e[2], *e[3:]) for e in raw_entries]
        assert (entries[0][1], entries[-1][2], sum(e[4] for e in entries)) == (base, last, size)
        assert max_ts == max(e[5] if e[7] == 1 else e[6] for e in entries)
        out.extend((log_id, file_id, base, last, e) for e in entries)
    return out


def check_invariants(url: str) -> None:
    """What every committed state must satisfy, read straight from the database."""
    with psycopg.connect(url, connect_timeout=10) as raw:
        stored = stored_batches(raw)
        by_log: dict[int, list[tuple]] = {}
        for log_id, _fid, _b, _l, e in stored:
            by_log.setdefault(log_id, []).append(e)
        for log_id, lso, hwm, size in raw.execute(
                "SELECT log_id, log_start_offset, high_watermark, byte_size FROM logs").fetchall():
            rows = by_log.pop(log_id, [])  # (id, base, last, byte offset, size, ...) in offset order
            assert size == sum(r[4] for r in rows)
            for prev, nxt in zip(rows, rows[1:]):
                assert nxt[1] == prev[2] + 1, "offsets must be gapless"
            if rows:
                assert rows[-1][2] == hwm - 1 and rows[0][1] <= lso <= rows[0][2]
            else:
                assert lso == hwm
        assert by_log == {}, "every run must belong to a log"
        per_file: dict[int, int] = {}
        for _log, fid, _b, _l, e in stored:
            per_file[fid] = per_file.get(fid, 0) + e[4]
        for file_id, used in raw.execute("SELECT file_id, used_size FROM files").fetchall():
            assert used == per_file.pop(file_id, 0), "used_size must equal the live batch bytes"
        assert per_file == {}, "every run must belong to a file"
        assert raw.execute("SELECT count(*) FROM files WHERE used_size = 0 AND state = 'uploaded'").fetchone()[0] == 0
        assert raw.execute(
            "SELECT count(*) FROM file_topics ft WHERE live_bytes != (SELECT coalesce(sum(r.byte_size), 0)"
            " FROM batch_runs r JOIN logs l ON l.log_id = r.log_id WHERE r.file_id = ft.file_id"
            " AND l.topic_id = ft.topic_id)").fetchone()[0] == 0
        ids = [e[0] for *_, e in stored]
        assert len(ids) == len(set(ids)), "batch ids must be unique"


@pytest.fixture(scope="module")
def property_database(pg_server: PgServer) -> str:
    return pg_server.url(pg_server.create_database())


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(operation, min_size=1, max_size=20))
def test_random_operations_through_two_brokers_keep_the_invariants(property_database: str, ops: list) -> None:
    """The SQLite property test's operations, against PostgreSQL, switching broker ("reopen")
    between operations: every state in between keeps offsets gapless and sizes consistent."""
    brokers = [PostgresBatchCoordinator(property_database), PostgresBatchCoordinator(property_database)]
    c = brokers[0]
    tid = uuid.uuid4()  # one shared database: each example has its own topic
    c.create_topic_and_partitions([CreateTopicAndPartitionsRequest(tid, "p", 3)])
    tips = [TopicIdPartition(tid, "p", p) for p in range(3)]
    sequences: dict[tuple[int, int], int] = {}
    try:
        for op in ops:
            kind = op[0]
            if kind == "commit":
                position, requests = 1, []
                for i, (part, records, size, pid, retry) in enumerate(op[1]):
                    producer = (-1, -1, -1, -1)
                    if pid >= 0:  # idempotent; ``retry`` resends the previous batch (a duplicate)
                        seq = sequences.get((part, pid), 0)
                        if retry and seq >= records:
                            seq -= records
                        sequences[(part, pid)] = seq + records
                        producer = (pid, 0, seq, seq + records - 1)
                    requests.append(CommitBatchRequest(i, tips[part], position, size, 0, records - 1, T0 + i, 0,
                                                       *producer))
                    position += size
                c.commit_file(f"wal/{uuid.uuid4()}", 0, position, requests)
            elif kind == "delete_records":
                c.delete_records([DeleteRecordsRequest(tips[op[1]], op[2])])
            elif kind == "retention":
                c.enforce_retention([RetentionRequest(tips[op[1]], -1, op[2])], now_ms=T0)
            elif kind == "delete_partition":
                c.delete_partitions(tid, {op[1]})
                sequences = {k: v for k, v in sequences.items() if k[0] != op[1]}
            elif kind == "recreate":
                c.create_topic_and_partitions([CreateTopicAndPartitionsRequest(tid, "p", op[1])])
            elif kind == "gc":
                doomed = [f.object_key for f in c.get_files_to_delete()]
                assert all(c.is_safe_to_delete_file(k) for k in doomed)
                c.delete_files(DeleteFilesRequest(doomed))
            elif kind == "reopen":
                c = brokers[1] if c is brokers[0] else brokers[0]
            check_invariants(property_database)
    finally:
        for b in brokers:
            b.close()


def test_one_commit_updates_known_producers_and_adds_new_ones(pg_database: str) -> None:
    """One object mixing the next batch of a known producer, the same producer id on another
    partition, an epoch bump, a duplicate and a new producer on two partitions leaves exactly
    Kafka's state behind, as another broker (instance) sees it; the snapshots written when the
    brokers close hold that state."""
    a, b = PostgresBatchCoordinator(pg_database), PostgresBatchCoordinator(pg_database)
    t0, t1 = new_topic(a, 2)
    first = [batch(t0, 0, 5, pid=7, epoch=0, seq=0), batch(t1, 1, 3, pid=7, epoch=0, seq=0),
             batch(t0, 2, 2, pid=8, epoch=0, seq=0), batch(t1, 3, 4, pid=9, epoch=0, seq=0)]
    assert all(r.errors == 0 for r in a.commit_file("wal/1", 1, 401, first))
    mixed = [batch(t0, 0, 5, pid=7, epoch=0, seq=5),   # known: its next batch
             batch(t1, 1, 3, pid=7, epoch=0, seq=3),   # the same id on the other partition
             batch(t0, 2, 2, pid=8, epoch=1, seq=0),   # known, bumped epoch: starts afresh
             batch(t1, 3, 4, pid=9, epoch=0, seq=0),   # a retry of the first object's batch
             batch(t0, 4, 1, pid=10, epoch=0, seq=0),  # new
             batch(t1, 5, 1, pid=10, epoch=0, seq=0)]  # new, same id on the other partition
    answers = b.commit_file("wal/2", 2, 601, mixed)
    assert [(r.errors, r.is_duplicate, r.assigned_base_offset) for r in answers] == [
        (0, False, 7), (0, False, 7), (0, False, 12), (0, True, 3), (0, False, 14), (0, False, 10)]
    # Through the other broker: retries of what the mixed object stored are duplicates with its
    # offsets, the fenced epoch is refused, and every producer continues where it left off.
    retries = a.commit_file("wal/3", 1, 601, mixed[:3] + mixed[4:] + [batch(t0, 3, 1, pid=8, epoch=0, seq=2)])
    assert [(r.errors, r.is_duplicate, r.assigned_base_offset) for r in retries[:5]] == [
        (0, True, 7), (0, True, 7), (0, True, 12), (0, True, 14), (0, True, 10)]
    assert retries[5].errors == ErrorCode.invalid_producer_epoch
    following = [batch(t0, 0, 1, pid=7, epoch=0, seq=10), batch(t1, 1, 1, pid=7, epoch=0, seq=6),
                 batch(t0, 2, 1, pid=8, epoch=1, seq=2), batch(t1, 3, 1, pid=9, epoch=0, seq=4),
                 batch(t0, 4, 1, pid=10, epoch=0, seq=1), batch(t1, 5, 1, pid=10, epoch=0, seq=1)]
    assert [(r.errors, r.is_duplicate) for r in b.commit_file("wal/4", 2, 601, following)] == [(0, False)] * 6
    a.close()
    b.close()
    with psycopg.connect(pg_database, connect_timeout=10) as raw:
        rows = raw.execute("SELECT l.partition, p.producer_id, p.producer_epoch, length(p.batches)"
                           " FROM producer_state p JOIN logs l USING (log_id) ORDER BY 1, 2").fetchall()
    entry = 32  # bytes a stored batch takes (sequence range, offsets, append time)
    assert rows == [(0, 7, 0, 3 * entry), (0, 8, 1, 2 * entry), (0, 10, 0, 2 * entry),
                    (1, 7, 0, 3 * entry), (1, 9, 0, 2 * entry), (1, 10, 0, 2 * entry)]
    a.close()
    b.close()


# -- producer state: derived from the runs, snapshotted periodically (schema 4) ------------------


def idem(tip: TopicIdPartition, seq: int, *, pid: int = 9, epoch: int = 0, records: int = 5) -> CommitBatchRequest:
    return batch(tip, 0, records, pid=pid, epoch=epoch, seq=seq)


def answer(c: PostgresBatchCoordinator, key: str, req: CommitBatchRequest) -> tuple[int, bool, int]:
    (r,) = c.commit_file(key, 1, 101, [req])
    return int(r.errors), r.is_duplicate, r.assigned_base_offset


def snapshot_rows(url: str) -> list[tuple]:
    with psycopg.connect(url, connect_timeout=10) as raw:
        return raw.execute("SELECT l.partition, l.producer_snapshot_offset, p.producer_id, length(p.batches)"
                           " FROM logs l LEFT JOIN producer_state p USING (log_id) ORDER BY 1, 3").fetchall()


def test_duplicates_are_found_across_a_snapshot_boundary(pg_database: str) -> None:
    """Batches before the snapshot are in its rows, batches after it only in the runs: a broker
    that starts after both (its state rebuilt from snapshot + runs) recognises retries of either,
    and the sequence continues from the newest."""
    a = PostgresBatchCoordinator(pg_database)
    (tip,) = new_topic(a, 1)
    for n in range(4):  # offsets 0, 5, 10, 15
        assert answer(a, f"wal/a{n}", idem(tip, 5 * n)) == (0, False, 5 * n)
    assert a._snapshot_producers() == 1
    assert snapshot_rows(pg_database) == [(0, 20, 9, 4 * 32)]
    for n in range(4, 7):  # offsets 20, 25, 30: after the snapshot, in runs only
        assert answer(a, f"wal/a{n}", idem(tip, 5 * n)) == (0, False, 5 * n)
    b = PostgresBatchCoordinator(pg_database)  # a second broker, nothing in memory
    assert answer(b, "wal/b0", idem(tip, 10)) == (0, True, 10), "a retry from before the snapshot (last 5)"
    assert answer(b, "wal/b1", idem(tip, 30)) == (0, True, 30), "a retry from after it"
    assert answer(b, "wal/b2", idem(tip, 0))[0] == ErrorCode.out_of_order_sequence_number, "older than the last 5"
    assert answer(b, "wal/b3", idem(tip, 40))[0] == ErrorCode.out_of_order_sequence_number, "a gap"
    assert answer(b, "wal/b4", idem(tip, 35)) == (0, False, 35)
    assert answer(a, "wal/a7", idem(tip, 35)) == (0, True, 35), "a sees b's batch (its memory was behind)"
    assert answer(a, "wal/a8", idem(tip, 40)) == (0, False, 40)
    (info,) = b.describe_producers(tip)
    assert (info.producer_id, info.producer_epoch, info.last_sequence) == (9, 0, 44)
    a.close()
    b.close()


def test_producer_state_survives_a_restart_with_and_without_a_snapshot(pg_database: str) -> None:
    """A clean close snapshots the state; a broker that died without one leaves only runs: the
    next start rebuilds the same state either way, fencing included."""
    c = PostgresBatchCoordinator(pg_database)
    t0, t1 = new_topic(c, 2)
    assert answer(c, "wal/1", idem(t0, 0)) == (0, False, 0)
    assert answer(c, "wal/2", idem(t1, 0, epoch=3)) == (0, False, 0)
    c.close()  # snapshot written
    assert [row[:3] for row in snapshot_rows(pg_database)] == [(0, 5, 9), (1, 5, 9)]
    c = PostgresBatchCoordinator(pg_database)
    assert answer(c, "wal/3", idem(t0, 0)) == (0, True, 0)
    assert answer(c, "wal/4", idem(t0, 5)) == (0, False, 5)
    assert answer(c, "wal/5", idem(t1, 5, epoch=2))[0] == ErrorCode.invalid_producer_epoch
    c._snapshotter.stop()  # a crash: no snapshot on the way out
    c._snapshotter = None
    c._pool.close()
    c._pool = None
    c = PostgresBatchCoordinator(pg_database)
    assert answer(c, "wal/6", idem(t0, 5)) == (0, True, 5), "rebuilt from the snapshot and the runs after it"
    assert answer(c, "wal/7", idem(t1, 5, epoch=2))[0] == ErrorCode.invalid_producer_epoch
    assert answer(c, "wal/8", idem(t1, 5, epoch=3)) == (0, False, 5)
    c.close()


def test_two_brokers_interleaving_on_one_partition_with_snapshots_and_retention(pg_database: str) -> None:
    """Two brokers (instances on one database) take turns on one partition's producers, snapshot
    at different moments, and retention deletes the oldest batches (it snapshots first): every
    retry is a duplicate with its original offset, whichever broker it reaches."""
    brokers = [PostgresBatchCoordinator(pg_database), PostgresBatchCoordinator(pg_database)]
    (tip,) = new_topic(brokers[0], 1)
    offsets: dict[tuple[int, int], int] = {}
    for n in range(12):
        c = brokers[n % 2]
        for pid in (1, 2):
            r = answer(c, f"wal/{n}-{pid}", idem(tip, 5 * n, pid=pid))
            assert r[:2] == (0, False)
            offsets[(pid, 5 * n)] = r[2]
        if n % 3 == 1:
            c._snapshot_producers()
        if n == 8:
            (result,) = brokers[0].enforce_retention([RetentionRequest(tip, -1, 300)], now_ms=T0)
            assert result.deleted_batches > 0
    for k, c in enumerate(brokers + [PostgresBatchCoordinator(pg_database)]):
        for pid in (1, 2):
            for seq in (35, 55):  # among the last 5 of each producer (seq 55 is the newest)
                assert answer(c, f"wal/retry-{k}-{pid}-{seq}", idem(tip, seq, pid=pid)) == (0, True, offsets[(pid, seq)])
        c.close()
    check_invariants(pg_database)


def test_a_version_3_database_migrates_its_producer_state(pg_database: str) -> None:
    """A version-3 database kept every producer's state current in producer_state: opened by
    this kcli it becomes the snapshot as of each log's high watermark, so retries, the next
    sequence and fencing answer as before the upgrade."""
    topic = uuid.uuid4()
    with psycopg.connect(pg_database, autocommit=True, connect_timeout=10) as raw:
        with raw.transaction():
            raw.execute("CREATE TABLE schema_version (version integer PRIMARY KEY,"
                        " applied_at timestamptz NOT NULL DEFAULT now())")
            for version in range(1, 4):
                for statement in MIGRATIONS[version - 1]:
                    raw.execute(statement)
                raw.execute("INSERT INTO schema_version (version) VALUES (%s)", (version,))
        log_id = raw.execute("INSERT INTO logs (topic_id, partition, topic_name, high_watermark, byte_size)"
                             " VALUES (%s, 0, 'v3', 10, 200) RETURNING log_id", (topic,)).fetchone()[0]
        file_id = raw.execute("INSERT INTO files (object_key, uploader, file_size, used_size, state, committed_at)"
                              " VALUES ('wal/v3', 1, 1000, 200, 'uploaded', %s) RETURNING file_id", (T0,)).fetchone()[0]
        entries = b"".join(_RUN_ENTRY.pack(i, 5 * i, 5 * i + 4, 1 + 100 * i, 100, T0, T0, 0, 9, 2, 5 * i, 5 * i + 4)
                           for i in range(2))
        raw.execute("INSERT INTO batch_runs VALUES (%s, 9, 0, %s, 2, 200, %s, %s)", (log_id, file_id, T0, entries))
        raw.execute("INSERT INTO file_topics VALUES (%s, %s, 'v3', 200, 200)", (file_id, topic))
        state = b"".join(ENTRY.pack(5 * i, 5 * i + 4, 5 * i, 5 * i + 4, T0) for i in range(2))
        raw.execute("INSERT INTO producer_state VALUES (%s, 9, 2, %s)", (log_id, state))
    c = PostgresBatchCoordinator(pg_database)
    tip = TopicIdPartition(topic, "v3", 0)
    assert snapshot_rows(pg_database) == [(0, 10, 9, 2 * 32)], "the rows are the snapshot as of the high watermark"
    assert answer(c, "wal/1", idem(tip, 5, epoch=2)) == (0, True, 5)
    assert answer(c, "wal/2", idem(tip, 10, epoch=1))[0] == ErrorCode.invalid_producer_epoch
    assert answer(c, "wal/3", idem(tip, 20, epoch=2))[0] == ErrorCode.out_of_order_sequence_number
    assert answer(c, "wal/4", idem(tip, 10, epoch=2)) == (0, False, 10)
    c.close()
    with psycopg.connect(pg_database, connect_timeout=10) as raw:
        assert raw.execute("SELECT max(version) FROM schema_version").fetchone() == (SCHEMA_VERSION,) == (4,)
        assert raw.execute("SELECT producers FROM batch_runs ORDER BY last_offset").fetchall() == [(None,), (True,)]
    check_invariants(pg_database)


def test_an_idempotent_commit_writes_no_producer_rows(pg_database: str) -> None:
    """What the schema-4 design is for: a commit of idempotent batches touches no producer_state
    row (they are written by snapshots, not per commit)."""
    c = PostgresBatchCoordinator(pg_database)
    tips = new_topic(c, 3)
    c.commit_file("wal/0", 1, 1001, [batch(t, i, pid=p, epoch=0, seq=0) for i, (t, p) in
                                     enumerate((t, p) for t in tips for p in (1, 2, 3))])
    with psycopg.connect(pg_database, autocommit=True, connect_timeout=10) as raw:
        def writes() -> int:
            raw.execute("SELECT pg_stat_clear_snapshot()")
            row = raw.execute("SELECT n_tup_ins + n_tup_upd FROM pg_stat_user_tables"
                              " WHERE relname = 'producer_state'").fetchone()
            return int(row[0])
        before = writes()
        for n in range(1, 4):
            assert all(r.errors == 0 and not r.is_duplicate for r in c.commit_file(
                f"wal/{n}", 1, 1001, [batch(t, i, pid=p, epoch=0, seq=3 * n) for i, (t, p) in
                                      enumerate((t, p) for t in tips for p in (1, 2, 3))]))
        time.sleep(0.7)  # the statistics collector's delay
        assert writes() == before
    c.close()


def test_a_stale_commit_puts_memory_back_and_is_redone_under_the_locks(pg_database: str) -> None:
    """Broker a's memory is behind b's commit: a's in-order batch is appended in place (the fast
    path, overwriting the ring slot of the oldest batch), its statement finds the log moved on and
    writes nothing, memory goes back (slot included), and the redo under the logs' locks reads b's
    run and answers with b's offset — not the offset a had guessed."""
    a = PostgresBatchCoordinator(pg_database, clock=lambda: T0)
    b = PostgresBatchCoordinator(pg_database, clock=lambda: T0)
    (tip,) = new_topic(a, 1)
    for n in range(5):  # a caches 5 batches: its ring is full
        assert answer(a, f"wal/a{n}", idem(tip, 5 * n)) == (0, False, 5 * n)
    b.commit_file("wal/b0", 2, 201, [batch(tip, 0, 3), batch(tip, 1, 5, pid=9, epoch=0, seq=25)])  # 25..27, 28..32
    assert answer(a, "wal/a5", idem(tip, 25)) == (0, True, 28), "b's batch, at b's offset"
    state = a._states[(tip.topic_id, tip.partition)]
    assert state.hwm == 33 and 9 in state.dirty
    assert state.producers[9].batches == [(5 * n, 5 * n + 4, 5 * n, 5 * n + 4, T0) for n in range(1, 5)] + [
        (25, 29, 28, 32, T0)]
    assert answer(a, "wal/a6", idem(tip, 30)) == (0, False, 33)
    a.close()
    b.close()


def test_a_transactional_batch_after_in_order_ones_redoes_the_commit_under_the_locks(pg_database: str) -> None:
    """Batches checked in memory before a transactional one (which needs the logs' locks) were
    appended in place; the commit is redone under the locks from memory as it was, so each batch
    is in its producer's state once."""
    c = PostgresBatchCoordinator(pg_database, clock=lambda: T0)
    (tip,) = new_topic(c, 1)
    assert answer(c, "wal/0", idem(tip, 0)) == (0, False, 0)
    assert answer(c, "wal/1", idem(tip, 0, pid=10)) == (0, False, 5)
    transactional = CommitBatchRequest(1, tip, 101, 100, 0, 4, T0, 0, 10, 0, 5, 9, TXN_DATA)
    responses = c.commit_file("wal/2", 1, 201, [idem(tip, 5), transactional])
    assert [(r.errors, r.is_duplicate, r.assigned_base_offset) for r in responses] == [(0, False, 10), (0, False, 15)]
    producers = c._states[(tip.topic_id, tip.partition)].producers
    assert producers[9].batches == [(0, 4, 0, 4, T0), (5, 9, 10, 14, T0)]
    assert producers[10].batches == [(0, 4, 5, 9, T0), (5, 9, 15, 19, T0)]
    assert c.list_offsets([ListOffsetsRequest(tip, -1, read_committed=True)])[0].offset == 15
    c.close()


# -- outages and bounded waits -------------------------------------------------------------------


def test_database_restart_fails_calls_then_they_succeed_on_their_own(pg_server: PgServer) -> None:
    url = pg_server.url(pg_server.create_database())
    c = PostgresBatchCoordinator(url, **{"pool.timeout.ms": "1500", "connect.timeout.ms": "1000"})
    (tip,) = new_topic(c, 1)
    assert c.commit_file("wal/before", 1, 101, [batch(tip, 0)])[0].assigned_base_offset == 0
    pg_server.stop()
    try:
        for call in (lambda: c.commit_file("wal/during", 1, 101, [batch(tip, 0)]), c.describe_logs,
                     lambda: c.find_batches([FindBatchRequest(tip, 0, 1000)], 1000)):
            started = time.monotonic()
            with pytest.raises(CoordinatorException, match="failed on postgresql://"):
                call()
            assert time.monotonic() - started < 15, "a call on a dead server must fail within its timeouts"
    finally:
        pg_server.start()
    deadline = time.monotonic() + 30
    while True:  # the pool reconnects by itself; nobody reopens the coordinator
        try:
            responses = c.commit_file("wal/after", 1, 101, [batch(tip, 0)])
            break
        except CoordinatorException:
            assert time.monotonic() < deadline, "the coordinator did not recover after the restart"
            time.sleep(0.2)
    assert responses[0].assigned_base_offset == 3  # nothing from the failed commit was kept
    assert c.known_object_keys() == {"wal/before", "wal/after"}
    c.close()


def test_connections_broken_by_a_restart_are_replaced_before_a_call_uses_them(pg_server: PgServer) -> None:
    """The pool's idle connections die with the server; once it is back, the very first calls
    succeed: the checkout finds each dead connection and opens a new one."""
    url = pg_server.url(pg_server.create_database())
    c = PostgresBatchCoordinator(url, **{"pool.min.size": "2", "pool.max.size": "2"})
    (tip,) = new_topic(c, 1)
    assert c.commit_file("wal/before", 1, 101, [batch(tip, 0)])[0].assigned_base_offset == 0
    pg_server.stop()
    pg_server.start()
    for n in range(3):  # both pooled connections, then one of the new ones again
        assert c.commit_file(f"wal/after-{n}", 1, 101, [batch(tip, 0)])[0].assigned_base_offset == 3 * (n + 1)
    (log,) = c.describe_logs([tip.topic_id])
    assert log.high_watermark == 12
    c.close()


def test_a_password_in_the_url_never_reaches_a_message() -> None:
    url = "postgresql://kcli:s3cret@127.0.0.1:1/db"  # nothing listens on port 1
    with pytest.raises(CoordinatorException) as err:
        PostgresBatchCoordinator(url, **{"connect.timeout.ms": "1000"})
    assert "s3cret" not in str(err.value) and "postgresql://kcli:***@127.0.0.1:1/db" in str(err.value)


def test_connect_timeout_to_a_silent_server_is_bounded() -> None:
    """A port that accepts TCP but never answers (a hung server, a black-holing proxy): the
    open fails after connect.timeout.ms, it does not hang."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes handshakes; nobody ever reads or answers
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(CoordinatorException, match="cannot open coordinator database"):
            PostgresBatchCoordinator(f"postgresql://kcli@127.0.0.1:{port}/x", **{"connect.timeout.ms": "1000"})
        assert time.monotonic() - started < 10
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, not listening: refused at once
    with pytest.raises(CoordinatorException, match="cannot open coordinator database"):
        PostgresBatchCoordinator(f"postgresql://kcli@127.0.0.1:{port}/x")


def test_statement_waiting_on_a_lock_is_bounded(pg_database: str) -> None:
    """A commit queued behind another session's row lock fails after statement.timeout.ms
    (nothing changed), then works once the lock is gone."""
    c = PostgresBatchCoordinator(pg_database, **{"statement.timeout.ms": "700"})
    (tip,) = new_topic(c, 1)
    with psycopg.connect(pg_database, connect_timeout=10) as holder:
        holder.execute("SELECT * FROM logs FOR UPDATE")  # an open transaction holds the log's row
        started = time.monotonic()
        with pytest.raises(CoordinatorException, match="statement timeout"):
            c.commit_file("wal/blocked", 1, 101, [batch(tip, 0)])
        assert time.monotonic() - started < 10
    assert c.commit_file("wal/blocked", 1, 101, [batch(tip, 0)])[0].assigned_base_offset == 0
    c.close()


# -- schema and configuration ------------------------------------------------------------------


def test_brokers_starting_together_migrate_once(pg_database: str) -> None:
    opened: list[PostgresBatchCoordinator] = []
    lock = threading.Lock()

    def work(_k: int) -> None:
        c = PostgresBatchCoordinator(pg_database)
        with lock:
            opened.append(c)

    # One session holds the migration lock for a moment: the openers wait (bounded), then one
    # of them migrates and the others find the work done.
    with psycopg.connect(pg_database, connect_timeout=10) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        threads_started = time.monotonic()
        release = threading.Timer(1.0, lambda: holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,)))
        release.start()
        assert run_threads(work, 4) == []
        release.join()
        assert time.monotonic() - threads_started >= 0.9
    with psycopg.connect(pg_database, connect_timeout=10) as raw:
        assert raw.execute("SELECT version FROM schema_version ORDER BY version").fetchall() == [
            (v,) for v in range(1, SCHEMA_VERSION + 1)]
    assert [c.describe_logs() for c in opened] == [[]] * 4
    for c in opened:
        c.close()


def test_a_migration_that_cannot_get_its_lock_gives_up_in_bounded_time(pg_database: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """lock_timeout bounds every wait of a migration step (the advisory lock included), and the
    retries are counted: a broker never hangs at start behind a stuck migration."""
    import plugins.coordinator.postgresql as pg

    monkeypatch.setattr(pg, "MIGRATION_LOCK_TIMEOUT_MS", 300)
    monkeypatch.setattr(pg, "MIGRATION_ATTEMPTS", 3)
    with psycopg.connect(pg_database, connect_timeout=10) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))  # held for the whole test
        started = time.monotonic()
        with pytest.raises(CoordinatorException, match="lock timeout"):
            PostgresBatchCoordinator(pg_database)
        elapsed = time.monotonic() - started
    assert 0.9 <= elapsed < 10, elapsed  # three attempts of 0.3 s plus the pauses between them
    PostgresBatchCoordinator(pg_database).close()  # the lock gone, the migration runs


@pytest.mark.parametrize("old_version", [1, 2])
def test_old_database_is_migrated_and_keeps_every_batch(pg_database: str, old_version: int) -> None:
    """A database an older kcli wrote (one row per batch) opens as version 3: each old batch
    becomes a run of one, with its fields and a distinct id, and commits go on after it."""
    topic = uuid.uuid4()
    with psycopg.connect(pg_database, autocommit=True, connect_timeout=10) as raw:
        with raw.transaction():
            raw.execute("CREATE TABLE schema_version (version integer PRIMARY KEY,"
                        " applied_at timestamptz NOT NULL DEFAULT now())")
            for version in range(1, old_version + 1):
                for statement in MIGRATIONS[version - 1]:
                    raw.execute(statement)
                raw.execute("INSERT INTO schema_version (version) VALUES (%s)", (version,))
        # what the old commit path left: partition 0 with three batches in two objects
        log_id = raw.execute("INSERT INTO logs (topic_id, partition, topic_name, high_watermark, byte_size)"
                             " VALUES (%s, 0, 'old', 9, 300) RETURNING log_id", (topic,)).fetchone()[0]
        files = [raw.execute("INSERT INTO files (object_key, uploader, file_size, used_size, state, committed_at)"
                             " VALUES (%s, 1, 1000, %s, 'uploaded', %s) RETURNING file_id",
                             (key, used, T0)).fetchone()[0] for key, used in (("wal/old-a", 200), ("wal/old-b", 100))]
        for i, (file_id, ts_type, pid, seq) in enumerate(((files[0], 0, -1, -1), (files[0], 1, 7, 0),
                                                           (files[1], 0, 7, 3))):
            raw.execute(
                "INSERT INTO batches (log_id, last_offset, base_offset, file_id, byte_offset, byte_size,"
                " log_append_time, batch_max_timestamp, timestamp_type, producer_id, producer_epoch,"
                " base_sequence, last_sequence) VALUES (%s, %s, %s, %s, %s, 100, %s, %s, %s, %s, %s, %s, %s)",
                (log_id, 3 * i + 2, 3 * i, file_id, 1 + 100 * i, T0 + i, T0 - i, ts_type, pid,
                 0 if pid >= 0 else -1, seq, seq + 2 if seq >= 0 else -1))
        for file_id, used in zip(files, (200, 100)):
            raw.execute("INSERT INTO file_topics VALUES (%s, %s, 'old', %s, %s)", (file_id, topic, used, used))
    with pytest.raises(CoordinatorException,
                       match=f"schema version {old_version}, this kcli understands {SCHEMA_VERSION}"):
        PostgresBatchCoordinator(pg_database, read_only=True)  # inspection never migrates
    c = PostgresBatchCoordinator(pg_database)
    tip = TopicIdPartition(topic, "old", 0)
    (resp,) = c.find_batches([FindBatchRequest(tip, 4, 1 << 20)], 1 << 20)
    assert [(b.object_key, b.metadata.base_offset, b.metadata.last_offset, b.metadata.byte_offset,
             b.metadata.timestamp_type, b.metadata.producer_id, b.metadata.base_sequence)
            for b in resp.batches] == [("wal/old-a", 3, 5, 101, 1, 7, 0), ("wal/old-b", 6, 8, 201, 0, 7, 3)]
    ids = {b.batch_id for b in all_batches(c, tip)}  # numbered within their objects
    assert ids == {files[0] << BATCH_INDEX_BITS, files[0] << BATCH_INDEX_BITS | 1, files[1] << BATCH_INDEX_BITS}
    (latest,) = c.list_offsets([ListOffsetsRequest(tip, ListOffsetsRequest.MAX_TIMESTAMP)])
    assert (latest.offset, latest.timestamp) == (5, T0 + 1)  # LogAppendTime: the append time counts
    # new ids never meet the old ones
    (r,) = c.commit_file("wal/new", 1, 1000, [batch(tip, 0)])
    assert r.errors == 0 and r.assigned_base_offset == 9
    assert len({b.batch_id for b in all_batches(c, tip)}) == 4
    marker = CommitBatchRequest(0, tip, 1, 100, 0, 0, T0, 0, 5, 0, -1, -1, TXN_ABORT)  # the txn tables work
    (r,) = c.commit_file("wal/marker", 1, 1000, [marker])
    assert r.errors == 0 and r.assigned_base_offset == 12
    (resp,) = c.find_batches([FindBatchRequest(tip, 9, 1 << 20, read_committed=True)], 1 << 20)
    assert [(a.producer_id, a.first_offset, a.last_offset) for a in resp.aborted_transactions] == [(5, 12, 12)]
    (d,) = c.delete_records([DeleteRecordsRequest(tip, 4)])  # the first old batch (0..2) goes
    assert d.low_watermark == 4
    c.close()
    check_invariants(pg_database)
    with psycopg.connect(pg_database, autocommit=True, connect_timeout=10) as raw:
        assert raw.execute("SELECT max(version) FROM schema_version").fetchone() == (SCHEMA_VERSION,)
        assert raw.execute("SELECT to_regclass('batches')").fetchone() == (None,)


def test_a_hot_partition_is_stored_as_runs_of_bounded_length(pg_database: str) -> None:
    """250 batches of one partition in one object: three runs (100, 100, 50); a fetch from the
    middle of the second starts at the right batch, and a compaction across two runs works."""
    c = PostgresBatchCoordinator(pg_database)
    (tip,) = new_topic(c, 1)
    responses = c.commit_file("wal/hot", 1, 30_000, [batch(tip, i) for i in range(250)])
    assert [r.assigned_base_offset for r in responses] == list(range(0, 750, 3))
    with psycopg.connect(pg_database, connect_timeout=10) as raw:
        assert raw.execute("SELECT batch_count FROM batch_runs ORDER BY last_offset").fetchall() == [
            (100,), (100,), (50,)]
    (resp,) = c.find_batches([FindBatchRequest(tip, 451, 1000)], 1 << 20)  # batch 150 holds 450..452
    assert [b.metadata.base_offset for b in resp.batches] == list(range(450, 480, 3))
    replaced = [b for b in all_batches(c, tip) if 290 <= b.metadata.base_offset <= 310]  # spans runs 1 and 2
    c.register_upload_intent("wal/c", 1, T0)
    rewrites = [BatchMetadata(tip, 1 + 10 * i, 10, b.metadata.base_offset, b.metadata.last_offset, T0, T0, 0,
                              -1, -1, -1, -1) for i, b in enumerate(replaced)]
    assert c.replace_batches(tip, replaced, "wal/c", 1, 1000, rewrites, T0)
    assert [b.metadata.base_offset for b in all_batches(c, tip)] == list(range(0, 750, 3))
    # the same through the idempotent path: 150 batches of one producer make runs of 100 and 50
    responses = c.commit_file("wal/hot-idempotent", 1, 30_000,
                              [batch(tip, i, pid=4, epoch=0, seq=3 * i) for i in range(150)])
    assert [(r.errors, r.assigned_base_offset) for r in responses] == [(0, o) for o in range(750, 1200, 3)]
    with psycopg.connect(pg_database, connect_timeout=10) as raw:
        assert raw.execute("SELECT batch_count, base_offset FROM batch_runs WHERE base_offset >= 750"
                           " ORDER BY last_offset").fetchall() == [(100, 750), (50, 1050)]
    (resp,) = c.find_batches([FindBatchRequest(tip, 1052, 1000)], 1 << 20)
    assert [(b.metadata.base_offset, b.metadata.base_sequence) for b in resp.batches] == [
        (o, o - 750) for o in range(1050, 1080, 3)]
    c.close()
    check_invariants(pg_database)


def test_a_field_that_does_not_fit_its_run_entry_refuses_the_commit_whole(pg_database: str) -> None:
    """Fields the commit does not check otherwise (a non-idempotent batch's epoch) must still fit
    the run entry: a clean CoordinatorException, and nothing written."""
    c = PostgresBatchCoordinator(pg_database)
    (tip,) = new_topic(c, 1)
    bad = CommitBatchRequest(1, tip, 101, 100, 0, 2, T0, 0, -1, 1 << 40, -1, -1)
    with pytest.raises(CoordinatorException, match="invalid commit of wal/bad: a batch field outside Kafka's types"):
        c.commit_file("wal/bad", 1, 1000, [batch(tip, 0), bad])
    assert c.known_object_keys() == set()
    (r,) = c.commit_file("wal/good", 1, 1000, [batch(tip, 0)])
    assert r.errors == 0 and r.assigned_base_offset == 0
    c.close()


run_operation = st.one_of(
    # (partition, records, size, timestamp type, producer id) per batch of one object; partition 2
    # does not exist; batches grouped by partition, or interleaved (both paths of a commit)
    st.tuples(st.just("commit"), st.lists(st.tuples(st.sampled_from([0, 1, 1, 0, 2]), st.integers(1, 4),
                                                    st.integers(1, 50), st.sampled_from([0, 0, 1]),
                                                    st.sampled_from([-1, -1, -1, 7])), min_size=1, max_size=12),
              st.booleans()),
    st.tuples(st.just("delete_records"), st.integers(0, 1), st.integers(0, 80)),
    st.tuples(st.just("retention"), st.integers(0, 1), st.integers(0, 300)),
    # compaction of live batches [i, i + n) of a partition, each rewritten to ``size`` bytes
    st.tuples(st.just("replace"), st.integers(0, 1), st.integers(0, 30), st.integers(1, 6), st.integers(1, 20)),
)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(run_operation, min_size=1, max_size=14), st.integers(0, 80), st.integers(0, 80))
def test_batch_runs_answer_as_the_sqlite_coordinator_does(property_database: str,
                                                          tmp_path_factory: pytest.TempPathFactory, ops: list,
                                                          fetch_at: int, ts_at: int) -> None:
    """Differential: the same operations on the SQLite coordinator (one row per batch) and the
    PostgreSQL one (batch runs, cut and rewritten by deletions and compaction) leave the same
    batches, and fetches, timestamp lookups and describes answer alike (all but batch ids)."""
    from plugins.coordinator.sqlite import SqliteBatchCoordinator
    from tests.test_coordinator import Clock

    clock = Clock()  # one "now" for both: LogAppendTime batches get the same append times
    sqlite = SqliteBatchCoordinator(tmp_path_factory.mktemp("diff") / "c.db", clock=clock)
    pg = PostgresBatchCoordinator(property_database, clock=clock)
    tid = uuid.uuid4()
    tips = [TopicIdPartition(tid, "d", p) for p in range(3)]  # partition 2 is never created
    both = (sqlite, pg)
    sequences: dict[int, int] = {}  # partition → producer 7's next sequence

    def view(c: Any, tip: TopicIdPartition, offset: int, max_bytes: int = 1 << 30) -> tuple:
        (r,) = c.find_batches([FindBatchRequest(tip, offset, max_bytes)], 1 << 30)
        return r.errors, r.log_start_offset, r.high_watermark, [
            (b.object_key, b.metadata.byte_offset, b.metadata.byte_size, b.metadata.base_offset,
             b.metadata.last_offset, b.metadata.timestamp_type, b.metadata.batch_max_timestamp)
            for b in r.batches]

    try:
        for c in both:
            c.create_topic_and_partitions([CreateTopicAndPartitionsRequest(tid, "d", 2)])
        for n, op in enumerate(ops):
            kind = op[0]
            clock.now = T0 + 1000 * n + 500
            if kind == "commit":
                position, requests = 1, []
                for i, (part, records, size, ts_type, pid) in enumerate(
                        op[1] if op[2] else sorted(op[1], key=lambda b: b[0])):
                    seq = sequences.get(part, 0) if pid >= 0 else -1
                    if pid >= 0:
                        sequences[part] = seq + records
                    requests.append(CommitBatchRequest(i, tips[part], position, size, 0, records - 1,
                                                       T0 + 1000 * n + i, ts_type, pid, 0 if pid >= 0 else -1,
                                                       seq, seq + records - 1 if pid >= 0 else -1))
                    position += size
                answers = [[(r.errors, r.assigned_base_offset, r.log_append_time, r.log_start_offset, r.is_duplicate)
                            for r in c.commit_file(f"wal/{tid}/{n}", 0, position, requests)] for c in both]
                assert answers[0] == answers[1]
            elif kind == "delete_records":
                got = [c.delete_records([DeleteRecordsRequest(tips[op[1]], op[2])]) for c in both]
                assert got[0] == got[1]
            elif kind == "retention":
                got = [c.enforce_retention([RetentionRequest(tips[op[1]], -1, op[2])], now_ms=T0) for c in both]
                assert got[0] == got[1]
            else:
                _, part, first, count, size = op
                swapped = []
                for c in both:
                    (r,) = c.find_batches([FindBatchRequest(tips[part], 0, 1 << 30)], 1 << 30)
                    if r.errors:  # everything deleted below the start: read from the start
                        (r,) = c.find_batches([FindBatchRequest(tips[part], r.log_start_offset, 1 << 30)], 1 << 30)
                    replaced = r.batches[first:first + count]
                    rewrites = [BatchMetadata(tips[part], 1 + size * i, size, b.metadata.base_offset,
                                              b.metadata.last_offset, b.metadata.log_append_timestamp,
                                              b.metadata.batch_max_timestamp, b.metadata.timestamp_type,
                                              -1, -1, -1, -1) for i, b in enumerate(replaced)]
                    c.register_upload_intent(f"wal/{tid}/c{n}", 0, T0)
                    swapped.append(c.replace_batches(tips[part], replaced, f"wal/{tid}/c{n}", 0, 1 + size * count,
                                                     rewrites, T0))
                assert swapped[0] == swapped[1]
        for tip in tips[:2]:
            (end,) = sqlite.describe_logs([tid])[tip.partition:tip.partition + 1]
            for offset in range(0, end.high_watermark + 2):  # from every offset: a run's every entry
                assert view(sqlite, tip, offset, 60) == view(pg, tip, offset, 60)
            assert view(sqlite, tip, fetch_at) == view(pg, tip, fetch_at)
            for ts in (T0 + 1000 * (ts_at // 6) + ts_at % 6, ListOffsetsRequest.MAX_TIMESTAMP):
                got = [c.list_offsets([ListOffsetsRequest(tip, ts)]) for c in both]
                assert got[0] == got[1]
        assert [(i.log_start_offset, i.high_watermark, i.batch_count, i.byte_size)
                for i in sqlite.describe_logs([tid])] == [
            (i.log_start_offset, i.high_watermark, i.batch_count, i.byte_size) for i in pg.describe_logs([tid])]
        files = [sorted((f.object_key, f.used_size, f.state, f.batch_count) for f in c.describe_files(topic_id=tid))
                 for c in both]
        assert files[0] == files[1]
        for key in {f[0] for f in files[0]}:
            assert [(b.metadata.byte_offset, b.metadata.base_offset) for b in sqlite.batches_in_file(key)] == [
                (b.metadata.byte_offset, b.metadata.base_offset) for b in pg.batches_in_file(key)]
    finally:
        sqlite.close()
        pg.close()
    check_invariants(property_database)


def test_runs_are_cut_at_any_offset_and_keep_the_rest(pg_database: str) -> None:
    """DeleteRecords, retention and compaction inside one run: the kept batches stay, with their
    ids, sizes and object; the removed ones free their bytes."""
    c = PostgresBatchCoordinator(pg_database)
    (tip,) = new_topic(c, 1)
    c.commit_file("wal/a", 1, 10_000, [batch(tip, i) for i in range(10)])  # one run: offsets 0..29
    c.commit_file("wal/b", 1, 10_000, [batch(tip, i) for i in range(5)])  # another: 30..44
    before = {b.metadata.last_offset: b.batch_id for b in all_batches(c, tip)}
    assert all(i >> BATCH_INDEX_BITS for i in before.values())
    (d,) = c.delete_records([DeleteRecordsRequest(tip, 7)])  # offset 7 lies in batch 6..8: 2 batches go
    assert d.low_watermark == 7
    kept = c.find_batches([FindBatchRequest(tip, 7, 1 << 40)], 1 << 40)[0].batches
    assert [b.metadata.base_offset for b in kept] == list(range(6, 45, 3))
    assert {b.metadata.last_offset: b.batch_id for b in kept} == {k: v for k, v in before.items() if k >= 8}
    # compaction replaces two batches in the middle of the first run (15..17, 18..20)
    replaced = [b for b in kept if 15 <= b.metadata.base_offset <= 18]
    c.register_upload_intent("wal/c", 1, T0)
    rewrites = [BatchMetadata(tip, 1 + 50 * i, 50, b.metadata.base_offset, b.metadata.last_offset, T0, T0, 0,
                              -1, -1, -1, -1) for i, b in enumerate(replaced)]
    assert c.replace_batches(tip, replaced, "wal/c", 1, 1000, rewrites, T0)
    after = c.find_batches([FindBatchRequest(tip, 7, 1 << 40)], 1 << 40)[0].batches
    assert [b.metadata.base_offset for b in after] == list(range(6, 45, 3))
    assert [b.object_key for b in after if 15 <= b.metadata.base_offset <= 18] == ["wal/c", "wal/c"]
    assert [b.metadata.byte_size for b in after].count(50) == 2
    # a stale replacement (the range changed) is refused
    c.register_upload_intent("wal/d", 1, T0)
    assert not c.replace_batches(tip, replaced, "wal/d", 1, 1000, rewrites, T0)
    (info,) = c.describe_logs([tip.topic_id])
    assert (info.log_start_offset, info.high_watermark, info.batch_count) == (7, 45, 13)
    assert {f.object_key: f.batch_count for f in c.describe_files(state="uploaded")} == {
        "wal/a": 6, "wal/b": 5, "wal/c": 2}
    (res,) = c.enforce_retention([RetentionRequest(tip, -1, 7 * 100)], T0)  # keep 7 x 100 bytes... and 2 x 50
    assert (res.log_start_offset, res.deleted_batches) == (24, 6)
    c.close()
    check_invariants(pg_database)


def test_newer_schema_and_foreign_database_are_refused(pg_database: str, pg_server: PgServer) -> None:
    PostgresBatchCoordinator(pg_database).close()
    with psycopg.connect(pg_database, autocommit=True, connect_timeout=10) as raw:
        raw.execute("INSERT INTO schema_version (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
    for read_only in (False, True):
        with pytest.raises(CoordinatorException, match=f"schema version {SCHEMA_VERSION + 1}, this kcli understands"):
            PostgresBatchCoordinator(pg_database, read_only=read_only)
    empty = pg_server.url(pg_server.create_database())
    with pytest.raises(CoordinatorException, match="no schema version"):
        open_coordinator(empty, read_only=True)  # inspection tools never create a schema


def test_configuration_is_checked(pg_database: str) -> None:
    c = PostgresBatchCoordinator()
    with pytest.raises(CoordinatorException, match="not open"):
        c.describe_logs()
    with pytest.raises(CoordinatorException, match="needs config url"):
        c.configure({})
    with pytest.raises(CoordinatorException, match="unknown PostgresBatchCoordinator config"):
        c.configure({"url": pg_database, "path": "/x"})
    with pytest.raises(CoordinatorException, match="pool.max.size: not an integer"):
        c.configure({"url": pg_database, "pool.max.size": "many"})
    with pytest.raises(CoordinatorException, match="statement.timeout.ms: must be positive"):
        c.configure({"url": pg_database, "statement.timeout.ms": "0"})
    c.configure({"url": pg_database.replace("postgresql://", "postgres://"), "pool.min.size": "2"})
    assert c.describe_logs() == []
    c.close()
    secret = PostgresBatchCoordinator.__new__(PostgresBatchCoordinator)
    secret._url = "postgresql://kcli:hunter2@127.0.0.1:5/db"
    assert "hunter2" not in secret.path


# -- a real broker -------------------------------------------------------------------------------


def test_broker_with_a_postgresql_coordinator_serves_diskless_topics_across_a_restart(
        broker_factory: Callable[..., Any], pg_database: str, cli_env: dict[str, str], tmp_path: Path) -> None:
    b = broker_factory(FAST, extra_args=["--coordinator", pg_database])
    create_topic(b.bootstrap, "pgd", 2, DISKLESS)
    values = [f"v{i}".encode() for i in range(200)]
    acks = produce(b.bootstrap, "pgd", values, keys=[str(i % 5).encode() for i in range(200)],
                   **{"enable.idempotence": True})
    msgs = consume_all(b.bootstrap, "pgd", len(values))
    assert sorted(m.value() for m in msgs) == sorted(values)
    assert sorted(acks) == sorted((m.partition(), m.offset()) for m in msgs)
    # The state is in PostgreSQL, not in the data dir's SQLite file.
    assert not (b.data_dir / "diskless" / "coordinator.db").exists()
    with psycopg.connect(pg_database, connect_timeout=10) as raw:
        assert raw.execute("SELECT sum(high_watermark) FROM logs").fetchone()[0] == len(values)
        assert raw.execute("SELECT value FROM kcli_meta WHERE key = 'cluster_id'").fetchone() is not None
    b.stop()
    b.start()
    again = consume_all(b.bootstrap, "pgd", len(values), group="after-restart")
    assert sorted((m.partition(), m.offset(), m.value()) for m in again) == sorted(
        (m.partition(), m.offset(), m.value()) for m in msgs)
    more = produce(b.bootstrap, "pgd", [b"after"], keys=[b"0"])
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "hw"})
    try:
        lo, hi = c.get_watermark_offsets(TopicPartition("pgd", more[0][0]), timeout=20)
    finally:
        c.close()
    assert (lo, hi) == (0, more[0][1] + 1)
    b.stop()
    # Offline inspection reads the same database (read-only).
    out = run_kcli(cli_env, "diskless", "describe", "--coordinator", pg_database, "-o", "json")
    assert out.returncode == 0, out.stderr
    assert '"pgd"' in out.stdout and str(len(values) + 1) in out.stdout.replace(" ", "")
    wal = sorted((b.data_dir / "objects" / "wal").iterdir())
    dump = run_kcli(cli_env, "dump-log", str(wal[0]), "--coordinator", pg_database)
    assert dump.returncode == 0, dump.stderr
    assert "topic: pgd partition: " in dump.stdout and "assignedBaseOffset: " in dump.stdout
    bad = run_kcli(cli_env, "broker", "start", "--data-dir", str(tmp_path / "x"), "--coordinator", "mysql://h/db")
    assert_one_line_error(bad, 2, "--coordinator expects", "'mysql://h/db'")


# -- the bench ---------------------------------------------------------------------------------


def test_bench_measures_a_postgresql_coordinator_and_names_wal_segment_crossings(pg_database: str) -> None:
    """bench/coordinator_bench.py against an existing database: the table, which timed commits
    crossed into a new WAL segment (docs/performance.md explains why those are the P99 on a
    fresh server), the time each commit scenario waited on the database, and the server's floor."""
    bench = Path(__file__).resolve().parents[1] / "bench" / "coordinator_bench.py"
    out = subprocess.run([sys.executable, str(bench), "--coordinator", pg_database, "--commits", "4", "--batches",
                          "20", "--partitions", "10", "--finds", "8"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "PostgreSQL batch coordinator" in out.stdout and "fsync=on" in out.stdout
    lines = [line for line in out.stdout.splitlines() if "crossed into a new WAL segment" in line]
    assert [line.split(":")[0].strip() for line in lines] == [
        "commit_file 1,000 batches, no producer ids", "commit_file 1,000 batches, idempotent, 50 producers"]
    assert all(re.search(r": [0-4] of 4 calls crossed into a new WAL segment \(.*\); P99 of the others", line)
               for line in lines), lines
    # How much of a commit is waiting on the database, and the server's floor on this host.
    waits = re.findall(r"^  (commit_file [^:]*): waiting on the database \(wall - CPU\) P50 ([0-9.]+), P99 ([0-9.]+) ms$",
                       out.stdout, re.M)
    assert [w[0] for w in waits] == [
        "commit_file 1,000 batches, no producer ids", "commit_file 1,000 batches, idempotent, 50 producers"]
    assert all(0 <= float(p50) <= float(p99) for _, p50, p99 in waits), waits
    floors = re.findall(r"^  floor, (.*): P50 ([0-9.]+), P99 ([0-9.]+) ms$", out.stdout, re.M)
    assert [f[0] for f in floors] == ["round trip (SELECT 1)", "durable commit (one WAL record, its flush)"]
