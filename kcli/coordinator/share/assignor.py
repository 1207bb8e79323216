"""Kafka's ``simple`` assignor for share groups (SimpleAssignor with its homogeneous and
heterogeneous builders, KIP-932).

A share partition may be consumed by several members at once (the share-partition leader hands
each record to one member at a time), so the assignment only spreads load:

* each subscribed partition is shared by ``ceil(members / partitions)`` members ("desired
  sharing"): with more members than partitions every member gets a partition, and with one
  partition every member gets it;
* each member gets about ``sharing * partitions / members`` partitions (Kafka's
  desiredAssignmentCount, counts differing by at most one);
* a member keeps what it had where balance allows (stickiness).

Members with different subscriptions are assigned topic by topic over the members subscribed to
each topic (kcli's simplification of Kafka's heterogeneous builder: same balance rules per topic).
Uses the KIP-848 assignors' :class:`MemberSpec` / :class:`TopicInfo`.
"""

from __future__ import annotations

import math
import uuid

from kcli.coordinator.group.assignors import MemberSpec, TopicInfo

SIMPLE = "simple"  # Kafka's SimpleAssignor.NAME

Assignment = dict[uuid.UUID, set[int]]


def _desired_counts(n_members: int, n_partitions: int) -> tuple[int, list[int]]:
    sharing = (n_members + n_partitions - 1) // n_partitions
    precise = sharing * n_partitions / n_members
    counts = [math.ceil(precise * (i + 1)) - math.ceil(precise * i) for i in range(n_members)]
    return sharing, counts


def assign_balanced(member_ids: list[str], partitions: list[tuple[uuid.UUID, int]],
                    previous: dict[str, set[tuple[uuid.UUID, int]]]) -> dict[str, set[tuple[uuid.UUID, int]]]:
    """The homogeneous builder: ``member_ids`` all subscribe to ``partitions``."""
    out: dict[str, set[tuple[uuid.UUID, int]]] = {m: set() for m in member_ids}
    if not member_ids or not partitions:
        return out
    sharing, counts = _desired_counts(len(member_ids), len(partitions))
    desired = dict(zip(member_ids, counts))
    targets = set(partitions)
    holders: dict[tuple[uuid.UUID, int], set[str]] = {tp: set() for tp in partitions}
    # 1. keep previous partitions still subscribed, up to each member's count and each partition's sharing
    for m in member_ids:
        for tp in sorted(previous.get(m, ()), key=lambda x: (str(x[0]), x[1])):
            if tp in targets and len(out[m]) < desired[m] and len(holders[tp]) < sharing:
                out[m].add(tp)
                holders[tp].add(m)
    # 2. give under-shared partitions to the members with room, least loaded first
    for tp in partitions:
        while len(holders[tp]) < sharing:
            room = [m for m in member_ids if len(out[m]) < desired[m] and tp not in out[m]]
            if not room:
                break
            m = min(room, key=lambda x: (len(out[x]) - desired[x], member_ids.index(x)))
            out[m].add(tp)
            holders[tp].add(m)
    return out


class SimpleAssignor:
    """``assign(members, topics)`` as the KIP-848 assignors: {member id: {topic id: partitions}}."""

    name = SIMPLE

    def assign(self, members: list[MemberSpec], topics: dict[str, TopicInfo]) -> dict[str, Assignment]:
        result: dict[str, Assignment] = {m.member_id: {} for m in members}
        ordered = sorted(members, key=lambda m: m.member_id)
        previous = {m.member_id: {(tid, p) for tid, ps in m.previous.items() for p in ps} for m in members}
        subs = {m.member_id: frozenset(t for t in m.topics if t in topics) for m in ordered}
        groups: dict[frozenset[str], list[str]] = {}
        if len(set(subs.values())) <= 1:  # homogeneous: one pass over every subscribed partition
            groups = {next(iter(subs.values()), frozenset()): [m.member_id for m in ordered]}
        else:  # heterogeneous: topic by topic over its subscribers
            for name in sorted({t for s in subs.values() for t in s}):
                groups[frozenset([name])] = [m.member_id for m in ordered if name in subs[m.member_id]]
        for names, mids in groups.items():
            parts = [(topics[n].topic_id, p) for n in sorted(names) for p in topics[n].partitions]
            for mid, tps in assign_balanced(mids, parts, previous).items():
                for tid, p in tps:
                    result[mid].setdefault(tid, set()).add(p)
        return result
