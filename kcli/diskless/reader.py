"""The diskless fetch path (KIP-1163 "Consume path", direct read from object storage).

find_batches gives batch coordinates; the batches of one object that lie back to back (a
partition's run in a WAL object) are fetched with ONE ranged GET; a bounded LRU cache of object
ranges (one entry per batch) serves repeated and tailing reads — freshly committed batches are
put in it as the producer sent them, so a consumer at the log end usually needs no GET at all. The stored batches still carry the
producer's offsets, so each batch gets its assigned base offset and leader epoch written into
its header (outside the CRC) and, for LogAppendTime topics, the timestamp-type bit and
maxTimestamp — the only rewrite that changes CRC-covered bytes, so the only one that
recomputes the CRC, and only when the bytes actually differ.

Every batch read from the object store is checked before it is cached or served: its header
must be the one the coordinator describes (size, record count) and its CRC-32C must hold (Kafka's
DefaultRecordBatch.isValid). A damaged batch is never served or cached: the batches before it
are, and a read that starts at it fails with CORRUPT_MESSAGE, as a damaged classic segment does
(kcli/storage/segment.py); one WARNING per object and byte range, each detection counted in
``fetch.corrupt.batches{source=diskless}``. Cached batches were checked when they went in (or
validated by the produce path), so hits cost nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import struct
import time
from collections import OrderedDict
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from crc32c import crc32c

from kcli.once import FirstTimes
from kcli.records.batch import (
    HEADER_SIZE,
    InvalidBatchError,
    read_header,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
)
from kcli.storage.errors import LogError
from plugins.objectstore.base import ObjectNotFound

if TYPE_CHECKING:
    from kcli.broker.metrics import Metrics
    from plugins.coordinator.base import AbortedTransaction, BatchInfo
    from plugins.objectstore.base import ObjectStorage

log = logging.getLogger("kcli.diskless.reader")

LOG_APPEND_TIME = 1
GET_ATTEMPTS = 3
GET_RETRY_BACKOFF_S = 0.025
# A GET that failed only after this long already went through the store's own timeouts and
# retries (S3: socket.timeout.ms x max.attempts): retrying it again would multiply the wait.
GET_RETRY_BUDGET_S = 2.0
GET_WARNING_INTERVAL_S = 10.0  # an unreachable store fails every GET: one line per interval, with a count
CORRUPT_METRIC = "fetch.corrupt.batches{source=diskless}"  # Kafka-style CorruptFetchBatchesPerSec (docs/observability.md)
# baseOffset, batchLength, magic, crc, lastOffsetDelta: what the read check needs of a v2 header
_CHECK = struct.Struct(">qi4xbI2xi")
# bench/fetch_crc_bench.py only: "1" turns the read check off so one run can compare on and off.
# Never set it on a real broker — damaged bytes would then reach consumers.
UNCHECKED_READS_ENV = "KCLI_BENCH_UNCHECKED_READS"
# True in the replica cache's task (kcli/diskless/replica_cache.py): its GETs fill local segments,
# they are not a Fetch request's, so they count as diskless.replica.cache.gets instead.
FILLING: contextvars.ContextVar[bool] = contextvars.ContextVar("kcli_diskless_cache_fill", default=False)


@dataclass(frozen=True, slots=True)
class DisklessReadResult:
    """What the Fetch handler needs (same attribute names as a classic log's ReadResult)."""

    records: bytes | bytearray
    high_watermark: int
    log_start_offset: int
    next_offset: int
    last_stable_offset: int = -1  # -1: not looked up (the high watermark stands for it)
    aborted_transactions: list["AbortedTransaction"] = field(default_factory=list)  # read_committed only


class CorruptBatch(LogError):
    """CORRUPT_MESSAGE for a diskless read: a batch read from the object store is damaged.
    ``intact`` holds the batches before it, assembled (offsets written in), ``served`` their
    count: a Fetch serves them and stops short of the damage, as the classic log does."""

    def __init__(self, message: str, intact: bytearray, served: int) -> None:
        super().__init__(ErrorCode.corrupt_message, message)
        self.intact = intact
        self.served = served


def batch_problem(view: memoryview, pos: int, byte_size: int, last_offset_delta: int) -> str | None:
    """Why the stored batch at ``pos`` of ``view`` cannot be served, or None when it is whole,
    the size and record count the coordinator gave, and its CRC-32C holds (Kafka's
    DefaultRecordBatch.isValid; the CRC covers bytes 21.., the base offset and leader epoch the
    reader rewrites are outside it). Only the needed header fields are unpacked and the CRC runs
    over the view: no copy."""
    if len(view) - pos < HEADER_SIZE:
        return f"{len(view) - pos} bytes are not a batch header"
    _base, length, magic, crc, delta = _CHECK.unpack_from(view, pos)
    if magic != 2 or length < HEADER_SIZE - 12:
        return f"impossible batch header (magic {magic}, length {length})"
    if length + 12 != byte_size or delta != last_offset_delta:
        return (f"header says {length + 12} bytes / {delta + 1} records, "
                f"coordinator {byte_size} bytes / {last_offset_delta + 1} records")
    if pos + byte_size > len(view):
        return f"batch of {byte_size} bytes runs past the {len(view) - pos} bytes read"
    if crc32c(view[pos + 21 : pos + byte_size]) != crc:
        return "batch fails its CRC-32C check"
    return None


class RangeCache:
    """LRU cache of object byte ranges — one entry per batch, keyed by (object, byte offset) —
    bounded by total bytes. Batch-sized entries let committed objects go in without joining
    their batches, and every later read of any of those batches hits exactly."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self._entries: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._by_key: dict[str, set[int]] = {}
        self.size = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, start: int, size: int) -> bytes | None:
        data = self._entries.get((key, start))
        if data is None or len(data) != size:
            return None
        self._entries.move_to_end((key, start))
        return data

    def put(self, key: str, start: int, data: bytes) -> None:
        n = len(data)
        if n == 0 or n > self.max_bytes:
            return
        old = self._entries.pop((key, start), None)
        if old is not None:
            self.size -= len(old)
        self._entries[(key, start)] = data
        self._by_key.setdefault(key, set()).add(start)
        self.size += n
        while self.size > self.max_bytes and self._entries:
            (k, s), evicted = self._entries.popitem(last=False)
            self.size -= len(evicted)
            starts = self._by_key.get(k)
            if starts is not None:
                starts.discard(s)
                if not starts:
                    del self._by_key[k]

    def drop(self, key: str) -> None:
        for s in self._by_key.pop(key, set()):
            data = self._entries.pop((key, s), None)
            if data is not None:
                self.size -= len(data)


def coalesce_members(batches: list["BatchInfo"]) -> list[tuple[str, int, int, list["BatchInfo"]]]:
    """Like :func:`coalesce`, with the batches each range covers."""
    ranges: list[list[Any]] = []
    open_by_key: dict[str, list[Any]] = {}
    for b in batches:
        start, size = b.metadata.byte_offset, b.metadata.byte_size
        cur = open_by_key.get(b.object_key)
        if cur is not None and cur[1] + cur[2] == start:
            cur[2] += size
            cur[3].append(b)
            continue
        cur = [b.object_key, start, size, [b]]
        open_by_key[b.object_key] = cur
        ranges.append(cur)
    return [(k, s, n, m) for k, s, n, m in ranges]


def coalesce(batches: list["BatchInfo"]) -> list[tuple[str, int, int]]:
    """(object key, start, size) ranges covering ``batches``, adjacent ones of an object merged."""
    return [(k, s, n) for k, s, n, _members in coalesce_members(batches)]


class Reader:
    """Turns batch coordinates into Fetch bytes; counts GETs per Fetch request."""

    def __init__(self, *, storage: "ObjectStorage", io_pool: Executor, metrics: "Metrics", cache_bytes: int) -> None:
        self.storage = storage
        self.io_pool = io_pool
        self.metrics = metrics
        self.cache = RangeCache(cache_bytes)
        self._inflight: dict[tuple[str, int, int], asyncio.Future[bytes]] = {}
        self._get_warned_at = -GET_WARNING_INTERVAL_S  # failed GETs: one WARNING line per interval
        self._gets_failed_quietly = 0
        self._gets_by_task: dict[asyncio.Task[Any], int] = {}
        self._damage_reported = FirstTimes()  # (object, range)s logged: each once, not per fetch
        self._check_reads = os.environ.get(UNCHECKED_READS_ENV) != "1"
        if not self._check_reads:
            log.warning("%s=1: batches read from the object store are NOT checked (benchmarks only)",
                        UNCHECKED_READS_ENV)

    async def assemble(self, batches: list["BatchInfo"], leader_epoch: int) -> bytearray:
        """The batches' bytes, in order, with offsets (and LogAppendTime) written in. A damaged
        batch raises :class:`CorruptBatch` carrying the batches before it."""
        if not batches:
            return bytearray()
        pieces: list[bytes | memoryview | None] = []
        missing: list["BatchInfo"] = []
        cache = self.cache
        for b in batches:
            hit = cache.get(b.object_key, b.metadata.byte_offset, b.metadata.byte_size)
            pieces.append(hit)
            if hit is None:
                missing.append(b)
        if len(missing) < len(batches):
            self.metrics.inc("diskless.cache.hits", len(batches) - len(missing))
        damaged: dict[tuple[str, int], str] = {}
        if missing:
            self.metrics.inc("diskless.cache.misses", len(missing))
            ranges = coalesce_members(missing)
            datas = await asyncio.gather(*(self._range(k, s, n) for k, s, n, _members in ranges))
            fetched: dict[tuple[str, int], bytes | memoryview] = {}
            for (k, s, _n, members), data in zip(ranges, datas):
                view = memoryview(data)
                whole = len(members) == 1 and len(view) == members[0].metadata.byte_size
                for b in members:
                    md = b.metadata
                    lo = md.byte_offset - s
                    # Checked once per GET, before the cache: a damaged batch is never cached.
                    problem = (batch_problem(view, lo, md.byte_size, md.last_offset - md.base_offset)
                               if self._check_reads else None)
                    if problem is not None:
                        damaged[(k, md.byte_offset)] = problem
                        continue
                    # A copy only for the cache (it must not pin the whole range); without one, a view.
                    piece = (data if whole else bytes(view[lo : lo + md.byte_size]) if cache.max_bytes
                             else view[lo : lo + md.byte_size])
                    fetched[(k, md.byte_offset)] = piece
                    cache.put(k, md.byte_offset, piece)
            pieces = [p if p is not None else fetched.get((b.object_key, b.metadata.byte_offset))
                      for p, b in zip(pieces, batches)]
        total = sum(b.metadata.byte_size for b in batches)
        out = bytearray(total)
        pos = 0
        for i, (b, src) in enumerate(zip(batches, pieces)):
            md = b.metadata
            size = md.byte_size
            if src is None:  # damaged: serve what precedes it, never the batch itself
                del out[pos:]
                raise self._corrupt(b, damaged.get((b.object_key, md.byte_offset), "not read"), out, i)
            out[pos : pos + size] = src  # type: ignore[index]
            try:
                h = read_header(out, pos)  # checked before it was cached: cannot fail
            except InvalidBatchError as err:
                del out[pos:]
                raise self._corrupt(b, str(err), out, i) from None
            set_base_offset(out, pos, md.base_offset)
            set_partition_leader_epoch(out, pos, leader_epoch)
            if md.timestamp_type == LOG_APPEND_TIME and not (
                h.is_log_append_time and h.max_timestamp == md.log_append_timestamp
            ):
                set_log_append_time(out, h, md.log_append_timestamp)
            pos += size
        return out

    def _corrupt(self, b: "BatchInfo", why: str, intact: bytearray, served: int) -> CorruptBatch:
        """The damaged batch ``b``: counted every time it is read, logged once per object and range."""
        md = b.metadata
        tp = md.topic_id_partition
        where = f"WAL object {b.object_key} bytes {md.byte_offset}-{md.byte_offset + md.byte_size - 1}"
        message = (f"{where} ({md.byte_size} bytes, batch {md.base_offset}..{md.last_offset} of "
                   f"{tp.topic}-{tp.partition}): {why}")
        # the replica cache's fill counts its own (it retries with back-off; no Fetch got the error)
        self.metrics.inc("diskless.replica.cache.corrupt.batches" if FILLING.get() else CORRUPT_METRIC)
        if self._damage_reported.first((b.object_key, md.byte_offset, md.byte_size)):
            log.warning("fetch: %s; answering CORRUPT_MESSAGE, the object is left in place "
                        "(`kcli diskless verify -k %s` lists its damage)", message, b.object_key,
                        extra={"event": "diskless.corrupt_batch", "object_key": b.object_key,
                               "byte_offset": md.byte_offset, "byte_size": md.byte_size})
        return CorruptBatch(message, intact, served)

    async def _range(self, key: str, start: int, size: int) -> bytes:
        """One ranged GET; concurrent readers of the same range share it."""
        ident = (key, start, size)
        fut = self._inflight.get(ident)
        if fut is not None:  # the same range is already being fetched for another reader
            return await asyncio.shield(fut)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._inflight[ident] = fut
        self._count_get()
        started = time.monotonic()
        try:
            from plugins.objectstore.base import ByteRange

            # A Fetch over many small objects makes many GETs; failing it whole on any one failed
            # GET would stall a consumer at a few percent of failed requests (found by the crash
            # soak with FaultyObjectStorage), so each GET gets GET_ATTEMPTS tries.
            for attempt in range(1, GET_ATTEMPTS + 1):
                try:
                    data = await loop.run_in_executor(self.io_pool, self.storage.fetch, key, ByteRange(start, size))
                    break
                except ObjectNotFound:
                    raise
                except Exception:  # noqa: BLE001 - any backend failure: retried, then reported below
                    if attempt == GET_ATTEMPTS or time.monotonic() - started > GET_RETRY_BUDGET_S:
                        raise
                    self.metrics.inc("diskless.get.retries")
                    await asyncio.sleep(GET_RETRY_BACKOFF_S * attempt)
        except asyncio.CancelledError:
            # Readers sharing this GET must not hang: they get a retriable storage error.
            fut.set_exception(LogError(ErrorCode.kafka_storage_error, f"read of WAL object {key} was cancelled"))
            fut.exception()
            raise
        except Exception as err:  # noqa: BLE001 - any backend failure
            self.metrics.inc("diskless.get.errors")
            error = LogError(ErrorCode.kafka_storage_error, f"cannot read {size} bytes at {start} of WAL object {key}: {err}")
            self._warn_get_failed(error)
            fut.set_exception(error)
            fut.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            raise error from None
        finally:
            self._inflight.pop(ident, None)
        self.metrics.inc("diskless.get.count")
        self.metrics.inc("diskless.get.bytes", len(data))
        self.metrics.observe("diskless.get.latency_ms", (time.monotonic() - started) * 1000)
        fut.set_result(data)
        return data

    def _warn_get_failed(self, error: LogError) -> None:
        now = time.monotonic()
        if now - self._get_warned_at < GET_WARNING_INTERVAL_S:
            self._gets_failed_quietly += 1
            return
        more = f" ({self._gets_failed_quietly} more failed GETs since the last warning)" if self._gets_failed_quietly else ""
        log.warning("object store GET failed: %s%s", error.message, more,
                    extra={"event": "objectstore.error", "operation": "get"})
        self._get_warned_at, self._gets_failed_quietly = now, 0

    def track_fetch(self) -> None:
        """Count the current request task as a Fetch that read diskless data (maybe 0 GETs)."""
        task = asyncio.current_task()
        if task is not None and task not in self._gets_by_task:
            self._gets_by_task[task] = 0
            task.add_done_callback(self._observe_task)

    def _count_get(self) -> None:
        """GETs per Fetch request: tally per request task, observed when the task ends."""
        if FILLING.get():
            self.metrics.inc("diskless.replica.cache.gets")
            return
        self.track_fetch()
        task = asyncio.current_task()
        if task is not None:
            self._gets_by_task[task] += 1

    def _observe_task(self, task: asyncio.Task[Any]) -> None:
        gets = self._gets_by_task.pop(task, 0)
        self.metrics.observe("diskless.fetch.gets_per_request", gets)
