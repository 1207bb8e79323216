"""Scanners over a Source: record batches (header + CRC only), offset/time/transaction indexes.

The batch scanner follows Kafka's FileLogInputStream.nextBatch: it stops quietly when fewer than
18 bytes remain or the next batch is cut short (the caller reports the rest as "invalid bytes at
the end"), and it stops with a reason when a header cannot be a batch at all.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Iterator

from crc32c import crc32c

from kcli.dumplog.format import HEADER, HEADER_SIZE
from kcli.dumplog.sources import S3_CHUNK, WINDOW, BytesSource, S3Source, Source

HEADER_SIZE_UP_TO_MAGIC = 17
LOG_OVERHEAD = 12
RECORD_OVERHEAD_V0 = 14  # Kafka's smallest legacy record: the first sanity bound it applies
_SIZE = struct.Struct(">i")
_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_TXN_ENTRY = struct.Struct(">hqqqq")


def window_size(source: Source) -> int:
    if isinstance(source, S3Source):
        return S3_CHUNK
    if isinstance(source, BytesSource):
        return max(source.size, 1)
    return WINDOW


@dataclass
class ScanState:
    """Where a batch scan ended and why; filled in as the scan runs."""

    end: int  # scan limit (file size or --max-bytes)
    position: int = 0  # first byte not part of a complete batch
    reason: str | None = None  # set when a header could not be a batch


def iter_batches(source: Source, start: int, end: int, state: ScanState) -> Iterator[tuple[tuple, memoryview, int, bool]]:
    """Yield ``(header_tuple, window, offset_in_window, crc_valid)`` per complete batch in [start, end).

    The batch is ``window[offset : offset + header[1] + 12]``; the window is only valid until the
    next iteration. Nothing is copied: the checksum runs on the mapped (or fetched) bytes. The
    scan reads through windows of ``window_size(source)`` bytes (bigger only for a batch larger
    than a window).
    """
    unpack = HEADER.unpack_from
    size_unpack = _SIZE.unpack_from
    wsize = window_size(source)
    pos = start
    win = source.view(pos, min(wsize, end - pos)) if end > pos else memoryview(b"")
    wstart = pos
    wend = wstart + len(win)
    try:
        while True:
            if pos + HEADER_SIZE_UP_TO_MAGIC >= end:
                break
            if pos + HEADER_SIZE_UP_TO_MAGIC >= wend:
                win = source.view(pos, min(wsize, end - pos))
                wstart, wend = pos, pos + len(win)
            rel = pos - wstart
            length = size_unpack(win, rel + 8)[0]
            if length < RECORD_OVERHEAD_V0:
                state.reason = (
                    f"Found record size {length} smaller than minimum record overhead "
                    f"({RECORD_OVERHEAD_V0}) at position {pos} in file {source.name}."
                )
                break
            size = length + LOG_OVERHEAD
            if pos + size > end:
                break
            if pos + size > wend:
                win = source.view(pos, max(min(wsize, end - pos), size))
                wstart, wend = pos, pos + len(win)
                rel = 0
            magic = win[rel + 16]
            if magic != 2:
                state.reason = f"unsupported record batch magic {magic} at position {pos} in {source.name}"
                break
            if size < HEADER_SIZE:
                state.reason = f"record batch at position {pos} in {source.name} is {size} bytes, smaller than its 61-byte header"
                break
            h = unpack(win, rel)
            yield h, win, rel, crc32c(win[rel + 21 : rel + size]) == h[4]
            pos += size
    finally:
        state.position = pos


def batch_boundaries(source: Source, start: int, end: int, every: int) -> list[int]:
    """Batch start positions roughly ``every`` bytes apart (header walk only, no checksums).

    Used to split one big file between worker processes; stops at the first header that does
    not look like a batch (the last range then finds and reports the damage itself).
    """
    size_unpack = _SIZE.unpack_from
    cuts = [start]
    pos = start
    next_cut = start + every
    while pos + HEADER_SIZE_UP_TO_MAGIC < end:
        head = source.view(pos, 12)
        if len(head) < 12:
            break
        length = size_unpack(head, 8)[0]
        if length < RECORD_OVERHEAD_V0 or pos + length + LOG_OVERHEAD > end:
            break
        pos += length + LOG_OVERHEAD
        if pos >= next_cut and pos + HEADER_SIZE_UP_TO_MAGIC < end:
            cuts.append(pos)
            next_cut = pos + every
    cuts.append(end)
    return cuts


@dataclass
class IndexEntries:
    """Entries of an offset or time index, read the way Kafka reads a read-only index."""

    base_offset: int
    length: int  # file length in bytes
    entries: list[tuple] = field(default_factory=list)  # (offset, position) or (timestamp, offset)


def read_offset_index(source: Source, base_offset: int) -> IndexEntries:
    data = bytes(source.view(0, source.size))
    n = len(data) // 8
    entries = [(base_offset + rel, pos) for rel, pos in _OFFSET_ENTRY.iter_unpack(data[: n * 8])]
    return IndexEntries(base_offset, len(data), entries)


def read_time_index(source: Source, base_offset: int) -> IndexEntries:
    data = bytes(source.view(0, source.size))
    n = len(data) // 12
    entries = [(ts, base_offset + rel) for ts, rel in _TIME_ENTRY.iter_unpack(data[: n * 12])]
    return IndexEntries(base_offset, len(data), entries)


def read_txn_index(source: Source) -> tuple[list[tuple[int, int, int, int, int]], int]:
    """Aborted transactions (version, producerId, firstOffset, lastOffset, lastStableOffset) and
    the count of trailing bytes that do not make a whole 34-byte entry."""
    data = bytes(source.view(0, source.size))
    n = len(data) // _TXN_ENTRY.size
    return list(_TXN_ENTRY.iter_unpack(data[: n * _TXN_ENTRY.size])), len(data) - n * _TXN_ENTRY.size


def offset_index_lookup(entries: list[tuple[int, int]], base_offset: int, target: int) -> int:
    """Kafka's OffsetIndex.lookup: position of the largest entry with offset <= target, else 0."""
    lo, hi = 0, len(entries) - 1
    found = -1
    while lo <= hi:
        mid = (lo + hi) // 2
        if entries[mid][0] <= target:
            found = mid
            lo = mid + 1
        else:
            hi = mid - 1
    return entries[found][1] if found >= 0 else 0


def header_at(source: Source, position: int) -> tuple | None:
    """The batch header at ``position`` if a complete v2 batch starts there."""
    head = source.view(position, HEADER_SIZE)
    if len(head) < HEADER_SIZE or head[16] != 2:
        return None
    h = HEADER.unpack_from(head)
    if position + h[1] + LOG_OVERHEAD > source.size:
        return None
    return h
