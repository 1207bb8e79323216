"""SQLite batch coordinator: every KIP-1164 operation, kcli's extras, durability, idempotence,
and a property test that offsets stay gapless and sizes consistent under random operations."""

from __future__ import annotations

import os
import struct
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from plugins.coordinator import open_coordinator
from plugins.coordinator.base import (
    TXN_ABORT, TXN_COMMIT, TXN_DATA, AbortedTransaction, ProducerInfo, BatchCoordinator, CommitBatchRequest,
    CoordinatorException, CreateTopicAndPartitionsRequest, DeleteFilesRequest, DeleteRecordsRequest,
    FindBatchRequest, ListOffsetsRequest, RetentionRequest, TimestampType, TopicIdPartition,
)
from plugins.coordinator.producers import ENTRY as _ENTRY, Producer as _Producer
from plugins.coordinator.sqlite import SCHEMA_VERSION, SqliteBatchCoordinator, _Checkpointer
from plugins.loader import PluginError, load_class
from tests.fixtures_pg import pg_database, pg_server  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000_000


class Clock:
    """An injected time source: tests decide what "now" is."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "diskless" / "coordinator.db"


class Backend:
    """Where one contract test's coordinator state lives: a SQLite file or a fresh PostgreSQL
    database on the session's real server (tests/fixtures_pg.py). ``open`` makes another
    instance on the same state: a restart, or a second broker."""

    def __init__(self, kind: str, target: str) -> None:
        self.kind = kind
        self.target = target
        self.opened: list[BatchCoordinator] = []

    def open(self, clock: Clock | None = None, *, read_only: bool = False) -> BatchCoordinator:
        if self.kind == "sqlite":
            c: BatchCoordinator = SqliteBatchCoordinator(self.target, clock=clock, read_only=read_only)
        else:
            from plugins.coordinator.postgresql import PostgresBatchCoordinator

            c = PostgresBatchCoordinator(self.target, clock=clock, read_only=read_only)
        self.opened.append(c)
        return c

    def close_all(self) -> None:
        for c in self.opened:
            c.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, db_path: Path):
    """The contract suite runs against both coordinators (same semantics, same answers)."""
    target = str(db_path) if request.param == "sqlite" else request.getfixturevalue("pg_database")
    b = Backend(request.param, target)
    yield b
    b.close_all()


@pytest.fixture
def coord(backend: Backend, clock: Clock):
    return backend.open(clock)


@pytest.fixture
def sqlite_coord(db_path: Path, clock: Clock):
    """SQLite-only tests (file settings, WAL, raw SQL on the file)."""
    c = SqliteBatchCoordinator(db_path, clock=clock)
    yield c
    c.close()


def topic(c: BatchCoordinator, name: str = "orders", partitions: int = 2) -> list[TopicIdPartition]:
    tid = uuid.uuid4()
    c.create_topic_and_partitions([CreateTopicAndPartitionsRequest(tid, name, partitions)])
    return [TopicIdPartition(tid, name, p) for p in range(partitions)]


def req(tip: TopicIdPartition, i: int = 0, *, size: int = 100, records: int = 10, pos: int | None = None,
        pid: int = -1, epoch: int = -1, seq: int = -1, ts: int = T0, ts_type: int = 0) -> CommitBatchRequest:
    last_seq = -1 if seq < 0 else (seq + records - 1) & 0x7FFFFFFF
    return CommitBatchRequest(i, tip, 1 + i * size if pos is None else pos, size, 0, records - 1, ts, ts_type,
                              pid, epoch, seq, last_seq)


def commit(c: BatchCoordinator, requests: list[CommitBatchRequest], key: str | None = None):
    key = key or f"wal/{uuid.uuid4()}"
    size = max([r.byte_offset + r.size for r in requests], default=1)
    return c.commit_file(key, 1, size, requests), key


def log_of(c: BatchCoordinator, tip: TopicIdPartition):
    return next(i for i in c.describe_logs([tip.topic_id]) if i.topic_id_partition.partition == tip.partition)


def file_of(c: BatchCoordinator, key: str):
    (info,) = c.describe_files(object_key=key)
    return info


# -- error codes are Kafka's -----------------------------------------------------------------


def test_error_codes_match_kafka() -> None:
    assert ErrorCode.offset_out_of_range == ErrorCode.offset_out_of_range
    assert ErrorCode.unknown_topic_or_partition == ErrorCode.unknown_topic_or_partition
    assert ErrorCode.out_of_order_sequence_number == ErrorCode.out_of_order_sequence_number
    assert ErrorCode.invalid_producer_epoch == ErrorCode.invalid_producer_epoch


# -- create / commit -------------------------------------------------------------------------


def test_create_topic_is_idempotent_and_adds_partitions(coord: SqliteBatchCoordinator) -> None:
    a0, a1 = topic(coord)
    commit(coord, [req(a0)])
    coord.create_topic_and_partitions([CreateTopicAndPartitionsRequest(a0.topic_id, "orders", 4)])
    logs = coord.describe_logs([a0.topic_id])
    assert [(i.topic_id_partition.partition, i.high_watermark) for i in logs] == [(0, 10), (1, 0), (2, 0), (3, 0)]
    assert coord.describe_logs([]) == []
    with pytest.raises(CoordinatorException, match="negative partition count"):
        coord.create_topic_and_partitions([CreateTopicAndPartitionsRequest(uuid.uuid4(), "x", -1)])


def test_commit_assigns_gapless_offsets_across_files(coord: SqliteBatchCoordinator, clock: Clock) -> None:
    a0, a1 = topic(coord)
    first, key1 = commit(coord, [req(a0, 0, records=5), req(a0, 1, records=3), req(a1, 2, records=7)])
    assert [(r.errors, r.assigned_base_offset) for r in first] == [(0, 0), (0, 5), (0, 0)]
    assert all(r.log_append_time == T0 and r.log_start_offset == 0 and not r.is_duplicate for r in first)
    assert [r.request.request_id for r in first] == [0, 1, 2]
    clock.now += 1000
    second, key2 = commit(coord, [req(a1, 0, records=1), req(a0, 1, records=2)])
    assert [r.assigned_base_offset for r in second] == [7, 8]
    assert second[0].log_append_time == T0 + 1000
    assert (log_of(coord, a0).high_watermark, log_of(coord, a1).high_watermark) == (10, 8)
    assert (log_of(coord, a0).byte_size, log_of(coord, a0).batch_count) == (300, 3)
    f1 = file_of(coord, key1)
    assert (f1.file_size, f1.used_size, f1.state, f1.batch_count, f1.committed_at_ms) == (301, 300, "uploaded", 3, T0)
    assert f1.partitions == [a0, a1] and f1.uploader_broker_id == 1
    offsets = [(b.metadata.base_offset, b.metadata.last_offset)
               for b in coord.find_batches([FindBatchRequest(a0, 0, 1 << 20)], 1 << 20)[0].batches]
    assert offsets == [(0, 4), (5, 7), (8, 9)]


def test_failed_batch_does_not_stop_the_others(coord: SqliteBatchCoordinator) -> None:
    (a0,) = topic(coord, partitions=1)
    ghost = TopicIdPartition(uuid.uuid4(), "ghost", 0)
    out_of_range_partition = TopicIdPartition(a0.topic_id, a0.topic, 9)
    responses, key = commit(coord, [req(a0, 0), req(ghost, 1), req(out_of_range_partition, 2), req(a0, 3)])
    assert [r.errors for r in responses] == [0, ErrorCode.unknown_topic_or_partition, ErrorCode.unknown_topic_or_partition, 0]
    bad = responses[1]
    assert (bad.assigned_base_offset, bad.log_append_time, bad.log_start_offset, bad.is_duplicate) == (-1, -1, -1, False)
    assert [r.assigned_base_offset for r in (responses[0], responses[3])] == [0, 10]
    assert file_of(coord, key).used_size == 200


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"pos": 1000}, "outside the object"),
        ({"size": 0}, "empty or outside"),
        ({"records": 0}, "last offset -1 before base offset 0"),
        ({"ts_type": 7}, "unknown timestamp type 7"),
    ],
)
def test_malformed_commit_is_refused_whole(coord: SqliteBatchCoordinator, bad: dict, message: str) -> None:
    (a0,) = topic(coord, partitions=1)
    with pytest.raises(CoordinatorException, match=message):
        coord.commit_file("wal/bad", 1, 201, [req(a0, 0), req(a0, 1, **bad)])
    assert log_of(coord, a0).high_watermark == 0
    assert coord.known_object_keys() == set()
    assert commit(coord, [req(a0)])[0][0].assigned_base_offset == 0  # caches were not left dirty


def test_same_object_twice_is_refused(coord: SqliteBatchCoordinator) -> None:
    (a0,) = topic(coord, partitions=1)
    commit(coord, [req(a0)], key="wal/once")
    with pytest.raises(CoordinatorException, match="already committed"):
        commit(coord, [req(a0)], key="wal/once")
    assert log_of(coord, a0).high_watermark == 10
    with pytest.raises(CoordinatorException, match="object key"):
        coord.commit_file("", 1, 10, [])


def test_object_with_nothing_committed_is_garbage_at_once(coord: SqliteBatchCoordinator) -> None:
    ghost = TopicIdPartition(uuid.uuid4(), "ghost", 0)
    _, key = commit(coord, [req(ghost)])
    info = file_of(coord, key)
    assert (info.state, info.used_size, info.marked_for_deletion_at_ms) == ("deleting", 0, T0)
    assert [f.object_key for f in coord.get_files_to_delete()] == [key]


# -- idempotent producers --------------------------------------------------------------------


def test_duplicate_returns_original_offsets(coord: SqliteBatchCoordinator, clock: Clock) -> None:
    (a0,) = topic(coord, partitions=1)
    first, _ = commit(coord, [req(a0, 0, pid=7, epoch=0, seq=0), req(a0, 1, pid=7, epoch=0, seq=10)])
    clock.now += 5000
    again, key = commit(coord, [req(a0, 0, pid=7, epoch=0, seq=10), req(a0, 1, pid=7, epoch=0, seq=20)])
    dup, new = again
    assert (dup.errors, dup.is_duplicate, dup.assigned_base_offset, dup.log_append_time) == (0, True, 10, T0)
    assert (new.errors, new.is_duplicate, new.assigned_base_offset) == (0, False, 20)
    assert log_of(coord, a0).high_watermark == 30
    assert file_of(coord, key).batch_count == 1  # the duplicate was not stored again


def test_duplicate_inside_one_commit(coord: SqliteBatchCoordinator) -> None:
    (a0,) = topic(coord, partitions=1)
    responses, _ = commit(coord, [req(a0, 0, pid=7, epoch=0, seq=0), req(a0, 1, pid=7, epoch=0, seq=0)])
    assert [(r.is_duplicate, r.assigned_base_offset) for r in responses] == [(False, 0), (True, 0)]
    assert log_of(coord, a0).high_watermark == 10


def test_sequence_and_epoch_errors(coord: SqliteBatchCoordinator) -> None:
    (a0,) = topic(coord, partitions=1)
    commit(coord, [req(a0, 0, pid=7, epoch=2, seq=0)])
    responses, _ = commit(coord, [
        req(a0, 0, pid=7, epoch=2, seq=20),  # gap: expected 10
        req(a0, 1, pid=7, epoch=1, seq=10),  # fenced epoch
        req(a0, 2, pid=7, epoch=3, seq=5),  # new epoch must start at 0
        req(a0, 3, pid=7, epoch=2, seq=10),  # in sequence: fine
        req(a0, 4),  # non-idempotent batch in the same object: fine
    ])
    assert [r.errors for r in responses] == [ErrorCode.out_of_order_sequence_number, ErrorCode.invalid_producer_epoch,
                                             ErrorCode.out_of_order_sequence_number, 0, 0]
    assert [r.assigned_base_offset for r in responses] == [-1, -1, -1, 10, 20]
    bumped, _ = commit(coord, [req(a0, 0, pid=7, epoch=3, seq=0), req(a0, 1, pid=7, epoch=2, seq=20)])
    assert [r.errors for r in bumped] == [0, ErrorCode.invalid_producer_epoch]


def test_unknown_producer_may_start_anywhere_and_sequences_wrap(coord: SqliteBatchCoordinator) -> None:
    (a0,) = topic(coord, partitions=1)
    int_max = 0x7FFFFFFF
    responses, _ = commit(coord, [req(a0, 0, pid=9, epoch=0, seq=int_max - 9),  # ends exactly at Int32.MAX
                                  req(a0, 1, pid=9, epoch=0, seq=0)])
    assert [r.errors for r in responses] == [0, 0]
    assert responses[0].request.last_sequence == int_max


def test_only_the_last_five_batches_are_deduplicated(coord: SqliteBatchCoordinator) -> None:
    (a0,) = topic(coord, partitions=1)
    commit(coord, [req(a0, i, pid=7, epoch=0, seq=10 * i) for i in range(6)])
    responses, _ = commit(coord, [req(a0, 0, pid=7, epoch=0, seq=10), req(a0, 1, pid=7, epoch=0, seq=0)])
    assert (responses[0].is_duplicate, responses[0].assigned_base_offset) == (True, 10)
    assert responses[1].errors == ErrorCode.out_of_order_sequence_number  # evicted: too old to recognise


def test_idempotence_state_is_per_partition(coord: SqliteBatchCoordinator) -> None:
    a0, a1 = topic(coord)
    responses, _ = commit(coord, [req(a0, 0, pid=7, epoch=0, seq=0), req(a1, 1, pid=7, epoch=0, seq=0)])
    assert [(r.errors, r.is_duplicate) for r in responses] == [(0, False), (0, False)]


def test_in_order_batches_and_every_other_case_in_one_commit(coord: SqliteBatchCoordinator) -> None:
    """A batch that continues its producer's sequence takes the commit loop's fast path; every
    other case falls back to Kafka's full checks, even between in-order batches of one commit: a
    gap, a duplicate (of this commit or an earlier one), an epoch bump (whose producer then
    continues in order again), a fenced epoch, a bump not starting at 0."""
    (a0,) = topic(coord, partitions=1)
    commit(coord, [req(a0, 0, pid=7, epoch=0, seq=0)])  # offsets 0..9: next sequence 10
    responses, _ = commit(coord, [
        req(a0, 0, pid=7, epoch=0, seq=10),  # in order: the fast path
        req(a0, 1, pid=7, epoch=0, seq=30),  # a gap
        req(a0, 2, pid=7, epoch=0, seq=10),  # a duplicate of this commit's first batch
        req(a0, 3, pid=7, epoch=0, seq=0),  # a duplicate of the earlier commit
        req(a0, 4, pid=7, epoch=0, seq=20),  # in order again
        req(a0, 5, pid=7, epoch=1, seq=0),  # an epoch bump: the producer starts afresh
        req(a0, 6, pid=7, epoch=1, seq=10),  # in order at the new epoch
        req(a0, 7, pid=7, epoch=0, seq=30),  # the old epoch is fenced
        req(a0, 8, pid=7, epoch=1, seq=0),  # a duplicate at the new epoch
        req(a0, 9, pid=7, epoch=2, seq=10),  # a bump must restart at 0
        req(a0, 10, pid=8, epoch=0, seq=500),  # a producer new to the partition: any sequence
        req(a0, 11, pid=8, epoch=0, seq=510),  # ... then in order
    ])
    oos, fenced = ErrorCode.out_of_order_sequence_number, ErrorCode.invalid_producer_epoch
    assert [(r.errors, r.is_duplicate, r.assigned_base_offset) for r in responses] == [
        (0, False, 10), (oos, False, -1), (0, True, 10), (0, True, 0), (0, False, 20), (0, False, 30),
        (0, False, 40), (fenced, False, -1), (0, True, 30), (oos, False, -1), (0, False, 50), (0, False, 60)]
    described = {p.producer_id: (p.producer_epoch, p.last_sequence) for p in coord.describe_producers(a0)}
    assert described == {7: (1, 19), 8: (0, 519)}
    # The next sequence after Int32.MAX is 0, never 2^31 (not an int32: the commit is refused).
    commit(coord, [seq_req(a0, 0, 0x7FFFFFFF - 9, 0x7FFFFFFF, epoch=3)])
    with pytest.raises(CoordinatorException, match="outside Kafka's int16 / int32"):
        commit(coord, [seq_req(a0, 0, 1 << 31, (1 << 31) + 9, epoch=3)])
    assert commit(coord, [seq_req(a0, 0, 0, 9, epoch=3)])[0][0].errors == 0


def test_a_refused_commit_leaves_producer_state_as_it_was(backend: Backend, clock: Clock) -> None:
    """The PostgreSQL coordinator checks and appends a commit's idempotent batches in memory, in
    place, before its statement (the fast path for in-order batches, the full checks otherwise),
    and puts memory back when the commit does not happen: the ring slot an append overwrote, a
    producer restarted at a new epoch, a producer new to the partition. Here the object key was
    committed before, so the statement writes nothing (SQLite refuses it before any check)."""
    c = backend.open(clock)
    (a0,) = topic(c, partitions=1)
    commit(c, [req(a0, i, pid=7, epoch=0, seq=10 * i) for i in range(5)], key="wal/taken")  # 5 cached: ring full
    for _ in range(2):
        with pytest.raises(CoordinatorException, match="already committed"):
            commit(c, [req(a0, 0, pid=7, epoch=0, seq=50),  # in order: overwrites the slot of seq 0..9
                       req(a0, 1, pid=7, epoch=0, seq=60),
                       req(a0, 2, pid=7, epoch=1, seq=0),  # epoch bump: a fresh producer
                       req(a0, 3, pid=7, epoch=1, seq=10),  # in order on the fresh one
                       req(a0, 4, pid=8, epoch=0, seq=100)], key="wal/taken")  # new to the partition
    responses, _ = commit(c, [req(a0, 0, pid=7, epoch=0, seq=0),  # still cached (its slot is back)
                              req(a0, 1, pid=8, epoch=0, seq=7),  # still unknown: any sequence
                              req(a0, 2, pid=7, epoch=0, seq=50)])  # epoch 0 continues at 50
    assert [(r.errors, r.is_duplicate, r.assigned_base_offset) for r in responses] == [
        (0, True, 0), (0, False, 50), (0, False, 60)]
    c.close()  # the snapshot holds what was kept
    c = backend.open(clock)
    responses, _ = commit(c, [req(a0, 0, pid=7, epoch=0, seq=10), req(a0, 1, pid=7, epoch=0, seq=50),
                              req(a0, 2, pid=8, epoch=0, seq=17), req(a0, 3, pid=7, epoch=0, seq=60)])
    assert [(r.errors, r.is_duplicate, r.assigned_base_offset) for r in responses] == [
        (0, True, 10), (0, True, 60), (0, False, 70), (0, False, 80)]
    c.close()


def test_idempotence_survives_restart(backend: Backend, clock: Clock) -> None:
    c = backend.open(clock)
    (a0,) = topic(c, partitions=1)
    commit(c, [req(a0, 0, pid=7, epoch=0, seq=0), req(a0, 1, pid=7, epoch=0, seq=10)])
    c.close()
    c = backend.open(clock)
    responses, _ = commit(c, [req(a0, 0, pid=7, epoch=0, seq=10), req(a0, 1, pid=7, epoch=0, seq=30)])
    assert (responses[0].is_duplicate, responses[0].assigned_base_offset) == (True, 10)
    assert responses[1].errors == ErrorCode.out_of_order_sequence_number
    c.close()


@pytest.mark.parametrize("how", ["delete_records", "retention"])
def test_idempotence_survives_deleting_the_data(coord: SqliteBatchCoordinator, backend: Backend, how: str) -> None:
    (a0,) = topic(coord, partitions=1)
    commit(coord, [req(a0, 0, pid=7, epoch=0, seq=0), req(a0, 1, pid=7, epoch=0, seq=10)])
    if how == "delete_records":
        assert coord.delete_records([DeleteRecordsRequest(a0, -1)])[0].low_watermark == 20
    else:
        assert coord.enforce_retention([RetentionRequest(a0, 1, -1)], now_ms=T0 + 10_000)[0].deleted_batches == 2
    assert log_of(coord, a0).batch_count == 0
    # A second instance sees only what is on disk, as after a crash (``coord`` never closes first).
    reopened = backend.open()
    responses, _ = commit(reopened, [req(a0, 0, pid=7, epoch=0, seq=10), req(a0, 1, pid=7, epoch=0, seq=30)])
    assert (responses[0].is_duplicate, responses[0].assigned_base_offset) == (True, 10)
    assert responses[1].errors == ErrorCode.out_of_order_sequence_number
    assert commit(reopened, [req(a0, 0, pid=7, epoch=0, seq=20)])[0][0].assigned_base_offset == 20
    reopened.close()


def seq_req(tip: TopicIdPartition, i: int, base_seq: int, last_seq: int, epoch: int = 0) -> CommitBatchRequest:
    """An idempotent batch of 10 records with any sequence numbers, even inconsistent ones."""
    return CommitBatchRequest(i, tip, 1 + 100 * i, 100, 0, 9, T0, 0, 7, epoch, base_seq, last_seq)


@pytest.mark.parametrize("batches, expected", [
    # A batch whose last sequence is below its base, then its retry: a duplicate, though it also
    # starts right after the last cached batch (no shortcut may skip the scan).
    ([(10, 9), (10, 9), (10, 12)], [(0, False, 0), (0, True, 0), (0, False, 10)]),
    ([(5, 9), (10, 4), (5, 9), (6, 9)],
     [(0, False, 0), (0, False, 10), (0, True, 0), (ErrorCode.out_of_order_sequence_number, False, -1)]),
    # Sequences wrap at Int32.MAX; retries on both sides of the wrap are recognised.
    ([(0x7FFFFFFF - 9, 0x7FFFFFFF), (0, 9), (0, 9), (0x7FFFFFFF - 9, 0x7FFFFFFF), (10, 19)],
     [(0, False, 0), (0, False, 10), (0, True, 10), (0, True, 0), (0, False, 20)]),
    # No sequence (-1) accepts anything after it; its retry is a duplicate.
    ([(-1, -1), (-1, -1), (7, 16), (17, 26), (7, 16), (30, 39)],
     [(0, False, 0), (0, True, 0), (0, False, 10), (0, False, 20), (0, True, 10),
      (ErrorCode.out_of_order_sequence_number, False, -1)]),
])
@pytest.mark.parametrize("per_commit", [1, 10])
def test_idempotence_with_unusual_sequences(coord: SqliteBatchCoordinator, batches: list, expected: list,
                                            per_commit: int) -> None:
    """Kafka's checks, exactly, whatever the sequences, one batch per commit or all in one."""
    (a0,) = topic(coord, partitions=1)
    requests = [seq_req(a0, i, b, l) for i, (b, l) in enumerate(batches)]
    responses = []
    for start in range(0, len(requests), per_commit):
        responses += commit(coord, requests[start:start + per_commit])[0]
    assert [(r.errors, r.is_duplicate, r.assigned_base_offset) for r in responses] == expected


@pytest.mark.parametrize("base_seq, last_seq, epoch", [(20, 1 << 31, 0), (20, 1 << 64, 0), (-(1 << 31) - 1, 5, 0),
                                                       (20, 29, 1 << 15)])
def test_sequence_outside_int32_fails_the_commit_and_changes_nothing(backend: Backend, base_seq: int, last_seq: int,
                                                                    epoch: int) -> None:
    """Kafka's sequences are int32 and epochs int16: anything else is a broken request, refused
    whole (as other malformed batches are) before it reaches the producer state or the database."""
    c = backend.open()
    (a0,) = topic(c, partitions=1)
    commit(c, [seq_req(a0, 0, 0, 9)])
    with pytest.raises(CoordinatorException, match="batch 1: producer epoch .* outside Kafka's int16 / int32"):
        commit(c, [seq_req(a0, 0, 10, 19), seq_req(a0, 1, base_seq, last_seq, epoch)])
    c.close()  # writes the producer snapshot: only what was kept
    c = backend.open()
    try:
        responses, _ = commit(c, [seq_req(a0, 0, 10, 19), seq_req(a0, 1, 10, 19), seq_req(a0, 2, 0, 9)])
        assert [(r.errors, r.is_duplicate, r.assigned_base_offset) for r in responses] == [
            (0, False, 10), (0, True, 10), (0, True, 0)]
    finally:
        c.close()


def test_producer_keeps_the_last_five_batches_in_order() -> None:
    entries = [(10 * i, 10 * i + 9, 100 * i, 100 * i + 9, T0 + i) for i in range(8)]
    for n in range(len(entries) + 1):
        producer = _Producer(3, entries[:n])
        assert producer.batches == entries[max(0, n - 5):n]
        assert producer.encode() == b"".join(_ENTRY.pack(*e) for e in entries[max(0, n - 5):n])
        assert _Producer.decode(3, producer.encode()).batches == producer.batches
        assert producer.next_sequence == (10 * n if n else None)
    # A broken chain disables the shortcut until the batch before the break has left the ring.
    producer = _Producer(0, [(0, 9, 0, 9, T0), (20, 29, 10, 19, T0)])
    for i in range(4):
        assert producer.next_sequence is None
        producer.append(30 + 10 * i, 39 + 10 * i, 20 + 10 * i, 29 + 10 * i, T0)
    assert producer.batches[0][:2] == (20, 29) and producer.next_sequence == 70


# -- find_batches ----------------------------------------------------------------------------


def test_find_batches_from_inside_a_batch_and_byte_limits(coord: SqliteBatchCoordinator) -> None:
    a0, a1 = topic(coord)
    _, key = commit(coord, [req(a0, i, size=100, records=10) for i in range(5)] + [req(a1, 5, size=500)])
    (resp,) = coord.find_batches([FindBatchRequest(a0, 15, 250)], 1 << 20)
    assert (resp.errors, resp.log_start_offset, resp.high_watermark) == (0, 0, 50)
    assert [b.metadata.base_offset for b in resp.batches] == [10, 20]  # starts at the batch holding 15
    b = resp.batches[0]
    assert (b.object_key, b.metadata.byte_offset, b.metadata.byte_size, b.metadata.topic_id_partition) == (
        key, 101, 100, a0)
    assert b.metadata.record_count == 10 and b.metadata.timestamp == T0
    # At least one batch even if it exceeds the partition limit.
    assert len(coord.find_batches([FindBatchRequest(a1, 0, 10)], 1 << 20)[0].batches) == 1
    # fetch.max.bytes across partitions (KIP-74): only the first non-empty partition may exceed.
    first, second = coord.find_batches([FindBatchRequest(a0, 0, 1 << 20), FindBatchRequest(a1, 0, 1 << 20)], 150)
    assert len(first.batches) == 1 and second.batches == [] and second.high_watermark == 10
    both = coord.find_batches([FindBatchRequest(a1, 0, 1 << 20), FindBatchRequest(a0, 0, 1 << 20)], 800)
    assert [len(r.batches) for r in both] == [1, 3]


def test_find_batches_over_many_batches(coord: SqliteBatchCoordinator) -> None:
    """A fetch spanning more batches than one read returns (PostgreSQL reads them in chunks)."""
    (a0,) = topic(coord, partitions=1)
    for n in range(3):
        commit(coord, [req(a0, i, size=10, records=1) for i in range(400)])
    (everything,) = coord.find_batches([FindBatchRequest(a0, 0, 1 << 30)], 1 << 30)
    assert [b.metadata.base_offset for b in everything.batches] == list(range(1200))
    (limited,) = coord.find_batches([FindBatchRequest(a0, 150, 6_505)], 1 << 30)
    assert [b.metadata.base_offset for b in limited.batches] == list(range(150, 800))
    (rest,) = coord.find_batches([FindBatchRequest(a0, 1150, 1 << 20)], 1 << 30)
    assert [b.metadata.base_offset for b in rest.batches] == list(range(1150, 1200))


def test_find_batches_edges(coord: SqliteBatchCoordinator) -> None:
    (a0,) = topic(coord, partitions=1)
    ghost = TopicIdPartition(uuid.uuid4(), "ghost", 0)
    commit(coord, [req(a0, i) for i in range(3)])
    coord.delete_records([DeleteRecordsRequest(a0, 12)])
    at_end, past, before, unknown, from_start = coord.find_batches([
        FindBatchRequest(a0, 30, 1000), FindBatchRequest(a0, 31, 1000), FindBatchRequest(a0, 11, 1000),
        FindBatchRequest(ghost, 0, 1000), FindBatchRequest(a0, 12, 1000)], 1 << 20)
    assert (at_end.errors, at_end.batches, at_end.high_watermark) == (0, [], 30)
    assert (past.errors, past.log_start_offset, past.high_watermark) == (ErrorCode.offset_out_of_range, 12, 30)
    assert before.errors == ErrorCode.offset_out_of_range
    assert (unknown.errors, unknown.log_start_offset, unknown.high_watermark) == (ErrorCode.unknown_topic_or_partition, -1, -1)
    assert [b.metadata.base_offset for b in from_start.batches] == [10, 20]


# -- list_offsets ----------------------------------------------------------------------------


def test_list_offsets(coord: SqliteBatchCoordinator, clock: Clock) -> None:
    a0, a1 = topic(coord)
    ghost = TopicIdPartition(uuid.uuid4(), "ghost", 0)
    commit(coord, [req(a0, 0, ts=T0 - 300), req(a0, 1, ts=T0 - 100), req(a0, 2, ts=T0 - 200),
                   req(a0, 3, ts=T0 - 100)])
    clock.now = T0 + 50
    commit(coord, [req(a0, 0, ts=5, ts_type=TimestampType.LOG_APPEND_TIME)])  # reports its append time

    def ask(tip: TopicIdPartition, ts: int) -> tuple[int, int, int]:
        r = coord.list_offsets([ListOffsetsRequest(tip, ts)])[0]
        assert r.topic_id_partition == tip
        return r.errors, r.timestamp, r.offset

    assert ask(a0, ListOffsetsRequest.EARLIEST_TIMESTAMP) == (0, -1, 0)
    assert ask(a0, ListOffsetsRequest.EARLIEST_LOCAL_TIMESTAMP) == (0, -1, 0)
    assert ask(a0, ListOffsetsRequest.LATEST_TIMESTAMP) == (0, -1, 50)
    assert ask(a0, ListOffsetsRequest.LATEST_TIERED_TIMESTAMP) == (0, -1, -1)
    assert ask(a0, ListOffsetsRequest.MAX_TIMESTAMP) == (0, T0 + 50, 49)
    assert ask(a0, T0 - 250) == (0, T0 - 100, 10)  # first batch whose max timestamp reaches it
    assert ask(a0, T0 - 100) == (0, T0 - 100, 10)
    assert ask(a0, T0) == (0, T0 + 50, 40)
    assert ask(a0, T0 + 51) == (0, -1, -1)
    assert ask(a1, ListOffsetsRequest.MAX_TIMESTAMP) == (0, -1, -1)
    assert ask(a1, T0) == (0, -1, -1)
    assert ask(ghost, ListOffsetsRequest.LATEST_TIMESTAMP) == (ErrorCode.unknown_topic_or_partition, -1, -1)
    coord.delete_records([DeleteRecordsRequest(a0, 15)])
    assert ask(a0, ListOffsetsRequest.EARLIEST_TIMESTAMP) == (0, -1, 15)
    assert ask(a0, T0 - 1000) == (0, T0 - 100, 15)  # never before the log start


# -- delete_records / delete_topics / files ---------------------------------------------------


def test_delete_records(coord: SqliteBatchCoordinator, clock: Clock) -> None:
    a0, a1 = topic(coord)
    ghost = TopicIdPartition(uuid.uuid4(), "ghost", 0)
    _, key1 = commit(coord, [req(a0, 0), req(a0, 1)])
    _, key2 = commit(coord, [req(a0, 0), req(a1, 1)])
    clock.now = T0 + 7
    mid, beyond, negative, unknown = coord.delete_records([
        DeleteRecordsRequest(a0, 15), DeleteRecordsRequest(a1, 11), DeleteRecordsRequest(a1, -5),
        DeleteRecordsRequest(ghost, 0)])
    assert (mid.errors, mid.low_watermark) == (0, 15)
    assert (beyond.errors, beyond.low_watermark) == (ErrorCode.offset_out_of_range, -1)
    assert negative.errors == ErrorCode.offset_out_of_range
    assert unknown.errors == ErrorCode.unknown_topic_or_partition
    log = log_of(coord, a0)
    assert (log.log_start_offset, log.batch_count, log.byte_size) == (15, 2, 200)
    assert file_of(coord, key1).used_size == 100
    assert coord.delete_records([DeleteRecordsRequest(a0, 3)])[0].low_watermark == 15  # never backwards
    (up_to_hwm,) = coord.delete_records([DeleteRecordsRequest(a0, -1)])
    assert up_to_hwm.low_watermark == 30
    f1, f2 = file_of(coord, key1), file_of(coord, key2)
    assert (f1.state, f1.used_size, f1.marked_for_deletion_at_ms, f1.partitions) == ("deleting", 0, T0 + 7, [])
    assert (f2.state, f2.used_size, f2.partitions) == ("uploaded", 100, [a1])
    (after,) = commit(coord, [req(a0)])[0]  # a commit answers the log start offset it found
    assert (after.assigned_base_offset, after.log_start_offset) == (30, 30)


def test_delete_topics_and_file_lifecycle(coord: SqliteBatchCoordinator, clock: Clock) -> None:
    a0, a1 = topic(coord, "orders")
    (b0,) = topic(coord, "audit", 1)
    _, shared = commit(coord, [req(a0, 0), req(b0, 1)])
    _, only_a = commit(coord, [req(a1, 0)])
    clock.now = T0 + 99
    coord.delete_topics({a0.topic_id, uuid.uuid4()})  # unknown ids are ignored
    assert coord.describe_logs([a0.topic_id]) == []
    assert [i.topic_id_partition for i in coord.describe_logs()] == [b0]
    assert file_of(coord, shared).used_size == 100
    assert [(f.object_key, f.marked_for_deletion_at_ms) for f in coord.get_files_to_delete()] == [(only_a, T0 + 99)]
    assert coord.is_safe_to_delete_file(only_a)
    assert not coord.is_safe_to_delete_file(shared)
    assert coord.is_safe_to_delete_file("wal/never-heard-of")
    assert [r.errors for r in coord.commit_file("wal/late", 1, 200, [req(a0), req(b0)])] == [
        ErrorCode.unknown_topic_or_partition, 0]
    coord.delete_files(DeleteFilesRequest([only_a, shared, "wal/unknown"]))  # live 'shared' must stay
    assert coord.known_object_keys() == {shared, "wal/late"}
    assert coord.get_files_to_delete() == []


def test_delete_partitions(coord: SqliteBatchCoordinator, clock: Clock) -> None:
    a0, a1, a2, a3 = topic(coord, partitions=4)
    _, mixed = commit(coord, [req(a0, 0), req(a2, 1), req(a3, 2, pid=5, epoch=0, seq=0)])
    _, dropped_only = commit(coord, [req(a2, 0), req(a3, 1)])
    clock.now = T0 + 5
    assert coord.delete_partitions(a0.topic_id, {2, 3, 7}) == 4
    assert [i.topic_id_partition.partition for i in coord.describe_logs([a0.topic_id])] == [0, 1]
    assert (file_of(coord, mixed).used_size, file_of(coord, mixed).state) == (100, "uploaded")
    assert (file_of(coord, dropped_only).state, file_of(coord, dropped_only).marked_for_deletion_at_ms) == (
        "deleting", T0 + 5)
    assert commit(coord, [req(a2)])[0][0].errors == ErrorCode.unknown_topic_or_partition
    # Adding the partitions back (KIP-694 re-increase) starts fresh logs, with no producer state.
    coord.create_topic_and_partitions([CreateTopicAndPartitionsRequest(a0.topic_id, "orders", 4)])
    responses, _ = commit(coord, [req(a3, 0, pid=5, epoch=0, seq=0)])
    assert (responses[0].assigned_base_offset, responses[0].is_duplicate) == (0, False)


# -- retention -------------------------------------------------------------------------------


def test_retention_by_time_stops_at_first_young_batch(coord: SqliteBatchCoordinator) -> None:
    a0, a1 = topic(coord)
    ghost = TopicIdPartition(uuid.uuid4(), "ghost", 0)
    _, key = commit(coord, [req(a0, 0, ts=T0 - 5000), req(a0, 1, ts=T0 - 4000), req(a0, 2, ts=T0),
                            req(a0, 3, ts=T0 - 4000), req(a1, 4, ts=T0 - 9000)])
    now = T0 + 1000
    r0, r1, r_ghost = coord.enforce_retention(
        [RetentionRequest(a0, 3000, -1), (a1, -1, -1), RetentionRequest(ghost, 1, 1)], now_ms=now)
    assert (r0.errors, r0.log_start_offset, r0.deleted_batches, r0.deleted_bytes) == (0, 20, 2, 200)
    assert (r1.deleted_batches, r1.log_start_offset) == (0, 0)  # -1/-1: keep forever
    assert r_ghost.errors == ErrorCode.unknown_topic_or_partition
    assert log_of(coord, a0).log_start_offset == 20
    assert file_of(coord, key).used_size == 300


def test_retention_by_bytes_keeps_at_least_retention_bytes(coord: SqliteBatchCoordinator) -> None:
    (a0,) = topic(coord, partitions=1)
    _, key = commit(coord, [req(a0, i, size=100) for i in range(10)])
    (r,) = coord.enforce_retention([RetentionRequest(a0, -1, 350)], now_ms=T0)
    # Kafka deletes from the front only while what stays is still >= retention.bytes.
    assert (r.deleted_batches, r.deleted_bytes, r.log_start_offset) == (6, 600, 60)
    assert log_of(coord, a0).byte_size == 400
    assert coord.enforce_retention([RetentionRequest(a0, -1, 400)], now_ms=T0)[0].deleted_batches == 0
    (everything,) = coord.enforce_retention([RetentionRequest(a0, 0, -1)], now_ms=T0 + 1)
    assert (everything.deleted_batches, everything.log_start_offset) == (4, 100)
    assert file_of(coord, key).state == "deleting"
    assert commit(coord, [req(a0)])[0][0].assigned_base_offset == 100


# -- inspection ------------------------------------------------------------------------------


def test_describe_files_filters_and_batches_in_file(coord: SqliteBatchCoordinator) -> None:
    a0, a1 = topic(coord, "orders")
    (b0,) = topic(coord, "audit", 1)
    _, k1 = commit(coord, [req(a1, 0), req(a0, 1, pid=3, epoch=1, seq=0)])
    _, k2 = commit(coord, [req(b0, 0)])
    coord.delete_records([DeleteRecordsRequest(b0, -1)])
    assert [f.object_key for f in coord.describe_files()] == [k1, k2]
    assert [f.object_key for f in coord.describe_files(state="deleting")] == [k2]
    assert [f.object_key for f in coord.describe_files(state="uploaded", topic_id=a0.topic_id)] == [k1]
    assert [f.object_key for f in coord.describe_files(topic_id=b0.topic_id)] == [k2]  # had batches there
    assert coord.describe_files(object_key="nope") == []
    with pytest.raises(CoordinatorException, match="unknown file state"):
        coord.describe_files(state="gone")
    batches = coord.batches_in_file(k1)
    assert [(b.metadata.topic_id_partition, b.metadata.byte_offset) for b in batches] == [(a1, 1), (a0, 101)]
    assert (batches[1].metadata.producer_id, batches[1].metadata.producer_epoch,
            batches[1].metadata.base_sequence, batches[1].metadata.last_sequence) == (3, 1, 0, 9)
    assert len({b.batch_id for b in batches}) == 2
    assert coord.batches_in_file(k2) == [] and coord.batches_in_file("nope") == []


def test_topic_storage_dead_bytes(coord: SqliteBatchCoordinator) -> None:
    (a0,) = topic(coord, "orders", 1)
    (b0,) = topic(coord, "audit", 1)
    (c0,) = topic(coord, "idle", 1)
    _, shared = commit(coord, [req(a0, 0, size=100), req(b0, 1, size=300, pos=101)])  # 401 bytes
    _, a_only = commit(coord, [req(a0, 0, size=50)])  # 51 bytes
    coord.delete_records([DeleteRecordsRequest(b0, -1)])
    info = {i.topic: i for i in coord.describe_topic_storage()}
    assert (info["orders"].live_bytes, info["orders"].file_count, info["orders"].files_size) == (150, 2, 452)
    assert (info["orders"].dead_file_count, info["orders"].dead_files_size) == (0, 0)
    # audit's batches are gone but the object they were in is kept alive by orders.
    assert (info["audit"].live_bytes, info["audit"].file_count, info["audit"].dead_files_size) == (0, 0, 401)
    assert (info["idle"].live_bytes, info["idle"].files_size) == (0, 0)
    coord.delete_topics([a0.topic_id])
    after = {i.topic: i for i in coord.describe_topic_storage()}
    assert (after["orders"].dead_file_count, after["orders"].dead_files_size) == (2, 452)
    coord.delete_files(DeleteFilesRequest([shared, a_only]))
    assert [i.topic for i in coord.describe_topic_storage()] == ["audit", "idle"]
    assert [i.topic for i in coord.describe_topic_storage([b0.topic_id])] == ["audit"]


# -- durability, concurrency, configuration ----------------------------------------------------


def test_state_survives_close_and_reopen(backend: Backend, clock: Clock) -> None:
    c = backend.open(clock)
    a0, a1 = topic(c)
    _, key = commit(c, [req(a0, 0), req(a1, 1)])
    c.delete_records([DeleteRecordsRequest(a0, 5)])
    before = (c.describe_logs(), c.describe_files(), c.batches_in_file(key))
    c.close()
    with pytest.raises(CoordinatorException, match="not open"):
        c.describe_logs()
    c = backend.open(clock)
    assert (c.describe_logs(), c.describe_files(), c.batches_in_file(key)) == before
    assert commit(c, [req(a0)])[0][0].assigned_base_offset == 10
    c.close()


def test_commit_is_durable_without_close(tmp_path: Path) -> None:
    """A process that commits and dies without closing: the commit must be there."""
    db = tmp_path / "c.db"
    script = f"""
import os, sys, uuid
sys.path.insert(0, {str(ROOT)!r})
from plugins.coordinator.base import CommitBatchRequest, CreateTopicAndPartitionsRequest, TopicIdPartition
from plugins.coordinator.sqlite import SqliteBatchCoordinator
c = SqliteBatchCoordinator({str(db)!r})
tid = uuid.UUID("00000000-0000-4000-8000-000000000001")
c.create_topic_and_partitions([CreateTopicAndPartitionsRequest(tid, "t", 1)])
r = c.commit_file("wal/x", 1, 101, [CommitBatchRequest(0, TopicIdPartition(tid, "t", 0), 1, 100, 0, 9, 0, 0)])
print(r[0].assigned_base_offset, flush=True)
os._exit(0)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"
    c = SqliteBatchCoordinator(db)
    (log,) = c.describe_logs()
    assert (log.high_watermark, log.batch_count) == (10, 1)
    assert c.known_object_keys() == {"wal/x"}
    c.close()


def test_producer_state_recovers_from_snapshot_and_replay_after_a_crash(tmp_path: Path) -> None:
    """Idempotence state is snapshotted at most once a minute; a crash loses nothing because
    the batches committed after the snapshot are replayed on open."""
    db = tmp_path / "c.db"
    script = f"""
import os, sys, uuid
sys.path.insert(0, {str(ROOT)!r})
from plugins.coordinator.base import CommitBatchRequest, CreateTopicAndPartitionsRequest, TopicIdPartition
from plugins.coordinator.sqlite import SqliteBatchCoordinator
now = [{T0}]
c = SqliteBatchCoordinator({str(db)!r}, clock=lambda: now[0])
tid = uuid.UUID("00000000-0000-4000-8000-000000000001")
tip = TopicIdPartition(tid, "t", 0)
c.create_topic_and_partitions([CreateTopicAndPartitionsRequest(tid, "t", 1)])
def commit(seq):
    r = c.commit_file(f"wal/{{seq}}", 1, 101, [CommitBatchRequest(0, tip, 1, 100, 0, 9, 0, 0, 7, 0, seq, seq + 9)])
    assert r[0].errors == 0 and not r[0].is_duplicate
for seq in (0, 10, 20):
    commit(seq)
now[0] += 61_000  # the next commit also writes a snapshot
commit(30)
now[0] += 1_000
commit(40)  # only in the batches table: must be replayed
os._exit(0)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    raw = sqlite3.connect(db)
    assert raw.execute("SELECT producer_id, producer_epoch FROM producer_state").fetchall() == [(7, 0)]
    assert raw.execute("SELECT value FROM kcli_meta WHERE key = 'producer_snapshot_batch_id'").fetchone() == ("4",)
    raw.close()
    c = SqliteBatchCoordinator(db)
    (tip,) = [i.topic_id_partition for i in c.describe_logs()]
    responses, _ = commit(c, [req(tip, 0, pid=7, epoch=0, seq=0), req(tip, 1, pid=7, epoch=0, seq=40),
                              req(tip, 2, pid=7, epoch=0, seq=60), req(tip, 3, pid=7, epoch=0, seq=50)])
    assert [(r.errors, r.is_duplicate, r.assigned_base_offset) for r in responses] == [
        (0, True, 0), (0, True, 40), (ErrorCode.out_of_order_sequence_number, False, -1), (0, False, 50)]
    c.close()


def test_checkpointer_restarts_the_wal_under_back_to_back_commits(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """SQLite restarts the WAL only when a commit begins with all of it checkpointed, which never
    happens by itself while commits follow each other: the checkpointer makes it happen, so the
    WAL file stops growing."""
    monkeypatch.setattr(_Checkpointer, "RESTART_FRAMES", 64)
    monkeypatch.setattr(_Checkpointer, "MIN_INTERVAL_S", 0.001)
    c = SqliteBatchCoordinator(tmp_path / "c.db")
    c._conn().execute("PRAGMA wal_autocheckpoint=0")  # no fallback: only the checkpointer bounds the WAL
    tips = topic(c, partitions=20)
    wal_sizes = []
    for _ in range(150):  # each commit dirties >= 20 pages (one per log), >= 12 MiB in all
        commit(c, [req(tips[i % 20], i, size=100) for i in range(200)])
        wal_sizes.append((tmp_path / "c.db-wal").stat().st_size)
    assert max(wal_sizes) < 4 << 20, wal_sizes[::10]
    assert [log.high_watermark for log in c.describe_logs()] == [15_000] * 20
    c.close()
    c = SqliteBatchCoordinator(tmp_path / "c.db")
    assert [(log.high_watermark, log.batch_count) for log in c.describe_logs()] == [(15_000, 1500)] * 20
    c.close()


def test_close_while_the_checkpointer_waits_for_the_lock(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(_Checkpointer, "RESTART_FRAMES", 1)
    c = SqliteBatchCoordinator(tmp_path / "c.db")
    (a0,) = topic(c, partitions=1)
    closed = threading.Event()

    def run() -> None:
        with c._lock:  # as configure() does: close() with the lock held
            commit(c, [req(a0)])  # wakes the checkpointer, which then wants the lock
            time.sleep(0.2)
            c.close()
        closed.set()

    threading.Thread(target=run, daemon=True).start()
    assert closed.wait(10), "close() deadlocked with the checkpointer"


def test_database_settings(sqlite_coord: SqliteBatchCoordinator, db_path: Path) -> None:
    raw = sqlite3.connect(db_path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"logs", "files", "batches", "producer_state", "file_topics", "file_logs"} <= tables
    assert raw.execute("SELECT value FROM kcli_meta WHERE key = 'schema_version'").fetchone() == (str(SCHEMA_VERSION),)
    # Batches are clustered by (log_id, last_offset): a fetch is one primary-key range scan.
    plan = " ".join(str(r) for r in raw.execute(
        "EXPLAIN QUERY PLAN SELECT * FROM batches WHERE log_id = ? AND last_offset >= ? ORDER BY last_offset", (1, 5)))
    assert "PRIMARY KEY" in plan and "SCAN" not in plan and "TEMP B-TREE" not in plan
    # No secondary index on batches: an object's batches are found through file_logs.
    assert raw.execute("SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'batches'"
                       " AND sql IS NOT NULL").fetchone() == (0,)
    plan = " ".join(str(r) for r in raw.execute(
        "EXPLAIN QUERY PLAN SELECT b.* FROM file_logs fl JOIN batches b ON b.log_id = fl.log_id"
        " AND b.last_offset BETWEEN fl.min_last_offset AND fl.max_last_offset AND b.file_id = fl.file_id"
        " WHERE fl.file_id = ?", (1,)))
    assert "SCAN" not in plan
    raw.close()


def test_concurrent_commits_from_threads_stay_gapless(coord: SqliteBatchCoordinator) -> None:
    (a0,) = topic(coord, partitions=1)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                commit(coord, [req(a0, i, records=3) for i in range(5)])
                coord.find_batches([FindBatchRequest(a0, 0, 1000)], 1000)
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    batches = coord.find_batches([FindBatchRequest(a0, 0, 1 << 30)], 1 << 30)[0].batches
    assert [b.metadata.base_offset for b in batches] == list(range(0, 4 * 20 * 5 * 3, 3))


def test_two_instances_on_one_file_do_not_trust_stale_caches(backend: Backend) -> None:
    first = backend.open()
    (a0,) = topic(first, partitions=1)
    commit(first, [req(a0, 0, pid=1, epoch=0, seq=0)])
    second = backend.open()
    assert commit(second, [req(a0, 0, pid=1, epoch=0, seq=10)])[0][0].assigned_base_offset == 10
    # first's cached high watermark (10) and producer state are stale now.
    responses, _ = commit(first, [req(a0, 0, pid=1, epoch=0, seq=10), req(a0, 1)])
    assert (responses[0].is_duplicate, responses[0].assigned_base_offset) == (True, 10)
    assert responses[1].assigned_base_offset == 20
    first.close()
    second.close()


def test_read_only_open(db_path: Path, tmp_path: Path) -> None:
    with pytest.raises(CoordinatorException, match="does not exist"):
        SqliteBatchCoordinator(tmp_path / "missing.db", read_only=True)
    assert not (tmp_path / "missing.db").exists()
    writer = SqliteBatchCoordinator(db_path)
    (a0,) = topic(writer, partitions=1)
    reader = open_coordinator(db_path.as_uri().replace("file:", "sqlite:"), read_only=True)
    commit(writer, [req(a0)])
    assert [i.high_watermark for i in reader.describe_logs()] == [10]  # sees the writer's commits
    with pytest.raises(CoordinatorException, match="readonly"):
        commit(reader, [req(a0)])
    reader.close()
    writer.close()


def test_not_a_coordinator_database(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(CoordinatorException, match="not a usable coordinator database") as info:
        SqliteBatchCoordinator(garbage)
    assert "\n" not in str(info.value)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(CoordinatorException, match="no schema version"):
        SqliteBatchCoordinator(other, read_only=True)


def test_loader_and_configure(tmp_path: Path) -> None:
    cls = load_class("plugins.coordinator.sqlite.SqliteBatchCoordinator", BatchCoordinator)
    c = cls()
    with pytest.raises(CoordinatorException, match="not open"):
        c.describe_logs()
    with pytest.raises(CoordinatorException, match="needs config path"):
        c.configure({})
    with pytest.raises(CoordinatorException, match="unknown SqliteBatchCoordinator config"):
        c.configure({"path": str(tmp_path / "c.db"), "url": "x"})
    c.configure({"path": str(tmp_path / "sub" / "c.db")})
    assert c.describe_logs() == [] and (tmp_path / "sub" / "c.db").exists()
    c.close()
    with pytest.raises(PluginError, match="is not a plugins.coordinator.base.BatchCoordinator"):
        load_class("plugins.objectstore.local.LocalObjectStorage", BatchCoordinator)


@pytest.mark.parametrize("uri", ["mysql://x/y", "postgresql:///no-host", "sqlite://host/x.db", "sqlite:relative.db", "/abs/x.db", "sqlite:///"])
def test_open_coordinator_rejects(uri: str) -> None:
    with pytest.raises(CoordinatorException, match="coordinator URI"):
        open_coordinator(uri)


# -- property: random operation sequences keep the invariants ---------------------------------


def check_invariants(c: SqliteBatchCoordinator) -> None:
    raw = sqlite3.connect(c.path)
    try:
        for log_id, lso, hwm, size in raw.execute(
            "SELECT log_id, log_start_offset, high_watermark, byte_size FROM logs"
        ):
            rows = raw.execute(
                "SELECT base_offset, last_offset, byte_size FROM batches WHERE log_id = ? ORDER BY last_offset",
                (log_id,)).fetchall()
            assert size == sum(r[2] for r in rows)
            for prev, nxt in zip(rows, rows[1:]):
                assert nxt[0] == prev[1] + 1, "offsets must be gapless"
            if rows:
                assert rows[-1][1] == hwm - 1
                assert rows[0][0] <= lso <= rows[0][1]
            else:
                assert lso == hwm
        for used, live in raw.execute(
            "SELECT f.used_size, (SELECT COALESCE(SUM(b.byte_size), 0) FROM batches b WHERE b.file_id = f.file_id)"
            " FROM files f"
        ):
            assert used == live, "used_size must equal the live batch bytes"
        assert raw.execute("SELECT COUNT(*) FROM files WHERE used_size = 0 AND state = 'uploaded'").fetchone()[0] == 0
        # batches carry no FOREIGN KEY clauses (their checks cost ~15% of a commit): the code keeps them valid.
        assert raw.execute(
            "SELECT COUNT(*) FROM batches b WHERE NOT EXISTS (SELECT 1 FROM files f WHERE f.file_id = b.file_id)"
            " OR NOT EXISTS (SELECT 1 FROM logs l WHERE l.log_id = b.log_id)"
        ).fetchone()[0] == 0
        # Every batch lies in its object's file_logs range for its log (how objects find their batches).
        assert raw.execute(
            "SELECT COUNT(*) FROM batches b WHERE NOT EXISTS (SELECT 1 FROM file_logs fl WHERE fl.file_id = b.file_id"
            " AND fl.log_id = b.log_id AND b.last_offset BETWEEN fl.min_last_offset AND fl.max_last_offset)"
        ).fetchone()[0] == 0
        assert raw.execute(
            "SELECT COUNT(*) FROM file_topics ft WHERE live_bytes != (SELECT COALESCE(SUM(b.byte_size), 0)"
            " FROM batches b JOIN logs l ON l.log_id = b.log_id WHERE b.file_id = ft.file_id AND l.topic_id = ft.topic_id)"
        ).fetchone()[0] == 0
        # Batch ids are unique and below the counter the next commit starts from.
        count, distinct, top = raw.execute("SELECT COUNT(*), COUNT(DISTINCT batch_id), MAX(batch_id) FROM batches").fetchone()
        assert count == distinct
        floor = raw.execute("SELECT value FROM kcli_meta WHERE key = 'next_batch_id'").fetchone()
        newest = raw.execute("SELECT next_batch_id FROM files ORDER BY file_id DESC LIMIT 1").fetchone()
        assert top is None or top < max(int(floor[0]) if floor else 1, newest[0] if newest else 1)
    finally:
        raw.close()


operation = st.one_of(
    st.tuples(st.just("commit"), st.lists(st.tuples(st.integers(0, 2), st.integers(1, 5), st.integers(1, 300),
                                                    st.sampled_from([-1, -1, 3, 4]), st.booleans()),
                                          min_size=0, max_size=8)),
    st.tuples(st.just("delete_records"), st.integers(0, 2), st.integers(-1, 60)),
    st.tuples(st.just("retention"), st.integers(0, 2), st.integers(-1, 400)),
    st.tuples(st.just("delete_partition"), st.integers(0, 2)),
    st.tuples(st.just("recreate"), st.just(3)),
    st.tuples(st.just("gc"), st.just(0)),
    st.tuples(st.just("reopen"), st.just(0)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operation, min_size=1, max_size=25))
def test_random_operations_keep_offsets_gapless_and_sizes_consistent(ops: list) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "c.db")
        c = SqliteBatchCoordinator(path)
        tid = uuid.uuid4()
        c.create_topic_and_partitions([CreateTopicAndPartitionsRequest(tid, "p", 3)])
        tips = [TopicIdPartition(tid, "p", p) for p in range(3)]
        sequences: dict[tuple[int, int], int] = {}  # (partition, producer id) → next sequence
        for op in ops:
            kind = op[0]
            if kind == "commit":
                position = 1
                requests = []
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
            elif kind == "recreate":
                c.create_topic_and_partitions([CreateTopicAndPartitionsRequest(tid, "p", op[1])])
            elif kind == "gc":
                doomed = [f.object_key for f in c.get_files_to_delete()]
                assert all(c.is_safe_to_delete_file(k) for k in doomed)
                c.delete_files(DeleteFilesRequest(doomed))
            elif kind == "reopen":
                c.close()
                c = SqliteBatchCoordinator(path)
            check_invariants(c)
        c.close()


# -- schema migration ----------------------------------------------------------------------------

# Schema version 1 exactly as kcli wrote it (batches keyed by an AUTOINCREMENT id, topic ids per row).
SCHEMA_V1 = """
CREATE TABLE kcli_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE logs (
    topic_id TEXT NOT NULL, partition INTEGER NOT NULL, topic_name TEXT NOT NULL,
    log_start_offset INTEGER NOT NULL DEFAULT 0, high_watermark INTEGER NOT NULL DEFAULT 0,
    byte_size INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (topic_id, partition)) WITHOUT ROWID;
CREATE TABLE files (
    file_id INTEGER PRIMARY KEY, object_key TEXT NOT NULL UNIQUE, uploader INTEGER NOT NULL,
    file_size INTEGER NOT NULL, used_size INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('uploaded', 'deleting')), committed_at INTEGER NOT NULL,
    marked_for_deletion_at INTEGER);
CREATE INDEX files_by_state ON files (state, marked_for_deletion_at);
CREATE TABLE batches (
    batch_id INTEGER PRIMARY KEY AUTOINCREMENT, topic_id TEXT NOT NULL, partition INTEGER NOT NULL,
    base_offset INTEGER NOT NULL, last_offset INTEGER NOT NULL, file_id INTEGER NOT NULL,
    byte_offset INTEGER NOT NULL, byte_size INTEGER NOT NULL, log_append_time INTEGER NOT NULL,
    batch_max_timestamp INTEGER NOT NULL, timestamp_type INTEGER NOT NULL, producer_id INTEGER NOT NULL,
    producer_epoch INTEGER NOT NULL, base_sequence INTEGER NOT NULL, last_sequence INTEGER NOT NULL);
CREATE UNIQUE INDEX batches_by_log ON batches (topic_id, partition, last_offset);
CREATE INDEX batches_by_file ON batches (file_id, byte_offset);
CREATE TABLE file_topics (
    file_id INTEGER NOT NULL REFERENCES files (file_id) ON DELETE CASCADE, topic_id TEXT NOT NULL,
    topic_name TEXT NOT NULL, committed_bytes INTEGER NOT NULL, live_bytes INTEGER NOT NULL,
    PRIMARY KEY (file_id, topic_id)) WITHOUT ROWID;
CREATE INDEX file_topics_by_topic ON file_topics (topic_id);
CREATE TABLE producer_state (
    topic_id TEXT NOT NULL, partition INTEGER NOT NULL, producer_id INTEGER NOT NULL,
    producer_epoch INTEGER NOT NULL, batches BLOB NOT NULL, PRIMARY KEY (topic_id, partition, producer_id),
    FOREIGN KEY (topic_id, partition) REFERENCES logs (topic_id, partition) ON DELETE CASCADE) WITHOUT ROWID;
INSERT INTO kcli_meta VALUES ('schema_version', '1');
"""
ORDERS = uuid.UUID("00000000-0000-4000-8000-00000000000a")
AUDIT = uuid.UUID("00000000-0000-4000-8000-00000000000b")


def write_v1_database(path: Path) -> None:
    """A version-1 database as a broker leaves it: two objects with batches (one idempotent
    producer, replayed after its snapshot), a deleted batch id, a garbage object, retention."""
    o, a = str(ORDERS), str(AUDIT)
    raw = sqlite3.connect(path)
    raw.executescript(SCHEMA_V1)
    raw.executemany("INSERT INTO logs VALUES (?, ?, ?, ?, ?, ?)", [
        (o, 0, "orders", 0, 30, 400), (o, 1, "orders", 0, 5, 50), (a, 0, "audit", 10, 10, 0)])
    raw.executemany("INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [
        (1, "wal/one", 1, 401, 150, "uploaded", T0, None),
        (2, "wal/two", 2, 301, 300, "uploaded", T0 + 1000, None),
        (3, "wal/garbage", 1, 50, 0, "deleting", T0 + 2000, T0 + 2000)])
    raw.executemany("INSERT INTO batches VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [
        (1, o, 0, 0, 9, 1, 1, 100, T0, T0 - 5, 0, 7, 0, 0, 9),
        (2, o, 1, 0, 4, 1, 101, 50, T0, T0 - 4, 1, -1, -1, -1, -1),
        # batch 3 (audit, offsets 0-9, in wal/one at 151) was deleted by DeleteRecords
        (4, o, 0, 10, 19, 2, 1, 100, T0 + 1000, T0 - 3, 0, 7, 0, 10, 19),
        (5, o, 0, 20, 29, 2, 101, 200, T0 + 1000, T0 - 2, 0, -1, -1, -1, -1)])
    raw.execute("UPDATE sqlite_sequence SET seq = 9 WHERE name = 'batches'")  # ids 6-9: rolled back
    raw.executemany("INSERT INTO file_topics VALUES (?, ?, ?, ?, ?)", [
        (1, o, "orders", 150, 150), (1, a, "audit", 250, 0), (2, o, "orders", 300, 300), (3, o, "orders", 50, 0)])
    # Snapshot as of batch 1; batch 4 must be replayed from the batches table.
    raw.execute("INSERT INTO producer_state VALUES (?, 0, 7, 0, ?)",
                (o, struct.pack(">iiqqq", 0, 9, 0, 9, T0)))
    raw.execute("INSERT INTO kcli_meta VALUES ('producer_snapshot_batch_id', '1')")
    raw.commit()
    raw.close()


def everything(c: SqliteBatchCoordinator) -> tuple:
    logs = c.describe_logs()
    found = [c.find_batches([FindBatchRequest(i.topic_id_partition, i.log_start_offset, 1 << 20)], 1 << 20)[0]
             for i in logs]
    files = c.describe_files()
    return logs, found, files, [c.batches_in_file(f.object_key) for f in files], c.describe_topic_storage()


def test_version_1_database_is_migrated_on_open(tmp_path: Path) -> None:
    db = tmp_path / "coordinator.db"
    write_v1_database(db)
    orders0, orders1 = TopicIdPartition(ORDERS, "orders", 0), TopicIdPartition(ORDERS, "orders", 1)
    audit0 = TopicIdPartition(AUDIT, "audit", 0)

    # Read-only inspection of the old file works on a migrated copy and leaves the file alone.
    reader = SqliteBatchCoordinator(db, read_only=True)
    seen_by_reader = everything(reader)
    reader.close()
    assert sqlite3.connect(db).execute("SELECT value FROM kcli_meta WHERE key = 'schema_version'").fetchone() == ("1",)

    c = SqliteBatchCoordinator(db, clock=Clock(T0 + 5000))
    state = everything(c)
    assert state == seen_by_reader
    logs, found, files, in_files, storage = state
    assert [(i.topic_id_partition, i.log_start_offset, i.high_watermark, i.batch_count, i.byte_size) for i in logs] == [
        (audit0, 10, 10, 0, 0), (orders0, 0, 30, 3, 400), (orders1, 0, 5, 1, 50)]
    assert found[0].batches == []
    got = [(b.batch_id, b.object_key, b.metadata.topic_id_partition, b.metadata.byte_offset, b.metadata.byte_size,
            b.metadata.base_offset, b.metadata.last_offset, b.metadata.log_append_timestamp,
            b.metadata.batch_max_timestamp, b.metadata.timestamp_type, b.metadata.producer_id,
            b.metadata.producer_epoch, b.metadata.base_sequence, b.metadata.last_sequence)
           for r in found[1:] for b in r.batches]
    assert got == [
        (1, "wal/one", orders0, 1, 100, 0, 9, T0, T0 - 5, 0, 7, 0, 0, 9),
        (4, "wal/two", orders0, 1, 100, 10, 19, T0 + 1000, T0 - 3, 0, 7, 0, 10, 19),
        (5, "wal/two", orders0, 101, 200, 20, 29, T0 + 1000, T0 - 2, 0, -1, -1, -1, -1),
        (2, "wal/one", orders1, 101, 50, 0, 4, T0, T0 - 4, 1, -1, -1, -1, -1)]
    assert [(f.object_key, f.used_size, f.state, f.batch_count, f.partitions) for f in files] == [
        ("wal/one", 150, "uploaded", 2, [orders0, orders1]), ("wal/two", 300, "uploaded", 2, [orders0]),
        ("wal/garbage", 0, "deleting", 0, [])]
    assert [[b.batch_id for b in batches] for batches in in_files] == [[1, 2], [4, 5], []]
    assert {(s.topic, s.live_bytes, s.dead_files_size) for s in storage} == {("orders", 450, 50), ("audit", 0, 401)}
    assert [f.object_key for f in c.get_files_to_delete()] == ["wal/garbage"]
    assert not c.is_safe_to_delete_file("wal/one") and c.is_safe_to_delete_file("wal/garbage")

    # Idempotence state carried over (snapshot + replay of batch 4); new batch ids continue after 9.
    responses, key = commit(c, [req(orders0, 0, pid=7, epoch=0, seq=10), req(orders0, 1, pid=7, epoch=0, seq=20),
                                req(orders0, 2, pid=7, epoch=0, seq=0)])
    assert [(r.errors, r.is_duplicate, r.assigned_base_offset) for r in responses] == [
        (0, True, 10), (0, False, 30), (0, True, 0)]
    assert [b.batch_id for b in c.batches_in_file(key)] == [10]
    c.delete_files(DeleteFilesRequest(["wal/garbage"]))
    check_invariants(c)
    c.close()
    raw = sqlite3.connect(db)
    assert raw.execute("SELECT value FROM kcli_meta WHERE key = 'schema_version'").fetchone() == (str(SCHEMA_VERSION),)
    assert raw.execute("PRAGMA foreign_key_check").fetchall() == []
    assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert "logs" in raw.execute("SELECT sql FROM sqlite_master WHERE name = 'producer_state'").fetchone()[0]
    raw.close()
    # Reopening a migrated database changes nothing.
    again = SqliteBatchCoordinator(db)
    assert [i.high_watermark for i in again.describe_logs()] == [10, 40, 5]
    again.close()


def test_migration_that_would_lose_rows_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "coordinator.db"
    write_v1_database(db)
    raw = sqlite3.connect(db)
    raw.execute("INSERT INTO batches VALUES (20, 'no-such-topic', 0, 0, 0, 1, 300, 1, 0, 0, 0, -1, -1, -1, -1)")
    raw.commit()
    raw.close()
    with pytest.raises(CoordinatorException, match="cannot migrate schema 1 to 2: 1 batches row"):
        SqliteBatchCoordinator(db)
    raw = sqlite3.connect(db)
    assert raw.execute("SELECT value FROM kcli_meta WHERE key = 'schema_version'").fetchone() == ("1",)
    assert raw.execute("SELECT COUNT(*) FROM batches").fetchone() == (5,)
    raw.close()


def test_newer_schema_is_refused(db_path: Path) -> None:
    SqliteBatchCoordinator(db_path).close()
    raw = sqlite3.connect(db_path)
    raw.execute("UPDATE kcli_meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    raw.commit()
    raw.close()
    for read_only in (False, True):
        with pytest.raises(CoordinatorException,
                           match=f"schema version {SCHEMA_VERSION + 1}, this kcli understands {SCHEMA_VERSION}"):
            SqliteBatchCoordinator(db_path, read_only=read_only)


# -- identity and upload intents (docs/reliability.md "Diskless garbage: identity and intents") --


def test_cluster_id_is_claimed_once_and_another_is_refused(backend: Backend) -> None:
    c = backend.open()
    assert c.cluster_id() is None
    c.claim_cluster_id("cluster-A")
    c.claim_cluster_id("cluster-A")  # idempotent
    with pytest.raises(CoordinatorException, match="belongs to cluster cluster-A, not to this broker's cluster B"):
        c.claim_cluster_id("B")
    with pytest.raises(CoordinatorException, match="invalid cluster id"):
        c.claim_cluster_id("")
    c.close()
    reader = backend.open(read_only=True)
    assert reader.cluster_id() == "cluster-A"
    with pytest.raises(CoordinatorException):
        reader.claim_cluster_id("cluster-A")  # inspection tools never write
    reader.close()


def table_rows(backend: Backend, table: str) -> int:
    """Rows of one coordinator table, read with a raw connection."""
    if backend.kind == "sqlite":
        with sqlite3.connect(backend.target) as raw:
            return raw.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    import psycopg

    with psycopg.connect(backend.target, connect_timeout=10) as raw:
        return raw.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def intent_rows(backend: Backend) -> int:
    return table_rows(backend, "upload_intents")


def test_upload_intents_end_with_the_commit_and_are_listed_until_then(coord: SqliteBatchCoordinator,
                                                                      backend: Backend) -> None:
    (tip, _) = topic(coord)
    coord.register_upload_intent("wal/committed", 3, T0)
    coord.register_upload_intent("wal/abandoned", 4, T0 + 1)
    coord.register_upload_intent("wal/never-uploaded", 4, T0 + 2)
    assert [(i.object_key, i.broker_id, i.created_at_ms) for i in coord.list_upload_intents()] == [
        ("wal/committed", 3, T0), ("wal/abandoned", 4, T0 + 1), ("wal/never-uploaded", 4, T0 + 2)]
    commit(coord, [req(tip)], key="wal/committed")
    assert [i.object_key for i in coord.list_upload_intents()] == ["wal/abandoned", "wal/never-uploaded"]
    assert coord.known_object_keys() == {"wal/committed"}
    coord.delete_upload_intents(["wal/abandoned", "wal/never-uploaded", "wal/no-such"])
    assert coord.list_upload_intents() == []
    assert intent_rows(backend) == 0  # nothing left behind for committed objects
    with pytest.raises(CoordinatorException, match="invalid upload intent"):
        coord.register_upload_intent("", 1, T0)


def test_version_2_database_is_migrated_to_3_and_keeps_everything(db_path: Path) -> None:
    c = SqliteBatchCoordinator(db_path, clock=Clock())
    (tip, _) = topic(c)
    _, key = commit(c, [req(tip), req(tip, 1)])
    c.close()
    raw = sqlite3.connect(db_path)  # what kcli with schema 2 left behind
    raw.execute("DROP TABLE upload_intents")
    raw.execute("UPDATE kcli_meta SET value = '2' WHERE key = 'schema_version'")
    raw.commit()
    raw.close()

    reader = SqliteBatchCoordinator(db_path, read_only=True)  # inspects a migrated copy
    assert reader.list_upload_intents() == [] and reader.known_object_keys() == {key}
    reader.close()
    assert sqlite3.connect(db_path).execute(
        "SELECT value FROM kcli_meta WHERE key = 'schema_version'").fetchone() == ("2",)

    c = SqliteBatchCoordinator(db_path)
    assert log_of(c, tip).high_watermark == 20 and c.known_object_keys() == {key}
    assert c.cluster_id() is None  # claimed by the broker's first start (kcli/diskless/identity.py)
    c.register_upload_intent("wal/next", 1, T0)
    assert [i.object_key for i in c.list_upload_intents()] == ["wal/next"]
    c.close()
    assert sqlite3.connect(db_path).execute(
        "SELECT value FROM kcli_meta WHERE key = 'schema_version'").fetchone() == (str(SCHEMA_VERSION),)


def test_listing_is_split_into_orphans_unknown_objects_and_stale_intents() -> None:
    from kcli.diskless.cleaner import classify_listing
    from plugins.coordinator.base import UploadIntent
    from plugins.objectstore.base import ObjectInfo

    now, grace = T0, 60_000
    old = now - 2 * grace

    def obj(key: str, mtime: int) -> ObjectInfo:
        return ObjectInfo(key, 10, mtime)

    listed = [obj("wal/committed", old), obj("wal/orphan", old), obj("wal/unknown", old),
              obj("wal/young-unknown", now), obj("wal/fresh-intent", old), obj("wal/in-flight", old)]
    intents = [UploadIntent("wal/orphan", 1, old), UploadIntent("wal/fresh-intent", 1, now - 10),
               UploadIntent("wal/in-flight", 1, old), UploadIntent("wal/put-failed", 1, old),
               UploadIntent("wal/put-running", 1, now - 10)]
    scan = classify_listing(listed, intents, {"wal/committed"}, {"wal/in-flight"}, now, grace)
    assert scan.orphans == ["wal/orphan"]
    assert scan.unknown == ["wal/unknown"]
    assert scan.stale_intents == ["wal/put-failed"]


# -- log compaction: replace_batches, cleaner checkpoint (both coordinators) ------------------


def _rewrite(b, pos: int, size: int, ts: int | None = None):  # noqa: ANN001, ANN202
    """A rewrite of batch ``b`` placed at ``pos`` of the new object (same offsets)."""
    from plugins.coordinator.base import BatchMetadata

    md = b.metadata
    return BatchMetadata(md.topic_id_partition, pos, size, md.base_offset, md.last_offset, md.log_append_timestamp,
                         md.batch_max_timestamp if ts is None else ts, md.timestamp_type, md.producer_id,
                         md.producer_epoch, md.base_sequence, md.last_sequence)


def _batches(c: BatchCoordinator, tip: TopicIdPartition, offset: int = 0):  # noqa: ANN202
    return c.find_batches([FindBatchRequest(tip, offset, 1 << 30)], 1 << 30)[0].batches


def test_replace_batches_swaps_a_range_keeps_offsets_and_frees_old_objects(coord: BatchCoordinator,
                                                                           clock: Clock) -> None:
    a0, a1 = topic(coord)
    _, key1 = commit(coord, [req(a0, 0), req(a0, 1), req(a1, 2)])  # a0: 0-9, 10-19; a1: 0-9
    _, key2 = commit(coord, [req(a0, 0), req(a0, 1)])  # a0: 20-29, 30-39
    old = _batches(coord, a0)[:3]  # the cleaned range: 0..29; 30-39 stays where it is
    new_key = "wal/compacted-1"
    coord.register_upload_intent(new_key, 1, T0)
    clock.now += 5
    # batch 10-19 vanished (all its records superseded): a gap, as in a cleaned classic segment
    assert coord.replace_batches(a0, old, new_key, 1, 61, [_rewrite(old[0], 1, 30), _rewrite(old[2], 31, 30)],
                                 clock.now) is True
    after = _batches(coord, a0)
    assert [(b.object_key, b.metadata.base_offset, b.metadata.last_offset) for b in after] == [
        (new_key, 0, 9), (new_key, 20, 29), (key2, 30, 39)]
    info = log_of(coord, a0)
    assert (info.log_start_offset, info.high_watermark, info.byte_size, info.batch_count) == (0, 40, 160, 3)
    assert _batches(coord, a0, 12)[0].metadata.base_offset == 20  # a fetch inside the gap gets the next batch
    f1, f2, fn = file_of(coord, key1), file_of(coord, key2), file_of(coord, new_key)
    assert (f1.used_size, f1.state) == (100, "uploaded")  # a1's batch keeps it alive
    assert (f2.used_size, f2.state) == (100, "uploaded")
    assert (fn.used_size, fn.state, fn.file_size, fn.partitions) == (60, "uploaded", 61, [a0])
    assert [b.metadata.base_offset for b in coord.batches_in_file(new_key)] == [0, 20]
    assert coord.list_upload_intents() == []
    assert new_key in coord.known_object_keys()
    # A second pass over everything empties key2 of a0 and key1 stays for a1 only.
    again = _batches(coord, a0)
    coord.register_upload_intent("wal/compacted-2", 1, T0)
    assert coord.replace_batches(a0, again, "wal/compacted-2", 1, 100,
                                 [_rewrite(b, 1 + 30 * i, 30) for i, b in enumerate(again)], clock.now)
    assert {f.object_key for f in coord.get_files_to_delete()} == {new_key, key2}
    assert all(f.marked_for_deletion_at_ms == clock.now for f in coord.get_files_to_delete())
    assert not coord.is_safe_to_delete_file(key1) and coord.is_safe_to_delete_file(key2)
    assert log_of(coord, a0).byte_size == 90
    # offsets and later commits are untouched
    (r,), _ = commit(coord, [req(a0, 0)])
    assert r.assigned_base_offset == 40
    storage = {s.topic: s for s in coord.describe_topic_storage([a0.topic_id])}["orders"]
    assert storage.live_bytes == 100 + 90 + 100  # a1, a0's rewrites, the new commit


def test_replace_batches_refuses_a_changed_range_and_marks_the_new_object(coord: BatchCoordinator,
                                                                          clock: Clock) -> None:
    (a0,) = topic(coord, partitions=1)
    commit(coord, [req(a0, 0), req(a0, 1), req(a0, 2)])
    old = _batches(coord, a0)
    coord.delete_records([DeleteRecordsRequest(a0, 10)])  # retention/DeleteRecords won the race
    coord.register_upload_intent("wal/stale", 1, T0)
    assert coord.replace_batches(a0, old, "wal/stale", 1, 91, [_rewrite(b, 1 + 30 * i, 30) for i, b in enumerate(old)],
                                 clock.now) is False
    assert [(b.metadata.base_offset) for b in _batches(coord, a0, 10)] == [10, 20]  # nothing swapped
    assert {f.object_key for f in coord.get_files_to_delete()} == {"wal/stale"}  # collected like any emptied object
    assert coord.list_upload_intents() == []
    # a range replaced by another compaction meanwhile (batch ids changed) is refused too
    live = _batches(coord, a0, 10)
    coord.register_upload_intent("wal/c1", 1, T0)
    assert coord.replace_batches(a0, live, "wal/c1", 1, 61, [_rewrite(b, 1 + 30 * i, 30) for i, b in enumerate(live)],
                                 clock.now)
    coord.register_upload_intent("wal/c2", 1, T0)
    assert coord.replace_batches(a0, live, "wal/c2", 1, 61, [], clock.now) is False
    assert [b.object_key for b in _batches(coord, a0, 10)] == ["wal/c1", "wal/c1"]


def test_replace_batches_fences_claimed_orphans_and_malformed_rewrites(coord: BatchCoordinator, clock: Clock) -> None:
    (a0,) = topic(coord, partitions=1)
    commit(coord, [req(a0, 0), req(a0, 1)])
    old = _batches(coord, a0)
    coord.register_upload_intent("wal/slow", 1, T0)
    assert coord.claim_orphans({"wal/slow": 61}, clock.now) == ["wal/slow"]
    with pytest.raises(CoordinatorException, match="claimed as an orphan"):
        coord.replace_batches(a0, old, "wal/slow", 1, 61, [_rewrite(old[0], 1, 30)], clock.now)
    coord.register_upload_intent("wal/bad", 1, T0)
    with pytest.raises(CoordinatorException, match="matches no replaced batch"):
        coord.replace_batches(a0, old[:1], "wal/bad", 1, 61, [_rewrite(old[1], 1, 30)], clock.now)
    with pytest.raises(CoordinatorException, match="outside the object"):
        coord.replace_batches(a0, old, "wal/bad", 1, 20, [_rewrite(old[0], 1, 30)], clock.now)
    assert [b.object_key for b in _batches(coord, a0)] == [old[0].object_key] * 2  # nothing changed
    assert [i.object_key for i in coord.list_upload_intents()] == ["wal/bad"]


def test_replace_batches_keeps_idempotence_state(backend: Backend, clock: Clock) -> None:
    coord = backend.open(clock)
    (a0,) = topic(coord, partitions=1)
    commit(coord, [req(a0, 0, pid=7, epoch=0, seq=0), req(a0, 1, pid=7, epoch=0, seq=10)])
    old = _batches(coord, a0)
    coord.register_upload_intent("wal/c", 1, T0)
    assert coord.replace_batches(a0, old, "wal/c", 1, 31, [_rewrite(old[1], 1, 30)], clock.now)
    for c in (coord, backend.open(clock)):  # the live instance and a restarted one
        (dup,), _ = commit(c, [req(a0, 0, pid=7, epoch=0, seq=10)])
        assert (dup.is_duplicate, dup.assigned_base_offset) == (True, 10)
        (nxt,), _ = commit(c, [req(a0, 0, pid=7, epoch=0, seq=30)])
        assert nxt.errors == ErrorCode.out_of_order_sequence_number
    (ok,), _ = commit(coord, [req(a0, 0, pid=7, epoch=0, seq=20)])
    assert (ok.errors, ok.assigned_base_offset) == (0, 20)


def test_cleaner_checkpoint_is_kept_per_log_and_goes_with_it(backend: Backend, clock: Clock) -> None:
    coord = backend.open(clock)
    a0, a1 = topic(coord)
    assert coord.cleaner_checkpoint(a0) is None
    coord.set_cleaner_checkpoint(a0, 40)
    coord.set_cleaner_checkpoint(a0, 50)
    assert (coord.cleaner_checkpoint(a0), coord.cleaner_checkpoint(a1)) == (50, None)
    assert backend.open(clock).cleaner_checkpoint(a0) == 50
    coord.delete_partitions(a0.topic_id, {0})
    coord.create_topic_and_partitions([CreateTopicAndPartitionsRequest(a0.topic_id, a0.topic, 2)])
    assert coord.cleaner_checkpoint(a0) is None  # a re-created log starts dirty
    ghost = TopicIdPartition(uuid.uuid4(), "ghost", 0)
    coord.set_cleaner_checkpoint(ghost, 5)
    assert coord.cleaner_checkpoint(ghost) is None


# -- transactions on diskless partitions (seed 004) ------------------------------------------


def txn_req(tip: TopicIdPartition, i: int, pid: int, epoch: int, seq: int, *, records: int = 10,
            kind: int = TXN_DATA) -> CommitBatchRequest:
    """A transactional batch (seq >= 0) or a marker (kind TXN_COMMIT / TXN_ABORT: one record, no sequence)."""
    if kind in (TXN_COMMIT, TXN_ABORT):
        return CommitBatchRequest(i, tip, 1 + i * 100, 100, 0, 0, T0, 0, pid, epoch, -1, -1, kind)
    r = req(tip, i, records=records, pid=pid, epoch=epoch, seq=seq)
    r.transaction = kind
    return r


def find(c: BatchCoordinator, tip: TopicIdPartition, offset: int = 0, *, committed: bool = False):
    (resp,) = c.find_batches([FindBatchRequest(tip, offset, 1 << 20, read_committed=committed)], 1 << 20)
    return resp


def latest(c: BatchCoordinator, tip: TopicIdPartition, committed: bool) -> int:
    (resp,) = c.list_offsets([ListOffsetsRequest(tip, ListOffsetsRequest.LATEST_TIMESTAMP, committed)])
    return resp.offset


def test_transactions_track_open_and_aborted_ranges_and_the_lso(backend: Backend, clock: Clock) -> None:
    c = backend.open(clock)
    tip, other = topic(c)
    commit(c, [req(tip)])  # 0..9, not transactional
    (r,), _ = commit(c, [txn_req(tip, 0, pid=7, epoch=0, seq=0)])  # 10..19, opens pid 7's transaction
    assert (r.errors, r.assigned_base_offset) == (0, 10)
    plain, committed = find(c, tip), find(c, tip, committed=True)
    assert [b.metadata.base_offset for b in plain.batches] == [0, 10]
    assert (plain.high_watermark, plain.last_stable_offset, plain.aborted_transactions) == (20, 10, [])
    assert [b.metadata.base_offset for b in committed.batches] == [0]  # read_committed stops at the LSO
    assert find(c, tip, 10, committed=True).batches == []
    assert (latest(c, tip, False), latest(c, tip, True)) == (20, 10)
    assert c.describe_producers(tip) == [ProducerInfo(7, 0, 9, T0, 10)]
    assert find(c, other).last_stable_offset == 0  # per partition

    (r,), _ = commit(c, [txn_req(tip, 0, pid=7, epoch=0, seq=-1, kind=TXN_ABORT)])  # marker at 20
    assert (r.errors, r.assigned_base_offset) == (0, 20)
    resp = find(c, tip, committed=True)
    assert [b.metadata.base_offset for b in resp.batches] == [0, 10, 20]
    assert (resp.last_stable_offset, resp.aborted_transactions) == (21, [AbortedTransaction(7, 10, 20)])
    assert find(c, tip).aborted_transactions == []  # read_uncommitted: no list (as Kafka answers)

    # The next transaction of the same producer continues its sequence (the marker keeps it) and commits.
    commit(c, [txn_req(tip, 0, pid=7, epoch=0, seq=10), txn_req(tip, 1, pid=8, epoch=0, seq=0, records=5)])
    assert find(c, tip).last_stable_offset == 21
    commit(c, [txn_req(tip, 0, pid=7, epoch=0, seq=-1, kind=TXN_COMMIT)])  # 36; pid 8 still open at 31
    assert find(c, tip).last_stable_offset == 31
    assert find(c, tip, 21, committed=True).aborted_transactions == []  # the aborted range ends below 21

    c2 = backend.open(clock)  # a restart (or another broker) sees the same state
    assert (find(c2, tip).last_stable_offset, latest(c2, tip, True)) == (31, 31)
    assert find(c2, tip, committed=True).aborted_transactions == [AbortedTransaction(7, 10, 20)]
    assert c2.describe_producers(tip) == [ProducerInfo(7, 0, 19, T0, -1), ProducerInfo(8, 0, 4, T0, 31)]
    (dup,), _ = commit(c2, [txn_req(tip, 0, pid=7, epoch=0, seq=10)])  # idempotence still holds past the marker
    assert dup.is_duplicate and dup.assigned_base_offset == 21
    # A bumped epoch (the coordinator fenced the producer) aborts pid 8; its old epoch is refused.
    (r,), _ = commit(c2, [txn_req(tip, 0, pid=8, epoch=1, seq=-1, kind=TXN_ABORT)])
    assert (r.errors, r.assigned_base_offset) == (0, 37)
    (r,), _ = commit(c2, [txn_req(tip, 0, pid=8, epoch=0, seq=5)])
    assert r.errors == ErrorCode.invalid_producer_epoch
    (r,), _ = commit(c2, [txn_req(tip, 0, pid=8, epoch=0, seq=-1, kind=TXN_COMMIT)])
    assert r.errors == ErrorCode.invalid_producer_epoch
    resp = find(c2, tip, committed=True)
    assert (resp.last_stable_offset, resp.high_watermark) == (38, 38)
    assert resp.aborted_transactions == [AbortedTransaction(7, 10, 20), AbortedTransaction(8, 31, 37)]
    (r,), _ = commit(c2, [txn_req(tip, 0, pid=8, epoch=1, seq=0)])  # the new epoch starts at 0
    assert (r.errors, r.assigned_base_offset) == (0, 38)
    assert c2.describe_producers(other) == [] and c2.describe_producers(
        TopicIdPartition(uuid.uuid4(), "gone", 0)) is None


def test_one_commit_with_data_and_markers_of_several_transactions(coord: BatchCoordinator) -> None:
    tip, other = topic(coord)
    responses, _ = commit(coord, [
        txn_req(tip, 0, pid=1, epoch=0, seq=0), txn_req(tip, 1, pid=2, epoch=0, seq=0),
        txn_req(tip, 2, pid=1, epoch=0, seq=-1, kind=TXN_ABORT), txn_req(tip, 3, pid=1, epoch=0, seq=10),
        txn_req(other, 4, pid=2, epoch=0, seq=0), txn_req(other, 5, pid=2, epoch=0, seq=-1, kind=TXN_COMMIT),
    ])
    assert [r.assigned_base_offset for r in responses] == [0, 10, 20, 21, 0, 10]
    resp = find(coord, tip, committed=True)
    assert resp.last_stable_offset == 10  # pid 2 open from 10; pid 1 reopened at 21
    assert [b.metadata.base_offset for b in resp.batches] == [0]
    assert find(coord, tip, 0, committed=False).aborted_transactions == []
    assert find(coord, other).last_stable_offset == 11
    commit(coord, [txn_req(tip, 0, pid=2, epoch=0, seq=-1, kind=TXN_COMMIT)])
    assert find(coord, tip).last_stable_offset == 21
    resp = find(coord, tip, committed=True)
    assert resp.aborted_transactions == [AbortedTransaction(1, 0, 20)]
    assert [b.metadata.base_offset for b in resp.batches] == [0, 10, 20]
    coord.delete_topics([tip.topic_id])  # the transaction rows go with the log
    assert coord.describe_producers(tip) is None


def aborted_rows(backend: Backend) -> int:
    return table_rows(backend, "txn_aborted")


def test_aborted_ranges_below_the_log_start_are_dropped(backend: Backend, clock: Clock) -> None:
    c = backend.open(clock)
    tip, _ = topic(c)
    for i in range(3):  # three aborted transactions: 0..10, 11..21, 22..32
        commit(c, [txn_req(tip, 0, pid=4, epoch=0, seq=10 * i),
                   txn_req(tip, 1, pid=4, epoch=0, seq=-1, kind=TXN_ABORT)])
    assert aborted_rows(backend) == 3
    (d,) = c.delete_records([DeleteRecordsRequest(tip, 15)])
    assert d.low_watermark == 15 and aborted_rows(backend) == 2  # the first ended at 10
    assert find(c, tip, 15, committed=True).aborted_transactions == [
        AbortedTransaction(4, 11, 21), AbortedTransaction(4, 22, 32)]
    clock.now += 10_000
    c.enforce_retention([RetentionRequest(tip, 1_000, -1)], clock.now)  # everything is old
    assert aborted_rows(backend) == 0


def test_version_3_database_is_migrated_to_4_with_empty_transaction_state(db_path: Path) -> None:
    c = SqliteBatchCoordinator(db_path, clock=Clock())
    (tip, _) = topic(c)
    commit(c, [req(tip), req(tip, 1, pid=3, epoch=0, seq=0)])
    c.close()
    raw = sqlite3.connect(db_path)  # what kcli with schema 3 left behind
    raw.execute("DROP TABLE txn_open")
    raw.execute("DROP TABLE txn_aborted")
    raw.execute("UPDATE kcli_meta SET value = '3' WHERE key = 'schema_version'")
    raw.commit()
    raw.close()
    reader = SqliteBatchCoordinator(db_path, read_only=True)  # inspects a migrated copy
    assert find(reader, tip).last_stable_offset == 20
    reader.close()
    c = SqliteBatchCoordinator(db_path, clock=Clock())
    assert log_of(c, tip).high_watermark == 20
    commit(c, [txn_req(tip, 0, pid=3, epoch=0, seq=10)])
    assert find(c, tip).last_stable_offset == 20 and latest(c, tip, True) == 20
    c.close()
    assert sqlite3.connect(db_path).execute(
        "SELECT value FROM kcli_meta WHERE key = 'schema_version'").fetchone() == ("4",)
