"""Zero-copy-ish Kafka framing on the socket: a BufferedProtocol that reads frames in place.

asyncio's StreamReader copies every chunk into its buffer and again when a frame is sliced
out; for 1 MiB produce requests that is most of the broker's CPU. Here the kernel writes
straight into our buffer (``recv_into``), and a frame larger than the buffer gets a buffer of
its own, so each byte is copied once on the way in. The object also plays the StreamWriter
part (write/drain/close) for the response side.
"""

from __future__ import annotations

import asyncio
import collections
import struct
from typing import Any, Callable

_SIZE = struct.Struct(">i")
_CHUNK = 256 * 1024
_MAX_QUEUED_FRAMES = 16


class FrameSizeError(Exception):
    """A frame announced a size outside 1..limit: the connection must be closed."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class KafkaFrameProtocol(asyncio.BufferedProtocol):
    def __init__(self, on_connect: Callable[["KafkaFrameProtocol"], Any], limit: int) -> None:
        self._on_connect = on_connect
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray(_CHUNK)
        self._start = 0
        self._end = 0
        self._big: bytearray | None = None  # a frame too large for _buf, filled in place
        self._big_pos = 0
        self._frames: collections.deque[bytes | memoryview] = collections.deque()
        self._bad_size: int | None = None
        self._eof = False
        self._waiter: asyncio.Future[None] | None = None
        self._reading_paused = False
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._closed: asyncio.Future[None] | None = None
        self.limit = limit  # largest acceptable frame; checked as soon as a size arrives

    # ---- protocol callbacks --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._closed = asyncio.get_running_loop().create_future()
        self._on_connect(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._wake()
        for w in self._drain_waiters:
            if not w.done():
                w.set_result(None)
        self._drain_waiters.clear()
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._big is not None:
            return memoryview(self._big)[self._big_pos:]
        free = len(self._buf) - self._end
        if free < _CHUNK // 4:
            pending = self._end - self._start
            if self._start:
                self._buf[:pending] = self._buf[self._start:self._end]
                self._start, self._end = 0, pending
            if len(self._buf) - self._end < _CHUNK // 4:
                self._buf.extend(bytes(_CHUNK))
        return memoryview(self._buf)[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._big is not None:
            self._big_pos += nbytes
            if self._big_pos == len(self._big):
                # kio's reader wants a read-only buffer; a read-only view avoids copying 1 MiB frames
                self._frames.append(memoryview(self._big).toreadonly())
                self._big = None
                self._big_pos = 0
        else:
            self._end += nbytes
        self._parse()
        self._wake()
        if len(self._frames) >= _MAX_QUEUED_FRAMES and not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _parse(self) -> None:
        buf = self._buf
        while self._big is None and self._bad_size is None and self._end - self._start >= 4:
            (size,) = _SIZE.unpack_from(buf, self._start)
            if size <= 0 or size > self.limit:
                self._bad_size = size
                return
            have = self._end - self._start - 4
            if have >= size:
                s = self._start + 4
                self._frames.append(bytes(memoryview(buf)[s:s + size]))
                self._start = s + size
            elif size > len(buf) // 2:
                big = bytearray(size)
                big[:have] = buf[self._start + 4:self._end]
                self._big, self._big_pos = big, have
                self._start = self._end = 0
            else:
                break
        if self._start == self._end:
            self._start = self._end = 0

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    # ---- reading ---------------------------------------------------------------------------
    async def read_frame(self, limit: int) -> bytes | memoryview | None:
        """The next whole frame, or None at EOF; FrameSizeError for a size outside 1..limit."""
        self.limit = limit
        while True:
            if self._frames:
                frame = self._frames.popleft()
                if len(frame) > limit:
                    raise FrameSizeError(len(frame))
                if self._reading_paused and len(self._frames) < _MAX_QUEUED_FRAMES // 2 and self.transport is not None:
                    self._reading_paused = False
                    self.transport.resume_reading()
                return frame
            if self._bad_size is None and self._end - self._start >= 4:
                self._parse()  # the limit may have changed since the bytes arrived
                if self._frames:
                    continue
            if self._bad_size is not None:
                raise FrameSizeError(self._bad_size)
            if self._big is not None and len(self._big) > limit:
                raise FrameSizeError(len(self._big))
            if self._eof:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    # ---- writing (the StreamWriter subset the server uses) -------------------------------------
    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        for w in self._drain_waiters:
            if not w.done():
                w.set_result(None)
        self._drain_waiters.clear()

    def write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("connection closed")
        self.transport.write(data)

    async def drain(self) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("connection closed")
        if self._write_paused:
            w = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(w)
            await w

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def wait_closed(self) -> None:
        if self._closed is not None:
            await self._closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default) if self.transport is not None else default
