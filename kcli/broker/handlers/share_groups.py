"""KIP-932 share groups ("queues"): ShareGroupHeartbeat (76), ShareGroupDescribe (77),
ShareFetch (78), ShareAcknowledge (79), DescribeShareGroupOffsets (90), AlterShareGroupOffsets (91)
and DeleteShareGroupOffsets (92).

The handlers translate between kio entities and kcli/coordinator/share/ (``broker.share``): the
group side is routed to the group's coordinator like classic and consumer groups; ShareFetch and
ShareAcknowledge are served by each partition's share-partition leader (NOT_LEADER_OR_FOLLOWER
with the leader's endpoint otherwise). Advertising APIs 76, 78 and 79 in ApiVersions is what makes
librdkafka's ShareConsumer (2.12+) work against the broker.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.broker.authz import AUTHORIZED_OPS_OMITTED, GROUP_DENIED, TOPIC_DENIED, TOPIC_DENIED_MESSAGE, Authz, Call, register_gate
from kcli.broker.dispatch import RequestContext, handler
from kcli.broker.handlers.consumer_groups import client_host, topics_view
from kcli.coordinator.group.offsets import OffsetStoreError
from kcli.coordinator.share.group import SHARE_PROTOCOL_TYPE, ShareGroupError, ShareHeartbeatRequest
from kcli.coordinator.share.session import FINAL_EPOCH, ShareSessionError
from kcli.security.acl import AclOperation as Op, ResourceType as RT


def _share(ctx: RequestContext) -> Any:
    share = getattr(ctx.broker, "share", None)
    coord = getattr(ctx.broker, "groups", None)
    if share is None or not share.active or coord is None or not coord.active:
        return None
    return share




def _other_type(ctx: RequestContext, group_id: str) -> bool:
    """``group_id`` is a live or stored classic / consumer group (not a share group)."""
    coord = ctx.broker.groups
    if group_id in coord.consumer.groups and not coord.consumer.groups[group_id].is_empty():
        return True
    classic = coord.groups.get(group_id)
    if classic is not None and (classic.members or classic.pending_members
                                or classic.protocol_type not in (None, "", SHARE_PROTOCOL_TYPE)):
        return True
    stored = coord.store.protocol_types.get(group_id)
    return bool(stored) and stored != SHARE_PROTOCOL_TYPE or coord.store.has_offsets(group_id)


def _is_share_group(ctx: RequestContext, group_id: str) -> bool:
    share = ctx.broker.share
    return group_id in share.groups.groups or ctx.broker.groups.store.protocol_types.get(group_id) == SHARE_PROTOCOL_TYPE


# ---- ShareGroupHeartbeat / ShareGroupDescribe -------------------------------------------------------


def _hb_error(code: int, message: str | None, member_id: str | None = None) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": code, "error_message": message, "member_id": member_id,
            "member_epoch": -1, "heartbeat_interval": 0, "assignment": None}


@handler(76, "ShareGroupHeartbeat", 1, 1)
async def share_group_heartbeat(ctx: RequestContext, req: Any) -> dict[str, Any]:
    share = _share(ctx)
    if share is None:
        return _hb_error(ErrorCode.coordinator_not_available, "The coordinator is not available.")
    coord = ctx.broker.groups
    if req.group_id:
        routed = await coord.route(req.group_id)
        if routed != ErrorCode.none:
            return _hb_error(routed, None)
        if req.group_id not in share.groups.groups and _other_type(ctx, req.group_id):
            return _hb_error(ErrorCode.group_id_not_found, f"Group {req.group_id} is not a share group.")
    hb = ShareHeartbeatRequest(
        group_id=req.group_id or "", member_id=req.member_id or "", member_epoch=int(req.member_epoch),
        rack_id=req.rack_id,
        subscribed_topic_names=None if req.subscribed_topic_names is None else list(req.subscribed_topic_names),
        client_id=ctx.client_id, client_host=client_host(ctx))
    try:
        result = share.groups.heartbeat(hb, lambda: topics_view(ctx))
    except ShareGroupError as err:
        return _hb_error(err.code, err.message, hb.member_id or None)
    if hb.group_id in share.groups.groups and coord.store.protocol_types.get(hb.group_id) != SHARE_PROTOCOL_TYPE:
        # so ListGroups still names it once it is empty and unloaded
        coord.store.append_behind([{"type": "group", "group": hb.group_id, "protocol_type": SHARE_PROTOCOL_TYPE}])
    assignment = None
    if result.assignment is not None:
        assignment = {"topic_partitions": [{"topic_id": tid, "partitions": sorted(parts)}
                                           for tid, parts in sorted(result.assignment.items(), key=lambda kv: str(kv[0]))]}
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "member_id": result.member_id,
            "member_epoch": result.member_epoch, "heartbeat_interval": result.heartbeat_interval_ms,
            "assignment": assignment}


@handler(77, "ShareGroupDescribe", 1, 1)
async def share_group_describe(ctx: RequestContext, req: Any) -> dict[str, Any]:
    share = _share(ctx)
    topics = topics_view(ctx)
    out = []
    for gid in req.group_ids:
        empty = {"group_id": gid, "group_state": "", "group_epoch": -1, "assignment_epoch": -1,
                 "assignor_name": "", "members": [], "error_message": None}
        if share is None:
            out.append({**empty, "error_code": ErrorCode.coordinator_not_available})
            continue
        routed = await ctx.broker.groups.route(gid)
        if routed != ErrorCode.none:
            out.append({**empty, "error_code": routed})
            continue
        group = share.groups.groups.get(gid)
        if group is not None:
            out.append({**share.groups.describe(group, topics), "error_code": ErrorCode.none, "error_message": None})
        elif _is_share_group(ctx, gid):  # stored state, no members since the broker started
            out.append({**empty, "group_state": "Empty", "group_epoch": 0, "assignment_epoch": 0,
                        "assignor_name": "simple", "error_code": ErrorCode.none})
        elif _other_type(ctx, gid):
            out.append({**empty, "error_code": ErrorCode.group_id_not_found,
                        "error_message": f"Group {gid} is not a share group."})
        else:
            out.append({**empty, "error_code": ErrorCode.group_id_not_found, "error_message": f"Group {gid} not found."})
    return {"throttle_time": 0, "groups": out}


# ---- ShareFetch / ShareAcknowledge -----------------------------------------------------------------


def _top_error(share: Any, code: int, message: str | None) -> dict[str, Any]:
    lock = share.cfg("group.share.record.lock.duration.ms") if share is not None else 0
    return {"throttle_time": 0, "error_code": code, "error_message": message, "acquisition_lock_timeout": lock,
            "responses": [], "node_endpoints": []}


def _no_leader() -> dict[str, int]:
    return {"leader_id": -1, "leader_epoch": -1}


def _partition_answer(idx: int, *, code: int = 0, message: str | None = None, ack: int | None = None,
                      leader: dict[str, int] | None = None, fetch: bool = True) -> dict[str, Any]:
    d: dict[str, Any] = {"partition_index": idx, "error_code": code, "error_message": message,
                         "current_leader": leader or _no_leader()}
    if fetch:
        d.update(acknowledge_error_code=ack or 0, acknowledge_error_message=None, records=b"", acquired_records=[])
    return d


def _resolve(ctx: RequestContext, key: tuple[Any, int]) -> tuple[Any, int, dict[str, Any] | None]:
    """(topic, partition, None), or the per-partition error (unknown, or led by another broker:
    NOT_LEADER_OR_FOLLOWER with the leader's id and epoch) and the leader node for its endpoint."""
    b = ctx.broker
    tid, idx = key
    t = b.topic_by_id(tid) if isinstance(tid, uuid.UUID) else None
    if t is None:
        return None, -1, {"code": ErrorCode.unknown_topic_id, "message": "This server does not host this topic ID."}
    if idx not in t.partitions:
        return t, -1, {"code": ErrorCode.unknown_topic_or_partition,
                       "message": "This server does not host this topic-partition."}
    leader = b.share.leader_of(t, idx)
    if leader != b.node_id:
        return t, leader, {"code": ErrorCode.not_leader_or_follower,
                           "message": f"Broker {b.node_id} is not the share-partition leader of {t.name}-{idx}",
                           "leader": {"leader_id": leader, "leader_epoch": t.partitions[idx].leader_epoch}}
    return t, leader, None


def _endpoints(ctx: RequestContext, nodes: set[int]) -> list[dict[str, Any]]:
    out = []
    for reg in ctx.broker.live_brokers():
        if reg.node_id in nodes:
            ep = reg.endpoint(ctx.connection.listener) if hasattr(reg, "endpoint") else None
            if ep is not None:
                out.append({"node_id": reg.node_id, "host": ep[0], "port": ep[1], "rack": getattr(reg, "rack", None)})
    return out


def _acks_of(batches: Any) -> list[tuple[int, int, tuple[int, ...]]]:
    return [(int(a.first_offset), int(a.last_offset), tuple(int(x) for x in a.acknowledge_types)) for a in batches]


async def _acknowledge(ctx: RequestContext, group_id: str, member_id: str, acks: dict[tuple[Any, int], list[Any]],
                       renew: bool) -> dict[tuple[Any, int], tuple[int, str | None, dict[str, Any] | None, int]]:
    """{(topic id, partition): (error code, message, leader hint, leader node)} for each partition acknowledged."""
    share = ctx.broker.share
    out = {}
    for key, batches in acks.items():
        t, leader, err = _resolve(ctx, key)
        if err is not None:
            out[key] = (err["code"], err["message"], err.get("leader"), leader)
            continue
        try:
            code = await share.acknowledge(group_id, member_id, t, key[1], batches, renew)
        except OffsetStoreError as e:
            code = e.error_code if e.error_code != ErrorCode.not_coordinator else ErrorCode.kafka_storage_error
            out[key] = (code, str(e), None, leader)
            continue
        msg = None
        if code == ErrorCode.invalid_record_state:
            msg = "The record state is invalid. The acknowledgement of delivery could not be completed."
        out[key] = (code, msg, None, leader)
    return out


def _member_check(ctx: RequestContext, group_id: str, member_id: str) -> int:
    """A new share session of a member the group's coordinator (this broker) does not know:
    UNKNOWN_MEMBER_ID. When another broker coordinates the group, the member is not checked."""
    coord = ctx.broker.groups
    if not coord.owns(group_id):
        return ErrorCode.none
    group = ctx.broker.share.groups.groups.get(group_id)
    if group is None or member_id not in group.members:
        return ErrorCode.unknown_member_id
    return ErrorCode.none


@handler(78, "ShareFetch", 1, 2)
async def share_fetch(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    share = _share(ctx)
    if share is None:
        return _top_error(None, ErrorCode.coordinator_not_available, "Share groups are not available.")
    group_id, member_id = req.group_id or "", req.member_id or ""
    if not group_id:
        return _top_error(share, ErrorCode.invalid_group_id, "The group id must not be empty.")
    if not member_id:
        return _top_error(share, ErrorCode.invalid_request, "The member id must not be empty.")
    epoch = int(req.share_session_epoch)
    renew = bool(getattr(req, "is_renew_ack", False))
    wanted: dict[tuple[Any, int], list[Any]] = {}
    for ft in req.topics:  # a topic may come twice (librdkafka groups partitions as they come)
        for fp in ft.partitions:
            wanted.setdefault((ft.topic_id, int(fp.partition_index)), []).extend(_acks_of(fp.acknowledgement_batches))
    forgotten = [(ft.topic_id, int(p)) for ft in req.forgotten_topics_data for p in ft.partitions]
    acks = {k: v for k, v in wanted.items() if v}
    if epoch == 0:
        code = _member_check(ctx, group_id, member_id)
        if code != ErrorCode.none:
            return _top_error(share, code, f"Member {member_id} is not a member of share group {group_id}.")
    final_session = share.sessions.get(group_id, member_id) if epoch == FINAL_EPOCH else None
    try:
        named = [k for k, v in wanted.items() if not v] if epoch == FINAL_EPOCH else list(wanted)
        session, full = share.sessions.fetch_context(group_id, member_id, epoch, named, forgotten,
                                                     bool(acks), id(ctx.connection))
    except ShareSessionError as err:
        return _top_error(share, err.code, err.message)
    if session is not None:
        share.watch_connection(ctx.connection, session)
    answers: dict[tuple[Any, int], dict[str, Any]] = {}
    leaders: set[int] = set()
    for key, (code, msg, hint, leader) in (await _acknowledge(ctx, group_id, member_id, acks, renew)).items():
        answers[key] = _partition_answer(key[1], ack=code, leader=hint)
        answers[key]["acknowledge_error_message"] = msg
        if code == ErrorCode.not_leader_or_follower and leader >= 0:
            leaders.add(leader)
    if session is None:  # the final request: acknowledgements only, then the session closes
        if final_session is not None:
            share.close_session(final_session)
        return _fetch_response(ctx, share, answers, leaders)
    targets = list(session.partitions)
    if targets:  # rotate where each request starts, so no partition starves the others
        shift = session.epoch % len(targets)
        targets = targets[shift:] + targets[:shift]
    max_records = int(req.max_records)
    max_bytes = int(req.max_bytes) if int(req.max_bytes) > 0 else 0x7FFFFFFF
    deadline = time.monotonic() + max(0.0, req.max_wait.total_seconds())
    while True:
        total, keys = 0, []
        for key in targets:
            t, leader, err = _resolve(ctx, key)
            entry = answers.get(key) or _partition_answer(key[1])
            if err is not None:
                entry.update(error_code=err["code"], error_message=err["message"],
                             current_leader=err.get("leader") or _no_leader())
                if err["code"] == ErrorCode.not_leader_or_follower and leader >= 0:
                    leaders.add(leader)
                answers[key] = entry
                continue
            keys.append((t.name, key[1]))
            if total >= max_records or max_records <= 0:
                if full:
                    answers.setdefault(key, entry)
                continue
            try:
                ranges, data = await share.acquire(group_id, member_id, t, key[1], max_records - total,
                                                   max(max_bytes - sum(len(a["records"]) for a in answers.values()), 1))
            except OffsetStoreError as e:
                entry.update(error_code=ErrorCode.kafka_storage_error, error_message=str(e))
                answers[key] = entry
                continue
            except Exception as e:
                code = getattr(e, "code", None)
                if code is None:
                    raise
                entry.update(error_code=int(code), error_message=str(e) or None)
                answers[key] = entry
                continue
            if ranges:
                entry["records"] = data
                entry["acquired_records"] = [{"first_offset": f, "last_offset": la, "delivery_count": c}
                                             for f, la, c in ranges]
                total += sum(la - f + 1 for f, la, _c in ranges)
                answers[key] = entry
            elif full:
                answers.setdefault(key, entry)
        left = deadline - time.monotonic()
        if total or max_records <= 0 or left <= 0 or b.stopping or not keys or not share.active:
            break
        await b.notifier.wait(keys, left)
    if total:
        for key, entry in answers.items():
            if entry.get("records"):
                name = b.topic_by_id(key[0]).name if b.topic_by_id(key[0]) is not None else None
                if name:
                    b.metrics.inc_labelled("topic.bytes_out", {"topic": name}, len(entry["records"]))
    return _fetch_response(ctx, share, answers, leaders)


def _fetch_response(ctx: RequestContext, share: Any, answers: dict[tuple[Any, int], dict[str, Any]],
                    leaders: set[int]) -> dict[str, Any]:
    by_topic: dict[Any, list[dict[str, Any]]] = {}
    for (tid, _idx), entry in answers.items():
        by_topic.setdefault(tid, []).append(entry)
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
            "acquisition_lock_timeout": share.cfg("group.share.record.lock.duration.ms"),
            "responses": [{"topic_id": tid, "partitions": parts} for tid, parts in by_topic.items()],
            "node_endpoints": _endpoints(ctx, leaders)}


@handler(79, "ShareAcknowledge", 1, 2)
async def share_acknowledge(ctx: RequestContext, req: Any) -> dict[str, Any]:
    share = _share(ctx)
    if share is None:
        return _top_error(None, ErrorCode.coordinator_not_available, "Share groups are not available.")
    group_id, member_id = req.group_id or "", req.member_id or ""
    if not group_id:
        return _top_error(share, ErrorCode.invalid_group_id, "The group id must not be empty.")
    if not member_id:
        return _top_error(share, ErrorCode.invalid_request, "The member id must not be empty.")
    epoch = int(req.share_session_epoch)
    try:
        session = share.sessions.acknowledge_context(group_id, member_id, epoch)
    except ShareSessionError as err:
        return _top_error(share, err.code, err.message)
    acks: dict[tuple[Any, int], list[Any]] = {}
    for at in req.topics:
        for ap in at.partitions:
            acks.setdefault((at.topic_id, int(ap.partition_index)), []).extend(_acks_of(ap.acknowledgement_batches))
    results = await _acknowledge(ctx, group_id, member_id, acks, bool(getattr(req, "is_renew_ack", False)))
    if epoch == FINAL_EPOCH:
        share.close_session(session)
    leaders = {leader for code, _m, _h, leader in results.values()
               if code == ErrorCode.not_leader_or_follower and leader >= 0}
    by_topic: dict[Any, list[dict[str, Any]]] = {}
    for (tid, idx), (code, msg, hint, _leader) in results.items():
        by_topic.setdefault(tid, []).append(_partition_answer(idx, code=code, message=msg, leader=hint, fetch=False))
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
            "acquisition_lock_timeout": share.cfg("group.share.record.lock.duration.ms"),
            "responses": [{"topic_id": tid, "partitions": parts} for tid, parts in by_topic.items()],
            "node_endpoints": _endpoints(ctx, leaders)}


# ---- admin: DescribeShareGroupOffsets / AlterShareGroupOffsets / DeleteShareGroupOffsets -----------


async def _admin_group_check(ctx: RequestContext, share: Any, group_id: str, *, must_exist: bool,
                             must_be_empty: bool) -> tuple[int, str | None]:
    if share is None:
        return ErrorCode.coordinator_not_available, "The coordinator is not available."
    if not group_id:
        return ErrorCode.invalid_group_id, "The group id must not be empty."
    routed = await ctx.broker.groups.route(group_id)
    if routed != ErrorCode.none:
        return routed, None
    if group_id not in share.groups.groups and _other_type(ctx, group_id):
        return ErrorCode.group_id_not_found, f"Group {group_id} is not a share group."
    if must_exist and not _is_share_group(ctx, group_id) and not await share.group_states(group_id):
        return ErrorCode.group_id_not_found, f"Group {group_id} not found."
    group = share.groups.groups.get(group_id)
    if must_be_empty and group is not None and not group.is_empty():
        return ErrorCode.non_empty_group, "The group is not empty."
    return ErrorCode.none, None


@handler(90, "DescribeShareGroupOffsets", 0, 1)
async def describe_share_group_offsets(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    share = _share(ctx)
    groups = []
    for rg in req.groups:
        code, msg = await _admin_group_check(ctx, share, rg.group_id, must_exist=True, must_be_empty=False)
        if code != ErrorCode.none:
            groups.append({"group_id": rg.group_id, "topics": [], "error_code": code, "error_message": msg})
            continue
        try:
            states = await share.group_states(rg.group_id)
        except OffsetStoreError as err:
            groups.append({"group_id": rg.group_id, "topics": [], "error_code": err.error_code,
                           "error_message": str(err)})
            continue
        if rg.topics is None:
            asked = sorted(states)
        else:
            asked = [(rt.topic_name, int(p)) for rt in rg.topics for p in rt.partitions]
        topics: dict[str, dict[str, Any]] = {}
        for name, idx in asked:
            t = b.topic(name)
            entry = topics.setdefault(name, {"topic_name": name, "topic_id": t.topic_id if t else uuid.UUID(int=0),
                                             "partitions": []})
            part = {"partition_index": idx, "start_offset": -1, "leader_epoch": -1, "lag": -1,
                    "error_code": ErrorCode.none, "error_message": None}
            if t is None or idx not in t.partitions:
                part.update(error_code=ErrorCode.unknown_topic_or_partition,
                            error_message="This server does not host this topic-partition.")
            elif (name, idx) in states:
                state = states[(name, idx)]
                part.update(start_offset=int(state["start_offset"]), leader_epoch=t.partitions[idx].leader_epoch,
                            lag=await share.lag(t, idx, state))
            entry["partitions"].append(part)
        groups.append({"group_id": rg.group_id, "topics": list(topics.values()), "error_code": ErrorCode.none,
                       "error_message": None})
    return {"throttle_time": 0, "groups": groups}


@handler(91, "AlterShareGroupOffsets", 0, 0)
async def alter_share_group_offsets(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    share = _share(ctx)
    code, msg = await _admin_group_check(ctx, share, req.group_id, must_exist=False, must_be_empty=True)
    if code != ErrorCode.none:
        return {"throttle_time": 0, "error_code": code, "error_message": msg, "responses": []}
    responses = []
    for rt in req.topics:
        t = b.topic(rt.topic_name)
        parts = []
        for rp in rt.partitions:
            idx, offset = int(rp.partition_index), int(rp.start_offset)
            entry = {"partition_index": idx, "error_code": ErrorCode.none, "error_message": None}
            if t is None or idx not in t.partitions:
                entry.update(error_code=ErrorCode.unknown_topic_or_partition,
                             error_message="This server does not host this topic-partition.")
            elif offset < 0:
                entry.update(error_code=ErrorCode.invalid_request, error_message=f"Invalid start offset {offset}.")
            else:
                try:
                    await share.alter_offset(req.group_id, t, idx, offset)
                except OffsetStoreError as err:
                    entry.update(error_code=err.error_code, error_message=str(err))
            parts.append(entry)
        responses.append({"topic_name": rt.topic_name, "topic_id": t.topic_id if t else uuid.UUID(int=0),
                          "partitions": parts})
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "responses": responses}


@handler(92, "DeleteShareGroupOffsets", 0, 0)
async def delete_share_group_offsets(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    share = _share(ctx)
    code, msg = await _admin_group_check(ctx, share, req.group_id, must_exist=True, must_be_empty=True)
    if code != ErrorCode.none:
        return {"throttle_time": 0, "error_code": code, "error_message": msg, "responses": []}
    responses = []
    for rt in req.topics:
        t = b.topic(rt.topic_name)
        entry = {"topic_name": rt.topic_name, "topic_id": t.topic_id if t else uuid.UUID(int=0),
                 "error_code": ErrorCode.none, "error_message": None}
        if t is None:
            entry.update(error_code=ErrorCode.unknown_topic_or_partition,
                         error_message="This server does not host this topic-partition.")
        else:
            try:
                await share.delete_offsets(req.group_id, t.name)
            except OffsetStoreError as err:
                entry.update(error_code=err.error_code, error_message=str(err))
        responses.append(entry)
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "responses": responses}


# ---- authorization (with an authorizer configured) -------------------------------------------------


def _group_gate(op: int, error: Any) -> Any:
    async def gate(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
        if not az.allowed(op, RT.GROUP, req.group_id or ""):
            return error(req)
        return await call(req)

    return gate


register_gate(76)(_group_gate(Op.READ, lambda req: _hb_error(GROUP_DENIED, None)))


def _records_gate(fetch: bool) -> Any:
    """ShareFetch / ShareAcknowledge (KafkaApis.handleShareFetchRequest): READ on the group, then
    READ on each topic; a denied topic's partitions answer TOPIC_AUTHORIZATION_FAILED and never
    reach the share partitions (nothing acquired, nothing acknowledged), the others proceed."""
    async def gate(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
        if not az.allowed(Op.READ, RT.GROUP, req.group_id or ""):
            return _top_error(None, GROUP_DENIED, None)
        allowed, denied = [], []
        for t in req.topics or ():
            topic = az.ctx.broker.topic_by_id(t.topic_id)  # an unknown id: the handler's UNKNOWN_TOPIC_ID
            (denied if topic is not None and not az.allowed(Op.READ, RT.TOPIC, topic.name) else allowed).append(t)
        if not denied:
            return await call(req)
        body = await call(dataclasses.replace(req, topics=tuple(allowed)))
        if body is None:
            return None
        body["responses"] = list(body.get("responses") or []) + [
            {"topic_id": t.topic_id, "partitions": [
                _partition_answer(p.partition_index, code=TOPIC_DENIED, message=TOPIC_DENIED_MESSAGE, fetch=fetch)
                for p in t.partitions]} for t in denied]
        return body

    return gate


register_gate(78)(_records_gate(fetch=True))
register_gate(79)(_records_gate(fetch=False))
register_gate(91)(_group_gate(Op.READ, lambda req: {"throttle_time": 0, "error_code": GROUP_DENIED,
                                                    "error_message": None, "responses": []}))
register_gate(92)(_group_gate(Op.DELETE, lambda req: {"throttle_time": 0, "error_code": GROUP_DENIED,
                                                      "error_message": None, "responses": []}))


@register_gate(77)
async def _describe_gate(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
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


@register_gate(90)
async def _describe_offsets_gate(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    body = await call(req)
    if body is None:
        return None
    for grp in body.get("groups") or []:
        if not az.allowed(Op.DESCRIBE, RT.GROUP, grp["group_id"]):
            grp.update(error_code=GROUP_DENIED, topics=[], error_message=None)
    return body


# ---- share group configs: DescribeConfigs / IncrementalAlterConfigs / AlterConfigs on a GROUP -------
#
# Kafka keeps group configs (ConfigResource type GROUP, 32) such as share.auto.offset.reset; kcli
# answers them for share groups here, in front of kcli/broker/handlers/admin.py's handlers (which
# keep every other resource type), so kafka-configs.sh --entity-type groups and Admin clients work.

GROUP_RESOURCE = 32
SHARE_GROUP_CONFIGS = {  # name -> (type, doc, validator)
    "share.auto.offset.reset": ("string", "Where a share group starts reading a partition it has no state for: "
                                "latest (the default) or earliest."),
    "share.record.lock.duration.ms": ("int", "Acquisition lock duration of the group's records (the broker's "
                                      "group.share.record.lock.duration.ms by default)."),
}
_TYPE_CODES = {"string": 2, "int": 3}


def _check_group_config(name: str, value: str | None) -> str | None:
    if name not in SHARE_GROUP_CONFIGS:
        return f"Unknown group config name: {name}"
    if value is None:
        return None
    if name == "share.auto.offset.reset" and value.lower() not in ("latest", "earliest"):
        return f"Invalid value {value} for configuration share.auto.offset.reset: String must be one of: latest, earliest"
    if name == "share.record.lock.duration.ms":
        try:
            if int(value) < 1000:
                return f"Invalid value {value} for configuration share.record.lock.duration.ms: Value must be at least 1000"
        except ValueError:
            return f"Invalid value {value} for configuration share.record.lock.duration.ms: Not a number of type INT"
    return None


async def _describe_group_configs(ctx: RequestContext, r: Any, include_docs: bool) -> dict[str, Any]:
    share = _share(ctx)
    entry: dict[str, Any] = {"error_code": 0, "error_message": None, "resource_type": GROUP_RESOURCE,
                             "resource_name": r.resource_name, "configs": []}
    if share is None:
        entry.update(error_code=ErrorCode.coordinator_not_available, error_message="The coordinator is not available.")
        return entry
    try:
        current = await share.load_group_configs(r.resource_name)
    except OffsetStoreError as err:
        entry.update(error_code=err.error_code, error_message=str(err))
        return entry
    keys = set(r.configuration_keys) if r.configuration_keys is not None else None
    defaults = {"share.auto.offset.reset": "latest",
                "share.record.lock.duration.ms": str(share.cfg("group.share.record.lock.duration.ms"))}
    for name, (type_, doc) in sorted(SHARE_GROUP_CONFIGS.items()):
        if keys is not None and name not in keys:
            continue
        set_here = name in current
        entry["configs"].append({"name": name, "value": current.get(name, defaults[name]), "read_only": False,
                                 "config_source": 8 if set_here else 5, "is_sensitive": False, "synonyms": [],
                                 "config_type": _TYPE_CODES[type_], "documentation": doc if include_docs else None})
    return entry


async def _alter_group_configs(ctx: RequestContext, r: Any, changes: dict[str, str | None], incremental: bool,
                               validate_only: bool) -> dict[str, Any]:
    share = _share(ctx)
    entry = {"error_code": 0, "error_message": None, "resource_type": GROUP_RESOURCE, "resource_name": r.resource_name}
    if share is None:
        entry.update(error_code=ErrorCode.coordinator_not_available, error_message="The coordinator is not available.")
        return entry
    if not r.resource_name:
        entry.update(error_code=ErrorCode.invalid_request, error_message="The group id must not be empty.")
        return entry
    for name, value in changes.items():
        problem = _check_group_config(name, value)
        if problem:
            entry.update(error_code=ErrorCode.invalid_config, error_message=problem)
            return entry
    try:
        current = await share.load_group_configs(r.resource_name) if incremental else {}
        new = dict(current)
        for name, value in changes.items():
            if value is None:
                new.pop(name, None)
            else:
                new[name] = value.lower() if name == "share.auto.offset.reset" else value
        if not validate_only:
            await share.set_group_configs(r.resource_name, new)
    except OffsetStoreError as err:
        entry.update(error_code=err.error_code, error_message=str(err))
    return entry


def _wrap_config_apis() -> None:
    """Put the GROUP resources of DescribeConfigs (32), AlterConfigs (33) and
    IncrementalAlterConfigs (44) here, the rest to admin.py's handlers, answers in request order."""
    import dataclasses

    import kcli.broker.handlers.admin  # noqa: F401 (its handlers must be registered first)
    from kcli.broker.dispatch import HANDLERS

    def wrap(api_key: int, array_in: str, array_out: str, one: Any) -> None:
        base = HANDLERS[api_key]
        if getattr(base.fn, "_share_group_configs", False):
            return
        inner = base.fn

        async def fn(ctx: RequestContext, req: Any) -> dict[str, Any] | None:
            resources = list(getattr(req, array_in))
            if not any(int(r.resource_type) == GROUP_RESOURCE for r in resources):
                return await inner(ctx, req)
            others = [r for r in resources if int(r.resource_type) != GROUP_RESOURCE]
            body = await inner(ctx, dataclasses.replace(req, **{array_in: tuple(others)})) if others else \
                {"throttle_time": 0, array_out: []}
            theirs = iter(body.get(array_out) or [])
            merged = []
            for r in resources:
                merged.append(await one(ctx, req, r) if int(r.resource_type) == GROUP_RESOURCE else next(theirs))
            body[array_out] = merged
            return body

        fn._share_group_configs = True  # type: ignore[attr-defined]
        handler(api_key, base.name, base.min_version, base.max_version)(fn)

    async def describe_one(ctx: RequestContext, req: Any, r: Any) -> dict[str, Any]:
        return await _describe_group_configs(ctx, r, bool(getattr(req, "include_documentation", False)))

    async def alter_one(ctx: RequestContext, req: Any, r: Any) -> dict[str, Any]:
        return await _alter_group_configs(ctx, r, {c.name: c.value for c in r.configs}, False, bool(req.validate_only))

    async def incremental_one(ctx: RequestContext, req: Any, r: Any) -> dict[str, Any]:
        changes: dict[str, str | None] = {}
        for c in r.configs:
            op = int(c.config_operation)
            if op not in (0, 1):
                return {"error_code": ErrorCode.invalid_config, "error_message":
                        f"Config value append is not allowed for config key: {c.name}",
                        "resource_type": GROUP_RESOURCE, "resource_name": r.resource_name}
            changes[c.name] = c.value if op == 0 else None
        return await _alter_group_configs(ctx, r, changes, True, bool(req.validate_only))

    wrap(32, "resources", "results", describe_one)
    wrap(33, "resources", "responses", alter_one)
    wrap(44, "resources", "responses", incremental_one)


_wrap_config_apis()
