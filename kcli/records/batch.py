"""Kafka v2 record batch headers: read, validate and patch without decoding records.

The broker stores what producers send byte-for-byte; it only needs the 61-byte header to
assign offsets, check the CRC and enforce idempotence. Layout (big-endian)::

    0 baseOffset i64 | 8 batchLength i32 | 12 partitionLeaderEpoch i32 | 16 magic i8
    17 crc u32 | 21 attributes i16 | 23 lastOffsetDelta i32 | 27 baseTimestamp i64
    35 maxTimestamp i64 | 43 producerId i64 | 51 producerEpoch i16 | 53 baseSequence i32
    57 recordsCount i32 | 61 records...

The CRC (CRC-32C) covers bytes 21..end, so the base offset and leader epoch can be
rewritten without recomputing it; a LogAppendTime rewrite changes attributes and
maxTimestamp and does need a new CRC.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator

from crc32c import crc32c

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the bytes not counted in batchLength
MAGIC_V2 = 2

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40

COMPRESSION_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

NO_PRODUCER_ID = -1
NO_SEQUENCE = -1

_HEADER = struct.Struct(">qiibIhiqqqhii")
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")


class InvalidBatchError(ValueError):
    """The bytes are not a valid v2 record batch (Kafka: CORRUPT_MESSAGE / INVALID_RECORD)."""


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fixed header of one v2 record batch, at ``position`` in its buffer."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    position: int = 0

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def compression_name(self) -> str:
        return COMPRESSION_NAMES.get(self.compression, f"unknown({self.compression})")

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_MASK)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_MASK)

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF

    @property
    def is_idempotent(self) -> bool:
        return self.producer_id >= 0


def read_header(buf: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
    """Parse the header at ``position``; raises InvalidBatchError if it cannot be one."""
    if len(buf) - position < HEADER_SIZE:
        raise InvalidBatchError(f"truncated batch header at position {position}")
    fields = _HEADER.unpack_from(buf, position)
    header = BatchHeader(*fields, position=position)
    if header.magic != MAGIC_V2:
        raise InvalidBatchError(f"unsupported record batch magic {header.magic} at position {position}")
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise InvalidBatchError(f"batch length {header.batch_length} too small at position {position}")
    return header


def batch_size_at(buf: bytes | bytearray | memoryview, position: int) -> int | None:
    """Size of the batch at ``position`` or None if fewer than 12 bytes remain."""
    if len(buf) - position < LOG_OVERHEAD:
        return None
    return _I32.unpack_from(buf, position + 8)[0] + LOG_OVERHEAD


def iter_headers(buf: bytes | bytearray | memoryview, start: int = 0) -> Iterator[BatchHeader]:
    """Yield each complete batch header in ``buf``; stops quietly at a partial tail."""
    pos = start
    end = len(buf)
    while end - pos >= HEADER_SIZE:
        header = read_header(buf, pos)
        if pos + header.size > end:
            return
        yield header
        pos += header.size


def compute_crc(buf: bytes | bytearray | memoryview, header: BatchHeader) -> int:
    start = header.position + 21
    return crc32c(memoryview(buf)[start : header.position + header.size])


def crc_is_valid(buf: bytes | bytearray | memoryview, header: BatchHeader) -> bool:
    return compute_crc(buf, header) == header.crc


def set_base_offset(buf: bytearray | memoryview, position: int, base_offset: int) -> None:
    """Write the broker-assigned base offset; outside the CRC, so the CRC stays valid."""
    _I64.pack_into(buf, position, base_offset)


def set_partition_leader_epoch(buf: bytearray | memoryview, position: int, epoch: int) -> None:
    _I32.pack_into(buf, position + 12, epoch)


def set_log_append_time(buf: bytearray | memoryview, header: BatchHeader, timestamp_ms: int) -> None:
    """Stamp LogAppendTime the way Kafka does: set the timestamp-type bit, set maxTimestamp,
    and recompute the CRC (the only rewrite that needs it)."""
    pos = header.position
    struct.pack_into(">h", buf, pos + 21, header.attributes | TIMESTAMP_TYPE_MASK)
    _I64.pack_into(buf, pos + 35, timestamp_ms)
    _U32.pack_into(buf, pos + 17, crc32c(memoryview(buf)[pos + 21 : pos + header.size]))
