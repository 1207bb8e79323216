"""KIP-950: turning tiered storage off (and on again) per topic, as a durable state machine.

States live in the cluster metadata (TopicTieredStateRecord: tieredEpoch, tieredState)::

    NONE --enable--> ENABLED(e) --disable--> DISABLING(e+1) --remote work done--> DISABLED(e+1)
                                                                               --enable--> ENABLED(e+2)

The controller's part (here: the broker's alter path) writes the ConfigRecords and the
DISABLING record in one fsynced append, so a crash never leaves one without the other. The
broker's part is :class:`Disabler`: stop copying (Kafka's stopPartitions), and with policy
``delete`` move the log start offset to the local log start and delete the remote segments;
with ``retain`` the remote segments stay readable and expire by retention.ms/bytes. Then it
writes DISABLED. A topic found DISABLING at start-up (the broker died mid-way) is disabled
again from the top: every step is idempotent.

In a cluster every broker does this part for the partitions it hosts and marks each one done for
the tiered epoch in the shared remote log metadata; the controller writes DISABLED once every
partition is marked, whichever host finished last (one broker: all of it in one pass).

Two vocabularies reach the same machine: KIP-950's ``remote.log.disable.policy=retain|delete``
and Apache Kafka 3.9's ``remote.log.delete.on.disable`` / ``remote.log.copy.disable``, validated
with Kafka's own messages (see :func:`validate_change`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Any, Protocol

from kio.schema.errors import ErrorCode

from kcli.broker.background import TaskGuard
from kcli.config.definitions import TOPIC_CONFIGS, format_value
from kcli.metadata.metadata_log import record
from kcli.protocol.errors import TIERED_STORAGE_DISABLEMENT_IN_PROGRESS, BrokerError

if TYPE_CHECKING:
    from kcli.metadata.metadata_log import TopicState

log = logging.getLogger("kcli.tiered")

NONE = "NONE"
ENABLED = "ENABLED"
DISABLING = "DISABLING"
DISABLED = "DISABLED"

REMOTE_STORAGE_ENABLE = "remote.storage.enable"
DISABLE_POLICY = "remote.log.disable.policy"
DELETE_ON_DISABLE = "remote.log.delete.on.disable"
COPY_DISABLE = "remote.log.copy.disable"
TIERING_KEYS = (REMOTE_STORAGE_ENABLE, DISABLE_POLICY, DELETE_ON_DISABLE, COPY_DISABLE)
POLICIES = ("retain", "delete")


# Test hook (broker config): hold a disablement in DISABLING this long before its remote work,
# so tests can observe DISABLING and kill the broker mid-way.
DISABLE_DELAY_CONFIG = "kcli.fault.remote.log.disable.delay.ms"
# How often a broker whose part is done looks whether the others' parts are (a small query).
WAIT_OTHERS_S = 1.0

KAFKA_TURN_OFF_MESSAGE = (
    "It is invalid to disable remote storage without deleting remote data. "
    "If you want to keep the remote data and turn to read only, please set "
    "`remote.storage.enable=true,remote.log.copy.disable=true`. "
    "If you want to disable remote storage and delete all remote data, please set "
    "`remote.storage.enable=false,remote.log.delete.on.disable=true`."
)


def is_true(value: str | None) -> bool:
    return str(value or "").strip().lower() == "true"


def disable_policy(configs: dict[str, str]) -> str:
    """The policy a disablement follows: an explicit KIP-950 policy wins; else Kafka 3.9's
    ``remote.log.delete.on.disable=true`` means delete; else KIP-950's default, retain."""
    policy = configs.get(DISABLE_POLICY)
    if policy in POLICIES:
        return policy
    return "delete" if is_true(configs.get(DELETE_ON_DISABLE)) else "retain"


def is_disable(old: dict[str, str], new: dict[str, str]) -> bool:
    return is_true(old.get(REMOTE_STORAGE_ENABLE)) and not is_true(new.get(REMOTE_STORAGE_ENABLE))


def is_enable(old: dict[str, str], new: dict[str, str]) -> bool:
    return not is_true(old.get(REMOTE_STORAGE_ENABLE)) and is_true(new.get(REMOTE_STORAGE_ENABLE))


def check_request(topic: "TopicState", changes: dict[str, str | None]) -> None:
    """Refuse tiering changes while a disablement runs (KIP-950), and an unknown policy with
    INVALID_REQUEST naming the choices. ``changes`` is the request as sent (None = delete)."""
    if DISABLE_POLICY in changes and changes[DISABLE_POLICY] is not None:
        value = str(changes[DISABLE_POLICY]).strip()
        if value not in POLICIES:
            raise BrokerError(ErrorCode.invalid_request, f"Invalid value {value} for configuration {DISABLE_POLICY}: "
                                               f"String must be one of: {', '.join(POLICIES)}")
    touched = [k for k in TIERING_KEYS if k in changes]
    if touched and topic.tiered_state == DISABLING:
        raise BrokerError(TIERED_STORAGE_DISABLEMENT_IN_PROGRESS,
                          f"Tiered storage disablement of topic {topic.name} is in progress (tiered epoch "
                          f"{topic.tiered_epoch}); retry once its tiered state is {DISABLED}")


def check_without_tiered_system(topic: "TopicState", old: dict[str, str], new: dict[str, str]) -> None:
    """A broker without the tiered-storage system (remote.log.storage.system.enable=false: no
    RemoteLogManager) refuses to turn a topic's tiered storage off, with INVALID_CONFIG.

    Nothing there could carry the disablement out (stop copying, retain or delete the remote
    data, move the topic to DISABLED): accepting it left ``remote.storage.enable=false`` next to
    ``TieredState: ENABLED`` once the system was back. Kafka refuses turning remote storage on
    in that case ("Tiered Storage functionality is disabled in the broker") and will not even
    start with such topics; turning it off is refused here with the same words."""
    if is_disable(old, new):
        raise BrokerError(ErrorCode.invalid_config,
                          f"Tiered Storage functionality is disabled in the broker "
                          f"(remote.log.storage.system.enable=false): tiered storage of topic {topic.name} "
                          f"(tiered state {topic.tiered_state}) can only be turned off by a broker running it, "
                          f"which stops copying and retains or deletes the remote data; restart the broker with "
                          f"remote.log.storage.system.enable=true first")


_RETENTION_PAIRS = (("retention.bytes", "local.retention.bytes"), ("retention.ms", "local.retention.ms"))


def _effective(defaults: dict[str, Any], configs: dict[str, str], name: str) -> str:
    if name in configs:
        return configs[name]
    return format_value(TOPIC_CONFIGS[name], defaults[name]) or ""


def validate_change(defaults: dict[str, Any], old: dict[str, str], new: dict[str, str]) -> None:
    """Kafka 3.9's LogConfig rules for a topic's new configs (messages verbatim), plus the one
    conflict the two vocabularies allow. ``defaults`` are the broker's topic config defaults."""
    eff = lambda name: _effective(defaults, new, name)  # noqa: E731
    if is_true(new.get(REMOTE_STORAGE_ENABLE)):
        policy = eff("cleanup.policy")
        if policy and policy != "delete":
            raise BrokerError(ErrorCode.invalid_config, "Remote log storage only supports topics with cleanup.policy=delete "
                                              "or cleanup.policy being an empty list.")
        for total_name, local_name in _RETENTION_PAIRS:
            total, local = int(eff(total_name)), int(eff(local_name))
            if total > -1 and local != -2:
                if local == -1:
                    raise BrokerError(ErrorCode.invalid_config, f"Invalid value -1 for configuration {local_name}: "
                                                      f"Value must not be -1 as {total_name} value is set as {total}.")
                if local > total:
                    raise BrokerError(ErrorCode.invalid_config, f"Invalid value {local} for configuration {local_name}: "
                                                      f"Value must not be more than {total_name} property value: {total}")
        if is_true(new.get(COPY_DISABLE)):
            for total_name, local_name in _RETENTION_PAIRS:
                local = int(eff(local_name))
                if local != -2 and local != int(eff(total_name)):
                    raise BrokerError(ErrorCode.invalid_config,
                                      f"When `remote.log.copy.disable` is set to true, the `{local_name}` and "
                                      f"`{total_name}` must be set to the identical value because there will be no "
                                      "more logs copied to the remote storage.")
    elif is_disable(old, new):
        explicit_policy = new.get(DISABLE_POLICY)
        if explicit_policy is None and DELETE_ON_DISABLE in new and not is_true(new[DELETE_ON_DISABLE]):
            # Spoken in Kafka 3.9's terms (delete.on.disable=false, no KIP-950 policy): Kafka's rule.
            raise BrokerError(ErrorCode.invalid_config, KAFKA_TURN_OFF_MESSAGE)
        if explicit_policy == "retain" and is_true(new.get(DELETE_ON_DISABLE)):
            raise BrokerError(ErrorCode.invalid_config, f"{DISABLE_POLICY}=retain contradicts {DELETE_ON_DISABLE}=true; "
                                              f"set one of them")


def transition_records(topic: "TopicState", old: dict[str, str], new: dict[str, str]) -> list[dict[str, Any]]:
    """TopicTieredStateRecord(s) to write atomically with the ConfigRecords of a change."""
    if is_disable(old, new):
        return [_state_record(topic.topic_id, topic.tiered_epoch + 1, DISABLING)]
    if is_enable(old, new):
        first = topic.tiered_state == NONE and topic.tiered_epoch == 0
        return [_state_record(topic.topic_id, 0 if first else topic.tiered_epoch + 1, ENABLED)]
    return []


def _state_record(topic_id: uuid.UUID, epoch: int, state: str) -> dict[str, Any]:
    return record("TopicTieredStateRecord", topicId=topic_id, tieredEpoch=epoch, tieredState=state)


class PartitionStopper(Protocol):
    """What the disable work needs of the RemoteLogManager (which owns a :class:`Disabler`):
    named here so this module does not import the manager back."""

    broker: Any

    metadata: Any  # kcli.tiered.metadata.RemoteLogMetadata

    async def stop_partitions(self, t: "TopicState", *, delete_remote: bool) -> None: ...


class Disabler:
    """Runs each DISABLING topic to DISABLED (one task per topic, retried until it succeeds;
    a failing topic is logged once and backed off by :class:`TaskGuard`, the others proceed)."""

    def __init__(self, manager: PartitionStopper) -> None:
        self.manager = manager
        self.broker = manager.broker
        self._tasks: dict[uuid.UUID, asyncio.Task[None]] = {}
        self.guard = TaskGuard("tiered-disable", manager.broker.metrics, log)

    def start(self, topic: "TopicState") -> None:
        task = self._tasks.get(topic.topic_id)
        if task is not None and not task.done():
            return
        log.info("tiered storage of %s: DISABLING (policy %s, tiered epoch %d)", topic.name,
                 disable_policy(topic.configs), topic.tiered_epoch,
                 extra={"event": "tiered.state", "topic": topic.name, "state": DISABLING})
        self._tasks[topic.topic_id] = asyncio.get_running_loop().create_task(
            self._run(topic.topic_id), name=f"tiered-disable-{topic.name}")

    def forget(self, topic_id: uuid.UUID) -> None:
        task = self._tasks.pop(topic_id, None)
        if task is not None:
            task.cancel()
        self.guard.forget(topic_id)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    def _delay_s(self) -> float:
        raw = self.broker.config.plugin.get(DISABLE_DELAY_CONFIG, "0")
        try:
            return max(0, int(raw)) / 1000
        except ValueError:
            log.warning("ignoring %s=%r (not an integer)", DISABLE_DELAY_CONFIG, raw)
            return 0.0

    async def _run(self, topic_id: uuid.UUID) -> None:
        delay = self._delay_s()
        if delay:
            await asyncio.sleep(delay)
        retry_s = self.broker.config.get_int("remote.log.manager.task.interval.ms") / 1000
        try:
            await self._run_until_disabled(topic_id, retry_s)
        finally:
            self.guard.forget(topic_id)
            self.guard.forget((topic_id, DISABLED))

    async def _run_until_disabled(self, topic_id: uuid.UUID, retry_s: float) -> None:
        """Do this broker's part (its partitions), then wait until every partition's part is
        marked done; the controller then writes DISABLED, once. On one broker that is all of
        it in one pass. In a cluster every broker runs this until the topic leaves DISABLING,
        so a new controller finishes what a dead one started, and a host that dies mid-way
        redoes its part when it is back (every step is idempotent)."""
        mine_done = -1  # tiered epoch whose part this broker has done
        while not self.broker.stopping:
            t = self.broker.topic_by_id(topic_id)
            if t is None or t.tiered_state != DISABLING:
                return
            epoch = t.tiered_epoch
            policy = disable_policy(t.configs)
            if mine_done != epoch:
                # remote store down: stay DISABLING and retry (as KIP-950's controller does), with back-off
                await self.guard.step(topic_id, t.name,
                                      lambda: self.manager.stop_partitions(t, delete_remote=policy == "delete"))
                if self.guard.failing(topic_id):
                    await asyncio.sleep(max(retry_s, self.guard.retry_in(topic_id)))
                    continue
                mine_done = epoch
            t = self.broker.topic_by_id(topic_id)
            if t is None or t.tiered_state != DISABLING or t.tiered_epoch != epoch:
                return
            if self.broker.metadata.is_controller() and await self.guard.step(
                    (topic_id, DISABLED), t.name, lambda: self._write_disabled(t)):
                log.info("tiered storage of %s: DISABLING -> DISABLED (policy %s, tiered epoch %d)", t.name, policy,
                         epoch, extra={"event": "tiered.state", "topic": t.name, "state": DISABLED})
                return
            await asyncio.sleep(min(retry_s, WAIT_OTHERS_S))  # other hosts' parts, or the controller

    async def _write_disabled(self, t: "TopicState") -> bool:
        """DISABLED, once every partition of ``t`` has done its part of disabling its current
        tiered epoch; False while some have not."""
        stopped = await asyncio.to_thread(self.manager.metadata.stopped_partitions, t.topic_id, t.tiered_epoch)
        if not set(t.partitions) <= stopped:
            return False
        self.broker.metadata.append([_state_record(t.topic_id, t.tiered_epoch, DISABLED)])
        return True
