"""The batch coordinator plugin contract (KIP-1164 "Public Interfaces"), in Python names.

The coordinator is the source of truth for diskless topics: it orders batches (assigning offsets
without gaps or duplicates), knows which object holds which bytes, and decides when an object is
garbage. Records mirror the KIP's Java records field by field in snake_case so that reading the
KIP is reading this module; kcli adds a few operations its other features need (partition
reduction, retention, inspection) at the end of the ABC.
"""

from __future__ import annotations

import abc
import enum
import uuid
from dataclasses import dataclass, field
from typing import ClassVar, Iterable, NamedTuple

from kcli.errors import OperationError


class CoordinatorException(OperationError):
    """Every unexpected failure of the coordinator layer (Kafka: KafkaException)."""


# Kafka error codes the coordinator answers with (org.apache.kafka.common.protocol.Errors).

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1
UNKNOWN_OFFSET = -1

# What a committed batch is to a transaction (CommitBatchRequest.transaction), from its attributes
# (transactional / control bits) and, for a marker, its control record (kcli/records/control.py).
TXN_NONE = 0  # not transactional
TXN_DATA = 1  # a transactional data batch: opens the producer's transaction on the partition
TXN_COMMIT = 2  # a COMMIT marker (control batch): ends it
TXN_ABORT = 3  # an ABORT marker: ends it and records an aborted range


# Records on the per-batch hot path (commit requests/responses, batch coordinates) are plain
# slotted dataclasses: treat them as immutable. Frozen dataclasses cost ~5x more to construct,
# which shows at 1,000 batches per object.


class TimestampType(enum.IntEnum):
    """Kafka's TimestampType ids (the MessageTimestampType int8 of the KIP's RPCs)."""

    NO_TIMESTAMP_TYPE = -1
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


@dataclass(frozen=True, slots=True)
class TopicIdPartition:
    topic_id: uuid.UUID
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class CreateTopicAndPartitionsRequest:
    topic_id: uuid.UUID
    topic_name: str
    num_partitions: int


@dataclass(slots=True)
class CommitBatchRequest:
    """One uploaded batch to commit. ``base_offset``/``last_offset`` are the producer's
    (usually 0 and count-1): only their difference matters, the coordinator picks the real ones."""

    request_id: int
    topic_id_partition: TopicIdPartition
    byte_offset: int
    size: int
    base_offset: int
    last_offset: int
    batch_max_timestamp: int
    message_timestamp_type: int
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE
    last_sequence: int = NO_SEQUENCE
    transaction: int = TXN_NONE

    @property
    def offset_delta(self) -> int:
        return self.last_offset - self.base_offset

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0


@dataclass(slots=True)
class CommitBatchResponse:
    """``errors`` is a Kafka error code; on error the offsets/times are -1 (as Kafka answers)."""

    errors: int
    assigned_base_offset: int
    log_append_time: int
    log_start_offset: int
    is_duplicate: bool
    request: CommitBatchRequest | None

    @classmethod
    def of_error(cls, errors: int, request: CommitBatchRequest) -> "CommitBatchResponse":
        return cls(errors, UNKNOWN_OFFSET, NO_TIMESTAMP, UNKNOWN_OFFSET, False, request)


@dataclass(slots=True)
class FindBatchRequest:
    """``read_committed`` (Fetch isolation_level 1): only batches below the last stable offset,
    and the aborted transactions overlapping them."""

    topic_id_partition: TopicIdPartition
    offset: int
    max_partition_fetch_bytes: int
    read_committed: bool = False


@dataclass(slots=True)
class BatchMetadata:
    topic_id_partition: TopicIdPartition
    byte_offset: int
    byte_size: int
    base_offset: int
    last_offset: int
    log_append_timestamp: int
    batch_max_timestamp: int
    timestamp_type: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    last_sequence: int

    @property
    def timestamp(self) -> int:
        """The batch's timestamp as Kafka reports it: the append time under LogAppendTime."""
        if self.timestamp_type == TimestampType.LOG_APPEND_TIME:
            return self.log_append_timestamp
        return self.batch_max_timestamp

    @property
    def record_count(self) -> int:
        return self.last_offset - self.base_offset + 1


@dataclass(slots=True)
class BatchInfo:
    batch_id: int
    object_key: str
    metadata: BatchMetadata


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    """An aborted transaction of one partition: its producer, its first offset there and the
    offset of its ABORT marker (Kafka's AbortedTxn of a .txnindex)."""

    producer_id: int
    first_offset: int
    last_offset: int


@dataclass(slots=True)
class FindBatchResponse:
    """``last_stable_offset``: the first offset of the partition's earliest open transaction, else
    the high watermark. ``aborted_transactions`` (read_committed requests only, else empty): those
    whose range overlaps [offset, end of the returned batches), by first offset."""

    errors: int
    batches: list[BatchInfo]
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int = UNKNOWN_OFFSET
    aborted_transactions: list[AbortedTransaction] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ListOffsetsRequest:
    """``read_committed``: LATEST_TIMESTAMP answers the last stable offset (as Kafka does)."""

    topic_id_partition: TopicIdPartition
    timestamp: int
    read_committed: bool = False

    # Kafka's special ListOffsets timestamps (org.apache.kafka.common.requests.ListOffsetsRequest).
    LATEST_TIMESTAMP: ClassVar[int] = -1
    EARLIEST_TIMESTAMP: ClassVar[int] = -2
    MAX_TIMESTAMP: ClassVar[int] = -3
    EARLIEST_LOCAL_TIMESTAMP: ClassVar[int] = -4
    LATEST_TIERED_TIMESTAMP: ClassVar[int] = -5


@dataclass(frozen=True, slots=True)
class ListOffsetsResponse:
    errors: int
    topic_id_partition: TopicIdPartition
    timestamp: int
    offset: int


@dataclass(frozen=True, slots=True)
class DeleteRecordsRequest:
    """Delete records before ``offset``; -1 means up to the high watermark (Kafka's convention)."""

    topic_id_partition: TopicIdPartition
    offset: int

    HIGH_WATERMARK: ClassVar[int] = -1


@dataclass(frozen=True, slots=True)
class DeleteRecordsResponse:
    errors: int
    low_watermark: int


@dataclass(frozen=True, slots=True)
class FileToDelete:
    object_key: str
    marked_for_deletion_at_ms: int


@dataclass(frozen=True, slots=True)
class DeleteFilesRequest:
    object_key_paths: frozenset[str]

    def __init__(self, object_key_paths: Iterable[str]) -> None:
        object.__setattr__(self, "object_key_paths", frozenset(object_key_paths))


# -- kcli extras -------------------------------------------------------------------------------


class RetentionRequest(NamedTuple):
    """Retention settings of one partition; -1 disables that limit (Kafka's retention.ms/bytes)."""

    topic_id_partition: TopicIdPartition
    retention_ms: int
    retention_bytes: int


@dataclass(frozen=True, slots=True)
class RetentionResult:
    topic_id_partition: TopicIdPartition
    errors: int
    log_start_offset: int
    deleted_batches: int
    deleted_bytes: int


@dataclass(frozen=True, slots=True)
class LogInfo:
    topic_id_partition: TopicIdPartition
    log_start_offset: int
    high_watermark: int
    batch_count: int
    byte_size: int


FILE_STATE_UPLOADED = "uploaded"
FILE_STATE_DELETING = "deleting"


@dataclass(frozen=True, slots=True)
class FileInfo:
    """One committed object. ``used_size`` is the bytes of its live batches; ``partitions`` the
    logs that still have batches in it."""

    object_key: str
    file_size: int
    used_size: int
    state: str
    committed_at_ms: int
    marked_for_deletion_at_ms: int | None
    batch_count: int
    partitions: list[TopicIdPartition] = field(default_factory=list)
    uploader_broker_id: int = -1


@dataclass(frozen=True, slots=True)
class UploadIntent:
    """A broker's announcement, recorded BEFORE its PUT, that it will upload ``object_key``.

    It is what makes an uncommitted object provably this cluster's garbage: an object in the
    store with an intent and no commit (past the grace period) is an orphan the cleaner may
    delete; an object with neither was not written by this cluster's brokers and is only
    reported ("unknown object"), never deleted on a guess."""

    object_key: str
    broker_id: int
    created_at_ms: int


@dataclass(frozen=True, slots=True)
class ProducerInfo:
    """One producer of a partition (DescribeProducers): its epoch, last sequence and batch time,
    and the first offset of its open transaction there (-1: none)."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    current_txn_start_offset: int


@dataclass(frozen=True, slots=True)
class TopicStorageInfo:
    """What a topic costs in object storage (kafka-diskless-metadata's topic overview).

    ``files_size`` totals the objects that still hold live batches of the topic; ``dead_files_size``
    totals objects the topic once had batches in, all deleted, that are still stored (kept alive by
    other topics or awaiting physical deletion).
    """

    topic_id: uuid.UUID
    topic: str
    live_bytes: int
    file_count: int
    files_size: int
    dead_file_count: int
    dead_files_size: int


class BatchCoordinator(abc.ABC):
    """KIP-1164's BatchCoordinator plus kcli's extras. Implementations raise only
    CoordinatorException for unexpected failures; per-partition outcomes are Kafka error codes."""

    @abc.abstractmethod
    def configure(self, configs: dict[str, str]) -> None:
        """Apply this class's own settings (prefix stripped)."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> "BatchCoordinator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- KIP-1164 operations ----------------------------------------------------------------

    @abc.abstractmethod
    def create_topic_and_partitions(self, requests: Iterable[CreateTopicAndPartitionsRequest]) -> None:
        """Create the logs of new topics or new partitions; existing logs are left as they are."""

    @abc.abstractmethod
    def commit_file(
        self,
        object_key: str,
        uploader_broker_id: int,
        file_size: int,
        batches: list[CommitBatchRequest],
        *,
        require_intent: bool = False,
    ) -> list[CommitBatchResponse]:
        """Atomically commit an uploaded object: one response per batch, in request order.

        ``require_intent`` (the broker's appender, which records an upload intent before every
        PUT): refuse with CoordinatorException unless the object's intent is still there, in the
        same transaction that removes it — the fence that makes claim_orphans safe."""

    @abc.abstractmethod
    def find_batches(self, requests: list[FindBatchRequest], fetch_max_bytes: int) -> list[FindBatchResponse]:
        """Batch coordinates serving a Fetch, one response per request."""

    @abc.abstractmethod
    def list_offsets(self, requests: list[ListOffsetsRequest]) -> list[ListOffsetsResponse]: ...

    @abc.abstractmethod
    def delete_records(self, requests: list[DeleteRecordsRequest]) -> list[DeleteRecordsResponse]: ...

    @abc.abstractmethod
    def delete_topics(self, topic_ids: Iterable[uuid.UUID]) -> None: ...

    @abc.abstractmethod
    def get_files_to_delete(self) -> list[FileToDelete]: ...

    @abc.abstractmethod
    def delete_files(self, request: DeleteFilesRequest) -> None: ...

    @abc.abstractmethod
    def is_safe_to_delete_file(self, object_key: str) -> bool: ...

    # -- kcli extras ------------------------------------------------------------------------

    @abc.abstractmethod
    def delete_partitions(self, topic_id: uuid.UUID, partitions: set[int]) -> int:
        """Drop the logs of removed partitions (KIP-694 reduction); returns batches deleted."""

    @abc.abstractmethod
    def enforce_retention(
        self, requests: Iterable[RetentionRequest | tuple[TopicIdPartition, int, int]], now_ms: int
    ) -> list[RetentionResult]:
        """Delete whole batches from the front of each log that retention.ms/bytes no longer keep."""

    @abc.abstractmethod
    def describe_logs(self, topic_ids: Iterable[uuid.UUID] | None = None) -> list[LogInfo]: ...

    @abc.abstractmethod
    def describe_files(
        self,
        state: str | None = None,
        object_key: str | None = None,
        topic_id: uuid.UUID | None = None,
    ) -> list[FileInfo]: ...

    @abc.abstractmethod
    def batches_in_file(self, object_key: str) -> list[BatchInfo]:
        """The live batches of one object, by byte offset (dump-log annotation)."""

    @abc.abstractmethod
    def known_object_keys(self) -> set[str]:
        """Every committed object key the coordinator tracks, in any state (orphan detection)."""

    # -- diskless replica caches (KIP-1163 "Replicas": in sync means in sync with the coordinator) --

    @abc.abstractmethod
    def report_replica_caches(self, broker_id: int, report: str) -> None:
        """Replace ``broker_id``'s report of its local replica caches (an opaque JSON document the
        broker writes, kcli/diskless/replica_cache.py): one small value per broker, kept in
        ``kcli_meta`` (no schema change), read by every broker to tell which replicas are in sync."""

    @abc.abstractmethod
    def replica_cache_reports(self) -> dict[int, str]:
        """Every broker's last :meth:`report_replica_caches` document, by broker id."""

    # -- identity and upload intents (what makes garbage provable) -------------------------------

    @abc.abstractmethod
    def cluster_id(self) -> str | None:
        """The cluster id this coordinator's state belongs to; None for a new (or pre-3.x
        kcli) database that was never claimed."""

    @abc.abstractmethod
    def claim_cluster_id(self, cluster_id: str) -> None:
        """Record ``cluster_id`` on first use; CoordinatorException if another one is recorded
        (two clusters' metadata must never drive one coordinator)."""

    @abc.abstractmethod
    def register_upload_intent(self, object_key: str, broker_id: int, time_ms: int) -> None:
        """Record, before the PUT, that ``broker_id`` will upload ``object_key`` (commit_file
        removes the intent in its own transaction)."""

    @abc.abstractmethod
    def list_upload_intents(self) -> list[UploadIntent]:
        """Intents of objects that were never committed, oldest first."""

    @abc.abstractmethod
    def delete_upload_intents(self, object_keys: Iterable[str]) -> None:
        """Forget intents (their objects were deleted, or never uploaded)."""

    @abc.abstractmethod
    def claim_orphans(self, object_sizes: dict[str, int], now_ms: int) -> list[str]:
        """Take uncommitted objects over for deletion, atomically with respect to commit_file:
        each key (→ its size in the store) whose upload intent still exists and that is not
        committed loses its intent and becomes a file marked for deletion (so a failed deletion
        is retried like any other); returns the keys so claimed. A later commit_file of a claimed
        key with ``require_intent`` fails, so an upload that was only slow — on another broker of
        a cluster, whose in-flight uploads the cleaner cannot see — is refused (its producers
        retry) instead of committed over a deleted object."""

    # -- log compaction (cleanup.policy=compact on diskless topics) -----------------------------

    @abc.abstractmethod
    def replace_batches(
        self,
        topic_id_partition: TopicIdPartition,
        replaced: list[BatchInfo],
        object_key: str,
        uploader_broker_id: int,
        file_size: int,
        batches: list[BatchMetadata],
        now_ms: int,
        *,
        require_intent: bool = True,
    ) -> bool:
        """Swap a compacted partition range in, atomically with respect to commits and fetches.

        ``replaced`` are the live batches the cleaner read (as find_batches returned them, a run
        of consecutive batches of the log); ``batches`` their rewrites in the uploaded object
        ``object_key``, each with the base and last offset of one replaced batch (offsets never
        change; a replaced batch without a rewrite leaves a gap). In one transaction: unless
        every replaced batch is still live with its batch id (retention, DeleteRecords or
        another compaction changed the range: answer False), they are deleted — objects left
        without live batches are marked for deletion (the grace period protects fetches that
        already hold their coordinates) — and the rewrites are committed as batches of the
        new object. The new object's upload intent ends with the commit (``require_intent``:
        CoordinatorException if it was claimed as an orphan); refused with False, the object
        is committed already marked for deletion, so it is collected like any emptied object.
        Batches beyond the range and the log's offsets are untouched. Producer idempotence state
        is kept as it was (rewrites are never replayed into it)."""

    @abc.abstractmethod
    def cleaner_checkpoint(self, topic_id_partition: TopicIdPartition) -> int | None:
        """The first dirty offset the log cleaner recorded for a log (None: never cleaned)."""

    @abc.abstractmethod
    def set_cleaner_checkpoint(self, topic_id_partition: TopicIdPartition, offset: int) -> None:
        """Record the first dirty offset after a cleaning pass (Kafka's cleaner-offset-checkpoint,
        kept with the log so that any broker — the controller of the moment — resumes)."""

    # -- transactions (seed 004: the coordinator holds a diskless partition's transaction state) --

    @abc.abstractmethod
    def describe_producers(self, topic_id_partition: TopicIdPartition) -> list[ProducerInfo] | None:
        """The partition's producers, by producer id (None: unknown partition). A producer whose
        batches were all deleted is still listed while its state is kept."""

    @abc.abstractmethod
    def describe_topic_storage(self, topic_ids: Iterable[uuid.UUID] | None = None) -> list[TopicStorageInfo]:
        """Per-topic live bytes, sizes of objects it uses, and dead object bytes."""
