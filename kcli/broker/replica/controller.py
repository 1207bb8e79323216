"""The controller's part of replication (Kafka's ReplicationControlManager and
PartitionChangeBuilder, reduced): when a broker leaves the live set, drop it from every ISR and
elect a new leader, from the ISR only unless ``unclean.leader.election.enable``.

Runs on the broker that holds the controller lock; its decisions are PartitionChangeRecords that
name the partition epoch they were computed from, so a change made from a stale state (a leader's
ISR change got in first) is refused by the store and recomputed on the next round.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

from kcli.metadata.metadata_log import MODE_NONE, ClusterState, PartitionState, record

log = logging.getLogger("kcli.broker.replica")


def is_replicated(p: PartitionState) -> bool:
    return len(p.replicas) > 1


def partition_change(topic_id: Any, p: PartitionState, live: set[int], unclean: bool) -> dict[str, Any] | None:
    """The PartitionChangeRecord that ``p`` needs with brokers ``live`` alive, or None.

    * leader alive and in the ISR: dead followers leave the ISR (never the last member);
    * leader dead (or none): the first replica, in assignment order, that is alive and in the ISR
      leads, with the leader epoch bumped; the dead leave the ISR;
    * no such replica: with unclean election, the first live replica leads alone (data the old ISR
      had may be lost, as in Kafka); without it the partition goes offline (leader -1) and keeps
      its ISR, so it comes back when an ISR member does.
    """
    live_isr = [r for r in p.isr if r in live]
    fence = {"expectedPartitionEpoch": p.partition_epoch, "expectedLeaderEpoch": p.leader_epoch}
    if p.leader >= 0 and p.leader in live and p.leader in p.isr:
        if len(live_isr) != len(p.isr):
            return record("PartitionChangeRecord", topicId=topic_id, partitionId=p.partition, isr=live_isr, **fence)
        return None
    candidates = [r for r in p.replicas if r in live_isr]
    if candidates:
        return record("PartitionChangeRecord", topicId=topic_id, partitionId=p.partition, leader=candidates[0],
                      isr=live_isr, leaderEpoch=p.leader_epoch + 1, **fence)
    if unclean:
        alive = [r for r in p.replicas if r in live]
        if alive:
            return record("PartitionChangeRecord", topicId=topic_id, partitionId=p.partition, leader=alive[0],
                          isr=[alive[0]], leaderEpoch=p.leader_epoch + 1, **fence)
    if p.leader != -1:
        return record("PartitionChangeRecord", topicId=topic_id, partitionId=p.partition, leader=-1,
                      leaderEpoch=p.leader_epoch + 1, **fence)
    return None


def election_records(state: ClusterState, live: set[int], is_classic: Callable[[Any], bool],
                     unclean: Callable[[Any], bool]) -> list[dict[str, Any]]:
    """Every change the replicated classic partitions of ``state`` need."""
    out: list[dict[str, Any]] = []
    for t in list(state.topics.values()):
        if not is_classic(t):
            continue
        for p in list(t.partitions.values()):
            if p.mode == MODE_NONE or not is_replicated(p):
                continue
            rec = partition_change(t.topic_id, p, live, unclean(t))
            if rec is not None:
                out.append(rec)
    return out


def describe(records: Iterable[dict[str, Any]], state: ClusterState) -> list[str]:
    """One readable line per change, for the controller's log."""
    lines = []
    for rec in records:
        d = rec["data"]
        t = next((t for t in state.topics.values() if str(t.topic_id) == d["topicId"]), None)
        name = f"{t.name}-{d['partitionId']}" if t is not None else f"{d['topicId']}-{d['partitionId']}"
        parts = []
        if "leader" in d:
            parts.append(f"leader {d['leader']} (epoch {d.get('leaderEpoch')})")
        if "isr" in d:
            parts.append(f"isr {d['isr']}")
        for key, label in (("replicas", "replicas"), ("addingReplicas", "adding"), ("removingReplicas", "removing")):
            if key in d:
                parts.append(f"{label} {d[key]}")
        lines.append(f"{name}: " + ", ".join(parts))
    return lines


# ---- Kafka's PartitionChangeBuilder: reassignment, preferred and unclean elections --------------
ONLINE, PREFERRED, UNCLEAN = "online", "preferred", "unclean"


def build_change(topic_id: Any, p: PartitionState, live: set[int], *, election: str = ONLINE,
                 replicas: list[int] | None = None, isr: list[int] | None = None, adding: list[int] | None = None,
                 removing: list[int] | None = None) -> dict[str, Any] | None:
    """The PartitionChangeRecord taking ``p`` to the targets given (the current values otherwise),
    or None when nothing changes — Kafka's PartitionChangeBuilder.build, without ELR:

    1. a reassignment whose target replicas are all in the target ISR completes: the removing
       replicas leave the replicas and the ISR, adding and removing are cleared;
    2. the leader is elected: PREFERRED takes the first replica if it is live and in the ISR,
       else keeps a valid leader, else the next valid replica; ONLINE and UNCLEAN keep a valid
       leader, else the first valid replica; UNCLEAN then falls back to the first live replica,
       which leads alone (the ISR becomes just it); with none, the leader is -1. Valid = live and
       in the target ISR;
    3. the leader epoch goes up with every leader change, and when replicas are dropped.
    """
    t_replicas = list(p.replicas if replicas is None else replicas)
    t_isr = list(p.isr if isr is None else isr)
    t_adding = list(p.adding_replicas if adding is None else adding)
    t_removing = list(p.removing_replicas if removing is None else removing)
    if t_adding or t_removing:  # PartitionReassignmentReplicas.maybeCompleteReassignment
        new_isr = [r for r in t_isr if r not in t_removing]
        new_replicas = [r for r in t_replicas if r not in t_removing]
        if new_isr and new_replicas and all(r in new_isr for r in new_replicas):
            t_isr, t_replicas, t_adding, t_removing = new_isr, new_replicas, [], []

    def valid(r: int) -> bool:
        return r >= 0 and r in t_isr and r in live

    leader, unclean = p.leader, False
    if election == PREFERRED and valid(t_replicas[0]):
        leader = t_replicas[0]
    elif not valid(p.leader):
        leader = next((r for r in t_replicas if valid(r)), -1)
        if leader < 0 and election == UNCLEAN:
            leader = next((r for r in t_replicas if r in live), -1)
            unclean = leader >= 0
    out: dict[str, Any] = {}
    if leader != p.leader or not set(p.replicas) <= set(t_replicas):
        out["leader"] = leader
        out["leaderEpoch"] = p.leader_epoch + 1
        if unclean:
            out["isr"] = [leader]
    if "isr" not in out and t_isr and t_isr != p.isr:
        out["isr"] = t_isr
    if t_replicas != p.replicas:
        out["replicas"] = t_replicas
    if t_removing != p.removing_replicas:
        out["removingReplicas"] = t_removing
    if t_adding != p.adding_replicas:
        out["addingReplicas"] = t_adding
    if not out:
        return None
    if out.get("leader", -1) >= 0 and out["leader"] not in out.get("isr", p.isr):
        return None  # a leader not in the ISR is never written (cannot happen: valid() checks it)
    return record("PartitionChangeRecord", topicId=topic_id, partitionId=p.partition, **out,
                  expectedPartitionEpoch=p.partition_epoch, expectedLeaderEpoch=p.leader_epoch)


def in_reassignment(p: PartitionState) -> bool:
    return bool(p.adding_replicas or p.removing_replicas)


def reassignment_target(p: PartitionState) -> list[int]:
    """The replicas a running reassignment ends with (Kafka's target replicas)."""
    return [r for r in p.replicas if r not in p.removing_replicas]


def original_replicas(p: PartitionState) -> list[int]:
    """The replicas before a running reassignment (PartitionReassignmentReplicas.originalReplicas)."""
    return [r for r in p.replicas if r not in p.adding_replicas]


def reassign(topic_id: Any, p: PartitionState, target: list[int], live: set[int]) -> dict[str, Any] | None:
    """Kafka's changePartitionReassignment: replicas = target + (current - target), adding =
    target - current, removing = current - target, measured from the replicas before any running
    reassignment (a new target replaces it); completes at once when the ISR already holds the
    whole target. None when nothing changes."""
    current = original_replicas(p)
    removing = sorted(set(current) - set(target))
    adding = sorted(set(target) - set(current))
    replicas = list(target) + [r for r in current if r not in target]
    # the replicas a replaced reassignment was adding, and that the new one does not want, leave the ISR
    isr = [r for r in p.isr if r in replicas]
    return build_change(topic_id, p, live, replicas=replicas, isr=isr or p.isr, adding=adding, removing=removing)


def cancel(topic_id: Any, p: PartitionState, live: set[int], unclean_allowed: bool) -> dict[str, Any] | None:
    """Kafka's cancelPartitionReassignment (PartitionReassignmentRevert): back to the original
    replicas; the adding replicas leave the ISR. Raises ValueError when that would need an unclean
    election and the topic does not allow one."""
    replicas = original_replicas(p)
    isr = [r for r in p.isr if r not in p.adding_replicas]
    unclean = not isr
    if unclean:
        if not unclean_allowed:
            raise ValueError("it would require an unclean leader election")
        isr = [replicas[0]]
    return build_change(topic_id, p, live, election=UNCLEAN if unclean_allowed else ONLINE, replicas=replicas,
                        isr=isr, adding=[], removing=[])


def completion_records(state: ClusterState, live: set[int], is_classic: Callable[[Any], bool]) -> list[dict[str, Any]]:
    """For the controller's rounds: every running reassignment whose target is in the ISR completes
    (the leader's ISR expansion is written by the leader, so the controller finishes the move)."""
    out = []
    for t in list(state.topics.values()):
        if not is_classic(t):
            continue
        for p in list(t.partitions.values()):
            if p.mode != MODE_NONE and in_reassignment(p):
                rec = build_change(t.topic_id, p, live)
                if rec is not None and "addingReplicas" in rec["data"]:
                    out.append(rec)
    return out


def imbalanced(state: ClusterState, live: set[int], is_classic: Callable[[Any], bool],
               percentage: int) -> list[dict[str, Any]]:
    """auto.leader.rebalance.enable (Kafka's checkAndTriggerAutoLeaderRebalance): per preferred
    broker (the first replica of each partition), the share of its partitions it does not lead;
    above ``leader.imbalance.per.broker.percentage`` its partitions get a preferred election
    where the preferred replica is live and in the ISR."""
    by_broker: dict[int, list[tuple[Any, PartitionState]]] = {}
    for t in list(state.topics.values()):
        if not is_classic(t):
            continue
        for p in list(t.partitions.values()):
            if p.mode != MODE_NONE and is_replicated(p) and not in_reassignment(p):
                by_broker.setdefault(p.replicas[0], []).append((t, p))
    out = []
    for broker, parts in sorted(by_broker.items()):
        if broker not in live:
            continue
        off = [(t, p) for t, p in parts if p.leader != broker]
        if not off or len(off) * 100 <= percentage * len(parts):
            continue
        for t, p in off:
            if broker in p.isr:
                rec = build_change(t.topic_id, p, live, election=PREFERRED)
                if rec is not None and rec["data"].get("leader") == broker:
                    out.append(rec)
    return out


def elect_leader(state: ClusterState, topic: str, partition: int, election: str, live: set[int],
                 unclean_allowed: bool = True) -> tuple[int, str | None, dict[str, Any] | None]:
    """Kafka's ReplicationControlManager.electLeader for one partition of an ElectLeaders request:
    (error code, message, the record to write or None)."""
    from kio.schema.errors import ErrorCode

    t = state.topics.get(topic)
    if t is None:
        return ErrorCode.unknown_topic_or_partition, f"No such topic as {topic}", None
    p = t.partitions.get(partition)
    if p is None or p.mode == MODE_NONE:
        return ErrorCode.unknown_topic_or_partition, f"No such partition as {topic}-{partition}", None
    if (election == PREFERRED and p.leader == p.replicas[0]) or (election == UNCLEAN and p.leader >= 0):
        return ErrorCode.election_not_needed, None, None
    rec = build_change(t.topic_id, p, live, election=election)
    if election == PREFERRED:
        if rec is None or rec["data"].get("leader") != p.replicas[0]:
            return ErrorCode.preferred_leader_not_available, None, None
    elif rec is None or rec["data"].get("leader", -1) < 0:
        return ErrorCode.eligible_leaders_not_available, None, None
    return ErrorCode.none, None, rec


# ---- broker epochs (Kafka's broker-epoch fencing, reduced to incarnations) ----------------------
def fence_incarnation(topic_id: Any, p: PartitionState, node: int, live: set[int]) -> dict[str, Any] | None:
    """The change that stops ``node``, restarted under a new incarnation, from counting as the ISR
    member (and leader) its previous incarnation was: Kafka fences the old broker epoch when a
    broker registers again, so a broker back on an empty disk is never elected as the replica that
    had the data. ``node`` leaves the ISR when another live member remains (as for a dead broker,
    the last member stays); if it led, that member leads in a new leader epoch. When it is the only
    live member it keeps leading, in a new leader epoch (its old epoch's state is not trusted)."""
    if node not in p.isr:
        return None
    fence = {"expectedPartitionEpoch": p.partition_epoch, "expectedLeaderEpoch": p.leader_epoch}
    rest = [r for r in p.isr if r != node]
    live_rest = [r for r in p.replicas if r in rest and r in live]
    if live_rest:
        if p.leader == node or p.leader not in live:
            return record("PartitionChangeRecord", topicId=topic_id, partitionId=p.partition, leader=live_rest[0],
                          isr=rest, leaderEpoch=p.leader_epoch + 1, **fence)
        return record("PartitionChangeRecord", topicId=topic_id, partitionId=p.partition, isr=rest, **fence)
    if p.leader == node:
        return record("PartitionChangeRecord", topicId=topic_id, partitionId=p.partition, leader=node,
                      isr=list(p.isr), leaderEpoch=p.leader_epoch + 1, **fence)
    return None
