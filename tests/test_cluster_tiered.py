"""Tiered topics in a cluster (issue #16): remote log segment metadata in PostgreSQL, segments in
the shared object store, each partition's copies made by its host, KIP-950 disablement finished
once every host is done. Real broker processes over the session's PostgreSQL server; the RLMM
contract runs against the single-node file store and the PostgreSQL store alike."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kcli.cluster.postgres import PostgresClusterStore
from kcli.protocol.client import WireClient
from kcli.tiered.metadata import SegmentOverlapError, RemoteLogMetadataError, RemoteLogMetadataStore
from plugins.rsm.base import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemoteStorageException,
)
from tests.fixtures_pg import pg_database, pg_server  # noqa: F401 - fixtures
from tests.test_cluster_state import FAST, wait_for
from tests.test_tiered import SEGMENT_BYTES, TIERED_BROKER, alter, kcli_state

S = RemoteLogSegmentState
TOPIC_CONFIGS = {"remote.storage.enable": "true", "segment.bytes": str(SEGMENT_BYTES),
                 "local.retention.bytes": "16000"}
COUNT = 500  # per partition: ~6 segments of 8 KiB, of which local retention keeps about two


# ---- the RLMM contract, for both stores ----------------------------------------------------------
class _Stores:
    """Opens RLMM instances of one kind; ``again()`` is a second broker (or a restart)."""

    def __init__(self, kind: str, tmp_path: Path, url: str | None) -> None:
        self.kind, self.tmp_path, self.url = kind, tmp_path, url
        self.opened: list[Any] = []

    def again(self) -> Any:
        if self.kind == "file":
            store: Any = RemoteLogMetadataStore(self.tmp_path)
        else:
            cluster = PostgresClusterStore(self.url or "", node_id=len(self.opened) + 1)
            cluster.open()
            self.opened.append(cluster)
            store = cluster.remote_log_metadata(self.tmp_path)
        self.opened.append(store)
        return store.open()

    def close(self) -> None:
        for x in reversed(self.opened):
            x.close()


@pytest.fixture(params=["file", "postgresql"])
def stores(request, tmp_path) -> Iterator[_Stores]:
    url = request.getfixturevalue("pg_database") if request.param == "postgresql" else None
    s = _Stores(request.param, tmp_path, url)
    yield s
    s.close()


def _segment(tid: uuid.UUID, start: int, broker: int = 1) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(RemoteLogSegmentId.generate(tid, "t", 0), start, start + 9, 1000 + start,
                                    broker, 1000, 100, tiered_epoch=start // 10)


def test_remote_log_metadata_contract(stores):
    """Both RLMMs: transitions validated before anything is written, durable on return (a new
    instance sees them), finished deletions leave every query, KIP-950 partition marks."""
    store = stores.again()
    tid = uuid.uuid4()
    mds = [_segment(tid, o) for o in (0, 10, 20)]
    for md in mds:
        store.add_copy_started(md)
    with pytest.raises(RemoteLogMetadataError, match="already exists"):
        store.add_copy_started(mds[0])
    with pytest.raises(RemoteLogMetadataError, match="must be COPY_SEGMENT_STARTED"):
        store.add_copy_started(_segment(tid, 30).with_state(S.COPY_SEGMENT_FINISHED, 2000))
    assert store.segments(tid, 0) == []  # nothing finished yet
    store.update_state(mds, S.COPY_SEGMENT_FINISHED)
    store.update_state(mds[:1], S.DELETE_SEGMENT_STARTED)
    with pytest.raises(RemoteStorageException, match="invalid state transition"):
        store.update_state(mds[1:2] + mds[:1], S.COPY_SEGMENT_FINISHED)  # one bad one: none written
    with pytest.raises(RemoteLogMetadataError, match="unknown remote segment"):
        store.update_state([_segment(tid, 90)], S.COPY_SEGMENT_FINISHED)
    store.update_state(mds[:1], S.DELETE_SEGMENT_FINISHED)
    assert store.get(mds[0].segment_id.id) is None
    store.mark_partitions_stopped(tid, 3, [0, 2])
    store.mark_partitions_stopped(tid, 3, [2])
    assert store.stopped_partitions(tid, 3) == {0, 2} and store.stopped_partitions(tid, 4) == set()

    other = stores.again()  # a restart (file) / another broker of the cluster (PostgreSQL)
    for s in (store, other):
        assert [(x.start_offset, x.state) for x in s.segments(tid, 0)] == [(10, S.COPY_SEGMENT_FINISHED),
                                                                           (20, S.COPY_SEGMENT_FINISHED)]
        assert s.highest_offset(tid, 0) == 29 and s.segment_for_offset(tid, 0, 3).start_offset == 10
        assert s.partitions(tid) == [0] and s.all_segments(states=(S.DELETE_SEGMENT_STARTED,)) == []


def test_finished_segments_never_overlap(stores):
    """Two leaders copying one range (an old leader still finishing, the new one resuming): the
    second COPY_SEGMENT_FINISHED over an offset a finished segment holds is refused, whichever
    broker writes it, so no offset is ever served from two segments; an adjacent copy finishes."""
    first = stores.again()
    second = stores.again() if stores.kind == "postgresql" else first  # a file RLMM has one writer
    tid = uuid.uuid4()
    a, overlapping, adjacent = _segment(tid, 0), _segment(tid, 5, broker=2), _segment(tid, 10, broker=2)
    first.add_copy_started(a)
    second.add_copy_started(overlapping)
    first.update_state([a], S.COPY_SEGMENT_FINISHED)
    with pytest.raises(SegmentOverlapError, match="overlaps finished segment"):
        second.update_state([overlapping], S.COPY_SEGMENT_FINISHED)
    second.add_copy_started(adjacent)
    second.update_state([adjacent], S.COPY_SEGMENT_FINISHED)
    both = _segment(tid, 30), _segment(tid, 35)
    for md in both:
        first.add_copy_started(md)
    with pytest.raises(SegmentOverlapError):  # within one update too; nothing of it is written
        first.update_state(list(both), S.COPY_SEGMENT_FINISHED)
    for s in (first, second):
        s.refresh()
        assert [(x.start_offset, x.end_offset) for x in s.segments(tid, 0)] == [(0, 9), (10, 19)]


def test_postgresql_rlmm_validates_against_the_database_and_refreshes(pg_database, tmp_path):  # noqa: F811
    """Two brokers' views of one database: a transition is checked against the row as committed
    (not the writer's possibly stale memory), and ``refresh`` brings the other's changes."""
    stores = _Stores("postgresql", tmp_path, pg_database)
    try:
        a, b = stores.again(), stores.again()
        tid = uuid.uuid4()
        md = _segment(tid, 0)
        a.add_copy_started(md)
        a.update_state([md], S.COPY_SEGMENT_FINISHED)
        assert b.get(md.segment_id.id) is None  # not learned yet
        b.refresh()
        assert b.get(md.segment_id.id).state is S.COPY_SEGMENT_FINISHED
        a.update_state([md], S.DELETE_SEGMENT_STARTED)
        with pytest.raises(RemoteStorageException, match="DELETE_SEGMENT_STARTED -> DELETE_SEGMENT_STARTED"):
            b.update_state([md], S.DELETE_SEGMENT_STARTED)  # b still thinks COPY_SEGMENT_FINISHED
        b.update_state([md], S.DELETE_SEGMENT_FINISHED)  # b's memory is stale; the database decides
        a.refresh()
        assert a.get(md.segment_id.id) is None and a.all_segments() == []
        with psycopg.connect(pg_database) as conn:
            assert conn.execute("SELECT state FROM remote_log_segments").fetchall() == [("DELETE_SEGMENT_FINISHED",)]
    finally:
        stores.close()


# ---- real brokers ---------------------------------------------------------------------------------
def value(p: int, i: int) -> bytes:
    return b"p%d-message-%06d-" % (p, i) + b"x" * 80


def fill(bootstrap: str, topic: str, partition: int, count: int) -> None:
    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "batch.size": 4000})
    errors: list[Any] = []
    for i in range(count):
        while True:
            try:
                prod.produce(topic, value(partition, i), partition=partition,
                             on_delivery=lambda err, _m: errors.append(err) if err else None)
                break
            except BufferError:
                prod.poll(0.05)
    assert prod.flush(30) == 0 and not errors, errors[:3]


def read_from_start(bootstrap: str, topic: str, partition: int, count: int, timeout: float = 30) -> list[bytes]:
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


def list_offset(bootstrap: str, topic: str, partition: int, timestamp: int) -> int:
    """ListOffsets v9: -4 = EARLIEST_LOCAL, -5 = LATEST_TIERED."""
    with WireClient(bootstrap) as c:
        resp = c.request(2, 9, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"partition_index": partition, "current_leader_epoch": -1,
                                            "timestamp": timestamp}]}]})
    part = resp.topics[0].partitions[0]
    assert part.error_code == 0, part
    return int(part.offset)


def rows(url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql, args).fetchall()


def start(broker_factory, url: str, node_id: int, objects: Path, extra: dict[str, str] | None = None) -> Any:
    return broker_factory({**FAST, **TIERED_BROKER, **(extra or {})}, name=f"node{node_id}",
                          extra_args=["--cluster", url, "--node-id", str(node_id), "--rack", f"rack-{node_id}",
                                      "--object-store", objects.as_uri()])


def tiered_on_both(b1: Any, b2: Any, topic: str) -> None:
    """A tiered topic with partition 0 on broker 1 and partition 1 on broker 2, filled until each
    host copied segments and local retention removed the oldest ones locally."""
    admin = AdminClient({"bootstrap.servers": b1.bootstrap})
    wait_for(lambda: len(admin.list_topics(timeout=10).brokers) == 2, 10, "both brokers registered")
    admin.create_topics([NewTopic(topic, 2, replica_assignment=[[1], [2]], config=TOPIC_CONFIGS)])[topic].result(15)
    wait_for(lambda: all((b.data_dir / f"{topic}-{p}").is_dir() for b, p in ((b1, 0), (b2, 1))), 10, "the hosts' logs")
    for b, p in ((b1, 0), (b2, 1)):
        fill(b.bootstrap, topic, p, COUNT)
    for b, p in ((b1, 0), (b2, 1)):
        wait_for(lambda b=b, p=p: list_offset(b.bootstrap, topic, p, -4) > 0, 30, f"local retention of {topic}-{p}")


def copied_by(url: str) -> set[tuple[int, int]]:
    """(partition, copying broker) of finished remote segments in the database."""
    return {(p, b) for p, b in rows(url, "SELECT partition, broker_id FROM remote_log_segments WHERE state = %s",
                                    "COPY_SEGMENT_FINISHED")}


def test_tiered_topic_in_a_cluster_survives_kill9_of_a_host(broker_factory, pg_database, tmp_path):  # noqa: F811
    """Each host copies its own partitions to the shared store; the segment metadata is in
    PostgreSQL (none in a data dir); a host killed with -9 and restarted still knows its remote
    segments and serves its partition from offset 0 although local retention removed the start;
    a topic deleted while a host is down loses the remote segments of both hosts."""
    objects = tmp_path / "objects"
    b1 = start(broker_factory, pg_database, 1, objects)
    b2 = start(broker_factory, pg_database, 2, objects)
    tiered_on_both(b1, b2, "tt")
    assert copied_by(pg_database) == {(0, 1), (1, 2)}  # each partition copied by its host only
    assert not any((b.data_dir / "__remote_log_metadata").exists() for b in (b1, b2))
    tiered_files = [f for f in (objects / "tiered").rglob("*.log")]
    assert {f.parent.name for f in tiered_files} == {"0", "1"}  # both hosts wrote to the shared store

    b2.kill9()
    wait_for(lambda: AdminClient({"bootstrap.servers": b1.bootstrap}).list_topics("tt", timeout=10)
             .topics["tt"].partitions[1].leader == -1, 15, "broker 2 to leave Metadata")
    b2.start()
    assert list_offset(b2.bootstrap, "tt", 1, -4) > 0  # the start is only in the remote tier
    assert list_offset(b2.bootstrap, "tt", 1, -5) >= 0
    assert read_from_start(b2.bootstrap, "tt", 1, COUNT) == [value(1, i) for i in range(COUNT)]
    assert read_from_start(b1.bootstrap, "tt", 0, COUNT) == [value(0, i) for i in range(COUNT)]

    # The topic deleted while broker 2 is dead: the controller (broker 1) deletes broker 2's
    # remote segments too, from the shared store.
    b2.kill9()
    wait_for(lambda: AdminClient({"bootstrap.servers": b1.bootstrap}).list_topics(timeout=10).brokers.keys() == {1},
             15, "broker 2 to leave Metadata")
    admin = AdminClient({"bootstrap.servers": b1.bootstrap})
    admin.delete_topics(["tt"])["tt"].result(15)
    wait_for(lambda: rows(pg_database, "SELECT count(*) FROM remote_log_segments "
                                       "WHERE state <> 'DELETE_SEGMENT_FINISHED'") == [(0,)], 20, "remote deletion")
    assert list((objects / "tiered").rglob("*.log")) == []


def test_disabling_with_partitions_on_two_brokers_waits_for_both(broker_factory, pg_database, tmp_path):  # noqa: F811
    """KIP-950 with policy delete: each host deletes its own partition's remote segments; the
    topic is DISABLED only once both parts are done (broker 2 holds its part back a while)."""
    objects = tmp_path / "objects"
    b1 = start(broker_factory, pg_database, 1, objects)
    b2 = start(broker_factory, pg_database, 2, objects, {"kcli.fault.remote.log.disable.delay.ms": "6000"})
    tiered_on_both(b1, b2, "dt")
    time.sleep(0.5)  # let a copy round that is under way end (its segment is then finished)
    alter(b1.bootstrap, "dt", {"remote.storage.enable": "false", "remote.log.disable.policy": "delete"})
    # broker 1's part is done at once; broker 2's waits out its delay: still DISABLING meanwhile
    wait_for(lambda: rows(pg_database, "SELECT partition FROM remote_log_partition_stops") == [(0,)], 10,
             "broker 1's part")
    assert kcli_state(b2.bootstrap, "dt")["kcli.tiered.state"] == "DISABLING"
    assert (1, 2) in copied_by(pg_database)  # broker 2's remote segments are still there

    for b in (b1, b2):
        wait_for(lambda b=b: kcli_state(b.bootstrap, "dt").get("kcli.tiered.state") == "DISABLED", 30, "DISABLED")
    assert sorted(rows(pg_database, "SELECT partition, tiered_epoch FROM remote_log_partition_stops")) == [(0, 1), (1, 1)]
    assert copied_by(pg_database) == set()
    assert rows(pg_database, "SELECT count(*) FROM remote_log_segments WHERE state <> 'DELETE_SEGMENT_FINISHED'") == [(0,)]
    assert list((objects / "tiered").rglob("*.log")) == []
    for b, p in ((b1, 0), (b2, 1)):  # policy delete: the log starts at the local log start now
        assert list_offset(b.bootstrap, "dt", p, -2) == list_offset(b.bootstrap, "dt", p, -4)


def test_cluster_broker_with_tiered_storage_needs_a_shared_store(broker_factory, pg_database):  # noqa: F811
    """Without --object-store the tiered segments would stay in the broker's own data dir."""
    with pytest.raises(RuntimeError) as err:
        broker_factory({**FAST, **TIERED_BROKER}, name="alone",
                       extra_args=["--cluster", pg_database, "--node-id", "1"])
    assert "tiered storage in a cluster needs an object store every broker shares" in str(err.value)
    assert "Traceback" not in str(err.value)
