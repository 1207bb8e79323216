"""The diskless produce path (KIP-1163 "Produce path"): buffer → WAL object → upload → commit.

Every diskless partition of every Produce request, on every connection, goes into ONE buffer.
The buffer closes after ``diskless.append.commit.interval.ms`` (counted from its first batch)
or once it holds ``diskless.append.buffer.max.bytes``; it then becomes one WAL object that is
uploaded on a worker thread while the next buffer fills. Several uploads may run at once, but
commits to the batch coordinator happen strictly in object order: that order is the order the
requests arrived in, which idempotent producers with several requests in flight depend on.

Failures answer every waiting request with a retriable error and commit nothing:

- upload intent not recorded, or upload failed → KAFKA_STORAGE_ERROR (librdkafka: retry, "not
  persisted"). The intent (key, broker, time) goes to the coordinator BEFORE the PUT: it is what
  lets the cleaner prove an uncommitted object is this cluster's garbage (kcli/diskless/cleaner.py);
  no intent, no upload;
- commit failed → REQUEST_TIMED_OUT (retry, "possibly persisted": with a remote coordinator the
  outcome is unknown; idempotent retries are deduplicated by the coordinator). The uploaded
  object stays for the orphan collector. The commit requires the intent to be still there: if
  this upload outlasted the grace period and a cleaner (in a cluster: another broker's) claimed
  the object as an orphan, the commit is refused rather than referencing a deleted object.

After a failure, objects already queued behind it (and the buffer being filled) are failed too
without committing, so a later request of an idempotent producer can never be committed ahead
of an earlier one that failed. A request that arrives only after the failure was answered (the
producer sent it while the failed one was in flight) is held to the same rule by a *sequence
fence*: per (partition, producer id) the first base sequence that failed; until a batch with that
sequence comes back (the producer's retry), a later batch of the producer on that partition is
answered KAFKA_STORAGE_ERROR too. Without it the coordinator would accept the later batch of a
producer it has no state for yet (any first sequence is valid there, as in Kafka), and the
producer, seeing a later batch acknowledged, counts the failed one as written (librdkafka's
implicit acknowledgement) — an acknowledged record that was never stored.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from kio.schema.errors import ErrorCode

from kcli.diskless.chunkstream import ChunkStream
from kcli.diskless.wal import WalBuilder, commit_batch_requests, new_object_key
from kcli.protocol.errors import BrokerError
from kcli.records.batch import HEADER_SIZE, InvalidBatchError, crc_is_valid, read_header

if TYPE_CHECKING:
    from kcli.broker.metrics import Metrics
    from kcli.diskless.wal import WalBatchRef
    from plugins.coordinator.base import BatchCoordinator, CommitBatchResponse, TopicIdPartition
    from plugins.objectstore.base import ObjectStorage

log = logging.getLogger("kcli.diskless.appender")


CREATE_TIME = 0
LOG_APPEND_TIME = 1


def validate_batches(records: bytes | bytearray | memoryview, max_message_bytes: int, *,
                     marker: bool = False) -> list[tuple[int, int]]:
    """(position, size) of each batch of one Produce partition; BrokerError on anything Kafka's
    LogValidator refuses that the header alone shows (framing, magic, CRC, counts, sizes).
    ``marker``: the transaction coordinator's end-transaction marker, the one control batch allowed."""
    total = len(records)
    if total == 0:
        raise BrokerError(ErrorCode.invalid_record, "the produce request has no record batch")
    out: list[tuple[int, int]] = []
    pos = 0
    while pos < total:
        if total - pos < HEADER_SIZE:
            raise BrokerError(ErrorCode.corrupt_message, f"{total - pos} trailing bytes at position {pos} are not a batch")
        try:
            h = read_header(records, pos)
        except InvalidBatchError as err:
            raise BrokerError(ErrorCode.corrupt_message, str(err)) from None
        size = h.size
        if pos + size > total:
            raise BrokerError(ErrorCode.corrupt_message, f"batch at position {pos} needs {size} bytes, {total - pos} remain")
        if h.base_offset != 0:
            raise BrokerError(ErrorCode.invalid_record, f"batch base offset must be 0 in a produce request, got {h.base_offset}")
        if size > max_message_bytes:
            raise BrokerError(ErrorCode.message_too_large, f"batch of {size} bytes exceeds max.message.bytes ({max_message_bytes})")
        if not crc_is_valid(records, h):
            raise BrokerError(ErrorCode.corrupt_message, f"batch at position {pos} fails its CRC-32C check")
        if h.records_count <= 0 or h.last_offset_delta < 0 or h.records_count != h.last_offset_delta + 1:
            raise BrokerError(ErrorCode.invalid_record, f"inconsistent batch: {h.records_count} records, last offset delta {h.last_offset_delta}")
        if h.is_control != marker:
            raise BrokerError(ErrorCode.invalid_record, "clients may not write control batches" if h.is_control
                              else "not a transaction marker")
        if marker:
            if not h.is_transactional or h.producer_id < 0:
                raise BrokerError(ErrorCode.invalid_record, "a transaction marker needs the transactional bit and a producer id")
        elif h.producer_id >= 0 and h.base_sequence < 0:
            raise BrokerError(ErrorCode.invalid_record, f"invalid sequence {h.base_sequence} for producer {h.producer_id}")
        out.append((pos, size))
        pos += size
    return out


def _keyless_records(records: bytes | bytearray | memoryview, spans: list[tuple[int, int]],
                     partition: str) -> list[tuple[int, str]]:
    """(record index, message) of each record without a key (a compacted topic refuses them)."""
    from kcli.storage.errors import LogError
    from kcli.storage.log import check_record_keys

    errors: list[tuple[int, str]] = []
    index = 0
    try:
        for pos, size in spans:
            index = check_record_keys(records, pos, size, index, errors, partition)
    except LogError as err:
        raise BrokerError(ErrorCode.corrupt_message, str(err)) from None
    return errors


def _error_response(index: int, code: int, message: str | None) -> dict[str, Any]:
    return {"index": index, "error_code": code, "base_offset": -1, "log_append_time": -1,
            "log_start_offset": -1, "record_errors": [], "error_message": message}


@dataclass
class _Pending:
    """One Produce partition waiting for its object: answered once, with its first batch's offset."""

    future: asyncio.Future[dict[str, Any]]
    tip: "TopicIdPartition"
    partition: int
    indices: list[int]
    log_append_time: bool
    started: float
    records: bytes | bytearray | memoryview = b""
    spans: list[tuple[int, int]] = field(default_factory=list)


FENCE_TTL_S = 900.0  # longer than any client's delivery timeout: a fence nobody retries expires
FENCE_MAX = 100_000


def _producer_batches(records: bytes | bytearray | memoryview, spans: list[tuple[int, int]]
                      ) -> list[tuple[int, int, int]]:
    """(producer id, epoch, base sequence) of each idempotent batch of one partition's records."""
    out = []
    for pos, _size in spans:
        h = read_header(records, pos)
        if h.producer_id >= 0:
            out.append((h.producer_id, h.producer_epoch, h.base_sequence))
    return out


@dataclass
class _Buffer:
    builder: WalBuilder = field(default_factory=WalBuilder)
    pending: list[_Pending] = field(default_factory=list)
    timestamp_types: dict[int, int] = field(default_factory=dict)  # id(tip) -> TimestampType
    timer: asyncio.TimerHandle | None = None


@dataclass(frozen=True)
class Committed:
    """What the engine learns from one committed object."""

    object_key: str
    batches: list[tuple[int, bytes]]  # (byte offset in the object, batch bytes) for the read cache
    # tip -> (high watermark, log start offset) after the commit
    partitions: dict["TopicIdPartition", tuple[int, int]]


class Appender:
    def __init__(
        self,
        *,
        storage: "ObjectStorage",
        coordinator: "BatchCoordinator",
        io_pool: Executor,
        coordinator_pool: Executor,
        metrics: "Metrics",
        broker_id: int,
        interval_ms: int,
        max_bytes: int,
        on_committed: Callable[[Committed], None],
        delete_uncommitted: Callable[[str], None],
        max_concurrent_uploads: int = 4,
    ) -> None:
        self.storage = storage
        self.coordinator = coordinator
        self.io_pool = io_pool
        self.coordinator_pool = coordinator_pool
        self.metrics = metrics
        self.broker_id = broker_id
        self.interval_s = interval_ms / 1000.0
        self.max_bytes = max_bytes
        self.on_committed = on_committed
        self.delete_uncommitted = delete_uncommitted
        self._buffer: _Buffer | None = None
        self._next_seq = 0
        self._poison_through = -1  # objects with seq <= this fail without committing
        self._last_done: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._upload_slots = asyncio.Semaphore(max_concurrent_uploads)
        self.in_flight_keys: set[str] = set()  # uploading or uploaded, not yet committed/failed
        # (partition, producer id) -> (epoch, first failed base sequence, monotonic time): see module doc
        self._fences: dict[tuple["TopicIdPartition", int], tuple[int, int, float]] = {}

    # -- accepting ---------------------------------------------------------------------------

    def append(self, tip: "TopicIdPartition", partition: int, records: bytes, *, log_append_time: bool,
               max_message_bytes: int, compacted: bool = False, marker: bool = False) -> asyncio.Future[dict[str, Any]]:
        """Validate now and enqueue now (so request order is buffer order); the future resolves
        to the Produce partition response once the object is committed (or failed).
        ``compacted``: every record needs a key (refused per record, as Kafka does).
        ``marker``: a transaction marker (kcli/records/control.py) from the transaction coordinator."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        try:
            spans = validate_batches(records, max_message_bytes, marker=marker)
            record_errors = _keyless_records(records, spans, str(tip)) if compacted and not marker else []
        except BrokerError as err:
            self.metrics.inc("diskless.append.rejected")
            fut.set_exception(err)
            return fut
        if record_errors:  # Kafka's RecordValidationException: nothing of the request is written
            self.metrics.inc("diskless.append.rejected")
            response = _error_response(partition, ErrorCode.invalid_record, record_errors[0][1])
            response["record_errors"] = [{"batch_index": i, "batch_index_error_message": m} for i, m in record_errors]
            fut.set_result(response)
            return fut
        if self._fences and self._fenced(tip, records, spans):
            self.metrics.inc("diskless.append.fenced")
            fut.set_result(_error_response(partition, ErrorCode.kafka_storage_error,
                                           "an earlier batch of this producer failed; retry it first"))
            return fut
        buf = self._buffer
        if buf is None:
            buf = self._buffer = _Buffer()
            buf.timer = loop.call_later(self.interval_s, self._on_timer, buf)
        builder = buf.builder
        if len(spans) == 1:
            indices = [builder.add(tip, records)]
        else:
            view = memoryview(records)
            indices = [builder.add(tip, view[pos:pos + size]) for pos, size in spans]
        buf.timestamp_types[id(tip)] = LOG_APPEND_TIME if log_append_time else CREATE_TIME
        buf.pending.append(_Pending(fut, tip, partition, indices, log_append_time, time.monotonic(), records, spans))
        self.metrics.inc("diskless.append.requests")
        self.metrics.inc("diskless.append.bytes", len(records))
        if builder.size >= self.max_bytes or marker:
            # A marker ends a transaction (EndTxn waits for it, as the next transaction does):
            # Kafka writes it at once, so its object goes now instead of after the interval.
            self._close_buffer()
        return fut

    def _fenced(self, tip: "TopicIdPartition", records: bytes | bytearray | memoryview,
                spans: list[tuple[int, int]]) -> bool:
        """Whether a batch of these records comes after a failed, not yet retried one of its
        producer: same epoch, a higher base sequence. Anything else lifts the fence: the retry
        itself (the failed base sequence), a sequence reset to 0, a new epoch, or a transaction
        marker (sequence -1: the transaction holding the failed batch ended)."""
        now = time.monotonic()
        for pid, epoch, base_seq in _producer_batches(records, spans):
            fence = self._fences.get((tip, pid))
            if fence is None:
                continue
            f_epoch, f_seq, at = fence
            if epoch != f_epoch or base_seq <= f_seq or now - at > FENCE_TTL_S:
                del self._fences[(tip, pid)]
                continue
            return True
        return False

    def _fence(self, buf: _Buffer) -> None:
        """Remember the first failed sequence of each producer in a failed object."""
        now = time.monotonic()
        for p in buf.pending:
            for pid, epoch, base_seq in _producer_batches(p.records, p.spans):
                key = (p.tip, pid)
                fence = self._fences.get(key)
                if fence is None or fence[0] != epoch:
                    if len(self._fences) >= FENCE_MAX:
                        self._fences.pop(next(iter(self._fences)))
                    self._fences[key] = (epoch, base_seq, now)

    @property
    def buffered_bytes(self) -> int:
        return self._buffer.builder.size if self._buffer is not None else 0

    @property
    def objects_in_flight(self) -> int:
        return len(self._tasks)

    def _on_timer(self, buf: _Buffer) -> None:
        if self._buffer is buf:
            self._close_buffer()

    def _close_buffer(self) -> None:
        buf, self._buffer = self._buffer, None
        if buf is None:
            return
        if buf.timer is not None:
            buf.timer.cancel()
        loop = asyncio.get_running_loop()
        seq = self._next_seq
        self._next_seq += 1
        prev = self._last_done
        done: asyncio.Future[None] = loop.create_future()
        self._last_done = done
        task = loop.create_task(self._process(buf, seq, prev, done), name=f"diskless-object-{seq}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- one object ----------------------------------------------------------------------------

    async def _process(self, buf: _Buffer, seq: int, prev: asyncio.Future[None] | None,
                       done: asyncio.Future[None]) -> None:
        loop = asyncio.get_running_loop()
        key = new_object_key()
        try:
            chunks, refs = buf.builder.build_chunks()
            size = sum(len(c) for c in chunks)
            self.in_flight_keys.add(key)
            upload_error: BaseException | None = None
            async with self._upload_slots:
                try:
                    await loop.run_in_executor(self.coordinator_pool, self.coordinator.register_upload_intent,
                                               key, self.broker_id, int(time.time() * 1000))
                except Exception as err:  # noqa: BLE001 - nothing uploaded: a plain, retriable failure
                    upload_error = err
                    self.metrics.inc("diskless.upload.intent_errors")
                started = time.monotonic()
                if upload_error is None:
                    try:
                        # Streamed from the batches as received: no joined copy of the object.
                        await loop.run_in_executor(self.io_pool, self.storage.upload, key, ChunkStream(chunks), size)
                    except Exception as err:  # noqa: BLE001 - any backend failure is an upload failure
                        upload_error = err
                elapsed_ms = (time.monotonic() - started) * 1000
            if upload_error is None:
                self.metrics.inc("diskless.upload.count")
                self.metrics.inc("diskless.upload.bytes", size)
                self.metrics.observe("diskless.upload.latency_ms", elapsed_ms)
                self.metrics.observe("diskless.upload.object_bytes", size)
            if prev is not None:
                await asyncio.shield(prev)  # strictly in object order
            if upload_error is not None:
                self.metrics.inc("diskless.upload.errors")
                log.warning("upload of WAL object %s (%d bytes) failed: %s", key, size, upload_error,
                            extra={"event": "objectstore.error", "operation": "put", "object_key": key})
                self._poison()
                self._fail(buf, ErrorCode.kafka_storage_error, f"WAL object upload failed: {upload_error}")
                self.in_flight_keys.discard(key)
                return
            if seq <= self._poison_through:
                # Never sent to the coordinator, so deleting it now is safe.
                self.in_flight_keys.discard(key)
                self.delete_uncommitted(key)
                self._fail(buf, ErrorCode.kafka_storage_error, "an earlier WAL object failed; retry")
                return
            timestamp_types = buf.timestamp_types
            requests = commit_batch_requests(refs, lambda tip: timestamp_types[id(tip)])
            started = time.monotonic()
            try:
                # require_intent: if the cleaner claimed the object as an orphan (this upload took
                # longer than the grace period), the commit is refused instead of referencing an
                # object that is being deleted (kcli/diskless/cleaner.py).
                responses = await loop.run_in_executor(
                    self.coordinator_pool, functools.partial(self.coordinator.commit_file, key, self.broker_id, size,
                                                             requests, require_intent=True))
            except Exception as err:  # noqa: BLE001 - coordinator failure of any kind
                self.metrics.inc("diskless.commit.errors")
                log.warning("commit of WAL object %s failed: %s", key, err,
                            extra={"event": "coordinator.error", "operation": "commit", "object_key": key})
                self._poison()
                self._fail(buf, ErrorCode.request_timed_out, f"WAL object commit failed: {err}")
                self.in_flight_keys.discard(key)  # left in storage: the orphan collector removes it
                return
            self.metrics.inc("diskless.commit.count")
            self.metrics.inc("diskless.commit.batches", len(requests))
            self.metrics.observe("diskless.commit.latency_ms", (time.monotonic() - started) * 1000)
            self.in_flight_keys.discard(key)
            self._answer(buf, key, list(zip(refs, chunks[1:])), responses)
        except BaseException as err:
            self.in_flight_keys.discard(key)
            if not isinstance(err, asyncio.CancelledError):
                log.exception("WAL object %s failed unexpectedly", key)
            self._poison()
            self._fail(buf, ErrorCode.kafka_storage_error, f"WAL object failed: {err!r}")
            if isinstance(err, asyncio.CancelledError):
                raise
        finally:
            if not done.done():
                done.set_result(None)

    def _poison(self) -> None:
        # Everything closed so far, and the buffer now filling if there is one (it will get seq
        # _next_seq): those requests arrived before the failure was answered.
        last = self._next_seq if self._buffer is not None else self._next_seq - 1
        self._poison_through = max(self._poison_through, last)

    def _fail(self, buf: _Buffer, code: int, message: str) -> None:
        self.metrics.inc("diskless.append.errors", len(buf.pending))
        self._fence(buf)
        for p in buf.pending:
            if not p.future.done():
                p.future.set_result(_error_response(p.partition, code, message))

    def _answer(self, buf: _Buffer, key: str, placed: list[tuple["WalBatchRef", bytes]],
                responses: list["CommitBatchResponse"]) -> None:
        by_index = {r.request.request_id: r for r in responses if r.request is not None}
        if len(by_index) != len(responses):  # a coordinator that drops the request echo
            by_index = {i: r for i, r in enumerate(responses)}
        # Only batches that now have coordinates are worth caching (not duplicates or errors).
        batches = [(ref.byte_offset, chunk) for ref, chunk in placed
                   if by_index[ref.request_index].errors == 0 and not by_index[ref.request_index].is_duplicate]
        touched: dict["TopicIdPartition", tuple[int, int]] = {}
        now = time.monotonic()
        for p in buf.pending:
            first = by_index[p.indices[0]]
            result: dict[str, Any] | None = None
            lso = first.log_start_offset
            for i in p.indices:
                r = by_index[i]
                if r.errors != 0:
                    # The request fails, but its other batches may have been committed: the
                    # high watermark below must still count them.
                    if result is None:
                        result = _error_response(p.partition, r.errors, None)
                    continue
                lso = max(lso, r.log_start_offset)
                if not r.is_duplicate and r.request is not None:
                    end = r.assigned_base_offset + (r.request.last_offset - r.request.base_offset) + 1
                    hwm, old_lso = touched.get(p.tip, (0, -1))
                    touched[p.tip] = (max(hwm, end), max(old_lso, r.log_start_offset))
            if result is None:
                result = {"index": p.partition, "error_code": 0, "base_offset": first.assigned_base_offset,
                          "log_append_time": first.log_append_time if p.log_append_time else -1,
                          "log_start_offset": lso, "record_errors": [], "error_message": None}
            if not p.future.done():
                p.future.set_result(result)
            self.metrics.observe("diskless.append.latency_ms", (now - p.started) * 1000)
        self.on_committed(Committed(key, batches, touched))

    # -- shutdown ------------------------------------------------------------------------------

    async def close(self, timeout_s: float = 30.0) -> None:
        """Send the open buffer now and wait for every object in flight (bounded)."""
        if self._buffer is not None:
            self._close_buffer()
        tasks = list(self._tasks)
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
