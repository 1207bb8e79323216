"""kafka-acls.sh (Kafka's AclCommand) over kcli.ops.acls: --add, --remove and --list of ACLs on
topics, groups, transactional ids and the cluster, printed as Kafka prints ResourcePattern and
AccessControlEntry."""

from __future__ import annotations

from typing import Any

from kcli.errors import KcliError
from kcli.kafka_tools import common
from kcli.kafka_tools.common import ToolError, ToolParser

PROG = "kafka-acls.sh"


def parser() -> ToolParser:
    p = ToolParser(PROG, "This tool helps to manage acls on kafka.")
    p.value("bootstrap-server", "A list of host/port pairs to use for establishing the connection to the Kafka "
                                "cluster.", metavar="server to connect to")
    p.value("bootstrap-controller", "kcli: the broker.", metavar="controller to connect to")
    p.value("command-config", "A property file containing configs to be passed to Admin Client.",
            metavar="command-config")
    p.value("topic", "topic to which ACLs should be added or removed.", repeat=True, metavar="topic")
    p.flag("cluster", "Add/Remove cluster ACLs.")
    p.value("group", "Consumer Group to which the ACLs should be added or removed.", repeat=True, metavar="group")
    p.value("transactional-id", "The transactionalId to which ACLs should be added or removed.", repeat=True,
            metavar="transactional-id")
    p.value("resource-pattern-type", "The type of the resource pattern or pattern filter (literal, prefixed, any, "
                                     "match).", metavar="ANY|MATCH|LITERAL|PREFIXED")
    p.flag("add", "Indicates you are trying to add ACLs.")
    p.flag("remove", "Indicates you are trying to remove ACLs.")
    p.flag("list", "List ACLs for the specified resource, use --topic <topic> or --group <group> or --cluster "
                   "to specify a resource.")
    p.value("operation", "Operation that is being allowed or denied.", repeat=True, metavar="operation")
    p.value("allow-principal", "principal is in principalType:name format.", repeat=True, metavar="allow-principal")
    p.value("deny-principal", "principal is in principalType:name format.", repeat=True, metavar="deny-principal")
    p.value("principal", "List ACLs for the specified principal (with --list).", repeat=True, metavar="principal")
    p.value("allow-host", "Host from which principals listed in --allow-principal will have access.", repeat=True,
            metavar="allow-host")
    p.value("deny-host", "Host from which principals listed in --deny-principal will be denied access.",
            repeat=True, metavar="deny-host")
    p.flag("force", "Assume Yes to all queries and do not prompt.")
    for flag in ("producer", "consumer", "idempotent"):
        p.flag(flag, "Not supported by kcli: it fails naming the option.")
    p.value("delegation-token", "Not supported by kcli.", metavar="delegation-token")
    p.value("user-principal", "Not supported by kcli.", metavar="user-principal")
    return p


def _pattern(a: Any) -> str:
    return f"ResourcePattern(resourceType={a.resource_type}, name={a.resource_name}, patternType={a.pattern_type})"


def _entry(a: Any) -> str:
    return f"(principal={a.principal}, host={a.host}, operation={a.operation}, permissionType={a.permission})"


def _print_grouped(title: str, acls: list[Any]) -> None:
    groups: dict[str, list[str]] = {}
    for a in acls:
        groups.setdefault(_pattern(a), []).append("\t" + _entry(a))
    for pattern, entries in groups.items():
        print(f"{title} `{pattern}`: \n " + "\n".join(entries) + " \n")


def main(argv: list[str]) -> int:
    ns = parser().parse(argv)
    if ns.bootstrap_server is None and ns.bootstrap_controller is None:
        raise ToolError("One of --bootstrap-server or --bootstrap-controller must be specified")
    actions = [a for a in ("add", "remove", "list") if getattr(ns, a)]
    if len(actions) != 1:
        raise ToolError("Command must include exactly one action: --list, --add, --remove. ")
    for flag in ("producer", "consumer", "idempotent", "delegation_token", "user_principal"):
        if getattr(ns, flag):
            raise ToolError(f"--{flag.replace('_', '-')} is not supported by kcli's kafka-acls")
    if ns.bootstrap_server is None:
        ns.bootstrap_server = ns.bootstrap_controller
    conn = common.connection(ns)
    from kcli.ops import acls as ops

    sel = ops.AclSelection(topics=ns.topic, groups=ns.group, transactional_ids=ns.transactional_id,
                           cluster=ns.cluster, pattern_type=(ns.resource_pattern_type or "literal").lower(),
                           allow_principals=ns.allow_principal, deny_principals=ns.deny_principal,
                           allow_hosts=ns.allow_host, deny_hosts=ns.deny_host, operations=ns.operation)
    try:
        if ns.add:
            if not sel.resources():
                raise ToolError("You must specify one of: --topic, --cluster, --group, --transactional-id when "
                                "trying to add ACLs.")
            if not sel.allow_principals and not sel.deny_principals:
                raise ToolError("You must specify one of: --allow-principal, --deny-principal when trying to add "
                                "ACLs.")
            created = ops.create_acls(conn, sel)
            _print_grouped("Adding ACLs for resource", created)
            _print_grouped("Current ACLs for resource", ops.list_acls(conn, sel))
        elif ns.remove:
            if not sel.resources():
                raise ToolError("You must specify one of: --topic, --cluster, --group, --transactional-id when "
                                "trying to remove ACLs.")
            ops.delete_acls(conn, sel)
        else:
            principal = ns.principal[0] if ns.principal else None
            _print_grouped("Current ACLs for resource", ops.list_acls(conn, sel, principal))
    except KcliError as err:
        raise ToolError(f"Error while executing ACL command: {common.kafka_message(err)}", stream="out") from None
    return 0


def entry() -> None:
    common.run(main)
