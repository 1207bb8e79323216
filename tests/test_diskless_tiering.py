"""Diskless topics moving their data to tiered storage (issue #27 item 4; seed 004 "Moving to
Tiered Storage"): a diskless topic with remote.storage.enable=true.

Real broker processes on loopback ports, real confluent-kafka clients, the broker's own file
object store (WAL objects under objects/wal, remote segments under objects/tiered) and its
persisted remote log metadata file.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from kcli.protocol.client import WireClient
from kcli.tiered import metadata as rlmm
from plugins.rsm.base import RemoteLogSegmentMetadata, RemoteLogSegmentState
from tests.diskless_helpers import FAST, counter, local_wal_objects, wait_until
from tests.fixtures_cli import cli_env, run_kcli  # noqa: F401 - fixture
from tests.kafka_helpers import admin, create_topic

S = RemoteLogSegmentState
BROKER = {
    **FAST,
    "remote.log.storage.system.enable": "true",
    "remote.log.manager.task.interval.ms": "200",
    "log.retention.check.interval.ms": "200",
}
SEGMENT_BYTES = 8192
TOPIC = {"diskless.enable": "true", "remote.storage.enable": "true", "segment.bytes": str(SEGMENT_BYTES),
         "local.retention.bytes": "0"}
BASE_TS = int(time.time() * 1000) - 3_600_000  # an hour ago: inside the default retention.ms


def value(i: int) -> bytes:
    return b"message-%06d-" % i + b"x" * 80


def fill(bootstrap: str, topic: str, start: int, count: int, partition: int = 0) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "batch.size": 4000})
    errors: list[Any] = []
    for i in range(start, start + count):
        while True:
            try:
                p.produce(topic, value(i), partition=partition, timestamp=BASE_TS + i,
                          on_delivery=lambda err, _m: errors.append(err) if err else None)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(30) == 0 and not errors, errors[:3]


def list_offset(bootstrap: str, topic: str, timestamp: int, partition: int = 0) -> int:
    """ListOffsets v9 (knows EARLIEST_LOCAL -4 and LATEST_TIERED -5)."""
    with WireClient(bootstrap) as c:
        resp = c.request(2, 9, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"partition_index": partition, "current_leader_epoch": -1,
                                            "timestamp": timestamp}]}]})
    part = resp.topics[0].partitions[0]
    assert part.error_code == 0, part
    return int(part.offset)


def segments(data_dir: Path, topic: str, partition: int = 0,
             states: tuple[S, ...] = (S.COPY_SEGMENT_FINISHED,)) -> list[RemoteLogSegmentMetadata]:
    return sorted((s for s in rlmm.load(data_dir).all_segments(states=states)
                   if s.segment_id.topic == topic and s.segment_id.partition == partition),
                  key=lambda s: s.start_offset)


def assert_contiguous(segs: list[RemoteLogSegmentMetadata], start: int = 0) -> None:
    """Remote segments are disjoint and contiguous from ``start``: nothing copied twice, no gap."""
    assert segs and segs[0].start_offset == start, [(s.start_offset, s.end_offset) for s in segs]
    for a, b in zip(segs, segs[1:]):
        assert b.start_offset == a.end_offset + 1, [(s.start_offset, s.end_offset) for s in segs]


def consume(bootstrap: str, topic: str, start: int, expected: int, partition: int = 0,
            timeout: float = 20.0) -> list[tuple[int, bytes]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "max.partition.fetch.bytes": 16384})
    c.assign([TopicPartition(topic, partition, start)])
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expected and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                raise KafkaException(m.error())
            out.append((m.offset(), m.value()))
        m = c.poll(0.3)  # nothing more: every record exactly once
        assert m is None or m.error() is not None, (m.offset(), m.value())
    finally:
        c.close()
    return out


def alter(bootstrap: str, topic: str, sets: dict[str, str]) -> None:
    a = admin(bootstrap)
    ops = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in sets.items()]
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=ops)
    for fut in a.incremental_alter_configs([res]).values():
        fut.result(20)


def tiered_state(bootstrap: str, topic: str) -> str | None:
    a = admin(bootstrap)
    res = ConfigResource(ResourceType.TOPIC, topic)
    entries = a.describe_configs([res])[res].result(20)
    e = entries.get("kcli.tiered.state")
    return e.value if e is not None else None


# ---- tests ---------------------------------------------------------------------------------------
def test_diskless_data_moves_to_the_remote_tier_and_reads_span_both(broker_factory):
    """(a)–(d): accepted at create; rolled segments copied from offset 0; WAL batches below the
    copied range deleted (the coordinator's log start rises, emptied WAL objects are collected);
    a consumer from the beginning reads every record exactly once across remote tier + WAL."""
    b = broker_factory(BROKER)
    create_topic(b.bootstrap, "dt", 1, TOPIC)
    for start in range(0, 600, 100):  # waves a commit interval apart: several WAL objects
        fill(b.bootstrap, "dt", start, 100)
        time.sleep(0.1)
    objects_before = len(local_wal_objects(b.data_dir))
    assert objects_before >= 3
    wait_until(lambda: len(segments(b.data_dir, "dt")) >= 4, what="4 remote segments")
    wait_until(lambda: list_offset(b.bootstrap, "dt", -4) > 0, what="the coordinator's log start to rise")
    wait_until(lambda: len(local_wal_objects(b.data_dir)) < objects_before, what="emptied WAL objects to go")
    segs = segments(b.data_dir, "dt")
    assert_contiguous(segs)
    assert all(s.segment_size_in_bytes <= SEGMENT_BYTES + 4096 for s in segs)
    local_start = list_offset(b.bootstrap, "dt", -4)
    assert list_offset(b.bootstrap, "dt", -2) == 0  # earliest: the remote tier's start
    assert list_offset(b.bootstrap, "dt", -5) >= local_start - 1  # latest tiered: everything below the WAL
    assert list_offset(b.bootstrap, "dt", -1) == 600
    assert list_offset(b.bootstrap, "dt", BASE_TS + 5) == 5  # by time, from the remote tier
    assert consume(b.bootstrap, "dt", 0, 600) == [(i, value(i)) for i in range(600)]
    assert counter(b.bootstrap, "diskless.tiered.remote.reads") > 0
    # a read starting in the WAL, and one in the middle of a remote segment
    assert consume(b.bootstrap, "dt", 590, 10) == [(i, value(i)) for i in range(590, 600)]
    mid = segs[1].start_offset + 3
    assert consume(b.bootstrap, "dt", mid, 600 - mid) == [(i, value(i)) for i in range(mid, 600)]


def test_config_combination_accepted_on_alter_and_refused_without_the_tiered_system(broker_factory):
    """(a): turning remote storage on for an existing diskless topic copies it from its start;
    a broker without remote.log.storage.system.enable refuses the combination with INVALID_CONFIG."""
    plain = broker_factory(FAST, name="plain")
    a = admin(plain.bootstrap)
    from confluent_kafka.admin import NewTopic

    fut = a.create_topics([NewTopic("dx", 1, 1, config=TOPIC)])["dx"]
    try:
        fut.result(20)
        raise AssertionError("accepted without the tiered system")
    except KafkaException as err:
        assert err.args[0].name() == "INVALID_CONFIG" and "remote.storage.enable" in err.args[0].str()

    b = broker_factory(BROKER, name="tiered")
    create_topic(b.bootstrap, "later", 1, {"diskless.enable": "true", "segment.bytes": str(SEGMENT_BYTES)})
    fill(b.bootstrap, "later", 0, 300)
    time.sleep(0.6)
    assert segments(b.data_dir, "later") == []  # not tiered yet
    alter(b.bootstrap, "later", {"remote.storage.enable": "true", "local.retention.bytes": "0"})
    wait_until(lambda: list_offset(b.bootstrap, "later", -4) > 0, what="the WAL to be trimmed")
    assert_contiguous(segments(b.data_dir, "later"))
    assert consume(b.bootstrap, "later", 0, 300) == [(i, value(i)) for i in range(300)]


def test_restart_mid_copy_copies_nothing_twice(broker_factory, tmp_path):
    """(g): kill -9 inside a copy (the segment's bytes stored, COPY_SEGMENT_STARTED written, the
    upload not yet acknowledged), then restarts: the half-copied segment is never trusted, its
    batches stay in the WAL until a finished copy holds them, the RLMM's segments stay disjoint
    and contiguous and every record is read exactly once."""
    switch = tmp_path / "hold-tiered-uploads"
    b = broker_factory({**BROKER, "diskless.storage.class.name": "plugins.objectstore.faulty.FaultyObjectStorage",
                        "diskless.storage.delegate.uri": (tmp_path / "objects").as_uri(),
                        "diskless.storage.key.prefixes": "tiered/", "diskless.storage.upload.ack.delay.ms": "5000",
                        "diskless.storage.switch.file": str(switch)})
    create_topic(b.bootstrap, "rs", 1, TOPIC)
    fill(b.bootstrap, "rs", 0, 200)
    wait_until(lambda: len(segments(b.data_dir, "rs")) >= 1, what="a first remote segment")
    switch.touch()  # from now on a copy's upload is stored but acknowledged 5 s late
    fill(b.bootstrap, "rs", 200, 300)
    started = wait_until(lambda: segments(b.data_dir, "rs", states=(S.COPY_SEGMENT_STARTED,)), what="a copy under way")
    finished_end = segments(b.data_dir, "rs")[-1].end_offset
    assert list_offset(b.bootstrap, "rs", -4) <= finished_end + 1  # nothing above a finished copy left the WAL
    b.kill9()
    switch.unlink()
    b.start()
    fill(b.bootstrap, "rs", 500, 100)
    b.restart()  # a clean restart too: the staging log is rebuilt from the tiered boundary
    fill(b.bootstrap, "rs", 600, 200)
    wait_until(lambda: (s := segments(b.data_dir, "rs")) and s[-1].end_offset >= 700, what="copies after the restarts")
    wait_until(lambda: not segments(b.data_dir, "rs", states=(S.COPY_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED)),
               what="the half-copied segment to be deleted")
    segs = segments(b.data_dir, "rs")
    assert started[0].segment_id.id not in {s.segment_id.id for s in segs}  # never trusted...
    assert any(s.start_offset == started[0].start_offset for s in segs)  # ...but copied again, once
    assert_contiguous(segs)
    assert consume(b.bootstrap, "rs", 0, 800) == [(i, value(i)) for i in range(800)]


def test_disablement_retain_and_delete(broker_factory):
    """(f) KIP-950 on diskless topics: retain keeps the remote segments readable and stops
    copying; delete removes them and the log start becomes the coordinator's."""
    b = broker_factory(BROKER)
    for name in ("keep", "drop"):
        create_topic(b.bootstrap, name, 1, TOPIC)
        fill(b.bootstrap, name, 0, 400)
    for name in ("keep", "drop"):
        wait_until(lambda name=name: list_offset(b.bootstrap, name, -4) > 0, what=f"{name} tiered and trimmed")

    kept = segments(b.data_dir, "keep")
    alter(b.bootstrap, "keep", {"remote.storage.enable": "false", "remote.log.disable.policy": "retain"})
    alter(b.bootstrap, "drop", {"remote.storage.enable": "false", "remote.log.disable.policy": "delete"})
    wait_until(lambda: tiered_state(b.bootstrap, "keep") == "DISABLED", what="keep DISABLED")
    wait_until(lambda: tiered_state(b.bootstrap, "drop") == "DISABLED", what="drop DISABLED")

    fill(b.bootstrap, "keep", 400, 200)  # no longer copied...
    time.sleep(0.8)
    assert [s.segment_id.id for s in segments(b.data_dir, "keep")] == [s.segment_id.id for s in kept]
    assert list_offset(b.bootstrap, "keep", -2) == 0  # ...and what was copied stays readable
    assert consume(b.bootstrap, "keep", 0, 600) == [(i, value(i)) for i in range(600)]

    assert segments(b.data_dir, "drop", states=(S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED,
                                         S.DELETE_SEGMENT_STARTED)) == []
    start = list_offset(b.bootstrap, "drop", -2)
    assert start == list_offset(b.bootstrap, "drop", -4) > 0
    assert consume(b.bootstrap, "drop", start, 400 - start) == [(i, value(i)) for i in range(start, 400)]

    a = admin(b.bootstrap)  # deleting the topic deletes its remote segments too
    a.delete_topics(["keep"])["keep"].result(20)
    wait_until(lambda: not segments(b.data_dir, "keep", states=(S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED,
                                                                 S.DELETE_SEGMENT_STARTED)),
               what="the deleted topic's remote segments to go")


def test_total_retention_and_partition_reduction(broker_factory, cli_env):  # noqa: F811
    """(e) retention.bytes spans remote tier + WAL: the oldest remote segments expire and the
    log start follows; (f) KIP-694: a removed partition's remote segments are deleted."""
    b = broker_factory({**BROKER, "delete.topic.partition.enable": "true"})
    create_topic(b.bootstrap, "ret", 2, {**TOPIC, "retention.bytes": "30000"})
    fill(b.bootstrap, "ret", 0, 600, partition=0)
    fill(b.bootstrap, "ret", 0, 300, partition=1)
    wait_until(lambda: list_offset(b.bootstrap, "ret", -4) > 500, what="partition 0 tiered and trimmed")

    def expired() -> bool:  # Kafka's rule: a segment goes while what stays is at least retention.bytes
        segs = segments(b.data_dir, "ret")
        return bool(segs) and segs[0].start_offset > 0 and sum(s.segment_size_in_bytes for s in segs[1:]) < 30000

    wait_until(expired, what="remote segments to expire")
    wait_until(lambda: segments(b.data_dir, "ret", 1), what="partition 1 tiered")
    start = list_offset(b.bootstrap, "ret", -2)
    segs = segments(b.data_dir, "ret")
    assert start > 0 and segs[0].start_offset == start
    assert_contiguous(segs, start)
    assert consume(b.bootstrap, "ret", start, 600 - start) == [(i, value(i)) for i in range(start, 600)]

    # DeleteRecords inside the remote tier: whole segments below it go, the low watermark says where it stands
    a = admin(b.bootstrap)  # kept alive until the futures resolve
    cut = segs[1].start_offset + 5
    low = list(a.delete_records([TopicPartition("ret", 0, cut)]).values())[0].result(20).low_watermark
    assert low == segs[1].start_offset == list_offset(b.bootstrap, "ret", -2)
    # DeleteRecords into the WAL: every remote segment below goes, nothing below is served
    wal_start = list_offset(b.bootstrap, "ret", -4)
    low = list(a.delete_records([TopicPartition("ret", 0, wal_start + 2)]).values())[0].result(20)
    assert low.low_watermark == wal_start + 2 == list_offset(b.bootstrap, "ret", -2)
    assert segments(b.data_dir, "ret") == []
    assert consume(b.bootstrap, "ret", 0, 598 - wal_start) == [(i, value(i)) for i in range(wal_start + 2, 600)]

    shrink = run_kcli(cli_env, "-b", b.bootstrap, "topics", "alter", "--topic", "ret", "--partitions", "1",
                      "--delete-partitions-delay", "0", "--yes")
    assert shrink.returncode == 0, shrink.stdout + shrink.stderr
    wait_until(lambda: not segments(b.data_dir, "ret", 1, states=(S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED,
                                                            S.DELETE_SEGMENT_STARTED)),
               what="the removed partition's remote segments to go")
    assert list_offset(b.bootstrap, "ret", -1) == 600  # partition 0 stays
