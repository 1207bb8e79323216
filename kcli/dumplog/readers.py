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
from kcli.dumplog.sources import S3_CHUNK, WINDOW, BytesSource, ReadWindow, S3Source, Source

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
    if isinstance(source, ReadWindow):
        return source.window
    if isinstance(source, BytesSource):
        return max(source.size, 1)
    return WINDOW


@dataclass
class ScanState:
    """Where a batch scan ended and why; filled in as the scan runs."""

    end: int  # scan limit (file size or --max-bytes)
    position: int = 0  # first byte not part of a complete batch
    reason: str | None = None  # set when a header could not be a batch


Window = tuple[memoryview, int, int]  # (bytes, file position of its first byte, of its end)


def locate_batch(source: Source, pos: int, end: int, window: Window, wsize: int,
                 state: ScanState) -> tuple[Window, int, int] | None:
    """Kafka's checks for the batch at ``pos``: ``(window, offset in it, batch size)`` with the
    whole batch inside the (possibly moved or grown) window, or None where the scan stops —
    quietly at the end or a cut-short batch, with ``state.reason`` set for a header that cannot
    be a batch. Shared by :func:`iter_batches` and the batch-line loop (batchlines.py)."""
    win, wstart, wend = window
    if pos + HEADER_SIZE_UP_TO_MAGIC >= end:
        return None
    if pos + HEADER_SIZE_UP_TO_MAGIC >= wend:
        win = source.view(pos, min(wsize, end - pos))
        wstart, wend = pos, pos + len(win)
    rel = pos - wstart
    length = _SIZE.unpack_from(win, rel + 8)[0]
    if length < RECORD_OVERHEAD_V0:
        state.reason = (
            f"Found record size {length} smaller than minimum record overhead "
            f"({RECORD_OVERHEAD_V0}) at position {pos} in file {source.name}."
        )
        return None
    size = length + LOG_OVERHEAD
    if pos + size > end:
        return None
    if pos + size > wend:
        win = source.view(pos, max(min(wsize, end - pos), size))
        wstart, wend = pos, pos + len(win)
        rel = 0
    magic = win[rel + 16]
    if magic != 2:
        state.reason = f"unsupported record batch magic {magic} at position {pos} in {source.name}"
        return None
    if size < HEADER_SIZE:
        state.reason = f"record batch at position {pos} in {source.name} is {size} bytes, smaller than its 61-byte header"
        return None
    return (win, wstart, wend), rel, size


def iter_batches(source: Source, start: int, end: int, state: ScanState) -> Iterator[tuple[tuple, memoryview, int, bool]]:
    """Yield ``(header_tuple, window, offset_in_window, crc_valid)`` per complete batch in [start, end).

    The batch is ``window[offset : offset + header[1] + 12]``; the window is only valid until the
    next iteration. Nothing is copied: the checksum runs on the mapped (or fetched) bytes. The
    scan reads through windows of ``window_size(source)`` bytes (bigger only for a batch larger
    than a window).
    """
    unpack = HEADER.unpack_from
    wsize = window_size(source)
    pos = start
    window: Window = (memoryview(b""), pos, pos)
    try:
        while True:
            found = locate_batch(source, pos, end, window, wsize, state)
            if found is None:
                break
            window, rel, size = found
            win = window[0]
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
