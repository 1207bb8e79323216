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

from plugins.coordinator import open_coordinator
from plugins.coordinator.base import (
    CommitBatchRequest,
    CoordinatorException,
    CreateTopicAndPartitionsRequest,
    DeleteFilesRequest,
    DeleteRecordsRequest,
    INVALID_PRODUCER_EPOCH,
    FindBatchRequest,
    RetentionRequest,
    TXN_ABORT,
    TopicIdPartition,
)
from plugins.coordinator.postgresql import (
    MIGRATION_LOCK_KEY,
    SCHEMA_VERSION,
    PostgresBatchCoordinator,
    _PackedProducer,
)
from plugins.coordinator.sqlite import _Producer
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


def check_invariants(url: str) -> None:
    """What every committed state must satisfy, read straight from the database."""
    with psycopg.connect(url, connect_timeout=10) as raw:
        for log_id, lso, hwm, size in raw.execute(
                "SELECT log_id, log_start_offset, high_watermark, byte_size FROM logs").fetchall():
            rows = raw.execute("SELECT base_offset, last_offset, byte_size FROM batches WHERE log_id = %s"
                               " ORDER BY last_offset", (log_id,)).fetchall()
            assert size == sum(r[2] for r in rows)
            for prev, nxt in zip(rows, rows[1:]):
                assert nxt[0] == prev[1] + 1, "offsets must be gapless"
            if rows:
                assert rows[-1][1] == hwm - 1 and rows[0][0] <= lso <= rows[0][1]
            else:
                assert lso == hwm
        assert raw.execute(
            "SELECT count(*) FROM files f WHERE used_size != (SELECT coalesce(sum(byte_size), 0) FROM batches b"
            " WHERE b.file_id = f.file_id)").fetchone()[0] == 0, "used_size must equal the live batch bytes"
        assert raw.execute("SELECT count(*) FROM files WHERE used_size = 0 AND state = 'uploaded'").fetchone()[0] == 0
        assert raw.execute(
            "SELECT count(*) FROM batches b WHERE NOT EXISTS (SELECT 1 FROM files f WHERE f.file_id = b.file_id)"
            " OR NOT EXISTS (SELECT 1 FROM logs l WHERE l.log_id = b.log_id)").fetchone()[0] == 0
        assert raw.execute(
            "SELECT count(*) FROM file_topics ft WHERE live_bytes != (SELECT coalesce(sum(b.byte_size), 0)"
            " FROM batches b JOIN logs l ON l.log_id = b.log_id WHERE b.file_id = ft.file_id"
            " AND l.topic_id = ft.topic_id)").fetchone()[0] == 0
        count, distinct = raw.execute("SELECT count(*), count(DISTINCT batch_id) FROM batches").fetchone()
        assert count == distinct


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


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 40), st.integers(-3, 40)), max_size=9), st.integers(0, 40),
       st.integers(0, 9))
def test_packed_producer_state_matches_the_ring(stored: list, base_seq: int, length: int) -> None:
    """The packed fast path keeps exactly the state _Producer keeps, and offers the shortcut
    exactly when _Producer does (the full checks run otherwise)."""
    ring = _Producer(0, [(b, l, i, i, T0) for i, (b, l) in enumerate(stored)])
    packed = _PackedProducer(0, ring.encode())
    assert packed.next_sequence == ring.next_sequence
    entry = (base_seq, base_seq + length, 100, 110, T0 + 1)
    if packed.next_sequence == base_seq or not stored:
        packed.append(*entry)
        ring.append(*entry)
        assert packed.encode() == ring.encode()
        assert packed.next_sequence == ring.next_sequence


def test_one_commit_updates_known_producers_and_adds_new_ones(pg_database: str) -> None:
    """A commit writes the state of producers the database knows (UPDATE) and of new ones
    (INSERT) separately, and reads it by (partition slot, producer id): one object mixing the
    next batch of a known producer, the same producer id on another partition, an epoch bump, a
    duplicate and a new producer on two partitions leaves exactly Kafka's state behind, as
    another broker (instance) sees it."""
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
    assert retries[5].errors == INVALID_PRODUCER_EPOCH
    following = [batch(t0, 0, 1, pid=7, epoch=0, seq=10), batch(t1, 1, 1, pid=7, epoch=0, seq=6),
                 batch(t0, 2, 1, pid=8, epoch=1, seq=2), batch(t1, 3, 1, pid=9, epoch=0, seq=4),
                 batch(t0, 4, 1, pid=10, epoch=0, seq=1), batch(t1, 5, 1, pid=10, epoch=0, seq=1)]
    assert [(r.errors, r.is_duplicate) for r in b.commit_file("wal/4", 2, 601, following)] == [(0, False)] * 6
    with psycopg.connect(pg_database, connect_timeout=10) as raw:
        rows = raw.execute("SELECT l.partition, p.producer_id, p.producer_epoch, length(p.batches)"
                           " FROM producer_state p JOIN logs l USING (log_id) ORDER BY 1, 2").fetchall()
    entry = 32  # bytes a stored batch takes (sequence range, offsets, append time)
    assert rows == [(0, 7, 0, 3 * entry), (0, 8, 1, 2 * entry), (0, 10, 0, 2 * entry),
                    (1, 7, 0, 3 * entry), (1, 9, 0, 2 * entry), (1, 10, 0, 2 * entry)]
    a.close()
    b.close()


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


def test_version_1_database_is_migrated_to_2_and_keeps_everything(pg_database: str) -> None:
    c = PostgresBatchCoordinator(pg_database)
    (tip,) = new_topic(c, 1)
    c.commit_file("wal/a", 1, 1000, [batch(tip, 0), batch(tip, 1, pid=5, epoch=0, seq=0)])
    c.close()
    with psycopg.connect(pg_database, autocommit=True, connect_timeout=10) as raw:  # what schema 1 left
        raw.execute("DROP TABLE txn_open")
        raw.execute("DROP TABLE txn_aborted")
        raw.execute("DELETE FROM schema_version WHERE version = 2")
    with pytest.raises(CoordinatorException, match="schema version 1, this kcli understands 2"):
        PostgresBatchCoordinator(pg_database, read_only=True)  # inspection never migrates
    c = PostgresBatchCoordinator(pg_database)
    (resp,) = c.find_batches([FindBatchRequest(tip, 0, 1 << 20, read_committed=True)], 1 << 20)
    assert (resp.high_watermark, resp.last_stable_offset, len(resp.batches)) == (6, 6, 2)
    marker = CommitBatchRequest(0, tip, 1, 100, 0, 0, T0, 0, 5, 0, -1, -1, TXN_ABORT)
    (r,) = c.commit_file("wal/b", 1, 1000, [marker])
    assert r.errors == 0 and r.assigned_base_offset == 6
    (resp,) = c.find_batches([FindBatchRequest(tip, 0, 1 << 20, read_committed=True)], 1 << 20)
    assert [(a.producer_id, a.first_offset, a.last_offset) for a in resp.aborted_transactions] == [(5, 6, 6)]
    c.close()
    with psycopg.connect(pg_database, autocommit=True, connect_timeout=10) as raw:
        assert raw.execute("SELECT max(version) FROM schema_version").fetchone() == (SCHEMA_VERSION,)


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
    """bench/coordinator_bench.py against an existing database: the table, and which timed commits
    crossed into a new WAL segment (docs/performance.md explains why those are the P99 on a
    fresh server)."""
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
