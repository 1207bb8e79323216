"""kafka-topics.sh (Kafka 4's TopicCommand) over kcli.ops.topics, with KIP-694's
``--delete-partitions-delay`` for ``--alter --partitions`` below the current count and KIP-1163's
diskless topics (``--diskless`` on ``--create`` and as a ``--list``/``--describe`` filter)."""

from __future__ import annotations

import re
import sys
from typing import Any

from kcli.errors import KcliError
from kcli.kafka_tools import common
from kcli.kafka_tools.common import ToolError, ToolParser, cannot_combine, jopt_int, missing

PROG = "kafka-topics.sh"
ACTIONS = ("create", "list", "alter", "describe", "delete")
ALTER_CONFIGS_HINT = " (To alter topic configurations, the kafka-configs tool can be used.)"
COLLISION_WARNING = ("WARNING: Due to limitations in metric names, topics with a period ('.') or underscore ('_') could "
                     "collide. To avoid issues it is best to use either, but not both.")


def parser() -> ToolParser:
    p = ToolParser(PROG, "This tool helps to create, delete, describe, or change a topic.")
    common.add_connection_options(p)
    p.flag("list", "List all available topics.")
    p.flag("create", "Create a new topic.")
    p.flag("delete", "Delete a topic.")
    p.flag("alter", "Alter the number of partitions and replica assignment." + ALTER_CONFIGS_HINT)
    p.flag("describe", "List details for the given topics.")
    p.value("topic", "The topic to create, alter, describe or delete. It also accepts a regular expression, "
                     "except for --create option.", metavar="topic")
    p.value("topic-id", "The topic-id to describe.", metavar="topic-id")
    p.value("config", "A topic configuration override for the topic being created (name=value).",
            metavar="name=value", repeat=True)
    p.value("delete-config", "No longer supported since Kafka 4.0 (use kafka-configs).", metavar="name", repeat=True)
    p.value("partitions", "The number of partitions for the topic being created or altered; below the current "
                          "count it reduces the topic (KIP-694).", metavar="# of partitions",
            type=jopt_int("partitions"))
    p.value("replication-factor", "The replication factor for each partition in the topic being created.",
            metavar="replication factor", type=jopt_int("replication-factor"))
    p.value("replica-assignment", "A list of manual partition-to-broker assignments for the topic being created "
                                  "or altered.", metavar="broker_id_for_part1_replica1:...,...")
    p.value("delete-partitions-delay", "KIP-694: with --alter --partitions below the current count, keep the removed "
                                       "partitions readable (ReadOnly) this many ms before deleting them "
                                       "(default 0: delete right away).", metavar="ms",
            type=jopt_int("delete-partitions-delay"))
    p.flag("diskless", "KIP-1163: with --create, create a diskless topic (diskless.enable=true); with --list or "
                       "--describe, only diskless topics.")
    p.flag("under-replicated-partitions", "If set when describing topics, only show under-replicated partitions.")
    p.flag("unavailable-partitions", "If set when describing topics, only show partitions whose leader is not "
                                     "available.")
    p.flag("under-min-isr-partitions", "If set when describing topics, only show partitions whose isr count is less "
                                       "than the configured minimum.")
    p.flag("at-min-isr-partitions", "If set when describing topics, only show partitions whose isr count is equal "
                                    "to the configured minimum.")
    p.flag("topics-with-overrides", "If set when describing topics, only show topics that have overridden configs.")
    p.flag("if-exists", "If set when altering or deleting or describing topics, the action will only execute if "
                        "the topic exists.")
    p.flag("if-not-exists", "If set when creating topics, the action will only execute if the topic does not "
                            "already exist.")
    p.flag("exclude-internal", "Exclude internal topics when listing or describing topics.")
    p.value("partition-size-limit-per-response", "The maximum partition size to be included in one "
                                                 "DescribeTopicPartitions response (accepted, not needed).",
            metavar="maximum number of partitions per response", type=jopt_int("partition-size-limit-per-response"))
    return p


REPORT_FLAGS = ("under_replicated_partitions", "under_min_isr_partitions", "at_min_isr_partitions",
                "unavailable_partitions")


def check_args(ns: Any, argv: list[str]) -> str:
    """TopicCommandOptions.checkArgs, in Kafka's order and words; returns the action."""
    if not argv:
        raise ToolError("Create, delete, describe, or change a topic.")
    actions = [a for a in ACTIONS if getattr(ns, a)]
    if len(actions) != 1:
        raise ToolError("Command must include exactly one action: --list, --describe, --create, --alter or --delete")
    action = actions[0]
    if ns.delete_config:
        sys.stderr.write("delete-config option is no longer supported and deprecated since version 4.0. The config "
                         "will be fully removed in future releases.\n")
    if ns.bootstrap_server is None:
        raise ToolError("--bootstrap-server must be specified")
    if action == "describe" and ns.if_exists and ns.topic is None and ns.topic_id is None:
        raise ToolError("--topic or --topic-id is required to describe a topic")
    if action not in ("list", "describe") and ns.topic is None:
        raise missing("topic")
    if action == "alter":
        if ns.config:
            raise ToolError('Option combination "[[bootstrap-server], [config]]" can\'t be used with option '
                            f'"[alter]"{ALTER_CONFIGS_HINT}')
        if ns.partitions is None:
            raise missing("partitions")

    def only(option: str, allowed: tuple[str, ...], value: Any) -> None:
        if value:
            for other in ("alter", "create", "describe", "list", "delete"):
                if other not in allowed and getattr(ns, other):
                    raise cannot_combine(option, other)

    only("config", ("alter", "create"), ns.config)
    only("partitions", ("alter", "create"), ns.partitions is not None)
    only("replication-factor", ("create",), ns.replication_factor is not None)
    only("replica-assignment", ("alter", "create"), ns.replica_assignment is not None)
    if action == "create" and ns.replica_assignment is not None:
        for other, given in (("partitions", ns.partitions is not None),
                             ("replication-factor", ns.replication_factor is not None)):
            if given:
                raise cannot_combine("replica-assignment", other)
    for flag in REPORT_FLAGS:
        if getattr(ns, flag):
            opt = flag.replace("_", "-")
            if ns.topics_with_overrides:
                raise cannot_combine(opt, "topics-with-overrides")
            only(opt, ("describe",), True)
    if ns.topics_with_overrides:
        for flag in REPORT_FLAGS:
            if getattr(ns, flag):
                raise cannot_combine("topics-with-overrides", flag.replace("_", "-"))
        only("topics-with-overrides", ("describe",), True)
    only("if-exists", ("alter", "delete", "describe"), ns.if_exists)
    only("if-not-exists", ("create",), ns.if_not_exists)
    only("exclude-internal", ("list", "describe"), ns.exclude_internal)
    only("delete-partitions-delay", ("alter",), ns.delete_partitions_delay is not None)
    only("diskless", ("create", "list", "describe"), ns.diskless)
    return action


def parse_configs(values: list[str]) -> dict[str, str]:
    """TopicCommand.parseTopicConfigsToBeAdded: each ``--config`` is one ``key=val``."""
    out: dict[str, str] = {}
    for value in values:
        parts = re.split(r"\s*=\s*", value)
        while parts and parts[-1] == "":  # Java's String.split drops trailing empty strings
            parts.pop()
        if len(parts) != 2:
            raise ToolError('Error while executing topic command : requirement failed: Invalid topic config: all '
                            'configs to be added must be in the format "key=val".', stream="out")
        out[parts[0].strip()] = parts[1].strip()
    return out


def parse_replica_assignment(text: str) -> list[list[int]]:
    """TopicCommand.parseReplicaAssignment: ``1:2,2:3`` → one broker list per partition."""
    out: list[list[int]] = []
    for i, part in enumerate(text.split(",")):
        try:
            brokers = [int(b.strip()) for b in part.split(":") if b.strip()]
        except ValueError:
            raise ToolError(f'For input string: "{part}"') from None
        dups = sorted({b for b in brokers if brokers.count(b) > 1})
        if dups:
            raise ToolError("Partition replica lists may not contain duplicate entries: " + ",".join(map(str, dups)))
        if out and len(brokers) != len(out[0]):
            raise ToolError(f"Partition {i} has different replication factor: [{', '.join(map(str, brokers))}]")
        out.append(brokers)
    return out


def _matching(conn: Any, pattern: str | None, exclude_internal: bool, diskless: bool = False) -> list[str]:
    """TopicService.getTopics: every topic, or those the ``--topic`` regular expression matches
    whole (Kafka's IncludeList), sorted; internal topics unless excluded."""
    from kcli.ops import topics as ops

    listings = ops.list_topics(conn, kind=ops.TopicKind.diskless if diskless else None)
    names = [lst.topic for lst in listings]
    if pattern is None:
        return [n for n in names if not (exclude_internal and n in ops.INTERNAL_TOPICS)]
    try:
        rx = re.compile(pattern.strip().strip('"'))
    except re.error:
        rx = re.compile(re.escape(pattern))
    return [n for n in names if rx.fullmatch(n) and not (exclude_internal and n in ops.INTERNAL_TOPICS)]


def _ensure_exists(found: list[str], requested: str | None, required: bool) -> None:
    if requested and required and not found:
        raise ToolError(f"Error while executing topic command : Topic '{requested}' does not exist as expected",
                        stream="out")


def create(conn: Any, ns: Any) -> None:
    from kcli.ops import topics as ops

    name = ns.topic
    if ns.replication_factor is not None and not 1 <= ns.replication_factor <= 32767:
        raise ToolError("Error while executing topic command : The replication factor must be between 1 and "
                        "32767 inclusive", stream="out")
    if ns.partitions is not None and ns.partitions < 1:
        raise ToolError("Error while executing topic command : The partitions must be greater than 0", stream="out")
    configs = parse_configs(ns.config)
    if ns.diskless:
        configs["diskless.enable"] = "true"
    partitions, rf = ns.partitions, ns.replication_factor
    if ns.replica_assignment:
        assignment = parse_replica_assignment(ns.replica_assignment)
        partitions, rf = len(assignment), len(assignment[0])
    if "." in name or "_" in name:
        print(COLLISION_WARNING)
    result = ops.create_topic(conn, ops.CreateTopicRequest(name, partitions, rf, configs, ns.if_not_exists))
    if result.created:
        print(f"Created topic {name}.")


def list_(conn: Any, ns: Any) -> None:
    names = _matching(conn, ns.topic, ns.exclude_internal, ns.diskless)
    print("\n".join(names))


def alter(conn: Any, ns: Any) -> None:
    from kcli.ops import topics as ops

    found = _matching(conn, ns.topic, ns.exclude_internal)
    _ensure_exists(found, ns.topic, not ns.if_exists)
    for name in found:
        if ns.partitions is not None:
            current = ops.describe_topics(conn, [name])[0].partition_count
            if ns.partitions == current:  # kcli's own alter is a no-op here; Kafka's broker refuses it
                raise ToolError(f"Error while executing topic command : Topic already has {current} partitions.",
                                stream="out")
        result = ops.alter_topic(conn, ops.AlterTopicRequest(
            name, partitions=ns.partitions, delete_partitions_delay_ms=ns.delete_partitions_delay, assume_yes=True))
        if result.shrink is not None:
            for warning in result.shrink.warnings:
                print(f"WARNING: {warning}")


def delete(conn: Any, ns: Any) -> None:
    from kcli.ops import topics as ops

    found = _matching(conn, ns.topic, False)
    _ensure_exists(found, ns.topic, not ns.if_exists)
    for name in found:
        ops.delete_topic(conn, name, if_exists=ns.if_exists)


def describe(conn: Any, ns: Any) -> None:
    from kcli.ops import topics as ops

    if ns.topic_id is not None and ns.topic_id.strip() not in ("", "AAAAAAAAAAAAAAAAAAAAAA"):
        every = ops.describe_topics(conn, _matching(conn, None, ns.exclude_internal))
        descriptions = [d for d in every if d.topic_id == ns.topic_id.strip()]
        if not descriptions and not ns.if_exists:
            raise ToolError(f"Error while executing topic command : TopicId '{ns.topic_id}' does not exist as "
                            "expected", stream="out")
    else:
        found = _matching(conn, ns.topic, ns.exclude_internal, ns.diskless)
        _ensure_exists(found, ns.topic, not ns.if_exists)
        descriptions = ops.describe_topics(conn, found) if found else []
    reporting = any(getattr(ns, f) for f in REPORT_FLAGS)
    for d in descriptions:
        if not reporting and (not ns.topics_with_overrides or d.configs):
            print(topic_line(d))
        if ns.topics_with_overrides:
            continue
        min_isr = int(d.all_configs.get("min.insync.replicas") or 1)
        for p in d.partitions:
            if reporting and not _reported(ns, p, min_isr):
                continue
            print(partition_line(d.topic, p))


def _reported(ns: Any, p: Any, min_isr: int) -> bool:
    return ((ns.under_replicated_partitions and len(p.isr) < len(p.replicas))
            or (ns.unavailable_partitions and p.leader is None)
            or (ns.under_min_isr_partitions and (p.leader is None or len(p.isr) < min_isr))
            or (ns.at_min_isr_partitions and len(p.isr) == min_isr))


def topic_line(d: Any) -> str:
    """TopicDescription.printDescription's line."""
    configs = ",".join(f"{k}={v}" for k, v in d.configs.items())
    topic_id = f"\tTopicId: {d.topic_id}" if d.topic_id else ""
    return (f"Topic: {d.topic}{topic_id}\tPartitionCount: {d.partition_count}\t"
            f"ReplicationFactor: {d.replication_factor}\tConfigs: {configs}")


def partition_line(topic: str, p: Any) -> str:
    """PartitionDescription.printDescription's line (Kafka 4: with Elr and LastKnownElr, N/A when
    the cluster does not report them, as a Kafka 4 tool prints against a broker without
    DescribeTopicPartitions)."""
    leader = "none" if p.leader is None else str(p.leader)
    line = (f"\tTopic: {topic}\tPartition: {p.partition}\tLeader: {leader}\t"
            f"Replicas: {','.join(map(str, p.replicas))}\tIsr: {','.join(map(str, p.isr))}\t"
            "Elr: N/A\tLastKnownElr: N/A")
    if p.mode != "ReadWrite":  # KIP-694: a partition being removed says so, as `kcli topics describe`
        from kcli.ops.partitions import format_ms

        line += f"\tMode: {p.mode}\tDeleteAt: {format_ms(p.delete_at_ms) or '-'}"
    return line


def main(argv: list[str]) -> int:
    ns = parser().parse(argv)
    action = check_args(ns, argv)
    conn = common.connection(ns, "--bootstrap-server must be specified")
    try:
        {"create": create, "list": list_, "alter": alter, "describe": describe, "delete": delete}[action](conn, ns)
    except KcliError as err:
        raise ToolError(f"Error while executing topic command : {common.kafka_message(err)}", stream="out") from None
    return 0


def entry() -> None:
    common.run(main)
