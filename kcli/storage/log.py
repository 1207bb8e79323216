"""The on-disk log of one classic partition, laid out exactly as Apache Kafka lays it out.

``<data_dir>/<topic>-<partition>/`` holds ``<20-digit base>.log`` segments of v2 record batches
(byte-for-byte what the producer sent, with offsets and leader epoch assigned), their
``.index`` / ``.timeindex`` files (see :mod:`kcli.storage.index`; written un-preallocated),
and ``partition.metadata``. Two small files replace Kafka's log-dir-level checkpoints:
``log-start-offset`` and ``recovery-point-offset`` (format: a version line ``0`` then the offset).

Durability follows Kafka: appends go to the page cache with one ``os.write``; :meth:`flush`
fsyncs what changed since the last flush and moves the recovery point (persisted at each new
segment and at most once a second). On open every segment's headers are walked (offsets,
producer state, index check). After a clean shutdown (the broker's ``.kafka_cleanshutdown``)
nothing else happens; otherwise batches at or above the persisted recovery point get a CRC
check, and a torn or corrupt tail is moved aside to ``<segment>.log.truncated-<ms>`` before
the cut, later segments renamed the same way: recovery never deletes records, and never
cuts below the recovery point (damage there is left in place and reads report it as
CORRUPT_MESSAGE). Reads CRC-check the batches they return.

The high watermark is the log end offset while the partition has one replica; a replicated
partition's replica layer (kcli/broker/replica/) sets it with :meth:`set_high_watermark`, and
reads without an explicit bound stop there. Every batch's partition leader epoch is kept in a
leader-epoch cache (Kafka's LeaderEpochFileCache), rebuilt from the batch headers that open walks
anyway, so it needs no checkpoint file; :meth:`end_offset_for_epoch` answers OffsetForLeaderEpoch
and :meth:`truncate_to` cuts a follower back to its leader. Not thread-safe except that
:meth:`flush` may run in a worker thread while the owner keeps calling the other methods.
"""

from __future__ import annotations

import base64
import enum
import itertools
import logging
import os
import re
import shutil
import struct
import threading
import time
import uuid
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kio.schema.errors import ErrorCode

from kcli import faults
from kcli.fsutil import fsync_dir
from kcli.records.batch import (
    HEADER_SIZE,
    BatchHeader,
    InvalidBatchError,
    crc_is_valid,
    read_header,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
)
from kcli.storage.errors import LogError, OffsetOutOfRange, RecordValidationError
from kcli.storage.index import INT32_MAX, NO_TIMESTAMP
from kcli.storage.log_config import LogConfig
from kcli.storage.producer_state import ProducerStateManager
from kcli.storage.txn_state import TXN_ENTRY, AbortedTxn, PartitionTxnState
from kcli.records.control import COMMIT, control_type
from kcli.storage.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIMEINDEX_SUFFIX,
    TXNINDEX_SUFFIX,
    Placement,
    Segment,
    SegmentInfo,
    iter_record_timestamps,
    move_aside,
    segment_name,
    swap_next_offset,
)

log = logging.getLogger(__name__)

LOG_START_OFFSET_FILE = "log-start-offset"
RECOVERY_POINT_FILE = "recovery-point-offset"
# A replicated partition's high watermark (Kafka's replication-offset-checkpoint, kept per partition
# directory so that it goes with the partition); written by the replica manager every
# replica.high.watermark.checkpoint.interval.ms and at a clean stop
HW_CHECKPOINT_FILE = "replication-offset-checkpoint"
PARTITION_METADATA_FILE = "partition.metadata"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"  # Kafka's LogLoader.CleanShutdownFile, one per log dir

# ListOffsets special timestamps (Kafka's ListOffsetsRequest constants).
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4

_SEGMENT_FILE = re.compile(r"^(\d{20})\.(log|index|timeindex)$")
_STRAY_SUFFIXES = (".deleted", ".cleaned", ".tmp")
_fdatasync = getattr(os, "fdatasync", os.fsync)  # fdatasync also persists the file size
_NO_BOUND = 2**63
RECOVERY_POINT_INTERVAL_S = 1.0  # most often a flush rewrites recovery-point-offset (Kafka: 60 s)


class AppendOrigin(enum.Enum):
    """Who is appending (Kafka's AppendOrigin): clients get the full produce checks; the
    coordinator may write control batches and skips duplicate/sequence checks."""

    CLIENT = "client"
    COORDINATOR = "coordinator"
    # A follower copying its leader (Kafka's appendAsFollower): base offsets and leader epochs are
    # the leader's, kept as they are; producer state is rebuilt without validation.
    REPLICATION = "replication"


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What a Produce response needs. For a duplicate, the original batch's offsets."""

    base_offset: int
    last_offset: int
    log_append_time: int  # -1 unless LogAppendTime
    log_start_offset: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Whole batches from the one containing the fetch offset (empty at the log end)."""

    records: bytes
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    next_offset: int  # the offset after the last returned batch (the fetch offset if empty)
    segment_base_offset: int = -1  # where the bytes came from (for sendfile-style readers)
    position: int = -1
    # Read from the remote tier: the aborted transactions its transaction indexes hold for the range
    # (the log's own list only has those of local segments once a restart replayed them).
    aborted_transactions: tuple[AbortedTxn, ...] = ()


@dataclass(frozen=True, slots=True)
class CleanableSegment:
    """One inactive segment as the log cleaner sees it; ``fd`` is a duplicate the cleaner
    reads and closes (the segment may be deleted meanwhile: the fd keeps its bytes)."""

    base_offset: int
    end_offset: int  # the next segment's base: every offset of this segment is below it
    size: int
    largest_timestamp: int  # Kafka's LogSegment.largestTimestamp (mtime when no timestamp)
    first_batch_timestamp: int  # the first batch's max timestamp, -1 if none (max.compaction.lag.ms)
    fd: int


@dataclass(frozen=True, slots=True)
class CleaningSnapshot:
    """What one cleaning pass needs, taken under the log's lock in one go."""

    log_start_offset: int
    active_base_offset: int
    log_end_offset: int
    segments: list[CleanableSegment]  # every inactive segment, oldest first
    producer_last_offsets: dict[int, int]  # producer id -> last offset it wrote (kept batches)
    # Transactions (Kafka's firstUnstableOffset and collectAbortedTransactions): the cleaner
    # stops below the segment holding the first offset of an open transaction, drops aborted
    # data and decides when markers may go.
    first_unstable_offset: int | None = None
    aborted: tuple[AbortedTxn, ...] = ()

    def close(self) -> None:
        for seg in self.segments:
            try:
                os.close(seg.fd)
            except OSError:
                pass


class PartitionLog:
    """One partition's segments, offsets and producer state. Build with :meth:`open`."""

    def __init__(self, directory: Path, config: LogConfig) -> None:
        self.dir = directory
        self._config = config
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._log_start = 0
        self._persisted_log_start: int | None = None
        self._leo = 0
        self._producers = ProducerStateManager()
        self._txns = PartitionTxnState()
        self._replaying: Segment | None = None  # the segment whose headers _load replays
        self._replayed_aborts: dict[int, list[AbortedTxn]] = {}  # per segment base, for .txnindex
        self._lock = threading.RLock()
        self._unflushed: dict[int, Segment] = {}
        self._dir_dirty = False
        self._recovery_point = 0
        self._persisted_recovery_point = 0
        self._recovery_point_persisted_at = 0.0  # time.monotonic() of the last checkpoint write
        self._recovery_point_segment = -1  # the active segment at that write
        self._reported_damage: set[str] = set()
        self._closed = False
        # Leader-epoch cache: (epoch, start offset) in increasing order of both
        self._epochs: list[tuple[int, int]] = []
        self._hw: int | None = None  # None: the high watermark is the log end (one replica)
        self._checkpointed_hw: int | None = None  # what HW_CHECKPOINT_FILE holds

    # ======================================================================================
    # open / recovery
    # ======================================================================================
    @classmethod
    def open(
        cls,
        directory: Path | str,
        config: LogConfig | None = None,
        *,
        now_ms: int | None = None,
        clean_shutdown: bool = False,
    ) -> "PartitionLog":
        """Open (creating if needed) the partition directory and recover it.

        ``clean_shutdown`` (the broker found Kafka's ``.kafka_cleanshutdown`` marker) means
        every batch was fsynced and closed: nothing is CRC-checked or cut. Otherwise only
        batches at or above the persisted recovery point are verified."""
        directory = Path(directory)
        config = config or LogConfig()
        now = _now_ms() if now_ms is None else now_ms
        plog = cls(directory, config)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            plog._load(now, clean_shutdown)
        except BaseException as exc:
            plog._close_segments()
            if isinstance(exc, OSError):
                raise LogError(ErrorCode.kafka_storage_error, f"cannot open log {directory}: {exc}") from exc
            raise
        return plog

    def _load(self, now_ms: int, clean_shutdown: bool = False) -> None:
        bases = self._scan_directory()
        persisted_start = _read_checkpoint(self.dir / LOG_START_OFFSET_FILE)
        self._persisted_log_start = persisted_start
        self._checkpointed_hw = _read_checkpoint(self.dir / HW_CHECKPOINT_FILE)
        recovery_point = _read_checkpoint(self.dir / RECOVERY_POINT_FILE) or 0
        # Kafka recovers from the recovery point after an unclean shutdown and not at all after
        # a clean one; below it batches are fsynced and trusted (finer than Kafka's segments).
        verify_from = _NO_BOUND if clean_shutdown else recovery_point
        replay = self._replay_batch
        damaged_last = False
        for i, base in enumerate(bases):
            seg = Segment(self.dir, base, self._config, created_ms=now_ms, create=False)
            if self._segments and base < self._segments[-1].next_offset:
                seg.close()
                raise LogError(
                    ErrorCode.kafka_storage_error,
                    f"segment {base} overlaps the previous one ending at {self._segments[-1].next_offset}",
                )
            is_last = i == len(bases) - 1
            end_offset = bases[i + 1] if not is_last else (recovery_point if recovery_point > base else -1)
            self._replaying = seg
            result = seg.recover(
                verify_from=verify_from, end_offset=end_offset, on_batch=replay, now_ms=now_ms, allow_gaps=not is_last
            )
            self._replaying = None
            self._segments.append(seg)
            self._bases.append(base)
            damaged_last = is_last and result.damaged_at >= 0
            if seg.next_offset > recovery_point and not clean_shutdown:
                self._unflushed[base] = seg  # not known to be durable yet
            if result.rebuilt_offset_index or result.rebuilt_time_index:
                log.info("%s: rebuilt index of segment %d", self.dir, base)
                self._dir_dirty = True
            if result.truncated_bytes and not is_last:
                for later in bases[i + 1 :]:
                    self._move_segment_aside(later, now_ms, "it follows a segment cut by recovery")
                break
        if damaged_last and self._segments[-1].next_offset > self._segments[-1].base_offset:
            # Appends after kept damage would only be reachable by reading through it: the
            # next append goes to a new active segment at the log end instead.
            self._segments[-1].on_become_inactive()
            self._add_segment(self._segments[-1].next_offset, now_ms)
        if not self._segments:
            self._add_segment(persisted_start or 0, now_ms)
        self._leo = self._segments[-1].next_offset
        if persisted_start is None:
            self._log_start = self._segments[0].base_offset
        elif persisted_start > self._leo:
            log.warning(
                "%s: log start %d is past the log end %d; moving all segments aside", self.dir, persisted_start, self._leo
            )
            segs = self._segments
            self._segments, self._bases, self._unflushed = [], [], {}
            for seg in segs:
                seg.close()
                self._move_segment_aside(seg.base_offset, now_ms, f"the log start {persisted_start} is past its end")
            self._producers.clear()
            self._txns.clear()
            self._add_segment(persisted_start, now_ms)
            self._leo = persisted_start
            self._log_start = persisted_start
        else:
            self._log_start = persisted_start
        self._txns.truncate_before(self._log_start)
        self._sync_txn_indexes()
        # Segments wholly below the log start (a crash between checkpoint and delete).
        self._delete_prefix(self._below_log_start(), now_ms, reason="below log start")
        for seg in self._segments[:-1]:
            seg.unload_indexes()
        self._recovery_point = min(recovery_point, self._leo)
        if clean_shutdown:
            self._recovery_point = self._leo
        self._persisted_recovery_point = self._recovery_point

    def _sync_txn_indexes(self) -> None:
        """Make each segment's ``.txnindex`` hold exactly the aborted transactions the replay
        found in it (Kafka rebuilds them in recovery too): the log is the truth, the index a
        copy for tools, so a stale, torn or orphaned one is rewritten or removed."""
        found, self._replayed_aborts = self._replayed_aborts, {}
        live = {seg.base_offset for seg in self._segments}
        for path in self.dir.glob("*" + TXNINDEX_SUFFIX):
            stem = path.name[: -len(TXNINDEX_SUFFIX)]
            if not (stem.isdigit() and int(stem) in live):
                path.unlink(missing_ok=True)
        for seg in self._segments:
            want = b"".join(_txn_entry(a) for a in found.get(seg.base_offset, []))
            try:
                have = seg.txnindex_path.read_bytes()
            except FileNotFoundError:
                have = None
            if have == want or (have is None and not want):
                continue
            if want:
                _atomic_write(seg.txnindex_path, want)
            else:
                seg.txnindex_path.unlink(missing_ok=True)

    def _move_segment_aside(self, base: int, now_ms: int, why: str) -> None:
        """Rename ``<base>.log`` to ``<base>.log.truncated-<ms>`` (one WARNING) and delete
        its indexes, which are derived data: recovery never deletes records."""
        stem = segment_name(base)
        log_path = self.dir / (stem + LOG_SUFFIX)
        try:
            size = log_path.stat().st_size
        except FileNotFoundError:
            size = 0
        target = move_aside(log_path, now_ms)
        for suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX):
            (self.dir / (stem + suffix)).unlink(missing_ok=True)
        log.warning(
            "%s: moved segment %d (%d bytes, offsets from %d) aside to %s: %s", self.dir, base, size, base, target.name, why
        )
        self._dir_dirty = True

    def _scan_directory(self) -> list[int]:
        """Segment base offsets, after removing leftovers Kafka would also discard and
        completing a log cleaner swap a crash interrupted (see :meth:`_complete_swaps`)."""
        self._complete_swaps()
        logs: set[int] = set()
        others: list[tuple[int, Path]] = []
        for path in self.dir.iterdir():
            name = path.name
            if name.endswith(_STRAY_SUFFIXES):
                path.unlink(missing_ok=True)
                continue
            m = _SEGMENT_FILE.match(name)
            if not m:
                continue
            if m.group(2) == "log":
                logs.add(int(m.group(1)))
            else:
                others.append((int(m.group(1)), path))
        for base, path in others:
            if base not in logs:  # an index without its log
                path.unlink(missing_ok=True)
        return sorted(logs)

    def _complete_swaps(self) -> None:
        """Finish what :meth:`replace_segments` began, as Kafka's LogLoader does with
        ``.swap`` files: a ``<base>.log.swap`` is a complete, fsynced cleaned segment, so
        the segments it replaces (those whose base offset lies in its offset range, always
        including ``<base>``) are deleted and it is renamed to ``<base>.log``. A ``.cleaned``
        file (a crash before the swap began) is a stray and removed with the others, leaving
        the old segments untouched: either way no offset is lost or doubled."""
        swaps = sorted(self.dir.glob("*" + LOG_SUFFIX + SWAP_SUFFIX))
        for swap in swaps:
            m = _SEGMENT_FILE.match(swap.name[: -len(SWAP_SUFFIX)])
            if not m:
                continue
            base = int(m.group(1))
            end = max(swap_next_offset(swap, base), base + 1)
            for path in self.dir.iterdir():
                old = _SEGMENT_FILE.match(path.name)
                if old and base <= int(old.group(1)) < end:
                    path.unlink(missing_ok=True)
            os.replace(swap, self.dir / (segment_name(base) + LOG_SUFFIX))
            fsync_dir(self.dir)
            log.info("%s: completed the swap of cleaned segment %d (offsets %d..%d)", self.dir, base, base, end - 1)

    def _note_epoch(self, epoch: int, start: int) -> None:
        if epoch >= 0 and (not self._epochs or epoch > self._epochs[-1][0]):
            self._epochs.append((epoch, start))

    def _replay_batch(self, h: BatchHeader) -> None:
        self._note_epoch(h.partition_leader_epoch, h.base_offset)
        if h.producer_id < 0:
            return
        if h.is_control:
            self._producers.replay_marker(h.producer_id, h.producer_epoch, h.max_timestamp)
            seg = self._replaying
            kind = control_type(os.pread(seg.fd, min(h.size, 128), h.position)) if seg is not None else -1
            if kind >= 0:
                aborted = self._txns.on_marker(h.producer_id, kind == COMMIT, h.base_offset, h.base_offset)
                if aborted is not None and seg is not None:
                    self._replayed_aborts.setdefault(seg.base_offset, []).append(aborted)
        else:
            self._txns.on_data(h.producer_id, h.base_offset, h.is_transactional)
            self._producers.replay(
                h.producer_id,
                h.producer_epoch,
                h.base_sequence,
                h.last_sequence,
                h.base_offset,
                h.last_offset,
                h.max_timestamp,
            )

    # ======================================================================================
    # properties
    # ======================================================================================
    @property
    def config(self) -> LogConfig:
        return self._config

    def update_config(self, config: LogConfig) -> None:
        """Apply changed topic configs; segment.index.bytes affects new segments only."""
        with self._lock:
            self._config = config
            for seg in self._segments:
                seg.index_interval = config.index_interval_bytes

    @property
    def log_start_offset(self) -> int:
        return self._log_start

    @property
    def local_log_start_offset(self) -> int:
        """First offset still in local segments (> log start once tiered segments are gone)."""
        return max(self._log_start, self._segments[0].base_offset) if self._segments else self._log_start

    @property
    def log_end_offset(self) -> int:
        return self._leo

    @property
    def high_watermark(self) -> int:
        return self._leo if self._hw is None else min(self._hw, self._leo)

    def set_high_watermark(self, offset: int | None) -> None:
        """Set the high watermark of a replicated partition (clamped to the log end); ``None``
        makes it follow the log end again (one replica)."""
        with self._lock:
            self._hw = None if offset is None else max(self._log_start, min(offset, self._leo))

    @property
    def replicated(self) -> bool:
        return self._hw is not None

    @property
    def checkpointed_high_watermark(self) -> int | None:
        """The high watermark of the last checkpoint (None: never written), for a restarted replica."""
        return self._checkpointed_hw

    def checkpoint_high_watermark(self) -> bool:
        """Write the high watermark of a replicated partition to ``replication-offset-checkpoint``
        (atomically: temp file, fsync, rename) when it moved since the last write."""
        with self._lock:
            if self._closed or self._hw is None:
                return False
            hw = self.high_watermark
            if hw == self._checkpointed_hw:
                return False
            _write_checkpoint(self.dir / HW_CHECKPOINT_FILE, hw)
            self._checkpointed_hw = hw
            return True

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the oldest open transaction, else the high watermark: where a
        read_committed fetch stops."""
        with self._lock:
            return min(self._txns.last_stable_offset(self._leo), self.high_watermark)

    # ---- leader epochs (Kafka's LeaderEpochFileCache) --------------------------------------
    @property
    def latest_epoch(self) -> int:
        return self._epochs[-1][0] if self._epochs else -1

    def assign_epoch(self, epoch: int) -> None:
        """A new leader's epoch starts at the current log end (Kafka's LeaderEpochFileCache.assign
        on becoming leader); kept in memory until a batch of the epoch is written."""
        with self._lock:
            self._note_epoch(epoch, self._leo)

    def epoch_entries(self) -> list[tuple[int, int]]:
        return list(self._epochs)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """Kafka's LeaderEpochFileCache.endOffsetFor: (the largest epoch <= ``epoch``, the start
        offset of the first epoch above it, or the log end for the latest); (-1, -1) for an
        undefined or a future epoch."""
        with self._lock:
            if epoch < 0 or not self._epochs:
                return -1, -1
            if epoch == self._epochs[-1][0]:
                return epoch, self._leo
            higher = next(((e, s) for e, s in self._epochs if e > epoch), None)
            if higher is None:
                return -1, -1
            floor = None
            for e, s in self._epochs:
                if e <= epoch:
                    floor = (e, s)
            return (epoch if floor is None else floor[0]), higher[1]

    def aborted_transactions(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping offsets ``start..end-1`` (for read_committed fetches)."""
        with self._lock:
            return self._txns.aborted_between(start, end)

    def open_transactions(self) -> dict[int, int]:
        """``{producer id: first offset}`` of the transactions open in this partition."""
        with self._lock:
            return dict(self._txns.ongoing)

    @property
    def recovery_point(self) -> int:
        """Every offset below this is fsynced."""
        return self._recovery_point

    @property
    def size_in_bytes(self) -> int:
        return sum(seg.size for seg in self._segments)

    @property
    def producer_state(self) -> ProducerStateManager:
        return self._producers

    def segments(self) -> list[SegmentInfo]:
        with self._lock:
            last = len(self._segments) - 1
            return [seg.info(is_active=i == last) for i, seg in enumerate(self._segments)]

    @property
    def _active(self) -> Segment:
        return self._segments[-1]

    # ======================================================================================
    # append
    # ======================================================================================
    def append(
        self,
        records: bytes | bytearray | memoryview,
        *,
        now_ms: int,
        log_append_time: bool = False,
        leader_epoch: int = 0,
        origin: AppendOrigin = AppendOrigin.CLIENT,
    ) -> AppendResult:
        """Validate, assign offsets to and write the batches of one Produce partition.

        ``records`` is copied once into a bytearray that is patched in place (base offset,
        leader epoch, LogAppendTime) and written with one ``os.write``; records are never
        decoded. LogAppendTime applies if ``log_append_time`` or the topic's
        message.timestamp.type says so. A retried idempotent batch returns the original
        offsets with ``duplicate=True`` and writes nothing.
        """
        with self._lock:
            self._check_open()
            config = self._config
            use_lat = log_append_time or config.log_append_time
            client = origin is AppendOrigin.CLIENT
            follower = origin is AppendOrigin.REPLICATION
            if follower:
                use_lat = False  # the leader's timestamps are kept as they are
            buf = bytearray(records)
            total = len(buf)
            if total == 0:
                raise LogError(ErrorCode.invalid_record, "the produce request has no record batch")
            if total > config.segment_bytes:
                raise LogError(
                    ErrorCode.record_list_too_large,
                    f"{total} bytes of records exceed segment.bytes ({config.segment_bytes})",
                )
            max_message = config.max_message_bytes
            next_offset = self._leo
            placements: list[Placement] = []
            producer_batches: list[tuple[BatchHeader, int, int, int]] = []
            max_ts_all = NO_TIMESTAMP
            check_keys = client and config.compact
            record_errors: list[tuple[int, str]] = []
            epoch_starts: list[tuple[int, int]] = []
            record_index = 0
            pos = 0
            while pos < total:
                if total - pos < HEADER_SIZE:
                    raise LogError(ErrorCode.corrupt_message, f"{total - pos} trailing bytes at position {pos} are not a batch")
                try:
                    h = read_header(buf, pos)
                except InvalidBatchError as exc:
                    raise LogError(ErrorCode.corrupt_message, str(exc)) from None
                size = h.size
                if pos + size > total:
                    raise LogError(ErrorCode.corrupt_message, f"batch at position {pos} needs {size} bytes, {total - pos} remain")
                if follower:
                    if h.base_offset < next_offset:
                        raise LogError(ErrorCode.unknown_server_error,
                                       f"replicated batch at offset {h.base_offset} is below the log end {next_offset}")
                    next_offset = h.base_offset
                elif client and h.base_offset != 0:
                    raise LogError(ErrorCode.invalid_record, f"batch base offset must be 0 in a produce request, got {h.base_offset}")
                if size > max_message:
                    raise LogError(ErrorCode.message_too_large, f"batch of {size} bytes exceeds max.message.bytes ({max_message})")
                if not crc_is_valid(buf, h):
                    raise LogError(ErrorCode.corrupt_message, f"batch at position {pos} fails its CRC-32C check")
                _validate_batch_fields(h, client)
                if check_keys and not h.is_control:
                    record_index = self._check_keys(buf, pos, size, record_index, record_errors)
                last_offset = next_offset + h.last_offset_delta
                max_ts = now_ms if use_lat else h.max_timestamp
                if follower:
                    epoch_starts.append((h.partition_leader_epoch, next_offset))
                else:
                    set_base_offset(buf, pos, next_offset)
                    set_partition_leader_epoch(buf, pos, leader_epoch)
                    if not epoch_starts:
                        epoch_starts.append((leader_epoch, next_offset))
                if use_lat:
                    set_log_append_time(buf, h, now_ms)
                if h.producer_id >= 0:
                    producer_batches.append((h, next_offset, last_offset, max_ts))
                placements.append((pos, last_offset, size, max_ts))
                if max_ts > max_ts_all:
                    max_ts_all = max_ts
                next_offset = last_offset + 1
                pos += size
            if record_errors:
                raise RecordValidationError(ErrorCode.invalid_record, record_errors)

            update = self._producers.begin(validate=client)
            markers: list[tuple[int, bool, int]] = []
            for h, first, last, ts in producer_batches:
                if h.is_control:
                    update.append_marker(h.producer_id, h.producer_epoch, ts)
                    markers.append((h.producer_id, control_type(buf, h.position) == COMMIT, first))
                    continue
                duplicate = update.append(
                    h.producer_id, h.producer_epoch, h.base_sequence, h.last_sequence, first, last, ts
                )
                if duplicate is not None:
                    return AppendResult(
                        duplicate.first_offset,
                        duplicate.last_offset,
                        duplicate.timestamp if use_lat else NO_TIMESTAMP,
                        self._log_start,
                        duplicate=True,
                    )

            seg = self._active
            if self._should_roll(seg, total, max_ts_all, next_offset - 1, now_ms):
                seg = self._roll(now_ms)
            seg.append(buf, placements)
            self._unflushed[seg.base_offset] = seg
            update.commit()
            base_offset = self._leo
            # In batch order: a follower's append carries many transactions of one producer (data,
            # marker, data, marker...), and each marker closes the transaction opened before it
            marker_at = {offset: (pid, commit) for pid, commit, offset in markers}
            for h, first, _last, _ts in producer_batches:
                if not h.is_control:
                    self._txns.on_data(h.producer_id, first, h.is_transactional)
                    continue
                pid, commit = marker_at[first]
                aborted = self._txns.on_marker(pid, commit, first, first)
                if aborted is not None:
                    _append_txn_entry(seg.txnindex_path, aborted)
            for epoch, start in epoch_starts:
                self._note_epoch(epoch, start)
            self._leo = next_offset
            return AppendResult(base_offset, next_offset - 1, now_ms if use_lat else NO_TIMESTAMP, self._log_start)

    def _check_keys(self, buf: bytearray, pos: int, size: int, index: int, errors: list[tuple[int, str]]) -> int:
        return check_record_keys(buf, pos, size, index, errors, self.dir.name)

    def _should_roll(self, seg: Segment, messages_size: int, max_timestamp: int, max_offset: int, now_ms: int) -> bool:
        """Kafka's LogSegment.shouldRoll (an empty segment never rolls: it would be reborn
        with the same base offset)."""
        if seg.size == 0:
            return False
        config = self._config
        return (
            seg.size > config.segment_bytes - messages_size
            or seg.time_waited_for_roll(now_ms, max_timestamp) > config.segment_ms
            or seg.offset_index.is_full()
            or seg.time_index.is_full()
            or max_offset - seg.base_offset > INT32_MAX
        )

    def roll(self, now_ms: int | None = None) -> int:
        """Force a new active segment at the log end (no-op if the active one is empty).
        Returns the active segment's base offset."""
        with self._lock:
            self._check_open()
            if self._active.size:
                self._roll(_now_ms() if now_ms is None else now_ms)
            return self._active.base_offset

    def _roll(self, now_ms: int) -> Segment:
        old = self._active
        old.on_become_inactive()
        faults.pause("log.roll")  # crash tests only (kcli/faults.py); a no-op otherwise
        try:
            new = self._add_segment(self._leo, now_ms)
        except OSError as exc:  # Segment logged the path and error
            raise LogError(ErrorCode.kafka_storage_error, f"cannot roll {self.dir} to a new segment: {exc}") from exc
        old.unload_indexes()
        return new

    def _add_segment(self, base_offset: int, now_ms: int) -> Segment:
        seg = Segment(self.dir, base_offset, self._config, created_ms=now_ms, create=True)
        self._segments.append(seg)
        self._bases.append(base_offset)
        self._dir_dirty = True
        return seg

    # ======================================================================================
    # read
    # ======================================================================================
    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        min_one_batch: bool = True,
        upper_bound: int | None = None,
    ) -> ReadResult:
        """Kafka fetch semantics for one segment's worth of whole batches.

        Starts at the batch containing ``offset`` (found via the offset index), returns
        whole batches up to ``max_bytes`` (at least one if ``min_one_batch``) that end
        below ``upper_bound`` (exclusive; default the high watermark). ``offset`` equal to
        the log end gives empty records; outside the local log raises OffsetOutOfRange.
        """
        with self._lock:
            self._check_open()
            if max_bytes < 0:
                raise LogError(ErrorCode.invalid_request, f"max_bytes must be >= 0, got {max_bytes}")
            leo = self._leo
            hw = self.high_watermark
            if offset < self.local_log_start_offset or offset > leo:
                raise self._out_of_range(offset)
            bound = hw if upper_bound is None else min(upper_bound, leo)
            if offset < bound:
                i = bisect_right(self._bases, offset) - 1
                for seg in self._segments[max(i, 0) :]:
                    try:
                        found = seg.read(offset, max_bytes, min_one_batch, bound)
                    except LogError as exc:
                        if exc.code == ErrorCode.corrupt_message and exc.message not in self._reported_damage:
                            self._reported_damage.add(exc.message)  # once per damaged spot, not per fetch
                            log.warning("fetch at offset %d: %s (left in place)", offset, exc.message)
                        raise
                    if found is not None:
                        data, position, next_offset = found
                        return ReadResult(
                            data, hw, self._log_start, leo, next_offset, seg.base_offset, position
                        )
            return ReadResult(b"", hw, self._log_start, leo, offset)

    def _out_of_range(self, offset: int) -> OffsetOutOfRange:
        return OffsetOutOfRange(
            offset,
            log_start_offset=self._log_start,
            local_log_start_offset=self.local_log_start_offset,
            log_end_offset=self._leo,
        )

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= ``timestamp_ms``
        (Kafka's fetchOffsetByTimestamp over local segments), or None if there is none.

        ListOffsets' special values are answered too, with timestamp -1 as Kafka does:
        -1 latest (log end), -2 earliest (log start), -4 earliest local; -3 (max timestamp)
        gives the record holding the largest timestamp and that timestamp.
        """
        with self._lock:
            self._check_open()
            if timestamp_ms == LATEST_TIMESTAMP:
                return self._leo, NO_TIMESTAMP
            if timestamp_ms == EARLIEST_TIMESTAMP:
                return self._log_start, NO_TIMESTAMP
            if timestamp_ms == EARLIEST_LOCAL_TIMESTAMP:
                return self.local_log_start_offset, NO_TIMESTAMP
            if timestamp_ms == MAX_TIMESTAMP:
                return self._max_timestamp_offset()
            if timestamp_ms < 0:
                raise LogError(ErrorCode.invalid_request, f"unsupported ListOffsets timestamp {timestamp_ms}")
            start = self.local_log_start_offset
            for seg in self._segments:
                if seg.max_timestamp >= timestamp_ms:
                    found = seg.find_offset_by_timestamp(timestamp_ms, start)
                    if found is not None:
                        return found
            return None

    def _max_timestamp_offset(self) -> tuple[int, int] | None:
        best: Segment | None = None
        for seg in self._segments:
            if seg.max_timestamp >= 0 and (best is None or seg.max_timestamp > best.max_timestamp):
                best = seg
        if best is None:
            return None
        found = best.find_batch(best.offset_of_max_timestamp)
        if found is not None:
            pos, header = found
            for rec_offset, rec_ts in iter_record_timestamps(best.read_batch(pos, header.size)):
                if rec_ts == best.max_timestamp:
                    return rec_offset, rec_ts
        return best.offset_of_max_timestamp, best.max_timestamp

    # ======================================================================================
    # retention and log start
    # ======================================================================================
    def delete_retention(self, now_ms: int) -> int:
        """Kafka's deleteOldSegments: segments wholly below the log start, then the oldest
        while the log exceeds retention.bytes, then those whose newest timestamp is older
        than retention.ms (the last two only with cleanup.policy=delete). Only whole
        segments below the high watermark; if every segment qualifies the log rolls first so
        the active one can go too. Returns the number of segments deleted."""
        with self._lock:
            self._check_open()
            deleted = self._delete_prefix(self._below_log_start(), now_ms, reason="below log start")
            config = self._config
            if not config.delete_enabled:
                return deleted
            if config.retention_bytes >= 0:
                excess = self.size_in_bytes - config.retention_bytes

                def size_breached(seg: Segment, _next: Segment | None) -> bool:
                    nonlocal excess
                    if excess - seg.size >= 0:
                        excess -= seg.size
                        return True
                    return False

                if excess > 0:
                    deleted += self._delete_prefix(self._deletable(size_breached), now_ms, reason="retention.bytes")
            if config.retention_ms >= 0:
                retention_ms = config.retention_ms

                def time_breached(seg: Segment, _next: Segment | None) -> bool:
                    return now_ms - seg.largest_timestamp() > retention_ms

                deleted += self._delete_prefix(self._deletable(time_breached), now_ms, reason="retention.ms")
            return deleted

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: move the log start to ``offset`` (-1 = high watermark) and delete
        the segments wholly below it. Returns the new log start offset."""
        with self._lock:
            self._check_open()
            if offset == -1:
                offset = self.high_watermark
            if offset < 0 or offset > self.high_watermark:
                raise self._out_of_range(offset)
            if offset > self._log_start:
                self._set_log_start(offset)
                self._delete_prefix(self._below_log_start(), _now_ms(), reason="delete records")
            return self._log_start

    def set_log_start_offset(self, offset: int) -> None:
        """Set the log start (tiered storage: remote retention moved it, or a restored log
        start below the local one). Local segments wholly below it are deleted."""
        with self._lock:
            self._check_open()
            if offset < 0 or offset > self._leo:
                raise self._out_of_range(offset)
            if offset != self._log_start:
                self._set_log_start(offset)
            self._delete_prefix(self._below_log_start(), _now_ms(), reason="log start moved")

    def delete_local_segments_below(self, offset: int) -> int:
        """Delete local segments wholly below ``offset`` (already in the remote tier) without
        moving the log start: only the local log start moves. Never the active segment."""
        with self._lock:
            self._check_open()

            def below(seg: Segment, nxt: Segment | None) -> bool:
                return nxt is not None and nxt.base_offset <= offset

            return self._delete_prefix(self._deletable(below), _now_ms(), reason="tiered", move_log_start=False)

    def _below_log_start(self) -> list[Segment]:
        start = self._log_start
        return self._deletable(lambda seg, nxt: nxt is not None and nxt.base_offset <= start)

    def _deletable(self, predicate: Callable[[Segment, Segment | None], bool]) -> list[Segment]:
        """Kafka's deletableSegments: the longest prefix matching ``predicate`` that is below
        the high watermark, excluding an empty active segment."""
        result: list[Segment] = []
        segs = self._segments
        hw = self.high_watermark
        for i, seg in enumerate(segs):
            nxt = segs[i + 1] if i + 1 < len(segs) else None
            upper = nxt.base_offset if nxt is not None else self._leo
            if hw >= upper and not (nxt is None and seg.size == 0) and predicate(seg, nxt):
                result.append(seg)
            else:
                break
        return result

    def _delete_prefix(self, doomed: list[Segment], now_ms: int, *, reason: str, move_log_start: bool = True) -> int:
        if not doomed:
            return 0
        if len(doomed) == len(self._segments):
            self._roll(now_ms)
        remaining_first = self._segments[len(doomed)].base_offset
        if move_log_start and remaining_first > self._log_start:
            self._set_log_start(remaining_first)  # checkpoint first: a crash then only leaves files to delete
        elif self._persisted_log_start != self._log_start:
            # Without a checkpoint, open would take the first local segment as the log start.
            self._set_log_start(self._log_start)
        for seg in doomed:
            log.info("%s: deleting segment %d (%s)", self.dir, seg.base_offset, reason)
            self._unflushed.pop(seg.base_offset, None)
            seg.delete_files()
        del self._segments[: len(doomed)]
        del self._bases[: len(doomed)]
        self._dir_dirty = True
        return len(doomed)

    # ======================================================================================
    # log cleaner (kcli.storage.cleaner)
    # ======================================================================================
    def cleaning_snapshot(self) -> CleaningSnapshot:
        """The inactive segments (with duplicated fds) and offsets a cleaning pass reads."""
        with self._lock:
            self._check_open()
            segs = self._segments
            out: list[CleanableSegment] = []
            try:
                for seg, nxt in itertools.pairwise(segs):
                    first_ts = seg.rolling_timestamp if seg.rolling_timestamp is not None else NO_TIMESTAMP
                    out.append(
                        CleanableSegment(
                            seg.base_offset, nxt.base_offset, seg.size, seg.largest_timestamp(), first_ts, os.dup(seg.fd)
                        )
                    )
            except OSError as exc:
                for c in out:
                    os.close(c.fd)
                raise LogError(ErrorCode.kafka_storage_error, f"cannot read {self.dir} for cleaning: {exc}") from exc
            producers = {pid: e.last_offset for pid, e in self._producers.producers().items()}
            unstable = min(self._txns.ongoing.values()) if self._txns.ongoing else None
            if self._hw is not None and self.high_watermark < self._leo:
                # Kafka cleans below the last stable offset only, never above the high watermark:
                # records there may still be truncated, and an older value they replace with them
                hw = self.high_watermark
                unstable = hw if unstable is None else min(unstable, hw)
            return CleaningSnapshot(self._log_start, self._active.base_offset, self._leo, out, producers,
                                    unstable, tuple(self._txns.aborted_between(self._log_start, self._leo)))

    def replace_segments(self, old: list[CleanableSegment], cleaned: Path, now_ms: int) -> bool:
        """Swap the cleaner's ``<base>.log.cleaned`` (complete and fsynced) in for the
        segments ``old`` (consecutive, inactive), as Kafka's replaceSegments does: rename it
        to ``.swap`` (the commit point: recovery finishes the swap from here), delete the
        old segments, rename the swap to ``<base>.log``. Offsets never change. Returns False
        (and removes ``cleaned``) when retention or DeleteRecords removed one of the old
        segments meanwhile."""
        with self._lock:
            self._check_open()
            first = old[0].base_offset
            try:
                i = self._bases.index(first)
            except ValueError:
                i = -1
            current = self._segments[i : i + len(old)] if i >= 0 else []
            if (
                len(current) != len(old)
                or i + len(old) >= len(self._segments)  # never the active segment
                or any(s.base_offset != o.base_offset or s.size != o.size for s, o in zip(current, old))
            ):
                cleaned.unlink(missing_ok=True)
                return False
            final = self.dir / (segment_name(first) + LOG_SUFFIX)
            swap = final.with_name(final.name + SWAP_SUFFIX)
            try:
                os.replace(cleaned, swap)
                fsync_dir(self.dir)
                faults.pause("log.cleaner.swap")  # crash tests only: the swap is committed, not done
                for seg in current:
                    self._unflushed.pop(seg.base_offset, None)
                    seg.delete_files()
                os.replace(swap, final)
                fsync_dir(self.dir)
                seg = Segment(self.dir, first, self._config, created_ms=now_ms, create=False)
            except OSError as exc:
                log.error("%s: swapping in cleaned segment %d failed: %s", self.dir, first, exc)
                raise LogError(ErrorCode.kafka_storage_error, f"cannot swap in cleaned segment {final}: {exc}") from exc
            seg.recover(verify_from=_NO_BOUND, end_offset=old[-1].end_offset, now_ms=now_ms, allow_gaps=True)
            seg.on_become_inactive()
            seg.unload_indexes()
            self._segments[i : i + len(old)] = [seg]
            self._bases[i : i + len(old)] = [first]
            return True

    # ======================================================================================
    # truncation (a follower matching its leader)
    # ======================================================================================
    def truncate_to(self, offset: int) -> int:
        """Remove every batch at or above ``offset`` (a batch that holds ``offset`` goes whole:
        its follower fetches it again). Producer, transaction and epoch state are rebuilt by
        reopening the log, as Kafka rebuilds them from its snapshots. Returns the new log end."""
        with self._lock:
            self._check_open()
            if offset >= self._leo:
                return self._leo
            if offset <= self._log_start:
                return self._truncate_fully(self._log_start)
            now = _now_ms()
            i = max(bisect_right(self._bases, offset) - 1, 0)
            seg = self._segments[i]
            found = seg.find_batch(offset)
            cut_pos = seg.size if found is None else found[0]
            for later in self._segments[i + 1:]:
                later.delete_files()
            self._segments, self._bases = self._segments[:i + 1], self._bases[:i + 1]
            os.ftruncate(seg.fd, cut_pos)
            os.fsync(seg.fd)
            seg.close()
            for path in (seg.index_path, seg.timeindex_path, seg.txnindex_path):  # rebuilt on open
                path.unlink(missing_ok=True)
            new_end = found[1].base_offset if found is not None else offset
            _write_checkpoint(self.dir / RECOVERY_POINT_FILE, min(self._recovery_point, new_end))
            fsync_dir(self.dir)
            self._reopen(now)
            log.info("%s: truncated to offset %d (log end %d)", self.dir, offset, self._leo)
            return self._leo

    def truncate_fully_and_start_at(self, offset: int) -> int:
        """Delete every segment and start an empty log at ``offset`` (a follower whose log does
        not overlap its leader's, Kafka's truncateFullyAndStartAt)."""
        with self._lock:
            self._check_open()
            return self._truncate_fully(offset)

    def _truncate_fully(self, offset: int) -> int:
        for seg in self._segments:
            seg.delete_files()
        self._segments, self._bases = [], []
        _write_checkpoint(self.dir / LOG_START_OFFSET_FILE, offset)
        _write_checkpoint(self.dir / RECOVERY_POINT_FILE, offset)
        fsync_dir(self.dir)
        self._reopen(_now_ms())
        log.info("%s: truncated fully, the log starts at offset %d", self.dir, offset)
        return self._leo

    def _reopen(self, now_ms: int) -> None:
        """Drop the in-memory state and load the directory again (lock held)."""
        hw = self._hw
        for seg in self._segments:
            seg.close()
        lock = self._lock
        self.__init__(self.dir, self._config)  # type: ignore[misc]
        self._lock = lock
        self._load(now_ms, clean_shutdown=False)
        if hw is not None:
            self._hw = max(self._log_start, min(hw, self._leo))
        if self._checkpointed_hw is not None and self._checkpointed_hw > self._leo:
            # records above the new end may come back different: a later start must not trust them
            _write_checkpoint(self.dir / HW_CHECKPOINT_FILE, self._leo)
            self._checkpointed_hw = self._leo

    def _set_log_start(self, offset: int) -> None:
        _write_checkpoint(self.dir / LOG_START_OFFSET_FILE, offset)
        self._log_start = self._persisted_log_start = offset
        self._txns.truncate_before(offset)

    # ======================================================================================
    # durability and lifecycle
    # ======================================================================================
    def flush(self) -> None:
        """fsync everything appended before this call (segments written since the last
        flush, and the directory after a roll or delete). Cheap when nothing changed; safe
        to call from a worker thread (it fsyncs duplicated fds outside the lock)."""
        with self._lock:
            if self._closed or (not self._unflushed and not self._dir_dirty):
                return
            target = self._leo
            segs = list(self._unflushed.values())
            self._unflushed.clear()
            dir_dirty, self._dir_dirty = self._dir_dirty, False
            fds = [os.dup(seg.fd) for seg in segs]
        failing: Path = self.dir
        try:
            for seg, fd in zip(segs, fds):
                failing = seg.log_path
                _fdatasync(fd)
            if dir_dirty:
                failing = self.dir
                fsync_dir(self.dir)
        except OSError as exc:
            log.error("%s: fsync failed: %s", failing, exc)
            with self._lock:
                for seg in segs:
                    if seg.fd >= 0:
                        self._unflushed.setdefault(seg.base_offset, seg)
                self._dir_dirty = self._dir_dirty or dir_dirty
            raise LogError(ErrorCode.kafka_storage_error, f"fsync of {failing} failed: {exc}") from exc
        finally:
            for fd in fds:
                os.close(fd)
        with self._lock:
            if target > self._recovery_point:
                self._recovery_point = target
                # Persist at each new segment and at most once a second otherwise: recovery
                # after a crash verifies only what lies above the persisted point.
                now = time.monotonic()
                active_base = self._active.base_offset
                if not self._closed and (
                    active_base != self._recovery_point_segment
                    or now - self._recovery_point_persisted_at >= RECOVERY_POINT_INTERVAL_S
                ):
                    self._persist_recovery_point()
                    self._recovery_point_persisted_at = now
                    self._recovery_point_segment = active_base

    def _persist_recovery_point(self) -> None:
        _write_checkpoint(self.dir / RECOVERY_POINT_FILE, self._recovery_point)
        self._persisted_recovery_point = self._recovery_point

    def close(self) -> None:
        """Seal the active segment's indexes, fsync, record the recovery point, close files."""
        with self._lock:
            if self._closed:
                return
            try:
                self._active.on_become_inactive()
                self.flush()
                self._recovery_point = self._leo
                self._persist_recovery_point()
            finally:
                self._close_segments()
                self._closed = True

    def _close_segments(self) -> None:
        for seg in self._segments:
            seg.close()

    def delete(self) -> None:
        """Remove the whole partition directory."""
        with self._lock:
            if not self._closed:
                self._close_segments()
                self._closed = True
            shutil.rmtree(self.dir, ignore_errors=True)

    def _check_open(self) -> None:
        if self._closed:
            raise LogError(ErrorCode.kafka_storage_error, f"log {self.dir} is closed")

    def __enter__(self) -> "PartitionLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"PartitionLog({self.dir}, log_start={self._log_start}, log_end={self._leo}, "
            f"segments={len(self._segments)})"
        )


# ==========================================================================================
# helpers
# ==========================================================================================
def _validate_batch_fields(h: BatchHeader, client: bool) -> None:
    """Kafka's LogValidator.validateBatch checks that need only the header."""
    if h.records_count <= 0 or h.last_offset_delta < 0:
        raise LogError(ErrorCode.invalid_record, f"batch reports {h.records_count} records, last offset delta {h.last_offset_delta}")
    if h.records_count != h.last_offset_delta + 1:
        raise LogError(
            ErrorCode.invalid_record,
            f"inconsistent batch: {h.records_count} records but last offset delta {h.last_offset_delta}",
        )
    if h.is_control and client:
        raise LogError(ErrorCode.invalid_record, "clients may not write control batches")
    if h.producer_id >= 0:
        if h.base_sequence < 0 and not h.is_control:
            raise LogError(ErrorCode.invalid_record, f"invalid sequence {h.base_sequence} for producer {h.producer_id}")
    elif h.is_transactional:
        raise LogError(ErrorCode.invalid_record, "transactional batch without a producer id")


def _txn_entry(a: AbortedTxn) -> bytes:
    return TXN_ENTRY.pack(0, a.producer_id, a.first_offset, a.last_offset, a.last_stable_offset)


def _append_txn_entry(path: Path, a: AbortedTxn) -> None:
    """Add one entry to a segment's .txnindex; not fsynced (rebuilt from the log on open)."""
    with open(path, "ab") as f:
        f.write(_txn_entry(a))


def _now_ms() -> int:
    return int(time.time() * 1000)


def _read_checkpoint(path: Path) -> int | None:
    """Read ``0\\n<offset>\\n``; a missing or unreadable file is None (the safe default)."""
    try:
        lines = path.read_text().split()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    if len(lines) != 2 or lines[0] != "0":
        log.warning("ignoring malformed checkpoint %s", path)
        return None
    try:
        value = int(lines[1])
    except ValueError:
        log.warning("ignoring malformed checkpoint %s", path)
        return None
    return value if value >= 0 else None


def _write_checkpoint(path: Path, offset: int) -> None:
    _atomic_write(path, f"0\n{offset}\n".encode())


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        log.error("%s: write failed: %s", path, exc)
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise LogError(ErrorCode.kafka_storage_error, f"cannot write {path}: {exc}") from exc



def write_clean_shutdown_marker(log_dir: Path | str) -> Path:
    """Kafka's ``.kafka_cleanshutdown``: written (durably) only after every log of the dir
    was flushed and closed, so a start that finds it may skip recovery."""
    path = Path(log_dir) / CLEAN_SHUTDOWN_FILE
    _atomic_write(path, b"")
    return path


def remove_clean_shutdown_marker(log_dir: Path | str) -> None:
    """Remove the marker (durably) once the logs are loaded, before anything is written:
    a crash after this is unclean again. Raises OSError if it cannot."""
    path = Path(log_dir) / CLEAN_SHUTDOWN_FILE
    try:
        path.unlink()
    except FileNotFoundError:
        return
    except OSError as exc:
        log.error("%s: cannot remove: %s", path, exc)
        raise
    fsync_dir(path.parent)


def write_partition_metadata(directory: Path | str, topic_id: uuid.UUID) -> Path:
    """Write Kafka's ``partition.metadata`` (``version: 0`` / ``topic_id: <base64 uuid>``,
    the id in Kafka's URL-safe unpadded base64)."""
    path = Path(directory) / PARTITION_METADATA_FILE
    encoded = base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode()
    _atomic_write(path, f"version: 0\ntopic_id: {encoded}".encode())
    return path


def read_partition_metadata(directory: Path | str) -> uuid.UUID | None:
    """The topic id from ``partition.metadata``, or None if the file is absent."""
    path = Path(directory) / PARTITION_METADATA_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    fields = dict(re.split(r":\s+", line, maxsplit=1) for line in text.splitlines() if ":" in line)
    if fields.get("version") != "0" or "topic_id" not in fields:
        raise LogError(ErrorCode.kafka_storage_error, f"malformed {path}")
    try:
        raw = base64.urlsafe_b64decode(fields["topic_id"] + "==")
        return uuid.UUID(bytes=raw)
    except ValueError as exc:
        raise LogError(ErrorCode.kafka_storage_error, f"malformed topic id in {path}") from exc


def check_record_keys(buf: bytes | bytearray | memoryview, pos: int, size: int, index: int,
                      errors: list[tuple[int, str]], partition: str) -> int:
    """Kafka's LogValidator.validateKey for a compacted topic (classic or diskless): every record
    needs a key. Adds (record index, message) per keyless record of the batch at ``pos``; returns
    the next record index."""
    from aiokafka.record.default_records import DefaultRecordBatch

    try:
        for record in DefaultRecordBatch(bytes(buf[pos : pos + size])):
            if record.key is None:
                message = f"Compacted topic cannot accept message without key in topic partition {partition}."
                errors.append((index, message))
            index += 1
    except Exception as exc:  # noqa: BLE001 - aiokafka's CorruptRecordException / codec errors
        raise LogError(ErrorCode.corrupt_message, f"cannot decode record batch: {exc}") from None
    return index


__all__ = [
    "CLEAN_SHUTDOWN_FILE",
    "AppendOrigin",
    "AppendResult",
    "PartitionLog",
    "check_record_keys",
    "ReadResult",
    "SegmentInfo",
    "read_partition_metadata",
    "remove_clean_shutdown_marker",
    "write_clean_shutdown_marker",
    "write_partition_metadata",
    "INDEX_SUFFIX",
    "LOG_SUFFIX",
    "TIMEINDEX_SUFFIX",
]

