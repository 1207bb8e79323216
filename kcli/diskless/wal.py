"""WAL segment objects (KIP-1163 "Data Format and WAL Segment Objects"). See docs/wal-format.md.

A broker buffers produce batches for many partitions and uploads them as ONE object so that
object-store request costs do not grow with the partition count. Layout::

    byte 0          version (always 0)
    bytes 1..       v2 record batches, grouped by partition in contiguous runs

The object carries no topic/partition names and no offsets: which bytes belong to which partition,
and at which offsets, lives only in the batch coordinator (the "batch coordinates"). Batches keep
the producer's bytes exactly; readers patch offsets in memory after fetching.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Hashable, Iterable

from kcli.errors import OperationError
from kcli.records.batch import BatchHeader, InvalidBatchError, read_header
from kcli.records.control import control_type

if TYPE_CHECKING:
    from plugins.coordinator.base import CommitBatchRequest

WAL_VERSION = 0
VERSION_HEADER_SIZE = 1
DEFAULT_PREFIX = "wal"


class WalError(OperationError):
    """A WAL segment object cannot be built or parsed."""


class UnknownWalVersion(WalError):
    """The version byte is not one this kcli understands (only 0 exists)."""

    def __init__(self, version: int) -> None:
        self.version = version
        super().__init__(f"unsupported WAL segment version {version}")


def new_object_key(prefix: str = DEFAULT_PREFIX) -> str:
    """A globally unique key ``<prefix>/<uuid4>``: brokers upload without coordinating names."""
    prefix = prefix.strip("/")
    name = str(uuid.uuid4())
    return f"{prefix}/{name}" if prefix else name


@dataclass(frozen=True, slots=True)
class WalBatchRef:
    """Where one added batch landed in the built object.

    ``byte_offset`` is absolute within the object (the first batch is at 1, after the version
    byte); ``request_index`` is the order of the ``add`` call, so the caller can route the
    coordinator's answer back to the produce request that sent the batch.
    """

    tip: Hashable
    byte_offset: int
    size: int
    request_index: int
    header: BatchHeader = field(compare=False, repr=False)
    control_type: int = -1  # a control batch's record type (kcli/records/control.py), else -1


class WalBuilder:
    """Collect batches per partition, then lay them out partition by partition.

    Partitions appear in the order they were first added; each partition's batches keep their
    insertion order (the coordinator assigns offsets in that order, so it is the produce order).
    """

    def __init__(self) -> None:
        self._by_tip: dict[Hashable, list[tuple[int, bytes, BatchHeader, int]]] = {}
        self._count = 0
        self._size = VERSION_HEADER_SIZE

    def add(self, tip: Hashable, batch: bytes | bytearray | memoryview) -> int:
        """Add exactly one v2 record batch for ``tip``; returns its request index."""
        data = bytes(batch)
        try:
            header = read_header(data)
        except InvalidBatchError as err:
            raise WalError(f"cannot add batch for {tip}: {err}") from None
        if header.size != len(data):
            raise WalError(
                f"cannot add batch for {tip}: expected exactly one batch of {header.size} bytes, got {len(data)}"
            )
        index = self._count
        kind = control_type(data) if header.is_control else -1
        self._by_tip.setdefault(tip, []).append((index, data, header, kind))
        self._count += 1
        self._size += len(data)
        return index

    @property
    def size(self) -> int:
        """Bytes the object would have if built now (version byte included)."""
        return self._size

    def __len__(self) -> int:
        return self._count

    @property
    def partitions(self) -> list[Hashable]:
        return list(self._by_tip)

    def build(self) -> tuple[bytes, list[WalBatchRef]]:
        """The object bytes and one ref per batch, in object (layout) order."""
        chunks, refs = self.build_chunks()
        return b"".join(chunks), refs

    def build_chunks(self) -> tuple[list[bytes], list[WalBatchRef]]:
        """Like build() without joining: the version byte, then each batch's bytes (chunk i+1
        belongs to refs[i]). Lets the broker stream an upload without copying the object."""
        chunks: list[bytes] = [bytes([WAL_VERSION])]
        refs: list[WalBatchRef] = []
        position = VERSION_HEADER_SIZE
        for tip, entries in self._by_tip.items():
            for index, data, header, kind in entries:
                chunks.append(data)
                refs.append(WalBatchRef(tip, position, len(data), index, header, kind))
                position += len(data)
        return chunks, refs


@dataclass(frozen=True, slots=True)
class WalObject:
    """A parsed WAL object: batch headers with their absolute positions, and any damaged tail.

    ``invalid_bytes`` counts the bytes after the last complete batch (a truncated upload or
    garbage); ``error`` says why parsing stopped early when the tail is not just short.
    """

    version: int
    batches: list[BatchHeader]
    size: int
    invalid_bytes: int = 0
    error: str | None = None

    @property
    def valid_size(self) -> int:
        return self.size - self.invalid_bytes


def parse_wal(data: bytes | bytearray | memoryview) -> WalObject:
    """Parse a whole WAL object; UnknownWalVersion for a version byte other than 0."""
    buf = memoryview(data).cast("B")
    if len(buf) < VERSION_HEADER_SIZE:
        raise WalError("empty WAL segment object: no version byte")
    version = buf[0]
    if version != WAL_VERSION:
        raise UnknownWalVersion(version)
    batches: list[BatchHeader] = []
    position = VERSION_HEADER_SIZE
    end = len(buf)
    error: str | None = None
    while position < end:
        try:
            header = read_header(buf, position)
        except InvalidBatchError as err:
            error = str(err)
            break
        if position + header.size > end:
            error = f"batch at position {position} needs {header.size} bytes, only {end - position} left"
            break
        batches.append(header)
        position += header.size
    return WalObject(version, batches, end, end - position, error)


def commit_batch_requests(
    refs: Iterable[WalBatchRef],
    timestamp_type: Callable[[Any], int] | None = None,
) -> list["CommitBatchRequest"]:
    """Turn built refs into coordinator commit requests (request_id = request index).

    ``timestamp_type(tip)`` returns the topic's ``message.timestamp.type`` as Kafka's
    TimestampType (0 CreateTime, 1 LogAppendTime); by default the batch's own attribute is used.
    """
    from kcli.records.control import ABORT, COMMIT
    from plugins.coordinator.base import TXN_ABORT, TXN_COMMIT, TXN_DATA, TXN_NONE, CommitBatchRequest, TimestampType

    out = []
    for ref in refs:
        h = ref.header
        if not h.is_transactional:
            txn = TXN_NONE
        elif not h.is_control:
            txn = TXN_DATA
        else:  # only markers get here (clients may not write control batches)
            txn = {COMMIT: TXN_COMMIT, ABORT: TXN_ABORT}.get(ref.control_type, TXN_NONE)
        ts_type = (
            timestamp_type(ref.tip)
            if timestamp_type is not None
            else (TimestampType.LOG_APPEND_TIME if h.is_log_append_time else TimestampType.CREATE_TIME)
        )
        out.append(
            CommitBatchRequest(
                request_id=ref.request_index,
                topic_id_partition=ref.tip,  # type: ignore[arg-type]
                byte_offset=ref.byte_offset,
                size=ref.size,
                base_offset=h.base_offset,
                last_offset=h.last_offset,
                batch_max_timestamp=h.max_timestamp,
                message_timestamp_type=int(ts_type),
                producer_id=h.producer_id,
                producer_epoch=h.producer_epoch,
                base_sequence=h.base_sequence,
                last_sequence=h.last_sequence,
                transaction=txn,
            )
        )
    return out
