"""Consumer groups and their offsets, as kafka-consumer-groups.sh (ConsumerGroupCommand) does them.

List, describe (members, committed offsets, log end offsets, lag), delete, reset offsets and
delete offsets over confluent-kafka's AdminClient; OffsetDelete (KIP-496), which confluent-kafka
does not expose, goes through kcli's own protocol client to the group's coordinator. Every
function takes a :class:`Connection` and returns dataclasses, so runbooks can chain them.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import OffsetSpec

from kcli.errors import KafkaApiError, OperationError, UsageError
from kcli.ops.connection import Admin, Connection, admin, to_kcli_error
from kcli.ops.topics import _metadata, _tp_key, list_offsets, validate_topic_name

# confluent-kafka's ConsumerGroupState names → the names Kafka's tools print.
_STATES = {"UNKNOWN": "Unknown", "PREPARING_REBALANCING": "PreparingRebalance",
           "COMPLETING_REBALANCING": "CompletingRebalance", "STABLE": "Stable", "DEAD": "Dead", "EMPTY": "Empty"}
_INACTIVE = ("Empty", "Dead")  # the states in which Kafka lets offsets be reset
RESET_KINDS = ("earliest", "latest", "current", "offset", "shift-by", "datetime", "duration", "file")


def validate_group_id(group: str) -> str:
    """A group id must not be blank (librdkafka aborts on one; Kafka refuses it with INVALID_GROUP_ID)."""
    if not group or not group.strip():
        raise UsageError("--group must not be empty")
    return group


def _state(value: Any) -> str:
    name = getattr(value, "name", str(value))
    return _STATES.get(name, name.title())


# --- records -------------------------------------------------------------------------------


GROUP_TYPES = ("classic", "consumer")  # Kafka's group types: the classic protocol, KIP-848's


@dataclass
class GroupListing:
    group: str
    state: str
    protocol_type: str  # "consumer"; "" for a simple group (offsets only, no members ever joined)
    type: str = "classic"  # the group protocol: "classic" or "consumer" (KIP-848)


@dataclass
class MemberDescription:
    member_id: str
    client_id: str
    host: str
    group_instance_id: str | None
    assignment: list[dict[str, Any]]  # [{"topic": t, "partition": p}, ...]
    member_epoch: int | None = None  # consumer groups: the member's epoch
    target_assignment: list[dict[str, Any]] | None = None  # consumer groups: where reconciliation heads


@dataclass
class PartitionOffsets:
    """One row of ``kafka-consumer-groups --describe``."""

    topic: str
    partition: int
    current_offset: int | None  # the committed offset; None: none committed
    log_end_offset: int | None  # the high watermark; None: unknown (topic gone)
    lag: int | None
    consumer_id: str | None  # the member the partition is assigned to, None when unassigned
    host: str | None
    client_id: str | None


@dataclass
class GroupDescription:
    group: str
    state: str
    protocol_type: str
    protocol: str  # the assignor (range, roundrobin, cooperative-sticky, ...); "" when not Stable
    coordinator: int | None
    members: list[MemberDescription]
    offsets: list[PartitionOffsets]
    type: str = "classic"  # the group protocol: "classic" or "consumer" (KIP-848)
    group_epoch: int | None = None  # consumer groups (ConsumerGroupDescribe)
    assignment_epoch: int | None = None  # consumer groups: the target assignment's epoch

    @property
    def lag_by_topic(self) -> dict[str, int]:
        """Total lag per topic over the partitions whose lag is known."""
        out: dict[str, int] = {}
        for row in self.offsets:
            out.setdefault(row.topic, 0)
            if row.lag is not None:
                out[row.topic] += row.lag
        return out

    def to_dict(self) -> dict[str, Any]:
        lags = self.lag_by_topic
        return {
            "group": self.group, "type": self.type, "state": self.state, "protocol_type": self.protocol_type,
            "protocol": self.protocol, "coordinator": self.coordinator,
            "group_epoch": self.group_epoch, "assignment_epoch": self.assignment_epoch,
            "members": [vars(m) for m in self.members],
            "offsets": [vars(o) for o in self.offsets],
            "lag_by_topic": lags, "total_lag": sum(lags.values()),
        }


@dataclass
class DeleteGroupResult:
    group: str
    deleted: bool
    error: str | None = None  # Kafka's error name when not deleted


@dataclass
class ResetRequest:
    group: str
    topics: list[tuple[str, list[int] | None]] = field(default_factory=list)  # (topic, partitions or all)
    all_topics: bool = False
    kind: str = "earliest"  # one of RESET_KINDS
    value: Any = None  # offset, shift, timestamp ms (datetime/duration), or the CSV rows (file)
    execute: bool = False


@dataclass
class PartitionReset:
    topic: str
    partition: int
    current_offset: int | None
    new_offset: int
    log_start_offset: int
    log_end_offset: int


@dataclass
class ResetResult:
    group: str
    executed: bool  # False: a dry run (the default, as Kafka's tool without --execute)
    offsets: list[PartitionReset]

    def to_dict(self) -> dict[str, Any]:
        return {"group": self.group, "dry_run": not self.executed, "executed": self.executed,
                "offsets": [vars(o) for o in self.offsets]}


@dataclass
class OffsetDeletion:
    topic: str
    partition: int
    error: str | None  # None: deleted (or there was nothing to delete)


@dataclass
class DeleteOffsetsResult:
    group: str
    partitions: list[OffsetDeletion]

    @property
    def failed(self) -> list[OffsetDeletion]:
        return [p for p in self.partitions if p.error is not None]


# --- input parsing -------------------------------------------------------------------------


def parse_topic_partitions(values: Sequence[str], option: str = "--topic") -> list[tuple[str, list[int] | None]]:
    """``T`` or ``T:P,P,...`` (kafka-consumer-groups' --topic) → [(topic, partitions or None)]."""
    out: list[tuple[str, list[int] | None]] = []
    for value in values:
        topic, sep, parts = value.partition(":")
        validate_topic_name(topic)
        if not sep:
            out.append((topic, None))
            continue
        try:
            numbers = sorted({int(p) for p in parts.split(",") if p.strip()})
        except ValueError:
            raise UsageError(f"{option} expects TOPIC or TOPIC:PARTITION,...; got {value!r}") from None
        if not numbers or any(p < 0 for p in numbers):
            raise UsageError(f"{option} expects TOPIC or TOPIC:PARTITION,... with partitions >= 0; got {value!r}")
        out.append((topic, numbers))
    return out


_DURATION = re.compile(r"^([-+]?)P(?:([-+]?\d+)D)?(?:T(?=[-+\d])(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?"
                       r"(?:([-+]?\d+(?:[.,]\d{1,9})?)S)?)?$", re.IGNORECASE)


def parse_duration_ms(text: str) -> int:
    """An ISO-8601 duration as Java's Duration.parse reads it (PnDTnHnMn.nS), in milliseconds."""
    m = _DURATION.match(text.strip())
    if not m or not any(m.group(i) for i in range(2, 6)):
        raise UsageError(f"--by-duration expects an ISO-8601 duration such as PT1H or P1DT30M; got {text!r}")
    days, hours, minutes = (int(m.group(i) or 0) for i in (2, 3, 4))
    seconds = float((m.group(5) or "0").replace(",", "."))
    total = ((days * 24 + hours) * 60 + minutes) * 60_000 + round(seconds * 1000)
    return -total if m.group(1) == "-" else total


def parse_datetime_ms(text: str) -> int:
    """Kafka's --to-datetime: ``YYYY-MM-DDTHH:mm:SS.sss`` with an optional zone (Z, +01:00);
    without one, local time, as Kafka's tool reads it."""
    value = text.strip()
    try:
        when = dt.datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value)
    except ValueError:
        raise UsageError(f"--to-datetime expects YYYY-MM-DDTHH:mm:SS.sss (optionally with a zone such as Z "
                         f"or +01:00); got {text!r}") from None
    if when.tzinfo is None:
        when = when.astimezone()  # local time zone
    return int(when.timestamp() * 1000)


def parse_offsets_csv(text: str, source: str) -> list[tuple[str | None, str, int, int]]:
    """Kafka's reset CSV: ``topic,partition,offset`` or ``group,topic,partition,offset`` lines
    (what ``--export`` prints) → [(group or None, topic, partition, offset)]."""
    rows: list[tuple[str | None, str, int, int]] = []
    for line_no, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or not "".join(row).strip():
            continue
        cells = [c.strip() for c in row]
        if len(cells) not in (3, 4):
            raise UsageError(f"{source}:{line_no}: expected topic,partition,offset (or group,topic,partition,offset); "
                             f"got {','.join(row)!r}")
        group = cells[0] if len(cells) == 4 else None
        topic, partition, offset = cells[-3:]
        try:
            p, o = int(partition), int(offset)
        except ValueError:
            raise UsageError(f"{source}:{line_no}: partition and offset must be numbers; got {','.join(row)!r}") from None
        if p < 0 or o < 0:
            raise UsageError(f"{source}:{line_no}: partition and offset must be >= 0; got {','.join(row)!r}")
        validate_topic_name(topic)
        rows.append((group, topic, p, o))
    if not rows:
        raise UsageError(f"{source}: no offsets in the file")
    return rows


# --- helpers -------------------------------------------------------------------------------


def _committed(client: Admin, group: str) -> dict[tuple[str, int], int]:
    futures = client.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                                 request_timeout=client.timeout_s)
    result = client.wait(futures[group], f"group '{group}'")
    return {_tp_key(tp): tp.offset for tp in result.topic_partitions or [] if tp.offset >= 0}


def _describe_raw(client: Admin, groups: Sequence[str]) -> dict[str, Any]:
    futures = client.describe_consumer_groups(list(groups), request_timeout=client.timeout_s)
    return {g: client.wait(futures[g], f"group '{g}'") for g in groups}


def _exists(desc: Any, committed: dict[tuple[str, int], int]) -> bool:
    """DescribeGroups answers Dead for an unknown group; one with offsets but no state is Empty."""
    return _state(desc.state) != "Dead" or bool(desc.members) or bool(committed)


def _not_found(group: str) -> KafkaApiError:
    return KafkaApiError("GROUP_ID_NOT_FOUND", f"consumer group '{group}' does not exist")


def _topic_partitions(client: Admin, topic: str, timeout_s: float) -> list[int]:
    md = _metadata(client, timeout_s, topic)
    meta = md.topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise KafkaApiError("UNKNOWN_TOPIC_OR_PARTITION", f"topic '{topic}' does not exist")
    return sorted(meta.partitions)


def _expand(client: Admin, topics: list[tuple[str, list[int] | None]], timeout_s: float) -> list[tuple[str, int]]:
    """(topic, partitions or None) → every named partition, checked against the metadata."""
    out: list[tuple[str, int]] = []
    for topic, partitions in topics:
        existing = _topic_partitions(client, topic, timeout_s)
        for p in partitions or existing:
            if p not in existing:
                raise KafkaApiError("UNKNOWN_TOPIC_OR_PARTITION",
                                    f"topic '{topic}' has {len(existing)} partitions; partition {p} does not exist")
            out.append((topic, p))
    return list(dict.fromkeys(out))


# --- operations ----------------------------------------------------------------------------


def _group_type(value: Any) -> str:
    name = getattr(value, "name", str(value or "")).lower()
    return name if name in GROUP_TYPES else "classic"


def list_groups(conn: Connection, states: Sequence[str] = (), types: Sequence[str] = ()) -> list[GroupListing]:
    """ListGroups on every broker, sorted by name; ``states`` filters (Kafka's --list --state),
    ``types`` keeps groups of those protocols (Kafka's --list --type classic|consumer)."""
    kinds = {t.strip().lower() for t in types if t.strip()}
    bad = sorted(kinds - set(GROUP_TYPES))
    if bad:
        raise UsageError(f"--type: unknown group type {bad[0]!r}; use one of {', '.join(GROUP_TYPES)}")
    wanted = {s.strip().lower() for s in states if s.strip()}
    known = {v.lower() for v in _STATES.values()} | {s.lower() for s in _CONSUMER_STATES}
    unknown = sorted(wanted - known)
    if unknown:
        raise UsageError(f"--state: unknown state {unknown[0]!r}; use one of {', '.join(sorted(_STATES.values()))}")
    client = admin(conn)
    result = client.wait(client.list_consumer_groups(request_timeout=conn.timeout_s), "list groups")
    if result.errors:
        raise KafkaApiError("COORDINATOR_NOT_AVAILABLE", f"list groups: {result.errors[0]}")
    out = [GroupListing(g.group_id, _state(g.state), "" if g.is_simple_consumer_group else "consumer",
                        _group_type(getattr(g, "type", None)))
           for g in result.valid]
    if any(g.type == "consumer" and g.state == "Unknown" for g in out):
        # librdkafka knows only the classic states: ask the coordinators for the consumer ones.
        for g in out:
            if g.type == "consumer" and g.state == "Unknown":
                described = _consumer_group_describe(conn, g.group)
                if described is not None:
                    g.state = described.get("state", g.state)
    if wanted:
        out = [g for g in out if g.state.lower() in wanted]
    if kinds:
        out = [g for g in out if g.type in kinds]
    return sorted(out, key=lambda g: g.group)


def describe_groups(conn: Connection, groups: Sequence[str]) -> list[GroupDescription]:
    """DescribeGroups + OffsetFetch + ListOffsets(latest): each group's members, and per partition
    (committed or assigned) the committed offset, log end offset and lag, as Kafka's --describe."""
    for g in groups:
        validate_group_id(g)
    groups = list(dict.fromkeys(groups))
    client = admin(conn)
    raw = _describe_raw(client, groups)
    out = []
    for g in groups:
        desc = raw[g]
        committed = _committed(client, g)
        if not _exists(desc, committed):
            raise _not_found(g)
        members = []
        owner: dict[tuple[str, int], Any] = {}
        for m in desc.members:
            assigned = sorted(_tp_key(tp) for tp in (m.assignment.topic_partitions if m.assignment else []) or [])
            members.append(MemberDescription(m.member_id, m.client_id, (m.host or "").lstrip("/") or m.host,
                                             m.group_instance_id,
                                             [{"topic": t, "partition": p} for t, p in assigned]))
            for tp in assigned:
                owner[tp] = members[-1]
        partitions = sorted(set(committed) | set(owner))
        ends = list_offsets(client, partitions, OffsetSpec.latest())
        rows = []
        for tp in partitions:
            current, end, member = committed.get(tp), ends.get(tp), owner.get(tp)
            # as Kafka's tool: negative when the committed offset is past the log end (truncation)
            lag = end - current if current is not None and end is not None else None
            rows.append(PartitionOffsets(tp[0], tp[1], current, end, lag,
                                         member.member_id if member else None, member.host if member else None,
                                         member.client_id if member else None))
        state = _state(desc.state)
        if state == "Dead" and committed:
            state = "Empty"  # offsets only: Kafka lists such a group as Empty
        coordinator = getattr(desc.coordinator, "id", None)
        d = GroupDescription(g, state, "" if desc.is_simple_consumer_group and not desc.members else "consumer",
                             desc.partition_assignor or "", coordinator, members, rows,
                             type=_group_type(getattr(desc, "type", None)))
        if d.type == "consumer":
            _add_consumer_details(conn, d)
        out.append(d)
    return out


# KIP-848 consumer group states (Kafka's ConsumerGroupState names); librdkafka reports the two
# that classic groups lack as UNKNOWN, so kcli asks ConsumerGroupDescribe for them.
_CONSUMER_STATES = ("Empty", "Assigning", "Reconciling", "Stable", "Dead")


def _consumer_group_describe(conn: Connection, group: str) -> dict[str, Any] | None:
    """ConsumerGroupDescribe (KIP-848) from the group's coordinator: the epochs and member
    epochs librdkafka's describe does not expose; None when the broker cannot answer it."""
    from kcli.protocol.errors import error_name

    try:
        with _coordinator_client(conn, group) as wire:
            resp = wire.request(69, 0, {"group_ids": [group], "include_authorized_operations": False})
    except Exception:  # an older broker, or one kcli's client cannot reach: librdkafka's view stays
        return None
    found = resp.groups[0] if resp.groups else None
    if found is None or found.error_code:
        return {"error": error_name(int(found.error_code))} if found is not None else None

    def parts(a: Any) -> list[dict[str, Any]]:
        return [{"topic": tp.topic_name, "partition": int(p)} for tp in sorted(a.topic_partitions, key=lambda t: t.topic_name)
                for p in sorted(tp.partitions)]

    return {"state": found.group_state, "group_epoch": int(found.group_epoch),
            "assignment_epoch": int(found.assignment_epoch), "assignor": found.assignor_name,
            "members": {m.member_id: {"member_epoch": int(m.member_epoch), "assignment": parts(m.assignment),
                                      "target_assignment": parts(m.target_assignment)} for m in found.members}}


def _add_consumer_details(conn: Connection, d: GroupDescription) -> None:
    described = _consumer_group_describe(conn, d.group)
    if described is None or "error" in described:
        return
    d.state = described["state"] or d.state
    d.group_epoch, d.assignment_epoch = described["group_epoch"], described["assignment_epoch"]
    d.protocol = described["assignor"] or d.protocol
    for m in d.members:
        mine = described["members"].get(m.member_id)
        if mine is not None:
            m.member_epoch = mine["member_epoch"]
            m.assignment = mine["assignment"]
            m.target_assignment = mine["target_assignment"]


def delete_groups(conn: Connection, groups: Sequence[str]) -> list[DeleteGroupResult]:
    """DeleteGroups; a group with members is refused (NON_EMPTY_GROUP), as Kafka does."""
    for g in groups:
        validate_group_id(g)
    groups = list(dict.fromkeys(groups))
    client = admin(conn)
    futures = client.delete_consumer_groups(groups, request_timeout=conn.timeout_s)
    out = []
    for g in groups:
        try:
            client.wait(futures[g], f"group '{g}'")
            out.append(DeleteGroupResult(g, True))
        except KafkaApiError as err:
            out.append(DeleteGroupResult(g, False, err.name))
    return out


def _require_inactive(client: Admin, group: str) -> None:
    desc = _describe_raw(client, [group])[group]
    state = _state(desc.state)
    if state not in _INACTIVE or desc.members:
        raise OperationError(f"Assignments can only be reset if the group '{group}' is inactive, "
                             f"but the current state is {state}.")


def _timestamp_offsets(client: Admin, partitions: list[tuple[str, int]], ts: int,
                       ends: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """First offset with a timestamp >= ``ts``; the log end where there is none (as Kafka)."""
    found = list_offsets(client, partitions, OffsetSpec.for_timestamp(ts), strict=True)
    return {tp: (o if o is not None and o >= 0 else ends[tp]) for tp, o in found.items()}


def plan_reset(conn: Connection, req: ResetRequest) -> ResetResult:
    """Compute (and with ``execute`` commit) the group's new offsets, clamped to each
    partition's [log start, log end] as Kafka's tool does; refused while the group has members."""
    validate_group_id(req.group)
    if req.kind not in RESET_KINDS:
        raise UsageError(f"unknown reset kind {req.kind!r}")
    client = admin(conn)
    _require_inactive(client, req.group)
    committed = _committed(client, req.group)
    if req.kind == "file":
        rows = req.value
        other = sorted({g for g, *_ in rows if g is not None and g != req.group})
        if other:
            raise UsageError(f"--from-file holds offsets of group {other[0]!r}, not of '{req.group}'")
        given = {(t, p): o for g, t, p, o in rows}
        _expand(client, [(t, [p]) for t, p in given], conn.timeout_s)
        partitions = sorted(given)
    elif req.all_topics:
        partitions = sorted(committed)
        if not partitions:
            raise OperationError(f"group '{req.group}' has no committed offsets: --all-topics finds no partition; "
                                 "name them with --topic")
    else:
        partitions = sorted(_expand(client, req.topics, conn.timeout_s))
    starts = list_offsets(client, partitions, OffsetSpec.earliest(), strict=True)
    ends = list_offsets(client, partitions, OffsetSpec.latest(), strict=True)
    if req.kind == "earliest":
        wanted = dict(starts)
    elif req.kind == "latest":
        wanted = dict(ends)
    elif req.kind == "offset":
        wanted = {tp: int(req.value) for tp in partitions}
    elif req.kind == "file":
        wanted = dict(given)
    elif req.kind in ("current", "shift-by"):
        missing = [tp for tp in partitions if tp not in committed]
        if missing:
            t, p = missing[0]
            raise OperationError(f"group '{req.group}' has no committed offset for {t}-{p} to "
                                 f"{'shift from' if req.kind == 'shift-by' else 'keep'}")
        shift = int(req.value) if req.kind == "shift-by" else 0
        wanted = {tp: committed[tp] + shift for tp in partitions}
    else:  # datetime, duration: both carry the timestamp in ms
        wanted = _timestamp_offsets(client, partitions, int(req.value), ends)  # type: ignore[arg-type]
    plan = []
    for tp in partitions:
        start, end = starts[tp], ends[tp]
        assert start is not None and end is not None
        new = min(max(int(wanted[tp]), start), end)  # type: ignore[arg-type]
        plan.append(PartitionReset(tp[0], tp[1], committed.get(tp), new, start, end))
    if req.execute and plan:
        _require_inactive(client, req.group)  # members may have joined while the plan was made
        futures = client.alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(req.group, [TopicPartition(r.topic, r.partition, r.new_offset) for r in plan])],
            request_timeout=conn.timeout_s)
        answer = client.wait(futures[req.group], f"group '{req.group}'")
        for tp in answer.topic_partitions or []:
            if tp.error is not None:
                raise to_kcli_error(tp.error, f"group '{req.group}' {tp.topic}-{tp.partition}")
    return ResetResult(req.group, req.execute, plan)


def delete_offsets(conn: Connection, group: str, topics: list[tuple[str, list[int] | None]]) -> DeleteOffsetsResult:
    """OffsetDelete (KIP-496) to the group's coordinator: drop the committed offsets of topics the
    group does not consume; a subscribed topic answers GROUP_SUBSCRIBED_TO_TOPIC per partition."""
    validate_group_id(group)
    if not topics:
        raise UsageError("give at least one --topic")
    client = admin(conn)
    partitions = _expand(client, topics, conn.timeout_s)
    from kcli.protocol.errors import error_name

    by_topic: dict[str, list[int]] = {}
    for t, p in partitions:
        by_topic.setdefault(t, []).append(p)
    body = {"group_id": group, "topics": [{"name": t, "partitions": [{"partition_index": p} for p in ps]}
                                          for t, ps in by_topic.items()]}
    with _coordinator_client(conn, group) as wire:
        resp = wire.request(47, 0, body)
    if resp.error_code:
        name = error_name(int(resp.error_code))
        if name == "GROUP_ID_NOT_FOUND":
            raise _not_found(group)
        raise KafkaApiError(name, f"group '{group}': offsets not deleted", int(resp.error_code))
    out = []
    for t in resp.topics:
        for p in t.partitions:
            out.append(OffsetDeletion(t.name, int(p.partition_index),
                                      error_name(int(p.error_code)) if p.error_code else None))
    return DeleteOffsetsResult(group, sorted(out, key=lambda d: (d.topic, d.partition)))


def _coordinator_client(conn: Connection, group: str) -> Any:
    """kcli's protocol client connected to ``group``'s coordinator (FindCoordinator first)."""
    from kcli.ops.brokers import coordinator_client

    return coordinator_client(conn, group, 0, "group")
