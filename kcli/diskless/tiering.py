"""Moving diskless data to tiered storage (seed 004 "Moving to Tiered Storage", issue #27 item 4).

A diskless topic with ``remote.storage.enable=true`` keeps its newest data in WAL objects (the
batch coordinator) and its older data in the remote tier, through the broker's existing
RemoteLogManager (:mod:`kcli.tiered.manager`): its RemoteStorageManager plugin and its remote
log metadata (RLMM). The RSM and RLMM do not know the data came from WAL objects.

Per partition, on the partition's leader only (``broker.leads``, as the RLM picks the partitions
it copies), every ``remote.log.manager.task.interval.ms``:

* **Build.** A *staging log* under ``<data_dir>/diskless-tiering/<topic>-<partition>/`` (an
  ordinary classic log: segments, offset/time/transaction indexes, rolled by the topic's
  ``segment.bytes``/``segment.ms``) is filled from the coordinator's batches, CRC-checked by the
  fetch path's reader, starting at the tiered boundary: the RLMM's highest copied offset + 1, or
  the coordinator's log start when nothing is copied. It is built from the coordinator, not from
  the replica cache, because the cache starts near the log end and expires by local retention,
  while the remote tier must hold everything from the log start (docs/diskless-tiering.md).
  It is rebuilt from the boundary at every start (it is never trusted across restarts).
* **Copy.** Each rolled staging segment goes through :meth:`RemoteLogManager._copy_segment`
  (COPY_SEGMENT_STARTED → upload → COPY_SEGMENT_FINISHED, each fsynced), then is deleted
  locally. A crash mid-copy leaves COPY_SEGMENT_STARTED, which the RLM's recovery marks for
  deletion; the next round starts again at the highest *finished* offset, so remote segments stay
  disjoint and contiguous and nothing is copied twice.
* **Trim the WAL.** Coordinator batches below the highest COPY_SEGMENT_FINISHED offset that are
  past ``local.retention.ms``/``local.retention.bytes`` (``-2``: ``retention.*``) are deleted with
  the coordinator's DeleteRecords (its log start moves, the WAL objects' used size falls and the
  FileCleaner deletes emptied objects after its grace period). Nothing not yet finished in the
  remote tier is ever deleted.
* **Total retention.** ``retention.ms``/``retention.bytes`` apply to remote + WAL: remote
  segments expire as a classic tiered topic's do, and the coordinator's log start follows. The
  engine's own coordinator retention skips topics that copy (their WAL goes only once tiered).

Reads below the coordinator's log start are served from the remote tier (:meth:`read`, CRC-checked
by the RLM's segment reader). The partition's log start is the first remote segment's start when
it lies below the coordinator's. KIP-950 disablement runs through the RLM unchanged (copying stops;
``delete`` removes the remote segments, ``retain`` keeps them readable while they expire by
retention and the coordinator gets classic retention back); KIP-694 partition reduction deletes
the removed partitions' remote segments.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from kio.schema.errors import ErrorCode

from kcli import faults
from kcli.broker.background import TaskGuard
from kcli.diskless.reader import CorruptBatch, DisklessReadResult
from kcli.storage.errors import LogError, OffsetOutOfRange

if TYPE_CHECKING:
    from kcli.metadata.metadata_log import TopicState
    from kcli.storage.log import PartitionLog
    from kcli.tiered.manager import RemoteLogManager

log = logging.getLogger("kcli.diskless.tiering")

STAGING_DIR = "diskless-tiering"
FILL_FETCH_BYTES = 4 * 1024 * 1024  # bytes asked of the coordinator per find
STEP_MAX_BYTES = 32 * 1024 * 1024  # bytes one partition stages per round before the others get a turn
MAX_STAGED_SEGMENTS = 8  # rolled segments waiting for their copy: staging stops (a failing RSM fills no disk)
TASK = "diskless-tiering"


@dataclasses.dataclass
class Staging:
    """The staging log of one partition, filled from ``start`` (the tiered boundary it was made at)."""

    topic: str
    partition: int
    log: "PartitionLog"


class DisklessTiering:
    """See the module docstring. Owned by the diskless engine (``engine.tiering``)."""

    def __init__(self, engine: Any) -> None:
        """``engine``: the DisklessEngine (kcli/diskless/engine.py imports this module: handed
        in, never imported back)."""
        self.engine = engine
        self.broker = engine.broker
        self.root: Path = self.broker.data_dir / STAGING_DIR
        self.guard = TaskGuard(TASK, engine.metrics, log)
        self.staging: dict[tuple[uuid.UUID, int], Staging] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._cleared = False

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._task = loop.create_task(self._run_forever(), name=TASK)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for key in list(self.staging):
            await self._drop(key)

    def wake(self) -> None:
        self._wake.set()

    @property
    def rlm(self) -> "RemoteLogManager | None":
        """The broker's RemoteLogManager once its plugin is open (None without the tiered system)."""
        rlm = self.broker.tiered
        return rlm if rlm is not None and getattr(rlm, "rsm", None) is not None else None

    # ---- what the engine asks ------------------------------------------------------------------
    def copies(self, t: "TopicState") -> bool:
        """The topic's WAL data moves to the remote tier (remote.storage.enable, not disabled)."""
        rlm = self.broker.tiered
        return rlm is not None and self.broker.is_diskless(t) and rlm.copy_enabled(t)

    def remote_segments(self, t: "TopicState", partition: int) -> list[Any]:
        rlm = self.broker.tiered
        return rlm.metadata.segments(t.topic_id, partition) if rlm is not None else []

    def log_start_offset(self, t: "TopicState", partition: int, coordinator_start: int) -> int:
        """The partition's log start: the first finished remote segment's start when it lies
        below the coordinator's log start, else the coordinator's."""
        segs = self.remote_segments(t, partition)
        if segs and segs[0].start_offset < coordinator_start:
            return segs[0].start_offset
        return coordinator_start

    def latest_tiered_offset(self, t: "TopicState", partition: int) -> int:
        rlm = self.broker.tiered
        return rlm.metadata.highest_offset(t.topic_id, partition) if rlm is not None else -1

    async def read(self, t: "TopicState", partition: int, offset: int, max_bytes: int, *, min_one: bool,
                   read_committed: bool) -> DisklessReadResult:
        """Whole batches from the remote segment holding ``offset`` (below the coordinator's log
        start), each CRC-checked by the RLM's segment reader before it is served."""
        from kcli.tiered.manager import _RemoteDamage
        from plugins.rsm.base import RemoteStorageException

        hwm, coord_start = self.engine.offsets(t, partition)
        start = self.log_start_offset(t, partition, coord_start)
        rlm = self.rlm
        md = rlm.metadata.segment_for_offset(t.topic_id, partition, offset) if rlm is not None else None
        if rlm is None or offset < start:
            raise OffsetOutOfRange(offset, log_start_offset=start, local_log_start_offset=coord_start,
                                   log_end_offset=hwm)
        if md is None or md.start_offset >= coord_start:
            # a gap between the remote tier and the WAL (tiering re-enabled after the WAL moved on):
            # fall forward to the coordinator's log start, as a remote read falls forward over a gap
            return await self.engine.read(t, partition, coord_start, max_bytes, min_one=min_one,
                                          read_committed=read_committed)
        try:
            records, next_offset, damage = await rlm._rsm_call(rlm._read_segment, md, max(offset, md.start_offset),
                                                               max_bytes, min_one)
        except _RemoteDamage as err:  # the read starts at a damaged batch: never served
            raise rlm._remote_corrupt(t, partition, md, err) from None
        except RemoteStorageException as err:
            if rlm.metadata.segment_for_offset(t.topic_id, partition, offset) is not md:  # expired while we read
                raise OffsetOutOfRange(offset, log_start_offset=self.log_start_offset(t, partition, coord_start),
                                       local_log_start_offset=coord_start, log_end_offset=hwm) from None
            raise LogError(ErrorCode.kafka_storage_error, f"reading remote segment {md.start_offset} of "
                                                          f"{t.name}-{partition}: {err}") from None
        if damage is not None:  # the intact batches before it are served; a fetch from it fails
            rlm._remote_corrupt(t, partition, md, damage)
        self.broker.metrics.inc("tiered.remote.fetch.bytes", len(records))
        self.broker.metrics.inc("diskless.tiered.remote.reads")
        lso, aborted = -1, []
        if read_committed:
            lso = await self.engine.last_stable_offset(t, partition)
            if records:
                try:
                    found = await rlm._rsm_call(rlm._remote_aborted, t, partition, md, offset, next_offset, coord_start)
                except RemoteStorageException as err:  # a read_committed client must not get aborted records
                    raise LogError(ErrorCode.kafka_storage_error, f"reading the transaction index of remote segment "
                                                                  f"{md.start_offset} of {t.name}-{partition}: {err}") from None
                aborted = list(found)
        return DisklessReadResult(records, hwm, start, next_offset, lso, aborted)  # type: ignore[arg-type]

    async def offset_for_timestamp(self, t: "TopicState", partition: int, timestamp: int) -> tuple[int, int] | None:
        """ListOffsets by time below the coordinator's log start: the first remote record with a
        timestamp at least ``timestamp`` (None: the coordinator answers)."""
        rlm = self.rlm
        if rlm is None:
            return None
        _hwm, coord_start = self.engine.offsets(t, partition)
        start = self.log_start_offset(t, partition, coord_start)
        for md in rlm.metadata.segments(t.topic_id, partition):
            if md.start_offset >= coord_start:
                return None
            if md.end_offset < start or md.max_timestamp_ms < timestamp:
                continue
            found = await rlm._rsm_call(rlm._find_timestamp, md, timestamp, start)
            if found is not None and found[0] < coord_start:
                return found
        return None

    async def delete_records(self, t: "TopicState", partition: int, offset: int) -> int:
        """DeleteRecords on a partition with remote segments. At or above the coordinator's log
        start: the coordinator's start moves there and every remote segment starting below it
        goes (the WAL holds the rest of a segment it cuts). Below it: the remote segments wholly
        below ``offset`` go, and the log start becomes the first one left; records of a remote
        segment that ``offset`` cuts stay readable (no persisted log start inside the remote
        tier: docs/diskless-tiering.md), as the returned low watermark says."""
        rlm = self.broker.tiered
        assert rlm is not None
        async with rlm._lock(t.topic_id, partition):
            hwm, coord_start = self.engine.offsets(t, partition)
            target = hwm if offset == -1 else offset
            if target >= coord_start or target < 0:
                low = await self.engine.coordinator_delete_records(t, partition, offset)  # out of range: its error
                doomed = [s for s in rlm.metadata.segments(t.topic_id, partition) if s.start_offset < low]
            else:
                doomed = [s for s in rlm.metadata.segments(t.topic_id, partition) if s.end_offset < target]
            if doomed:
                await rlm._delete_remote(doomed)
            return self.log_start_offset(t, partition, self.engine.offsets(t, partition)[1])

    def partitions_deleted(self, t: "TopicState", partitions: Iterable[int]) -> None:
        """KIP-694: the removed partitions' remote segments go too (their staging logs at the next round)."""
        rlm = self.broker.tiered
        if rlm is None:
            return
        parts = sorted(partitions)
        if any(rlm.metadata.segments(t.topic_id, p, _live_states()) for p in parts):
            rlm._spawn(rlm.partitions_deleted(t, parts), f"diskless-tiered-delete-{t.name}")

    def describe(self, t: "TopicState", partition: int) -> dict[str, Any]:
        """The tiered boundary for `kcli diskless describe`."""
        segs = self.remote_segments(t, partition)
        return {"remote_segments": len(segs), "remote_bytes": sum(s.segment_size_in_bytes for s in segs),
                "remote_log_start_offset": segs[0].start_offset if segs else None,
                "highest_tiered_offset": segs[-1].end_offset if segs else -1}

    # ---- the task ------------------------------------------------------------------------------
    async def _run_forever(self) -> None:
        interval = self.broker.config.get_int("remote.log.manager.task.interval.ms") / 1000
        while not self.broker.stopping:
            try:
                await asyncio.wait_for(self._wake.wait(), interval)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            await self.guard.round(self.run_once, "diskless tiering round")

    async def run_once(self, now_ms: int | None = None) -> int:
        """One round over every diskless partition this broker leads: stage, copy, trim the WAL,
        expire remote segments. Returns segments copied."""
        rlm = self.rlm
        if rlm is None or self.engine.coordinator is None:
            return 0
        if not self._cleared:  # the staging logs are rebuilt from the tiered boundary at every start
            await asyncio.to_thread(shutil.rmtree, self.root, True)
            self._cleared = True
        rlm.metadata.refresh()
        wanted = self._wanted(rlm)
        for key in [k for k in self.staging if k not in wanted or not self.copies(wanted[k][0])]:
            await self._drop(key)
        copied = 0
        now = int(time.time() * 1000) if now_ms is None else now_ms
        for key, (t, p) in wanted.items():
            copied += await self.guard.step(key, f"{t.name}-{p}", lambda t=t, p=p: self._partition_step(rlm, t, p, now)) or 0
        return copied

    def _wanted(self, rlm: "RemoteLogManager") -> dict[tuple[uuid.UUID, int], tuple["TopicState", int]]:
        """Diskless partitions this broker leads that copy, or still have remote segments."""
        from kcli.metadata.metadata_log import MODE_NONE

        out: dict[tuple[uuid.UUID, int], tuple["TopicState", int]] = {}
        for t in list(self.broker.state.topics.values()):
            if not self.broker.is_diskless(t):
                continue
            copying = rlm.copy_enabled(t)
            for p in t.partitions.values():
                if p.mode == MODE_NONE or not self.broker.leads(p) or self.engine.offsets(t, p.partition)[0] < 0:
                    continue
                if copying or rlm.metadata.segments(t.topic_id, p.partition):
                    out[(t.topic_id, p.partition)] = (t, p.partition)
        return out

    async def _partition_step(self, rlm: "RemoteLogManager", t: "TopicState", partition: int, now: int) -> int:
        async with rlm._lock(t.topic_id, partition):  # the RLM's per-partition lock: its deletes wait
            copied = 0
            current = self.broker.topic_by_id(t.topic_id)
            if current is None:
                return 0
            if rlm.copy_enabled(current):
                copied = await self._stage_and_copy(rlm, current, partition)
                await self._trim_wal(rlm, current, partition, now)
            await self._expire_remote(rlm, current, partition, now)
            return copied

    # ---- build and copy ------------------------------------------------------------------------
    async def _stage_and_copy(self, rlm: "RemoteLogManager", t: "TopicState", partition: int) -> int:
        key = (t.topic_id, partition)
        hwm, coord_start = self.engine.offsets(t, partition)
        tiered_upto = rlm.metadata.highest_offset(t.topic_id, partition)
        boundary = max(tiered_upto + 1, coord_start)
        st = self.staging.get(key)
        if st is None:
            lg = await asyncio.to_thread(self._create, t, partition, boundary)
            st = self.staging[key] = Staging(t.name, partition, lg)
        elif not (st.log.local_log_start_offset <= boundary <= st.log.log_end_offset) or any(
                s.base_offset < boundary < s.next_offset for s in st.log.segments()):
            # another leader copied past us, or the coordinator's start moved (DeleteRecords):
            # start again at the boundary, so no offset is copied twice
            await asyncio.to_thread(st.log.truncate_fully_and_start_at, boundary)
        await self._fill(t, partition, st, hwm)
        copied = 0
        for seg in st.log.segments():
            if seg.is_active:
                break
            if seg.next_offset - 1 <= tiered_upto or seg.size == 0:
                continue
            current = self.broker.topic_by_id(t.topic_id)
            p = current.partitions.get(partition) if current is not None else None
            if current is None or p is None or not rlm.copy_enabled(current) or not self.broker.leads(p):
                break  # disabled, deleted or no longer the leader meanwhile
            if not await rlm._copy_segment(current, partition, seg):
                break  # keep segments in order: retry this one next round
            copied += 1
            tiered_upto = seg.next_offset - 1
            await asyncio.to_thread(st.log.delete_local_segments_below, seg.next_offset)
        if copied:
            self.broker.metrics.inc("diskless.tiered.segments.copied", copied)
        return copied

    async def _fill(self, t: "TopicState", partition: int, st: Staging, hwm: int) -> None:
        """Stage the coordinator's batches from the staging log's end towards the high watermark."""
        from plugins.coordinator.base import FindBatchRequest

        from kcli.diskless.replica_cache import _append_grouped

        engine = self.engine
        assert engine.coordinator is not None and engine.reader is not None
        tip = engine.tip(t, partition)
        segment_bytes = st.log.config.segment_bytes
        filled = 0
        while filled < STEP_MAX_BYTES and st.log.log_end_offset < hwm and len(st.log.segments()) <= MAX_STAGED_SEGMENTS:
            offset = st.log.log_end_offset
            resp = (await engine._coord(engine.coordinator.find_batches,
                                        [FindBatchRequest(tip, offset, FILL_FETCH_BYTES)], FILL_FETCH_BYTES))[0]
            if resp.errors == ErrorCode.offset_out_of_range and offset < resp.log_start_offset:
                # the coordinator dropped batches we never staged (DeleteRecords): they are gone
                await asyncio.to_thread(st.log.truncate_fully_and_start_at, resp.log_start_offset)
                continue
            if resp.errors != 0:
                raise LogError(resp.errors, f"find_batches for tiering {tip}")
            if not resp.batches:
                break
            p = t.partitions.get(partition)
            try:
                data = await engine.reader.assemble(resp.batches, p.leader_epoch if p is not None else 0)
            except CorruptBatch as err:  # stage the intact batches; the damaged one stops this partition
                if err.served:
                    await asyncio.to_thread(_append_grouped, st.log, err.intact, resp.batches[: err.served],
                                            segment_bytes)
                raise
            await asyncio.to_thread(_append_grouped, st.log, data, resp.batches, segment_bytes)
            filled += len(data)

    def _create(self, t: "TopicState", partition: int, start: int) -> "PartitionLog":
        from kcli.storage.log import PartitionLog, write_partition_metadata

        d = self.root / f"{t.name}-{partition}"
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        write_partition_metadata(d, t.topic_id)
        lg = PartitionLog.open(d, self.broker.log_config(t))
        if start != lg.log_end_offset:
            lg.truncate_fully_and_start_at(start)
        return lg

    async def _drop(self, key: tuple[uuid.UUID, int]) -> None:
        st = self.staging.pop(key, None)
        if st is None:
            return
        await asyncio.to_thread(_delete_log, st.log)

    # ---- the WAL and retention -----------------------------------------------------------------
    async def _wal_bytes(self, t: "TopicState", partition: int) -> int:
        assert self.engine.coordinator is not None
        for info in await self.engine._coord(self.engine.coordinator.describe_logs, [t.topic_id]):
            if info.topic_id_partition.partition == partition:
                return int(info.byte_size)
        return 0

    async def _trim_wal(self, rlm: "RemoteLogManager", t: "TopicState", partition: int, now: int) -> None:
        """Delete coordinator batches that are COPY_SEGMENT_FINISHED in the remote tier and past
        local retention (local.retention.ms/bytes; -2: retention.*)."""
        ms, limit = rlm._retention_limits(t, local=True)
        if ms < 0 and limit < 0:
            return
        _hwm, coord_start = self.engine.offsets(t, partition)
        segs = [s for s in rlm.metadata.segments(t.topic_id, partition) if s.end_offset >= coord_start]
        if not segs:
            return
        size = await self._wal_bytes(t, partition)
        below = coord_start
        for s in segs:
            if s.start_offset > below:
                break  # a gap in the remote tier: nothing above it is provably copied
            share = _share_above(s, below)
            by_size = limit >= 0 and size - share >= limit
            by_time = ms >= 0 and s.max_timestamp_ms >= 0 and now - s.max_timestamp_ms > ms
            if not (by_size or by_time):
                break
            size -= share
            below = s.end_offset + 1
        if below <= coord_start:
            return
        # the copies' metadata, read again now: every offset below ``below`` is COPY_SEGMENT_FINISHED
        finished = [s for s in rlm.metadata.segments(t.topic_id, partition) if s.start_offset < below]
        if not finished or not _covers(finished, coord_start, below):
            return
        faults.pause("diskless.tiering.trim")  # crash tests only: copies FINISHED, WAL not yet trimmed
        low = await self.engine.coordinator_delete_records(t, partition, below)
        self.broker.metrics.inc("diskless.tiered.wal.trimmed.offsets", max(0, low - coord_start))
        log.info("diskless WAL of %s-%d trimmed below offset %d (in the remote tier, past local retention)",
                 t.name, partition, low)

    async def _expire_remote(self, rlm: "RemoteLogManager", t: "TopicState", partition: int, now: int) -> None:
        """Total retention (retention.ms/bytes over remote + WAL): the oldest remote segments
        expire, and the coordinator's log start follows when they reached into the WAL."""
        from kcli.tiered.manager import expired_remote_segments

        segs = rlm.metadata.segments(t.topic_id, partition)
        if not segs:
            return
        ms, limit = rlm._retention_limits(t, local=False)
        hwm, coord_start = self.engine.offsets(t, partition)
        excess = 0
        if limit >= 0:
            wal = await self._wal_bytes(t, partition)
            overlap = sum(_share_above(s, coord_start) for s in segs if s.end_offset >= coord_start)
            excess = sum(s.segment_size_in_bytes for s in segs) + max(0, wal - overlap) - limit
        doomed = expired_remote_segments(segs, excess=excess, limit=limit, retention_ms=ms, now=now)
        if not doomed:
            return
        new_start = doomed[-1].end_offset + 1
        await rlm._delete_remote(doomed)  # DELETE_SEGMENT_STARTED first: no read is sent to them
        if new_start > coord_start:
            await self.engine.coordinator_delete_records(t, partition, min(new_start, hwm))
        log.info("expired %d remote segments of diskless %s-%d; log start offset %d", len(doomed), t.name,
                 partition, self.log_start_offset(t, partition, self.engine.offsets(t, partition)[1]))


def _share_above(s: Any, offset: int) -> int:
    """Bytes of remote segment ``s`` at or above ``offset`` (pro rata by offsets: the WAL holds
    the same batches, so this estimates their WAL bytes)."""
    if s.start_offset >= offset:
        return int(s.segment_size_in_bytes)
    span = s.end_offset - s.start_offset + 1
    return int(s.segment_size_in_bytes * max(0, s.end_offset - offset + 1) // max(1, span))


def _covers(segs: list[Any], start: int, end: int) -> bool:
    """Finished segments cover ``start..end-1`` without a gap."""
    at = start
    for s in sorted(segs, key=lambda s: s.start_offset):
        if s.start_offset > at:
            return False
        at = max(at, s.end_offset + 1)
        if at >= end:
            return True
    return at >= end


def _live_states() -> tuple[Any, ...]:
    from plugins.rsm.base import RemoteLogSegmentState as S

    return (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED)


def _delete_log(lg: "PartitionLog") -> None:
    try:
        lg.delete()
    except Exception as err:  # noqa: BLE001 - a staging copy: the next start clears the directory
        log.debug("deleting staging log %s: %s", lg.dir, err)
