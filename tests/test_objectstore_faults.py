"""FaultyObjectStorage, and a broker whose object store fails: retriable errors for producers,
nothing acknowledged lost, full recovery once the faults stop.

The plugin is exercised over real stores (a local directory, and S3 through moto's HTTP server);
the broker runs as a real process configured the way an operator would configure it
(``diskless.storage.class.name=plugins.objectstore.faulty.FaultyObjectStorage``).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from kcli.config.broker_config import BrokerConfig
from kcli.diskless import admin_api
from kcli.diskless.storage_setup import open_object_storage
from kcli.protocol.client import WireClient
from plugins.objectstore import ByteRange, ObjectNotFound, StorageBackendException
from plugins.objectstore.faulty import FaultyObjectStorage, InjectedFault
from plugins.objectstore.local import LocalObjectStorage
from tests.diskless_helpers import DISKLESS, FAST, admin, counter, wait_until
from tests.fixtures_s3 import moto_server, s3_bucket, s3_env  # noqa: F401 - fixtures
from tests.kafka_helpers import create_topic
from tests.wire_helpers import batch, produce_body, produce_result

FAULTY = "plugins.objectstore.faulty.FaultyObjectStorage"


def faulty(tmp_path: Path, **settings: str) -> FaultyObjectStorage:
    s = FaultyObjectStorage()
    s.configure({"delegate.uri": (tmp_path / "objects").as_uri(), **{k.replace("_", "."): v for k, v in settings.items()}})
    return s


# ---- the plugin ---------------------------------------------------------------------------------


def test_without_faults_it_is_the_delegate(tmp_path):
    s = faulty(tmp_path)
    s.upload("wal/a", b"hello world", 11)
    assert s.fetch("wal/a") == b"hello world"
    assert s.fetch("wal/a", ByteRange(6, 5)) == b"world"
    assert s.size("wal/a") == 11 and [o.key for o in s.list("wal/")] == ["wal/a"]
    assert s.describe() == (tmp_path / "objects").as_uri(), "tools given describe() read the real store"
    s.delete(["wal/a"])
    with pytest.raises(ObjectNotFound):
        s.fetch("wal/a")
    assert (tmp_path / "objects").is_dir() and not (tmp_path / "objects" / "wal" / "a").exists()


def test_a_torn_prefix_marker_of_this_broker_is_written_again(tmp_path):
    """A partial upload of the prefix marker (a store that is not atomic) left half of this
    process's own marker: the claim writes it again once the store works, instead of refusing the
    prefix forever (which stopped every orphan scan); another torn or foreign marker is still refused."""
    from kcli.diskless.identity import PREFIX_MARKER_KEY, DisklessIdentityError, PrefixClaim

    switch = tmp_path / "faults-on"
    switch.touch()
    store = faulty(tmp_path, partial_upload_rate="1", switch_file=str(switch), key_prefixes=PREFIX_MARKER_KEY)
    claim = PrefixClaim(store, "cluster-a")
    with pytest.raises(StorageBackendException):
        claim.ensure()
    local = LocalObjectStorage(tmp_path / "objects")
    torn = local.fetch(PREFIX_MARKER_KEY)
    assert 0 < len(torn) < len(claim.own_writes[0]), "the marker is torn"
    switch.unlink()
    claim.ensure()
    assert json.loads(local.fetch(PREFIX_MARKER_KEY))["cluster_id"] == "cluster-a"
    local.upload(PREFIX_MARKER_KEY, torn, len(torn))  # not this process's write any more
    with pytest.raises(DisklessIdentityError, match="not a kcli prefix marker"):
        PrefixClaim(LocalObjectStorage(tmp_path / "objects"), "cluster-a").ensure()


def test_failures_follow_the_seed_and_hit_only_the_chosen_operations(tmp_path):
    def pattern(seed: str) -> list[bool]:
        s = faulty(tmp_path, failure_rate="0.5", seed=seed, failure_operations="upload")
        out = []
        for i in range(40):
            try:
                s.upload(f"wal/{seed}-{i}", b"x", 1)
                out.append(True)
            except InjectedFault:
                out.append(False)
        s.size(f"wal/{seed}-0") if out[0] else None  # size is not a faulted operation here
        return out

    a, b, c = pattern("7"), pattern("7"), pattern("8")
    assert a == b, "the same seed injects the same faults"
    assert a != c and 5 < a.count(False) < 35
    failed = [i for i, ok in enumerate(a) if not ok]
    store = LocalObjectStorage(tmp_path / "objects")
    assert all(not store.exists(f"wal/7-{i}") for i in failed), "a failed upload stores nothing"
    always = faulty(tmp_path, failure_rate="1", failure_operations="fetch,list")
    always.upload("wal/z", b"zz", 2)
    with pytest.raises(InjectedFault, match="injected fetch failure"):
        always.fetch("wal/z")
    with pytest.raises(StorageBackendException):  # what the broker catches
        list(always.list("wal/"))
    assert always.size("wal/z") == 2 and always.stats["failures.fetch"] == 1 and always.stats["failures.list"] == 1


def test_partial_upload_leaves_half_an_object_and_fails(tmp_path):
    s = faulty(tmp_path, partial_upload_rate="1", seed="1")
    data = bytes(range(256)) * 40
    with pytest.raises(InjectedFault, match="partial upload"):
        s.upload("wal/torn", data, len(data))
    torn = (tmp_path / "objects" / "wal" / "torn").read_bytes()
    assert torn == data[: len(data) // 2]
    import io

    with pytest.raises(InjectedFault):
        s.upload("wal/torn2", io.BytesIO(data), len(data))  # from a stream too
    assert (tmp_path / "objects" / "wal" / "torn2").read_bytes() == data[: len(data) // 2]


def test_switch_file_window_key_prefixes_latency_slow_uploads_and_stats(tmp_path):
    switch = tmp_path / "faults-on"
    stats = tmp_path / "stats.json"
    s = faulty(tmp_path, failure_rate="1", switch_file=str(switch), stats_file=str(stats), key_prefixes="wal/")
    s.upload("wal/a", b"a", 1)  # switch file absent: no faults
    switch.touch()
    with pytest.raises(InjectedFault):
        s.upload("wal/b", b"b", 1)
    s.upload("tiered/c", b"c", 1)  # not under key.prefixes
    switch.unlink()
    s.upload("wal/b", b"b", 1)
    assert json.loads(stats.read_text())["failures.upload"] == 1

    w = faulty(tmp_path, failure_rate="1", active_after_ms="0", active_for_ms="300")
    with pytest.raises(InjectedFault):
        w.fetch("wal/a")
    time.sleep(0.35)
    assert w.fetch("wal/a") == b"a", "the fault window is over"

    slow = faulty(tmp_path, latency_ms="100", upload_bytes_per_second="20000", upload_ack_delay_ms="100")
    started = time.monotonic()
    slow.upload("wal/slow", b"s" * 10000, 10000)  # 0.5 s of trickle + 0.1 latency + 0.1 ack delay
    assert time.monotonic() - started >= 0.6
    assert (tmp_path / "objects" / "wal" / "slow").read_bytes() == b"s" * 10000


def test_abandoned_upload_temp_files_are_swept_but_never_a_live_upload(tmp_path):
    """A SIGKILL mid-upload leaves a local store's temp file that list() hides from every
    collector; the cleaner sweeps such files, and must never take one a slow upload still uses."""
    import os
    import threading

    from plugins.objectstore.local import TEMP_SUFFIX

    store = LocalObjectStorage(tmp_path / "objects")
    (tmp_path / "objects" / "wal").mkdir(parents=True)
    stale = tmp_path / "objects" / "wal" / f".dead.0123{TEMP_SUFFIX}"  # a killed broker's upload
    stale.write_bytes(b"half an object")
    os.utime(stale, (time.time() - 120, time.time() - 120))
    slow = FaultyObjectStorage(store, upload_bytes_per_second="4000")
    data = bytes(range(256)) * 8  # 2048 bytes: about half a second
    t = threading.Thread(target=slow.upload, args=("wal/slow", data, len(data)))
    t.start()
    swept = 0
    while t.is_alive():
        swept += slow.delete_abandoned_uploads(0)  # "older than 0 ms": every idle temp file
        time.sleep(0.02)
    t.join()
    assert swept == 1 and not stale.exists()
    assert store.fetch("wal/slow") == data, "the live upload's temp file was left alone"
    assert not [p for p in (tmp_path / "objects").rglob(f"*{TEMP_SUFFIX}")]


@pytest.mark.parametrize("settings,needle", [
    ({}, "needs config delegate.uri"),
    ({"delegate.uri": "ftp://x"}, "unsupported object store URI"),
    ({"delegate.uri": "file:///tmp/x", "failure.rate": "2"}, "failure.rate must be a number in 0..1"),
    ({"delegate.uri": "file:///tmp/x", "latency.ms": "-1"}, "latency.ms must be an integer >= 0"),
    ({"delegate.uri": "file:///tmp/x", "failure.operations": "upload,rename"}, "unknown operation(s) rename"),
    ({"delegate.uri": "file:///tmp/x", "seed": "abc"}, "seed must be an integer"),
    ({"delegate.uri": "file:///tmp/x", "failure.ratio": "0.1"}, "unknown FaultyObjectStorage config(s): failure.ratio"),
])
def test_bad_settings_are_one_line_errors(settings, needle):
    with pytest.raises(StorageBackendException) as info:
        FaultyObjectStorage().configure(settings)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_the_broker_builds_it_from_its_diskless_storage_settings(tmp_path):
    config = BrokerConfig({
        "diskless.storage.class.name": FAULTY,
        "diskless.storage.delegate.uri": (tmp_path / "store").as_uri(),
        "diskless.storage.failure.rate": "0.25",
        "diskless.storage.seed": "42",
    })
    storage = open_object_storage(config, tmp_path / "data")
    assert isinstance(storage, FaultyObjectStorage)
    assert storage.failure_rate == 0.25 and storage.seed == 42
    assert storage.describe() == (tmp_path / "store").as_uri()
    storage.close()


# ---- a broker over a failing store ------------------------------------------------------------------


class Ledger:
    def __init__(self) -> None:
        self.acked: dict[bytes, tuple[str, int, int]] = {}
        self.errors: list[Any] = []
        self.lock = threading.Lock()

    def cb(self, err: Any, msg: Any) -> None:
        with self.lock:
            if err is not None:
                self.errors.append(err)
            else:
                self.acked[msg.value()] = (msg.topic(), msg.partition(), msg.offset())


def read_all(bootstrap: str, topic: str, partitions: int, expected: int, timeout: float = 60) -> tuple[list[Any], list[str]]:
    """Every record of ``topic`` from offset 0; also the retriable errors the consumer saw."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"faults-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100,
                  "fetch.error.backoff.ms": 50})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[Any] = []
    errors: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expected and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if m.error():
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        errors.append(m.error().name())
                    continue
                out.append(m)
    finally:
        c.close()
    return out, errors


def check_exactly_once(msgs: list[Any], ledger: Ledger, topic: str) -> None:
    got = [m.value() for m in msgs]
    assert len(got) == len(set(got)), "a record was stored twice"
    placed = {m.value(): (m.topic(), m.partition(), m.offset()) for m in msgs}
    for value, where in ledger.acked.items():
        if where[0] == topic:
            assert placed.get(value) == where, f"acknowledged {value!r} at {where}, read at {placed.get(value)}"


def faulty_broker_configs(objects: Path, switch: Path, stats: Path, delegate: str | None = None) -> dict[str, str]:
    return {
        **FAST,
        "diskless.storage.class.name": FAULTY,
        "diskless.storage.delegate.uri": delegate or objects.as_uri(),
        "diskless.storage.failure.rate": "0.3",
        "diskless.storage.partial.upload.rate": "0.1",
        "diskless.storage.latency.ms": "5",
        "diskless.storage.seed": "12345",
        "diskless.storage.switch.file": str(switch),
        "diskless.storage.stats.file": str(stats),
        "remote.log.storage.system.enable": "true",
        "remote.log.manager.task.interval.ms": "200",
        "log.retention.check.interval.ms": "300",
        "diskless.fetch.cache.max.bytes": "0",
    }


def produce_through_faults(bootstrap: str, topics: dict[str, int], switch: Path, stats: Path,
                           minimum: int = 400) -> tuple[Ledger, int]:
    """Produce while the store fails until it injected upload failures and a torn upload (and at
    least ``minimum`` records per topic went out); the producer must only have seen retriable
    errors. Then turn the faults off and let everything complete. Returns the ledger and the
    number of records per topic."""
    ledger = Ledger()
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                  "batch.size": 16384, "message.timeout.ms": 120000, "retry.backoff.ms": 50,
                  "retry.backoff.max.ms": 300})
    deadline = time.monotonic() + 45
    injected: dict[str, int] = {}
    n = 0
    while time.monotonic() < deadline:
        for _ in range(20):
            for topic, parts in topics.items():
                value = b"%s-%06d-" % (topic.encode(), n) + b"v" * 200
                p.produce(topic, value, key=b"%d" % (n % (parts * 3)), on_delivery=ledger.cb)
            n += 1
        p.poll(0.05)
        injected = json.loads(stats.read_text()) if stats.exists() else {}
        # The store's count includes tiered copies (they share it): also wait until WAL uploads
        # themselves failed, which is what the callers check the broker answered.
        if n >= minimum and injected.get("failures.upload", 0) >= 3 and injected.get("partial_uploads", 0) >= 1 \
                and counter(bootstrap, "diskless.upload.errors") >= 3:
            break
    assert injected.get("failures.upload", 0) >= 3 and injected.get("partial_uploads", 0) >= 1, injected
    assert ledger.errors == [], f"an object-store fault surfaced as a non-retriable error: {ledger.errors[:3]}"
    switch.unlink()  # the store recovers
    assert p.flush(90) == 0
    assert ledger.errors == [], ledger.errors[:3]
    assert len(ledger.acked) == n * len(topics)
    return ledger, n


def test_broker_over_a_failing_local_store_loses_nothing_and_recovers(broker_factory, tmp_path):
    objects, switch, stats = tmp_path / "objects", tmp_path / "faults-on", tmp_path / "stats.json"
    objects.mkdir()
    switch.touch()
    b = broker_factory(faulty_broker_configs(objects, switch, stats))
    create_topic(b.bootstrap, "df", 3, DISKLESS)
    create_topic(b.bootstrap, "raw", 1, DISKLESS)
    # What a producer is told when its WAL object cannot be stored: KAFKA_STORAGE_ERROR, which
    # every Kafka client retries (the batch was not persisted).
    codes = set()
    with WireClient(b.bootstrap) as client:
        for i in range(40):
            resp = client.request(0, 9, produce_body("raw", 0, batch([b"raw-%d" % i], timestamp=int(time.time() * 1000))))
            codes.add(produce_result(resp)[0])
            if codes - {0}:
                break
    assert codes - {0} == {56}, codes
    create_topic(b.bootstrap, "tf", 2, {"remote.storage.enable": "true", "segment.bytes": "16384",
                                         "local.retention.bytes": "1"})
    ledger, n = produce_through_faults(b.bootstrap, {"df": 3, "tf": 2}, switch, stats)
    assert counter(b.bootstrap, "diskless.upload.errors") >= 3, "uploads failed, and were answered with errors"
    wait_until(lambda: int(admin(b.bootstrap, admin_api.BROKER_METRICS_KEY)["counters"].get("tiered.segments.copied", 0)) >= 2,
               30, what="tiered copies after the faults stopped")
    # Reading through the faults: WAL and remote-tier fetches fail part of the time (no fetch
    # cache: every read goes to the store), the consumers retry and get every record once.
    switch.touch()
    seen: list[str] = []
    for topic, parts in (("df", 3), ("tf", 2)):
        msgs, errors = read_all(b.bootstrap, topic, parts, n)
        seen += errors
        check_exactly_once(msgs, ledger, topic)
        assert len(msgs) == n
    switch.unlink()
    injected = json.loads(stats.read_text())
    print(f"\ninjected: {injected}; consumers saw: {sorted(set(seen))}")
    assert injected["failures.fetch"] >= 1, "the reads went through the faults"
    # Torn objects of partial uploads are orphans: collected after the grace period; nothing damaged.
    last: dict[str, Any] = {}

    def collected() -> dict[str, Any] | None:
        last.update(admin(b.bootstrap, admin_api.DISKLESS_VERIFY_KEY))
        return dict(last) if not last["orphans"] else None

    try:
        report = wait_until(collected, 30, what="orphans of failed uploads collected")
    except AssertionError:
        cleaner = [line for line in b.log_text().splitlines() if "cleaner" in line or "orphan" in line]
        raise AssertionError(f"orphans left: {last.get('orphans')}; cleaner log: {cleaner[-15:]}") from None
    assert report["problems"] == [] and report["objects_checked"] >= 1
    assert counter(b.bootstrap, "diskless.cleaner.orphans_deleted") >= 1


def test_a_later_batch_of_a_producer_whose_batch_failed_waits_for_the_retry(broker_factory, tmp_path):
    """The race the fault soak found: batch A (sequence 0) of a new idempotent producer fails to
    upload; its batch B (sequence 1), sent while A was in flight, arrives after A's failure was
    answered. The coordinator has no state for the producer, so it would take B as the first
    batch; librdkafka, seeing B acknowledged, counts A as written (an acknowledgement without an
    offset) and A is lost. B must be refused until A's retry comes back, then both land in order."""
    switch, stats = tmp_path / "faults-on", tmp_path / "stats.json"
    switch.touch()
    b = broker_factory({**FAST, "diskless.storage.class.name": FAULTY,
                        "diskless.storage.delegate.uri": (tmp_path / "objects").as_uri(),
                        "diskless.storage.failure.rate": "1.0", "diskless.storage.failure.operations": "upload",
                        "diskless.storage.switch.file": str(switch), "diskless.storage.stats.file": str(stats)})
    create_topic(b.bootstrap, "seq", 1, DISKLESS)
    now = int(time.time() * 1000)
    with WireClient(b.bootstrap) as client:
        init = client.request(22, 1, {"transactional_id": None, "transaction_timeout_ms": 60000})
        pid, epoch = int(init.producer_id), int(init.producer_epoch)
        a = batch([b"a0", b"a1"], producer_id=pid, epoch=epoch, base_sequence=0, timestamp=now)
        later = batch([b"b0"], producer_id=pid, epoch=epoch, base_sequence=2, timestamp=now)
        assert produce_result(client.request(0, 9, produce_body("seq", 0, a)))[0] == 56
        switch.unlink()  # the store works again; B arrives only now
        assert produce_result(client.request(0, 9, produce_body("seq", 0, later))) == (56, -1), \
            "a batch after a failed one of its producer was accepted"
        assert produce_result(client.request(0, 9, produce_body("seq", 0, later)))[0] == 56, "still fenced"
        assert produce_result(client.request(0, 9, produce_body("seq", 0, a))) == (0, 0)  # the retry
        assert produce_result(client.request(0, 9, produce_body("seq", 0, later))) == (0, 2)
        # A fence stops only a later sequence: a producer that starts over at 0 (or a transaction
        # marker, sequence -1) is not held back by it; the coordinator judges the sequence.
        switch.touch()
        c = batch([b"c0"], producer_id=pid, epoch=epoch, base_sequence=3, timestamp=now)
        assert produce_result(client.request(0, 9, produce_body("seq", 0, c)))[0] == 56
        switch.unlink()
        restart = batch([b"r0"], producer_id=pid, epoch=epoch, base_sequence=0, timestamp=now)
        assert produce_result(client.request(0, 9, produce_body("seq", 0, restart)))[0] == 45  # OUT_OF_ORDER, not fenced
    assert counter(b.bootstrap, "diskless.append.fenced") == 2


def test_broker_over_a_failing_s3_store_loses_nothing_and_recovers(broker_factory, tmp_path, s3_bucket):
    switch, stats = tmp_path / "faults-on", tmp_path / "stats.json"
    switch.touch()
    configs = faulty_broker_configs(tmp_path / "unused", switch, stats, delegate=f"s3://{s3_bucket}/faulty")
    configs = {k: v for k, v in configs.items() if not k.startswith(("remote.", "log.retention"))}
    b = broker_factory(configs)
    create_topic(b.bootstrap, "sf", 2, DISKLESS)
    ledger, n = produce_through_faults(b.bootstrap, {"sf": 2}, switch, stats)
    msgs, _ = read_all(b.bootstrap, "sf", 2, n)
    check_exactly_once(msgs, ledger, "sf")
    assert len(msgs) == n
    last: dict[str, Any] = {}

    def collected() -> dict[str, Any] | None:
        last.update(admin(b.bootstrap, admin_api.DISKLESS_VERIFY_KEY))
        return dict(last) if not last["orphans"] else None

    try:
        report = wait_until(collected, 30, what="orphans of failed uploads collected")
    except AssertionError:
        cleaner = [line for line in b.log_text().splitlines() if "cleaner" in line or "orphan" in line]
        raise AssertionError(f"orphans left: {last.get('orphans')}; cleaner log: {cleaner[-15:]}") from None
    assert report["problems"] == [] and report["storage"].startswith(f"s3://{s3_bucket}/faulty")


def test_a_fetch_over_many_objects_survives_a_share_of_failed_gets(broker_factory, tmp_path):
    """One Fetch of a partition spread over ~150 WAL objects needs ~150 ranged GETs; with 10% of
    GETs failing, a Fetch that fails whenever any one GET does would almost never succeed and
    the consumer would stall (the crash soak found this). Each GET is retried, so it reads on."""
    switch, stats = tmp_path / "faults-on", tmp_path / "stats.json"
    b = broker_factory({
        **FAST, "diskless.append.commit.interval.ms": "1", "diskless.fetch.cache.max.bytes": "0",
        # no replica cache: the consumer must read the objects itself, through the failing GETs
        "diskless.replica.cache.enable": "false",
        "diskless.storage.class.name": FAULTY, "diskless.storage.delegate.uri": (tmp_path / "objects").as_uri(),
        "diskless.storage.failure.rate": "0.1", "diskless.storage.failure.operations": "fetch",
        "diskless.storage.seed": "3", "diskless.storage.switch.file": str(switch),
        "diskless.storage.stats.file": str(stats),
    })
    create_topic(b.bootstrap, "many", 1, DISKLESS)
    ledger = Ledger()
    p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "linger.ms": 0,
                  "batch.num.messages": 1, "max.in.flight.requests.per.connection": 1})
    for i in range(150):
        p.produce("many", b"m-%04d" % i, on_delivery=ledger.cb)
        p.poll(0)
    assert p.flush(60) == 0 and len(ledger.acked) == 150
    objects = admin(b.bootstrap, admin_api.DISKLESS_DESCRIBE_KEY, {"topics": ["many"]})["topics"][0]["storage"]["file_count"]
    assert objects >= 100, f"the records should be spread over many objects, got {objects}"
    switch.touch()
    msgs, _ = read_all(b.bootstrap, "many", 1, 150, timeout=30)
    switch.unlink()
    check_exactly_once(msgs, ledger, "many")
    assert len(msgs) == 150
    assert json.loads(stats.read_text())["failures.fetch"] >= 5
    assert counter(b.bootstrap, "diskless.get.retries") >= 5
