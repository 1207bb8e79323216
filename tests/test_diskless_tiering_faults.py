"""Crash windows of moving diskless data to tiered storage (issue #27 "Bad input and faults").

A real broker process is killed with SIGKILL inside each window of the move, held open by a
named pause point (kcli/faults.py), then restarted:

* ``tiered.copy.uploaded``: the segment's bytes are in the remote store, its RLMM state is still
  COPY_SEGMENT_STARTED;
* ``diskless.tiering.trim``: the copies are COPY_SEGMENT_FINISHED, the coordinator's DeleteRecords
  has not run;
* ``diskless.delete.records``: inside the batch coordinator's DeleteRecords transaction.

After each, every acknowledged record is read exactly once, in order, from offset 0 (remote tier,
then WAL: tests/history.py checks), and the remote segments stay disjoint and contiguous (nothing
copied twice, no gap). One broker process, configured with every point, serves the module; the
switch file names the one point each test arms (kcli/faults.py).

A replica whose download fails (the store cannot return an object) stays out of the ISR, never
serves what it could not verify, and retries; the other partitions go on.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from kcli.diskless import admin_api
from kcli.protocol.client import WireClient

from plugins.coordinator.sqlite import SqliteBatchCoordinator
from tests.brokerproc import BrokerProcess
from tests.diskless_helpers import admin, wait_until
from tests.history import Ack, History, read_all
from tests.kafka_helpers import create_topic
from tests.test_diskless_tiering import BROKER, TOPIC, S, assert_contiguous, list_offset, segments

PAUSE_MS = "30000"
POINTS = ("tiered.copy.uploaded", "diskless.tiering.trim", "diskless.delete.records")


@pytest.fixture(scope="module")
def fbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("tiering-faults")
    b = BrokerProcess(root / "data", {**BROKER, "remote.log.manager.task.interval.ms": "100",
                                      **{f"kcli.fault.{p}.pause.ms": PAUSE_MS for p in POINTS},
                                      "kcli.fault.switch.file": str(root / "arm")}).start()
    b.switch = root / "arm"  # type: ignore[attr-defined]
    try:
        yield b
    finally:
        b.stop()


def _produce(history: History, bootstrap: str, topic: str, name: str, start: int, count: int,
             strict: bool = True) -> None:
    """``count`` records, each acknowledgement (or failure, when not ``strict``) recorded in ``history``."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 2, "batch.size": 4000,
                  "message.timeout.ms": 30000 if strict else 8000})

    def report(seq: int, value: bytes):  # noqa: ANN202
        def done(err, msg) -> None:  # noqa: ANN001
            if err is None:
                history.record_ack(Ack(name, seq, msg.partition(), msg.offset(), value, time.monotonic()))
            else:
                history.record_failure(name, seq, err)
        return done

    for seq in range(start, start + count):
        value = b"%s-%06d-" % (name.encode(), seq) + b"x" * 80
        while True:
            try:
                p.produce(topic, value, partition=0, on_delivery=report(seq, value))
                break
            except BufferError:
                p.poll(0.05)
    left = p.flush(30)
    if strict:
        mine = [f for f in history.failures if f[0] == name]
        assert left == 0 and not mine, mine[:3]


def _coordinator_log_start(data_dir: Path, topic: str) -> int:
    coord = SqliteBatchCoordinator(data_dir / "diskless" / "coordinator.db", read_only=True)
    try:
        (info,) = [i for i in coord.describe_logs() if i.topic_id_partition.topic == topic]
        return int(info.log_start_offset)
    finally:
        coord.close()


def _kill_inside(b: BrokerProcess, point: str, history: History, topic: str) -> None:
    """Arm the point, produce until the broker is inside it, SIGKILL it there."""
    line = f"kcli fault point {point}: pausing"
    seen = b.log_text().count(line)
    b.switch.write_text(point)  # type: ignore[attr-defined] - only this window's point
    # a point may hold the event loop: what the kill leaves unacknowledged is a failure (read or not)
    producer = threading.Thread(target=_produce, args=(history, b.bootstrap, topic, "mid", 0, 300, False))
    producer.start()
    try:
        wait_until(lambda: b.log_text().count(line) > seen, timeout=45, what=f"the broker inside {point}")
    finally:
        b.kill9()
        b.switch.unlink()  # type: ignore[attr-defined]
        producer.join(40)


def _check_once(b: BrokerProcess, history: History, topic: str) -> None:
    summary = history.check(read_all(b.bootstrap, topic, 1, timeout_s=30))
    assert summary, summary
    assert_contiguous(segments(b.data_dir, topic))  # nothing copied twice, no gap


def _run_to_end(b: BrokerProcess, history: History, topic: str) -> None:
    """After the restart: more records, the move resumes, and everything is read once."""
    b.start()
    _produce(history, b.bootstrap, topic, "after", 0, 200)
    _check_once(b, history, topic)
    end = list_offset(b.bootstrap, topic, -1)  # the active staging segment (~70 records) is never copied
    wait_until(lambda: (s := segments(b.data_dir, topic)) and s[-1].end_offset >= end - 150, timeout=20,
               what="copies to resume after the restart")
    wait_until(lambda: list_offset(b.bootstrap, topic, -4) > end - 250, timeout=20,
               what="the WAL trimmed after the restart")
    _check_once(b, history, topic)


def _prefill(b: BrokerProcess, history: History, topic: str) -> None:
    if not b.alive():  # an earlier window's test failed between its kill and its restart
        b.start()
    create_topic(b.bootstrap, topic, 1, TOPIC)
    _produce(history, b.bootstrap, topic, "p", 0, 250)  # copied and trimmed at full speed until the switch


def test_kill_after_the_remote_copy_before_copy_segment_finished(fbroker: BrokerProcess) -> None:
    b, topic, history = fbroker, "win-copied", History()
    _prefill(b, history, topic)
    _kill_inside(b, "tiered.copy.uploaded", history, topic)
    started = segments(b.data_dir, topic, states=(S.COPY_SEGMENT_STARTED,))
    assert len(started) == 1, started  # the killed copy: uploaded, never FINISHED
    assert _coordinator_log_start(b.data_dir, topic) <= started[0].start_offset  # its batches are still in the WAL
    _run_to_end(b, history, topic)
    wait_until(lambda: not segments(b.data_dir, topic, states=(S.COPY_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED)),
               what="the unfinished copy deleted")
    finished = segments(b.data_dir, topic)
    assert started[0].segment_id.id not in {s.segment_id.id for s in finished}  # never trusted...
    assert [s.start_offset for s in finished].count(started[0].start_offset) == 1  # ...copied again once


def test_kill_after_copy_segment_finished_before_the_coordinator_deletion(fbroker: BrokerProcess) -> None:
    b, topic, history = fbroker, "win-finished", History()
    _prefill(b, history, topic)
    _kill_inside(b, "diskless.tiering.trim", history, topic)
    finished = segments(b.data_dir, topic)
    assert not segments(b.data_dir, topic, states=(S.COPY_SEGMENT_STARTED,))
    start = _coordinator_log_start(b.data_dir, topic)
    assert finished[-1].end_offset >= start  # copied and FINISHED, still in the WAL too: read once all the same
    _run_to_end(b, history, topic)
    assert _coordinator_log_start(b.data_dir, topic) > start


def test_kill_during_the_coordinator_deletion(fbroker: BrokerProcess) -> None:
    b, topic, history = fbroker, "win-deleting", History()
    _prefill(b, history, topic)
    before = _coordinator_log_start(b.data_dir, topic)
    _kill_inside(b, "diskless.delete.records", history, topic)
    start = _coordinator_log_start(b.data_dir, topic)  # the transaction rolled back as a whole
    finished = segments(b.data_dir, topic)
    assert start >= before and finished[-1].end_offset >= start  # the killed deletion's range is still in the WAL
    _run_to_end(b, history, topic)
    assert _coordinator_log_start(b.data_dir, topic) > start


# ---- a replica whose download fails: out of the ISR, retried, never serves what it could not read ---
def _isr(bootstrap: str, topic: str, partition: int) -> list[int]:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return sorted(md.topics[topic].partitions[partition].isrs)


def _own_cache(bootstrap: str, topic: str, partition: int) -> dict[str, Any]:
    doc = admin(bootstrap, admin_api.DISKLESS_DESCRIBE_KEY, {"topics": [topic], "replicas": True})
    return next(p for p in doc["topics"][0]["partitions"] if p["partition"] == partition)["replica_caches"][0]


def _fetch(bootstrap: str, topic: str, partition: int, offset: int) -> tuple[int, bytes]:
    with WireClient(bootstrap, timeout=20) as client:
        resp = client.request(1, 4, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
            "topics": [{"topic": topic, "partitions": [
                {"partition": partition, "fetch_offset": offset, "partition_max_bytes": 1 << 20}]}]})
    part = resp.responses[0].partitions[0]
    return int(part.error_code), bytes(part.records or b"")


def test_store_error_keeps_the_replica_out_of_the_isr_and_it_retries(fbroker: BrokerProcess) -> None:
    """A WAL object the store cannot return (gone from the file store while the broker is down, its
    replica cache deleted): that partition's replica stays out of the ISR, a fetch of it is an
    error (never records it could not verify), the other partition fills and stays in the ISR; once
    the object is back the replica retries, fills and rejoins the ISR."""
    b, topic = fbroker, "dl-fail"
    if not b.alive():  # an earlier window's test failed between its kill and its restart
        b.start()
    create_topic(b.bootstrap, topic, 2, {"diskless.enable": "true"})
    history = History()
    _produce(history, b.bootstrap, topic, "p", 0, 30)  # partition 0, its own WAL objects
    time.sleep(0.3)
    p1 = Producer({"bootstrap.servers": b.bootstrap})
    p1.produce(topic, b"other", partition=1)
    assert p1.flush(20) == 0
    wait_until(lambda: _own_cache(b.bootstrap, topic, 0)["log_end_offset"] == 30, what="partition 0 cached")
    objects = admin(b.bootstrap, admin_api.DISKLESS_OBJECTS_KEY, {"topic": topic, "batches": True})["objects"]
    keys = {o["object_key"] for o in objects for x in o["batches"] if x["topic"] == topic and x["partition"] == 0}
    assert keys and not keys & {o["object_key"] for o in objects for x in o["batches"]
                                if x["topic"] == topic and x["partition"] == 1}
    b.stop()
    shutil.rmtree(b.data_dir / "diskless-cache" / f"{topic}-0")  # a new replica: it fills from the store
    hidden = b.data_dir.parent / "hidden-objects"
    hidden.mkdir(exist_ok=True)
    for k in keys:
        (b.data_dir / "objects" / k).rename(hidden / k.replace("/", "_"))
    b.start()
    wait_until(lambda: _own_cache(b.bootstrap, topic, 1)["log_end_offset"] == 1, what="partition 1 cached")
    assert _isr(b.bootstrap, topic, 1) == [1]  # one failing partition does not stop the others
    time.sleep(0.5)  # fill rounds, each failing
    cache = _own_cache(b.bootstrap, topic, 0)
    assert not cache["in_sync"] and (cache["log_end_offset"] or 0) < 30, cache
    assert _isr(b.bootstrap, topic, 0) == []
    err, records = _fetch(b.bootstrap, topic, 0, 0)
    assert err != 0 and records == b"", (err, records[:40])  # nothing it could not read and verify
    for k in keys:
        (hidden / k.replace("/", "_")).rename(b.data_dir / "objects" / k)
    wait_until(lambda: _own_cache(b.bootstrap, topic, 0)["log_end_offset"] == 30, what="the retried fill")
    wait_until(lambda: _isr(b.bootstrap, topic, 0) == [1], 10, what="the replica back in the ISR")
    assert _fetch(b.bootstrap, topic, 0, 0)[0] == 0
    history.check([r for r in read_all(b.bootstrap, topic, 2, timeout_s=20) if r[0] == 0])
