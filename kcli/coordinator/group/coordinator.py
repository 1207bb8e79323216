"""Classic consumer-group coordinator (Kafka's GroupCoordinator / ClassicGroup) and offset store.

The state machine mirrors Kafka's so real clients see the same answers: Empty →
PreparingRebalance → CompletingRebalance → Stable, Dead when deleted; MEMBER_ID_REQUIRED on a
first JoinGroup v4+; the initial-rebalance delay (InitialDelayedJoin) for a rebalance that
starts from Empty; members that fail to rejoin within the rebalance timeout, miss their
session timeout or never send SyncGroup are dropped. Everything runs on the broker's event
loop, so state changes between two ``await``s are atomic and need no locks; delayed
operations are loop timers.

Group membership lives only in memory (clients rejoin after a restart). Committed offsets are
durable behind the :class:`CommittedOffsetStore` contract, which the shared cluster state hands
out (``ClusterStateStore.offset_store``): on one broker :class:`OffsetStore`, where
``<data_dir>/__consumer_offsets/offsets.log`` holds one ``<crc32c hex> <json>`` line per record,
fsynced before a commit is answered (concurrent commits share one fsync), replayed at start and
compacted when it is mostly superseded records; in a cluster the PostgreSQL store of
:mod:`kcli.cluster.pg_offsets`.

In a cluster each group has one coordinator among the live brokers (:func:`coordinator_node`):
a group maps to a ``__consumer_offsets`` partition as in Kafka, and the partition to a broker by
rendezvous hashing, so when a broker leaves only its groups move. A broker loads a group's
offsets from the store when it first serves the group (after a failover: the store's state at
that moment), unloads it when the group moves away, and answers NOT_COORDINATOR for groups it
does not coordinate. On one broker every group is coordinated here, as before.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from kio.schema.errors import ErrorCode


from kcli.coordinator.group.assignors import TopicInfo
from kcli.coordinator.group.consumer_group import (ConsumerGroup, ConsumerGroupManager, HeartbeatError, HeartbeatRequest,
                                                   HeartbeatResult, TopicsView)
from kcli.coordinator.group.offsets import (CommittedOffsetStore, OffsetAndMetadata, OffsetStore, OffsetStoreError,
                                             commit_record)
from kcli.coordinator.placement import coordinator_node, offsets_partition

log = logging.getLogger("kcli.coordinator.group.coordinator")

# Kafka error codes the coordinator answers with.

# Group states, spelled as Kafka reports them in ListGroups / DescribeGroups.
EMPTY = "Empty"
PREPARING_REBALANCE = "PreparingRebalance"
COMPLETING_REBALANCE = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"
STATES = (EMPTY, PREPARING_REBALANCE, COMPLETING_REBALANCE, STABLE, DEAD)

# Which states may precede each state (Kafka's ClassicGroupState.validPreviousStates).
_VALID_PREVIOUS = {
    DEAD: {STABLE, PREPARING_REBALANCE, COMPLETING_REBALANCE, EMPTY, DEAD},
    COMPLETING_REBALANCE: {PREPARING_REBALANCE},
    STABLE: {COMPLETING_REBALANCE},
    PREPARING_REBALANCE: {STABLE, COMPLETING_REBALANCE, EMPTY},
    EMPTY: {PREPARING_REBALANCE},
}

# Kafka's classicGroupNewMemberJoinTimeoutMs: a new member's parked JoinGroup is dropped after
# this long, since a client that gave up and retried would otherwise leave a ghost member.
NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000
# Kafka's offset.metadata.max.bytes default.
OFFSET_METADATA_MAX_BYTES = 4096
# What DescribeGroups reports for include_authorized_operations with no authorizer:
# READ(3), DELETE(6), DESCRIBE(8).
GROUP_AUTHORIZED_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8)

_DEFAULTS = {
    "group.initial.rebalance.delay.ms": 3000,
    "group.min.session.timeout.ms": 6000,
    "group.max.session.timeout.ms": 1800000,
    "offsets.retention.minutes": 10080,
    "offsets.retention.check.interval.ms": 600000,
    "offset.metadata.max.bytes": OFFSET_METADATA_MAX_BYTES,
    "offsets.topic.num.partitions": 50,
    "group.consumer.session.timeout.ms": 45000,
    "group.consumer.heartbeat.interval.ms": 5000,
}
# Kafka's group.consumer.assignors default, by the short names kcli's assignors carry.
DEFAULT_CONSUMER_ASSIGNORS = ["uniform", "range"]
# How often a coordinator checks which of its loaded groups moved to another live broker (or
# were taken over through the store) and unloads them.
OWNERSHIP_CHECK_S = 0.5
# A group loaded for a request but holding no state (no offsets, no members: an OffsetFetch or a
# describe of an unknown group, an AddOffsetsToTxn) is unloaded only after this long, so the
# ownership check cannot unload it between the load and the request that asked for it.
EMPTY_GROUP_GRACE_S = 30.0


def _now_ms() -> int:
    return int(time.time() * 1000)


# ---- results handed to the API handlers --------------------------------------------------------



@dataclass
class JoinMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass
class JoinResult:
    error: int
    member_id: str
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: list[JoinMember] = field(default_factory=list)
    skip_assignment: bool = False


@dataclass
class SyncResult:
    error: int
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    require_known_member_id: bool = True
    supports_skip_assignment: bool = True
    reason: str | None = None


def _join_error(member_id: str, error: int) -> JoinResult:
    return JoinResult(error=error, member_id=member_id)


# ---- group state -------------------------------------------------------------------------------


@dataclass(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    is_new: bool = False
    join_future: asyncio.Future[JoinResult] | None = None
    sync_future: asyncio.Future[SyncResult] | None = None
    heartbeat_timer: asyncio.TimerHandle | None = None

    @property
    def awaiting_join(self) -> bool:
        return self.join_future is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_future is not None

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata(self, protocol: str) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        raise KeyError(protocol)

    def metadata_or_empty(self, protocol: str | None) -> bytes:
        if protocol is None:
            return b""
        try:
            return self.metadata(protocol)
        except KeyError:
            return b""

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols

    def vote(self, candidates: set[str]) -> str:
        for name in self.protocol_names():
            if name in candidates:
                return name
        raise ValueError(f"member {self.member_id} supports none of {sorted(candidates)}")

    def has_satisfied_heartbeat(self) -> bool:
        # A timer that fires means no heartbeat came in time; members parked in a rebalance
        # are excused, except new ones (Kafka expires those while they wait to join).
        if self.is_new:
            return False
        return self.awaiting_join or self.awaiting_sync


class Group:
    """One classic group's membership and generation (Kafka's ClassicGroup)."""

    def __init__(self, group_id: str, protocol_type: str | None = None) -> None:
        self.group_id = group_id
        self.state = EMPTY
        self.previous_state: str | None = None
        self.state_timestamp_ms = _now_ms()
        self.generation_id = 0
        self.protocol_type: str | None = protocol_type or None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}
        self.pending_members: dict[str, asyncio.TimerHandle | None] = {}
        self.pending_sync_members: set[str] = set()
        self.new_member_added = False
        self.join_timer: asyncio.TimerHandle | None = None
        self.sync_timer: asyncio.TimerHandle | None = None

    # state
    def transition(self, target: str) -> None:
        if self.state not in _VALID_PREVIOUS[target]:
            raise RuntimeError(f"group {self.group_id}: illegal transition {self.state} -> {target}")
        self.previous_state = self.state
        self.state = target
        self.state_timestamp_ms = _now_ms()

    def can_rebalance(self) -> bool:
        return self.state in _VALID_PREVIOUS[PREPARING_REBALANCE]

    # membership
    def add(self, member: Member, join_future: asyncio.Future[JoinResult] | None) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if self.leader_id is None:
            self.leader_id = member.member_id
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        member.join_future = join_future
        timer = self.pending_members.pop(member.member_id, None)
        if timer is not None:
            timer.cancel()

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        if member.group_instance_id is not None and self.static_members.get(member.group_instance_id) == member_id:
            del self.static_members[member.group_instance_id]
        if member.heartbeat_timer is not None:
            member.heartbeat_timer.cancel()
            member.heartbeat_timer = None
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_sync_members.discard(member_id)
        return member

    def remove_pending(self, member_id: str) -> None:
        timer = self.pending_members.pop(member_id, None)
        if timer is not None:
            timer.cancel()

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> Member:
        member = self.members.pop(old_id)
        # Fence whoever still waits under the old id: a duplicate instance must shut down.
        _answer_join(member, JoinResult(error=ErrorCode.fenced_instance_id, member_id=old_id))
        _answer_sync(member, SyncResult(error=ErrorCode.fenced_instance_id))
        member.member_id = new_id
        self.members[new_id] = member
        if self.leader_id == old_id:
            self.leader_id = new_id
        if old_id in self.pending_sync_members:
            self.pending_sync_members.discard(old_id)
            self.pending_sync_members.add(new_id)
        self.static_members[instance_id] = new_id
        return member

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def validate_member(self, member_id: str, instance_id: str | None) -> int:
        if instance_id is not None:
            existing = self.static_members.get(instance_id)
            if existing is None:
                return ErrorCode.unknown_member_id
            if existing != member_id:
                return ErrorCode.fenced_instance_id
            return ErrorCode.none
        return ErrorCode.none if member_id in self.members else ErrorCode.unknown_member_id

    def has_all_members_joined(self) -> bool:
        return all(m.awaiting_join for m in self.members.values()) and not self.pending_members

    def not_yet_rejoined(self) -> list[Member]:
        return [m for m in self.members.values() if not m.awaiting_join]

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    # protocols
    def candidate_protocols(self) -> set[str]:
        counts: dict[str, int] = {}
        for m in self.members.values():
            for name in set(m.protocol_names()):
                counts[name] = counts.get(name, 0) + 1
        return {name for name, n in counts.items() if n == len(self.members)}

    def supports_protocols(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        if self.state == EMPTY:
            return bool(protocol_type) and bool(protocols)
        candidates = self.candidate_protocols()
        return self.protocol_type == protocol_type and any(name in candidates for name, _ in protocols)

    def select_protocol(self) -> str:
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = m.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=lambda name: votes[name])

    def maybe_elect_new_joined_leader(self) -> bool:
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.awaiting_join:
            return True
        for m in self.members.values():
            if m.awaiting_join:
                self.leader_id = m.member_id
                return True
        self.leader_id = None
        return False

    def init_next_generation(self) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition(COMPLETING_REBALANCE)
        else:
            self.protocol_name = None
            self.transition(EMPTY)
        self.pending_sync_members.clear()

    def current_member_metadata(self) -> list[JoinMember]:
        if self.protocol_name is None:
            raise RuntimeError(f"group {self.group_id} has no protocol selected")
        return [JoinMember(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
                for m in self.members.values()]

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to (consumer protocol only), or None when unknown."""
        if self.protocol_type != "consumer" or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            parsed = parse_consumer_subscription(m.metadata(self.protocol_name))
            if parsed is None:
                return None
            topics.update(parsed)
        return topics


def _str16(value: str) -> bytes:
    raw = value.encode("utf-8")
    return struct.pack(">h", len(raw)) + raw


def encode_consumer_subscription(topics: list[str]) -> bytes:
    """A ConsumerProtocolSubscription v0 (what classic tools read from DescribeGroups)."""
    return struct.pack(">hi", 0, len(topics)) + b"".join(_str16(t) for t in topics) + struct.pack(">i", -1)


def encode_consumer_assignment(assigned: dict[str, list[int]]) -> bytes:
    """A ConsumerProtocolAssignment v0 of ``{topic: partitions}``."""
    out = struct.pack(">hi", 0, len(assigned))
    for topic, parts in sorted(assigned.items()):
        out += _str16(topic) + struct.pack(f">i{len(parts)}i", len(parts), *parts)
    return out + struct.pack(">i", -1)


def parse_consumer_subscription(data: bytes) -> list[str] | None:
    """Topic names from a ConsumerProtocolSubscription (every version starts the same way)."""
    try:
        pos = 2  # int16 version
        (count,) = struct.unpack_from(">i", data, pos)
        pos += 4
        topics = []
        for _ in range(max(count, 0)):
            (n,) = struct.unpack_from(">h", data, pos)
            pos += 2
            if n < 0 or pos + n > len(data):
                return None
            topics.append(data[pos:pos + n].decode("utf-8"))
            pos += n
        return topics
    except (struct.error, UnicodeDecodeError):
        return None


def _answer_join(member: Member, result: JoinResult) -> bool:
    fut, member.join_future = member.join_future, None
    if fut is None:
        return False
    if not fut.done():
        fut.set_result(result)
    return True


def _answer_sync(member: Member, result: SyncResult) -> bool:
    fut, member.sync_future = member.sync_future, None
    if fut is None:
        return False
    if not fut.done():
        fut.set_result(result)
    return True


# ---- the coordinator ---------------------------------------------------------------------------


class GroupCoordinator:
    """Kafka's classic group coordinator for the groups this broker coordinates.

    ``live_nodes`` gives the node ids of the live brokers (this one included); without it, or
    when it names this broker alone, every group is coordinated here. The API handlers call
    :meth:`route` before each group operation; the operations themselves work on loaded groups.
    """

    def __init__(self, data_dir: Path, config_get_int: Callable[[str], int],
                 store: CommittedOffsetStore | None = None, *, node_id: int = -1,
                 live_nodes: Callable[[], Iterable[int]] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self._config_get_int = config_get_int
        self.store: CommittedOffsetStore = (store if store is not None
                                            else OffsetStore(self.data_dir / "__consumer_offsets"))
        self.node_id = node_id
        self._live_nodes = live_nodes
        self.groups: dict[str, Group] = {}
        self.active = False
        self._loaded: set[str] = set()  # groups whose stored state is loaded here
        self._loaded_at: dict[str, float] = {}  # monotonic time of each load (EMPTY_GROUP_GRACE_S)
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cleanup_task: asyncio.Task[None] | None = None
        self._ownership_task: asyncio.Task[None] | None = None
        self._placement: tuple[frozenset[int], dict[int, int]] = (frozenset(), {})
        # KIP-848 consumer groups (group.protocol=consumer), beside the classic ones: a group id
        # has at most one non-empty kind (see consumer_group_heartbeat and _join).
        self.consumer = ConsumerGroupManager(self._call_later, self._cfg, self._consumer_assignors)
        # KIP-932 share groups: kcli/coordinator/share/manager.py's ShareCoordinator, set by the
        # broker (its ``groups`` hold the share groups this broker coordinates).
        self.share: Any = None

    def _share_groups(self) -> dict[str, Any]:
        return self.share.groups.groups if self.share is not None else {}

    def _consumer_assignors(self) -> list[str]:
        """``group.consumer.assignors`` as short names (Kafka's class names are accepted)."""
        config = getattr(self._config_get_int, "__self__", None)  # the BrokerConfig, when it is one
        try:
            value = config.get("group.consumer.assignors") if config is not None else None
        except Exception:  # a config without the name
            value = None
        if not value:
            return list(DEFAULT_CONSUMER_ASSIGNORS)
        names = [value] if isinstance(value, str) else list(value)
        return [n.strip().rsplit(".", 1)[-1].removesuffix("Assignor").lower() for n in names if n.strip()]

    def _cfg(self, name: str) -> int:
        try:
            return int(self._config_get_int(name))
        except Exception:  # a name the broker config does not define (it may raise any type)
            return _DEFAULTS[name]

    # -- lifecycle
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            await asyncio.to_thread(self.store.open)
        except OSError as err:
            raise OffsetStoreError(f"cannot open {self.store.location}: {err}") from err
        # Groups the store loaded at open (a data dir's log) come back Empty, as Kafka loads them.
        for gid in set(self.store.offsets) | set(self.store.protocol_types):
            self.groups[gid] = Group(gid, self.store.protocol_types.get(gid))
            self._loaded.add(gid)
        self.active = True
        self._cleanup_task = self._loop.create_task(self._cleanup_loop())
        self._ownership_task = self._loop.create_task(self._ownership_loop())

    async def close(self) -> None:
        self.active = False
        for task in (self._cleanup_task, self._ownership_task, *self._loading.values()):
            if task is None:
                continue
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        for group in self.groups.values():
            self._unload(group)
        self.consumer.close()
        await self.store.close()

    # -- which groups this broker coordinates (Kafka's partitionFor + the partition's leader)
    def coordinator_of(self, group_id: str) -> int:
        """Node id of the live broker that coordinates ``group_id``."""
        if self._live_nodes is None:
            return self.node_id
        nodes = frozenset([*self._live_nodes(), self.node_id])  # this broker answers, so it is alive
        if len(nodes) == 1:
            return self.node_id
        if self._placement[0] != nodes:  # the live set changed: partitions are placed anew
            self._placement = (nodes, {})
        partition = offsets_partition(group_id, self._cfg("offsets.topic.num.partitions"))
        placed = self._placement[1]
        if partition not in placed:
            placed[partition] = coordinator_node(partition, nodes)
        return placed[partition]

    def owns(self, group_id: str) -> bool:
        return self.coordinator_of(group_id) == self.node_id

    async def route(self, group_id: str) -> int:
        """NONE when this broker coordinates ``group_id`` and has its state loaded (loading it
        from the store first: after a failover that is the store's state now), else the code
        the client gets: NOT_COORDINATOR (it asks FindCoordinator again) or, while the store
        cannot be reached, COORDINATOR_NOT_AVAILABLE. Callers act on the group right after it
        returns, with no ``await`` in between, so the answer still holds."""
        if not self.active:
            return ErrorCode.coordinator_not_available
        if not group_id:
            return ErrorCode.none  # the operation answers INVALID_GROUP_ID
        if not self.owns(group_id):
            if group_id in self._loaded or group_id in self.groups or group_id in self.consumer.groups \
                    or group_id in self._share_groups():
                self._unload_group(group_id, f"it moved to node {self.coordinator_of(group_id)}")
            return ErrorCode.not_coordinator
        if group_id in self._loaded:
            return ErrorCode.none
        task = self._loading.get(group_id)
        if task is None:
            assert self._loop is not None, "coordinator not started"
            task = self._loading[group_id] = self._loop.create_task(self._load_group(group_id))
            task.add_done_callback(lambda _t, gid=group_id: self._loading.pop(gid, None))
        try:
            await asyncio.shield(task)
        except OffsetStoreError as err:
            return err.error_code
        if not self.active:
            return ErrorCode.coordinator_not_available
        if group_id not in self._loaded or not self.owns(group_id):
            return ErrorCode.not_coordinator  # it moved while loading
        return ErrorCode.none

    async def _load_group(self, group_id: str) -> None:
        try:
            await self.store.load_group(group_id)
        except OffsetStoreError as err:
            log.warning("group %s: cannot load its offsets from %s: %s", group_id, self.store.location, err)
            raise
        if not self.active:
            return
        self._loaded.add(group_id)
        self._loaded_at[group_id] = time.monotonic()
        if group_id not in self.groups and (self.store.has_offsets(group_id) or group_id in self.store.protocol_types):
            self.groups[group_id] = Group(group_id, self.store.protocol_types.get(group_id))
        log.info("group %s: now coordinated by node %d (%d committed offsets loaded)", group_id, self.node_id,
                 len(self.store.group_offsets(group_id)))

    def _unload_group(self, group_id: str, why: str) -> None:
        """Stop coordinating ``group_id``: parked members get NOT_COORDINATOR and rediscover."""
        group = self.groups.pop(group_id, None)
        if group_id in self._share_groups():
            self.share.groups.drop(group_id)
        if group_id in self.consumer.groups:
            self.consumer.drop(group_id)  # its members get UNKNOWN_MEMBER_ID here, NOT_COORDINATOR first
            log.info("group %s: consumer group no longer coordinated by node %d: %s", group_id, self.node_id, why)
        if group is not None:
            self._unload(group)
            log.info("group %s: no longer coordinated by node %d: %s", group_id, self.node_id, why)
        self._loaded.discard(group_id)
        self._loaded_at.pop(group_id, None)
        self.store.unload_group(group_id)

    async def check_ownership(self) -> None:
        """Unload groups that moved to another live broker or that another broker took over
        through the store, and loaded groups a request left without any state."""
        share_groups = self._share_groups()
        for gid in sorted(self._loaded | set(self.groups) | set(self.consumer.groups) | set(share_groups)):
            if not self.owns(gid):
                self._unload_group(gid, f"it moved to node {self.coordinator_of(gid)}")
            elif gid not in self.groups and gid not in self.consumer.groups and gid not in share_groups \
                    and time.monotonic() - self._loaded_at.get(gid, 0.0) >= EMPTY_GROUP_GRACE_S:
                self._unload_group(gid, "nothing is left of it")
        if self._loaded:
            lost = await self.store.lost_groups(sorted(self._loaded))
            for gid in sorted(lost & self._loaded):
                self._unload_group(gid, "another broker took it over")

    async def _ownership_loop(self) -> None:
        while True:
            await asyncio.sleep(OWNERSHIP_CHECK_S)
            try:
                await self.check_ownership()
            except OffsetStoreError as err:
                log.debug("group ownership check: %s", err)
            except Exception:
                log.exception("group ownership check failed")

    def _unload(self, group: Group) -> None:
        """Answer every parked request with NOT_COORDINATOR and stop the group's timers."""
        for timer in (group.join_timer, group.sync_timer, *group.pending_members.values()):
            if timer is not None:
                timer.cancel()
        for m in group.members.values():
            if m.heartbeat_timer is not None:
                m.heartbeat_timer.cancel()
            _answer_join(m, _join_error(m.member_id, ErrorCode.not_coordinator))
            _answer_sync(m, SyncResult(error=ErrorCode.not_coordinator))

    # -- timers
    def _call_later(self, delay_ms: float, fn: Callable[..., None], *args: Any) -> asyncio.TimerHandle:
        assert self._loop is not None, "coordinator not started"

        def run() -> None:
            if not self.active:
                return
            try:
                fn(*args)
            except Exception:  # a bug here must not kill the event loop's other work
                log.exception("group coordinator timer %s failed", getattr(fn, "__name__", fn))

        return self._loop.call_later(max(delay_ms, 0) / 1000.0, run)

    def _reschedule_heartbeat(self, group: Group, member: Member, timeout_ms: int | None = None) -> None:
        if member.heartbeat_timer is not None:
            member.heartbeat_timer.cancel()
        member.heartbeat_timer = self._call_later(
            member.session_timeout_ms if timeout_ms is None else timeout_ms,
            self._expire_heartbeat, group, member.member_id)

    def _expire_heartbeat(self, group: Group, member_id: str) -> None:
        if group.state == DEAD:
            return
        if member_id in group.pending_members:
            log.info("group %s: pending member %s expired", group.group_id, member_id)
            group.remove_pending(member_id)
            self._maybe_complete_join_phase(group)
            return
        member = group.members.get(member_id)
        if member is None:
            return
        member.heartbeat_timer = None
        if not member.has_satisfied_heartbeat():
            log.info("group %s: member %s failed its session timeout, removing it", group.group_id, member_id)
            self._remove_member_and_update_group(group, member)

    # -- rebalance machinery
    def _maybe_prepare_rebalance_or_complete_join(self, group: Group) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group)
        else:
            self._maybe_complete_join_phase(group)

    def _prepare_rebalance(self, group: Group) -> None:
        if group.state == COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment_error(group, ErrorCode.rebalance_in_progress)
        if group.sync_timer is not None:
            group.sync_timer.cancel()
            group.sync_timer = None
        initial = group.state == EMPTY
        group.transition(PREPARING_REBALANCE)
        log.info("group %s: preparing to rebalance (old generation %d)", group.group_id, group.generation_id)
        if initial:
            delay = self._cfg("group.initial.rebalance.delay.ms")
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            self._set_join_timer(group, delay, self._initial_delay_expired, group, delay, remaining)
        else:
            self._maybe_complete_join_else_schedule(group)

    def _set_join_timer(self, group: Group, delay_ms: int, fn: Callable[..., None], *args: Any) -> None:
        if group.join_timer is not None:
            group.join_timer.cancel()
        group.join_timer = self._call_later(delay_ms, fn, *args)

    def _initial_delay_expired(self, group: Group, delay: int, remaining: int) -> None:
        group.join_timer = None
        if group.state != PREPARING_REBALANCE:
            return
        if group.new_member_added and remaining != 0:
            group.new_member_added = False
            new_delay = min(self._cfg("group.initial.rebalance.delay.ms"), remaining)
            new_remaining = max(remaining - delay, 0)
            self._set_join_timer(group, new_delay, self._initial_delay_expired, group, new_delay, new_remaining)
        else:
            self._complete_join(group)

    def _maybe_complete_join_else_schedule(self, group: Group) -> None:
        if group.has_all_members_joined():
            self._complete_join(group)
        else:
            self._set_join_timer(group, group.rebalance_timeout_ms(), self._join_timeout, group)

    def _join_timeout(self, group: Group) -> None:
        group.join_timer = None
        if group.state == PREPARING_REBALANCE:
            self._complete_join(group)

    def _maybe_complete_join_phase(self, group: Group) -> None:
        if (group.state == PREPARING_REBALANCE and group.has_all_members_joined()
                and group.previous_state != EMPTY):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        if group.join_timer is not None:
            group.join_timer.cancel()
            group.join_timer = None
        for m in group.not_yet_rejoined():
            if m.group_instance_id is None:
                log.info("group %s: member %s did not rejoin in time, removing it", group.group_id, m.member_id)
                group.remove(m.member_id)
                _answer_sync(m, SyncResult(error=ErrorCode.unknown_member_id))
        if group.state == DEAD:
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Only static members that have not rejoined are left: wait for them or their
            # session timeout.
            self._set_join_timer(group, group.rebalance_timeout_ms(), self._join_timeout, group)
            return
        group.new_member_added = False
        group.init_next_generation()
        if group.state == EMPTY:
            log.info("group %s: generation %d is empty", group.group_id, group.generation_id)
            return
        if group.protocol_type and self.store.protocol_types.get(group.group_id) != group.protocol_type:
            self.store.append_behind([{"type": "group", "group": group.group_id,
                                       "protocol_type": group.protocol_type}])
        log.info("group %s: generation %d with %d members, protocol %s, leader %s", group.group_id,
                 group.generation_id, len(group.members), group.protocol_name, group.leader_id)
        leader_view = group.current_member_metadata()
        for m in list(group.members.values()):
            _answer_join(m, JoinResult(
                error=ErrorCode.none, member_id=m.member_id, generation_id=group.generation_id,
                protocol_type=group.protocol_type, protocol_name=group.protocol_name,
                leader=group.leader_id or "",
                members=leader_view if group.is_leader(m.member_id) else [],
            ))
            self._reschedule_heartbeat(group, m)
            m.is_new = False
            group.pending_sync_members.add(m.member_id)
        self._schedule_pending_sync(group)

    def _schedule_pending_sync(self, group: Group) -> None:
        if group.sync_timer is not None:
            group.sync_timer.cancel()
        group.sync_timer = self._call_later(group.rebalance_timeout_ms(), self._expire_pending_sync,
                                            group, group.generation_id)

    def _expire_pending_sync(self, group: Group, generation_id: int) -> None:
        group.sync_timer = None
        if generation_id != group.generation_id or group.state not in (COMPLETING_REBALANCE, STABLE):
            return
        if not group.pending_sync_members:
            return
        missing = sorted(group.pending_sync_members)
        log.info("group %s: members %s sent no SyncGroup in time, removing them", group.group_id, missing)
        for member_id in missing:
            m = group.remove(member_id)
            if m is not None:
                _answer_join(m, _join_error("", ErrorCode.unknown_member_id))
                _answer_sync(m, SyncResult(error=ErrorCode.unknown_member_id))
        self._prepare_rebalance(group)

    def _reset_and_propagate_assignment_error(self, group: Group, error: int) -> None:
        for m in group.members.values():
            m.assignment = b""
        self._propagate_assignment(group, error)

    def _propagate_assignment(self, group: Group, error: int) -> None:
        for m in group.members.values():
            result = SyncResult(error=error, assignment=m.assignment if error == ErrorCode.none else b"",
                                protocol_type=group.protocol_type, protocol_name=group.protocol_name)
            if _answer_sync(m, result):
                # Members parked in SyncGroup were excused from heartbeats: start their clock now.
                self._reschedule_heartbeat(group, m)

    def _remove_member_and_update_group(self, group: Group, member: Member) -> None:
        # A new member may be parked in JoinGroup: answer it so the client retries.
        _answer_join(member, _join_error("", ErrorCode.unknown_member_id))
        _answer_sync(member, SyncResult(error=ErrorCode.unknown_member_id))
        group.remove(member.member_id)
        if group.state in (STABLE, COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance_or_complete_join(group)
        elif group.state == PREPARING_REBALANCE:
            self._maybe_complete_join_phase(group)

    def _add_member_and_rebalance(self, group: Group, req: JoinRequest, member_id: str,
                                  fut: asyncio.Future[JoinResult]) -> None:
        member = Member(member_id, req.group_instance_id, req.client_id, req.client_host,
                        req.rebalance_timeout_ms, req.session_timeout_ms, req.protocol_type,
                        list(req.protocols), is_new=True)
        if group.state == PREPARING_REBALANCE and group.previous_state == EMPTY:
            group.new_member_added = True
        group.add(member, fut)
        self._reschedule_heartbeat(group, member, NEW_MEMBER_JOIN_TIMEOUT_MS)
        self._maybe_prepare_rebalance_or_complete_join(group)

    def _update_member_and_rebalance(self, group: Group, member: Member, req: JoinRequest,
                                     fut: asyncio.Future[JoinResult]) -> None:
        self._update_member(member, req, fut)
        self._maybe_prepare_rebalance_or_complete_join(group)

    @staticmethod
    def _update_member(member: Member, req: JoinRequest, fut: asyncio.Future[JoinResult]) -> None:
        member.protocols = list(req.protocols)
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.session_timeout_ms = req.session_timeout_ms
        # Our connections answer in order, so a superseded parked JoinGroup must be answered.
        _answer_join(member, _join_error(member.member_id, ErrorCode.rebalance_in_progress))
        member.join_future = fut

    def _new_member_id(self, req: JoinRequest) -> str:
        prefix = req.group_instance_id if req.group_instance_id is not None else req.client_id
        return f"{prefix}-{uuid.uuid4()}"

    # -- JoinGroup
    async def join_group(self, req: JoinRequest) -> JoinResult:
        """Handle JoinGroup; the answer may come after a rebalance delay (parked request)."""
        assert self._loop is not None, "coordinator not started"
        fut: asyncio.Future[JoinResult] = self._loop.create_future()
        self._join(req, fut)
        return await fut

    def _join(self, req: JoinRequest, fut: asyncio.Future[JoinResult]) -> None:
        if not req.group_id:
            fut.set_result(_join_error(req.member_id, ErrorCode.invalid_group_id))
            return
        if not self.active:
            fut.set_result(_join_error(req.member_id, ErrorCode.coordinator_not_available))
            return
        if not (self._cfg("group.min.session.timeout.ms") <= req.session_timeout_ms
                <= self._cfg("group.max.session.timeout.ms")):
            fut.set_result(_join_error(req.member_id, ErrorCode.invalid_session_timeout))
            return
        if self.group_type(req.group_id) == "share":  # a share group's id: Kafka refuses a classic join
            fut.set_result(_join_error(req.member_id, ErrorCode.inconsistent_group_protocol))
            return
        consumer_group = self.consumer.groups.get(req.group_id)
        if consumer_group is not None:
            if not consumer_group.is_empty():
                # kcli implements group.consumer.migration.policy=disabled: a classic member
                # cannot join a consumer group that has members.
                fut.set_result(_join_error(req.member_id, ErrorCode.inconsistent_group_protocol))
                return
            self.consumer.drop(req.group_id)  # an empty consumer group becomes a classic one
        unknown = req.member_id == ""
        group = self.groups.get(req.group_id)
        if group is None:
            if not unknown:
                fut.set_result(_join_error(req.member_id, ErrorCode.unknown_member_id))
                return
            group = self.groups[req.group_id] = Group(req.group_id)
        if unknown:
            self._join_unknown_member(group, req, fut)
        else:
            self._join_existing_member(group, req, fut)
        if group.state == PREPARING_REBALANCE:
            self._maybe_complete_join_phase(group)

    def _join_unknown_member(self, group: Group, req: JoinRequest, fut: asyncio.Future[JoinResult]) -> None:
        if group.state == DEAD:
            fut.set_result(_join_error("", ErrorCode.coordinator_not_available))
            return
        if not group.supports_protocols(req.protocol_type, req.protocols):
            fut.set_result(_join_error("", ErrorCode.inconsistent_group_protocol))
            return
        new_id = self._new_member_id(req)
        instance = req.group_instance_id
        if instance is not None and instance in group.static_members:
            self._rejoin_static_member(group, req, group.static_members[instance], new_id, fut)
        elif instance is None and req.require_known_member_id:
            # Hand out the id and wait for the client to come back with it (KIP-394).
            group.pending_members[new_id] = self._call_later(
                req.session_timeout_ms, self._expire_heartbeat, group, new_id)
            fut.set_result(_join_error(new_id, ErrorCode.member_id_required))
        else:
            self._add_member_and_rebalance(group, req, new_id, fut)

    def _rejoin_static_member(self, group: Group, req: JoinRequest, old_id: str, new_id: str,
                              fut: asyncio.Future[JoinResult]) -> None:
        current_leader = group.leader_id or ""
        member = group.replace_static_member(req.group_instance_id or "", old_id, new_id)
        self._reschedule_heartbeat(group, member)
        old_protocol = group.protocol_name
        self._update_member(member, req, fut)
        if group.state == STABLE:
            if old_protocol == group.select_protocol():
                # Same protocol: hand back the current generation without a rebalance.
                if req.supports_skip_assignment:
                    is_leader = group.is_leader(new_id)
                    result = JoinResult(
                        error=ErrorCode.none, member_id=new_id, generation_id=group.generation_id,
                        protocol_type=group.protocol_type, protocol_name=group.protocol_name,
                        leader=group.leader_id or "",
                        members=group.current_member_metadata() if is_leader else [],
                        skip_assignment=is_leader)
                else:
                    # Older clients must not think they lead: they would compute an
                    # assignment that a Stable group never distributes.
                    result = JoinResult(
                        error=ErrorCode.none, member_id=new_id, generation_id=group.generation_id,
                        protocol_type=group.protocol_type, protocol_name=group.protocol_name,
                        leader=current_leader)
                _answer_join(member, result)
            else:
                self._maybe_prepare_rebalance_or_complete_join(group)
        elif group.state == COMPLETING_REBALANCE:
            self._prepare_rebalance(group)
        else:
            self._maybe_complete_join_phase(group)

    def _join_existing_member(self, group: Group, req: JoinRequest, fut: asyncio.Future[JoinResult]) -> None:
        member_id = req.member_id
        if group.state == DEAD:
            fut.set_result(_join_error(member_id, ErrorCode.coordinator_not_available))
            return
        if not group.supports_protocols(req.protocol_type, req.protocols):
            fut.set_result(_join_error(member_id, ErrorCode.inconsistent_group_protocol))
            return
        if member_id in group.pending_members:
            if req.group_instance_id is not None:
                fut.set_result(_join_error(member_id, ErrorCode.unknown_member_id))
                return
            self._add_member_and_rebalance(group, req, member_id, fut)
            return
        err = group.validate_member(member_id, req.group_instance_id)
        if err != ErrorCode.none:
            fut.set_result(_join_error(member_id, err))
            return
        member = group.members[member_id]
        if group.state == PREPARING_REBALANCE:
            self._update_member_and_rebalance(group, member, req, fut)
        elif group.state == COMPLETING_REBALANCE:
            if member.matches(req.protocols):
                # The client missed the JoinGroup answer: repeat it for this generation.
                fut.set_result(JoinResult(
                    error=ErrorCode.none, member_id=member_id, generation_id=group.generation_id,
                    protocol_type=group.protocol_type, protocol_name=group.protocol_name,
                    leader=group.leader_id or "",
                    members=group.current_member_metadata() if group.is_leader(member_id) else []))
            else:
                self._update_member_and_rebalance(group, member, req, fut)
        elif group.state == STABLE:
            if group.is_leader(member_id) or not member.matches(req.protocols):
                # The leader rejoining asks for a new assignment (e.g. topic metadata changed).
                self._update_member_and_rebalance(group, member, req, fut)
            else:
                fut.set_result(JoinResult(
                    error=ErrorCode.none, member_id=member_id, generation_id=group.generation_id,
                    protocol_type=group.protocol_type, protocol_name=group.protocol_name,
                    leader=group.leader_id or ""))
        else:  # Empty: the member is stale
            fut.set_result(_join_error(member_id, ErrorCode.unknown_member_id))

    # -- SyncGroup
    async def sync_group(self, group_id: str, generation_id: int, member_id: str,
                         group_instance_id: str | None, protocol_type: str | None,
                         protocol_name: str | None, assignments: dict[str, bytes]) -> SyncResult:
        """Handle SyncGroup; followers wait until the leader's assignment arrives."""
        assert self._loop is not None, "coordinator not started"
        if not group_id:
            return SyncResult(error=ErrorCode.invalid_group_id)
        if not self.active:
            return SyncResult(error=ErrorCode.coordinator_not_available)
        group = self.groups.get(group_id)
        if group is None:
            return SyncResult(error=ErrorCode.unknown_member_id)
        if group.state == DEAD:
            return SyncResult(error=ErrorCode.coordinator_not_available)
        err = group.validate_member(member_id, group_instance_id)
        if err != ErrorCode.none:
            return SyncResult(error=err)
        if generation_id != group.generation_id:
            return SyncResult(error=ErrorCode.illegal_generation)
        if _inconsistent(protocol_type, group.protocol_type) or _inconsistent(protocol_name, group.protocol_name):
            return SyncResult(error=ErrorCode.inconsistent_group_protocol)
        member = group.members[member_id]
        if group.state == EMPTY:
            return SyncResult(error=ErrorCode.unknown_member_id)
        if group.state == PREPARING_REBALANCE:
            return SyncResult(error=ErrorCode.rebalance_in_progress)
        if group.state == STABLE:
            group.pending_sync_members.discard(member_id)
            self._reschedule_heartbeat(group, member)
            return SyncResult(error=ErrorCode.none, assignment=member.assignment,
                              protocol_type=group.protocol_type, protocol_name=group.protocol_name)
        # CompletingRebalance: park until the leader's assignment is in.
        fut: asyncio.Future[SyncResult] = self._loop.create_future()
        _answer_sync(member, SyncResult(error=ErrorCode.rebalance_in_progress))
        member.sync_future = fut
        group.pending_sync_members.discard(member_id)
        if group.is_leader(member_id):
            log.info("group %s: assignment received from leader %s for generation %d",
                     group.group_id, member_id, group.generation_id)
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            group.transition(STABLE)
            self._propagate_assignment(group, ErrorCode.none)
        return await fut

    # -- Heartbeat
    def heartbeat(self, group_id: str, generation_id: int, member_id: str,
                  group_instance_id: str | None = None) -> int:
        if not group_id:
            return ErrorCode.invalid_group_id
        if not self.active:
            return ErrorCode.coordinator_not_available
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        if group.state == DEAD:
            return ErrorCode.coordinator_not_available
        err = group.validate_member(member_id, group_instance_id)
        if err != ErrorCode.none:
            return err
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        if group.state == EMPTY:
            return ErrorCode.unknown_member_id
        self._reschedule_heartbeat(group, group.members[member_id])
        if group.state == PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        # CompletingRebalance too: clients may heartbeat between JoinGroup and SyncGroup.
        return ErrorCode.none

    # -- LeaveGroup
    def leave_group(self, group_id: str, members: list[tuple[str, str | None]]
                    ) -> tuple[int, list[tuple[str, str | None, int]]]:
        """Remove ``(member_id, group_instance_id)`` members; returns (top error, per member)."""
        if not group_id:
            return ErrorCode.invalid_group_id, []
        if not self.active:
            return ErrorCode.coordinator_not_available, []
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.none, [(mid, iid, ErrorCode.unknown_member_id) for mid, iid in members]
        if group.state == DEAD:
            return ErrorCode.coordinator_not_available, []
        out: list[tuple[str, str | None, int]] = []
        left = False
        for member_id, instance_id in members:
            if member_id == "":
                # Administrative removal of a static member by its instance id.
                target = group.static_members.get(instance_id) if instance_id is not None else None
                if target is None:
                    out.append((member_id, instance_id, ErrorCode.unknown_member_id))
                    continue
                self._remove_leaving_member(group, group.members[target])
            elif member_id in group.pending_members:
                group.remove_pending(member_id)
            else:
                err = group.validate_member(member_id, instance_id)
                if err != ErrorCode.none:
                    out.append((member_id, instance_id, err))
                    continue
                self._remove_leaving_member(group, group.members[member_id])
            log.info("group %s: member %s left", group.group_id, member_id or instance_id)
            out.append((member_id, instance_id, ErrorCode.none))
            left = True
        if left:
            if group.state in (STABLE, COMPLETING_REBALANCE):
                self._maybe_prepare_rebalance_or_complete_join(group)
            elif group.state == PREPARING_REBALANCE:
                self._maybe_complete_join_phase(group)
        return ErrorCode.none, out

    @staticmethod
    def _remove_leaving_member(group: Group, member: Member) -> None:
        _answer_join(member, _join_error("", ErrorCode.unknown_member_id))
        _answer_sync(member, SyncResult(error=ErrorCode.unknown_member_id))
        group.remove(member.member_id)

    # -- offsets
    async def commit_offsets(self, group_id: str, generation_id: int, member_id: str,
                             group_instance_id: str | None,
                             offsets: dict[tuple[str, int], OffsetAndMetadata],
                             api_version: int = 9) -> dict[tuple[str, int], int]:
        """Store ``offsets`` durably; returns an error code per partition (0 when stored)."""
        def all_(code: int) -> dict[tuple[str, int], int]:
            return {tp: code for tp in offsets}

        if not self.active:
            return all_(ErrorCode.coordinator_not_available)
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None:
            # A consumer-protocol group: the member epoch is checked here (Kafka's
            # ConsumerGroup.validateOffsetCommit); the classic checks below see a simple commit.
            err = self.consumer.validate_offset_commit(consumer_group, member_id, generation_id, api_version)
            if err != ErrorCode.none:
                return all_(err)
            generation_id, member_id, group_instance_id = -1, "", None
        group = self.groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                # Not a group we know: an older generation or a group that never joined.
                return all_(ErrorCode.illegal_generation)
            group = self.groups[group_id] = Group(group_id)
        err = self._validate_offset_commit(group, generation_id, member_id, group_instance_id)
        if err != ErrorCode.none:
            return all_(err)
        if member_id in group.members and group.state in (STABLE, PREPARING_REBALANCE):
            # A commit is as good as a heartbeat (Kafka reschedules the member's expiry).
            self._reschedule_heartbeat(group, group.members[member_id])
        max_meta = self._cfg("offset.metadata.max.bytes")
        result: dict[tuple[str, int], int] = {}
        records = []
        now = _now_ms()
        for (topic, partition), om in offsets.items():
            if om.metadata and len(om.metadata.encode()) > max_meta:
                result[(topic, partition)] = ErrorCode.offset_metadata_too_large
                continue
            stored = OffsetAndMetadata(om.offset, om.leader_epoch, om.metadata or "", now)
            records.append(commit_record(group_id, topic, partition, stored))
            result[(topic, partition)] = ErrorCode.none
        if records:
            try:
                await self.store.append(records)
            except OffsetStoreError as err:
                # Kafka answers a failed offsets-log append with NOT_COORDINATOR; an unreachable
                # shared store is COORDINATOR_NOT_AVAILABLE. Both make the client retry.
                if err.fenced:
                    self._unload_group(group_id, "another broker took it over")
                return {tp: (err.error_code if code == ErrorCode.none else code) for tp, code in result.items()}
            if group_id not in self.groups and self.store.has_offsets(group_id):
                # The group was deleted while the commit was being written; it exists again.
                self.groups[group_id] = Group(group_id, self.store.protocol_types.get(group_id))
        return result

    async def commit_transactional_offsets(self, group_id: str,
                                           offsets: dict[tuple[str, int], tuple[int, int, str]]) -> None:
        """Store the offsets a committed transaction carried (TxnOffsetCommit, then EndTxn);
        the membership was checked when TxnOffsetCommit arrived. Raises OffsetStoreError."""
        now = _now_ms()
        await self.store.append([commit_record(group_id, t, p, OffsetAndMetadata(o, e, m, now))
                                 for (t, p), (o, e, m) in offsets.items()])
        if group_id not in self.groups and self.store.has_offsets(group_id):
            self.groups[group_id] = Group(group_id, self.store.protocol_types.get(group_id))

    def check_txn_offset_commit(self, group_id: str, generation_id: int, member_id: str,
                                group_instance_id: str | None) -> int:
        """TxnOffsetCommit's membership check (0 when the commit may be kept)."""
        if not self.active:
            return ErrorCode.coordinator_not_available
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None:
            return self.consumer.validate_offset_commit(consumer_group, member_id, generation_id, 9, transactional=True)
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.none if generation_id < 0 else ErrorCode.illegal_generation
        return self._validate_offset_commit(group, generation_id, member_id, group_instance_id)

    @staticmethod
    def _validate_offset_commit(group: Group, generation_id: int, member_id: str,
                                group_instance_id: str | None) -> int:
        if group.state == DEAD:
            return ErrorCode.coordinator_not_available
        if generation_id < 0 and group.state == EMPTY:
            return ErrorCode.none  # a standalone consumer or admin tool: no membership to check
        if generation_id >= 0 or member_id or group_instance_id is not None:
            err = group.validate_member(member_id, group_instance_id)
            if err != ErrorCode.none:
                return err
            if generation_id != group.generation_id:
                return ErrorCode.illegal_generation
        elif group.state != EMPTY:
            return ErrorCode.unknown_member_id  # only members may commit to a non-empty group
        if group.state == COMPLETING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def fetch_offsets(self, group_id: str, partitions: Iterable[tuple[str, int]] | None,
                      member_id: str | None = None, member_epoch: int = -1
                      ) -> tuple[int, dict[tuple[str, int], OffsetAndMetadata | None]]:
        """Committed offsets of ``partitions`` (None = every committed partition); a consumer
        group's member (OffsetFetch v9+) must name its current member epoch."""
        if not self.active:
            return ErrorCode.coordinator_not_available, {}
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None:
            err = self.consumer.validate_offset_fetch(consumer_group, member_id, member_epoch)
            if err != ErrorCode.none:
                return err, {}
        group = self.groups.get(group_id)
        stored = self.store.group_offsets(group_id) if group is None or group.state != DEAD else {}
        if partitions is None:
            return ErrorCode.none, dict(stored)
        return ErrorCode.none, {tp: stored.get(tp) for tp in partitions}

    def delete_offsets(self, group_id: str, partitions: Iterable[tuple[str, int]]
                       ) -> tuple[int, dict[tuple[str, int], int]]:
        """OffsetDelete (KIP-496): drop committed offsets of topics the group does not consume;
        returns (group error, error per partition) as Kafka's handleDeleteOffsets does."""
        if not group_id:
            return ErrorCode.invalid_group_id, {}
        if not self.active:
            return ErrorCode.coordinator_not_available, {}
        group = self.groups.get(group_id)
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None and not consumer_group.is_empty():
            subscribed_now = set(consumer_group.subscription_metadata)
            out_cg: dict[tuple[str, int], int] = {}
            doomed_cg: list[dict[str, Any]] = []
            stored_cg = self.store.group_offsets(group_id)
            for topic, partition in partitions:
                if topic in subscribed_now:
                    out_cg[(topic, partition)] = ErrorCode.group_subscribed_to_topic
                    continue
                out_cg[(topic, partition)] = ErrorCode.none
                if (topic, partition) in stored_cg:
                    doomed_cg.append({"type": "offset_delete", "group": group_id, "topic": topic, "partition": partition})
            if doomed_cg:
                self.store.append_behind(doomed_cg)
            return ErrorCode.none, out_cg
        if group is None or group.state == DEAD:
            return ErrorCode.group_id_not_found, {}
        subscribed: set[str] | None = set()
        if group.state != EMPTY:
            if group.protocol_type != "consumer":
                return ErrorCode.non_empty_group, {}
            subscribed = group.subscribed_topics()  # None: unknown, so every topic counts
        out: dict[tuple[str, int], int] = {}
        doomed: list[dict[str, Any]] = []
        stored = self.store.group_offsets(group_id)
        for topic, partition in partitions:
            if subscribed is None or topic in subscribed:
                out[(topic, partition)] = ErrorCode.group_subscribed_to_topic
                continue
            out[(topic, partition)] = ErrorCode.none
            if (topic, partition) in stored:
                doomed.append({"type": "offset_delete", "group": group_id, "topic": topic, "partition": partition})
        if doomed:
            self.store.append_behind(doomed)
        return ErrorCode.none, out

    def committed_offsets(self, group_id: str) -> dict[tuple[str, int], int]:
        """For kcli's tools: ``{(topic, partition): offset}`` of ``group_id``."""
        return {tp: om.offset for tp, om in self.store.group_offsets(group_id).items()}

    def delete_topic_offsets(self, topic: str, topic_id: Any = None) -> int:
        """Drop every group's offsets for a deleted topic; returns how many loaded ones were
        dropped. Every broker of a cluster calls this for the same deletion: a shared store
        deletes the stored offsets once per ``topic_id``."""
        n = sum(1 for offs in self.store.offsets.values() for tp in offs if tp[0] == topic)
        rec: dict[str, Any] = {"type": "topic_delete", "topic": topic}
        if topic_id is not None:
            rec["topic_id"] = str(topic_id)
        self.store.append_behind([rec])
        if n:
            log.info("removed %d committed offsets of deleted topic %s", n, topic)
        return n

    # -- admin
    def list_groups(self, states: Iterable[str] | None = None) -> list[tuple[str, str, str]]:
        """``(group_id, protocol_type, state)`` of every group, optionally filtered by state."""
        wanted = {s.lower() for s in states} if states else None
        out = []
        for cg in self.consumer.groups.values():
            if wanted is None or cg.state.lower() in wanted:
                out.append((cg.group_id, "consumer", cg.state))
        for sg in self._share_groups().values():
            if wanted is None or sg.state.lower() in wanted:
                out.append((sg.group_id, "share", sg.state))
        for g in self.groups.values():
            if g.state == DEAD or g.group_id in self.consumer.groups or g.group_id in self._share_groups():
                continue
            if wanted is not None and g.state.lower() not in wanted:
                continue
            out.append((g.group_id, g.protocol_type or "", g.state))
        return out

    async def list_coordinated_groups(self, states: Iterable[str] | None = None) -> list[tuple[str, str, str]]:
        """ListGroups: the groups this broker coordinates, with those whose stored state is not
        loaded here yet (Empty, as Kafka lists groups that only have offsets)."""
        stored = await self.store.stored_groups()  # OffsetStoreError when unreachable
        out = [row for row in self.list_groups(states) if self.owns(row[0])]
        wanted = {s.lower() for s in states} if states else None
        if wanted is None or EMPTY.lower() in wanted:
            out += [(gid, pt or "", EMPTY) for gid, pt in sorted(stored.items())
                    if gid not in self.groups and gid not in self.consumer.groups and gid not in self._share_groups()
                    and self.owns(gid)]
        return out

    def group_type(self, group_id: str) -> str:
        """Kafka's group type: ``consumer`` (KIP-848), ``share`` (KIP-932) or ``classic``."""
        classic = self.groups.get(group_id)  # a stored share group comes back as an empty Group of type "share"
        if group_id in self._share_groups() or (self.store.protocol_types.get(group_id) == "share"
                                                and (classic is None or (classic.protocol_type == "share"
                                                                         and not classic.members))
                                                and group_id not in self.consumer.groups):
            return "share"
        return "consumer" if group_id in self.consumer.groups else "classic"

    def describe_group(self, group_id: str, topics: dict[str, TopicInfo] | None = None) -> dict[str, Any]:
        """DescribeGroups' view: member metadata/assignment only when Stable, as Kafka does; a
        consumer group as Kafka's ConsumerGroup.asDescribedGroup shows it to classic tools."""
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None:
            return self._describe_consumer_group(consumer_group, topics or {})
        if self.group_type(group_id) == "share":  # Kafka's DescribeGroups (v0-v5) on a share group: Dead
            return {"group_id": group_id, "group_state": DEAD, "protocol_type": "", "protocol_data": "", "members": []}
        group = self.groups.get(group_id)
        if group is None:
            return {"group_id": group_id, "group_state": DEAD, "protocol_type": "", "protocol_data": "",
                    "members": []}
        stable = group.state == STABLE and group.protocol_name is not None
        members = []
        for m in group.members.values():
            members.append({
                "member_id": m.member_id, "group_instance_id": m.group_instance_id,
                "client_id": m.client_id, "client_host": m.client_host,
                "member_metadata": m.metadata_or_empty(group.protocol_name) if stable else b"",
                "member_assignment": m.assignment if stable else b"",
            })
        return {"group_id": group_id, "group_state": group.state,
                "protocol_type": group.protocol_type or "",
                "protocol_data": group.protocol_name if stable else "", "members": members}

    def _describe_consumer_group(self, group: ConsumerGroup, topics: dict[str, TopicInfo]) -> dict[str, Any]:
        names = {info.topic_id: info.name for info in topics.values()}
        members = []
        for m in group.members.values():
            assigned = {names[tid]: sorted(ps) for tid, ps in m.assigned.items() if tid in names and ps}
            members.append({
                "member_id": m.member_id, "group_instance_id": m.instance_id,
                "client_id": m.client_id, "client_host": m.client_host,
                "member_metadata": encode_consumer_subscription(sorted(m.subscribed_topic_names)),
                "member_assignment": encode_consumer_assignment(assigned),
            })
        return {"group_id": group.group_id, "group_state": group.state, "protocol_type": "consumer",
                "protocol_data": group.assignor_name or self.consumer.preferred_assignor(group), "members": members}

    # -- KIP-848 consumer groups (ConsumerGroupHeartbeat, ConsumerGroupDescribe)
    def consumer_group_heartbeat(self, req: HeartbeatRequest, topics_view: TopicsView) -> HeartbeatResult:
        """Join, heartbeat or leave a consumer group; raises HeartbeatError. A group id with a
        non-empty classic group is not a consumer group (GROUP_ID_NOT_FOUND, as Kafka answers
        with group.consumer.migration.policy=disabled); an empty one becomes a consumer group."""
        if not req.group_id:
            raise HeartbeatError(ErrorCode.invalid_request, "GroupId can't be empty.")
        if not self.active:
            raise HeartbeatError(ErrorCode.coordinator_not_available, "The coordinator is not available.")
        classic = self.groups.get(req.group_id)
        if classic is not None and req.group_id not in self.consumer.groups and (classic.members or classic.pending_members):
            raise HeartbeatError(ErrorCode.group_id_not_found, f"Group {req.group_id} is not a consumer group.")
        if self.group_type(req.group_id) == "share":
            raise HeartbeatError(ErrorCode.group_id_not_found, f"Group {req.group_id} is not a consumer group.")
        result = self.consumer.heartbeat(req, topics_view)
        if req.group_id in self.consumer.groups and self.store.protocol_types.get(req.group_id) != "consumer":
            # So ListGroups still names the protocol type once the group is unloaded.
            self.store.append_behind([{"type": "group", "group": req.group_id, "protocol_type": "consumer"}])
        return result

    def describe_consumer_group(self, group_id: str, topics: dict[str, TopicInfo]) -> tuple[int, dict[str, Any]]:
        """ConsumerGroupDescribe: (error, DescribedGroup fields); GROUP_ID_NOT_FOUND for a
        classic or unknown group, as Kafka answers (clients then ask DescribeGroups)."""
        group = self.consumer.groups.get(group_id)
        if group is None:
            return ErrorCode.group_id_not_found, {}
        return ErrorCode.none, self.consumer.describe(group, topics)

    def describe(self, group_id: str) -> dict[str, Any]:
        """For kcli's tools: everything known about ``group_id`` (state Dead when unknown)."""
        group = self.groups.get(group_id)
        offsets = {f"{t}-{p}": om.offset for (t, p), om in sorted(self.store.group_offsets(group_id).items())}
        if group is None:
            return {"group_id": group_id, "state": DEAD, "protocol_type": "", "protocol": "",
                    "generation_id": -1, "leader": "", "members": [], "offsets": offsets}
        members = []
        for m in group.members.values():
            meta = m.metadata_or_empty(group.protocol_name)
            members.append({
                "member_id": m.member_id, "group_instance_id": m.group_instance_id,
                "client_id": m.client_id, "client_host": m.client_host,
                "session_timeout_ms": m.session_timeout_ms, "rebalance_timeout_ms": m.rebalance_timeout_ms,
                "metadata": meta, "assignment": m.assignment,
            })
        return {"group_id": group_id, "state": group.state, "protocol_type": group.protocol_type or "",
                "protocol": group.protocol_name or "", "generation_id": group.generation_id,
                "leader": group.leader_id or "", "members": members, "offsets": offsets}

    async def delete_groups(self, group_ids: Iterable[str]) -> dict[str, int]:
        """Delete Empty groups and their offsets; NON_EMPTY_GROUP for groups with members."""
        out: dict[str, int] = {}
        for gid in group_ids:
            if not self.active:
                out[gid] = ErrorCode.coordinator_not_available
                continue
            if self.share is not None and self.group_type(gid) == "share":  # KIP-932: the group and its share state
                out[gid] = await self.share.delete_group(gid)
                continue
            consumer_group = self.consumer.groups.get(gid)
            if consumer_group is not None:
                if not consumer_group.is_empty():
                    out[gid] = ErrorCode.non_empty_group
                    continue
                self.consumer.drop(gid)
                if gid not in self.groups:
                    out[gid] = ErrorCode.none
                    continue
            group = self.groups.get(gid)
            if group is None or group.state == DEAD:
                out[gid] = ErrorCode.group_id_not_found
            elif group.state != EMPTY:
                out[gid] = ErrorCode.non_empty_group
            else:
                self._remove_group(group)
                out[gid] = ErrorCode.none
        return out

    def _remove_group(self, group: Group) -> None:
        self._unload(group)
        group.transition(DEAD)
        self.groups.pop(group.group_id, None)
        if self.store.has_offsets(group.group_id) or group.group_id in self.store.protocol_types:
            self.store.append_behind([{"type": "group_delete", "group": group.group_id}])
        log.info("group %s deleted", group.group_id)

    # -- retention (Kafka's offsets.retention.minutes / offsets.retention.check.interval.ms)
    async def _cleanup_loop(self) -> None:
        while True:
            await asyncio.sleep(self._cfg("offsets.retention.check.interval.ms") / 1000.0)
            try:
                await self.load_coordinated_groups()
            except OffsetStoreError as err:
                log.warning("cannot load the groups this broker coordinates: %s", err)
            try:
                self.expire_offsets()
            except Exception:
                log.exception("offsets cleanup failed")

    async def load_coordinated_groups(self) -> int:
        """Load every stored group this broker coordinates and has not loaded (Kafka loads its
        whole offsets partitions), so that retention also reaches groups nobody asked about
        since they moved here; they age from now, never from a guess. Returns how many."""
        loaded = 0
        for gid in sorted(await self.store.stored_groups()):
            if self.active and gid not in self._loaded and self.owns(gid) and await self.route(gid) == ErrorCode.none:
                loaded += 1
        return loaded

    def expire_offsets(self, now_ms: int | None = None) -> int:
        """Drop offsets past retention and forget Empty groups without offsets; returns count."""
        now = _now_ms() if now_ms is None else now_ms
        retention = self._cfg("offsets.retention.minutes") * 60_000
        removed = 0
        for gid, consumer_group in list(self.consumer.groups.items()):
            if consumer_group.is_empty() and not self.store.has_offsets(gid) and gid not in self.groups:
                self.consumer.drop(gid)
        for group in list(self.groups.values()):
            if group.protocol_type == "share" or group.group_id in self._share_groups():
                continue  # KIP-932: a share group's state goes only with the group (DeleteGroups)
            consumer_group = self.consumer.groups.get(group.group_id)
            if consumer_group is not None and not consumer_group.is_empty():
                # Its members are consuming: Kafka keeps their offsets, and retention counts
                # from when the group becomes empty (this check's interval at most later).
                group.state_timestamp_ms = now
                group.protocol_type = group.protocol_type or "consumer"
                continue
            offs = self.store.group_offsets(group.group_id)
            expired: list[tuple[str, int]] = []
            if group.protocol_type and group.state == EMPTY:
                # No consumers left: everything goes once the group has been empty long enough.
                if group.state_timestamp_ms + retention <= now:
                    expired = list(offs)
            elif not group.protocol_type:
                # Standalone committer: each offset ages from its own commit.
                expired = [tp for tp, om in offs.items() if om.commit_timestamp_ms + retention <= now]
            elif group.state == STABLE:
                subscribed = group.subscribed_topics()
                if subscribed is not None:
                    expired = [tp for tp, om in offs.items()
                               if tp[0] not in subscribed and om.commit_timestamp_ms + retention <= now]
            if expired:
                self.store.append_behind([{"type": "offset_delete", "group": group.group_id,
                                           "topic": t, "partition": p} for t, p in expired])
                removed += len(expired)
            if group.state == EMPTY and not group.members and not self.store.has_offsets(group.group_id) \
                    and not group.pending_members:
                self._remove_group(group)
        if removed:
            log.info("expired %d committed offsets", removed)
        return removed


def _inconsistent(requested: str | None, current: str | None) -> bool:
    return requested is not None and current is not None and requested != current
