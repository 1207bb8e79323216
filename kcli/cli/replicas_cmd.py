"""`kcli topics elect-leaders` (kafka-leader-election) and `kcli partitions reassign
plan|execute|verify|cancel|list` (kafka-reassign-partitions), over kcli.ops.replicas."""

from __future__ import annotations

import sys
from enum import Enum
from typing import List, Optional

import typer

from kcli.cli.common import options
from kcli.cli.completion_cmd import complete_topic
from kcli.cli.render import render
from kcli.cli.topics import topics_app
from kcli.errors import UsageError
from kcli.ops import replicas as ops
from kcli.ops.connection import connect


class ElectionType(str, Enum):
    preferred = "preferred"
    unclean = "unclean"


@topics_app.command("elect-leaders")
def elect_leaders(
    ctx: typer.Context,
    topic: Optional[str] = typer.Option(None, "--topic", "-t", autocompletion=complete_topic,
                                        help="Topic (default: every partition of every topic)."),
    partition: Optional[int] = typer.Option(None, "--partition", min=0, help="Partition of --topic (default: all)."),
    election_type: ElectionType = typer.Option(ElectionType.preferred, "--election-type",
                                               help="preferred: the first replica leads again if it is in the ISR; "
                                                    "unclean: an offline partition gets any live replica as leader "
                                                    "(records only its old ISR had are lost)."),
) -> None:
    """Elect leaders on demand (ElectLeaders, kafka-leader-election).

    Prints Kafka's lines; exits 1 when a partition could not be elected.

    Example: kcli topics elect-leaders --topic orders --election-type preferred
    """
    if partition is not None and topic is None:
        raise UsageError("--partition needs --topic")
    opts = options(ctx)
    with connect(opts) as conn:
        wanted = None
        if topic is not None:
            wanted = [(topic, partition)] if partition is not None else sorted(ops.current_assignment(conn, [topic]))
        results = ops.elect_leaders(conn, election_type.value, wanted)
    kind = election_type.value.upper()
    failed = [r for r in results if r.error and r.error != "ELECTION_NOT_NEEDED"]

    def table() -> None:
        for line in ops.election_lines(kind, results):
            sys.stdout.write(line + "\n")

    render([{**r.to_dict(), "result": "elected" if r.error is None else
             ("not_needed" if r.error == "ELECTION_NOT_NEEDED" else "failed")} for r in results], opts.output, table)
    if failed:
        raise typer.Exit(1)


partitions_app = typer.Typer(help="Move partition replicas between brokers (kafka-reassign-partitions style).",
                             no_args_is_help=True)
reassign_app = typer.Typer(help="Plan, start, verify, cancel and list partition reassignments.", no_args_is_help=True)
partitions_app.add_typer(reassign_app, name="reassign")


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as err:
        raise UsageError(f"cannot read {path}: {err.strerror or err}") from None


def _targets(json_file: Optional[str], topic: Optional[str], partition: Optional[int],
             replicas: Optional[str]) -> dict[tuple[str, int], list[int]]:
    """The reassignment from --reassignment-json-file, or from --topic/--partition/--replicas."""
    if json_file is not None:
        if topic is not None or partition is not None or replicas is not None:
            raise UsageError("--reassignment-json-file cannot be combined with --topic, --partition or --replicas")
        return ops.parse_reassignment_json(_read(json_file))
    if topic is None or partition is None:
        raise UsageError("give --reassignment-json-file, or --topic and --partition (with --replicas)")
    reps = ops.parse_broker_list(replicas, "--replicas") if replicas is not None else []
    return {(topic, partition): reps}


JSON_FILE = typer.Option(None, "--reassignment-json-file", help="Kafka's reassignment JSON "
                         '({"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1,2,3]}]}).')
TOPIC = typer.Option(None, "--topic", "-t", autocompletion=complete_topic, help="Topic (instead of a JSON file).")
PARTITION = typer.Option(None, "--partition", min=0, help="Partition of --topic.")


def _warn_unreachable(unreachable: dict[int, str]) -> None:
    """A broker that did not answer keeps its throttle rates: say so, and how to remove them."""
    for broker, error in sorted(unreachable.items()):
        sys.stderr.write(f"kcli: warning: could not remove the replication throttle rates of broker {broker} "
                         f"({error}); run verify again once it is back\n")


@reassign_app.command("plan")
def plan(
    ctx: typer.Context,
    broker_list: str = typer.Option(..., "--broker-list", help="Brokers to place the replicas on: 1,2,3."),
    topics_to_move_json_file: Optional[str] = typer.Option(None, "--topics-to-move-json-file",
                                                           help='Kafka\'s {"version":1,"topics":[{"topic":"t"}]}.'),
    topic: List[str] = typer.Option([], "--topic", "-t", autocompletion=complete_topic,
                                    help="Topic to move (repeatable; instead of the JSON file)."),
) -> None:
    """Propose a reassignment of whole topics over a broker list (kafka-reassign-partitions --generate).

    Prints the current assignment (save it for a rollback) and the proposal; nothing changes.

    Example: kcli partitions reassign plan --topic orders --broker-list 1,2,3 > plan.txt
    """
    if topics_to_move_json_file is not None and topic:
        raise UsageError("--topics-to-move-json-file cannot be combined with --topic")
    names = ops.parse_topics_json(_read(topics_to_move_json_file)) if topics_to_move_json_file else list(topic)
    if not names:
        raise UsageError("give --topics-to-move-json-file or --topic")
    brokers = ops.parse_broker_list(broker_list)
    opts = options(ctx)
    with connect(opts) as conn:
        live = set(ops.live_broker_ids(conn))
        current = ops.current_assignment(conn, names)
    usable = [b for b in brokers if b in live]  # Kafka's getBrokerMetadata keeps the known brokers only
    proposed = ops.generate(current, usable)
    import json

    def table() -> None:
        sys.stdout.write(f"Current partition replica assignment\n{ops.format_json(current)}\n\n")
        sys.stdout.write(f"Proposed partition reassignment configuration\n{ops.format_json(proposed)}\n")

    render({"current": json.loads(ops.format_json(current)), "proposed": json.loads(ops.format_json(proposed))},
           opts.output, table)


@reassign_app.command("execute")
def execute(
    ctx: typer.Context,
    reassignment_json_file: Optional[str] = JSON_FILE,
    topic: Optional[str] = TOPIC,
    partition: Optional[int] = PARTITION,
    replicas: Optional[str] = typer.Option(None, "--replicas", help="Target replicas of --topic/--partition: 1,2,3 "
                                                                      "(the first is the preferred leader)."),
    additional: bool = typer.Option(False, "--additional", help="Start even though other reassignments run."),
    throttle: Optional[int] = typer.Option(None, "--throttle", min=1, metavar="BYTES_PER_SEC",
                                           help="Limit the catch-up of the moving replicas to this many bytes/s "
                                                "(Kafka's replication throttle configs; `verify` removes them)."),
) -> None:
    """Start reassignments (AlterPartitionReassignments; kafka-reassign-partitions --execute).

    New replicas copy the leader and join the ISR; then the removed replicas are dropped and their
    logs deleted. A broker that is not live is refused (exit 2) and nothing changes. With
    --throttle, leader.replication.throttled.replicas / follower.replication.throttled.replicas
    are set on the topics and leader/follower.replication.throttled.rate on the brokers involved;
    run `verify` until the move completes to remove them. Re-running with --additional and a new
    --throttle while the move runs only changes the rates.

    Example: kcli partitions reassign execute --topic orders --partition 0 --replicas 2,3,4 --throttle 50000000
    """
    targets = _targets(reassignment_json_file, topic, partition, replicas)
    if any(not r for r in targets.values()):
        raise UsageError("Partition replica list cannot be empty")
    opts = options(ctx)
    with connect(opts) as conn:
        current, results = ops.execute(conn, targets, additional=additional, throttle=throttle)
    ops.raise_if_failed(results, "Error reassigning partition(s)")
    names = [f"{t}-{p}" for t, p in sorted(targets)]

    def table() -> None:
        if throttle is not None:
            sys.stdout.write("Warning: You must run --verify periodically, until the reassignment completes, to "
                             "ensure the throttle is removed.\n")
            sys.stdout.write(f"The inter-broker throttle limit was set to {throttle} B/s\n")
        sys.stdout.write(f"Current partition replica assignment\n\n{ops.format_json(current)}\n\n"
                         "Save this to use as the --reassignment-json-file option during rollback\n")
        sys.stdout.write(f"Successfully started partition reassignment{'' if len(names) == 1 else 's'} for "
                         f"{','.join(names)}\n")

    import json

    render({"previous": json.loads(ops.format_json(current)), "started": [r.to_dict() for r in results],
            "throttle": throttle}, opts.output, table)


@reassign_app.command("verify")
def verify(
    ctx: typer.Context,
    reassignment_json_file: Optional[str] = JSON_FILE,
    topic: Optional[str] = TOPIC,
    partition: Optional[int] = PARTITION,
    replicas: Optional[str] = typer.Option(None, "--replicas", help="Target replicas of --topic/--partition."),
    preserve_throttles: bool = typer.Option(False, "--preserve-throttles",
                                            help="Keep the replication throttle configs when the moves are done."),
) -> None:
    """Show whether reassignments completed (kafka-reassign-partitions --verify).

    When every partition is done, the replication throttles are removed (the topics'
    leader/follower.replication.throttled.replicas, every live broker's
    leader/follower.replication.throttled.rate) unless --preserve-throttles.

    Example: kcli partitions reassign verify --reassignment-json-file plan.json
    """
    targets = _targets(reassignment_json_file, topic, partition, replicas)
    opts = options(ctx)
    removed = False
    with connect(opts) as conn:
        states = ops.verify(conn, targets)
        if all(s.done for s in states) and not preserve_throttles:
            cleared = ops.clear_throttles(conn, targets)
            removed = cleared.removed
            _warn_unreachable(cleared.unreachable)

    def table() -> None:
        sys.stdout.write("Status of partition reassignment:\n")
        for s in states:
            sys.stdout.write(s.line() + "\n")
        if removed:
            sys.stdout.write("Throttle was removed.\n")

    render(states, opts.output, table)  # JSON/YAML keep their documented list shape


@reassign_app.command("cancel")
def cancel(
    ctx: typer.Context,
    reassignment_json_file: Optional[str] = JSON_FILE,
    topic: Optional[str] = TOPIC,
    partition: Optional[int] = PARTITION,
    preserve_throttles: bool = typer.Option(False, "--preserve-throttles",
                                            help="Keep the replication throttle configs."),
) -> None:
    """Cancel running reassignments: back to the replicas before them (kafka-reassign-partitions --cancel).

    The replication throttles are removed too, unless --preserve-throttles.

    Example: kcli partitions reassign cancel --topic orders --partition 0
    """
    targets = _targets(reassignment_json_file, topic, partition, None)
    opts = options(ctx)
    with connect(opts) as conn:
        results = ops.cancel(conn, sorted(targets))
        if not preserve_throttles and not any(r.error for r in results):
            _warn_unreachable(ops.clear_throttles(conn, targets).unreachable)
    ops.raise_if_failed(results, "Error cancelling partition reassignment(s)")
    names = [r.name for r in results]

    def table() -> None:
        if names:
            sys.stdout.write(f"Successfully cancelled partition reassignment{'' if len(names) == 1 else 's'} for: "
                             f"{','.join(names)}\n")
        else:
            sys.stdout.write("None of the specified partition reassignments are active.\n")

    render([r.to_dict() for r in results], opts.output, table)


@reassign_app.command("list")
def list_(ctx: typer.Context) -> None:
    """List the running reassignments (kafka-reassign-partitions --list).

    Example: kcli partitions reassign list
    """
    opts = options(ctx)
    with connect(opts) as conn:
        running = ops.list_reassignments(conn)

    def table() -> None:
        if not running:
            sys.stdout.write("No partition reassignments found.\n")
            return
        sys.stdout.write("Current partition reassignments:\n")
        for r in running:
            sys.stdout.write(r.line() + "\n")

    render(running, opts.output, table)


def register(app: typer.Typer) -> None:
    app.add_typer(partitions_app, name="partitions")
