"""Consumer groups in a cluster: committed offsets behind the shared-state interface (one
contract, run against the data dir's offsets log and against PostgreSQL), and real broker
processes over one database where each group has one coordinator among the live brokers,
which another broker replaces, offsets intact, when it is killed."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kio.schema.errors import ErrorCode

from kcli.coordinator import placement
from kcli.coordinator.group import coordinator as g
from kcli.coordinator.group.offsets import OffsetAndMetadata, OffsetStoreError
from kcli.cluster.local import LocalClusterStore
from kcli.cluster.postgres import PostgresClusterStore
from kcli.cluster.state import StoreSettings
from kcli.protocol.client import WireClient
from tests.fixtures_pg import pg_database, pg_server  # noqa: F401 - fixtures
from tests.kafka_helpers import produce
from tests.test_cluster_state import FAST, brokers_of, wait_for


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def commit(group: str, topic: str, partition: int, offset: int, **kw: Any) -> dict[str, Any]:
    return {"type": "offset", "group": group, "topic": topic, "partition": partition, "offset": offset,
            "leader_epoch": kw.get("leader_epoch", -1), "metadata": kw.get("metadata", ""),
            "commit_timestamp": kw.get("commit_timestamp", 1_700_000_000_000)}


def offsets_of(store: Any, group: str) -> dict[tuple[str, int], int]:
    return {tp: om.offset for tp, om in store.group_offsets(group).items()}


# ---- the offset store contract: data dir (one broker) and PostgreSQL (a cluster) ---------------


@pytest.fixture(params=["file", "postgresql"])
def open_offsets(request, tmp_path) -> Iterator[Callable[[int], Any]]:
    """``open_offsets(node_id)``: an opened offset store of one kind over one shared place, handed
    out by the cluster-state store as the broker gets it."""
    stores: list[Any] = []
    if request.param == "postgresql":
        url = request.getfixturevalue("pg_database")

        def make_cluster(node_id: int) -> Any:
            return PostgresClusterStore(url, node_id, StoreSettings(listen=False))
    else:
        def make_cluster(node_id: int) -> Any:
            return LocalClusterStore(tmp_path / "data")

    def make(node_id: int = 1) -> Any:
        cluster = make_cluster(node_id)
        cluster.open()
        stores.append(cluster)
        offsets = cluster.offset_store(tmp_path / "data")
        offsets.open()
        return offsets

    make.kind = request.param  # type: ignore[attr-defined]
    yield make
    for s in stores:
        s.close()


def test_offset_store_contract_commits_deletions_and_reload(open_offsets):
    async def main() -> None:
        a = open_offsets(1)
        await a.load_group("g1")
        await a.load_group("g2")
        await a.append([commit("g1", "t", 0, 7, leader_epoch=3, metadata="m"), commit("g1", "u", 1, 9)])
        await a.append([commit("g1", "t", 0, 8, leader_epoch=4, metadata="n")])
        await a.append([commit("g2", "t", 0, 1), commit("g2", "u", 0, 2)])
        a.append_behind([{"type": "group", "group": "g2", "protocol_type": "consumer"}])
        assert offsets_of(a, "g1") == {("t", 0): 8, ("u", 1): 9}
        assert a.group_offsets("g1")[("t", 0)] == OffsetAndMetadata(8, 4, "n", 1_700_000_000_000)
        # written behind: visible at once
        a.append_behind([{"type": "offset_delete", "group": "g1", "topic": "u", "partition": 1}])
        a.append_behind([{"type": "topic_delete", "topic": "u", "topic_id": str(uuid.uuid4())}])
        assert offsets_of(a, "g1") == {("t", 0): 8} and offsets_of(a, "g2") == {("t", 0): 1}
        assert a.protocol_types == {"g2": "consumer"}
        assert await a.stored_groups() == {"g1": "", "g2": "consumer"}
        await a.load_group("g3")
        await a.append([commit("g3", "t", 0, 5)])
        a.append_behind([{"type": "group_delete", "group": "g3"}])
        assert not a.has_offsets("g3")
        a.unload_group("g2")
        await a.load_group("g2")  # what the store holds, whoever held it in memory
        assert offsets_of(a, "g2") == {("t", 0): 1} and a.protocol_types.get("g2") == "consumer"
        assert await a.lost_groups(["g1", "g2"]) == set()
        await a.close()

        b = open_offsets(1)  # the next start: a new process reads what the last one wrote
        for gid in ("g1", "g2", "g3"):
            await b.load_group(gid)
        assert offsets_of(b, "g1") == {("t", 0): 8}
        assert b.group_offsets("g1")[("t", 0)] == OffsetAndMetadata(8, 4, "n", 1_700_000_000_000)
        assert offsets_of(b, "g2") == {("t", 0): 1} and b.protocol_types.get("g2") == "consumer"
        assert offsets_of(b, "g3") == {}
        assert await b.stored_groups() == {"g1": "", "g2": "consumer"}
        await b.close()

    run(main())


def test_offset_store_contract_concurrent_commits_all_land(open_offsets):
    async def main() -> None:
        a = open_offsets(1)
        for k in range(4):
            await a.load_group(f"g{k}")
        await asyncio.gather(*[a.append([commit(f"g{i % 4}", "t", i, i)]) for i in range(120)])
        await a.close()
        b = open_offsets(1)
        for k in range(4):
            await b.load_group(f"g{k}")
        assert sum(len(b.group_offsets(f"g{k}")) for k in range(4)) == 120
        assert offsets_of(b, "g1")[("t", 5)] == 5
        await b.close()

    run(main())


@pytest.fixture
def pg_offsets(pg_database) -> Iterator[Callable[[int], Any]]:  # noqa: F811
    opened: list[Any] = []

    def make(node_id: int) -> Any:
        cluster = PostgresClusterStore(pg_database, node_id, StoreSettings(listen=False, connect_timeout_s=2))
        cluster.open()
        opened.append(cluster)
        store = cluster.offset_store(Path("/nonexistent"))
        store.open()
        stores.append(store)
        return store

    stores: list[Any] = []
    yield make
    for s in stores:
        if s._pool is not None:  # a test that failed before closing it
            s._pool.close()
    for c in opened:
        c.close()


def test_the_last_broker_to_load_a_group_is_its_only_writer(pg_offsets):
    """Two brokers that both think they coordinate a group (the live set is changing): the one
    that loaded it last wins; the other's commit is refused (NOT_COORDINATOR, it rediscovers),
    never silently written under the new coordinator's feet."""
    async def main() -> None:
        old, new = pg_offsets(1), pg_offsets(2)
        await old.load_group("grp")
        await old.append([commit("grp", "t", 0, 10)])
        await new.load_group("grp")
        assert offsets_of(new, "grp") == {("t", 0): 10}
        with pytest.raises(OffsetStoreError) as err:
            await old.append([commit("grp", "t", 0, 11)])
        assert (err.value.error_code, err.value.fenced) == (ErrorCode.not_coordinator, True)
        assert await old.lost_groups(["grp"]) == {"grp"}
        await new.append([commit("grp", "t", 0, 12)])
        old.unload_group("grp")
        await old.load_group("grp")  # it moves back: the store's state now, not the old memory
        assert offsets_of(old, "grp") == {("t", 0): 12}
        assert await new.lost_groups(["grp"]) == {"grp"}
        await old.close()
        await new.close()

    run(main())


def test_topic_offsets_are_dropped_once_per_deleted_topic(pg_offsets):
    """Every broker applies the RemoveTopicRecord; the first one drops the offsets, a late one
    does not drop the offsets of a topic of the same name created since."""
    async def main() -> None:
        a, b = pg_offsets(1), pg_offsets(2)
        await a.load_group("ga")
        await b.load_group("gb")
        await a.append([commit("ga", "t", 0, 3), commit("ga", "keep", 0, 4)])
        await b.append([commit("gb", "t", 0, 5)])
        old_topic = str(uuid.uuid4())
        a.append_behind([{"type": "topic_delete", "topic": "t", "topic_id": old_topic}])
        await a.append([commit("ga", "keep", 0, 6)])  # the flush of the deletion is done too
        await b.append([commit("gb", "t", 0, 1)])  # "t" made again, consumed from the start
        b.append_behind([{"type": "topic_delete", "topic": "t", "topic_id": old_topic}])  # late
        await b.append([commit("gb", "keep", 0, 0)])
        c = pg_offsets(3)
        await c.load_group("ga")
        await c.load_group("gb")
        assert offsets_of(c, "ga") == {("keep", 0): 6}
        assert offsets_of(c, "gb") == {("t", 0): 1, ("keep", 0): 0}
        for s in (a, b, c):
            await s.close()

    run(main())


def test_an_unreachable_database_is_a_retriable_error_within_the_timeout(pg_offsets, pg_database, tmp_path):  # noqa: F811
    """Commits and loads answer COORDINATOR_NOT_AVAILABLE (the client retries) within the pool's
    timeout; nothing that was not stored is applied."""
    async def main() -> None:
        s = pg_offsets(1)
        coord = g.GroupCoordinator(tmp_path, {}.__getitem__, s, node_id=1, live_nodes=lambda: [1])
        await coord.start()
        assert await coord.route("grp") == ErrorCode.none
        assert await coord.commit_offsets("grp", -1, "", None, {("t", 0): OffsetAndMetadata(1)}) == {("t", 0): ErrorCode.none}
        s._pool.kwargs = {**s._pool.kwargs, "dbname": "no_such_database"}  # new connections now fail
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'kcli-broker-1-offsets'")
        started = time.monotonic()
        assert await coord.commit_offsets("grp", -1, "", None, {("t", 0): OffsetAndMetadata(2)}) \
            == {("t", 0): ErrorCode.coordinator_not_available}
        assert await coord.route("other") == ErrorCode.coordinator_not_available
        with pytest.raises(OffsetStoreError) as err:
            await s.append([commit("grp", "t", 0, 3)])
        assert err.value.error_code == ErrorCode.coordinator_not_available and not err.value.fenced
        assert time.monotonic() - started < 20  # three waits of the 2 s pool timeout, with margin
        assert coord.committed_offsets("grp") == {("t", 0): 1}  # nothing applied that was not stored
        await coord.close()

    run(main())


def test_coordinator_choice_is_kafkas_partition_then_rendezvous():
    assert placement.java_string_hash("hello") == 99162322  # "hello".hashCode() in Java
    assert placement.offsets_partition("polygenelubricants", 50) == 0  # hashCode is Integer.MIN_VALUE
    groups = [f"group-{i}" for i in range(400)]
    before = {gid: placement.coordinator_node(placement.offsets_partition(gid, 50), [1, 2, 3]) for gid in groups}
    assert set(before.values()) == {1, 2, 3}
    after = {gid: placement.coordinator_node(placement.offsets_partition(gid, 50), [1, 3]) for gid in groups}
    moved = {gid for gid in groups if before[gid] != after[gid]}
    assert moved == {gid for gid in groups if before[gid] == 2}  # only the departed node's groups


def test_coordinators_with_different_views_of_the_live_brokers_never_lose_a_commit(pg_offsets, tmp_path):
    """Node 2 has just joined: node 2 already sees it coordinates the group, node 1 does not know
    yet. Node 2 loads the group with node 1's commit; node 1's next commit is refused with
    NOT_COORDINATOR and its parked members are sent away; once node 1 sees node 2 it lets go."""
    async def main() -> None:
        group = group_for(([1, 2], 2))
        solo = next(f"solo-{i}" for i in range(1000) if placement.coordinator_node(placement.offsets_partition(f"solo-{i}", 50), [1, 2]) == 2)
        cfg = {"group.initial.rebalance.delay.ms": 60_000}
        view1: list[int] = [1]
        c1 = g.GroupCoordinator(tmp_path / "n1", cfg.__getitem__, pg_offsets(1), node_id=1, live_nodes=lambda: view1)
        c2 = g.GroupCoordinator(tmp_path / "n2", cfg.__getitem__, pg_offsets(2), node_id=2, live_nodes=lambda: [1, 2])
        await c1.start()
        await c2.start()
        assert await c1.route(group) == ErrorCode.none
        assert await c1.commit_offsets(group, -1, "", None, {("t", 0): OffsetAndMetadata(4)}) == {("t", 0): ErrorCode.none}
        parked = asyncio.create_task(c1.join_group(g.JoinRequest(
            group, "", None, "client", "/127.0.0.1", 10_000, 10_000, "consumer", [("range", b"")],
            require_known_member_id=False)))
        await asyncio.sleep(0.2)
        assert not parked.done()  # waiting out the initial rebalance delay

        assert await c1.route(solo) == ErrorCode.none
        assert await c1.commit_offsets(solo, -1, "", None, {("t", 0): OffsetAndMetadata(1)}) == {("t", 0): ErrorCode.none}

        for gid in (group, solo):
            assert await c2.route(gid) == ErrorCode.none
        assert {tp: om.offset for tp, om in c2.fetch_offsets(group, None)[1].items()} == {("t", 0): 4}
        assert await c2.commit_offsets(solo, -1, "", None, {("t", 0): OffsetAndMetadata(6)}) == {("t", 0): ErrorCode.none}
        assert await c1.commit_offsets(solo, -1, "", None, {("t", 0): OffsetAndMetadata(5)}) == {("t", 0): ErrorCode.not_coordinator}
        assert c2.committed_offsets(solo) == {("t", 0): 6}
        await c1.check_ownership()  # node 1 finds its claim of the group taken
        assert (await asyncio.wait_for(parked, 5)).error == ErrorCode.not_coordinator

        view1.append(2)
        await c1.check_ownership()
        assert await c1.route(solo) == ErrorCode.not_coordinator
        assert await c2.route(solo) == ErrorCode.none and c2.committed_offsets(solo) == {("t", 0): 6}
        await c1.close()
        await c2.close()

    run(main())


def test_a_new_coordinator_loads_its_stored_groups_so_retention_reaches_them(pg_offsets, tmp_path):
    """A group whose consumers left before its coordinator died: nobody asks for it again, yet
    the broker that coordinates it now lists it, loads it and expires its offsets in time."""
    async def main() -> None:
        cfg = {"offsets.retention.minutes": 1}
        c1 = g.GroupCoordinator(tmp_path / "n1", cfg.__getitem__, pg_offsets(1), node_id=1, live_nodes=lambda: [1])
        await c1.start()
        assert await c1.route("idle") == ErrorCode.none
        await c1.commit_offsets("idle", -1, "", None, {("t", 0): OffsetAndMetadata(3)})
        await c1.close()  # as if it died

        c2 = g.GroupCoordinator(tmp_path / "n2", cfg.__getitem__, pg_offsets(2), node_id=2, live_nodes=lambda: [2])
        await c2.start()
        assert "idle" not in c2.groups and await c2.list_coordinated_groups() == [("idle", "", g.EMPTY)]
        assert await c2.load_coordinated_groups() == 1
        assert c2.committed_offsets("idle") == {("t", 0): 3}
        assert c2.expire_offsets(int(time.time() * 1000) + 61_000) == 1
        await c2.close()

        c3 = g.GroupCoordinator(tmp_path / "n3", cfg.__getitem__, pg_offsets(3), node_id=3, live_nodes=lambda: [3])
        await c3.start()
        assert await c3.list_coordinated_groups() == []
        assert await c3.route("idle") == ErrorCode.none and c3.committed_offsets("idle") == {}
        await c3.close()

    run(main())


# ---- real brokers over one database -------------------------------------------------------------

NOT_COORDINATOR = 16


def find_coordinator(bootstrap: str, group: str) -> tuple[int, int, int]:
    """(error, node id, port) from FindCoordinator v3 and, checked equal, v4's batched form.

    The broker's live set may refresh between the two requests while a coordinator moves; the
    answers must then agree on a second try (a view changes at most once a second)."""
    for _ in range(3):
        with WireClient(bootstrap, timeout=10) as c:
            one = c.request(10, 3, {"key": group, "key_type": 0})
            many = c.request(10, 4, {"key_type": 0, "coordinator_keys": [group]}).coordinators[0]
        a = (int(one.error_code), int(one.node_id), int(one.port))
        b = (int(many.error_code), int(many.node_id), int(many.port))
        if a == b:
            return a
    raise AssertionError(f"FindCoordinator v3 answered {a}, v4 {b}, three times running")


def fetch_committed(bootstrap: str, group: str, topic: str, partitions: int) -> tuple[int, dict[int, int]]:
    with WireClient(bootstrap, timeout=10) as c:
        r = c.request(9, 7, {"group_id": group, "topics": [{"name": topic, "partition_indexes": list(range(partitions))}],
                             "require_stable": False})
    got = {int(p.partition_index): int(p.committed_offset) for t in r.topics for p in t.partitions}
    return int(r.error_code), {p: o for p, o in got.items() if o >= 0}


def group_for(*placements: tuple[list[int], int]) -> str:
    """A group id that each live set ``nodes`` of ``(nodes, node)`` places on ``node``."""
    for i in range(10_000):
        gid = f"orders-app-{i}"
        if all(placement.coordinator_node(placement.offsets_partition(gid, 50), nodes) == want for nodes, want in placements):
            return gid
    raise AssertionError("no such group id")


def cluster(broker_factory: Any, url: str, node_id: int, objects: Path) -> Any:
    return broker_factory({**FAST, "group.initial.rebalance.delay.ms": "0"}, name=f"node{node_id}",
                          extra_args=["--cluster", url, "--node-id", str(node_id), "--rack", f"r{node_id}",
                                      "--object-store", objects.as_uri()])


def consume(bootstrap: str, group: str, topic: str, count: int, timeout: float = 40.0) -> list[Any]:
    """Up to ``count`` records of ``group`` from its committed offsets, committed synchronously
    every 10 records and at the end; the consumer leaves the group on close."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "session.timeout.ms": 6000})
    c.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < count and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            out.append(m)
            if len(out) % 10 == 0:
                c.commit(asynchronous=False)
        if len(out) % 10:
            c.commit(asynchronous=False)
    finally:
        c.close()
    return out


def test_group_coordinator_fails_over_with_committed_offsets_intact(broker_factory, pg_database, tmp_path):  # noqa: F811
    objects = tmp_path / "objects"
    brokers = {n: cluster(broker_factory, pg_database, n, objects) for n in (1, 2, 3)}
    for b in brokers.values():
        wait_for(lambda b=b: set(brokers_of(b.bootstrap)) == {1, 2, 3}, 10, "three brokers")
    admin = AdminClient({"bootstrap.servers": brokers[1].bootstrap})  # alive until the result
    admin.create_topics([NewTopic("events", 2, 1, config={"diskless.enable": "true"})])["events"].result(15)
    values = [b"%04d" % i for i in range(120)]
    produce(brokers[2].bootstrap, "events", values, keys=[b"%d" % (i % 5) for i in range(120)])
    group = group_for(([1, 2, 3], 2))
    first = consume(brokers[1].bootstrap, group, "events", 50)
    assert len(first) == 50

    # every broker names the same coordinator; the others refuse the group's requests
    for b in brokers.values():
        assert find_coordinator(b.bootstrap, group) == (0, 2, brokers[2].port)
    err, committed = fetch_committed(brokers[2].bootstrap, group, "events", 2)
    assert err == 0 and sum(committed.values()) == 50
    for n in (1, 3):
        assert fetch_committed(brokers[n].bootstrap, group, "events", 2)[0] == NOT_COORDINATOR
        with WireClient(brokers[n].bootstrap, timeout=10) as c:
            assert int(c.request(12, 4, {"group_id": group, "generation_id": 1, "member_id": "m",
                                         "group_instance_id": None}).error_code) == NOT_COORDINATOR
            assert group not in [x.group_id for x in c.request(16, 4, {"states_filter": []}).groups]
    with WireClient(brokers[2].bootstrap, timeout=10) as c:
        assert group in [x.group_id for x in c.request(16, 4, {"states_filter": []}).groups]

    brokers[2].kill9()

    def survivors_agree() -> tuple[int, int, int] | None:  # each broker refreshes the live set each second
        one, three = find_coordinator(brokers[1].bootstrap, group), find_coordinator(brokers[3].bootstrap, group)
        return one if one == three and one[0] == 0 and one[1] != 2 else None

    # It moves once broker 2's database session (and node lock) is gone, at the survivors' next refresh.
    successor = wait_for(survivors_agree, 10, "another broker to coordinate the group")
    rest = consume(brokers[1].bootstrap, group, "events", 70)
    # resumed exactly at the committed offsets: nothing read twice, nothing skipped
    assert sorted(m.value() for m in first + rest) == values
    for p in (0, 1):
        mine = [m.offset() for m in rest if m.partition() == p]
        assert mine == list(range(committed.get(p, 0), committed.get(p, 0) + len(mine)))
    err, after = fetch_committed(brokers[successor[1]].bootstrap, group, "events", 2)
    assert err == 0 and sum(after.values()) == 120

    brokers[2].start()  # rejoins; the group goes back to it and it loads what was committed meanwhile
    wait_for(lambda: all(find_coordinator(b.bootstrap, group)[1] == 2 for b in brokers.values()), 10,
             "every broker to name node 2 again")
    assert fetch_committed(brokers[2].bootstrap, group, "events", 2) == (0, after)
    wait_for(lambda: fetch_committed(brokers[successor[1]].bootstrap, group, "events", 2)[0] == NOT_COORDINATOR, 5,
             "the interim coordinator to hand the group back")


def test_a_group_that_moves_away_and_back_is_reloaded_not_stale(broker_factory, pg_database, tmp_path):  # noqa: F811
    """Node 1 coordinates the group; node 3 joins and takes it (node 1 unloads it); commits go
    to node 3; node 3 stops and node 1 coordinates again with node 3's commits, not its old view."""
    objects = tmp_path / "objects"
    b1, b2 = cluster(broker_factory, pg_database, 1, objects), cluster(broker_factory, pg_database, 2, objects)
    group = group_for(([1, 2], 1), ([1, 2, 3], 3))
    admin = AdminClient({"bootstrap.servers": b1.bootstrap})  # alive until the result
    admin.create_topics([NewTopic("moves", 1, 1, config={"diskless.enable": "true"})])["moves"].result(15)
    wait_for(lambda: find_coordinator(b2.bootstrap, group)[1] == 1, 10, "both brokers")

    def commit_at(bootstrap: str, offset: int) -> None:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
        try:  # a standalone commit (no membership), sent to the coordinator FindCoordinator names
            c.commit(offsets=[TopicPartition("moves", 0, offset)], asynchronous=False)
        finally:
            c.close()

    commit_at(b2.bootstrap, 5)
    assert fetch_committed(b1.bootstrap, group, "moves", 1) == (0, {0: 5})
    b3 = cluster(broker_factory, pg_database, 3, objects)
    wait_for(lambda: all(find_coordinator(b.bootstrap, group)[1] == 3 for b in (b1, b2, b3)), 10,
             "node 3 to coordinate the group")
    wait_for(lambda: fetch_committed(b1.bootstrap, group, "moves", 1)[0] == NOT_COORDINATOR, 5, "node 1 to let go")
    commit_at(b2.bootstrap, 9)
    assert fetch_committed(b3.bootstrap, group, "moves", 1) == (0, {0: 9})
    b3.stop()  # a clean stop gives up the registration at once
    wait_for(lambda: find_coordinator(b1.bootstrap, group)[1] == 1, 10, "node 1 to coordinate again")
    assert fetch_committed(b1.bootstrap, group, "moves", 1) == (0, {0: 9})

    # OffsetDelete (KIP-496) too goes to the coordinator only, and deletes in the shared store
    delete = {"group_id": group, "topics": [{"name": "moves", "partitions": [{"partition_index": 0}]}]}
    with WireClient(b2.bootstrap, timeout=10) as c:
        assert int(c.request(47, 0, delete).error_code) == NOT_COORDINATOR
    with WireClient(b1.bootstrap, timeout=10) as c:
        r = c.request(47, 0, delete)
    assert int(r.error_code) == 0 and [int(p.error_code) for p in r.topics[0].partitions] == [0]
    assert fetch_committed(b1.bootstrap, group, "moves", 1) == (0, {})
    b1.stop()  # node 2 takes the group over from the database: the deletion is there
    wait_for(lambda: find_coordinator(b2.bootstrap, group)[1] == 2, 10, "node 2 to coordinate the group")
    assert fetch_committed(b2.bootstrap, group, "moves", 1) == (0, {})
