"""Replica placement and leader choice (kcli/cluster/placement.py): pure functions every broker of
a cluster evaluates alike, checked against the properties Metadata relies on."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcli.cluster.placement import PlacementError, assign_replicas, diskless_leader, rack_alternated
from kcli.cluster.state import BrokerRegistration


def regs(*racks: str | None) -> list[BrokerRegistration]:
    return [BrokerRegistration(i + 1, "127.0.0.1", 9000 + i, rack) for i, rack in enumerate(racks)]


def test_rack_alternated_interleaves_racks():
    assert rack_alternated(regs("a", "a", "b", "b", "c")) == [1, 3, 5, 2, 4]


def test_replicas_spread_over_brokers_and_racks():
    brokers = regs("a", "b", "c", "a", "b", "c")
    placement = assign_replicas(uuid.uuid4(), range(60), 3, brokers)
    rack_of = {b.node_id: b.rack for b in brokers}
    for replicas in placement.values():
        assert len(set(replicas)) == 3 and {rack_of[r] for r in replicas} == {"a", "b", "c"}
    leaders = Counter(r[0] for r in placement.values())
    assert set(leaders) == {1, 2, 3, 4, 5, 6} and max(leaders.values()) == min(leaders.values())


def test_replication_factor_above_the_brokers_is_kafkas_error():
    with pytest.raises(PlacementError, match="only 2 broker"):
        assign_replicas(uuid.uuid4(), range(1), 3, regs("a", "b"))


def test_more_replicas_than_racks_fill_with_distinct_brokers():
    placement = assign_replicas(uuid.uuid4(), range(8), 3, regs("a", "a", "b"))
    assert all(len(set(r)) == 3 for r in placement.values())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", None]), min_size=1, max_size=7), st.integers(0, 50), st.uuids())
def test_diskless_leader_is_live_rack_local_and_stable(racks, partition, topic_id):
    live = regs(*racks)
    ids = [b.node_id for b in live]
    for client in ("a", "b", "zz", None):
        leader = diskless_leader(topic_id, partition, [99], live, client)
        assert leader in ids
        if client is not None and client in racks:
            assert dict((b.node_id, b.rack) for b in live)[leader] == client
        assert diskless_leader(topic_id, partition, [99], list(reversed(live)), client) == leader  # stable


def test_live_replica_first_and_only_a_dead_brokers_partitions_move():
    live = regs("a", "b", "c")
    tid = uuid.uuid4()
    assert diskless_leader(tid, 0, [2, 3], live, None) == 2
    assert diskless_leader(tid, 0, [2, 3], live, "c") == 3
    before = {p: diskless_leader(tid, p, [], live, None) for p in range(300)}
    assert set(Counter(before.values())) == {1, 2, 3}
    after = {p: diskless_leader(tid, p, [], [b for b in live if b.node_id != 2], None) for p in range(300)}
    assert all(after[p] == before[p] for p in before if before[p] != 2)
    assert diskless_leader(tid, 0, [1], [], None) == -1
