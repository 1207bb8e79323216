"""A dry run's model of the cluster, and what each runbook operation does to it.

``kcli runbook run --dry-run`` plans like ``terraform plan``: the live state is read once
(:func:`read_cluster`), then every step is applied in order to this in-memory
:class:`ClusterModel`, so a step is checked against the cluster *as the earlier steps would
leave it* (a topic created in step 1 exists for step 2). A step the model refuses raises
:class:`WouldFail` with Kafka's error name, the way the broker would answer; the plan goes on
with the model unchanged by that step. Nothing here writes to the cluster.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

from kcli.config.definitions import (DISKLESS_SYSTEM_DISABLED, TIERED_SYSTEM_DISABLED, TOPIC_CONFIGS, ConfigError,
                                    format_value, normalise_topic_configs)
from kcli.errors import KcliError
from kcli.ops.connection import Connection

Args = dict[str, Any]

# what a broker answers, by Kafka's error names (kcli/protocol/errors.py holds the codes)
UNKNOWN_TOPIC = "UNKNOWN_TOPIC_OR_PARTITION"
ALREADY_EXISTS = "TOPIC_ALREADY_EXISTS"
INVALID_CONFIG = "INVALID_CONFIG"
INVALID_PARTITIONS = "INVALID_PARTITIONS"
INVALID_REPLICATION_FACTOR = "INVALID_REPLICATION_FACTOR"
INVALID_REQUEST = "INVALID_REQUEST"
POLICY_VIOLATION = "POLICY_VIOLATION"
UNDER_CHANGES = "TOPIC_UNDER_CHANGES"
INVALID_TOPIC = "INVALID_TOPIC_EXCEPTION"

# broker configs a plan consults (absent: the check is left to the real run)
BROKER_FACTS = ("num.partitions", "remote.log.storage.system.enable", "diskless.system.enable",
                "delete.topic.partition.enable", "log.cleanup.policy")


class WouldFail(Exception):
    """The step would fail: ``error`` is Kafka's error name (None for a kcli-side refusal)."""

    def __init__(self, error: str | None, reason: str) -> None:
        self.error = error
        self.reason = reason
        super().__init__(f"{error}: {reason}" if error else reason)


@dataclass
class TopicModel:
    name: str
    partitions: int  # every partition, ReadOnly ones included
    writable: int  # ReadWrite partitions (KIP-694: the rest await deletion)
    configs: dict[str, str | None]  # effective values, kcli.* state included
    overrides: set[str] = field(default_factory=set)  # set on the topic itself
    pending_until_s: float | None = None  # model clock when the ReadOnly partitions are gone
    with_records: set[int] = field(default_factory=set)  # partitions that (may) hold records
    internal: bool = False

    @property
    def diskless(self) -> bool:
        return self.configs.get("diskless.enable") == "true"

    @property
    def tiered(self) -> bool:
        return self.configs.get("remote.storage.enable") == "true"

    @property
    def kind(self) -> str:
        return "diskless" if self.diskless else "tiered" if self.tiered else "classic"


@dataclass
class ClusterModel:
    topics: dict[str, TopicModel]
    broker: dict[str, str | None]  # BROKER_FACTS as the cluster reports them
    brokers: int = 1  # live brokers
    clock_s: float = 0.0  # plan time: sleep steps advance it (KIP-694 delays pass)

    def topic(self, name: str) -> TopicModel:
        self.expire()
        t = self.topics.get(name)
        if t is None:
            raise WouldFail(UNKNOWN_TOPIC, f"topic '{name}' does not exist")
        return t

    def expire(self) -> None:
        """Partitions whose deletion delay has passed on the plan clock are gone."""
        for t in self.topics.values():
            if t.pending_until_s is not None and t.pending_until_s <= self.clock_s:
                t.partitions, t.pending_until_s = t.writable, None
                t.with_records = {p for p in t.with_records if p < t.writable}

    def flag(self, name: str) -> bool | None:
        value = self.broker.get(name)
        return None if value is None else value.strip().lower() == "true"


@dataclass
class Planned:
    """One step of the plan: what it would do, for the STEP/ACTION/RESOURCE/CHANGE columns."""

    action: str  # create, change, delete, write, read, wait, none
    resource: str  # "topic orders", "cluster"
    change: str
    notes: list[str] = field(default_factory=list)
    simulated: bool = True  # False: the model cannot tell what the step would find

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "resource": self.resource, "change": self.change, "notes": self.notes,
                "simulated": self.simulated}


Simulator = Callable[[ClusterModel, Args], Planned]


# --- reading the live cluster once ---------------------------------------------------------


def _broker_facts(conn: Connection) -> tuple[dict[str, str | None], int]:
    from confluent_kafka.admin import ConfigResource, ResourceType

    from kcli.ops.connection import admin

    client = admin(conn)
    brokers = client.list_topics(timeout=conn.timeout_s).brokers
    if not brokers:
        return {}, 0
    resource = ConfigResource(ResourceType.BROKER, str(min(brokers)))
    try:
        entries = client.wait(client.describe_configs([resource], request_timeout=conn.timeout_s)[resource],
                              "broker configs")
    except KcliError:
        return {}, len(brokers)  # e.g. no DESCRIBE_CONFIGS: broker-side rules are left to the real run
    return {k: entries[k].value for k in BROKER_FACTS if k in entries}, len(brokers)


def read_cluster(conn: Connection, names: set[str]) -> ClusterModel:
    """The live state the steps need: every topic's name, and for the topics the steps name
    their partitions (and modes), configs, tiered state and which partitions hold records."""
    from kcli.ops import topics as t

    broker, count = _broker_facts(conn)
    existing = {x.topic: x for x in t.list_topics(conn)}
    now_ms = time.time() * 1000
    model = ClusterModel({}, broker, count)
    wanted = sorted(n for n in names if n in existing)
    described = {d.topic: d for d in t.describe_topics(conn, wanted)} if wanted else {}
    for name, listing in existing.items():
        d = described.get(name)
        if d is None:  # not named by any step: only its existence matters
            model.topics[name] = TopicModel(name, 0, 0, {}, internal=listing.internal)
            continue
        pending = [p.delete_at_ms for p in d.partitions if p.mode != "ReadWrite"]
        configs = dict(d.all_configs)
        model.topics[name] = TopicModel(
            name, d.partition_count, d.partition_count - len(pending), configs, set(d.configs),
            pending_until_s=max(0.0, (max(x or 0 for x in pending) - now_ms) / 1000) if pending else None,
            with_records={p.partition for p in d.partitions
                          if (p.log_end_offset or 0) > (p.log_start_offset or 0)},
            internal=d.internal)
    return model


# --- shared checks -------------------------------------------------------------------------


def _topic_name(name: str) -> None:
    from kcli.ops.topics import validate_topic_name

    try:
        validate_topic_name(name)
    except KcliError as err:
        raise WouldFail(INVALID_TOPIC, str(err)) from None


def check_configs(model: ClusterModel, configs: dict[str, str | None], topic: TopicModel | None) -> dict[str, str]:
    """Parse configs with the broker's parser (kcli/config/definitions.py) and apply its cross-config
    rules; ``topic`` None means creating. Returns the normalised values."""
    try:
        out = normalise_topic_configs(configs)
    except ConfigError as err:
        raise WouldFail(INVALID_CONFIG, str(err)) from None
    if topic is not None and "diskless.enable" in out:
        raise WouldFail(INVALID_CONFIG, "diskless.enable can only be set when a topic is created")
    diskless = out.get("diskless.enable") == "true" if topic is None else topic.diskless
    if diskless and model.flag("diskless.system.enable") is False:  # creating or altering, as the broker
        raise WouldFail(INVALID_CONFIG, DISKLESS_SYSTEM_DISABLED)
    # a diskless topic may tier too, as the broker accepts it (docs/diskless-tiering.md)
    if out.get("remote.storage.enable") == "true" and model.flag("remote.log.storage.system.enable") is False:
        raise WouldFail(INVALID_CONFIG, TIERED_SYSTEM_DISABLED)
    old = topic.configs if topic is not None else {}
    policy = out.get("cleanup.policy", old.get("cleanup.policy") or model.broker.get("log.cleanup.policy") or "")
    if "compact" in (policy or "").split(",") and out.get("remote.storage.enable",
                                                          old.get("remote.storage.enable")) == "true":
        raise WouldFail(INVALID_CONFIG, "Remote log storage is unsupported for the compacted topics")
    return out


def _defaults() -> dict[str, str | None]:
    return {name: format_value(d, d.default) for name, d in TOPIC_CONFIGS.items()}


def _set_configs(t: TopicModel, sets: dict[str, str], deletes: list[str]) -> None:
    defaults = _defaults()
    for k in deletes:
        t.configs[k] = defaults.get(k)
        t.overrides.discard(k)
    for k, v in sets.items():
        t.configs[k] = v
        t.overrides.add(k)
    was = t.configs.get("kcli.tiered.state")
    if t.tiered and was != "ENABLED":
        epoch = int(t.configs.get("kcli.tiered.epoch") or 0)
        t.configs["kcli.tiered.epoch"] = str(epoch + 1 if was not in (None, "NONE") else epoch)
        t.configs["kcli.tiered.state"] = "ENABLED"
    elif not t.tiered and was in ("ENABLED", "DISABLING"):
        t.configs["kcli.tiered.state"] = "DISABLED"  # the broker gets there asynchronously


def _pairs(sets: dict[str, str], deletes: list[str]) -> str:
    return ",".join([f"{k}={v}" for k, v in sets.items()] + [f"-{k}" for k in deletes])


def _under_changes(t: TopicModel) -> None:
    if t.pending_until_s is not None:
        raise WouldFail(UNDER_CHANGES, f"partitions {t.writable}..{t.partitions - 1} of '{t.name}' are read-only "
                                       "until their deletion delay passes")
    if t.configs.get("kcli.tiered.state") == "DISABLING":
        raise WouldFail(UNDER_CHANGES, f"tiered storage of '{t.name}' is being disabled")


# --- the operations ------------------------------------------------------------------------


def create(model: ClusterModel, a: Args) -> Planned:
    name = a["topic"]
    _topic_name(name)
    model.expire()
    if name in model.topics:
        if a.get("if_not_exists"):
            return Planned("none", f"topic {name}", "exists already (if_not_exists)")
        raise WouldFail(ALREADY_EXISTS, f"Topic '{name}' already exists.")
    configs: dict[str, str | None] = dict(a.get("configs") or {})
    if a.get("diskless"):
        configs["diskless.enable"] = "true"
    clean = check_configs(model, configs, None)
    partitions = a.get("partitions")
    if partitions is None:
        partitions = int(model.broker.get("num.partitions") or 1)
    rf = a.get("replication_factor") or 1
    if model.brokers and rf > model.brokers:
        raise WouldFail(INVALID_REPLICATION_FACTOR, f"Unable to replicate the partition {rf} time(s): "
                                                    f"The target replication factor of {rf} cannot be reached "
                                                    f"because only {model.brokers} broker(s) are registered.")
    if rf > 1 and clean.get("diskless.enable") != "true":
        raise WouldFail(INVALID_REPLICATION_FACTOR, "kcli's brokers do not replicate classic topics: "
                                                    "use replication_factor 1 (diskless topics may use more)")
    t = TopicModel(name, partitions, partitions, _defaults())
    _set_configs(t, clean, [])
    model.topics[name] = t
    extra = f", {_pairs(clean, [])}" if clean else ""
    return Planned("create", f"topic {name}", f"{t.kind}, {partitions} partition(s), rf {rf}{extra}")


def delete(model: ClusterModel, a: Args) -> Planned:
    name = a["topic"]
    _topic_name(name)
    model.expire()
    if name not in model.topics:
        if a.get("if_exists"):
            return Planned("none", f"topic {name}", "absent already (if_exists)")
        raise WouldFail(UNKNOWN_TOPIC, f"topic '{name}' does not exist")
    t = model.topics.pop(name)
    return Planned("delete", f"topic {name}", f"{t.partitions} partition(s) and their records" if t.partitions
                   else "the topic and its records")


def _tiering(model: ClusterModel, t: TopicModel, a: Args) -> Planned:
    from kcli.ops import tiering

    values = dict(t.configs)
    entries = {k: SimpleNamespace(value=v, is_default=k not in t.overrides) for k, v in values.items()}
    try:
        status = tiering.status_from_configs(t.name, entries)
        change = (tiering.plan_disable(status, a.get("policy")) if a.get("disable_tiering")
                  else tiering.plan_enable(status))
    except KcliError as err:
        raise WouldFail(getattr(err, "name", None), str(err)) from None
    if not change.changes:
        return Planned("none", f"topic {t.name}", change.effect)
    if a.get("enable_tiering"):
        check_configs(model, dict(change.set_configs), t)  # e.g. a diskless topic refuses tiering
    _set_configs(t, change.set_configs, change.delete_configs)
    verb = "disable tiering" if a.get("disable_tiering") else "enable tiering"
    return Planned("change", f"topic {t.name}", f"{verb}: {_pairs(change.set_configs, change.delete_configs)}",
                   [change.effect])


def alter(model: ClusterModel, a: Args) -> Planned:
    name = a["topic"]
    _topic_name(name)
    t = model.topic(name)
    if a.get("disable_tiering") or a.get("enable_tiering"):
        return _tiering(model, t, a)
    sets = check_configs(model, dict(a.get("configs") or {}), t)
    deletes = list(a.get("delete_configs") or [])
    for k in deletes:
        if k not in TOPIC_CONFIGS:
            raise WouldFail(INVALID_CONFIG, f"Unknown topic config name: {k}")
    changes: list[str] = []
    notes: list[str] = []
    target = a.get("partitions")
    delay = a.get("delete_partitions_delay")
    if target is not None and target > t.partitions:
        _under_changes(t)
        changes.append(f"partitions {t.partitions} -> {target}")
    elif target is not None and target < t.partitions and not (t.pending_until_s is not None
                                                                and target == t.writable):
        _under_changes(t)
        if t.internal:
            raise WouldFail(INVALID_REQUEST, f"Partitions of the internal topic '{name}' cannot be deleted.")
        if model.flag("delete.topic.partition.enable") is False:
            raise WouldFail(POLICY_VIOLATION, "Reducing partitions is disabled on this broker: set "
                                              "delete.topic.partition.enable=true to enable it")
        doomed = sorted(p for p in t.with_records if p >= target)
        if doomed and not delay and not a.get("yes"):
            raise WouldFail(None, f"deleting partitions {target}..{t.partitions - 1} of '{name}' right away "
                                  f"destroys the records in partition(s) {doomed}: add yes: true, or a "
                                  "delete_partitions_delay to keep them readable first")
        changes.append(f"partitions {t.partitions} -> {target} (KIP-694"
                       + (f", read-only for {delay:g}s)" if delay else ", deleted now)"))
        if doomed:
            notes.append(f"partition(s) {doomed} hold records that are deleted")
    elif delay is not None:
        raise WouldFail(None, f"delete_partitions_delay applies only when partitions is below the current count "
                              f"({t.partitions})")
    if sets or deletes:
        changes.insert(0, _pairs(sets, deletes))
    if not changes:
        return Planned("none", f"topic {name}", "already as asked")
    _set_configs(t, sets, [k for k in deletes])
    if target is not None and target > t.partitions:
        t.partitions = t.writable = target
    elif target is not None and target < t.partitions:
        t.writable = target
        if delay:
            t.pending_until_s = model.clock_s + delay
        else:
            t.partitions = target
            t.with_records = {p for p in t.with_records if p < target}
    return Planned("change", f"topic {name}", "; ".join(changes), notes)


def _partition(t: TopicModel, a: Args, count: int) -> None:
    p = a.get("partition")
    if p is not None and p >= count:
        raise WouldFail(UNKNOWN_TOPIC, f"topic '{t.name}' has {count} partitions; partition {p} does not exist")


def produce(model: ClusterModel, a: Args) -> Planned:
    t = model.topic(a["topic"])
    _partition(t, a, t.writable)
    n = len(a["records"]) if a.get("records") is not None else a["count"]
    where = f"partition {a['partition']}" if a.get("partition") is not None else "any partition"
    t.with_records |= {a["partition"]} if a.get("partition") is not None else set(range(t.writable))
    return Planned("write", f"topic {t.name}", f"{n} record(s) to {where}")


def consume(model: ClusterModel, a: Args) -> Planned:
    t = model.topic(a["topic"])
    _partition(t, a, t.partitions)
    group = f" as group {a['group']} (commits offsets)" if a.get("group") else ""
    return Planned("read", f"topic {t.name}", f"records{group}", simulated=False,
                   notes=["what it reads depends on the records: not simulated"])


def describe(model: ClusterModel, a: Args) -> Planned:
    names = [a["topic"]] if a.get("topic") else list(a.get("topics") or [])
    for name in names:
        model.topic(name)
    what = ", ".join(f"topic {n}" for n in names) or "every topic"
    return Planned("read", what, "describe")


def list_topics(model: ClusterModel, a: Args) -> Planned:
    return Planned("read", "cluster", "list topics")


def diskless_describe(model: ClusterModel, a: Args) -> Planned:
    names = [a["topic"]] if a.get("topic") else list(a.get("topics") or [])
    for name in names:
        t = model.topic(name)
        if a.get("topic") and not t.diskless and t.configs:
            raise WouldFail(None, f"topic '{name}' is not a diskless topic")
    return Planned("read", ", ".join(f"topic {n}" for n in names) or "diskless topics", "describe diskless storage")


def diskless_objects(model: ClusterModel, a: Args) -> Planned:
    return Planned("read", "cluster", "list WAL objects", simulated=False,
                   notes=["the objects depend on the object store: not simulated"])


def diskless_verify(model: ClusterModel, a: Args) -> Planned:
    return Planned("read", "cluster", "verify WAL objects", simulated=False,
                   notes=["damage can only be found by reading the object store: not simulated"])


def diskless_gc(model: ClusterModel, a: Args) -> Planned:
    mode = "dry run" if a.get("dry_run") else "delete garbage"
    return Planned("none", "cluster", f"diskless gc ({mode})",
                   ["gc deletes only garbage: topics and configs stay as they are (the live gc dry run below "
                    "lists what it would delete now)"])


def sleep(model: ClusterModel, a: Args) -> Planned:
    model.clock_s += a["duration"]
    model.expire()
    return Planned("wait", "-", f"{a['duration']:g}s")


def topic_names(a: Args) -> list[str]:
    """The topics a step touches: resources for dependencies, and what read_cluster describes."""
    names = [a["topic"]] if isinstance(a.get("topic"), str) else []
    return names + [n for n in a.get("topics") or [] if isinstance(n, str)]
