"""Kafka's sparse segment indexes: ``<base>.index`` (offset → position) and ``<base>.timeindex``.

On-disk formats are Kafka's, big-endian, fixed-size entries with offsets relative to the
segment base offset:

* offset index entry: relative offset i32 | physical position i32 (8 bytes). An entry
  ``(o, p)`` says "the batch starting at byte ``p`` has last offset ``o``" (what
  kafka-dump-log's index check verifies).
* time index entry: timestamp i64 | relative offset i32 (12 bytes): "the largest timestamp
  up to and including the batch ending at offset ``o`` is ``t``"; timestamps strictly grow.

Unlike Kafka we do not preallocate the files to ``segment.index.bytes`` and mmap them: files
are always exactly ``entries * entry_size`` bytes (what Kafka leaves after trimming on roll or
close), entries are kept in arrays in memory and new ones are appended with one ``os.write``
per log append. ``segment.index.bytes`` still bounds the entry count (a full index rolls the
segment, as in Kafka). Index files are never fsynced: PartitionLog.open verifies every index
against the log and rewrites a wrong one, so a torn index costs a rebuild, never a wrong read.
"""

from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path

OFFSET_ENTRY = struct.Struct(">ii")
TIME_ENTRY = struct.Struct(">qi")
NO_TIMESTAMP = -1
INT32_MAX = 2**31 - 1


class IndexCorrupt(ValueError):
    """An index file that cannot be right (bad size or ordering); the caller rebuilds it."""


class _IndexFile:
    """The file side shared by both indexes: lazily opened append fd and pending bytes."""

    entry_size = 0

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max_index_bytes // self.entry_size
        self._fd: int | None = None
        self._pending = bytearray()

    def _open_fd(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return self._fd

    def write_pending(self) -> None:
        """Append the entries added since the last call with one write."""
        if self._pending:
            data = bytes(self._pending)
            self._pending.clear()
            _write_all(self._open_fd(), data)

    def _rewrite(self, data: bytes) -> None:
        self.close()
        self._pending.clear()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)

    def read_file(self) -> bytes:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return b""

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class OffsetIndex(_IndexFile):
    """Offset → file position for one segment (see module docstring for the format)."""

    entry_size = OFFSET_ENTRY.size

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        super().__init__(path, base_offset, max_index_bytes)
        self._rel: array | None = None
        self._pos: array | None = None

    # -- loading ---------------------------------------------------------------------------
    @staticmethod
    def parse(data: bytes) -> tuple[array, array]:
        """(relative offsets, positions) from file bytes; raises IndexCorrupt if impossible."""
        if len(data) % OFFSET_ENTRY.size:
            raise IndexCorrupt(f"offset index size {len(data)} is not a multiple of 8")
        both = array("i")
        both.frombytes(data)
        if both.itemsize != 4:  # pragma: no cover - every CPython platform has 32-bit int arrays
            raise RuntimeError("array('i') is not 32-bit here")
        if _LITTLE_ENDIAN:
            both.byteswap()
        rel, pos = both[0::2], both[1::2]
        for i in range(1, len(rel)):
            if rel[i] <= rel[i - 1] or pos[i] <= pos[i - 1]:
                raise IndexCorrupt(f"offset index entry {i} is not increasing")
        if len(rel) and (rel[0] < 0 or pos[0] < 0):
            raise IndexCorrupt("offset index has a negative first entry")
        return rel, pos

    def load(self) -> None:
        self._rel, self._pos = self.parse(self.read_file())

    def set_entries(self, rel: array, pos: array, *, write: bool) -> None:
        """Adopt entries (already verified or rebuilt); ``write`` rewrites the file with them."""
        self._pending.clear()
        self._rel, self._pos = array("i", rel), array("i", pos)
        if write:
            both = array("i", bytes(8 * len(rel)))
            both[0::2], both[1::2] = self._rel, self._pos
            if _LITTLE_ENDIAN:
                both.byteswap()
            self._rewrite(both.tobytes())

    def unload(self) -> None:
        """Drop the in-memory copy of an inactive segment's index; reloaded on next lookup."""
        self.write_pending()
        self._rel = self._pos = None

    def _arrays(self) -> tuple[array, array]:
        if self._rel is None or self._pos is None:
            self.load()
        assert self._rel is not None and self._pos is not None
        return self._rel, self._pos

    # -- queries ---------------------------------------------------------------------------
    @property
    def entries(self) -> int:
        return len(self._arrays()[0])

    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    def last_entry(self) -> tuple[int, int] | None:
        rel, pos = self._arrays()
        if not rel:
            return None
        return self.base_offset + rel[-1], pos[-1]

    def lookup(self, offset: int) -> tuple[int, int]:
        """Largest entry with offset <= ``offset``, or (base_offset, 0): where a scan starts."""
        rel, pos = self._arrays()
        i = bisect_right(rel, offset - self.base_offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self.base_offset + rel[i], pos[i]

    def ceiling_entry(self, offset: int) -> tuple[int, int] | None:
        """Smallest entry with offset >= ``offset``: the batch ending there starts at its
        position (lets a read step over damage that a scan from :meth:`lookup` hits)."""
        rel, pos = self._arrays()
        i = bisect_left(rel, offset - self.base_offset)
        if i >= len(rel):
            return None
        return self.base_offset + rel[i], pos[i]

    def floor_entry(self, max_position: int, below_offset: int) -> tuple[int, int] | None:
        """Last entry whose batch starts at or before ``max_position`` and ends below
        ``below_offset``: a batch boundary a read can jump to without scanning."""
        rel, pos = self._arrays()
        i = min(bisect_right(pos, max_position), bisect_left(rel, below_offset - self.base_offset)) - 1
        if i < 0:
            return None
        return self.base_offset + rel[i], pos[i]

    # -- writes ----------------------------------------------------------------------------
    def append(self, offset: int, position: int) -> None:
        rel, pos = self._arrays()
        relative = offset - self.base_offset
        if rel and (relative <= rel[-1] or position <= pos[-1]):
            raise ValueError(f"offset index append ({offset}, {position}) is not after the last entry")
        rel.append(relative)
        pos.append(position)
        self._pending += OFFSET_ENTRY.pack(relative, position)


class TimeIndex(_IndexFile):
    """Timestamp → offset for one segment (see module docstring for the format)."""

    entry_size = TIME_ENTRY.size

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        super().__init__(path, base_offset, max_index_bytes)
        self._ts: array | None = None
        self._rel: array | None = None

    @staticmethod
    def parse(data: bytes) -> tuple[array, array]:
        """(timestamps, relative offsets); raises IndexCorrupt if impossible."""
        if len(data) % TIME_ENTRY.size:
            raise IndexCorrupt(f"time index size {len(data)} is not a multiple of 12")
        ts, rel = array("q"), array("i")
        last_ts, last_rel = NO_TIMESTAMP, -1
        for t, r in TIME_ENTRY.iter_unpack(data):
            if t <= last_ts or r < last_rel:
                raise IndexCorrupt(f"time index entry {len(ts)} is not increasing")
            ts.append(t)
            rel.append(r)
            last_ts, last_rel = t, r
        return ts, rel

    def load(self) -> None:
        self._ts, self._rel = self.parse(self.read_file())

    def set_entries(self, ts: array, rel: array, *, write: bool) -> None:
        self._pending.clear()
        self._ts, self._rel = array("q", ts), array("i", rel)
        if write:
            self._rewrite(b"".join(TIME_ENTRY.pack(t, r) for t, r in zip(self._ts, self._rel)))

    def unload(self) -> None:
        self.write_pending()
        self._ts = self._rel = None

    def _arrays(self) -> tuple[array, array]:
        if self._ts is None or self._rel is None:
            self.load()
        assert self._ts is not None and self._rel is not None
        return self._ts, self._rel

    @property
    def entries(self) -> int:
        return len(self._arrays()[0])

    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, or (-1, base_offset) when empty, as Kafka."""
        ts, rel = self._arrays()
        if not ts:
            return NO_TIMESTAMP, self.base_offset
        return ts[-1], self.base_offset + rel[-1]

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """Largest entry with timestamp <= ``timestamp``, or (-1, base_offset)."""
        ts, rel = self._arrays()
        i = bisect_right(ts, timestamp) - 1
        if i < 0:
            return NO_TIMESTAMP, self.base_offset
        return ts[i], self.base_offset + rel[i]

    def maybe_append(self, timestamp: int, offset: int, *, skip_full_check: bool = False) -> bool:
        """Append only if ``timestamp`` grows past the last entry (Kafka's maybeAppend)."""
        ts, rel = self._arrays()
        if not skip_full_check and len(ts) >= self.max_entries:
            return False
        last_ts = ts[-1] if ts else NO_TIMESTAMP
        if timestamp <= last_ts:
            return False
        relative = offset - self.base_offset
        if rel and relative < rel[-1]:
            raise ValueError(f"time index append offset {offset} is before the last entry")
        ts.append(timestamp)
        rel.append(relative)
        self._pending += TIME_ENTRY.pack(timestamp, relative)
        return True


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


_LITTLE_ENDIAN = array("i", [1]).tobytes()[0] == 1
