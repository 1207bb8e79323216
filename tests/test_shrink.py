"""Reducing a topic's partition count (KIP-694) on real broker processes with real clients.

The shrink goes through kcli.ops.partitions (the code `kcli topics alter --partitions N` runs)
or the CLI itself; producers and consumers are unmodified confluent-kafka (librdkafka 2.x)
and kafka-python clients. A short delete.topic.partition.interval.delay.ms keeps deletions
within a test's patience.
"""

from __future__ import annotations

import collections
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kcli.broker.partition_reducer import PartitionReducer, producer_view_topic_id
from kcli.cli.topics import description_lines
from kcli.errors import KafkaApiError
from kcli.ops import clients as client_ops
from kcli.ops import partitions as shrink_ops
from kcli.ops import topics as topic_ops
from kcli.ops.connection import Connection
from kcli.protocol.client import WireClient
from kcli.protocol.kcli_schemas import DELETE_PARTITIONS_KEY
from tests.diskless_helpers import wait_until as poll_until
from tests.fixtures_cli import assert_one_line_error, cli_env, run_kcli  # noqa: F401
from tests.kafka_helpers import consume_all, create_topic, produce

ENABLED = {"delete.topic.partition.enable": "true", "delete.topic.partition.interval.delay.ms": "200",
           "group.initial.rebalance.delay.ms": "0"}


# ---- helpers ------------------------------------------------------------------------------------
def wait_until(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    return poll_until(check, timeout, what=what)


def fill(bootstrap: str, topic: str, partitions: int, per_partition: int, tag: str = "old") -> None:
    for p in range(partitions):
        produce(bootstrap, topic, [f"{tag}-{p}-{i}".encode() for i in range(per_partition)], partition=p)


def watermarks(bootstrap: str, topic: str, partitions: range) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"wm-{uuid.uuid4().hex}"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=20)[1] for p in partitions}
    finally:
        c.close()


def describe(conn: Connection, topic: str) -> topic_ops.TopicDescription:
    return topic_ops.describe_topics(conn, [topic])[0]


def modes(desc: topic_ops.TopicDescription) -> dict[int, tuple[str, int | None]]:
    return {p.partition: (p.mode, p.delete_at_ms) for p in desc.partitions}


def partition_dirs(data_dir: Path, topic: str) -> list[int]:
    return sorted(int(d.name.rsplit("-", 1)[1]) for d in data_dir.glob(f"{topic}-*") if d.is_dir())


def delete_partitions(bootstrap: str, topic: str, partitions: list[int], delay_ms: int) -> Any:
    with WireClient(bootstrap) as c:
        return c.request(DELETE_PARTITIONS_KEY, 0, {"timeout_ms": 10000, "delete_partitions_delay": delay_ms,
                                                    "topics": [{"name": topic, "partitions": partitions}]})


# ---- the main path -------------------------------------------------------------------------------
def test_shrink_with_delay_producers_move_on_consumers_drain(broker_factory):
    b = broker_factory(ENABLED)
    conn = Connection(b.bootstrap)
    create_topic(b.bootstrap, "orders", 6)
    fill(b.bootstrap, "orders", 6, 10)
    create_topic(b.bootstrap, "brief", 3)
    fill(b.bootstrap, "brief", 3, 5)
    brief = shrink_ops.shrink_topic(conn, "brief", 1, 1000)  # deleted while the rest of the test runs
    # a producer that knew all six partitions before the shrink
    early = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
    assert len(early.list_topics("orders", timeout=20).topics["orders"].partitions) == 6

    plan = shrink_ops.shrink_topic(conn, "orders", 3, 120000)
    assert plan.applied and [(p.partition, p.mode, p.records) for p in plan.partitions] == [
        (3, "ReadOnly", 10), (4, "ReadOnly", 10), (5, "ReadOnly", 10)]
    assert plan.keyed is False and plan.sampled_records == 60 and not plan.warnings
    desc = describe(conn, "orders")
    assert {p: m for p, (m, _) in modes(desc).items()} == {0: "ReadWrite", 1: "ReadWrite", 2: "ReadWrite",
                                                           3: "ReadOnly", 4: "ReadOnly", 5: "ReadOnly"}
    assert {at for _, at in list(modes(desc).values())[3:]} == {plan.delete_at_ms}
    assert description_lines(desc)[4].endswith(f"\tMode: ReadOnly\tDeleteAt: {shrink_ops.format_ms(plan.delete_at_ms)}")

    # "The topic is currently under changes": no second shrink, no growth while pending
    for attempt in (lambda: shrink_ops.shrink_topic(conn, "orders", 2, 1000),
                    lambda: topic_ops.alter_topic(conn, topic_ops.AlterTopicRequest("orders", partitions=8))):
        with pytest.raises(KafkaApiError) as info:
            attempt()
        assert info.value.name == "TOPIC_UNDER_CHANGES" and "currently under changes" in info.value.message
    # re-running the same shrink is a no-op; only the highest partitions may go
    again = topic_ops.alter_topic(conn, topic_ops.AlterTopicRequest("orders", partitions=3, delete_partitions_delay_ms=1000))
    assert not again.steps and not again.changed

    # fresh producers only see partitions 0..2 (and a producer-view topic id); all records land there
    fresh = produce(b.bootstrap, "orders", [b"new-c-%d" % i for i in range(150)], **{"enable.idempotence": True})
    from kafka import KafkaProducer

    kp = KafkaProducer(bootstrap_servers=b.bootstrap, linger_ms=5)
    assert kp.partitions_for("orders") == {0, 1, 2}
    futures = [kp.send("orders", b"new-k-%d" % i) for i in range(150)]
    kp.flush(30)
    kafka_python = [f.get(10).partition for f in futures]
    kp.close()
    # the early producer learns of the shrink from its first rejected batch and carries on
    early_errors: list[Any] = []
    early_parts: list[int] = []
    for i in range(300):
        early.produce("orders", b"new-e-%d" % i,
                      on_delivery=lambda err, m: early_errors.append(err.name()) if err else early_parts.append(m.partition()))
        early.poll(0)
        time.sleep(0.002)
    assert early.flush(30) == 0
    assert {p for p, _ in fresh} <= {0, 1, 2} and set(kafka_python) <= {0, 1, 2} and set(early_parts) <= {0, 1, 2}
    assert len(fresh) == len(kafka_python) == 150
    # records it had already put in a removed partition fail fast; the rest are delivered
    assert set(early_errors) <= {"_UNKNOWN_PARTITION"} and len(early_parts) >= 250, (early_errors, len(early_parts))
    # kcli produce refuses a ReadOnly partition by name and spreads the rest over 0..2
    with pytest.raises(KafkaApiError) as info:
        client_ops.produce(conn, client_ops.ProduceRequest("orders", partition=4), [b"x\n"])
    assert info.value.name == "PARTITION_READ_ONLY"
    kcli_result = client_ops.produce(conn, client_ops.ProduceRequest("orders", key_separator=b":"),
                                     [b"k%d:v\n" % i for i in range(30)] + [b":v\n"] * 6)
    assert kcli_result.records == 36 and set(kcli_result.partitions) <= {0, 1, 2}
    assert watermarks(b.bootstrap, "orders", range(3, 6)) == {3: 10, 4: 10, 5: 10}, "no record lands in 3..5"

    # a group consumer still gets the records in the ReadOnly partitions
    total = 60 + 150 + 150 + len(early_parts) + 36
    msgs = consume_all(b.bootstrap, "orders", total, group="drain")
    per = collections.Counter(m.partition() for m in msgs)
    assert len(msgs) == total and per[3] == per[4] == per[5] == 10
    assert sorted(m.value() for m in msgs if m.partition() >= 3) == sorted(
        f"old-{p}-{i}".encode() for p in (3, 4, 5) for i in range(10))

    # the wire API: advertised in ApiVersions; only the highest-numbered partitions can go
    with WireClient(b.bootstrap) as c:
        keys = {int(k.api_key) for k in c.request(18, 3, {"client_software_name": "t", "client_software_version": "1"}).api_keys}
    assert DELETE_PARTITIONS_KEY in keys
    create_topic(b.bootstrap, "gaps", 4)
    resp = delete_partitions(b.bootstrap, "gaps", [1, 3], 0)
    assert {int(p.error_code) for p in resp.responses[0].partitions} == {37}  # INVALID_PARTITIONS
    assert "highest-numbered" in resp.responses[0].partitions[0].error_message

    # after its delay the periodic check deleted "brief" 1..2: gone from every view and from disk
    wait_until("brief-1 and brief-2 deleted", lambda: describe(conn, "brief").partition_count == 1)
    assert time.time() * 1000 >= brief.delete_at_ms and partition_dirs(b.data_dir, "brief") == [0]
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "md"})
    assert sorted(c.list_topics("brief", timeout=20).topics["brief"].partitions) == [0]
    c.close()


def test_restart_keeps_the_pending_deletion_and_overdue_deletions_run_at_start(broker_factory):
    """r's deletion is far away and survives restarts; s's delay passes while the broker is down.
    From the first restart on the periodic check runs every 10 minutes, so only start-up can
    delete s."""
    b = broker_factory(ENABLED)
    for name in ("r", "s"):
        create_topic(b.bootstrap, name, 4)
        fill(b.bootstrap, name, 4, 5)
    r_plan = shrink_ops.shrink_topic(Connection(b.bootstrap), "r", 2, 120000)
    b.configs["delete.topic.partition.interval.delay.ms"] = "600000"
    b.restart()
    r_modes = {0: ("ReadWrite", None), 1: ("ReadWrite", None),
               2: ("ReadOnly", r_plan.delete_at_ms), 3: ("ReadOnly", r_plan.delete_at_ms)}
    assert modes(describe(Connection(b.bootstrap), "r")) == r_modes
    assert partition_dirs(b.data_dir, "r") == [0, 1, 2, 3]

    s_plan = shrink_ops.shrink_topic(Connection(b.bootstrap), "s", 3, 1500)
    b.stop()
    while time.time() * 1000 < s_plan.delete_at_ms:
        time.sleep(0.1)
    b.start()
    conn = Connection(b.bootstrap)
    assert partition_dirs(b.data_dir, "s") == [0, 1, 2] and not list(b.data_dir.glob("*-delete"))
    assert describe(conn, "s").partition_count == 3
    assert modes(describe(conn, "r")) == r_modes
    # growing again takes the normal CreatePartitions path: a fresh, empty partition 3
    topic_ops.alter_topic(conn, topic_ops.AlterTopicRequest("s", partitions=4))
    assert watermarks(b.bootstrap, "s", range(4)) == {0: 5, 1: 5, 2: 5, 3: 0}


def test_cli_delay_zero_needs_yes_dry_run_changes_nothing_and_the_feature_switch(broker_factory, cli_env):  # noqa: F811
    b = broker_factory(ENABLED)
    create_topic(b.bootstrap, "z", 3)
    fill(b.bootstrap, "z", 3, 4)
    produce(b.bootstrap, "z", [b"v"] * 3, keys=[b"a", b"b", b"c"], partition=0)
    cli = ["-b", b.bootstrap, "topics", "alter", "--topic", "z", "--partitions", "2"]

    dry = run_kcli(cli_env, *cli, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "Would alter topic z: Partitions 3 -> 2" in dry.stdout and "Partition 2: 4 records" in dry.stdout
    assert "Keyed records: yes" in dry.stdout and "key-to-partition mapping will change" in dry.stderr
    refused = run_kcli(cli_env, *cli)  # no terminal to ask on, and no --yes
    assert_one_line_error(refused, 2, "--yes", "4 records")
    assert describe(Connection(b.bootstrap), "z").partition_count == 3 and partition_dirs(b.data_dir, "z") == [0, 1, 2]

    done = run_kcli(cli_env, *cli, "--yes")
    assert done.returncode == 0, done.stderr
    assert "Partition 2: deleted now" in done.stdout
    assert describe(Connection(b.bootstrap), "z").partition_count == 2 and partition_dirs(b.data_dir, "z") == [0, 1]

    b.configs["delete.topic.partition.enable"] = "false"
    b.restart()
    off = run_kcli(cli_env, "-b", b.bootstrap, "topics", "alter", "--topic", "z", "--partitions", "1", "--yes")
    assert_one_line_error(off, 1, "POLICY_VIOLATION", "delete.topic.partition.enable=true")


@pytest.mark.slow
def test_long_lived_kafka_python_and_kcat_producers_across_a_shrink(broker_factory):
    """The docs' table for producers that knew every partition before the shrink: they lose at
    most what they had already put in a removed partition, and never write there again."""
    import shutil
    import subprocess

    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    if shutil.which("kcat") is None:
        pytest.fail("kcat is part of the test environment (apt kcat)")
    b = broker_factory(ENABLED)
    create_topic(b.bootstrap, "lp", 6)
    kp = KafkaProducer(bootstrap_servers=b.bootstrap, linger_ms=5, delivery_timeout_ms=15000, request_timeout_ms=10000)
    kcat = subprocess.Popen(["kcat", "-P", "-b", b.bootstrap, "-t", "lp", "-X", "message.timeout.ms=15000"],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    futures = []
    start = time.monotonic()
    before: dict[int, int] | None = None
    while time.monotonic() - start < 6:
        if before is None and time.monotonic() - start > 2:
            before = watermarks(b.bootstrap, "lp", range(6))
            shrink_ops.shrink_topic(Connection(b.bootstrap), "lp", 3, 60000)
        futures.append(kp.send("lp", b"kp-%d" % len(futures)))
        assert kcat.stdin is not None
        kcat.stdin.write(b"kcat-%d\n" % len(futures))
        kcat.stdin.flush()
        time.sleep(0.004)
    kcat.stdin.close()
    kcat_failures = [ln for ln in kcat.stderr.read().decode().splitlines() if "Delivery failed" in ln]
    kcat.wait(30)
    try:
        kp.flush(30)
    except KafkaTimeoutError:
        pass  # a batch kafka-python had put in a removed partition can outlive flush (see the docs)
    lost = [f for f in futures if not f.is_done or f.failed()]
    try:
        kp.close(timeout=1)
    except KafkaTimeoutError:
        pass
    late = [f.value.partition for f in futures[-100:] if f.is_done and f.succeeded()]
    assert before is not None and watermarks(b.bootstrap, "lp", range(3, 6)) == {p: before[p] for p in (3, 4, 5)}
    assert len(late) >= 90 and set(late) <= {0, 1, 2} and len(lost) < 20, (len(late), len(lost))
    assert all("Unknown partition" in ln for ln in kcat_failures) and len(kcat_failures) < len(futures) // 2, kcat_failures[:3]


# ---- diskless and tiered topics ----------------------------------------------------------------
def test_diskless_shrink_reads_read_only_partitions_then_drops_their_batches(broker_factory):
    from tests.diskless_helpers import DISKLESS, FAST, local_wal_objects

    b = broker_factory({**FAST, **ENABLED})
    create_topic(b.bootstrap, "dl", 2, DISKLESS)
    produce(b.bootstrap, "dl", [b"keep-%d" % i for i in range(10)], partition=0)
    produce(b.bootstrap, "dl", [b"drop-%d" % i for i in range(10)], partition=1)
    objects = set(local_wal_objects(b.data_dir))
    assert objects
    plan = shrink_ops.shrink_topic(Connection(b.bootstrap), "dl", 1, 3000)
    assert [(p.partition, p.records) for p in plan.partitions] == [(1, 10)] and plan.partitions[0].size_bytes > 0
    msgs = consume_all(b.bootstrap, "dl", 20, group="dl-drain")
    assert sorted(m.value() for m in msgs if m.partition() == 1) == sorted(b"drop-%d" % i for i in range(10))
    wait_until("dl-1 deleted", lambda: describe(Connection(b.bootstrap), "dl").partition_count == 1)
    # the objects held only the two partitions' batches: partition 0's are still needed, the rest
    # is collected once unused; reads of partition 0 are unaffected
    assert sorted(m.value() for m in consume_all(b.bootstrap, "dl", 10)) == sorted(b"keep-%d" % i for i in range(10))


def test_tiered_shrink_deletes_local_and_remote_segments(broker_factory):
    from kcli.tiered import metadata as rlmm

    tiered_broker = {"remote.log.storage.system.enable": "true", "remote.log.manager.task.interval.ms": "200",
                     "log.retention.check.interval.ms": "200"}
    b = broker_factory({**tiered_broker, **ENABLED})
    create_topic(b.bootstrap, "tt", 2, {"remote.storage.enable": "true", "segment.bytes": "4096"})
    for p in (0, 1):
        produce(b.bootstrap, "tt", [b"%d-%05d-" % (p, i) + b"x" * 100 for i in range(200)], partition=p,
                **{"batch.size": 2000})

    def remote(partition: int) -> list[Any]:
        """Remote segments of tt-<partition> that are not (fully) deleted."""
        return [s for s in rlmm.load(b.data_dir).all_segments()
                if s.segment_id.partition == partition and s.state.name != "DELETE_SEGMENT_FINISHED"]

    wait_until("segments of both partitions tiered", lambda: remote(0) and remote(1))
    shrink_ops.shrink_topic(Connection(b.bootstrap), "tt", 1, 0, assume_yes=True)
    assert partition_dirs(b.data_dir, "tt") == [0]
    wait_until("remote segments of tt-1 deleted", lambda: not remote(1), timeout=5)
    assert remote(0)


# ---- pieces without a broker ---------------------------------------------------------------------
def test_modes_text_partitioner_and_producer_view_rules():
    assert shrink_ops.parse_modes("3:ReadOnly@1700000000000,4:ReadOnly@1700000000000,junk,x:y") == {
        3: shrink_ops.PartitionMode(3, "ReadOnly", 1700000000000),
        4: shrink_ops.PartitionMode(4, "ReadOnly", 1700000000000)}
    assert shrink_ops.parse_modes(None) == {}
    pick = shrink_ops.ReadWritePartitioner(6, shrink_ops.parse_modes("3:ReadOnly@1,4:ReadOnly@1,5:ReadOnly@1"))
    assert [pick(None) for _ in range(4)] == [0, 1, 2, 0]
    assert {pick(b"key-%d" % i) for i in range(100)} == {0, 1, 2} and pick(b"same") == pick(b"same")

    from kcli.broker.dispatch import ConnectionState, RequestContext
    from kcli.protocol.codec import RequestHeader

    def view(seen: set[int], allow_auto: bool) -> bool:
        conn = ConnectionState("peer", extra={"api_keys": seen})
        req = type("MetadataRequest", (), {"allow_auto_topic_creation": allow_auto})()
        return PartitionReducer.producer_view(RequestContext(None, RequestHeader(3, 12, 1, "c"), conn), req)

    assert view(set(), True) and not view(set(), False)  # librdkafka: producers true, consumers/admin false
    assert view({0}, False) and view({0, 1}, False)  # once it produced, a connection is a producer's
    assert not view({10, 11}, True)  # kafka-python and Java consumers ask with true after FindCoordinator
    topic_id = uuid.uuid4()
    assert producer_view_topic_id(topic_id) == producer_view_topic_id(topic_id) != topic_id
