"""The RemoteLogManager (KIP-405): copy rolled segments to a remote tier, serve old offsets from
it, and apply local and total retention to tiered topics.

Attached as ``broker.tiered`` when the broker config ``remote.log.storage.system.enable=true``.
Two loops run per broker:

* every ``remote.log.manager.task.interval.ms``: for each partition of a topic that copies
  (remote.storage.enable=true, tiered state ENABLED, remote.log.copy.disable=false), each rolled
  segment past the highest tiered offset is copied with its offset and time index. Its
  RemoteLogSegmentMetadata goes COPY_SEGMENT_STARTED → (bytes uploaded) → COPY_SEGMENT_FINISHED,
  each step fsynced in :mod:`kcli.tiered.metadata` before the next.
* every ``log.retention.check.interval.ms``: local retention (local.retention.ms/bytes, -2 =
  retention.*) deletes only segments already copied; total retention (retention.ms/bytes over
  remote + local) expires remote segments (DELETE_SEGMENT_STARTED → delete → FINISHED) and moves
  the log start offset. A topic that no longer copies (disabled with ``retain``, or
  remote.log.copy.disable) keeps classic retention for its local segments while its remote
  segments expire by the same total retention.

Both loops work partition by partition through :class:`kcli.broker.background.TaskGuard` (as
Kafka keeps one RLM task per partition): a partition whose copy or retention fails is logged once,
backed off and counted, and the others proceed. Segments marked DELETE_SEGMENT_STARTED (a crash, a
failed undo, a deleted topic or partition) are deleted by every copy round until they are gone.

Fetches below the local log start offset are answered from remote segments (whole batches, at
most one segment per fetch, via the segment's offset index); ListOffsets EARLIEST_LOCAL (-4) and
LATEST_TIERED (-5) come from the local log start and the highest tiered offset. KIP-950
disablement is in :mod:`kcli.tiered.disable`.

The segment metadata comes from the broker's cluster state store (``remote_log_metadata``): the
data dir's event file on one broker, PostgreSQL in a cluster; this module does not know which.
In a cluster each partition's remote segments are worked on by one broker (:meth:`owns`): the
partition's host; for a deleted topic or partition, the broker that copied the segment while it
is alive, else the controller. The remote storage manager must then write to a store every
broker shares (:func:`kcli.tiered.store.check_shared`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from array import array
from bisect import bisect_right
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from crc32c import crc32c
from kio.schema.errors import ErrorCode

from kcli import faults
from kcli.broker.background import TaskGuard
from kcli.broker.extension import BrokerExtension
from kcli.once import FirstTimes
from kcli.records.batch import HEADER_SIZE, InvalidBatchError, read_header
from kcli.storage.errors import LogError, OffsetOutOfRange
from kcli.storage.index import OffsetIndex, TimeIndex
from kcli.storage.log import ReadResult
from kcli.storage.segment import iter_record_timestamps
from kcli.storage.txn_state import AbortedTxn, parse_txn_index
from kcli.tiered import disable as kip950
from kcli.tiered.metadata import RemoteLogMetadata, SegmentOverlapError
from plugins.rsm.base import (
    IndexType,
    LogSegmentData,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemoteResourceNotFoundException,
    RemoteStorageException,
    RemoteStorageManager,
)

if TYPE_CHECKING:
    from kcli.broker.broker import Broker
    from kcli.metadata.metadata_log import TopicState
    from kcli.storage.log import PartitionLog
    from kcli.storage.segment import SegmentInfo

log = logging.getLogger("kcli.tiered")

S = RemoteLogSegmentState
LIVE = (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED)
RSM_CONFIG_PREFIX = "remote.log.storage.manager.impl."
_READ_CHUNK = 64 * 1024
_INDEX_CACHE_ENTRIES = 1024
_TXN_SCAN_SEGMENTS = 1000  # remote transaction indexes one read looks through at most
CORRUPT_METRIC = "fetch.corrupt.batches{source=tiered}"  # Kafka-style CorruptFetchBatchesPerSec (docs/observability.md)


def _nonempty(path: "os.PathLike[str]") -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False


def _now_ms() -> int:
    return int(time.time() * 1000)


def leader_epoch_checkpoint(epoch: int, start_offset: int) -> bytes:
    """Kafka's leader-epoch-checkpoint file for a segment: version 0, one entry."""
    return f"0\n1\n{epoch} {start_offset}\n".encode()


def leader_epoch_checkpoint_of(epochs: dict[int, int]) -> bytes:
    """Kafka's leader-epoch-checkpoint file (version 0) with every epoch of a segment."""
    lines = "".join(f"{e} {s}\n" for e, s in sorted(epochs.items()))
    return f"0\n{len(epochs)}\n{lines}".encode()


def segment_leader_epochs(entries: list[tuple[int, int]], start: int, end: int) -> dict[int, int]:
    """The leader epochs of offsets ``start..end`` and the first offset of each there, from a
    log's leader-epoch cache entries (epoch, start offset): Kafka's segmentLeaderEpochs, which a
    new leader and a rebuilt follower use to match the remote tier to their own epochs."""
    out: dict[int, int] = {}
    for i, (epoch, first) in enumerate(entries):
        nxt = entries[i + 1][1] if i + 1 < len(entries) else None
        if first <= end and (nxt is None or nxt > start):
            out[epoch] = max(first, start)
    return out


TRIM_SUFFIX = ".tiered-trim"


def trim_segment(seg: "SegmentInfo", start: int) -> "SegmentInfo":
    """A copy of ``seg`` from its first batch holding an offset >= ``start`` (worker thread), in
    ``<segment>.tiered-trim/``, with empty indexes (remote reads then scan from the segment's
    start). Batches are never split: a batch holding ``start`` is kept whole."""
    from dataclasses import replace

    out_dir = seg.log_path.with_name(seg.log_path.name + TRIM_SUFFIX)
    _remove_trimmed_dir(out_dir)
    out_dir.mkdir()
    fd = os.open(seg.log_path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        pos = 0
        while pos + HEADER_SIZE <= size:
            h = read_header(os.pread(fd, HEADER_SIZE, pos), 0)
            if h.last_offset >= start:
                break
            pos += h.size
        log_path = out_dir / seg.log_path.name
        with open(log_path, "wb") as out:
            left = size - pos
            while left > 0:
                chunk = os.pread(fd, min(left, 1 << 20), pos)
                if not chunk:
                    break
                out.write(chunk)
                pos += len(chunk)
                left -= len(chunk)
            out.flush()
            os.fsync(out.fileno())
    finally:
        os.close(fd)
    index_path = out_dir / seg.index_path.name
    timeindex_path = out_dir / seg.timeindex_path.name
    index_path.write_bytes(b"")
    timeindex_path.write_bytes(b"")
    return replace(seg, base_offset=start, size=log_path.stat().st_size, log_path=log_path, index_path=index_path,
                   timeindex_path=timeindex_path)


def _remove_trimmed(seg: "SegmentInfo") -> None:
    _remove_trimmed_dir(seg.log_path.parent)


def _remove_trimmed_dir(path: "os.PathLike[str]") -> None:
    import shutil

    if str(path).endswith(TRIM_SUFFIX):
        shutil.rmtree(path, ignore_errors=True)



def expired_remote_segments(segs: list[RemoteLogSegmentMetadata], *, excess: int, limit: int, retention_ms: int,
                            now: int, log_start: int = -1) -> list[RemoteLogSegmentMetadata]:
    """The oldest remote segments that retention removes: those wholly below ``log_start``, then,
    in order, each while ``excess`` bytes over ``limit`` (retention.bytes) remain or it is older
    than ``retention_ms`` (retention.ms); the first one kept stops the run (segments expire in order)."""
    doomed: list[RemoteLogSegmentMetadata] = []
    for s in segs:
        if s.end_offset < log_start:
            doomed.append(s)
            continue
        by_size = limit >= 0 and excess - s.segment_size_in_bytes >= 0
        by_time = retention_ms >= 0 and s.max_timestamp_ms >= 0 and now - s.max_timestamp_ms > retention_ms
        if not (by_size or by_time):
            break
        excess -= s.segment_size_in_bytes
        doomed.append(s)
    return doomed


class RemoteLogManager(BrokerExtension):
    """Tiered storage for one broker: copy, remote reads, retention, KIP-950 disablement."""

    def __init__(self, broker: "Broker") -> None:
        super().__init__(broker)
        self.metadata: RemoteLogMetadata = broker.metadata.remote_log_metadata(broker.data_dir)
        self.rsm: RemoteStorageManager | None = None
        self.disabler = kip950.Disabler(self)
        self._tasks: list[asyncio.Task[Any]] = []
        self._locks: dict[tuple[uuid.UUID, int], asyncio.Lock] = {}
        self._index_cache: OrderedDict[tuple[uuid.UUID, IndexType], Any] = OrderedDict()  # parsed indexes
        self._index_lock = threading.Lock()  # remote reads run in worker threads
        self._damage_reported = FirstTimes()  # damaged (segment, position)s logged: each once, not per fetch
        self._copy_wakeup = asyncio.Event()
        # one guard per task: a failing partition is backed off and logged once, the rest proceed
        self.copy_guard = TaskGuard("tiered-copy", broker.metrics, log)
        self.delete_guard = TaskGuard("tiered-remote-delete", broker.metrics, log)
        self.retention_guard = TaskGuard("tiered-retention", broker.metrics, log)

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        from kcli.tiered.store import check_shared

        check_shared(self.broker)  # before anything is opened: refused with one line
        self.metadata.open()
        self.rsm = self._build_rsm()
        for t in list(self.broker.state.topics.values()):
            if t.tiered_state == kip950.DISABLING:
                self.disabler.start(t)  # the broker died mid-disablement: finish it
            elif t.tiered_state == kip950.ENABLED and not self.broker.is_tiered(t):
                # turned off by an earlier kcli, which accepted that without the tiered system
                # (now refused: kip950.check_without_tiered_system); nothing is copied, the
                # remote data stays readable until retention: say how to finish it
                log.warning("tiered storage of %s: remote.storage.enable=false but tiered state ENABLED (turned off "
                            "while the broker ran without remote.log.storage.system.enable); to finish turning it "
                            "off run `kcli topics alter --topic %s --enable-tiering`, then --disable-tiering",
                            t.name, t.name, extra={"event": "tiered.state", "topic": t.name, "state": kip950.ENABLED})
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._copy_loop(), name="rlm-copy"))
        self._tasks.append(loop.create_task(self._retention_loop(), name="rlm-retention"))

    def _build_rsm(self) -> RemoteStorageManager:
        from plugins.loader import load_class
        from plugins.rsm.object_store import ObjectStoreRemoteStorageManager

        name = self.broker.config.get_str("remote.log.storage.manager.class.name")
        cls = load_class(name, RemoteStorageManager)
        rsm = cls()
        rsm.configure(self.broker.config.prefixed(RSM_CONFIG_PREFIX))
        if isinstance(rsm, ObjectStoreRemoteStorageManager) and not rsm.configured:
            from kcli.tiered.store import object_store_for

            rsm.use_store(object_store_for(self.broker), owned=True)  # our own client of the shared store
        return rsm

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.disabler.close()
        if self.rsm is not None:
            self.rsm.close()
        self.metadata.close()

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.append(task)
        task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)

    def _lock(self, topic_id: uuid.UUID, partition: int) -> asyncio.Lock:
        return self._locks.setdefault((topic_id, partition), asyncio.Lock())

    def owns_partition(self, topic_id: uuid.UUID, partition: int, copiers: Iterable[int] = ()) -> bool:
        """Whether this broker works on the remote segments of this partition: its host while
        it exists; once it is gone (topic or partition deleted), a broker that copied some of
        them (it may still be mid-copy) while one is alive, else the controller. On one node
        that is always this broker."""
        t = self.broker.topic_by_id(topic_id)
        p = t.partitions.get(partition) if t is not None else None
        if p is not None:
            return bool(self.broker.leads(p))
        copiers = set(copiers)
        if self.broker.node_id in copiers:
            return True
        live = {b.node_id for b in self.broker.live_brokers()}
        return self.broker.metadata.is_controller() and not copiers & live

    def owns(self, seg: RemoteLogSegmentMetadata) -> bool:
        return self.owns_partition(seg.segment_id.topic_id, seg.segment_id.partition, (seg.broker_id,))

    async def _rsm_call(self, fn: Any, *args: Any) -> Any:
        """Run a blocking RSM call in a worker thread (object stores do network or disk I/O)."""
        return await asyncio.to_thread(fn, *args)

    # ---- what the broker asks ----------------------------------------------------------------
    def copy_enabled(self, t: "TopicState") -> bool:
        """KIP-405 copying is on: remote.storage.enable, not disabled (KIP-950 or Kafka 3.9)."""
        return (self.broker.is_tiered(t) and t.tiered_state in (kip950.ENABLED, kip950.NONE)
                and not kip950.is_true(t.configs.get(kip950.COPY_DISABLE)))

    def manages(self, t: "TopicState") -> bool:
        """Retention of this topic is ours (the broker's classic loop skips it)."""
        return (self.broker.is_tiered(t) or t.tiered_state == kip950.DISABLING
                or bool(self.metadata.partitions(t.topic_id)))

    def has_remote(self, t: "TopicState", partition: int) -> bool:
        return bool(self.metadata.segments(t.topic_id, partition))

    def latest_tiered_offset(self, t: "TopicState", partition: int) -> int:
        return self.metadata.highest_offset(t.topic_id, partition)

    def copy_lag(self) -> dict[str, tuple[int, int]]:
        """Per topic, (segments, bytes) of rolled local segments not yet copied: Kafka's
        RemoteCopyLagSegments / RemoteCopyLagBytes, for the metrics endpoint."""
        out: dict[str, tuple[int, int]] = {}
        for t, p, lg in self._local_logs(self.copy_enabled):
            if not self.leads(t, p):
                continue  # a follower copies nothing: its segments are the leader's lag
            tiered_upto = self.latest_tiered_offset(t, p)
            segs, size = out.get(t.name, (0, 0))
            for seg in lg.segments():
                if not seg.is_active and seg.size and seg.next_offset - 1 > tiered_upto:
                    segs, size = segs + 1, size + seg.size
            out[t.name] = (segs, size)
        return out

    def remote_size(self, t: "TopicState") -> tuple[int, int]:
        """(segments, bytes) of the topic's finished remote segments."""
        segs = self.metadata.all_segments(t.topic_id, (S.COPY_SEGMENT_FINISHED,))
        return len(segs), sum(s.segment_size_in_bytes for s in segs)

    def topic_state(self, topic: "TopicState") -> dict[str, str]:
        segments, size = self.remote_size(topic)
        if topic.tiered_state == kip950.NONE and not segments:
            return {}
        return {"kcli.tiered.state": topic.tiered_state, "kcli.tiered.epoch": str(topic.tiered_epoch),
                "kcli.tiered.remote.segments": str(segments), "kcli.tiered.remote.bytes": str(size)}

    # ---- config hooks (KIP-950) --------------------------------------------------------------
    def validate_config_request(self, topic: "TopicState", changes: dict[str, str | None]) -> None:
        kip950.check_request(topic, changes)

    def validate_config_change(self, topic: "TopicState", old: dict[str, str], new: dict[str, str]) -> None:
        kip950.validate_change(self.broker.default_topic_configs(), old, new)

    def config_change_records(self, topic: "TopicState", old: dict[str, str], new: dict[str, str]) -> list[dict[str, Any]]:
        return kip950.transition_records(topic, old, new)

    def config_changed(self, topic: "TopicState", old: dict[str, str], new: dict[str, str]) -> None:
        t = self.broker.topic(topic.name) or topic
        if t.tiered_state == kip950.DISABLING and kip950.is_disable(old, new):
            self.disabler.start(t)
        elif self.copy_enabled(t):
            self._copy_wakeup.set()

    def topic_deleted(self, topic: "TopicState") -> None:
        """Remote data of a deleted topic goes too (marked now, deleted in the background)."""
        self.disabler.forget(topic.topic_id)
        segs = [s for s in self.metadata.all_segments(topic.topic_id, (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED))
                if self.owns(s)]
        if segs:
            try:
                self.metadata.update_state(segs, S.DELETE_SEGMENT_STARTED)
            except Exception as err:  # noqa: BLE001 - the copy rounds mark the orphans again
                log.warning("marking the remote segments of deleted topic %s failed (retried): %s", topic.name, err)
                return
        self._spawn(self._finish_deletes_now(topic.topic_id), f"rlm-delete-{topic.name}")

    async def _finish_deletes_now(self, topic_id: uuid.UUID) -> None:
        """Fast path of a topic deletion; what fails here the copy rounds retry (with back-off)."""
        try:
            await self._finish_deletes(topic_id)
        except Exception as err:  # noqa: BLE001 - retried by _finish_pending_deletes
            log.debug("deleting remote segments of topic %s failed, the copy rounds retry: %s", topic_id, err)

    async def partitions_deleted(self, topic: "TopicState", partitions: Iterable[int]) -> None:
        """KIP-694: removed partitions lose their remote segments too (marked, then deleted)."""
        for p in sorted(partitions):
            async with self._lock(topic.topic_id, p):
                segs = self.metadata.segments(topic.topic_id, p, (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED))
                if segs and not self.owns_partition(topic.topic_id, p, {s.broker_id for s in segs}):
                    continue  # a follower: the leader deletes them (each replica deletes its own log)
                if segs:
                    await self._delete_remote(segs)

    # ---- copy ----------------------------------------------------------------------------------
    async def _copy_loop(self) -> None:
        interval = self.broker.config.get_int("remote.log.manager.task.interval.ms") / 1000
        try:
            self._recover()
        except Exception as err:  # noqa: BLE001 - the broker keeps running; the next start tries again
            log.warning("recovering remote log segment states failed: %s", err)
        while not self.broker.stopping:
            await self.copy_guard.round(self.copy_once, "copy round")
            self._copy_wakeup.clear()
            try:
                await asyncio.wait_for(self._copy_wakeup.wait(), interval)
            except asyncio.TimeoutError:
                pass

    def _recover(self) -> None:
        """Segments a crash left mid-copy, and those of topics that no longer exist, are marked
        for deletion (a half-copied segment is never trusted; it is copied again). Every copy
        round then deletes the marked ones, partition by partition (:meth:`_finish_pending_deletes`)."""
        doomed = [s for s in self.metadata.all_segments(states=(S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED))
                  if (s.state is S.COPY_SEGMENT_STARTED or self._orphan(s)) and self.owns(s)]
        if doomed:
            self.metadata.update_state(doomed, S.DELETE_SEGMENT_STARTED)

    def _orphan(self, seg: RemoteLogSegmentMetadata) -> bool:
        """The segment's topic or partition no longer exists."""
        t = self.broker.topic_by_id(seg.segment_id.topic_id)
        return t is None or seg.segment_id.partition not in t.partitions

    def _mark_orphans(self) -> None:
        """Finished copies of deleted topics whose deletion nobody marked (their host was down,
        or the database was): marked for deletion by their owner now. A copy still running is
        left to the broker copying it, which sees the topic gone when it ends."""
        doomed = [s for s in self.metadata.all_segments(states=(S.COPY_SEGMENT_FINISHED,))
                  if self._orphan(s) and self.owns(s)]
        if doomed:
            self.metadata.update_state(doomed, S.DELETE_SEGMENT_STARTED)

    async def copy_once(self) -> int:
        """One RLM copy round: finish marked deletions, then copy every copying partition, each
        partition on its own (a failure backs that partition off; the others proceed).
        Returns segments copied."""
        self.metadata.refresh()  # what other brokers of a cluster wrote (deleted topics' segments)
        self._mark_orphans()
        await self.delete_guard.round(self._finish_pending_deletes, "remote delete round")
        copied = 0
        for t, p, lg in self._local_logs(self.copy_enabled):
            if not self.leads(t, p):
                continue  # KIP-405: only the leader copies; followers learn the segments from the RLMM
            copied += await self.copy_guard.step((t.topic_id, p), f"{t.name}-{p}",
                                                 lambda: self._copy_step(t, p, lg)) or 0
        return copied

    def leads(self, t: "TopicState", partition: int) -> bool:
        """Whether this broker leads the partition (copies it, expires its remote segments); a
        follower of a replicated tiered partition only applies local retention to its own log."""
        p = t.partitions.get(partition)
        return p is not None and bool(self.broker.leads(p))

    async def _copy_step(self, t: "TopicState", partition: int, lg: "PartitionLog") -> int:
        async with self._lock(t.topic_id, partition):
            return await self._copy_partition(t, partition, lg)

    async def _finish_pending_deletes(self) -> None:
        """Delete the remote objects of every segment in DELETE_SEGMENT_STARTED (left by a crash,
        a failed undo of a copy, or a topic deletion whose fast path failed), per partition."""
        pending = {(s.segment_id.topic_id, s.segment_id.partition): s.segment_id.topic
                   for s in self.metadata.all_segments(states=(S.DELETE_SEGMENT_STARTED,)) if self.owns(s)}
        for (topic_id, p), name in sorted(pending.items(), key=lambda kv: (kv[1], kv[0][1])):
            await self.delete_guard.step((topic_id, p), f"{name}-{p}",
                                         lambda: self._finish_partition_deletes(topic_id, p))

    async def _finish_partition_deletes(self, topic_id: uuid.UUID, partition: int) -> None:
        async with self._lock(topic_id, partition):
            # under the lock: a copy that was running has now ended (and was marked too)
            segs = [s for s in self.metadata.segments(topic_id, partition, (S.DELETE_SEGMENT_STARTED,)) if self.owns(s)]
            if segs:
                await self._delete_remote(segs)

    def _local_logs(self, wanted: Callable[["TopicState"], bool]) -> Iterator[tuple["TopicState", int, "PartitionLog"]]:
        """(topic, partition, local log) of every ``wanted`` topic's partitions that have a log here."""
        for t in list(self.broker.state.topics.values()):
            if not wanted(t):
                continue
            for p in sorted(t.partitions):
                lg = self.broker.get_log(t.name, p)
                if lg is not None:
                    yield t, p, lg

    async def _copy_partition(self, t: "TopicState", partition: int, lg: "PartitionLog") -> int:
        copied = 0
        tiered_upto = self.latest_tiered_offset(t, partition)
        for seg in lg.segments():
            if seg.is_active:
                break  # Kafka copies up to the last stable offset: every rolled segment here
            current = self.broker.topic_by_id(t.topic_id)
            if current is None or not self.copy_enabled(current):
                break  # disabled meanwhile (stopPartitions)
            if seg.next_offset - 1 <= tiered_upto or seg.size == 0 or seg.next_offset <= lg.log_start_offset:
                continue
            if not self.leads(current, partition):
                break  # leadership moved meanwhile: the new leader goes on from the RLMM's highest offset
            epochs = segment_leader_epochs(lg.epoch_entries(), max(seg.base_offset, tiered_upto + 1),
                                           seg.next_offset - 1)
            if seg.base_offset <= tiered_upto:
                # A new leader's segments are cut where its own log rolled, not where the old
                # leader's were: copy only the part past the highest tiered offset, so no offset
                # is copied twice (the old leader's copies end at its own boundaries)
                trimmed = await asyncio.to_thread(trim_segment, seg, tiered_upto + 1)
                try:
                    ok = await self._copy_segment(current, partition, trimmed, epochs=epochs)
                finally:
                    await asyncio.to_thread(_remove_trimmed, trimmed)
            else:
                ok = await self._copy_segment(current, partition, seg, epochs=epochs)
            if not ok:
                break  # keep segments in order: retry this one next round
            copied += 1
            tiered_upto = seg.next_offset - 1
        return copied

    async def _copy_segment(self, t: "TopicState", partition: int, seg: "SegmentInfo", *,
                            epochs: dict[int, int] | None = None) -> bool:
        """Copy one segment; ``epochs``: its leader epochs and where each starts in it (from the
        log's leader-epoch cache), else the partition's current epoch from its base offset."""
        assert self.rsm is not None
        pstate = t.partitions.get(partition)
        leader_epoch = pstate.leader_epoch if pstate is not None else 0
        epochs = epochs or {leader_epoch: seg.base_offset}
        leader_epoch = max(epochs)
        md = RemoteLogSegmentMetadata(
            RemoteLogSegmentId.generate(t.topic_id, t.name, partition), seg.base_offset, seg.next_offset - 1,
            seg.max_timestamp, self.broker.node_id, _now_ms(), seg.size, S.COPY_SEGMENT_STARTED,
            t.tiered_epoch, dict(epochs))
        txnindex = seg.txnindex_path if seg.txnindex_path is not None and _nonempty(seg.txnindex_path) else None
        data = LogSegmentData(seg.log_path, seg.index_path, seg.timeindex_path,
                              leader_epoch_checkpoint_of(epochs), transaction_index=txnindex)
        self.metadata.add_copy_started(md)
        try:
            await self._rsm_call(self.rsm.copy_log_segment_data, md, data)
            faults.pause("tiered.copy.uploaded")  # crash tests only (kcli/faults.py): stored, not FINISHED
        except Exception:  # any plugin failure: undo, and let the copy guard back this partition off
            try:
                await self._delete_remote([md])
            except Exception as undo_err:  # noqa: BLE001 - stays DELETE_SEGMENT_STARTED: the copy rounds finish it
                log.debug("undoing the copy of segment %d of %s-%d failed: %s", seg.base_offset, t.name,
                          partition, undo_err)
            raise
        current = self.metadata.get(md.segment_id.id)
        if current is None or current.state is not S.COPY_SEGMENT_STARTED:
            return False  # the topic was deleted meanwhile: its deletion removes these objects
        try:
            self.metadata.update_state([md], S.COPY_SEGMENT_FINISHED)
        except SegmentOverlapError as err:  # another leader copied this range first: ours goes
            log.warning("%s: deleting this copy; copying resumes after that segment", err)
            self.broker.metrics.inc("tiered.segments.overlapping.deleted")
            await self._delete_remote([md])
            return False
        self.broker.metrics.inc("tiered.segments.copied")
        self.broker.metrics.inc("tiered.bytes.copied", md.segment_size_in_bytes)
        log.info("copied segment %d-%d of %s-%d to remote storage (tiered epoch %d)",
                 md.start_offset, md.end_offset, t.name, partition, md.tiered_epoch)
        return True

    # ---- remote deletion -------------------------------------------------------------------------
    async def _delete_remote(self, segs: Iterable[RemoteLogSegmentMetadata]) -> None:
        """DELETE_SEGMENT_STARTED (fsynced) → delete objects → DELETE_SEGMENT_FINISHED."""
        assert self.rsm is not None
        current = (self.metadata.get(s.segment_id.id) for s in segs)
        segs = [s for s in current if s is not None]  # the store's view: states may have moved on
        starting = [s for s in segs if s.state is not S.DELETE_SEGMENT_STARTED]
        if starting:
            self.metadata.update_state(starting, S.DELETE_SEGMENT_STARTED)
        for s in segs:
            await self._rsm_call(self.rsm.delete_log_segment_data, s)
            with self._index_lock:
                self._index_cache.pop((s.segment_id.id, IndexType.OFFSET), None)
                self._index_cache.pop((s.segment_id.id, IndexType.TIMESTAMP), None)
            self.metadata.update_state([s], S.DELETE_SEGMENT_FINISHED)
            self.broker.metrics.inc("tiered.segments.deleted")

    async def _finish_deletes(self, topic_id: uuid.UUID) -> None:
        for p in self.metadata.partitions(topic_id):
            await self._finish_partition_deletes(topic_id, p)

    async def stop_partitions(self, t: "TopicState", *, delete_remote: bool) -> None:
        """KIP-950's RemoteLogManager#stopPartitions for every partition of ``t`` this broker
        works on (:meth:`owns_partition`): copying has stopped (the topic no longer copies, and
        the lock waits out a running copy); with ``delete_remote`` the log start offset moves to
        the local log start and every remote segment is deleted. Each partition done is marked
        in the remote log metadata for ``t.tiered_epoch``, so whoever writes DISABLED knows it."""
        self.metadata.refresh()
        copiers: dict[int, set[int]] = {}
        for s in self.metadata.all_segments(t.topic_id, LIVE):
            copiers.setdefault(s.segment_id.partition, set()).add(s.broker_id)
        partitions = [p for p in sorted(set(t.partitions) | set(copiers))
                      if self.owns_partition(t.topic_id, p, copiers.get(p, ()))]
        failed: list[tuple[int, Exception]] = []
        done: list[int] = []
        for p in partitions:
            async with self._lock(t.topic_id, p):
                try:
                    if delete_remote:
                        await self._stop_partition_delete(t, p)
                    done.append(p)
                except Exception as err:  # noqa: BLE001 - the other partitions still proceed
                    failed.append((p, err))
        self.metadata.mark_partitions_stopped(t.topic_id, t.tiered_epoch, done)
        if failed:
            p, err = failed[0]
            raise RemoteStorageException(f"{len(failed)} of {len(partitions)} partition(s) failed, "
                                         f"first {t.name}-{p}: {err}") from err

    async def _stop_partition_delete(self, t: "TopicState", p: int) -> None:
        lg = self.broker.get_log(t.name, p)
        if lg is not None and lg.log_start_offset < lg.local_log_start_offset:
            lg.set_log_start_offset(lg.local_log_start_offset)
        segs = self.metadata.segments(t.topic_id, p, LIVE)
        if segs:
            await self._delete_remote(segs)
            log.info("deleted %d remote segments of %s-%d (tiering disabled, policy delete)", len(segs), t.name, p)

    async def log_start_moved(self, t: "TopicState", partition: int, new_start: int) -> None:
        """DeleteRecords moved the log start: remote segments wholly below it go at the next
        retention round (as Kafka's RLM expiration task does)."""

    # ---- retention ---------------------------------------------------------------------------------
    async def _retention_loop(self) -> None:
        interval = self.broker.config.get_int("log.retention.check.interval.ms") / 1000
        while not self.broker.stopping:
            await asyncio.sleep(interval)
            await self.retention_guard.round(self.retention_once, "retention round")

    async def retention_once(self, now_ms: int | None = None) -> None:
        """Local and total retention of every partition we manage, each on its own (a failing
        partition is backed off; the others proceed)."""
        now = _now_ms() if now_ms is None else now_ms
        for t, p, lg in self._local_logs(self.manages):
            await self.retention_guard.step((t.topic_id, p), f"{t.name}-{p}",
                                            lambda: self._retention_step(t, p, lg, now))

    async def _retention_step(self, t: "TopicState", p: int, lg: "PartitionLog", now: int) -> None:
        async with self._lock(t.topic_id, p):
            current = self.broker.topic_by_id(t.topic_id)
            if current is None:
                return  # deleted meanwhile
            if self.copy_enabled(current):
                self._local_retention(current, p, lg, now)
            else:
                lg.delete_retention(now)
            if self.leads(current, p):
                await self._remote_retention(current, p, lg, now)
            elif (not self.copy_enabled(current) and not self.has_remote(current, p)
                  and lg.log_start_offset < lg.local_log_start_offset):
                # a follower once the remote tier is gone (KIP-950 delete, or expired): its log
                # starts where its own data does, never below it in a tier that no longer exists
                lg.set_log_start_offset(lg.local_log_start_offset)

    def _retention_limits(self, t: "TopicState", local: bool) -> tuple[int, int]:
        """(ms, bytes); local ones fall back to the totals when -2 (Kafka's rule)."""
        ms = int(self.broker.topic_config_value(t, "retention.ms"))
        size = int(self.broker.topic_config_value(t, "retention.bytes"))
        if local:
            local_ms = int(self.broker.topic_config_value(t, "local.retention.ms"))
            local_size = int(self.broker.topic_config_value(t, "local.retention.bytes"))
            ms = ms if local_ms == -2 else local_ms
            size = size if local_size == -2 else local_size
        return ms, size

    def _local_retention(self, t: "TopicState", partition: int, lg: "PartitionLog", now: int) -> int:
        """Delete the oldest local segments that are copied and past local retention."""
        ms, limit = self._retention_limits(t, local=True)
        tiered_upto = self.latest_tiered_offset(t, partition)
        segs = lg.segments()
        size = sum(s.size for s in segs)
        delete_below = None
        for seg in segs[:-1]:
            if seg.next_offset - 1 > tiered_upto:
                break  # never delete what is not in the remote tier yet
            by_size = limit >= 0 and size - seg.size >= limit
            by_time = ms >= 0 and now - _segment_time(seg) > ms
            if not (by_size or by_time):
                break
            size -= seg.size
            delete_below = seg.next_offset
        if delete_below is None:
            return 0
        return lg.delete_local_segments_below(delete_below)

    async def _remote_retention(self, t: "TopicState", partition: int, lg: "PartitionLog", now: int) -> None:
        """Expire remote segments by total retention (or below the log start), moving the log
        start first so no fetch is sent to a segment about to go."""
        segs = self.metadata.segments(t.topic_id, partition)
        if not segs:
            return
        ms, limit = self._retention_limits(t, local=False)
        log_start = lg.log_start_offset
        tiered_upto = segs[-1].end_offset
        only_local = sum(s.size for s in lg.segments() if s.base_offset > tiered_upto)
        excess = (sum(s.segment_size_in_bytes for s in segs if s.end_offset >= log_start) + only_local - limit
                  if limit >= 0 else 0)
        doomed = expired_remote_segments(segs, excess=excess, limit=limit, retention_ms=ms, now=now,
                                         log_start=log_start)
        if not doomed:
            return
        new_start = doomed[-1].end_offset + 1
        if new_start > lg.log_start_offset:
            lg.set_log_start_offset(min(new_start, lg.log_end_offset))
        await self._delete_remote(doomed)
        log.info("expired %d remote segments of %s-%d; log start offset %d",
                 len(doomed), t.name, partition, lg.log_start_offset)

    # ---- remote reads --------------------------------------------------------------------------------
    async def read(self, t: "TopicState", partition: int, offset: int, max_bytes: int, *, min_one: bool) -> ReadResult:
        """Whole batches from the remote segment holding ``offset`` (Kafka's RemoteLogReader)."""
        lg = self.broker.get_log(t.name, partition)
        if lg is None:
            raise LogError(ErrorCode.unknown_topic_or_partition, "This server does not host this topic-partition.")
        if offset < lg.log_start_offset or offset > lg.log_end_offset:
            raise _out_of_range(lg, offset)
        md = self.metadata.segment_for_offset(t.topic_id, partition, offset)
        if md is None or md.start_offset >= lg.local_log_start_offset:
            raise _out_of_range(lg, offset)
        try:
            records, next_offset, damage = await self._rsm_call(self._read_segment, md, max(offset, md.start_offset),
                                                                max_bytes, min_one)
        except _RemoteDamage as err:  # the read starts at a damaged batch: never served
            raise self._remote_corrupt(t, partition, md, err) from None
        except RemoteStorageException as err:
            if offset < lg.log_start_offset:  # expired while we read
                raise _out_of_range(lg, offset) from None
            raise LogError(ErrorCode.kafka_storage_error, f"reading remote segment {md.start_offset} of "
                                                f"{t.name}-{partition}: {err}") from None
        if damage is not None:  # the intact batches before it are served; a fetch from it fails
            self._remote_corrupt(t, partition, md, damage)
        self.broker.metrics.inc("tiered.remote.fetch.bytes", len(records))
        aborted: tuple[AbortedTxn, ...] = ()
        if records:
            try:
                aborted = await self._rsm_call(self._remote_aborted, t, partition, md, offset, next_offset,
                                               lg.local_log_start_offset)
            except RemoteStorageException as err:  # a read_committed client must not get aborted records
                raise LogError(ErrorCode.kafka_storage_error, f"reading the transaction index of remote segment "
                                                    f"{md.start_offset} of {t.name}-{partition}: {err}") from None
        return ReadResult(records, lg.high_watermark, lg.log_start_offset, lg.log_end_offset, next_offset,
                          aborted_transactions=aborted)

    def _remote_aborted(self, t: "TopicState", partition: int, md: RemoteLogSegmentMetadata, start: int,
                        upper: int, local_start: int) -> tuple[AbortedTxn, ...]:
        """Kafka's RemoteLogManager.collectAbortedTransactions: the aborted transactions overlapping
        ``start..upper-1`` from the transaction indexes of ``md`` and the remote segments after it
        (an ABORT marker can lie in a later segment than the data it aborts), until an entry's last
        stable offset reaches ``upper`` (no transaction open before ``upper`` is left to find) or
        the local segments begin (the log's own list covers those). Worker thread."""
        found: list[AbortedTxn] = []
        later = [m for m in self.metadata.segments(t.topic_id, partition)
                 if md.start_offset <= m.start_offset < local_start]
        for seg in sorted(later, key=lambda m: m.start_offset)[:_TXN_SCAN_SEGMENTS]:
            complete = False
            for a in self._txn_entries(seg):
                if a.last_offset >= start and a.first_offset < upper:
                    found.append(a)
                complete = complete or a.last_stable_offset >= upper
            if complete:
                break
        return tuple(found)

    def _txn_entries(self, md: RemoteLogSegmentMetadata) -> list[AbortedTxn]:
        """A remote segment's transaction index (none uploaded: no entries)."""
        return self._cached_index(md, IndexType.TRANSACTION, parse_txn_index, missing_ok=True)

    def _index(self, md: RemoteLogSegmentMetadata, index_type: IndexType) -> tuple[array, array]:
        return self._cached_index(md, index_type, OffsetIndex.parse if index_type is IndexType.OFFSET
                                  else TimeIndex.parse)

    def _cached_index(self, md: RemoteLogSegmentMetadata, index_type: IndexType, parse: Callable[[bytes], Any],
                      missing_ok: bool = False) -> Any:
        """A remote segment's index fetched once and parsed, then served from an LRU cache (worker
        thread). ``missing_ok``: an index the segment was uploaded without parses as empty."""
        key = (md.segment_id.id, index_type)
        with self._index_lock:
            cached = self._index_cache.get(key)
            if cached is not None:
                self._index_cache.move_to_end(key)
                return cached
        assert self.rsm is not None
        try:
            data = self.rsm.fetch_index(md, index_type)
        except RemoteResourceNotFoundException:
            if not missing_ok:
                raise
            data = b""
        parsed = parse(data)
        with self._index_lock:
            self._index_cache[key] = parsed
            while len(self._index_cache) > _INDEX_CACHE_ENTRIES:
                self._index_cache.popitem(last=False)
        return parsed

    def _position_for(self, md: RemoteLogSegmentMetadata, offset: int) -> int:
        """Where a scan for ``offset`` starts (offset index lookup; 0 without entries)."""
        try:
            rel, pos = self._index(md, IndexType.OFFSET)
        except (RemoteResourceNotFoundException, ValueError):
            return 0
        i = bisect_right(rel, offset - md.start_offset) - 1
        return pos[i] if i >= 0 else 0

    def _remote_corrupt(self, t: "TopicState", partition: int, md: RemoteLogSegmentMetadata,
                        damage: "_RemoteDamage") -> LogError:
        """CORRUPT_MESSAGE for a damaged remote batch: counted every time it is read, logged once
        per segment object and byte range."""
        assert self.rsm is not None
        where = self.rsm.segment_location(md)
        span = (f"bytes {damage.position}-{damage.position + damage.size - 1}" if damage.size
                else f"position {damage.position}")
        message = f"{where} {span} (segment {md.start_offset}..{md.end_offset} of {t.name}-{partition}): {damage.why}"
        self.broker.metrics.inc(CORRUPT_METRIC)
        if self._damage_reported.first((where, damage.position)):
            log.warning("remote fetch: %s; answering CORRUPT_MESSAGE, the segment is left in place", message,
                        extra={"event": "tiered.corrupt_batch", "location": where, "position": damage.position,
                               "byte_size": damage.size})
        return LogError(ErrorCode.corrupt_message, message)

    def _read_segment(self, md: RemoteLogSegmentMetadata, offset: int, max_bytes: int,
                      min_one: bool) -> tuple[bytes, int, "_RemoteDamage | None"]:
        """(records, next offset, damage) from ``md``; runs in a worker thread. Every batch served
        is CRC-checked first (Kafka's DefaultRecordBatch.isValid); a damaged one ends the records
        before it (``damage`` says where) or, when the read starts at it, raises _RemoteDamage."""
        assert self.rsm is not None
        cursor = _RemoteCursor(self.rsm, md, self._position_for(md, offset), max_bytes + 2 * 4096)
        first = None
        for pos, h in cursor.batches():  # a damaged header before the wanted batch raises: nothing to serve
            if h.last_offset >= offset:
                first = pos
                break
        if first is None:
            return b"", offset, None
        end, next_offset = first, offset
        served: list[tuple[int, Any]] = []
        damage: _RemoteDamage | None = None
        try:
            for pos, h in cursor.batches(first):
                if pos + h.size - first > max_bytes and not (pos == first and min_one):
                    break
                if pos + h.size > cursor.size:
                    damage = _RemoteDamage(pos, h.size, f"batch of {h.size} bytes runs past the end of the "
                                                        f"segment ({cursor.size} bytes)")
                    break
                served.append((pos, h))
                end, next_offset = pos + h.size, h.last_offset + 1
        except _RemoteDamage as err:
            damage = err
        if end == first:
            if damage is not None:
                raise damage
            return b"", offset, None
        cursor.ensure(end)
        view = memoryview(cursor.buf)
        base = cursor.start
        for i, (pos, h) in enumerate(served):  # over the fetched buffer: no copy
            if crc32c(view[pos - base + 21 : pos - base + h.size]) != h.crc:
                damage = _RemoteDamage(pos, h.size, "batch fails its CRC-32C check")
                if i == 0:
                    view.release()
                    raise damage
                end, next_offset = pos, served[i - 1][1].last_offset + 1
                break
        view.release()
        return cursor.slice(first, end), next_offset, damage

    async def max_timestamp_offset(self, t: "TopicState", partition: int, local: tuple[int, int] | None) -> tuple[int, int] | None:
        """ListOffsets -3 (KIP-734) over remote and local data: the first record holding the
        largest timestamp. ``local`` is the local log's answer; a remote segment below the local
        log start whose max timestamp reaches it holds an earlier (or a larger) one."""
        lg = self.broker.get_log(t.name, partition)
        if lg is None:
            return local
        start = lg.log_start_offset
        best: RemoteLogSegmentMetadata | None = None
        for md in self.metadata.segments(t.topic_id, partition):
            if md.end_offset < start or md.start_offset >= lg.local_log_start_offset or md.max_timestamp_ms < 0:
                continue
            if best is None or md.max_timestamp_ms > best.max_timestamp_ms:
                best = md  # the earliest segment of the largest timestamp
        if best is None or (local is not None and best.max_timestamp_ms < local[1]):
            return local
        found = await self._rsm_call(self._find_timestamp, best, best.max_timestamp_ms, start)
        return found if found is not None and found[1] == best.max_timestamp_ms else local

    async def offset_for_timestamp(self, t: "TopicState", partition: int, timestamp: int) -> tuple[int, int] | None:
        """First remote record with timestamp >= ``timestamp`` at or after the log start."""
        lg = self.broker.get_log(t.name, partition)
        if lg is None:
            return None
        start = lg.log_start_offset
        for md in self.metadata.segments(t.topic_id, partition):
            if md.end_offset < start or md.max_timestamp_ms < timestamp:
                continue
            if md.start_offset >= lg.local_log_start_offset:
                return None  # the local log answers from here on
            found = await self._rsm_call(self._find_timestamp, md, timestamp, start)
            if found is not None:
                return found
        return None

    def _find_timestamp(self, md: RemoteLogSegmentMetadata, timestamp: int, start: int) -> tuple[int, int] | None:
        assert self.rsm is not None
        try:
            ts, rel = self._index(md, IndexType.TIMESTAMP)
            i = bisect_right(ts, timestamp - 1) - 1  # last entry with ts < timestamp
            indexed = md.start_offset + rel[i] if i >= 0 else md.start_offset
        except (RemoteResourceNotFoundException, ValueError):
            indexed = md.start_offset
        cursor = _RemoteCursor(self.rsm, md, self._position_for(md, max(indexed, start)), _READ_CHUNK)
        for pos, h in cursor.batches():
            if h.max_timestamp >= timestamp and h.last_offset >= start:
                for rec_offset, rec_ts in iter_record_timestamps(cursor.slice(pos, pos + h.size)):
                    if rec_ts >= timestamp and rec_offset >= start:
                        return rec_offset, rec_ts
        return None


class _RemoteDamage(RemoteStorageException):
    """A batch of a remote segment that cannot be served: an impossible header, or its CRC-32C
    fails. ``size`` is 0 when the header could not be read."""

    def __init__(self, position: int, size: int, why: str) -> None:
        super().__init__(f"position {position}: {why}")
        self.position = position
        self.size = size
        self.why = why


class _RemoteCursor:
    """Forward reads over one remote segment with few ranged GETs: one buffer that grows by
    at least ``chunk`` bytes whenever a header or slice reaches past it."""

    def __init__(self, rsm: RemoteStorageManager, md: RemoteLogSegmentMetadata, start: int, chunk: int) -> None:
        self.rsm = rsm
        self.md = md
        self.size = md.segment_size_in_bytes
        self.start = start
        self.buf = b""
        self.chunk = max(chunk, _READ_CHUNK)

    def ensure(self, end: int) -> None:
        have = self.start + len(self.buf)
        if end <= have:
            return
        want = min(self.size, max(end, have + self.chunk))
        more = self.rsm.fetch_log_segment(self.md, have, want - 1)
        self.buf = self.buf + more if self.buf else more  # usually one GET: no copy

    def slice(self, begin: int, end: int) -> bytes:
        self.ensure(end)
        lo, hi = begin - self.start, end - self.start
        if lo == 0 and hi == len(self.buf):
            return self.buf
        return bytes(memoryview(self.buf)[lo:hi])

    def batches(self, position: int | None = None) -> Iterable[tuple[int, Any]]:
        pos = self.start if position is None else position
        while pos + HEADER_SIZE <= self.size:
            self.ensure(pos + HEADER_SIZE)
            try:
                h = read_header(self.buf, pos - self.start)
            except InvalidBatchError as err:
                raise _RemoteDamage(pos, 0, f"no batch header: {err}") from None
            yield pos, h
            pos += h.size


def _segment_time(seg: "SegmentInfo") -> int:
    """Newest timestamp of a local segment, or its file's mtime (Kafka's retention rule)."""
    if seg.max_timestamp >= 0:
        return seg.max_timestamp
    try:
        return int(os.stat(seg.log_path).st_mtime * 1000)
    except OSError:
        return _now_ms()


def _out_of_range(lg: "PartitionLog", offset: int) -> OffsetOutOfRange:
    return OffsetOutOfRange(offset, log_start_offset=lg.log_start_offset,
                            local_log_start_offset=lg.local_log_start_offset, log_end_offset=lg.log_end_offset)
