"""Group APIs: FindCoordinator, Join/Sync/Heartbeat/LeaveGroup, OffsetCommit/Fetch/Delete,
List/Describe/DeleteGroups.

These only translate between kio request entities / response dicts and
:class:`kcli.coordinator.group.coordinator.GroupCoordinator`, which owns the state machine. Every group
operation first asks :meth:`GroupCoordinator.route` whether this broker coordinates the group
(in a cluster another broker may: NOT_COORDINATOR, and the client asks FindCoordinator again).
Field names are those of each API's newest version; the codec drops what an older version lacks.
"""

from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.coordinator.group import coordinator as g
from kcli.coordinator.group.assignors import TopicInfo
from kcli.broker.dispatch import RequestContext, handler
from kcli.broker.authz import from_a_broker

KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1


def _coordinator(ctx: RequestContext) -> g.GroupCoordinator | None:
    coord = getattr(ctx.broker, "groups", None)
    if coord is None or not coord.active:
        return None
    return coord


async def _route(coord: g.GroupCoordinator | None, group_id: str) -> int:
    """NONE when ``coord`` coordinates ``group_id`` here, else the error code to answer with."""
    if coord is None:
        return ErrorCode.coordinator_not_available
    return await coord.route(group_id)


def _topic_infos(ctx: RequestContext) -> dict[str, TopicInfo]:
    return {name: TopicInfo(name, t.topic_id, tuple(p.partition for p in t.live_partitions()))
            for name, t in ctx.broker.state.topics.items()}


def _ms(value: Any) -> int:
    if isinstance(value, datetime.timedelta):
        return round(value / datetime.timedelta(milliseconds=1))
    return int(value)


def _client_host(ctx: RequestContext) -> str:
    # Kafka reports InetAddress.toString(): "/127.0.0.1".
    peer = ctx.connection.peer
    host = peer.rsplit(":", 1)[0] if ":" in peer else peer
    return "/" + host


# ---- FindCoordinator ----------------------------------------------------------------------------


@handler(api_key=10, name="FindCoordinator", min_version=0, max_version=5)
async def find_coordinator(ctx: RequestContext, req: Any) -> dict[str, Any]:
    key_type = int(getattr(req, "key_type", KEY_TYPE_GROUP))
    b = ctx.broker

    def answer(key: str) -> dict[str, Any]:
        if key_type not in (KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION):
            return {"key": key, "error_code": ErrorCode.invalid_request, "error_message": f"Invalid key type {key_type}",
                    "node_id": -1, "host": "", "port": -1}
        unavailable = {"key": key, "error_code": ErrorCode.coordinator_not_available,
                       "error_message": "The coordinator is not available.", "node_id": -1, "host": "", "port": -1}
        node = b.node_id
        host, port = next(((e.host, e.port) for e in b.endpoints if e.name == ctx.connection.listener),
                          (b.advertised_host, b.advertised_port))
        if key_type == KEY_TYPE_GROUP:
            coord = _coordinator(ctx)
            if coord is None:
                return unavailable
            node = coord.coordinator_of(key)
        else:  # a transactional id: placed over the live brokers as groups are
            txn = getattr(b, "transactions", None)
            if txn is None or not txn.active:
                return unavailable
            node = txn.coordinator_of(key)
        if node != b.node_id:  # another live broker coordinates this key
            reg = next((r for r in b.metadata.live_brokers() if r.node_id == node), None)
            endpoint = reg.endpoint(ctx.connection.listener) if reg is not None else None
            if endpoint is None:
                return unavailable
            host, port = endpoint
        return {"key": key, "error_code": ErrorCode.none, "error_message": None, "node_id": node, "host": host, "port": port}

    if ctx.api_version >= 4:
        return {"throttle_time": 0, "coordinators": [answer(k) for k in req.coordinator_keys]}
    body = answer(req.key)
    del body["key"]
    body["throttle_time"] = 0
    return body


# ---- membership -----------------------------------------------------------------------------------


@handler(api_key=11, name="JoinGroup", min_version=0, max_version=9)
async def join_group(ctx: RequestContext, req: Any) -> dict[str, Any]:
    v = ctx.api_version
    coord = _coordinator(ctx)
    err = await _route(coord, req.group_id)
    if err != ErrorCode.none or coord is None:
        result = g.JoinResult(error=err, member_id=req.member_id)
    else:
        session_ms = _ms(req.session_timeout)
        result = await coord.join_group(g.JoinRequest(
            group_id=req.group_id,
            member_id=req.member_id,
            group_instance_id=getattr(req, "group_instance_id", None),
            client_id=ctx.client_id,
            client_host=_client_host(ctx),
            session_timeout_ms=session_ms,
            # v0 has no rebalance timeout: Kafka uses the session timeout.
            rebalance_timeout_ms=_ms(req.rebalance_timeout) if v >= 1 else session_ms,
            protocol_type=req.protocol_type,
            protocols=[(p.name, bytes(p.metadata)) for p in req.protocols],
            require_known_member_id=v >= 4,
            supports_skip_assignment=v >= 9,
            reason=getattr(req, "reason", None),
        ))
    protocol_name = result.protocol_name
    if v < 7 and protocol_name is None:
        protocol_name = ""  # not nullable before v7
    return {
        "throttle_time": 0,
        "error_code": result.error,
        "generation_id": result.generation_id,
        "protocol_type": result.protocol_type,
        "protocol_name": protocol_name,
        "leader": result.leader,
        "skip_assignment": result.skip_assignment,
        "member_id": result.member_id,
        "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id, "metadata": m.metadata}
                    for m in result.members],
    }


@handler(api_key=14, name="SyncGroup", min_version=0, max_version=5)
async def sync_group(ctx: RequestContext, req: Any) -> dict[str, Any]:
    coord = _coordinator(ctx)
    err = await _route(coord, req.group_id)
    if err != ErrorCode.none or coord is None:
        result = g.SyncResult(error=err)
    else:
        result = await coord.sync_group(
            req.group_id, int(req.generation_id), req.member_id, getattr(req, "group_instance_id", None),
            getattr(req, "protocol_type", None), getattr(req, "protocol_name", None),
            {a.member_id: bytes(a.assignment) for a in req.assignments},
        )
    return {"throttle_time": 0, "error_code": result.error, "protocol_type": result.protocol_type,
            "protocol_name": result.protocol_name, "assignment": result.assignment}


@handler(api_key=12, name="Heartbeat", min_version=0, max_version=4)
async def heartbeat(ctx: RequestContext, req: Any) -> dict[str, Any]:
    coord = _coordinator(ctx)
    code = await _route(coord, req.group_id)
    if code == ErrorCode.none and coord is not None:
        code = coord.heartbeat(req.group_id, int(req.generation_id), req.member_id,
                               getattr(req, "group_instance_id", None))
    return {"throttle_time": 0, "error_code": code}


@handler(api_key=13, name="LeaveGroup", min_version=0, max_version=5)
async def leave_group(ctx: RequestContext, req: Any) -> dict[str, Any]:
    v = ctx.api_version
    if v >= 3:
        leaving = [(m.member_id, m.group_instance_id) for m in req.members]
    else:
        leaving = [(req.member_id, None)]
    coord = _coordinator(ctx)
    top = await _route(coord, req.group_id)
    members: list[tuple[str, str | None, int]] = []
    if top == ErrorCode.none and coord is not None:
        top, members = coord.leave_group(req.group_id, leaving)
    if v < 3 and top == ErrorCode.none and members:
        top = members[0][2]  # single-member versions carry the member's error at the top
    return {"throttle_time": 0, "error_code": top,
            "members": [{"member_id": mid, "group_instance_id": iid, "error_code": code}
                        for mid, iid, code in members]}


# ---- offsets ---------------------------------------------------------------------------------------


@handler(api_key=8, name="OffsetCommit", min_version=2, max_version=9)
async def offset_commit(ctx: RequestContext, req: Any) -> dict[str, Any]:
    coord = _coordinator(ctx)
    routed = await _route(coord, req.group_id)
    codes: dict[tuple[str, int], int] = {}
    wanted: dict[tuple[str, int], g.OffsetAndMetadata] = {}
    order: list[tuple[str, int]] = []
    for t in req.topics:
        exists = ctx.broker.topic_exists(t.name)
        for p in t.partitions:
            tp = (t.name, int(p.partition_index))
            order.append(tp)
            if coord is None or routed != ErrorCode.none:
                codes[tp] = routed if routed != ErrorCode.none else ErrorCode.coordinator_not_available
            elif not exists:
                codes[tp] = ErrorCode.unknown_topic_or_partition
            else:
                wanted[tp] = g.OffsetAndMetadata(
                    offset=int(p.committed_offset),
                    leader_epoch=int(getattr(p, "committed_leader_epoch", -1)),
                    metadata=p.committed_metadata or "",
                )
    if coord is not None and wanted and from_a_broker(ctx):
        # A committed transaction's offsets, from its coordinator on another broker: the
        # membership was checked here when TxnOffsetCommit arrived (kcli/coordinator/transaction/coordinator.py).
        try:
            await coord.commit_transactional_offsets(
                req.group_id, {tp: (om.offset, om.leader_epoch, om.metadata) for tp, om in wanted.items()})
            codes.update({tp: ErrorCode.none for tp in wanted})
        except g.OffsetStoreError as err:
            codes.update({tp: err.error_code for tp in wanted})
    elif coord is not None and wanted:
        codes.update(await coord.commit_offsets(
            req.group_id, int(req.generation_id_or_member_epoch), req.member_id,
            getattr(req, "group_instance_id", None), wanted, api_version=ctx.api_version))
    topics: dict[str, list[dict[str, Any]]] = {}
    for tp in order:
        topics.setdefault(tp[0], []).append({"partition_index": tp[1], "error_code": codes[tp]})
    return {"throttle_time": 0,
            "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()]}


async def _fetch_group(coord: g.GroupCoordinator | None, group_id: str, topics: Any,
                       version: int, unstable: Any = None, member: tuple[str | None, int] = (None, -1)
                       ) -> tuple[int, list[dict[str, Any]]]:
    """One group's OffsetFetch answer: (group error, topics list)."""
    requested = None if topics is None else [(t.name, int(p)) for t in topics for p in t.partition_indexes]
    err = await _route(coord, group_id)
    found: dict[tuple[str, int], g.OffsetAndMetadata | None] = {}
    if err == ErrorCode.none and coord is not None:
        err, found = coord.fetch_offsets(group_id, requested, *member)  # member: (id, epoch), v9+
    if err != ErrorCode.none and version >= 2:
        return err, []  # v2+ carry a group-level error and no partitions
    items = sorted(found.items()) if requested is None else [(tp, found.get(tp)) for tp in requested]
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), om in items:
        by_topic.setdefault(topic, []).append({
            "partition_index": partition,
            "committed_offset": om.offset if om else -1,
            "committed_leader_epoch": om.leader_epoch if om else -1,
            "metadata": om.metadata if om else "",
            # v1 has no group-level error: it goes on each partition; require_stable (v7+) and an
            # open transaction holding an offset for the partition: UNSTABLE_OFFSET_COMMIT
            "error_code": err or (ErrorCode.unstable_offset_commit if unstable is not None
                                  and unstable.has_pending_offsets(group_id, (topic, partition)) else 0),
        })
    return err, [{"name": t, "partitions": parts} for t, parts in by_topic.items()]


@handler(api_key=9, name="OffsetFetch", min_version=1, max_version=9)
async def offset_fetch(ctx: RequestContext, req: Any) -> dict[str, Any]:
    coord = _coordinator(ctx)
    unstable = ctx.broker.transactions if getattr(req, "require_stable", False) else None
    if ctx.api_version >= 8:
        out = []
        for grp in req.groups:
            member = (getattr(grp, "member_id", None), int(getattr(grp, "member_epoch", -1)))
            err, topics = await _fetch_group(coord, grp.group_id, grp.topics, ctx.api_version, unstable, member)
            out.append({"group_id": grp.group_id, "topics": topics, "error_code": err})
        return {"throttle_time": 0, "groups": out}
    err, topics = await _fetch_group(coord, req.group_id, req.topics, ctx.api_version, unstable)
    return {"throttle_time": 0, "topics": topics, "error_code": err}


# ---- admin ------------------------------------------------------------------------------------------


@handler(api_key=16, name="ListGroups", min_version=0, max_version=5)
async def list_groups(ctx: RequestContext, req: Any) -> dict[str, Any]:
    coord = _coordinator(ctx)
    if coord is None:
        return {"throttle_time": 0, "error_code": ErrorCode.coordinator_not_available, "groups": []}
    states = list(getattr(req, "states_filter", ()) or ())
    try:  # the groups this broker coordinates, as Kafka lists those of its offsets partitions
        listed = await coord.list_coordinated_groups(states or None)
    except g.OffsetStoreError as err:
        return {"throttle_time": 0, "error_code": err.error_code, "groups": []}
    types = {t.lower() for t in getattr(req, "types_filter", ()) or ()}  # v5: classic, consumer
    rows = [(gid, pt, st, coord.group_type(gid)) for gid, pt, st in listed]
    return {"throttle_time": 0, "error_code": ErrorCode.none,
            "groups": [{"group_id": gid, "protocol_type": pt, "group_state": st, "group_type": gt}
                       for gid, pt, st, gt in rows if not types or gt in types]}


@handler(api_key=15, name="DescribeGroups", min_version=0, max_version=5)
async def describe_groups(ctx: RequestContext, req: Any) -> dict[str, Any]:
    coord = _coordinator(ctx)
    with_ops = bool(getattr(req, "include_authorized_operations", False))
    out = []
    for gid in req.groups:
        err = await _route(coord, gid)
        if err != ErrorCode.none or coord is None:
            d: dict[str, Any] = {"group_id": gid, "error_code": err, "group_state": "",
                                 "protocol_type": "", "protocol_data": "", "members": []}
        else:
            d = coord.describe_group(gid, _topic_infos(ctx) if gid in coord.consumer.groups else None)
            d["error_code"] = ErrorCode.none
        if with_ops:
            d["authorized_operations"] = g.GROUP_AUTHORIZED_OPERATIONS
        out.append(d)
    return {"throttle_time": 0, "groups": out}


@handler(api_key=42, name="DeleteGroups", min_version=0, max_version=2)
async def delete_groups(ctx: RequestContext, req: Any) -> dict[str, Any]:
    coord = _coordinator(ctx)
    names = list(req.groups_names)
    codes: dict[str, int] = {}
    for gid in names:
        err = await _route(coord, gid)
        if err != ErrorCode.none or coord is None:
            codes[gid] = err
        else:
            codes.update(await coord.delete_groups([gid]))
    return {"throttle_time": 0, "results": [{"group_id": gid, "error_code": codes[gid]} for gid in names]}


@handler(api_key=47, name="OffsetDelete", min_version=0, max_version=0)
async def offset_delete(ctx: RequestContext, req: Any) -> dict[str, Any]:
    coord = _coordinator(ctx)
    top = await _route(coord, req.group_id)
    codes: dict[tuple[str, int], int] = {}
    if top == ErrorCode.none and coord is not None:
        # Kafka answers a partition its metadata does not hold UNKNOWN_TOPIC_OR_PARTITION (below)
        known = [(t.name, int(p.partition_index)) for t in req.topics if (topic := ctx.broker.topic(t.name)) is not None
                 for p in t.partitions if int(p.partition_index) in topic.partitions]
        top, codes = coord.delete_offsets(req.group_id, known)
    if top != ErrorCode.none:
        return {"throttle_time": 0, "error_code": top, "topics": []}
    return {"throttle_time": 0, "error_code": ErrorCode.none,
            "topics": [{"name": t.name, "partitions": [
                {"partition_index": int(p.partition_index),
                 "error_code": codes.get((t.name, int(p.partition_index)), ErrorCode.unknown_topic_or_partition)}
                for p in t.partitions]} for t in req.topics]}
