"""Issue #25, item 1: a corrupted object in object storage never reaches a consumer.

Real broker processes on loopback ports, real clients (confluent-kafka, `kcli` as a subprocess),
real files: one byte is flipped inside a record of a WAL object (diskless topic) or of a
remote-tier segment (tiered topic) on the local filesystem store. librdkafka does not check CRCs
by default (check.crcs=false), so before this change `kcli consume` printed the damaged record
(`rec-140` where `rec-150` was written) and exited 0, and the broker logged nothing.

Each test asserts what the old code got wrong: the consumer's exit status and output, the
partition's error code, the one WARNING naming the object and byte range, the metric, and
`kcli diskless verify`'s report of the same object and range.
"""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from kcli.diskless.wal import parse_wal
from kcli.protocol.client import WireClient
from kcli.records.batch import BatchHeader, iter_headers
from tests.diskless_helpers import FAST, local_wal_objects, wait_until
from tests.fixtures_cli import cli_env, run_kcli  # noqa: F401
from tests.kafka_helpers import create_topic, produce

CORRUPT_MESSAGE = 2
KAFKA_STORAGE_ERROR = 56
DISKLESS_METRIC = "fetch.corrupt.batches{source=diskless}"
TIERED_METRIC = "fetch.corrupt.batches{source=tiered}"
PROM_NAME = "kafka_server_brokertopicmetrics_corruptfetchbatches_total"
METRICS_LISTEN = ["--metrics-listen", "127.0.0.1:0"]


# ---- helpers ------------------------------------------------------------------------------------
def fetch(bootstrap: str, topic: str, partition: int, offset: int) -> tuple[int, bytes]:
    """(error code, records) of one Fetch v4 of ``partition`` at ``offset`` (1 MiB)."""
    with WireClient(bootstrap, timeout=20) as client:
        resp = client.request(1, 4, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
            "topics": [{"topic": topic, "partitions": [
                {"partition": partition, "fetch_offset": offset, "partition_max_bytes": 1 << 20}]}]})
    part = resp.responses[0].partitions[0]
    return int(part.error_code), bytes(part.records or b"")


def flip(path: Path, at: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= mask
    path.write_bytes(bytes(data))


def broker_counter(env: dict[str, str], bootstrap: str, name: str) -> int:
    """A counter as `kcli broker metrics -o json` shows it (0 while it has never moved)."""
    proc = run_kcli(env, "-b", bootstrap, "broker", "metrics", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    doc = doc[0] if isinstance(doc, list) else doc
    return int(doc["counters"].get(name, 0))


def prometheus(b: Any, source: str) -> float:
    """The exported meter for ``source``, scraped from the broker's current metrics endpoint."""
    urls = wait_until(lambda: re.findall(r"metrics (http://\S+/metrics)", b.log_text()), what="metrics line")
    with urllib.request.urlopen(urls[-1], timeout=10) as resp:
        text = resp.read().decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == PROM_NAME and s.labels == {"source": source}:
                return s.value
    raise AssertionError(f"{PROM_NAME}{{source={source!r}}} is not exported")


def warnings_naming(b: Any, needle: str) -> list[str]:
    return [ln for ln in b.log_text().splitlines() if " WARNING " in ln and needle in ln]


def consume_cli(env: dict[str, str], bootstrap: str, topic: str) -> Any:
    return run_kcli(env, "-b", bootstrap, "consume", "--topic", topic, "--from-beginning", "--timeout-ms", "8000",
                    timeout=90)


def assert_fails_with_one_corrupt_message_line(proc: Any) -> None:
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-500:], proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("kcli: error: CORRUPT_MESSAGE"), proc.stderr


# ---- the check itself ---------------------------------------------------------------------------
def test_batch_problem_checks_header_and_crc_but_not_the_fields_the_reader_rewrites() -> None:
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    from kcli.diskless.reader import batch_problem
    from kcli.records.batch import HEADER_SIZE

    # one real v2 batch, as a client writes it (aiokafka's builder)
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(10):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=None, value=b"rec-%03d" % i, headers=[])
    good = bytes(builder.build())
    size = len(good)
    assert batch_problem(memoryview(good), 0, size, 9) is None

    def damaged(at: int) -> str | None:
        data = bytearray(good)
        data[at] ^= 0x01
        return batch_problem(memoryview(bytes(data)), 0, size, 9)

    assert damaged(size - 3) == "batch fails its CRC-32C check"  # a record byte
    assert damaged(18) == "batch fails its CRC-32C check"  # the stored CRC itself
    assert "impossible batch header" in (damaged(16) or "")  # magic: outside the CRC
    assert "coordinator" in (damaged(11) or "")  # batchLength: outside the CRC, checked against the coordinator
    assert damaged(3) is None and damaged(13) is None  # base offset, leader epoch: rewritten by every read
    assert "coordinator" in (batch_problem(memoryview(good), 0, size, 8) or "")  # record count differs
    assert "not a batch header" in (batch_problem(memoryview(good[: HEADER_SIZE - 1]), 0, size, 9) or "")


# ---- diskless -----------------------------------------------------------------------------------
def test_a_flipped_byte_in_a_wal_object_is_corrupt_message_logged_once_counted_and_verified(
        broker_factory, cli_env) -> None:  # noqa: F811
    b = broker_factory(FAST, extra_args=METRICS_LISTEN)
    create_topic(b.bootstrap, "dl", 1, {"diskless.enable": "true"})
    create_topic(b.bootstrap, "dm", 1, {"diskless.enable": "true"})
    # Two produce calls, each acknowledged before the next: two WAL objects, one batch of dl-0 each.
    produce(b.bootstrap, "dl", [b"rec-%03d" % i for i in range(100)], partition=0, acks="all", **{"linger.ms": 50})
    produce(b.bootstrap, "dl", [b"rec-%03d" % i for i in range(100, 200)], partition=0, acks="all", **{"linger.ms": 50})
    produce(b.bootstrap, "dm", [b"hdr-%03d" % i for i in range(50)], partition=0, acks="all", **{"linger.ms": 50})
    objects = local_wal_objects(b.data_dir)
    assert len(objects) == 3
    assert b.stop() == 0  # the restarted broker's cache is empty: every batch comes from the store
    # ...and so is its replica cache (kcli/diskless/replica_cache.py): it kept the batches as they
    # were before the flip and would serve those intact copies; without it the store is read.
    shutil.rmtree(b.data_dir / "diskless-cache", ignore_errors=True)

    # Flip the low bit of a digit of rec-150 ('5' -> '4'), which old code served as rec-140.
    (victim,) = [p for p in objects if b"rec-150" in p.read_bytes()]
    blob = victim.read_bytes()
    (h,) = parse_wal(blob).batches
    at = blob.index(b"rec-150") + 5
    assert h.position + 21 <= at < h.position + h.size
    flip(victim, at)
    key = f"wal/{victim.name}"
    span = f"{key} bytes {h.position}-{h.position + h.size - 1}"
    # dm-0: flip the batch's magic byte, outside the CRC (old code: KAFKA_STORAGE_ERROR, retried forever)
    (other,) = [p for p in objects if b"hdr-000" in p.read_bytes()]
    (oh,) = parse_wal(other.read_bytes()).batches
    flip(other, oh.position + 16)
    b.start()
    assert prometheus(b, "diskless") == 0  # exported before the first event

    # kcli consume: the intact batch, then one error line and exit 1 — never the damaged records
    proc = consume_cli(cli_env, b.bootstrap, "dl")
    assert_fails_with_one_corrupt_message_line(proc)
    printed = proc.stdout.splitlines()
    assert "rec-140" not in printed and "rec-150" not in printed
    assert sorted(v for v in printed if v.startswith("rec-")) == ["rec-%03d" % i for i in range(100)]

    # the partition answers CORRUPT_MESSAGE from the damaged batch on; before it the intact batch is served
    assert fetch(b.bootstrap, "dl", 0, 100) == (CORRUPT_MESSAGE, b"")
    assert fetch(b.bootstrap, "dl", 0, 150) == (CORRUPT_MESSAGE, b"")
    code, records = fetch(b.bootstrap, "dl", 0, 0)
    assert code == 0 and [(x.base_offset, x.last_offset) for x in iter_headers(records)] == [(0, 99)]
    assert fetch(b.bootstrap, "dm", 0, 0) == (CORRUPT_MESSAGE, b"")
    # a real client sees the broker's error, not records
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "integrity", "enable.auto.commit": False})
    c.assign([TopicPartition("dl", 0, 100)])
    try:
        msg = wait_until(lambda: (lambda m: m if m is not None and (m.error() or m.value()) else None)(c.poll(0.5)),
                         what="a message or an error")
    finally:
        c.close()
    assert msg.error() is not None and msg.error().code() == KafkaError.INVALID_MSG, (msg.error(), msg.value())

    # one WARNING per damaged object range, however many fetches hit it
    lines = warnings_naming(b, span)
    assert len(lines) == 1, warnings_naming(b, key)
    assert "CRC-32C" in lines[0] and "dl-0" in lines[0] and "CORRUPT_MESSAGE" in lines[0]
    assert len(warnings_naming(b, f"wal/{other.name} bytes {oh.position}-")) == 1

    # counted: every read that found damage, also under the Prometheus name
    counted = broker_counter(cli_env, b.bootstrap, DISKLESS_METRIC)
    assert counted >= 3  # consume (>= 1) and the two fetches from the damaged batch
    assert fetch(b.bootstrap, "dl", 0, 100)[0] == CORRUPT_MESSAGE  # never cached: read and checked again
    assert broker_counter(cli_env, b.bootstrap, DISKLESS_METRIC) == counted + 1
    assert prometheus(b, "diskless") == counted + 1
    assert prometheus(b, "tiered") == 0
    assert len(warnings_naming(b, span)) == 1

    # kcli diskless verify names the same object and byte range
    ver = run_kcli(cli_env, "-b", b.bootstrap, "diskless", "verify", "-o", "json")
    assert ver.returncode == 1, ver.stderr
    problems = json.loads(ver.stdout)["problems"]
    crc = [p for p in problems if p["problem"] == "CRC-32C mismatch"]
    assert crc == [{"object_key": key, "byte_offset": h.position, "byte_size": h.size, "partition": "dl-0",
                    "problem": "CRC-32C mismatch"}], problems
    assert any(p["object_key"] == f"wal/{other.name}" and p.get("byte_offset") == oh.position for p in problems)
    table = run_kcli(cli_env, "-b", b.bootstrap, "diskless", "verify")
    row = next(ln for ln in table.stdout.splitlines() if ln.startswith(key))
    assert row.split()[1:3] == [str(h.position), str(h.size)] and "CRC-32C mismatch" in row


# ---- tiered -------------------------------------------------------------------------------------
TIERED_BROKER = {
    "remote.log.storage.system.enable": "true",
    "remote.log.manager.task.interval.ms": "200",
    "log.retention.check.interval.ms": "200",
    "group.initial.rebalance.delay.ms": "0",
}
TIERED_TOPIC = {"remote.storage.enable": "true", "segment.bytes": "8192", "local.retention.bytes": "20000"}


def tvalue(i: int) -> bytes:
    return b"message-%06d-" % i + b"x" * 80


def earliest_local(bootstrap: str, topic: str) -> int:
    with WireClient(bootstrap) as c:
        resp = c.request(2, 9, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": -4}]}]})
    part = resp.topics[0].partitions[0]
    assert part.error_code == 0, part
    return int(part.offset)


def test_a_flipped_byte_in_a_remote_segment_is_corrupt_message_logged_once_and_counted(
        broker_factory, cli_env) -> None:  # noqa: F811
    b = broker_factory(TIERED_BROKER, extra_args=METRICS_LISTEN)
    create_topic(b.bootstrap, "tt", 1, TIERED_TOPIC)
    produce(b.bootstrap, "tt", [tvalue(i) for i in range(600)], partition=0, acks="all",
            **{"linger.ms": 2, "batch.size": 2000})
    objects = b.data_dir / "objects"
    segment = wait_until(lambda: next(iter(sorted((objects / "tiered").rglob("00000000000000000000-*.log"))), None)
                         if (objects / "tiered").exists() else None, what="the first remote segment")
    headers: list[BatchHeader] = wait_until(
        lambda: (lambda hs: hs if len(hs) >= 3 and earliest_local(b.bootstrap, "tt") > hs[-1].last_offset else None)(
            list(iter_headers(segment.read_bytes()))), what="the first segment to be remote only")
    second = headers[1]
    data = segment.read_bytes()
    at = data.index(b"message-%06d-" % (second.base_offset + 2), second.position) + 12  # a digit of a value
    flip(segment, at)
    key = segment.relative_to(objects).as_posix()
    span = f"remote object {key} bytes {second.position}-{second.position + second.size - 1}"
    assert prometheus(b, "tiered") == 0

    proc = consume_cli(cli_env, b.bootstrap, "tt")
    assert_fails_with_one_corrupt_message_line(proc)
    assert proc.stdout.splitlines() == [tvalue(i).decode() for i in range(second.base_offset)]

    assert fetch(b.bootstrap, "tt", 0, second.base_offset) == (CORRUPT_MESSAGE, b"")
    assert fetch(b.bootstrap, "tt", 0, second.last_offset) == (CORRUPT_MESSAGE, b"")
    code, records = fetch(b.bootstrap, "tt", 0, 0)
    assert code == 0 and [x.base_offset for x in iter_headers(records)] == [0]
    code, records = fetch(b.bootstrap, "tt", 0, second.last_offset + 1)  # past the damage reads on
    assert code == 0 and next(iter_headers(records)).base_offset == second.last_offset + 1

    lines = warnings_naming(b, span)
    assert len(lines) == 1, warnings_naming(b, key)
    assert "CRC-32C" in lines[0] and "tt-0" in lines[0] and "CORRUPT_MESSAGE" in lines[0]
    counted = broker_counter(cli_env, b.bootstrap, TIERED_METRIC)
    assert counted >= 4
    assert fetch(b.bootstrap, "tt", 0, second.base_offset)[0] == CORRUPT_MESSAGE
    assert prometheus(b, "tiered") == counted + 1
    assert prometheus(b, "diskless") == 0
    assert len(warnings_naming(b, span)) == 1
