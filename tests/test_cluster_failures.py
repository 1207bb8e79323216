"""Cluster mode under failure (issue #16 "Evidence"): real broker processes over one PostgreSQL and
one object store (S3 on moto's HTTP server, or a shared directory), real idempotent producers.

What each test proves: records a producer had acknowledged are all read back, once each, at the
offsets the producer was told, in each producer's order — whichever broker died, restarted or
lost its database meanwhile; and garbage collection with several brokers deletes only objects no
commit can ever reference.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from plugins.coordinator.base import CoordinatorException, DeleteFilesRequest
from plugins.objectstore import from_uri
from tests.diskless_helpers import counter
from tests.fixtures_cli import cli_env, run_kcli  # noqa: F401 - fixture
from tests.fixtures_pg import pg_database, pg_server, start_pg_server, stop_pg_server  # noqa: F401 - fixtures
from tests.fixtures_s3 import moto_server, s3_bucket, s3_env  # noqa: F401 - fixtures
from tests.test_cluster_state import DISKLESS, FAST, brokers_of, controller_of, wait_for
from tests.test_coordinator import (  # noqa: F401 - fixtures
    T0,
    backend,
    clock,
    commit,
    coord,
    db_path,
    req,
    topic,
)

RACKS = ("a", "b", "c")
# The cleaner's grace period and intervals shortened so collection happens within a test.
GC = {"diskless.file.cleaner.retention.period.ms": "1000", "diskless.file.cleaner.interval.ms": "200"}
FAULTY = "plugins.objectstore.faulty.FaultyObjectStorage"


def start(broker_factory, url: str, node_id: int, rack: str, store: str | None,
          configs: dict[str, str] | None = None) -> Any:
    args = ["--cluster", url, "--node-id", str(node_id), "--rack", rack]
    if store is not None:
        args += ["--object-store", store]
    return broker_factory({**FAST, **GC, **(configs or {})}, name=f"node{node_id}", extra_args=args)


def three_brokers(broker_factory, url: str, store: str | None, **configs: dict[str, str]) -> list[Any]:
    """Brokers 1, 2, 3 in racks a, b, c; broker 1 starts first, so it is the controller."""
    out = [start(broker_factory, url, 1, "a", store, configs.get("node1"))]
    wait_for(lambda: controller_of(out[0].bootstrap) == 1, 10, "broker 1 to be the controller")
    out += [start(broker_factory, url, n, r, store, configs.get(f"node{n}")) for n, r in ((2, "b"), (3, "c"))]
    for b in out:  # each refreshes the live registrations on its own (every second)
        wait_for(lambda b=b: set(brokers_of(b.bootstrap)) == {1, 2, 3}, 10, "every broker to see three live brokers")
    return out


def create(bootstrap: str, name: str, partitions: int = 3) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1, config=DISKLESS)])[name].result(15)


def rack_client(rack: str) -> str:
    return f"app-{rack},diskless_rack_id={rack}"


def leaders(bootstrap: str, topic: str, rack: str) -> set[int]:
    md = AdminClient({"bootstrap.servers": bootstrap, "client.id": rack_client(rack)}).list_topics(topic, timeout=10)
    return {p.leader for p in md.topics[topic].partitions.values()}


class RackProducer(threading.Thread):
    """One idempotent confluent-kafka producer of rack ``rack``: values ``<rack>-<seq>`` to
    partition ``seq % partitions``; ``count`` of them, or until :meth:`finish` when ``count``
    is None. Delivery reports record every acknowledgement (partition, offset, time) and every
    error; ``error_cb`` records client-level errors (a fatal one means the producer was fenced)."""

    def __init__(self, bootstrap: str, topic: str, rack: str, *, count: int | None = None, partitions: int = 3,
                 pause_s: float = 0.002, tag: str | None = None) -> None:
        super().__init__(name=f"producer-{rack}", daemon=True)
        self.topic, self.rack, self.count, self.partitions, self.pause_s = topic, rack, count, partitions, pause_s
        self.tag = tag or rack  # the values' prefix: unique per producer of a topic
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.ack_times: list[float] = []
        self.delivery_errors: list[Any] = []
        self.client_errors: list[Any] = []
        self.sent = 0
        self.remaining = -1
        self._done = threading.Event()
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "client.id": rack_client(rack), "enable.idempotence": True,
            "linger.ms": 5, "message.timeout.ms": 120000, "error_cb": self.client_errors.append})

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.delivery_errors.append(err)
        else:
            self.acked[msg.value()] = (msg.partition(), msg.offset())
            self.ack_times.append(time.monotonic())

    def run(self) -> None:
        while not self._done.is_set() and (self.count is None or self.sent < self.count):
            value = b"%s-%07d" % (self.tag.encode(), self.sent)
            try:
                self.producer.produce(self.topic, value, partition=self.sent % self.partitions, on_delivery=self._delivered)
            except BufferError:
                self.producer.poll(0.05)
                continue
            self.sent += 1
            self.producer.poll(0)
            time.sleep(self.pause_s)
        self.remaining = self.producer.flush(90)

    def finish(self, timeout: float = 120) -> None:
        """Stop sending (a counted producer sends all first) and wait for the flush."""
        if self.count is None:
            self._done.set()
        self.join(timeout)
        assert not self.is_alive(), f"producer {self.rack} did not flush in time"

    def acks_after(self, t: float, until: float = float("inf")) -> int:
        return sum(1 for x in list(self.ack_times) if t < x < until)

    def check_clean(self) -> None:
        """Everything sent was acknowledged; only retriable trouble on the way (never fenced)."""
        assert self.remaining == 0, f"producer {self.rack}: {self.remaining} message(s) never acknowledged"
        assert not self.delivery_errors, self.delivery_errors[:3]
        assert not [e for e in self.client_errors if e.fatal()], self.client_errors[:3]
        assert len(self.acked) == self.sent


def acked_ends(producers: list[RackProducer], partitions: int = 3) -> dict[int, int]:
    """Per partition, one past the highest offset any producer was acknowledged."""
    ends = dict.fromkeys(range(partitions), 0)
    for prod in producers:
        for p, o in prod.acked.values():
            ends[p] = max(ends[p], o + 1)
    return ends


def read_all(bootstrap: str, topic: str, producers: list[RackProducer], partitions: int = 3, rack: str | None = None,
             timeout: float = 60) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of ``topic`` from offset 0 to each partition's high watermark, by partition
    (assigned partitions: no consumer group involved). The high watermark a broker reports
    must reach every acknowledged offset within a few seconds, whichever broker committed it."""
    conf = {"bootstrap.servers": bootstrap, "group.id": f"r-{time.monotonic_ns()}", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100}
    if rack is not None:
        conf |= {"client.rack": rack, "client.id": rack_client(rack)}
    c = Consumer(conf)
    out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
    acked = acked_ends(producers, partitions)

    admin = AdminClient({"bootstrap.servers": bootstrap})

    last: list[object] = [None]

    def watermarks() -> dict[int, int] | None:
        try:
            done = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)},
                                      request_timeout=10)
            e = {tp.partition: f.result(15).offset for tp, f in done.items()}
        except KafkaException as err:
            last[0] = err
            return None
        last[0] = e
        return e if all(e[p] >= acked[p] for p in e) else None

    try:
        try:
            ends = wait_for(watermarks, 15, "high watermarks")
        except AssertionError:
            raise AssertionError(f"high watermarks not at the acknowledged ends {acked} in 15 s: last "
                                 f"answer {last[0]}") from None
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while any(len(out[p]) < ends[p] for p in out) and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            out[m.partition()].append((m.offset(), m.value()))
    finally:
        c.close()
    missing = {p: ends[p] - len(out[p]) for p in out if len(out[p]) < ends[p]}
    assert not missing, f"records not readable (partition: count): {missing}"
    return out


def check_exactly_once(read: dict[int, list[tuple[int, bytes]]], producers: list[RackProducer]) -> int:
    """Offsets gapless; no value twice; each acknowledged value where its producer was told it
    is; each producer's values in its order within a partition. Returns the records read."""
    seen: dict[bytes, tuple[int, int]] = {}
    for p, rows in read.items():
        assert [o for o, _ in rows] == list(range(len(rows))), f"partition {p}: offsets not gapless"
        for o, v in rows:
            assert v not in seen, f"{v!r} read twice: at {seen[v]} and {(p, o)}"
            seen[v] = (p, o)
        for prod in producers:
            mine = [v for _, v in rows if v.startswith(prod.tag.encode() + b"-")]
            assert mine == sorted(mine), f"partition {p}: producer {prod.tag} out of order"
    for prod in producers:
        lost = [v for v in prod.acked if v not in seen]
        assert not lost, f"producer {prod.tag}: {len(lost)} acknowledged record(s) lost, e.g. {lost[:3]}"
        moved = [(v, at, seen[v]) for v, at in prod.acked.items() if seen[v] != at]
        assert not moved, f"producer {prod.tag}: acknowledged at another offset: {moved[:3]}"
    return len(seen)


def wal_keys(store: str) -> set[str]:
    s = from_uri(store)
    try:
        return {o.key for o in s.list("wal/")}
    finally:
        s.close()


# ---- racks -------------------------------------------------------------------------------------


def test_each_rack_writes_through_its_own_broker_and_other_racks_read_everything_once(
        broker_factory, pg_database, s3_bucket):  # noqa: F811
    """KIP-1163's point: a producer in rack r writes through rack r's broker (no cross-zone
    produce traffic); consumers in the other racks read from their own racks' brokers, every
    record once, in each producer's order."""
    store = f"s3://{s3_bucket}/cluster"
    b1, b2, b3 = three_brokers(broker_factory, pg_database, store)
    create(b1.bootstrap, "zones")
    wait_for(lambda: all("zones" in AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=10).topics
                         for b in (b2, b3)), 10, "every broker to learn the topic")
    for rack, node in zip(RACKS, (1, 2, 3)):  # asked of any broker: the rack's own broker leads
        for b in (b1, b2, b3):
            assert leaders(b.bootstrap, "zones", rack) == {node}
    brokers = (b1, b2, b3)

    def served(name: str) -> list[int]:  # a counter of each broker (its admin API)
        return [counter(b.bootstrap, name) for b in brokers]

    # Every producer bootstraps from broker 1; what each broker appends shows where it was sent.
    producers = [RackProducer(b1.bootstrap, "zones", rack, count=400) for rack in RACKS]
    for i, p in enumerate(producers):
        before = served("diskless.append.requests")
        p.start()
        p.finish()
        p.check_clean()
        grew = [after - was for after, was in zip(served("diskless.append.requests"), before)]
        assert grew[i] > 0 and sum(grew) == grew[i], f"rack {p.rack} produced through brokers {grew}"
    for rack, b in zip(RACKS, (b2, b3, b1)):  # bootstrapped from another rack's broker
        before = served("diskless.read.bytes")
        read = read_all(b.bootstrap, "zones", producers, rack=rack)
        assert check_exactly_once(read, producers) == 1200
        grew = [after - was for after, was in zip(served("diskless.read.bytes"), before)]
        i = RACKS.index(rack)
        assert grew[i] > 0 and sum(grew) == grew[i], f"rack {rack} consumed from brokers {grew}"


# ---- kill -9 ------------------------------------------------------------------------------------


def test_kill9_of_a_broker_mid_produce_loses_and_duplicates_nothing_and_it_rejoins(
        broker_factory, pg_database, s3_bucket):  # noqa: F811
    """Broker 2 (rack b) dies under three running producers: the rack-b producer moves to a
    survivor once broker 2's lease expires, no acknowledged record is lost or doubled, broker 2
    leaves Metadata within the session timeout (3 s here), and after a restart it rejoins and
    serves produce again."""
    store = f"s3://{s3_bucket}/cluster"
    b1, b2, b3 = three_brokers(broker_factory, pg_database, store)
    create(b1.bootstrap, "kill")
    wait_for(lambda: leaders(b2.bootstrap, "kill", "b") == {2}, 10, "broker 2 to lead for rack b")
    producers = [RackProducer(b.bootstrap, "kill", rack) for b, rack in zip((b1, b2, b3), RACKS)]
    for p in producers:
        p.start()
    wait_for(lambda: all(len(p.acked) >= 100 for p in producers), 30, "every producer under way")
    killed = time.monotonic()
    b2.kill9()
    wait_for(lambda: set(brokers_of(b1.bootstrap)) == {1, 3}, 3.0 + 5, "broker 2 to leave Metadata")
    left_after = time.monotonic() - killed
    # (each survivor drops it at its own next refresh, within a second of the other)
    wait_for(lambda: leaders(b1.bootstrap, "kill", "b") <= {1, 3}, 5, "rack b's partitions on the survivors")
    wait_for(lambda: producers[1].acks_after(killed + left_after) >= 50, 30,
             "the rack-b producer acknowledged through a survivor")
    b2.start()
    wait_for(lambda: set(brokers_of(b1.bootstrap)) == {1, 2, 3}, 10, "broker 2 to rejoin")
    wait_for(lambda: leaders(b1.bootstrap, "kill", "b") == {2}, 10, "broker 2 to lead for rack b again")
    rejoined = time.monotonic()
    wait_for(lambda: all(p.acks_after(rejoined) >= 50 for p in producers), 30, "every producer after the rejoin")
    for p in producers:
        p.finish()
        p.check_clean()
    # broker 2 serves produce itself again: a producer that knows only broker 2
    fresh = RackProducer(b2.bootstrap, "kill", "b", count=30, tag="fresh")
    fresh.run()
    fresh.check_clean()
    check_exactly_once(read_all(b3.bootstrap, "kill", [*producers, fresh]), [*producers, fresh])


def test_kill9_of_the_controller_hands_over_and_background_work_resumes(broker_factory, pg_database, tmp_path):  # noqa: F811
    """The controller (broker 1) dies mid-produce: nothing acknowledged is lost or doubled,
    another broker becomes the controller, and background deletion — here the objects of a
    topic deleted afterwards, which only the controller's cleaner removes — goes on there."""
    store = (tmp_path / "objects").as_uri()
    b1, b2, b3 = three_brokers(broker_factory, pg_database, store)
    create(b1.bootstrap, "ctl")
    producers = [RackProducer(b.bootstrap, "ctl", rack) for b, rack in zip((b1, b2, b3), RACKS)]
    for p in producers:
        p.start()
    wait_for(lambda: all(len(p.acked) >= 100 for p in producers), 30, "every producer under way")
    killed = time.monotonic()
    b1.kill9()
    new = wait_for(lambda: (c := controller_of(b2.bootstrap)) in (2, 3) and c, 10, "a new controller")
    wait_for(lambda: controller_of(b3.bootstrap) == new, 5, "broker 3 to name the same controller")
    wait_for(lambda: set(brokers_of(b2.bootstrap)) == {2, 3}, 3.0 + 5, "broker 1 to leave Metadata")
    wait_for(lambda: producers[0].acks_after(killed + 3.0) >= 50, 30, "the rack-a producer through a survivor")
    for p in producers:
        p.finish()
        p.check_clean()
    check_exactly_once(read_all(b2.bootstrap, "ctl", producers), producers)

    # background work on the new controller: a deleted topic's objects are collected
    create(b2.bootstrap, "doomed", 1)
    before = wal_keys(store)
    doomed = RackProducer(b2.bootstrap, "doomed", "b", count=50, partitions=1)
    doomed.run()
    doomed.check_clean()
    theirs = wal_keys(store) - before  # nothing else is produced meanwhile: these hold only "doomed"
    assert theirs
    a3 = AdminClient({"bootstrap.servers": b3.bootstrap})  # kept until the result is in
    a3.delete_topics(["doomed"])["doomed"].result(15)
    wait_for(lambda: not (wal_keys(store) & theirs), 20, "the new controller to delete the topic's objects")
    assert wal_keys(store) >= before  # the other topic's objects stay
    b1.start()  # the old controller rejoins as an ordinary broker
    wait_for(lambda: set(brokers_of(b1.bootstrap)) == {1, 2, 3}, 10, "broker 1 to rejoin")
    # (until its first election tick a starting broker names itself: kcli/broker/handlers/metadata.py)
    wait_for(lambda: controller_of(b1.bootstrap) == new, 5, "broker 1 to name the new controller")
    check_exactly_once(read_all(b1.bootstrap, "ctl", producers), producers)


# ---- PostgreSQL restart ---------------------------------------------------------------------------


@pytest.fixture
def private_pg() -> Iterator[Any]:
    """A PostgreSQL server of this test alone (the test stops and starts it)."""
    root = Path(tempfile.mkdtemp(prefix="kcli-pg-"))  # under /tmp: the postgres user must reach it
    server = start_pg_server(root)
    try:
        yield server
    finally:
        stop_pg_server(server, "immediate")
        shutil.rmtree(root, ignore_errors=True)


def test_postgresql_restart_mid_produce_is_retriable_and_loses_nothing(private_pg, broker_factory, tmp_path):
    """The database goes away for a few seconds under running producers: they see only
    retriable errors (no failed delivery, no fatal error: the idempotent producers are not
    fenced), nothing acknowledged is lost or doubled, and both brokers reconnect by themselves.
    (``private_pg`` comes first: it is torn down after the brokers, which then stop at once.)"""
    url = private_pg.url(private_pg.create_database())
    store = (tmp_path / "objects").as_uri()
    b1 = start(broker_factory, url, 1, "a", store)
    b2 = start(broker_factory, url, 2, "b", store)
    wait_for(lambda: set(brokers_of(b1.bootstrap)) == {1, 2}, 10, "both brokers")
    create(b1.bootstrap, "pgdown")
    producers = [RackProducer(b.bootstrap, "pgdown", rack) for b, rack in ((b1, "a"), (b2, "b"))]
    for p in producers:
        p.start()
    wait_for(lambda: all(len(p.acked) >= 100 for p in producers), 30, "both producers under way")
    private_pg.stop()
    stopped = time.monotonic()
    # Longer than the session timeout (every lease runs out meanwhile) and than the brokers' 5 s
    # wait for a pooled connection: a wait that began at the stop fails before the server is back,
    # so each broker notices the outage (with 4 s a wait could outlast it and succeed: CI flake).
    time.sleep(6)
    restarted = time.monotonic()
    private_pg.start()
    wait_for(lambda: all(p.acks_after(restarted) >= 100 for p in producers), 60, "both producers acknowledged again")
    assert all(p.acks_after(stopped + 1.0, restarted) == 0 for p in producers)  # the outage was real
    for p in producers:
        p.finish()
        p.check_clean()
    assert b1.alive() and b2.alive()
    assert all("is unavailable" in b.log_text() for b in (b1, b2))  # both noticed, neither restarted
    wait_for(lambda: set(brokers_of(b2.bootstrap)) == {1, 2}, 15, "both brokers registered again")
    check_exactly_once(read_all(b2.bootstrap, "pgdown", producers), producers)


# ---- garbage collection ---------------------------------------------------------------------------


def test_claimed_orphan_can_never_be_committed_and_a_committed_one_is_never_claimed(coord, clock):  # noqa: F811
    """The rule that makes orphan deletion safe without seeing other brokers' uploads: a claim and
    a commit that requires its intent exclude each other, whichever comes first, for good —
    also once the claimed object and its deletion record are gone (both coordinators)."""
    (tip, _) = topic(coord)
    coord.register_upload_intent("wal/committed", 2, T0)
    coord.register_upload_intent("wal/slow", 2, T0)
    coord.commit_file("wal/committed", 2, 101, [req(tip)], require_intent=True)
    assert coord.claim_orphans({"wal/committed": 10, "wal/slow": 20, "wal/no-intent": 5}, T0 + 5000) == ["wal/slow"]
    assert coord.claim_orphans({"wal/slow": 20}, T0 + 6000) == []  # claimed once
    with pytest.raises(CoordinatorException, match="claimed as an orphan"):
        coord.commit_file("wal/slow", 2, 101, [req(tip)], require_intent=True)  # the slow upload's late commit
    assert coord.list_upload_intents() == []
    assert [(f.object_key, f.marked_for_deletion_at_ms) for f in coord.get_files_to_delete()] == [("wal/slow", T0 + 5000)]
    assert coord.is_safe_to_delete_file("wal/slow")
    coord.delete_files(DeleteFilesRequest(["wal/slow"]))  # the object is deleted: its record goes
    assert coord.known_object_keys() == {"wal/committed"}
    with pytest.raises(CoordinatorException, match="claimed as an orphan"):
        coord.commit_file("wal/slow", 2, 101, [req(tip)], require_intent=True)  # still refused
    assert [r.assigned_base_offset for r in commit(coord, [req(tip)])[0]] == [10]  # the log goes on


def _faulty(store: str, switch: Path, delay_ms: int) -> dict[str, str]:
    """Broker configs: the shared store, with WAL uploads that return ``delay_ms`` after the
    object is stored while ``switch`` exists (the window between "stored" and "committed")."""
    return {"diskless.storage.class.name": FAULTY, "diskless.storage.delegate.uri": store,
            "diskless.storage.upload.ack.delay.ms": str(delay_ms), "diskless.storage.switch.file": str(switch),
            "diskless.storage.key.prefixes": "wal/"}


def test_gc_with_three_brokers_spares_slow_uploads_and_collects_a_killed_brokers_orphans(
        broker_factory, pg_database, tmp_path):  # noqa: F811
    """Broker 1 is the controller (the only cleaner); broker 2's uploads can be held between
    "stored" and "committed".

    1. A slow upload on live broker 2, older than the grace period (1 s) when its commit comes:
       the controller sees an uncommitted object with an intent and takes it for an orphan. It
       must never delete an object a commit then references: it claims it first, so broker 2's
       late commit is refused (a retriable error) and the producer's retry commits the records
       anew. Acknowledged records are all readable, once.
    2. Broker 2 killed between the PUT and the commit: the object is an orphan for good and the
       controller collects it after the grace period; every committed object stays."""
    store = (tmp_path / "objects").as_uri()
    switch = tmp_path / "hold-uploads"
    b1, b2, b3 = three_brokers(broker_factory, pg_database, None,
                               node1={"diskless.storage.uri": store}, node3={"diskless.storage.uri": store},
                               node2=_faulty(store, switch, 8000))
    create(b1.bootstrap, "gc")
    wait_for(lambda: leaders(b3.bootstrap, "gc", "b") == {2}, 10, "broker 2 to lead for rack b")
    steady = [RackProducer(b.bootstrap, "gc", rack, count=100) for b, rack in ((b1, "a"), (b3, "c"))]
    for p in steady:
        p.start()
    for p in steady:
        p.finish()
        p.check_clean()
    committed = wal_keys(store)

    # 1. a slow upload on a live broker
    switch.touch()
    slow = RackProducer(b2.bootstrap, "gc", "b", count=20, tag="slow")
    slow.start()
    held = wait_for(lambda: wal_keys(store) - committed, 10, "broker 2's object stored, its commit held")
    wait_for(lambda: not (wal_keys(store) & held), 7, "the controller to take the held object for an orphan")
    assert not slow.acked  # deleted before its commit came
    switch.unlink()  # the producer's retries upload at full speed
    slow.finish()
    slow.check_clean()
    assert wal_keys(store) >= committed  # no committed object was touched
    check_exactly_once(read_all(b1.bootstrap, "gc", [*steady, slow]), [*steady, slow])
    assert "claimed as an orphan" in b2.log_text()  # the late commit was refused, not applied

    # 2. broker 2 dies between the PUT and the commit
    before = wal_keys(store)
    switch.touch()
    doomed = RackProducer(b2.bootstrap, "gc", "b", count=5, tag="doomed")
    doomed.start()
    orphan = wait_for(lambda: wal_keys(store) - before, 10, "broker 2's object stored")
    b2.kill9()
    switch.unlink()
    wait_for(lambda: not (wal_keys(store) & orphan), 15, "the controller to collect the killed broker's orphan")
    assert wal_keys(store) >= before  # every committed object stays
    with psycopg.connect(pg_database, autocommit=True) as conn:
        wait_for(lambda: conn.execute("SELECT count(*) FROM upload_intents").fetchone()[0] == 0, 10, "no intent left")
        wait_for(lambda: conn.execute("SELECT count(*) FROM files WHERE state = 'deleting'").fetchone()[0] == 0, 10,
                 "no claim left")
    doomed.finish()  # its records went to a survivor once broker 2's lease expired
    doomed.check_clean()
    check_exactly_once(read_all(b3.bootstrap, "gc", [*steady, slow, doomed]), [*steady, slow, doomed])


def test_offline_gc_against_a_running_cluster_never_deletes_an_object_a_commit_then_references(
        broker_factory, pg_database, tmp_path, cli_env):  # noqa: F811
    """`kcli diskless gc --coordinator postgresql://...` run by an operator while the brokers
    serve: with `--grace-ms 0` every uncommitted object with an intent is an orphan to it,
    including one a live broker has uploaded and is about to commit. It claims before it
    deletes, so that commit is refused and retried; nothing acknowledged is lost."""
    import json

    store = (tmp_path / "objects").as_uri()
    switch = tmp_path / "hold-uploads"
    patient = {"diskless.file.cleaner.retention.period.ms": "600000"}  # the brokers' own cleaner stays out
    b1 = start(broker_factory, pg_database, 1, "a", store, patient)
    b2 = start(broker_factory, pg_database, 2, "b", None, {**patient, **_faulty(store, switch, 8000)})
    wait_for(lambda: set(brokers_of(b1.bootstrap)) == {1, 2} == set(brokers_of(b2.bootstrap)), 10, "both brokers")
    create(b1.bootstrap, "offline")
    wait_for(lambda: leaders(b1.bootstrap, "offline", "b") == {2}, 10, "broker 2 to lead for rack b")
    before = wal_keys(store)
    switch.touch()
    slow = RackProducer(b2.bootstrap, "offline", "b", count=20, tag="slow")
    slow.start()
    held = wait_for(lambda: wal_keys(store) - before, 10, "broker 2's object stored, its commit held")
    proc = run_kcli(cli_env, "diskless", "gc", "--coordinator", pg_database, "--object-store", store,
                    "--grace-ms", "0", "--engine", "local", "-o", "json", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert held <= set(json.loads(proc.stdout)["orphans"]) and not (wal_keys(store) & held)
    switch.unlink()
    slow.finish()
    slow.check_clean()
    check_exactly_once(read_all(b1.bootstrap, "offline", [slow]), [slow])
    assert "claimed as an orphan" in b2.log_text()
