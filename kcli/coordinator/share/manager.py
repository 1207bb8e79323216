"""The broker's share-group side (Kafka's SharePartitionManager plus the share half of the group
coordinator), attached to the broker as ``broker.share``.

* ``groups`` (kcli/coordinator/share/group.py): membership and assignment of the share groups
  this broker coordinates (ShareGroupHeartbeat / ShareGroupDescribe), beside the classic and
  consumer groups of the GroupCoordinator, routed the same way.
* ``partitions``: the share partitions this broker leads (one per group and topic-partition,
  kcli/coordinator/share/share_partition.py), loaded from the persister on first use. The
  share-partition leader is the partition's leader: the log's host for a classic or tiered
  partition; for a diskless one the broker Metadata names to a client without a rack (seed 004
  "Queues": ShareFetch is served by the partition leader only).
* ``sessions`` (kcli/coordinator/share/session.py): the share sessions of ShareFetch /
  ShareAcknowledge.

A sweep every 100 ms expires acquisition locks (records become available again, or archived at
the delivery limit) and wakes the ShareFetches parked on those partitions through the broker's
append notifier. Records a member holds are released at once when it leaves the group, is
fenced, closes its share session or its connection closes (Kafka's ShareGroupListener).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any, Iterable

from kio.schema.errors import ErrorCode

from kcli.coordinator.group.offsets import OffsetStoreError
from kcli.coordinator.share.group import SHARE_PROTOCOL_TYPE, ShareGroupListener, ShareGroupManager
from kcli.coordinator.share.persister import SharePersister
from kcli.coordinator.share.session import ShareSession, ShareSessionCache
from kcli.coordinator.share.share_partition import (ACKNOWLEDGED, ARCHIVED, Batch, SharePartition, now_ms,
                                                    split_batches)

log = logging.getLogger("kcli.coordinator.share")

_DEFAULTS = {
    "group.share.session.timeout.ms": 45000,
    "group.share.heartbeat.interval.ms": 5000,
    "group.share.record.lock.duration.ms": 30000,
    "group.share.delivery.count.limit": 5,
    "group.share.partition.max.record.locks": 2000,
    "group.share.max.size": 200,
    "group.share.max.share.sessions": 2000,
}
SWEEP_S = 0.1
READ_MAX_BYTES = 1024 * 1024  # one read of a share fetch (the first batch may exceed it)
AUTO_OFFSET_RESET = "share.auto.offset.reset"  # Kafka's group config; latest by default
LOCK_DURATION = "share.record.lock.duration.ms"  # Kafka's group config; the broker's by default


class _Slot:
    """Ordering of one share partition's writes: each write stores the newest snapshot, so a
    caller whose change a later write already stored does not wait for another."""

    __slots__ = ("lock", "version", "stored")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.version = 0
        self.stored = 0


class ShareCoordinator(ShareGroupListener):
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.coord = broker.groups
        self.groups = ShareGroupManager(self.coord._call_later, self.cfg, self)
        self.sessions = ShareSessionCache(self.cfg("group.share.max.share.sessions"))
        self.partitions: dict[tuple[str, str, int], SharePartition] = {}
        self._slots: dict[tuple[str, str, int], _Slot] = {}
        self._loading: dict[tuple[str, str, int], asyncio.Task[SharePartition]] = {}
        self.persister = SharePersister(self.coord.store)
        self.group_configs: dict[str, dict[str, str]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.active = False

    def cfg(self, name: str) -> int:
        try:
            return int(self.broker.config.get_int(name))
        except Exception:  # a name the broker config does not define
            return _DEFAULTS[name]

    # -- lifecycle
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.active = True
        self._sweeper = self._loop.create_task(self._sweep_loop(), name="share-sweeper")

    async def close(self) -> None:
        self.active = False
        if self._sweeper is not None:
            self._sweeper.cancel()
            try:
                await self._sweeper
            except (asyncio.CancelledError, Exception):
                pass
        self.groups.close()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)

    def _spawn(self, coro: Any) -> None:
        if self._loop is None or not self.active:
            coro.close()
            return
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- leadership
    def leader_of(self, t: Any, idx: int) -> int:
        """The node that leads share partition (t, idx)."""
        b = self.broker
        p = t.partitions[idx]
        if b.is_diskless(t):
            if b.diskless is None:
                return -1
            return b.diskless.leader_for_client(t, None, p)
        if len(p.replicas) > 1 and not b.metadata.single_broker:
            return p.leader
        return b.metadata.partition_host(p.leader)

    def leads(self, t: Any, idx: int) -> bool:
        return self.leader_of(t, idx) == self.broker.node_id

    # -- group configs (Kafka's GroupConfig, the share ones; IncrementalAlterConfigs on a GROUP resource)
    def auto_offset_reset(self, group_id: str) -> str:
        return (self.group_configs.get(group_id, {}).get(AUTO_OFFSET_RESET) or "latest").lower()

    def lock_duration_ms(self, group_id: str) -> int:
        value = self.group_configs.get(group_id, {}).get(LOCK_DURATION)
        return int(value) if value else self.cfg("group.share.record.lock.duration.ms")

    async def load_group_configs(self, group_id: str) -> dict[str, str]:
        configs = await self.persister.group_configs(group_id)
        self.group_configs[group_id] = configs
        return configs

    async def set_group_configs(self, group_id: str, configs: dict[str, str]) -> None:
        await self.persister.write_group_configs(group_id, configs)
        self.group_configs[group_id] = dict(configs)
        for (gid, _t, _p), sp in self.partitions.items():
            if gid == group_id:
                sp.lock_ms = self.lock_duration_ms(group_id)

    # -- share partitions
    async def partition(self, group_id: str, t: Any, idx: int) -> SharePartition:
        """The loaded share partition (reading its state, or initializing it: SPSO at the log end
        for share.auto.offset.reset=latest, at the log start for earliest). Raises OffsetStoreError."""
        key = (group_id, t.name, idx)
        sp = self.partitions.get(key)
        if sp is not None and not sp.fenced:
            return sp
        task = self._loading.get(key)
        if task is None:
            assert self._loop is not None, "share coordinator not started"
            task = self._loading[key] = self._loop.create_task(self._load(group_id, t, idx))
            task.add_done_callback(lambda _t, k=key: self._loading.pop(k, None))
        return await asyncio.shield(task)

    async def _load(self, group_id: str, t: Any, idx: int) -> SharePartition:
        key = (group_id, t.name, idx)
        await self.load_group_configs(group_id)
        sp = SharePartition(group_id, t.name, idx, lock_ms=self.lock_duration_ms(group_id),
                            max_delivery=self.cfg("group.share.delivery.count.limit"),
                            max_locks=self.cfg("group.share.partition.max.record.locks"))
        state = await self.persister.read(group_id, t.name, idx)
        if state is not None:
            sp.load(state)
            if not self.broker.metadata.single_broker:
                sp.state_epoch += 1  # this leader's epoch: an older leader's writes are refused from now on
                await self.persister.write(group_id, t.name, idx, sp.snapshot())
        else:
            earliest = self.auto_offset_reset(group_id) == "earliest"
            first, _ts = await self.broker.list_offset(t, idx, -2 if earliest else -1)
            sp.start_offset = sp.end_offset = max(int(first), 0)
            await self.persister.write(group_id, t.name, idx, sp.snapshot())
            self._mark_group(group_id)
        log.info("share partition %s %s-%d loaded: start offset %d, end offset %d, state epoch %d",
                 group_id, t.name, idx, sp.start_offset, sp.end_offset, sp.state_epoch)
        self.partitions[key] = sp
        return sp

    def _mark_group(self, group_id: str) -> None:
        """So ListGroups still names a share group with state but no members (after a restart)."""
        store = self.coord.store
        if store.protocol_types.get(group_id) != SHARE_PROTOCOL_TYPE and self.coord.owns(group_id) \
                and (self.broker.metadata.single_broker or group_id in self.coord._loaded):  # the group's writer
            try:
                store.append_behind([{"type": "group", "group": group_id, "protocol_type": SHARE_PROTOCOL_TYPE}])
            except OffsetStoreError:
                pass

    async def persist(self, sp: SharePartition) -> None:
        """Store ``sp``'s snapshot (durable on return); a fenced writer drops its copy."""
        key = (sp.group_id, sp.topic, sp.partition)
        slot = self._slots.setdefault(key, _Slot())
        slot.version += 1
        mine = slot.version
        async with slot.lock:
            if slot.stored >= mine or sp.fenced:
                return
            version, snap = slot.version, sp.snapshot()
            ok = await self.persister.write(sp.group_id, sp.topic, sp.partition, snap)
            slot.stored = version
        if not ok:
            log.warning("share partition %s %s-%d: a newer state epoch is stored (another leader, or its offsets "
                        "were reset): dropping this copy", sp.group_id, sp.topic, sp.partition)
            self._drop(sp)

    def _persist_behind(self, sp: SharePartition) -> None:
        async def run() -> None:
            try:
                await self.persist(sp)
            except OffsetStoreError as err:
                log.warning("share partition %s %s-%d: state not stored: %s", sp.group_id, sp.topic, sp.partition, err)

        self._spawn(run())

    def _drop(self, sp: SharePartition) -> None:
        sp.fenced = True
        key = (sp.group_id, sp.topic, sp.partition)
        if self.partitions.get(key) is sp:
            del self.partitions[key]
            self._slots.pop(key, None)

    def _wake(self, sp: SharePartition) -> None:
        self.broker.notifier.notify(sp.topic, sp.partition)

    def drop_group_partitions(self, group_id: str, topic: str | None = None) -> None:
        for key, sp in list(self.partitions.items()):
            if key[0] == group_id and (topic is None or key[1] == topic):
                self._drop(sp)

    # -- ShareGroupListener
    def on_assignment(self, group_id: str, partitions: dict[Any, set[int]]) -> None:
        """Initialize the share partitions this broker leads before members fetch (Kafka's
        InitializeShareGroupState), so share.auto.offset.reset=latest counts from the
        assignment, not from a member's first fetch."""
        b = self.broker
        for tid, parts in partitions.items():
            t = b.topic_by_id(tid)
            if t is None:
                continue
            for idx in parts:
                if idx in t.partitions and (group_id, t.name, idx) not in self.partitions and self.leads(t, idx):
                    self._spawn(self._init_quietly(group_id, t, idx))

    async def _init_quietly(self, group_id: str, t: Any, idx: int) -> None:
        try:
            await self.partition(group_id, t, idx)
        except Exception as err:  # the first fetch tries again
            log.debug("share partition %s %s-%d: not initialized yet: %s", group_id, t.name, idx, err)

    def on_member_left(self, group_id: str, member_id: str) -> None:
        self.sessions.remove(group_id, member_id)
        self.release_member(group_id, member_id)

    def release_member(self, group_id: str, member_id: str, only: Iterable[tuple[str, int]] | None = None) -> int:
        wanted = set(only) if only is not None else None
        total = 0
        for (gid, topic, idx), sp in list(self.partitions.items()):
            if gid != group_id or (wanted is not None and (topic, idx) not in wanted):
                continue
            n = sp.release_member(member_id)
            if n:
                total += n
                self._wake(sp)
                self._persist_behind(sp)
        if total:
            log.info("share group %s: released %d records of member %s", group_id, total, member_id)
        return total

    def watch_connection(self, connection: Any, session: ShareSession) -> None:
        """When the client's connection is gone, its session goes and its records are released
        (Kafka's ShareSessionCache connection-disconnect listener)."""
        if connection.extra.get("_share_sessions") is None:
            keys: set[tuple[str, str]] = set()
            connection.extra["_share_sessions"] = keys
            loop = self._loop
            me = weakref.ref(self)

            def closed(keys: set[tuple[str, str]] = keys, conn_id: int = id(connection)) -> None:
                def run() -> None:
                    owner = me()
                    if owner is not None and owner.active:
                        owner._connection_closed(keys, conn_id)
                if loop is not None and not loop.is_closed():
                    try:
                        loop.call_soon_threadsafe(run)
                    except RuntimeError:
                        pass

            weakref.finalize(connection, closed)
        connection.extra["_share_sessions"].add(session.key)

    def _connection_closed(self, keys: set[tuple[str, str]], conn_id: int) -> None:
        for group_id, member_id in keys:
            session = self.sessions.get(group_id, member_id)
            if session is None or session.connection != conn_id:
                continue
            self.sessions.remove(group_id, member_id)
            log.info("share group %s: connection of member %s closed: releasing its records", group_id, member_id)
            self.release_member(group_id, member_id, self._session_partitions(session))

    def _session_partitions(self, session: ShareSession) -> list[tuple[str, int]]:
        out = []
        for tid, idx in session.partitions:
            t = self.broker.topic_by_id(tid)
            if t is not None:
                out.append((t.name, idx))
        return out

    def close_session(self, session: ShareSession) -> None:
        """A final (epoch -1) request: the session goes, its member's records are released."""
        self.sessions.remove(session.group_id, session.member_id)
        self.release_member(session.group_id, session.member_id, self._session_partitions(session))

    # -- the sweep
    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                self.sweep()
            except Exception:
                log.exception("share partition sweep failed")

    def sweep(self, now: int | None = None) -> int:
        now = now_ms() if now is None else now
        expired = 0
        for sp in list(self.partitions.values()):
            if sp.acquired and sp.next_deadline and sp.next_deadline <= now:
                n = sp.expire_locks(now)
                if n:
                    expired += n
                    log.debug("share partition %s %s-%d: %d acquisition locks expired", sp.group_id, sp.topic,
                              sp.partition, n)
                    self._wake(sp)
                    self._persist_behind(sp)
        # a session nobody used for twice the share session timeout belongs to a gone client
        for s in self.sessions.idle(2 * self.cfg("group.share.session.timeout.ms") / 1000.0):
            self.close_session(s)
        return expired

    # -- fetching
    async def acquire(self, group_id: str, member_id: str, t: Any, idx: int, max_records: int,
                      max_bytes: int) -> tuple[list[tuple[int, int, int]], bytes]:
        """Acquire up to ``max_records`` records of (t, idx) for a member: the acquired ranges and
        the stored batches that hold them. Raises OffsetStoreError, or errors with ``.code``."""
        sp = await self.partition(group_id, t, idx)
        hw, log_start = await self.offsets(t, idx)
        changed = log_start >= 0 and sp.move_start(log_start)
        ranges: list[tuple[int, int, int]] = []
        used: dict[int, Batch] = {}
        limit = min(max(max_bytes, 1), READ_MAX_BYTES)
        first = sp.available_in_window()
        if first is not None and max_records > 0:
            res = await self._read(t, idx, first, limit, sp)
            if res is not None:
                before = len(sp.records)
                got, batches = sp.acquire(member_id, split_batches(res.records), max_records, in_window_only=True,
                                          from_offset=first)
                changed = changed or (not got and len(sp.records) != before)
                ranges += got
                used.update((x.base, x) for x in batches)
        n = sum(last - first_ + 1 for first_, last, _ in ranges)
        if n < max_records and sp.end_offset < hw and sp.in_flight() < sp.max_locks:
            start = sp.end_offset
            res = await self._read(t, idx, start, limit, sp)
            if res is not None:
                got, batches = sp.acquire(member_id, split_batches(res.records), max_records - n,
                                          in_window_only=False, from_offset=start)
                ranges += got
                used.update((x.base, x) for x in batches)
        if changed:
            self._persist_behind(sp)
        ranges.sort()
        data = b"".join(bytes(used[k].data) for k in sorted(used))
        return ranges, data

    async def offsets(self, t: Any, idx: int) -> tuple[int, int]:
        """(high watermark, log start offset), asking the log or the batch coordinator when the
        broker's cached view has none yet (a diskless partition nobody produced to through it)."""
        hw, start = self.broker.partition_offsets(t, idx)
        if hw < 0 or start < 0:
            try:
                hw = int((await self.broker.list_offset(t, idx, -1))[0])
                start = int((await self.broker.list_offset(t, idx, -2))[0])
            except Exception as err:  # not hosted here, offline: the caller sees -1
                if getattr(err, "code", None) is None:
                    raise
                return -1, -1
        return hw, start

    async def _read(self, t: Any, idx: int, offset: int, limit: int, sp: SharePartition) -> Any:
        try:
            return await self.broker.read_partition(t, idx, offset, limit, min_one=True)
        except Exception as err:
            if getattr(err, "code", None) == ErrorCode.offset_out_of_range:
                _hw, log_start = await self.offsets(t, idx)
                if log_start >= 0 and sp.move_start(log_start):
                    self._persist_behind(sp)
                return None
            raise

    # -- acknowledging
    async def acknowledge(self, group_id: str, member_id: str, t: Any, idx: int,
                          batches: list[tuple[int, int, tuple[int, ...]]], renew: bool) -> int:
        key = (group_id, t.name, idx)
        sp = self.partitions.get(key)
        if sp is None or sp.fenced:
            sp = await self.partition(group_id, t, idx)
        code = sp.acknowledge(member_id, batches, renew_allowed=renew)
        if code != ErrorCode.none:
            return code
        self._wake(sp)
        await self.persist(sp)
        return ErrorCode.none

    # -- admin (DescribeShareGroupOffsets, AlterShareGroupOffsets, DeleteShareGroupOffsets)
    async def group_states(self, group_id: str) -> dict[tuple[str, int], dict[str, Any]]:
        """Start offset and lag of each share partition of a group with state, live when this
        broker leads it, else as persisted."""
        out: dict[tuple[str, int], dict[str, Any]] = {}
        for (gid, topic, idx), state in (await self.persister.states(group_id)).items():
            out[(topic, idx)] = dict(state)
        for (gid, topic, idx), sp in self.partitions.items():
            if gid == group_id and not sp.fenced:
                out[(topic, idx)] = sp.snapshot()
        return out

    async def lag(self, t: Any, idx: int, state: dict[str, Any]) -> int:
        """Kafka's share-partition lag (KIP-1226): records from the SPSO to the high watermark not
        yet acknowledged or archived (-1 when this broker cannot tell the high watermark)."""
        hw, _ = await self.offsets(t, idx)
        if hw < 0:
            return -1
        spso = int(state.get("start_offset", 0))
        done = sum(int(last) - int(first) + 1 for first, last, st, _c in state.get("batches", ())
                   if int(st) in (ACKNOWLEDGED, ARCHIVED) and int(first) >= spso)
        return max(hw - spso - done, 0)

    async def alter_offset(self, group_id: str, t: Any, idx: int, offset: int) -> None:
        key = (group_id, t.name, idx)
        current = await self.persister.read(group_id, t.name, idx)
        sp = self.partitions.get(key)
        epoch = max(int((current or {}).get("state_epoch", 0)), sp.state_epoch if sp is not None else 0) + 1
        if sp is not None:
            self._drop(sp)
        await self.persister.write(group_id, t.name, idx, {"state_epoch": epoch, "start_offset": int(offset),
                                                            "batches": []})
        self._mark_group(group_id)
        self.broker.notifier.notify(t.name, idx)

    async def delete_offsets(self, group_id: str, topic: str) -> None:
        self.drop_group_partitions(group_id, topic)
        await self.persister.delete(group_id, topic)

    async def delete_group_state(self, group_id: str) -> None:
        self.drop_group_partitions(group_id)
        await self.persister.delete(group_id)
        self.group_configs.pop(group_id, None)

    async def delete_group(self, group_id: str) -> int:
        """DeleteGroups of a share group: refused while it has members (NON_EMPTY_GROUP), else the
        group and every share-partition state of it go."""
        group = self.groups.groups.get(group_id)
        if group is not None and not group.is_empty():
            return ErrorCode.non_empty_group
        self.groups.drop(group_id)
        try:
            await self.delete_group_state(group_id)
        except OffsetStoreError as err:
            return err.error_code
        self.coord.store.append_behind([{"type": "group_delete", "group": group_id}])
        log.info("share group %s deleted", group_id)
        return ErrorCode.none

    def forget_topic(self, topic: str) -> None:
        for key, sp in list(self.partitions.items()):
            if key[1] == topic:
                self._drop(sp)
