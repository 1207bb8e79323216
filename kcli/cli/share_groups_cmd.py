"""`kcli share-groups list|describe|reset-offsets|delete-offsets|delete`, kafka-share-groups style (KIP-932)."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from kcli.cli.common import options
from kcli.cli.completion_cmd import complete_topic
from kcli.cli.render import print_table, render
from kcli.errors import OperationError, UsageError
from kcli.ops import share_groups as ops
from kcli.ops.connection import connect
from kcli.ops.groups import parse_topic_partitions

share_groups_app = typer.Typer(help="List, describe and delete share groups (KIP-932 queues); reset and delete "
                                    "their start offsets (kafka-share-groups style).", no_args_is_help=True)


@share_groups_app.command("list")
def list_(
    ctx: typer.Context,
    state: List[str] = typer.Option([], "--state", help="Only groups in these states (Empty, Stable; repeatable or comma-separated); adds a STATE column."),
) -> None:
    """List share groups, one name per line (with --state: GROUP STATE).

    Example: kcli share-groups list --state Stable
    """
    states = [s for value in state for s in value.split(",")]
    opts = options(ctx)
    with connect(opts) as conn:
        listings = ops.list_share_groups(conn, states)

    def table() -> None:
        if state:
            print_table([vars(g) for g in listings], [("GROUP", "group"), ("STATE", "state")])
        else:
            for g in listings:
                sys.stdout.write(f"{g.group}\n")

    render(listings, opts.output, table)


@share_groups_app.command("describe")
def describe(
    ctx: typer.Context,
    group: List[str] = typer.Option([], "--group", "-g", help="Share group to describe (repeatable)."),
    all_groups: bool = typer.Option(False, "--all-groups", help="Describe every share group."),
) -> None:
    """Describe share groups: state, epochs, members and their assignments, and per partition the
    share-partition start offset and lag (kafka-share-groups --describe columns).

    Example: kcli share-groups describe --group orders-workers
    """
    if bool(group) == all_groups:
        raise UsageError("give --group (repeatable) or --all-groups")
    opts = options(ctx)
    with connect(opts) as conn:
        names = [g.group for g in ops.list_share_groups(conn)] if all_groups else group
        descriptions = ops.describe_share_groups(conn, names) if names else []
    render(descriptions, opts.output, lambda: _describe_table(descriptions))


def _assignment(parts: list[dict]) -> str:
    by_topic: dict[str, list[str]] = {}
    for p in parts:
        by_topic.setdefault(p["topic"], []).append(str(p["partition"]))
    return ",".join(f"{t}:{','.join(ps)}" for t, ps in by_topic.items()) or "-"


def _describe_table(descriptions: list[ops.ShareGroupDescription]) -> None:
    out = sys.stdout
    for i, d in enumerate(descriptions):
        if i:
            out.write("\n")
        head = [("GROUP", d.group), ("COORDINATOR", "-" if d.coordinator is None else str(d.coordinator)),
                ("STATE", d.state), ("GROUP-EPOCH", str(d.group_epoch)),
                ("ASSIGNMENT-EPOCH", str(d.assignment_epoch)), ("ASSIGNOR", d.assignor or "-"),
                ("MEMBERS", str(len(d.members)))]
        width = max(len(k) for k, _ in head)
        for key, value in head:
            out.write(f"{key.ljust(width)}  {value}\n")
        if d.offsets:
            out.write("\n")
            print_table([dict(vars(o), group=d.group) for o in d.offsets],
                        [("GROUP", "group"), ("TOPIC", "topic"), ("PARTITION", "partition"),
                         ("LEADER-EPOCH", "leader_epoch"), ("START-OFFSET", "start_offset"), ("LAG", "lag")])
        if d.members:
            out.write("\n")
            print_table([{"group": d.group, "member_id": m.member_id, "host": m.host, "client_id": m.client_id,
                          "epoch": m.member_epoch, "assignment": _assignment(m.assignment)} for m in d.members],
                        [("GROUP", "group"), ("CONSUMER-ID", "member_id"), ("HOST", "host"),
                         ("CLIENT-ID", "client_id"), ("MEMBER-EPOCH", "epoch"), ("ASSIGNMENT", "assignment")])
        else:
            out.write(f"\nShare group '{d.group}' has no active members.\n")


@share_groups_app.command("reset-offsets")
def reset_offsets(
    ctx: typer.Context,
    group: str = typer.Option(..., "--group", "-g", help="Share group whose start offsets to reset; it must have no members."),
    topic: List[str] = typer.Option([], "--topic", "-t", autocompletion=complete_topic, help="TOPIC or TOPIC:PARTITION,... (repeatable)."),
    all_topics: bool = typer.Option(False, "--all-topics", help="Every topic the group has share-partition state for."),
    to_earliest: bool = typer.Option(False, "--to-earliest", help="Reset to the log start offset."),
    to_latest: bool = typer.Option(False, "--to-latest", help="Reset to the log end offset."),
    to_offset: Optional[int] = typer.Option(None, "--to-offset", help="Reset to this offset (clamped into the log)."),
    execute: bool = typer.Option(False, "--execute", help="Apply the new start offsets (without it nothing changes)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only print the plan (the default)."),
) -> None:
    """Reset a share group's start offsets (AlterShareGroupOffsets); prints the plan and applies it
    only with --execute. Records from the new start offset on are delivered again; the delivery
    state of the records in flight is forgotten.

    Example: kcli share-groups reset-offsets --group workers --topic orders --to-earliest --execute
    """
    chosen = [(k, v) for k, v in (("earliest", to_earliest or None), ("latest", to_latest or None),
                                  ("offset", to_offset)) if v is not None]
    if len(chosen) != 1:
        raise UsageError("give exactly one of --to-earliest, --to-latest, --to-offset")
    if execute and dry_run:
        raise UsageError("--execute and --dry-run are mutually exclusive")
    if bool(topic) == all_topics:
        raise UsageError("give --topic (repeatable) or --all-topics")
    kind, value = chosen[0]
    if kind == "offset" and value < 0:
        raise UsageError(f"--to-offset must be >= 0, got {value}")
    opts = options(ctx)
    with connect(opts) as conn:
        result = ops.plan_share_reset(conn, group, parse_topic_partitions(topic), all_topics, kind,
                                      value if kind == "offset" else None, execute)

    def table() -> None:
        print_table([dict(vars(r), group=result.group) for r in result.offsets],
                    [("GROUP", "group"), ("TOPIC", "topic"), ("PARTITION", "partition"),
                     ("NEW-START-OFFSET", "new_start_offset")])

    render(result, opts.output, table)
    if not execute and not dry_run:
        sys.stderr.write("kcli: dry run: no offsets were changed; add --execute to apply this plan\n")


@share_groups_app.command("delete-offsets")
def delete_offsets(
    ctx: typer.Context,
    group: str = typer.Option(..., "--group", "-g", help="Share group whose state to delete; it must have no members."),
    topic: List[str] = typer.Option(..., "--topic", "-t", autocompletion=complete_topic, help="Topic (repeatable)."),
) -> None:
    """Delete a share group's state of whole topics (DeleteShareGroupOffsets).

    Example: kcli share-groups delete-offsets --group workers --topic old-orders
    """
    opts = options(ctx)
    with connect(opts) as conn:
        result = ops.delete_share_offsets(conn, group, topic)

    def table() -> None:
        print_table([{"topic": d.topic, "status": "Successful" if d.error is None else f"Error: {d.error}"}
                     for d in result], [("TOPIC", "topic"), ("STATUS", "status")])

    render(result, opts.output, table)
    if any(d.error for d in result):
        raise SystemExit(1)


@share_groups_app.command("delete")
def delete(
    ctx: typer.Context,
    group: List[str] = typer.Option(..., "--group", "-g", help="Share group to delete (repeatable); it must have no members."),
) -> None:
    """Delete share groups and their share-partition state (DeleteGroups); a group with members is refused.

    Example: kcli share-groups delete --group workers
    """
    opts = options(ctx)
    with connect(opts) as conn:
        results = ops.delete_share_groups(conn, group)
    failed = [r for r in results if not r.deleted]
    deleted = [r.group for r in results if r.deleted]

    def table() -> None:
        if deleted:
            names = ", ".join(f"'{g}'" for g in deleted)
            sys.stdout.write(f"Deletion of requested share groups ({names}) was successful.\n")

    render(results, opts.output, table)
    if failed:
        why = "; ".join(f"share group '{r.group}' could not be deleted due to: {r.error}" for r in failed)
        raise OperationError(why)


def register(app: typer.Typer) -> None:
    app.add_typer(share_groups_app, name="share-groups")
