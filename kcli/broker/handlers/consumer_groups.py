"""KIP-848 consumer group APIs: ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69).

They translate between kio entities and :mod:`kcli.coordinator.group.consumer_group` (the state
machine, reached through the broker's GroupCoordinator, which routes the group to its coordinator
first as for classic groups). The handler hands the state machine a view of the broker's topics
(name, id, live partitions) so regex subscriptions and partition changes are seen at each
heartbeat. Advertising API 68 in ApiVersions is what makes librdkafka (2.4+) with
``group.protocol=consumer`` use this protocol; it needs no ApiVersions feature flags.
"""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.broker.authz import AUTHORIZED_OPS_OMITTED, GROUP_DENIED, Authz, Call, register_gate, peer_host
from kcli.broker.dispatch import RequestContext, handler
from kcli.coordinator.group import coordinator as g
from kcli.coordinator.group.assignors import TopicInfo
from kcli.coordinator.group.consumer_group import HeartbeatError, HeartbeatRequest
from kcli.security.acl import AclOperation as Op, ResourceType as RT


def _coordinator(ctx: RequestContext) -> g.GroupCoordinator | None:
    coord = getattr(ctx.broker, "groups", None)
    if coord is None or not coord.active:
        return None
    return coord


def topics_view(ctx: RequestContext) -> dict[str, TopicInfo]:
    """Every topic with its live partitions (KIP-694 deleted ones left out), as the consumer and
    share group assignors see them."""
    out = {}
    for name, t in ctx.broker.state.topics.items():
        parts = tuple(p.partition for p in t.live_partitions())
        if parts:
            out[name] = TopicInfo(name, t.topic_id, parts)
    return out


def client_host(ctx: RequestContext) -> str:
    """The member's host as Kafka's group describe shows it ("/127.0.0.1")."""
    return "/" + peer_host(ctx.connection.peer)


def _ms(value: Any) -> int:
    if value is None:
        return -1
    if hasattr(value, "total_seconds"):
        return round(value.total_seconds() * 1000)
    return int(value)


def _error(code: int, message: str | None, member_id: str | None = None) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": code, "error_message": message, "member_id": member_id,
            "member_epoch": -1, "heartbeat_interval": 0, "assignment": None}


@handler(68, "ConsumerGroupHeartbeat", 0, 1)
async def consumer_group_heartbeat(ctx: RequestContext, req: Any) -> dict[str, Any]:
    coord = _coordinator(ctx)
    if coord is None:
        return _error(ErrorCode.coordinator_not_available, "The coordinator is not available.")
    routed = await coord.route(req.group_id)
    if routed != ErrorCode.none:
        return _error(routed, None)
    owned = None
    if req.topic_partitions is not None:
        owned = [(tp.topic_id, [int(p) for p in tp.partitions]) for tp in req.topic_partitions
                 if isinstance(tp.topic_id, uuid.UUID)]
    hb = HeartbeatRequest(
        group_id=req.group_id, member_id=req.member_id or "", member_epoch=int(req.member_epoch),
        instance_id=req.instance_id, rack_id=req.rack_id, rebalance_timeout_ms=_ms(req.rebalance_timeout),
        subscribed_topic_names=None if req.subscribed_topic_names is None else list(req.subscribed_topic_names),
        subscribed_topic_regex=getattr(req, "subscribed_topic_regex", None),
        server_assignor=req.server_assignor, owned=owned, client_id=ctx.client_id,
        client_host=client_host(ctx), api_version=ctx.api_version)
    if ctx.api_version >= 1 and not hb.member_id and hb.member_epoch == 0:
        # v1: the client names itself (a UUID) and keeps that id for its lifetime.
        return _error(ErrorCode.invalid_request, "MemberId can't be empty.")
    try:
        result = coord.consumer_group_heartbeat(hb, lambda: topics_view(ctx))
    except HeartbeatError as err:
        return _error(err.code, err.message, hb.member_id or None)
    assignment = None
    if result.assignment is not None:
        assignment = {"topic_partitions": [{"topic_id": tid, "partitions": sorted(parts)}
                                           for tid, parts in sorted(result.assignment.items(), key=lambda kv: str(kv[0]))]}
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
            "member_id": result.member_id, "member_epoch": result.member_epoch,
            "heartbeat_interval": result.heartbeat_interval_ms, "assignment": assignment}


@handler(69, "ConsumerGroupDescribe", 0, 0)
async def consumer_group_describe(ctx: RequestContext, req: Any) -> dict[str, Any]:
    coord = _coordinator(ctx)
    topics = topics_view(ctx)
    out = []
    for gid in req.group_ids:
        empty = {"group_id": gid, "group_state": "", "group_epoch": -1, "assignment_epoch": -1,
                 "assignor_name": "", "members": []}
        if coord is None:
            out.append({**empty, "error_code": ErrorCode.coordinator_not_available})
            continue
        routed = await coord.route(gid)
        if routed != ErrorCode.none:
            out.append({**empty, "error_code": routed})
            continue
        err, described = coord.describe_consumer_group(gid, topics)
        if err != ErrorCode.none:
            out.append({**empty, "error_code": err, "error_message": f"Group {gid} is not a consumer group."})
            continue
        out.append({**described, "error_code": ErrorCode.none, "error_message": None})
    return {"throttle_time": 0, "groups": out}


@register_gate(68)
async def _heartbeat_gate(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    """READ on the group, as JoinGroup and Heartbeat need."""
    if not az.allowed(Op.READ, RT.GROUP, req.group_id):
        return _error(GROUP_DENIED, None)
    return await call(req)


@register_gate(69)
async def _describe_gate(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    """DESCRIBE on each group; the others' entries are answered GROUP_AUTHORIZATION_FAILED."""
    body = await call(req)
    if body is None:
        return None
    with_ops = bool(getattr(req, "include_authorized_operations", False))
    for grp in body.get("groups") or []:
        if not az.allowed(Op.DESCRIBE, RT.GROUP, grp["group_id"]):
            grp.update(error_code=GROUP_DENIED, group_state="", members=[], authorized_operations=AUTHORIZED_OPS_OMITTED)
        elif with_ops:
            grp["authorized_operations"] = az.operations(RT.GROUP, grp["group_id"])
    return body
