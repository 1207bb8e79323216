"""Reduce a topic's partition count (KIP-694) and read partition modes.

A shrink is planned before anything changes: kcli sends DeletePartitions with its
``validate_only`` tag (the broker checks the feature switch, pending deletions and which
partitions may go, and reports each partition's record count, bytes and delete time) and
samples the topic for keyed records. Only then, after confirmation where data would be
deleted right away, does it send the real request.

DeletePartitions is not in Kafka's protocol, so it travels on kcli's own API key over
:class:`~kcli.protocol.client.WireClient`; partition modes come back to any Kafka admin client
as the read-only ``kcli.partition.modes`` DescribeConfigs entry (``3:ReadOnly@<deleteAtMs>,...``).
"""

from __future__ import annotations

import time
import zlib
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from confluent_kafka import KafkaException, TopicCollection, TopicPartition

from kcli.errors import KafkaApiError, OperationError, UsageError
from kcli.ops.brokers import wire_client
from kcli.ops.connection import Connection, admin, consumer
from kcli.ops.partition_modes import (  # noqa: F401 - re-exported for callers of the shrink
    MODES_KEY,
    NONE,
    READ_ONLY,
    READ_WRITE,
    PartitionMode,
    parse_modes,
    partition_modes,
)

ENABLE_CONFIG = "delete.topic.partition.enable"
_MODE_CODES = {0: READ_WRITE, 1: READ_ONLY, -1: NONE}
KEY_SAMPLE_PER_PARTITION = 100

KEYED_WARNING = ("topic '{topic}' holds keyed records: the key-to-partition mapping will change, so new "
                 "records with a key may land in a different partition than earlier ones")
OFFLINE_WARNING = ("partition(s) {partitions} of '{topic}' are offline (their broker is down): their record "
                   "counts are unknown, and their data is deleted when their broker is back")
PRODUCER_NOTE = ("producers built on librdkafka 2.x (confluent-kafka and most non-Java clients) never lower a "
                 "partition count they already know: restart them after the shrink (see docs/partition-reduction.md)")


def format_ms(ms: int | None) -> str | None:
    if ms is None or ms < 0:
        return None
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# --- the plan --------------------------------------------------------------------------------


@dataclass
class PartitionPlan:
    """One partition a shrink removes."""

    partition: int
    records: int | None  # high watermark - log start offset; None when the broker cannot tell
    size_bytes: int | None
    delete_at_ms: int
    mode: str  # after the request: ReadWrite (plan only), ReadOnly or None (deleted)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "delete_at": format_ms(self.delete_at_ms)}


@dataclass
class ShrinkPlan:
    """What reducing ``topic`` from ``current`` to ``target`` partitions does (or did)."""

    topic: str
    current: int
    target: int
    delay_ms: int
    partitions: list[PartitionPlan]
    keyed: bool | None = None  # None: nothing to sample
    sampled_records: int = 0
    warnings: list[str] = field(default_factory=list)
    dry_run: bool = False
    applied: bool = False
    routing: Routing | None = field(default=None, repr=False)  # where the partitions live

    @property
    def delete_at_ms(self) -> int:
        return min((p.delete_at_ms for p in self.partitions), default=-1)

    @property
    def records(self) -> int:
        return sum(p.records or 0 for p in self.partitions)

    @property
    def size_bytes(self) -> int:
        return sum(p.size_bytes or 0 for p in self.partitions)

    @property
    def unknown(self) -> list[int]:
        """Partitions whose contents no broker could tell (in a cluster: their host is down)."""
        return [p.partition for p in self.partitions if p.records is None]

    @property
    def destroys_data(self) -> bool:
        """Deleting right away would (or might: contents unknown) remove stored records: what
        needs confirmation."""
        return self.delay_ms == 0 and any(p.records is None or p.records > 0 or (p.size_bytes or 0) > 0
                                          for p in self.partitions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic, "current_partitions": self.current, "target_partitions": self.target,
            "delay_ms": self.delay_ms, "delete_at_ms": self.delete_at_ms, "delete_at": format_ms(self.delete_at_ms),
            "records": self.records, "size_bytes": self.size_bytes, "keyed": self.keyed,
            "sampled_records": self.sampled_records, "warnings": list(self.warnings),
            "dry_run": self.dry_run, "applied": self.applied,
            "partitions": [p.to_dict() for p in self.partitions],
        }


# --- the wire request ------------------------------------------------------------------------


def _check_supported(client: Any, key: int) -> None:
    versions = client.request(18, 0, {})
    if not any(int(k.api_key) == key for k in versions.api_keys):
        raise KafkaApiError("UNSUPPORTED_VERSION",
                            "the cluster does not support DeletePartitions (KIP-694); it needs a kcli broker")


def delete_partitions(conn: Connection, topic: str, partitions: list[int], delay_ms: int, *,
                      validate_only: bool = False, address: str | None = None) -> list[PartitionPlan]:
    """Send one DeletePartitions request (to ``address``, default the first bootstrap broker);
    raise KafkaApiError for the first refusal."""
    import dataclasses

    from kcli.protocol.codec import build, request_class
    from kcli.protocol.errors import error_name
    from kcli.protocol.kcli_schemas import DELETE_PARTITIONS_KEY

    body = build(request_class(DELETE_PARTITIONS_KEY, 0), {
        "timeout_ms": int(conn.timeout_s * 1000), "delete_partitions_delay": delay_ms,
        "topics": [{"name": topic, "partitions": sorted(partitions)}]})
    body = dataclasses.replace(body, validate_only=validate_only)
    with wire_client(conn, address) as client:
        _check_supported(client, DELETE_PARTITIONS_KEY)
        resp = client.request(DELETE_PARTITIONS_KEY, 0, body)
    if resp.error_code:
        raise KafkaApiError(error_name(int(resp.error_code)), resp.error_message or "", int(resp.error_code))
    out = []
    for result in resp.responses:
        for p in result.partitions:
            if p.error_code:
                raise KafkaApiError(error_name(int(p.error_code)), p.error_message or "", int(p.error_code))
            out.append(PartitionPlan(int(p.partition_index), int(p.record_count) if p.record_count >= 0 else None,
                                     int(p.size_bytes) if p.size_bytes >= 0 else None, int(p.delete_at_ms),
                                     _MODE_CODES.get(int(p.status_code), str(p.status_code))))
    return out


@dataclass
class Routing:
    """Where the removed partitions live: each one's host (None: offline) and their addresses.

    In a cluster a classic partition's log, and so its record count and bytes, is on one broker
    (docs/cluster.md); a delete-now request is best sent to that broker, which deletes the
    partitions it holds at once (other hosts delete theirs in their next deletion round)."""

    hosts: dict[int, int | None]
    addresses: dict[int, str]  # node id → address, live brokers

    def primary(self, partitions: list[int]) -> str | None:
        """The address of the live broker hosting most of ``partitions`` (ties: lowest node id),
        else of any live broker (None: none listed)."""
        counts: dict[int, int] = {}
        for p in partitions:
            host = self.hosts.get(p)
            if host is not None and host in self.addresses:
                counts[host] = counts.get(host, 0) + 1
        if not counts:
            return self.addresses[min(self.addresses)] if self.addresses else None
        return self.addresses[min(counts, key=lambda n: (-counts[n], n))]


def route(conn: Connection, topic: str) -> Routing:
    from kcli.ops.brokers import cluster_view, partition_hosts

    view = cluster_view(conn)
    return Routing(partition_hosts(conn, topic), {b.node_id: view.address(b) for b in view.brokers})


def validate_on_hosts(conn: Connection, topic: str, partitions: list[int], delay_ms: int,
                      routing: Routing) -> list[PartitionPlan]:
    """A validate-only DeletePartitions to each host of ``partitions``, each partition's numbers
    taken from its own host's answer; an offline partition's are unknown (None)."""
    answers: dict[str | None, dict[int, PartitionPlan]] = {}
    wanted = {p: (routing.addresses.get(h) if h is not None else None) for p, h in routing.hosts.items()
              if p in partitions}
    for address in dict.fromkeys([a for a in wanted.values() if a is not None] or [routing.primary(partitions)]):
        answers[address] = {pp.partition: pp for pp in
                            delete_partitions(conn, topic, partitions, delay_ms, validate_only=True, address=address)}
    any_answer = next(iter(answers.values()))
    out = []
    for p in sorted(partitions):
        address = wanted.get(p)
        plan = answers[address][p] if address in answers else any_answer[p]
        if address is None:  # its host is down: nobody can tell
            plan = PartitionPlan(p, None, None, plan.delete_at_ms, plan.mode)
        out.append(plan)
    return out


# --- keyed records ---------------------------------------------------------------------------


def sample_keys(conn: Connection, topic: str, partitions: list[int],
                per_partition: int = KEY_SAMPLE_PER_PARTITION) -> tuple[bool | None, int]:
    """(any record has a key, records read) from the last ``per_partition`` records of each partition."""
    client = consumer(conn, **{"group.id": f"kcli-keys-{time.time_ns()}", "enable.auto.commit": False,
                               "enable.partition.eof": False})
    try:
        wanted: dict[int, int] = {}
        assignment = []
        for p in partitions:
            try:
                low, high = client.get_watermark_offsets(TopicPartition(topic, p), timeout=conn.timeout_s)
            except KafkaException:  # offline (in a cluster: its broker is down): nothing to sample
                client.errors.check()
                continue
            client.errors.fail_on_brokers_down = False  # reached the cluster: ride out outages
            if high > low:
                wanted[p] = high
                assignment.append(TopicPartition(topic, p, max(low, high - per_partition)))
        if not assignment:
            return None, 0
        client.assign(assignment)
        seen = 0
        deadline = time.monotonic() + min(conn.timeout_s, 10.0)
        while wanted and time.monotonic() < deadline:
            for msg in client.consume(500, 0.2):
                client.errors.check()
                if msg.error() is not None:
                    continue
                seen += 1
                if msg.key() is not None:
                    return True, seen
                if msg.offset() + 1 >= wanted.get(msg.partition(), 0):
                    wanted.pop(msg.partition(), None)
        return False, seen
    finally:
        client.close()


# --- operations ------------------------------------------------------------------------------


def removed_partitions(current: int, target: int) -> list[int]:
    return list(range(target, current))


def plan_shrink(conn: Connection, topic: str, current: int, target: int, delay_ms: int = 0) -> ShrinkPlan:
    """Validate on the broker (nothing changes) and sample for keys."""
    if target < 1:
        raise UsageError(f"--partitions must be at least 1, got {target}")
    if target >= current:
        raise UsageError(f"topic '{topic}' has {current} partitions; a shrink needs fewer than that")
    if delay_ms < 0:
        raise UsageError(f"--delete-partitions-delay must be >= 0 ms, got {delay_ms}")
    gone = removed_partitions(current, target)
    routing = route(conn, topic)
    parts = validate_on_hosts(conn, topic, gone, delay_ms, routing)
    plan = ShrinkPlan(topic, current, target, delay_ms, parts, routing=routing)
    offline = [p for p in gone if routing.hosts.get(p) is None]
    if offline:
        plan.warnings.append(OFFLINE_WARNING.format(partitions=",".join(map(str, offline)), topic=topic))
    plan.keyed, plan.sampled_records = sample_keys(conn, topic, list(range(current)))
    if plan.keyed:
        plan.warnings.append(KEYED_WARNING.format(topic=topic))
    return plan


def shrink_topic(conn: Connection, topic: str, target: int, delay_ms: int = 0, *, current: int | None = None,
                 dry_run: bool = False, assume_yes: bool = False,
                 confirm: Callable[[ShrinkPlan], bool] | None = None) -> ShrinkPlan:
    """Reduce ``topic`` to ``target`` partitions: plan, confirm if data would go right away, apply.

    ``confirm`` asks the operator (the CLI passes a terminal prompt); without it, deleting
    stored records with no delay needs ``assume_yes``."""
    if current is None:
        current = _partition_count(conn, topic)
    plan = prepare_shrink(conn, topic, current, target, delay_ms, dry_run=dry_run, assume_yes=assume_yes,
                          confirm=confirm)
    if not dry_run:
        apply_shrink(conn, plan)
    return plan


def _partition_count(conn: Connection, topic: str) -> int:
    """Partitions the broker lists for ``topic`` (the same count ``kcli topics describe`` shows)."""
    client = admin(conn)
    future = client.describe_topics(TopicCollection([topic]), request_timeout=conn.timeout_s)[topic]
    try:
        return len(client.wait(future, f"topic '{topic}'").partitions)
    except KafkaApiError as err:
        if err.name == "UNKNOWN_TOPIC_OR_PARTITION":
            raise KafkaApiError(err.name, f"topic '{topic}' does not exist") from None
        raise


def prepare_shrink(conn: Connection, topic: str, current: int, target: int, delay_ms: int, *, dry_run: bool,
                   assume_yes: bool, confirm: Callable[[ShrinkPlan], bool] | None) -> ShrinkPlan:
    """The plan, confirmed unless it is a dry run (raises when the operator says no)."""
    plan = plan_shrink(conn, topic, current, target, delay_ms)
    plan.dry_run = dry_run
    if dry_run or not plan.destroys_data or assume_yes:
        return plan
    if confirm is None:
        raise UsageError(f"deleting {_span(plan).lower()} of '{topic}' right away destroys "
                         f"{_destroyed(plan, str(plan.size_bytes) + ' bytes')}: pass --yes to confirm, or give "
                         "--delete-partitions-delay MS to keep them readable first")
    if not confirm(plan):
        raise OperationError("aborted: nothing was changed")
    return plan


def apply_shrink(conn: Connection, plan: ShrinkPlan) -> ShrinkPlan:
    gone = [p.partition for p in plan.partitions]
    address = plan.routing.primary(gone) if plan.routing is not None else None
    applied = delete_partitions(conn, plan.topic, gone, plan.delay_ms, address=address)
    sampled = {p.partition: p for p in plan.partitions}
    for p in applied:  # the broker's numbers at the moment of the change
        before = sampled.get(p.partition)
        if before is not None:
            p.records = p.records if p.records is not None else before.records
            p.size_bytes = p.size_bytes if p.size_bytes is not None else before.size_bytes
    plan.partitions = applied
    plan.applied = True
    return plan


# --- writing around ReadOnly partitions (kcli produce) ------------------------------------------


def writable_partition(modes: dict[int, PartitionMode], topic: str, partition: int) -> int:
    """``partition`` if records may be written there, else a KafkaApiError naming its mode."""
    mode = modes.get(partition)
    if mode is not None and mode.mode != READ_WRITE:
        when = format_ms(mode.delete_at_ms)
        raise KafkaApiError("PARTITION_READ_ONLY",
                            f"partition {partition} of '{topic}' is {mode.mode} (being deleted"
                            f"{' at ' + when if when else ''}); it takes no new records")
    return partition


class ReadWritePartitioner:
    """Picks ReadWrite partitions when a client's metadata still lists ReadOnly ones: keyed
    records by CRC32 of the key (librdkafka's ``consistent`` partitioner), others round robin."""

    def __init__(self, count: int, modes: dict[int, PartitionMode]) -> None:
        self.writable = [p for p in range(count) if p not in modes or modes[p].mode == READ_WRITE]
        self._next = 0

    def __call__(self, key: bytes | None) -> int:
        if key is not None:
            return self.writable[zlib.crc32(key) % len(self.writable)]
        p = self.writable[self._next % len(self.writable)]
        self._next += 1
        return p


# --- text for the CLI ------------------------------------------------------------------------


def _size(n: int | None) -> str:
    if n is None:
        return "? bytes"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def plan_lines(plan: ShrinkPlan) -> list[str]:
    """The plan as indented lines under ``topics alter``'s step line."""
    later = [p.partition for p in plan.partitions if p.mode == READ_ONLY]
    if plan.applied and plan.delay_ms == 0 and later:  # a cluster: hosted by other brokers
        when = (f"deleted now, except partition(s) {','.join(map(str, later))}: read-only until the broker "
                "hosting each deletes it (its next deletion round, delete.topic.partition.interval.delay.ms)")
    elif plan.applied and plan.delay_ms == 0:
        when = "deleted now"
    elif plan.applied:
        when = f"read-only until {format_ms(plan.delete_at_ms)}, then deleted"
    elif plan.delay_ms == 0:
        when = "would be deleted right away"
    else:
        when = f"would be read-only for {plan.delay_ms} ms (until about {format_ms(plan.delete_at_ms)}), then deleted"
    lines = [f"  {_span(plan)}: {when}"]
    for p in plan.partitions:
        records = "? records" if p.records is None else f"{p.records} records"
        where = ""  # in a cluster: the broker holding the partition
        if plan.routing is not None and len(plan.routing.addresses) > 1 and p.partition in plan.routing.hosts:
            host = plan.routing.hosts[p.partition]
            where = f" (broker {host})" if host is not None else " (offline: its broker is down)"
        lines.append(f"    Partition {p.partition}{where}: {records}, {_size(p.size_bytes)}")
    keyed = {True: "yes", False: "no", None: "unknown (no records)"}[plan.keyed]
    lines.append(f"  Keyed records: {keyed} (sampled {plan.sampled_records})")
    return lines


def _span(plan: ShrinkPlan) -> str:
    last = plan.current - 1
    return f"Partition {last}" if plan.target == last else f"Partitions {plan.target}..{last}"


def confirm_question(plan: ShrinkPlan) -> str:
    return (f"Delete {_span(plan).lower()} of '{plan.topic}' now, destroying "
            f"{_destroyed(plan, _size(plan.size_bytes))}?")


def _destroyed(plan: ShrinkPlan, size: str) -> str:
    """``N records (size)``, saying so when offline partitions may hold more."""
    unknown = f" and partition(s) {','.join(map(str, plan.unknown))} of unknown size" if plan.unknown else ""
    return f"{plan.records} records ({size}){unknown}"
