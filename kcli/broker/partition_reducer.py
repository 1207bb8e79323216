"""Reducing a topic's partition count (KIP-694): ReadWrite → ReadOnly → None.

A shrink writes one DeleteTopicPartitionsRecord: the highest-numbered partitions become
ReadOnly with a delete time. ReadOnly partitions take no writes but stay readable so
consumers can drain them; once the delete time passes (checked every
``delete.topic.partition.interval.delay.ms``) their data is deleted — local segments, remote
segments through the tiered extension, coordinator batches through the diskless extension —
and a PartitionChangeRecord with mode None removes them from the metadata.

Data goes before the None record, so a crash in between leaves a ReadOnly partition whose
delete time has passed, and the deletion simply runs again at the next start. A local
partition directory is first renamed to ``<topic>-<p>.<uuid>-delete`` (Kafka's convention), so
a crash during the recursive delete leaves only a directory that start-up sweeps away.

Unmodified clients cannot read a partition mode, so :meth:`producer_view` decides per
request which partitions Metadata shows (see docs/partition-reduction.md for the measured
behaviour of librdkafka and kafka-python):

- a connection that has produced (Produce, InitProducerId, transactions) sees ReadWrite only;
- else a connection that has used consumer APIs (Fetch, ListOffsets, group and offset APIs)
  sees ReadWrite and ReadOnly partitions, so plain and group consumers drain them;
- else the Metadata request's ``allow_auto_topic_creation`` decides: librdkafka and
  kafka-python producers send true (producer view); librdkafka consumers and admin requests
  send false (full view).

Because only the highest-numbered partitions are removed, the producer view is always the
dense range 0..N-1, which every client's partitioner expects. While it hides partitions it
carries a derived topic id (:func:`producer_view_topic_id`): librdkafka >= 2.x ignores a
shorter partition list for a topic id it knows, but replaces its view when the id changes.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterable

from kio.schema.errors import ErrorCode

from kcli.fsutil import fsync_dir_best_effort
from kcli.broker.background import TaskGuard
from kcli.broker.extension import BrokerExtension
from kcli.metadata.metadata_log import MODE_NAMES, MODE_NONE, MODE_READ_ONLY, MODE_READ_WRITE, record
from kcli.protocol.errors import TOPIC_UNDER_CHANGES, BrokerError

if TYPE_CHECKING:
    from kcli.broker.broker import Broker
    from kcli.broker.dispatch import RequestContext
    from kcli.metadata.metadata_log import PartitionState, TopicState

log = logging.getLogger("kcli.broker.partition_reducer")

ENABLE_CONFIG = "delete.topic.partition.enable"
INTERVAL_CONFIG = "delete.topic.partition.interval.delay.ms"
MODES_STATE_KEY = "kcli.partition.modes"


# API keys that mark a connection as a producer's or a consumer's (see producer_view).
PRODUCER_APIS = frozenset({0, 22, 24, 25, 26, 28})  # Produce, InitProducerId, txn APIs
CONSUMER_APIS = frozenset({1, 2, 8, 9, 10, 11, 12, 13, 14})  # Fetch, ListOffsets, offsets, groups
SEEN_APIS_KEY = "api_keys"  # ConnectionState.extra entry the server fills

_DOOMED_DIR = re.compile(r"^.+-\d+\.[0-9a-f]{32}-delete$")


def now_ms() -> int:
    from kcli.broker.broker import now_ms as broker_now

    return broker_now()


def producer_view_topic_id(topic_id: uuid.UUID) -> uuid.UUID:
    """The id producers see while ReadOnly partitions are hidden from them: derived, so every
    broker and every request agrees on it. Produce before v13 names topics, so the id is only
    what tells a client that the partition list is not stale metadata of the same topic."""
    return uuid.uuid5(topic_id, "kcli-kip694-producer-view")


def format_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def format_modes(partitions: Iterable["PartitionState"]) -> str:
    """``3:ReadOnly@<deleteAtMs>,4:...`` for every partition that is not ReadWrite."""
    out = []
    for p in sorted(partitions, key=lambda p: p.partition):
        if p.mode == MODE_READ_WRITE:
            continue
        entry = f"{p.partition}:{MODE_NAMES.get(p.mode, str(p.mode))}"
        if p.delete_at_ms is not None:
            entry += f"@{p.delete_at_ms}"
        out.append(entry)
    return ",".join(out)


@dataclass
class PartitionOutcome:
    """One partition of a DeletePartitions answer (or of its validate-only plan)."""

    partition: int
    mode: int  # mode afterwards: ReadWrite (validate only), ReadOnly or None
    delete_at_ms: int
    record_count: int  # high watermark - log start offset; -1 unknown
    size_bytes: int  # local + remote bytes; -1 unknown


class PartitionReducer(BrokerExtension):
    """Broker side of KIP-694: validates shrinks, schedules and runs partition deletions."""

    def __init__(self, broker: "Broker") -> None:
        super().__init__(broker)
        self._task: asyncio.Task[None] | None = None
        self._deleting: set[tuple[uuid.UUID, int]] = set()
        # a topic whose deletion fails is logged once and backed off; the other topics proceed
        self.guard = TaskGuard("partition-deletion", broker.metrics, log)

    @property
    def enabled(self) -> bool:
        return self.broker.config.get_bool(ENABLE_CONFIG)

    # ---- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        self._sweep_doomed_dirs()
        # deletions whose delay passed while the broker was down; a failing one never stops the start
        done = await self.guard.round(self.run_due, "deletion round at start") or 0
        if done:
            log.info("deleted %d partitions whose deletion delay passed while the broker was down", done)
        self._task = asyncio.create_task(self._loop(), name="partition-reducer")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _loop(self) -> None:
        interval_s = self.broker.config.get_int(INTERVAL_CONFIG) / 1000
        while not self.broker.stopping:
            await asyncio.sleep(interval_s)
            await self.guard.round(self.run_due, "deletion round")

    def _sweep_doomed_dirs(self) -> None:
        for d in self.broker.data_dir.iterdir():
            if d.is_dir() and _DOOMED_DIR.match(d.name):
                shutil.rmtree(d, ignore_errors=True)
                log.info("removed leftover %s of an interrupted partition deletion", d.name)

    # ---- hooks -------------------------------------------------------------------------
    def topic_state(self, topic: "TopicState") -> dict[str, str]:
        modes = format_modes(topic.partitions.values())
        return {MODES_STATE_KEY: modes} if modes else {}

    def validate_create_partitions(self, topic: "TopicState", count: int) -> None:
        """Growing while partitions are ReadOnly would leave a gap in the partition ids."""
        self._refuse_if_pending(topic)

    # ---- metadata views ----------------------------------------------------------------
    @staticmethod
    def producer_view(ctx: "RequestContext", req: Any) -> bool:
        """Whether this Metadata request should see ReadWrite partitions only."""
        seen = ctx.connection.extra.get(SEEN_APIS_KEY, ())
        if not PRODUCER_APIS.isdisjoint(seen):
            return True
        if not CONSUMER_APIS.isdisjoint(seen):
            return False
        # Metadata v0-v3 has no flag and always allowed auto-creation: treat as a producer.
        return bool(getattr(req, "allow_auto_topic_creation", True))

    def metadata_view(self, topic: "TopicState", producer_view: bool) -> tuple[list["PartitionState"], uuid.UUID]:
        """The partitions Metadata lists for ``topic``, and the topic id it reports.

        A producer view leaves ReadOnly partitions out and, while it does, reports
        :func:`producer_view_topic_id` instead of the real id: librdkafka >= 2.x keeps every
        partition it ever saw for a topic id (a shorter list looks like stale metadata to it),
        and drops the missing ones only when the id differs."""
        parts = self.broker.visible_partitions(topic)
        if not producer_view:
            return parts, topic.topic_id
        writable = [p for p in parts if p.mode == MODE_READ_WRITE]
        if len(writable) == len(parts):
            return parts, topic.topic_id
        return writable, producer_view_topic_id(topic.topic_id)

    # ---- shrinking ---------------------------------------------------------------------
    def pending(self, topic: "TopicState") -> list["PartitionState"]:
        return [p for _, p in sorted(topic.partitions.items()) if p.mode == MODE_READ_ONLY]

    def _refuse_if_pending(self, topic: "TopicState") -> None:
        pending = self.pending(topic)
        if pending:
            ids = ",".join(str(p.partition) for p in pending)
            when = min(p.delete_at_ms or 0 for p in pending)
            raise BrokerError(TOPIC_UNDER_CHANGES,
                              f"The topic is currently under changes: partitions {ids} of '{topic.name}' are "
                              f"read-only and will be deleted at {format_ms(when)}")
        if topic.tiered_state == "DISABLING":
            raise BrokerError(TOPIC_UNDER_CHANGES,
                              f"The topic is currently under changes: tiered storage of '{topic.name}' is being disabled")

    def check_request(self, delay_ms: int) -> None:
        """Request-wide checks: the feature switch and the delay."""
        if not self.enabled:
            raise BrokerError(ErrorCode.policy_violation,
                              f"Reducing partitions is disabled on this broker: set {ENABLE_CONFIG}=true to enable it")
        if delay_ms < 0:
            raise BrokerError(ErrorCode.invalid_request, f"delete_partitions_delay must be >= 0 ms, got {delay_ms}")

    def check_topic(self, name: str, partitions: list[int]) -> "TopicState":
        """Topic checks; returns the topic. Raises BrokerError with Kafka's error code."""
        from kcli.broker.broker import INTERNAL_TOPICS

        t = self.broker.topic(name)
        if t is None:
            raise BrokerError(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")
        if name in INTERNAL_TOPICS:
            raise BrokerError(ErrorCode.invalid_request, f"Partitions of the internal topic '{name}' cannot be deleted.")
        self._refuse_if_pending(t)
        if self.broker.is_diskless(t) and self.broker.diskless is None:
            raise BrokerError(ErrorCode.invalid_request, f"'{name}' is a diskless topic and diskless storage is not enabled on this broker")
        if not partitions:
            raise BrokerError(ErrorCode.invalid_partitions, "No partitions to delete were given.")
        if len(set(partitions)) != len(partitions):
            raise BrokerError(ErrorCode.invalid_request, f"Duplicate partitions in {sorted(partitions)}.")
        current = len(t.partitions)
        unknown = sorted(set(partitions) - set(t.partitions))
        if unknown:
            raise BrokerError(ErrorCode.invalid_partitions,
                              f"Topic '{name}' has {current} partitions; partition {unknown[0]} does not exist.")
        keep = current - len(partitions)
        if keep < 1:
            raise BrokerError(ErrorCode.invalid_partitions, f"Topic '{name}' must keep at least one partition.")
        if sorted(partitions) != list(range(keep, current)):
            raise BrokerError(ErrorCode.invalid_partitions,
                              f"Only the highest-numbered partitions can be deleted: to keep {keep} partitions of "
                              f"'{name}', delete partitions {keep}..{current - 1}.")
        return t

    def _size_bytes(self, t: "TopicState", p: int) -> int:
        b = self.broker
        if b.is_diskless(t):
            size_fn = getattr(b.diskless, "partition_size_bytes", None)
            return int(size_fn(t, p)) if size_fn is not None else -1
        lg = b.get_log(t.name, p)
        if lg is None and not self._deletes_here(t, p):
            return -1  # another broker of the cluster holds the log: only it can tell
        size = lg.size_in_bytes if lg is not None else 0
        remote_fn = getattr(b.tiered, "remote_size_bytes", None) if b.tiered is not None else None
        if remote_fn is not None:
            size += int(remote_fn(t, p))
        return size

    def _outcome(self, t: "TopicState", p: int, mode: int, delete_at: int) -> PartitionOutcome:
        try:
            hw, start = self.broker.partition_offsets(t, p)
            count = hw - start if hw >= 0 and start >= 0 else -1
        except Exception:  # an extension that cannot answer: unknown, not fatal
            count = -1
        try:
            size = self._size_bytes(t, p)
        except Exception:
            size = -1
        return PartitionOutcome(p, mode, delete_at, count, size)

    async def delete_partitions(self, name: str, partitions: list[int], delay_ms: int, *,
                                validate_only: bool = False) -> list[PartitionOutcome]:
        """Make ``partitions`` ReadOnly until now + ``delay_ms``; 0 deletes them right away."""
        self.check_request(delay_ms)
        t = self.check_topic(name, partitions)
        now = now_ms()
        delete_at = now + delay_ms
        parts = sorted(partitions)
        outcomes = [self._outcome(t, p, MODE_READ_WRITE if validate_only else MODE_READ_ONLY, delete_at) for p in parts]
        if validate_only:
            return outcomes
        self.broker.metadata.append([record("DeleteTopicPartitionsRecord", topicId=t.topic_id, partitions=parts,
                                            deleteAtMs=delete_at, delayMs=delay_ms, createTimestamp=now)])
        self.broker.metrics.inc("partitions.marked_read_only", len(parts))
        log.info("partitions %s of %s are read-only; data deleted at %s", parts, name, format_ms(delete_at))
        if delay_ms == 0:
            # In a cluster a classic partition's log is deleted by its host (here, or in the
            # host's next deletion round): those stay ReadOnly until then.
            here = [p for p in parts if self._deletes_here(t, p)]
            await self._delete_now(t, here)
            for o in outcomes:
                if o.partition in here:
                    o.mode = MODE_NONE
        return outcomes

    def _deletes_here(self, t: "TopicState", partition: int) -> bool:
        b = self.broker
        p = t.partitions.get(partition)
        return b.is_diskless(t) or p is None or b.hosts(p)

    async def run_due(self, at_ms: int | None = None) -> int:
        """Delete every ReadOnly partition whose delete time has passed; returns how many.
        Topic by topic: one whose deletion fails is backed off while the others proceed."""
        now = now_ms() if at_ms is None else at_ms
        done = 0
        b = self.broker
        for t in list(b.state.topics.values()):
            # In a cluster a classic partition is deleted by the broker that holds its log, a
            # diskless one (data in the shared store) by the controller alone.
            controller = b.is_diskless(t) and b.metadata.is_controller()
            due = [p.partition for p in self.pending(t) if p.delete_at_ms is not None and p.delete_at_ms <= now
                   and (controller or (not b.is_diskless(t) and b.hosts(p)))]
            # a replicated partition: another replica deleted its part first and wrote mode None
            # (which removes it from the metadata); this replica's log, and the remote segments
            # its leader copied, still go
            if not b.is_diskless(t):
                due += sorted(idx for name, idx in list(b.logs) if name == t.name and idx not in t.partitions)
            if due:
                done += await self.guard.step(t.topic_id, f"{t.name} partitions {due}",
                                              lambda t=t, due=due: self._delete_now(t, due)) or 0
        return done

    async def _delete_now(self, t: "TopicState", partitions: list[int]) -> int:
        b = self.broker
        parts = [p for p in partitions if (t.topic_id, p) not in self._deleting]
        if not parts:
            return 0
        keys = {(t.topic_id, p) for p in parts}
        self._deleting |= keys
        try:
            if b.is_diskless(t):
                await self._diskless_delete(t, parts)
            else:
                # remote first: the tiered extension stops copying these partitions under its
                # per-partition lock before their local segments disappear
                if b.tiered is not None and hasattr(b.tiered, "partitions_deleted"):
                    await _maybe_await(b.tiered.partitions_deleted(t, parts))
                for p in parts:
                    self._delete_local(t, p)
            current = b.topic_by_id(t.topic_id)
            if current is None:  # the whole topic was deleted meanwhile
                return 0
            recs = [record("PartitionChangeRecord", topicId=t.topic_id, partitionId=p, mode=MODE_NONE)
                    for p in parts if p in current.partitions]
            if recs:
                b.metadata.append(recs)
            for p in parts:
                b.notifier.notify(t.name, p)
            b.metrics.inc("partitions.deleted", len(recs))
            log.info("deleted partitions %s of %s", parts, t.name)
            return len(recs)
        finally:
            self._deleting -= keys

    def _delete_local(self, t: "TopicState", p: int) -> None:
        b = self.broker
        d = b.partition_dir(t.name, p)
        doomed = b.partition_delete_dir(t.name, p)  # fits 255 bytes even for a 249-char topic
        if d.exists():
            os.rename(d, doomed)
            fsync_dir_best_effort(b.data_dir)
        lg = b.logs.pop((t.name, p), None)  # after the rename: a failed rename leaves the log served
        if lg is not None:
            lg.delete()  # closes its files; its old path is already gone
        shutil.rmtree(doomed, ignore_errors=True)

    async def _diskless_delete(self, t: "TopicState", parts: list[int]) -> None:
        d = self.broker.diskless
        if hasattr(d, "partitions_deleted"):
            await _maybe_await(d.partitions_deleted(t, parts))
            return
        coordinator = getattr(d, "coordinator", None)
        if coordinator is None or not hasattr(coordinator, "delete_partitions"):
            raise RuntimeError("the diskless extension cannot delete partitions")
        await _maybe_await(coordinator.delete_partitions(t.topic_id, set(parts)))


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value
