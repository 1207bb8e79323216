"""End-transaction markers: the one-record control batches a transaction coordinator writes.

A marker batch has the transactional and control attribute bits set, the producer id and
epoch of the transaction, no sequence, and one record whose key is ``version i16 | type i16``
(type 0 = ABORT, 1 = COMMIT) and whose value is ``version i16 | coordinatorEpoch i32`` —
Kafka's ControlRecordType and EndTransactionMarker.
"""

from __future__ import annotations

import struct

from crc32c import crc32c

from kcli.records.batch import CONTROL_MASK, HEADER_SIZE, TRANSACTIONAL_MASK

ABORT = 0
COMMIT = 1
CONTROL_TYPE_NAMES = {ABORT: "ABORT", COMMIT: "COMMIT"}

_HEADER = struct.Struct(">qiibIhiqqqhii")


def _varint(value: int) -> bytes:
    """Zig-zag varint, as record fields are encoded."""
    v = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = v & 0x7F
        v >>= 7
        if v:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def marker_batch(commit: bool, producer_id: int, producer_epoch: int, coordinator_epoch: int, timestamp_ms: int) -> bytes:
    """A COMMIT or ABORT marker batch at base offset 0 (the log assigns the real one)."""
    key = struct.pack(">hh", 0, COMMIT if commit else ABORT)
    value = struct.pack(">hi", 0, coordinator_epoch)
    body = (b"\x00" + _varint(0) + _varint(0) + _varint(len(key)) + key + _varint(len(value)) + value + _varint(0))
    record = _varint(len(body)) + body
    length = HEADER_SIZE - 12 + len(record)
    attributes = TRANSACTIONAL_MASK | CONTROL_MASK
    buf = bytearray(_HEADER.pack(0, length, 0, 2, 0, attributes, 0, timestamp_ms, timestamp_ms,
                                 producer_id, producer_epoch, -1, 1)) + record
    struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[21:]))
    return bytes(buf)


def control_type(batch: bytes | bytearray | memoryview, position: int = 0) -> int:
    """The control record type of the (uncompressed) control batch at ``position``: ABORT,
    COMMIT or another Kafka control type; -1 when the record cannot be read."""
    try:
        pos = position + HEADER_SIZE
        _length, pos = _read_varint(batch, pos)
        pos += 1  # attributes
        _ts, pos = _read_varint(batch, pos)
        _od, pos = _read_varint(batch, pos)
        key_len, pos = _read_varint(batch, pos)
        if key_len < 4:
            return -1
        return struct.unpack_from(">h", batch, pos + 2)[0]
    except (IndexError, ValueError, struct.error):
        return -1
