"""Write Kafka-format segments, indexes and WAL objects from scratch (tests, benchmarks, demos).

Batches come from aiokafka's DefaultRecordBatchBuilder (what a real producer sends); the broker's
part is imitated the way Kafka's LogSegment.append does it: base offset patched into the first
8 bytes, an offset-index entry (relative last offset, position) and a time-index entry
(max timestamp so far, relative offset of that batch) each time more than
``index_interval_bytes`` were appended since the last entry.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from aiokafka.record._crecords import DefaultRecordBatchBuilder
from crc32c import crc32c

CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
Record = tuple  # (key: bytes|None, value: bytes|None, headers: list[tuple[str, bytes|None]])


def build_batch(
    records: Sequence[Record],
    base_offset: int = 0,
    timestamps: Sequence[int] | None = None,
    compression: str = "none",
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    partition_leader_epoch: int = 0,
    log_append_time: int | None = None,
    offset_deltas: Sequence[int] | None = None,
) -> bytes:
    """One v2 batch as a producer would build it, with the broker's base offset applied."""
    builder = DefaultRecordBatchBuilder(
        2, CODEC_IDS[compression], int(transactional), producer_id, producer_epoch, base_sequence, 1 << 30
    )
    for i, (key, value, headers) in enumerate(records):
        ts = timestamps[i] if timestamps is not None else 1_700_000_000_000 + i
        delta = offset_deltas[i] if offset_deltas is not None else i
        builder.append(delta, ts, key, value, list(headers))
    buf = bytearray(builder.build())
    struct.pack_into(">q", buf, 0, base_offset)
    struct.pack_into(">i", buf, 12, partition_leader_epoch)
    if log_append_time is not None:
        attrs = struct.unpack_from(">h", buf, 21)[0] | 0x08
        struct.pack_into(">h", buf, 21, attrs)
        struct.pack_into(">q", buf, 35, log_append_time)
        _fix_crc(buf)
    return bytes(buf)


def control_batch(base_offset: int, commit: bool, producer_id: int, producer_epoch: int, coordinator_epoch: int = 0,
                  timestamp: int = 1_700_000_000_000) -> bytes:
    """An end-transaction marker batch (COMMIT or ABORT), as the transaction coordinator writes."""
    key = struct.pack(">hh", 0, 1 if commit else 0)
    value = struct.pack(">hi", 0, coordinator_epoch)
    buf = bytearray(build_batch([(key, value, [])], base_offset, [timestamp], producer_id=producer_id,
                                producer_epoch=producer_epoch, transactional=True))
    attrs = struct.unpack_from(">h", buf, 21)[0] | 0x20
    struct.pack_into(">h", buf, 21, attrs)
    _fix_crc(buf)
    return bytes(buf)


def _fix_crc(buf: bytearray) -> None:
    struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[21:]))


def batch_last_offset(batch: bytes) -> int:
    return struct.unpack_from(">q", batch, 0)[0] + struct.unpack_from(">i", batch, 23)[0]


def batch_max_timestamp(batch: bytes) -> int:
    return struct.unpack_from(">q", batch, 35)[0]


@dataclass
class Segment:
    log: str
    index: str
    timeindex: str
    positions: list[int] = field(default_factory=list)
    index_entries: list[tuple[int, int]] = field(default_factory=list)  # (offset, position)
    time_entries: list[tuple[int, int]] = field(default_factory=list)  # (timestamp, offset)


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


def write_segment(
    directory: str,
    base_offset: int,
    batches: Iterable[bytes],
    index_interval_bytes: int = 4096,
    stem: str | None = None,
) -> Segment:
    """Write ``<stem>.log/.index/.timeindex`` (stem defaults to the 20-digit base offset)."""
    stem = stem or segment_name(base_offset)
    seg = Segment(*(os.path.join(directory, stem + s) for s in (".log", ".index", ".timeindex")))
    since_last = 0
    max_ts = -1
    max_ts_offset = base_offset
    position = 0
    with open(seg.log, "wb") as log:
        for batch in batches:
            last = batch_last_offset(batch)
            ts = batch_max_timestamp(batch)
            if ts > max_ts:
                max_ts, max_ts_offset = ts, last
            if since_last > index_interval_bytes:
                seg.index_entries.append((last, position))
                if not seg.time_entries or max_ts > seg.time_entries[-1][0]:
                    seg.time_entries.append((max_ts, max_ts_offset))
                since_last = 0
            log.write(batch)
            seg.positions.append(position)
            position += len(batch)
            since_last += len(batch)
    with open(seg.index, "wb") as f:
        f.write(b"".join(struct.pack(">ii", o - base_offset, p) for o, p in seg.index_entries))
    with open(seg.timeindex, "wb") as f:
        f.write(b"".join(struct.pack(">qi", t, o - base_offset) for t, o in seg.time_entries))
    return seg


def wal_object(batches: Iterable[bytes], version: int = 0) -> bytes:
    """A WAL segment object: the 1-byte version header, then the batches back to back."""
    return bytes([version]) + b"".join(batches)


def simple_records(n: int, value_size: int = 100, key_prefix: bytes = b"key-", headers: list | None = None) -> list[Record]:
    value = b"v" * value_size
    return [(key_prefix + str(i).encode(), value, headers or []) for i in range(n)]
