"""KIP-932 share groups ("queues"): confluent-kafka's ShareConsumer against the broker, the share
partition's state machine, persistence across restarts, wire-level bad input, and the
``kcli share-groups`` commands (docs/share-groups.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient, NewTopic

from kcli.coordinator.group.assignors import MemberSpec, TopicInfo
from kcli.coordinator.share.assignor import SimpleAssignor
from kcli.coordinator.share.session import ShareSessionCache, ShareSessionError
from kcli.coordinator.share.share_partition import (ACCEPT, ACKNOWLEDGED, ARCHIVED, AVAILABLE, GAP, RELEASE, REJECT,
                                                    Batch, SharePartition)
from kcli.protocol.client import WireClient
from tests.test_output_formats import assert_documented
from tests.brokerproc import BrokerProcess
from tests.fixtures_pg import pg_database, pg_server  # noqa: F401 - fixtures

LOCK_MS = 2000
BROKER_CONFIGS = {
    "group.share.record.lock.duration.ms": str(LOCK_MS),
    "group.share.heartbeat.interval.ms": "500",
    "group.share.session.timeout.ms": "6000",
    "diskless.append.commit.interval.ms": "50",
}


# ---- the share partition's state machine (no broker) ----------------------------------------------


def _batches(*ranges: tuple[int, int]) -> list[Batch]:
    return [Batch(a, b, memoryview(b"x")) for a, b in ranges]


def _sp(**kw: Any) -> SharePartition:
    args = {"lock_ms": 1000, "max_delivery": 3, "max_locks": 100, **kw}
    return SharePartition("g", "t", 0, **args)


def test_acquire_acknowledge_and_start_offset():
    sp = _sp()
    got, used = sp.acquire("m1", _batches((0, 4), (5, 9)), 5, in_window_only=False, now=0)
    assert got == [(0, 4, 1)] and len(used) == 1 and sp.end_offset == 5
    # the same records are not acquired by another member while locked
    got2, _ = sp.acquire("m2", _batches((0, 4), (5, 9)), 10, in_window_only=False, now=0)
    assert got2 == [(5, 9, 1)]
    assert sp.acknowledge("m2", [(0, 0, (ACCEPT,))]) == 121  # INVALID_RECORD_STATE: m1 holds it
    assert sp.acknowledge("m1", [(0, 1, (ACCEPT,)), (2, 4, (ACCEPT, REJECT, GAP))]) == 0
    assert sp.start_offset == 5 and sp.acquired == 5
    assert sp.acknowledge("m1", [(0, 0, (ACCEPT,))]) == 121  # already acknowledged
    assert sp.acknowledge("m2", [(6, 5, (ACCEPT,))]) == 42  # INVALID_REQUEST: first > last
    assert sp.acknowledge("m2", [(5, 6, (ACCEPT, ACCEPT, ACCEPT))]) == 42  # types do not match the range
    assert sp.acknowledge("m2", [(5, 5, (9,))]) == 42  # unknown type
    assert sp.acknowledge("m2", [(5, 5, (4,))]) == 42  # RENEW without is_renew_ack
    assert sp.acknowledge("m2", [(5, 5, (4,))], renew_allowed=True, now=900) == 0  # the lock starts again
    assert sp.expire_locks(now=1500) == 4 and sp.records[5].state == 1  # 6-9 expired, 5 renewed until 1900
    assert sp.expire_locks(now=1900) == 1 and sp.records[5].state == AVAILABLE


def test_release_timeout_and_delivery_limit_archive_a_poison_record():
    sp = _sp(max_delivery=3)
    got, _ = sp.acquire("m", _batches((0, 1)), 10, in_window_only=False, now=0)
    assert got == [(0, 1, 1)]
    assert sp.acknowledge("m", [(1, 1, (ACCEPT,)), (0, 0, (RELEASE,))]) == 0
    for attempt in (2, 3):
        got, _ = sp.acquire("m", _batches((0, 1)), 10, in_window_only=True, now=0)
        assert got == [(0, 0, attempt)]
        assert sp.acknowledge("m", [(0, 0, (RELEASE,))]) == 0
    # released at the limit: archived, never delivered again, the start offset moves past it
    assert sp.records == {} and sp.start_offset == 2
    # a lock that expires counts as a delivery too
    sp2 = _sp(max_delivery=2)
    sp2.acquire("m", _batches((0, 0)), 1, in_window_only=False, now=0)
    assert sp2.expire_locks(now=500) == 0 and sp2.expire_locks(now=1000) == 1
    assert sp2.records[0].state == AVAILABLE and sp2.records[0].count == 1
    sp2.acquire("m", _batches((0, 0)), 1, in_window_only=True, now=2000)
    assert sp2.expire_locks(now=3000) == 1 and sp2.start_offset == 1  # archived at the limit


def test_snapshot_round_trip_keeps_acknowledged_and_counts_not_locks():
    sp = _sp()
    sp.acquire("m", _batches((0, 9)), 10, in_window_only=False, now=0)
    sp.acknowledge("m", [(0, 2, (ACCEPT,)), (5, 5, (ACCEPT,)), (6, 6, (RELEASE,))])
    snap = sp.snapshot()
    assert snap["start_offset"] == 3
    again = _sp()
    again.load(json.loads(json.dumps(snap)))
    assert again.start_offset == 3 and again.end_offset == 10 and again.acquired == 0
    assert again.records[5].state == ACKNOWLEDGED and again.records[3].state == AVAILABLE
    assert again.records[3].count == 1 and again.records[6].count == 1  # acquired → available, count kept
    got, _ = again.acquire("m2", _batches((0, 9)), 100, in_window_only=True, from_offset=3, now=0)
    assert got == [(3, 4, 2), (6, 9, 2)]  # 5 was acknowledged: never delivered again


def test_offsets_without_records_are_archived_and_window_limit_holds():
    sp = _sp(max_locks=5)
    got, _ = sp.acquire("m", _batches((0, 1), (4, 5)), 100, in_window_only=False, now=0)  # 2-3 compacted away
    assert got == [(0, 1, 1), (4, 5, 1)] and sp.records[2].state == ARCHIVED
    got, _ = sp.acquire("m", _batches((6, 9)), 100, in_window_only=False, now=0)
    assert got == [] and sp.end_offset == 6  # the window (6 in flight) is full
    sp.acknowledge("m", [(0, 1, (ACCEPT,)), (4, 5, (ACCEPT,))])
    assert sp.start_offset == 6 and sp.records == {}


def test_simple_assignor_shares_partitions():
    tid = uuid.uuid4()
    topics = {"t": TopicInfo("t", tid, (0,))}
    members = [MemberSpec(f"m{i}", None, frozenset({"t"})) for i in range(4)]
    out = SimpleAssignor().assign(members, topics)
    assert all(a == {tid: {0}} for a in out.values())  # one partition: every member gets it
    topics = {"t": TopicInfo("t", tid, tuple(range(6)))}
    out = SimpleAssignor().assign(members[:2], topics)
    assert sorted(len(a[tid]) for a in out.values()) == [3, 3] and out["m0"][tid] | out["m1"][tid] == set(range(6))
    sticky = SimpleAssignor().assign([MemberSpec("m0", None, frozenset({"t"}), out["m0"]),
                                      MemberSpec("m1", None, frozenset({"t"}), out["m1"]),
                                      MemberSpec("m2", None, frozenset({"t"}))], topics)
    assert all(len(a[tid]) == 2 for a in sticky.values())
    assert sticky["m0"][tid] <= out["m0"][tid] and sticky["m1"][tid] <= out["m1"][tid]


def test_share_session_cache_epochs():
    cache = ShareSessionCache(max_entries=1)
    s, full = cache.fetch_context("g", "m", 0, [("t", 0)], [], False)
    assert full and s.epoch == 1
    with pytest.raises(ShareSessionError) as err:
        cache.fetch_context("g", "m", 5, [], [], False)
    assert err.value.code == 123  # INVALID_SHARE_SESSION_EPOCH
    with pytest.raises(ShareSessionError) as err:
        cache.fetch_context("g", "other", 3, [], [], False)
    assert err.value.code == 122  # SHARE_SESSION_NOT_FOUND
    with pytest.raises(ShareSessionError) as err:
        cache.fetch_context("g", "other", 0, [], [], False)
    assert err.value.code == 133  # SHARE_SESSION_LIMIT_REACHED
    with pytest.raises(ShareSessionError) as err:
        cache.fetch_context("g", "m", 0, [], [], True)
    assert err.value.code == 42  # acknowledgements in an initial request
    with pytest.raises(ShareSessionError) as err:
        cache.acknowledge_context("g", "m", 0)
    assert err.value.code == 123


# ---- a real broker ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sbroker(tmp_path_factory: pytest.TempPathFactory):
    b = BrokerProcess(tmp_path_factory.mktemp("share") / "data", BROKER_CONFIGS).start()
    yield b
    b.stop()


def _topic(bootstrap: str, name: str, partitions: int = 1, diskless: bool = False) -> str:
    a = AdminClient({"bootstrap.servers": bootstrap})
    configs = {"diskless.enable": "true"} if diskless else {}
    a.create_topics([NewTopic(name, partitions, 1, config=configs)])[name].result(20)
    return name


def _produce(bootstrap: str, topic: str, n: int, partition: int = 0, per_batch: int = 5) -> None:
    """``n`` records in batches of ``per_batch`` (a share fetch acquires whole batches, so small
    ones let several members share a partition's backlog)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(n):
        p.produce(topic, f"v{i}".encode(), partition=partition)
        if (i + 1) % per_batch == 0:
            assert p.flush(20) == 0
    assert p.flush(20) == 0


def _kcli(bootstrap: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "kcli", "-b", bootstrap, *args], capture_output=True, text=True,
                          timeout=60)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def _consumer(bootstrap: str, group: str, **extra: Any) -> ShareConsumer:
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3, **extra}
    return ShareConsumer(conf)


def _reset_to_earliest(bootstrap: str, group: str, topic: str) -> None:
    _kcli(bootstrap, "share-groups", "reset-offsets", "--group", group, "--topic", topic, "--to-earliest", "--execute")


@pytest.mark.parametrize("diskless", [False, True], ids=["classic", "diskless"])
def test_members_share_one_partition_each_record_once(sbroker, diskless):
    """Three ShareConsumers on one partition: every record is delivered, to one member, once
    (no lock expires, so no record was ever acquired by two members)."""
    kind = "dl" if diskless else "cl"
    topic, group, n = _topic(sbroker.bootstrap, f"share-{kind}", diskless=diskless), f"workers-{kind}", 300
    _reset_to_earliest(sbroker.bootstrap, group, topic)  # state at offset 0 before anyone joins
    seen: dict[int, list[str]] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def work(name: str) -> None:
        c = _consumer(sbroker.bootstrap, group, **{"max.poll.records": 7})
        c.subscribe([topic])
        try:
            while not stop.is_set():
                for m in c.poll(0.5):
                    if m.error() is None:
                        with lock:
                            seen.setdefault(m.offset(), []).append(name)
                time.sleep(0.02)  # let the others take their turn
            c.commit_sync(10)
        finally:
            c.close()

    threads = [threading.Thread(target=work, args=(f"c{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # all three members assigned the partition, then the records come
        desc = json.loads(_kcli(sbroker.bootstrap, "-o", "json", "share-groups", "describe", "--group", group).stdout)
        if sum(1 for m in desc[0]["members"] if m["assignment"]) == 3:
            break
        time.sleep(0.3)
    _produce(sbroker.bootstrap, topic, n)
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline and len(seen) < n:
        time.sleep(0.2)
    time.sleep(0.5)
    out = _kcli(sbroker.bootstrap, "-o", "json", "share-groups", "describe", "--group", group)
    stop.set()
    for t in threads:
        t.join(30)
    assert sorted(seen) == list(range(n))
    assert all(len(v) == 1 for v in seen.values()), {o: v for o, v in seen.items() if len(v) > 1}
    assert len({v[0] for v in seen.values()}) >= 2, "the partition's records were shared among the members"
    desc = json.loads(out.stdout)[0]
    assert desc["type"] == "share" and desc["state"] == "Stable" and len(desc["members"]) == 3
    assert all(m["assignment"] == [{"topic": topic, "partition": 0}] for m in desc["members"])


_STUCK_MEMBER = textwrap.dedent("""
    import json, sys, time
    from confluent_kafka import ShareConsumer
    c = ShareConsumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                       "share.acknowledgement.mode": "explicit", "max.poll.records": 20, "log_level": 3})
    c.subscribe([sys.argv[3]])
    while True:
        msgs = [m for m in c.poll(0.5) if m.error() is None]
        if msgs:
            print(json.dumps([m.offset() for m in msgs]), flush=True)
            time.sleep(3600)  # holds its batch, never acknowledges: killed -9 here
""")


def test_records_of_a_killed_member_are_delivered_again(sbroker, tmp_path):
    topic, group = _topic(sbroker.bootstrap, "share-kill"), "kill9"
    _produce(sbroker.bootstrap, topic, 20)
    _reset_to_earliest(sbroker.bootstrap, group, topic)
    script = tmp_path / "stuck.py"
    script.write_text(_STUCK_MEMBER)
    proc = subprocess.Popen([sys.executable, str(script), sbroker.bootstrap, group, topic], stdout=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        held = json.loads(line)
        assert held, "the stuck member got a batch"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    killed = time.monotonic()
    c = _consumer(sbroker.bootstrap, group)
    c.subscribe([topic])
    got: dict[int, int] = {}
    try:
        while time.monotonic() - killed < 30 and not set(held) <= set(got):
            for m in c.poll(0.5):
                if m.error() is None:
                    got[m.offset()] = m.delivery_count()
        c.commit_sync(10)
    finally:
        c.close()
    assert set(held) <= set(got)
    assert all(got[o] == 2 for o in held), got  # the second delivery of each held record
    assert time.monotonic() - killed < LOCK_MS / 1000 + 20


def test_acquisition_lock_expires_for_a_live_member_that_does_not_acknowledge(sbroker):
    """Wire level: a member acquires and goes quiet; after group.share.record.lock.duration.ms
    another member gets the records with delivery count 2; the first one's late ack is refused."""
    topic, group = _topic(sbroker.bootstrap, "share-lock"), "lockers"
    _produce(sbroker.bootstrap, topic, 5)
    _reset_to_earliest(sbroker.bootstrap, group, topic)
    with WireClient(sbroker.bootstrap) as w:
        tid = _topic_id(w, topic)
        a, b = _join(w, group, topic), _join(w, group, topic)
        first = _share_fetch(w, group, a, 0, tid, [0])
        ranges = _acquired(first)
        assert ranges == [(0, 4, 1)]
        assert _acquired(_share_fetch(w, group, b, 0, tid, [0], max_wait=0)) == []  # locked by a
        time.sleep(LOCK_MS / 1000 + 0.5)
        assert _acquired(_share_fetch(w, group, b, 1, tid, [], max_wait=2000)) == [(0, 4, 2)]
        late = _share_ack(w, group, a, 1, tid, 0, [(0, 4, [ACCEPT])])
        assert late.error_code == 0 and _part(late).error_code == 121  # INVALID_RECORD_STATE
        done = _share_ack(w, group, b, 2, tid, 0, [(0, 4, [ACCEPT])])
        assert _part(done).error_code == 0


def test_delivery_limit_archives_a_poison_record(sbroker):
    topic, group = _topic(sbroker.bootstrap, "share-poison"), "poison"
    _produce(sbroker.bootstrap, topic, 10)
    _reset_to_earliest(sbroker.bootstrap, group, topic)
    poison = 3
    deliveries: list[int] = []
    accepted: set[int] = set()
    c = _consumer(sbroker.bootstrap, group, **{"share.acknowledgement.mode": "explicit"})
    c.subscribe([topic])
    deadline = time.monotonic() + 40
    try:
        while time.monotonic() < deadline:
            msgs = [m for m in c.poll(0.5) if m.error() is None]
            for m in msgs:
                if m.offset() == poison:
                    deliveries.append(m.delivery_count())
                    c.acknowledge(m, AcknowledgeType.RELEASE)  # always gives it back
                else:
                    accepted.add(m.offset())
                    c.acknowledge(m, AcknowledgeType.ACCEPT)
            if msgs:
                c.commit_sync(10)
            if len(deliveries) >= 5 and len(accepted) == 9 and not msgs:
                break
    finally:
        c.close()
    assert deliveries == [1, 2, 3, 4, 5]  # group.share.delivery.count.limit (Kafka's default 5)
    out = json.loads(_kcli(sbroker.bootstrap, "-o", "json", "share-groups", "describe", "--group", group).stdout)[0]
    assert out["offsets"] == [{"topic": topic, "partition": 0, "start_offset": 10, "leader_epoch": 0, "lag": 0}]


def test_restart_resumes_without_redelivering_acknowledged_records(broker_factory):
    b = broker_factory(BROKER_CONFIGS)
    topic, group = _topic(b.bootstrap, "share-restart"), "durable"
    _produce(b.bootstrap, topic, 100)
    _reset_to_earliest(b.bootstrap, group, topic)
    first: set[int] = set()
    c = _consumer(b.bootstrap, group, **{"share.acknowledgement.mode": "explicit", "max.poll.records": 10})
    c.subscribe([topic])
    try:
        while len(first) < 40:
            for m in c.poll(0.5):
                if m.error() is None:
                    first.add(m.offset())
                    c.acknowledge(m, AcknowledgeType.ACCEPT)
            c.commit_sync(10)
    finally:
        c.close()
    b.kill9()  # the acknowledgements were answered: they are on disk
    b.start()
    second: list[int] = []
    c = _consumer(b.bootstrap, group, **{"max.poll.records": 50})
    c.subscribe([topic])
    deadline = time.monotonic() + 40
    try:
        while time.monotonic() < deadline and len(first) + len(second) < 100:
            second += [m.offset() for m in c.poll(0.5) if m.error() is None]
        c.commit_sync(10)
    finally:
        c.close()
    assert not set(second) & first, "acknowledged records came back after the restart"
    assert sorted(first | set(second)) == list(range(100)) and len(second) == len(set(second))


# ---- wire-level bad input -----------------------------------------------------------------------------


def _topic_id(w: WireClient, topic: str) -> uuid.UUID:
    return w.request(3, 12, {"topics": [{"name": topic}]}).topics[0].topic_id


def _join(w: WireClient, group: str, topic: str) -> str:
    mid = uuid.uuid4().hex
    r = w.request(76, 1, {"group_id": group, "member_id": mid, "member_epoch": 0, "subscribed_topic_names": [topic]})
    assert r.error_code == 0, r
    return mid


def _share_fetch(w: WireClient, group: str, member: str, epoch: int, tid: uuid.UUID, parts: list[int],
                 acks: dict[int, list[tuple[int, int, list[int]]]] | None = None, max_wait: int = 1000) -> Any:
    acks = acks or {}
    partitions = [{"partition_index": p, "acknowledgement_batches": [
        {"first_offset": f, "last_offset": la, "acknowledge_types": t} for f, la, t in acks.get(p, [])]}
        for p in sorted(set(parts) | set(acks))]
    return w.request(78, 1, {"group_id": group, "member_id": member, "share_session_epoch": epoch,
                             "max_wait": max_wait, "min_bytes": 1, "max_bytes": 1 << 20, "max_records": 100,
                             "batch_size": 100, "topics": [{"topic_id": tid, "partitions": partitions}] if partitions else [],
                             "forgotten_topics_data": []})


def _share_ack(w: WireClient, group: str, member: str, epoch: int, tid: uuid.UUID, partition: int,
               batches: list[tuple[int, int, list[int]]]) -> Any:
    return w.request(79, 1, {"group_id": group, "member_id": member, "share_session_epoch": epoch, "topics": [
        {"topic_id": tid, "partitions": [{"partition_index": partition, "acknowledgement_batches": [
            {"first_offset": f, "last_offset": la, "acknowledge_types": t} for f, la, t in batches]}]}]})


def _part(resp: Any) -> Any:
    return resp.responses[0].partitions[0]


def _acquired(resp: Any) -> list[tuple[int, int, int]]:
    assert resp.error_code == 0, resp
    return [(int(a.first_offset), int(a.last_offset), int(a.delivery_count))
            for t in resp.responses for p in t.partitions for a in p.acquired_records]


def test_bad_input_gets_kafka_error_codes_and_keeps_the_connection(sbroker):
    topic, group = _topic(sbroker.bootstrap, "share-bad"), "bad-input"
    _produce(sbroker.bootstrap, topic, 3)
    _reset_to_earliest(sbroker.bootstrap, group, topic)
    with WireClient(sbroker.bootstrap) as w:
        tid = _topic_id(w, topic)
        # ShareGroupHeartbeat
        hb = w.request(76, 1, {"group_id": group, "member_id": "nobody", "member_epoch": 3})
        assert hb.error_code == 25  # UNKNOWN_MEMBER_ID
        assert w.request(76, 1, {"group_id": group, "member_id": "", "member_epoch": 0,
                                 "subscribed_topic_names": [topic]}).error_code == 42  # INVALID_REQUEST
        assert w.request(76, 1, {"group_id": group, "member_id": "x", "member_epoch": 0}).error_code == 42
        member = _join(w, group, topic)
        assert w.request(76, 1, {"group_id": group, "member_id": member, "member_epoch": 99}).error_code == 110  # FENCED
        assert w.request(76, 1, {"group_id": "share-bad-as-classic", "member_id": member,
                                 "member_epoch": -7}).error_code == 42
        # ShareFetch: sessions
        assert _share_fetch(w, group, "stranger", 0, tid, [0]).error_code == 25  # not a member of the group
        assert _share_fetch(w, group, member, 4, tid, [0]).error_code == 122  # SHARE_SESSION_NOT_FOUND
        assert _acquired(_share_fetch(w, group, member, 0, tid, [0])) == [(0, 2, 1)]
        assert _share_fetch(w, group, member, 9, tid, []).error_code == 123  # INVALID_SHARE_SESSION_EPOCH
        assert _share_fetch(w, group, member, 0, tid, [0], acks={0: [(0, 0, [ACCEPT])]}).error_code == 42
        # (the session was replaced by that epoch-0 request: epoch 1 is next)
        # ShareAcknowledge: records not acquired by this member, malformed batches, epoch 0
        other = _join(w, group, topic)
        assert _share_fetch(w, group, other, 0, tid, [0], max_wait=0).error_code == 0
        assert _part(_share_ack(w, group, other, 1, tid, 0, [(0, 0, [ACCEPT])])).error_code == 121
        assert _part(_share_ack(w, group, member, 1, tid, 0, [(0, 0, [7])])).error_code == 42
        assert _part(_share_ack(w, group, member, 2, tid, 0, [(2, 1, [ACCEPT])])).error_code == 42
        assert _part(_share_ack(w, group, member, 3, tid, 0, [(50, 60, [ACCEPT])])).error_code == 121
        assert _share_ack(w, group, member, 0, tid, 0, [(0, 0, [ACCEPT])]).error_code == 123
        assert _part(_share_ack(w, group, member, 4, tid, 7, [(0, 0, [ACCEPT])])).error_code == 3  # no partition 7
        unknown = _share_ack(w, group, member, 5, uuid.uuid4(), 0, [(0, 0, [ACCEPT])])
        assert _part(unknown).error_code == 100  # UNKNOWN_TOPIC_ID
        assert _part(_share_ack(w, group, member, 6, tid, 0, [(0, 2, [ACCEPT])])).error_code == 0
        # the final request closes the session; another final one finds none
        assert _share_ack(w, group, member, -1, tid, 0, []).error_code == 0
        assert _share_ack(w, group, member, -1, tid, 0, []).error_code == 122
        # admin APIs
        assert w.request(91, 0, {"group_id": group, "topics": []}).error_code == 68  # NON_EMPTY_GROUP
        assert w.request(92, 0, {"group_id": "never-seen", "topics": [{"topic_name": topic}]}).error_code == 69
        d = w.request(90, 1, {"groups": [{"group_id": group, "topics": [{"topic_name": "nope", "partitions": [0]}]}]})
        assert d.groups[0].topics[0].partitions[0].error_code == 3
        assert w.request(18, 3, {}).error_code == 0  # still connected, still answering


def test_list_and_describe_groups_name_the_share_type(sbroker):
    topic, group = _topic(sbroker.bootstrap, "share-types"), "typed"
    with WireClient(sbroker.bootstrap) as w:
        _join(w, group, topic)
        listed = w.request(16, 5, {"states_filter": [], "types_filter": ["share"]})
        rows = {g.group_id: g for g in listed.groups}
        assert rows[group].group_type == "share" and rows[group].protocol_type == "share"
        assert rows[group].group_state == "Stable"
        assert group not in {g.group_id for g in w.request(16, 5, {"states_filter": [],
                                                                   "types_filter": ["classic"]}).groups}
        described = w.request(15, 5, {"groups": [group], "include_authorized_operations": False}).groups[0]
        assert described.group_state == "Dead"  # as Kafka's DescribeGroups v0-v5 shows a share group
        sd = w.request(77, 1, {"group_ids": [group, "no-such-share-group"], "include_authorized_operations": False})
        assert sd.groups[0].error_code == 0 and sd.groups[0].assignor_name == "simple"
        assert sd.groups[1].error_code == 69


# ---- kcli share-groups --------------------------------------------------------------------------------


def test_cli_list_describe_reset_and_delete(sbroker):
    topic, group = _topic(sbroker.bootstrap, "share-cli", partitions=2), "cli-workers"
    _produce(sbroker.bootstrap, topic, 6, partition=0)
    _produce(sbroker.bootstrap, topic, 4, partition=1)
    dry = _kcli(sbroker.bootstrap, "-o", "json", "share-groups", "reset-offsets", "--group", group, "--topic", topic,
                "--to-latest")
    plan = json.loads(dry.stdout)
    assert_documented("kcli share-groups reset-offsets", plan)
    assert plan["dry_run"] and [(o["partition"], o["new_start_offset"]) for o in plan["offsets"]] == [(0, 6), (1, 4)]
    assert group not in _kcli(sbroker.bootstrap, "share-groups", "list").stdout.split()  # nothing was changed
    _kcli(sbroker.bootstrap, "share-groups", "reset-offsets", "--group", group, "--topic", f"{topic}:1",
          "--to-offset", "2", "--execute")
    assert group in _kcli(sbroker.bootstrap, "share-groups", "list").stdout.split()
    c = _consumer(sbroker.bootstrap, group)
    c.subscribe([topic])
    got: list[tuple[int, int]] = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(got) < 2:
            got += [(m.partition(), m.offset()) for m in c.poll(0.5) if m.error() is None]
        text = _kcli(sbroker.bootstrap, "share-groups", "describe", "--group", group).stdout
        assert "Stable" in text and "START-OFFSET" in text and "CONSUMER-ID" in text
        assert_documented("kcli share-groups describe", json.loads(
            _kcli(sbroker.bootstrap, "-o", "json", "share-groups", "describe", "--group", group).stdout))
        refused = _kcli(sbroker.bootstrap, "share-groups", "delete", "--group", group, check=False)
        assert refused.returncode != 0 and "NON_EMPTY_GROUP" in refused.stderr
        busy = _kcli(sbroker.bootstrap, "share-groups", "reset-offsets", "--group", group, "--all-topics",
                     "--to-earliest", "--execute", check=False)
        assert busy.returncode != 0 and "not empty" in busy.stderr
        c.commit_sync(10)
    finally:
        c.close()
    assert sorted(got) == [(1, 2), (1, 3)]
    listed = json.loads(_kcli(sbroker.bootstrap, "-o", "json", "share-groups", "list", "--state", "Empty").stdout)
    assert {"group": group, "state": "Empty", "type": "share"} in listed
    assert_documented("kcli share-groups list", listed)
    dropped = json.loads(_kcli(sbroker.bootstrap, "-o", "json", "share-groups", "delete-offsets", "--group", group,
                               "--topic", topic).stdout)
    assert dropped == [{"topic": topic, "error": None}]
    assert_documented("kcli share-groups delete-offsets", dropped)
    deleted = json.loads(_kcli(sbroker.bootstrap, "-o", "json", "share-groups", "delete", "--group", group).stdout)
    assert_documented("kcli share-groups delete", deleted)
    assert deleted == [{"group": group, "deleted": True, "error": None}]
    assert group not in _kcli(sbroker.bootstrap, "share-groups", "list").stdout.split()
    gone = _kcli(sbroker.bootstrap, "share-groups", "describe", "--group", group, check=False)
    assert gone.returncode != 0 and "does not exist" in gone.stderr
    classic = _kcli(sbroker.bootstrap, "share-groups", "reset-offsets", "--group", group, "--topic", topic,
                    "--to-earliest", "--bogus", check=False)
    assert classic.returncode != 0


def test_group_config_share_auto_offset_reset(sbroker):
    """share.auto.offset.reset is a group config (kafka-configs --entity-type groups): latest by
    default, earliest makes a new share group read what was produced before it joined."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    topic, group = _topic(sbroker.bootstrap, "share-reset-config"), "from-earliest"
    _produce(sbroker.bootstrap, topic, 4)
    a = AdminClient({"bootstrap.servers": sbroker.bootstrap})
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    a.incremental_alter_configs([res])[res].result(20)
    described = a.describe_configs([ConfigResource(ResourceType.GROUP, group)])
    configs = list(described.values())[0].result(20)
    assert configs["share.auto.offset.reset"].value == "earliest"
    assert configs["share.record.lock.duration.ms"].value == str(LOCK_MS)
    bad = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "sometimes", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(Exception) as err:
        a.incremental_alter_configs([bad])[bad].result(20)
    assert "INVALID_CONFIG" in str(err.value) or "String must be one of" in str(err.value)
    c = _consumer(sbroker.bootstrap, group)
    c.subscribe([topic])
    got: list[int] = []
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(got) < 4:
            got += [m.offset() for m in c.poll(0.5) if m.error() is None]
        c.commit_sync(10)
    finally:
        c.close()
    assert sorted(got) == [0, 1, 2, 3]
    # the default (latest): a group without the config starts at the end
    c = _consumer(sbroker.bootstrap, "from-latest")
    c.subscribe([topic])
    try:
        quiet = [m for _ in range(4) for m in c.poll(0.5) if m.error() is None]
    finally:
        c.close()
    assert quiet == []


def test_postgres_share_state_round_trip_and_state_epoch_fencing(pg_database):  # noqa: F811 - fixture
    """The cluster's store: table share_group_state (migration step 5); a write with an older
    state epoch than the stored one is refused; group configs and deletions."""
    import asyncio

    import psycopg

    from kcli.cluster.migrations import migrate
    from kcli.cluster.pg_offsets import PostgresOffsetStore
    from kcli.coordinator.share.persister import SharePersister

    with psycopg.connect(pg_database, autocommit=True) as conn:
        migrate(conn)

    async def scenario() -> None:
        store = PostgresOffsetStore(pg_database, 1, label="test", connect_kwargs={}, timeout_s=10)
        store.open()
        p = SharePersister(store)
        try:
            assert await p.read("g", "t", 0) is None
            state = {"state_epoch": 2, "start_offset": 40, "batches": [[41, 43, ACKNOWLEDGED, 1], [44, 44, 0, 3]]}
            assert await p.write("g", "t", 0, state)
            assert await p.read("g", "t", 0) == state
            assert not await p.write("g", "t", 0, {**state, "state_epoch": 1, "start_offset": 99})  # fenced
            assert (await p.read("g", "t", 0))["start_offset"] == 40
            assert await p.write("g", "t", 1, {"state_epoch": 0, "start_offset": 5, "batches": []})
            await p.write_group_configs("g", {"share.auto.offset.reset": "earliest"})
            assert await p.group_configs("g") == {"share.auto.offset.reset": "earliest"}
            assert sorted(await p.states("g")) == [("g", "t", 0), ("g", "t", 1)]  # configs are not a partition
            await p.delete("g", "t")
            assert await p.states("g") == {} and await p.group_configs("g") == {"share.auto.offset.reset": "earliest"}
            await p.delete("g")
            assert await p.group_configs("g") == {}
        finally:
            await store.close()

    asyncio.run(scenario())


def test_local_store_keeps_share_state_through_compaction_and_reopen(tmp_path):
    import asyncio

    from kcli.coordinator.group.offsets import OffsetStore

    async def write(store: OffsetStore) -> None:
        for i in range(60):  # the same partition over and over: the log compacts
            await store.share_state_write("g", "t", 0, {"state_epoch": 0, "start_offset": i, "batches": []})
        await store.share_state_write("g", "t", 1, {"state_epoch": 3, "start_offset": 7, "batches": [[8, 9, 2, 1]]})
        await store.share_state_write("h", "t", 0, {"state_epoch": 0, "start_offset": 1, "batches": []})
        store.append_behind([{"type": "group_delete", "group": "h"}])
        await store.close()

    store = OffsetStore(tmp_path / "__consumer_offsets", compact_min_lines=10)
    store.open()
    asyncio.run(write(store))
    assert store.compactions >= 1
    again = OffsetStore(tmp_path / "__consumer_offsets")
    again.open()
    states = asyncio.run(again.share_states())
    assert states == {("g", "t", 0): {"state_epoch": 0, "start_offset": 59, "batches": []},
                      ("g", "t", 1): {"state_epoch": 3, "start_offset": 7, "batches": [[8, 9, 2, 1]]}}


@pytest.mark.parametrize("diskless", [False, True], ids=["classic", "diskless"])
def test_cluster_share_fetch_is_served_by_each_partition_leader(broker_factory, pg_database, diskless):  # noqa: F811
    """Two brokers over PostgreSQL: a ShareConsumer reads partitions led by both (its ShareFetch
    goes to each partition's leader, the state is in share_group_state); a ShareFetch at the other
    broker answers NOT_LEADER_OR_FOLLOWER with the leader's endpoint."""
    from tests.test_cluster_state import FAST, brokers_of, wait_for

    nodes = [broker_factory({**FAST, **BROKER_CONFIGS}, name=f"node{i}",
                            extra_args=["--cluster", pg_database, "--node-id", str(i), "--rack", f"r{i}"])
             for i in (1, 2)]
    wait_for(lambda: len(brokers_of(nodes[0].bootstrap)) == 2, 20, "both brokers registered")
    topic, group = _topic(nodes[0].bootstrap, f"share-cluster-{int(diskless)}", partitions=4, diskless=diskless), "cw"
    for p in range(4):
        _produce(nodes[0].bootstrap, topic, 10, partition=p)
    _reset_to_earliest(nodes[0].bootstrap, group, topic)
    md = AdminClient({"bootstrap.servers": nodes[0].bootstrap}).list_topics(topic, timeout=10).topics[topic]
    leaders = {p.id: p.leader for p in md.partitions.values()}
    assert set(leaders.values()) == {1, 2}, leaders
    c = _consumer(nodes[1].bootstrap, group)
    c.subscribe([topic])
    got: set[tuple[int, int]] = set()
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and len(got) < 40:
            got |= {(m.partition(), m.offset()) for m in c.poll(0.5) if m.error() is None}
        c.commit_sync(10)
    finally:
        c.close()
    assert got == {(p, o) for p in range(4) for o in range(10)}
    wrong = next(p for p, leader in leaders.items() if leader == 2)
    with WireClient(nodes[0].bootstrap) as w:
        tid = _topic_id(w, topic)
        member = _join(w, group, topic)
        r = _share_fetch(w, group, member, 0, tid, [wrong], max_wait=0)
        part = _part(r)
        assert part.error_code == 6 and part.current_leader.leader_id == 2  # NOT_LEADER_OR_FOLLOWER
        assert [e.node_id for e in r.node_endpoints] == [2]
    out = json.loads(_kcli(nodes[0].bootstrap, "-o", "json", "share-groups", "describe", "--group", group).stdout)[0]
    assert sorted((o["partition"], o["start_offset"]) for o in out["offsets"]) == [(p, 10) for p in range(4)]


def test_tiered_partition_is_shared_from_the_remote_tier(broker_factory):
    """A tiered topic whose oldest records are only in the remote tier: a share group reset to
    the earliest offset reads them (ShareFetch through the remote-tier read) and then the local log."""
    from tests.test_tiered import TIERED_BROKER, TIERED_TOPIC, fill, list_offset, wait_until

    b = broker_factory({**TIERED_BROKER, **BROKER_CONFIGS})
    topic, group = "share-tiered", "tiered-workers"
    from tests.kafka_helpers import create_topic

    create_topic(b.bootstrap, topic, 1, TIERED_TOPIC)
    fill(b.bootstrap, topic, 0, 600)
    local_start = wait_until("the local log to start above 0", lambda: list_offset(b.bootstrap, topic, -4) or None)
    assert list_offset(b.bootstrap, topic, -2) == 0
    _reset_to_earliest(b.bootstrap, group, topic)
    c = _consumer(b.bootstrap, group, **{"max.poll.records": 100})
    c.subscribe([topic])
    got: list[int] = []
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and len(got) < 600:
            got += [m.offset() for m in c.poll(0.5) if m.error() is None]
        c.commit_sync(10)
    finally:
        c.close()
    assert local_start > 0 and sorted(got) == list(range(600))
