"""KIP-848 consumer groups ("group.protocol=consumer"): Kafka's GroupMetadataManager and
ConsumerGroup for the ConsumerGroupHeartbeat API.

The coordinator owns the assignment. Three epochs drive it, as in Kafka:

* the **group epoch** is bumped whenever the membership or a subscription changes (a member
  joins, leaves, is fenced, changes its subscription, or a subscribed topic's partitions change);
* the **target assignment epoch** is the group epoch the target assignment was computed for
  (the server-side assignor runs when the group epoch moves past it);
* each member's **member epoch** reaches the target epoch once it is reconciled.

Reconciliation is incremental (Kafka's CurrentAssignmentBuilder): a member first gives up the
partitions it must revoke (it stays at its epoch, UNREVOKED_PARTITIONS, until its heartbeat no
longer lists them as owned), then moves to the target epoch; a partition another member still
owns or is revoking is not handed to its new owner until released (UNRELEASED_PARTITIONS). So no
partition ever has two owners, and a member never loses a partition its target keeps.

Membership lives in memory on the coordinating broker, as kcli's classic groups do: after a
restart or a coordinator failover the group starts empty and members that heartbeat with their
old epoch get UNKNOWN_MEMBER_ID, on which clients rejoin with epoch 0 (Kafka instead replays the
group's records from ``__consumer_offsets``). Committed offsets are durable as for classic groups.

Everything runs on the broker's event loop; timers are loop timers handed in by the coordinator.
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from kio.schema.errors import ErrorCode

from kcli.coordinator.group.assignors import MemberSpec, TopicInfo, make_assignor

log = logging.getLogger("kcli.coordinator.group.consumer_group")

# Kafka's sentinel member epochs (ConsumerGroupHeartbeatRequest).
JOIN_GROUP_MEMBER_EPOCH = 0
LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2

# Member states (Kafka's MemberState).
MEMBER_STABLE = "stable"
MEMBER_UNREVOKED = "unrevoked_partitions"
MEMBER_UNRELEASED = "unreleased_partitions"

# Group states, spelled as Kafka's ConsumerGroupState reports them.
EMPTY = "Empty"
ASSIGNING = "Assigning"
RECONCILING = "Reconciling"
STABLE = "Stable"
DEAD = "Dead"

CONSUMER_PROTOCOL_TYPE = "consumer"

Assignment = dict[uuid.UUID, set[int]]
TopicsView = Callable[[], dict[str, TopicInfo]]


class HeartbeatError(Exception):
    """A ConsumerGroupHeartbeat answered with ``code`` (and Kafka's message)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = int(code)
        self.message = message


@dataclass
class HeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None
    rack_id: str | None
    rebalance_timeout_ms: int
    subscribed_topic_names: list[str] | None
    subscribed_topic_regex: str | None
    server_assignor: str | None
    owned: list[tuple[uuid.UUID, list[int]]] | None  # topic_partitions; None: unchanged
    client_id: str = ""
    client_host: str = ""
    api_version: int = 1


@dataclass
class HeartbeatResult:
    error: int = ErrorCode.none
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None  # None: not sent (unchanged)


@dataclass(eq=False)
class ConsumerMember:
    """One member (Kafka's ConsumerGroupMember)."""

    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = 300000
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: str = MEMBER_STABLE
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)
    session_timer: Any = None
    rebalance_timer: Any = None

    def subscription(self) -> tuple[Any, ...]:
        return (self.subscribed_topic_names, self.subscribed_topic_regex, self.server_assignor)

    def cancel_timers(self) -> None:
        for t in (self.session_timer, self.rebalance_timer):
            if t is not None:
                t.cancel()
        self.session_timer = self.rebalance_timer = None


def _copy(a: Assignment) -> Assignment:
    return {t: set(ps) for t, ps in a.items() if ps}


def compile_regex(pattern: str) -> re.Pattern[str]:
    """A subscription regex. Kafka uses RE2/J; kcli uses Python's ``re`` with a full match,
    which agrees with RE2 on the usual subscription patterns (``orders-.*``, ``(a|b)\\d+``)."""
    return re.compile(pattern)


class ConsumerGroup:
    """One consumer group's members, epochs and target assignment."""

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.members: dict[str, ConsumerMember] = {}
        self.static_members: dict[str, str] = {}  # instance id -> member id
        self.target: dict[str, Assignment] = {}  # member id -> target assignment
        self.subscription_metadata: dict[str, TopicInfo] = {}  # the subscribed topics as last seen
        self.assignor_name = ""

    @property
    def state(self) -> str:
        if not self.members:
            return EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ASSIGNING
        for m in self.members.values():
            if m.state != MEMBER_STABLE or m.member_epoch != self.assignment_epoch:
                return RECONCILING
        return STABLE

    def is_empty(self) -> bool:
        return not self.members

    def subscribed_topics(self, topics: dict[str, TopicInfo]) -> set[str]:
        """Every existing topic some member subscribes to (names and resolved regexes)."""
        out: set[str] = set()
        for m in self.members.values():
            out |= member_topics(m, topics)
        return out

    def owner_of(self, tp: tuple[uuid.UUID, int]) -> str | None:
        """The member that owns or is still revoking ``tp``."""
        for m in self.members.values():
            if tp[1] in m.assigned.get(tp[0], ()) or tp[1] in m.pending_revocation.get(tp[0], ()):
                return m.member_id
        return None


def member_topics(m: ConsumerMember, topics: dict[str, TopicInfo]) -> set[str]:
    out = {t for t in m.subscribed_topic_names if t in topics}
    if m.subscribed_topic_regex:
        try:
            rx = compile_regex(m.subscribed_topic_regex)
        except re.error:
            return out
        out |= {t for t in topics if rx.fullmatch(t)}
    return out


class ConsumerGroupManager:
    """The consumer groups this broker coordinates (Kafka's GroupMetadataManager, the
    ConsumerGroupHeartbeat and ConsumerGroupDescribe side).

    ``call_later(delay_ms, fn, *args)`` schedules a timer on the broker's loop; ``config(name)``
    reads an int broker config; ``assignors()`` the names of ``group.consumer.assignors``.
    """

    def __init__(self, call_later: Callable[..., Any], config: Callable[[str], int],
                 assignors: Callable[[], list[str]]) -> None:
        self._call_later = call_later
        self._config = config
        self._assignors = assignors
        self.groups: dict[str, ConsumerGroup] = {}

    # -- configs
    def session_timeout_ms(self) -> int:
        return self._config("group.consumer.session.timeout.ms")

    def heartbeat_interval_ms(self) -> int:
        return self._config("group.consumer.heartbeat.interval.ms")

    def assignor_names(self) -> list[str]:
        names = [n for n in self._assignors() if make_assignor(n) is not None]
        return names or ["uniform"]

    # -- lifecycle
    def drop(self, group_id: str) -> None:
        """Forget a group (it moved to another coordinator or was deleted)."""
        group = self.groups.pop(group_id, None)
        if group is not None:
            for m in group.members.values():
                m.cancel_timers()

    def close(self) -> None:
        for gid in list(self.groups):
            self.drop(gid)

    # -- the heartbeat
    def validate(self, req: HeartbeatRequest) -> None:
        """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid."""
        if req.instance_id is not None and req.instance_id == "":
            raise HeartbeatError(ErrorCode.invalid_request, "InstanceId can't be empty.")
        if req.rack_id is not None and req.rack_id == "":
            raise HeartbeatError(ErrorCode.invalid_request, "RackId can't be empty.")
        epoch = req.member_epoch
        if epoch > 0 or epoch == LEAVE_GROUP_MEMBER_EPOCH:
            if not req.member_id:
                raise HeartbeatError(ErrorCode.invalid_request, "MemberId can't be empty.")
        elif epoch == JOIN_GROUP_MEMBER_EPOCH:
            if req.rebalance_timeout_ms == -1:
                raise HeartbeatError(ErrorCode.invalid_request, "RebalanceTimeoutMs must be provided in first request.")
            if req.owned is None or any(parts for _, parts in req.owned):
                raise HeartbeatError(ErrorCode.invalid_request, "TopicPartitions must be empty when (re-)joining.")
            if not req.subscribed_topic_names and not req.subscribed_topic_regex:
                raise HeartbeatError(ErrorCode.invalid_request,
                                     "SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")
        elif epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            if not req.member_id:
                raise HeartbeatError(ErrorCode.invalid_request, "MemberId can't be empty.")
            if req.instance_id is None:
                raise HeartbeatError(ErrorCode.invalid_request, "InstanceId can't be null.")
        else:
            raise HeartbeatError(ErrorCode.invalid_request, "MemberEpoch is invalid.")
        if req.server_assignor is not None and req.server_assignor not in self.assignor_names():
            raise HeartbeatError(ErrorCode.unsupported_assignor,
                                 f"ServerAssignor {req.server_assignor} is not supported. Supported assignors: "
                                 f"{', '.join(self.assignor_names())}.")
        if req.subscribed_topic_regex:
            try:
                compile_regex(req.subscribed_topic_regex)
            except re.error as err:
                raise HeartbeatError(ErrorCode.invalid_regular_expression,
                                     f"SubscribedTopicRegex {req.subscribed_topic_regex!r} is not a valid "
                                     f"regular expression: {err}") from None

    def heartbeat(self, req: HeartbeatRequest, topics_view: TopicsView) -> HeartbeatResult:
        """One ConsumerGroupHeartbeat (join, heartbeat, or leave); raises HeartbeatError."""
        self.validate(req)
        if req.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
            return self._leave(req, topics_view)
        joining = req.member_epoch == JOIN_GROUP_MEMBER_EPOCH
        group = self.groups.get(req.group_id)
        if group is None:
            if not joining:
                # Kafka would know the group from its log; kcli's is in memory and gone after a
                # failover or restart, so the member is told to rejoin (clients do, with epoch 0).
                raise HeartbeatError(ErrorCode.unknown_member_id,
                                     f"Member {req.member_id} is not a member of group {req.group_id}.")
            group = self.groups[req.group_id] = ConsumerGroup(req.group_id)
        member_id = req.member_id or str(uuid.uuid4())  # v0: the coordinator names the member
        member = self._get_or_create_member(group, req, member_id, joining)
        before_subscription = member.subscription() if member.member_id in group.members else None
        before_assigned = _copy(member.assigned)
        before_epoch = member.member_epoch

        # 1. Update the member; a new member or a changed subscription bumps the group epoch.
        if req.rack_id is not None:
            member.rack_id = req.rack_id
        if req.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
        if req.subscribed_topic_names is not None:
            member.subscribed_topic_names = tuple(sorted(set(req.subscribed_topic_names)))
        if req.subscribed_topic_regex is not None:
            member.subscribed_topic_regex = req.subscribed_topic_regex or None
        if req.server_assignor is not None:
            member.server_assignor = req.server_assignor
        member.client_id, member.client_host = req.client_id, req.client_host
        bump = before_subscription is None or before_subscription != member.subscription()
        if member.member_id not in group.members:
            group.members[member.member_id] = member
            if member.instance_id is not None:
                group.static_members[member.instance_id] = member.member_id
            log.info("group %s: member %s joins using the consumer protocol", group.group_id, member.member_id)

        topics = topics_view()
        metadata = self._subscription_metadata(group, topics)
        if metadata != group.subscription_metadata:
            group.subscription_metadata = metadata
            bump = True
        if bump:
            group.group_epoch += 1
            log.info("group %s: bumped group epoch to %d", group.group_id, group.group_epoch)

        # 2. A new target assignment when the group epoch moved past the target's.
        if group.group_epoch > group.assignment_epoch:
            self._compute_target(group, topics)

        # 3. Reconcile the member towards its target.
        owned = None if req.owned is None else {tid: set(parts) for tid, parts in req.owned}
        self._reconcile(group, member, owned)
        self._schedule_session_timeout(group, member)

        full = joining or (req.rebalance_timeout_ms != -1 and req.subscribed_topic_names is not None
                           and req.owned is not None)
        changed = before_assigned != _copy(member.assigned) or before_epoch != member.member_epoch
        return HeartbeatResult(member_id=member.member_id, member_epoch=member.member_epoch,
                               heartbeat_interval_ms=self.heartbeat_interval_ms(),
                               assignment=_copy(member.assigned) if full or changed else None)

    def _get_or_create_member(self, group: ConsumerGroup, req: HeartbeatRequest, member_id: str,
                              joining: bool) -> ConsumerMember:
        if req.instance_id is None:
            member = group.members.get(member_id)
            if member is None:
                if not joining:
                    raise HeartbeatError(ErrorCode.unknown_member_id,
                                         f"Member {member_id} is not a member of group {group.group_id}.")
                return ConsumerMember(member_id)
            if joining:
                return self._rejoin(group, member)
            self._check_epoch(member, req)
            return member
        existing_id = group.static_members.get(req.instance_id)
        existing = group.members.get(existing_id) if existing_id is not None else None
        if joining:
            if existing is None:
                return ConsumerMember(member_id, instance_id=req.instance_id)
            if existing.member_id == member_id:
                return self._rejoin(group, existing)
            if existing.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                raise HeartbeatError(ErrorCode.unreleased_instance_id,
                                     f"Static member {existing.member_id} with instance id {req.instance_id} "
                                     f"is still in group {group.group_id}: {member_id} cannot replace it yet.")
            # The static member came back under a new member id: it takes over the old member's
            # assignment without a rebalance (Kafka's replaceMember).
            member = ConsumerMember(member_id, instance_id=req.instance_id, rack_id=existing.rack_id,
                                    rebalance_timeout_ms=existing.rebalance_timeout_ms,
                                    subscribed_topic_names=existing.subscribed_topic_names,
                                    subscribed_topic_regex=existing.subscribed_topic_regex,
                                    server_assignor=existing.server_assignor, member_epoch=0,
                                    previous_member_epoch=0, assigned=_copy(existing.assigned))
            existing.cancel_timers()
            del group.members[existing.member_id]
            if existing.member_id in group.target:
                group.target[member_id] = group.target.pop(existing.member_id)
            group.members[member_id] = member
            group.static_members[req.instance_id] = member_id
            log.info("group %s: static member %s rejoins as %s", group.group_id, req.instance_id, member_id)
            return member
        if existing is None:
            raise HeartbeatError(ErrorCode.unknown_member_id,
                                 f"Instance id {req.instance_id} is unknown in group {group.group_id}.")
        if existing.member_id != member_id:
            raise HeartbeatError(ErrorCode.fenced_instance_id,
                                 f"Static member {member_id} with instance id {req.instance_id} is fenced by "
                                 f"member {existing.member_id}.")
        self._check_epoch(existing, req)
        return existing

    @staticmethod
    def _rejoin(group: ConsumerGroup, member: ConsumerMember) -> ConsumerMember:
        """A known member joins again with epoch 0 (after FENCED_MEMBER_EPOCH, or a lost
        response): it owns nothing now, so what it held is released for the others."""
        member.member_epoch = 0
        member.previous_member_epoch = 0
        member.assigned = {}
        member.pending_revocation = {}
        member.state = MEMBER_STABLE
        if member.rebalance_timer is not None:
            member.rebalance_timer.cancel()
            member.rebalance_timer = None
        return member

    @staticmethod
    def _check_epoch(member: ConsumerMember, req: HeartbeatRequest) -> None:
        """Kafka's throwIfConsumerGroupMemberEpochIsInvalid."""
        got = req.member_epoch
        if got > member.member_epoch:
            raise HeartbeatError(ErrorCode.fenced_member_epoch,
                                 f"The consumer group member has a greater member epoch ({got}) than the one "
                                 f"known by the group coordinator ({member.member_epoch}). The member must "
                                 f"abandon all its partitions and rejoin.")
        if got < member.member_epoch:
            # The response carrying the bumped epoch may have been lost: accept the previous
            # epoch when the member owns no more than its current assignment.
            ok = got == member.previous_member_epoch and req.owned is not None and all(
                set(parts) <= member.assigned.get(tid, set()) for tid, parts in req.owned)
            if not ok:
                raise HeartbeatError(ErrorCode.fenced_member_epoch,
                                     f"The consumer group member has a smaller member epoch ({got}) than the one "
                                     f"known by the group coordinator ({member.member_epoch}). The member must "
                                     f"abandon all its partitions and rejoin.")

    # -- leaving and fencing
    def _leave(self, req: HeartbeatRequest, topics_view: TopicsView) -> HeartbeatResult:
        group = self.groups.get(req.group_id)
        if group is None:
            raise HeartbeatError(ErrorCode.group_id_not_found, f"Consumer group {req.group_id} not found.")
        if req.instance_id is None:
            member = group.members.get(req.member_id)
            if member is None:
                raise HeartbeatError(ErrorCode.unknown_member_id,
                                     f"Member {req.member_id} is not a member of group {group.group_id}.")
        else:
            mid = group.static_members.get(req.instance_id)
            member = group.members.get(mid) if mid is not None else None
            if member is None:
                raise HeartbeatError(ErrorCode.unknown_member_id,
                                     f"Instance id {req.instance_id} is unknown in group {group.group_id}.")
            if member.member_id != req.member_id:
                raise HeartbeatError(ErrorCode.fenced_instance_id,
                                     f"Static member {req.member_id} with instance id {req.instance_id} is fenced "
                                     f"by member {member.member_id}.")
        if req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            # A static member leaves for a while (a restart): it keeps its assignment, and its
            # instance id may rejoin under a new member id until its session times out.
            log.info("group %s: static member %s (instance %s) leaves temporarily", group.group_id,
                     member.member_id, member.instance_id)
            member.member_epoch = LEAVE_GROUP_STATIC_MEMBER_EPOCH
            if member.rebalance_timer is not None:
                member.rebalance_timer.cancel()
                member.rebalance_timer = None
            self._schedule_session_timeout(group, member)
        else:
            log.info("group %s: member %s leaves", group.group_id, member.member_id)
            self.fence(group, member, topics_view)
        return HeartbeatResult(member_id=req.member_id, member_epoch=req.member_epoch,
                               heartbeat_interval_ms=0)

    def fence(self, group: ConsumerGroup, member: ConsumerMember, topics_view: TopicsView | None) -> None:
        """Remove ``member`` (left, session or rebalance timeout): the group epoch moves on and
        its partitions go to the others at their next heartbeat."""
        member.cancel_timers()
        group.members.pop(member.member_id, None)
        group.target.pop(member.member_id, None)
        if member.instance_id is not None and group.static_members.get(member.instance_id) == member.member_id:
            del group.static_members[member.instance_id]
        group.group_epoch += 1
        if topics_view is not None:
            topics = topics_view()
            group.subscription_metadata = self._subscription_metadata(group, topics)
            self._compute_target(group, topics)
        else:
            self._last_topics_compute(group)

    def _last_topics_compute(self, group: ConsumerGroup) -> None:
        # From a timer: the target is recomputed with the topics known at the last heartbeat
        # (subscription_metadata); the next heartbeat refreshes it when topics changed.
        group.subscription_metadata = self._subscription_metadata(group, dict(group.subscription_metadata))
        self._compute_target(group, dict(group.subscription_metadata))

    # -- assignment
    @staticmethod
    def _subscription_metadata(group: ConsumerGroup, topics: dict[str, TopicInfo]) -> dict[str, TopicInfo]:
        return {t: topics[t] for t in sorted(group.subscribed_topics(topics))}

    def preferred_assignor(self, group: ConsumerGroup) -> str:
        """The assignor most members ask for (Kafka's computePreferredServerAssignor), else the
        first of ``group.consumer.assignors``."""
        names = self.assignor_names()
        votes: dict[str, int] = {}
        for m in group.members.values():
            if m.server_assignor:
                votes[m.server_assignor] = votes.get(m.server_assignor, 0) + 1
        if not votes:
            return names[0]
        return max(votes, key=lambda n: (votes[n], -names.index(n) if n in names else -len(names)))

    def _compute_target(self, group: ConsumerGroup, topics: dict[str, TopicInfo]) -> None:
        name = self.preferred_assignor(group)
        assignor = make_assignor(name) or make_assignor("uniform")
        assert assignor is not None
        subscribed = group.subscribed_topics(topics)
        view = {t: topics[t] for t in subscribed}
        specs = [MemberSpec(m.member_id, m.instance_id, frozenset(member_topics(m, view)),
                            _copy(group.target.get(m.member_id, {})))
                 for m in group.members.values()]
        group.target = {mid: _copy(a) for mid, a in assignor.assign(specs, view).items()}
        group.assignment_epoch = group.group_epoch
        group.assignor_name = assignor.name
        log.info("group %s: target assignment for epoch %d by %s: %s", group.group_id, group.assignment_epoch,
                 assignor.name, {mid: {str(t): sorted(p) for t, p in a.items()} for mid, a in group.target.items()})

    def _reconcile(self, group: ConsumerGroup, member: ConsumerMember, owned: Assignment | None) -> None:
        """Kafka's CurrentAssignmentBuilder: move the member one step towards its target."""
        target_epoch = group.assignment_epoch
        if member.state == MEMBER_STABLE:
            if member.member_epoch == target_epoch:
                return
            self._next_assignment(group, member, member.member_epoch, owned)
        elif member.state == MEMBER_UNREVOKED:
            if self._owns_any(owned, member.pending_revocation):
                return
            self._next_assignment(group, member, member.member_epoch + 1, owned)
        else:  # unreleased partitions: take them once their previous owners let go
            self._next_assignment(group, member, member.member_epoch, owned)
        if member.state == MEMBER_UNREVOKED:
            if member.rebalance_timer is None:
                member.rebalance_timer = self._call_later(member.rebalance_timeout_ms, self._rebalance_timeout,
                                                          group, member.member_id, member.member_epoch)
        elif member.rebalance_timer is not None:
            member.rebalance_timer.cancel()
            member.rebalance_timer = None

    @staticmethod
    def _owns_any(owned: Assignment | None, revoking: Assignment) -> bool:
        if owned is None:
            return True  # unknown: assume it still owns them
        return any(owned.get(tid, set()) & parts for tid, parts in revoking.items())

    def _set_epoch(self, member: ConsumerMember, epoch: int) -> None:
        if epoch != member.member_epoch:
            member.previous_member_epoch = member.member_epoch
            member.member_epoch = epoch

    def _next_assignment(self, group: ConsumerGroup, member: ConsumerMember, epoch: int,
                         owned: Assignment | None) -> None:
        target = group.target.get(member.member_id, {})
        assigned: Assignment = {}
        revoking: Assignment = {}
        pending: Assignment = {}
        unreleased = False
        for tid in set(target) | set(member.assigned):
            want = target.get(tid, set())
            have = member.assigned.get(tid, set())
            keep = have & want
            if keep:
                assigned[tid] = set(keep)
            if have - keep:
                revoking[tid] = have - keep
            new = set()
            for p in want - keep:
                owner = group.owner_of((tid, p))
                if owner is not None and owner != member.member_id:
                    unreleased = True
                else:
                    new.add(p)
            if new:
                pending[tid] = new
        if revoking and self._owns_any(owned, revoking):
            member.state = MEMBER_UNREVOKED
            self._set_epoch(member, epoch)
            member.assigned = assigned
            member.pending_revocation = revoking
            return
        for tid, parts in pending.items():
            assigned.setdefault(tid, set()).update(parts)
        member.state = MEMBER_UNRELEASED if unreleased else MEMBER_STABLE
        self._set_epoch(member, group.assignment_epoch)
        member.assigned = assigned
        member.pending_revocation = {}

    # -- timers
    def _schedule_session_timeout(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()
        member.session_timer = self._call_later(self.session_timeout_ms(), self._session_timeout,
                                                group, member.member_id)

    def _session_timeout(self, group: ConsumerGroup, member_id: str) -> None:
        if self.groups.get(group.group_id) is not group:
            return
        member = group.members.get(member_id)
        if member is None:
            return
        member.session_timer = None
        log.info("group %s: member %s failed its session timeout, fencing it", group.group_id, member_id)
        self.fence(group, member, None)

    def _rebalance_timeout(self, group: ConsumerGroup, member_id: str, epoch: int) -> None:
        if self.groups.get(group.group_id) is not group:
            return
        member = group.members.get(member_id)
        if member is None:
            return
        member.rebalance_timer = None
        if member.member_epoch == epoch and member.state == MEMBER_UNREVOKED:
            log.info("group %s: member %s did not revoke its partitions within its rebalance timeout, fencing it",
                     group.group_id, member_id)
            self.fence(group, member, None)

    # -- offsets (ConsumerGroup.validateOffsetCommit / validateOffsetFetch)
    def validate_offset_commit(self, group: ConsumerGroup, member_id: str, member_epoch: int,
                               api_version: int, transactional: bool = False) -> int:
        if member_epoch < 0 and not group.members:
            return ErrorCode.none  # an admin tool or a consumer without group management
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if not transactional and api_version < 9:
            return ErrorCode.unsupported_version  # consumer-protocol members commit with v9+
        if member_epoch != member.member_epoch:
            return ErrorCode.stale_member_epoch
        return ErrorCode.none

    def validate_offset_fetch(self, group: ConsumerGroup, member_id: str | None, member_epoch: int) -> int:
        if member_id is None and member_epoch < 0:
            return ErrorCode.none
        member = group.members.get(member_id or "")
        if member is None:
            return ErrorCode.unknown_member_id
        if member_epoch != member.member_epoch:
            return ErrorCode.stale_member_epoch
        return ErrorCode.none

    # -- describing
    def describe(self, group: ConsumerGroup, topics: dict[str, TopicInfo]) -> dict[str, Any]:
        """ConsumerGroupDescribe's DescribedGroup fields (without error code)."""
        by_id = {info.topic_id: info.name for info in topics.values()}

        def parts(a: Assignment) -> dict[str, Any]:
            return {"topic_partitions": [{"topic_id": tid, "topic_name": by_id.get(tid, ""), "partitions": sorted(ps)}
                                         for tid, ps in sorted(a.items(), key=lambda kv: by_id.get(kv[0], str(kv[0])))
                                         if ps]}

        members = []
        for m in group.members.values():
            members.append({
                "member_id": m.member_id, "instance_id": m.instance_id, "rack_id": m.rack_id,
                "member_epoch": m.member_epoch, "client_id": m.client_id, "client_host": m.client_host,
                "subscribed_topic_names": list(m.subscribed_topic_names),
                "subscribed_topic_regex": m.subscribed_topic_regex,
                "assignment": parts(m.assigned), "target_assignment": parts(group.target.get(m.member_id, {})),
                "member_type": 1,  # v1: consumer protocol
            })
        return {"group_id": group.group_id, "group_state": group.state, "group_epoch": group.group_epoch,
                "assignment_epoch": group.assignment_epoch,
                "assignor_name": group.assignor_name or self.preferred_assignor(group), "members": members}
