"""`kcli acls list|create|delete`: ACLs of a running cluster, with kafka-acls.sh's flags.

Parsing and rendering only; the work is in :mod:`kcli.ops.acls`.
"""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from kcli.cli.common import options
from kcli.cli.render import print_table, render
from kcli.ops.connection import connect

acls_app = typer.Typer(help="ACLs of the cluster (the broker's StandardAuthorizer), as kafka-acls.sh manages them.",
                       no_args_is_help=True)

_COLUMNS = [("RESOURCE_TYPE", "resource_type"), ("NAME", "resource_name"), ("PATTERN", "pattern_type"),
            ("PRINCIPAL", "principal"), ("HOST", "host"), ("OPERATION", "operation"), ("PERMISSION", "permission")]

TOPIC = typer.Option(None, "--topic", help="Topic name (repeatable); with a prefixed pattern, the prefix.")
GROUP = typer.Option(None, "--group", help="Consumer group id (repeatable).")
TXN = typer.Option(None, "--transactional-id", help="Transactional id (repeatable).")
CLUSTER = typer.Option(False, "--cluster", help="The cluster resource (kafka-cluster).")
PATTERN = typer.Option("literal", "--resource-pattern-type",
                       help="literal or prefixed (create); also match or any to filter (list, delete).")
OPERATION = typer.Option(None, "--operation", help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, "
                                                   "DescribeConfigs, AlterConfigs, IdempotentWrite or All (repeatable).")
ALLOW_P = typer.Option(None, "--allow-principal", help="Principal to allow, e.g. User:alice (User:* for everyone); repeatable.")
DENY_P = typer.Option(None, "--deny-principal", help="Principal to deny; repeatable.")
ALLOW_H = typer.Option(None, "--allow-host", help="Host the allowed principals may connect from (default: *).")
DENY_H = typer.Option(None, "--deny-host", help="Host the denied principals are refused from (default: *).")


def _selection(topic, group, transactional_id, cluster, pattern, operation=None, allow_principal=None,  # noqa: ANN001
               deny_principal=None, allow_host=None, deny_host=None):  # noqa: ANN001, ANN202
    from kcli.ops.acls import AclSelection

    return AclSelection(topics=list(topic or []), groups=list(group or []),
                        transactional_ids=list(transactional_id or []), cluster=cluster, pattern_type=pattern,
                        allow_principals=list(allow_principal or []), deny_principals=list(deny_principal or []),
                        allow_hosts=list(allow_host or []), deny_hosts=list(deny_host or []),
                        operations=list(operation or []))


def _table(acls: list, empty: str, heading: str = "") -> None:  # noqa: ANN001
    if not acls:
        sys.stdout.write(empty)
        return
    if heading:
        sys.stdout.write(heading.format(n=len(acls)))
    print_table([vars(a) for a in acls], _COLUMNS)


@acls_app.command("list")
def list_(
    ctx: typer.Context,
    topic: Optional[List[str]] = TOPIC,
    group: Optional[List[str]] = GROUP,
    transactional_id: Optional[List[str]] = TXN,
    cluster: bool = CLUSTER,
    pattern: str = typer.Option(None, "--resource-pattern-type", help="literal (default with a resource), prefixed, "
                                "match (every ACL that applies to the name) or any."),
    principal: Optional[str] = typer.Option(None, "--principal", help="Only the ACLs of this principal, e.g. User:alice."),
    operation: Optional[List[str]] = OPERATION,
) -> None:
    """List ACLs: every ACL, or those on the named resources.

    Example: kcli acls list --topic orders --resource-pattern-type match -o json
    """
    from kcli.ops.acls import list_acls

    sel = _selection(topic, group, transactional_id, cluster, pattern or ("literal" if topic or group or
                                                                          transactional_id or cluster else "any"),
                     operation)
    opts = options(ctx)
    with connect(opts) as conn:
        result = list_acls(conn, sel, principal)
    render(result, opts.output, lambda: _table(result, "No ACLs.\n"))


@acls_app.command("create")
def create(
    ctx: typer.Context,
    allow_principal: Optional[List[str]] = ALLOW_P,
    deny_principal: Optional[List[str]] = DENY_P,
    allow_host: Optional[List[str]] = ALLOW_H,
    deny_host: Optional[List[str]] = DENY_H,
    operation: Optional[List[str]] = OPERATION,
    topic: Optional[List[str]] = TOPIC,
    group: Optional[List[str]] = GROUP,
    transactional_id: Optional[List[str]] = TXN,
    cluster: bool = CLUSTER,
    pattern: str = PATTERN,
) -> None:
    """Create ACLs: one per principal, host, operation and resource (default operation: All).

    Example: kcli acls create --allow-principal User:alice --operation Read --operation Describe --topic orders --group billing
    """
    from kcli.ops.acls import create_acls

    sel = _selection(topic, group, transactional_id, cluster, pattern, operation, allow_principal, deny_principal,
                     allow_host, deny_host)
    opts = options(ctx)
    with connect(opts) as conn:
        result = create_acls(conn, sel)
    render(result, opts.output, lambda: _table(result, "", "Created {n} ACL(s):\n"))


@acls_app.command("delete")
def delete(
    ctx: typer.Context,
    allow_principal: Optional[List[str]] = ALLOW_P,
    deny_principal: Optional[List[str]] = DENY_P,
    allow_host: Optional[List[str]] = ALLOW_H,
    deny_host: Optional[List[str]] = DENY_H,
    operation: Optional[List[str]] = OPERATION,
    topic: Optional[List[str]] = TOPIC,
    group: Optional[List[str]] = GROUP,
    transactional_id: Optional[List[str]] = TXN,
    cluster: bool = CLUSTER,
    pattern: str = PATTERN,
) -> None:
    """Delete the ACLs the flags name; without a principal, every ACL on the named resources.

    Example: kcli acls delete --allow-principal User:alice --operation Read --topic orders
    """
    from kcli.ops.acls import delete_acls

    sel = _selection(topic, group, transactional_id, cluster, pattern, operation, allow_principal, deny_principal,
                     allow_host, deny_host)
    opts = options(ctx)
    with connect(opts) as conn:
        result = delete_acls(conn, sel)
    render(result, opts.output, lambda: _table(result, "No ACL matched.\n", "Deleted {n} ACL(s):\n"))


def register(app: typer.Typer) -> None:
    app.add_typer(acls_app, name="acls")
