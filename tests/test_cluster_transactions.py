"""Transactions in a cluster: real broker processes over one PostgreSQL, confluent-kafka's
transactional producer writing classic partitions hosted on different brokers (markers sent
between brokers), offsets committed at a group coordinator on another broker, each
transactional id coordinated by one broker, and kill -9 of that coordinator mid-transaction."""

from __future__ import annotations

import asyncio

import time
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kcli.coordinator.group import coordinator as g
from kcli.coordinator.transaction.state import (
    ONGOING, TransactionFencedError, TransactionMetadata, TransactionStateError,
)
from kcli.cluster.postgres import PostgresClusterStore
from kcli.cluster.state import StoreSettings
from kcli.protocol.client import WireClient
from tests.fixtures_pg import pg_database, pg_server  # noqa: F401 - fixtures
from tests.kafka_helpers import produce
from tests.test_cluster_groups import cluster, group_for
from tests.test_cluster_state import brokers_of, wait_for
from tests.test_transactions import _kcli, read, txn_producer

NOT_COORDINATOR = 16
UNSTABLE_OFFSET_COMMIT = 88


def stable_offset(bootstrap: str, group: str) -> tuple[int, int]:
    """(error, offset) of in-0 from OffsetFetch with require_stable (KIP-447)."""
    with WireClient(bootstrap, timeout=10) as c:
        r = c.request(9, 7, {"group_id": group, "topics": [{"name": "in", "partition_indexes": [0]}],
                             "require_stable": True})
    part = r.topics[0].partitions[0]
    return int(part.error_code), int(part.committed_offset)


def txn_id_for(nodes: list[int], want: int, prefix: str) -> str:
    """A transactional id that the live set ``nodes`` places on ``want`` (as groups are placed)."""
    for i in range(10_000):
        tid = f"{prefix}-{i}"
        if g.coordinator_node(g.offsets_partition(tid, 50), nodes) == want:
            return tid
    raise AssertionError("no such transactional id")


def put(p: Producer, topic: str, prefix: bytes, n: int) -> None:
    """``prefix``0.. ``prefix``n-1 alternately to partitions 0 and 1."""
    for i in range(n):
        p.produce(topic, value=b"%s%d" % (prefix, i), partition=i % 2)


def find_txn_coordinator(bootstrap: str, tid: str) -> tuple[int, int]:
    with WireClient(bootstrap, timeout=10) as c:
        r = c.request(10, 3, {"key": tid, "key_type": 1})
    return int(r.error_code), int(r.node_id)


def hosts_of(bootstrap: str, topic: str) -> dict[int, int]:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return {p.id: p.leader for p in md.topics[topic].partitions.values()}


def create(bootstrap: str, topic: str, assignment: list[list[int]]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the result
    admin.create_topics([NewTopic(topic, len(assignment), replica_assignment=assignment)])[topic].result(15)


def test_pg_transaction_store_claims_fence_the_previous_coordinator(pg_database, tmp_path) -> None:  # noqa: F811
    clusters = [PostgresClusterStore(pg_database, n, StoreSettings(listen=False)) for n in (1, 2)]
    for c in clusters:
        c.open()
    one, two = (c.transaction_store(tmp_path) for c in clusters)

    async def main() -> None:
        assert one.open() == {} and two.open() == {}  # nothing loaded up front: ids are claimed
        assert await one.claim("t") is None
        md = TransactionMetadata("t", 1000, 0, 60000, state=ONGOING, partitions=frozenset({("x", 0)}), start_ms=5)
        await one.write([md.to_record()], {})
        assert await two.orphans() == ["t"] and await one.orphans() == []
        got = await two.claim("t")  # the successor reads what the first one wrote
        assert got is not None and got.to_record() == md.to_record()
        assert await one.orphans() == ["t"] and await two.orphans() == []
        with pytest.raises(TransactionFencedError):
            await one.write([{**md.to_record(), "state": "PrepareAbort"}], {})
        with pytest.raises(TransactionFencedError):  # and it stays fenced: it must claim again
            await one.write([md.to_record()], {})
        await two.write([{"type": "txn_delete", "transactional_id": "t"}], {})
        assert await one.claim("t") is None
        one.close()
        two.close()

    try:
        asyncio.run(main())
    finally:
        for c in clusters:
            c.close()


def test_pg_transaction_store_outage_is_a_retriable_error_within_the_timeout(pg_database, tmp_path) -> None:  # noqa: F811
    cluster = PostgresClusterStore(pg_database, 1, StoreSettings(listen=False, connect_timeout_s=2))
    cluster.open()
    store = cluster.transaction_store(tmp_path)
    store.open()

    async def main() -> None:
        assert await store.claim("t") is None
        md = TransactionMetadata("t", 1000, 0, 60000, state=ONGOING, start_ms=5)
        await store.write([md.to_record()], {})
        store._pool.kwargs = {**store._pool.kwargs, "dbname": "no_such_database"}  # new connections now fail
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE application_name = 'kcli-broker-1-transactions'")
        started = time.monotonic()
        for attempt in (store.write([md.to_record()], {}), store.claim("u"), store.orphans()):
            with pytest.raises(TransactionStateError) as err:
                await attempt
            assert not isinstance(err.value, TransactionFencedError)  # COORDINATOR_NOT_AVAILABLE, not fenced
        assert time.monotonic() - started < 20  # three waits of the 2 s pool timeout, with margin
        assert store.claims.get("t") is not None  # still this broker's: nothing was refused, only unreachable

    try:
        asyncio.run(main())
    finally:
        store.close()
        cluster.close()


def test_transaction_over_partitions_of_two_brokers_with_offsets_at_a_third_place(broker_factory, pg_database,  # noqa: F811
                                                                                   tmp_path) -> None:
    objects = tmp_path / "objects"
    b = {n: cluster(broker_factory, pg_database, n, objects) for n in (1, 2)}
    for x in b.values():
        wait_for(lambda x=x: set(brokers_of(x.bootstrap)) == {1, 2}, 10, "two brokers")
    create(b[1].bootstrap, "tx", [[1], [2]])
    create(b[1].bootstrap, "in", [[1]])
    assert hosts_of(b[2].bootstrap, "tx") == {0: 1, 1: 2}
    produce(b[1].bootstrap, "in", [b"%d" % i for i in range(10)])
    tid = txn_id_for([1, 2], 1, "tx-app")  # coordinated by node 1: markers for tx-1 go to node 2
    group = group_for(([1, 2], 2))  # the group's coordinator is node 2

    # every broker names the same coordinator; a transaction API elsewhere is NOT_COORDINATOR
    for x in b.values():
        assert find_txn_coordinator(x.bootstrap, tid) == (0, 1)
    with WireClient(b[2].bootstrap, timeout=10) as c:
        r = c.request(22, 3, {"transactional_id": tid, "transaction_timeout": 60000, "producer_id": -1,
                              "producer_epoch": -1})
        assert int(r.error_code) == NOT_COORDINATOR

    # bootstrap through node 2 only: the client finds node 1 for the transaction
    p = txn_producer(b[2].bootstrap, tid)
    c = Consumer({"bootstrap.servers": b[1].bootstrap, "group.id": group, "enable.auto.commit": False})
    p.begin_transaction()
    put(p, "tx", b"c", 6)
    p.send_offsets_to_transaction([TopicPartition("in", 0, 5)], c.consumer_group_metadata(), 30)
    # node 2, the group's coordinator, knows the offset is held by a transaction coordinated by node 1
    assert stable_offset(b[2].bootstrap, group) == (UNSTABLE_OFFSET_COMMIT, -1)
    p.commit_transaction(30)
    assert stable_offset(b[2].bootstrap, group) == (0, 5)
    p.begin_transaction()
    put(p, "tx", b"a", 4)
    p.send_offsets_to_transaction([TopicPartition("in", 0, 10)], c.consumer_group_metadata(), 30)
    p.flush(30)
    assert stable_offset(b[2].bootstrap, group) == (UNSTABLE_OFFSET_COMMIT, 5)
    p.abort_transaction(30)
    assert stable_offset(b[2].bootstrap, group) == (0, 5)
    p.begin_transaction()
    p.produce("tx", value=b"last", partition=1)
    p.commit_transaction(30)

    committed = sorted([b"c%d" % i for i in range(6)] + [b"last"])
    assert read(b[2].bootstrap, "tx", 2, "read_committed", expected=7) == committed
    assert read(b[1].bootstrap, "tx", 2, "read_uncommitted", expected=11) == sorted(
        committed + [b"a%d" % i for i in range(4)])
    # the committed transaction's offset is at the group's coordinator; the aborted one's is not
    assert c.committed([TopicPartition("in", 0)], timeout=10)[0].offset == 5

    # A coordinator that made PrepareCommit durable and died before the markers (simulated: the
    # row is PrepareCommit under another claim): node 1 takes the id over and completes it.
    p.begin_transaction()
    put(p, "tx", b"p", 4)
    p.send_offsets_to_transaction([TopicPartition("in", 0, 8)], c.consumer_group_metadata(), 30)
    p.flush(30)
    with psycopg.connect(pg_database, autocommit=True) as conn:
        n = conn.execute("""UPDATE transactions SET state = 'PrepareCommit', claim = gen_random_uuid(),
                                record = jsonb_set(record, '{state}', '"PrepareCommit"')
                            WHERE transactional_id = %s AND state = 'Ongoing'""", (tid,)).rowcount
    assert n == 1
    committed += [b"p%d" % i for i in range(4)]
    assert read(b[2].bootstrap, "tx", 2, "read_committed", expected=11, settle=6.0) == sorted(committed)
    wait_for(lambda: c.committed([TopicPartition("in", 0)], timeout=10)[0].offset == 8, 10, "the offsets")
    p.commit_transaction(30)  # the client's own EndTxn finds the transaction committed
    c.close()

    # kcli transactions through node 2: describe asks the coordinator (node 1), list asks every
    # broker, describe-producers the partition's host (tx-0 is on node 1)
    d = _kcli(b[2].bootstrap, "transactions", "describe", "--transactional-id", tid)
    assert d["state"] == "CompleteCommit"
    assert (tid, "CompleteCommit") in [(t["transactional_id"], t["state"])
                                       for t in _kcli(b[2].bootstrap, "transactions", "list")]
    producers = _kcli(b[2].bootstrap, "transactions", "describe-producers", "--topic", "tx", "--partition", "0")
    assert [x["producer_id"] for x in producers] == [d["producer_id"]]


def test_transaction_survives_kill9_of_its_coordinator(broker_factory, pg_database, tmp_path) -> None:  # noqa: F811
    objects = tmp_path / "objects"
    b = {n: cluster(broker_factory, pg_database, n, objects) for n in (1, 2, 3)}
    for x in b.values():
        wait_for(lambda x=x: set(brokers_of(x.bootstrap)) == {1, 2, 3}, 10, "three brokers")
    create(b[1].bootstrap, "kx", [[1], [2]])
    tid = txn_id_for([1, 2, 3], 3, "kx-app")  # node 3 coordinates it and hosts no partition of kx
    p = txn_producer(b[1].bootstrap, tid, **{"transaction.timeout.ms": 20000})
    assert find_txn_coordinator(b[1].bootstrap, tid) == (0, 3)
    p.begin_transaction()
    put(p, "kx", b"A", 6)
    p.commit_transaction(30)

    p.begin_transaction()
    put(p, "kx", b"B", 6)
    p.flush(30)
    b[3].kill9()  # mid-transaction: its state is in PostgreSQL, its successor takes it over
    try:
        p.commit_transaction(60)
        b_committed = True
    except KafkaException as err:
        assert err.args[0].txn_requires_abort(), err
        p.abort_transaction(60)
        b_committed = False
    assert find_txn_coordinator(b[1].bootstrap, tid)[1] in (1, 2)
    p.begin_transaction()
    put(p, "kx", b"C", 4)
    p.commit_transaction(60)

    want = [b"A%d" % i for i in range(6)] + [b"C%d" % i for i in range(4)]
    if b_committed:
        want += [b"B%d" % i for i in range(6)]
    assert read(b[2].bootstrap, "kx", 2, "read_committed", expected=len(want)) == sorted(want)
    assert read(b[1].bootstrap, "kx", 2, "read_uncommitted", expected=16) == sorted(
        [b"A%d" % i for i in range(6)] + [b"B%d" % i for i in range(6)] + [b"C%d" % i for i in range(4)])


def test_transaction_over_diskless_and_classic_partitions_in_a_cluster(broker_factory, pg_database,  # noqa: F811
                                                                        tmp_path) -> None:
    """A transaction coordinated by node 1 over a diskless topic (its markers are WAL objects the
    coordinator's broker commits through the shared batch coordinator) and a classic partition
    hosted by node 2 (its marker goes there as WriteTxnMarkers): read_committed sees exactly the
    committed records through either broker."""
    objects = tmp_path / "objects"
    b = {n: cluster(broker_factory, pg_database, n, objects) for n in (1, 2)}
    for x in b.values():
        wait_for(lambda x=x: set(brokers_of(x.bootstrap)) == {1, 2}, 10, "two brokers")
    admin = AdminClient({"bootstrap.servers": b[1].bootstrap})
    admin.create_topics([NewTopic("dtx", 2, 1, config={"diskless.enable": "true"})])["dtx"].result(15)
    create(b[1].bootstrap, "ctx", [[2]])
    tid = txn_id_for([1, 2], 1, "dtx-app")
    p = txn_producer(b[2].bootstrap, tid)
    p.begin_transaction()
    put(p, "dtx", b"c", 6)
    p.produce("ctx", value=b"c-classic", partition=0)
    p.commit_transaction(30)
    p.begin_transaction()
    put(p, "dtx", b"a", 4)
    p.produce("ctx", value=b"a-classic", partition=0)
    p.flush(30)
    p.abort_transaction(30)
    p.begin_transaction()
    put(p, "dtx", b"z", 2)
    p.commit_transaction(30)
    committed = sorted([b"c%d" % i for i in range(6)] + [b"z0", b"z1"])
    for x in b.values():
        assert read(x.bootstrap, "dtx", 2, "read_committed", expected=8) == committed
    assert read(b[1].bootstrap, "dtx", 2, "read_uncommitted", expected=12) == sorted(
        committed + [b"a%d" % i for i in range(4)])
    assert read(b[1].bootstrap, "ctx", 1, "read_committed", expected=1) == [b"c-classic"]
