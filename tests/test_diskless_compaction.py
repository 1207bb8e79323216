"""Log compaction of diskless partitions (kcli/diskless/compaction.py), against the dict model
the classic twin uses (tests/test_compaction.py).

Real broker processes, local object store, SQLite coordinator, confluent-kafka clients: 100k
records over 1k keys with tombstones compacted by the broker's diskless cleaner (survivors key
by key, offsets unchanged, old objects collected, describe's DirtyRatio, dump-log of the
rewritten object annotated by the coordinator); a SIGKILL between the upload and the commit of
a rewrite, and between the commit and the deletion of the old objects; key-less records refused;
a log cleaned to nothing; failure isolation per partition; two brokers on PostgreSQL, where only
the controller compacts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kio.schema.errors import ErrorCode

from plugins.coordinator.base import FindBatchRequest
from plugins.coordinator.sqlite import SqliteBatchCoordinator
from tests.brokerproc import BrokerProcess
from tests.diskless_helpers import FAST, local_wal_objects, wait_until
from tests.fixtures_pg import pg_database, pg_server  # noqa: F401 - fixtures
from tests.diskless_helpers import metrics as broker_metrics
from tests.kafka_helpers import create_topic, produce
from tests.test_compaction import (
    END_KEY,
    _assert_no_loss_or_duplicate,
    _compacted_as_modelled,
    _read_partition,
    _write_model,
)

CLEANER = {**FAST, "log.cleaner.backoff.ms": "200"}
COMPACT = {"diskless.enable": "true", "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01",
           "delete.retention.ms": "3000"}
ENV = {k: v for k, v in os.environ.items() if not k.startswith("KCLI_")}


def _kcli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kcli", *args], check=False, capture_output=True, text=True,
                          timeout=120, env=ENV)


def _coordinator(data_dir: Path) -> SqliteBatchCoordinator:
    return SqliteBatchCoordinator(data_dir / "diskless" / "coordinator.db", read_only=True)


def _read_to_end(bootstrap: str, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    """Every record up to the high watermark (``_read_partition`` stops at the first END_KEY
    record; the crash test writes a second one after it). Of the END_KEY records only the last is
    returned: they are the test's markers, not part of the model."""
    records = _read_partition(bootstrap, topic)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{time.monotonic_ns()}", "enable.auto.commit": False})
    try:
        _low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        c.assign([TopicPartition(topic, 0, records[-1][0] + 1)])
        deadline = time.monotonic() + 30
        while (not records or records[-1][0] < high - 1) and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and not m.error():
                records.append((m.offset(), m.key(), m.value()))
    finally:
        c.close()
    assert records[-1][0] == high - 1, "did not read up to the high watermark"
    ends = [r for r in records if r[1] == END_KEY]
    return [r for r in records if r[1] != END_KEY] + ends[-1:]


@pytest.fixture(scope="module")
def dbroker(tmp_path_factory: pytest.TempPathFactory) -> BrokerProcess:
    # --verbose: INFO lines (each swap is logged with its sizes)
    b = BrokerProcess(tmp_path_factory.mktemp("dcompaction") / "data", CLEANER, ["--verbose"]).start()
    yield b
    b.stop()


def test_diskless_broker_compacts_100k_records_over_1k_keys(dbroker: BrokerProcess) -> None:
    b = dbroker
    create_topic(b.bootstrap, "dchangelog", 1, COMPACT)
    latest = _write_model(b.bootstrap, "dchangelog", 100_000, 1000, seed=17)
    assert any(v is None for _o, v in latest.values()), "the model has no tombstone"
    live = {k: ov for k, ov in latest.items() if ov[1] is not None}

    def compacted() -> list | None:
        # A consumer reading while passes swap objects sees a consistent log every time: offsets
        # in order, none twice, and every key's latest record (only superseded ones go).
        r = _read_partition(b.bootstrap, "dchangelog")
        _assert_no_loss_or_duplicate(r, live)
        return r if _compacted_as_modelled(r, latest, tombstones=False) else None

    records = wait_until(compacted, timeout=180, interval=0.2, what="the diskless partition compacted as modelled")
    counters = broker_metrics(b.bootstrap)["counters"]
    assert counters["diskless.log.cleaner.runs"] >= 1 and counters["diskless.log.cleaner.bytes.written"] > 0
    assert counters["diskless.log.cleaner.records.removed"] >= 100_000 - len(records)
    # offsets are the producer's: the end record is still where it was written, and new writes go on from there
    assert records[-1][0] == 100_000 and produce(b.bootstrap, "dchangelog", [b"v"], keys=[b"k"], partition=0) == [(0, 100_001)]
    # the replaced objects are deleted by the file cleaner: what is stored is what the coordinator holds
    with _coordinator(b.data_dir) as coord:
        def collected() -> bool:
            stored = {f"wal/{p.name}" for p in local_wal_objects(b.data_dir)}
            return stored == {f.object_key for f in coord.describe_files(state="uploaded")}
        wait_until(collected, timeout=60, interval=0.5, what="old WAL objects collected")
        (info,) = [i for i in coord.describe_logs() if i.topic_id_partition.topic == "dchangelog"]
        resp = coord.find_batches([FindBatchRequest(info.topic_id_partition, 0, 1 << 30)], 1 << 30)[0]
        rewritten = resp.batches[0].object_key
        assert info.byte_size < 200_000, info  # ~1k surviving records, not 100k
    # every committed batch (rewrites included) matches its object: byte range, header, CRC
    run = _kcli("-b", b.bootstrap, "diskless", "verify")
    assert run.returncode == 0, run.stdout + run.stderr
    # kcli topics describe: the dirty ratio of a compacted diskless topic, as for classic ones
    run = _kcli("-b", b.bootstrap, "topics", "describe", "-t", "dchangelog")
    assert run.returncode == 0, run.stderr
    assert "DirtyRatio: " in run.stdout, run.stdout
    # dump-log of the rewritten object, annotated by the coordinator: original offsets, gaps between batches
    obj = b.data_dir / "objects" / rewritten
    run = _kcli("dump-log", str(obj), "--coordinator", f"sqlite://{b.data_dir / 'diskless' / 'coordinator.db'}",
                "--print-data-log")
    assert run.returncode == 0, run.stderr
    assert "topic: dchangelog partition: 0 assignedBaseOffset: " in run.stdout, run.stdout[:2000]
    first_key = min((k for k, ov in latest.items() if ov[1] is not None), key=lambda k: latest[k][0])
    assert f"key: {first_key.decode()} payload: {latest[first_key][1].decode()}" in run.stdout


@pytest.mark.parametrize("point", ["diskless.log.cleaner.uploaded", "diskless.log.cleaner.committed"])
def test_kill9_inside_a_diskless_cleaning_then_restart_keeps_the_model(tmp_path: Path, point: str) -> None:
    """SIGKILL after the rewrite is uploaded but not committed (an orphan: collected by the
    upload-intent rule), or after the commit before the old objects are deleted (marked: deleted
    after the grace period): nothing lost, nothing read twice, the cleaner finishes after restart."""
    switch = tmp_path / "arm"
    b = BrokerProcess(tmp_path / "data", {**CLEANER, f"kcli.fault.{point}.pause.ms": "30000",
                                          "kcli.fault.switch.file": str(switch)}).start()
    try:
        create_topic(b.bootstrap, "dcrash", 1, {**COMPACT, "delete.retention.ms": "600000"})
        latest = _write_model(b.bootstrap, "dcrash", 20_000, 300, seed=5)
        switch.touch()
        # a pass is due at once; the model gets the new record (a diskless log has no active segment: all is cleanable)
        ((_p, again), _end) = produce(b.bootstrap, "dcrash", [b"again", b"end"], keys=[b"key-0000", END_KEY],
                                      partition=0)
        latest[b"key-0000"] = (again, b"again")
        wait_until(lambda: f"kcli fault point {point}: pausing" in b.log_text(), timeout=90, interval=0.1,
                   what=f"the diskless cleaner inside {point}")
        b.kill9()
        stored = {f"wal/{p.name}" for p in local_wal_objects(b.data_dir)}
        with _coordinator(b.data_dir) as coord:
            known = coord.known_object_keys()
            marked = {f.object_key for f in coord.get_files_to_delete()}
            intents = {i.object_key for i in coord.list_upload_intents()}
        if point == "diskless.log.cleaner.uploaded":
            debris = (stored - known) & intents  # the rewrite: uploaded, intent recorded, never committed
        else:
            debris = marked & stored  # the replaced objects: marked for deletion, still stored
        assert debris, "the kill left nothing to collect: it missed the window"
        switch.unlink()
        b.start()
        _assert_no_loss_or_duplicate(_read_to_end(b.bootstrap, "dcrash"), latest)

        wait_until(lambda: _compacted_as_modelled(_read_to_end(b.bootstrap, "dcrash"), latest, tombstones=True),
                   timeout=120, interval=1.0, what="compaction after the restart")
        # the debris goes by the existing rules (orphan scan / grace period), nothing else is lost
        wait_until(lambda: not debris & {f"wal/{p.name}" for p in local_wal_objects(b.data_dir)}, timeout=60,
                   interval=0.5, what="the crash's debris collected")
        _assert_no_loss_or_duplicate(_read_to_end(b.bootstrap, "dcrash"), latest)
    finally:
        b.stop()


def test_keyless_records_refused_per_record_on_a_compacted_diskless_topic(dbroker: BrokerProcess) -> None:
    b = dbroker
    create_topic(b.bootstrap, "dkeyed", 1, {**COMPACT, "cleanup.policy": "compact,delete"})
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    errors: list = []
    p.produce("dkeyed", value=b"no key", partition=0, on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)
    assert errors and errors[0] is not None and errors[0].name() == "INVALID_RECORD", errors
    assert produce(b.bootstrap, "dkeyed", [b"v"], keys=[b"k"], partition=0) == [(0, 0)]  # nothing was appended
    # the wire: Produce v8+ names each refused record
    from kcli.protocol.client import WireClient
    from tests.wire_helpers import batch, produce_body

    with WireClient(b.bootstrap) as client:
        pr = client.request(0, 9, produce_body("dkeyed", 0, batch([b"a", b"b"]))).responses[0].partition_responses[0]
    assert int(pr.error_code) == ErrorCode.invalid_record
    assert [int(e.batch_index) for e in pr.record_errors] == [0, 1]
    assert "Compacted topic cannot accept message without key" in pr.record_errors[0].batch_index_error_message
    # a diskless topic switched to compact later is cleaned too (no longer refused)
    create_topic(b.bootstrap, "dswitch", 1, {"diskless.enable": "true"})
    from tests.test_compaction import _alter

    _alter(b.bootstrap, "dswitch", cleanup_policy="compact", min_cleanable_dirty_ratio="0.01")
    produce(b.bootstrap, "dswitch", [b"a", b"b", b"c"], keys=[b"k", b"k", END_KEY], partition=0)
    wait_until(lambda: _read_partition(b.bootstrap, "dswitch") == [(1, b"k", b"b"), (2, END_KEY, b"c")],
               timeout=60, interval=0.5, what="the switched topic compacted")


def test_a_log_cleaned_to_nothing_keeps_an_empty_last_batch_so_consumers_reach_the_end(dbroker: BrokerProcess) -> None:
    """Superseded record, then its tombstone past delete.retention.ms: every record goes, the last
    batch stays empty, and a consumer's position moves to the high watermark."""
    b = dbroker
    create_topic(b.bootstrap, "dgone", 1, {**COMPACT, "delete.retention.ms": "500"})
    produce(b.bootstrap, "dgone", [b"v"], keys=[b"k"], partition=0)
    produce(b.bootstrap, "dgone", [None], keys=[b"k"], partition=0)
    with _coordinator(b.data_dir) as coord:
        def emptied() -> bool:
            (info,) = [i for i in coord.describe_logs() if i.topic_id_partition.topic == "dgone"]
            resp = coord.find_batches([FindBatchRequest(info.topic_id_partition, 0, 1 << 30)], 1 << 30)[0]
            return [(x.metadata.base_offset, x.metadata.last_offset) for x in resp.batches] == [(1, 1)] \
                and resp.batches[0].metadata.byte_size == 61  # a v2 batch header and no record
        wait_until(emptied, timeout=60, interval=0.3, what="both records cleaned away")
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    kc = KafkaConsumer(bootstrap_servers=b.bootstrap, enable_auto_commit=False)
    try:
        kc.assign([KTP("dgone", 0)])
        kc.seek(KTP("dgone", 0), 0)
        deadline = time.monotonic() + 20
        got = []
        while time.monotonic() < deadline and kc.position(KTP("dgone", 0)) != 2:
            got += [m for ms in kc.poll(timeout_ms=200).values() for m in ms]
        assert got == [] and kc.position(KTP("dgone", 0)) == 2
    finally:
        kc.close()


def test_only_the_controller_compacts_in_a_cluster_on_postgresql(broker_factory, pg_database, tmp_path):  # noqa: ANN001, F811
    """Two brokers on one PostgreSQL coordinator and one object store, producing through both:
    the partition is compacted as modelled, by the controller alone."""
    from confluent_kafka.admin import AdminClient

    from tests.test_cluster_state import FAST as CLUSTER_FAST

    configs = {**CLUSTER_FAST, **CLEANER}
    brokers = [broker_factory(configs, name=f"node{i}", extra_args=[
        "--cluster", pg_database, "--node-id", str(i), "--rack", f"rack-{i}", "--object-store",
        (tmp_path / "objects").as_uri()]) for i in (1, 2)]
    wait_until(lambda: len(AdminClient({"bootstrap.servers": brokers[0].bootstrap}).list_topics(timeout=10).brokers)
               == 2, timeout=20, what="both brokers registered")
    create_topic(brokers[0].bootstrap, "dcluster", 1, COMPACT)
    wait_until(lambda: "dcluster" in AdminClient({"bootstrap.servers": brokers[1].bootstrap}).list_topics(
        timeout=10).topics, timeout=20, what="broker 2 to learn the topic")
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for round_ in range(4):
        b = brokers[round_ % 2]
        keys = [b"key-%03d" % ((i * 7 + round_) % 100) for i in range(1000)]
        values = [None if i % 37 == 0 else b"v-%d-%d" % (round_, i) for i in range(1000)]
        for key, value, (_p, offset) in zip(keys, values, produce(b.bootstrap, "dcluster", values, keys=keys,
                                                                   partition=0)):
            latest[key] = (offset, value)
    produce(brokers[1].bootstrap, "dcluster", [b"end"], keys=[END_KEY], partition=0)
    for b in brokers:  # both serve the compacted partition
        wait_until(lambda b=b: _compacted_as_modelled(_read_partition(b.bootstrap, "dcluster"), latest,
                                                      tombstones=False),
                   timeout=120, interval=1.0, what=f"the partition compacted, read through {b.bootstrap}")
    runs = [int(broker_metrics(b.bootstrap)["counters"].get("diskless.log.cleaner.runs", 0)) for b in brokers]
    assert sorted(runs)[0] == 0 and sorted(runs)[1] >= 1, runs  # one broker, the controller, cleaned


def test_one_partition_whose_cleaning_fails_does_not_stop_the_others(tmp_path: Path) -> None:
    """The WAL objects of one compacted topic vanish from the store: its passes fail (logged once,
    backed off, counted), the other topic is compacted all the same."""
    b = BrokerProcess(tmp_path / "data", {**CLEANER, "diskless.fetch.cache.max.bytes": "0"}).start()
    try:
        # Not cleanable until the objects are gone: the first records are all dirty (ratio 1.0),
        # so a pass would otherwise rewrite them before the test removes them.
        held = {**COMPACT, "min.cleanable.dirty.ratio": "0.9", "min.compaction.lag.ms": "3600000"}
        for name in ("dbad", "dgood"):
            create_topic(b.bootstrap, name, 1, held)
        for name in ("dbad", "dgood"):  # one produce each: objects are not shared between the topics
            produce(b.bootstrap, name, [b"1", b"2"], keys=[b"k", b"k"], partition=0)
        with _coordinator(b.data_dir) as coord:
            (bad,) = [i.topic_id_partition for i in coord.describe_logs() if i.topic_id_partition.topic == "dbad"]
            keys = {x.object_key for x in coord.find_batches([FindBatchRequest(bad, 0, 1 << 30)], 1 << 30)[0].batches}
        for key in keys:
            (b.data_dir / "objects" / key).unlink()
        for name in ("dbad", "dgood"):  # now due: dirty ratio 1.0 >= 0.9, no lag
            produce(b.bootstrap, name, [b"3"], keys=[END_KEY], partition=0)
        from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        for name in ("dbad", "dgood"):
            res = ConfigResource(ResourceType.TOPIC, name, set_config={**held, "min.compaction.lag.ms": "0"})
            admin.alter_configs([res])[res].result(20)
        wait_until(lambda: _read_partition(b.bootstrap, "dgood") == [(1, b"k", b"2"), (2, END_KEY, b"3")],
                   timeout=60, interval=0.5, what="the good topic compacted")
        failures = broker_metrics(b.bootstrap)["counters"].get("background.task.failures{task=diskless-log-cleaner}", 0)
        assert failures >= 1, b.log_text()[-4000:]
        assert b.log_text().count("diskless-log-cleaner of dbad-0 failed") == 1, b.log_text()[-3000:]
    finally:
        b.stop()


def test_a_pass_rewrites_in_groups_of_at_most_segment_bytes(dbroker: BrokerProcess) -> None:
    """Each rewritten object holds at most segment.bytes of the old batches (Kafka's grouping),
    so neither memory nor object size grows with the partition."""
    import re

    b = dbroker
    create_topic(b.bootstrap, "dgroups", 1, {**COMPACT, "segment.bytes": "4096"})
    keys = [b"key-%02d" % (i % 20) for i in range(3000)]
    values = [b"value-%05d" % i for i in range(3000)]
    acks = produce(b.bootstrap, "dgroups", values, keys=keys, partition=0, **{"batch.size": 1000})
    latest = {k: (o, v) for k, v, (_p, o) in zip(keys, values, acks)}
    produce(b.bootstrap, "dgroups", [b"end"], keys=[END_KEY], partition=0)
    wait_until(lambda: _compacted_as_modelled(_read_partition(b.bootstrap, "dgroups"), latest, tombstones=True),
               timeout=90, interval=0.5, what="dgroups compacted as modelled")
    swaps = [(int(written), int(read)) for written, read in
             re.findall(r"dgroups-0: compacted offsets \d+\.\.\d+ into WAL object \S+ \((\d+) bytes from (\d+)\)",
                        b.log_text())]
    assert len(swaps) >= 2, swaps
    assert all(read <= 4096 and written <= 4097 for written, read in swaps), swaps  # + the version byte


def test_a_fetch_holding_old_coordinates_still_reads_the_replaced_object(tmp_path: Path) -> None:
    """Coordinates found just before a swap stay readable: the replaced object is only marked, and
    the broker's file cleaner deletes it once the grace period since the swap has passed (real
    SQLite coordinator, local object store, FileCleaner)."""
    import asyncio
    import uuid
    from concurrent.futures import ThreadPoolExecutor

    from kcli.broker.metrics import Metrics
    from kcli.diskless.cleaner import FileCleaner
    from kcli.diskless.wal import WalBuilder, commit_batch_requests
    from kcli.dumplog.synth import build_batch
    from plugins.coordinator.base import BatchMetadata, CreateTopicAndPartitionsRequest, TopicIdPartition
    from plugins.objectstore.base import ByteRange
    from plugins.objectstore.local import LocalObjectStorage

    storage = LocalObjectStorage(tmp_path / "objects")
    coord = SqliteBatchCoordinator(tmp_path / "coordinator.db")
    tip = TopicIdPartition(uuid.uuid4(), "t", 0)
    coord.create_topic_and_partitions([CreateTopicAndPartitionsRequest(tip.topic_id, "t", 1)])
    builder = WalBuilder()
    for i in range(3):
        builder.add(tip, build_batch([(b"k", b"v%d" % i, [])], 0))
    data, refs = builder.build()
    storage.upload("wal/old", data, len(data))
    coord.commit_file("wal/old", 1, len(data), commit_batch_requests(refs))
    old = coord.find_batches([FindBatchRequest(tip, 0, 1 << 20)], 1 << 20)[0].batches  # a fetch's coordinates
    last = old[-1]
    rewritten = bytes(data[last.metadata.byte_offset:last.metadata.byte_offset + last.metadata.byte_size])
    storage.upload("wal/new", b"\x00" + rewritten, 1 + len(rewritten))
    coord.register_upload_intent("wal/new", 1, 0)
    md = last.metadata
    swap_ms = int(time.time() * 1000)
    assert coord.replace_batches(tip, old, "wal/new", 1, 1 + len(rewritten), [BatchMetadata(
        tip, 1, md.byte_size, md.base_offset, md.last_offset, md.log_append_timestamp, md.batch_max_timestamp,
        md.timestamp_type, md.producer_id, md.producer_epoch, md.base_sequence, md.last_sequence)], swap_ms)
    grace = 60_000
    with ThreadPoolExecutor(2) as io, ThreadPoolExecutor(1) as cp:
        cleaner = FileCleaner(storage=storage, coordinator=coord, io_pool=io, coordinator_pool=cp, metrics=Metrics(),
                              grace_ms=grace, in_flight_keys=set, on_deleted=lambda keys: None)
        report = asyncio.run(cleaner.run_once(orphans=False, now_ms=swap_ms + grace - 1))
        assert report.waiting == ["wal/old"] and report.deleted == []
        for b in old:  # the fetch that found the old coordinates reads them all
            got = storage.fetch("wal/old", ByteRange(b.metadata.byte_offset, b.metadata.byte_size))
            assert got == data[b.metadata.byte_offset:b.metadata.byte_offset + b.metadata.byte_size]
        report = asyncio.run(cleaner.run_once(orphans=False, now_ms=swap_ms + grace))
        assert report.deleted == ["wal/old"]
    assert [p.name for p in (tmp_path / "objects" / "wal").iterdir()] == ["new"]
    coord.close()
