"""The coordinator rules both implementations apply, written once (SQLite and PostgreSQL differ in
how they store and lock, not in what they answer): argument checks and their messages, the
DeleteRecords target, Kafka's retention rule, the ListOffsets cases, the KIP-74 fetch budget,
and the per-topic storage overview.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable, Iterable, Iterator, TypeVar

from kio.schema.errors import ErrorCode

from plugins.coordinator.base import (
    FILE_STATE_DELETING,
    FILE_STATE_UPLOADED,
    NO_TIMESTAMP,
    UNKNOWN_OFFSET,
    BatchInfo,
    BatchMetadata,
    CommitBatchRequest,
    CoordinatorException,
    CreateTopicAndPartitionsRequest,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    TopicIdPartition,
    TopicStorageInfo,
)

TIMESTAMP_TYPES = frozenset((-1, 0, 1))
T = TypeVar("T")


def checkpoint_key(log_id: int) -> str:
    """kcli_meta key of a log's cleaner checkpoint (no schema change for a small per-log value)."""
    return f"cleaner.checkpoint.{log_id}"


def sql_filters(conditions: Iterable[tuple[str, object]]) -> tuple[str, list]:
    """``" WHERE a AND b"`` (or ``""``) and its parameters, from (clause, value) pairs: a pair whose
    value is None is left out. The optional filters of a listing or a range delete, in either
    database's placeholder style (the clauses carry their placeholders)."""
    chosen = [(clause, value) for clause, value in conditions if value is not None]
    where = " WHERE " + " AND ".join(clause for clause, _ in chosen) if chosen else ""
    return where, [value for _, value in chosen]


def check_commit(object_key: object, file_size: int) -> None:
    """A commit's object key and size (a broker bug otherwise: the whole commit is refused)."""
    if not isinstance(object_key, str) or not object_key:
        raise CoordinatorException(f"invalid commit: object key {object_key!r}")
    if file_size < 0:
        raise CoordinatorException(f"invalid commit of {object_key}: file size {file_size}")


def describe_bad(req: CommitBatchRequest, file_size: int) -> str:
    """Why a commit request is malformed (a broker bug, so the whole commit is refused)."""
    if req.size <= 0 or req.byte_offset < 0 or req.byte_offset + req.size > file_size:
        return (f"byte range [{req.byte_offset}, {req.byte_offset + req.size}) is empty or outside"
                f" the object of {file_size} bytes")
    if req.last_offset < req.base_offset:
        return f"last offset {req.last_offset} before base offset {req.base_offset}"
    if req.message_timestamp_type not in TIMESTAMP_TYPES:
        return f"unknown timestamp type {req.message_timestamp_type}"
    return (f"producer epoch {req.producer_epoch} or sequences {req.base_sequence}..{req.last_sequence}"
            " outside Kafka's int16 / int32")


def bad_batch(object_key: str, i: int, req: CommitBatchRequest, file_size: int) -> CoordinatorException:
    """The error refusing a commit for its malformed batch ``i``."""
    return CoordinatorException(f"invalid commit of {object_key}: batch {i}: {describe_bad(req, file_size)}")


def not_a_partition(object_key: str, i: int) -> CoordinatorException:
    return CoordinatorException(
        f"invalid commit of {object_key}: batch {i}: topic_id_partition is not a TopicIdPartition")


def already_committed(object_key: str) -> CoordinatorException:
    return CoordinatorException(f"object {object_key} is already committed")


def intent_gone(object_key: str) -> CoordinatorException:
    return CoordinatorException(f"upload intent of {object_key} is gone: the object was claimed as an orphan")


def partition_rows(requests: Iterable[CreateTopicAndPartitionsRequest]) -> list[tuple[uuid.UUID, int, str]]:
    """(topic id, partition, topic name) of every log the requests create."""
    rows = []
    for req in requests:
        if req.num_partitions < 0:
            raise CoordinatorException(f"topic {req.topic_name}: negative partition count {req.num_partitions}")
        rows.extend((req.topic_id, p, req.topic_name) for p in range(req.num_partitions))
    return rows


def check_file_state(state: str | None) -> None:
    if state is not None and state not in (FILE_STATE_UPLOADED, FILE_STATE_DELETING):
        raise CoordinatorException(f"unknown file state {state!r} (expected uploaded or deleting)")


def check_cluster_id(cluster_id: object) -> None:
    if not isinstance(cluster_id, str) or not cluster_id:
        raise CoordinatorException(f"invalid cluster id {cluster_id!r}")


def foreign_cluster(path: str, stored: str, cluster_id: str) -> CoordinatorException:
    return CoordinatorException(
        f"coordinator database {path} belongs to cluster {stored}, not to this broker's cluster {cluster_id}")


def check_intent_key(object_key: object) -> None:
    if not isinstance(object_key, str) or not object_key:
        raise CoordinatorException(f"invalid upload intent: object key {object_key!r}")


def check_replacement(tip: TopicIdPartition, replaced: list[BatchInfo], batches: list[BatchMetadata],
                      file_size: int) -> None:
    """CoordinatorException unless each rewrite keeps the offsets of one replaced batch, in order,
    inside the object (a malformed swap is a cleaner bug)."""
    spans = {(b.metadata.base_offset, b.metadata.last_offset) for b in replaced}
    if len(spans) != len(replaced):
        raise CoordinatorException(f"replace_batches of {tip}: replaced batches repeat")
    prev = -1
    for i, md in enumerate(batches):
        if (md.base_offset, md.last_offset) not in spans or md.base_offset <= prev:
            raise CoordinatorException(
                f"replace_batches of {tip}: rewrite {i} (offsets {md.base_offset}..{md.last_offset}) matches"
                " no replaced batch in order")
        if md.byte_size <= 0 or md.byte_offset < 0 or md.byte_offset + md.byte_size > file_size \
                or md.timestamp_type not in TIMESTAMP_TYPES:
            raise CoordinatorException(f"replace_batches of {tip}: rewrite {i} lies outside the object or is malformed")
        prev = md.last_offset


def delete_records_target(req: DeleteRecordsRequest, lso: int, hwm: int) -> int | DeleteRecordsResponse:
    """The new log start offset for a DeleteRecords request, or the answer when nothing is deleted
    (-1 means the high watermark; beyond it, or negative: ErrorCode.offset_out_of_range; at or below the
    log start: a no-op answering the log start)."""
    target = hwm if req.offset == DeleteRecordsRequest.HIGH_WATERMARK else req.offset
    if target < 0 or target > hwm:
        return DeleteRecordsResponse(ErrorCode.offset_out_of_range, UNKNOWN_OFFSET)
    if target <= lso:
        return DeleteRecordsResponse(ErrorCode.none, lso)
    return target


def retention_nothing_to_do(retention_ms: int, retention_bytes: int, size: int) -> bool:
    """Neither rule can delete anything: no time limit, and the log within its size limit."""
    return retention_ms < 0 and (retention_bytes < 0 or size <= retention_bytes)


def retention_cut(batches: Iterable[tuple[int, int, int]], size: int, retention_ms: int, retention_bytes: int,
                  now_ms: int) -> tuple[int | None, int, int]:
    """Kafka's retention over a log's batches (last offset, bytes, effective timestamp), from the
    front: a batch goes while it is older than ``retention_ms`` or what stays is still at least
    ``retention_bytes``; deletion stops at the first batch neither rule removes. Returns the
    first offset kept (None: nothing goes), batches and bytes deleted."""
    cutoff = None
    count = freed = 0
    remaining = size
    horizon = now_ms - retention_ms
    for last, bsize, ts in batches:
        by_time = retention_ms >= 0 and ts < horizon
        # Kafka's size rule: drop a batch only if what stays is still >= retention.bytes.
        by_size = retention_bytes >= 0 and remaining - bsize >= retention_bytes
        if not (by_time or by_size):
            break
        cutoff = last + 1
        count += 1
        freed += bsize
        remaining -= bsize
    return cutoff, count, freed


def list_offsets_answer(tip: TopicIdPartition, req: ListOffsetsRequest, lso: int, hwm: int,
                        stable: Callable[[], int], max_timestamp: Callable[[], tuple[int, int] | None],
                        first_at: Callable[[int], tuple[int, int] | None]) -> ListOffsetsResponse:
    """ListOffsets of a known log; the lookups are the implementation's: ``stable()`` the last
    stable offset, ``max_timestamp()`` (last offset, timestamp) of the earliest batch holding the
    largest timestamp, ``first_at(ts)`` (base offset, timestamp) of the first batch whose
    timestamp reaches ts. Batch granularity: Kafka would decode records for the exact one."""
    ts = req.timestamp
    if ts in (ListOffsetsRequest.EARLIEST_TIMESTAMP, ListOffsetsRequest.EARLIEST_LOCAL_TIMESTAMP):
        # Diskless logs have no local/remote split: the earliest local offset is the earliest.
        return ListOffsetsResponse(ErrorCode.none, tip, NO_TIMESTAMP, lso)
    if ts == ListOffsetsRequest.LATEST_TIMESTAMP:
        return ListOffsetsResponse(ErrorCode.none, tip, NO_TIMESTAMP, stable() if req.read_committed else hwm)
    if ts == ListOffsetsRequest.LATEST_TIERED_TIMESTAMP:
        return ListOffsetsResponse(ErrorCode.none, tip, NO_TIMESTAMP, UNKNOWN_OFFSET)  # nothing tiered
    hit = max_timestamp() if ts == ListOffsetsRequest.MAX_TIMESTAMP else first_at(ts)
    if hit is None:
        return ListOffsetsResponse(ErrorCode.none, tip, NO_TIMESTAMP, UNKNOWN_OFFSET)
    return ListOffsetsResponse(ErrorCode.none, tip, hit[1], max(hit[0], lso))


class FetchBudget:
    """KIP-74's fetch limits over the partitions of one Fetch: each partition gets
    min(its max bytes, what is left of the fetch's), and the first batch of the first partition
    that returns data comes back even when larger, so a fetch always progresses."""

    __slots__ = ("remaining", "min_one")

    def __init__(self, fetch_max_bytes: int) -> None:
        self.remaining = fetch_max_bytes
        self.min_one = True

    def wants(self, max_partition_fetch_bytes: int) -> int | None:
        """This partition's budget; None when it may take nothing."""
        budget = min(max_partition_fetch_bytes, self.remaining)
        return budget if budget > 0 or self.min_one else None

    def take(self, batches: Iterator[T], size_of: Callable[[T], int], budget: int) -> list[T]:
        """The batches that fit ``budget``, in order (``batches`` may stop early: end of data)."""
        found: list[T] = []
        taken = 0
        for b in batches:
            size = size_of(b)
            if taken + size > budget and not (self.min_one and not found):
                break
            found.append(b)
            taken += size
            if taken >= budget:
                break
        if found:
            self.min_one = False
            self.remaining -= taken
        return found


def topic_storage(names: dict[Any, str], stats: Iterable[tuple], wanted: set | None,
                  as_uuid: Callable[[Any], uuid.UUID]) -> list[TopicStorageInfo]:
    """describe_topic_storage from the logs' topic names and the per-topic object statistics
    (topic id, name, live bytes, files, their size, dead files, their size); topics without
    objects show zeros. Sorted by topic name, then id."""
    out: dict[Any, TopicStorageInfo] = {}
    for tid, name, live, nfiles, fsize, ndead, dsize in stats:
        out[tid] = TopicStorageInfo(as_uuid(tid), names.get(tid, name), int(live), int(nfiles), int(fsize),
                                    int(ndead), int(dsize))
    for tid, name in names.items():
        if tid not in out:
            out[tid] = TopicStorageInfo(as_uuid(tid), name, 0, 0, 0, 0, 0)
    result = [info for tid, info in out.items() if wanted is None or tid in wanted]
    result.sort(key=lambda info: (info.topic, str(info.topic_id)))
    return result
