"""The RemoteStorageManager plugin contract (KIP-405) and the metadata it is handed.

Kafka keeps *what* is tiered (RemoteLogSegmentMetadata, in the RLMM) apart from *where the bytes
go* (the RemoteStorageManager). kcli mirrors that split: the broker's RemoteLogManager owns the
metadata and the schedule, and a plugin named by ``remote.log.storage.manager.class.name`` only
moves bytes: copy a rolled segment with its indexes, fetch a byte range or an index, delete.
Method names are Kafka's in snake_case so a reader of KIP-405 finds them.
"""

from __future__ import annotations

import abc
import enum
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from kcli.errors import OperationError


class RemoteStorageException(OperationError):
    """Any failure of the remote storage layer (Kafka's RemoteStorageException)."""


class RemoteResourceNotFoundException(RemoteStorageException):
    """The segment or index asked for is not in remote storage (deleted, or never copied)."""


class RemoteLogSegmentState(str, enum.Enum):
    """Lifecycle of one remote segment (Kafka's RemoteLogSegmentState)."""

    COPY_SEGMENT_STARTED = "COPY_SEGMENT_STARTED"
    COPY_SEGMENT_FINISHED = "COPY_SEGMENT_FINISHED"
    DELETE_SEGMENT_STARTED = "DELETE_SEGMENT_STARTED"
    DELETE_SEGMENT_FINISHED = "DELETE_SEGMENT_FINISHED"

    def can_move_to(self, target: "RemoteLogSegmentState") -> bool:
        """Kafka's RemoteLogSegmentState.isValidTransition."""
        return target in _TRANSITIONS[self]


_S = RemoteLogSegmentState
_TRANSITIONS: dict[RemoteLogSegmentState, frozenset[RemoteLogSegmentState]] = {
    _S.COPY_SEGMENT_STARTED: frozenset({_S.COPY_SEGMENT_FINISHED, _S.DELETE_SEGMENT_STARTED}),
    _S.COPY_SEGMENT_FINISHED: frozenset({_S.DELETE_SEGMENT_STARTED}),
    _S.DELETE_SEGMENT_STARTED: frozenset({_S.DELETE_SEGMENT_FINISHED}),
    _S.DELETE_SEGMENT_FINISHED: frozenset(),
}


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentId:
    """One copy of one segment: the partition (by topic id, so a re-created topic of the same
    name never sees old data) plus a random id (a re-copy after a failure gets a new one)."""

    topic_id: uuid.UUID
    topic: str
    partition: int
    id: uuid.UUID

    @classmethod
    def generate(cls, topic_id: uuid.UUID, topic: str, partition: int) -> "RemoteLogSegmentId":
        return cls(topic_id, topic, partition, uuid.uuid4())


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadata:
    """Kafka's RemoteLogSegmentMetadata, with KIP-950's ``tiered_epoch``.

    ``end_offset`` is inclusive (the segment's last offset), as in Kafka.
    """

    segment_id: RemoteLogSegmentId
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    broker_id: int
    event_timestamp_ms: int
    segment_size_in_bytes: int
    state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_STARTED
    tiered_epoch: int = 0
    segment_leader_epochs: dict[int, int] = field(default_factory=lambda: {0: 0})
    custom_metadata: bytes | None = None

    def with_state(self, state: RemoteLogSegmentState, event_timestamp_ms: int) -> "RemoteLogSegmentMetadata":
        if not self.state.can_move_to(state):
            raise RemoteStorageException(
                f"remote segment {self.segment_id.id}: invalid state transition {self.state.value} -> {state.value}"
            )
        return replace(self, state=state, event_timestamp_ms=event_timestamp_ms)


class IndexType(str, enum.Enum):
    """The per-segment files that travel with a segment (Kafka's RemoteStorageManager.IndexType)."""

    OFFSET = "OFFSET"
    TIMESTAMP = "TIMESTAMP"
    PRODUCER_SNAPSHOT = "PRODUCER_SNAPSHOT"
    TRANSACTION = "TRANSACTION"
    LEADER_EPOCH = "LEADER_EPOCH"


@dataclass(frozen=True, slots=True)
class LogSegmentData:
    """The local files of a rolled segment (Kafka's LogSegmentData). kcli keeps producer state
    in memory (no snapshot); a segment in which no aborted transaction ended has no transaction
    index. Both are optional here."""

    log_segment: Path
    offset_index: Path
    time_index: Path
    leader_epoch_index: bytes
    transaction_index: Path | None = None
    producer_snapshot_index: Path | None = None


class RemoteStorageManager(abc.ABC):
    """Moves segment bytes to and from a remote tier; holds no metadata of its own.

    Calls are blocking and may run in worker threads concurrently; implementations must be
    thread-safe. Every method raises :class:`RemoteStorageException` (or a subclass) on failure.
    """

    def configure(self, configs: dict[str, str]) -> None:
        """Settings from broker configs ``remote.log.storage.manager.impl.<key>`` (prefix
        stripped). The default accepts none, so a typo is reported at start-up."""
        if configs:
            raise RemoteStorageException(f"{type(self).__name__} accepts no configs, got: {', '.join(sorted(configs))}")

    @abc.abstractmethod
    def copy_log_segment_data(self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData) -> bytes | None:
        """Copy the segment and its indexes; returns optional custom metadata. A failed copy may
        leave partial objects behind: the caller then calls :meth:`delete_log_segment_data`."""

    @abc.abstractmethod
    def fetch_log_segment(self, metadata: RemoteLogSegmentMetadata, start_position: int,
                          end_position: int | None = None) -> bytes:
        """Bytes ``start_position``..``end_position`` (inclusive, as in Kafka; None = to the
        end of the segment) of the segment's log file."""

    @abc.abstractmethod
    def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        """The whole index file; RemoteResourceNotFoundException if this segment has none."""

    @abc.abstractmethod
    def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Delete the segment and its indexes; deleting what is already gone is not an error."""

    def segment_location(self, metadata: RemoteLogSegmentMetadata) -> str:
        """Where the segment's log bytes live, for the broker's log lines (kcli's addition to
        Kafka's interface: a damaged remote segment is reported by this name)."""
        sid = metadata.segment_id
        return f"remote segment {sid.id} ({sid.topic}-{sid.partition} from offset {metadata.start_offset})"

    def close(self) -> None:
        """Release clients and handles."""
