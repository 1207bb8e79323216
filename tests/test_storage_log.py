"""PartitionLog on real files: layout, indexes, reads, recovery, retention, idempotence.

Batches come from aiokafka's DefaultRecordBatchBuilder (what a real client sends). The files
are checked with a reader written here from Kafka's format description (RecordBatch v2,
OffsetIndex, TimeIndex, DumpLogSegments' index checks), independent of kcli's own parsers.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kio.schema.errors import ErrorCode

from kcli.storage.errors import LogError, OffsetOutOfRange
from kcli.storage.log import (
    LOG_START_OFFSET_FILE,
    RECOVERY_POINT_FILE,
    AppendOrigin,
    PartitionLog,
    read_partition_metadata,
    write_partition_metadata,
)
from kcli.storage.log_config import LogConfig

REPO = Path(__file__).resolve().parents[1]
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


# ------------------------------------------------------------------------------------------
# batches as a client builds them
# ------------------------------------------------------------------------------------------
def build(
    n: int = 1,
    *,
    ts: int = 1_000,
    ts_step: int = 1,
    value_size: int = 100,
    codec: int = 0,
    pid: int = -1,
    epoch: int = -1,
    seq: int = -1,
    transactional: bool = False,
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=int(transactional),
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        batch_size=1 << 30,
    )
    for i in range(n):
        value = (b"v%05d" % i) * (value_size // 6 + 1)
        builder.append(i, timestamp=ts + i * ts_step, key=b"k%d" % i, value=value[:value_size], headers=[])
    return bytes(builder.build())


def open_log(path: Path, **configs: object) -> PartitionLog:
    return PartitionLog.open(path, LogConfig.from_dict({k.replace("_", "."): str(v) for k, v in configs.items()}))


# ------------------------------------------------------------------------------------------
# an independent reader of Kafka's on-disk formats
# ------------------------------------------------------------------------------------------
_BATCH = struct.Struct(">qiibIhiqqqhii")  # RecordBatch v2 header, 61 bytes


@dataclass
class RawBatch:
    position: int
    base_offset: int
    length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    count: int
    raw: bytes

    @property
    def size(self) -> int:
        return self.length + 12

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


def parse_batches(data: bytes) -> list[RawBatch]:
    """Every batch in ``data``; asserts the bytes are exactly a sequence of valid v2 batches."""
    out, pos = [], 0
    while pos < len(data):
        fields = _BATCH.unpack_from(data, pos)
        size = fields[1] + 12
        raw = data[pos : pos + size]
        assert len(raw) == size, f"torn batch at {pos}"
        batch = RawBatch(pos, *fields, raw=raw)
        assert batch.magic == 2
        assert crc32c(raw[21:]) == batch.crc, f"bad CRC at {pos}"
        out.append(batch)
        pos += size
    return out


def read_offset_index(path: Path) -> list[tuple[int, int]]:
    data = path.read_bytes()
    assert len(data) % 8 == 0
    return list(struct.iter_unpack(">ii", data))


def read_time_index(path: Path) -> list[tuple[int, int]]:
    data = path.read_bytes()
    assert len(data) % 12 == 0
    return list(struct.iter_unpack(">qi", data))


def kafka_index_entries(batches: list[RawBatch], base: int, interval: int, sealed: bool):
    """Kafka's LogSegment rule: an entry before a batch once more than index.interval.bytes
    were written since the last one; the time index only when the max timestamp grew; a
    sealed segment's time index ends with its max timestamp."""
    offsets: list[tuple[int, int]] = []
    times: list[tuple[int, int]] = []
    since, max_ts, max_off = 0, -1, base
    for b in batches:
        if b.max_timestamp > max_ts:
            max_ts, max_off = b.max_timestamp, b.last_offset
        if since > interval:
            offsets.append((b.last_offset - base, b.position))
            if max_ts > (times[-1][0] if times else -1):
                times.append((max_ts, max_off - base))
            since = 0
        since += b.size
    if sealed and max_ts > (times[-1][0] if times else -1):
        times.append((max_ts, max_off - base))
    return offsets, times


def check_partition_files(
    plog: PartitionLog, interval: int, *, sealed_active: bool = False, exact: bool = True
) -> list[RawBatch]:
    """Verify every segment like kafka-dump-log would (and, if ``exact``, that the indexes
    are exactly what Kafka's rule produces); return all batches in order."""
    everything: list[RawBatch] = []
    expected_next = None
    for info in plog.segments():
        assert info.log_path.name == f"{info.base_offset:020d}.log"
        assert info.index_path.name == f"{info.base_offset:020d}.index"
        assert info.timeindex_path.name == f"{info.base_offset:020d}.timeindex"
        batches = parse_batches(info.log_path.read_bytes())
        assert info.size == info.log_path.stat().st_size
        if expected_next is not None:
            assert info.base_offset == expected_next
        if batches:
            assert batches[0].base_offset == info.base_offset
            for a, b in zip(batches, batches[1:]):
                assert b.base_offset == a.last_offset + 1
            assert info.next_offset == batches[-1].last_offset + 1
        offsets = read_offset_index(info.index_path)
        times = read_time_index(info.timeindex_path)
        by_pos = {b.position: b for b in batches}
        for rel, pos in offsets:  # DumpLogSegments: the batch at the position ends at the entry offset
            assert by_pos[pos].last_offset == info.base_offset + rel
        max_so_far, ends = -1, {}
        for b in batches:
            max_so_far = max(max_so_far, b.max_timestamp)
            ends[b.last_offset] = max_so_far
        for (ts, rel), prev in zip(times, [(-1, -1)] + times):
            assert ts > prev[0] and rel >= prev[1] and ends[info.base_offset + rel] == ts
        if exact:
            sealed = sealed_active or not info.is_active
            assert (offsets, times) == kafka_index_entries(batches, info.base_offset, interval, sealed)
        expected_next = info.next_offset
        everything += batches
    return everything


# ------------------------------------------------------------------------------------------
# layout, rolls, indexes, reads
# ------------------------------------------------------------------------------------------
def test_segment_files_are_kafka_batches_and_indexes(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0", segment_bytes=8_000, index_interval_bytes=1000)
    sent = []
    for i in range(60):
        batch = build(1 + i % 7, ts=10_000 + i * 10, value_size=50 + (i * 37) % 400, codec=i % 5)
        sent.append(batch)
        result = plog.append(batch, now_ms=1, leader_epoch=7)
        assert result.log_start_offset == 0 and result.log_append_time == -1
    infos = plog.segments()
    assert len(infos) >= 3 and [i.is_active for i in infos] == [False] * (len(infos) - 1) + [True]
    assert all(i.size <= 8_000 for i in infos)
    stored = check_partition_files(plog, 1000)
    assert len(stored) == len(sent)
    offset = 0
    for original, batch in zip(sent, stored):
        # Byte-for-byte what the producer sent, but for the assigned offset and leader epoch.
        assert batch.raw[8:12] == original[8:12] and batch.raw[16:] == original[16:]
        assert batch.base_offset == offset and batch.leader_epoch == 7
        offset = batch.last_offset + 1
    assert plog.log_end_offset == offset
    plog.close()
    # After close the active segment's time index is sealed with its max timestamp too.
    plog = open_log(tmp_path / "t-0", segment_bytes=8_000, index_interval_bytes=1000)
    check_partition_files(plog, 1000, sealed_active=True)
    plog.close()


def test_read_at_every_offset_returns_the_containing_batch(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0", segment_bytes=30_000, index_interval_bytes=512)
    for i in range(80):
        plog.append(build(1 + i % 9, value_size=30 + i * 11 % 300, codec=i % 5), now_ms=1)
    leo = plog.log_end_offset
    for offset in range(leo):
        result = plog.read(offset, 1)
        (batch,) = parse_batches(result.records)  # exactly one whole batch
        assert batch.base_offset <= offset <= batch.last_offset
        assert result.next_offset == batch.last_offset + 1
        assert result.high_watermark == leo and result.log_start_offset == 0
        # Records decode (compressed or not) and hold the offset asked for.
        assert offset in [r.offset for r in DefaultRecordBatch(result.records)]
        # A large read is whole batches from the same start, within one segment.
        big = plog.read(offset, 10_000)
        batches = parse_batches(big.records)
        assert batches[0].raw == batch.raw and len(big.records) <= 10_000
        assert big.next_offset == batches[-1].last_offset + 1
    assert plog.read(leo, 1000).records == b""
    plog.close()


def test_read_limits_and_bounds(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0")
    for _ in range(5):
        plog.append(build(10, value_size=200), now_ms=1)
    one = len(plog.read(0, 1).records)
    assert one > 200
    assert plog.read(0, one - 1, min_one_batch=False).records == b""
    assert len(plog.read(0, one - 1).records) == one
    assert len(plog.read(0, 2 * one + 1).records) == 2 * one
    assert len(plog.read(0, 10**9).records) == 5 * one
    # upper_bound is exclusive and only whole batches below it are returned.
    assert len(plog.read(0, 10**9, upper_bound=25).records) == 2 * one
    assert len(plog.read(0, 10**9, upper_bound=30).records) == 3 * one
    assert plog.read(20, 10**9, upper_bound=25).records == b""
    for bad in (-1, 51):
        with pytest.raises(OffsetOutOfRange) as err:
            plog.read(bad, 100)
        assert err.value.code == ErrorCode.offset_out_of_range and not err.value.is_remote
    plog.close()


def test_read_skips_headers_with_the_index_for_large_fetches(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0", index_interval_bytes=100)
    for _ in range(200):
        plog.append(build(3, value_size=100), now_ms=1)
    sizes = [b.size for b in parse_batches(plog.read(0, 10**9).records)]
    assert len(sizes) == 200
    for start in (0, 17, 150):
        for budget in (1, 1000, 5000, 12_345, 40_000):
            result = plog.read(start * 3, budget)
            got = parse_batches(result.records)
            expected, total = [], 0
            for s in sizes[start:]:
                if expected and total + s > budget:
                    break
                expected.append(s)
                total += s
            assert [b.size for b in got] == expected
            assert result.next_offset == got[-1].last_offset + 1
    plog.close()


def test_multi_batch_append_assigns_consecutive_offsets(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0", index_interval_bytes=0)
    records = build(3) + build(4, codec=1) + build(2)
    result = plog.append(records, now_ms=1)
    assert (result.base_offset, result.last_offset) == (0, 8)
    batches = check_partition_files(plog, 0)
    assert [(b.base_offset, b.last_offset) for b in batches] == [(0, 2), (3, 6), (7, 8)]
    plog.close()


def test_roll_by_segment_ms_uses_batch_timestamps(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0", segment_ms=1000)
    plog.append(build(1, ts=5_000), now_ms=0)
    plog.append(build(1, ts=5_900), now_ms=0)
    assert len(plog.segments()) == 1
    plog.append(build(1, ts=6_001), now_ms=0)  # 1001 ms after the segment's first batch
    assert [s.base_offset for s in plog.segments()] == [0, 2]
    plog.close()


def test_roll_by_segment_ms_without_timestamps_uses_wall_clock(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0", segment_ms=1000)
    plog.append(build(1, ts=-1, ts_step=0), now_ms=0)
    plog.roll(now_ms=100)  # the new active segment is created at t=100
    plog.append(build(1, ts=-1, ts_step=0), now_ms=200)
    plog.append(build(1, ts=-1, ts_step=0), now_ms=1_100)
    assert len(plog.segments()) == 2
    plog.append(build(1, ts=-1, ts_step=0), now_ms=1_101)
    assert [s.base_offset for s in plog.segments()] == [0, 1, 3]
    plog.close()


def test_forced_roll_and_segment_hooks(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0")
    assert plog.roll() == 0  # empty active segment: nothing to roll
    plog.append(build(5, ts=100), now_ms=1)
    assert plog.roll() == 5
    infos = plog.segments()
    assert [(i.base_offset, i.next_offset, i.is_active) for i in infos] == [(0, 5, False), (5, 5, True)]
    assert infos[0].max_timestamp == 104 and infos[1].max_timestamp == -1
    assert infos[1].log_path.exists() and infos[1].index_path.exists() and infos[1].timeindex_path.exists()
    plog.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shapes=st.lists(st.tuples(st.integers(1, 12), st.integers(0, 600), st.integers(0, 4)), min_size=1, max_size=40),
    interval=st.sampled_from([0, 64, 700, 4096]),
    segment_bytes=st.sampled_from([10_000, 50_000]),
)
def test_property_index_and_reads(tmp_path_factory, shapes, interval, segment_bytes) -> None:
    path = tmp_path_factory.mktemp("prop") / "t-0"
    plog = open_log(path, segment_bytes=segment_bytes, index_interval_bytes=interval)
    ts = 1_000
    for count, size, codec in shapes:
        plog.append(build(count, ts=ts, value_size=size, codec=codec), now_ms=1)
        ts += count * 3 - 7  # timestamps sometimes go back: the time index must only grow
    check_partition_files(plog, interval)
    for offset in range(plog.log_end_offset):
        (batch,) = parse_batches(plog.read(offset, 0).records)
        assert batch.base_offset <= offset <= batch.last_offset
    plog.close()
    reopened = open_log(path, segment_bytes=segment_bytes, index_interval_bytes=interval)
    check_partition_files(reopened, interval, sealed_active=True)
    reopened.close()


# ------------------------------------------------------------------------------------------
# recovery
# ------------------------------------------------------------------------------------------
def test_recovery_truncates_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "t-0"
    plog = open_log(path, index_interval_bytes=300)
    for _ in range(10):
        plog.append(build(4, value_size=150), now_ms=1)
    plog.close()
    active = path / "00000000000000000000.log"
    data = active.read_bytes()
    last = parse_batches(data)[-1]
    with open(active, "r+b") as f:
        f.truncate(last.position + last.size // 2)  # a crash mid-write of the last batch
    (path / RECOVERY_POINT_FILE).write_text("0\n36\n")  # ... before that batch was flushed
    plog = open_log(path, index_interval_bytes=300)
    assert plog.log_end_offset == 36
    assert active.stat().st_size == last.position
    (aside,) = path.glob("00000000000000000000.log.truncated-*")  # the cut bytes, moved aside
    assert aside.read_bytes() == data[last.position : last.position + last.size // 2]
    check_partition_files(plog, 300, sealed_active=True)
    for offset in range(36):
        (batch,) = parse_batches(plog.read(offset, 1).records)
        assert batch.base_offset <= offset <= batch.last_offset
    assert plog.append(build(4), now_ms=1).base_offset == 36
    plog.close()


@pytest.mark.parametrize("garbage", [b"\x00" * 5000, b"\xff" * 7, b"junk" * 100], ids=["zeros", "short", "junk"])
def test_recovery_drops_trailing_garbage(tmp_path: Path, garbage: bytes) -> None:
    path = tmp_path / "t-0"
    plog = open_log(path)
    plog.append(build(3), now_ms=1)
    plog.close()
    with open(path / "00000000000000000000.log", "ab") as f:
        f.write(garbage)
    plog = open_log(path)
    assert plog.log_end_offset == 3
    assert len(parse_batches((path / "00000000000000000000.log").read_bytes())) == 1
    plog.close()


def test_recovery_cuts_a_corrupt_batch_and_every_later_segment(tmp_path: Path) -> None:
    path = tmp_path / "t-0"
    plog = open_log(path, segment_bytes=5_000)
    for _ in range(30):
        plog.append(build(2, value_size=400), now_ms=1)
    infos = plog.segments()
    assert len(infos) >= 4
    plog.close()
    victim = infos[1]
    batches = parse_batches(victim.log_path.read_bytes())
    bad = batches[2]
    with open(victim.log_path, "r+b") as f:  # flip one byte of a record body
        f.seek(bad.position + bad.size - 3)
        byte = f.read(1)
        f.seek(bad.position + bad.size - 3)
        f.write(bytes([byte[0] ^ 0x55]))
    (path / RECOVERY_POINT_FILE).unlink()  # as after a crash before anything was checkpointed
    plog = open_log(path, segment_bytes=5_000)
    assert plog.log_end_offset == bad.base_offset
    assert [s.base_offset for s in plog.segments()] == [infos[0].base_offset, victim.base_offset]
    for later in infos[2:]:
        assert not later.log_path.exists() and not later.index_path.exists()
        assert len(list(path.glob(later.log_path.name + ".truncated-*"))) == 1  # moved aside, not deleted
    check_partition_files(plog, 4096, sealed_active=True)
    assert plog.append(build(1), now_ms=1).base_offset == bad.base_offset
    plog.close()


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x5A]))


@pytest.mark.parametrize("clean", [True, False], ids=["clean-shutdown", "below-recovery-point"])
def test_damage_in_trusted_batches_is_never_cut_and_reads_report_it(tmp_path: Path, clean: bool) -> None:
    """After a clean shutdown nothing is verified; after a crash nothing below the recovery
    point is. A flipped record byte and a destroyed header stay on disk; reads of them answer
    CORRUPT_MESSAGE, everything else stays readable and the log goes on after them."""
    path = tmp_path / "t-0"
    plog = open_log(path, index_interval_bytes=300)
    for _ in range(30):
        plog.append(build(3, value_size=150), now_ms=1)
    plog.close()  # recovery point = log end = 90
    seg = path / "00000000000000000000.log"
    batches = parse_batches(seg.read_bytes())
    _flip(seg, batches[10].position + batches[10].size - 3)  # record bytes: the CRC fails
    _flip(seg, batches[20].position + 16)  # the magic byte: an impossible header
    _flip(seg, batches[25].position + 2)  # the base offset, which the CRC does not cover
    damaged = seg.read_bytes()
    if clean:
        (path / RECOVERY_POINT_FILE).unlink()  # the marker alone decides: nothing is verified
    flags = {"clean_shutdown": True} if clean else {}  # a crash: only the recovery point protects
    plog = PartitionLog.open(path, LogConfig.from_dict({"index.interval.bytes": "300"}), **flags)
    assert seg.read_bytes() == damaged and not list(path.glob("*.truncated-*"))
    assert plog.log_end_offset == 90
    for bad in (batches[10], batches[20], batches[25]):
        for offset in (bad.base_offset, bad.last_offset):
            with pytest.raises(LogError) as err:
                plog.read(offset, 1 << 20)
            assert err.value.code == ErrorCode.corrupt_message and str(seg) in str(err.value)
    served = parse_batches(plog.read(batches[22].base_offset, 1 << 20).records)
    assert [b.base_offset for b in served] == [batches[22].base_offset, batches[23].base_offset, batches[24].base_offset]
    served = parse_batches(plog.read(batches[8].base_offset, 1 << 20).records)
    assert [b.base_offset for b in served] == [batches[8].base_offset, batches[9].base_offset]
    served = parse_batches(plog.read(batches[15].base_offset, 1 << 20).records)  # stops before the bad header
    assert [b.base_offset for b in served] == [b.base_offset for b in batches[15:20]]
    for good in (batches[11], batches[21], batches[26], batches[29]):  # the walk resumed after the bad headers
        (first, *_rest) = parse_batches(plog.read(good.base_offset, 1 << 20).records)
        assert first.base_offset == good.base_offset
    assert plog.append(build(2), now_ms=1).base_offset == 90  # into a new segment after the damage
    assert parse_batches(plog.read(90, 1 << 20).records)[0].base_offset == 90
    assert [s.base_offset for s in plog.segments()] == [0, 90]
    plog.close()
    assert seg.read_bytes() == damaged


def test_missing_or_corrupt_indexes_are_rebuilt_identically(tmp_path: Path) -> None:
    path = tmp_path / "t-0"
    plog = open_log(path, segment_bytes=8_000, index_interval_bytes=200)
    for i in range(40):
        plog.append(build(3, ts=1_000 + 5 * i, value_size=120), now_ms=1)
    infos = plog.segments()
    plog.close()
    originals = {p: p.read_bytes() for i in infos for p in (i.index_path, i.timeindex_path)}
    infos[0].index_path.unlink()
    infos[1].timeindex_path.write_bytes(b"\x00" * 25)  # not a multiple of 12
    infos[2].index_path.write_bytes(struct.pack(">ii", 999, 8))  # points inside a batch
    infos[-1].timeindex_path.write_bytes(originals[infos[-1].timeindex_path][:-12] + struct.pack(">qi", 1, 0))
    plog = open_log(path, segment_bytes=8_000, index_interval_bytes=200)
    for p, data in originals.items():
        assert p.read_bytes() == data, p.name
    for offset in range(plog.log_end_offset):
        (batch,) = parse_batches(plog.read(offset, 1).records)
        assert batch.base_offset <= offset <= batch.last_offset
    plog.close()


def test_orphan_and_stray_files_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "t-0"
    plog = open_log(path)
    plog.append(build(1), now_ms=1)
    plog.close()
    (path / "00000000000000000042.index").write_bytes(b"")
    (path / "00000000000000000042.timeindex").write_bytes(b"")
    (path / "00000000000000000007.log.deleted").write_bytes(b"x")
    (path / "leader-epoch-checkpoint").write_text("0\n0\n")  # not ours: left alone
    (path / "00000000000000000000.log.truncated-1700000000000").write_bytes(b"x")  # moved aside: the operator's
    (path / "00000000000000000000.log.truncated-1700000000001.tmp").write_bytes(b"x")  # a crash mid-copy
    plog = open_log(path)
    names = sorted(p.name for p in path.iterdir())
    assert "00000000000000000042.index" not in names and "00000000000000000007.log.deleted" not in names
    assert "leader-epoch-checkpoint" in names
    assert "00000000000000000000.log.truncated-1700000000000" in names
    assert "00000000000000000000.log.truncated-1700000000001.tmp" not in names
    plog.close()


CRASH_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from aiokafka.record.default_records import DefaultRecordBatchBuilder
    from kcli.storage.log import PartitionLog
    from kcli.storage.log_config import LogConfig

    plog = PartitionLog.open(Path(sys.argv[1]), LogConfig.from_dict({"segment.bytes": "300000"}))
    seq = plog.producer_state.last_entry(7).last_seq + 1 if 7 in plog.producer_state else 0
    while True:
        b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0,
                                      producer_id=7, producer_epoch=0, base_sequence=seq, batch_size=1 << 30)
        for i in range(50):
            b.append(i, timestamp=1000, key=None, value=b"x" * 1000, headers=[])
        r = plog.append(bytes(b.build()), now_ms=1)
        plog.flush()
        seq += 50
        print(r.last_offset, flush=True)
    """
)


def test_killed_writer_process_recovers_with_acknowledged_data(tmp_path: Path) -> None:
    path = tmp_path / "t-0"
    script = tmp_path / "child.py"
    script.write_text(CRASH_CHILD)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    acked = -1
    for round_ in range(2):
        child = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE, env=env, text=True)
        assert child.stdout is not None
        for _ in range(30 + round_ * 10):
            acked = int(child.stdout.readline())
        child.send_signal(signal.SIGKILL)
        child.wait()
        plog = open_log(path, segment_bytes=300_000)
        assert plog.log_end_offset > acked
        assert plog.log_end_offset % 50 == 0  # only whole batches survive
        check_partition_files(plog, 4096, exact=False)
        entry = plog.producer_state.last_entry(7)
        assert entry is not None and entry.last_offset == plog.log_end_offset - 1
        plog.close()


# ------------------------------------------------------------------------------------------
# retention, log start, tiered hooks
# ------------------------------------------------------------------------------------------
def _fill(plog: PartitionLog, segments: int, *, ts0: int = 1_000) -> None:
    """One 10-record batch per segment, rolled after each, timestamps ts0, ts0+1000, ..."""
    for i in range(segments):
        plog.append(build(10, ts=ts0 + i * 1000, ts_step=0), now_ms=1)
        plog.roll(now_ms=1)


def test_retention_by_time_deletes_old_whole_segments(tmp_path: Path) -> None:
    path = tmp_path / "t-0"
    plog = open_log(path, retention_ms=2_500)
    _fill(plog, 5)  # max timestamps 1000..5000, then an empty active segment
    assert plog.delete_retention(now_ms=5_000) == 2  # 1000 and 2000 are more than 2500 ms old
    assert [s.base_offset for s in plog.segments()] == [20, 30, 40, 50]
    assert plog.log_start_offset == 20
    assert not (path / "00000000000000000000.log").exists()
    with pytest.raises(OffsetOutOfRange):
        plog.read(19, 100)
    assert plog.delete_retention(now_ms=5_000) == 0
    plog.close()
    plog = open_log(path, retention_ms=2_500)
    assert plog.log_start_offset == 20 and plog.log_end_offset == 50
    plog.close()


def test_retention_never_removes_the_last_data_without_rolling(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0", retention_ms=1_000)
    plog.append(build(10, ts=1_000), now_ms=1)
    plog.append(build(10, ts=1_100), now_ms=1)
    # Everything expired, active segment included: Kafka rolls, then deletes the old one.
    assert plog.delete_retention(now_ms=100_000) == 1
    assert [(s.base_offset, s.size) for s in plog.segments()] == [(20, 0)]
    assert plog.log_start_offset == 20 and plog.log_end_offset == 20
    assert plog.read(20, 100).records == b""
    assert plog.append(build(1), now_ms=1).base_offset == 20
    plog.close()


def test_retention_by_bytes_and_unlimited(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0", retention_bytes=-1, retention_ms=-1)
    _fill(plog, 6)
    assert plog.delete_retention(now_ms=10**12) == 0
    one = plog.segments()[0].size
    plog.update_config(LogConfig.from_dict({"retention.bytes": str(3 * one + one // 2), "retention.ms": "-1"}))
    # Kafka deletes oldest segments only while the rest still holds >= retention.bytes.
    assert plog.delete_retention(now_ms=10**12) == 2
    assert plog.size_in_bytes == 4 * one
    assert plog.log_start_offset == 20
    plog.close()


def test_compact_only_topics_keep_segments(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0", retention_ms=1, cleanup_policy="compact")
    _fill(plog, 3)
    assert plog.delete_retention(now_ms=10**12) == 0
    plog.close()


def test_delete_records_before(tmp_path: Path) -> None:
    path = tmp_path / "t-0"
    plog = open_log(path)
    _fill(plog, 4)  # segments [0,10) [10,20) [20,30) [30,40) + active at 40
    assert plog.delete_records_before(25) == 25
    assert [s.base_offset for s in plog.segments()] == [20, 30, 40]
    with pytest.raises(OffsetOutOfRange):
        plog.read(24, 100)
    (batch,) = parse_batches(plog.read(25, 1).records)  # the batch containing 25 starts at 20
    assert batch.base_offset == 20
    assert plog.delete_records_before(5) == 25  # never moves backwards
    with pytest.raises(OffsetOutOfRange) as err:
        plog.delete_records_before(41)
    assert err.value.code == ErrorCode.offset_out_of_range
    plog.close()
    plog = open_log(path)
    assert plog.log_start_offset == 25
    assert plog.delete_records_before(-1) == 40
    assert [s.base_offset for s in plog.segments()] == [40]
    plog.close()
    assert (path / LOG_START_OFFSET_FILE).read_text() == "0\n40\n"


def test_log_start_past_the_end_on_open_starts_an_empty_log_there(tmp_path: Path) -> None:
    path = tmp_path / "t-0"
    plog = open_log(path)
    plog.append(build(5), now_ms=1)
    plog.close()
    (path / LOG_START_OFFSET_FILE).write_text("0\n1000\n")
    plog = open_log(path)
    assert (plog.log_start_offset, plog.log_end_offset) == (1000, 1000)
    assert [s.base_offset for s in plog.segments()] == [1000]
    assert not (path / "00000000000000000000.log").exists()
    assert len(list(path.glob("00000000000000000000.log.truncated-*"))) == 1  # moved aside, not deleted
    assert plog.append(build(1), now_ms=1).base_offset == 1000
    plog.close()


def test_tiered_hooks_move_local_start_only(tmp_path: Path) -> None:
    path = tmp_path / "t-0"
    plog = open_log(path)
    _fill(plog, 4)
    assert plog.delete_local_segments_below(25) == 2  # [0,10) and [10,20); [20,30) holds 25
    assert (plog.log_start_offset, plog.local_log_start_offset) == (0, 20)
    with pytest.raises(OffsetOutOfRange) as err:
        plog.read(15, 100)
    assert err.value.is_remote
    assert plog.offset_for_timestamp(-4) == (20, -1)
    assert plog.offset_for_timestamp(-2) == (0, -1)
    assert plog.delete_local_segments_below(10**6) == 2  # never the active segment
    assert [s.base_offset for s in plog.segments()] == [40]
    plog.close()
    plog = open_log(path)
    assert (plog.log_start_offset, plog.local_log_start_offset) == (0, 40)
    plog.set_log_start_offset(35)
    assert (plog.log_start_offset, plog.local_log_start_offset) == (35, 40)
    with pytest.raises(OffsetOutOfRange):
        plog.set_log_start_offset(41)
    plog.close()


# ------------------------------------------------------------------------------------------
# produce validation, idempotence, LogAppendTime
# ------------------------------------------------------------------------------------------
def _recrc(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


def _corrupt_crc(b: bytes) -> bytes:
    out = bytearray(b)
    out[-1] ^= 1
    return bytes(out)


def _bad_magic(b: bytes) -> bytes:
    out = bytearray(b)
    out[16] = 1
    return bytes(out)


def _count_mismatch(b: bytes) -> bytes:
    out = bytearray(b)
    struct.pack_into(">i", out, 57, 5)
    return _recrc(out)


def _nonzero_base(b: bytes) -> bytes:
    out = bytearray(b)
    struct.pack_into(">q", out, 0, 42)  # outside the CRC
    return bytes(out)


def _control(b: bytes) -> bytes:
    out = bytearray(b)
    struct.pack_into(">h", out, 21, struct.unpack_from(">h", out, 21)[0] | 0x20)
    return _recrc(out)


@pytest.mark.parametrize(
    "mangle, code",
    [
        (_corrupt_crc, ErrorCode.corrupt_message),
        (_bad_magic, ErrorCode.corrupt_message),
        (lambda b: b[:-10], ErrorCode.corrupt_message),
        (lambda b: b + b[:30], ErrorCode.corrupt_message),
        (_count_mismatch, ErrorCode.invalid_record),
        (_nonzero_base, ErrorCode.invalid_record),
        (_control, ErrorCode.invalid_record),
        (lambda b: b"", ErrorCode.invalid_record),
    ],
    ids=["crc", "magic", "truncated", "trailing-partial", "count", "base-offset", "control", "empty"],
)
def test_invalid_batches_are_rejected_and_nothing_is_written(tmp_path: Path, mangle, code) -> None:
    plog = open_log(tmp_path / "t-0")
    plog.append(build(2), now_ms=1)
    size = plog.size_in_bytes
    with pytest.raises(LogError) as err:
        plog.append(mangle(build(3)), now_ms=1)
    assert err.value.code == code
    assert plog.log_end_offset == 2 and plog.size_in_bytes == size
    # A bad second batch rejects the whole append.
    if mangle(build(3)):
        with pytest.raises(LogError):
            plog.append(build(1) + mangle(build(3)), now_ms=1)
    assert plog.log_end_offset == 2 and plog.size_in_bytes == size
    plog.close()


def test_size_limits(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0", max_message_bytes=1000, segment_bytes=3000)
    plog.append(build(1, value_size=500), now_ms=1)
    with pytest.raises(LogError) as err:
        plog.append(build(1, value_size=2000), now_ms=1)
    assert err.value.code == ErrorCode.message_too_large
    with pytest.raises(LogError) as err:
        plog.append(build(1, value_size=900) * 4, now_ms=1)
    assert err.value.code == ErrorCode.record_list_too_large
    plog.close()


def test_coordinator_origin_may_write_control_batches(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0")
    marker = _control(bytearray(build(1, pid=5, epoch=2, seq=0, transactional=True)))
    result = plog.append(marker, now_ms=1, origin=AppendOrigin.COORDINATOR)
    assert result.base_offset == 0
    assert plog.producer_state.last_entry(5).producer_epoch == 2
    plog.close()


def test_idempotent_producer_duplicates_gaps_and_fencing(tmp_path: Path) -> None:
    path = tmp_path / "t-0"
    plog = open_log(path)
    first = plog.append(build(5, pid=1000, epoch=0, seq=0), now_ms=1)
    second = plog.append(build(3, pid=1000, epoch=0, seq=5), now_ms=1)
    assert (first.base_offset, second.base_offset) == (0, 5)
    size = plog.size_in_bytes
    dup = plog.append(build(5, pid=1000, epoch=0, seq=0), now_ms=1)
    assert dup.duplicate and (dup.base_offset, dup.last_offset) == (0, 4)
    assert plog.size_in_bytes == size and plog.log_end_offset == 8
    with pytest.raises(LogError) as err:
        plog.append(build(1, pid=1000, epoch=0, seq=9), now_ms=1)  # 8 is missing
    assert err.value.code == ErrorCode.out_of_order_sequence_number
    plog.append(build(1, pid=1000, epoch=1, seq=0), now_ms=1)  # epoch bump restarts at 0
    with pytest.raises(LogError) as err:
        plog.append(build(1, pid=1000, epoch=0, seq=8), now_ms=1)
    assert err.value.code == ErrorCode.invalid_producer_epoch
    with pytest.raises(LogError) as err:
        plog.append(build(1, pid=1000, epoch=2, seq=1), now_ms=1)
    assert err.value.code == ErrorCode.out_of_order_sequence_number
    # Unknown producers may start anywhere; non-idempotent batches are not tracked.
    assert plog.append(build(2, pid=2000, epoch=0, seq=77), now_ms=1).base_offset == 9
    plog.append(build(2), now_ms=1)
    assert plog.size_in_bytes > size
    # Negative sequence with a producer id is invalid.
    with pytest.raises(LogError) as err:
        plog.append(build(1, pid=3000, epoch=0, seq=-1), now_ms=1)
    assert err.value.code == ErrorCode.invalid_record
    plog.close()

    plog = open_log(path)  # producer state comes back from the batch headers
    dup = plog.append(build(2, pid=2000, epoch=0, seq=77), now_ms=1)
    assert dup.duplicate and dup.base_offset == 9
    with pytest.raises(LogError) as err:
        plog.append(build(1, pid=1000, epoch=1, seq=5), now_ms=1)
    assert err.value.code == ErrorCode.out_of_order_sequence_number
    with pytest.raises(LogError) as err:
        plog.append(build(1, pid=1000, epoch=0, seq=8), now_ms=1)
    assert err.value.code == ErrorCode.invalid_producer_epoch
    assert plog.append(build(1, pid=1000, epoch=1, seq=1), now_ms=1).base_offset == 13
    plog.close()


def test_duplicate_survives_segment_deletion_until_restart(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0")
    plog.append(build(2, pid=1, epoch=0, seq=0), now_ms=1)
    plog.roll(now_ms=1)
    plog.delete_records_before(2)
    assert plog.segments()[0].base_offset == 2
    assert plog.append(build(2, pid=1, epoch=0, seq=0), now_ms=1).duplicate
    plog.close()


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_log_append_time_rewrites_header_with_a_valid_crc(tmp_path: Path, codec: str) -> None:
    plog = open_log(tmp_path / "t-0", message_timestamp_type="LogAppendTime")
    result = plog.append(build(4, ts=1_000, codec=CODECS[codec]), now_ms=1_700_000_000_123)
    assert result.log_append_time == 1_700_000_000_123
    (batch,) = parse_batches(plog.read(0, 10**6).records)  # parse_batches checks the CRC
    assert batch.attributes & 0x08 and batch.max_timestamp == 1_700_000_000_123
    assert batch.first_timestamp == 1_000  # Kafka leaves the base timestamp alone
    decoded = DefaultRecordBatch(batch.raw)
    assert decoded.validate_crc()
    assert [r.timestamp for r in decoded] == [1_700_000_000_123] * 4
    plog.close()


def test_log_append_time_by_argument_and_duplicate_keeps_original_time(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0")
    r1 = plog.append(build(1, pid=1, epoch=0, seq=0), now_ms=5_000, log_append_time=True)
    assert r1.log_append_time == 5_000
    dup = plog.append(build(1, pid=1, epoch=0, seq=0), now_ms=9_000, log_append_time=True)
    assert dup.duplicate and dup.log_append_time == 5_000
    create = plog.append(build(1, ts=123), now_ms=9_000)
    assert create.log_append_time == -1
    plog.close()


# ------------------------------------------------------------------------------------------
# timestamps, metadata, lifecycle, config
# ------------------------------------------------------------------------------------------
def test_offset_for_timestamp_finds_the_first_record(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0", segment_bytes=4_000, index_interval_bytes=100)
    for i in range(30):
        plog.append(build(10, ts=10_000 + i * 100, ts_step=10, value_size=50, codec=i % 5), now_ms=1)
    assert len(plog.segments()) >= 3
    # Record k (0-based) has timestamp 10_000 + 10 * k: exact answers for any target.
    for target in (0, 10_000, 10_005, 10_010, 11_234, 12_990, 12_991 - 1):
        k = max(0, -(-(target - 10_000) // 10))
        assert plog.offset_for_timestamp(target) == (k, 10_000 + 10 * k)
    assert plog.offset_for_timestamp(12_991) is None
    assert plog.offset_for_timestamp(-1) == (300, -1)
    assert plog.offset_for_timestamp(-2) == (0, -1)
    assert plog.offset_for_timestamp(-3) == (299, 12_990)
    plog.delete_records_before(105)
    assert plog.offset_for_timestamp(0) == (105, 11_050)  # never below the log start
    plog.close()


def test_offset_for_timestamp_with_out_of_order_timestamps(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0", index_interval_bytes=0)
    plog.append(build(3, ts=5_000), now_ms=1)  # 5000..5002
    plog.append(build(3, ts=1_000), now_ms=1)  # older records later in the log
    plog.append(build(3, ts=6_000), now_ms=1)
    assert plog.offset_for_timestamp(1_500) == (0, 5_000)
    assert plog.offset_for_timestamp(5_002) == (2, 5_002)
    assert plog.offset_for_timestamp(5_003) == (6, 6_000)
    plog.close()


def test_flush_moves_and_persists_the_recovery_point(tmp_path: Path) -> None:
    path = tmp_path / "t-0"
    plog = open_log(path)
    plog.append(build(3), now_ms=1)
    plog.flush()
    assert plog.recovery_point == 3
    plog.flush()  # nothing new: no-op
    plog.roll(now_ms=1)
    plog.append(build(2), now_ms=1)
    assert plog.recovery_point == 3
    plog.flush()
    assert plog.recovery_point == 5
    assert (path / RECOVERY_POINT_FILE).read_text() == "0\n5\n"
    plog.close()
    assert (path / RECOVERY_POINT_FILE).read_text() == "0\n5\n"


def test_flush_from_a_worker_thread_while_appending(tmp_path: Path) -> None:
    import threading

    plog = open_log(tmp_path / "t-0", segment_bytes=20_000, retention_bytes=40_000)
    stop = threading.Event()
    errors: list[BaseException] = []

    def flusher() -> None:
        while not stop.is_set():
            try:
                plog.flush()
            except BaseException as exc:  # surfaced below
                errors.append(exc)
                return

    worker = threading.Thread(target=flusher)
    worker.start()
    deleted = 0
    try:
        for _ in range(300):
            plog.append(build(5, value_size=200), now_ms=1)
            deleted += plog.delete_retention(now_ms=1)  # deletes segments the flusher may be syncing
    finally:
        stop.set()
        worker.join()
    assert not errors and deleted > 5 and plog.log_start_offset > 0
    plog.flush()
    assert plog.recovery_point == plog.log_end_offset == 1500
    plog.close()


def test_partition_metadata_file(tmp_path: Path) -> None:
    topic_id = uuid.UUID("1ea4a7d8-4f8e-4c1b-9d9a-0f5c7e6b2a31")
    path = write_partition_metadata(tmp_path, topic_id)
    text = path.read_text()
    assert path.name == "partition.metadata"
    assert text == "version: 0\ntopic_id: HqSn2E-OTBudmg9cfmsqMQ"  # Kafka's Uuid.toString()
    assert read_partition_metadata(tmp_path) == topic_id
    assert read_partition_metadata(tmp_path / "missing") is None
    path.write_text("version: 3\n")
    with pytest.raises(LogError):
        read_partition_metadata(tmp_path)


def test_closed_log_refuses_work_and_delete_removes_the_directory(tmp_path: Path) -> None:
    path = tmp_path / "t-0"
    plog = open_log(path)
    plog.append(build(1), now_ms=1)
    plog.close()
    plog.close()  # idempotent
    with pytest.raises(LogError):
        plog.append(build(1), now_ms=1)
    plog = open_log(path)
    assert plog.log_end_offset == 1
    plog.delete()
    assert not path.exists()


def test_log_config_from_kafka_strings() -> None:
    cfg = LogConfig.from_dict(
        {
            "segment.bytes": "1048576",
            "retention.ms": "-1",
            "message.timestamp.type": "LogAppendTime",
            "cleanup.policy": "compact,delete",
            "flush.ms": "10",
            "remote.storage.enable": "true",
        }
    )
    assert cfg.segment_bytes == 1048576 and cfg.retention_ms == -1 and cfg.log_append_time and cfg.delete_enabled
    assert cfg.max_message_bytes == 1048588 and cfg.index_interval_bytes == 4096 and cfg.retention_bytes == -1
    assert LogConfig.from_dict(cfg.to_dict()) == cfg
    for bad in ({"segment.bytes": "ten"}, {"segment.bytes": "13"}, {"message.timestamp.type": "Now"},
                {"retention.ms": "-2"}, {"cleanup.policy": "keep"}, {"max.message.bytes": str(2**31)}):
        with pytest.raises(LogError) as err:
            LogConfig.from_dict(bad)
        assert err.value.code == 40 and list(bad)[0] in str(err.value)
