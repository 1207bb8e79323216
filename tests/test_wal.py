"""WAL segment objects: layout, parsing, damage reporting, and the produce → commit → fetch loop."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from kcli.diskless.wal import (
    UnknownWalVersion,
    WalBuilder,
    WalError,
    commit_batch_requests,
    new_object_key,
    parse_wal,
)
from kcli.records.batch import crc_is_valid, read_header
from plugins.coordinator.base import (
    CreateTopicAndPartitionsRequest,
    FindBatchRequest,
    TimestampType,
    TopicIdPartition,
)
from plugins.coordinator.sqlite import SqliteBatchCoordinator
from plugins.objectstore import ByteRange, ObjectStorage
from plugins.objectstore.local import LocalObjectStorage
from plugins.objectstore.s3 import S3ObjectStorage
from tests.fixtures_s3 import moto_server, s3_bucket, s3_env  # noqa: F401

TOPIC = uuid.uuid4()
A0 = TopicIdPartition(TOPIC, "orders", 0)
A1 = TopicIdPartition(TOPIC, "orders", 1)
B0 = TopicIdPartition(uuid.uuid4(), "audit", 0)


def batch(n: int = 3, *, tag: bytes = b"v", pid: int = -1, epoch: int = -1, seq: int = -1,
          ts: int = 1_700_000_000_000) -> bytes:
    """A real v2 record batch as a producer sends it (base offset 0)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=pid,
                                        producer_epoch=epoch, base_sequence=seq, batch_size=1 << 20)
    for i in range(n):
        builder.append(i, timestamp=ts + i, key=b"k%d" % i, value=tag * (10 + i), headers=[])
    return bytes(builder.build())


def test_layout_groups_partitions_in_first_seen_order() -> None:
    added = [(A1, batch(1, tag=b"a")), (B0, batch(2, tag=b"b")), (A1, batch(3, tag=b"c")),
             (A0, batch(4, tag=b"d")), (B0, batch(5, tag=b"e"))]
    builder = WalBuilder()
    indexes = [builder.add(tip, data) for tip, data in added]
    assert indexes == [0, 1, 2, 3, 4]
    assert len(builder) == 5
    assert builder.partitions == [A1, B0, A0]
    data, refs = builder.build()
    assert builder.size == len(data)
    assert data[0] == 0
    # Partition by partition, insertion order inside each: A1(0,2), B0(1,4), A0(3).
    assert [r.request_index for r in refs] == [0, 2, 1, 4, 3]
    assert [r.tip for r in refs] == [A1, A1, B0, B0, A0]
    assert refs[0].byte_offset == 1
    position = 1
    for ref in refs:
        assert ref.byte_offset == position
        assert data[ref.byte_offset : ref.byte_offset + ref.size] == added[ref.request_index][1]
        position += ref.size
    assert position == len(data)


def test_parse_roundtrip_matches_refs() -> None:
    builder = WalBuilder()
    for i in range(6):
        builder.add([A0, A1, B0][i % 3], batch(i + 1))
    data, refs = builder.build()
    wal = parse_wal(data)
    assert wal.version == 0
    assert wal.invalid_bytes == 0 and wal.error is None
    assert wal.size == wal.valid_size == len(data)
    assert [(h.position, h.size) for h in wal.batches] == [(r.byte_offset, r.size) for r in refs]
    assert [h.records_count for h in wal.batches] == [1, 4, 2, 5, 3, 6]
    assert all(crc_is_valid(data, h) for h in wal.batches)


def test_empty_builder_is_just_the_version_byte() -> None:
    data, refs = WalBuilder().build()
    assert data == b"\x00" and refs == []
    wal = parse_wal(data)
    assert wal.batches == [] and wal.invalid_bytes == 0


@pytest.mark.parametrize("version", [1, 2, 255])
def test_unknown_version_is_refused(version: int) -> None:
    data = bytes([version]) + batch()
    with pytest.raises(UnknownWalVersion, match=f"unsupported WAL segment version {version}") as info:
        parse_wal(data)
    assert info.value.version == version
    assert isinstance(info.value, WalError)


def test_empty_object_is_an_error() -> None:
    with pytest.raises(WalError, match="no version byte"):
        parse_wal(b"")


@pytest.mark.parametrize("cut", [1, 12, 60, 61, 100])
def test_truncated_tail_is_reported(cut: int) -> None:
    builder = WalBuilder()
    builder.add(A0, batch(2))
    builder.add(A0, batch(3))
    data, refs = builder.build()
    damaged = data[: len(data) - cut]
    wal = parse_wal(damaged)
    assert len(wal.batches) == 1
    assert wal.valid_size == refs[1].byte_offset
    assert wal.invalid_bytes == refs[1].size - cut
    assert wal.error and ("truncated" in wal.error or "needs" in wal.error)


def test_garbage_after_batches_is_reported() -> None:
    builder = WalBuilder()
    builder.add(A0, batch(2))
    data, _ = builder.build()
    garbage = b"\xff" * 80
    wal = parse_wal(data + garbage)
    assert len(wal.batches) == 1
    assert wal.invalid_bytes == 80
    assert "magic" in (wal.error or "") or "length" in (wal.error or "")


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", "truncated batch header"),
        (b"\x00" * 30, "truncated batch header"),
        (None, "expected exactly one batch"),
        ("two", "expected exactly one batch"),
        ("magic", "magic"),
    ],
)
def test_add_accepts_exactly_one_v2_batch(payload: bytes | str | None, message: str) -> None:
    good = batch()
    if payload is None:
        payload = good[:-1]
    elif payload == "two":
        payload = good + good
    elif payload == "magic":
        bad = bytearray(good)
        bad[16] = 1
        payload = bytes(bad)
    builder = WalBuilder()
    with pytest.raises(WalError, match=message):
        builder.add(A0, payload)
    assert len(builder) == 0 and builder.size == 1


def test_object_keys_are_prefixed_uuid4() -> None:
    key = new_object_key()
    prefix, _, name = key.partition("/")
    assert prefix == "wal"
    assert uuid.UUID(name).version == 4
    assert re.fullmatch(r"cluster-1/wal/[0-9a-f-]{36}", new_object_key("/cluster-1/wal/"))
    assert re.fullmatch(r"[0-9a-f-]{36}", new_object_key(""))
    assert new_object_key() != new_object_key()


def test_commit_batch_requests_carry_header_fields() -> None:
    builder = WalBuilder()
    builder.add(A0, batch(4, pid=77, epoch=3, seq=20, ts=1_000))
    builder.add(A1, batch(1))
    _, refs = builder.build()
    reqs = commit_batch_requests(refs)
    first = reqs[0]
    assert (first.request_id, first.topic_id_partition, first.byte_offset, first.size) == (0, A0, 1, refs[0].size)
    assert (first.base_offset, first.last_offset, first.batch_max_timestamp) == (0, 3, 1_003)
    assert (first.producer_id, first.producer_epoch, first.base_sequence, first.last_sequence) == (77, 3, 20, 23)
    assert first.message_timestamp_type == TimestampType.CREATE_TIME
    assert reqs[1].producer_id == -1 and reqs[1].base_sequence == -1
    forced = commit_batch_requests(refs, timestamp_type=lambda tip: TimestampType.LOG_APPEND_TIME)
    assert {r.message_timestamp_type for r in forced} == {1}


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStorage:
    if request.param == "local":
        return LocalObjectStorage(tmp_path / "objects")
    return S3ObjectStorage(request.getfixturevalue("s3_bucket"), "diskless")


def test_produce_commit_fetch_roundtrip(store: ObjectStorage, tmp_path: Path) -> None:
    """The diskless produce path end to end: build, upload, commit, find, ranged fetch."""
    coordinator = SqliteBatchCoordinator(tmp_path / "coordinator.db")
    coordinator.create_topic_and_partitions([CreateTopicAndPartitionsRequest(TOPIC, "orders", 2),
                                             CreateTopicAndPartitionsRequest(B0.topic_id, "audit", 1)])
    sent = {A0: [batch(2, tag=b"x"), batch(3, tag=b"y")], A1: [batch(5)], B0: [batch(1), batch(2)]}
    builder = WalBuilder()
    for i in range(3):
        for tip, batches in sent.items():
            if i < len(batches):
                builder.add(tip, batches[i])
    data, refs = builder.build()
    key = new_object_key()
    store.upload(key, data, len(data))
    responses = coordinator.commit_file(key, 1, len(data), commit_batch_requests(refs))
    assert [r.errors for r in responses] == [0] * len(refs)
    assert {(r.request.topic_id_partition, r.assigned_base_offset) for r in responses} == {
        (A0, 0), (A0, 2), (A1, 0), (B0, 0), (B0, 1)}

    found = coordinator.find_batches([FindBatchRequest(A0, 0, 1 << 20)], 1 << 20)[0]
    assert found.high_watermark == 5
    fetched = [store.fetch(b.object_key, ByteRange(b.metadata.byte_offset, b.metadata.byte_size))
               for b in found.batches]
    assert fetched == sent[A0]
    assert [read_header(f).records_count for f in fetched] == [2, 3]
    assert [b.metadata.base_offset for b in found.batches] == [0, 2]

    # Commit a second object for the same partition: offsets continue without a gap.
    builder = WalBuilder()
    builder.add(A0, batch(4))
    data2, refs2 = builder.build()
    key2 = new_object_key()
    store.upload(key2, data2, len(data2))
    assert coordinator.commit_file(key2, 1, len(data2), commit_batch_requests(refs2))[0].assigned_base_offset == 5
    coordinator.close()
