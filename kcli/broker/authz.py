"""Authorization of requests: Kafka's operation per API, checked before the handler runs.

The handlers stay as they are. With an authorizer configured (``authorizer.class.name``), every
request passes through the gate registered for its API key here, as KafkaApis does it:

* entries the principal may not touch are taken out of the request before the handler sees it,
  and answered with TOPIC_/GROUP_/CLUSTER_/TRANSACTIONAL_ID_AUTHORIZATION_FAILED in the response,
  built from the schema like any error response (:func:`kcli.protocol.codec.error_response_body`);
* read-only answers (OffsetFetch, DescribeGroups, ListGroups, Metadata of all topics) are
  filtered afterwards: what may not be described is hidden or answered with the error;
* an API without a gate is refused (CLUSTER_AUTHORIZATION_FAILED) to everyone but super users,
  so an API added later is closed until its check is written (:func:`register_gate`).

Without an authorizer only the authorized-operations fields are filled (every supported
operation, as Kafka reports then). Other modules ask :func:`authorize` / :func:`authorize_many`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.security.acl import CLUSTER_NAME, AclOperation as Op, ResourceType as RT, all_operations_bits
from kcli.broker.dispatch import HANDLERS, ApiHandler, HandlerFn, RequestContext
from kcli.protocol import codec
from kcli.protocol.interbroker import INTER_BROKER_CLIENT_ID

TOPIC_DENIED = int(ErrorCode.topic_authorization_failed)  # 29
GROUP_DENIED = int(ErrorCode.group_authorization_failed)  # 30
CLUSTER_DENIED = int(ErrorCode.cluster_authorization_failed)  # 31
TXN_DENIED = int(ErrorCode.transactional_id_authorization_failed)  # 53
AUTHZ_FAILED = "Authorization failed."  # Kafka's message for admin API entries
AUTHORIZED_OPS_OMITTED = -2147483648

Call = Callable[[Any], Awaitable[dict[str, Any] | None]]
Gate = Callable[["Authz", Any, Call], Awaitable[dict[str, Any] | None]]
GATES: dict[int, Gate] = {}
OPEN_APIS = frozenset({17, 18, 36})  # SaslHandshake, ApiVersions, SaslAuthenticate: before any principal
# Gates that also run without an authorizer: they fill authorized-operations fields.
FILLS_OPERATIONS = frozenset({3, 15, 60})
# The ACL APIs answer SECURITY_DISABLED themselves when there is no authorizer.


def register_gate(*api_keys: int) -> Callable[[Gate], Gate]:
    """Register the authorization check of one or more APIs (another module may add its own)."""

    def add(fn: Gate) -> Gate:
        for key in api_keys:
            GATES[key] = fn
        return fn

    return add


def peer_host(peer: str) -> str:
    """The client's address without the port ('127.0.0.1:5555' → '127.0.0.1')."""
    host = peer.rsplit(":", 1)[0] if ":" in peer else peer
    return host.strip("[]")


# Kafka's kafka.authorizer.logger: a denial at INFO, an allowed operation at DEBUG.
audit_log = logging.getLogger("kcli.authorizer")


def _enum_name(enum: type, value: int) -> str:
    try:
        return enum(value).name
    except ValueError:
        return str(value)


def authorize(ctx: RequestContext, operation: int, resource_type: int, name: str, *, log_denied: bool = True) -> bool:
    """May this request's principal do ``operation`` on the resource? True without an authorizer.

    The one call for code outside this module (e.g. transactions: WRITE on TRANSACTIONAL_ID). As
    Kafka's authorizer logger does, each decision is logged (``log_denied=False`` where Kafka's
    action has logIfDenied off: filtering an all-topics Metadata answer)."""
    authorizer = ctx.broker.authorizer
    if authorizer is None:
        return True
    conn = ctx.connection
    host = peer_host(conn.peer)
    allowed = authorizer.authorize(conn.principal, host, operation, resource_type, name)
    level = logging.DEBUG if allowed or not log_denied else logging.INFO
    if audit_log.isEnabledFor(level):
        handler = HANDLERS.get(ctx.header.api_key)
        verdict, op, rtype = "Allowed" if allowed else "Denied", _enum_name(Op, operation), _enum_name(RT, resource_type)
        audit_log.log(level, "Principal = %s is %s operation = %s from host = %s on resource = %s:LITERAL:%s for request = %s",
                      conn.principal, verdict, op, host, rtype.title().replace("_", ""), name,
                      handler.name if handler else ctx.header.api_key,
                      extra={"event": f"authorizer.{verdict.lower()}", "principal": conn.principal,
                             "client_host": host, "operation": op, "resource_type": rtype, "resource": name})
    return allowed


def authorize_many(ctx: RequestContext, actions: Iterable[tuple[int, int, str]]) -> list[bool]:
    """The batch form of :func:`authorize`: one answer per (operation, resource type, name)."""
    return [authorize(ctx, op, rtype, name) for op, rtype, name in actions]


class Authz:
    """One request's view of the authorizer: decisions cached for the request's lifetime."""

    def __init__(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        self.authorizer = ctx.broker.authorizer
        self._cache: dict[tuple[int, int, str], bool] = {}

    @property
    def version(self) -> int:
        return self.ctx.api_version

    def allowed(self, op: int, rtype: int, name: str | None, *, log_denied: bool = True) -> bool:
        if self.authorizer is None:
            return True
        if name is None:
            return False
        key = (int(op), int(rtype), name)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = authorize(self.ctx, op, rtype, name, log_denied=log_denied)
        return hit

    def cluster(self, op: int) -> bool:
        return self.allowed(op, RT.CLUSTER, CLUSTER_NAME)

    def operations(self, rtype: int, name: str) -> int:
        if self.authorizer is None:
            return all_operations_bits(rtype)
        conn = self.ctx.connection
        return self.authorizer.authorized_operations(conn.principal, peer_host(conn.peer), rtype, name)

    def error_body(self, req: Any, code: int, message: str | None = None) -> dict[str, Any]:
        """Every entry of ``req`` answered with ``code`` (Kafka's getErrorResponse)."""
        h = self.ctx.header
        return _fix_records(codec.error_response_body(h.api_key, h.api_version, req, code, message))


def guarded(h: ApiHandler, broker: Any) -> HandlerFn:
    """``h``'s handler behind its gate; the handler itself when nothing needs checking."""
    gate = GATES.get(h.api_key)
    if h.api_key in OPEN_APIS or (broker.authorizer is None and h.api_key not in FILLS_OPERATIONS):
        return h.fn
    fn = h.fn

    async def run(ctx: RequestContext, req: Any) -> dict[str, Any] | None:
        az = Authz(ctx)
        if gate is None:  # no check written for this API: super users only
            if ctx.connection.principal in broker.authorizer.super_users:
                return await fn(ctx, req)
            if int(getattr(req, "acks", -1)) == 0:
                return None
            return az.error_body(req, CLUSTER_DENIED, AUTHZ_FAILED)
        return await gate(az, req, lambda r: fn(ctx, r))

    return run


def _fix_records(body: Any) -> Any:
    """An error entry built from the schema has null records; clients want an empty set."""
    if isinstance(body, dict):
        for k, v in body.items():
            if k == "records" and v is None:
                body[k] = b""
            else:
                _fix_records(v)
    elif isinstance(body, list):
        for v in body:
            _fix_records(v)
    return body


def _merge(body: dict[str, Any], errors: dict[str, Any]) -> dict[str, Any]:
    """Append the error entries' arrays to the handler's answer."""
    for k, v in errors.items():
        if isinstance(v, list):
            body[k] = list(body.get(k) or []) + v
    return body


def _clear_top_level(body: dict[str, Any]) -> dict[str, Any]:
    """An answer made only of denied entries: the request as a whole did not fail."""
    if "error_code" in body:
        body["error_code"] = 0
    if "error_message" in body:
        body["error_message"] = None
    body.setdefault("throttle_time", 0)
    return body


async def split(az: Authz, req: Any, call: Call, array: str, code_of: Callable[[Any], int],
                message: str | None = None,
                error_entry: Callable[[Any, int], dict[str, Any]] | None = None,
                response_array: str | None = None) -> dict[str, Any] | None:
    """Run the handler on the entries of ``req.<array>`` that pass (``code_of(entry) == 0``) and
    answer the others with their code: Kafka's partition into authorized and unauthorized."""
    entries = tuple(getattr(req, array) or ())
    allowed: list[Any] = []
    denied: dict[int, list[Any]] = {}
    for e in entries:
        code = code_of(e)
        if code:
            denied.setdefault(code, []).append(e)
        else:
            allowed.append(e)
    if not denied:
        return await call(req)
    if error_entry is not None:
        assert response_array is not None
        errors: dict[str, Any] = {response_array: [error_entry(e, code) for code, es in denied.items() for e in es]}
    else:
        errors = {}
        for code, es in denied.items():
            _merge(errors, az.error_body(dataclasses.replace(req, **{array: tuple(es)}), code, message))
    if allowed:
        body = await call(dataclasses.replace(req, **{array: tuple(allowed)}))
        if body is None:  # acks=0
            return None
    else:
        if int(getattr(req, "acks", -1)) == 0:
            return None
        body = _clear_top_level(az.error_body(dataclasses.replace(req, **{array: ()}), 0))
    return _merge(body, errors)


def _topic(az: Authz, op: int, pass_unknown: bool = False) -> Callable[[Any], int]:
    """0 when the entry's topic allows ``op``, else TOPIC_AUTHORIZATION_FAILED. With
    ``pass_unknown``, an entry naming no known topic (an unknown id) goes to the handler, which
    answers UNKNOWN_TOPIC_ID."""
    def code(entry: Any) -> int:
        name = _entry_name(az, entry)
        if name is None and pass_unknown:
            return 0
        return 0 if az.allowed(op, RT.TOPIC, name) else TOPIC_DENIED

    return code


def _entry_name(az: Authz, entry: Any) -> str | None:
    """A request entry's topic name; resolved from its topic id where it has only that (None for
    an unknown id)."""
    if isinstance(entry, str):
        return entry
    for field in ("name", "topic", "topic_name"):
        name = getattr(entry, field, None)
        if name:
            return name
    topic_id = getattr(entry, "topic_id", None)
    if topic_id is not None:
        t = az.ctx.broker.topic_by_id(topic_id)
        if t is None:
            return None
        return t.name
    return None


def _topic_gate(array: str, op: int, message: str | None = None, pass_unknown: bool = False) -> Gate:
    """A request whose ``array`` lists topics, each needing ``op``."""
    async def gate(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
        return await split(az, req, call, array, _topic(az, op, pass_unknown), message)

    return gate


# ---- produce, fetch, offsets --------------------------------------------------------------------


@register_gate(0)
async def _produce(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    if req.transactional_id is not None and not az.allowed(Op.WRITE, RT.TRANSACTIONAL_ID, req.transactional_id):
        return None if int(req.acks) == 0 else az.error_body(req, TXN_DENIED)
    return await split(az, req, call, "topic_data", _topic(az, Op.WRITE))


register_gate(1)(_topic_gate("topics", Op.READ, pass_unknown=True))  # Fetch
register_gate(2)(_topic_gate("topics", Op.DESCRIBE))  # ListOffsets
register_gate(21)(_topic_gate("topics", Op.DELETE))  # DeleteRecords
register_gate(37, 32001)(_topic_gate("topics", Op.ALTER, AUTHZ_FAILED))  # CreatePartitions, DeletePartitions


@register_gate(22)
async def _init_producer_id(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    """A transactional producer needs WRITE on its transactional id; an idempotent one
    IDEMPOTENT_WRITE on the cluster or WRITE on some topic (KIP-679, as KafkaApis)."""
    if req.transactional_id is not None:
        if not az.allowed(Op.WRITE, RT.TRANSACTIONAL_ID, req.transactional_id):
            return az.error_body(req, TXN_DENIED)
    elif not az.cluster(Op.IDEMPOTENT_WRITE):
        conn = az.ctx.connection
        if az.authorizer is not None and not az.authorizer.authorize_by_resource_type(
                conn.principal, peer_host(conn.peer), Op.WRITE, RT.TOPIC):
            return az.error_body(req, CLUSTER_DENIED)
    return await call(req)


# ---- metadata and cluster -----------------------------------------------------------------------


@register_gate(3)
async def _metadata(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    """KafkaApis.handleTopicMetadataRequest: topics the principal may not describe are hidden
    from an all-topics answer and refused by name; auto-creation needs CREATE on the cluster
    or on the topic."""
    b = az.ctx.broker
    requested = req.topics
    all_topics = requested is None or (az.version == 0 and len(requested) == 0)
    denied: list[dict[str, Any]] = []
    if all_topics:
        body = await call(req)
        assert body is not None
        body["topics"] = [t for t in body["topics"] if az.allowed(Op.DESCRIBE, RT.TOPIC, t["name"], log_denied=False)]
    else:
        keep = []
        auto = b.config.get_bool("auto.create.topics.enable") and getattr(req, "allow_auto_topic_creation", True)
        for rt in requested:
            name = _entry_name(az, rt)
            if name is None:  # an unknown topic id: the handler answers UNKNOWN_TOPIC_ID
                keep.append(rt)
            elif not az.allowed(Op.DESCRIBE, RT.TOPIC, name):
                # the name is echoed only when the client sent it: an id never reveals one
                denied.append({"error_code": TOPIC_DENIED, "name": rt.name, "topic_id": getattr(rt, "topic_id", None),
                               "is_internal": False, "partitions": [],
                               "topic_authorized_operations": AUTHORIZED_OPS_OMITTED})
            elif auto and b.topic(name) is None and not az.cluster(Op.CREATE) \
                    and not az.allowed(Op.CREATE, RT.TOPIC, name):
                denied.append({"error_code": TOPIC_DENIED, "name": name, "is_internal": False, "partitions": [],
                               "topic_authorized_operations": 0})
            else:
                keep.append(rt)
        body = await call(dataclasses.replace(req, topics=tuple(keep)))
        assert body is not None
        if not keep:  # an empty list means "all topics" to Metadata v0
            body["topics"] = []
    if getattr(req, "include_topic_authorized_operations", False):
        for t in body["topics"]:
            if t.get("error_code") in (0, int(ErrorCode.leader_not_available)) and t.get("name"):
                t["topic_authorized_operations"] = az.operations(RT.TOPIC, t["name"])
    body["topics"] = list(body["topics"]) + denied
    if getattr(req, "include_cluster_authorized_operations", False):
        body["cluster_authorized_operations"] = az.operations(RT.CLUSTER, CLUSTER_NAME)
    return body


@register_gate(60)
async def _describe_cluster(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    if not az.cluster(Op.DESCRIBE):
        return az.error_body(req, CLUSTER_DENIED)
    body = await call(req)
    if body is not None and getattr(req, "include_cluster_authorized_operations", False):
        body["cluster_authorized_operations"] = az.operations(RT.CLUSTER, CLUSTER_NAME)
    return body


def _denied(code: int, **fields: Any) -> dict[str, Any]:
    return {"error_code": code, "error_message": AUTHZ_FAILED, **fields}


# The entries of a refused SCRAM or ACL request, one per entry of the request (Kafka's
# getErrorResponse; their arrays do not mirror the request's, so the schema cannot say).
_CLUSTER_DENIALS: dict[int, tuple[int, Callable[[Any], dict[str, Any]]]] = {
    50: (Op.DESCRIBE, lambda req: {"error_code": CLUSTER_DENIED, "error_message": AUTHZ_FAILED, "results": [
        _denied(CLUSTER_DENIED, user=u.name, credential_infos=[]) for u in req.users or ()]}),
    51: (Op.ALTER, lambda req: {"results": [_denied(CLUSTER_DENIED, user=u.name)
                                            for u in (*req.deletions, *req.upsertions)]}),
    29: (Op.DESCRIBE, lambda req: _denied(CLUSTER_DENIED, resources=[])),
    30: (Op.ALTER, lambda req: {"results": [_denied(CLUSTER_DENIED) for _ in req.creations]}),
    31: (Op.ALTER, lambda req: {"filter_results": [_denied(CLUSTER_DENIED, matching_acls=[]) for _ in req.filters]}),
}


@register_gate(*_CLUSTER_DENIALS)
async def _cluster_api(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    """SCRAM credentials and ACLs: DESCRIBE or ALTER on the cluster."""
    op, denial = _CLUSTER_DENIALS[az.ctx.header.api_key]
    if not az.cluster(op):
        return {"throttle_time": 0, **denial(req)}
    return await call(req)


@register_gate(43, 45, 46)
async def _replica_admin(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    """ElectLeaders and AlterPartitionReassignments: ALTER on the cluster;
    ListPartitionReassignments: DESCRIBE on it (Kafka's KafkaApis)."""
    key = az.ctx.header.api_key
    if az.cluster(Op.DESCRIBE if key == 46 else Op.ALTER):
        return await call(req)
    if key == 43:
        return {"throttle_time": 0, "error_code": CLUSTER_DENIED, "replica_election_results": [
            {"topic": tp.topic, "partition_result": [{"partition_id": int(p), "error_code": CLUSTER_DENIED,
                                                      "error_message": AUTHZ_FAILED} for p in tp.partitions]}
            for tp in req.topic_partitions or ()]}
    return {"throttle_time": 0, "error_code": CLUSTER_DENIED, "error_message": AUTHZ_FAILED,
            "responses": [], "topics": []}


# ---- topic administration -----------------------------------------------------------------------


@register_gate(19)
async def _create_topics(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    """CREATE on the cluster or on each topic; the new topic's configs are shown only with
    DESCRIBE_CONFIGS on it, as Kafka (whose topic_config_error_code is a tagged field kcli never writes)."""
    if az.cluster(Op.CREATE):
        body = await call(req)
    else:
        body = await split(az, req, call, "topics", _topic(az, Op.CREATE), AUTHZ_FAILED)
    for t in (body or {}).get("topics") or []:
        if not t.get("error_code") and not az.allowed(Op.DESCRIBE_CONFIGS, RT.TOPIC, t.get("name")):
            t["configs"] = None
    return body


@register_gate(20)
async def _delete_topics(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    array = "topics" if az.version >= 6 else "topic_names"
    return await split(az, req, call, array, _topic(az, Op.DELETE, pass_unknown=True), AUTHZ_FAILED)


def _config_resource(az: Authz, op: int) -> Callable[[Any], int]:
    """Topic configs need ``op`` on the topic; broker and broker-logger configs on the cluster."""
    def code(r: Any) -> int:
        if int(r.resource_type) == 2:
            return 0 if az.allowed(op, RT.TOPIC, r.resource_name) else TOPIC_DENIED
        if int(r.resource_type) in (4, 8):
            return 0 if az.cluster(op) else CLUSTER_DENIED
        return 0  # the handler refuses an unknown resource type

    return code


@register_gate(32)
async def _describe_configs(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    return await split(az, req, call, "resources", _config_resource(az, Op.DESCRIBE_CONFIGS), AUTHZ_FAILED)


@register_gate(33, 44)
async def _alter_configs(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    return await split(az, req, call, "resources", _config_resource(az, Op.ALTER_CONFIGS), AUTHZ_FAILED)


def _kcli_admin_gate(op: int) -> Gate:
    async def gate(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
        if not az.cluster(op):
            from kcli.diskless import admin_api

            return {"error_code": CLUSTER_DENIED, "json": admin_api.encode_doc({"error": AUTHZ_FAILED})}
        return await call(req)

    return gate


register_gate(32010, 32011, 32012, 32013)(_kcli_admin_gate(Op.DESCRIBE))  # metrics, diskless describe/objects/verify
register_gate(32014)(_kcli_admin_gate(Op.ALTER))  # diskless garbage collection


# ---- groups -------------------------------------------------------------------------------------


def _group_gate(op: int) -> Gate:
    """JoinGroup, SyncGroup, Heartbeat, LeaveGroup: the whole request is about one group."""
    async def gate(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
        if not az.allowed(op, RT.GROUP, req.group_id):
            return az.error_body(req, GROUP_DENIED)
        return await call(req)

    return gate


register_gate(11, 12, 13, 14)(_group_gate(Op.READ))


@register_gate(8)
async def _offset_commit(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    if not az.allowed(Op.READ, RT.GROUP, req.group_id):
        return az.error_body(req, GROUP_DENIED)
    return await split(az, req, call, "topics", _topic(az, Op.READ))


@register_gate(47)
async def _offset_delete(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    if not az.allowed(Op.DELETE, RT.GROUP, req.group_id):
        return {"throttle_time": 0, "error_code": GROUP_DENIED, "topics": []}
    return await split(az, req, call, "topics", _topic(az, Op.READ))


def _hide_offsets(az: Authz, topics: list[dict[str, Any]], requested: bool) -> list[dict[str, Any]]:
    """Offsets of topics the principal may not describe: refused when asked for by name,
    left out of an all-topics answer (KafkaApis' OffsetFetch)."""
    out = []
    for t in topics:
        if az.allowed(Op.DESCRIBE, RT.TOPIC, t.get("name")):
            out.append(t)
        elif requested:
            out.append({**t, "partitions": [
                {**p, "committed_offset": -1, "committed_leader_epoch": -1, "metadata": None, "error_code": TOPIC_DENIED}
                for p in t.get("partitions", [])]})
    return out


@register_gate(9)
async def _offset_fetch(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    if az.version < 8:
        if not az.allowed(Op.DESCRIBE, RT.GROUP, req.group_id):
            return az.error_body(req, GROUP_DENIED)
        body = await call(req)
        if body is not None:
            body["topics"] = _hide_offsets(az, body.get("topics") or [], req.topics is not None)
        return body
    body = await call(req)
    if body is None:
        return None
    asked = {g.group_id: g.topics is not None for g in req.groups}
    for g in body.get("groups") or []:
        if not az.allowed(Op.DESCRIBE, RT.GROUP, g["group_id"]):
            g.update(error_code=GROUP_DENIED, topics=[])
        else:
            g["topics"] = _hide_offsets(az, g.get("topics") or [], asked.get(g["group_id"], False))
    return body


@register_gate(10)
async def _find_coordinator(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    """DESCRIBE on the group (key type 0) or the transactional id (key type 1)."""
    def denied_code(key: str) -> int:
        if int(req.key_type) == 1:
            return 0 if az.allowed(Op.DESCRIBE, RT.TRANSACTIONAL_ID, key) else TXN_DENIED
        return 0 if az.allowed(Op.DESCRIBE, RT.GROUP, key) else GROUP_DENIED

    if az.version < 4:
        code = denied_code(req.key)
        if code:
            return {"throttle_time": 0, "error_code": code, "error_message": None, "node_id": -1, "host": "", "port": -1}
        return await call(req)
    return await split(az, req, call, "coordinator_keys", denied_code,
                       error_entry=lambda key, code: {"key": key, "node_id": -1, "host": "", "port": -1,
                                                      "error_code": code, "error_message": None},
                       response_array="coordinators")


@register_gate(15)
async def _describe_groups(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    body = await call(req)
    if body is None:
        return None
    with_ops = bool(getattr(req, "include_authorized_operations", False))
    for g in body.get("groups") or []:
        if not az.allowed(Op.DESCRIBE, RT.GROUP, g["group_id"]):
            g.update(error_code=GROUP_DENIED, group_state="", protocol_type="", protocol_data="", members=[])
            if with_ops:
                g["authorized_operations"] = AUTHORIZED_OPS_OMITTED
        elif with_ops:
            g["authorized_operations"] = az.operations(RT.GROUP, g["group_id"])
    return body


@register_gate(16)
async def _list_groups(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    body = await call(req)
    if body is not None and not az.cluster(Op.DESCRIBE):
        body["groups"] = [g for g in body.get("groups") or [] if az.allowed(Op.DESCRIBE, RT.GROUP, g["group_id"])]
    return body


@register_gate(42)
async def _delete_groups(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    return await split(az, req, call, "groups_names",
                       lambda gid: 0 if az.allowed(Op.DELETE, RT.GROUP, gid) else GROUP_DENIED,
                       error_entry=lambda gid, code: {"group_id": gid, "error_code": code}, response_array="results")


# ---- transactions -------------------------------------------------------------------------------
# KafkaApis: the transactional id is checked first (WRITE; a refusal fails the whole request),
# then the group and the topics.

NOT_ATTEMPTED = int(ErrorCode.operation_not_attempted)  # 55
UNKNOWN_PARTITION = int(ErrorCode.unknown_topic_or_partition)  # 3
TOPIC_DENIED_MESSAGE = "Topic authorization failed."  # Kafka's message for TOPIC_AUTHORIZATION_FAILED


def _txn_id_denied(az: Authz, tid: str | None) -> bool:
    return not az.allowed(Op.WRITE, RT.TRANSACTIONAL_ID, tid)


@register_gate(24)
async def _add_partitions_to_txn(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    """WRITE on the transactional id (else 53 for every partition) and on each topic. Adding
    partitions is all or nothing: with any topic refused, nothing is added; the refused partitions
    get 29, unknown ones UNKNOWN_TOPIC_OR_PARTITION, the rest OPERATION_NOT_ATTEMPTED."""
    if az.version >= 4:  # KIP-890: brokers only; the handler checks ClusterAction (from_a_broker)
        return await call(req)
    topics = tuple(req.v3_and_below_topics or ())
    if _txn_id_denied(az, req.v3_and_below_transactional_id):
        return _add_partitions_answer(topics, lambda _t, _p: TXN_DENIED)
    if all(az.allowed(Op.WRITE, RT.TOPIC, t.name) for t in topics):
        return await call(req)
    b = az.ctx.broker

    def code(topic: str, partition: int) -> int:
        if not az.allowed(Op.WRITE, RT.TOPIC, topic):
            return TOPIC_DENIED
        t = b.topic(topic)
        return NOT_ATTEMPTED if t is not None and partition in t.partitions else UNKNOWN_PARTITION

    return _add_partitions_answer(topics, code)


def _add_partitions_answer(topics: Sequence[Any], code: Callable[[str, int], int]) -> dict[str, Any]:
    return {"throttle_time": 0, "results_by_topic_v3_and_below": [
        {"name": t.name, "results_by_partition": [{"partition_index": int(p), "partition_error_code": code(t.name, int(p))}
                                                  for p in t.partitions]} for t in topics]}


@register_gate(25)
async def _add_offsets_to_txn(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    """WRITE on the transactional id, READ on the group whose offsets join the transaction."""
    if _txn_id_denied(az, req.transactional_id):
        return az.error_body(req, TXN_DENIED)
    if not az.allowed(Op.READ, RT.GROUP, req.group_id):
        return az.error_body(req, GROUP_DENIED)
    return await call(req)


@register_gate(26)
async def _end_txn(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    if _txn_id_denied(az, req.transactional_id):
        return az.error_body(req, TXN_DENIED)
    return await call(req)


@register_gate(28)
async def _txn_offset_commit(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    """WRITE on the transactional id and READ on the group (each refusal answers every
    partition), then READ on each topic (29 per partition, the others go ahead)."""
    if _txn_id_denied(az, req.transactional_id):
        return az.error_body(req, TXN_DENIED)
    if not az.allowed(Op.READ, RT.GROUP, req.group_id):
        return az.error_body(req, GROUP_DENIED)
    return await split(az, req, call, "topics", _topic(az, Op.READ))


@register_gate(27)
async def _write_txn_markers(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    """An inter-broker API (and what Admin.abortTransaction sends): CLUSTER_ACTION on the cluster."""
    if az.cluster(Op.CLUSTER_ACTION):
        return await call(req)
    return {"markers": [{"producer_id": int(m.producer_id), "topics": [
        {"name": t.name, "partitions": [{"partition_index": int(p), "error_code": CLUSTER_DENIED}
                                        for p in t.partition_indexes]} for t in m.topics]} for m in req.markers]}


@register_gate(61)
async def _describe_producers(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    """READ on each topic; a refused topic's partitions answer 29 with Kafka's message."""
    return await split(az, req, call, "topics", _topic(az, Op.READ), error_entry=lambda t, code: {
        "name": t.name, "partitions": [{"partition_index": int(p), "error_code": code,
                                        "error_message": TOPIC_DENIED_MESSAGE, "active_producers": []}
                                       for p in t.partition_indexes]}, response_array="topics")


@register_gate(65)
async def _describe_transactions(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    """DESCRIBE on each transactional id; of a described transaction only the topics the
    principal may describe are shown."""
    body = await split(az, req, call, "transactional_ids",
                       lambda tid: 0 if az.allowed(Op.DESCRIBE, RT.TRANSACTIONAL_ID, tid) else TXN_DENIED,
                       error_entry=lambda tid, code: {
                           "error_code": code, "transactional_id": tid, "transaction_state": "",
                           "transaction_timeout": 0, "transaction_start_time": 0, "producer_id": -1,
                           "producer_epoch": -1, "topics": []},
                       response_array="transaction_states")
    for s in (body or {}).get("transaction_states") or []:
        s["topics"] = [t for t in s.get("topics") or [] if az.allowed(Op.DESCRIBE, RT.TOPIC, t["topic"])]
    return body


@register_gate(66)
async def _list_transactions(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    """Only the transactional ids the principal may describe are listed."""
    body = await call(req)
    if body is not None:
        body["transaction_states"] = [s for s in body.get("transaction_states") or []
                                      if az.allowed(Op.DESCRIBE, RT.TRANSACTIONAL_ID, s["transactional_id"])]
    return body


# ---- gates for handlers that other modules add -------------------------------------------------


@register_gate(23)
async def _offset_for_leader_epoch(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    """CLUSTER_ACTION on the cluster (a follower), else DESCRIBE on each topic (a consumer
    checking for truncation, KIP-320)."""
    if az.cluster(Op.CLUSTER_ACTION):
        return await call(req)
    return await split(az, req, call, "topics", _topic(az, Op.DESCRIBE), error_entry=lambda t, code: {
        "topic": t.topic, "partitions": [{"partition": int(p.partition), "error_code": code, "leader_epoch": -1,
                                          "end_offset": -1} for p in t.partitions]}, response_array="topics")


@register_gate(35)
async def _describe_log_dirs(az: Authz, req: Any, call: Call) -> dict[str, Any] | None:
    """DESCRIBE on the cluster; refused: no log dirs, and CLUSTER_AUTHORIZATION_FAILED (v3+)."""
    if not az.cluster(Op.DESCRIBE):
        return {"throttle_time": 0, "error_code": CLUSTER_DENIED, "results": []}
    return await call(req)


def gated_api_keys() -> Sequence[int]:
    """API keys with a check (for the docs' table and the test that every API has one)."""
    return sorted(GATES)


def from_a_broker(ctx: Any) -> bool:
    """Whether a request comes from another broker: its client id, on a connection allowed
    ``ClusterAction`` on the cluster (a client merely naming itself so gets no shortcut)."""
    if ctx.client_id != INTER_BROKER_CLIENT_ID:
        return False
    return authorize(ctx, Op.CLUSTER_ACTION, RT.CLUSTER, CLUSTER_NAME)
