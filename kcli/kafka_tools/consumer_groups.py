"""kafka-consumer-groups.sh (Kafka 4's ConsumerGroupCommand) for classic consumer groups over
kcli.ops.groups: --list, --describe (offsets, --members, --state), --delete, --reset-offsets
and --delete-offsets, with Kafka's column tables."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kcli.errors import KcliError
from kcli.kafka_tools import common
from kcli.kafka_tools.common import ToolError, ToolParser, cannot_combine, jopt_int

PROG = "kafka-consumer-groups.sh"
ACTIONS = ("list", "describe", "delete", "reset_offsets", "delete_offsets")
SCENARIOS = ("to_offset", "to_datetime", "by_duration", "to_earliest", "to_latest", "to_current", "shift_by",
             "from_file")
MISSING = "-"


def parser() -> ToolParser:
    p = ToolParser(PROG, "This tool helps to list all consumer groups, describe a consumer group, delete consumer "
                         "group info, or reset consumer group offsets.")
    common.add_connection_options(p, required_text="REQUIRED: The server(s) to connect to.")
    p.value("group", "The consumer group we wish to act on.", repeat=True, metavar="consumer group")
    p.value("topic", "The topic whose consumer group information should be deleted or topic whose should be "
                     "included in the reset offset process (topic or topic:partitions).", repeat=True,
            metavar="topic")
    p.flag("all-topics", "Consider all topics assigned to a group in the `reset-offsets` process.")
    p.flag("list", "List all consumer groups.")
    p.flag("describe", "Describe consumer group and list offset lag (number of messages not yet processed) "
                       "related to given group.")
    p.flag("all-groups", "Apply to all consumer groups.")
    p.flag("delete", "Pass in groups to delete topic partition offsets and ownership information over the entire "
                     "consumer group.")
    p.value("timeout", "The timeout that can be set for some use cases.", metavar="timeout (ms)",
            type=jopt_int("timeout"))
    p.flag("reset-offsets", "Reset offsets of consumer group.")
    p.flag("delete-offsets", "Delete offsets of consumer group.")
    p.flag("dry-run", "Only show results without executing changes on Consumer Groups.")
    p.flag("execute", "Execute operation.")
    p.flag("export", "Export operation execution to a CSV file.")
    p.value("to-offset", "Reset offsets to a specific offset.", metavar="offset", type=jopt_int("to-offset"))
    p.value("from-file", "Reset offsets to values defined in CSV file.", metavar="path to CSV file")
    p.value("to-datetime", "Reset offsets to offset from datetime. Format: 'YYYY-MM-DDThh:mm:ss.sss'",
            metavar="datetime")
    p.value("by-duration", "Reset offsets to offset by duration from current timestamp. Format: 'PnDTnHnMnS'",
            metavar="duration")
    p.flag("to-earliest", "Reset offsets to earliest offset.")
    p.flag("to-latest", "Reset offsets to latest offset.")
    p.flag("to-current", "Reset offsets to current offset.")
    p.value("shift-by", "Reset offsets shifting current offset by 'n', where 'n' can be positive or negative.",
            metavar="number-of-offsets", type=jopt_int("shift-by"))
    p.flag("members", "Describe members of the group.")
    p.flag("verbose", "Provide additional information, if any, when describing the group.")
    p.flag("offsets", "Describe the group and list all topic partitions in the group along with their offset "
                      "information.")
    p.add_argument("--state", nargs="?", const="", default=None, metavar="state",
                   help="When specified with '--describe', includes the state of the group. When specified with "
                        "'--list', it displays the state of all groups; it can also filter by state.")
    p.add_argument("--type", nargs="?", const="", default=None, metavar="type",
                   help="When specified with '--list', it displays the types of all the groups (kcli: classic).")
    return p


def _opts(names: tuple[str, ...]) -> str:
    return ", ".join(f"[{n}]" for n in names)


def check_args(ns: Any) -> str:
    """ConsumerGroupCommandOptions.checkArgs, in Kafka's order and words; returns the action."""
    actions = [a for a in ACTIONS if getattr(ns, a)]
    if len(actions) != 1:
        raise ToolError("Command must include exactly one action: --list, --describe, --delete, --reset-offsets, "
                        "--delete-offsets")
    action = actions[0]
    if ns.bootstrap_server is None:
        raise common.missing("bootstrap-server")
    scope = "[group], [all-groups]"
    if action == "describe":
        if not ns.group and not ns.all_groups:
            raise ToolError(f"Option [describe] takes one of these options: {scope}")
        if sum(1 for x in (ns.members, ns.offsets, ns.state is not None) if x) > 1:
            raise ToolError("Option [describe] takes at most one of these options: [members], [offsets], [state]")
        if ns.state:
            raise ToolError("Option [describe] does not take a value for [state]")
    if action == "delete":
        if not ns.group and not ns.all_groups:
            raise ToolError(f"Option [delete] takes one of these options: {scope}")
        if ns.topic:
            raise ToolError("The consumer does not support topic-specific offset deletion from a consumer group.")
    if action == "delete_offsets" and (not ns.group or not ns.topic):
        raise ToolError("Option [delete-offsets] takes the following options: [topic], [group]")
    if action == "reset_offsets":
        if ns.dry_run and ns.execute:
            raise ToolError("Option [reset-offsets] only accepts one of [execute] and [dry-run]")
        if not ns.dry_run and not ns.execute:
            import sys

            sys.stderr.write("WARN: No action will be performed as the --execute option is missing. In a future "
                             "major release, the default behavior of this command will be to prompt the user before "
                             "executing the reset rather than doing a dry run. You should add the --dry-run option "
                             "explicitly if you are scripting this command and want to keep the current default "
                             "behavior without prompting.\n")
        if not ns.group and not ns.all_groups:
            raise ToolError(f"Option [reset-offsets] takes one of these options: {scope}")
        given = [s for s in SCENARIOS if getattr(ns, s) not in (None, False)]
        if len(given) > 1:
            raise cannot_combine(given[0].replace("_", "-"), given[1].replace("_", "-"))
        if not given:
            raise ToolError("Option '[reset-offsets]' requires one of the following scenarios: "
                            + "[" + ", ".join(f"[{s.replace('_', '-')}]" for s in SCENARIOS) + "]")
        if not ns.topic and not ns.all_topics and not ns.from_file:
            raise ToolError("Option [reset-offsets] takes one of these options: [all-topics], [topic]")
    if ns.group and ns.all_groups:
        raise cannot_combine("group", "all-groups")
    if ns.group and action == "list":
        raise cannot_combine("group", "list")
    if ns.topic and action in ("list", "describe"):
        raise cannot_combine("topic", action)
    return action


def _groups(conn: Any, ns: Any) -> list[str]:
    from kcli.ops import groups as ops

    return [g.group for g in ops.list_groups(conn)] if ns.all_groups else list(dict.fromkeys(ns.group))


def list_(conn: Any, ns: Any) -> None:
    from kcli.ops import groups as ops

    states = [s for s in (ns.state or "").split(",") if s.strip()]
    listings = ops.list_groups(conn, states)
    if ns.state is None and ns.type is None:
        for g in listings:
            print(g.group)
        return
    width = max([15] + [len(g.group) for g in listings]) + 10
    header = ["GROUP"]
    if ns.type is not None:
        header.append("TYPE")
    if ns.state is not None:
        header.append("STATE")
    rows = [header]
    for g in listings:
        row = [g.group]
        if ns.type is not None:
            row.append("Classic")
        if ns.state is not None:
            row.append(g.state)
        rows.append(row)
    for row in rows:
        print(f"{row[0]:<{width}}" + "".join(f" {c:<20}" for c in row[1:]))


def describe(conn: Any, ns: Any) -> int:
    from kcli.errors import KafkaApiError
    from kcli.ops import groups as ops

    code = 0
    for group in _groups(conn, ns):
        try:
            desc = ops.describe_groups(conn, [group])[0]
        except KafkaApiError as err:
            if err.name in ("GROUP_ID_NOT_FOUND", "UNKNOWN_MEMBER_ID") or "does not exist" in err.message:
                print(f"\nError: Consumer group '{group}' does not exist.")
                code = 1
                continue
            raise
        if desc.state == "Dead":
            print(f"\nError: Consumer group '{group}' does not exist.")
            code = 1
            continue
        if desc.state == "Empty":
            import sys

            sys.stderr.write(f"\nConsumer group '{group}' has no active members.\n")
        elif desc.state in ("PreparingRebalance", "CompletingRebalance"):
            import sys

            sys.stderr.write(f"\nWarning: Consumer group '{group}' is rebalancing.\n")
        if ns.state is not None:
            _print_state(conn, desc)
        elif ns.members:
            _print_members(desc, ns.verbose)
        else:
            _print_offsets(desc)
    return code


def _print_offsets(desc: Any) -> None:
    rows = [(desc.group, r.topic, str(r.partition), _v(r.current_offset), _v(r.log_end_offset), _v(r.lag),
             r.consumer_id or MISSING, r.host or MISSING, r.client_id or MISSING) for r in desc.offsets]
    # members without partitions get a row of their own, as Kafka's tool prints them
    owners = {r.consumer_id for r in desc.offsets if r.consumer_id}
    rows += [(desc.group, MISSING, MISSING, MISSING, MISSING, MISSING, m.member_id, m.host or MISSING,
              m.client_id or MISSING) for m in desc.members if m.member_id not in owners]
    if not rows:
        return
    g = max([15] + [len(r[0]) for r in rows])
    t = max([15] + [len(r[1]) for r in rows])
    c = max([15] + [len(r[6]) for r in rows])
    h = max([15] + [len(r[7]) for r in rows])

    def line(r: tuple[str, ...]) -> str:
        return f"\n{r[0]:<{g}} {r[1]:<{t}} {r[2]:<10} {r[3]:<15} {r[4]:<15} {r[5]:<15} {r[6]:<{c}} {r[7]:<{h}} {r[8]}"

    out = line(("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST",
                "CLIENT-ID"))
    out += "".join(line(r) for r in rows)
    print(out)


def _v(value: int | None) -> str:
    return MISSING if value is None else str(value)


def _print_members(desc: Any, verbose: bool) -> None:
    if not desc.members:
        return
    g = max([15, len(desc.group)])
    c = max([15] + [len(m.member_id) for m in desc.members])
    i = max([17] + [len(m.group_instance_id or "") for m in desc.members])
    h = max([15] + [len(m.host) for m in desc.members])
    k = max([15] + [len(m.client_id) for m in desc.members])
    with_instance = any(m.group_instance_id for m in desc.members)

    def line(cells: list[str]) -> str:
        widths = [g, c] + ([i] if with_instance else []) + [h, k, 15]
        return "".join(f"{cell:<{w}} " for cell, w in zip(cells, widths))

    head = ["GROUP", "CONSUMER-ID"] + (["GROUP-INSTANCE-ID"] if with_instance else []) + ["HOST", "CLIENT-ID",
                                                                                          "#PARTITIONS"]
    text = "\n" + line(head) + ("ASSIGNMENT" if verbose else "")
    for m in desc.members:
        cells = [desc.group, m.member_id] + ([m.group_instance_id or ""] if with_instance else []) + \
            [m.host, m.client_id, str(len(m.assignment))]
        text += "\n" + line(cells)
        if verbose:
            by_topic: dict[str, list[int]] = {}
            for a in m.assignment:
                by_topic.setdefault(a["topic"], []).append(a["partition"])
            text += ",".join(f"{t}({','.join(map(str, ps))})" for t, ps in sorted(by_topic.items())) or MISSING
    print(text)


def _print_state(conn: Any, desc: Any) -> None:
    coordinator = "-"
    if desc.coordinator is not None:
        host = conn.bootstrap.split(",")[0].rsplit("://", 1)[-1]
        coordinator = f"{host}  ({desc.coordinator})"
    width = max(25, len(coordinator))
    fmt = "\n{:<%d} {:<25} {:<20} {:<15} {}" % width
    print(fmt.format("GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS")
          + fmt.format(desc.group, coordinator, desc.protocol, desc.state, len(desc.members)))


def delete(conn: Any, ns: Any) -> int:
    from kcli.ops import groups as ops

    results = ops.delete_groups(conn, _groups(conn, ns))
    ok = [r.group for r in results if r.deleted]
    failed = [r for r in results if not r.deleted]
    if not failed:
        print("Deletion of requested consumer groups ('" + "', '".join(ok) + "') was successful.")
        return 0
    print("Deletion of some consumer groups failed:")
    for r in failed:
        print(f"* Group '{r.group}' could not be deleted due to: {_kafka_exception(r.error)}")
    if ok:
        print("\nThese consumer groups were deleted successfully: '" + "', '".join(ok) + "'")
    return 1


def _kafka_exception(name: str | None) -> str:
    messages = {"NON_EMPTY_GROUP": "org.apache.kafka.common.errors.GroupNotEmptyException: The group is not empty.",
                "GROUP_ID_NOT_FOUND": "org.apache.kafka.common.errors.GroupIdNotFoundException: The group id does "
                                      "not exist."}
    return messages.get(name or "", name or "unknown error")


def reset(conn: Any, ns: Any) -> None:
    from kcli.ops import groups as ops

    kind, value = _scenario(ns)
    plans = []
    for group in _groups(conn, ns):
        req = ops.ResetRequest(group, ops.parse_topic_partitions(ns.topic) if ns.topic else [],
                               all_topics=ns.all_topics, kind=kind, value=value, execute=ns.execute)
        plans.append(ops.plan_reset(conn, req))
    if ns.export:
        lines = [f"{r.topic},{r.partition},{r.new_offset}" if len(plans) == 1 else
                 f"{p.group},{r.topic},{r.partition},{r.new_offset}" for p in plans for r in p.offsets]
        print("\n".join(lines))
        return
    fmt = "\n{:<30} {:<30} {:<10} {:<15}"
    out = fmt.format("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET") if any(p.offsets for p in plans) else ""
    for p in plans:
        for r in p.offsets:
            out += fmt.format(p.group, r.topic, r.partition, r.new_offset)
    print(out)


def _scenario(ns: Any) -> tuple[str, Any]:
    from kcli.ops import groups as ops

    if ns.to_earliest:
        return "earliest", None
    if ns.to_latest:
        return "latest", None
    if ns.to_current:
        return "current", None
    if ns.to_offset is not None:
        return "offset", ns.to_offset
    if ns.shift_by is not None:
        return "shift-by", ns.shift_by
    if ns.to_datetime is not None:
        return "datetime", ops.parse_datetime_ms(ns.to_datetime)
    if ns.by_duration is not None:
        return "duration", int(time.time() * 1000) - ops.parse_duration_ms(ns.by_duration)
    try:
        text = Path(ns.from_file).read_text()
    except OSError as err:
        raise ToolError(f"{ns.from_file} ({err.strerror or err})") from None
    return "file", ops.parse_offsets_csv(text, ns.from_file)


def delete_offsets(conn: Any, ns: Any) -> int:
    from kcli.ops import groups as ops

    group = ns.group[0]
    result = ops.delete_offsets(conn, group, ops.parse_topic_partitions(ns.topic))
    if not result.failed:
        print(f"Request succeed for deleting offsets from group {group}.")
    else:
        print("Encounter some partition level error, see the follow-up details:")
    fmt = "\n{:<30} {:<15} {:<15}"
    out = fmt.format("TOPIC", "PARTITION", "STATUS")
    for p in result.partitions:
        out += fmt.format(p.topic, p.partition, "Successful" if p.error is None else f"Error: {p.error}")
    print(out)
    return 1 if result.failed else 0


def main(argv: list[str]) -> int:
    ns = parser().parse(argv)
    action = check_args(ns)
    conn = common.connection(ns)
    if ns.timeout is not None and ns.timeout > 0:
        conn.timeout_s = ns.timeout / 1000.0
    try:
        if action == "list":
            list_(conn, ns)
        elif action == "describe":
            return describe(conn, ns)
        elif action == "delete":
            return delete(conn, ns)
        elif action == "reset_offsets":
            reset(conn, ns)
        else:
            return delete_offsets(conn, ns)
    except KcliError as err:
        raise ToolError(f"Error: Executing consumer group command failed due to {common.kafka_message(err)}",
                        stream="out") from None
    return 0


def entry() -> None:
    common.run(main)
