"""Replication throttles around a reassignment, as Kafka's ReassignPartitionsCommand sets and
clears them: the topic configs ``leader.replication.throttled.replicas`` (each moving partition's
current replicas) and ``follower.replication.throttled.replicas`` (the replicas being added), and
the broker configs ``leader/follower.replication.throttled.rate`` on every broker involved. Kept
apart from kcli.ops.replicas because only the throttled paths need DescribeConfigs/AlterConfigs."""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka.admin import ConfigResource, ResourceType

from kcli.errors import KcliError, UsageError
from kcli.ops.configs import alter_configs, describe_configs
from kcli.ops.connection import Connection, admin
from kcli.ops.topics import _source_name

LEADER_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_REPLICAS = "follower.replication.throttled.replicas"
LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
TOPIC_CONFIGS = (LEADER_REPLICAS, FOLLOWER_REPLICAS)
BROKER_CONFIGS = (LEADER_RATE, FOLLOWER_RATE)

Assignment = dict[tuple[str, int], list[int]]


def check_throttle(throttle: int | None) -> None:
    """A throttle is a positive byte rate (UsageError otherwise)."""
    if throttle is not None and throttle <= 0:
        raise UsageError(f"--throttle must be a positive number of bytes/s, got {throttle}")


def _merge(existing: str | None, entries: list[str]) -> str | None:
    """``existing`` (a ``p:b`` list or ``*``) with ``entries`` added; None when nothing changes."""
    old = [e.strip() for e in (existing or "").split(",") if e.strip()]
    if "*" in old:
        return None
    merged = old + [e for e in entries if e not in old]
    return ",".join(merged) if merged != old else None


def topic_throttles(current: Assignment, targets: Assignment) -> dict[str, tuple[list[str], list[str]]]:
    """Per topic: (leader entries, follower entries) — calculateLeaderThrottles /
    calculateFollowerThrottles: the current replicas throttled as leaders, the added ones as followers."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    for (topic, p), target in sorted(targets.items()):
        cur = current.get((topic, p), [])
        leaders, followers = out.setdefault(topic, ([], []))
        leaders += [f"{p}:{b}" for b in cur if f"{p}:{b}" not in leaders]
        followers += [f"{p}:{b}" for b in target if b not in cur and f"{p}:{b}" not in followers]
    return out


def involved_brokers(current: Assignment, targets: Assignment) -> list[int]:
    """Every old and new replica of the moving partitions (calculateReassigningBrokers)."""
    return sorted({b for k, t in targets.items() for b in [*current.get(k, []), *t]})


def set_rates(conn: Connection, brokers: list[int], throttle: int) -> None:
    for b in brokers:
        alter_configs(conn, "broker", str(b), {LEADER_RATE: str(throttle), FOLLOWER_RATE: str(throttle)}, [])


def apply(conn: Connection, current: Assignment, targets: Assignment, throttle: int, *,
          rates_only: bool = False) -> list[int]:
    """Set the topic throttles (merged with each topic's own values) unless ``rates_only``, then
    the rates on the brokers involved; returns those brokers."""
    if not rates_only:
        for topic, (leaders, followers) in topic_throttles(current, targets).items():
            own = {c.name: c.value for c in describe_configs(conn, "topic", topic, dynamic_only=True)}
            sets = {}
            for name, entries in ((LEADER_REPLICAS, leaders), (FOLLOWER_REPLICAS, followers)):
                value = _merge(own.get(name), entries)
                if value is not None:
                    sets[name] = value
            if sets:
                alter_configs(conn, "topic", topic, sets, [])
    brokers = involved_brokers(current, targets)
    set_rates(conn, brokers, throttle)
    return brokers


CLEAR_TIMEOUT_S = 3.0  # per broker: a paused or dying broker must not hold a cancel for long


@dataclass
class Cleared:
    """What clearAllThrottles did: anything removed, and the brokers that did not answer (their
    rates, if any, are left; the caller warns)."""

    removed: bool = False
    unreachable: dict[int, str] = field(default_factory=dict)  # broker id -> error


def _broker_rates(conn: Connection, brokers: list[int]) -> tuple[dict[int, list[str]], dict[int, str]]:
    """The throttle rates set on each broker, and the brokers that did not answer."""
    client = admin(conn)
    timeout = min(conn.timeout_s, CLEAR_TIMEOUT_S)
    resources = {b: ConfigResource(ResourceType.BROKER, str(b)) for b in brokers}
    # librdkafka takes one BROKER resource per call: one call each, all in flight together
    futures = {res: client.describe_configs([res], request_timeout=timeout)[res] for res in resources.values()}
    found: dict[int, list[str]] = {}
    failed: dict[int, str] = {}
    for b, res in resources.items():
        try:
            entries = client.wait(futures[res], f"broker '{b}'", timeout_s=timeout)
        except KcliError as err:
            failed[b] = str(err)
            continue
        found[b] = [k for k in BROKER_CONFIGS if k in entries and _source_name(entries[k].source) == "DYNAMIC_BROKER_CONFIG"]
    return found, failed


def clear(conn: Connection, topics: list[str], brokers: list[int]) -> Cleared:
    """clearAllThrottles: delete the two replica lists on ``topics`` and the two rates on
    ``brokers``, where set. A broker that does not answer is reported, not an error: the
    reassignment's own outcome (a cancel, a completed move) stands."""
    out = Cleared()
    for topic in sorted(set(topics)):
        own = {c.name for c in describe_configs(conn, "topic", topic, dynamic_only=True)}
        gone = [k for k in TOPIC_CONFIGS if k in own]
        if gone:
            alter_configs(conn, "topic", topic, {}, gone)
            out.removed = True
    found, out.unreachable = _broker_rates(conn, brokers)
    for b, gone in sorted(found.items()):
        if not gone:
            continue
        try:
            alter_configs(conn, "broker", str(b), {}, gone)
            out.removed = True
        except KcliError as err:
            out.unreachable[b] = str(err)
    return out
