"""Transactions on diskless partitions (issue #17): the batch coordinator keeps each partition's
open transactions, aborted ranges and last stable offset (seed 004); markers are control batches
committed through WAL objects. Real broker processes, confluent-kafka and kafka-python."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kcli.protocol.client import WireClient
from plugins.coordinator.sqlite import SqliteBatchCoordinator
from tests.diskless_helpers import DISKLESS, FAST, wait_until
from tests.fixtures_pg import pg_database, pg_server  # noqa: F401 - fixtures
from tests.kafka_helpers import create_topic, produce
from tests.test_transactions import (
    _run_ctp_with_kills,
    check_commit_and_abort,
    check_kafka_python_commit_and_abort,
    check_send_offsets,
    read,
    txn_producer,
    watermarks,
)


def test_commit_abort_and_lso_on_a_diskless_topic(broker_factory) -> None:
    b = broker_factory(FAST)
    create_topic(b.bootstrap, "dtx", 2, DISKLESS)
    check_commit_and_abort(b.bootstrap, "dtx", "t-dl")


def test_describe_producers_answers_the_coordinators_state(broker_factory) -> None:
    b = broker_factory(FAST)
    create_topic(b.bootstrap, "dprod", 1, DISKLESS)
    p = txn_producer(b.bootstrap, "t-dprod")
    p.begin_transaction()
    p.produce("dprod", value=b"v0")
    p.flush(30)
    with WireClient(b.bootstrap) as client:
        r = client.request(61, 0, {"topics": [{"name": "dprod", "partition_indexes": [0]}]})
    part = r.topics[0].partitions[0]
    assert int(part.error_code) == 0
    assert [(int(x.producer_epoch), int(x.last_sequence), int(x.current_txn_start_offset))
            for x in part.active_producers] == [(0, 0, 0)]
    p.abort_transaction(30)


def test_one_transaction_spans_a_classic_and_a_diskless_topic(broker_factory) -> None:
    b = broker_factory(FAST)
    create_topic(b.bootstrap, "mix-classic", 1)
    create_topic(b.bootstrap, "mix-diskless", 1, DISKLESS)
    p = txn_producer(b.bootstrap, "t-mix")
    for n, commit in enumerate((True, False, True)):
        p.begin_transaction()
        p.produce("mix-classic", value=b"c-%d" % n)
        p.produce("mix-diskless", value=b"d-%d" % n)
        if commit:
            p.commit_transaction(30)
        else:
            p.flush(30)
            p.abort_transaction(30)
    for topic, prefix in (("mix-classic", b"c"), ("mix-diskless", b"d")):
        assert read(b.bootstrap, topic, 1, "read_committed", expected=2) == [prefix + b"-0", prefix + b"-2"]
        assert read(b.bootstrap, topic, 1, "read_uncommitted", expected=3) == [prefix + b"-%d" % i for i in range(3)]
        assert watermarks(b.bootstrap, topic, 0, "read_committed") == 6  # 3 records + 3 markers


def test_send_offsets_with_a_diskless_input_topic(broker_factory) -> None:
    b = broker_factory(FAST)
    create_topic(b.bootstrap, "din", 1, DISKLESS)
    create_topic(b.bootstrap, "dout", 1, DISKLESS)
    check_send_offsets(b.bootstrap, "din", "dout", "dctp", "t-dctp")


def test_kafka_python_on_a_diskless_topic(broker_factory) -> None:
    b = broker_factory(FAST)
    create_topic(b.bootstrap, "dkp", 1, DISKLESS)
    check_kafka_python_commit_and_abort(b.bootstrap, "dkp")


def test_kill9_with_an_open_diskless_transaction_is_aborted_after_restart(broker_factory) -> None:
    b = broker_factory({**FAST, "transaction.abort.timed.out.transaction.cleanup.interval.ms": "300"})
    create_topic(b.bootstrap, "dk", 1, DISKLESS)
    p = txn_producer(b.bootstrap, "t-dkill", **{"transaction.timeout.ms": 3000})
    p.begin_transaction()
    p.produce("dk", value=b"c1")
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce("dk", value=b"open")
    p.flush(30)
    assert watermarks(b.bootstrap, "dk", 0, "read_committed") == 2
    b.kill9()
    b.start()
    # the open transaction is in the coordinator's state; the transaction coordinator's timeout
    # aborts it, and the ABORT marker reaches the diskless partition
    assert watermarks(b.bootstrap, "dk", 0, "read_committed") == 2
    deadline = time.monotonic() + 30
    while watermarks(b.bootstrap, "dk", 0, "read_committed") == 2 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert watermarks(b.bootstrap, "dk", 0, "read_committed") == 4  # record + ABORT marker
    assert read(b.bootstrap, "dk", 1, "read_committed", expected=1, settle=1.0) == [b"c1"]
    assert read(b.bootstrap, "dk", 1, "read_uncommitted", expected=2, settle=1.0) == [b"c1", b"open"]


def test_consume_transform_produce_on_diskless_survives_a_kill9(broker_factory, tmp_path: Path) -> None:
    """The default run's short variant of the slow loop: 300 records, one kill of each."""
    broker = broker_factory({**FAST})
    create_topic(broker.bootstrap, "dctp-in", 2, DISKLESS)
    create_topic(broker.bootstrap, "dctp-out", 2, DISKLESS)
    _run_ctp_with_kills(broker, "dctp-in", "dctp-out", 300, 1, tmp_path)


def test_compaction_keeps_what_read_committed_sees(broker_factory) -> None:
    """The diskless cleaner never cleans at or above the LSO (an open transaction's record is not
    yet the latest of its key) and never maps an aborted record as the latest of its key."""
    b = broker_factory({**FAST, "log.cleaner.backoff.ms": "200"})
    create_topic(b.bootstrap, "dcomp", 1, {**DISKLESS, "cleanup.policy": "compact",
                                           "min.cleanable.dirty.ratio": "0.01"})
    produce(b.bootstrap, "dcomp", [b"v1"], keys=[b"k"])
    p = txn_producer(b.bootstrap, "t-dcomp")
    p.begin_transaction()
    p.produce("dcomp", key=b"k", value=b"v2")
    p.flush(30)

    def checkpoint() -> int | None:
        c = SqliteBatchCoordinator(b.data_dir / "diskless" / "coordinator.db", read_only=True)
        try:
            (log,) = [i for i in c.describe_logs() if i.topic_id_partition.topic == "dcomp"]
            return c.cleaner_checkpoint(log.topic_id_partition)
        finally:
            c.close()

    # while the transaction is open, the cleaner stops at its first offset (the LSO, 1)
    wait_until(lambda: checkpoint() == 1, timeout=60, what="a pass up to the LSO")
    time.sleep(1.0)  # several more rounds
    assert checkpoint() == 1
    assert read(b.bootstrap, "dcomp", 1, "read_uncommitted", expected=2, settle=1.0) == [b"v1", b"v2"]
    p.abort_transaction(30)
    produce(b.bootstrap, "dcomp", [b"x"], keys=[b"other"])  # v1 0, v2 1, ABORT marker 2, x 3
    wait_until(lambda: checkpoint() == 4, timeout=60, what="a pass over the aborted transaction")
    assert read(b.bootstrap, "dcomp", 1, "read_committed", expected=2, settle=1.0) == [b"v1", b"x"]
    # the pass dropped the aborted record itself: read_uncommitted consumers no longer see it either
    assert read(b.bootstrap, "dcomp", 1, "read_uncommitted", expected=2, settle=1.0) == [b"v1", b"x"]


@pytest.mark.slow
def test_consume_transform_produce_on_diskless_survives_kill9_three_times(broker_factory, tmp_path: Path) -> None:
    """The issue's evidence over diskless input and output topics: every input record exactly once
    in the read_committed output after kill -9 of the broker, then of the client, three times."""
    broker = broker_factory({**FAST})
    create_topic(broker.bootstrap, "dctp-in", 2, DISKLESS)
    create_topic(broker.bootstrap, "dctp-out", 2, DISKLESS)
    _run_ctp_with_kills(broker, "dctp-in", "dctp-out", 3000, 3, tmp_path)


def test_transactions_on_a_postgresql_coordinator_span_classic_and_diskless(broker_factory, pg_database: str) -> None:
    """Cluster mode's coordinator: the same state in PostgreSQL (kill -9 included)."""
    b = broker_factory(FAST, extra_args=["--coordinator", pg_database])
    create_topic(b.bootstrap, "pgtx", 2, DISKLESS)
    check_commit_and_abort(b.bootstrap, "pgtx", "t-pg")
    create_topic(b.bootstrap, "pg-classic", 1)
    p = txn_producer(b.bootstrap, "t-pg-mix")
    p.begin_transaction()
    p.produce("pg-classic", value=b"c-open")
    p.produce("pgtx", value=b"d-open", partition=1)
    p.flush(30)
    b.kill9()
    b.start()
    # partition 1: c1 c3 c5 COMMIT a1 a3 ABORT, then the open transaction's record at 7 holds the LSO
    assert (watermarks(b.bootstrap, "pgtx", 1, "read_committed"), watermarks(b.bootstrap, "pgtx", 1, "read_uncommitted")) \
        == (7, 8)
    q = txn_producer(b.bootstrap, "t-pg-mix")  # re-initialising aborts the open transaction
    q.begin_transaction()
    q.produce("pg-classic", value=b"c-ok")
    q.produce("pgtx", value=b"d-ok", partition=1)
    q.commit_transaction(30)
    assert read(b.bootstrap, "pg-classic", 1, "read_committed", expected=1) == [b"c-ok"]
    committed = sorted([b"c%d" % i for i in range(6)] + [b"last", b"d-ok"])
    assert read(b.bootstrap, "pgtx", 2, "read_committed", expected=8) == committed
