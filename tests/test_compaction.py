"""Log compaction of classic partitions (kcli/storage/cleaner.py), checked against a dict model.

Storage level: random key/value/tombstone sequences, random codecs and batch sizes, cleaned
with a controlled clock; the survivors are exactly the latest record per key, tombstones are
kept until their delete horizon and then dropped, offsets never move, and a reopened log (the
swap recovery, the cleaner checkpoint) reads the same. Broker level: real broker processes and
real clients (confluent-kafka, kafka-python): 100k records over 1k keys cleaned by the broker's
cleaner task, a SIGKILL inside a cleaning, key-less produce refused per record.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kio.schema.errors import ErrorCode

from kcli.dumplog.synth import build_batch
from kcli.protocol.client import WireClient
from kcli.records.batch import iter_headers
from kcli.storage.cleaner import (
    CHECKPOINT_FILE,
    LogCleaner,
    clean_log,
    decode_records,
    read_checkpoints,
)
from kcli.storage.errors import RecordValidationError
from kcli.storage.log import PartitionLog
from kcli.storage.log_config import LogConfig
from tests.brokerproc import BrokerProcess
from tests.diskless_helpers import metrics as broker_metrics
from tests.diskless_helpers import wait_until
from tests.kafka_helpers import admin, create_topic, produce
from tests.wire_helpers import batch, produce_body

T0 = 1_700_000_000_000
DELETE_RETENTION = 10_000


def _config(**extra: str) -> LogConfig:
    base = {"cleanup.policy": "compact", "segment.bytes": "1200", "min.cleanable.dirty.ratio": "0.0",
            "delete.retention.ms": str(DELETE_RETENTION), "index.interval.bytes": "100"}
    base.update(extra)
    return LogConfig.from_dict(base)


def _records(plog: PartitionLog) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record from the log start, read as a consumer would."""
    out = []
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        res = plog.read(offset, 1 << 20)
        if not res.records:
            break
        for h in iter_headers(res.records):
            batch = res.records[h.position : h.position + h.size]
            out += [(r.offset, r.key, r.value) for r in decode_records(batch)]
        offset = res.next_offset
    return out


def _model(ops: list[tuple[int, bytes, bytes | None]]) -> dict[bytes, tuple[int, bytes | None]]:
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for offset, key, value in ops:
        latest[key] = (offset, value)
    return latest


def _append(plog: PartitionLog, items: list[tuple[bytes, bytes | None]], codec: str, now: int,
            ops: list[tuple[int, bytes, bytes | None]]) -> None:
    res = plog.append(build_batch([(k, v, []) for k, v in items], 0, [now] * len(items), compression=codec), now_ms=now)
    for i, (k, v) in enumerate(items):
        ops.append((res.base_offset + i, k, v))


keys = st.sampled_from([b"k%d" % i for i in range(12)])
values = st.one_of(st.none(), st.binary(min_size=1, max_size=40))
batches = st.lists(st.tuples(keys, values), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rounds=st.lists(st.lists(batches, min_size=1, max_size=12), min_size=1, max_size=3),
       codec=st.sampled_from(["none", "gzip", "snappy", "lz4", "zstd"]))
def test_cleaner_keeps_latest_per_key_and_drops_tombstones_after_horizon(tmp_path_factory, rounds, codec):
    path = tmp_path_factory.mktemp("c") / "t-0"
    plog = PartitionLog.open(path, _config())
    cleaner = LogCleaner.open(path.parent)
    ops: list[tuple[int, bytes, bytes | None]] = []
    now = T0
    for rnd in rounds:
        for items in rnd:
            _append(plog, items, codec, now, ops)
        plog.roll(now)
        end = plog.log_end_offset
        before = {o for o, _k, _v in _records(plog)}
        cleaner.clean(("t", 0), plog, now)
        got = _records(plog)
        assert plog.log_end_offset == end
        latest = _model(ops)
        # Everything at or after the last cleaned offset is untouched; below it only the latest per key.
        expected = sorted((o, k, v) for k, (o, v) in latest.items())
        assert [(o, k, v) for o, k, v in got] == expected, "survivors differ from the dict model"
        assert {o for o, _k, _v in got} <= before
        now += 1000
    # Past the delete horizon the tombstones go; values stay.
    now += DELETE_RETENTION + 1
    plog.roll(now)
    cleaner.clean(("t", 0), plog, now)
    got = _records(plog)
    expected = sorted((o, k, v) for k, (o, v) in _model(ops).items() if v is not None)
    assert [(o, k, v) for o, k, v in got] == expected
    assert read_checkpoints(path.parent)[("t", 0)] == plog.segments()[-1].base_offset
    plog.close()
    reopened = PartitionLog.open(path, _config())
    assert _records(reopened) == got
    assert reopened.append(build_batch([(b"x", b"y", [])]), now_ms=now).base_offset == ops[-1][0] + 1
    reopened.close()


def test_a_small_offset_map_cleans_in_several_passes_to_the_same_result(tmp_path: Path) -> None:
    """log.cleaner.dedupe.buffer.size bounds the map: a pass maps as many segments as fit (at
    least one) and the checkpoint moves only that far; later passes finish the job."""
    path = tmp_path / "t-0"
    plog = PartitionLog.open(path, _config())
    cleaner = LogCleaner.open(tmp_path, max_map_bytes=1)
    ops: list[tuple[int, bytes, bytes | None]] = []
    for i in range(120):
        _append(plog, [(b"k%d" % (i % 9), b"v%d" % i), (b"j%d" % (i % 5), b"w%d" % i)], "none", T0, ops)
    active = plog.roll(T0)
    checkpoints = []
    while cleaner.checkpoints.get(("t", 0), 0) < active:
        assert cleaner.clean(("t", 0), plog, T0) is not None
        checkpoints.append(cleaner.checkpoints[("t", 0)])
        assert len(checkpoints) < 100
    assert len(checkpoints) > 2 and checkpoints == sorted(set(checkpoints))
    assert _records(plog) == sorted((o, k, v) for k, (o, v) in _model(ops).items())
    plog.close()


def test_active_segment_min_lag_and_ratio_are_respected(tmp_path: Path) -> None:
    path = tmp_path / "t-0"
    plog = PartitionLog.open(path, _config(**{"min.cleanable.dirty.ratio": "0.5", "min.compaction.lag.ms": "5000"}))
    ops: list[tuple[int, bytes, bytes | None]] = []
    for i in range(20):
        _append(plog, [(b"a", b"v%d" % i)], "none", T0 + i, ops)
    # Only the active segment holds the later duplicates: never cleaned.
    assert clean_log(plog, None, T0 + 100_000) is not None
    for i in range(20, 40):
        _append(plog, [(b"a", b"v%d" % i)], "none", T0 + 100_000, ops)
    plog.roll(T0 + 100_000)
    # Inside min.compaction.lag.ms of the newest segment: that segment is not cleanable yet.
    res = clean_log(plog, None, T0 + 100_001)
    assert res is not None and res.end_offset <= 20
    vals = [v for _o, _k, v in _records(plog)]
    assert vals[-20:] == [b"v%d" % i for i in range(20, 40)]
    # Later it is, and only the last record of key "a" remains.
    res = clean_log(plog, None, T0 + 200_000)
    assert [v for _o, _k, v in _records(plog)] == [b"v39"]
    plog.close()


def test_keyless_records_are_refused_per_record(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", _config())
    batch = build_batch([(b"k", b"v", []), (None, b"v", []), (b"k2", b"v", []), (None, b"w", [])])
    with pytest.raises(RecordValidationError) as err:
        plog.append(batch, now_ms=T0)
    assert err.value.code == ErrorCode.invalid_record
    assert [i for i, _m in err.value.record_errors] == [1, 3]
    assert err.value.record_errors[0][1] == "Compacted topic cannot accept message without key in topic partition t-0."
    assert plog.log_end_offset == 0
    delete = PartitionLog.open(tmp_path / "d-0", LogConfig.from_dict({}))
    assert delete.append(batch, now_ms=T0).last_offset == 3  # only compacted topics refuse
    plog.close()
    delete.close()


def test_a_producers_last_batch_is_kept_empty_so_its_sequence_state_survives(tmp_path: Path) -> None:
    """Kafka keeps an emptied batch when it is its producer's last, so a restart still knows
    the producer's sequence: a retry is a duplicate, the next sequence is accepted."""
    path = tmp_path / "t-0"
    plog = PartitionLog.open(path, _config())
    plog.append(build_batch([(b"k", b"from-a", [])], producer_id=7, producer_epoch=0, base_sequence=0), now_ms=T0)
    plog.append(build_batch([(b"k", b"from-b", [])], producer_id=8, producer_epoch=0, base_sequence=0), now_ms=T0)
    plog.roll(T0)
    clean_log(plog, None, T0)
    assert _records(plog) == [(1, b"k", b"from-b")]
    headers = list(iter_headers(plog.read(0, 1 << 20).records))
    assert [(h.base_offset, h.producer_id, h.records_count) for h in headers] == [(0, 7, 0), (1, 8, 1)]
    plog.close()
    plog = PartitionLog.open(path, _config())
    retry = plog.append(build_batch([(b"k", b"from-a", [])], producer_id=7, producer_epoch=0, base_sequence=0), now_ms=T0)
    assert retry.duplicate and retry.base_offset == 0
    nxt = plog.append(build_batch([(b"k", b"a2", [])], producer_id=7, producer_epoch=0, base_sequence=1), now_ms=T0)
    assert not nxt.duplicate and nxt.base_offset == 2
    plog.close()


def _txn(plog: PartitionLog, pid: int, seq: int, items: list[tuple[bytes, bytes | None]], now: int = T0) -> int:
    res = plog.append(build_batch([(k, v, []) for k, v in items], producer_id=pid, producer_epoch=0,
                                  base_sequence=seq, transactional=True), now_ms=now)
    return res.base_offset


def _marker(plog: PartitionLog, pid: int, commit: bool, now: int = T0) -> int:
    from kcli.dumplog.synth import control_batch
    from kcli.storage.log import AppendOrigin

    return plog.append(control_batch(0, commit, pid, 0, timestamp=now), now_ms=now, origin=AppendOrigin.COORDINATOR).base_offset


def _markers(plog: PartitionLog) -> list[int]:
    return [h.base_offset for h in iter_headers(plog.read(0, 1 << 20).records) if h.is_control]


def test_aborted_data_never_hides_committed_data_and_markers_go_after_their_data(tmp_path: Path) -> None:
    """Kafka's CleanedTransactionMetadata: an aborted record is not in the offset map (the
    committed value it would hide survives) and is dropped; a marker stays while the pass read
    data of its transaction, then gets a delete horizon and goes once that passed."""
    plog = PartitionLog.open(tmp_path / "t-0", _config())
    _txn(plog, 9, 0, [(b"a", b"c1")])            # 0
    _marker(plog, 9, True)                        # 1
    _txn(plog, 10, 0, [(b"a", b"aborted")])      # 2
    abort = _marker(plog, 10, False)              # 3
    _txn(plog, 9, 1, [(b"z", b"c2")])            # 4
    _marker(plog, 9, True)                        # 5
    _txn(plog, 10, 1, [(b"y", b"ok")])           # 6
    _marker(plog, 10, True)                       # 7
    plog.append(build_batch([(b"b", b"x", [])]), now_ms=T0)  # 8
    plog.roll(T0)
    assert plog.aborted_transactions(0, 9)[0].last_offset == abort
    clean_log(plog, None, T0, force=True)
    assert [(o, k, v) for o, k, v in _records(plog) if o not in (1, 3, 5, 7)] == \
        [(0, b"a", b"c1"), (4, b"z", b"c2"), (6, b"y", b"ok"), (8, b"b", b"x")]
    assert _markers(plog) == [1, 3, 5, 7], "every marker still guarded data read in this pass"
    clean_log(plog, 9, T0 + 1, force=True)
    assert _markers(plog) == [1, 3, 5, 7], "the ABORT marker only got its delete horizon"
    later = T0 + 2 + DELETE_RETENTION
    clean_log(plog, 9, later, force=True)
    assert _markers(plog) == [1, 5, 7], "the ABORT marker went after its horizon; COMMITs guard live data"
    # The committed record of the first transaction is superseded: its marker follows it out.
    plog.append(build_batch([(b"a", b"new", [])]), now_ms=later)
    plog.roll(later)
    for now in (later, later + 1, later + 2 + DELETE_RETENTION):
        clean_log(plog, None, now, force=True)
    assert _markers(plog) == [5, 7]
    assert [(o, k, v) for o, k, v in _records(plog) if o not in (5, 7)] == \
        [(4, b"z", b"c2"), (6, b"y", b"ok"), (8, b"b", b"x"), (9, b"a", b"new")]
    path = plog.dir
    plog.close()
    plog = PartitionLog.open(path, _config())  # the replay finds no open transaction left behind
    assert plog.last_stable_offset == plog.log_end_offset and plog.open_transactions() == {}
    plog.close()


def test_an_open_transaction_is_not_cleaned_and_its_abort_keeps_the_committed_value(tmp_path: Path) -> None:
    """Nothing at or after the first unstable offset is cleaned: an open transaction's record
    must not hide the committed value of its key, which is the one left when it aborts."""
    plog = PartitionLog.open(tmp_path / "t-0", _config())
    plog.append(build_batch([(b"c", b"v1", [])]), now_ms=T0)
    plog.roll(T0)
    _txn(plog, 11, 0, [(b"c", b"open")])
    plog.append(build_batch([(b"d", b"x", [])]), now_ms=T0)
    plog.roll(T0)
    plog.append(build_batch([(b"d", b"y", [])]), now_ms=T0)
    plog.roll(T0)
    clean_log(plog, None, T0, force=True)
    assert [(o, k, v) for o, k, v in _records(plog)] == [(0, b"c", b"v1"), (1, b"c", b"open"), (2, b"d", b"x"),
                                                         (3, b"d", b"y")]
    _marker(plog, 11, False)
    plog.roll(T0)
    clean_log(plog, None, T0 + 1, force=True)
    assert [(o, k, v) for o, k, v in _records(plog) if o != 4] == [(0, b"c", b"v1"), (3, b"d", b"y")]
    plog.close()


def _segments_from(plog: PartitionLog, now: int, n: int) -> list[tuple[int, bytes, bytes | None]]:
    ops: list[tuple[int, bytes, bytes | None]] = []
    for i in range(n):
        _append(plog, [(b"k%d" % (i % 5), b"v%d" % i), (b"k%d" % ((i + 1) % 5), None)], "none", now, ops)
    plog.roll(now)
    return ops


@pytest.mark.parametrize("stage", ["cleaned", "swap", "swap-half-deleted"])
def test_crash_between_cleaning_and_swap_recovers_without_loss_or_duplicates(tmp_path: Path, stage: str) -> None:
    """Files as a crash leaves them at each step of the swap; reopening completes or rolls back."""
    path = tmp_path / "t-0"
    plog = PartitionLog.open(path, _config())
    ops = _segments_from(plog, T0, 60)
    segs = plog.segments()
    assert len(segs) >= 4
    before = _records(plog)
    plog.close()
    # Clean a copy of the partition, then put the copy's cleaned first segment back as a crash would leave it.
    shutil.copytree(path, tmp_path / "copy" / "t-0")
    copy = PartitionLog.open(tmp_path / "copy" / "t-0", _config())
    clean_log(copy, None, T0)
    cleaned_first = copy.segments()[0]
    cleaned_bytes = cleaned_first.log_path.read_bytes()
    cleaned_end = cleaned_first.next_offset
    expected = _records(copy)
    copy.close()
    name = cleaned_first.log_path.name
    if stage == "cleaned":
        (path / (name + ".cleaned")).write_bytes(cleaned_bytes)
        after_expected = before
    else:
        (path / (name + ".swap")).write_bytes(cleaned_bytes)
        if stage == "swap-half-deleted":
            (path / name).unlink()
        # Recovery deletes the old segments whose base lies in the swap's offset range.
        end = max(cleaned_end, cleaned_first.base_offset + 1)
        kept_from = min((s.base_offset for s in segs if s.base_offset >= end), default=end)
        after_expected = [r for r in expected if r[0] < end] + [r for r in before if r[0] >= kept_from]
    reopened = PartitionLog.open(path, _config())
    got = _records(reopened)
    assert got == after_expected
    offsets = [o for o, _k, _v in got]
    assert offsets == sorted(set(offsets)), "an offset appears twice"
    assert not list(path.glob("*.cleaned")) and not list(path.glob("*.swap"))
    # Whatever state the crash left, the latest value of every key is still there.
    latest = {k: (o, v) for k, (o, v) in _model(ops).items()}
    assert {(o, k, v) for k, (o, v) in latest.items()} <= set(got)
    reopened.close()


# ==========================================================================================
# a real broker and real clients
# ==========================================================================================
FAST_CLEANER = {"log.cleaner.backoff.ms": "200"}
COMPACT = {"cleanup.policy": "compact", "segment.bytes": "65536", "min.cleanable.dirty.ratio": "0.01",
           "delete.retention.ms": "3000", "segment.ms": "1000"}
END_KEY = b"~end"


@pytest.fixture(scope="module")
def cbroker(tmp_path_factory: pytest.TempPathFactory) -> BrokerProcess:
    b = BrokerProcess(tmp_path_factory.mktemp("compaction") / "data", FAST_CLEANER).start()
    yield b
    b.stop()


def _write_model(bootstrap: str, topic: str, n: int, nkeys: int, seed: int) -> dict[bytes, tuple[int, bytes | None]]:
    """Produce ``n`` records over ``nkeys`` keys (5% tombstones, gzip batches) with
    confluent-kafka; returns key -> (offset, value) of each key's latest record. Then, after
    segment.ms, one more record rolls the segment so every modelled record is cleanable."""
    rng = random.Random(seed)
    keys = [b"key-%04d" % rng.randrange(nkeys) for _ in range(n)]
    values: list[bytes | None] = [None if rng.random() < 0.05 else b"value-%06d-" % i + b"x" * rng.randrange(40)
                                  for i in range(n)]
    acks = produce(bootstrap, topic, values, keys=keys, partition=0, **{"compression.type": "gzip", "linger.ms": 20, "batch.size": 16384})
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for key, value, (_p, offset) in zip(keys, values, acks):
        latest[key] = (offset, value)
    time.sleep(1.2)
    produce(bootstrap, topic, [b"end"], keys=[END_KEY], partition=0)
    return latest


def _read_partition(bootstrap: str, topic: str, timeout: float = 30.0) -> list[tuple[int, bytes, bytes | None]]:
    """(offset, key, value) of every record from offset 0 up to the END_KEY record (confluent-kafka)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{time.monotonic_ns()}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[int, bytes, bytes | None]] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                raise KafkaException(m.error())
            out.append((m.offset(), m.key(), m.value()))
            if m.key() == END_KEY:
                return out
    finally:
        c.close()
    raise AssertionError(f"timed out reading {topic}: {len(out)} records")


def _compacted_as_modelled(records: list[tuple[int, bytes, bytes | None]],
                           latest: dict[bytes, tuple[int, bytes | None]], *, tombstones: bool) -> bool:
    """Survivors are exactly one record per key, the latest, at its original offset (tombstones
    too while ``tombstones``)."""
    got = {k: (o, v) for o, k, v in records if k != END_KEY}
    if len(got) != len(records) - 1:
        return False  # a key appears twice: not (fully) cleaned
    want = {k: ov for k, ov in latest.items() if tombstones or ov[1] is not None}
    return got == want


def _assert_no_loss_or_duplicate(records: list[tuple[int, bytes, bytes | None]],
                                 latest: dict[bytes, tuple[int, bytes | None]]) -> None:
    offsets = [o for o, _k, _v in records]
    assert offsets == sorted(set(offsets)), "an offset was read twice or out of order"
    present = {(o, k, v) for o, k, v in records}
    missing = [k for k, (o, v) in latest.items() if (o, k, v) not in present]
    assert not missing, f"latest records lost for {len(missing)} keys, e.g. {missing[:3]}"


def test_broker_compacts_100k_records_over_1k_keys(cbroker: BrokerProcess) -> None:
    b = cbroker
    create_topic(b.bootstrap, "changelog", 1, COMPACT)
    latest = _write_model(b.bootstrap, "changelog", 100_000, 1000, seed=17)
    assert any(v is None for _o, v in latest.values()), "the model has no tombstone"
    # Every key once, the latest, at its offset; tombstones are kept first, dropped once
    # delete.retention.ms passed after the pass that kept them.
    records = wait_until(lambda: (r := _read_partition(b.bootstrap, "changelog"))
                         and _compacted_as_modelled(r, latest, tombstones=False) and r,
                         timeout=120, interval=1.0, what="the partition compacted as modelled")
    _assert_no_loss_or_duplicate(records, {k: ov for k, ov in latest.items() if ov[1] is not None})
    counters = broker_metrics(b.bootstrap)["counters"]
    assert counters["log.cleaner.runs"] >= 1 and counters["log.cleaner.bytes.read"] > 0
    assert counters["log.cleaner.records.removed"] >= 100_000 - len(records)
    # kafka-python reads the cleaned (gapped, re-compressed) batches the same way
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    kc = KafkaConsumer(bootstrap_servers=b.bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000)
    kc.assign([KTP("changelog", 0)])
    kc.seek_to_beginning()
    seen = [(m.offset, m.key, m.value) for m in kc]
    kc.close()
    assert seen == records
    # kcli topics describe: the dirty ratio per partition of a compacted topic
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCLI_")}
    run = subprocess.run([sys.executable, "-m", "kcli", "-b", b.bootstrap, "topics", "describe", "-t", "changelog"],
                         check=False, capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stderr
    assert "DirtyRatio: " in run.stdout, run.stdout


@pytest.mark.parametrize("point", ["log.cleaner.cleaned", "log.cleaner.swap"])
def test_kill9_inside_a_cleaning_then_restart_keeps_the_model(tmp_path: Path, point: str) -> None:
    """SIGKILL while the cleaner holds a complete ``.cleaned`` file (rolled back on start) or
    a committed ``.swap`` (completed on start): nothing lost, nothing read twice, and the
    restarted cleaner finishes the job."""
    switch = tmp_path / "arm"
    b = BrokerProcess(tmp_path / "data", {**FAST_CLEANER, f"kcli.fault.{point}.pause.ms": "20000",
                                          "kcli.fault.switch.file": str(switch)}).start()
    try:
        create_topic(b.bootstrap, "crash", 1, {**COMPACT, "delete.retention.ms": "600000"})
        latest = _write_model(b.bootstrap, "crash", 20_000, 300, seed=5)
        switch.touch()
        # the next pass pauses inside the window; a fresh write makes one due at once
        produce(b.bootstrap, "crash", [b"again"], keys=[b"key-0000"], partition=0)
        wait_until(lambda: f"kcli fault point {point}: pausing" in b.log_text(), timeout=60, interval=0.1,
                   what=f"the cleaner inside {point}")
        b.kill9()
        left = sorted(p.name for p in (b.data_dir / "crash-0").iterdir() if p.name.endswith((".cleaned", ".swap")))
        assert left, "the kill left no cleaning debris: it missed the window"
        switch.unlink()
        b.start()
        records = _read_partition(b.bootstrap, "crash")
        latest_now = dict(latest)
        _assert_no_loss_or_duplicate(records, latest_now)
        assert not [p for p in (b.data_dir / "crash-0").iterdir() if p.name.endswith((".cleaned", ".swap"))]
        # The restarted cleaner finishes: one record per key, the latest (the "again" write is
        # in the active segment with the END record, so key-0000 may appear twice there).
        def settled() -> list | None:
            r = _read_partition(b.bootstrap, "crash")
            body = [x for x in r if x[1] != b"key-0000" or x[2] != b"again"]
            return r if _compacted_as_modelled(body, latest, tombstones=True) else None

        wait_until(settled, timeout=90, interval=1.0, what="compaction after the restart")
    finally:
        b.stop()


def test_keyless_records_refused_per_record_confluent_kafka_python_and_wire(cbroker: BrokerProcess) -> None:
    b = cbroker
    create_topic(b.bootstrap, "keyed", 1, {"cleanup.policy": "compact,delete"})
    # confluent-kafka: the key-less record fails with INVALID_RECORD, the keyed one is stored
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    errors: list = []
    p.produce("keyed", value=b"no key", partition=0, on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)
    assert errors and errors[0] is not None and errors[0].name() == "INVALID_RECORD", errors
    assert produce(b.bootstrap, "keyed", [b"v"], keys=[b"k"], partition=0) == [(0, 0)]
    # kafka-python
    from kafka import KafkaProducer
    from kafka.errors import InvalidRecordError

    kp = KafkaProducer(bootstrap_servers=b.bootstrap, retries=0)
    fut = kp.send("keyed", value=b"no key", partition=0)
    with pytest.raises(InvalidRecordError):
        fut.get(timeout=30)
    assert kp.send("keyed", key=b"k2", value=b"v", partition=0).get(timeout=30).offset == 1
    kp.close()
    # the wire: Produce v8+ names each refused record; v7 has no record_errors, only the code
    body = produce_body("keyed", 0, batch([b"a", b"b"]))
    with WireClient(b.bootstrap) as client:
        pr = client.request(0, 9, body).responses[0].partition_responses[0]
        assert int(pr.error_code) == ErrorCode.invalid_record
        assert [(int(e.batch_index), e.batch_index_error_message) for e in pr.record_errors] == [
            (i, "Compacted topic cannot accept message without key in topic partition keyed-0.") for i in (0, 1)]
        pr = client.request(0, 7, body).responses[0].partition_responses[0]
        assert int(pr.error_code) == ErrorCode.invalid_record
    assert produce(b.bootstrap, "keyed", [b"v"], keys=[b"k3"], partition=0) == [(0, 2)]  # nothing was appended


def _alter(bootstrap: str, topic: str, **configs: str) -> None:
    a = admin(bootstrap)
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()])
    a.incremental_alter_configs([res])[res].result(30)


def test_cleanup_policy_altered_both_ways_and_refused_where_unsupported(cbroker: BrokerProcess) -> None:
    b = cbroker
    create_topic(b.bootstrap, "switch", 1, {"segment.bytes": "65536", "segment.ms": "1000",
                                              "min.cleanable.dirty.ratio": "0.01"})
    keys = [b"k%d" % (i % 10) for i in range(2000)]
    produce(b.bootstrap, "switch", [b"v%d" % i for i in range(2000)], keys=keys, partition=0, **{"batch.size": 16384})
    time.sleep(1.2)
    produce(b.bootstrap, "switch", [b"end"], keys=[END_KEY], partition=0)
    assert len(_read_partition(b.bootstrap, "switch")) == 2001  # delete policy: nothing cleaned
    _alter(b.bootstrap, "switch", cleanup_policy="compact")
    latest = {b"k%d" % k: (1990 + k, b"v%d" % (1990 + k)) for k in range(10)}
    wait_until(lambda: _compacted_as_modelled(_read_partition(b.bootstrap, "switch"), latest, tombstones=True),
               timeout=60, interval=0.5, what="compaction after delete -> compact")
    _alter(b.bootstrap, "switch", cleanup_policy="delete")
    produce(b.bootstrap, "switch", [b"no key"], partition=0)  # accepted again
    assert _compacted_as_modelled(_read_partition(b.bootstrap, "switch"), latest, tombstones=True)


def test_compact_refused_with_remote_storage(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data", {"remote.log.storage.system.enable": "true"}).start()
    try:
        a = admin(b.bootstrap)

        def create_error(name: str, cfg: dict[str, str]) -> str:
            fs = a.create_topics([NewTopic(name, 1, 1, config=cfg)], operation_timeout=30)
            with pytest.raises(KafkaException) as err:
                fs[name].result(30)
            return str(err.value)

        msg = create_error("tr", {"remote.storage.enable": "true", "cleanup.policy": "compact,delete"})
        assert "Remote log storage is unsupported for the compacted topics" in msg, msg
        create_topic(b.bootstrap, "tiered", 1, {"remote.storage.enable": "true"})
        with pytest.raises(KafkaException, match="Remote log storage is unsupported for the compacted topics"):
            _alter(b.bootstrap, "tiered", cleanup_policy="compact")
        create_topic(b.bootstrap, "comp", 1, {"cleanup.policy": "compact"})
        with pytest.raises(KafkaException, match="Remote log storage is unsupported for the compacted topics"):
            _alter(b.bootstrap, "comp", remote_storage_enable="true")
    finally:
        b.stop()


def test_dump_log_reads_cleaned_segments_leftovers_and_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "t-0"
    plog = PartitionLog.open(path, _config(**{"segment.bytes": "100000"}))
    cleaner = LogCleaner.open(tmp_path)
    ops: list[tuple[int, bytes, bytes | None]] = []
    for i in range(30):
        _append(plog, [(b"k%d" % (i % 4), None if i == 28 else b"v%d" % i), (b"u%d" % i, b"once")], "gzip", T0, ops)
    plog.roll(T0)
    assert cleaner.clean(("t", 0), plog, T0) is not None
    seg = plog.segments()[0].log_path
    plog.close()
    (path / (seg.name + ".cleaned")).write_bytes(seg.read_bytes())  # as a crash before the swap leaves it
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCLI_")}
    for f in (seg, path / (seg.name + ".cleaned"), tmp_path / CHECKPOINT_FILE):
        run = subprocess.run([sys.executable, "-m", "kcli", "dump-log", "--files", str(f), "--print-data-log"],
                             check=False, capture_output=True, text=True, timeout=60, env=env)
        assert run.returncode == 0, (f.name, run.stdout[-2000:], run.stderr)
        assert "corrupt" not in (run.stdout + run.stderr).lower(), run.stdout[-2000:]
        if f.name.endswith(CHECKPOINT_FILE):
            assert "topic: t partition: 0 offset: 60" in run.stdout, run.stdout
        else:
            assert "Non-consecutive offsets" in run.stdout + run.stderr  # compaction's gaps, listed as Kafka lists them
            assert "key: k1 payload: v29" in run.stdout and "key: k1 payload: v25" not in run.stdout, run.stdout
            assert "deleteHorizonMs: OptionalLong[" in run.stdout  # the kept tombstone's batch (KIP-534)


def test_emptied_batches_of_idempotent_producers_are_read_by_real_clients(cbroker: BrokerProcess) -> None:
    """The empty batch kept for a producer's sequence state is skipped by confluent-kafka and
    kafka-python consumers alike; the producer keeps writing after the cleaning."""
    b = cbroker
    create_topic(b.bootstrap, "idem", 1, COMPACT)
    first = produce(b.bootstrap, "idem", [b"a1"], keys=[b"k"], partition=0, **{"enable.idempotence": True})
    produce(b.bootstrap, "idem", [b"b1"], keys=[b"k"], partition=0, **{"enable.idempotence": True})
    time.sleep(1.2)
    produce(b.bootstrap, "idem", [b"end"], keys=[END_KEY], partition=0)
    assert first == [(0, 0)]
    want = [(1, b"k", b"b1"), (2, END_KEY, b"end")]
    wait_until(lambda: _read_partition(b.bootstrap, "idem") == want, timeout=60, interval=0.5,
               what="the first producer's record cleaned away")
    first_batch = next(iter_headers((b.data_dir / "idem-0" / "00000000000000000000.log").read_bytes()))
    assert (first_batch.base_offset, first_batch.records_count, first_batch.producer_id >= 0) == (0, 0, True)
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    kc = KafkaConsumer(bootstrap_servers=b.bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000)
    kc.assign([KTP("idem", 0)])
    kc.seek_to_beginning()
    assert [(m.offset, m.key, m.value) for m in kc] == want
    kc.close()


def test_transactional_changelog_is_compacted_as_read_committed_sees_it(cbroker: BrokerProcess) -> None:
    """confluent-kafka's transactional producer on a compacted topic: the cleaner drops the
    aborted records (read_uncommitted consumers stop seeing them too), never lets them hide the
    committed value of their key, and both isolation levels read the same survivors after."""
    b = cbroker
    create_topic(b.bootstrap, "txn-changelog", 1, COMPACT)
    p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "changelog-writer", "linger.ms": 5})
    p.init_transactions(30)
    for round_ in range(3):
        p.begin_transaction()
        for k in range(20):
            p.produce("txn-changelog", b"committed-%d-%d" % (round_, k), key=b"key-%02d" % k, partition=0)
        p.commit_transaction(30)
        p.begin_transaction()
        for k in range(20):
            p.produce("txn-changelog", b"aborted-%d-%d" % (round_, k), key=b"key-%02d" % k, partition=0)
        p.flush(30)
        p.abort_transaction(30)
    time.sleep(1.2)  # segment.ms: the next record rolls the segment, everything above is cleanable
    produce(b.bootstrap, "txn-changelog", [b"end"], keys=[END_KEY], partition=0)

    def read(isolation: str) -> list[tuple[int, bytes, bytes | None]]:
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"g-{time.monotonic_ns()}",
                      "enable.auto.commit": False, "isolation.level": isolation})
        c.assign([TopicPartition("txn-changelog", 0, 0)])
        out: list[tuple[int, bytes, bytes | None]] = []
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline and not (out and out[-1][1] == END_KEY):
                m = c.poll(0.2)
                if m is not None and not m.error():
                    out.append((m.offset(), m.key(), m.value()))
        finally:
            c.close()
        return out

    expected = {b"key-%02d" % k: b"committed-2-%d" % k for k in range(20)} | {END_KEY: b"end"}
    cleaned = wait_until(lambda: (r := read("read_uncommitted")) and {k: v for _o, k, v in r} == expected
                         and len(r) == len(expected) and r, timeout=60, interval=1.0,
                         what="aborted records dropped and the committed values kept")
    assert read("read_committed") == cleaned
    p.flush(10)
