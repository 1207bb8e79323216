"""Log compaction of diskless partitions (``cleanup.policy=compact``): the classic cleaner's rules
applied to WAL objects.

What is kept is decided exactly as for classic topics (kcli/storage/cleaner.py, whose record
filter this module calls): the latest record per key survives, tombstones stay for
``delete.retention.ms`` after the pass that first keeps them (KIP-534 delete horizon in the
batch), ``min.cleanable.dirty.ratio`` / ``max.compaction.lag.ms`` / ``min.compaction.lag.ms``
decide when and up to where a log is cleaned. What differs is the storage:

- a diskless log has no segments: its clean section is ``[log start, checkpoint)``, its dirty
  section ``[checkpoint, first uncleanable)`` counted in whole batches, where the first
  uncleanable offset is the high watermark as the pass read it — or earlier, the first dirty
  batch younger than ``min.compaction.lag.ms``. There is no active segment to spare: the newest
  batches are cleanable (``min.compaction.lag.ms`` keeps records longer where wanted);
- the checkpoint lives in the batch coordinator (:meth:`BatchCoordinator.cleaner_checkpoint`),
  so whichever broker is the controller resumes where the last one stopped;
- a pass maps the dirty batches' keys, then reads every batch below the map's end in groups of
  at most ``segment.bytes`` (as Kafka groups segments), rewrites each group (each batch keeps its
  base offset and lastOffsetDelta; a batch left empty disappears, leaving a gap) into one new WAL
  object — upload intent first, as every upload — and swaps it in with
  :meth:`BatchCoordinator.replace_batches`: one coordinator transaction that refuses if
  retention or DeleteRecords changed the range meanwhile (the pass stops; the next one retries).
  Memory holds the key map and one group. Batches committed after the pass read
  the log are not touched. Old objects left without live batches are marked for deletion and go
  by the file cleaner's rules (grace period: fetches that found the old coordinates just before
  the swap still read them); a rewrite that was uploaded but never committed is an orphan.

In a cluster only the controller compacts (as it applies diskless retention); each partition is
one step of a :class:`TaskGuard` (task ``diskless-log-cleaner``), so one failing partition is
logged once and backed off while the others are cleaned. Crash windows are fault points
``diskless.log.cleaner.uploaded`` (the rewrite is uploaded, not committed) and
``diskless.log.cleaner.committed`` (committed, old objects not yet deleted).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kcli import faults
from kcli.broker.background import TaskGuard
from kcli.diskless.chunkstream import ChunkStream
from kcli.diskless.wal import WalBuilder, new_object_key
from kcli.records.batch import read_header
from kcli.storage.cleaner import (
    MAP_ENTRY_OVERHEAD,
    CleanableRange,
    CleanedTransactions,
    CleanResult,
    PartitionCleanerState,
    decode_records,
    encode_batch,
    filter_batch,
)

if TYPE_CHECKING:
    from kcli.metadata.metadata_log import TopicState
    from kcli.storage.log_config import LogConfig
    from plugins.coordinator.base import AbortedTransaction, BatchInfo, TopicIdPartition

log = logging.getLogger("kcli.diskless.compaction")

NO_MAX_LAG = 2**63 - 1
_ALL = 1 << 62  # find_batches budget that returns a whole log


@dataclass(frozen=True)
class LogSnapshot:
    """A diskless log as one find_batches call saw it, with its cleaner checkpoint: the batches
    below its last stable offset (an open transaction's records may still be aborted, so nothing
    at or above it is cleaned, as in Kafka) and the aborted transactions among them."""

    batches: list["BatchInfo"]
    log_start_offset: int
    high_watermark: int
    checkpoint: int | None
    last_stable_offset: int = -1  # -1: the high watermark
    aborted: tuple["AbortedTransaction", ...] = ()

    @property
    def stable_end(self) -> int:
        return self.high_watermark if self.last_stable_offset < 0 else min(self.last_stable_offset, self.high_watermark)


def cleanable_range(snap: LogSnapshot, min_lag_ms: int, max_lag_ms: int, now_ms: int) -> CleanableRange:
    """The classic cleanable range (storage.cleaner.cleanable_range) over batches, not segments."""
    first_dirty = snap.checkpoint if snap.checkpoint is not None else snap.log_start_offset
    if not snap.log_start_offset <= first_dirty <= snap.high_watermark:
        first_dirty = snap.log_start_offset  # the log start moved past the checkpoint
    uncleanable = snap.stable_end
    dirty = [b.metadata for b in snap.batches if b.metadata.last_offset >= first_dirty]
    if min_lag_ms > 0:
        for md in dirty:
            if md.timestamp > now_ms - min_lag_ms:
                uncleanable = max(md.base_offset, first_dirty)
                break
    clean_bytes = sum(b.metadata.byte_size for b in snap.batches if b.metadata.last_offset < first_dirty)
    dirty = [md for md in dirty if md.last_offset < uncleanable]
    dirty_bytes = sum(md.byte_size for md in dirty)
    must = False
    if max_lag_ms < NO_MAX_LAG and dirty:
        stamps = [md.timestamp for md in dirty if md.timestamp >= 0]
        must = bool(stamps) and now_ms - min(stamps) > max_lag_ms
    return CleanableRange(first_dirty, uncleanable, clean_bytes, dirty_bytes, must)


def batch_groups(batches: list["BatchInfo"], max_bytes: int) -> list[list["BatchInfo"]]:
    """Consecutive batches whose sizes sum to at most ``max_bytes`` (``segment.bytes``, as Kafka
    groups segments to clean), at least one batch each: what one pass reads and writes at once."""
    groups: list[list["BatchInfo"]] = []
    size = 0
    for b in batches:
        if groups and size + b.metadata.byte_size <= max_bytes:
            groups[-1].append(b)
            size += b.metadata.byte_size
        else:
            groups.append([b])
            size = b.metadata.byte_size
    return groups


class CompactionHost(Protocol):
    """What the cleaner uses of the diskless engine (kcli/diskless/engine.py, which imports this
    module): a Protocol, so imports flow one way."""

    broker: Any
    metrics: Any
    coordinator: Any
    storage: Any
    reader: Any
    io_pool: Any

    def tip(self, t: Any, partition: int) -> Any: ...

    def _live_partitions(self, t: Any) -> set[int]: ...

    async def _coord(self, fn: Any, *args: Any) -> Any: ...


def read_log(engine: "CompactionHost", tip: "TopicIdPartition") -> LogSnapshot:
    """Every live batch of one log (blocking: call on the coordinator pool)."""
    from plugins.coordinator.base import FindBatchRequest

    coordinator = engine.coordinator
    assert coordinator is not None
    checkpoint = coordinator.cleaner_checkpoint(tip)
    resp = coordinator.find_batches([FindBatchRequest(tip, 0, _ALL, read_committed=True)], _ALL)[0]
    if resp.errors == 1:  # OFFSET_OUT_OF_RANGE: offset 0 is below the log start
        resp = coordinator.find_batches([FindBatchRequest(tip, resp.log_start_offset, _ALL, read_committed=True)],
                                        _ALL)[0]
    if resp.errors != 0:
        from kcli.protocol.errors import error_name

        raise RuntimeError(f"the coordinator answered {error_name(resp.errors)} for {tip}")
    return LogSnapshot(resp.batches, resp.log_start_offset, resp.high_watermark, checkpoint,
                       resp.last_stable_offset, tuple(resp.aborted_transactions))


class DisklessLogCleaner:
    """The diskless twin of :class:`kcli.storage.cleaner.LogCleaner` (see the module docstring)."""

    def __init__(self, engine: "CompactionHost") -> None:
        self.engine = engine
        cfg = engine.broker.config
        self.enabled = cfg.get_bool("log.cleaner.enable")
        self.backoff_s = cfg.get_int("log.cleaner.backoff.ms") / 1000
        self.max_map_bytes = cfg.get_int("log.cleaner.dedupe.buffer.size")
        self.guard = TaskGuard("diskless-log-cleaner", engine.metrics, log)
        self.states: dict[tuple[Any, int], PartitionCleanerState] = {}
        self.in_flight_keys: set[str] = set()  # a rewrite uploading or committing: no orphan yet

    # ---- what is compacted -----------------------------------------------------------------
    def compacted_partitions(self) -> list[tuple["TopicState", int]]:
        b = self.engine.broker
        out = []
        for t in list(b.state.topics.values()):
            if b.is_diskless(t) and b.log_config(t).compact:
                out.extend((t, p) for p in sorted(self.engine._live_partitions(t)))
        return out

    def dirty_ratios(self, t: "TopicState") -> dict[int, float]:
        """Partition → dirty ratio now (``kcli topics describe``); blocking coordinator reads."""
        config = self.engine.broker.log_config(t)
        now = _now_ms()
        out = {}
        for p in sorted(self.engine._live_partitions(t)):
            snap = read_log(self.engine, self.engine.tip(t, p))
            out[p] = cleanable_range(snap, config.min_compaction_lag_ms, config.max_compaction_lag_ms, now).ratio
        return out

    # ---- the task --------------------------------------------------------------------------
    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.backoff_s)
            if not self.engine.broker.metadata.is_controller():  # one broker of a cluster cleans
                continue
            await self.guard.round(self.run_round, "diskless cleaner round")

    async def run_round(self) -> int:
        """Offer every compacted diskless partition to the cleaner once; returns the passes made."""
        parts = self.compacted_partitions()
        live = {(t.topic_id, p) for t, p in parts}
        for key in [k for k in self.states if k not in live]:
            del self.states[key]
        passes = 0
        for t, p in parts:
            if self.engine.broker.stopping:
                break
            result = await self.guard.step((t.topic_id, p), f"{t.name}-{p}",
                                           functools.partial(self.clean, t, p, _now_ms()))
            if result is not None:
                passes += 1
                result.count(self.engine.metrics, "diskless.log.cleaner")
        return passes

    async def clean(self, t: "TopicState", partition: int, now_ms: int) -> CleanResult | None:
        """One pass over one partition if it is due; None when it was not."""
        engine = self.engine
        tip = engine.tip(t, partition)
        config = engine.broker.log_config(t)
        state = self.states.setdefault((t.topic_id, partition), PartitionCleanerState())
        force = state.delete_horizon is not None and now_ms >= state.delete_horizon
        snap: LogSnapshot = await engine._coord(read_log, engine, tip)
        rng = cleanable_range(snap, config.min_compaction_lag_ms, config.max_compaction_lag_ms, now_ms)
        due = rng.dirty_bytes > 0 and (rng.ratio >= config.min_cleanable_dirty_ratio or rng.must_clean)
        in_range = [b for b in snap.batches if b.metadata.last_offset < rng.first_uncleanable]
        if not (due or force) or not in_range:
            return None
        result = CleanResult(rng.first_dirty, rng.first_dirty, rng.ratio)
        offsets, result.end_offset = await self._offset_map(in_range, rng, config.segment_bytes, result, snap.aborted)
        todo = [b for b in in_range if b.metadata.last_offset < result.end_offset]
        loop = asyncio.get_running_loop()
        txns = CleanedTransactions(snap.aborted)  # one per pass, from the log start, as the classic cleaner's
        for group in batch_groups(todo, config.segment_bytes):  # one rewritten object per group
            pieces = await self._read(group, result)
            await loop.run_in_executor(engine.io_pool, self._rewrite, tip, config, group, pieces, offsets, snap,
                                       now_ms, result, txns)
            if result.aborted:
                break
        if not result.aborted:
            state.delete_horizon = result.delete_horizon
            await engine._coord(engine.coordinator.set_cleaner_checkpoint, tip,  # type: ignore[union-attr]
                                result.end_offset)
        return result

    async def _read(self, batches: list["BatchInfo"], result: CleanResult) -> list[bytes]:
        """The batches' bytes as a fetch gets them (offsets written in), one piece per batch."""
        assert self.engine.reader is not None
        data = await self.engine.reader.assemble(batches, 0)
        result.bytes_read += len(data)
        pieces, pos = [], 0
        for b in batches:
            pieces.append(bytes(data[pos:pos + b.metadata.byte_size]))
            pos += b.metadata.byte_size
        return pieces

    async def _offset_map(self, batches: list["BatchInfo"], rng: CleanableRange, group_bytes: int,
                          result: CleanResult,
                          aborted: tuple["AbortedTransaction", ...] = ()) -> tuple[dict[bytes, int], int]:
        """Kafka's buildOffsetMap over the dirty batches, read a group at a time, until the keys
        cost ``max_map_bytes`` (at least one batch is mapped): (key → latest offset, the pass's end)."""
        offsets: dict[bytes, int] = {}
        cost, end, full = 0, rng.first_dirty, False
        txns = CleanedTransactions(aborted)  # aborted records never count as the latest of their key
        loop = asyncio.get_running_loop()
        for group in batch_groups([b for b in batches if b.metadata.last_offset >= rng.first_dirty], group_bytes):
            pieces = await self._read(group, result)
            cost, end, full = await loop.run_in_executor(self.engine.io_pool, self._map_group, offsets, group,
                                                         pieces, rng.first_dirty, cost, end, txns)
            if full:
                break
        return offsets, end

    def _map_group(self, offsets: dict[bytes, int], group: list["BatchInfo"], pieces: list[bytes],
                   first_dirty: int, cost: int, end: int, txns: CleanedTransactions) -> tuple[int, int, bool]:
        """Add one group's keys to the map (worker thread: decoding is CPU); returns (cost, end,
        whether the map is full)."""
        for b, piece in zip(group, pieces):
            if offsets and cost >= self.max_map_bytes:
                return cost, end, True
            h = read_header(piece)
            if not h.is_control and not txns.is_aborted(h):
                for rec in decode_records(piece):
                    if rec.key is not None and rec.offset >= first_dirty:
                        if rec.key not in offsets:
                            cost += len(rec.key) + MAP_ENTRY_OVERHEAD
                        offsets[rec.key] = rec.offset
            end = b.metadata.last_offset + 1
        return cost, end, False

    def _rewrite(self, tip: "TopicIdPartition", config: "LogConfig", batches: list["BatchInfo"],
                 pieces: list[bytes], offsets: dict[bytes, int], snap: LogSnapshot, now_ms: int,
                 result: CleanResult, txns: CleanedTransactions | None = None) -> None:
        """Filter one group of batches, upload the survivors as one WAL object and swap it in
        (worker thread: the fault points sleep). Sets ``result.aborted`` when the swap was refused."""
        from plugins.coordinator.base import BatchMetadata

        engine = self.engine
        coordinator, storage = engine.coordinator, engine.storage
        assert coordinator is not None and storage is not None
        producer_last: dict[int, int] = {}
        for b in snap.batches:
            if b.metadata.producer_id >= 0:
                producer_last[b.metadata.producer_id] = b.metadata.last_offset
        horizon_new = now_ms + config.delete_retention_ms
        builder = WalBuilder()
        kept_from: list["BatchInfo"] = []
        changed = False
        tail = snap.high_watermark - 1
        for b, piece in zip(batches, pieces):
            h = read_header(piece)
            kept, verbatim = filter_batch(h, piece, offsets, producer_last, now_ms, horizon_new, result, txns)
            if kept is None and b.metadata.last_offset == tail:
                # The log's last batch stays, empty: a consumer at an offset past every surviving
                # record then still finds a batch that moves it to the high watermark (a classic
                # log never cleans its active segment, so there it cannot happen).
                kept = encode_batch(h, [], None)
            changed = changed or not verbatim
            if kept is not None:
                builder.add(tip, kept)
                kept_from.append(b)
        if not changed:
            return  # nothing to remove and no horizon to stamp: the checkpoint moves on
        chunks, refs = builder.build_chunks()
        size = sum(len(c) for c in chunks)
        rewrites = [
            BatchMetadata(tip, ref.byte_offset, ref.size, ref.header.base_offset, ref.header.last_offset,
                          b.metadata.log_append_timestamp, ref.header.max_timestamp, b.metadata.timestamp_type,
                          b.metadata.producer_id, b.metadata.producer_epoch, b.metadata.base_sequence,
                          b.metadata.last_sequence)
            for ref, b in zip(refs, kept_from)
        ]
        key = new_object_key()
        self.in_flight_keys.add(key)
        try:
            coordinator.register_upload_intent(key, engine.broker.node_id, _now_ms())
            storage.upload(key, ChunkStream(chunks), size)
            faults.pause("diskless.log.cleaner.uploaded")  # crash tests: uploaded, not committed (an orphan)
            swapped = coordinator.replace_batches(tip, batches, key, engine.broker.node_id, size, rewrites, _now_ms())
        finally:  # a failed upload or commit leaves an orphan (intent, no commit) for the file cleaner
            self.in_flight_keys.discard(key)
        faults.pause("diskless.log.cleaner.committed")  # crash tests: committed, old objects not deleted
        if not swapped:
            result.aborted = True  # retention or DeleteRecords moved meanwhile: the next round retries
            log.info("%s: compaction swap refused (the log changed meanwhile); retrying next round", tip)
            return
        result.bytes_written += size
        result.segments_swapped += 1
        log.info("%s: compacted offsets %d..%d into WAL object %s (%d bytes from %d)", tip,
                 batches[0].metadata.base_offset, batches[-1].metadata.last_offset, key, size,
                 sum(b.metadata.byte_size for b in batches))


def _now_ms() -> int:
    return int(time.time() * 1000)
