"""ACLs and the authorizer: Kafka's StandardAuthorizer rules over KRaft AccessControlEntryRecords.

An ACL allows or denies one principal (``User:alice``, or ``User:*``) from one host (or ``*``)
one operation on resources of one type whose names match a pattern: ``LITERAL`` (the name, or
``*`` for every name) or ``PREFIXED``. Deciding follows Kafka's StandardAuthorizerData:

* a super user (``super.users``) may do anything;
* a matching DENY wins over any ALLOW;
* an ALLOW of READ, WRITE, DELETE or ALTER also allows DESCRIBE, and an ALLOW of ALTER_CONFIGS
  also allows DESCRIBE_CONFIGS (a DENY implies nothing);
* a resource that no ACL names at all (for any principal) is allowed only when
  ``allow.everyone.if.no.acl.found=true``; one with ACLs but none matching is denied.

Codes are Kafka's (AclOperation, ResourceType, PatternType, AclPermissionType), so records,
requests and the admin clients agree on them. This module knows nothing of the broker: the
request side is kcli/broker/authz.py, the records are applied by kcli/metadata/metadata_log.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

CLUSTER_NAME = "kafka-cluster"  # the one cluster resource's name (Kafka's CLUSTER_NAME)
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class AclOperation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class PermissionType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


Op, RT = AclOperation, ResourceType
# Kafka's AclEntry.supportedOperations: what an authorized-operations bit field can hold.
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[AclOperation, ...]] = {
    RT.TOPIC: (Op.READ, Op.WRITE, Op.CREATE, Op.DESCRIBE, Op.DELETE, Op.ALTER, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS),
    RT.GROUP: (Op.READ, Op.DESCRIBE, Op.DELETE),
    RT.CLUSTER: (Op.CREATE, Op.CLUSTER_ACTION, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS, Op.IDEMPOTENT_WRITE,
                 Op.ALTER, Op.DESCRIBE),
    RT.TRANSACTIONAL_ID: (Op.DESCRIBE, Op.WRITE),
    RT.DELEGATION_TOKEN: (Op.DESCRIBE,),
    RT.USER: (Op.CREATE_TOKENS, Op.DESCRIBE_TOKENS),
}
# An ALLOW of one of these also allows DESCRIBE / DESCRIBE_CONFIGS (StandardAuthorizerData).
IMPLIES_DESCRIBE = frozenset({Op.DESCRIBE, Op.READ, Op.WRITE, Op.DELETE, Op.ALTER})
IMPLIES_DESCRIBE_CONFIGS = frozenset({Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS})


class AclError(ValueError):
    """An ACL or filter Kafka would refuse (INVALID_REQUEST), with Kafka's reason."""


def parse_principal(text: str) -> tuple[str, str]:
    """``Type:name`` → (type, name); AclError unless both parts are present."""
    kind, sep, name = text.partition(":")
    if not sep or not kind or not name:
        raise AclError(f"Could not parse principal from `{text}` (no colon is present separating the principal type "
                       "from the principal name)" if not sep else f"Invalid principal {text!r}")
    return kind, name


@dataclass(frozen=True)
class AclBinding:
    """One ACL (Kafka's StandardAcl): a resource pattern and an access control entry."""

    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int

    def check(self) -> None:
        """Kafka's AclControlManager.validateNewAcl: raise AclError for an ACL it refuses."""
        if self.resource_type not in (RT.TOPIC, RT.GROUP, RT.CLUSTER, RT.TRANSACTIONAL_ID, RT.DELEGATION_TOKEN, RT.USER):
            raise AclError(f"Invalid resourceType {_name(ResourceType, self.resource_type)}")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise AclError(f"Invalid patternType {_name(PatternType, self.pattern_type)}")
        if self.operation in (Op.UNKNOWN, Op.ANY) or self.operation not in Op.__members__.values():
            raise AclError(f"Invalid operation {_name(AclOperation, self.operation)}")
        if self.permission_type not in (PermissionType.ALLOW, PermissionType.DENY):
            raise AclError(f"Invalid permissionType {_name(PermissionType, self.permission_type)}")
        if not self.resource_name:
            raise AclError("Resource name should not be empty")
        if self.resource_type == RT.CLUSTER and self.resource_name != CLUSTER_NAME:
            raise AclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
        if not self.host:
            raise AclError("Invalid empty host")
        parse_principal(self.principal)

    def record_data(self, acl_id: uuid.UUID | str) -> dict[str, Any]:
        """The fields of an AccessControlEntryRecord (KRaft's names)."""
        return {"id": str(acl_id), "resourceType": int(self.resource_type), "resourceName": self.resource_name,
                "patternType": int(self.pattern_type), "principal": self.principal, "host": self.host,
                "operation": int(self.operation), "permissionType": int(self.permission_type)}

    @classmethod
    def from_record_data(cls, d: Mapping[str, Any]) -> AclBinding:
        return cls(d["resourceType"], d["resourceName"], d["patternType"], d["principal"], d["host"],
                   d["operation"], d["permissionType"])

    def describe(self) -> str:
        return (f"(principal={self.principal}, host={self.host}, operation={_name(AclOperation, self.operation)}, "
                f"permissionType={_name(PermissionType, self.permission_type)}) on "
                f"{_name(ResourceType, self.resource_type)}:{_name(PatternType, self.pattern_type)}:{self.resource_name}")


def _name(enum: type[IntEnum], value: int) -> str:
    try:
        return enum(value).name
    except ValueError:
        return str(value)


def check_acl_record(kind: str, d: Mapping[str, Any]) -> None:
    """What replay needs of AccessControlEntryRecord / RemoveAccessControlEntryRecord (ValueError if not)."""
    uuid.UUID(d["id"])
    if kind == "AccessControlEntryRecord":
        AclBinding.from_record_data(d).check()


@dataclass(frozen=True)
class AclBindingFilter:
    """Kafka's AclBindingFilter, as DescribeAcls and DeleteAcls carry it (None = any)."""

    resource_type: int
    resource_name: str | None
    pattern_type: int
    principal: str | None
    host: str | None
    operation: int
    permission_type: int

    def check(self) -> None:
        """Kafka refuses filters with UNKNOWN parts (INVALID_REQUEST)."""
        if self.resource_type not in ResourceType.__members__.values() or self.resource_type == RT.UNKNOWN \
                or self.pattern_type not in PatternType.__members__.values() or self.pattern_type == PatternType.UNKNOWN:
            raise AclError("The resource pattern filter is unknown")
        if self.operation not in Op.__members__.values() or self.operation == Op.UNKNOWN \
                or self.permission_type not in PermissionType.__members__.values() \
                or self.permission_type == PermissionType.UNKNOWN:
            raise AclError("The access control entry filter is unknown")

    def matches(self, acl: AclBinding) -> bool:
        if self.resource_type != RT.ANY and self.resource_type != acl.resource_type:
            return False
        if not self._pattern_matches(acl):
            return False
        return ((self.principal is None or self.principal == acl.principal)
                and (self.host is None or self.host == acl.host)
                and (self.operation == Op.ANY or self.operation == acl.operation)
                and (self.permission_type == PermissionType.ANY or self.permission_type == acl.permission_type))

    def _pattern_matches(self, acl: AclBinding) -> bool:
        """Kafka's ResourcePatternFilter.matches: MATCH finds every pattern that applies to a name."""
        name = self.resource_name
        if self.pattern_type == PatternType.MATCH:
            if name is None:
                return True
            if acl.pattern_type == PatternType.LITERAL:
                return acl.resource_name in (name, WILDCARD)
            return name.startswith(acl.resource_name)
        if self.pattern_type != PatternType.ANY and self.pattern_type != acl.pattern_type:
            return False
        return name is None or name == acl.resource_name


class Authorizer:
    """kcli's StandardAuthorizer: decisions over the ACLs of the cluster metadata.

    ``acls`` returns the current ACLs (id → binding); it is read on every decision, so ACLs
    another broker of the cluster wrote apply as soon as this broker has caught up."""

    def __init__(self, acls: Callable[[], Mapping[str, AclBinding]], super_users: Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False, version: Callable[[], int] | None = None) -> None:
        """``version`` (optional) changes whenever the ACLs do: the lookup index is rebuilt only then."""
        self._acls = acls
        self._version = version
        self._indexed: tuple[int, _AclIndex] | None = None
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_everyone_if_no_acl_found

    def _index(self) -> _AclIndex:
        if self._version is None:
            return _AclIndex(self._acls().values())
        v = self._version()
        if self._indexed is None or self._indexed[0] != v:
            self._indexed = (v, _AclIndex(self._acls().values()))
        return self._indexed[1]

    def authorize(self, principal: str, host: str, operation: int, resource_type: int, name: str) -> bool:
        """May ``principal`` connecting from ``host`` do ``operation`` on the named resource?"""
        if principal in self.super_users:
            return True
        found_resource_acl = allowed = False
        for acl in self._index().applying(resource_type, name):
            found_resource_acl = True
            result = _entry_result(acl, principal, host, operation)
            if result is PermissionType.DENY:
                return False
            if result is PermissionType.ALLOW:
                allowed = True
        return allowed or (not found_resource_acl and self.allow_if_no_acl)

    def authorize_many(self, principal: str, host: str,
                       actions: Iterable[tuple[int, int, str]]) -> list[bool]:
        """The batch form: one answer per (operation, resource type, name)."""
        return [self.authorize(principal, host, op, rtype, name) for op, rtype, name in actions]

    def authorize_by_resource_type(self, principal: str, host: str, operation: int, resource_type: int) -> bool:
        """Kafka's authorizeByResourceType, simplified: may ``principal`` do ``operation`` on at least
        one resource of the type? True for a super user, for an ALLOW that matches (unless a DENY of
        the literal ``*`` covers every name), and with no ACL of that type at all when
        allow.everyone.if.no.acl.found is on."""
        if principal in self.super_users:
            return True
        any_acl = allowed = False
        for acl in self._acls().values():
            if acl.resource_type != resource_type:
                continue
            any_acl = True
            result = _entry_result(acl, principal, host, operation)
            if result is PermissionType.DENY and acl.pattern_type == PatternType.LITERAL and acl.resource_name == WILDCARD:
                return False
            if result is PermissionType.ALLOW:
                allowed = True
        return allowed or (not any_acl and self.allow_if_no_acl)

    def authorized_operations(self, principal: str, host: str, resource_type: int, name: str) -> int:
        """Kafka's authorized-operations bit field (bit n set = operation code n allowed)."""
        ops = SUPPORTED_OPERATIONS.get(ResourceType(resource_type), ())
        return operations_bits(op for op in ops if self.authorize(principal, host, op, resource_type, name))


class _AclIndex:
    """The ACLs by resource type and pattern name, so that a decision looks up the ACLs that
    apply to one name (its literal, the literal ``*``, its prefixes) instead of scanning all."""

    def __init__(self, acls: Iterable[AclBinding]) -> None:
        self.by_pattern: dict[tuple[int, int, str], list[AclBinding]] = {}
        self.prefix_lengths: dict[int, set[int]] = {}
        for a in acls:
            self.by_pattern.setdefault((a.resource_type, a.pattern_type, a.resource_name), []).append(a)
            if a.pattern_type == PatternType.PREFIXED:
                self.prefix_lengths.setdefault(a.resource_type, set()).add(len(a.resource_name))

    def applying(self, resource_type: int, name: str) -> list[AclBinding]:
        get = self.by_pattern.get
        out = list(get((resource_type, PatternType.LITERAL, name), ()))
        if name != WILDCARD:
            out += get((resource_type, PatternType.LITERAL, WILDCARD), ())
        for n in self.prefix_lengths.get(resource_type, ()):
            if n <= len(name):
                out += get((resource_type, PatternType.PREFIXED, name[:n]), ())
        return out


def operations_bits(ops: Iterable[int]) -> int:
    bits = 0
    for op in ops:
        bits |= 1 << int(op)
    return bits


def all_operations_bits(resource_type: int) -> int:
    """Every supported operation: what Kafka reports when no authorizer is configured."""
    return operations_bits(SUPPORTED_OPERATIONS.get(ResourceType(resource_type), ()))


def _entry_result(acl: AclBinding, principal: str, host: str, operation: int) -> PermissionType | None:
    """ALLOW / DENY when the entry applies to this principal, host and operation, else None."""
    if acl.principal != principal and acl.principal != WILDCARD_PRINCIPAL:
        return None
    if acl.host != WILDCARD and acl.host != host:
        return None
    if acl.operation != Op.ALL:
        if acl.permission_type == PermissionType.ALLOW:
            if operation == Op.DESCRIBE:
                if acl.operation not in IMPLIES_DESCRIBE:
                    return None
            elif operation == Op.DESCRIBE_CONFIGS:
                if acl.operation not in IMPLIES_DESCRIBE_CONFIGS:
                    return None
            elif acl.operation != operation:
                return None
        elif acl.operation != operation:
            return None
    return PermissionType.ALLOW if acl.permission_type == PermissionType.ALLOW else PermissionType.DENY


def parse_super_users(value: str) -> list[str]:
    """``super.users`` (``User:admin;User:ops``) → principals; AclError names a malformed one."""
    out = []
    for part in value.split(";"):
        part = part.strip()
        if part:
            parse_principal(part)
            out.append(part)
    return out


def authorizer_from_config(config: Any, acls: Callable[[], Mapping[str, AclBinding]],
                           version: Callable[[], int] | None = None) -> Authorizer | None:
    """The broker's authorizer, or None when ``authorizer.class.name`` is empty (everything allowed).
    A malformed ``super.users`` raises ConfigError, so the broker refuses to start."""
    from kcli.config.definitions import ConfigError

    if not config.get_str("authorizer.class.name"):
        return None
    try:
        supers = parse_super_users(config.get_str("super.users"))
    except AclError as err:
        raise ConfigError(f"Invalid value {config.get_str('super.users')} for configuration super.users: {err}") from None
    return Authorizer(acls, supers, config.get_bool("allow.everyone.if.no.acl.found"), version)
