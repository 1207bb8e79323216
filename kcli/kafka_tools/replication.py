"""kafka-reassign-partitions.sh (Kafka's ReassignPartitionsCommand) and kafka-leader-election.sh
(LeaderElectionCommand) over kcli.ops.replicas, with Kafka's flags, output lines and errors.

``--throttle`` sets Kafka's replication throttle configs (kcli.ops.reassign_throttle); a completed
``--verify`` and ``--cancel`` clear them unless ``--preserve-throttles``. Not built: log directory
moves (``log_dirs`` other than ``"any"``, ``--replica-alter-log-dirs-throttle``)."""

from __future__ import annotations

import json
import sys
from typing import Any

from kcli.errors import KcliError
from kcli.kafka_tools import common
from kcli.kafka_tools.common import ToolError, ToolParser


def reassign_parser() -> ToolParser:
    p = ToolParser("kafka-reassign-partitions.sh", "This tool helps to move topic partitions between replicas.")
    p.value("bootstrap-server", "the server(s) to use for bootstrapping.")
    p.value("bootstrap-controller", "the controller(s) to use for bootstrapping.")
    p.value("command-config", "Property file containing configs to be passed to Admin Client.")
    for flag in ("verify", "generate", "execute", "cancel", "list", "preserve-throttles", "additional",
                 "disable-rack-aware"):
        p.flag(flag, f"Kafka's --{flag}.")
    for value in ("reassignment-json-file", "topics-to-move-json-file", "broker-list",
                  "replica-alter-log-dirs-throttle", "timeout"):
        p.value(value, f"Kafka's --{value}.")
    p.value("throttle", "The movement of partitions between brokers will be throttled to this value (bytes/sec).",
            type=common.jopt_int("throttle"))
    return p


def election_parser() -> ToolParser:
    p = ToolParser("kafka-leader-election.sh", "This tool attempts to elect a new leader for a set of topic "
                                               "partitions.")
    p.value("bootstrap-server", "the server(s) to use for bootstrapping.")
    p.value("bootstrap-controller", "the controller(s) to use for bootstrapping.")
    p.value("admin.config", "Configuration properties files to pass to the admin client.")
    p.value("topic", "Name of topic for which to perform an election.")
    p.value("partition", "Partition id for which to perform an election.", type=common.jopt_int("partition"))
    p.value("path-to-json-file", "The JSON file with the list of partition for which leader elections should be "
                                 "performed.")
    p.value("election-type", "Type of election to attempt (PREFERRED or UNCLEAN).")
    p.flag("all-topic-partitions", "Perform election on all of the eligible topic partitions.")
    return p


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as err:
        raise ToolError(f"{path} ({err.strerror or err})") from None


# ---- kafka-leader-election -----------------------------------------------------------------------
def election_main(argv: list[str]) -> int:
    ns = election_parser().parse(argv)
    missing = [n for n, v in (("bootstrap-server", ns.bootstrap_server or ns.bootstrap_controller),
                              ("election-type", ns.election_type)) if not v]
    if missing:
        raise ToolError(f"Missing required option(s): {', '.join(missing)}")
    chosen = [ns.topic is not None, ns.all_topic_partitions, ns.path_to_json_file is not None]
    if sum(chosen) != 1:
        raise ToolError("One and only one of the following options is required: topic, all-topic-partitions, "
                        "path-to-json-file")
    if ns.topic is not None and ns.partition is None:
        raise ToolError("Missing required option(s): partition")
    if ns.topic is None and ns.partition is not None:
        raise ToolError("Option partition is only allowed if topic is used")
    kind = ns.election_type.strip().upper()
    if kind not in ("PREFERRED", "UNCLEAN"):
        raise ToolError(f"No enum constant org.apache.kafka.common.ElectionType.{kind}")
    wanted: list[tuple[str, int]] | None = None
    if ns.topic is not None:
        wanted = [(ns.topic, ns.partition)]
    elif ns.path_to_json_file is not None:
        wanted = _election_json(_read(ns.path_to_json_file))
    if ns.bootstrap_server is None:
        ns.bootstrap_server = ns.bootstrap_controller
    ns.command_config = getattr(ns, "admin.config", None)
    conn = common.connection(ns)
    from kcli.ops import replicas as ops

    try:
        results = ops.elect_leaders(conn, kind.lower(), wanted)
    except KcliError as err:
        raise ToolError(common.kafka_message(err)) from None
    for line in ops.election_lines(kind, results):
        print(line)
    failed = [r for r in results if r.error and r.error != "ELECTION_NOT_NEEDED"]
    if failed:
        raise ToolError(f"{len(failed)} replica(s) could not be elected")
    return 0


def _election_json(text: str) -> list[tuple[str, int]]:
    """LeaderElectionCommand.parseReplicaElectionData: {"partitions":[{"topic":"t","partition":0}]}."""
    try:
        doc = json.loads(text)
    except ValueError:
        raise ToolError("Replica election data is empty") from None
    if not isinstance(doc, dict) or "partitions" not in doc:
        raise ToolError("Replica election data is empty")
    out = []
    for e in doc["partitions"] or []:
        try:
            out.append((str(e["topic"]), int(e["partition"])))
        except (KeyError, TypeError, ValueError):
            raise ToolError(f"Invalid partition entry {json.dumps(e)}") from None
    dups = sorted({f"{t}-{p}" for t, p in out if out.count((t, p)) > 1})
    if dups:
        raise ToolError(f"Replica election data contains duplicate partitions: {','.join(dups)}")
    return out


# ---- kafka-reassign-partitions -------------------------------------------------------------------
ACTIONS = ("generate", "execute", "verify", "cancel", "list")


def reassign_main(argv: list[str]) -> int:
    ns = reassign_parser().parse(argv)
    actions = [a for a in ACTIONS if getattr(ns, a)]
    if len(actions) != 1:
        raise ToolError("Command must include exactly one action: --generate, --execute, --verify, --cancel, --list")
    action = actions[0]
    if not (ns.bootstrap_server or ns.bootstrap_controller):
        raise ToolError("Please specify --bootstrap-server")
    if action in ("execute", "verify", "cancel") and ns.reassignment_json_file is None:
        raise ToolError("Missing required argument \"[reassignment-json-file]\"")
    if action == "generate":
        for name in ("topics-to-move-json-file", "broker-list"):
            if getattr(ns, name.replace("-", "_")) is None:
                raise ToolError(f"Missing required argument \"[{name}]\"")
    if ns.throttle is not None and ns.throttle <= 0:
        raise ToolError(f"--throttle must be a positive number of bytes/sec, got {ns.throttle}")
    if ns.bootstrap_server is None:
        ns.bootstrap_server = ns.bootstrap_controller
    conn = common.connection(ns)
    from kcli.ops import replicas as ops

    try:
        if action == "list":
            running = ops.list_reassignments(conn)
            if not running:
                print("No partition reassignments found.")
            else:
                print("Current partition reassignments:")
                for r in running:
                    print(r.line())
        elif action == "generate":
            names = ops.parse_topics_json(_read(ns.topics_to_move_json_file))
            brokers = ops.parse_broker_list(ns.broker_list)
            current = ops.current_assignment(conn, names)
            live = set(ops.live_broker_ids(conn))
            proposed = ops.generate(current, [b for b in brokers if b in live])
            print(f"Current partition replica assignment\n{ops.format_json(current)}\n")
            print(f"Proposed partition reassignment configuration\n{ops.format_json(proposed)}")
        elif action == "execute":
            targets = ops.parse_reassignment_json(_read(ns.reassignment_json_file))
            current, results = ops.execute(conn, targets, additional=ns.additional, throttle=ns.throttle)
            if ns.throttle is not None:
                print("Warning: You must run --verify periodically, until the reassignment completes, to ensure "
                      "the throttle is removed.")
                print(f"The inter-broker throttle limit was set to {ns.throttle} B/s")
            print(f"Current partition replica assignment\n\n{ops.format_json(current)}\n\n"
                  "Save this to use as the --reassignment-json-file option during rollback")
            failed = [r for r in results if r.error]
            if failed:
                raise ToolError("Error reassigning partition(s):\n" + "\n".join(
                    f"{r.name}: {r.message or ops.EXCEPTIONS.get(r.error or '', ('', r.error))[1]}" for r in failed),
                    stream="out")
            names = [f"{t}-{p}" for t, p in sorted(targets)]
            print(f"Successfully started partition reassignment{'' if len(names) == 1 else 's'} for {','.join(names)}")
        elif action == "verify":
            targets = ops.parse_reassignment_json(_read(ns.reassignment_json_file))
            print("Status of partition reassignment:")
            states = ops.verify(conn, targets)
            for s in states:
                print(s.line())
            if all(s.done for s in states) and not ns.preserve_throttles:
                _clear_throttles(conn, targets)
        else:  # cancel
            targets = ops.parse_reassignment_json(_read(ns.reassignment_json_file))
            results = ops.cancel(conn, sorted(targets))
            failed = [r for r in results if r.error]
            if failed:
                raise ToolError(f"Error cancelling partition reassignment{'' if len(failed) == 1 else 's'} for:\n"
                                + "\n".join(f"{r.name}: {r.message or r.error}" for r in failed), stream="out")
            if results:
                names = ",".join(r.name for r in results)
                print(f"Successfully cancelled partition reassignment{'' if len(results) == 1 else 's'} for: {names}")
            else:
                print("None of the specified partition reassignments are active.")
            if not ns.preserve_throttles:
                _clear_throttles(conn, targets)
    except KcliError as err:
        raise ToolError(f"Error: {common.kafka_message(err)}", stream="out") from None
    return 0


def _clear_throttles(conn: Any, targets: dict[tuple[str, int], list[int]]) -> None:
    """clearAllThrottles with Kafka's lines (when anything was removed): the rates on every live
    broker, the replica lists of the plan's topics."""
    from kcli.ops import replicas as ops

    cleared = ops.clear_throttles(conn, targets)
    for broker, error in sorted(cleared.unreachable.items()):
        sys.stderr.write(f"kafka-reassign-partitions: could not remove the throttle rates of broker {broker}: "
                         f"{error}\n")
    if not cleared.removed:
        return  # nothing was set: Kafka prints its lines anyway; kcli keeps the output as before
    topics = sorted({t for t, _ in targets})
    print(f"\nClearing broker-level throttles on brokers {','.join(map(str, sorted(ops.live_broker_ids(conn))))}")
    print(f"Clearing topic-level throttles on topic{'' if len(topics) == 1 else 's'} {','.join(topics)}")
    print("Throttle was removed.")


def reassign_entry() -> None:
    common.run(reassign_main)


def election_entry() -> None:
    common.run(election_main)
