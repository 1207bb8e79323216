"""Object-store faults are bounded in time, and a store the broker cannot use is named at start.

Real broker processes over moto's HTTP server (tests/fixtures_s3.py); the silent connection
death is a loopback proxy that stops forwarding without RST or FIN (tests/blackhole_proxy.py).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import boto3
import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewPartitions

from plugins.objectstore import StorageBackendException, from_uri
from plugins.objectstore.local import LocalObjectStorage
from plugins.objectstore.s3 import S3ObjectStorage
from tests.blackhole_proxy import BlackholeProxy, time_to_first_ack_after_heal
from tests.diskless_helpers import DISKLESS, FAST, wait_until
from tests.fixtures_cli import REPO, assert_one_line_error
from tests.fixtures_s3 import moto_server, s3_bucket, s3_env  # noqa: F401 - fixtures
from tests.kafka_helpers import admin, consume_all, create_topic, produce


def start_expecting_failure(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`kcli broker start` that must refuse (one that starts is killed by the timeout)."""
    proc = subprocess.run([sys.executable, "-m", "kcli", "broker", "start", "--data-dir", str(data_dir),
                           "--listen", "127.0.0.1:0", *args], capture_output=True, env=dict(os.environ),
                          cwd=REPO, timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def s3_client(endpoint: str):  # noqa: ANN201
    return boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                          aws_access_key_id="test", aws_secret_access_key="test")


def empty_and_delete_bucket(client, bucket: str) -> None:  # noqa: ANN001
    for item in client.list_objects_v2(Bucket=bucket).get("Contents", []):
        client.delete_object(Bucket=bucket, Key=item["Key"])
    client.delete_bucket(Bucket=bucket)


def topic_names(bootstrap: str) -> set[str]:
    return set(admin(bootstrap).list_topics(timeout=10).topics)


def create_error(bootstrap: str, name: str) -> KafkaError | None:
    try:
        create_topic(bootstrap, name, 2, DISKLESS)
    except KafkaException as err:
        return err.args[0]
    return None


# ---- the settings -------------------------------------------------------------------------------


def test_s3_calls_have_timeouts_and_bounded_retries_by_default_and_as_configured():
    store = S3ObjectStorage("b", "p", endpoint_url="http://127.0.0.1:9")
    client = store._s3()
    cfg = client.meta.config
    assert (cfg.connect_timeout, cfg.read_timeout) == (3.0, 5.0), "botocore's 60 s would stall producers"
    assert cfg.retries == {"mode": "standard", "total_max_attempts": 3} and cfg.tcp_keepalive is True
    store.configure({"connection.timeout.ms": "250", "socket.timeout.ms": "700", "max.attempts": "2",
                     "tcp.keepalive.enabled": "false"})
    cfg = store._s3().meta.config
    assert (cfg.connect_timeout, cfg.read_timeout, cfg.retries["total_max_attempts"], cfg.tcp_keepalive) == (0.25, 0.7, 2, False)
    for bad in ({"socket.timeout.ms": "0"}, {"connection.timeout.ms": "soon"}, {"max.attempts": "0"}):
        with pytest.raises(StorageBackendException, match=next(iter(bad))):
            store.configure(bad)
    # Nothing listens on port 9: the call fails within the bounds instead of hanging.
    store.configure({"connection.timeout.ms": "200", "max.attempts": "2"})
    started = time.monotonic()
    with pytest.raises(StorageBackendException):
        store.size("k")
    assert time.monotonic() - started < 10
    store.close()


def test_write_failures_log_one_line_per_streak_with_key_and_error(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    store = LocalObjectStorage(blocker / "objects")  # under a regular file: ENOTDIR, even for root
    caplog.set_level(logging.WARNING, logger="kcli.objectstore")
    for i in range(5):
        with pytest.raises(StorageBackendException):
            store.upload(f"wal/k{i}", b"x", 1)
    lines = [r.getMessage() for r in caplog.records if r.name == "kcli.objectstore"]
    assert len(lines) == 1 and "upload of 'wal/k0' failed" in lines[0] and "Not a directory" in lines[0], lines
    assert "wal/k4" in (store.write_failure() or ""), "the current streak's latest error"
    store.configure({"root": str(tmp_path / "objects")})
    store.upload("wal/ok", b"x", 1)
    assert store.write_failure() is None
    lines = [r.getMessage() for r in caplog.records if r.name == "kcli.objectstore"]
    assert len(lines) == 2 and "work again after 5 failed" in lines[1], lines


def test_probe_names_the_failing_operation(tmp_path, s3_bucket):  # noqa: F811
    from_uri(f"s3://{s3_bucket}/p").probe()  # a usable store: nothing left behind
    assert s3_client(os.environ["AWS_ENDPOINT_URL"]).list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0
    missing = f"kcli-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(StorageBackendException, match=rf"^object store s3://{missing}/p: bucket '{missing}' does not exist$"):
        from_uri(f"s3://{missing}/p").probe()
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageBackendException, match=r"probe write of '_probe/.*' failed: .*Not a directory"):
        LocalObjectStorage(tmp_path / "file" / "objects").probe()


# ---- at start -----------------------------------------------------------------------------------


def test_broker_start_names_a_missing_bucket(tmp_path, s3_env):  # noqa: F811
    missing = f"kcli-missing-{uuid.uuid4().hex[:8]}"
    proc = start_expecting_failure(tmp_path / "data", "--object-store", f"s3://{missing}/wal")
    assert_one_line_error(proc, 1, f"object store s3://{missing}/wal: bucket '{missing}' does not exist")


def test_broker_start_names_an_unwritable_store(tmp_path):
    (tmp_path / "file").write_text("x")
    uri = (tmp_path / "file" / "objects").as_uri()
    proc = start_expecting_failure(tmp_path / "data", "--object-store", uri)
    assert_one_line_error(proc, 1, f"object store {uri}: probe write of", "Not a directory")


def test_broker_start_refuses_bad_store_settings(tmp_path):
    proc = start_expecting_failure(tmp_path / "data", "--object-store", "s3://b/p",
                                   "--config", "diskless.storage.socket.timeout.ms=soon")
    assert_one_line_error(proc, 2, "socket.timeout.ms must be an integer")


# ---- diskless CreateTopics ----------------------------------------------------------------------


def test_diskless_create_over_an_unusable_store_fails_and_leaves_no_topic(broker_factory, s3_bucket):  # noqa: F811
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    client = s3_client(endpoint)
    b = broker_factory(FAST, extra_args=["--object-store", f"s3://{s3_bucket}/kcli"])
    empty_and_delete_bucket(client, s3_bucket)  # gone after the start-up probe

    err = create_error(b.bootstrap, "lost")  # the first diskless topic opens (and probes) the store
    assert err is not None and err.code() == KafkaError.KAFKA_STORAGE_ERROR, err
    assert "does not exist" in err.str()
    assert "lost" not in topic_names(b.bootstrap), "no half-created topic whose producers would hang"

    client.create_bucket(Bucket=s3_bucket)
    create_topic(b.bootstrap, "kept", 2, DISKLESS)
    produce(b.bootstrap, "kept", [b"a", b"b"], partition=0)

    # The store breaks while open: failed uploads mark it, and creates are refused until it works.
    empty_and_delete_bucket(client, s3_bucket)
    with pytest.raises(AssertionError, match="delivery failed"):  # retried until the message times out
        produce(b.bootstrap, "kept", [b"c"], partition=0, **{"message.timeout.ms": 3000})
    err = create_error(b.bootstrap, "later")
    assert err is not None and err.code() == KafkaError.KAFKA_STORAGE_ERROR and "cannot be written" in err.str(), err
    a = admin(b.bootstrap)  # kept alive until its future resolves
    fs = a.create_partitions([NewPartitions("kept", 4)])
    with pytest.raises(KafkaException, match="cannot be written"):
        fs["kept"].result(30)
    assert "later" not in topic_names(b.bootstrap)
    assert len(admin(b.bootstrap).list_topics("kept", timeout=10).topics["kept"].partitions) == 2

    client.create_bucket(Bucket=s3_bucket)  # recovered: a background re-probe clears the mark
    wait_until(lambda: create_error(b.bootstrap, "later") is None, timeout=20, what="create after recovery")
    produce(b.bootstrap, "later", [b"x"], partition=1)
    assert [m.value() for m in consume_all(b.bootstrap, "later", 1)] == [b"x"]
    b.stop()
    b.start()  # the data dir and the store it accepted still start
    assert {"kept", "later"} <= topic_names(b.bootstrap)


# ---- silent connection death --------------------------------------------------------------------


def test_produce_resumes_soon_after_a_silent_store_outage(broker_factory, s3_bucket):  # noqa: F811
    upstream = urlsplit(os.environ["AWS_ENDPOINT_URL"])
    with BlackholeProxy((upstream.hostname, upstream.port)) as proxy:
        b = broker_factory(FAST, extra_args=["--object-store", f"s3://{s3_bucket}/kcli"],
                           env={"AWS_ENDPOINT_URL": proxy.url})
        create_topic(b.bootstrap, "stall", 1, DISKLESS)
        recovery = time_to_first_ack_after_heal(b.bootstrap, "stall", proxy, outage_s=5.0, give_up_s=40.0)
        print(f"\nproduce acknowledged {recovery if recovery is None else round(recovery, 2)} s after the store healed")
        assert recovery is not None and recovery <= 15.0, f"produce stalled {recovery} s after the store healed"
        b.stop()  # while its store is still reachable: a clean, quick shutdown
