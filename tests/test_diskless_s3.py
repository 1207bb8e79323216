"""Diskless topics with the WAL objects in S3: the broker runs with --object-store s3://…
against moto's real HTTP server (tests/fixtures_s3.py), found through the standard AWS_* env."""

from __future__ import annotations

import socket
import time
from typing import Iterator

import boto3
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from moto.server import ThreadedMotoServer

from kcli.diskless import admin_api
from kcli.protocol.client import WireClient
from tests.diskless_helpers import CODECS, DISKLESS, FAST, admin, check_partition_order, counter, values_in_objects, wait_until
from tests.fixtures_s3 import _moto_admin, moto_server, s3_bucket, s3_env  # noqa: F401
from tests.kafka_helpers import admin as kafka_admin
from tests.kafka_helpers import consume_all, create_topic, produce
from tests.wire_helpers import batch, produce_body

PREFIX = "kcli/wal-test"


def _keys(client: object, bucket: str) -> set[str]:
    """Object keys under PREFIX/, relative to it (as the broker names them)."""
    items = client.list_objects_v2(Bucket=bucket, Prefix=f"{PREFIX}/").get("Contents", [])  # type: ignore[attr-defined]
    return {item["Key"][len(PREFIX) + 1:] for item in items}


def _objects(client: object, bucket: str) -> dict[str, bytes]:
    out = {}
    for item in client.list_objects_v2(Bucket=bucket, Prefix=f"{PREFIX}/").get("Contents", []):  # type: ignore[attr-defined]
        out[item["Key"]] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()  # type: ignore[attr-defined]
    return out


def test_s3_every_codec_kafka_python_kill9_and_deletion(broker_factory, s3_bucket, _moto_admin):  # noqa: F811
    kafka = pytest.importorskip("kafka")
    b = broker_factory(FAST, extra_args=["--object-store", f"s3://{s3_bucket}/{PREFIX}"])
    create_topic(b.bootstrap, "s3t", 2, DISKLESS)
    create_topic(b.bootstrap, "s3d", 1, DISKLESS)
    create_topic(b.bootstrap, "s3k", 1, DISKLESS)
    produced: list[bytes] = []
    for codec in CODECS:
        values = [f"{codec}-{i}".encode() * 3 for i in range(60)]
        produce(b.bootstrap, "s3t", values, keys=[b"%d" % (i % 5) for i in range(60)],
                **{"compression.type": codec, "enable.idempotence": True})
        produced += values
    prod = kafka.KafkaProducer(bootstrap_servers=b.bootstrap, acks="all", compression_type="gzip")
    for i in range(40):
        prod.send("s3k", value=b"kp-%d" % i)
    prod.flush(30)
    prod.close()
    kp_values = [b"kp-%d" % i for i in range(40)]
    produce(b.bootstrap, "s3d", [b"doomed-%d" % i for i in range(10)])

    stored = _objects(_moto_admin, s3_bucket)
    # The prefix owner marker (kcli/diskless/identity.py) sits next to wal/, not in it.
    assert stored.pop(f"{PREFIX}/kcli-cluster.json", None) is not None, "the prefix names its cluster"
    assert stored and all(k.startswith(f"{PREFIX}/wal/") for k in stored), "objects live under the URI's prefix"
    assert set(values_in_objects(stored.values())) == set(produced + kp_values) | {b"doomed-%d" % i for i in range(10)}
    report = admin(b.bootstrap, admin_api.DISKLESS_VERIFY_KEY)
    assert report["ok"] and report["storage"] == f"s3://{s3_bucket}/{PREFIX}/"

    b.kill9()  # every acknowledged record is in S3 and committed: nothing local is needed
    b.start()
    msgs = consume_all(b.bootstrap, "s3t", len(produced), **{"check.crcs": True})
    assert sorted(m.value() for m in msgs) == sorted(produced)
    check_partition_order(msgs)
    cons = kafka.KafkaConsumer("s3k", bootstrap_servers=b.bootstrap, auto_offset_reset="earliest",
                               consumer_timeout_ms=10000, group_id=None)
    got = [m.value for _, m in zip(range(len(kp_values)), cons)]
    cons.close()
    assert got == kp_values
    assert counter(b.bootstrap, "diskless.get.count") >= 1, "after a restart reads are ranged GETs"

    doomed = {o["object_key"] for o in admin(b.bootstrap, admin_api.DISKLESS_OBJECTS_KEY, {"topic": "s3d"})["objects"]}
    assert doomed
    a = kafka_admin(b.bootstrap)
    assert list(a.delete_records([TopicPartition("s3d", 0, 10)]).values())[0].result(20).low_watermark == 10
    wait_until(lambda: not doomed & _keys(_moto_admin, s3_bucket), 20,
               what="emptied objects deleted from S3 after the grace period")
    assert len(consume_all(b.bootstrap, "s3t", len(produced))) == len(produced), "other objects untouched"


@pytest.fixture
def restartable_s3(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A moto server on a fixed port that a test can stop and start again (moto's state lives in
    this process, so the bucket survives the restart): an S3 outage without any mock."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    nowhere = tmp_path_factory.mktemp("aws") / "none"
    for name, value in {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
                        "AWS_CONFIG_FILE": str(nowhere), "AWS_SHARED_CREDENTIALS_FILE": str(nowhere)}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    state: dict = {"server": ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)}
    state["server"].start()
    bucket = f"kcli-outage-{port}"
    client = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")
    client.create_bucket(Bucket=bucket)
    client.close()

    def stop() -> None:
        state["server"].stop()

    def start() -> None:
        state["server"] = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        state["server"].start()

    yield {"bucket": bucket, "stop": stop, "start": start}
    try:
        state["server"].stop()
    except Exception:  # noqa: BLE001 - already stopped
        pass


def test_s3_outage_gives_retriable_errors_then_the_idempotent_producer_succeeds(broker_factory, restartable_s3):
    b = broker_factory(FAST, extra_args=["--object-store", f"s3://{restartable_s3['bucket']}/{PREFIX}"])
    create_topic(b.bootstrap, "out", 1, DISKLESS)
    produce(b.bootstrap, "out", [b"before"])
    restartable_s3["stop"]()
    delivered: list[bytes] = []
    errors: list[object] = []
    p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "linger.ms": 5,
                  "retry.backoff.ms": 100, "message.timeout.ms": 90000})
    try:
        with WireClient(b.bootstrap, timeout=60) as client:
            resp = client.request(0, 9, produce_body("out", 0, batch([b"raw"], timestamp=int(time.time() * 1000))))
        assert int(resp.responses[0].partition_responses[0].error_code) == 56  # KAFKA_STORAGE_ERROR

        def cb(err, msg):  # noqa: ANN001
            (errors if err is not None else delivered).append(err if err is not None else msg.value())

        values = [b"out-%d" % i for i in range(100)]
        for v in values:
            p.produce("out", v, on_delivery=cb)
        p.poll(1.0)
        assert delivered == [] and errors == []
        assert counter(b.bootstrap, "diskless.upload.errors") >= 1
    finally:
        restartable_s3["start"]()
    assert p.flush(60) == 0
    assert errors == [] and sorted(delivered) == sorted(values)
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "o", "auto.offset.reset": "earliest"})
    c.assign([TopicPartition("out", 0, 0)])
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 101 and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            got.append(m.value())
    low, high = c.get_watermark_offsets(TopicPartition("out", 0), timeout=10)
    c.close()
    assert got == [b"before"] + values and (low, high) == (0, 101), "in order, no loss, no duplicate"
