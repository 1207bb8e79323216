"""Topic operations over the Kafka admin protocol (confluent-kafka AdminClient).

Each function takes a :class:`Connection`, does one operator-level thing and returns
dataclasses, so runbooks can chain them. Kafka refusals become ``KafkaApiError(NAME, message)``.
Semantics follow kafka-topics.sh (TopicCommand) unless a docstring says otherwise.
"""

from __future__ import annotations

import base64
import dataclasses
import re
import struct
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Callable, Iterable, Sequence

from confluent_kafka import KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)

from kcli.errors import KafkaApiError, UsageError
from kcli.ops import partitions as shrink_ops
from kcli.ops.connection import Admin, Connection, admin, to_kcli_error
from kcli.ops.partition_modes import MODES_KEY, parse_modes

# Kafka's Topic.isInternal: the topics the broker marks internal (kafka-topics --exclude-internal).
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})

DISKLESS_ENABLE = "diskless.enable"
REMOTE_STORAGE_ENABLE = "remote.storage.enable"

_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249


class TopicKind(str, Enum):
    """Where a topic's data lives: local log only, local + remote tier, or object storage only."""

    classic = "classic"
    tiered = "tiered"
    diskless = "diskless"


def topic_kind(configs: dict[str, str | None]) -> TopicKind:
    """Kind from effective configs; diskless wins (Inkless forbids combining it with tiering)."""
    if str(configs.get(DISKLESS_ENABLE) or "").lower() == "true":
        return TopicKind.diskless
    if str(configs.get(REMOTE_STORAGE_ENABLE) or "").lower() == "true":
        return TopicKind.tiered
    return TopicKind.classic


def validate_topic_name(name: str) -> str:
    """Kafka's Topic.validate rules, checked locally so a typo is a usage error, not a round trip."""
    if not name:
        raise UsageError("topic name must not be empty")
    if name in (".", ".."):
        raise UsageError(f"topic name cannot be {name!r}")
    if len(name) > MAX_TOPIC_NAME:
        raise UsageError(f"topic name is {len(name)} characters; the limit is {MAX_TOPIC_NAME}")
    if not _LEGAL_TOPIC.match(name):
        raise UsageError(f"topic name {name!r} is illegal: use ASCII letters, digits, '.', '_' and '-'")
    return name


def format_topic_id(uuid: Any) -> str | None:
    """Kafka's Uuid.toString: url-safe base64 of the 16 bytes, no padding (22 chars). Zero → None."""
    if uuid is None:
        return None
    msb, lsb = uuid.get_most_significant_bits(), uuid.get_least_significant_bits()
    if msb == 0 and lsb == 0:
        return None
    raw = struct.pack(">qq", msb, lsb)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


# --- records -------------------------------------------------------------------------------


@dataclass
class PartitionDescription:
    """One partition as kafka-topics shows it. New fields get defaults so JSON only grows."""

    partition: int
    leader: int | None
    replicas: list[int]
    isr: list[int]
    mode: str = "ReadWrite"  # KIP-694: ReadWrite, or ReadOnly while its deletion is pending
    delete_at_ms: int | None = None  # when a ReadOnly partition's data is deleted
    # A cluster (docs/cluster.md): the leader's rack, each replica's rack (None: not set, or the
    # broker is down), and the replicas whose broker is not live (Metadata lists live brokers only)
    leader_rack: str | None = None
    replica_racks: list[str | None] = field(default_factory=list)
    offline_replicas: list[int] = field(default_factory=list)
    # cleanup.policy=compact (docs/broker.md "Log compaction"): dirty bytes / cleanable bytes
    dirty_ratio: float | None = None
    # ListOffsets: earliest and latest (the high watermark) offsets; for a tiered topic also the
    # first offset still on the leader's disk (KIP-405 EARLIEST_LOCAL); None when not answered
    log_start_offset: int | None = None
    log_end_offset: int | None = None
    local_log_start_offset: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TopicDescription:
    """What ``topics describe`` reports for a topic.

    ``configs`` holds only non-default configs (as kafka-topics prints); ``all_configs`` keeps
    every effective value for callers such as runbooks, and stays out of the JSON. Later
    features (tiered_state, tiered_epoch, partition mode, delete_at) are added as optional
    fields here and in :class:`PartitionDescription`; JSON consumers see extra keys only.
    """

    topic: str
    topic_id: str | None
    kind: TopicKind
    partition_count: int
    replication_factor: int
    configs: dict[str, str | None]
    partitions: list[PartitionDescription]
    internal: bool = False
    all_configs: dict[str, str | None] = field(default_factory=dict, repr=False)
    tiered_state: str | None = None  # KIP-950, from kcli's broker (DescribeConfigs kcli.tiered.state)
    tiered_epoch: int | None = None
    # where each of ``configs`` comes from: DYNAMIC_TOPIC_CONFIG (the topic's own), or the broker's
    # DYNAMIC_BROKER_CONFIG / DYNAMIC_DEFAULT_BROKER_CONFIG / STATIC_BROKER_CONFIG (DescribeConfigs source)
    config_sources: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "topic_id": self.topic_id,
            "kind": self.kind.value,
            "partition_count": self.partition_count,
            "replication_factor": self.replication_factor,
            "configs": dict(self.configs),
            "config_sources": dict(self.config_sources),
            "partitions": [p.to_dict() for p in self.partitions],
            "internal": self.internal,
            **({"tiered_state": self.tiered_state, "tiered_epoch": self.tiered_epoch}
               if self.tiered_state is not None else {}),
        }


@dataclass
class TopicListing:
    topic: str
    internal: bool
    kind: TopicKind | None = None  # None when configs were not fetched

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "internal": self.internal, "kind": self.kind.value if self.kind else None}


@dataclass
class CreateTopicRequest:
    topic: str
    partitions: int | None = None  # None: broker default (num.partitions)
    replication_factor: int | None = None  # None: broker default (default.replication.factor)
    configs: dict[str, str] = field(default_factory=dict)
    if_not_exists: bool = False


@dataclass
class CreateTopicResult:
    topic: str
    created: bool  # False: it already existed and --if-not-exists was given


@dataclass
class AlterTopicRequest:
    """Changes to one topic. Later options (tiering on/off, disable policy, dry-run,
    partition-deletion delay) become fields here and steps in :func:`plan_alter`."""

    topic: str
    partitions: int | None = None
    set_configs: dict[str, str] = field(default_factory=dict)
    delete_configs: list[str] = field(default_factory=list)
    dry_run: bool = False
    delete_partitions_delay_ms: int | None = None  # KIP-694 shrink: keep removed partitions readable this long
    assume_yes: bool = False  # a shrink that deletes data right away needs confirming


@dataclass
class AlterStep:
    """One change the alter will make (or made), in order."""

    action: str  # "set-configs" | "delete-configs" | "create-partitions" | "delete-partitions"
    detail: str
    done: bool = False


@dataclass
class AlterTopicResult:
    topic: str
    steps: list[AlterStep]
    dry_run: bool = False
    shrink: Any = None  # kcli.ops.partitions.ShrinkPlan when the alter reduces partitions

    @property
    def changed(self) -> bool:
        return any(s.done for s in self.steps)


@dataclass
class DeleteTopicResult:
    topic: str
    deleted: bool  # False: it did not exist and --if-exists was given


# --- helpers -------------------------------------------------------------------------------


def _metadata(client: Admin, timeout_s: float, topic: str | None = None) -> Any:
    """Cluster metadata, retried in short slices so an unreachable cluster fails fast."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.list_topics(topic=topic, timeout=1.0) if topic else client.list_topics(timeout=1.0)
        except KafkaException as err:
            kerr = err.args[0] if err.args else None
            retriable = isinstance(kerr, KafkaError) and kerr.code() in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT)
            client.poll(0)
            client.errors.check()
            if not retriable or time.monotonic() > deadline:
                raise to_kcli_error(err, "metadata") from err


def _topic_names(client: Admin, timeout_s: float) -> list[str]:
    md = _metadata(client, timeout_s)
    return sorted(md.topics)


def _describe_configs(client: Admin, topics: Sequence[str]) -> dict[str, dict[str, ConfigEntry]]:
    if not topics:
        return {}
    futures = client.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in topics],
                                      request_timeout=client.timeout_s)
    out: dict[str, dict[str, ConfigEntry]] = {}
    for resource, fut in futures.items():
        out[resource.name] = client.wait(fut, f"topic '{resource.name}'")
    return out


def _not_found(topic: str) -> KafkaApiError:
    return KafkaApiError("UNKNOWN_TOPIC_OR_PARTITION", f"topic '{topic}' does not exist")


def _is_unknown_topic(err: KafkaApiError) -> bool:
    return err.name == "UNKNOWN_TOPIC_OR_PARTITION"


def _tp_key(tp: Any) -> tuple[str, int]:
    return tp.topic, tp.partition


def list_offsets(client: Admin, partitions: Iterable[tuple[str, int]], spec: Any,
                 strict: bool = False) -> dict[tuple[str, int], int | None]:
    """ListOffsets for each partition with one OffsetSpec; an unanswerable partition maps to None
    (or, with ``strict``, raises its error). A timestamp with no record after it answers -1."""
    wanted = sorted(set(partitions))
    if not wanted:
        return {}
    futures = client.list_offsets({TopicPartition(t, p): spec for t, p in wanted}, request_timeout=client.timeout_s)
    out: dict[tuple[str, int], int | None] = {}
    for tp, fut in futures.items():
        try:
            out[_tp_key(tp)] = client.wait(fut, f"topic '{tp.topic}' partition {tp.partition}").offset
        except KafkaApiError:
            if strict:
                raise
            out[_tp_key(tp)] = None
    return out


# --- operations ----------------------------------------------------------------------------


def create_topic(conn: Connection, req: CreateTopicRequest) -> CreateTopicResult:
    """CreateTopics; ``if_not_exists`` turns TOPIC_ALREADY_EXISTS into ``created=False``."""
    validate_topic_name(req.topic)
    if req.partitions is not None and req.partitions < 1:
        raise UsageError(f"--partitions must be at least 1, got {req.partitions}")
    if req.replication_factor is not None and not 1 <= req.replication_factor <= 32767:
        raise UsageError(f"--replication-factor must be between 1 and 32767, got {req.replication_factor}")
    client = admin(conn)
    new = NewTopic(req.topic, num_partitions=req.partitions if req.partitions is not None else -1,
                   replication_factor=req.replication_factor if req.replication_factor is not None else -1,
                   config=dict(req.configs))
    futures = client.create_topics([new], request_timeout=conn.timeout_s, operation_timeout=conn.timeout_s)
    try:
        client.wait(futures[req.topic], f"topic '{req.topic}'")
    except KafkaApiError as err:
        if err.name == "TOPIC_ALREADY_EXISTS" and req.if_not_exists:
            return CreateTopicResult(req.topic, created=False)
        raise
    return CreateTopicResult(req.topic, created=True)


def list_topics(conn: Connection, kind: TopicKind | None = None, exclude_internal: bool = False,
                with_kind: bool = False) -> list[TopicListing]:
    """Sorted topic names; a ``kind`` filter (or ``with_kind``) fetches each topic's configs."""
    client = admin(conn)
    names = _topic_names(client, conn.timeout_s)
    if exclude_internal:
        names = [n for n in names if n not in INTERNAL_TOPICS]
    listings = [TopicListing(n, n in INTERNAL_TOPICS) for n in names]
    if kind is not None or with_kind:
        configs = _describe_configs(client, names)
        for listing in listings:
            entries = configs.get(listing.topic, {})
            listing.kind = topic_kind({k: e.value for k, e in entries.items()})
        if kind is not None:
            listings = [lst for lst in listings if lst.kind == kind]
    return listings


def filter_partitions(descriptions: list[TopicDescription], *, under_replicated: bool = False,
                      under_min_isr: bool = False, unavailable: bool = False) -> list[TopicDescription]:
    """kafka-topics --describe's partition filters (TopicCommand), each keeping a partition that
    matches any filter given: --under-replicated-partitions (ISR smaller than the replicas),
    --under-min-isr-partitions (no leader, or ISR below min.insync.replicas),
    --unavailable-partitions (no leader, or a replica whose broker is down). Topics left with no
    partition are dropped; no filter keeps everything."""
    if not (under_replicated or under_min_isr or unavailable):
        return descriptions
    out = []
    for desc in descriptions:
        try:
            min_isr = int(desc.all_configs.get("min.insync.replicas") or 1)
        except ValueError:
            min_isr = 1
        keep = [p for p in desc.partitions
                if (under_replicated and len(p.isr) < len(p.replicas))
                or (under_min_isr and (p.leader is None or len(p.isr) < min_isr))
                or (unavailable and (p.leader is None or bool(p.offline_replicas)))]
        if keep:
            out.append(dataclasses.replace(desc, partitions=keep))
    return out


def describe_topics(conn: Connection, topics: Sequence[str] | None = None) -> list[TopicDescription]:
    """DescribeTopics + DescribeConfigs for ``topics`` (default: every topic), sorted by name."""
    client = admin(conn)
    names = sorted(dict.fromkeys(topics)) if topics else _topic_names(client, conn.timeout_s)
    for name in names:
        validate_topic_name(name)
    if not names:
        return []
    futures = client.describe_topics(TopicCollection(names), request_timeout=conn.timeout_s)
    described: dict[str, Any] = {}
    for name in names:
        try:
            described[name] = client.wait(futures[name], f"topic '{name}'")
        except KafkaApiError as err:
            raise (_not_found(name) if _is_unknown_topic(err) else err) from None
    configs = _describe_configs(client, names)
    # only partitions with a live leader: librdkafka would retry the others until the timeout
    every = [(n, p.id) for n in names for p in described[n].partitions
             if p.leader is not None and p.leader.id >= 0 and p.leader.host]
    starts = list_offsets(client, every, OffsetSpec.earliest())
    ends = list_offsets(client, every, OffsetSpec.latest())
    # tiered topics, diskless ones with remote storage too: below the local log start, the remote tier
    tiered = [(n, p) for n in names if str((e := configs.get(n, {}).get(REMOTE_STORAGE_ENABLE)) and e.value).lower()
              == "true" for p in described[n].partitions]
    local_starts = _local_log_starts(conn, tiered)
    result = []
    for name in names:
        desc = described[name]
        parts = sorted(desc.partitions, key=lambda p: p.id)
        entries = configs.get(name, {})
        all_configs = {k: e.value for k, e in sorted(entries.items())}
        modes = parse_modes(all_configs.get(MODES_KEY))  # KIP-694 partitions that are not ReadWrite
        dirty = _parse_dirty_ratios(all_configs.get("kcli.cleaner.dirty.ratio"))  # compacted topics
        # kcli.* entries are read-only broker state (e.g. tiered state), not configs
        overrides = {k: e.value for k, e in sorted(entries.items()) if not e.is_default and not k.startswith("kcli.")}
        result.append(TopicDescription(
            topic=name,
            topic_id=format_topic_id(getattr(desc, "topic_id", None)),
            kind=topic_kind(all_configs),
            partition_count=len(parts),
            replication_factor=len(parts[0].replicas) if parts else 0,
            configs=overrides,
            partitions=[
                PartitionDescription(
                    partition=p.id,
                    leader=p.leader.id if p.leader is not None and p.leader.id >= 0 else None,
                    replicas=[n.id for n in p.replicas],
                    isr=[n.id for n in p.isr],
                    mode=modes[p.id].mode if p.id in modes else "ReadWrite",
                    delete_at_ms=modes[p.id].delete_at_ms if p.id in modes else None,
                    leader_rack=p.leader.rack if p.leader is not None and p.leader.id >= 0 else None,
                    replica_racks=[n.rack for n in p.replicas],
                    offline_replicas=[n.id for n in p.replicas if not n.host],
                    dirty_ratio=dirty.get(p.id),
                    log_start_offset=starts.get((name, p.id)),
                    log_end_offset=ends.get((name, p.id)),
                    local_log_start_offset=local_starts.get((name, p.id)),
                )
                for p in parts
            ],
            internal=bool(getattr(desc, "is_internal", False)) or name in INTERNAL_TOPICS,
            all_configs=all_configs,
            tiered_state=all_configs.get("kcli.tiered.state"),
            tiered_epoch=int(all_configs["kcli.tiered.epoch"]) if all_configs.get("kcli.tiered.epoch") else None,
            config_sources={k: _source_name(entries[k].source) for k in overrides},
        ))
    return result


EARLIEST_LOCAL_TIMESTAMP = -4  # ListOffsets v8+ (KIP-405): the leader's local log start


def _local_log_starts(conn: Connection, partitions: list[tuple[str, Any]]) -> dict[tuple[str, int], int]:
    """ListOffsets(-4) to each partition's leader with kcli's protocol client (confluent-kafka's
    OffsetSpec has no EARLIEST_LOCAL); best effort: a partition that gets no answer is left out."""
    by_leader: dict[str, dict[str, list[int]]] = {}
    for topic, p in partitions:
        if p.leader is None or p.leader.id < 0 or not p.leader.host:
            continue
        by_leader.setdefault(f"{p.leader.host}:{p.leader.port}", {}).setdefault(topic, []).append(p.id)
    out: dict[tuple[str, int], int] = {}
    if not by_leader:
        return out
    from kcli.errors import OperationError
    from kcli.protocol.client import WireClient

    for address, topics in by_leader.items():
        body = {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": t, "partitions": [{"partition_index": p, "current_leader_epoch": -1,
                                        "timestamp": EARLIEST_LOCAL_TIMESTAMP} for p in ps]}
            for t, ps in topics.items()]}
        try:
            with WireClient(address, timeout=conn.timeout_s, properties=conn.properties) as wire:
                resp = wire.request(2, 8, body)
        except OperationError:
            continue
        for t in resp.topics:
            for p in t.partitions:
                if not p.error_code and p.offset >= 0:
                    out[(t.name, int(p.partition_index))] = int(p.offset)
    return out


def _source_name(source: Any) -> str:
    """confluent-kafka's ConfigSource (or its int) as Kafka names it."""
    try:
        return ConfigSource(int(getattr(source, "value", source))).name
    except (TypeError, ValueError):
        return str(source)


def _parse_dirty_ratios(value: str | None) -> dict[int, float]:
    """The broker's ``<partition>:<ratio>,...`` (kcli/broker/log_cleaner.py); bad pairs are skipped."""
    out: dict[int, float] = {}
    for pair in (value or "").split(","):
        p, _, ratio = pair.partition(":")
        try:
            out[int(p)] = float(ratio)
        except ValueError:
            continue
    return out


def _check_alter_input(req: AlterTopicRequest) -> None:
    validate_topic_name(req.topic)
    if req.partitions is None and not req.set_configs and not req.delete_configs:
        raise UsageError("nothing to alter: give --partitions, --config or --delete-config")
    if req.partitions is not None and req.partitions < 1:
        raise UsageError(f"--partitions must be at least 1, got {req.partitions}")
    if req.delete_partitions_delay_ms is not None and req.delete_partitions_delay_ms < 0:
        raise UsageError(f"--delete-partitions-delay must be >= 0 ms, got {req.delete_partitions_delay_ms}")
    clash = sorted(set(req.set_configs) & set(req.delete_configs))
    if clash:
        raise UsageError(f"config {clash[0]!r} is both set (--config) and deleted (--delete-config)")


def plan_alter(current: TopicDescription, req: AlterTopicRequest) -> list[AlterStep]:
    """The ordered changes ``req`` asks of ``current``; raises for changes not possible yet."""
    steps: list[AlterStep] = []
    _check_alter_input(req)
    if req.set_configs:
        steps.append(AlterStep("set-configs", ",".join(f"{k}={v}" for k, v in req.set_configs.items())))
    if req.delete_configs:
        steps.append(AlterStep("delete-configs", ",".join(req.delete_configs)))
    shrinking = req.partitions is not None and req.partitions < current.partition_count
    if req.delete_partitions_delay_ms is not None and not shrinking:
        raise UsageError("--delete-partitions-delay applies only when --partitions is below the current count "
                         f"({current.partition_count})")
    if req.partitions is not None:
        writable = sum(1 for p in current.partitions if p.mode == "ReadWrite")
        if shrinking and req.partitions == writable:
            pass  # that shrink is already under way (the rest are ReadOnly): nothing to do again
        elif shrinking:
            steps.append(AlterStep("delete-partitions", f"{current.partition_count} -> {req.partitions}"))
        if req.partitions > current.partition_count:
            steps.append(AlterStep("create-partitions", f"{current.partition_count} -> {req.partitions}"))
    return steps


def alter_topic(conn: Connection, req: AlterTopicRequest,
                confirm: Callable[[Any], bool] | None = None) -> AlterTopicResult:
    """IncrementalAlterConfigs then CreatePartitions or DeletePartitions (KIP-694). Everything
    is validated (describe + plan, and for a shrink the broker's validate-only answer and the
    operator's confirmation) before the first change, so bad input changes nothing.
    ``--partitions`` equal to the current count is a no-op, so re-running a runbook step is safe."""
    _check_alter_input(req)
    current = describe_topics(conn, [req.topic])[0]
    steps = plan_alter(current, req)
    shrink = None
    if any(s.action == "delete-partitions" for s in steps):
        assert req.partitions is not None
        shrink = shrink_ops.prepare_shrink(conn, req.topic, current.partition_count, req.partitions,
                                           req.delete_partitions_delay_ms or 0, dry_run=req.dry_run,
                                           assume_yes=req.assume_yes, confirm=confirm)
    if req.dry_run or not steps:
        return AlterTopicResult(req.topic, steps, dry_run=req.dry_run, shrink=shrink)
    client = admin(conn)
    context = f"topic '{req.topic}'"
    ops = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in req.set_configs.items()]
    ops += [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in req.delete_configs]
    for step in steps:
        if step.action in ("set-configs", "delete-configs"):
            if ops:
                resource = ConfigResource(ResourceType.TOPIC, req.topic, incremental_configs=ops)
                futures = client.incremental_alter_configs([resource], request_timeout=conn.timeout_s)
                for fut in futures.values():
                    client.wait(fut, context)
                ops = []  # one request carries both sets and deletes
            step.done = True
        elif step.action == "create-partitions":
            assert req.partitions is not None
            futures = client.create_partitions([NewPartitions(req.topic, req.partitions)],
                                               request_timeout=conn.timeout_s, operation_timeout=conn.timeout_s)
            client.wait(futures[req.topic], context)
            step.done = True
        elif step.action == "delete-partitions":
            shrink_ops.apply_shrink(conn, shrink)
            step.done = True
    return AlterTopicResult(req.topic, steps, shrink=shrink)


def delete_topic(conn: Connection, topic: str, if_exists: bool = False) -> DeleteTopicResult:
    """DeleteTopics; ``if_exists`` turns UNKNOWN_TOPIC_OR_PARTITION into ``deleted=False``."""
    validate_topic_name(topic)
    client = admin(conn)
    futures = client.delete_topics([topic], request_timeout=conn.timeout_s, operation_timeout=conn.timeout_s)
    try:
        client.wait(futures[topic], f"topic '{topic}'")
    except KafkaApiError as err:
        if _is_unknown_topic(err):
            if if_exists:
                return DeleteTopicResult(topic, deleted=False)
            raise _not_found(topic) from None
        raise
    return DeleteTopicResult(topic, deleted=True)

