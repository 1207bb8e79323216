"""Server-side assignors of KIP-848 consumer groups, by Kafka's names: ``uniform`` and ``range``.

The coordinator, not a group leader, computes each member's target assignment from the members'
subscriptions and the topics' partitions. Both assignors are sticky where Kafka's are: a member
keeps the partitions of its previous target assignment that it may still own, so a rebalance
moves only what balance needs. They aim at Kafka's results (uniform: partition counts differ by at
most one among members with the same subscription; range: co-partitioned ranges per topic) but
are kcli's own algorithms, so the exact partition-to-member mapping can differ from Kafka's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Protocol

# Kafka's names (UniformAssignor.NAME, RangeAssignor.NAME).
UNIFORM = "uniform"
RANGE = "range"

TopicPartition = tuple[uuid.UUID, int]


@dataclass(frozen=True)
class TopicInfo:
    """What an assignor needs to know of a topic."""

    name: str
    topic_id: uuid.UUID
    partitions: tuple[int, ...]


@dataclass
class MemberSpec:
    """One member as the assignor sees it: what it subscribes to, what it was given last time."""

    member_id: str
    instance_id: str | None
    topics: frozenset[str]  # subscribed topic names that exist (regexes already resolved)
    previous: dict[uuid.UUID, set[int]] = field(default_factory=dict)  # its previous target assignment

    @property
    def sort_key(self) -> str:
        return self.instance_id or self.member_id


class Assignor(Protocol):
    name: str

    def assign(self, members: list[MemberSpec], topics: dict[str, TopicInfo]) -> dict[str, dict[uuid.UUID, set[int]]]:
        ...


def _empty(members: list[MemberSpec]) -> dict[str, dict[uuid.UUID, set[int]]]:
    return {m.member_id: {} for m in members}


class UniformAssignor:
    """Kafka's ``uniform``: spread every subscribed partition evenly over the members that
    subscribe to its topic, keeping previous owners where balance allows."""

    name = UNIFORM

    def assign(self, members: list[MemberSpec], topics: dict[str, TopicInfo]) -> dict[str, dict[uuid.UUID, set[int]]]:
        out = _empty(members)
        if not members:
            return out
        ordered = sorted(members, key=lambda m: m.sort_key)
        eligible: dict[uuid.UUID, list[MemberSpec]] = {}
        for name, info in topics.items():
            subs = [m for m in ordered if name in m.topics]
            if subs:
                eligible[info.topic_id] = subs
        counts = {m.member_id: 0 for m in members}
        owner: dict[TopicPartition, str] = {}
        all_parts = [(info.topic_id, p) for name, info in sorted(topics.items())
                     if info.topic_id in eligible for p in info.partitions]
        total = len(all_parts)
        # A member's fair share: its partitions over the members that could take them.
        quota = {}
        for m in ordered:
            mine = sum(len(info.partitions) for name, info in topics.items() if name in m.topics)
            sharers = max((len(eligible.get(info.topic_id, ())) for name, info in topics.items()
                           if name in m.topics), default=1)
            quota[m.member_id] = -(-mine // max(sharers, 1)) if mine else 0
        valid = set(all_parts)
        # 1. Stickiness: keep previous partitions that are still valid, up to the quota.
        for m in ordered:
            for tid, parts in sorted(m.previous.items(), key=lambda kv: str(kv[0])):
                if tid not in eligible or m not in eligible[tid]:
                    continue
                for p in sorted(parts):
                    tp = (tid, p)
                    if tp in valid and tp not in owner and counts[m.member_id] < quota[m.member_id]:
                        owner[tp] = m.member_id
                        counts[m.member_id] += 1
        # 2. The rest go to the least-loaded member that subscribes to the topic.
        for tp in all_parts:
            if tp in owner:
                continue
            target = min(eligible[tp[0]], key=lambda m: (counts[m.member_id], m.sort_key))
            owner[tp] = target.member_id
            counts[target.member_id] += 1
        # 3. Balance: move partitions from the most- to the least-loaded eligible member until
        # no move narrows the gap (bounded: each move lowers the sum of squared counts).
        for _ in range(total * max(len(members), 1)):
            moved = False
            for tp in all_parts:
                cur = owner[tp]
                best = min(eligible[tp[0]], key=lambda m: (counts[m.member_id], m.sort_key))
                if counts[cur] - counts[best.member_id] > 1:
                    owner[tp] = best.member_id
                    counts[cur] -= 1
                    counts[best.member_id] += 1
                    moved = True
            if not moved:
                break
        for (tid, p), mid in owner.items():
            out[mid].setdefault(tid, set()).add(p)
        return out


class RangeAssignor:
    """Kafka's ``range``: per topic, the subscribed members in order each take a contiguous
    range of partitions (the first ``partitions % members`` one more), so members subscribed
    to co-partitioned topics get the same partition numbers of each."""

    name = RANGE

    def assign(self, members: list[MemberSpec], topics: dict[str, TopicInfo]) -> dict[str, dict[uuid.UUID, set[int]]]:
        out = _empty(members)
        ordered = sorted(members, key=lambda m: m.sort_key)
        for name, info in sorted(topics.items()):
            subs = [m for m in ordered if name in m.topics]
            if not subs:
                continue
            parts = sorted(info.partitions)
            base, extra = divmod(len(parts), len(subs))
            start = 0
            for i, m in enumerate(subs):
                n = base + (1 if i < extra else 0)
                if n:
                    out[m.member_id].setdefault(info.topic_id, set()).update(parts[start:start + n])
                start += n
        return out


ASSIGNORS: dict[str, type] = {UNIFORM: UniformAssignor, RANGE: RangeAssignor}


def make_assignor(name: str) -> Assignor | None:
    """The assignor called ``name``, or None when kcli has none by that name."""
    cls = ASSIGNORS.get(name)
    return cls() if cls is not None else None
