"""Turn tiered storage off and on for a topic (KIP-950), against kcli's broker or Apache Kafka 3.9+.

Two cluster dialects exist for the same operation, told apart with DescribeConfigs:

* ``kip950`` (kcli's broker): ``remote.storage.enable=false`` plus
  ``remote.log.disable.policy=retain|delete``; the broker reports the topic's tiered state and
  epoch and its remote segment count/bytes as read-only ``kcli.tiered.*`` entries.
* ``kafka39`` (Apache Kafka 3.9+, which shipped KIP-950 as two configs): retain means
  ``remote.log.copy.disable=true`` (remote data stays readable; local retention is set to follow
  the total, as Kafka requires), delete means ``remote.storage.enable=false`` with
  ``remote.log.delete.on.disable=true``.

Every change is one IncrementalAlterConfigs request; a dry run sends it with validate_only, so
the cluster checks it (unknown policy, disablement already in progress) and nothing changes.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from kcli.errors import KafkaApiError, OperationError, UsageError
from kcli.ops.connection import Connection, admin
from kcli.ops.topics import validate_topic_name

REMOTE_STORAGE_ENABLE = "remote.storage.enable"
DISABLE_POLICY = "remote.log.disable.policy"
COPY_DISABLE = "remote.log.copy.disable"
DELETE_ON_DISABLE = "remote.log.delete.on.disable"
POLICIES = ("retain", "delete")
STATE_KEY = "kcli.tiered.state"
EPOCH_KEY = "kcli.tiered.epoch"
SEGMENTS_KEY = "kcli.tiered.remote.segments"
BYTES_KEY = "kcli.tiered.remote.bytes"

KIP950 = "kip950"
KAFKA39 = "kafka39"


def _true(value: str | None) -> bool:
    return str(value or "").strip().lower() == "true"


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


@dataclass
class TieringStatus:
    """A topic's tiering as DescribeConfigs reports it (None: the cluster does not say)."""

    topic: str
    dialect: str
    remote_storage_enable: bool
    copy_disabled: bool
    delete_on_disable: bool
    policy: str | None
    tiered_state: str | None
    tiered_epoch: int | None
    remote_segments: int | None
    remote_bytes: int | None
    configs: dict[str, str | None] = field(default_factory=dict, repr=False)
    overrides: set[str] = field(default_factory=set, repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("configs")
        d.pop("overrides")
        return d


@dataclass
class TieringChange:
    """What ``--disable-tiering`` / ``--enable-tiering`` does (or, with dry_run, would do)."""

    topic: str
    action: str  # "disable" | "enable"
    policy: str | None
    dialect: str
    set_configs: dict[str, str]
    delete_configs: list[str]
    effect: str
    remote_segments: int | None
    remote_bytes: int | None
    dry_run: bool = False
    done: bool = False
    tiered_state: str | None = None
    tiered_epoch: int | None = None

    @property
    def changes(self) -> bool:
        return bool(self.set_configs or self.delete_configs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def detect_dialect(configs: dict[str, Any]) -> str:
    """``kip950`` if the topic knows remote.log.disable.policy, ``kafka39`` if it knows Kafka
    3.9's remote.log.copy.disable / remote.log.delete.on.disable; else the cluster cannot."""
    if REMOTE_STORAGE_ENABLE not in configs:
        raise OperationError("the cluster does not support tiered storage (topic has no remote.storage.enable)")
    if DISABLE_POLICY in configs:
        return KIP950
    if COPY_DISABLE in configs or DELETE_ON_DISABLE in configs:
        return KAFKA39
    raise OperationError("the cluster cannot disable tiered storage per topic: it knows neither "
                         f"{DISABLE_POLICY} (KIP-950) nor {COPY_DISABLE}/{DELETE_ON_DISABLE} (Kafka 3.9+)")


def status_from_configs(topic: str, entries: dict[str, Any], dialect: str | None = None) -> TieringStatus:
    """Build a status from DescribeConfigs entries (name → ConfigEntry-like with .value and
    .is_default, or plain values)."""
    values = {k: getattr(e, "value", e) for k, e in entries.items()}
    overrides = {k for k, e in entries.items() if not getattr(e, "is_default", False)}
    return TieringStatus(
        topic=topic,
        dialect=dialect or detect_dialect(values),
        remote_storage_enable=_true(values.get(REMOTE_STORAGE_ENABLE)),
        copy_disabled=_true(values.get(COPY_DISABLE)),
        delete_on_disable=_true(values.get(DELETE_ON_DISABLE)),
        policy=values.get(DISABLE_POLICY),
        tiered_state=values.get(STATE_KEY),
        tiered_epoch=_int(values.get(EPOCH_KEY)),
        remote_segments=_int(values.get(SEGMENTS_KEY)),
        remote_bytes=_int(values.get(BYTES_KEY)),
        configs=values,
        overrides=overrides,
    )


def tiering_status(conn: Connection, topic: str, dialect: str | None = None) -> TieringStatus:
    validate_topic_name(topic)
    client = admin(conn)
    futures = client.describe_configs([ConfigResource(ResourceType.TOPIC, topic)], request_timeout=conn.timeout_s)
    entries: dict[str, Any] = {}
    for fut in futures.values():
        try:
            entries = client.wait(fut, f"topic '{topic}'")
        except KafkaApiError as err:
            if err.name == "UNKNOWN_TOPIC_OR_PARTITION":
                raise KafkaApiError(err.name, f"topic '{topic}' does not exist") from None
            raise
    return status_from_configs(topic, entries, dialect)


def _remote_text(status: TieringStatus) -> str:
    if status.remote_segments is None:
        return "its remote segments (the cluster does not report how many)"
    return f"{status.remote_segments} remote segment(s), {status.remote_bytes or 0} bytes"


def plan_disable(status: TieringStatus, policy: str | None) -> TieringChange:
    """The config changes that disable tiering on ``status.topic`` with ``policy``."""
    chosen = policy if policy is not None else "retain"
    sets: dict[str, str] = {}
    deletes: list[str] = []
    change = TieringChange(status.topic, "disable", chosen, status.dialect, sets, deletes, "",
                           status.remote_segments, status.remote_bytes)
    if status.dialect == KAFKA39:
        if chosen not in POLICIES:
            raise UsageError(f"--policy must be one of {', '.join(POLICIES)}, got {chosen!r}")
        if chosen == "delete":
            if status.remote_storage_enable:
                sets.update({REMOTE_STORAGE_ENABLE: "false", DELETE_ON_DISABLE: "true"})
        elif status.remote_storage_enable and not status.copy_disabled:
            sets[COPY_DISABLE] = "true"
            # Kafka 3.9 requires local retention to follow the total once copying stops.
            for local, total in (("local.retention.ms", "retention.ms"), ("local.retention.bytes", "retention.bytes")):
                if status.configs.get(local) not in ("-2", status.configs.get(total)):
                    sets[local] = "-2"
    else:
        if status.tiered_state == "DISABLING" or status.remote_storage_enable:
            # While DISABLING the broker answers TIERED_STORAGE_DISABLEMENT_IN_PROGRESS: send it.
            sets.update({REMOTE_STORAGE_ENABLE: "false", DISABLE_POLICY: chosen})
            if chosen == "retain" and status.delete_on_disable and DELETE_ON_DISABLE in status.overrides:
                deletes.append(DELETE_ON_DISABLE)  # it would mean delete to a Kafka 3.9 reader
    if not change.changes:
        state = f" (tiered state {status.tiered_state})" if status.tiered_state else ""
        change.effect = f"tiering is already off on topic {status.topic}{state}; nothing to do"
    elif chosen == "delete":
        change.effect = (f"copying stops; {_remote_text(status)} will be deleted and the log start offset moves "
                         "to the local log start offset")
    else:
        change.effect = (f"copying stops; {_remote_text(status)} stay readable and expire by "
                         "retention.ms/retention.bytes")
    return change


def plan_enable(status: TieringStatus) -> TieringChange:
    """The config changes that turn tiering back on (KIP-950: no policy; a new tiered epoch)."""
    sets: dict[str, str] = {}
    deletes: list[str] = []
    if not status.remote_storage_enable:
        sets[REMOTE_STORAGE_ENABLE] = "true"
    if status.copy_disabled:
        sets[COPY_DISABLE] = "false"
    if status.dialect == KIP950 and status.tiered_state == "DISABLING":
        sets[REMOTE_STORAGE_ENABLE] = "true"  # the broker answers TIERED_STORAGE_DISABLEMENT_IN_PROGRESS
    if sets and status.dialect == KIP950 and DISABLE_POLICY in status.overrides:
        deletes.append(DISABLE_POLICY)  # a stale policy must not steer the next disablement
    change = TieringChange(status.topic, "enable", None, status.dialect, sets, deletes, "",
                           status.remote_segments, status.remote_bytes)
    if not change.changes:
        change.effect = f"tiering is already on for topic {status.topic}; nothing to do"
    else:
        epoch = f" (tiered epoch {status.tiered_epoch} -> {status.tiered_epoch + 1})" if status.tiered_epoch is not None \
            and status.tiered_state not in (None, "NONE") else ""
        change.effect = f"copying to remote storage resumes from the local segments{epoch}"
    return change


def _apply(conn: Connection, change: TieringChange) -> None:
    client = admin(conn)
    ops = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in change.set_configs.items()]
    ops += [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in change.delete_configs]
    resource = ConfigResource(ResourceType.TOPIC, change.topic, incremental_configs=ops)
    futures = client.incremental_alter_configs([resource], request_timeout=conn.timeout_s,
                                               validate_only=change.dry_run)
    for fut in futures.values():
        client.wait(fut, f"topic '{change.topic}'")


def _run(conn: Connection, change: TieringChange) -> TieringChange:
    if change.changes:
        _apply(conn, change)
        change.done = not change.dry_run
    if change.done:
        after = tiering_status(conn, change.topic, change.dialect)
        change.tiered_state, change.tiered_epoch = after.tiered_state, after.tiered_epoch
    return change


def disable_tiering(conn: Connection, topic: str, policy: str | None = None, *, dry_run: bool = False,
                    dialect: str | None = None) -> TieringChange:
    """Disable tiering on ``topic`` (policy retain by default); returns what was (or would be) done.
    The disablement finishes asynchronously: see :func:`wait_for_state`."""
    status = tiering_status(conn, topic, dialect)
    change = plan_disable(status, policy)
    change.dry_run = dry_run
    return _run(conn, change)


def enable_tiering(conn: Connection, topic: str, *, dry_run: bool = False, dialect: str | None = None) -> TieringChange:
    status = tiering_status(conn, topic, dialect)
    change = plan_enable(status)
    change.dry_run = dry_run
    return _run(conn, change)


def wait_for_state(conn: Connection, topic: str, state: str, timeout_s: float = 60.0,
                   poll_s: float = 0.2) -> TieringStatus:
    """Poll DescribeConfigs until the topic's tiered state is ``state`` (kcli's broker only)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = tiering_status(conn, topic)
        if status.tiered_state == state:
            return status
        if status.tiered_state is None and status.dialect != KIP950:
            raise OperationError(f"the cluster does not report the tiered state of topic '{topic}'")
        if time.monotonic() > deadline:
            now = status.tiered_state or "without a tiered state (never tiered)"
            raise OperationError(f"topic '{topic}' is still {now} after {timeout_s:.0f}s (waiting for {state})")
        time.sleep(poll_s)
