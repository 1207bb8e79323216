"""`kcli groups list|describe|delete|reset-offsets|delete-offsets`, kafka-consumer-groups style."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from kcli.cli.common import options
from kcli.cli.completion_cmd import complete_topic
from kcli.cli.render import print_table, render
from kcli.errors import OperationError, UsageError
from kcli.ops import groups as ops
from kcli.ops.connection import connect

groups_app = typer.Typer(help="List, describe and delete consumer groups; reset and delete their offsets "
                              "(kafka-consumer-groups style).", no_args_is_help=True)


@groups_app.command("list")
def list_(
    ctx: typer.Context,
    state: List[str] = typer.Option([], "--state", help="Only groups in these states (Stable, Empty, ...; repeatable or comma-separated); adds a STATE column."),
    type_: List[str] = typer.Option([], "--type", help="Only groups of these protocols (classic, consumer; repeatable or comma-separated); adds a TYPE column."),
) -> None:
    """List consumer groups, one name per line (with --state: GROUP STATE; with --type: a TYPE
    column, classic or consumer).

    Example: kcli groups list --type classic,consumer
    """
    states = [s for value in state for s in value.split(",")]
    types = [t for value in type_ for t in value.split(",")]
    opts = options(ctx)
    with connect(opts) as conn:
        listings = ops.list_groups(conn, states, types)

    def table() -> None:
        if state or type_:
            columns = [("GROUP", "group")] + ([("STATE", "state")] if state else []) \
                + ([("TYPE", "type")] if type_ else [])
            print_table([vars(g) for g in listings], columns)
        else:
            for g in listings:
                sys.stdout.write(f"{g.group}\n")

    render(listings, opts.output, table)


@groups_app.command("describe")
def describe(
    ctx: typer.Context,
    group: List[str] = typer.Option([], "--group", "-g", help="Group to describe (repeatable)."),
    all_groups: bool = typer.Option(False, "--all-groups", help="Describe every group."),
) -> None:
    """Describe groups: state, protocol, members, and per partition the committed offset,
    log end offset and lag (kafka-consumer-groups --describe columns), with the lag per topic.

    Example: kcli groups describe --group billing
    """
    if bool(group) == all_groups:
        raise UsageError("give --group (repeatable) or --all-groups")
    opts = options(ctx)
    with connect(opts) as conn:
        names = [g.group for g in ops.list_groups(conn)] if all_groups else group
        descriptions = ops.describe_groups(conn, names) if names else []
    render(descriptions, opts.output, lambda: _describe_table(descriptions))


def _describe_table(descriptions: list[ops.GroupDescription]) -> None:
    out = sys.stdout
    for i, d in enumerate(descriptions):
        if i:
            out.write("\n")
        lags = d.lag_by_topic
        head = [("GROUP", d.group), ("COORDINATOR", "-" if d.coordinator is None else str(d.coordinator)),
                ("TYPE", d.type), ("STATE", d.state), ("PROTOCOL-TYPE", d.protocol_type or "-"),
                ("PROTOCOL", d.protocol or "-"), ("MEMBERS", str(len(d.members))), ("TOTAL-LAG", str(sum(lags.values())))]
        if d.group_epoch is not None:
            head += [("GROUP-EPOCH", str(d.group_epoch)), ("TARGET-ASSIGNMENT-EPOCH", str(d.assignment_epoch))]
        width = max(len(k) for k, _ in head)
        for key, value in head:
            out.write(f"{key.ljust(width)}  {value}\n")
        if not d.members:
            out.write(f"\nConsumer group '{d.group}' has no active members.\n")
        if d.offsets:
            out.write("\n")
            print_table([dict(vars(r), group=d.group) for r in d.offsets],
                        [("GROUP", "group"), ("TOPIC", "topic"), ("PARTITION", "partition"),
                         ("CURRENT-OFFSET", "current_offset"), ("LOG-END-OFFSET", "log_end_offset"), ("LAG", "lag"),
                         ("CONSUMER-ID", "consumer_id"), ("HOST", "host"), ("CLIENT-ID", "client_id")])
            out.write("\n")
            print_table([{"topic": t, "lag": lag} for t, lag in lags.items()], [("TOPIC", "topic"), ("TOTAL-LAG", "lag")])
        if d.members:
            out.write("\n")
            rows = [{"consumer_id": m.member_id, "host": m.host, "client_id": m.client_id, "count": len(m.assignment),
                     "assignment": _assignment(m.assignment), "epoch": m.member_epoch,
                     "target": _assignment(m.target_assignment or [])} for m in d.members]
            columns = [("CONSUMER-ID", "consumer_id"), ("HOST", "host"), ("CLIENT-ID", "client_id"),
                       ("#PARTITIONS", "count"), ("ASSIGNMENT", "assignment")]
            if d.group_epoch is not None:  # a consumer group: Kafka's --members --verbose columns
                columns += [("CURRENT-EPOCH", "epoch"), ("TARGET-ASSIGNMENT", "target")]
            print_table(rows, columns)


def _assignment(parts: list[dict]) -> str:
    """``orders(0,1),audit(2)`` as kafka-consumer-groups --members --verbose prints it."""
    by_topic: dict[str, list[str]] = {}
    for p in parts:
        by_topic.setdefault(p["topic"], []).append(str(p["partition"]))
    return ",".join(f"{t}({','.join(ps)})" for t, ps in by_topic.items()) or "-"


@groups_app.command("delete")
def delete(
    ctx: typer.Context,
    group: List[str] = typer.Option(..., "--group", "-g", help="Group to delete (repeatable); it must have no members."),
) -> None:
    """Delete consumer groups and their committed offsets (DeleteGroups); a group with members is refused.

    Example: kcli groups delete --group billing
    """
    opts = options(ctx)
    with connect(opts) as conn:
        results = ops.delete_groups(conn, group)
    failed = [r for r in results if not r.deleted]
    deleted = [r.group for r in results if r.deleted]

    def table() -> None:
        if deleted:
            names = ", ".join(f"'{g}'" for g in deleted)
            sys.stdout.write(f"Deletion of requested consumer groups ({names}) was successful.\n")

    render(results, opts.output, table)
    if failed:
        why = "; ".join(f"group '{r.group}' could not be deleted due to: {r.error}" for r in failed)
        raise OperationError(why)


@groups_app.command("reset-offsets")
def reset_offsets(
    ctx: typer.Context,
    group: str = typer.Option(..., "--group", "-g", help="Group whose offsets to reset; it must be inactive (no members)."),
    topic: List[str] = typer.Option([], "--topic", "-t", autocompletion=complete_topic, help="TOPIC or TOPIC:PARTITION,... (repeatable)."),
    all_topics: bool = typer.Option(False, "--all-topics", help="Every topic the group has committed offsets for."),
    to_earliest: bool = typer.Option(False, "--to-earliest", help="Reset to the log start offset."),
    to_latest: bool = typer.Option(False, "--to-latest", help="Reset to the log end offset."),
    to_current: bool = typer.Option(False, "--to-current", help="Reset to the committed offset (clamped into the log)."),
    to_offset: Optional[int] = typer.Option(None, "--to-offset", help="Reset to this offset."),
    shift_by: Optional[int] = typer.Option(None, "--shift-by", help="Move the committed offset by N (may be negative)."),
    to_datetime: Optional[str] = typer.Option(None, "--to-datetime", help="First offset at or after YYYY-MM-DDTHH:mm:SS.sss (zone optional, default local)."),
    by_duration: Optional[str] = typer.Option(None, "--by-duration", help="First offset at or after now minus an ISO-8601 duration (PT1H, P1DT2H)."),
    from_file: Optional[Path] = typer.Option(None, "--from-file", help="CSV of topic,partition,offset (or group,topic,partition,offset)."),
    execute: bool = typer.Option(False, "--execute", help="Commit the new offsets (without it nothing changes)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only print the plan (the default)."),
    export: bool = typer.Option(False, "--export", help="Print the plan as CSV (group,topic,partition,offset) for --from-file."),
) -> None:
    """Reset a group's committed offsets; prints the plan and applies it only with --execute.

    New offsets are clamped to each partition's [log start, log end], as Kafka's tool does.

    Example: kcli groups reset-offsets --group billing --topic orders --to-earliest --execute

    Example: kcli groups reset-offsets --group billing --topic orders:0,1 --shift-by -10
    """
    chosen = [(k, v) for k, v in (("earliest", to_earliest or None), ("latest", to_latest or None),
                                  ("current", to_current or None), ("offset", to_offset), ("shift-by", shift_by),
                                  ("datetime", to_datetime), ("duration", by_duration), ("file", from_file))
              if v is not None]
    if len(chosen) != 1:
        raise UsageError("give exactly one of --to-earliest, --to-latest, --to-current, --to-offset, --shift-by, "
                         "--to-datetime, --by-duration, --from-file")
    if execute and dry_run:
        raise UsageError("--execute and --dry-run are mutually exclusive")
    kind, value = chosen[0]
    if kind == "file":
        if topic or all_topics:
            raise UsageError("--from-file names its partitions: leave out --topic and --all-topics")
        try:
            text = Path(value).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"--from-file {value}: {getattr(err, 'strerror', None) or err}") from None
        value = ops.parse_offsets_csv(text, str(value))
    elif bool(topic) == all_topics:
        raise UsageError("give --topic (repeatable) or --all-topics")
    elif kind == "offset" and value < 0:
        raise UsageError(f"--to-offset must be >= 0, got {value}")
    elif kind == "datetime":
        value = ops.parse_datetime_ms(value)
    elif kind == "duration":
        import time

        value = int(time.time() * 1000) - ops.parse_duration_ms(value)
    ops.validate_group_id(group)
    request = ops.ResetRequest(group=group, topics=ops.parse_topic_partitions(topic), all_topics=all_topics,
                               kind=kind, value=value, execute=execute)
    opts = options(ctx)
    with connect(opts) as conn:
        result = ops.plan_reset(conn, request)

    def table() -> None:
        if export:
            for r in result.offsets:
                sys.stdout.write(f"{result.group},{r.topic},{r.partition},{r.new_offset}\n")
            return
        print_table([dict(vars(r), group=result.group) for r in result.offsets],
                    [("GROUP", "group"), ("TOPIC", "topic"), ("PARTITION", "partition"), ("NEW-OFFSET", "new_offset")])

    render(result, opts.output, table)
    if not execute and not dry_run:
        sys.stderr.write("kcli: dry run: no offsets were changed; add --execute to apply this plan\n")


@groups_app.command("delete-offsets")
def delete_offsets(
    ctx: typer.Context,
    group: str = typer.Option(..., "--group", "-g", help="Group whose committed offsets to delete."),
    topic: List[str] = typer.Option(..., "--topic", "-t", autocompletion=complete_topic, help="TOPIC or TOPIC:PARTITION,... (repeatable)."),
) -> None:
    """Delete a group's committed offsets for topics it does not consume (OffsetDelete, KIP-496).

    Example: kcli groups delete-offsets --group billing --topic old-orders
    """
    ops.validate_group_id(group)
    topics = ops.parse_topic_partitions(topic)
    opts = options(ctx)
    with connect(opts) as conn:
        result = ops.delete_offsets(conn, group, topics)
    failed = result.failed
    if failed and len(failed) == len(result.partitions):
        first = failed[0]
        raise OperationError(f"{first.error}: no offsets of group '{group}' deleted "
                             f"({', '.join(sorted({f'{d.topic}-{d.partition}' for d in failed}))})")

    def table() -> None:
        print_table([{"topic": d.topic, "partition": d.partition,
                      "status": "Successful" if d.error is None else f"Error: {d.error}"} for d in result.partitions],
                    [("TOPIC", "topic"), ("PARTITION", "partition"), ("STATUS", "status")])

    render(result, opts.output, table)
    if failed:
        raise SystemExit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(groups_app, name="groups")
