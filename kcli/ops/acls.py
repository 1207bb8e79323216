"""ACLs of a running cluster: CreateAcls / DescribeAcls / DeleteAcls through confluent-kafka's admin API.

Flags and defaults follow kafka-acls.sh: one ACL per principal × host × operation × resource,
hosts default to ``*``, the operation to ``All`` when adding, patterns to ``literal``; a delete
without principals removes every ACL of the resources. The broker stores the ACLs in the cluster
metadata, so every broker of a cluster applies them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ConfigResource,
    ResourcePatternType,
    ResourceType,
)

from kcli.errors import KafkaApiError, UsageError
from kcli.ops.connection import Admin, Connection, admin

CLUSTER_NAME = "kafka-cluster"
# kafka-acls.sh's operation names (case-insensitive; "DescribeConfigs" or "describe_configs")
OPERATIONS = {op.name.replace("_", "").lower(): op for op in AclOperation
              if op not in (AclOperation.UNKNOWN, AclOperation.ANY)}
PATTERN_TYPES = {"literal": ResourcePatternType.LITERAL, "prefixed": ResourcePatternType.PREFIXED,
                 "match": ResourcePatternType.MATCH, "any": ResourcePatternType.ANY}
# Kafka's AclEntry.supportedOperations, as kafka-acls.sh checks them before sending anything
_O = AclOperation
SUPPORTED = {
    ResourceType.TOPIC: {_O.READ, _O.WRITE, _O.CREATE, _O.DESCRIBE, _O.DELETE, _O.ALTER, _O.DESCRIBE_CONFIGS,
                         _O.ALTER_CONFIGS},
    ResourceType.GROUP: {_O.READ, _O.DESCRIBE, _O.DELETE},
    ResourceType.BROKER: {_O.CREATE, _O.CLUSTER_ACTION, _O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS, _O.IDEMPOTENT_WRITE,
                          _O.ALTER, _O.DESCRIBE},
    ResourceType.TRANSACTIONAL_ID: {_O.DESCRIBE, _O.WRITE},
}
_RESOURCE_NAMES = {ResourceType.TOPIC: "TOPIC", ResourceType.GROUP: "GROUP", ResourceType.BROKER: "CLUSTER",
                   ResourceType.TRANSACTIONAL_ID: "TRANSACTIONAL_ID"}


@dataclass
class Acl:
    """One ACL as kcli shows it (Kafka's names: CLUSTER, not librdkafka's BROKER)."""

    resource_type: str
    resource_name: str
    pattern_type: str
    principal: str
    host: str
    operation: str
    permission: str


@dataclass
class AclSelection:
    """What the kafka-acls.sh-like flags name: resources and the entries on them."""

    topics: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    transactional_ids: list[str] = field(default_factory=list)
    cluster: bool = False
    pattern_type: str = "literal"
    allow_principals: list[str] = field(default_factory=list)
    deny_principals: list[str] = field(default_factory=list)
    allow_hosts: list[str] = field(default_factory=list)
    deny_hosts: list[str] = field(default_factory=list)
    operations: list[str] = field(default_factory=list)

    def resources(self) -> list[tuple[ResourceType, str]]:
        out = [(ResourceType.TOPIC, t) for t in self.topics] + [(ResourceType.GROUP, g) for g in self.groups]
        out += [(ResourceType.TRANSACTIONAL_ID, t) for t in self.transactional_ids]
        if self.cluster:
            out.append((ResourceType.BROKER, CLUSTER_NAME))
        for _, name in out:
            if not name:
                raise UsageError("a resource name must not be empty")
        return out

    def entries(self, default_op: AclOperation) -> list[tuple[str, str, AclOperation, AclPermissionType]]:
        """(principal, host, operation, permission) for every combination the flags name."""
        ops = [parse_operation(o) for o in self.operations] or [default_op]
        out = []
        for principals, hosts, perm in ((self.allow_principals, self.allow_hosts, AclPermissionType.ALLOW),
                                        (self.deny_principals, self.deny_hosts, AclPermissionType.DENY)):
            for p in principals:
                check_principal(p)
                for h in hosts or ["*"]:
                    out += [(p, h, op, perm) for op in ops]
        if (self.allow_hosts and not self.allow_principals) or (self.deny_hosts and not self.deny_principals):
            raise UsageError("--allow-host / --deny-host need --allow-principal / --deny-principal")
        return out


def check_principal(text: str) -> str:
    kind, sep, name = text.partition(":")
    if not sep or not kind or not name:
        raise UsageError(f"principal {text!r} must be TYPE:NAME, e.g. User:alice (User:* for everyone)")
    return text


def parse_operation(text: str) -> AclOperation:
    op = OPERATIONS.get(text.replace("_", "").replace("-", "").lower())
    if op is None:
        raise UsageError(f"--operation must be one of: {', '.join(_op_name(o) for o in OPERATIONS.values())}; got {text!r}")
    return op


def parse_pattern_type(text: str, *, creating: bool) -> ResourcePatternType:
    pt = PATTERN_TYPES.get(text.lower())
    if pt is None:
        raise UsageError(f"--resource-pattern-type must be one of: literal, prefixed, match, any; got {text!r}")
    if creating and pt not in (ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED):
        raise UsageError(f"--resource-pattern-type {text} is a filter: ACLs are created literal or prefixed")
    return pt


def _op_name(op: AclOperation) -> str:
    return "".join(w.capitalize() for w in op.name.split("_"))


def _to_acl(b: AclBinding) -> Acl:
    return Acl(_RESOURCE_NAMES.get(b.restype, b.restype.name), b.name, b.resource_pattern_type.name,
               b.principal, b.host, b.operation.name, b.permission_type.name)


def _sorted(acls: Sequence[Acl]) -> list[Acl]:
    return sorted(acls, key=lambda a: (a.resource_type, a.resource_name, a.pattern_type, a.principal, a.host,
                                       a.operation, a.permission))


def create_acls(conn: Connection, sel: AclSelection) -> list[Acl]:
    """Create one ACL per principal × host × operation × resource (an existing one is kept)."""
    pattern = parse_pattern_type(sel.pattern_type, creating=True)
    resources = sel.resources()
    if not resources:
        raise UsageError("name a resource: --topic, --group, --transactional-id or --cluster")
    entries = sel.entries(AclOperation.ALL)
    if not entries:
        raise UsageError("name at least one --allow-principal or --deny-principal")
    bindings = []
    for rtype, name in resources:
        for principal, host, op, perm in entries:
            if op != AclOperation.ALL and op not in SUPPORTED[rtype]:
                raise UsageError(f"{_RESOURCE_NAMES[rtype]} resources do not support --operation {_op_name(op)} "
                                 f"(they support: {', '.join(sorted(_op_name(o) for o in SUPPORTED[rtype]))})")
            bindings.append(AclBinding(rtype, name, pattern, principal, host, op, perm))
    client = admin(conn)
    futures = client.create_acls(bindings, request_timeout=conn.timeout_s)
    for b in bindings:
        client.wait(futures[b], f"ACL {b.principal} {b.operation.name} on {b.name}")
    return _sorted([_to_acl(b) for b in bindings])


def _filters(sel: AclSelection, *, default_pattern: str) -> list[AclBindingFilter]:
    pattern = parse_pattern_type(sel.pattern_type or default_pattern, creating=False)
    resources: list[tuple[Any, str | None]] = list(sel.resources()) or [(ResourceType.ANY, None)]
    entries: list[tuple[str | None, str | None, AclOperation, AclPermissionType]] = list(sel.entries(AclOperation.ANY))
    if not entries:
        ops = [parse_operation(o) for o in sel.operations] or [AclOperation.ANY]
        entries = [(None, None, op, AclPermissionType.ANY) for op in ops]
    return [AclBindingFilter(rtype, name, pattern if name is not None else ResourcePatternType.ANY,
                             principal, None if host == "*" and not _host_named(sel) else host, op, perm)
            for rtype, name in resources for principal, host, op, perm in entries]


def _host_named(sel: AclSelection) -> bool:
    return bool(sel.allow_hosts or sel.deny_hosts)


def list_acls(conn: Connection, sel: AclSelection, principal: str | None = None) -> list[Acl]:
    """The ACLs on the named resources (every ACL without one), optionally of one principal."""
    if principal is not None:
        check_principal(principal)
    client = admin(conn)
    seen: dict[tuple[Any, ...], Acl] = {}
    for flt in _filters(sel, default_pattern="literal"):
        if principal is not None:
            flt = AclBindingFilter(flt.restype, flt.name, flt.resource_pattern_type, principal, flt.host,
                                   flt.operation, flt.permission_type)
        for b in client.wait(client.describe_acls(flt, request_timeout=conn.timeout_s), "ACLs"):
            acl = _to_acl(b)
            seen[tuple(vars(acl).values())] = acl
    if not seen:
        _check_authorizer(conn, client)
    return _sorted(list(seen.values()))


def _check_authorizer(conn: Connection, client: Admin) -> None:
    """librdkafka drops DescribeAcls' error code: SECURITY_DISABLED (no authorizer) would look like
    "no ACLs". An empty answer is therefore checked against the broker's authorizer.class.name."""
    brokers = client.list_topics(timeout=conn.timeout_s).brokers
    if not brokers:
        return
    resource = ConfigResource(ResourceType.BROKER, str(min(brokers)))
    try:
        configs = client.wait(client.describe_configs([resource], request_timeout=conn.timeout_s)[resource], "broker configs")
    except KafkaApiError:
        return  # e.g. no DESCRIBE_CONFIGS on the cluster: the empty answer stands
    entry = configs.get("authorizer.class.name")
    if entry is not None and not entry.value:
        raise KafkaApiError("SECURITY_DISABLED", "No Authorizer is configured.", 54)


def delete_acls(conn: Connection, sel: AclSelection) -> list[Acl]:
    """Remove the ACLs the flags name; without principals every ACL of the named resources."""
    if not sel.resources():
        raise UsageError("name a resource: --topic, --group, --transactional-id or --cluster")
    filters = _filters(sel, default_pattern="literal")
    client = admin(conn)
    futures = client.delete_acls(filters, request_timeout=conn.timeout_s)
    removed: dict[tuple[Any, ...], Acl] = {}
    for f in filters:
        for b in client.wait(futures[f], "delete ACLs"):
            acl = _to_acl(b)
            removed[tuple(vars(acl).values())] = acl
    return _sorted(list(removed.values()))
