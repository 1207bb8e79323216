"""Tiered storage (KIP-405) and its disablement (KIP-950) on real broker processes.

Small segment.bytes make many segments roll; short task intervals keep each test to seconds.
Remote objects are checked where they live (the broker's file object store, or a moto S3
server), remote metadata through the broker's own persisted event file.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import boto3
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from kcli.ops import tiering
from kcli.ops.connection import Connection
from kcli.protocol.client import WireClient
from kcli.tiered import metadata as rlmm
from plugins.objectstore.local import LocalObjectStorage
from plugins.rsm.base import (
    IndexType,
    LogSegmentData,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemoteResourceNotFoundException,
    RemoteStorageException,
)
from plugins.rsm.object_store import ObjectStoreRemoteStorageManager, kafka_uuid
from tests.diskless_helpers import wait_until as poll_until
from tests.fixtures_cli import assert_one_line_error, cli_env, run_kcli  # noqa: F401
from tests.fixtures_s3 import _moto_admin, moto_server, s3_bucket, s3_env  # noqa: F401
from tests.kafka_helpers import admin, create_topic

TIERED_BROKER = {
    "remote.log.storage.system.enable": "true",
    "remote.log.manager.task.interval.ms": "200",
    "log.retention.check.interval.ms": "200",
    "group.initial.rebalance.delay.ms": "0",
}
SEGMENT_BYTES = 8192
LOCAL_RETENTION = 20000
TIERED_TOPIC = {"remote.storage.enable": "true", "segment.bytes": str(SEGMENT_BYTES),
                "local.retention.bytes": str(LOCAL_RETENTION)}
BASE_TS = int(time.time() * 1000) - 3_600_000  # an hour ago: well inside the default retention.ms
S = RemoteLogSegmentState


# ---- helpers ------------------------------------------------------------------------------------
def value(i: int) -> bytes:
    return b"message-%06d-" % i + b"x" * 80


def fill(bootstrap: str, topic: str, start: int, count: int) -> None:
    """Produce messages start..start+count-1 with timestamps BASE_TS + i, small batches."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "batch.size": 4000})
    errors: list[Any] = []
    for i in range(start, start + count):
        while True:
            try:
                p.produce(topic, value(i), timestamp=BASE_TS + i,
                          on_delivery=lambda err, _m: errors.append(err) if err else None)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(30) == 0 and not errors, errors[:3]


def wait_until(what: str, check: Callable[[], Any], timeout: float = 20.0) -> Any:
    return poll_until(check, timeout, what=what)


def list_offset(bootstrap: str, topic: str, timestamp: int) -> int:
    """ListOffsets v9, which knows EARLIEST_LOCAL (-4) and LATEST_TIERED (-5)."""
    with WireClient(bootstrap) as c:
        resp = c.request(2, 9, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": timestamp}]}]})
    part = resp.topics[0].partitions[0]
    assert part.error_code == 0, part
    return int(part.offset)


def kcli_state(bootstrap: str, topic: str) -> dict[str, str]:
    a = admin(bootstrap)
    res = ConfigResource(ResourceType.TOPIC, topic)
    entries = a.describe_configs([res])[res].result(20)
    return {k: e.value for k, e in entries.items() if k.startswith("kcli.tiered.")}


def wait_state(bootstrap: str, topic: str, state: str, timeout: float = 20.0) -> dict[str, str]:
    return wait_until(f"tiered state {state}",
                      lambda: (lambda s: s if s.get("kcli.tiered.state") == state else None)(kcli_state(bootstrap, topic)),
                      timeout)


def remote_segments(data_dir: Path, states: tuple[S, ...] = (S.COPY_SEGMENT_FINISHED,)) -> list[RemoteLogSegmentMetadata]:
    return rlmm.load(data_dir).all_segments(states=states)


def remote_files(data_dir: Path) -> list[Path]:
    root = data_dir / "objects" / "tiered"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def local_log_bytes(data_dir: Path, topic: str) -> int:
    return sum(p.stat().st_size for p in (data_dir / f"{topic}-0").glob("*.log"))


def consume_values(bootstrap: str, topic: str, start: int, expected: int, timeout: float = 20.0) -> list[tuple[int, bytes]]:
    """(offset, value) of ``expected`` messages from ``start`` with an assigned confluent consumer."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "max.partition.fetch.bytes": 16384})
    c.assign([TopicPartition(topic, 0, start)])
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
    finally:
        c.close()
    return out


def alter(bootstrap: str, topic: str, sets: dict[str, str], validate_only: bool = False) -> None:
    a = admin(bootstrap)
    ops = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in sets.items()]
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=ops)
    for fut in a.incremental_alter_configs([res], validate_only=validate_only).values():
        fut.result(20)


def alter_error(bootstrap: str, topic: str, sets: dict[str, str]) -> tuple[int, str]:
    with pytest.raises(KafkaException) as info:
        alter(bootstrap, topic, sets)
    err = info.value.args[0]
    return err.code(), err.str()


def wait_copied(b: Any, topic: str) -> int:
    """Wait until every rolled segment is in the remote tier; returns the latest tiered offset."""
    def done() -> int | None:
        active = max(int(p.name[:20]) for p in (b.data_dir / f"{topic}-0").glob("*.log"))
        tiered = list_offset(b.bootstrap, topic, -5)
        return tiered + 1 if tiered == active - 1 else None
    return wait_until("every rolled segment to be copied", done) - 1


def tiered_topic(b: Any, name: str, messages: int, min_remote: int = 3, **extra: str) -> None:
    create_topic(b.bootstrap, name, 1, {**TIERED_TOPIC, **extra})
    fill(b.bootstrap, name, 0, messages)
    wait_until(f"{min_remote} remote segments", lambda: len(remote_segments(b.data_dir)) >= min_remote)


# ---- KIP-405: copy, local retention, remote reads ------------------------------------------------
def test_segments_tier_remote_reads_and_retention(broker_factory):
    b = broker_factory(TIERED_BROKER)
    create_topic(b.bootstrap, "orders", 1, TIERED_TOPIC)
    fill(b.bootstrap, "orders", 0, 600)

    # rolled segments are copied with their indexes, then local retention shrinks the local log
    wait_until("local log to shrink to local retention",
               lambda: list_offset(b.bootstrap, "orders", -4) > 0
               and local_log_bytes(b.data_dir, "orders") < LOCAL_RETENTION + SEGMENT_BYTES)
    segs = remote_segments(b.data_dir)
    assert len(segs) >= 4 and all(s.tiered_epoch == 0 for s in segs)
    names = {p.name for p in remote_files(b.data_dir)}
    for s in segs:
        for suffix in ("log", "index", "timeindex", "leader-epoch-checkpoint"):
            assert any(n.startswith(f"{s.start_offset:020d}-") and n.endswith("." + suffix) for n in names), (s, suffix)
    local_start = list_offset(b.bootstrap, "orders", -4)
    assert list_offset(b.bootstrap, "orders", -2) == 0  # earliest: the remote tier still has offset 0
    assert local_start - 1 <= list_offset(b.bootstrap, "orders", -5) < 600  # LATEST_TIERED
    assert local_start == min(int(p.name[:20]) for p in (b.data_dir / "orders-0").glob("*.log"))

    # a consumer from the beginning reads everything: remote segments, then the local log
    got = consume_values(b.bootstrap, "orders", 0, 600)
    assert got == [(i, value(i)) for i in range(600)]
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    kc = KafkaConsumer(bootstrap_servers=b.bootstrap, enable_auto_commit=False, consumer_timeout_ms=10000,
                       max_partition_fetch_bytes=16384)
    kc.assign([KTP("orders", 0)])
    kc.seek_to_beginning()
    kvalues = []
    for m in kc:
        kvalues.append((m.offset, m.value))
        if len(kvalues) == 600:
            break
    kc.close()
    assert kvalues == [(i, value(i)) for i in range(600)]

    # timestamp lookups are answered from the remote time index
    a = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "ts"})
    [tp] = a.offsets_for_times([TopicPartition("orders", 0, BASE_TS + 7)], timeout=20)
    a.close()
    assert tp.offset == 7 < local_start

    # remote metadata survives a restart: the same data is still served from the remote tier
    b.restart()
    assert list_offset(b.bootstrap, "orders", -2) == 0
    assert list_offset(b.bootstrap, "orders", -4) >= local_start
    assert consume_values(b.bootstrap, "orders", 0, 600) == [(i, value(i)) for i in range(600)]

    # total retention: with retention.bytes=40000 (remote + not-yet-copied local) old remote segments expire
    wait_copied(b, "orders")
    before = remote_segments(b.data_dir)
    alter(b.bootstrap, "orders", {"retention.bytes": "40000"})
    wait_until("remote expiry", lambda: list_offset(b.bootstrap, "orders", -2) > 0)
    time.sleep(0.5)  # let the round that moved the log start finish its deletes
    after = remote_segments(b.data_dir)
    start = list_offset(b.bootstrap, "orders", -2)
    assert after and after[0].start_offset == start and all(s.end_offset >= start for s in after)
    total = sum(s.segment_size_in_bytes for s in after) + sum(
        p.stat().st_size for p in (b.data_dir / "orders-0").glob("*.log") if int(p.name[:20]) > after[-1].end_offset)
    assert total < 40000 + SEGMENT_BYTES  # Kafka's rule: delete a segment only if the rest still fills the limit
    expired = {s.segment_id.id for s in before} - {s.segment_id.id for s in after}
    names = " ".join(p.name for p in remote_files(b.data_dir))
    assert expired and not any(kafka_uuid(sid) in names for sid in expired)
    got = consume_values(b.bootstrap, "orders", 0, 600 - start)  # out of range: reset to the new earliest
    assert got == [(i, value(i)) for i in range(start, 600)]


# ---- KIP-950 ------------------------------------------------------------------------------------
def test_disable_retain_then_reenable_with_new_epoch(broker_factory, cli_env):  # noqa: F811
    b = broker_factory(TIERED_BROKER)
    tiered_topic(b, "retained", 600)
    kcli = lambda *args: run_kcli(cli_env, "-b", b.bootstrap, *args)  # noqa: E731
    wait_copied(b, "retained")
    wait_until("local log start to move", lambda: list_offset(b.bootstrap, "retained", -4) > 0)

    assert kcli_state(b.bootstrap, "retained")["kcli.tiered.epoch"] == "0"
    dry = kcli("topics", "alter", "--topic", "retained", "--disable-tiering", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    segs, size = kcli_state(b.bootstrap, "retained")["kcli.tiered.remote.segments"], \
        kcli_state(b.bootstrap, "retained")["kcli.tiered.remote.bytes"]
    assert dry.stdout.startswith("Would disable tiering on topic retained (policy retain): "
                                 "remote.storage.enable=false,remote.log.disable.policy=retain\n"), dry.stdout
    assert f"{segs} remote segment(s), {size} bytes stay readable" in dry.stdout
    assert kcli_state(b.bootstrap, "retained")["kcli.tiered.state"] == "ENABLED"  # nothing changed

    done = kcli("topics", "alter", "--topic", "retained", "--disable-tiering")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Disabling tiering on topic retained (policy retain)"), done.stdout
    wait_state(b.bootstrap, "retained", "DISABLED")
    described = kcli("topics", "describe", "--topic", "retained")
    assert described.returncode == 0, described.stderr
    assert "\tTieredState: DISABLED\tTieredEpoch: 1" in described.stdout.splitlines()[0], described.stdout
    assert "kcli.tiered" not in described.stdout  # state is shown as state, not as configs
    copied = remote_segments(b.data_dir)
    fill(b.bootstrap, "retained", 600, 200)  # no longer copied...
    time.sleep(1.0)
    assert {s.segment_id.id for s in remote_segments(b.data_dir)} == {s.segment_id.id for s in copied}
    # ...and the tiered data stays readable
    assert list_offset(b.bootstrap, "retained", -2) == 0
    assert consume_values(b.bootstrap, "retained", 0, 800) == [(i, value(i)) for i in range(800)]

    again = kcli("-o", "json", "topics", "alter", "--topic", "retained", "--enable-tiering")
    assert again.returncode == 0, again.stderr
    result = json.loads(again.stdout)
    assert result["set_configs"] == {"remote.storage.enable": "true"} and result["tiered_epoch"] == 2
    assert result["delete_configs"] == ["remote.log.disable.policy"]  # no stale policy for the next disable
    wait_state(b.bootstrap, "retained", "ENABLED")
    assert kcli_state(b.bootstrap, "retained")["kcli.tiered.epoch"] == "2"
    fill(b.bootstrap, "retained", 800, 200)
    wait_until("copies with the new epoch", lambda: any(s.tiered_epoch == 2 for s in remote_segments(b.data_dir)))
    newer = [s for s in remote_segments(b.data_dir) if s.tiered_epoch == 2]
    assert min(s.start_offset for s in newer) > max(s.end_offset for s in copied)  # resumed after the old tier
    assert consume_values(b.bootstrap, "retained", 0, 1000) == [(i, value(i)) for i in range(1000)]

    a = admin(b.bootstrap)  # deleting the topic deletes its remote data (both epochs) too
    a.delete_topics(["retained"])["retained"].result(20)
    # the files go first, then each segment's DELETE_SEGMENT_FINISHED record: wait for both
    wait_until("remote data of the deleted topic to go", lambda: not remote_files(b.data_dir) and remote_segments(
        b.data_dir, (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED)) == [])


def test_disable_delete_in_progress_error_and_bad_policy(broker_factory, cli_env):  # noqa: F811
    b = broker_factory({**TIERED_BROKER, "kcli.fault.remote.log.disable.delay.ms": "60000"})  # held DISABLING
    tiered_topic(b, "purged", 600)
    wait_copied(b, "purged")
    wait_until("local log start to move", lambda: list_offset(b.bootstrap, "purged", -4) > 0)

    code, message = alter_error(b.bootstrap, "purged", {"remote.storage.enable": "false",
                                                        "remote.log.disable.policy": "archive"})
    assert code == 42 and "retain, delete" in message  # INVALID_REQUEST naming the choices
    bad = run_kcli(cli_env, "-b", b.bootstrap, "topics", "alter", "--topic", "purged", "--disable-tiering",
                   "--policy", "archive")
    # the CLI refuses it first: --policy is a choice (a usage error, exit 2); the broker's check is above
    assert_one_line_error(bad, 2, "'archive' is not one of 'retain', 'delete'")

    conn = Connection(b.bootstrap)
    dry = tiering.disable_tiering(conn, "purged", "delete", dry_run=True)
    assert not dry.done and "will be deleted" in dry.effect and dry.remote_segments == len(remote_segments(b.data_dir))
    assert kcli_state(b.bootstrap, "purged")["kcli.tiered.state"] == "ENABLED"

    change = tiering.disable_tiering(conn, "purged", "delete")
    assert change.done and (change.tiered_state, change.tiered_epoch) == ("DISABLING", 1)
    code, message = alter_error(b.bootstrap, "purged", {"remote.storage.enable": "false",
                                                        "remote.log.disable.policy": "retain"})
    assert code == 200 and "in progress" in message  # TIERED_STORAGE_DISABLEMENT_IN_PROGRESS
    code, _ = alter_error(b.bootstrap, "purged", {"remote.storage.enable": "true"})
    assert code == 200  # re-enabling waits for the disablement too
    alter(b.bootstrap, "purged", {"retention.ms": "86400000"})  # other configs may change meanwhile
    second = run_kcli(cli_env, "-b", b.bootstrap, "topics", "alter", "--topic", "purged", "--disable-tiering")
    assert_one_line_error(second, 1, "TIERED_STORAGE_DISABLEMENT_IN_PROGRESS")

    local_start = list_offset(b.bootstrap, "purged", -4)
    assert kcli_state(b.bootstrap, "purged")["kcli.tiered.state"] == "DISABLING"
    b.configs.pop("kcli.fault.remote.log.disable.delay.ms")
    b.restart()  # a clean restart resumes the disablement too, now without the hold
    tiering.wait_for_state(Connection(b.bootstrap), "purged", "DISABLED", 20)
    assert list_offset(b.bootstrap, "purged", -2) == local_start  # log start moved to the local log start
    assert remote_segments(b.data_dir, (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED)) == []
    assert remote_files(b.data_dir) == []
    got = consume_values(b.bootstrap, "purged", 0, 600 - local_start)
    assert got == [(i, value(i)) for i in range(local_start, 600)]


def test_kill9_while_disabling_finishes_after_restart_on_s3(broker_factory, s3_bucket):  # noqa: F811
    configs = {**TIERED_BROKER, "kcli.fault.remote.log.disable.delay.ms": "30000"}
    b = broker_factory(configs, extra_args=["--object-store", f"s3://{s3_bucket}/cluster"])
    tiered_topic(b, "crashy", 400)
    s3 = boto3.client("s3")
    marker = "cluster/kcli-cluster.json"  # the prefix's owner (docs/reliability.md), not tiered data
    keys = lambda: [o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket).get("Contents", [])  # noqa: E731
                    if o["Key"] != marker]
    assert keys() and all(k.startswith("cluster/tiered/crashy-") for k in keys())

    alter(b.bootstrap, "crashy", {"remote.storage.enable": "false", "remote.log.disable.policy": "delete"})
    assert kcli_state(b.bootstrap, "crashy")["kcli.tiered.state"] == "DISABLING"
    b.kill9()
    b.configs.pop("kcli.fault.remote.log.disable.delay.ms")
    b.start()
    state = wait_state(b.bootstrap, "crashy", "DISABLED")
    assert state["kcli.tiered.epoch"] == "1" and state["kcli.tiered.remote.segments"] == "0"
    assert keys() == []
    assert list_offset(b.bootstrap, "crashy", -2) == list_offset(b.bootstrap, "crashy", -4)


def test_kafka_39_configs_and_messages(broker_factory):
    b = broker_factory(TIERED_BROKER)
    tiered_topic(b, "k39", 400)
    code, message = alter_error(b.bootstrap, "k39", {"remote.storage.enable": "false",
                                                     "remote.log.delete.on.disable": "false"})
    assert code == 40 and message.startswith("It is invalid to disable remote storage without deleting remote data.")
    code, message = alter_error(b.bootstrap, "k39", {"remote.log.copy.disable": "true"})
    assert code == 40 and message == ("When `remote.log.copy.disable` is set to true, the `local.retention.bytes` and "
                                      "`retention.bytes` must be set to the identical value because there will be "
                                      "no more logs copied to the remote storage.")

    conn = Connection(b.bootstrap)
    wait_copied(b, "k39")  # no copy in flight when copying is switched off
    # retain, as Kafka 3.9 spells it: copy.disable=true (and local retention following the total)
    change = tiering.disable_tiering(conn, "k39", "retain", dialect=tiering.KAFKA39)
    assert change.set_configs == {"remote.log.copy.disable": "true", "local.retention.bytes": "-2"}
    assert change.tiered_state == "ENABLED"  # read-only tier: no KIP-950 transition
    frozen = {s.segment_id.id for s in remote_segments(b.data_dir)}
    fill(b.bootstrap, "k39", 400, 200)
    time.sleep(1.0)
    assert {s.segment_id.id for s in remote_segments(b.data_dir)} == frozen
    assert consume_values(b.bootstrap, "k39", 0, 600) == [(i, value(i)) for i in range(600)]

    assert tiering.enable_tiering(conn, "k39", dialect=tiering.KAFKA39).set_configs == {"remote.log.copy.disable": "false"}
    wait_until("copying to resume", lambda: len(remote_segments(b.data_dir)) > len(frozen))

    # delete, as Kafka 3.9 spells it
    change = tiering.disable_tiering(conn, "k39", "delete", dialect=tiering.KAFKA39)
    assert change.set_configs == {"remote.storage.enable": "false", "remote.log.delete.on.disable": "true"}
    wait_state(b.bootstrap, "k39", "DISABLED")
    assert remote_files(b.data_dir) == []


def test_bad_remote_storage_manager_stops_startup_with_one_line(tmp_path):
    from tests.brokerproc import BrokerProcess

    b = BrokerProcess(tmp_path / "bad", {"remote.log.storage.system.enable": "true",
                                         "remote.log.storage.manager.class.name": "plugins.rsm.nowhere.Manager"})
    with pytest.raises(RuntimeError, match="did not start"):
        b.start(timeout=15)
    b.stop()
    assert "kcli: error: plugin class 'plugins.rsm.nowhere.Manager' not found" in b.log_text()
    assert "Traceback" not in b.log_text()


# ---- pieces without a broker --------------------------------------------------------------------
def test_dialect_detection_and_plans():
    kip = {"remote.storage.enable": "true", "remote.log.disable.policy": "retain", "remote.log.copy.disable": "false",
           "remote.log.delete.on.disable": "false", "kcli.tiered.state": "ENABLED", "kcli.tiered.epoch": "0",
           "kcli.tiered.remote.segments": "3", "kcli.tiered.remote.bytes": "999"}
    status = tiering.status_from_configs("t", kip)
    assert status.dialect == tiering.KIP950 and status.remote_segments == 3
    plan = tiering.plan_disable(status, "delete")
    assert plan.set_configs == {"remote.storage.enable": "false", "remote.log.disable.policy": "delete"}
    assert "3 remote segment(s), 999 bytes will be deleted" in plan.effect

    kafka = {"remote.storage.enable": "true", "remote.log.copy.disable": "false", "remote.log.delete.on.disable": "false",
             "local.retention.ms": "3600000", "retention.ms": "604800000", "local.retention.bytes": "-2",
             "retention.bytes": "-1"}
    status = tiering.status_from_configs("t", kafka)
    assert status.dialect == tiering.KAFKA39 and status.remote_segments is None
    assert tiering.plan_disable(status, None).set_configs == {"remote.log.copy.disable": "true",
                                                              "local.retention.ms": "-2"}
    with pytest.raises(Exception, match="--policy must be one of retain, delete"):
        tiering.plan_disable(status, "archive")
    off = tiering.status_from_configs("t", {**kafka, "remote.storage.enable": "false"})
    assert not tiering.plan_disable(off, "delete").changes
    with pytest.raises(Exception, match="cannot disable tiered storage per topic"):
        tiering.detect_dialect({"remote.storage.enable": "true"})


def _segment(tmp: Path, base: int, payload: bytes) -> tuple[RemoteLogSegmentMetadata, LogSegmentData]:
    log = tmp / f"{base:020d}.log"
    log.write_bytes(payload)
    (tmp / f"{base:020d}.index").write_bytes(b"\x00\x00\x00\x05\x00\x00\x00\x10")
    md = RemoteLogSegmentMetadata(RemoteLogSegmentId.generate(uuid.uuid4(), "t", 0), base, base + 9, BASE_TS, 1,
                                  BASE_TS, len(payload), tiered_epoch=3)
    return md, LogSegmentData(log, tmp / f"{base:020d}.index", tmp / f"{base:020d}.timeindex", b"0\n1\n0 0\n")


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_object_store_rsm_roundtrip(tmp_path, backend, request):
    if backend == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        rsm = ObjectStoreRemoteStorageManager()
        rsm.configure({"uri": f"s3://{bucket}/p", "key.prefix": "tier"})
    else:
        rsm = ObjectStoreRemoteStorageManager(LocalObjectStorage(tmp_path / "store"))
    md, data = _segment(tmp_path, 100, bytes(range(256)) * 4)
    rsm.copy_log_segment_data(md, data)
    assert rsm.fetch_log_segment(md, 10, 19) == (bytes(range(256)) * 4)[10:20]
    assert rsm.fetch_log_segment(md, 1000) == (bytes(range(256)) * 4)[1000:]
    assert rsm.fetch_index(md, IndexType.OFFSET) == b"\x00\x00\x00\x05\x00\x00\x00\x10"
    assert rsm.fetch_index(md, IndexType.TIMESTAMP) == b""  # no time index file: empty index
    assert rsm.fetch_index(md, IndexType.LEADER_EPOCH) == b"0\n1\n0 0\n"
    with pytest.raises(RemoteResourceNotFoundException):
        rsm.fetch_index(md, IndexType.TRANSACTION)
    rsm.delete_log_segment_data(md)
    rsm.delete_log_segment_data(md)  # idempotent
    with pytest.raises(RemoteResourceNotFoundException):
        rsm.fetch_log_segment(md, 0, 1)
    with pytest.raises(RemoteStorageException, match="unknown ObjectStoreRemoteStorageManager config"):
        rsm.configure({"bucket": "x"})
    rsm.close()


def test_metadata_store_persists_and_drops_torn_tail(tmp_path):
    store = rlmm.RemoteLogMetadataStore(tmp_path).open()
    tid = uuid.uuid4()
    mds = [RemoteLogSegmentMetadata(RemoteLogSegmentId.generate(tid, "t", 0), o, o + 9, BASE_TS + o, 1, BASE_TS, 100,
                                    tiered_epoch=o // 10) for o in (0, 10, 20)]
    for md in mds:
        store.add_copy_started(md)
    store.update_state(mds, S.COPY_SEGMENT_FINISHED)
    store.update_state(mds[:1], S.DELETE_SEGMENT_STARTED)
    with pytest.raises(RemoteStorageException, match="invalid state transition"):
        store.update_state(mds[:1], S.COPY_SEGMENT_FINISHED)
    store.update_state(mds[:1], S.DELETE_SEGMENT_FINISHED)
    store.close()
    with open(tmp_path / "__remote_log_metadata" / "metadata.log", "ab") as f:
        f.write(b"0000abcd {\"type\":\"Remote")  # a crash mid-append
    again = rlmm.RemoteLogMetadataStore(tmp_path).open()
    assert [(s.start_offset, s.tiered_epoch) for s in again.segments(tid, 0)] == [(10, 1), (20, 2)]
    assert again.highest_offset(tid, 0) == 29 and again.segment_for_offset(tid, 0, 15).start_offset == 10
    assert again.segment_for_offset(tid, 0, 3).start_offset == 10  # falls forward over a gap
    again.close()


def test_read_committed_from_the_remote_tier_skips_aborted_records_across_a_restart(broker_factory):
    """A segment's transaction index is copied with it (Kafka's LogSegmentData.transactionIndex)
    and read back for remote fetches: after a restart the log's own aborted list only covers the
    local segments it replayed, so without the remote index a read_committed consumer reading the
    tiered part would get the aborted records (confluent-kafka and kafka-python)."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    from tests.test_transactions import read

    b = broker_factory(TIERED_BROKER)
    create_topic(b.bootstrap, "ttxn", 1, TIERED_TOPIC)
    p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "ttxn-app", "linger.ms": 2,
                  "batch.size": 4000})
    p.init_transactions(30)
    for kind, commit in ((b"aborted", False), (b"committed", True)):
        p.begin_transaction()
        for i in range(50):
            p.produce("ttxn", kind + b"-%03d-" % i + b"x" * 80)
        p.flush(30)
        p.commit_transaction(30) if commit else p.abort_transaction(30)
    fill(b.bootstrap, "ttxn", 0, 800)  # rolls segments; local retention drops the transactions' ones
    wait_until("the transactions' segments to be remote only", lambda: list_offset(b.bootstrap, "ttxn", -4) > 110)
    assert any(f.name.endswith(".txnindex") for f in remote_files(b.data_dir)), "the transaction index was not copied"
    b.restart()
    values = read(b.bootstrap, "ttxn", 1, "read_committed", expected=850)
    assert len(values) == 850 and not [v for v in values if v.startswith(b"aborted")]
    assert len([v for v in read(b.bootstrap, "ttxn", 1, "read_uncommitted", expected=900)]) == 900
    kc = KafkaConsumer(bootstrap_servers=b.bootstrap, isolation_level="read_committed", enable_auto_commit=False,
                       consumer_timeout_ms=5000)
    kc.assign([KTP("ttxn", 0)])
    kc.seek_to_beginning()
    seen = [m.value for m in kc]
    kc.close()
    assert len(seen) == 850 and not [v for v in seen if v.startswith(b"aborted")]
