"""`kcli topics create|list|describe|alter|delete`, with kafka-topics' flags and output."""

from __future__ import annotations

import sys
from enum import Enum
from typing import List, Optional

import typer

from kcli.cli.common import OutputFormat, options, parse_key_values
from kcli.cli.render import render
from kcli.errors import UsageError
from kcli.ops import partitions as shrink_ops
from kcli.ops import topics as ops
from kcli.ops.connection import connect
from kcli.cli.completion_cmd import complete_topic

class DisablePolicy(str, Enum):
    """--policy of --disable-tiering (KIP-950's remote.log.disable.policy)."""

    retain = "retain"
    delete = "delete"


topics_app = typer.Typer(help="Create, list, describe, alter and delete topics (kafka-topics style).",
                         no_args_is_help=True)


@topics_app.command("create")
def create(
    ctx: typer.Context,
    topic: str = typer.Option(..., "--topic", "-t", autocompletion=complete_topic, help="Topic name."),
    partitions: Optional[int] = typer.Option(None, "--partitions", min=1, help="Partition count (default: broker's num.partitions)."),
    replication_factor: Optional[int] = typer.Option(None, "--replication-factor", min=1, max=32767,
                                                     help="Replicas per partition (default: broker's default.replication.factor)."),
    config: List[str] = typer.Option([], "--config", help="Topic config KEY=VALUE (repeatable)."),
    if_not_exists: bool = typer.Option(False, "--if-not-exists", help="Succeed if the topic already exists."),
    diskless: bool = typer.Option(False, "--diskless", help="Same as --config diskless.enable=true."),
) -> None:
    """Create a topic.

    Example: kcli topics create --topic orders --partitions 6 --config retention.ms=86400000
    """
    configs = parse_key_values(config, "--config")
    if diskless:
        if configs.get(ops.DISKLESS_ENABLE, "true").lower() != "true":
            raise UsageError(f"--diskless conflicts with --config {ops.DISKLESS_ENABLE}={configs[ops.DISKLESS_ENABLE]}")
        configs[ops.DISKLESS_ENABLE] = "true"
    opts = options(ctx)
    request = ops.CreateTopicRequest(topic, partitions, replication_factor, configs, if_not_exists)
    with connect(opts) as conn:
        result = ops.create_topic(conn, request)

    def table() -> None:
        if result.created:
            sys.stdout.write(f"Created topic {result.topic}.\n")
        else:
            sys.stdout.write(f"Topic {result.topic} already exists.\n")

    render(result, opts.output, table)


@topics_app.command("list")
def list_(
    ctx: typer.Context,
    diskless: bool = typer.Option(False, "--diskless", help="Only diskless topics (diskless.enable=true)."),
    classic: bool = typer.Option(False, "--classic", help="Only classic topics (neither diskless nor tiered)."),
    tiered: bool = typer.Option(False, "--tiered", help="Only tiered topics (remote.storage.enable=true)."),
    exclude_internal: bool = typer.Option(False, "--exclude-internal", help="Leave out internal topics."),
) -> None:
    """List topic names, one per line (JSON/YAML add each topic's kind).

    Example: kcli topics list --diskless
    """
    chosen = [k for k, on in ((ops.TopicKind.diskless, diskless), (ops.TopicKind.classic, classic),
                              (ops.TopicKind.tiered, tiered)) if on]
    if len(chosen) > 1:
        raise UsageError("give at most one of --diskless, --classic, --tiered")
    opts = options(ctx)
    with connect(opts) as conn:
        listings = ops.list_topics(conn, kind=chosen[0] if chosen else None, exclude_internal=exclude_internal,
                                   with_kind=opts.output != OutputFormat.table)

    def table() -> None:
        for listing in listings:
            sys.stdout.write(f"{listing.topic}\n")

    render(listings, opts.output, table)


@topics_app.command("describe")
def describe(
    ctx: typer.Context,
    topic: List[str] = typer.Option([], "--topic", "-t", autocompletion=complete_topic, help="Topic to describe (repeatable; default: all)."),
    under_replicated: bool = typer.Option(False, "--under-replicated-partitions", help="Only partitions whose ISR is smaller than their replicas."),
    under_min_isr: bool = typer.Option(False, "--under-min-isr-partitions", help="Only partitions without a leader or with an ISR below min.insync.replicas."),
    unavailable: bool = typer.Option(False, "--unavailable-partitions", help="Only partitions without a leader or with a replica on a broker that is down."),
) -> None:
    """Describe topics as kafka-topics does, plus each topic's kind.

    Leader, Replicas and Isr come from the cluster: a replicated classic
    partition (docs/replication.md) lists its in-sync replicas. The
    --under-replicated-partitions, --under-min-isr-partitions and
    --unavailable-partitions filters keep only the matching partitions.

    In a cluster whose brokers have racks, partition lines add LeaderRack
    and ReplicaRacks; Offline names replicas whose broker is down (a classic
    partition whose host is down: Leader none).

    Example: kcli topics describe --topic orders -o json

    Example: kcli -b host1:9092,host2:9092,host3:9092 topics describe --topic orders
    """
    opts = options(ctx)
    with connect(opts) as conn:
        descriptions = ops.describe_topics(conn, topic or None)
    filtered = under_replicated or under_min_isr or unavailable
    descriptions = ops.filter_partitions(descriptions, under_replicated=under_replicated,
                                         under_min_isr=under_min_isr, unavailable=unavailable)

    def table() -> None:
        for desc in descriptions:
            # kafka-topics prints only the partition lines when a partition filter is given
            for line in description_lines(desc)[1 if filtered else 0:]:
                sys.stdout.write(line + "\n")

    render(descriptions, opts.output, table)


@topics_app.command("alter")
def alter(
    ctx: typer.Context,
    topic: str = typer.Option(..., "--topic", "-t", autocompletion=complete_topic, help="Topic name."),
    partitions: Optional[int] = typer.Option(None, "--partitions", min=1, help="New partition count; below the current count removes the highest-numbered partitions (KIP-694)."),
    config: List[str] = typer.Option([], "--config", help="Set topic config KEY=VALUE (repeatable)."),
    delete_config: List[str] = typer.Option([], "--delete-config", help="Reset topic config KEY to its default (repeatable)."),
    disable_tiering: bool = typer.Option(False, "--disable-tiering", help="Turn tiered storage off (KIP-950)."),
    policy: Optional[DisablePolicy] = typer.Option(None, "--policy", help="With --disable-tiering: retain (default) or delete the remote data."),
    enable_tiering: bool = typer.Option(False, "--enable-tiering", help="Turn tiered storage back on (new tiered epoch)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would change without changing anything."),
    delete_partitions_delay: Optional[int] = typer.Option(None, "--delete-partitions-delay", min=0, metavar="MS",
                                                          help="With a smaller --partitions: keep the removed partitions readable (ReadOnly) this long before their data is deleted (default 0: delete right away)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before deleting partitions that hold data right away."),
    wait: bool = typer.Option(False, "--wait", help="With --disable-tiering/--enable-tiering: return once the topic's tiered state is DISABLED/ENABLED."),
    timeout: Optional[float] = typer.Option(None, "--timeout", min=0.1, metavar="SECONDS", help="With --wait: give up (exit 1) after this long (default 300)."),
) -> None:
    """Change a topic's configs (IncrementalAlterConfigs), add partitions, or remove partitions.

    In a cluster, a removed classic partition is counted and deleted by the
    broker hosting it.

    Example: kcli topics alter --topic orders --partitions 12 --config retention.ms=3600000

    Example: kcli topics alter --topic orders --partitions 3 --delete-partitions-delay 3600000 --dry-run

    Example: kcli topics alter --topic orders --disable-tiering --policy delete --dry-run

    Example: kcli topics alter --topic orders --disable-tiering --wait --timeout 600
    """
    if timeout is not None and not wait:
        raise UsageError("--timeout goes with --wait")
    if disable_tiering or enable_tiering or policy is not None:
        if partitions is not None or config or delete_config:
            raise UsageError("--disable-tiering/--enable-tiering cannot be combined with --partitions, --config or --delete-config")
        if wait and dry_run:
            raise UsageError("--wait and --dry-run are mutually exclusive (a dry run changes nothing to wait for)")
        return _alter_tiering(ctx, topic, disable_tiering, enable_tiering, policy.value if policy else None, dry_run,
                              (timeout if timeout is not None else WAIT_TIMEOUT_S) if wait else None)
    if wait:
        raise UsageError("--wait goes with --disable-tiering or --enable-tiering")
    for key in delete_config:
        if not key.strip() or "=" in key:
            raise UsageError(f"--delete-config expects a config name, got {key!r}")
    request = ops.AlterTopicRequest(topic=topic, partitions=partitions,
                                    set_configs=parse_key_values(config, "--config"),
                                    delete_configs=[k.strip() for k in delete_config], dry_run=dry_run,
                                    delete_partitions_delay_ms=delete_partitions_delay, assume_yes=yes)
    opts = options(ctx)
    with connect(opts) as conn:
        confirm = (lambda plan: typer.confirm(shrink_ops.confirm_question(plan), default=False, err=True)) \
            if sys.stdin.isatty() else None  # off a terminal, deleting data right away needs --yes
        result = ops.alter_topic(conn, request, confirm=confirm)
    for warning in result.shrink.warnings if result.shrink is not None else ():
        sys.stderr.write(f"kcli: warning: {warning}\n")

    def table() -> None:
        if not result.steps:
            sys.stdout.write(f"Topic {result.topic} unchanged.\n")
        for step in result.steps:
            verb = {"set-configs": "Set configs", "delete-configs": "Deleted configs",
                    "create-partitions": "Partitions", "delete-partitions": "Partitions"}.get(step.action, step.action)
            prefix = "Would alter" if result.dry_run else "Altered"
            sys.stdout.write(f"{prefix} topic {result.topic}: {verb} {step.detail}\n")
        if result.shrink is not None:
            for line in shrink_ops.plan_lines(result.shrink):
                sys.stdout.write(line + "\n")

    data = {"topic": result.topic, "changed": result.changed, "dry_run": result.dry_run, "steps": result.steps}
    if result.shrink is not None:
        data["partition_deletion"] = result.shrink
    render(data, opts.output, table)


WAIT_TIMEOUT_S = 300.0  # --wait without --timeout: a delete-policy disablement deletes remote data first


def _alter_tiering(ctx: typer.Context, topic: str, disable: bool, enable: bool, policy: str | None, dry_run: bool,
                   wait_s: float | None = None) -> None:
    """``alter --disable-tiering|--enable-tiering`` (KIP-950), via kcli.ops.tiering; ``wait_s``:
    then poll until the tiered state is DISABLED / ENABLED (OperationError, exit 1, on timeout)."""
    from kcli.ops import tiering

    if disable and enable:
        raise UsageError("--disable-tiering and --enable-tiering are mutually exclusive")
    if policy is not None and not disable:
        raise UsageError("--policy goes with --disable-tiering (re-enabling takes no policy, as in KIP-950)")
    opts = options(ctx)
    with connect(opts) as conn:
        change = (tiering.disable_tiering(conn, topic, policy, dry_run=dry_run) if disable
                  else tiering.enable_tiering(conn, topic, dry_run=dry_run))
        if wait_s is not None and change.changes:  # nothing to do: nothing to wait for either
            after = tiering.wait_for_state(conn, topic, "DISABLED" if disable else "ENABLED", wait_s)
            change.tiered_state, change.tiered_epoch = after.tiered_state, after.tiered_epoch

    def table() -> None:
        if not change.changes:
            sys.stdout.write(f"Topic {change.topic} unchanged: {change.effect}.\n")
            return
        verb = ("Would " + change.action if change.dry_run
                else {"disable": "Disabling", "enable": "Enabled"}[change.action])
        policy_text = f" (policy {change.policy})" if change.policy else ""
        sets = ",".join([f"{k}={v}" for k, v in change.set_configs.items()] + [f"-{k}" for k in change.delete_configs])
        sys.stdout.write(f"{verb} tiering on topic {change.topic}{policy_text}: {sets}\n"
                         f"  {change.effect[0].upper()}{change.effect[1:]}.\n")
        if change.tiered_state is not None:
            sys.stdout.write(f"  TieredState: {change.tiered_state}\tTieredEpoch: {change.tiered_epoch}\n")

    render(change, opts.output, table)


@topics_app.command("delete")
def delete(
    ctx: typer.Context,
    topic: str = typer.Option(..., "--topic", "-t", autocompletion=complete_topic, help="Topic name."),
    if_exists: bool = typer.Option(False, "--if-exists", help="Succeed if the topic does not exist."),
) -> None:
    """Delete a topic.

    Example: kcli topics delete --topic orders
    """
    opts = options(ctx)
    with connect(opts) as conn:
        result = ops.delete_topic(conn, topic, if_exists)

    def table() -> None:
        if result.deleted:
            sys.stdout.write(f"Deleted topic {result.topic}.\n")
        else:
            sys.stdout.write(f"Topic {result.topic} does not exist.\n")

    render(result, opts.output, table)


def description_lines(desc: ops.TopicDescription) -> list[str]:
    """kafka-topics --describe lines in Kafka 3.x layout, with ``Kind:`` ending the topic line;
    in a cluster with racks, partition lines add ``LeaderRack:``/``ReplicaRacks:``, and
    ``Offline:`` names replicas whose broker is down.

    Kafka 4.x appends ``Elr:``/``LastKnownElr:`` to partition lines (KIP-966); kcli leaves them
    out: confluent-kafka does not expose ELR, and a single-node cluster never has one.
    """
    head = f"Topic: {desc.topic}"
    if desc.topic_id:
        head += f"\tTopicId: {desc.topic_id}"
    configs = ",".join(f"{k}={'null' if v is None else v}" for k, v in desc.configs.items())
    head += f"\tPartitionCount: {desc.partition_count}\tReplicationFactor: {desc.replication_factor}"
    head += f"\tConfigs: {configs}\tKind: {desc.kind.value}"
    if desc.tiered_state is not None:
        head += f"\tTieredState: {desc.tiered_state}\tTieredEpoch: {desc.tiered_epoch}"
    lines = [head]
    racks = any(p.leader_rack is not None or any(p.replica_racks) for p in desc.partitions)
    for p in desc.partitions:
        leader = "none" if p.leader is None else str(p.leader)
        line = (f"\tTopic: {desc.topic}\tPartition: {p.partition}\tLeader: {leader}"
                f"\tReplicas: {','.join(map(str, p.replicas))}\tIsr: {','.join(map(str, p.isr))}")
        if racks:  # brokers with broker.rack (a cluster): where the leader and each replica are
            line += (f"\tLeaderRack: {p.leader_rack or '-'}"
                     f"\tReplicaRacks: {','.join(r or '-' for r in p.replica_racks)}")
        if p.offline_replicas:  # replicas whose broker is down
            line += f"\tOffline: {','.join(map(str, p.offline_replicas))}"
        if p.dirty_ratio is not None:  # a compacted topic: what the log cleaner has still to clean
            line += f"\tDirtyRatio: {p.dirty_ratio:.2f}"
        if p.log_end_offset is not None:  # ListOffsets answered: the partition's offset range
            line += f"\tLogStartOffset: {_offset(p.log_start_offset)}\tLogEndOffset: {p.log_end_offset}"
        if p.local_log_start_offset is not None:  # tiered: below it the records are remote only
            line += f"\tLocalLogStartOffset: {p.local_log_start_offset}"
        if p.mode != "ReadWrite":  # KIP-694: only partitions being deleted get the extra columns
            line += f"\tMode: {p.mode}\tDeleteAt: {shrink_ops.format_ms(p.delete_at_ms) or '-'}"
        lines.append(line)
    return lines


def _offset(value: int | None) -> str:
    return "-" if value is None else str(value)


def register(app: typer.Typer) -> None:
    app.add_typer(topics_app, name="topics")
