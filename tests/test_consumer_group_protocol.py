"""KIP-848 consumer groups (group.protocol=consumer, issue #28 item 1) against real kcli broker
processes: confluent-kafka consumers join, a fourth joins and is killed with SIGKILL, every
record is consumed once, and assignments move incrementally (no member ever gives up a partition
its target keeps); the wire answers to bad input (unknown assignor, stale or fenced epochs,
unknown members), static membership, classic vs consumer group types, regex subscriptions, the
CLI's view of a consumer group, and a coordinator failover in a cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from kcli.protocol.client import WireClient
from tests.brokerproc import BrokerProcess
from tests.fixtures_cli import run_kcli
from tests.fixtures_pg import pg_database, pg_server  # noqa: F401 - fixtures

REPO = Path(__file__).resolve().parents[1]
BROKER = {
    "group.consumer.session.timeout.ms": "2500",
    "group.consumer.heartbeat.interval.ms": "200",
    "group.initial.rebalance.delay.ms": "0",
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("kip848") / "data", BROKER)
    b.start()
    try:
        yield b
    finally:
        b.stop()


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(15)


def produce(bootstrap: str, topic: str, values: list[bytes], partitions: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i, v in enumerate(values):
        p.produce(topic, value=v, partition=i % partitions)
    assert p.flush(15) == 0


def consumer_config(bootstrap: str, group: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
            "auto.offset.reset": "earliest", "enable.auto.commit": False, **extra}


def commit(c: Consumer, m: Any) -> None:
    """Commit past ``m``; a commit racing an epoch bump (STALE_MEMBER_EPOCH) is retried."""
    for _ in range(100):
        try:
            c.commit(offsets=[TopicPartition(m.topic(), m.partition(), m.offset() + 1)], asynchronous=False)
            return
        except KafkaException:
            time.sleep(0.05)
    raise AssertionError(f"cannot commit {m.topic()}-{m.partition()}@{m.offset()}")


class Member:
    """A consumer-protocol member polling in a thread; it commits each record before the next
    poll, and records every assignment change librdkafka reports (incremental with KIP-848)."""

    def __init__(self, bootstrap: str, group: str, topics: list[str], name: str, **extra: Any) -> None:
        self.name = name
        self.owned: set[tuple[str, int]] = set()
        self.events: list[tuple[str, frozenset[tuple[str, int]]]] = []
        self.values: list[bytes] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.c = Consumer(consumer_config(bootstrap, group, **{"client.id": name, **extra}))
        self.c.subscribe(topics, on_assign=self._assigned, on_revoke=self._revoked)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _assigned(self, _c: Any, parts: list[TopicPartition]) -> None:
        got = frozenset((p.topic, p.partition) for p in parts)
        with self.lock:
            self.events.append(("assign", got))
            self.owned = self.owned | got  # rebound, never mutated: other threads read it

    def _revoked(self, _c: Any, parts: list[TopicPartition]) -> None:
        lost = frozenset((p.topic, p.partition) for p in parts)
        with self.lock:
            self.events.append(("revoke", lost))
            self.owned = self.owned - lost

    def _run(self) -> None:
        while not self.stop.is_set():
            m = self.c.poll(0.1)
            if m is None or m.error():
                continue
            commit(self.c, m)
            with self.lock:
                self.values.append(m.value())

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.c.close()


CHILD = r"""
import sys, time
from confluent_kafka import Consumer, KafkaException, TopicPartition
bootstrap, group, topic = sys.argv[1:4]
c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
              "auto.offset.reset": "earliest", "enable.auto.commit": False, "client.id": "doomed"})
def show(kind, parts):
    print(kind, " ".join(str(p.partition) for p in parts), flush=True)
c.subscribe([topic], on_assign=lambda _c, ps: show("ASSIGN", ps), on_revoke=lambda _c, ps: show("REVOKE", ps))
while True:
    m = c.poll(0.1)
    if m is None or m.error():
        continue
    for _ in range(100):
        try:
            c.commit(offsets=[TopicPartition(m.topic(), m.partition(), m.offset() + 1)], asynchronous=False)
            break
        except KafkaException:
            time.sleep(0.05)
    print("REC", m.value().decode(), flush=True)  # printed only once committed
"""


class ChildMember:
    """A consumer-protocol member in its own process, to be killed without leaving the group."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, bootstrap, group, topic], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, cwd=REPO)
        self.owned: set[int] = set()
        self.values: list[bytes] = []
        self.revoked: list[set[int]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, _, rest = line.strip().partition(" ")
            if kind == "REC":
                self.values.append(rest.encode())
            elif kind == "ASSIGN":
                self.owned = self.owned | {int(p) for p in rest.split()}
            elif kind == "REVOKE":
                self.owned = self.owned - {int(p) for p in rest.split()}
                self.revoked.append({int(p) for p in rest.split()})

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.thread.join(5)
        self.owned = set()  # it owns nothing any more, though it never said so


def test_members_join_one_dies_records_consumed_once_and_assignments_move_incrementally(broker):
    topic, group, n = f"orders-{uuid.uuid4().hex[:8]}", f"billing-{uuid.uuid4().hex[:8]}", 12
    create_topic(broker.bootstrap, topic, n)
    everything = set()
    batch = [b"a%03d" % i for i in range(120)]
    everything |= set(batch)
    produce(broker.bootstrap, topic, batch, n)
    members = [Member(broker.bootstrap, group, [topic], f"m{i}") for i in range(3)]
    child: ChildMember | None = None
    try:
        def consumed() -> list[bytes]:
            return [v for m in members for v in m.values] + (child.values if child else [])

        def split_evenly(count: int) -> bool:
            alive = child is not None and child.proc.poll() is None
            owned = [m.owned for m in members] + ([{(topic, p) for p in child.owned}] if alive else [])
            union = set().union(*owned)
            return len(union) == n and sum(len(o) for o in owned) == n and all(len(o) == n // count for o in owned)

        wait_for(lambda: split_evenly(3) and len(consumed()) == 120, 20, "3 members to share the partitions")
        before = [set(m.owned) for m in members]
        marks = [len(m.events) for m in members]

        # A fourth member joins: each of the three gives up exactly one partition to it, and
        # nothing else; the newcomer gets each partition only once its previous owner let go.
        child = ChildMember(broker.bootstrap, group, topic)
        wait_for(lambda: split_evenly(4), 20, "4 members to share the partitions")
        for m, had, mark in zip(members, before, marks):
            assert m.owned < had and len(had - m.owned) == 1, (m.name, had, m.owned)
            later = m.events[mark:]
            assert not any(parts for kind, parts in later if kind == "assign"), later  # nothing new for the three
            assert set().union(*(parts for _, parts in later)) == had - m.owned  # only what moved
        assert {(topic, p) for p in child.owned} == set().union(*before) - set().union(*(m.owned for m in members))
        batch = [b"b%03d" % i for i in range(120)]
        everything |= set(batch)
        produce(broker.bootstrap, topic, batch, n)
        wait_for(lambda: len(consumed()) == 240, 20, "the second batch")
        assert child.values, "the fourth member consumed its share"

        # It dies without leaving: after the session timeout its partitions go to the others,
        # who only gain partitions.
        during = [set(m.owned) for m in members]
        marks = [len(m.events) for m in members]
        child.kill9()
        wait_for(lambda: split_evenly(3), 20, "the dead member's partitions to move")
        for m, had, mark in zip(members, during, marks):
            assert had < m.owned and not any(parts for kind, parts in m.events[mark:] if kind == "revoke"), \
                (m.name, m.events[mark:])
        batch = [b"c%03d" % i for i in range(120)]
        everything |= set(batch)
        produce(broker.bootstrap, topic, batch, n)
        wait_for(lambda: len(consumed()) >= 360, 20, "the third batch")
        time.sleep(0.3)  # anything read twice would show up now
        got = consumed()
        assert sorted(got) == sorted(everything), "every record exactly once per group"
    finally:
        if child is not None and child.proc.poll() is None:
            child.kill9()
        for m in members:
            m.close()


# ---- the assignors ---------------------------------------------------------------------------


def test_assignors_balance_stick_and_co_partition():
    from kcli.coordinator.group.assignors import MemberSpec, RangeAssignor, TopicInfo, UniformAssignor, make_assignor

    a, b = TopicInfo("a", uuid.uuid4(), tuple(range(7))), TopicInfo("b", uuid.uuid4(), tuple(range(3)))
    topics = {"a": a, "b": b}
    both = frozenset({"a", "b"})
    first = UniformAssignor().assign([MemberSpec(f"m{i}", None, both) for i in range(3)], topics)
    assert sorted(sum(map(len, x.values())) for x in first.values()) == [3, 3, 4]
    grown = UniformAssignor().assign([MemberSpec(m, None, both, {t: set(p) for t, p in x.items()})
                                      for m, x in first.items()] + [MemberSpec("m3", None, both)], topics)
    assert sorted(sum(map(len, x.values())) for x in grown.values()) == [2, 2, 3, 3]
    moved = sum(len(p - grown[m].get(t, set())) for m, x in first.items() for t, p in x.items())
    assert moved == 2  # only what the newcomer needs
    mixed = UniformAssignor().assign([MemberSpec("x", None, frozenset({"a"})), MemberSpec("y", None, both)], topics)
    assert b.topic_id not in mixed["x"] and sum(map(len, mixed["x"].values())) == sum(map(len, mixed["y"].values())) == 5
    ranged = RangeAssignor().assign([MemberSpec(f"m{i}", None, both) for i in range(3)], topics)
    assert [sorted(ranged[f"m{i}"][b.topic_id]) for i in range(3)] == [[0], [1], [2]]
    assert [sorted(ranged[f"m{i}"][a.topic_id]) for i in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert make_assignor("sticky") is None


# ---- the wire: ConsumerGroupHeartbeat by hand ------------------------------------------------


def hb(c: WireClient, group: str, member_id: str, epoch: int, version: int = 1, **kw: Any) -> Any:
    body = {"group_id": group, "member_id": member_id, "member_epoch": epoch, "instance_id": None, "rack_id": None,
            "rebalance_timeout": 30000 if epoch == 0 else -1, "subscribed_topic_names": None,
            "subscribed_topic_regex": None, "server_assignor": None, "topic_partitions": [] if epoch == 0 else None}
    body.update(kw)
    return c.request(68, version, body)


def owned_of(resp: Any) -> list[dict[str, Any]]:
    return [{"topic_id": tp.topic_id, "partitions": list(tp.partitions)} for tp in resp.assignment.topic_partitions]


def test_api_versions_advertise_the_consumer_group_apis_without_feature_flags(broker):
    """librdkafka picks the consumer protocol from ConsumerGroupHeartbeat v1 in ApiVersions; it
    needs no `group.version` feature (a tagged field, which librdkafka < 2.2 cannot parse)."""
    with WireClient(broker.bootstrap, timeout=10) as c:
        keys = {int(k.api_key): (int(k.min_version), int(k.max_version))
                for k in c.request(18, 3, {"client_software_name": "librdkafka", "client_software_version": "2.16.0"}).api_keys}
        assert keys[68] == (0, 1) and keys[69] == (0, 0) and keys[8][1] >= 9 and keys[9][1] >= 9 and keys[16][1] >= 5
        # librdkafka < 2.2 cannot parse tagged fields: it gets no features (kcli/broker/features.py)
        _, frame = c.encode_request(18, 3, {"client_software_name": "librdkafka", "client_software_version": "2.0.2"})
        c.send_raw(frame)
        assert c.recv_frame()[-5:] == b"\0\0\0\0\0"  # throttle_time 0, then an empty tagged-field section


def test_wire_errors_unknown_assignor_unknown_member_fenced_and_stale_epochs(broker):
    topic, group = f"wire-{uuid.uuid4().hex[:8]}", f"wire-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 2)
    with WireClient(broker.bootstrap, timeout=10) as c:
        r = hb(c, group, str(uuid.uuid4()), 0, subscribed_topic_names=[topic], server_assignor="sticky")
        assert int(r.error_code) == ErrorCode.unsupported_assignor and "uniform" in r.error_message
        r = hb(c, group, "", 0, subscribed_topic_names=[topic])  # v1: the client names itself
        assert int(r.error_code) == ErrorCode.invalid_request
        r = hb(c, group, str(uuid.uuid4()), 0, subscribed_topic_names=[topic], topic_partitions=None)
        assert int(r.error_code) == ErrorCode.invalid_request
        r = hb(c, group, str(uuid.uuid4()), 3, subscribed_topic_names=[topic])
        assert int(r.error_code) == ErrorCode.unknown_member_id  # no such group (or member): rejoin

        me = str(uuid.uuid4())
        r = hb(c, group, me, 0, subscribed_topic_names=[topic], server_assignor="range")
        assert int(r.error_code) == 0 and r.member_epoch == 1 and r.heartbeat_interval.total_seconds() == 0.2
        assert sorted(owned_of(r)[0]["partitions"]) == [0, 1]
        owned = owned_of(r)
        assert int(hb(c, group, str(uuid.uuid4()), 1).error_code) == ErrorCode.unknown_member_id
        assert int(hb(c, group, me, 2, topic_partitions=owned).error_code) == ErrorCode.fenced_member_epoch
        r = hb(c, group, me, 1, topic_partitions=owned)
        assert int(r.error_code) == 0 and r.member_epoch == 1 and r.assignment is None  # nothing changed

        # Offsets: a member commits with its epoch (OffsetCommit v9); another epoch is stale.
        tid_topic = {"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 5,
                                                    "committed_leader_epoch": -1, "committed_metadata": ""}]}

        def commit_v9(epoch: int, member: str) -> int:
            resp = c.request(8, 9, {"group_id": group, "generation_id_or_member_epoch": epoch, "member_id": member,
                                    "group_instance_id": None, "topics": [tid_topic]})
            return int(resp.topics[0].partitions[0].error_code)

        assert commit_v9(0, me) == ErrorCode.stale_member_epoch
        assert commit_v9(1, "someone-else") == ErrorCode.unknown_member_id
        assert commit_v9(-1, "") == ErrorCode.unknown_member_id  # not an admin commit: the group has members
        assert commit_v9(1, me) == 0

        def fetch_v9(epoch: int, member: str | None) -> Any:
            resp = c.request(9, 9, {"groups": [{"group_id": group, "member_id": member, "member_epoch": epoch,
                                                "topics": [{"name": topic, "partition_indexes": [0]}]}],
                                    "require_stable": False})
            return resp.groups[0]

        assert int(fetch_v9(7, me).error_code) == ErrorCode.stale_member_epoch
        assert int(fetch_v9(1, "nobody").error_code) == ErrorCode.unknown_member_id
        got = fetch_v9(1, me)
        assert int(got.error_code) == 0 and int(got.topics[0].partitions[0].committed_offset) == 5
        assert int(fetch_v9(-1, None).topics[0].partitions[0].committed_offset) == 5  # admin tools

        # A second member: the first must revoke one partition before the newcomer gets it.
        other = str(uuid.uuid4())
        r2 = hb(c, group, other, 0, subscribed_topic_names=[topic])
        # at the group's epoch, waiting for partition 1 (Kafka's UNRELEASED_PARTITIONS)
        assert int(r2.error_code) == 0 and r2.member_epoch == 2 and owned_of(r2) == []
        r = hb(c, group, me, 1, topic_partitions=owned)
        assert r.member_epoch == 1 and len(owned_of(r)[0]["partitions"]) == 1  # revoke one, same epoch
        kept = owned_of(r)
        moved = ({0, 1} - set(kept[0]["partitions"])).pop()
        r = hb(c, group, me, 1, topic_partitions=kept)  # revoked: now at the group's epoch
        assert r.member_epoch == 2
        assert commit_v9(1, me) == ErrorCode.stale_member_epoch
        r2 = hb(c, group, other, 2, topic_partitions=[])
        assert r2.member_epoch == 2 and owned_of(r2)[0]["partitions"] == [moved]
        # leaving (epoch -1) hands the partition back at the next heartbeat
        r2 = hb(c, group, other, -1)
        assert int(r2.error_code) == 0 and r2.member_epoch == -1
        r = hb(c, group, me, 2, topic_partitions=kept)
        assert r.member_epoch == 3 and sorted(owned_of(r)[0]["partitions"]) == [0, 1]
        r = hb(c, group, me, -1)
        assert int(r.error_code) == 0
        assert int(hb(c, group, me, -1).error_code) == ErrorCode.unknown_member_id


def test_a_member_that_does_not_revoke_within_its_rebalance_timeout_is_fenced(broker):
    topic, group = f"slow-{uuid.uuid4().hex[:8]}", f"slow-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 2)
    with WireClient(broker.bootstrap, timeout=10) as c:
        slow, other = str(uuid.uuid4()), str(uuid.uuid4())
        r = hb(c, group, slow, 0, subscribed_topic_names=[topic], rebalance_timeout=300)
        owned = owned_of(r)
        assert int(hb(c, group, other, 0, subscribed_topic_names=[topic]).error_code) == 0
        r = hb(c, group, slow, 1, topic_partitions=owned)  # asked to revoke one partition
        assert len(owned_of(r)[0]["partitions"]) == 1
        time.sleep(0.6)  # ... and it never does
        assert int(hb(c, group, slow, 1, topic_partitions=owned).error_code) == ErrorCode.unknown_member_id
        r = hb(c, group, other, 2, topic_partitions=[])
        assert sorted(owned_of(r)[0]["partitions"]) == [0, 1]


def test_static_member_leaves_temporarily_and_its_instance_takes_its_partitions_back(broker):
    topic, group = f"static-{uuid.uuid4().hex[:8]}", f"static-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 4)
    with WireClient(broker.bootstrap, timeout=10) as c:
        a, b = str(uuid.uuid4()), str(uuid.uuid4())
        ra = hb(c, group, a, 0, instance_id="pod-a", subscribed_topic_names=[topic])
        rb = hb(c, group, b, 0, instance_id="pod-b", subscribed_topic_names=[topic])
        ra = hb(c, group, a, ra.member_epoch, instance_id="pod-a", topic_partitions=owned_of(ra))
        ra = hb(c, group, a, ra.member_epoch, instance_id="pod-a", topic_partitions=owned_of(ra))
        rb = hb(c, group, b, rb.member_epoch, instance_id="pod-b", topic_partitions=[])
        mine = sorted(owned_of(rb)[0]["partitions"])
        assert len(mine) == 2
        # the same instance cannot join twice while it is in the group
        dup = hb(c, group, str(uuid.uuid4()), 0, instance_id="pod-b", subscribed_topic_names=[topic])
        assert int(dup.error_code) == ErrorCode.unreleased_instance_id
        assert int(hb(c, group, str(uuid.uuid4()), 2, instance_id="pod-b").error_code) == ErrorCode.fenced_instance_id
        left = hb(c, group, b, -2, instance_id="pod-b")
        assert int(left.error_code) == 0 and left.member_epoch == -2
        again = hb(c, group, str(uuid.uuid4()), 0, instance_id="pod-b", subscribed_topic_names=[topic])
        assert int(again.error_code) == 0 and sorted(owned_of(again)[0]["partitions"]) == mine  # no rebalance
        d = c.request(69, 0, {"group_ids": [group], "include_authorized_operations": False}).groups[0]
        assert d.group_epoch == 2 and {m.instance_id for m in d.members} == {"pod-a", "pod-b"}


def test_regex_subscription_follows_topics_created_later(broker):
    prefix = f"rx{uuid.uuid4().hex[:6]}"
    create_topic(broker.bootstrap, f"{prefix}-one", 1)
    with WireClient(broker.bootstrap, timeout=10) as c:
        group, me = f"rx-{prefix}", str(uuid.uuid4())
        bad = hb(c, group, me, 0, subscribed_topic_regex="(unclosed")
        assert int(bad.error_code) == ErrorCode.invalid_regular_expression
        r = hb(c, group, me, 0, subscribed_topic_regex=f"{prefix}-.*")
        assert int(r.error_code) == 0 and len(owned_of(r)) == 1
        create_topic(broker.bootstrap, f"{prefix}-two", 2)
        create_topic(broker.bootstrap, f"other-{prefix}-two", 2)  # no full match
        r = hb(c, group, me, r.member_epoch, topic_partitions=owned_of(r))
        assert r.member_epoch == 2 and sum(len(t["partitions"]) for t in owned_of(r)) == 3


def test_classic_and_consumer_groups_exclude_each_other_and_report_their_type(broker):
    topic = f"types-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 2)
    consumer_group, classic_group = f"new-{topic}", f"old-{topic}"
    classic = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": classic_group, "session.timeout.ms": 6000})
    classic.subscribe([topic])
    try:
        wait_for(lambda: classic.poll(0.1) is None and classic.assignment(), 20, "the classic member")
        with WireClient(broker.bootstrap, timeout=10) as c:
            me = str(uuid.uuid4())
            assert int(hb(c, consumer_group, me, 0, subscribed_topic_names=[topic]).error_code) == 0
            r = hb(c, classic_group, str(uuid.uuid4()), 0, subscribed_topic_names=[topic])
            assert int(r.error_code) == ErrorCode.group_id_not_found  # a non-empty classic group
            join = c.request(11, 9, {"group_id": consumer_group, "session_timeout": 10000, "rebalance_timeout": 10000,
                                     "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
                                     "protocols": [{"name": "range", "metadata": b"\0\0\0\0\0\0"}], "reason": None})
            assert int(join.error_code) == ErrorCode.inconsistent_group_protocol
            listed = {g.group_id: g for g in c.request(16, 5, {"states_filter": [], "types_filter": []}).groups}
            assert listed[consumer_group].group_type == "consumer" and listed[classic_group].group_type == "classic"
            only = c.request(16, 5, {"states_filter": [], "types_filter": ["consumer"]}).groups
            assert consumer_group in {g.group_id for g in only} and classic_group not in {g.group_id for g in only}
            described = c.request(15, 5, {"groups": [consumer_group], "include_authorized_operations": False}).groups[0]
            assert described.protocol_type == "consumer" and described.group_state == "Stable"
            assert described.protocol_data == "uniform" and described.members[0].member_id == me
            cgd = c.request(69, 0, {"group_ids": [classic_group], "include_authorized_operations": False}).groups[0]
            assert int(cgd.error_code) == ErrorCode.group_id_not_found  # clients then use DescribeGroups
            # once empty, the consumer group converts: a classic member may take the id
            assert int(hb(c, consumer_group, me, -1).error_code) == 0
            join = c.request(11, 9, {"group_id": consumer_group, "session_timeout": 10000, "rebalance_timeout": 10000,
                                     "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
                                     "protocols": [{"name": "range", "metadata": b"\0\0\0\0\0\0"}], "reason": None})
            assert int(join.error_code) == ErrorCode.member_id_required
    finally:
        classic.close()


def test_cli_shows_a_consumer_groups_protocol_epochs_and_assignments(broker, tmp_path):
    topic, group = f"cli-{uuid.uuid4().hex[:8]}", f"cli-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 3)
    produce(broker.bootstrap, topic, [b"x%d" % i for i in range(6)], 3)
    member = Member(broker.bootstrap, group, [topic], "cli-app", **{"group.remote.assignor": "range"})
    try:
        wait_for(lambda: len(member.owned) == 3 and len(member.values) == 6, 20, "the member")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KCLI_")}
        env.update(KCLI_CONFIG=str(tmp_path / "config.yaml"), KCLI_DATA_DIR=str(tmp_path / "d"),
                   KCLI_BOOTSTRAP_SERVER=broker.bootstrap)
        proc = run_kcli(env, "groups", "describe", "--group", group, "-o", "json")
        assert proc.returncode == 0, proc.stderr
        d = json.loads(proc.stdout)[0]
        assert d["type"] == "consumer" and d["protocol"] == "range" and d["state"] == "Stable"
        assert d["group_epoch"] == d["assignment_epoch"] >= 1
        (m,) = d["members"]
        assert m["client_id"] == "cli-app" and m["member_epoch"] == d["group_epoch"]
        assert m["assignment"] == m["target_assignment"] == [{"topic": topic, "partition": p} for p in range(3)]
        table = run_kcli(env, "groups", "describe", "--group", group).stdout
        assert "TYPE                     consumer" in table and "GROUP-EPOCH" in table
        assert f"{topic}(0,1,2)" in table and "CURRENT-EPOCH" in table
        listing = run_kcli(env, "groups", "list", "--type", "consumer")
        assert listing.returncode == 0 and any(line.split() == [group, "consumer"] for line in listing.stdout.splitlines())
        assert group not in run_kcli(env, "groups", "list", "--type", "classic").stdout
    finally:
        member.close()


# ---- a cluster: the coordinator fails over ---------------------------------------------------


def test_consumer_group_survives_its_coordinators_failover_with_offsets_intact(broker_factory, pg_database, tmp_path):  # noqa: F811
    """The new coordinator has no member state (kept in memory): the member's heartbeat gets
    UNKNOWN_MEMBER_ID, it rejoins with epoch 0 and resumes from the offsets in PostgreSQL."""
    from tests.test_cluster_groups import find_coordinator, group_for
    from tests.test_cluster_state import FAST, brokers_of

    objects = tmp_path / "objects"
    brokers = {n: broker_factory({**FAST, **BROKER}, name=f"node{n}",
                                 extra_args=["--cluster", pg_database, "--node-id", str(n), "--object-store",
                                             objects.as_uri()])
               for n in (1, 2)}
    for b in brokers.values():
        wait_for(lambda b=b: set(brokers_of(b.bootstrap)) == {1, 2}, 10, "two brokers")
    admin = AdminClient({"bootstrap.servers": brokers[1].bootstrap})
    admin.create_topics([NewTopic("events", 2, 1, config={"diskless.enable": "true"})])["events"].result(15)
    values = [b"%04d" % i for i in range(100)]
    produce(brokers[1].bootstrap, "events", values[:50], 2)
    group = group_for(([1, 2], 2))
    member = Member(brokers[1].bootstrap, group, ["events"], "survivor")
    try:
        wait_for(lambda: len(member.values) == 50, 20, "the first half")
        assert find_coordinator(brokers[1].bootstrap, group)[1] == 2
        brokers[2].kill9()
        wait_for(lambda: find_coordinator(brokers[1].bootstrap, group)[:2] == (0, 1), 15, "broker 1 to take the group")

        def rejoined() -> bool:
            with WireClient(brokers[1].bootstrap, timeout=10) as c:
                d = c.request(69, 0, {"group_ids": [group], "include_authorized_operations": False}).groups[0]
            return int(d.error_code) == 0 and d.group_state == "Stable" and len(member.owned) == 2 \
                and [len(m.assignment.topic_partitions[0].partitions) for m in d.members] == [2]

        wait_for(rejoined, 15, "the member to rejoin at the new coordinator")
        produce(brokers[1].bootstrap, "events", values[50:], 2)
        wait_for(lambda: len(member.values) >= 100, 30, "the second half after the failover")
        time.sleep(0.3)
        assert sorted(member.values) == values  # nothing read twice, nothing skipped
        with WireClient(brokers[1].bootstrap, timeout=10) as c:
            d = c.request(69, 0, {"group_ids": [group], "include_authorized_operations": False}).groups[0]
        assert int(d.error_code) == 0 and [m.client_id for m in d.members] == ["survivor"]
    finally:
        member.close()
