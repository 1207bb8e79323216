"""Tiered topics with replication factor > 1 (KIP-405's follower side, KIP-1023), on three real
kcli brokers over one PostgreSQL database and one shared object store: only the leader copies,
followers delete their own local segments only once they are in the remote tier, a new leader
goes on from the highest tiered offset (no offset copied twice or lost), a replica on an empty
disk starts from the last tiered offset instead of copying the log, and KIP-950 disablement and
KIP-694 partition reduction act on every replica."""

from __future__ import annotations

import shutil
import time
import uuid
from typing import Any

import psycopg
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka import ElectionType
from confluent_kafka.admin import AdminClient, NewTopic

from kcli.protocol.client import WireClient
from kcli.protocol.errors import ErrorCode
from kcli.protocol.interbroker import INTER_BROKER_CLIENT_ID
from tests.brokerproc import BrokerProcess
from tests.fixtures_pg import pg_server  # noqa: F401 - fixture
from tests.replication_cluster import FeatureCluster, describe, feature_cluster  # noqa: F401
from tests.test_cluster_state import wait_for
from tests.test_shrink import delete_partitions
from tests.test_tiered import alter, kcli_state

SEGMENT_BYTES = 8192
TOPIC = {"remote.storage.enable": "true", "segment.bytes": str(SEGMENT_BYTES), "local.retention.bytes": "16000",
         "min.insync.replicas": "2"}
COUNT = 400  # ~5 segments of 8 KiB per round, of which local retention keeps about two


@pytest.fixture
def tc(feature_cluster: FeatureCluster) -> FeatureCluster:  # noqa: F811
    return feature_cluster


# ---- helpers ----------------------------------------------------------------------------------
def value(tag: str, i: int) -> bytes:
    return f"{tag}-{i:06d}-".encode() + b"x" * 80


def fill(bootstrap: str, topic: str, partition: int, tag: str, count: int = COUNT) -> None:
    prod = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 2,
                     "batch.size": 4000})
    errors: list[Any] = []
    for i in range(count):
        while True:
            try:
                prod.produce(topic, value(tag, i), partition=partition,
                             on_delivery=lambda err, _m: errors.append(err) if err else None)
                break
            except BufferError:
                prod.poll(0.05)
    assert prod.flush(30) == 0 and not errors, errors[:3]


def read_all(bootstrap: str, topic: str, partition: int, count: int, timeout: float = 30) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4()}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < count and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                out.append(m.value())
    finally:
        c.close()
    return out


def watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"w-{uuid.uuid4()}"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=20)
    finally:
        c.close()


def remote(url: str, topic_part: int | None = None, state: str = "COPY_SEGMENT_FINISHED",
           topic: str | None = None) -> list[tuple[int, int, int, int]]:
    """(partition, start, end, copying broker) of the remote segments in ``state``, by start offset."""
    sql = "SELECT partition, start_offset, end_offset, broker_id FROM remote_log_segments WHERE state = %s"
    args: list[Any] = [state]
    if topic is not None:
        sql += " AND metadata->>'topic' = %s"
        args.append(topic)
    with psycopg.connect(url) as conn:
        rows = conn.execute(sql, args).fetchall()
    return sorted((int(p), int(s), int(e), int(b)) for p, s, e, b in rows if topic_part is None or p == topic_part)


def live_remote(url: str, topic: str) -> list[tuple[int, int, int, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT partition, start_offset, end_offset, broker_id FROM remote_log_segments "
                            "WHERE metadata->>'topic' = %s AND state <> 'DELETE_SEGMENT_FINISHED'", (topic,)).fetchall()
    return sorted(tuple(int(x) for x in r) for r in rows)  # type: ignore[misc]


def local_bases(b: BrokerProcess, topic: str, partition: int) -> list[int]:
    return sorted(int(p.name[:20]) for p in (b.data_dir / f"{topic}-{partition}").glob("*.log"))


def contiguous(segs: list[tuple[int, int, int, int]]) -> bool:
    """Remote segments of one partition cover 0.. without a gap or an overlap."""
    nxt = 0
    for _p, start, end, _b in segs:
        if start != nxt:
            return False
        nxt = end + 1
    return True


def isr_full(bootstrap: str, topic: str) -> bool:
    parts = describe(bootstrap, topic)
    return bool(parts) and all(len(p.isrs) == len(p.replicas) and p.leader >= 0 for p in parts.values())


def create(bootstrap: str, topic: str, assignment: list[list[int]], configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, len(assignment), replica_assignment=assignment, config=configs)])[topic].result(20)
    wait_for(lambda: isr_full(bootstrap, topic), 20, f"the ISRs of {topic}")


# ---- tests ------------------------------------------------------------------------------------
def test_leader_copies_followers_trim_new_leader_resumes_empty_replica_starts_from_the_tier(tc):
    url = tc.url
    create(tc.bootstrap, "rt", [[1, 2, 3]], TOPIC)
    fill(tc.bootstrap, "rt", 0, "a")
    # only the leader (1) copies; the followers learn the segments and trim their own logs
    wait_for(lambda: len(remote(url, topic="rt")) >= 2, 30, "the leader's copies")
    for n in (2, 3):
        wait_for(lambda n=n: local_bases(tc.brokers[n], "rt", 0)[0] > 0, 30, f"local retention on follower {n}")
    tiered_upto = max(e for _p, _s, e, _b in remote(url, topic="rt"))
    for n in (1, 2, 3):  # nothing is deleted locally before it is in the remote tier
        assert 0 < local_bases(tc.brokers[n], "rt", 0)[0] <= tiered_upto + 1, (n, local_bases(tc.brokers[n], "rt", 0))
    assert {b for *_x, b in remote(url, topic="rt")} == {1}

    # the leader dies: a follower leads and copies on from the highest tiered offset
    tc.brokers[1].kill9()
    wait_for(lambda: describe(tc.bootstrap, "rt")[0].leader in (2, 3), 15, "a new leader")
    new_leader = describe(tc.bootstrap, "rt")[0].leader
    fill(tc.bootstrap, "rt", 0, "b")
    wait_for(lambda: any(b == new_leader for *_x, b in remote(url, topic="rt")), 30, "the new leader's copies")
    segs = remote(url, topic="rt")
    assert contiguous(segs), segs  # none copied twice, none lost

    # broker 1 comes back on an empty disk: it starts from the last tiered offset (KIP-1023)
    b1 = tc.brokers[1]
    shutil.rmtree(b1.data_dir)
    before = len(b1.log_text().splitlines())
    b1.start()
    wait_for(lambda: isr_full(tc.bootstrap, "rt"), 30, "broker 1 back in the ISR")
    built = [ln for ln in b1.log_text().splitlines()[before:] if "rt-0: offsets below" in ln]
    assert built, "the replica was not built from the remote tier"
    first_local = local_bases(b1, "rt", 0)[0]
    assert first_local > 0 and first_local in {e + 1 for _p, _s, e, _b in remote(url, topic="rt")}, first_local

    # it leads again (preferred election) and serves everything: the remote tier, then its own log
    def elected() -> bool:
        admin = AdminClient({"bootstrap.servers": tc.bootstrap})
        admin.elect_leaders(ElectionType.PREFERRED, None).result(20)
        return describe(tc.bootstrap, "rt")[0].leader == 1

    wait_for(elected, 30, "broker 1 to lead again")
    expected = [value("a", i) for i in range(COUNT)] + [value("b", i) for i in range(COUNT)]
    assert read_all(tc.bootstrap, "rt", 0, len(expected)) == expected
    # a follower asking the leader for an offset only in the remote tier is told so
    with WireClient(tc.brokers[1].bootstrap, client_id=INTER_BROKER_CLIENT_ID) as c:
        resp = c.request(1, 12, {"replica_id": 2, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                                 "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                                 "topics": [{"topic": "rt", "partitions": [{
                                     "partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                                     "last_fetched_epoch": -1, "log_start_offset": 0,
                                     "partition_max_bytes": 65536}]}],
                                 "forgotten_topics_data": [], "rack_id": ""})
    moved = resp.responses[0].partitions[0]
    assert int(moved.error_code) == ErrorCode.offset_moved_to_tiered_storage and not moved.records
    assert int(moved.log_start_offset) == 0
    fill(tc.bootstrap, "rt", 0, "c")
    wait_for(lambda: remote(url, topic="rt")[-1][3] == 1 and len({b for *_x, b in remote(url, topic="rt")}) >= 2,
             30, "broker 1 to copy again")
    segs = remote(url, topic="rt")
    assert contiguous(segs), segs


def test_disabling_tiering_on_a_replicated_topic_both_policies(tc):
    url = tc.url
    create(tc.bootstrap, "rdel", [[2, 3, 1]], TOPIC)
    create(tc.bootstrap, "rret", [[3, 1, 2]], TOPIC)
    fill(tc.bootstrap, "rdel", 0, "d")
    fill(tc.bootstrap, "rret", 0, "r")
    for topic, leader in (("rdel", 2), ("rret", 3)):
        wait_for(lambda topic=topic: len(remote(url, topic=topic)) >= 2, 30, f"copies of {topic}")
        assert {b for *_x, b in remote(url, topic=topic)} == {leader}
    alter(tc.bootstrap, "rdel", {"remote.storage.enable": "false", "remote.log.disable.policy": "delete"})
    alter(tc.bootstrap, "rret", {"remote.storage.enable": "false", "remote.log.disable.policy": "retain"})
    for topic in ("rdel", "rret"):
        wait_for(lambda topic=topic: kcli_state(tc.bootstrap, topic).get("kcli.tiered.state") == "DISABLED", 30,
                 f"{topic} DISABLED")
    assert live_remote(url, "rdel") == []  # policy delete: every remote segment is gone
    assert remote(url, topic="rret")  # policy retain: they stay readable
    assert read_all(tc.bootstrap, "rret", 0, COUNT) == [value("r", i) for i in range(COUNT)]
    # policy delete: the log now starts where the leader's local data does, on every replica
    low, high = watermarks(tc.bootstrap, "rdel")
    assert 0 < low < high == COUNT  # the remote part is gone, the local part stays
    assert read_all(tc.bootstrap, "rdel", 0, high - low) == [value("d", i) for i in range(low, COUNT)]
    fill(tc.bootstrap, "rdel", 0, "e", 50)  # acks=all with min.insync.replicas=2: the replicas follow
    wait_for(lambda: isr_full(tc.bootstrap, "rdel"), 20, "the ISR of rdel")


def test_partition_reduction_deletes_every_replica_and_the_remote_segments(tc):
    url = tc.url
    create(tc.bootstrap, "rsh", [[1, 2, 3], [2, 3, 1]], TOPIC)
    fill(tc.bootstrap, "rsh", 1, "s")
    wait_for(lambda: len(remote(url, 1, topic="rsh")) >= 2, 30, "copies of rsh-1")
    resp = delete_partitions(tc.brokers[1].bootstrap, "rsh", [1], 0)
    assert all(int(p.error_code) == 0 for t in resp.responses for p in t.partitions), resp
    wait_for(lambda: not any((b.data_dir / "rsh-1").exists() for b in tc.brokers.values()), 20,
             "rsh-1 deleted on every replica")
    wait_for(lambda: [s for s in live_remote(url, "rsh") if s[0] == 1] == [], 20, "the remote segments of rsh-1")
    assert all((b.data_dir / "rsh-0").is_dir() for b in tc.brokers.values())


# ---- pieces without a broker --------------------------------------------------------------------
def test_a_new_leaders_segment_is_copied_from_past_the_highest_tiered_offset(tmp_path):
    """The segment a new leader copies first may start below the remote tier's end (its log rolled
    elsewhere than the old leader's): the copy starts at the first batch past it, byte for byte."""
    from kcli.tiered.manager import segment_leader_epochs, trim_segment
    from tests.test_storage_log import build, open_log, parse_batches

    lg = open_log(tmp_path / "t-0", segment_bytes=1 << 20)
    for _ in range(5):
        lg.append(build(3), now_ms=1000)  # batches 0-2, 3-5, ..., 12-14
    lg.roll()
    seg = lg.segments()[0]
    trimmed = trim_segment(seg, 6)
    try:
        whole = parse_batches(seg.log_path.read_bytes())
        kept = parse_batches(trimmed.log_path.read_bytes())
        assert [b.base_offset for b in kept] == [6, 9, 12]
        assert [b.raw for b in kept] == [b.raw for b in whole[2:]]
        assert (trimmed.base_offset, trimmed.next_offset, trimmed.size) == (6, 15, sum(b.size for b in kept))
        assert trimmed.index_path.read_bytes() == b"" and trimmed.log_path.parent != seg.log_path.parent
    finally:
        shutil.rmtree(trimmed.log_path.parent)
    assert seg.log_path.exists()  # the local segment is untouched
    lg.close()
    # the leader epochs of a segment's offsets, and where each starts in it
    assert segment_leader_epochs([(0, 0), (2, 10), (5, 20)], 6, 14) == {0: 6, 2: 10}
    assert segment_leader_epochs([(0, 0), (2, 10), (5, 20)], 20, 30) == {5: 20}
    assert segment_leader_epochs([], 0, 5) == {}
