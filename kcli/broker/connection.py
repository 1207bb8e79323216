"""Zero-copy-ish Kafka framing on the socket: a BufferedProtocol that reads frames in place.

asyncio's StreamReader copies every chunk into its buffer and again when a frame is sliced
out; for 1 MiB produce requests that is most of the broker's CPU. Here the kernel writes
straight into our buffer (``recv_into``), and a frame larger than ``_BIG_FRAME`` gets a buffer
of its own, so each byte is copied once on the way in. The object also plays the StreamWriter
part (write/drain/close) for the response side.

Memory stays bounded whatever clients do (docs/reliability.md, "Memory under hostile and idle
connections"): a connection's read buffer starts at ``_INITIAL`` bytes, grows only while data
flows (up to ``_CHUNK``) and is dropped when the connection goes idle (``release_if_idle``); a
large frame's buffer is charged to the broker-wide ``ReadBudget`` before it is allocated, and a
frame above ``_EAGER`` bytes is an anonymous mmap whose pages exist only once bytes arrive, so
announcing 100 MB and stalling costs one budget window and no memory.
"""

from __future__ import annotations

import asyncio
import collections
import mmap
import struct
import time
from collections.abc import Callable
from typing import Any

from kcli.broker.read_budget import ReadBudget

_SIZE = struct.Struct(">i")
_INITIAL = 4 * 1024  # a fresh connection's read buffer
_MIN_FREE = 1024  # never offer the kernel less room than this
_CHUNK = 256 * 1024  # the read buffer grows (doubling while recv fills it) up to this
_BIG_FRAME = _CHUNK // 2  # larger frames get a buffer of their own (no copy out of the read buffer)
_EAGER = 2 * 1024 * 1024  # ... allocated whole up front; larger ones are filled lazily (mmap)
_FIRST_WINDOW = 64 * 1024  # budget charged for a lazily filled frame's first step; each step doubles
_WINDOW = 1024 * 1024  # ... up to this
_MAX_QUEUED_FRAMES = 16
_PAGE = mmap.PAGESIZE
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14: fault a range in with one call instead of page by page
_populate_ok = True


class FrameSizeError(Exception):
    """A frame announced a size outside 1..limit: the connection must be closed."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class KafkaFrameProtocol(asyncio.BufferedProtocol):
    def __init__(self, on_connect: Callable[[KafkaFrameProtocol], Any], limit: int,
                 budget: ReadBudget | None = None) -> None:
        self._on_connect = on_connect
        self.transport: asyncio.Transport | None = None
        self._budget = budget if budget is not None else ReadBudget(-1, limit)
        self._buf = bytearray()  # allocated on the first read, dropped again when idle
        self._start = 0
        self._end = 0
        self._want = _INITIAL  # read buffer size to offer; doubles while recv fills what we offer
        self._offered = 0  # room offered by the last get_buffer
        self._frame_need = 0  # bytes (with the size prefix) of the partial small frame at _start
        self._active = False  # bytes arrived since the last release_if_idle
        self.last_activity = time.monotonic()  # last byte read or written (connections.max.idle.ms)
        # A frame larger than _BIG_FRAME, read into its own buffer:
        self._big_size = 0  # its announced size (0: none in progress)
        self._big: bytearray | mmap.mmap | None = None  # allocated once budget is granted
        self._big_pos = 0  # bytes received
        self._big_granted = 0  # bytes of it covered by budget (the readable window ends here)
        self._held = 0  # budget held: the frame in progress plus queued big frames
        self._waiting_budget = False
        self._frames: collections.deque[tuple[bytes | memoryview, int]] = collections.deque()  # (frame, charge)
        self._bad_size: int | None = None
        self._eof = False
        self._lost = False
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
        self._lost = True
        self._big = None  # a partly read frame is of no use any more
        self._big_size = self._big_pos = self._big_granted = 0
        held, self._held = self._held, 0
        self._budget.give_back(held)  # queued frames stay readable but are no longer charged
        self._budget.forget(self)
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
            if self._big_granted == self._big_pos:  # not expected: reading pauses before this
                self._force_window()
            return memoryview(self._big)[self._big_pos:self._big_granted]
        pending = self._end - self._start
        room = max(_MIN_FREE, self._frame_need - pending)
        if len(self._buf) - self._end < room or len(self._buf) < self._want:
            size = max(len(self._buf), self._want, _INITIAL)
            while size < pending + room:
                size *= 2
            if size == len(self._buf):  # moving the pending bytes to the front makes room
                self._buf[:pending] = self._buf[self._start:self._end]
            else:
                buf = bytearray(size)
                buf[:pending] = memoryview(self._buf)[self._start:self._end]
                self._buf = buf
            self._start, self._end = 0, pending
        self._offered = len(self._buf) - self._end
        return memoryview(self._buf)[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        self._active = True
        self.last_activity = time.monotonic()
        if self._big is not None:
            self._big_pos += nbytes
            if self._big_pos == self._big_size:
                # kio's reader wants a read-only buffer; a read-only view avoids copying 1 MiB frames
                self._frames.append((memoryview(self._big).toreadonly(), self._big_granted))
                self._big = None
                self._big_size = self._big_pos = self._big_granted = 0
            elif self._big_pos == self._big_granted:
                self._next_window()
        else:
            self._end += nbytes
            if nbytes == self._offered and self._want < _CHUNK:
                self._want *= 2  # data is flowing faster than we offer room
        self._parse()
        self._wake()
        self._update_reading()

    def _parse(self) -> None:
        buf = self._buf
        self._frame_need = 0
        while self._big_size == 0 and self._bad_size is None and self._end - self._start >= 4:
            (size,) = _SIZE.unpack_from(buf, self._start)
            if size <= 0 or size > self.limit:
                self._bad_size = size
                return
            have = self._end - self._start - 4
            if have >= size:
                s = self._start + 4
                self._frames.append((bytes(memoryview(buf)[s:s + size]), 0))
                self._start = s + size
            elif size > _BIG_FRAME:
                self._big_size = size
                first = size if size <= _EAGER else min(size, have + _FIRST_WINDOW)
                if self._budget.take(self, first):
                    self._start_big(first)
                else:
                    self._wait_budget(first)
                return
            else:
                self._frame_need = size + 4
                break
        if self._start == self._end:
            self._start = self._end = 0

    def _start_big(self, granted: int) -> None:
        """Budget for the first window arrived: allocate, move over what the read buffer holds."""
        size = self._big_size
        self._held += granted
        # Private anonymous memory: the kernel backs a page only when a byte lands in it.
        big: bytearray | mmap.mmap = bytearray(size) if size <= _EAGER else mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
        have = self._end - self._start - 4
        big[:have] = memoryview(self._buf)[self._start + 4:self._end]
        self._big, self._big_pos, self._big_granted = big, have, granted
        self._start = self._end = 0

    def _window(self) -> int:
        """The next step of a lazily filled frame: doubling while bytes keep coming, at most _WINDOW."""
        step = min(_WINDOW, max(_FIRST_WINDOW, self._big_granted))
        return min(self._big_size, self._big_granted + step) - self._big_granted

    def _next_window(self) -> None:
        n = self._window()
        if self._budget.take(self, n):
            self._grant(n)
        else:
            self._wait_budget(n)

    def _grant(self, n: int) -> None:
        """Extend the readable window of a lazily filled frame by ``n`` budgeted bytes.

        The client has filled the previous window, so the bytes are coming: fault the pages
        in with one madvise rather than one page fault per 4 KiB (~1.3x the reading speed)."""
        global _populate_ok
        start = self._big_granted
        self._held += n
        self._big_granted += n
        if _populate_ok and isinstance(self._big, mmap.mmap):
            first = start - start % _PAGE
            try:
                self._big.madvise(_MADV_POPULATE_WRITE, first, self._big_granted - first)
            except (OSError, ValueError):
                _populate_ok = False  # an older kernel: pages fault in as bytes land

    def _force_window(self) -> None:
        n = self._window()
        self._budget.charge(n)
        self._held += n
        self._big_granted += n

    def _wait_budget(self, n: int) -> None:
        """No budget for the next ``n`` bytes: stop reading until some is given back."""
        self._waiting_budget = True

        def retry() -> bool:
            if self._lost:
                return True
            if not self._budget.take(self, n):
                return False
            self._waiting_budget = False
            if self._big is None:
                self._start_big(n)
            else:
                self._grant(n)
            self._update_reading()
            return True

        self._budget.wait(self, retry)

    def _update_reading(self) -> None:
        """Pause reading while frames pile up unread or budget is short; resume when neither."""
        if self.transport is None or self._lost:
            return
        pause = self._waiting_budget or len(self._frames) >= _MAX_QUEUED_FRAMES
        if pause and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        elif not pause and self._reading_paused and len(self._frames) < _MAX_QUEUED_FRAMES // 2:
            self._reading_paused = False
            self.transport.resume_reading()

    @property
    def waiting_for_budget(self) -> bool:
        """Reading is paused by us (no budget), not by the client: not idle."""
        return self._waiting_budget

    @property
    def mid_request(self) -> bool:
        """Part of a request has arrived and the rest has not."""
        return self._big_size != 0 or self._start != self._end

    def release_if_idle(self) -> int:
        """Drop the read buffer of a connection that received nothing since the last call.

        Called periodically by the server: a connection that is busy keeps its grown buffer,
        one that has gone quiet goes back to holding no read buffer at all. Returns the bytes
        released."""
        released = 0
        if not self._active and self._start == self._end and self._big_size == 0 and self._buf:
            released = len(self._buf)
            self._buf = bytearray()
            self._start = self._end = 0
            self._want = _INITIAL
        self._active = False
        return released

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
                frame, charge = self._frames.popleft()
                if charge and not self._lost:
                    self._held -= charge
                    self._budget.give_back(charge)
                self._update_reading()
                if len(frame) > limit:
                    raise FrameSizeError(len(frame))
                return frame
            if self._bad_size is None and self._big_size == 0 and self._end - self._start >= 4:
                self._parse()  # the limit may have changed since the bytes arrived
                self._update_reading()
                if self._frames:
                    continue
            if self._bad_size is not None:
                raise FrameSizeError(self._bad_size)
            if self._big_size > limit:
                raise FrameSizeError(self._big_size)
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
        self.last_activity = time.monotonic()
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

    def peer(self) -> str:
        info = self.get_extra_info("peername")
        return f"{info[0]}:{info[1]}" if info else "?"

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default) if self.transport is not None else default
