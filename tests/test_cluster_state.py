"""Shared cluster state (kcli/cluster/): the store interface against the local metadata log and a
real PostgreSQL server, then real `kcli broker start --cluster ...` processes sharing one database."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from kio.schema.errors import ErrorCode

from kcli.metadata.metadata_log import InvalidRecordError, record
from kcli.cluster.local import LocalClusterStore
from kcli.cluster.postgres import PostgresClusterStore
from kcli.cluster.state import NodeIdInUseError, StoreSettings
from kcli.protocol.errors import BrokerError
from tests.fixtures_cli import REPO, assert_one_line_error, cli_env  # noqa: F401 - fixture
from tests.fixtures_pg import pg_database, pg_server, start_pg_server, stop_pg_server  # noqa: F401 - fixtures


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def topic_recs(name: str, partitions: int = 1, configs: dict[str, str] | None = None) -> list[dict[str, Any]]:
    tid = uuid.uuid4()
    recs = [record("TopicRecord", name=name, topicId=tid)]
    recs += [record("PartitionRecord", topicId=tid, partitionId=p, leader=1, replicas=[1], isr=[1]) for p in range(partitions)]
    recs += [record("ConfigRecord", resourceType=2, resourceName=name, name=k, value=v) for k, v in (configs or {}).items()]
    return recs


def _opened_stores(build: Callable[[int, StoreSettings], Any]) -> Iterator[Callable[..., Any]]:
    """A factory of opened stores (``make(node_id, **settings)``), all closed at the end."""
    opened: list[Any] = []

    def make(node_id: int = 1, **settings: Any) -> Any:
        store = build(node_id, StoreSettings(**settings))
        store.open()
        opened.append(store)
        return store

    yield make
    for s in opened:
        s.close()


@pytest.fixture(params=["local", "postgresql"])
def make_store(request, tmp_path) -> Iterator[Callable[..., Any]]:
    """A factory of opened stores of one kind over one shared place (data dir or database)."""
    if request.param == "postgresql":
        url = request.getfixturevalue("pg_database")
        yield from _opened_stores(lambda node_id, settings: PostgresClusterStore(url, node_id, settings))
    else:
        yield from _opened_stores(lambda _node_id, _settings: LocalClusterStore(tmp_path / "data"))


@pytest.fixture
def pg_stores(pg_database) -> Iterator[Callable[..., PostgresClusterStore]]:  # noqa: F811
    yield from _opened_stores(lambda node_id, settings: PostgresClusterStore(pg_database, node_id, settings))


# ---- both implementations -----------------------------------------------------------------------


def test_append_order_and_replay_on_reopen(make_store):
    a = make_store()
    heard: list[str] = []
    a.set_listener(lambda recs: heard.extend(r["type"] for r in recs))
    a.append(topic_recs("first", 2, {"retention.ms": "1000"}))
    a.append(topic_recs("second"))
    a.append([record("ConfigRecord", resourceType=2, resourceName="first", name="retention.ms", value="2000")])
    assert heard[:4] == ["TopicRecord", "PartitionRecord", "PartitionRecord", "ConfigRecord"]
    a.close()
    b = make_store()
    assert list(b.state.topics) == ["first", "second"]
    assert b.state.topics["first"].configs == {"retention.ms": "2000"}
    assert sorted(b.state.topics["first"].partitions) == [0, 1]


def test_bad_record_is_refused_before_anything_is_written(make_store):
    a = make_store()
    bad = topic_recs("half", 1, {"no.such.config": "1"})  # a good TopicRecord, then a bad ConfigRecord
    with pytest.raises(InvalidRecordError):
        a.append(bad)
    assert "half" not in a.state.topics
    a.close()
    assert "half" not in make_store().state.topics  # nothing of the batch was written


# ---- PostgreSQL ---------------------------------------------------------------------------------


def run_in_loop(store: PostgresClusterStore) -> Callable[[], None]:
    """Run ``store.run`` on its own event loop thread; returns a stop function."""
    stop = threading.Event()

    def main() -> None:
        asyncio.run(store.run(stop.is_set))

    t = threading.Thread(target=main, daemon=True)
    t.start()

    def halt() -> None:
        stop.set()
        t.join(timeout=15)
    return halt


def test_other_brokers_learn_appends_promptly_through_notify(pg_stores):
    a = pg_stores(1)
    b = pg_stores(2, poll_interval_ms=60_000)  # only a NOTIFY can wake it within the test
    heard: list[dict[str, Any]] = []
    b.set_listener(heard.extend)
    halt = run_in_loop(b)
    try:
        time.sleep(1.0)  # let the LISTEN connection come up (the first wake-up catches up anyway)
        a.append(topic_recs("via-notify"))
        wait_for(lambda: "via-notify" in b.state.topics, 10, "the NOTIFY wake-up")
        assert [r["type"] for r in heard] == ["TopicRecord", "PartitionRecord"]
    finally:
        halt()


def test_polling_catches_up_when_a_notify_is_missed(pg_stores, pg_database):  # noqa: F811
    b = pg_stores(2, listen=False, poll_interval_ms=300)
    halt = run_in_loop(b)
    try:
        # a record committed without NOTIFY (a notification lost while b was disconnected)
        with psycopg.connect(pg_database, autocommit=True) as conn:
            conn.execute("INSERT INTO metadata_records (record, node_id) VALUES (%s, 1)",
                         (psycopg.types.json.Jsonb(topic_recs("no-notify")[0]),))
        wait_for(lambda: "no-notify" in b.state.topics, 10, "the polling fallback")
    finally:
        halt()


def test_concurrent_appends_keep_one_total_order(pg_stores):
    stores = [pg_stores(n) for n in range(1, 5)]
    errors: list[BaseException] = []

    def work(s: PostgresClusterStore, n: int) -> None:
        try:
            for i in range(8):
                s.append(topic_recs(f"t-{n}-{i}"))
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=work, args=(s, n)) for n, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    for s in stores:
        s.poll()
    fresh = pg_stores(9)
    order = list(fresh.state.topics)
    assert len(order) == 32
    for s in stores:  # every broker applied the same records in the same order
        assert list(s.state.topics) == order


def test_a_stale_broker_cannot_create_a_topic_another_created(pg_stores):
    a, b = pg_stores(1), pg_stores(2)
    a.append(topic_recs("race"))
    with pytest.raises(BrokerError) as err:  # b has not seen a's record yet
        b.append(topic_recs("race"))
    assert err.value.code == ErrorCode.topic_already_exists
    assert b.state.topics["race"].topic_id == a.state.topics["race"].topic_id  # caught up, not overwritten
    pid = a.state.next_producer_id
    a.append([record("ProducerIdsRecord", nextProducerId=pid + 1)])
    with pytest.raises(BrokerError):  # the same producer id block twice would hand out one id twice
        b.append([record("ProducerIdsRecord", nextProducerId=pid + 1)])


def test_a_live_node_id_cannot_be_taken_and_an_expired_lease_drops_out(pg_stores):
    a = pg_stores(1, session_timeout_ms=1500)
    b = pg_stores(2, session_timeout_ms=1500)
    a.register_broker(1, "r1", "127.0.0.1", 9001)
    b.register_broker(2, "r2", "127.0.0.1", 9002)
    a.refresh_brokers()
    assert [(x.node_id, x.rack, x.port) for x in a.live_brokers()] == [(1, "r1", 9001), (2, "r2", 9002)]
    intruder = pg_stores(1)
    with pytest.raises(NodeIdInUseError, match="node id 1"):
        intruder.register_broker(1, None, "127.0.0.1", 9009)

    def only_a() -> bool:  # b stops renewing (as if killed); a keeps renewing
        a.renew_lease()
        a.refresh_brokers()
        return [x.node_id for x in a.live_brokers()] == [1]
    wait_for(only_a, 10, "node 2's lease to expire")
    pg_stores(2).register_broker(2, "r2", "127.0.0.1", 9012)  # an expired node id can be taken again


def test_a_dead_session_leaves_before_its_lease_and_frees_its_node_id(pg_stores, pg_database):  # noqa: F811
    a = pg_stores(1, session_timeout_ms=60000)
    b = pg_stores(2, session_timeout_ms=60000)
    a.register_broker(1, "r1", "127.0.0.1", 9001)
    b.register_broker(2, "r2", "127.0.0.1", 9002)
    a.refresh_brokers()
    assert [x.node_id for x in a.live_brokers()] == [1, 2]
    with psycopg.connect(pg_database, autocommit=True) as conn:  # what kill -9 of broker 2 does to its session
        n = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE application_name = 'kcli-broker-2-controller'").rowcount
    assert n == 1
    wait_for(lambda: a.refresh_brokers() or [x.node_id for x in a.live_brokers()] == [1], 5, "node 2 to leave")
    restarted = pg_stores(2, session_timeout_ms=60000)
    restarted.register_broker(2, "r2", "127.0.0.1", 9012)  # its lease had ~60 s left: the free lock lets it in
    a.refresh_brokers()
    assert [(x.node_id, x.port) for x in a.live_brokers()] == [(1, 9001), (2, 9012)]
    b.elect()  # the old store reconnects: the node lock is taken, so it does not come back as live
    assert not b._node_locked
    with pytest.raises(NodeIdInUseError, match="node id 2"):  # and a live one still cannot be taken
        pg_stores(2).register_broker(2, None, "127.0.0.1", 9019)


def test_one_controller_and_another_takes_over(pg_stores, pg_database):  # noqa: F811
    a, b = pg_stores(1), pg_stores(2)
    assert a.elect() is True
    assert b.elect() is False
    assert b.controller_id() == 1
    with psycopg.connect(pg_database, autocommit=True) as conn:  # the controller's connection dies
        n = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE application_name = 'kcli-broker-1-controller'").rowcount
    assert n == 1
    wait_for(b.elect, 10, "node 2 to take over")
    assert b.controller_id() == 2
    assert a.elect() is False  # a notices its connection is gone and does not claim the role
    assert a.controller_id() == 2


def test_appends_reconnect_by_themselves(pg_stores, pg_database):  # noqa: F811
    a = pg_stores(1)
    a.append(topic_recs("before"))
    with psycopg.connect(pg_database, autocommit=True) as conn:  # e.g. a database restart
        # With a timeout the call returns once the backends have exited, as a restarted server's
        # have: their sockets are closed, which the pool sees at checkout. (A backend killed
        # while a statement runs fails that statement: a retriable error, then a new connection.)
        assert conn.execute("SELECT bool_and(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity"
                            " WHERE application_name = 'kcli-broker-1-pool'").fetchone()[0] is True
    a.append(topic_recs("after"))
    assert {"before", "after"} <= set(a.state.topics)


def test_unreachable_database_is_a_retriable_error_for_appends(pg_stores, pg_database):  # noqa: F811
    a = pg_stores(1, connect_timeout_s=2)
    a.url = pg_database.rsplit("/", 1)[0] + "/no_such_database"  # new connections now fail
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'kcli-broker-1-pool'")
    a._pool.kwargs = {**a._pool.kwargs, "dbname": "no_such_database"}  # type: ignore[union-attr]
    started = time.monotonic()
    with pytest.raises(BrokerError) as err:
        a.append(topic_recs("lost"))
    assert err.value.code == ErrorCode.request_timed_out
    assert time.monotonic() - started < 10
    assert "lost" not in a.state.topics


# ---- real brokers -------------------------------------------------------------------------------

FAST = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500",
        "diskless.append.commit.interval.ms": "50"}
DISKLESS = {"diskless.enable": "true"}


def cluster_broker(broker_factory, url: str, node_id: int, rack: str) -> Any:
    return broker_factory(FAST, name=f"node{node_id}",
                          extra_args=["--cluster", url, "--node-id", str(node_id), "--rack", rack])


def brokers_of(bootstrap: str) -> dict[int, str]:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    return {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()}


def controller_of(bootstrap: str) -> int:
    return AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).controller_id


def racks_of(bootstrap: str) -> dict[int, str | None]:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # keep the handle alive until the result
    nodes = admin.describe_cluster(request_timeout=10).result(15).nodes
    return {n.id: n.rack for n in nodes}


def test_two_brokers_share_topics_and_see_each_other(broker_factory, pg_database, cli_env):  # noqa: F811
    b1 = cluster_broker(broker_factory, pg_database, 1, "rack-a")
    b2 = cluster_broker(broker_factory, pg_database, 2, "rack-b")
    a1 = AdminClient({"bootstrap.servers": b1.bootstrap})
    a1.create_topics([NewTopic("shared", 3, 1, config={**DISKLESS, "retention.ms": "123456"})])["shared"].result(15)
    md = wait_for(lambda: (m := AdminClient({"bootstrap.servers": b2.bootstrap}).list_topics(timeout=10))
                  .topics.get("shared") and m, 10, "broker 2 to learn the topic")
    assert sorted(md.topics["shared"].partitions) == [0, 1, 2]
    a2 = AdminClient({"bootstrap.servers": b2.bootstrap})
    described = a2.describe_configs([ConfigResource(ResourceType.TOPIC, "shared")])
    configs = next(iter(described.values())).result(15)
    assert configs["retention.ms"].value == "123456"  # the topic's ConfigRecord is shared too
    for b in (b1, b2):
        assert wait_for(lambda b=b: set(brokers_of(b.bootstrap)) == {1, 2} and brokers_of(b.bootstrap), 10, "both brokers") \
            == {1: b1.bootstrap, 2: b2.bootstrap}
        assert racks_of(b.bootstrap) == {1: "rack-a", 2: "rack-b"}

    # a second process may not take node id 1 while broker 1 lives
    proc = subprocess.run([sys.executable, "-m", "kcli", "broker", "start", "--data-dir", str(b1.data_dir.parent / "intruder"),
                           "--listen", "127.0.0.1:0", "--cluster", pg_database, "--node-id", "1",
                           "--log-level", "WARNING"],  # start-up INFO lines (docs/observability.md) aside
                          capture_output=True, text=True, env=cli_env, cwd=REPO, timeout=60, check=False)
    assert_one_line_error(proc, 1, "node id 1 is registered by another live broker")
    assert brokers_of(b1.bootstrap) == {1: b1.bootstrap, 2: b2.bootstrap}

    # topic deletion through broker 2 reaches broker 1 and its data dir
    a2.delete_topics(["shared"])["shared"].result(15)
    wait_for(lambda: "shared" not in AdminClient({"bootstrap.servers": b1.bootstrap}).list_topics(timeout=10).topics,
             10, "broker 1 to learn the deletion")
    wait_for(lambda: not (b1.data_dir / "shared-0").exists(), 10, "broker 1 to delete the partition dir")


def test_a_killed_broker_leaves_metadata_and_rejoins(broker_factory, pg_database):  # noqa: F811
    # A lease far longer than the test: a killed broker must leave because its database session
    # (and with it its node lock) ended, not because its lease ran out.
    slow_lease = {**FAST, "broker.session.timeout.ms": "60000", "broker.heartbeat.interval.ms": "2000"}
    b1 = broker_factory(slow_lease, name="node1", extra_args=["--cluster", pg_database, "--node-id", "1", "--rack", "rack-a"])
    b2 = broker_factory(slow_lease, name="node2", extra_args=["--cluster", pg_database, "--node-id", "2", "--rack", "rack-b"])
    wait_for(lambda: set(brokers_of(b1.bootstrap)) == {1, 2}, 10, "both brokers")
    killed = time.monotonic()
    b2.kill9()
    wait_for(lambda: set(brokers_of(b1.bootstrap)) == {1}, 10, "broker 2 to leave (its session ended)")
    assert time.monotonic() - killed < 15  # its lease had ~58 s left
    b2.start()  # at once: its node lock is free, so its old registration is a dead process's
    wait_for(lambda: set(brokers_of(b1.bootstrap)) == {1, 2}, 10, "broker 2 to rejoin")
    assert set(brokers_of(b2.bootstrap)) == {1, 2}
    assert controller_of(b2.bootstrap) == 1  # broker 1 started first and holds the controller lock
    b1.kill9()  # its database session ends with the process: broker 2 takes over
    wait_for(lambda: controller_of(b2.bootstrap) == 2, 10, "broker 2 to become the controller")
    wait_for(lambda: set(brokers_of(b2.bootstrap)) == {2}, 10, "broker 1 to leave")


def test_database_outage_is_retriable_and_the_broker_recovers(broker_factory):
    root = Path(tempfile.mkdtemp(prefix="kcli-pg-"))  # under /tmp: the postgres user must reach it
    server = start_pg_server(root)  # a private server: this test stops it
    try:
        url = server.url(server.create_database())
        b = cluster_broker(broker_factory, url, 1, "rack-a")
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("before", 1, 1, config=DISKLESS)])["before"].result(15)
        server.stop()
        started = time.monotonic()
        with pytest.raises(KafkaException) as err:
            admin.create_topics([NewTopic("during", 1, 1, config=DISKLESS)], request_timeout=20)["during"].result(30)
        assert err.value.args[0].code() == KafkaError.REQUEST_TIMED_OUT  # retriable, not a dropped connection
        assert time.monotonic() - started < 15
        assert "before" in admin.list_topics(timeout=10).topics  # reads go on from the applied state
        server.start()

        def created() -> bool:
            try:
                admin.create_topics([NewTopic("after", 1, 1, config=DISKLESS)])["after"].result(15)
                return True
            except KafkaException as e:
                assert e.args[0].code() == KafkaError.REQUEST_TIMED_OUT, e
                return False
        wait_for(created, 20, "the broker to reconnect by itself")
        assert b.alive()
        assert {"before", "after"} <= set(admin.list_topics(timeout=10).topics)
        assert "during" not in admin.list_topics(timeout=10).topics
        assert b.stop() == 0  # a clean stop (before the server goes) leaves the cluster at once
    finally:
        stop_pg_server(server, "immediate")
        shutil.rmtree(root, ignore_errors=True)


def test_producer_ids_stay_unique_when_another_broker_took_the_next_block(broker_factory, pg_database):  # noqa: F811
    from kcli.protocol.client import WireClient

    b1 = cluster_broker(broker_factory, pg_database, 1, "rack-a")
    b2 = cluster_broker(broker_factory, pg_database, 2, "rack-b")

    def init_producer_id(b: Any) -> tuple[int, int]:
        with WireClient(b.bootstrap) as client:
            r = client.request(22, 0, {"transactional_id": None, "transaction_timeout_ms": 60000})
        return int(r.error_code), int(r.producer_id)

    first = init_producer_id(b1)
    assert first[0] == 0
    # Another broker's allocation that broker 2 has not heard of yet (committed without NOTIFY,
    # so it learns it only at its next poll, up to a second later).
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("INSERT INTO metadata_records (record, node_id) VALUES (%s, 1)",
                     (psycopg.types.json.Jsonb(record("ProducerIdsRecord", nextProducerId=first[1] + 500)),))
    assert init_producer_id(b2) == (0, first[1] + 500)  # not the stale first[1] + 1, and no error
    assert init_producer_id(b1) == (0, first[1] + 501)


def test_migrations_run_once_and_a_newer_schema_is_refused(pg_database):  # noqa: F811
    from kcli.cluster.migrations import LATEST, STEPS, migrate
    from kcli.cluster.state import ClusterStoreError

    errors: list[BaseException] = []

    def run() -> None:
        try:
            with psycopg.connect(pg_database, autocommit=True) as conn:
                migrate(conn)
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=run) for _ in range(3)]  # brokers starting together
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    with psycopg.connect(pg_database, autocommit=True) as conn:
        assert conn.execute("SELECT version FROM kcli_cluster_schema_version ORDER BY version").fetchall() \
            == [(v,) for v, _ in STEPS]  # each step once
        conn.execute("INSERT INTO kcli_cluster_schema_version (version) VALUES (%s)", (LATEST + 1,))
    store = PostgresClusterStore(pg_database, 1)
    with pytest.raises(ClusterStoreError, match="newer than this kcli"):
        store.open()


def test_diskless_records_written_through_one_broker_are_read_through_another(broker_factory, pg_database,  # noqa: F811
                                                                              tmp_path):
    """The cluster's point: one object store, one PostgreSQL (metadata and, by default, the batch
    coordinator), any broker accepts produce and fetch for a diskless partition. An idempotent
    producer bootstrapped from broker 1 writes through the leaders Metadata spreads over both
    brokers; a consumer bootstrapped from broker 2 gets every record exactly once, in
    per-partition order."""
    from tests.kafka_helpers import consume_all, produce

    store = ["--object-store", (tmp_path / "objects").as_uri()]
    b1 = broker_factory(FAST, name="node1", extra_args=["--cluster", pg_database, "--node-id", "1", *store])
    b2 = broker_factory(FAST, name="node2", extra_args=["--cluster", pg_database, "--node-id", "2", *store])
    a1 = AdminClient({"bootstrap.servers": b1.bootstrap})
    a1.create_topics([NewTopic("orders", 3, 1, config=DISKLESS)])["orders"].result(15)
    wait_for(lambda: "orders" in AdminClient({"bootstrap.servers": b2.bootstrap}).list_topics(timeout=10).topics,
             10, "broker 2 to learn the topic")
    values = [b"%05d" % i for i in range(300)]
    produce(b1.bootstrap, "orders", values, keys=[b"%d" % (i % 7) for i in range(300)], **{"enable.idempotence": True})
    got = consume_all(b2.bootstrap, "orders", len(values), timeout=60)
    assert sorted(m.value() for m in got) == values  # every record, once
    for p in range(3):
        offsets = [m.offset() for m in got if m.partition() == p]
        assert offsets == list(range(len(offsets)))  # gapless, in order
        seq = [m.value() for m in got if m.partition() == p]
        assert seq == sorted(seq)  # the producer's order within the partition

