"""Share groups (KIP-932), as kafka-share-groups.sh (ShareGroupCommand) does them: list,
describe (state, members, start offsets and lag), reset offsets, delete offsets, delete.

librdkafka's AdminClient has no share-group calls, so these go through kcli's own protocol client:
ListGroups (types "share") to every broker, ShareGroupDescribe and the share-group offsets APIs
(DescribeShareGroupOffsets, AlterShareGroupOffsets, DeleteShareGroupOffsets) to the group's
coordinator, DeleteGroups through the AdminClient. Every function takes a :class:`Connection` and
returns dataclasses, so runbooks can chain them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from confluent_kafka.admin import OffsetSpec

from kcli.errors import KafkaApiError, OperationError, UsageError
from kcli.ops.connection import Connection, admin
from kcli.ops.groups import _expand, validate_group_id
from kcli.ops.topics import list_offsets

SHARE_STATES = ("Empty", "Stable", "Dead")
RESET_KINDS = ("earliest", "latest", "offset")


def _error_name(code: int) -> str:
    from kcli.protocol.errors import error_name

    return error_name(int(code))


@dataclass
class ShareGroupListing:
    group: str
    state: str
    type: str = "share"


@dataclass
class ShareMemberDescription:
    member_id: str
    client_id: str
    host: str
    member_epoch: int
    rack: str | None
    subscribed_topics: list[str]
    assignment: list[dict[str, Any]]  # [{"topic": t, "partition": p}, ...]


@dataclass
class SharePartitionOffset:
    """One row of ``kafka-share-groups --describe --offsets``."""

    topic: str
    partition: int
    start_offset: int | None  # the share-partition start offset; None: not initialized
    leader_epoch: int | None
    lag: int | None


@dataclass
class ShareGroupDescription:
    group: str
    state: str
    coordinator: int | None
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: list[ShareMemberDescription]
    offsets: list[SharePartitionOffset]
    type: str = "share"

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "type": self.type, "state": self.state, "coordinator": self.coordinator,
                "group_epoch": self.group_epoch, "assignment_epoch": self.assignment_epoch,
                "assignor": self.assignor, "members": [vars(m) for m in self.members],
                "offsets": [vars(o) for o in self.offsets],
                "total_lag": sum(o.lag for o in self.offsets if o.lag is not None)}


@dataclass
class ShareOffsetReset:
    topic: str
    partition: int
    current_start_offset: int | None
    new_start_offset: int


@dataclass
class ShareResetResult:
    group: str
    executed: bool
    offsets: list[ShareOffsetReset] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "dry_run": not self.executed, "executed": self.executed,
                "offsets": [vars(o) for o in self.offsets]}


@dataclass
class ShareDeleteResult:
    group: str
    deleted: bool
    error: str | None = None


@dataclass
class ShareOffsetDeletion:
    topic: str
    error: str | None


# --- wire helpers ------------------------------------------------------------------------


def _coordinator(conn: Connection, group: str) -> Any:
    from kcli.ops.brokers import coordinator_client

    return coordinator_client(conn, group, 0, "share group")


def _raw_describe(conn: Connection, group: str) -> tuple[Any, int | None]:
    """ShareGroupDescribe of one group at its coordinator: (described group, coordinator id)."""
    with _coordinator(conn, group) as wire:
        resp = wire.request(77, 1, {"group_ids": [group], "include_authorized_operations": False})
        found = wire.request(10, 3, {"key": group, "key_type": 0})
    return resp.groups[0], (int(found.node_id) if not found.error_code else None)


def _not_share(group: str, described: Any) -> KafkaApiError:
    msg = described.error_message or f"Group {group} not found."
    if "not a share group" in msg:
        return KafkaApiError("GROUP_ID_NOT_FOUND", f"group '{group}' is not a share group")
    return KafkaApiError("GROUP_ID_NOT_FOUND", f"share group '{group}' does not exist")


# --- list ----------------------------------------------------------------------------------


def list_share_groups(conn: Connection, states: Sequence[str] = ()) -> list[ShareGroupListing]:
    """ListGroups (v5, types "share") on every broker, sorted by name."""
    wanted = {s.strip().lower() for s in states if s.strip()}
    unknown = sorted(wanted - {s.lower() for s in SHARE_STATES})
    if unknown:
        raise UsageError(f"--state: unknown state {unknown[0]!r}; use one of {', '.join(SHARE_STATES)}")
    from kcli.ops.brokers import cluster_view, wire_client

    view = cluster_view(conn)
    out: dict[str, ShareGroupListing] = {}
    for b in view.brokers:
        with wire_client(conn, view.address(b)) as wire:
            resp = wire.request(16, 5, {"states_filter": [], "types_filter": ["share"]})
        if resp.error_code:
            raise KafkaApiError(_error_name(resp.error_code), "list share groups: the broker refused ListGroups")
        for g in resp.groups:
            out[g.group_id] = ShareGroupListing(g.group_id, g.group_state)
    rows = sorted(out.values(), key=lambda g: g.group)
    if wanted:
        rows = [g for g in rows if g.state.lower() in wanted]
    return rows


# --- describe ------------------------------------------------------------------------------


def _offsets(conn: Connection, group: str) -> list[SharePartitionOffset]:
    with _coordinator(conn, group) as wire:
        resp = wire.request(90, 1, {"groups": [{"group_id": group, "topics": None}]})
    g = resp.groups[0]
    if g.error_code:
        if _error_name(g.error_code) == "GROUP_ID_NOT_FOUND":
            return []
        raise KafkaApiError(_error_name(g.error_code), f"share group '{group}': {g.error_message or 'offsets not read'}")
    out = []
    for t in g.topics:
        for p in t.partitions:
            if p.error_code:
                continue
            out.append(SharePartitionOffset(t.topic_name, int(p.partition_index),
                                            None if int(p.start_offset) < 0 else int(p.start_offset),
                                            None if int(p.leader_epoch) < 0 else int(p.leader_epoch),
                                            None if int(p.lag) < 0 else int(p.lag)))
    return sorted(out, key=lambda o: (o.topic, o.partition))


def describe_share_groups(conn: Connection, groups: Sequence[str]) -> list[ShareGroupDescription]:
    out = []
    for group in groups:
        validate_group_id(group)
        d, coordinator = _raw_describe(conn, group)
        if d.error_code:
            raise _not_share(group, d) if _error_name(d.error_code) == "GROUP_ID_NOT_FOUND" else \
                KafkaApiError(_error_name(d.error_code), f"share group '{group}': {d.error_message or 'not described'}")
        members = [ShareMemberDescription(m.member_id, m.client_id, m.client_host, int(m.member_epoch), m.rack_id,
                                          list(m.subscribed_topic_names),
                                          [{"topic": tp.topic_name, "partition": int(p)}
                                           for tp in m.assignment.topic_partitions for p in tp.partitions])
                   for m in d.members]
        out.append(ShareGroupDescription(group, d.group_state, coordinator, int(d.group_epoch),
                                         int(d.assignment_epoch), d.assignor_name, members, _offsets(conn, group)))
    return out


# --- reset offsets -------------------------------------------------------------------------


def plan_share_reset(conn: Connection, group: str, topics: list[tuple[str, list[int] | None]], all_topics: bool,
                     kind: str, value: int | None, execute: bool) -> ShareResetResult:
    """kafka-share-groups --reset-offsets: new start offsets, clamped to [log start, log end];
    applied (AlterShareGroupOffsets) only with ``execute`` and only while the group has no members."""
    validate_group_id(group)
    if kind not in RESET_KINDS:
        raise UsageError(f"unknown reset kind {kind!r}")
    d, _coordinator_id = _raw_describe(conn, group)
    exists = not d.error_code
    if d.error_code and "not a share group" in (d.error_message or ""):
        raise _not_share(group, d)
    if exists and d.members:
        raise OperationError(f"share group '{group}' is not empty: it has {len(d.members)} member(s); "
                             f"offsets can only be reset while it is inactive")
    current = {(o.topic, o.partition): o.start_offset for o in (_offsets(conn, group) if exists else [])}
    client = admin(conn)
    if all_topics:
        partitions = sorted(current)
        if not partitions:
            raise OperationError(f"share group '{group}' has no share-partition state: name the topics with --topic")
    else:
        partitions = sorted(_expand(client, topics, conn.timeout_s))
    starts = list_offsets(client, partitions, OffsetSpec.earliest(), strict=True)
    ends = list_offsets(client, partitions, OffsetSpec.latest(), strict=True)
    plan = []
    for tp in partitions:
        start, end = int(starts[tp] or 0), int(ends[tp] or 0)
        wanted = start if kind == "earliest" else end if kind == "latest" else int(value or 0)
        plan.append(ShareOffsetReset(tp[0], tp[1], current.get(tp), min(max(wanted, start), end)))
    if execute and plan:
        by_topic: dict[str, list[dict[str, int]]] = {}
        for r in plan:
            by_topic.setdefault(r.topic, []).append({"partition_index": r.partition, "start_offset": r.new_start_offset})
        with _coordinator(conn, group) as wire:
            resp = wire.request(91, 0, {"group_id": group, "topics": [{"topic_name": t, "partitions": ps}
                                                                       for t, ps in by_topic.items()]})
        if resp.error_code:
            name = _error_name(resp.error_code)
            if name == "NON_EMPTY_GROUP":
                raise OperationError(f"share group '{group}' is not empty: offsets can only be reset while it is inactive")
            raise KafkaApiError(name, f"share group '{group}': {resp.error_message or 'offsets not reset'}")
        for t in resp.responses:
            for p in t.partitions:
                if p.error_code:
                    raise KafkaApiError(_error_name(p.error_code),
                                        f"share group '{group}' {t.topic_name}-{p.partition_index}: {p.error_message}")
    return ShareResetResult(group, execute, plan)


# --- delete --------------------------------------------------------------------------------


def delete_share_groups(conn: Connection, groups: Sequence[str]) -> list[ShareDeleteResult]:
    """DeleteGroups of share groups (kafka-share-groups --delete): only an empty group is deleted,
    with its share-partition state."""
    from kcli.ops.groups import delete_groups

    out = []
    for group in groups:
        validate_group_id(group)
        d, _c = _raw_describe(conn, group)
        if d.error_code:
            out.append(ShareDeleteResult(group, False, "GROUP_ID_NOT_FOUND" if "not a share group" not in
                                         (d.error_message or "") else "GROUP_ID_NOT_FOUND: not a share group"))
            continue
        if d.members:
            out.append(ShareDeleteResult(group, False, "NON_EMPTY_GROUP"))
            continue
        r = delete_groups(conn, [group])[0]
        out.append(ShareDeleteResult(group, r.deleted, r.error))
    return out


def delete_share_offsets(conn: Connection, group: str, topics: Sequence[str]) -> list[ShareOffsetDeletion]:
    """DeleteShareGroupOffsets (kafka-share-groups --delete-offsets): forget the group's state of
    whole topics; the group must be empty."""
    validate_group_id(group)
    if not topics:
        raise UsageError("give at least one --topic")
    with _coordinator(conn, group) as wire:
        resp = wire.request(92, 0, {"group_id": group, "topics": [{"topic_name": t} for t in topics]})
    if resp.error_code:
        name = _error_name(resp.error_code)
        if name == "NON_EMPTY_GROUP":
            raise OperationError(f"share group '{group}' is not empty: its offsets can only be deleted while it is inactive")
        if name == "GROUP_ID_NOT_FOUND":
            raise KafkaApiError(name, f"share group '{group}' does not exist")
        raise KafkaApiError(name, f"share group '{group}': {resp.error_message or 'offsets not deleted'}")
    return [ShareOffsetDeletion(t.topic_name, _error_name(t.error_code) if t.error_code else None) for t in resp.responses]
