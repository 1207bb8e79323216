"""KIP-932 share groups: membership, epochs and the server-side assignment (Kafka's
GroupMetadataManager, the ShareGroupHeartbeat / ShareGroupDescribe side, and ShareGroup).

The same epochs as KIP-848 consumer groups (kcli/coordinator/group/consumer_group.py):

* the **group epoch** moves whenever a member joins, leaves, is fenced or changes its
  subscription, or a subscribed topic's partitions change;
* the **assignment epoch** is the group epoch the target assignment was computed for (by the
  ``simple`` assignor, kcli/coordinator/share/assignor.py);
* a member's **member epoch** is the assignment epoch it was last given.

Unlike consumer groups there is nothing to revoke: a share partition may be assigned to several
members at once (the share-partition leader hands each record to one member at a time), so a
member moves straight to its target assignment at its next heartbeat.

Membership lives in memory on the coordinating broker, as kcli's other groups do: after a restart
a member heartbeating with its old epoch gets UNKNOWN_MEMBER_ID and rejoins with epoch 0. The
share partitions' state (what was delivered and acknowledged) is durable
(kcli/coordinator/share/persister.py). Everything runs on the broker's event loop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from kio.schema.errors import ErrorCode

from kcli.coordinator.group.assignors import MemberSpec, TopicInfo
from kcli.coordinator.group.consumer_group import JOIN_GROUP_MEMBER_EPOCH, LEAVE_GROUP_MEMBER_EPOCH, HeartbeatError
from kcli.coordinator.share.assignor import SIMPLE, SimpleAssignor

log = logging.getLogger("kcli.coordinator.share.group")


# Kafka's ShareGroup.ShareGroupState names.
EMPTY = "Empty"
STABLE = "Stable"
DEAD = "Dead"

SHARE_PROTOCOL_TYPE = "share"  # what ListGroups names as protocol type and group type

Assignment = dict[Any, set[int]]  # topic id -> partitions
TopicsView = Callable[[], dict[str, TopicInfo]]


class ShareGroupError(HeartbeatError):
    """A ShareGroupHeartbeat answered with ``code`` and Kafka's message."""


@dataclass
class ShareHeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    rack_id: str | None
    subscribed_topic_names: list[str] | None  # None: unchanged
    client_id: str = ""
    client_host: str = ""


@dataclass
class ShareHeartbeatResult:
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: Assignment | None = None  # None: not sent (unchanged)


@dataclass(eq=False)
class ShareMember:
    member_id: str
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    member_epoch: int = 0
    assigned: Assignment = field(default_factory=dict)
    session_timer: Any = None

    def cancel_timers(self) -> None:
        if self.session_timer is not None:
            self.session_timer.cancel()
            self.session_timer = None


class ShareGroup:
    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.members: dict[str, ShareMember] = {}
        self.target: dict[str, Assignment] = {}
        self.subscription_metadata: dict[str, TopicInfo] = {}

    @property
    def state(self) -> str:
        return STABLE if self.members else EMPTY

    def is_empty(self) -> bool:
        return not self.members

    def subscribed_topics(self, topics: dict[str, TopicInfo]) -> set[str]:
        return {t for m in self.members.values() for t in m.subscribed_topic_names if t in topics}

    def assigned_partitions(self) -> dict[Any, set[int]]:
        out: dict[Any, set[int]] = {}
        for a in self.target.values():
            for tid, ps in a.items():
                out.setdefault(tid, set()).update(ps)
        return out


def _copy(a: Assignment) -> Assignment:
    return {t: set(ps) for t, ps in a.items() if ps}


class ShareGroupListener:
    """What the share-partition side hears from the groups (kcli/coordinator/share/manager.py)."""

    def on_assignment(self, group_id: str, partitions: dict[Any, set[int]]) -> None:  # pragma: no cover
        ...

    def on_member_left(self, group_id: str, member_id: str) -> None:  # pragma: no cover
        ...


class ShareGroupManager:
    """The share groups this broker coordinates.

    ``call_later(delay_ms, fn, *args)`` schedules a loop timer; ``config(name)`` reads an int
    broker config; ``listener`` hears of assignments (so share partitions initialize their start
    offset before members fetch, as Kafka's InitializeShareGroupState) and of members that left
    or were fenced (their acquired records are released at once).
    """

    def __init__(self, call_later: Callable[..., Any], config: Callable[[str], int],
                 listener: ShareGroupListener | None = None) -> None:
        self._call_later = call_later
        self._config = config
        self.listener = listener
        self.groups: dict[str, ShareGroup] = {}
        self.assignor = SimpleAssignor()

    def session_timeout_ms(self) -> int:
        return self._config("group.share.session.timeout.ms")

    def heartbeat_interval_ms(self) -> int:
        return self._config("group.share.heartbeat.interval.ms")

    # -- lifecycle
    def drop(self, group_id: str) -> None:
        group = self.groups.pop(group_id, None)
        if group is not None:
            for m in group.members.values():
                m.cancel_timers()

    def close(self) -> None:
        for gid in list(self.groups):
            self.drop(gid)

    # -- the heartbeat
    @staticmethod
    def validate(req: ShareHeartbeatRequest) -> None:
        """Kafka's throwIfShareGroupHeartbeatRequestIsInvalid."""
        if not req.group_id:
            raise ShareGroupError(ErrorCode.invalid_request, "GroupId can't be empty.")
        if not req.member_id:
            raise ShareGroupError(ErrorCode.invalid_request, "MemberId can't be empty.")
        if req.rack_id is not None and req.rack_id == "":
            raise ShareGroupError(ErrorCode.invalid_request, "RackId can't be empty.")
        if req.member_epoch == JOIN_GROUP_MEMBER_EPOCH:
            if not req.subscribed_topic_names:
                raise ShareGroupError(ErrorCode.invalid_request, "SubscribedTopicNames must be set in first request.")
        elif req.member_epoch < LEAVE_GROUP_MEMBER_EPOCH:
            raise ShareGroupError(ErrorCode.invalid_request, "MemberEpoch is invalid.")

    def heartbeat(self, req: ShareHeartbeatRequest, topics_view: TopicsView) -> ShareHeartbeatResult:
        self.validate(req)
        if req.member_epoch == LEAVE_GROUP_MEMBER_EPOCH:
            return self._leave(req, topics_view)
        joining = req.member_epoch == JOIN_GROUP_MEMBER_EPOCH
        group = self.groups.get(req.group_id)
        if group is None:
            if not joining:
                # Kafka knows the group from its log; kcli's is in memory and gone after a restart
                # or a coordinator move: the member is told to rejoin (clients do, with epoch 0).
                raise ShareGroupError(ErrorCode.unknown_member_id,
                                      f"Member {req.member_id} is not a member of group {req.group_id}.")
            group = self.groups[req.group_id] = ShareGroup(req.group_id)
        member = group.members.get(req.member_id)
        new_member = member is None
        if member is None:
            if not joining:
                raise ShareGroupError(ErrorCode.unknown_member_id,
                                      f"Member {req.member_id} is not a member of group {req.group_id}.")
            if len(group.members) >= self._config("group.share.max.size"):
                raise ShareGroupError(ErrorCode.group_max_size_reached,
                                      f"The share group has reached its maximum capacity of "
                                      f"{self._config('group.share.max.size')} members.")
            member = ShareMember(req.member_id)
        elif not joining and req.member_epoch != member.member_epoch:
            raise ShareGroupError(ErrorCode.fenced_member_epoch,
                                  f"The share group member has a {'greater' if req.member_epoch > member.member_epoch else 'smaller'} "
                                  f"member epoch ({req.member_epoch}) than the one known by the group coordinator "
                                  f"({member.member_epoch}). The member must abandon all its partitions and rejoin.")
        before_assigned = _copy(member.assigned)
        before_epoch = member.member_epoch
        bump = new_member
        if req.rack_id is not None:
            member.rack_id = req.rack_id
        if req.subscribed_topic_names is not None:
            names = tuple(sorted(set(req.subscribed_topic_names)))
            bump = bump or names != member.subscribed_topic_names
            member.subscribed_topic_names = names
        member.client_id, member.client_host = req.client_id, req.client_host
        if new_member:
            group.members[member.member_id] = member
            log.info("share group %s: member %s joins", group.group_id, member.member_id)
        topics = topics_view()
        metadata = {t: topics[t] for t in sorted(group.subscribed_topics(topics))}
        if metadata != group.subscription_metadata:
            group.subscription_metadata = metadata
            bump = True
        if bump:
            group.group_epoch += 1
        if group.group_epoch > group.assignment_epoch:
            self._compute_target(group, topics)
        member.member_epoch = group.assignment_epoch
        member.assigned = _copy(group.target.get(member.member_id, {}))
        self._schedule_session_timeout(group, member)
        changed = before_assigned != member.assigned or before_epoch != member.member_epoch
        full = joining or req.subscribed_topic_names is not None
        return ShareHeartbeatResult(member.member_id, member.member_epoch, self.heartbeat_interval_ms(),
                                    _copy(member.assigned) if (changed or full) else None)

    def _leave(self, req: ShareHeartbeatRequest, topics_view: TopicsView | None) -> ShareHeartbeatResult:
        group = self.groups.get(req.group_id)
        if group is None:
            raise ShareGroupError(ErrorCode.group_id_not_found, f"Share group {req.group_id} not found.")
        member = group.members.get(req.member_id)
        if member is None:
            raise ShareGroupError(ErrorCode.unknown_member_id,
                                  f"Member {req.member_id} is not a member of group {group.group_id}.")
        log.info("share group %s: member %s leaves", group.group_id, member.member_id)
        self.fence(group, member, topics_view)
        return ShareHeartbeatResult(req.member_id, LEAVE_GROUP_MEMBER_EPOCH, 0)

    def fence(self, group: ShareGroup, member: ShareMember, topics_view: TopicsView | None) -> None:
        member.cancel_timers()
        group.members.pop(member.member_id, None)
        group.target.pop(member.member_id, None)
        group.group_epoch += 1
        topics = topics_view() if topics_view is not None else dict(group.subscription_metadata)
        group.subscription_metadata = {t: topics[t] for t in sorted(group.subscribed_topics(topics))}
        self._compute_target(group, topics)
        if self.listener is not None:
            self.listener.on_member_left(group.group_id, member.member_id)

    def _compute_target(self, group: ShareGroup, topics: dict[str, TopicInfo]) -> None:
        view = {t: topics[t] for t in group.subscribed_topics(topics)}
        specs = [MemberSpec(m.member_id, None, frozenset(t for t in m.subscribed_topic_names if t in view),
                            _copy(group.target.get(m.member_id, {})))
                 for m in group.members.values()]
        group.target = {mid: _copy(a) for mid, a in self.assignor.assign(specs, view).items()}
        group.assignment_epoch = group.group_epoch
        log.info("share group %s: target assignment for epoch %d: %s", group.group_id, group.assignment_epoch,
                 {mid: {str(t): sorted(p) for t, p in a.items()} for mid, a in group.target.items()})
        if self.listener is not None and group.target:
            self.listener.on_assignment(group.group_id, group.assigned_partitions())

    # -- timers
    def _schedule_session_timeout(self, group: ShareGroup, member: ShareMember) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()
        member.session_timer = self._call_later(self.session_timeout_ms(), self._session_timeout,
                                                group, member.member_id)

    def _session_timeout(self, group: ShareGroup, member_id: str) -> None:
        if self.groups.get(group.group_id) is not group:
            return
        member = group.members.get(member_id)
        if member is None:
            return
        member.session_timer = None
        log.info("share group %s: member %s failed its session timeout, fencing it", group.group_id, member_id)
        self.fence(group, member, None)

    # -- describing
    def describe(self, group: ShareGroup, topics: dict[str, TopicInfo]) -> dict[str, Any]:
        """ShareGroupDescribe's DescribedGroup fields (without the error code)."""
        by_id = {info.topic_id: info.name for info in topics.values()}

        def parts(a: Assignment) -> dict[str, Any]:
            return {"topic_partitions": [{"topic_id": tid, "topic_name": by_id.get(tid, ""), "partitions": sorted(ps)}
                                         for tid, ps in sorted(a.items(), key=lambda kv: by_id.get(kv[0], str(kv[0])))
                                         if ps]}

        members = [{"member_id": m.member_id, "rack_id": m.rack_id, "member_epoch": m.member_epoch,
                    "client_id": m.client_id, "client_host": m.client_host,
                    "subscribed_topic_names": list(m.subscribed_topic_names), "assignment": parts(m.assigned)}
                   for m in group.members.values()]
        return {"group_id": group.group_id, "group_state": group.state, "group_epoch": group.group_epoch,
                "assignment_epoch": group.assignment_epoch, "assignor_name": SIMPLE, "members": members}
