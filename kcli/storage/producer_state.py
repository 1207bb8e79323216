"""Idempotent-producer state of one partition, after Kafka's ProducerStateManager.

Per producer id we keep the epoch and the metadata of its last 5 batches (Kafka's
NUM_BATCHES_TO_RETAIN, which is also the client's max in-flight requests with idempotence):
enough to answer a retried batch with its original offsets instead of writing it twice.

Appends are staged: :meth:`ProducerStateManager.begin` returns an update that validates each
batch against the committed state plus the batches staged before it, and only
:meth:`ProducerStateUpdate.commit` (called after the log write succeeded) changes the
manager. Recovery replays batch headers with :meth:`ProducerStateManager.replay`, which never
validates (Kafka's REPLICATION origin). Nothing here touches files, so the class is reusable by
anything that orders batches per partition.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode
from collections import deque
from dataclasses import dataclass, field

from kcli.storage.errors import LogError

NUM_BATCHES_TO_RETAIN = 5
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1
INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """Where one idempotent batch landed: its sequence range and offset range."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int  # the batch's max timestamp, as Kafka keeps it


@dataclass(slots=True)
class ProducerStateEntry:
    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))
    last_timestamp: int = NO_TIMESTAMP

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def copy(self) -> "ProducerStateEntry":
        return ProducerStateEntry(
            self.producer_id,
            self.producer_epoch,
            deque(self.batches, maxlen=NUM_BATCHES_TO_RETAIN),
            self.last_timestamp,
        )

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """The cached batch with exactly this epoch and sequence range, if any."""
        if epoch != self.producer_epoch:
            return None
        for meta in self.batches:
            if meta.first_seq == first_seq and meta.last_seq == last_seq:
                return meta
        return None

    def maybe_update_epoch(self, epoch: int) -> None:
        """A new epoch starts a new sequence space: forget the old epoch's batches."""
        if epoch != self.producer_epoch:
            self.producer_epoch = epoch
            self.batches.clear()

    def add_batch(self, epoch: int, meta: BatchMetadata) -> None:
        self.maybe_update_epoch(epoch)
        self.batches.append(meta)
        self.last_timestamp = meta.timestamp


def in_sequence(last_seq: int, next_seq: int) -> bool:
    """``next_seq`` directly follows ``last_seq``; sequences wrap from Int32.MAX to 0."""
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


class ProducerStateManager:
    """Committed producer state of one partition (see module docstring)."""

    def __init__(self) -> None:
        self._producers: dict[int, ProducerStateEntry] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def __contains__(self, producer_id: object) -> bool:
        return producer_id in self._producers

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self._producers.get(producer_id)

    def producers(self) -> dict[int, ProducerStateEntry]:
        """A snapshot copy (safe to keep while the log appends)."""
        return {pid: entry.copy() for pid, entry in self._producers.items()}

    def begin(self, *, validate: bool = True) -> "ProducerStateUpdate":
        """Stage the producer batches of one append; ``validate=False`` skips duplicate and
        sequence checks (Kafka's non-client origins) but still fences older epochs."""
        return ProducerStateUpdate(self, validate=validate)

    def replay(
        self,
        producer_id: int,
        producer_epoch: int,
        first_seq: int,
        last_seq: int,
        first_offset: int,
        last_offset: int,
        timestamp: int,
    ) -> None:
        """Apply a batch already in the log (recovery), without any check."""
        entry = self._producers.get(producer_id)
        if entry is None:
            entry = self._producers[producer_id] = ProducerStateEntry(producer_id)
        entry.add_batch(producer_epoch, BatchMetadata(first_seq, last_seq, first_offset, last_offset, timestamp))

    def replay_marker(self, producer_id: int, producer_epoch: int, timestamp: int) -> None:
        """Apply a control batch (transaction marker) already in the log: epoch only."""
        entry = self._producers.get(producer_id)
        if entry is None:
            entry = self._producers[producer_id] = ProducerStateEntry(producer_id)
        entry.maybe_update_epoch(producer_epoch)
        entry.last_timestamp = timestamp

    def remove_expired(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers idle for ``expiration_ms`` (Kafka's producer.id.expiration.ms,
        judged by the last batch timestamp). Returns how many were removed."""
        expired = [pid for pid, e in self._producers.items() if now_ms - e.last_timestamp >= expiration_ms]
        for pid in expired:
            del self._producers[pid]
        return len(expired)

    def clear(self) -> None:
        self._producers.clear()


class ProducerStateUpdate:
    """The producer changes of one append, applied to the manager only on :meth:`commit`."""

    def __init__(self, manager: ProducerStateManager, *, validate: bool) -> None:
        self._manager = manager
        self._validate = validate
        self._updated: dict[int, ProducerStateEntry] = {}

    def append(
        self,
        producer_id: int,
        producer_epoch: int,
        first_seq: int,
        last_seq: int,
        first_offset: int,
        last_offset: int,
        timestamp: int,
    ) -> BatchMetadata | None:
        """Stage one idempotent batch.

        Returns the original batch's metadata when this is a retry of a batch the log
        already holds (nothing is staged then); raises LogError with
        INVALID_PRODUCER_EPOCH or OUT_OF_ORDER_SEQUENCE_NUMBER as Kafka's produce path does.
        """
        committed = self._manager.last_entry(producer_id)
        if self._validate and committed is not None:
            duplicate = committed.find_duplicate(producer_epoch, first_seq, last_seq)
            if duplicate is not None:
                return duplicate
        entry = self._updated.get(producer_id)
        if entry is None:
            entry = committed.copy() if committed is not None else ProducerStateEntry(producer_id)
        self._check_epoch(entry, producer_epoch)
        if self._validate:
            self._check_sequence(entry, committed, producer_epoch, first_seq)
        entry.add_batch(producer_epoch, BatchMetadata(first_seq, last_seq, first_offset, last_offset, timestamp))
        self._updated[producer_id] = entry
        return None

    def append_marker(self, producer_id: int, producer_epoch: int, timestamp: int) -> None:
        """Stage a control batch: fences older epochs, moves the epoch forward."""
        committed = self._manager.last_entry(producer_id)
        entry = self._updated.get(producer_id)
        if entry is None:
            entry = committed.copy() if committed is not None else ProducerStateEntry(producer_id)
        self._check_epoch(entry, producer_epoch)
        entry.maybe_update_epoch(producer_epoch)
        entry.last_timestamp = timestamp
        self._updated[producer_id] = entry

    def commit(self) -> None:
        self._manager._producers.update(self._updated)
        self._updated = {}

    @staticmethod
    def _check_epoch(entry: ProducerStateEntry, epoch: int) -> None:
        if epoch < entry.producer_epoch:
            raise LogError(
                ErrorCode.invalid_producer_epoch,
                f"producer {entry.producer_id} epoch {epoch} is older than the current epoch {entry.producer_epoch}",
            )

    @staticmethod
    def _check_sequence(
        entry: ProducerStateEntry, committed: ProducerStateEntry | None, epoch: int, first_seq: int
    ) -> None:
        pid = entry.producer_id
        if epoch != entry.producer_epoch:
            # A bumped epoch restarts sequences at 0 (unless we knew no epoch at all).
            if first_seq != 0 and entry.producer_epoch != NO_PRODUCER_EPOCH:
                raise LogError(
                    ErrorCode.out_of_order_sequence_number,
                    f"producer {pid}: new epoch {epoch} must start at sequence 0, got {first_seq}",
                )
            return
        # Unknown producer (its batches were all removed from the log): accept any sequence,
        # as Kafka >= 2.5 does instead of answering UNKNOWN_PRODUCER_ID.
        if committed is None or committed.producer_epoch == NO_PRODUCER_EPOCH:
            return
        last_seq = entry.last_seq  # NO_SEQUENCE (-1) when the epoch has no batch yet: expect 0
        if not in_sequence(last_seq, first_seq):
            raise LogError(
                ErrorCode.out_of_order_sequence_number,
                f"producer {pid} epoch {epoch}: expected sequence {(last_seq + 1) & INT32_MAX}, got {first_seq}",
            )
