"""Transactions (KIP-98) against a real broker with confluent-kafka and kafka-python:
commit/abort, read_committed vs read_uncommitted, send_offsets_to_transaction, fencing,
timeouts, transaction.max.timeout.ms, and state that survives kill -9."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from kcli.dumplog.synth import build_batch
from kcli.protocol.client import WireClient
from tests.kafka_helpers import create_topic, produce
from tests.wire_helpers import produce_body

INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
PRODUCER_FENCED = 90
UNSTABLE_OFFSET_COMMIT = 88


def txn_producer(bootstrap: str, tid: str, **conf: Any) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5, **conf})
    p.init_transactions(30)
    return p


def read(bootstrap: str, topic: str, partitions: int, isolation: str, *, settle: float = 3.0,
         timeout: float = 30.0, expected: int | None = None) -> list[bytes]:
    """Every value of ``topic`` from offset 0 up to the end the consumer can reach (the last stable
    offset for read_committed); stops once nothing new came for ``settle`` seconds (or
    ``expected`` values arrived)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "isolation.level": isolation})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    quiet_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None or m.error():
                if time.monotonic() - quiet_since > settle and (expected is None or len(out) >= expected):
                    break
                continue
            out.append(m.value())
            quiet_since = time.monotonic()
    finally:
        c.close()
    return sorted(out)


def watermarks(bootstrap: str, topic: str, partition: int, isolation: str) -> int:
    """The end offset a consumer with ``isolation`` sees (the last stable offset for read_committed)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "wm", "isolation.level": isolation})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
    finally:
        c.close()


def check_commit_and_abort(bootstrap: str, topic: str, tid: str) -> None:
    """Commit, abort, commit on a 2-partition ``topic``: what read_committed and read_uncommitted
    consumers see, and the LSO while a transaction is open (shared with the diskless tests)."""
    p = txn_producer(bootstrap, tid)
    p.begin_transaction()
    for i in range(6):
        p.produce(topic, value=b"c%d" % i, partition=i % 2)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(4):
        p.produce(topic, value=b"a%d" % i, partition=i % 2)
    p.flush(30)
    # open transaction: read_committed stops at its first offset, read_uncommitted sees it
    assert watermarks(bootstrap, topic, 0, "read_committed") == 4  # 3 records + COMMIT marker
    assert watermarks(bootstrap, topic, 0, "read_uncommitted") == 6
    assert read(bootstrap, topic, 2, "read_committed", expected=6, settle=1.0) == sorted(b"c%d" % i for i in range(6))
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce(topic, value=b"last", partition=0)
    p.commit_transaction(30)

    committed = sorted([b"c%d" % i for i in range(6)] + [b"last"])
    assert read(bootstrap, topic, 2, "read_committed", expected=7) == committed
    assert read(bootstrap, topic, 2, "read_uncommitted", expected=11) == sorted(committed + [b"a%d" % i for i in range(4)])
    # the LSO is back at the end once everything is decided
    assert watermarks(bootstrap, topic, 0, "read_committed") == watermarks(bootstrap, topic, 0, "read_uncommitted")


def test_commit_and_abort_read_committed_vs_uncommitted(broker) -> None:
    create_topic(broker.bootstrap, "tx", 2)
    check_commit_and_abort(broker.bootstrap, "tx", "t-commit")


def check_send_offsets(bootstrap: str, src: str, dst: str, group: str, tid: str) -> None:
    """Consume 10 records of ``src``; commit the first half's output with their offsets, abort the
    second half's: the group's committed offset and ``dst``'s read_committed content follow."""
    produce(bootstrap, src, [b"%d" % i for i in range(10)])
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    c.subscribe([src])
    p = txn_producer(bootstrap, tid)
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < 10 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m)
    assert len(got) == 10
    # the first half committed with its offsets, the second half aborted with its offsets
    p.begin_transaction()
    for m in got[:5]:
        p.produce(dst, value=b"x" + m.value())
    p.send_offsets_to_transaction([TopicPartition(src, 0, got[4].offset() + 1)], c.consumer_group_metadata(), 30)
    p.commit_transaction(30)
    p.begin_transaction()
    for m in got[5:]:
        p.produce(dst, value=b"x" + m.value())
    p.send_offsets_to_transaction([TopicPartition(src, 0, 10)], c.consumer_group_metadata(), 30)
    p.abort_transaction(30)
    committed = c.committed([TopicPartition(src, 0)], timeout=10)
    c.close()
    assert committed[0].offset == 5
    assert read(bootstrap, dst, 1, "read_committed", expected=5) == sorted(b"x%d" % i for i in range(5))


def test_send_offsets_to_transaction(broker) -> None:
    create_topic(broker.bootstrap, "in", 1)
    create_topic(broker.bootstrap, "out", 1)
    check_send_offsets(broker.bootstrap, "in", "out", "ctp", "t-ctp")


def test_zombie_is_fenced(broker) -> None:
    create_topic(broker.bootstrap, "z", 1)
    old = txn_producer(broker.bootstrap, "t-zombie")
    old.begin_transaction()
    old.produce("z", value=b"zombie")
    old.flush(30)
    new = txn_producer(broker.bootstrap, "t-zombie")  # aborts the old one's transaction, bumps the epoch
    new.begin_transaction()
    new.produce("z", value=b"new")
    new.commit_transaction(30)
    with pytest.raises(KafkaException) as info:
        old.commit_transaction(10)
    err = info.value.args[0]
    assert err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH), err
    assert read(broker.bootstrap, "z", 1, "read_committed", expected=1) == [b"new"]
    assert read(broker.bootstrap, "z", 1, "read_uncommitted", expected=2) == [b"new", b"zombie"]


def test_transaction_timeout_is_checked_and_enforced(broker_factory) -> None:
    b = broker_factory({"transaction.max.timeout.ms": "60000",
                        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "300"})
    create_topic(b.bootstrap, "to", 1)
    too_long = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "t-long", "transaction.timeout.ms": 120000})
    with pytest.raises(KafkaException) as info:
        too_long.init_transactions(20)
    assert info.value.args[0].code() == KafkaError.INVALID_TRANSACTION_TIMEOUT

    p = txn_producer(b.bootstrap, "t-short", **{"transaction.timeout.ms": 1500})
    p.begin_transaction()
    p.produce("to", value=b"late")
    p.flush(30)
    assert watermarks(b.bootstrap, "to", 0, "read_committed") == 0
    deadline = time.monotonic() + 20
    while watermarks(b.bootstrap, "to", 0, "read_committed") == 0 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert watermarks(b.bootstrap, "to", 0, "read_committed") == 2  # record + ABORT marker
    with pytest.raises(KafkaException):
        p.commit_transaction(10)
    assert read(b.bootstrap, "to", 1, "read_committed", settle=1.5) == []


def test_state_survives_kill9(broker) -> None:
    create_topic(broker.bootstrap, "k", 1)
    p = txn_producer(broker.bootstrap, "t-kill")
    p.begin_transaction()
    p.produce("k", value=b"c1")
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce("k", value=b"a1")
    p.flush(30)  # else abort_transaction purges it unsent
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce("k", value=b"open")
    p.flush(30)
    broker.kill9()
    broker.start()
    # the aborted range and the open transaction were rebuilt from the log
    assert watermarks(broker.bootstrap, "k", 0, "read_committed") == 4
    # the coordinator still knows the id: a new instance aborts the open transaction
    q = txn_producer(broker.bootstrap, "t-kill")
    q.begin_transaction()
    q.produce("k", value=b"c2")
    q.commit_transaction(30)
    assert read(broker.bootstrap, "k", 1, "read_committed", expected=2) == [b"c1", b"c2"]
    assert read(broker.bootstrap, "k", 1, "read_uncommitted", expected=4) == [b"a1", b"c1", b"c2", b"open"]
    state = (broker.data_dir / "__transaction_state" / "transactions.log").read_text()
    assert '"transactional_id":"t-kill"' in state


def check_kafka_python_commit_and_abort(bootstrap: str, topic: str) -> None:
    """kafka-python's transactional producer: commit, abort, commit; its read_committed consumer
    sees the committed records only, read_uncommitted sees all (classic and diskless tests)."""
    from kafka import KafkaConsumer, KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"t-{topic}")
    p.init_transactions()
    for value, commit in ((b"k1", True), (b"k-aborted", False), (b"k2", True)):
        p.begin_transaction()
        p.send(topic, value)
        p.flush()
        p.commit_transaction() if commit else p.abort_transaction()
    p.close()
    for isolation, want in (("read_committed", [b"k1", b"k2"]), ("read_uncommitted", [b"k-aborted", b"k1", b"k2"])):
        c = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                          isolation_level=isolation, consumer_timeout_ms=4000)
        assert sorted(m.value for m in c) == want
        c.close()


def test_kafka_python_transactions(broker) -> None:
    create_topic(broker.bootstrap, "kp", 1)
    check_kafka_python_commit_and_abort(broker.bootstrap, "kp")


def test_wire_checks_and_fenced_error_per_version(broker) -> None:
    """A transactional batch for a partition the transaction did not add is refused (no hanging
    transaction); an old epoch is PRODUCER_FENCED from EndTxn v2 on, INVALID_PRODUCER_EPOCH before."""
    create_topic(broker.bootstrap, "w", 2)
    with WireClient(broker.bootstrap) as client:
        r = client.request(22, 4, {"transactional_id": "t-wire", "transaction_timeout": 60000,
                                   "producer_id": -1, "producer_epoch": -1})
        assert int(r.error_code) == 0
        pid, epoch = int(r.producer_id), int(r.producer_epoch)
        r = client.request(24, 3, {"v3_and_below_transactional_id": "t-wire", "v3_and_below_producer_id": pid,
                                   "v3_and_below_producer_epoch": epoch,
                                   "v3_and_below_topics": [{"name": "w", "partitions": [0]}]})
        assert int(r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code) == 0
        records = build_batch([(None, b"v", [])], producer_id=pid, producer_epoch=epoch, base_sequence=0,
                              transactional=True)
        for partition, code in ((1, INVALID_TXN_STATE), (0, 0)):
            body = {**produce_body("w", partition, records), "transactional_id": "t-wire"}
            pr = client.request(0, 9, body).responses[0].partition_responses[0]
            assert int(pr.error_code) == code
        end = {"transactional_id": "t-wire", "producer_id": pid, "producer_epoch": epoch - 1 + 2, "committed": True}
        assert int(client.request(26, 1, end).error_code) == INVALID_PRODUCER_EPOCH
        assert int(client.request(26, 3, end).error_code) == PRODUCER_FENCED
        assert int(client.request(26, 3, {**end, "producer_id": pid + 7}).error_code) == INVALID_PRODUCER_ID_MAPPING
        assert int(client.request(26, 3, {**end, "producer_epoch": epoch}).error_code) == 0
        assert int(client.request(26, 3, {**end, "producer_epoch": epoch}).error_code) == 0  # a retried commit
        assert int(client.request(26, 3, {**end, "producer_epoch": epoch, "committed": False}).error_code) == INVALID_TXN_STATE
    assert read(broker.bootstrap, "w", 2, "read_committed", expected=1) == [b"v"]


def test_txn_offsets_are_unstable_until_commit(broker) -> None:
    """OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT while an open transaction
    holds an offset of the partition; the offset appears with the commit."""
    create_topic(broker.bootstrap, "u", 1)
    fetch = {"group_id": "ug", "topics": [{"name": "u", "partition_indexes": [0]}]}

    def fetched(client: WireClient, stable: bool) -> tuple[int, int]:
        part = client.request(9, 7, {**fetch, "require_stable": stable}).topics[0].partitions[0]
        return int(part.error_code), int(part.committed_offset)

    with WireClient(broker.bootstrap) as client:
        r = client.request(22, 4, {"transactional_id": "t-u", "transaction_timeout": 60000,
                                   "producer_id": -1, "producer_epoch": -1})
        pid, epoch = int(r.producer_id), int(r.producer_epoch)
        ids = {"transactional_id": "t-u", "producer_id": pid, "producer_epoch": epoch}
        # TxnOffsetCommit before AddOffsetsToTxn is refused
        commit = {**ids, "group_id": "ug", "generation_id": -1, "member_id": "", "group_instance_id": None,
                  "topics": [{"name": "u", "partitions": [{"partition_index": 0, "committed_offset": 42,
                                                           "committed_leader_epoch": -1, "committed_metadata": "m"}]}]}
        assert int(client.request(28, 3, commit).topics[0].partitions[0].error_code) == INVALID_TXN_STATE
        assert int(client.request(25, 3, {**ids, "group_id": "ug"}).error_code) == 0
        assert int(client.request(28, 3, commit).topics[0].partitions[0].error_code) == 0
        assert fetched(client, True) == (UNSTABLE_OFFSET_COMMIT, -1)
        assert fetched(client, False) == (0, -1)
        assert int(client.request(26, 3, {**ids, "committed": True}).error_code) == 0
        assert fetched(client, True) == (0, 42)


class LoopRunner:
    """tests/txn_loop.py as a child process, restarted whenever it exits with an error (as
    after a broker restart that forgot the group's members: UNKNOWN_MEMBER_ID)."""

    def __init__(self, bootstrap: str, src: str, dst: str, log_path: Path) -> None:
        self.args = [sys.executable, "-m", "tests.txn_loop", bootstrap, src, dst, "ctp-group", "t-ctp-loop", "20", "0.1"]
        self.log_path = log_path
        self.restarts = 0
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=open(self.log_path, "ab"))

    def poll(self) -> int | None:
        """None while running; 0 once done; restarts it after an error exit."""
        rc = self.proc.poll()
        if rc is None or rc == 0:
            return rc
        self.restarts += 1
        self.proc = self._start()
        return None

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc = self._start()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _end_offsets(bootstrap: str, topic: str) -> int:
    return sum(watermarks(bootstrap, topic, p, "read_uncommitted") for p in range(2))


def _wait_progress(loop: LoopRunner, bootstrap: str, topic: str, records: int = 60, timeout: float = 90.0) -> None:
    start = _end_offsets(bootstrap, topic)
    deadline = time.monotonic() + timeout
    while _end_offsets(bootstrap, topic) < start + records:
        assert loop.poll() is None, "the loop finished before the kills: give it more input"
        assert time.monotonic() < deadline, f"no progress on {topic}: {loop.log_path.read_text()[-2000:]}"
        time.sleep(0.1)


def _run_ctp_with_kills(broker: Any, src: str, dst: str, n: int, kills: int, tmp_path: Path) -> None:
    """Feed ``n`` records to ``src``, run the loop, kill -9 the broker then the client ``kills``
    times while transactions run; then let it finish and check the output."""
    produce(broker.bootstrap, src, [b"%d" % i for i in range(n)], keys=[b"%d" % i for i in range(n)])
    loop = LoopRunner(broker.bootstrap, src, dst, tmp_path / "loop.log")
    rng = random.Random(17)
    try:
        for _ in range(kills):
            _wait_progress(loop, broker.bootstrap, dst)
            time.sleep(rng.uniform(0.0, 0.3))
            broker.kill9()
            broker.start()
            _wait_progress(loop, broker.bootstrap, dst)
            time.sleep(rng.uniform(0.0, 0.3))
            loop.kill9()
        deadline = time.monotonic() + 240
        while loop.poll() is None:
            assert time.monotonic() < deadline, loop.log_path.read_text()[-2000:]
            time.sleep(0.2)
    finally:
        loop.stop()
    want = sorted(b"out-%d" % i for i in range(n))
    committed = read(broker.bootstrap, dst, 2, "read_committed", expected=n, settle=2.0)
    assert committed == want  # every input record exactly once
    uncommitted = read(broker.bootstrap, dst, 2, "read_uncommitted", expected=n, settle=2.0)
    assert set(uncommitted) == set(want) and len(uncommitted) > n  # the killed transactions' copies


@pytest.mark.slow
def test_consume_transform_produce_survives_kill9(broker_factory, tmp_path: Path) -> None:
    """The issue's evidence: every input record exactly once in the read_committed output after
    kill -9 of the broker, then of the client, three times (about 80 s)."""
    broker = broker_factory({"group.initial.rebalance.delay.ms": "0"})
    create_topic(broker.bootstrap, "ctp-in", 2)
    create_topic(broker.bootstrap, "ctp-out", 2)
    _run_ctp_with_kills(broker, "ctp-in", "ctp-out", 3000, 3, tmp_path)


def _kcli(bootstrap: str, *args: str) -> Any:
    import json

    out = subprocess.run([sys.executable, "-m", "kcli", "-b", bootstrap, "-o", "json", *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_transactions_cli_list_describe_and_abort_hanging(broker) -> None:
    create_topic(broker.bootstrap, "h", 1)
    p = txn_producer(broker.bootstrap, "t-hang")
    p.begin_transaction()
    p.produce("h", value=b"stuck")
    p.flush(30)
    listed = _kcli(broker.bootstrap, "transactions", "list")
    assert [(t["transactional_id"], t["state"]) for t in listed] == [("t-hang", "Ongoing")]
    assert _kcli(broker.bootstrap, "transactions", "list", "--state", "CompleteCommit") == []
    assert _kcli(broker.bootstrap, "transactions", "list", "--duration-filter", "3600000") == []
    d = _kcli(broker.bootstrap, "transactions", "describe", "--transactional-id", "t-hang")
    assert (d["state"], d["partitions"], d["timeout_ms"]) == ("Ongoing", ["h-0"], 60000) and d["start_time_ms"] > 0
    producers = _kcli(broker.bootstrap, "transactions", "describe-producers", "--topic", "h", "--partition", "0")
    assert [(x["producer_id"], x["current_txn_start_offset"]) for x in producers] == [(d["producer_id"], 0)]
    assert watermarks(broker.bootstrap, "h", 0, "read_committed") == 0
    # the partition's transaction is closed by hand, as kafka-transactions.sh abort does
    r = _kcli(broker.bootstrap, "transactions", "abort", "--topic", "h", "--partition", "0", "--start-offset", "0")
    assert r["producer_id"] == d["producer_id"]
    assert watermarks(broker.bootstrap, "h", 0, "read_committed") == 2
    assert read(broker.bootstrap, "h", 1, "read_committed", settle=1.0) == []
    producers = _kcli(broker.bootstrap, "transactions", "describe-producers", "--topic", "h", "--partition", "0")
    assert producers[0]["current_txn_start_offset"] == -1
