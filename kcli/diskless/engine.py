"""Diskless topics inside the broker (KIP-1163): the one object the broker core talks to.

``broker.diskless`` is a :class:`DisklessEngine`. The broker and its handlers call the methods
below for every diskless partition; the work is split over small modules:

- :mod:`.appender` — Produce: one shared buffer → WAL object → upload → ordered commit;
- :mod:`.reader` — Fetch: batch coordinates → coalesced ranged GETs through an LRU cache →
  offsets patched into the batch headers;
- :mod:`.cleaner` — deletion of emptied objects after the grace period, and of orphans;
- :mod:`.compaction` — log compaction (``cleanup.policy=compact``) by rewriting WAL objects;
- :mod:`.admin_views` — what the kcli admin API (describe, objects, verify, gc) reports.

All object-store and coordinator calls run on worker threads: the event loop only moves bytes
between sockets. The engine keeps each partition's high watermark and log start offset in
memory (it is the coordinator's only writer), so offset queries and fetches at the log end
never touch the coordinator.

The plugins are opened lazily — at start when diskless data exists, else on the first diskless
topic — so brokers that never use diskless topics pay nothing but a class-name check.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Iterable

from kio.schema.errors import ErrorCode

from kcli.broker.background import ROUND, TaskGuard
from kcli.broker.extension import BrokerExtension
from kcli.diskless.appender import Appender, Committed
from kcli.diskless.cleaner import FileCleaner
from kcli.diskless.compaction import DisklessLogCleaner
from kcli.cluster.placement import diskless_leader
from kcli.diskless.rack import client_rack
from kcli.diskless.reader import CorruptBatch, DisklessReadResult, Reader
from kcli.diskless.storage_setup import (
    check_plugin_classes,
    open_coordinator,
    open_object_storage,
    probe_object_storage,
    storage_configured,
)
from kcli.protocol.errors import BrokerError
from kcli.storage.errors import LogError, OffsetOutOfRange

if TYPE_CHECKING:
    from kcli.broker.broker import Broker
    from kcli.metadata.metadata_log import PartitionState, TopicState
    from plugins.coordinator.base import BatchCoordinator, BatchInfo, TopicIdPartition
    from plugins.objectstore.base import ObjectStorage

log = logging.getLogger("kcli.diskless")

MARKER_DIR = "diskless"  # exists once diskless was used in this data dir: open at start


class DisklessEngine(BrokerExtension):
    def __init__(self, broker: "Broker") -> None:
        super().__init__(broker)
        cfg = broker.config
        self.interval_ms = cfg.get_int("diskless.append.commit.interval.ms")
        self.buffer_max_bytes = cfg.get_int("diskless.append.buffer.max.bytes")
        self.grace_ms = cfg.get_int("diskless.file.cleaner.retention.period.ms")
        self.cleaner_interval_ms = cfg.get_int("diskless.file.cleaner.interval.ms")
        self.cache_bytes = cfg.get_int("diskless.fetch.cache.max.bytes")
        self.retention_interval_ms = cfg.get_int("diskless.retention.check.interval.ms")
        # a partition whose retention fails is logged once and backed off; the others proceed
        self.retention_guard = TaskGuard("diskless-retention", broker.metrics, log)
        # the offsets safety net retries within seconds: a broker that missed other brokers'
        # offsets while the cluster store was down serves their records only once it has re-read
        self.refresh_guard = TaskGuard("diskless-offsets-refresh", broker.metrics, log, max_s=5.0)
        self._refresh_wanted: asyncio.Event | None = None
        self.metrics = broker.metrics
        self.storage: "ObjectStorage | None" = None
        self.coordinator: "BatchCoordinator | None" = None
        self.appender: Appender | None = None
        self.reader: Reader | None = None
        self.cleaner: FileCleaner | None = None
        self.log_cleaner = DisklessLogCleaner(self)
        self.replica_cache: Any = None  # kcli/diskless/replica_cache.py: local segments of this broker's replicas
        self.tiering: Any = None  # kcli/diskless/tiering.py: WAL data moved to the remote tier (with remote storage)
        self.io_pool: ThreadPoolExecutor | None = None
        self.coordinator_pool: ThreadPoolExecutor | None = None
        self._tips: dict[tuple[uuid.UUID, int], "TopicIdPartition"] = {}
        self._offsets: dict[tuple[uuid.UUID, int], list[int]] = {}  # [high watermark, log start]
        # LogAppendTime?, max.message.bytes, cleanup.policy includes compact?
        self._settings: dict[uuid.UUID, tuple[bool, int, bool]] = {}
        self._loops: list[asyncio.Task[None]] = []
        self._jobs: set[asyncio.Future[Any]] = set()
        self._probe: "asyncio.Future[Any] | None" = None  # background re-probe of a failing store
        self._prefix_claim: Any = None  # kcli.diskless.identity.PrefixClaim once open

    # ==========================================================================================
    # lifecycle
    # ==========================================================================================

    @property
    def is_open(self) -> bool:
        return self.coordinator is not None

    async def start(self) -> None:
        check_plugin_classes(self.broker.config)  # a bad class name stops the broker with one line
        used_before = (self.broker.data_dir / MARKER_DIR).exists()
        if used_before or any(self.broker.is_diskless(t) for t in self.broker.state.topics.values()):
            self._open(used_before=used_before)
            await self._reconcile()
        elif storage_configured(self.broker.config):
            # A missing bucket or unwritable store is reported now (one line), not at first use.
            probe_object_storage(self.broker.config, self.broker.data_dir)
            # A prefix another cluster owns is refused now too (kcli/diskless/identity.py).
            from kcli.diskless.identity import claim_prefix_at_start

            claim_prefix_at_start(self.broker.config, self.broker.data_dir, self.broker.cluster_id)

    def _open(self, used_before: bool | None = None) -> None:
        """Open storage and coordinator, load offsets, start the background tasks (idempotent).
        ``used_before``: opened by start() (diskless was opened in this data dir before?); None
        for the lazy open of the first diskless topic."""
        if self.coordinator is not None:
            return
        b = self.broker
        storage = open_object_storage(b.config, b.data_dir)
        try:
            storage.probe()  # write/read/delete a small object: a store we cannot use stops here
            coordinator = open_coordinator(b.config, b.data_dir)
        except BaseException:
            storage.close()
            raise
        try:
            logs = coordinator.describe_logs()
            self._check_identity(storage, coordinator, logs, used_before)
            (b.data_dir / MARKER_DIR).mkdir(parents=True, exist_ok=True)
        except BaseException:
            coordinator.close()
            storage.close()
            raise
        self.io_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="kcli-diskless-io")
        self.coordinator_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kcli-diskless-coord")
        self.storage, self.coordinator = storage, coordinator
        self.appender = Appender(
            storage=storage, coordinator=coordinator, io_pool=self.io_pool,
            coordinator_pool=self.coordinator_pool, metrics=self.metrics, broker_id=b.node_id,
            interval_ms=self.interval_ms, max_bytes=self.buffer_max_bytes,
            on_committed=self._on_committed, delete_uncommitted=self._delete_uncommitted,
        )
        self.reader = Reader(storage=storage, io_pool=self.io_pool, metrics=self.metrics, cache_bytes=self.cache_bytes)
        if b.config.get_bool("diskless.replica.cache.enable"):
            from kcli.diskless.replica_cache import ReplicaCache

            self.replica_cache = ReplicaCache(self)
        if b.config.get_bool("remote.log.storage.system.enable"):
            from kcli.diskless.tiering import DisklessTiering

            self.tiering = DisklessTiering(self)
        self.cleaner = FileCleaner(
            storage=storage, coordinator=coordinator, io_pool=self.io_pool,
            coordinator_pool=self.coordinator_pool, metrics=self.metrics, grace_ms=self.grace_ms,
            in_flight_keys=self.in_flight_keys,
            on_deleted=self._on_objects_deleted, prefix_check=self._prefix_claim.ensure,
        )
        for info in logs:
            tip = info.topic_id_partition
            self._offsets[(tip.topic_id, tip.partition)] = [info.high_watermark, info.log_start_offset]
        log.info("diskless storage %s, coordinator %s", storage.describe(), type(coordinator).__name__)
        self.broker.metadata.set_offsets_listener(self._offsets_published, on_gap=self._offsets_gap)
        self._start_loops()

    def _check_identity(self, storage: "ObjectStorage", coordinator: "BatchCoordinator", logs: list[Any],
                        used_before: bool | None) -> None:
        """Refuse a store prefix or coordinator of another cluster, or a coordinator that lost
        its state, before anything is served or collected (kcli/diskless/identity.py)."""
        from kcli.diskless.identity import PrefixClaim, check_coordinator, claim_prefix, read_prefix_owner, retrying

        b = self.broker
        self._prefix_claim = PrefixClaim(storage, b.cluster_id)
        where = f"reading the owner of object store {storage.describe()}"
        read, owner = retrying(lambda: read_prefix_owner(storage), where)
        if owner is not None and owner != b.cluster_id:
            claim_prefix(storage, b.cluster_id, owner)  # raises: the prefix is another cluster's
        unknown: list[str] = []
        if used_before is not None:  # at start: every live diskless partition must be known
            have = {(i.topic_id_partition.topic_id, i.topic_id_partition.partition) for i in logs}
            for t in b.state.topics.values():
                if b.is_diskless(t):
                    unknown += [f"{t.name}-{p}" for p in sorted(self._live_partitions(t)) if (t.topic_id, p) not in have]
        check_coordinator(coordinator, b.cluster_id, unknown, used_before=bool(used_before), prefix_owner=owner)
        if read:
            retrying(self._prefix_claim.ensure, f"claiming object store {storage.describe()}")

    def in_flight_keys(self) -> set[str]:
        """Objects being uploaded or committed by this broker (produce, compaction): not orphans."""
        keys = set(self.log_cleaner.in_flight_keys)
        return keys | self.appender.in_flight_keys if self.appender is not None else keys

    def _ensure_open(self) -> None:
        if self.coordinator is not None:
            return
        try:
            self._open()
        except BrokerError:
            raise
        except Exception as err:
            raise BrokerError(ErrorCode.kafka_storage_error, f"diskless storage is unavailable: {err}") from None

    def check_writable(self) -> None:
        """Called before the metadata records of a diskless CreateTopics/CreatePartitions are
        written: while the object store fails writes, refuse with KAFKA_STORAGE_ERROR (leaving
        no topic whose producers would only hang) and re-probe it in the background, so the
        next attempt succeeds once the store recovers."""
        self._ensure_open()  # the first open probes the store
        assert self.storage is not None
        failure = self.storage.write_failure()
        if failure is None:
            return
        if self._probe is None or self._probe.done():
            self._probe = self._background(self.io_pool, self.storage.probe, what="re-probing the object store")
        raise BrokerError(ErrorCode.kafka_storage_error,
                          f"object store {self.storage.describe()} cannot be written ({failure}); retry later")

    def _start_loops(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # opened outside the event loop: start() will not be late for it
            return
        assert self.cleaner is not None
        orphan_interval = max(self.cleaner_interval_ms, self.grace_ms // 2)
        self._loops.append(loop.create_task(
            self.cleaner.run_forever(self.cleaner_interval_ms, orphan_interval, active=self.broker.metadata.is_controller),
            name="diskless-file-cleaner"))
        self._loops.append(loop.create_task(self._retention_forever(), name="diskless-retention"))
        self._refresh_wanted = asyncio.Event()
        self._loops.append(loop.create_task(self._refresh_offsets_forever(), name="diskless-offsets-refresh"))
        if self.log_cleaner.enabled:
            self._loops.append(loop.create_task(self.log_cleaner.run_forever(), name="diskless-log-cleaner"))
        if self.replica_cache is not None:
            self.replica_cache.start(loop)
        if self.tiering is not None:
            self.tiering.start(loop)

    async def close(self) -> None:
        if self.coordinator is None:
            return
        if self.appender is not None:
            await self.appender.close()
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops.clear()
        if self.replica_cache is not None:
            await self.replica_cache.close()
        if self.tiering is not None:
            await self.tiering.close()
        if self._jobs:
            await asyncio.wait(list(self._jobs), timeout=30)
        for pool in (self.io_pool, self.coordinator_pool):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        try:
            self.coordinator.close()
        finally:
            if self.storage is not None:
                self.storage.close()
        self.coordinator = None

    async def _reconcile(self) -> None:
        """Bring the coordinator in line with the metadata log after a crash between the two:
        logs of deleted topics or removed partitions go, missing logs of live ones are made."""
        from plugins.coordinator.base import CreateTopicAndPartitionsRequest

        assert self.coordinator is not None
        by_id = {t.topic_id: t for t in self.broker.state.topics.values() if self.broker.is_diskless(t)}
        have: dict[uuid.UUID, set[int]] = {}
        for tid, p in self._offsets:
            have.setdefault(tid, set()).add(p)
        gone_topics = [tid for tid in have if tid not in by_id]
        if gone_topics:
            log.info("removing coordinator state of %d deleted diskless topic(s)", len(gone_topics))
            await self._coord(self.coordinator.delete_topics, gone_topics)
            for tid in gone_topics:
                self._forget(tid, have[tid])
        creates = []
        for tid, t in by_id.items():
            live = self._live_partitions(t)
            extra = have.get(tid, set()) - live
            if extra:
                await self._coord(self.coordinator.delete_partitions, tid, extra)
                self._forget(tid, extra)
            if live - have.get(tid, set()):
                creates.append(CreateTopicAndPartitionsRequest(tid, t.name, max(live) + 1))
                for p in live:
                    self._offsets.setdefault((tid, p), [0, 0])
        if creates:
            await self._coord(self.coordinator.create_topic_and_partitions, creates)

    @staticmethod
    def _live_partitions(t: "TopicState") -> set[int]:
        from kcli.metadata.metadata_log import MODE_NONE

        return {p for p, st in t.partitions.items() if st.mode != MODE_NONE}

    # ==========================================================================================
    # helpers
    # ==========================================================================================

    async def _coord(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.coordinator_pool, fn, *args)

    def _background(self, pool: ThreadPoolExecutor | None, fn: Callable[..., Any], *args: Any,
                    what: str) -> "asyncio.Future[Any] | None":
        """Run a hook's slow part off the loop; close() waits for it. The future may be awaited
        (a caller that needs the work done first) or dropped (failures are logged)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            try:
                fn(*args)
            except Exception:  # noqa: BLE001
                log.exception("%s failed", what)
            return None
        fut = loop.run_in_executor(pool, fn, *args)
        self._jobs.add(fut)

        def done(f: asyncio.Future[Any]) -> None:
            self._jobs.discard(f)
            if not f.cancelled() and f.exception() is not None:
                log.error("%s failed: %s", what, f.exception())

        fut.add_done_callback(done)
        return fut

    def tip(self, t: "TopicState", partition: int) -> "TopicIdPartition":
        """One TopicIdPartition object per partition (the coordinator caches by identity)."""
        key = (t.topic_id, partition)
        tip = self._tips.get(key)
        if tip is None:
            from plugins.coordinator.base import TopicIdPartition

            tip = self._tips[key] = TopicIdPartition(t.topic_id, t.name, partition)
        return tip

    def _topic_settings(self, t: "TopicState") -> tuple[bool, int, bool]:
        s = self._settings.get(t.topic_id)
        if s is None:
            b = self.broker
            s = self._settings[t.topic_id] = (
                b.topic_config_value(t, "message.timestamp.type") == "LogAppendTime",
                int(b.topic_config_value(t, "max.message.bytes")),
                b.log_config(t).compact,
            )
        return s

    def _forget(self, topic_id: uuid.UUID, partitions: set[int] | None = None) -> None:
        for key in [k for k in self._offsets if k[0] == topic_id and (partitions is None or k[1] in partitions)]:
            self._offsets.pop(key, None)
        for key in [k for k in self._tips if k[0] == topic_id and (partitions is None or k[1] in partitions)]:
            self._tips.pop(key, None)
        if partitions is None:
            self._settings.pop(topic_id, None)

    def _on_committed(self, c: Committed) -> None:
        if self.reader is not None:
            for offset, data in c.batches:
                self.reader.cache.put(c.object_key, offset, data)
        notify = self.broker.notifier.notify
        for tip, (hwm, lso) in c.partitions.items():
            o = self._offsets.get((tip.topic_id, tip.partition))
            if o is None:
                o = self._offsets[(tip.topic_id, tip.partition)] = [0, 0]
            o[0] = max(o[0], hwm)
            o[1] = max(o[1], lso)
            notify(tip.topic, tip.partition)
        if self.replica_cache is not None:
            self.replica_cache.wake()
        # other brokers of a cluster serve these partitions too: their fetches at the log end wake
        self.broker.metadata.publish_offsets([(tip.topic_id, tip.partition, hwm, lso)
                                              for tip, (hwm, lso) in c.partitions.items()])

    def _offsets_published(self, changes: list[tuple[uuid.UUID, int, int, int]]) -> None:
        """Offsets another broker committed; only ever moving forward, as every offset update."""
        for tid, partition, hwm, lso in changes:
            o = self._offsets.get((tid, partition))
            if o is None:
                continue  # a partition this broker has not learned yet: it reads the coordinator
            if hwm > o[0] or lso > o[1]:
                o[0], o[1] = max(o[0], hwm), max(o[1], lso)
                t = self.broker.state.topic_by_id(tid)
                if t is not None:
                    self.broker.notifier.notify(t.name, partition)
                if self.replica_cache is not None:
                    self.replica_cache.wake()

    def _on_objects_deleted(self, keys: list[str]) -> None:
        if self.reader is not None:
            for k in keys:
                self.reader.cache.drop(k)

    def _delete_uncommitted(self, key: str) -> None:
        if self.storage is not None:
            self._background(self.io_pool, self.storage.delete, [key], what=f"deleting uncommitted object {key}")

    def _set_log_start(self, t: "TopicState", partition: int, lso: int) -> None:
        o = self._offsets.get((t.topic_id, partition))
        if o is not None and lso > o[1]:
            o[1] = lso
            self.broker.metadata.publish_offsets([(t.topic_id, partition, o[0], lso)])

    # ==========================================================================================
    # broker hooks
    # ==========================================================================================

    def create_partitions(self, t: "TopicState", partitions: range) -> None:
        from plugins.coordinator.base import CreateTopicAndPartitionsRequest

        if not len(partitions):
            return
        self._ensure_open()
        assert self.coordinator is not None
        try:
            self.coordinator.create_topic_and_partitions(
                [CreateTopicAndPartitionsRequest(t.topic_id, t.name, max(partitions) + 1)])
        except Exception as err:
            raise BrokerError(ErrorCode.kafka_storage_error, f"cannot create diskless partitions of {t.name}: {err}") from None
        for p in partitions:
            self._offsets.setdefault((t.topic_id, p), [0, 0])

    def topic_deleted(self, t: "TopicState") -> None:
        if not self.broker.is_diskless(t):
            return
        partitions = [k[1] for k in self._offsets if k[0] == t.topic_id]
        self._forget(t.topic_id)
        for p in partitions:
            self.broker.notifier.notify(t.name, p)
        if self.coordinator is not None:
            self._background(self.coordinator_pool, self.coordinator.delete_topics, [t.topic_id],
                             what=f"deleting diskless topic {t.name}")

    def partitions_deleted(self, t: "TopicState", partitions: Iterable[int]) -> "asyncio.Future[Any] | None":
        """KIP-694 shrink: the removed partitions' batches go; emptied objects are then collected
        like any other. Returns an awaitable that completes when the coordinator has dropped them."""
        parts = set(partitions)
        if not self.broker.is_diskless(t) or not parts:
            return None
        self._forget(t.topic_id, parts)
        for p in parts:
            self.broker.notifier.notify(t.name, p)
        if self.tiering is not None:  # their remote segments go too
            self.tiering.partitions_deleted(t, parts)
        if self.coordinator is None:
            return None
        return self._background(self.coordinator_pool, self.coordinator.delete_partitions, t.topic_id, parts,
                                what=f"deleting diskless partitions {sorted(parts)} of {t.name}")

    def partition_size_bytes(self, t: "TopicState", partition: int) -> int:
        """Bytes of live batches of one partition (KIP-694 plans show what a shrink deletes)."""
        if self.coordinator is None:
            return 0
        for info in self.coordinator.describe_logs([t.topic_id]):
            if info.topic_id_partition.partition == partition:
                return info.byte_size
        return 0

    def config_changed(self, topic: "TopicState", old: dict[str, str], new: dict[str, str]) -> None:
        self._settings.pop(topic.topic_id, None)
        if self.replica_cache is not None:
            self.replica_cache.config_changed(topic)

    def topic_state(self, topic: "TopicState") -> dict[str, str]:
        """The dirty ratio of a compacted diskless topic's partitions (as the classic log cleaner
        reports it: ``kcli.cleaner.dirty.ratio``, shown by ``kcli topics describe``)."""
        from kcli.broker.log_cleaner import DIRTY_RATIO_STATE_KEY

        if self.coordinator is None or not self.broker.is_diskless(topic) or not self.broker.log_config(topic).compact:
            return {}
        try:
            ratios = self.log_cleaner.dirty_ratios(topic)
        except Exception as err:  # noqa: BLE001 - a describe never fails for it
            log.debug("dirty ratio of %s: %s", topic.name, err)
            return {}
        return {DIRTY_RATIO_STATE_KEY: ",".join(f"{p}:{r:.4f}" for p, r in ratios.items())} if ratios else {}

    # ==========================================================================================
    # produce / fetch / offsets
    # ==========================================================================================

    def append(self, t: "TopicState", partition: int, records: bytes) -> "asyncio.Future[dict[str, Any]]":
        try:
            self._ensure_open()
        except BrokerError as err:
            fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            fut.set_exception(err)
            return fut
        assert self.appender is not None
        log_append, max_message, compacted = self._topic_settings(t)
        return self.appender.append(self.tip(t, partition), partition, records, log_append_time=log_append,
                                    max_message_bytes=max_message, compacted=compacted)

    def append_marker(self, t: "TopicState", partition: int, batch: bytes) -> "asyncio.Future[dict[str, Any]]":
        """A transaction marker (COMMIT/ABORT control batch) through the same WAL object path as
        produce: the coordinator commits it like any batch and ends the producer's transaction."""
        self._ensure_open()
        assert self.appender is not None
        log_append, max_message, _compacted = self._topic_settings(t)
        return self.appender.append(self.tip(t, partition), partition, batch, log_append_time=log_append,
                                    max_message_bytes=max(max_message, len(batch)), marker=True)

    async def last_stable_offset(self, t: "TopicState", partition: int) -> int:
        """ListOffsets latest for read_committed: the first offset of the earliest open transaction."""
        from plugins.coordinator.base import ListOffsetsRequest

        self._ensure_open()
        assert self.coordinator is not None
        tip = self.tip(t, partition)
        resp = (await self._coord(self.coordinator.list_offsets, [
            ListOffsetsRequest(tip, ListOffsetsRequest.LATEST_TIMESTAMP, read_committed=True)]))[0]
        if resp.errors != 0:
            raise LogError(resp.errors, f"diskless partition {tip}")
        return resp.offset

    async def describe_producers(self, t: "TopicState", partition: int) -> list[Any]:
        """The partition's producers as the coordinator keeps them (DescribeProducers)."""
        self._ensure_open()
        assert self.coordinator is not None
        tip = self.tip(t, partition)
        producers = await self._coord(self.coordinator.describe_producers, tip)
        if producers is None:
            raise LogError(ErrorCode.unknown_topic_or_partition, f"diskless partition {tip} is unknown")
        return producers

    def offsets(self, t: "TopicState", partition: int) -> tuple[int, int]:
        o = self._offsets.get((t.topic_id, partition))
        return (o[0], o[1]) if o is not None else (-1, -1)

    async def read(self, t: "TopicState", partition: int, offset: int, max_bytes: int, *,
                   min_one: bool, read_committed: bool = False) -> DisklessReadResult:
        """``read_committed``: only up to the last stable offset, with the aborted transactions
        of the range (the coordinator's, seed 004)."""
        from plugins.coordinator.base import FindBatchRequest

        self._ensure_open()
        assert self.coordinator is not None and self.reader is not None
        self.metrics.inc("diskless.fetch.partition.reads")  # every source: log end, local cache, object store
        o = self._offsets.get((t.topic_id, partition))
        if o is not None and offset < o[1] and self.tiering is not None and self.tiering.remote_segments(t, partition):
            # below the coordinator's log start: the remote tier (kcli/diskless/tiering.py)
            return await self.tiering.read(t, partition, offset, max_bytes, min_one=min_one,
                                           read_committed=read_committed)
        if o is not None and offset == o[0] and offset >= o[1] and not read_committed:
            # At the log end: nothing to look up. (A read_committed fetch always asks: an open
            # transaction may keep the last stable offset below the high watermark.)
            return DisklessReadResult(b"", o[0], o[1], offset)
        if self.replica_cache is not None:  # seed 004 "Consume path": local segments when they hold it
            cached = await self.replica_cache.read(t, partition, offset, max_bytes, min_one=min_one,
                                                   read_committed=read_committed)
            if cached is not None:
                return cached
        started = time.monotonic()
        tip = self.tip(t, partition)
        limit = max(0, max_bytes)
        resp = (await self._coord(self.coordinator.find_batches,
                                  [FindBatchRequest(tip, offset, limit, read_committed)], limit))[0]
        self.metrics.observe("diskless.find.latency_ms", (time.monotonic() - started) * 1000)  # the coordinator's part
        if resp.errors == ErrorCode.offset_out_of_range:
            raise OffsetOutOfRange(offset, log_start_offset=resp.log_start_offset,
                                   local_log_start_offset=resp.log_start_offset,
                                   log_end_offset=resp.high_watermark)
        if resp.errors != 0:
            raise LogError(resp.errors, f"diskless partition {tip}")
        if o is not None:
            o[0] = max(o[0], resp.high_watermark)
        batches = resp.batches
        if batches and not min_one and batches[0].metadata.byte_size > limit:
            batches = []
        self.metrics.inc("diskless.read.count")
        if not batches:
            return DisklessReadResult(b"", resp.high_watermark, resp.log_start_offset, offset, resp.last_stable_offset)
        self.reader.track_fetch()
        p = t.partitions.get(partition)
        try:
            data = await self.reader.assemble(batches, p.leader_epoch if p is not None else 0)
        except CorruptBatch as err:
            if not err.served:  # the read starts at the damaged batch: CORRUPT_MESSAGE
                raise
            # Serve the intact batches before it; the next fetch, from the damaged batch, reports it.
            data, batches = err.intact, batches[: err.served]
        self.metrics.inc("diskless.read.bytes", len(data))
        self.metrics.observe("diskless.read.latency_ms", (time.monotonic() - started) * 1000)
        return DisklessReadResult(data, resp.high_watermark, resp.log_start_offset, batches[-1].metadata.last_offset + 1,
                                  resp.last_stable_offset, resp.aborted_transactions)

    async def list_offset(self, t: "TopicState", partition: int, timestamp: int) -> tuple[int, int]:
        """ListOffsets: -1 latest, -2 earliest (the remote tier's start when it holds data), -4
        earliest local (the coordinator's log start), -5 latest tiered (none: -1), -3 max
        timestamp (of the WAL data), else the first record whose timestamp is at least
        ``timestamp`` (refined inside the batch, as Kafka does; the remote tier first)."""
        from plugins.coordinator.base import ListOffsetsRequest

        self._ensure_open()
        assert self.coordinator is not None
        hwm, lso = self.offsets(t, partition)
        if hwm < 0:
            raise LogError(ErrorCode.unknown_topic_or_partition, f"diskless partition {t.name}-{partition} is unknown")
        if timestamp == -1:
            return hwm, -1
        if timestamp == -2:
            return (self.tiering.log_start_offset(t, partition, lso) if self.tiering is not None else lso), -1
        if timestamp == -4:
            return lso, -1
        if timestamp == -5:
            return (self.tiering.latest_tiered_offset(t, partition) if self.tiering is not None else -1), -1
        if timestamp < 0 and timestamp != -3:
            raise LogError(ErrorCode.invalid_request, f"unsupported ListOffsets timestamp {timestamp}")
        if timestamp >= 0 and self.tiering is not None and self.tiering.remote_segments(t, partition):
            found = await self.tiering.offset_for_timestamp(t, partition, timestamp)
            if found is not None:
                return found
        tip = self.tip(t, partition)
        resp = (await self._coord(self.coordinator.list_offsets, [ListOffsetsRequest(tip, timestamp)]))[0]
        if resp.errors != 0:
            raise LogError(resp.errors, f"diskless partition {tip}")
        if resp.offset < 0:
            return -1, -1
        return await self._refine(t, partition, resp.offset, resp.timestamp, timestamp)

    async def _refine(self, t: "TopicState", partition: int, offset: int, batch_ts: int, wanted: int) -> tuple[int, int]:
        """The exact record inside the batch the coordinator found (it indexes batches only)."""
        from kcli.storage.segment import iter_record_timestamps
        from plugins.coordinator.base import FindBatchRequest

        assert self.coordinator is not None and self.reader is not None
        tip = self.tip(t, partition)
        resp = (await self._coord(self.coordinator.find_batches, [FindBatchRequest(tip, offset, 1)], 1))[0]
        if resp.errors != 0 or not resp.batches:
            return offset, batch_ts
        batch: "BatchInfo" = resp.batches[0]
        data = await self.reader.assemble([batch], 0)
        lso = resp.log_start_offset
        for rec_offset, rec_ts in iter_record_timestamps(bytes(data)):
            if rec_offset < lso:
                continue
            if (wanted == -3 and rec_ts == batch_ts) or (wanted >= 0 and rec_ts >= wanted):
                return rec_offset, rec_ts
        return offset, batch_ts

    async def delete_records(self, t: "TopicState", partition: int, offset: int) -> int:
        """DeleteRecords: the coordinator's log start moves; with remote segments, the tiering
        deletes those below the new start too (kcli/diskless/tiering.py)."""
        self._ensure_open()
        if self.tiering is not None and self.tiering.remote_segments(t, partition):
            return await self.tiering.delete_records(t, partition, offset)
        return await self.coordinator_delete_records(t, partition, offset)

    async def coordinator_delete_records(self, t: "TopicState", partition: int, offset: int) -> int:
        """Move the coordinator's log start (its batches below go; emptied objects are collected)."""
        from plugins.coordinator.base import DeleteRecordsRequest

        self._ensure_open()
        assert self.coordinator is not None
        resp = (await self._coord(self.coordinator.delete_records, [DeleteRecordsRequest(self.tip(t, partition), offset)]))[0]
        if resp.errors == ErrorCode.offset_out_of_range:
            hwm, _ = self.offsets(t, partition)
            raise BrokerError(ErrorCode.offset_out_of_range,
                              f"Cannot increment the log start offset to {offset} of partition {t.name}-{partition}"
                              f" since it is larger than the high watermark {hwm}")
        if resp.errors != 0:
            raise BrokerError(resp.errors, f"diskless partition {t.name}-{partition}")
        self._set_log_start(t, partition, resp.low_watermark)
        return resp.low_watermark

    def leader_for_client(self, t: "TopicState", client_id: str | None, p: "PartitionState") -> int:
        """Metadata leader for a diskless partition: any live broker serves it, so a broker in
        the client's rack if it asks, else one spread over the live brokers."""
        return diskless_leader(t.topic_id, p.partition, p.replicas, self.broker.live_brokers(), client_rack(client_id))

    def leader_in_rack(self, t: "TopicState", rack: str, p: "PartitionState") -> int:
        """A live broker of ``rack`` for this partition (Fetch's preferred read replica), or -1:
        an in-sync replica there first, else an out-of-sync one (seed 004 "Consume path": not
        excluded, only deprioritized), else any broker there."""
        in_rack = [b for b in self.broker.live_brokers() if b.rack == rack]
        if not in_rack:
            return -1
        replicas = [r for r in p.replicas if any(b.node_id == r for b in in_rack)]
        if replicas and self.replica_cache is not None:
            isr = set(self.isr(t, p))
            replicas = [r for r in replicas if r in isr] or replicas
        return diskless_leader(t.topic_id, p.partition, replicas or p.replicas, in_rack, rack)

    def isr(self, t: "TopicState", p: "PartitionState") -> list[int]:
        """The live replicas in sync with the batch coordinator (seed 004 "Replicas"): their
        local cache reached its high watermark within replica.lag.time.max.ms. Without the cache
        (diskless.replica.cache.enable=false) every live replica reads the store and is in sync."""
        live = {b.node_id for b in self.broker.live_brokers()}
        replicas = [r for r in p.replicas if r in live]
        if self.replica_cache is None:
            return replicas
        return [r for r in replicas if self.replica_cache.in_sync(t, p, r)]

    def cache_ranges(self, t: "TopicState", p: "PartitionState") -> list[dict[str, Any]]:
        """Per replica: its local cache range and whether it is in sync (kcli diskless describe)."""
        return self.replica_cache.ranges(t, p) if self.replica_cache is not None else []

    # ==========================================================================================
    # retention
    # ==========================================================================================

    async def _retention_forever(self) -> None:
        while True:
            await asyncio.sleep(self.retention_interval_ms / 1000)
            # the coordinator down is a whole-round failure: logged once per streak, backed off
            await self.retention_guard.round(self._retention_round, "retention round")

    async def _retention_round(self) -> None:
        if self.broker.metadata.is_controller():  # one broker of a cluster applies retention
            await self.enforce_retention()

    def _offsets_gap(self) -> None:
        """Offsets other brokers published may have been missed: re-read them now."""
        if self._refresh_wanted is not None:
            self._refresh_wanted.set()

    async def _refresh_offsets_forever(self) -> None:
        """The periodic re-read (every diskless.retention.check.interval.ms), at once after a gap;
        a failed re-read is retried with a back-off capped at 5 s until it succeeds."""
        assert self._refresh_wanted is not None
        while True:
            try:
                await asyncio.wait_for(self._refresh_wanted.wait(), self.retention_interval_ms / 1000)
            except asyncio.TimeoutError:
                pass
            self._refresh_wanted.clear()
            await self.refresh_guard.round(self._refresh_offsets, "offsets refresh")
            while self.refresh_guard.failing(ROUND):
                await asyncio.sleep(self.refresh_guard.retry_in(ROUND))
                await self.refresh_guard.round(self._refresh_offsets, "offsets refresh")

    async def _refresh_offsets(self) -> None:
        """Re-read offsets from the coordinator (only ever moving them forward): the in-memory
        copy is kept exact by every commit, this is a safety net, not the mechanism."""
        assert self.coordinator is not None
        for info in await self._coord(self.coordinator.describe_logs):
            tip = info.topic_id_partition
            o = self._offsets.get((tip.topic_id, tip.partition))
            if o is not None:
                o[0] = max(o[0], info.high_watermark)
                o[1] = max(o[1], info.log_start_offset)

    async def enforce_retention(self, now_ms: int | None = None) -> int:
        """retention.ms / retention.bytes of every diskless partition; returns batches deleted.

        One coordinator call for all partitions (as Inkless does); a partition it answers with an
        error code is counted and backed off by ``retention_guard`` while the others proceed."""
        from kcli.protocol.errors import error_name
        from plugins.coordinator.base import RetentionRequest

        if self.coordinator is None:
            return 0
        b = self.broker
        guard = self.retention_guard
        requests = []
        topics: dict[uuid.UUID, "TopicState"] = {}
        for t in list(b.state.topics.values()):
            if not b.is_diskless(t):
                continue
            if self.tiering is not None and self.tiering.copies(t):
                continue  # its WAL goes once in the remote tier, retention spans both (kcli/diskless/tiering.py)
            topics[t.topic_id] = t
            retention_ms = int(b.topic_config_value(t, "retention.ms"))
            retention_bytes = int(b.topic_config_value(t, "retention.bytes"))
            if retention_ms < 0 and retention_bytes < 0:
                continue
            for p in self._live_partitions(t):
                if guard.ready((t.topic_id, p)):
                    requests.append(RetentionRequest(self.tip(t, p), retention_ms, retention_bytes))
        if not requests:
            return 0
        now = int(time.time() * 1000) if now_ms is None else now_ms
        results = await self._coord(self.coordinator.enforce_retention, requests, now)
        deleted = 0
        for r in results:
            tid, p = r.topic_id_partition.topic_id, r.topic_id_partition.partition
            t = topics.get(tid)
            label = f"{t.name if t is not None else tid}-{p}"
            if r.errors != 0:
                guard.failed((tid, p), label, f"the coordinator answered {error_name(r.errors)}")
                continue
            if t is not None:
                guard.step_sync((tid, p), label, lambda t=t, p=p, lso=r.log_start_offset: self._set_log_start(t, p, lso))
            deleted += r.deleted_batches
        if deleted:
            self.metrics.inc("diskless.retention.deleted_batches", deleted)
        return deleted

    # ==========================================================================================
    # observability
    # ==========================================================================================

    def gauges(self) -> dict[str, Any]:
        """Point-in-time values for `kcli broker metrics` (counters live in broker.metrics)."""
        if self.coordinator is None:
            return {"diskless.open": False}
        assert self.appender is not None and self.reader is not None and self.storage is not None
        return {
            "diskless.open": True,
            "diskless.storage": self.storage.describe(),
            "diskless.buffer.bytes": self.appender.buffered_bytes,
            "diskless.objects.in_flight": self.appender.objects_in_flight,
            "diskless.cache.bytes": self.reader.cache.size,
            "diskless.cache.entries": len(self.reader.cache),
            "diskless.cache.max.bytes": self.reader.cache.max_bytes,
            **(self.replica_cache.gauges() if self.replica_cache is not None else {}),
        }
