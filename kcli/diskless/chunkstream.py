"""A read-only, seekable binary file over a list of byte chunks.

A WAL object is the version byte followed by batches the broker already holds as separate
``bytes``; joining them costs a fresh multi-megabyte allocation (page faults and zeroing) per
object, which showed as the largest diskless-only CPU cost of the produce path. Object stores
accept a file object (``Uploadable``), so the broker uploads through this view instead: reads
hand out slices of the chunks without copying them.
"""

from __future__ import annotations

import io
from bisect import bisect_right
from typing import Sequence


class ChunkStream(io.RawIOBase):
    def __init__(self, chunks: Sequence[bytes | bytearray | memoryview]) -> None:
        super().__init__()
        self._chunks = [memoryview(c).cast("B") for c in chunks if len(c)]
        self._starts: list[int] = []
        total = 0
        for c in self._chunks:
            self._starts.append(total)
            total += c.nbytes
        self._size = total
        self._pos = 0

    def __len__(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def _piece(self, limit: int) -> memoryview:
        """Up to ``limit`` bytes from the current position, never crossing a chunk boundary."""
        i = bisect_right(self._starts, self._pos) - 1
        chunk = self._chunks[i]
        offset = self._pos - self._starts[i]
        piece = chunk[offset : offset + limit]
        self._pos += piece.nbytes
        return piece

    def read(self, size: int | None = -1) -> bytes | memoryview:  # type: ignore[override]
        """At most ``size`` bytes (a zero-copy slice of one chunk when possible); everything
        that is left when ``size`` is negative or None."""
        if self._pos >= self._size:
            return b""
        if size is None or size < 0:
            parts = []
            while self._pos < self._size:
                parts.append(self._piece(self._size - self._pos))
            return b"".join(parts)
        if size == 0:
            return b""
        return self._piece(size)

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        out = memoryview(buffer).cast("B")
        n = 0
        while n < out.nbytes and self._pos < self._size:
            piece = self._piece(out.nbytes - n)
            out[n : n + piece.nbytes] = piece
            n += piece.nbytes
        return n
