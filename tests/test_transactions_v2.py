"""Transactions v2 (KIP-890 part 2) against a real broker. librdkafka 2.16 does not implement it
(its EndTxn stays at v1, AddPartitionsToTxn at v0, and it reads no transaction.version), so a
scripted wire client (kcli.protocol.client.WireClient) plays a Kafka 4 TV2 producer: Produce v12
without AddPartitionsToTxn, EndTxn v5 with its epoch bump, TxnOffsetCommit v5 without
AddOffsetsToTxn, across a classic and a diskless partition; confluent-kafka's TV1 producer keeps
working on the same broker, read_committed consumers see only committed records."""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest
from kio.schema.errors import ErrorCode

from kcli.dumplog.synth import build_batch
from kcli.protocol import codec
from kcli.protocol.client import WireClient
from tests.brokerproc import BrokerProcess
from tests.diskless_helpers import DISKLESS, FAST
from tests.fixtures_pg import pg_database, pg_server  # noqa: F401 - fixtures
from tests.kafka_helpers import create_topic
from tests.test_transactions import read, txn_producer

TOPICS = ("tv2-c", "tv2-d")  # classic, diskless


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("tv2") / "data", FAST).start()
    try:
        create_topic(b.bootstrap, "tv2-c", 1)
        create_topic(b.bootstrap, "tv2-d", 1, DISKLESS)
        yield b
    finally:
        b.stop()


class Tv2Producer:
    """A minimal Kafka 4 transactional producer speaking transactions v2 on the wire."""

    def __init__(self, client: WireClient, tid: str, leader: WireClient | None = None) -> None:
        self.c, self.tid = client, tid  # the transaction's coordinator
        self.leader = leader or client  # where Produce goes
        r = client.request(22, 5, {"transactional_id": tid, "transaction_timeout": 60000,
                                   "producer_id": -1, "producer_epoch": -1})
        assert int(r.error_code) == 0
        self.pid, self.epoch = int(r.producer_id), int(r.producer_epoch)
        self.seq: dict[str, int] = {}

    def produce(self, topic: str, value: bytes, epoch: int | None = None) -> int:
        epoch = self.epoch if epoch is None else epoch
        seq = self.seq.get(topic, 0)
        records = build_batch([(None, value, [])], timestamps=[int(time.time() * 1000)],  # inside the retention
                              producer_id=self.pid, producer_epoch=epoch, base_sequence=seq, transactional=True)
        body = {"transactional_id": self.tid, "acks": -1, "timeout": 30000,
                "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": records}]}]}
        code = int(self.leader.request(0, 12, body).responses[0].partition_responses[0].error_code)
        if code == 0:
            self.seq[topic] = seq + 1
        return code

    def produce_pipelined(self, topic: str, values: list[bytes]) -> list[tuple[int, int]]:
        """One Produce v12 per value, all sent before any answer is read (as a client with
        several requests in flight): (error, base offset) of each."""
        sent = []
        for value in values:
            seq = self.seq.get(topic, 0)
            records = build_batch([(None, value, [])], timestamps=[int(time.time() * 1000)], producer_id=self.pid,
                                  producer_epoch=self.epoch, base_sequence=seq, transactional=True)
            self.seq[topic] = seq + 1
            corr, frame = self.leader.encode_request(0, 12, {
                "transactional_id": self.tid, "acks": -1, "timeout": 30000,
                "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": records}]}]})
            self.leader.send_raw(frame)
            sent.append(corr)
        out = []
        for corr in sent:
            pr = codec.decode_response(0, 12, self.leader.recv_frame(), corr).responses[0].partition_responses[0]
            out.append((int(pr.error_code), int(pr.base_offset)))
        return out

    def end(self, commit: bool, epoch: int | None = None) -> tuple[int, int, int]:
        r = self.c.request(26, 5, {"transactional_id": self.tid, "producer_id": self.pid,
                                   "producer_epoch": self.epoch if epoch is None else epoch, "committed": commit})
        return int(r.error_code), int(r.producer_id), int(r.producer_epoch)

    def next_transaction(self, pid: int, epoch: int) -> None:
        """After EndTxn v5: the bumped epoch (or new id) starts every sequence at 0."""
        self.pid, self.epoch, self.seq = pid, epoch, {}


def describe(c: WireClient, tid: str) -> Any:
    return c.request(65, 0, {"transactional_ids": [tid]}).transaction_states[0]


def test_tv2_commit_and_abort_across_classic_and_diskless(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        p = Tv2Producer(c, "tv2-wire")
        pid, e0 = p.pid, p.epoch
        # 1: the first Produce v12 adds each partition (no AddPartitionsToTxn), then commit
        assert [p.produce(t, b"c1-" + t.encode()) for t in TOPICS] == [0, 0]
        st = describe(c, "tv2-wire")
        assert st.transaction_state == "Ongoing"
        assert sorted((t.topic, tuple(t.partitions)) for t in st.topics) == [("tv2-c", (0,)), ("tv2-d", (0,))]
        assert p.end(True) == (0, pid, e0 + 1)  # EndTxn v5: the epoch is bumped
        assert p.end(True, epoch=e0) == (0, pid, e0 + 1)  # a retry of it is answered the same way
        assert p.end(False, epoch=e0)[0] == ErrorCode.invalid_txn_state  # but not the opposite result
        p.next_transaction(pid, e0 + 1)
        # 2: aborted
        assert [p.produce(t, b"a2-" + t.encode()) for t in TOPICS] == [0, 0]
        assert p.end(False) == (0, pid, e0 + 2)
        # a zombie write with the ended transaction's epoch is fenced, and opens nothing
        assert p.produce("tv2-c", b"zombie", epoch=e0 + 1) == ErrorCode.invalid_producer_epoch
        p.next_transaction(pid, e0 + 2)
        assert describe(c, "tv2-wire").transaction_state == "CompleteAbort"
        # 3: committed, with offsets sent by TxnOffsetCommit v5 alone (no AddOffsetsToTxn)
        assert [p.produce(t, b"c3-" + t.encode()) for t in TOPICS] == [0, 0]
        r = c.request(28, 5, {"transactional_id": "tv2-wire", "group_id": "tv2-group", "producer_id": pid,
                              "producer_epoch": e0 + 2, "generation_id": -1, "member_id": "",
                              "group_instance_id": None, "topics": [{"name": "tv2-c", "partitions": [
                                  {"partition_index": 0, "committed_offset": 3, "committed_leader_epoch": -1,
                                   "committed_metadata": ""}]}]})
        assert int(r.topics[0].partitions[0].error_code) == 0
        assert p.end(True) == (0, pid, e0 + 3)
        p.next_transaction(pid, e0 + 3)
        # an abort with nothing open still ends with a bump; a commit with nothing open is refused
        assert p.end(False) == (0, pid, e0 + 4)
        assert p.end(True, epoch=e0 + 4)[0] == ErrorCode.invalid_txn_state
        # an epoch that is not the current one
        assert p.end(True, epoch=e0 + 9)[0] == ErrorCode.producer_fenced
        off = c.request(9, 8, {"groups": [{"group_id": "tv2-group", "topics": [{"name": "tv2-c", "partition_indexes": [0]}]}],
                               "require_stable": True})
        assert int(off.groups[0].topics[0].partitions[0].committed_offset) == 3
    for t in TOPICS:
        committed = [b"c1-" + t.encode(), b"c3-" + t.encode()]
        assert read(broker.bootstrap, t, 1, "read_committed", expected=2, settle=1.0) == committed
        assert read(broker.bootstrap, t, 1, "read_uncommitted", expected=3, settle=1.0) == \
            sorted(committed + [b"a2-" + t.encode()])


def test_a_new_instance_fences_a_tv2_producer(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        old = Tv2Producer(c, "tv2-fence")
        assert old.produce("tv2-d", b"open") == 0
        new = c.request(22, 5, {"transactional_id": "tv2-fence", "transaction_timeout": 60000,
                                "producer_id": -1, "producer_epoch": -1})
        assert int(new.error_code) == ErrorCode.concurrent_transactions  # the open one is aborted first
        assert old.produce("tv2-c", b"late") == ErrorCode.invalid_producer_epoch
        assert old.end(True)[0] == ErrorCode.producer_fenced


def test_add_partitions_to_txn_v5_is_for_brokers_only(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        p = Tv2Producer(c, "tv2-v5")
        for verify_only in (True, False):
            r = c.request(24, 5, {"transactions": [{"transactional_id": "tv2-v5", "producer_id": p.pid,
                                                    "producer_epoch": p.epoch, "verify_only": verify_only,
                                                    "topics": [{"name": "tv2-c", "partitions": [0]}]}]})
            assert int(r.error_code) == ErrorCode.cluster_authorization_failed
        assert describe(c, "tv2-v5").transaction_state == "Empty"  # nothing was added


def test_tv1_librdkafka_producer_still_works_with_tv2_enabled(broker: BrokerProcess) -> None:
    """confluent-kafka 2.16 (TV1: AddPartitionsToTxn, EndTxn v1) commits and aborts transactions
    spanning a classic and a diskless topic of the TV2 broker."""
    create_topic(broker.bootstrap, "tv1-c", 1)
    create_topic(broker.bootstrap, "tv1-d", 1, DISKLESS)
    p = txn_producer(broker.bootstrap, "tv1-mixed")
    for value, commit in ((b"c1", True), (b"a2", False), (b"c3", True)):
        p.begin_transaction()
        for t in ("tv1-c", "tv1-d"):
            p.produce(t, value=value + t.encode())
        p.flush(30)
        p.commit_transaction(30) if commit else p.abort_transaction(30)
    for t in ("tv1-c", "tv1-d"):
        committed = [b"c1" + t.encode(), b"c3" + t.encode()]
        assert read(broker.bootstrap, t, 1, "read_committed", expected=2, settle=0.5) == committed
        assert read(broker.bootstrap, t, 1, "read_uncommitted", expected=3, settle=0.5) == \
            sorted(committed + [b"a2" + t.encode()])


def test_transaction_version_1_keeps_clients_on_v1(tmp_path: Any) -> None:
    b = BrokerProcess(tmp_path / "data", {**FAST, "transaction.version": "1"}).start()
    try:
        with WireClient(b.bootstrap) as c:
            av = c.request(18, 3, {"client_software_name": "apache-kafka-java", "client_software_version": "4.0.0"})
            assert {f.name: int(f.max_version_level) for f in av.finalized_features}["transaction.version"] == 1
            r = c.request(22, 5, {"transactional_id": "tv1", "transaction_timeout": 60000,
                                  "producer_id": -1, "producer_epoch": -1})
            end = c.request(26, 5, {"transactional_id": "tv1", "producer_id": r.producer_id,
                                    "producer_epoch": r.producer_epoch, "committed": False})
            assert int(end.error_code) == ErrorCode.unsupported_version
    finally:
        b.stop()


def test_tv2_in_a_cluster_adds_partitions_at_the_coordinator_on_another_broker(broker_factory, pg_database,  # noqa: F811
                                                                                tmp_path: Any) -> None:
    """Node 1 coordinates the id; Produce v12 reaches node 2 (the classic partition's host, and a
    diskless partition), which adds the partitions at node 1 (AddPartitionsToTxn v5); the
    TxnOffsetCommit v5 reaches the group's coordinator, node 2, which adds the group at node 1."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.test_cluster_groups import cluster, group_for
    from tests.test_cluster_state import brokers_of, wait_for
    from tests.test_cluster_transactions import create, txn_id_for

    objects = tmp_path / "objects"
    b = {n: cluster(broker_factory, pg_database, n, objects) for n in (1, 2)}
    for x in b.values():
        wait_for(lambda x=x: set(brokers_of(x.bootstrap)) == {1, 2}, 10, "two brokers")
    create(b[1].bootstrap, "ctv", [[2]])
    admin = AdminClient({"bootstrap.servers": b[1].bootstrap})  # alive until the result
    admin.create_topics([NewTopic("dtv", 1, 1, config=DISKLESS)])["dtv"].result(15)
    tid = txn_id_for([1, 2], 1, "tv2-cluster")
    group = group_for(([1, 2], 2))
    with WireClient(b[1].bootstrap) as one, WireClient(b[2].bootstrap) as two:
        p = Tv2Producer(one, tid, leader=two)
        pid, e0 = p.pid, p.epoch
        for round_, commit in enumerate((True, False, True)):
            if round_ == 0:  # in flight together: each asks node 1 first, and still they land in order
                answers = p.produce_pipelined("ctv", [b"p%d" % i for i in range(4)])
                assert answers == [(0, i) for i in range(4)], answers
            assert [p.produce(t, b"r%d-%s" % (round_, t.encode())) for t in ("ctv", "dtv")] == [0, 0]
            if round_ == 0:
                r = two.request(28, 5, {"transactional_id": tid, "group_id": group, "producer_id": pid,
                                        "producer_epoch": p.epoch, "generation_id": -1, "member_id": "",
                                        "group_instance_id": None, "topics": [{"name": "ctv", "partitions": [
                                            {"partition_index": 0, "committed_offset": 1,
                                             "committed_leader_epoch": -1, "committed_metadata": ""}]}]})
                assert int(r.topics[0].partitions[0].error_code) == 0
            assert p.end(commit) == (0, pid, e0 + round_ + 1)
            p.next_transaction(pid, e0 + round_ + 1)
        # a zombie's Produce on node 2 is refused by node 1's check
        assert p.produce("ctv", b"zombie", epoch=e0) == ErrorCode.invalid_producer_epoch
        off = two.request(9, 8, {"groups": [{"group_id": group, "topics": [{"name": "ctv", "partition_indexes": [0]}]}],
                                 "require_stable": True})
        assert int(off.groups[0].topics[0].partitions[0].committed_offset) == 1
    pipelined = [b"p%d" % i for i in range(4)]
    for t in ("ctv", "dtv"):
        assert read(b[1].bootstrap, t, 1, "read_committed", expected=2, settle=1.0) == sorted(
            [b"r0-" + t.encode(), b"r2-" + t.encode()] + (pipelined if t == "ctv" else []))


def test_exhausted_epoch_gets_a_new_producer_id_at_end_txn(broker_factory) -> None:  # noqa: ANN001
    """At epoch 32766 (Short.MaxValue - 1), not before, EndTxn v5 writes the markers with 32767 and
    hands the producer a new id at epoch 0, as Kafka does. The state log is given that epoch while the
    broker is down (a state line as the coordinator writes it), since 32k transactions take too long."""
    from kcli.coordinator.transaction.state import TransactionMetadata
    from kcli.crcjson import decode_line, encode_line

    b = broker_factory(FAST)
    create_topic(b.bootstrap, "tv2-x", 1)
    with WireClient(b.bootstrap) as c:
        pid = Tv2Producer(c, "tv2-exhaust").pid
    b.stop()
    path = b.data_dir / "__transaction_state" / "transactions.log"
    lines = [decode_line(line) for line in path.read_bytes().splitlines()]
    md = TransactionMetadata.from_record([r for r in lines if r and r.get("transactional_id") == "tv2-exhaust"][-1])
    md.producer_epoch = 32765
    with open(path, "ab") as f:
        f.write(encode_line(md.to_record()))
    b.start()
    with WireClient(b.bootstrap) as c:
        p = Tv2Producer.__new__(Tv2Producer)
        p.c = p.leader = c
        p.tid, p.pid, p.epoch, p.seq = "tv2-exhaust", pid, 32765, {}
        assert p.produce("tv2-x", b"next-to-last") == 0
        assert p.end(True) == (0, pid, 32766)  # not exhausted yet: the same id
        p.next_transaction(pid, 32766)
        assert p.produce("tv2-x", b"last-of-its-id") == 0
        err, new_pid, new_epoch = p.end(True)
        assert (err, new_epoch) == (0, 0) and new_pid != pid
        p.next_transaction(new_pid, 0)
        assert p.produce("tv2-x", b"first-of-the-new-id") == 0
        assert p.end(True) == (0, new_pid, 1)
        # the old id's late write is refused
        p.pid, p.epoch = pid, 32766
        assert p.produce("tv2-x", b"zombie") == ErrorCode.invalid_producer_id_mapping
    assert read(b.bootstrap, "tv2-x", 1, "read_committed", expected=3, settle=1.0) == [
        b"first-of-the-new-id", b"last-of-its-id", b"next-to-last"]
