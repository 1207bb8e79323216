"""The seeds' test plans (issue #25, item 4), each on a real broker process with real clients.

* Seed 004 (KIP-1163): ``diskless.append.commit.interval.ms`` and ``diskless.append.buffer.max.bytes``
  held within an error threshold, measured from produce latency, object commit times and the
  WAL objects' sizes in the object store.
* Seed 001 (KIP-405): remote expiry by ``retention.ms``; local copies deleted by
  ``local.retention.ms`` once tiered while the remote copies stay.
* Seed 000 (KIP-950): remote data retained by a disablement expires by ``retention.ms``.
* ``diskless.system.enable=false``: what the broker refuses, on the wire and through the CLI.

Each time-based check uses two cohorts of records: one timestamped two hours ago, one now. With
``retention.ms`` (or ``local.retention.ms``) of one hour exactly the old cohort's segments must go
and the young ones must stay, so a broker that ignored the config, or deleted everything, fails.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import ConfigResource, NewPartitions, NewTopic, ResourceType

from kcli.diskless import admin_api
from kcli.diskless.wal import parse_wal
from plugins.rsm.base import RemoteLogSegmentState as S
from plugins.rsm.object_store import kafka_uuid
from tests.brokerproc import BrokerProcess
from tests.diskless_helpers import DISKLESS, admin as kcli_admin
from tests.fixtures_cli import assert_one_line_error, cli_env, run_kcli  # noqa: F401
from tests.kafka_helpers import admin, create_topic, produce
from tests.test_tiered import (
    SEGMENT_BYTES,
    TIERED_BROKER,
    alter,
    alter_error,
    consume_values,
    list_offset,
    remote_files,
    value,
    wait_copied,
    wait_state,
    wait_until,
)

HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def tiered_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """Copies every 200 ms, applies retention every 200 ms (TIERED_BROKER)."""
    b = BrokerProcess(tmp_path_factory.mktemp("tiered") / "data", TIERED_BROKER).start()
    yield b
    b.stop()


# ---- seeds 001 and 000: retention of tiered data --------------------------------------------------
def fill_at(bootstrap: str, topic: str, start: int, count: int, timestamp_ms: int) -> None:
    """Messages start..start+count-1 (tests.test_tiered.value), all stamped ``timestamp_ms``."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "batch.size": 4000})
    errors: list[Any] = []
    for i in range(start, start + count):
        while True:
            try:
                p.produce(topic, value(i), timestamp=timestamp_ms,
                          on_delivery=lambda err, _m: errors.append(err) if err else None)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(30) == 0 and not errors, errors[:3]


def two_cohorts(b: BrokerProcess, topic: str, config: dict[str, str]) -> int:
    """Messages 0..299 stamped two hours ago, 300..599 stamped now; waits until every rolled
    segment is tiered. Returns the time the young cohort was stamped with."""
    create_topic(b.bootstrap, topic, 1,
                 {"remote.storage.enable": "true", "segment.bytes": str(SEGMENT_BYTES), **config})
    now = int(time.time() * 1000)
    fill_at(b.bootstrap, topic, 0, 300, now - 2 * HOUR_MS)
    fill_at(b.bootstrap, topic, 300, 300, now)
    wait_copied(b, topic)
    return now


def segments_of(b: BrokerProcess, topic: str, states: tuple[S, ...] = (S.COPY_SEGMENT_FINISHED,)) -> list[Any]:
    from kcli.tiered import metadata as rlmm

    return [s for s in rlmm.load(b.data_dir).all_segments(states=states) if s.segment_id.topic == topic]


def files_of(b: BrokerProcess, topic: str) -> str:
    return " ".join(p.name for p in remote_files(b.data_dir) if p.parent.parent.name.startswith(f"{topic}-"))


def split_by_age(segs: list[Any], young_ts: int) -> tuple[list[Any], list[Any]]:
    """(segments holding only the old cohort, segments holding young records)."""
    old = [s for s in segs if s.max_timestamp_ms < young_ts - HOUR_MS]
    young = [s for s in segs if s.max_timestamp_ms >= young_ts - HOUR_MS]
    return old, young


def local_bases(b: BrokerProcess, topic: str) -> list[int]:
    return sorted(int(p.name[:20]) for p in (b.data_dir / f"{topic}-0").glob("*.log"))


def assert_expired_by_time(b: BrokerProcess, topic: str, old: list[Any], young: list[Any]) -> int:
    """retention.ms of one hour was just set: the old cohort's remote segments go, the young stay."""
    boundary = young[0].start_offset
    assert boundary == old[-1].end_offset + 1
    wait_until("the log start offset to move past the expired remote segments",
               lambda: list_offset(b.bootstrap, topic, -2) == boundary)
    wait_until("the expired segments' DELETE_SEGMENT_FINISHED",
               lambda: all(s.start_offset >= boundary for s in segments_of(
                   b, topic, (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED))))
    kept = segments_of(b, topic)
    assert {s.segment_id.id for s in young} <= {s.segment_id.id for s in kept}  # young ones stay
    assert all(s.start_offset >= boundary for s in kept)
    names = files_of(b, topic)
    assert not any(kafka_uuid(s.segment_id.id) in names for s in old), "expired objects are deleted"
    assert all(kafka_uuid(s.segment_id.id) in names for s in young)
    got = consume_values(b.bootstrap, topic, 0, 600 - boundary)  # from 0: reset to the new earliest
    assert got == [(i, value(i)) for i in range(boundary, 600)]
    return boundary


def test_remote_segments_expire_by_retention_ms(tiered_broker):
    """Seed 001: total retention by time deletes remote segments past retention.ms (by their
    max timestamp), moves the log start offset, and keeps younger remote segments."""
    b, topic = tiered_broker, "expire-by-time"
    young_ts = two_cohorts(b, topic, {"local.retention.bytes": "20000"})
    old, young = split_by_age(segments_of(b, topic), young_ts)
    assert len(old) >= 2 and young, (old, young)
    time.sleep(1.0)  # five retention rounds under the default 7 days: nothing expires
    assert list_offset(b.bootstrap, topic, -2) == 0
    assert {s.segment_id.id for s in old + young} <= {s.segment_id.id for s in segments_of(b, topic)}

    alter(b.bootstrap, topic, {"retention.ms": str(HOUR_MS)})  # retention.bytes stays -1: time alone
    assert_expired_by_time(b, topic, old, young)


def test_local_retention_ms_deletes_tiered_local_segments_and_keeps_remote(tiered_broker):
    """Seed 001: local.retention.ms deletes local segments once they are tiered and older than
    it; their remote copies stay (retention.ms is 7 days), younger tiered segments stay local."""
    b, topic = tiered_broker, "local-by-time"
    # local.retention.bytes -2 → retention.bytes -1: no size limit, only local.retention.ms can delete
    young_ts = two_cohorts(b, topic, {"local.retention.ms": str(HOUR_MS)})
    old, young = split_by_age(segments_of(b, topic), young_ts)
    assert len(old) >= 2 and young, (old, young)
    boundary = young[0].start_offset
    wait_until("local segments of the old cohort to be deleted",
               lambda: list_offset(b.bootstrap, topic, -4) == boundary)
    time.sleep(1.0)  # more rounds delete nothing younger than local.retention.ms
    bases = local_bases(b, topic)
    assert bases[0] == boundary == list_offset(b.bootstrap, topic, -4)
    assert all(s.start_offset in bases for s in young)  # tiered, but young: still local too
    # the remote tier is untouched: every segment, every object, offset 0 still the earliest
    assert list_offset(b.bootstrap, topic, -2) == 0
    assert {s.segment_id.id for s in old + young} <= {s.segment_id.id for s in segments_of(b, topic)}
    names = files_of(b, topic)
    assert all(kafka_uuid(s.segment_id.id) in names for s in old + young)
    assert consume_values(b.bootstrap, topic, 0, 600) == [(i, value(i)) for i in range(600)]


def test_retained_remote_data_expires_by_retention_after_disablement(tiered_broker, cli_env):  # noqa: F811
    """Seed 000: after `--disable-tiering --policy retain` the remote segments stay readable and
    are not copied to any more; once retention.ms passes them they are deleted."""
    b, topic = tiered_broker, "retained-then-expired"
    young_ts = two_cohorts(b, topic, {"local.retention.bytes": "20000"})
    wait_until("local retention to delete tiered segments", lambda: list_offset(b.bootstrap, topic, -4) > 0)
    done = run_kcli(cli_env, "-b", b.bootstrap, "topics", "alter", "--topic", topic, "--disable-tiering",
                    "--policy", "retain", "--wait", "--timeout", "60")
    assert done.returncode == 0, done.stderr
    wait_state(b.bootstrap, topic, "DISABLED")
    old, young = split_by_age(segments_of(b, topic), young_ts)
    assert len(old) >= 2 and young, (old, young)
    time.sleep(1.0)  # retention rounds after the disablement: retain keeps everything (7 days)
    assert list_offset(b.bootstrap, topic, -2) == 0
    assert {s.segment_id.id for s in segments_of(b, topic)} == {s.segment_id.id for s in old + young}
    assert consume_values(b.bootstrap, topic, 0, 20) == [(i, value(i)) for i in range(20)]  # from the remote tier

    alter(b.bootstrap, topic, {"retention.ms": str(HOUR_MS)})
    assert_expired_by_time(b, topic, old, young)
    assert segments_of(b, topic, (S.COPY_SEGMENT_STARTED,)) == []  # and nothing new was copied


# ---- seed 004: commit interval and buffer size held within a threshold ---------------------------
INTERVAL_MS = 2000
BUFFER_MAX = 65536


@pytest.fixture(scope="module")
def diskless_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("diskless") / "data", {
        "diskless.append.commit.interval.ms": str(INTERVAL_MS),
        "diskless.append.buffer.max.bytes": str(BUFFER_MAX),
        "group.initial.rebalance.delay.ms": "0",
    }).start()
    yield b
    b.stop()


def objects_of(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    doc = kcli_admin(bootstrap, admin_api.DISKLESS_OBJECTS_KEY, {"topic": topic, "batches": True})
    return doc["objects"]


def test_commit_interval_holds_objects_open_for_the_interval_and_no_longer(diskless_broker):
    """diskless.append.commit.interval.ms=2000: a lone record is acknowledged no sooner than the
    interval (its object waits for more batches; a broker that ignored the config would answer
    after ~its 250 ms default) and well before twice the interval; records arriving while the
    object is open share it and are acknowledged with it."""
    b = diskless_broker
    topic = "interval"
    create_topic(b.bootstrap, topic, 1, DISKLESS)
    create_topic(b.bootstrap, "warm-up", 1)
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0, "acks": "all", "enable.idempotence": False})
    acked: dict[int, float] = {}
    sent: dict[int, float] = {}
    stamps: dict[int, int] = {}

    def done(i: int):
        def cb(err, msg):  # noqa: ANN001
            assert err is None, err
            acked[i] = time.monotonic()
            stamps[i] = msg.timestamp()[1]
        return cb

    p.produce("warm-up", b"w", on_delivery=done(-1))  # connections to the broker are up before timing
    assert p.flush(20) == 0
    p.list_topics(topic, timeout=10)
    for i, delay in enumerate((0.0, 0.4, 0.4)):  # sent at ~0, ~0.4, ~0.8 s: all inside the first object's 2 s
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline:
            p.poll(0.01)
        sent[i] = time.monotonic()
        p.produce(topic, b"record-%d" % i, on_delivery=done(i))
        p.poll(0)
    deadline = time.monotonic() + 20
    while len(acked) < 4 and time.monotonic() < deadline:
        p.poll(0.01)
    assert len(acked) == 4, acked
    interval = INTERVAL_MS / 1000
    first = acked[0] - sent[0]
    assert interval - 0.05 <= first < 2 * interval, f"lone record acknowledged after {first:.3f}s"
    for i in (1, 2):  # acknowledged with the first object, not a whole interval after their own send
        if sent[i] - sent[0] < interval - 0.4:  # arrived while the object was still open
            assert acked[i] - sent[i] < acked[0] - sent[0] - 0.2, (i, acked, sent)

    [obj] = objects_of(b.bootstrap, topic)  # one object holds the three records
    assert obj["batch_count"] == 3
    age = obj["committed_at_ms"] - stamps[0]  # record 0 stamped by the client when it was produced
    assert INTERVAL_MS - 50 <= age < 2 * INTERVAL_MS, age


def test_buffer_max_bytes_bounds_every_wal_object(diskless_broker):
    """diskless.append.buffer.max.bytes=64 KiB: a burst closes objects by size long before the
    2 s interval, and no WAL object in the store is larger than the limit plus one batch (the
    batch that crossed the limit)."""
    b = diskless_broker
    topic = "sized"
    create_topic(b.bootstrap, topic, 1, DISKLESS)
    count = 1200
    values = [b"%05d-" % i + b"v" * 994 for i in range(count)]  # ~1.2 MB in ~16 KiB batches
    start = time.monotonic()
    produce(b.bootstrap, topic, values, partition=0, **{"batch.size": 16384, "linger.ms": 20,
                                                        "enable.idempotence": False,
                                                        "max.in.flight.requests.per.connection": 200})
    elapsed = time.monotonic() - start

    objects = objects_of(b.bootstrap, topic)
    store = b.data_dir / "objects"
    sizes, last_batches, largest_batch, records = [], [], 0, 0
    for obj in objects:
        blob = (store / obj["object_key"]).read_bytes()  # the object as stored (key: wal/<uuid>)
        assert len(blob) == obj["file_size"]
        wal = parse_wal(blob)
        assert wal.error is None and wal.invalid_bytes == 0 and wal.batches
        sizes.append(len(blob))
        last_batches.append(wal.batches[-1].size)  # one partition: layout order is arrival order
        largest_batch = max([largest_batch] + [h.size for h in wal.batches])
        records += sum(h.records_count for h in wal.batches)
    assert records == count and largest_batch <= 16384 + 100
    for size, last in zip(sizes, last_batches):
        assert size - last < BUFFER_MAX, (size, last)  # below the limit until its last batch came
        assert size <= BUFFER_MAX + largest_batch, (size, largest_batch)
    full = [s for s in sizes if s >= BUFFER_MAX]
    # closed by size: without the limit a 2 s object would hold far more than 64 KiB
    assert len(full) >= 3 and len(objects) >= sum(sizes) // (BUFFER_MAX + largest_batch), (sizes, elapsed)
    described = kcli_admin(b.bootstrap, admin_api.DISKLESS_DESCRIBE_KEY, {"topics": [topic]})
    assert described["topics"][0]["partitions"][0]["high_watermark"] == count


# ---- diskless.system.enable=false ------------------------------------------------------------------
REFUSED = "diskless.enable=true needs diskless.system.enable=true on the broker"


def test_broker_without_diskless_refuses_creating_and_altering_diskless_topics(broker_factory, cli_env):  # noqa: F811
    """With diskless.system.enable=false a broker refuses to create a diskless topic and to
    alter one created while diskless was on (configs or partitions), with INVALID_CONFIG and one
    message; the CLI prints that as one line and exits 1. Classic topics are unaffected, and
    the diskless topic's data is intact when diskless is turned back on."""
    b = broker_factory({"diskless.append.commit.interval.ms": "50"})
    create_topic(b.bootstrap, "dl", 1, DISKLESS)
    produce(b.bootstrap, "dl", [b"before"])
    b.stop()
    b.configs["diskless.system.enable"] = "false"
    b.start()
    a = admin(b.bootstrap)
    # the CLI's three refusals, run meanwhile (each is a Python process start)
    pool = ThreadPoolExecutor(max_workers=3)
    cli = [pool.submit(run_kcli, cli_env, "-b", b.bootstrap, *args) for args in (
        ("topics", "create", "--topic", "new-dl", "--diskless"),
        ("topics", "alter", "--topic", "dl", "--config", "retention.ms=100000"),
        ("topics", "alter", "--topic", "dl", "--partitions", "2"))]

    # creating: Kafka's CreateTopics error, nothing created
    fut = a.create_topics([NewTopic("new-dl", 1, 1, config=DISKLESS)], operation_timeout=20)["new-dl"]
    with pytest.raises(KafkaException) as info:
        fut.result(20)
    err = info.value.args[0]
    assert (err.name(), err.str()) == ("INVALID_CONFIG", REFUSED), (err.name(), err.str())
    assert "new-dl" not in a.list_topics(timeout=10).topics
    create_topic(b.bootstrap, "classic", 1)  # classic topics are not affected

    # altering the diskless topic: its configs and its partitions
    code, message = alter_error(b.bootstrap, "dl", {"retention.ms": "100000"})
    assert (code, message) == (40, REFUSED), (code, message)
    fut = a.create_partitions([NewPartitions("dl", 2)], operation_timeout=20)["dl"]
    with pytest.raises(KafkaException) as info:
        fut.result(20)
    err = info.value.args[0]
    assert (err.name(), err.str()) == ("INVALID_CONFIG", REFUSED), (err.name(), err.str())
    assert_one_line_error(cli[0].result(60), 1, f"kcli: error: INVALID_CONFIG: topic 'new-dl': {REFUSED}")
    assert_one_line_error(cli[1].result(60), 1, f"kcli: error: INVALID_CONFIG: topic 'dl': {REFUSED}")
    assert_one_line_error(cli[2].result(60), 1, "INVALID_CONFIG", REFUSED)
    pool.shutdown()
    res = ConfigResource(ResourceType.TOPIC, "dl")
    assert "retention.ms" not in {k for k, e in a.describe_configs([res])[res].result(20).items()
                                  if not e.is_default}
    assert len(a.list_topics("dl", timeout=10).topics["dl"].partitions) == 1
    # turning an existing classic topic diskless is refused anyway (only at creation)
    code, message = alter_error(b.bootstrap, "classic", {"diskless.enable": "true"})
    assert (code, message) == (40, "diskless.enable can only be set when a topic is created")
    # its data is not served either, with the same answer instead of a server error
    errors: list[Any] = []
    p = Producer({"bootstrap.servers": b.bootstrap, "message.timeout.ms": 10000})
    p.produce("dl", b"refused", on_delivery=lambda err, _m: errors.append(err))
    p.flush(20)
    assert [e.name() for e in errors] == ["INVALID_CONFIG"], errors
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g", "enable.auto.commit": False})
    c.assign([TopicPartition("dl", 0, 0)])
    try:
        got = wait_until("the fetch error", lambda: (lambda m: m if m is not None else None)(c.poll(0.2)))
    finally:
        c.close()
    assert got.error() is not None and got.error().name() == "INVALID_CONFIG", got.error()
    assert "Traceback" not in b.log_text()  # CLI's ListOffsets, Produce: no UNKNOWN_SERVER_ERROR

    # with diskless back on, the topic is whole and alterable again
    b.stop()
    b.configs["diskless.system.enable"] = "true"
    b.start()
    alter(b.bootstrap, "dl", {"retention.ms": "100000"})
    assert [v for _o, v in consume_values(b.bootstrap, "dl", 0, 1)] == [b"before"]
