"""DescribeAcls (29), CreateAcls (30) and DeleteAcls (31), as KRaft Kafka answers them.

ACLs are KRaft AccessControlEntryRecords in the cluster metadata: created and removed as one unit
per request, checked (check_record) before anything is written, and in a cluster learned by every
broker from the shared store. Who may call these APIs is checked in kcli/broker/authz.py
(DESCRIBE / ALTER on the cluster); without an authorizer they answer SECURITY_DISABLED, as Kafka.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.security.acl import AclBinding, AclBindingFilter, AclError
from kcli.broker.dispatch import RequestContext, handler
from kcli.metadata.metadata_log import record
from kcli.protocol.errors import BrokerError

log = logging.getLogger("kcli.broker.acls")

NO_AUTHORIZER = "No Authorizer is configured."


def _disabled(ctx: RequestContext) -> bool:
    return ctx.broker.authorizer is None


def _filter(f: Any, prefix: str = "") -> AclBindingFilter:
    return AclBindingFilter(int(getattr(f, f"resource_type{prefix}")), getattr(f, f"resource_name{prefix}"),
                            int(getattr(f, f"pattern_type{prefix}", 3)), getattr(f, f"principal{prefix}"),
                            getattr(f, f"host{prefix}"), int(f.operation), int(f.permission_type))


def _append_failure(err: Exception, what: str) -> tuple[int, str]:
    """The code and message every entry gets when the records could not be written."""
    if isinstance(err, BrokerError):  # refused, or the cluster database is unreachable: nothing was written
        return err.code, err.message or str(err)
    if isinstance(err, OSError):
        return int(ErrorCode.kafka_storage_error), f"cannot write the metadata log: {err.strerror or err}"
    log.exception("appending %s failed", what)
    return int(ErrorCode.unknown_server_error), f"Unexpected server error: {type(err).__name__}"


@handler(29, "DescribeAcls", 1, 3)
async def describe_acls(ctx: RequestContext, req: Any) -> dict[str, Any]:
    if _disabled(ctx):
        return {"throttle_time": 0, "error_code": ErrorCode.security_disabled, "error_message": NO_AUTHORIZER,
                "resources": []}
    flt = _filter(req, "_filter")
    try:
        flt.check()
    except AclError as err:
        return {"throttle_time": 0, "error_code": ErrorCode.invalid_request, "error_message": str(err), "resources": []}
    by_resource: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    for acl in sorted(ctx.broker.state.acls.values(), key=_sort_key):
        if flt.matches(acl):
            by_resource.setdefault((acl.resource_type, acl.resource_name, acl.pattern_type), []).append(
                {"principal": acl.principal, "host": acl.host, "operation": acl.operation,
                 "permission_type": acl.permission_type})
    resources = [{"resource_type": rt, "resource_name": name, "pattern_type": pt, "acls": acls}
                 for (rt, name, pt), acls in by_resource.items()]
    return {"throttle_time": 0, "error_code": 0, "error_message": None, "resources": resources}


def _sort_key(acl: AclBinding) -> tuple[Any, ...]:
    return (acl.resource_type, acl.resource_name, acl.pattern_type, acl.principal, acl.host, acl.operation,
            acl.permission_type)


@handler(30, "CreateAcls", 1, 3)
async def create_acls(ctx: RequestContext, req: Any) -> dict[str, Any]:
    if _disabled(ctx):
        return {"throttle_time": 0, "results": [{"error_code": ErrorCode.security_disabled,
                                                 "error_message": NO_AUTHORIZER} for _ in req.creations]}
    existing = set(ctx.broker.state.acls.values())
    results: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    written: list[int] = []  # indexes of results that depend on the append
    for c in req.creations:
        acl = AclBinding(int(c.resource_type), c.resource_name, int(c.resource_pattern_type), c.principal, c.host,
                         int(c.operation), int(c.permission_type))
        try:
            acl.check()
        except AclError as err:
            results.append({"error_code": ErrorCode.invalid_request, "error_message": str(err)})
            continue
        results.append({"error_code": 0, "error_message": None})
        if acl not in existing:  # an ACL that exists already is success, with nothing written (Kafka)
            existing.add(acl)
            records.append(record("AccessControlEntryRecord", **acl.record_data(uuid.uuid4())))
            written.append(len(results) - 1)
    if records:
        try:
            ctx.broker.metadata.append(records)  # checked (check_record) before anything is written
        except Exception as err:  # noqa: BLE001 - every ACL of the unit gets the error
            code, message = _append_failure(err, f"{len(records)} ACL record(s)")
            for i in written:
                results[i] = {"error_code": code, "error_message": message}
    return {"throttle_time": 0, "results": results}


def _matching(acl: AclBinding) -> dict[str, Any]:
    return {"error_code": 0, "error_message": None, "resource_type": acl.resource_type,
            "resource_name": acl.resource_name, "pattern_type": acl.pattern_type, "principal": acl.principal,
            "host": acl.host, "operation": acl.operation, "permission_type": acl.permission_type}


@handler(31, "DeleteAcls", 1, 3)
async def delete_acls(ctx: RequestContext, req: Any) -> dict[str, Any]:
    if _disabled(ctx):
        return {"throttle_time": 0, "filter_results": [
            {"error_code": ErrorCode.security_disabled, "error_message": NO_AUTHORIZER, "matching_acls": []}
            for _ in req.filters]}
    acls = dict(ctx.broker.state.acls)
    deleted: set[str] = set()
    results: list[dict[str, Any]] = []
    for f in req.filters:
        flt = _filter(f, "_filter")
        try:
            flt.check()
        except AclError as err:
            results.append({"error_code": ErrorCode.invalid_request, "error_message": str(err), "matching_acls": []})
            continue
        matches = [(i, a) for i, a in sorted(acls.items(), key=lambda kv: _sort_key(kv[1]))
                   if i not in deleted and flt.matches(a)]
        deleted.update(i for i, _ in matches)
        results.append({"error_code": 0, "error_message": None,
                        "matching_acls": [_matching(a) for _, a in matches]})
    if deleted:
        try:
            ctx.broker.metadata.append([record("RemoveAccessControlEntryRecord", id=i) for i in sorted(deleted)])
        except Exception as err:  # noqa: BLE001 - nothing was removed: every filter gets the error
            code, message = _append_failure(err, f"removal of {len(deleted)} ACL(s)")
            results = [r if r["error_code"] else {"error_code": code, "error_message": message, "matching_acls": []}
                       for r in results]
    return {"throttle_time": 0, "filter_results": results}
