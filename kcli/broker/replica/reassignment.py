"""The controller's admin operations on replicas (Kafka's ReplicationControlManager.electLeaders,
alterPartitionReassignments, listPartitionReassignments) and what a broker does when the
replicas of a partition change under it (Kafka's StopReplica with delete, and a new replica).

Any broker may run an operation: like CreateTopics, its decision is a PartitionChangeRecord
appended to the shared metadata, fenced by the partition epoch it was computed from
(kcli/cluster/conflicts.py), so two brokers (or a broker and the controller's own rounds)
cannot both apply a change made from the same state; a fenced change is recomputed from the
state the refused append caught up on. The rules are the pure functions of ``controller``.
"""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.broker.replica import controller as ctl
from kcli.protocol.errors import BrokerError

log = logging.getLogger("kcli.broker.replica")

RETRIES = 3  # a change fenced by a concurrent one is recomputed this many times
_FENCED = (ErrorCode.invalid_update_version, ErrorCode.fenced_leader_epoch)


def _live(b: Any) -> set[int]:
    return {r.node_id for r in b.live_brokers()}


def _append(b: Any, compute: Any) -> tuple[int, str | None, dict[str, Any] | None]:
    """Compute (code, message, record) from the current state and append the record; a change
    fenced by a newer partition epoch is computed again."""
    for attempt in range(RETRIES):
        code, message, rec = compute()
        if code or rec is None:
            return code, message, rec
        try:
            b.metadata.append([rec])
            log.info("[Controller id=%d] partition change: %s", b.node_id, ctl.describe([rec], b.state)[0])
            return ErrorCode.none, None, rec
        except BrokerError as err:
            if err.code not in _FENCED or attempt == RETRIES - 1:
                return err.code, err.message or None, None
    raise AssertionError("unreachable")


# ---- ElectLeaders --------------------------------------------------------------------------------
def elect_leaders(b: Any, election: str, wanted: list[tuple[str, list[int]]] | None) -> list[dict[str, Any]]:
    """ElectLeaders' replica_election_results. ``wanted`` None: every partition, answering only
    those whose election was needed (Kafka leaves out ELECTION_NOT_NEEDED then)."""
    every = wanted is None
    if every:
        wanted = [(name, sorted(t.partitions)) for name, t in sorted(b.state.topics.items())]
    results = []
    for topic, partitions in wanted or []:
        out = []
        for idx in partitions:
            t = b.state.topics.get(topic)
            if t is not None and (b.is_diskless(t)) and election == ctl.UNCLEAN:
                code, message = ErrorCode.election_not_needed, None  # diskless leaders are never offline
            else:
                code, message, _rec = _append(b, lambda topic=topic, idx=idx: ctl.elect_leader(
                    b.state, topic, int(idx), election, _live(b)))
            if every and code == ErrorCode.election_not_needed:
                continue
            out.append({"partition_id": int(idx), "error_code": code, "error_message": message})
        results.append({"topic": topic, "partition_result": out})
    return results


# ---- AlterPartitionReassignments -----------------------------------------------------------------
def _check_target(b: Any, target: list[int]) -> None:
    """Kafka's validateManualPartitionAssignment, against the registered (live) brokers."""
    if not target:
        raise BrokerError(ErrorCode.invalid_replica_assignment,
                          "The manual partition assignment includes an empty replica list.")
    live = _live(b)
    prev = None
    for broker in sorted(target):
        if broker not in live:
            raise BrokerError(ErrorCode.invalid_replica_assignment, f"The manual partition assignment includes "
                                                                    f"broker {broker}, but no such broker is registered.")
        if broker == prev:
            raise BrokerError(ErrorCode.invalid_replica_assignment, f"The manual partition assignment includes the "
                                                                    f"broker {broker} more than once.")
        prev = broker


def _topic_for_reassignment(b: Any, topic: str, idx: int) -> tuple[Any, Any]:
    t = b.state.topics.get(topic)
    if t is None:
        raise BrokerError(ErrorCode.unknown_topic_or_partition, f"Unable to find a topic named {topic}.")
    p = t.partitions.get(idx)
    if p is None or p.mode == ctl.MODE_NONE:
        raise BrokerError(ErrorCode.unknown_topic_or_partition, f"Unable to find partition {topic}:{idx}.")
    return t, p


def alter_one(b: Any, topic: str, idx: int, target: list[int] | None) -> tuple[int, str | None]:
    """One partition of AlterPartitionReassignments: start (or replace) a reassignment to
    ``target``, or cancel the running one (``target`` None)."""
    def compute() -> tuple[int, str | None, dict[str, Any] | None]:
        t, p = _topic_for_reassignment(b, topic, idx)
        if target is None:
            if not ctl.in_reassignment(p):
                raise BrokerError(ErrorCode.no_reassignment_in_progress,
                                  "No partition reassignment is in progress for this topic or partition.")
            unclean = bool(b.topic_config_value(t, "unclean.leader.election.enable"))
            try:
                return ErrorCode.none, None, ctl.cancel(t.topic_id, p, _live(b), unclean)
            except ValueError:
                raise BrokerError(ErrorCode.invalid_replica_assignment, f"Unable to revert partition assignment for "
                                  f"{topic}:{idx} because it would require an unclean leader election.") from None
        _check_target(b, target)
        if b.is_diskless(t):  # metadata only and immediate: the new replicas fill their caches
            from kcli.diskless.reassign import change_record
            return ErrorCode.none, None, change_record(t, p, list(target), _live(b))
        return ErrorCode.none, None, ctl.reassign(t.topic_id, p, list(target), _live(b))

    try:
        code, message, _rec = _append(b, compute)
    except BrokerError as err:
        return err.code, err.message or None
    return code, message


def alter_reassignments(b: Any, topics: list[tuple[str, list[tuple[int, list[int] | None]]]]) -> list[dict[str, Any]]:
    out = []
    for topic, parts in topics:
        answers = []
        for idx, target in parts:
            code, message = alter_one(b, topic, int(idx), None if target is None else [int(r) for r in target])
            if code:
                log.info("Unable to alter partition reassignment for %s:%d: %s", topic, idx, message or code)
            answers.append({"partition_index": int(idx), "error_code": code, "error_message": message})
        out.append({"name": topic, "partitions": answers})
    return out


def list_reassignments(b: Any, topics: list[tuple[str, list[int]]] | None) -> list[dict[str, Any]]:
    """ListPartitionReassignments: the running reassignments (of the partitions asked for)."""
    out = []
    names = sorted(b.state.topics) if topics is None else [name for name, _ in topics]
    asked = {} if topics is None else {name: set(parts) for name, parts in topics}
    for name in names:
        t = b.state.topics.get(name)
        if t is None:
            continue
        parts = []
        for idx, p in sorted(t.partitions.items()):
            if ctl.in_reassignment(p) and (topics is None or idx in asked.get(name, ())):
                parts.append({"partition_index": idx, "replicas": list(p.replicas),
                              "adding_replicas": list(p.adding_replicas), "removing_replicas": list(p.removing_replicas)})
        if parts:
            out.append({"name": name, "partitions": parts})
    return out


# ---- a broker's replicas follow the metadata ---------------------------------------------------
def open_new_replicas(b: Any) -> None:
    """Before the replica manager looks: open a log for each classic partition this broker became
    a replica of (a reassignment added it; the fetcher then copies the leader from its log start)."""
    seen = _seen(b)
    for t in list(b.state.topics.values()):
        if b.is_diskless(t):
            continue
        for idx, p in list(t.partitions.items()):
            key = (t.name, idx)
            if key not in b.logs and key in seen and b.node_id in p.replicas and b.hosts(p):
                log.info("[Broker id=%d] %s-%d: now a replica (replicas %s); creating its log", b.node_id, t.name, idx,
                         p.replicas)
                b._open_log(t, idx)


def drop_removed_replicas(b: Any) -> None:
    """After the replica manager stopped leading or following them: delete the log of each classic
    partition this broker is no longer a replica of (Kafka's StopReplica with deletePartition), and
    let a partition back to one replica take its high watermark from its log end again."""
    seen = _seen(b)
    for t in list(b.state.topics.values()):
        if b.is_diskless(t):
            continue
        for idx, p in list(t.partitions.items()):
            key = (t.name, idx)
            before = seen.get(key)
            seen[key] = list(p.replicas)
            lg = b.logs.get(key)
            if lg is None:
                continue
            if before is not None and b.node_id in before and b.node_id not in p.replicas and not b.hosts(p):
                log.info("[Broker id=%d] %s-%d: no longer a replica (replicas %s); deleting its log", b.node_id,
                         t.name, idx, p.replicas)
                b.logs.pop(key)
                lg.delete()
                b.notifier.notify(t.name, idx)
            elif len(p.replicas) == 1 and lg.replicated and b.leads(p):
                lg.set_high_watermark(None)  # one replica again: the high watermark is the log end
                b.notifier.notify(t.name, idx)


def _seen(b: Any) -> dict[tuple[str, int], list[int]]:
    """The replicas of each partition as this broker last acted on them (filled on first use, so
    a start never deletes anything: only a change seen while running does)."""
    seen = getattr(b, "_replica_sets", None)
    if seen is None:
        seen = {(t.name, idx): list(p.replicas) for t in b.state.topics.values() for idx, p in t.partitions.items()}
        b._replica_sets = seen
    return seen


# ---- the controller's rounds ---------------------------------------------------------------------
def controller_round(b: Any, live: set[int]) -> list[dict[str, Any]]:
    """What the controller adds to its elections each round: running reassignments whose new
    replicas reached the ISR complete, and — every ``leader.imbalance.check.interval.seconds``
    with ``auto.leader.rebalance.enable`` — preferred leaders of imbalanced brokers come back."""
    import time

    def classic(t: Any) -> bool:
        return not b.is_diskless(t)

    recs = ctl.completion_records(b.state, live, classic)
    cfg = b.config
    if not cfg.get_bool("auto.leader.rebalance.enable"):
        return recs
    now = time.monotonic()
    due = getattr(b, "_rebalance_due", None)
    if due is None:  # Kafka's first check is one interval after the controller started
        b._rebalance_due = now + cfg.get_int("leader.imbalance.check.interval.seconds")
        return recs
    if now < due:
        return recs
    b._rebalance_due = now + cfg.get_int("leader.imbalance.check.interval.seconds")
    moved = {(r["data"]["topicId"], r["data"]["partitionId"]) for r in recs}
    for rec in ctl.imbalanced(b.state, live, classic, cfg.get_int("leader.imbalance.per.broker.percentage")):
        if (rec["data"]["topicId"], rec["data"]["partitionId"]) not in moved:
            recs.append(rec)
    return recs


def controller_lost(b: Any) -> None:
    """Not the controller (any more): a new one starts its rebalance interval afresh."""
    b._rebalance_due = None
