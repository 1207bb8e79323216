"""Local segments of diskless replicas (KIP-1163 "Replicas"): a cache, never the persistence.

Each broker holding a replica of a diskless partition (the partition's ``replicas`` in its
PartitionRecord; on a single broker, that broker) follows the batch coordinator's log tail,
downloads the new batches from the object store through the fetch path's reader (CRC-checked,
offsets, leader epoch and LogAppendTime written in) and appends them, unchanged, to an ordinary
classic log (kcli/storage/log.py: segments, offset and time indexes, transaction index) under
``<data_dir>/diskless-cache/<topic>-<partition>/`` — so ``kcli dump-log`` and every reader of
classic segments read it. Fetches are served from it when it holds the offset
(:meth:`ReplicaCache.read`); everything else reads the object store as before.

Rules:

* **Start.** A new cache starts ``diskless.replica.cache.start.bytes`` before the log end, or at
  the log start, whichever is later (seed 004's policy 3). The offset is estimated from the
  partition's average batch size (the coordinator indexes batches, not byte positions) and moved
  to the start of the batch holding it.
* **Safe to lose.** Nothing is read from the cache that the coordinator does not vouch for: a
  read checks the coordinator's log start first, and a cache that cannot be opened, is damaged,
  belongs to another topic id or runs past the coordinator's log end is deleted and rebuilt.
  Deleting the whole directory (broker down or up) loses nothing.
* **Expiry.** ``local.retention.ms`` / ``local.retention.bytes`` (``-2``: ``retention.*``) delete
  whole segments, as a tiered topic's local segments go; segments below the coordinator's log
  start go at once.
* **In sync.** A replica is in the ISR while its cache reached the coordinator's high watermark
  within ``replica.lag.time.max.ms`` (Kafka's lastCaughtUpTime rule) and no damaged batch stops
  it. In a cluster each broker reports its caches' ranges through the batch coordinator
  (``report_replica_caches``, about once a second) and reads the others' reports.
* **Isolation.** One background task per broker, at most
  ``diskless.replica.cache.max.concurrent.partitions`` partitions filling at once, each step
  through a :class:`~kcli.broker.background.TaskGuard` (task ``diskless-replica-cache``): one
  failing partition is backed off, the others go on. Appends and file work run on the cache's
  own two threads, coordinator calls on its own thread: the produce path's threads never wait
  for the cache.

Compacted diskless topics are not cached (the coordinator rewrites their batches; a cache would
keep what compaction removed): they are read from the object store, and their live replicas count
as in sync.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kio.schema.errors import ErrorCode

from kcli.broker.background import TaskGuard
from kcli.diskless.reader import FILLING, CorruptBatch, DisklessReadResult
from kcli.storage.errors import LogError, OffsetOutOfRange

if TYPE_CHECKING:
    from kcli.metadata.metadata_log import PartitionState, TopicState
    from kcli.storage.log import PartitionLog

log = logging.getLogger("kcli.diskless.replica_cache")

CACHE_DIR = "diskless-cache"
FILL_FETCH_BYTES = 4 * 1024 * 1024  # bytes asked of the coordinator per find
STEP_MAX_BYTES = 16 * 1024 * 1024  # bytes one partition fills per step before the others get a turn
ROUND_INTERVAL_S = 1.0  # housekeeping and coordinator refresh at least this often
REPORT_INTERVAL_S = 1.0  # cluster: how often this broker reports its caches
FLUSH_INTERVAL_S = 5.0  # fsync of cache segments (they are a cache: recovery cuts a torn tail)
TAIL_WAIT_S = 0.5  # a fetch at an in-sync cache's end waits this long for the batches being filled
TASK = "diskless-replica-cache"


class CacheHost(Protocol):
    """What the cache uses of the diskless engine (kcli/diskless/engine.py, which imports this
    module: the engine is handed in, never imported)."""

    broker: Any
    metrics: Any
    coordinator: Any
    reader: Any

    def offsets(self, t: Any, partition: int) -> tuple[int, int]: ...

    def tip(self, t: Any, partition: int) -> Any: ...


@dataclasses.dataclass
class CachedPartition:
    topic_id: uuid.UUID
    topic: str
    partition: int
    log: "PartitionLog"
    caught_up_ms: int = 0  # wall clock: the cache last reached the coordinator's high watermark
    stable_seen: int = 0  # the coordinator's last stable offset at the last find
    stuck: str | None = None  # a damaged batch stops the fill here (out of the ISR)
    broken: bool = False  # a read failed: rebuilt by the next round
    busy: bool = False
    changed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class ReplicaCache:
    """See the module docstring. Owned by the diskless engine (``engine.replica_cache``)."""

    def __init__(self, engine: CacheHost) -> None:
        self.engine = engine
        self.broker = engine.broker
        cfg = self.broker.config
        self.root: Path = self.broker.data_dir / CACHE_DIR
        self.start_bytes = cfg.get_int("diskless.replica.cache.start.bytes")
        self.max_concurrent = cfg.get_int("diskless.replica.cache.max.concurrent.partitions")
        self.lag_max_ms = cfg.get_int("replica.lag.time.max.ms")
        self.retention_interval_s = cfg.get_int("log.retention.check.interval.ms") / 1000
        self.guard = TaskGuard(TASK, engine.metrics, log)
        self.parts: dict[tuple[uuid.UUID, int], CachedPartition] = {}
        self.remote: dict[int, tuple[int, dict[str, list[int]]]] = {}  # broker -> (reported at, caches)
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kcli-diskless-cache")
        self.coord_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kcli-diskless-cache-coord")
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_report = 0.0
        self._last_flush = time.monotonic()
        self._last_retention = time.monotonic()
        self._scanned = False

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._task = loop.create_task(self._run_forever(), name=TASK)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        loop = asyncio.get_running_loop()
        for cp in list(self.parts.values()):
            try:
                await loop.run_in_executor(self.pool, _close_log, cp.log)
            except Exception as err:  # noqa: BLE001 - a cache: the next start recovers or rebuilds it
                log.warning("closing the replica cache of %s-%d: %s", cp.topic, cp.partition, err)
        self.parts.clear()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.coord_pool.shutdown(wait=True, cancel_futures=True)

    def wake(self) -> None:
        """New offsets were committed or published: fill now."""
        self._wake.set()

    # ---- which partitions --------------------------------------------------------------------
    def single_broker(self) -> bool:
        return bool(self.broker.metadata.single_broker)

    def replicas_of(self, p: "PartitionState") -> list[int]:
        """The brokers holding a replica (on a single broker: the partition's replicas are all
        this broker, whatever node id made the topic)."""
        return list(p.replicas) if p.replicas else [self.broker.node_id]

    def holds(self, p: "PartitionState") -> bool:
        return self.single_broker() or self.broker.node_id in p.replicas

    def cacheable(self, t: "TopicState") -> bool:
        return self.broker.is_diskless(t) and not self.broker.log_config(t).compact

    def _wanted(self) -> dict[tuple[uuid.UUID, int], tuple["TopicState", int]]:
        from kcli.metadata.metadata_log import MODE_NONE

        out: dict[tuple[uuid.UUID, int], tuple["TopicState", int]] = {}
        for t in list(self.broker.state.topics.values()):
            if not self.cacheable(t):
                continue
            for p in t.partitions.values():
                if p.mode != MODE_NONE and self.holds(p) and self.engine.offsets(t, p.partition)[0] >= 0:
                    out[(t.topic_id, p.partition)] = (t, p.partition)
        return out

    # ---- the task ----------------------------------------------------------------------------
    async def _run_forever(self) -> None:
        FILLING.set(True)  # GETs of this task (and of its steps) are not Fetch requests' GETs
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), ROUND_INTERVAL_S)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            await self.guard.round(self._round, "replica cache round")

    async def _round(self) -> None:
        loop = asyncio.get_running_loop()
        if not self._scanned:
            await loop.run_in_executor(self.pool, self._scan)
            self._scanned = True
        wanted = self._wanted()
        for key in [k for k in self.parts if k not in wanted or self.parts[k].broken]:
            await self._drop(key)
        sem = asyncio.Semaphore(self.max_concurrent)
        steps = []
        for key, (t, partition) in wanted.items():
            cp = self.parts.get(key)
            hwm, _lso = self.engine.offsets(t, partition)
            if cp is not None:
                if cp.busy:
                    continue
                if cp.log.log_end_offset >= hwm and cp.stuck is None:
                    cp.caught_up_ms = _now_ms()  # nothing new: still caught up
                    continue
            steps.append(self._guarded_step(sem, key, t, partition))
        if steps:
            await asyncio.gather(*steps)
        now = time.monotonic()
        if now - self._last_retention >= self.retention_interval_s:
            self._last_retention = now
            for key, cp in list(self.parts.items()):
                t = wanted[key][0]
                await self.guard.step(("retention",) + key, f"{cp.topic}-{cp.partition}",
                                      lambda cp=cp, t=t: loop.run_in_executor(self.pool, self._expire, cp, t))
        if now - self._last_flush >= FLUSH_INTERVAL_S:
            self._last_flush = now
            await loop.run_in_executor(self.pool, _flush_all, [cp.log for cp in self.parts.values()])
        if not self.single_broker() and now - self._last_report >= REPORT_INTERVAL_S:
            self._last_report = now
            await self._exchange_reports()

    async def _guarded_step(self, sem: asyncio.Semaphore, key: tuple[uuid.UUID, int], t: "TopicState",
                            partition: int) -> None:
        async with sem:
            await self.guard.step(key, f"{t.name}-{partition}", lambda: self._step(key, t, partition))

    async def _step(self, key: tuple[uuid.UUID, int], t: "TopicState", partition: int) -> None:
        """Fill one partition's cache towards the coordinator's high watermark (one step's worth)."""
        from plugins.coordinator.base import FindBatchRequest

        loop = asyncio.get_running_loop()
        engine = self.engine
        coordinator, reader = engine.coordinator, engine.reader
        assert coordinator is not None and reader is not None
        cp = self.parts.get(key)
        if cp is None:
            start = await self._start_offset(t, partition)
            lg = await loop.run_in_executor(self.pool, self._create, t, partition, start)
            cp = self.parts[key] = CachedPartition(t.topic_id, t.name, partition, lg)
            log.info("replica cache of %s-%d starts at offset %d", t.name, partition, start)
        cp.busy = True
        try:
            tip = engine.tip(t, partition)
            filled = 0
            segment_bytes = cp.log.config.segment_bytes
            while filled < STEP_MAX_BYTES:
                offset = cp.log.log_end_offset
                resp = (await loop.run_in_executor(self.coord_pool, coordinator.find_batches,
                                                   [FindBatchRequest(tip, offset, FILL_FETCH_BYTES)], FILL_FETCH_BYTES))[0]
                if resp.errors == ErrorCode.offset_out_of_range:
                    # The coordinator's log moved past the cache (retention, DeleteRecords) or the
                    # cache runs past its end (a restored coordinator): start again where it is valid.
                    restart = resp.log_start_offset if offset < resp.log_start_offset else await self._start_offset(t, partition)
                    await loop.run_in_executor(self.pool, cp.log.truncate_fully_and_start_at, restart)
                    cp.stuck = None
                    continue
                if resp.errors != 0:
                    raise LogError(resp.errors, f"find_batches for the replica cache of {tip}")
                cp.stable_seen = max(cp.stable_seen, resp.last_stable_offset)
                if not resp.batches:
                    if offset >= resp.high_watermark:
                        cp.caught_up_ms = _now_ms()
                    break
                p = t.partitions.get(partition)
                try:
                    data = await reader.assemble(resp.batches, p.leader_epoch if p is not None else 0)
                    batches = resp.batches
                    damage = None
                except CorruptBatch as err:
                    data, batches, damage = err.intact, resp.batches[: err.served], err.message
                if batches:
                    await loop.run_in_executor(self.pool, _append_grouped, cp.log, data, batches, segment_bytes)
                    filled += len(data)
                    cp.notify()
                    self.engine.metrics.inc("diskless.replica.cache.appended.bytes", len(data))
                if damage is not None:
                    bad = resp.batches[len(batches)]
                    if cp.stuck is None:  # the reader logged the object range once; this names the effect
                        log.warning("replica cache of %s-%d stops at offset %d, before a damaged batch of WAL "
                                    "object %s; the replica is out of the ISR until it can be read",
                                    t.name, partition, cp.log.log_end_offset, bad.object_key)
                    cp.stuck = damage
                    # (the reader's one WARNING names the byte range; the guard's names the object)
                    raise LogError(ErrorCode.corrupt_message, f"a damaged batch of WAL object {bad.object_key} "
                                   f"at offset {cp.log.log_end_offset}")
                cp.stuck = None
                if cp.log.log_end_offset >= resp.high_watermark:
                    cp.caught_up_ms = _now_ms()
                    break
        finally:
            cp.busy = False
        if cp.log.log_end_offset < engine.offsets(t, partition)[0]:
            self.wake()  # more to do: the next round continues (other partitions get their turn)

    async def _start_offset(self, t: "TopicState", partition: int) -> int:
        """Seed 004's policy 3: ``start.bytes`` before the log end or the log start, whichever is later."""
        from plugins.coordinator.base import FindBatchRequest

        loop = asyncio.get_running_loop()
        coordinator = self.engine.coordinator
        assert coordinator is not None
        infos = await loop.run_in_executor(self.coord_pool, coordinator.describe_logs, [t.topic_id])
        info = next((i for i in infos if i.topic_id_partition.partition == partition), None)
        if info is None:
            raise LogError(ErrorCode.unknown_topic_or_partition, f"diskless partition {t.name}-{partition} is unknown")
        lso, hwm, size = info.log_start_offset, info.high_watermark, info.byte_size
        if size <= self.start_bytes or hwm <= lso:
            return lso
        estimate = hwm - (hwm - lso) * self.start_bytes // size
        tip = self.engine.tip(t, partition)
        resp = (await loop.run_in_executor(self.coord_pool, coordinator.find_batches,
                                           [FindBatchRequest(tip, estimate, 1)], 1))[0]
        if resp.errors != 0 or not resp.batches:
            return max(lso, estimate)
        return max(resp.log_start_offset, resp.batches[0].metadata.base_offset)

    # ---- files (pool threads) ----------------------------------------------------------------
    def _dir(self, topic: str, partition: int) -> Path:
        return self.root / f"{topic}-{partition}"

    def _log_config(self, t: "TopicState") -> Any:
        """The topic's log config with local retention as its retention (-2: retention.*)."""
        b = self.broker
        cfg = b.log_config(t)
        local_ms = int(b.topic_config_value(t, "local.retention.ms"))
        local_bytes = int(b.topic_config_value(t, "local.retention.bytes"))
        return dataclasses.replace(
            cfg,
            retention_ms=cfg.retention_ms if local_ms == -2 else local_ms,
            retention_bytes=cfg.retention_bytes if local_bytes == -2 else local_bytes,
        )

    def _create(self, t: "TopicState", partition: int, start: int) -> "PartitionLog":
        from kcli.storage.log import PartitionLog, write_partition_metadata

        d = self._dir(t.name, partition)
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        write_partition_metadata(d, t.topic_id)
        lg = PartitionLog.open(d, self._log_config(t))
        if start != lg.log_end_offset:
            lg.truncate_fully_and_start_at(start)
        return lg

    def _scan(self) -> None:
        """At start: open the caches of partitions this broker still holds; delete the rest
        (and any cache that cannot be opened: it is only a cache)."""
        from kcli.storage.log import PartitionLog, read_partition_metadata

        if not self.root.is_dir():
            return
        wanted = self._wanted()
        by_dir = {self._dir(t.name, p).name: (key, t, p) for key, (t, p) in wanted.items()}
        for d in sorted(self.root.iterdir()):
            hit = by_dir.get(d.name)
            try:
                if hit is None or not d.is_dir() or read_partition_metadata(d) != hit[0][0]:
                    raise LogError(ErrorCode.unknown_topic_or_partition, "not a partition this broker holds")
                key, t, p = hit
                lg = PartitionLog.open(d, self._log_config(t))
                cp = self.parts[key] = CachedPartition(t.topic_id, t.name, p, lg)
                if lg.log_end_offset >= self.engine.offsets(t, p)[0]:
                    cp.caught_up_ms = _now_ms()
                log.info("replica cache of %s-%d: offsets %d..%d", t.name, p, lg.log_start_offset, lg.log_end_offset)
            except Exception as err:  # noqa: BLE001 - a cache: deleted, rebuilt if still wanted
                log.info("removing replica cache %s: %s", d.name, getattr(err, "message", None) or err)
                shutil.rmtree(d, ignore_errors=True) if d.is_dir() else d.unlink(missing_ok=True)

    async def _drop(self, key: tuple[uuid.UUID, int]) -> None:
        cp = self.parts.pop(key)
        cp.notify()
        self.guard.forget(key)

        def remove() -> None:
            _close_log(cp.log)
            shutil.rmtree(cp.log.dir, ignore_errors=True)

        await asyncio.get_running_loop().run_in_executor(self.pool, remove)
        log.info("replica cache of %s-%d removed", cp.topic, cp.partition)

    def _expire(self, cp: CachedPartition, t: "TopicState") -> None:
        """Local retention, and nothing below the coordinator's log start."""
        _hwm, lso = self.engine.offsets(t, cp.partition)
        lg = cp.log
        if lso > lg.log_start_offset:
            if lso >= lg.log_end_offset:
                lg.truncate_fully_and_start_at(lso)
            else:
                lg.delete_records_before(lso)
        lg.delete_retention(_now_ms())

    def config_changed(self, t: "TopicState") -> None:
        for cp in self.parts.values():
            if cp.topic_id == t.topic_id:
                cp.log.update_config(self._log_config(t))

    # ---- reads (the Fetch path) --------------------------------------------------------------
    async def read(self, t: "TopicState", partition: int, offset: int, max_bytes: int, *, min_one: bool,
                   read_committed: bool) -> DisklessReadResult | None:
        """The fetch from the local cache, or None when it does not hold ``offset`` (the caller
        reads the object store). A fetch at the end of an in-sync cache that is filling waits
        briefly for it, so a tail consumer is served locally."""
        cp = self.parts.get((t.topic_id, partition))
        if cp is None or cp.broken:
            return None
        hwm, lso = self.engine.offsets(t, partition)
        lg = cp.log
        if offset == hwm and read_committed and lg.log_end_offset == hwm and cp.stuck is None:
            # A read_committed consumer at the end: the cache knows the last stable offset when
            # every transaction it holds is closed and the coordinator said so at the last find.
            if lg.last_stable_offset == hwm and cp.stable_seen >= hwm:
                return DisklessReadResult(b"", hwm, lso, offset, hwm)
            return None
        if offset < max(lso, lg.log_start_offset) or offset >= hwm:
            return None
        if offset >= lg.log_end_offset:
            if offset > lg.log_end_offset or cp.stuck is not None or not self._locally_in_sync(cp, hwm):
                return None
            ev = cp.changed
            try:
                await asyncio.wait_for(ev.wait(), TAIL_WAIT_S)
            except asyncio.TimeoutError:
                return None
            if offset >= lg.log_end_offset or self.parts.get((t.topic_id, partition)) is not cp:
                return None
        bound = None
        if read_committed:
            bound = min(cp.stable_seen, lg.last_stable_offset)
            if offset >= bound:
                return None
        try:
            res = lg.read(offset, max_bytes, min_one_batch=min_one, upper_bound=bound)
        except OffsetOutOfRange:  # local retention moved the cache's start meanwhile
            return None
        except Exception as err:  # noqa: BLE001 - damaged or gone: rebuilt; the store serves this fetch
            log.warning("replica cache of %s-%d unreadable at offset %d, rebuilding it: %s",
                        t.name, partition, offset, getattr(err, "message", None) or err)
            cp.broken = True
            self.wake()
            return None
        if not res.records:
            return None
        self.engine.metrics.inc("diskless.replica.cache.reads")
        aborted = lg.aborted_transactions(offset, res.next_offset) if read_committed else []
        return DisklessReadResult(res.records, hwm, lso, res.next_offset,
                                  bound if bound is not None else -1, aborted)  # type: ignore[arg-type]

    # ---- ISR ---------------------------------------------------------------------------------
    def _locally_in_sync(self, cp: CachedPartition, hwm: int) -> bool:
        if cp.stuck is not None or cp.broken:
            return False
        return cp.log.log_end_offset >= hwm or _now_ms() - cp.caught_up_ms <= self.lag_max_ms

    def in_sync(self, t: "TopicState", p: "PartitionState", replica: int) -> bool:
        if not self.cacheable(t):
            return True  # not cached: every live replica reads the store directly
        hwm, lso = self.engine.offsets(t, p.partition)
        if hwm <= lso:
            return True  # an empty log: nothing to be behind on
        if replica == self.broker.node_id or self.single_broker():
            cp = self.parts.get((t.topic_id, p.partition))
            return cp is not None and self._locally_in_sync(cp, hwm)
        reported = self.remote.get(replica)
        if reported is None or _now_ms() - reported[0] > self.lag_max_ms:
            return False
        entry = reported[1].get(_report_key(t.topic_id, p.partition))
        if entry is None:
            return False
        _start, end, caught_up, stuck = entry
        return not stuck and (end >= hwm or _now_ms() - caught_up <= self.lag_max_ms)

    def ranges(self, t: "TopicState", p: "PartitionState") -> list[dict[str, Any]]:
        """Each replica's cache as this broker knows it (its own exactly, the others' from their
        last report; null offsets: no cache there yet)."""
        out = []
        for r in self.replicas_of(p):
            entry: dict[str, Any] = {"broker": r, "in_sync": self.in_sync(t, p, r), "log_start_offset": None,
                                     "log_end_offset": None, "size_bytes": None, "problem": None}
            if r == self.broker.node_id or self.single_broker():
                cp = self.parts.get((t.topic_id, p.partition))
                if cp is not None:
                    entry.update(log_start_offset=cp.log.log_start_offset, log_end_offset=cp.log.log_end_offset,
                                 size_bytes=cp.log.size_in_bytes, problem=cp.stuck)
            else:
                reported = self.remote.get(r)
                e = reported[1].get(_report_key(t.topic_id, p.partition)) if reported else None
                if e is not None:
                    entry.update(log_start_offset=e[0], log_end_offset=e[1],
                                 problem="stopped at a damaged batch" if e[3] else None)
            out.append(entry)
        return out

    async def _exchange_reports(self) -> None:
        """Cluster: publish this broker's caches, read the other brokers' (the coordinator keeps them)."""
        coordinator = self.engine.coordinator
        assert coordinator is not None
        doc = {"at": _now_ms(), "caches": {
            _report_key(cp.topic_id, cp.partition): [cp.log.log_start_offset, cp.log.log_end_offset, cp.caught_up_ms,
                                                     1 if cp.stuck else 0]
            for cp in self.parts.values()}}
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.coord_pool, coordinator.report_replica_caches, self.broker.node_id,
                                   json.dumps(doc, separators=(",", ":")))
        reports = await loop.run_in_executor(self.coord_pool, coordinator.replica_cache_reports)
        remote: dict[int, tuple[int, dict[str, list[int]]]] = {}
        for broker_id, text in reports.items():
            try:
                d = json.loads(text)
                remote[broker_id] = (int(d["at"]), dict(d["caches"]))
            except (ValueError, KeyError, TypeError):
                continue
        self.remote = remote

    def gauges(self) -> dict[str, Any]:
        return {
            "diskless.replica.cache.partitions": len(self.parts),
            "diskless.replica.cache.bytes": sum(cp.log.size_in_bytes for cp in self.parts.values()),
        }


def _report_key(topic_id: uuid.UUID, partition: int) -> str:
    return f"{topic_id.hex}:{partition}"


def _now_ms() -> int:
    return int(time.time() * 1000)


def _append_grouped(lg: "PartitionLog", data: bytes | bytearray, batches: list[Any], segment_bytes: int) -> None:
    """Append assembled batches as the leader wrote them (offsets, epochs, timestamps kept), in
    groups no larger than a segment (an append never spans segments)."""
    from kcli.storage.log import AppendOrigin

    view = memoryview(data)
    now = _now_ms()
    start = pos = 0
    for b in batches:
        size = b.metadata.byte_size
        if pos > start and pos + size - start > segment_bytes:
            lg.append(view[start:pos], now_ms=now, origin=AppendOrigin.REPLICATION)
            start = pos
        pos += size
    if pos > start:
        lg.append(view[start:pos], now_ms=now, origin=AppendOrigin.REPLICATION)


def _flush_all(logs: list["PartitionLog"]) -> None:
    for lg in logs:
        try:
            lg.flush()
        except Exception as err:  # noqa: BLE001 - a cache: recovery cuts what was not flushed
            log.debug("flushing %s: %s", lg.dir, err)


def _close_log(lg: "PartitionLog") -> None:
    try:
        lg.flush()
    finally:
        lg.close()
