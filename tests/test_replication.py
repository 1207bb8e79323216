"""Replication of classic partitions (issue #26, docs/replication.md): Kafka's ISR protocol
between real kcli broker processes over one PostgreSQL database.

One module-scoped three-broker cluster serves the tests (each uses its own topics); the tests that
kill, pause or wipe a broker bring it back before they end. The fault tests run idempotent
``acks=all`` confluent-kafka producers through the fault and check the history
(tests/history.py): nothing acknowledged lost, doubled or reordered, offsets contiguous.
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kcli.storage.log import AppendOrigin, PartitionLog
from kcli.storage.log_config import LogConfig
from tests.fixtures_pg import pg_server  # noqa: F401 - fixture
from tests.history import History, HistoryProducer, read_all
# the cluster fixture and its helpers live in tests/replication_cluster.py (shared with
# tests/test_replication_faults.py); the names stay importable from here
from tests.replication_cluster import (CONFIGS, LAG_MS, Cluster, cluster, create, describe,  # noqa: F401
                                       isr_full, leader_of, produce_once)
from tests.test_cluster_state import controller_of, wait_for
from tests.test_storage_log import build


# ---------------------------------------------------------------------------------------------
# the log's replication primitives
# ---------------------------------------------------------------------------------------------
def test_follower_append_keeps_offsets_and_epochs_and_truncation_rebuilds_state(tmp_path: Path) -> None:
    config = LogConfig.from_dict({"segment.bytes": "2000"})
    leader = PartitionLog.open(tmp_path / "leader-0", config)
    follower = PartitionLog.open(tmp_path / "follower-0", config)
    for epoch in (0, 0, 1, 1, 3):
        leader.append(build(3, pid=7, epoch=0, seq=leader.log_end_offset), now_ms=1, leader_epoch=epoch)
    assert leader.epoch_entries() == [(0, 0), (1, 6), (3, 12)]
    while follower.log_end_offset < leader.log_end_offset:
        res = leader.read(follower.log_end_offset, 1 << 20, upper_bound=leader.log_end_offset)
        follower.append(res.records, now_ms=2, origin=AppendOrigin.REPLICATION)
    assert follower.epoch_entries() == leader.epoch_entries()
    assert follower.read(0, 1 << 20, upper_bound=15).records == leader.read(0, 1 << 20, upper_bound=15).records
    # Kafka's LeaderEpochFileCache.endOffsetFor
    assert [follower.end_offset_for_epoch(e) for e in (-1, 0, 1, 2, 3, 4)] == \
        [(-1, -1), (0, 6), (1, 12), (1, 12), (3, 15), (-1, -1)]
    follower.set_high_watermark(5)
    assert follower.high_watermark == 5 and follower.last_stable_offset == 5
    assert follower.read(0, 1 << 20).next_offset == 3  # consumers stop at the high watermark
    assert follower.truncate_to(7) == 6  # the batch holding offset 7 goes whole
    assert follower.epoch_entries() == [(0, 0)] and follower.high_watermark == 5
    # the producer state was rebuilt: the leader's next batch of producer 7 appends after the cut
    follower.append(leader.read(6, 1 << 20, upper_bound=15).records, now_ms=3, origin=AppendOrigin.REPLICATION)
    assert follower.log_end_offset == 15 and follower.epoch_entries() == leader.epoch_entries()
    follower.close()
    reopened = PartitionLog.open(tmp_path / "follower-0", config)
    assert reopened.log_end_offset == 15 and reopened.epoch_entries() == leader.epoch_entries()
    assert reopened.truncate_fully_and_start_at(12) == 12 and reopened.log_start_offset == 12
    with pytest.raises(Exception):  # a replicated batch below the log end is refused
        reopened.append(leader.read(0, 1 << 20, upper_bound=15).records, now_ms=4, origin=AppendOrigin.REPLICATION)


def test_partition_changes_are_checked_fenced_and_elected_as_kafka_does() -> None:
    import uuid

    from kio.schema.errors import ErrorCode

    from kcli.broker.replica.controller import partition_change
    from kcli.cluster.conflicts import check_conflicts
    from kcli.metadata.metadata_log import (ClusterState, InvalidRecordError, PartitionState, apply_record,
                                            check_record, partition_record, record)
    from kcli.protocol.errors import BrokerError

    tid = uuid.uuid4()
    state = ClusterState()
    for rec in (record("TopicRecord", name="t", topicId=tid),
                partition_record(tid, PartitionState(0, 1, [1, 2, 3], [1, 2, 3]))):
        check_record(rec)
        apply_record(state, rec)
    p = state.topics["t"].partitions[0]

    def change(**d: Any) -> dict[str, Any]:
        return record("PartitionChangeRecord", topicId=tid, partitionId=0, **d)

    for bad in (change(isr=[]), change(isr=[1, 1]), change(leader=4, isr=[1]), change(leader="1")):
        with pytest.raises(InvalidRecordError):
            check_record(bad)
    shrink = change(isr=[1, 2], expectedPartitionEpoch=0, expectedLeaderEpoch=0)
    check_conflicts(state, [shrink])
    apply_record(state, shrink)
    assert p.isr == [1, 2] and p.partition_epoch == 1 and p.leader == 1
    with pytest.raises(BrokerError) as stale:  # AlterPartition's fencing: computed from epoch 0
        check_conflicts(state, [change(isr=[1], expectedPartitionEpoch=0, expectedLeaderEpoch=0)])
    assert stale.value.code == ErrorCode.invalid_update_version
    with pytest.raises(BrokerError):  # not a replica
        check_conflicts(state, [change(isr=[1, 4], expectedPartitionEpoch=1)])
    # the controller: leader 1 dead -> 2 from the ISR, epoch 1; then 2 dead too -> offline, ISR kept
    elect = partition_change(tid, p, {2, 3}, unclean=False)
    assert elect is not None and elect["data"]["leader"] == 2 and elect["data"]["isr"] == [2]
    assert elect["data"]["leaderEpoch"] == 1
    check_conflicts(state, [elect])
    apply_record(state, elect)
    assert partition_change(tid, p, {2, 3}, unclean=False) is None  # nothing more to do
    offline = partition_change(tid, p, {3}, unclean=False)
    assert offline is not None and offline["data"]["leader"] == -1 and "isr" not in offline["data"]
    unclean = partition_change(tid, p, {3}, unclean=True)
    assert unclean is not None and unclean["data"]["leader"] == 3 and unclean["data"]["isr"] == [3]
    apply_record(state, offline)
    back = partition_change(tid, p, {2}, unclean=False)  # the last ISR member returns: it leads
    assert back is not None and back["data"]["leader"] == 2 and back["data"]["leaderEpoch"] == 3


# ---------------------------------------------------------------------------------------------
# a three-broker cluster
# ---------------------------------------------------------------------------------------------
def test_rf3_topic_replicates_and_consumers_see_everything(cluster: Cluster) -> None:
    create(cluster.bootstrap, "r3", 3, 3, **{"min.insync.replicas": "2"})
    wait_for(lambda: isr_full(cluster.bootstrap, "r3", 3), 20, "every partition with a leader and ISR of 3")
    parts = describe(cluster.bootstrap, "r3")
    assert all(sorted(p.replicas) == [1, 2, 3] for p in parts.values())
    assert {p.leader for p in parts.values()} == {1, 2, 3}  # leaders spread
    history = History()
    producer = HistoryProducer(history, cluster.bootstrap, "r3", rate_per_s=500)
    time.sleep(2)
    assert producer.stop() == 0
    assert not history.failures
    summary = history.check(read_all(cluster.bootstrap, "r3", 3))
    assert summary["acknowledged"] > 200
    print("acks=all produce on RF=3:", summary)


def test_refused_factors(cluster: Cluster) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    err = admin.create_topics([NewTopic("rf4", 1, 4)])["rf4"].exception(20)
    assert err is not None and err.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR
    assert "only 3 broker(s) are registered" in err.args[0].str()
    # Kafka accepts min.insync.replicas above the replication factor at creation (KAFKA-4680 was
    # never merged); every acks=all produce is then refused with NOT_ENOUGH_REPLICAS, naming both.
    create(cluster.bootstrap, "mi3", 1, 2, **{"min.insync.replicas": "3"})
    wait_for(lambda: isr_full(cluster.bootstrap, "mi3", 2), 20, "the ISR of mi3")
    err = produce_once(cluster.bootstrap, "mi3", 0)
    assert err is not None and err.code() == KafkaError.NOT_ENOUGH_REPLICAS, err
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "1"})  # acks=1 does not need the ISR
    p.produce("mi3", b"x")
    assert p.flush(15) == 0


def test_paused_follower_leaves_the_isr_and_returns(cluster: Cluster) -> None:
    create(cluster.bootstrap, "pause", 1, 3, **{"min.insync.replicas": "2"})
    wait_for(lambda: isr_full(cluster.bootstrap, "pause", 3), 20, "the ISR of pause")
    leader = leader_of(cluster.bootstrap, "pause", 0)
    controller = controller_of(cluster.bootstrap)
    victim = next(n for n in (1, 2, 3) if n not in (leader, controller))  # a paused controller keeps its lock
    history = History()
    producer = HistoryProducer(history, cluster.bootstrap, "pause", rate_per_s=100)
    proc = cluster.brokers[victim].proc
    assert proc is not None
    proc.send_signal(signal.SIGSTOP)
    paused = time.monotonic()
    try:
        others = [b for n, b in cluster.brokers.items() if n != victim]
        wait_for(lambda: victim not in describe(others[0].bootstrap, "pause")[0].isrs, LAG_MS / 1000 + 15,
                 "the paused follower to leave the ISR")
        left = time.monotonic() - paused
        acked = len(history.acks)
        wait_for(lambda: len(history.acks) > acked + 20, 30, "acks=all produce with the ISR of 2")
    finally:
        proc.send_signal(signal.SIGCONT)
    resumed = time.monotonic()
    wait_for(lambda: isr_full(cluster.bootstrap, "pause", 3), 30, "the follower back in the ISR")
    print(f"paused follower left the ISR after {left:.1f} s (replica.lag.time.max.ms={LAG_MS}), "
          f"back {time.monotonic() - resumed:.1f} s after SIGCONT")
    assert producer.stop() == 0
    history.check(read_all(cluster.bootstrap, "pause", 1))
    cluster.wait_live({1, 2, 3})


def test_kill9_of_a_leader_loses_nothing_acknowledged(cluster: Cluster) -> None:
    """kill -9 of the leader mid-produce: 0 acknowledged records lost, 0 duplicates, order kept;
    producers acknowledged again within seconds. Then a second broker down: acks=all is refused
    with NOT_ENOUGH_REPLICAS, and succeeds again once it is back."""
    create(cluster.bootstrap, "k9", 3, 3, **{"min.insync.replicas": "2"})
    wait_for(lambda: isr_full(cluster.bootstrap, "k9", 3), 20, "the ISR of k9")
    victim = leader_of(cluster.bootstrap, "k9", 0)
    led = [i for i, p in describe(cluster.bootstrap, "k9").items() if p.leader == victim]
    history = History()
    producers = [HistoryProducer(history, cluster.bootstrap, "k9", f"p{i}", rate_per_s=150) for i in range(2)]
    time.sleep(2)
    cluster.brokers[victim].kill9()
    killed = time.monotonic()
    wait_for(lambda: any(a.partition in led for a in history.acked_between(killed)), 30,
             "an acknowledgement on a partition the killed broker led")
    recovered = min(a.at for a in history.acked_between(killed) if a.partition in led) - killed
    survivors = [n for n in (1, 2, 3) if n != victim]
    boot = cluster.brokers[survivors[0]].bootstrap
    wait_for(lambda: all(p.leader in survivors and victim not in p.isrs for p in describe(boot, "k9").values()), 15,
             "new leaders from the ISR")
    print(f"kill -9 of leader {victim}: producers acknowledged again on its partitions {recovered:.2f} s later")
    time.sleep(1)
    # a second broker down: the ISR of 1 is below min.insync.replicas=2
    second = survivors[1]
    cluster.brokers[second].kill9()
    last = survivors[0]
    boot = cluster.brokers[last].bootstrap
    wait_for(lambda: all(p.leader == last and p.isrs == [last] for p in describe(boot, "k9").values()), 15,
             "the last broker to lead alone")
    err = produce_once(boot, "k9", 0)
    assert err is not None and err.code() == KafkaError.NOT_ENOUGH_REPLICAS, err
    cluster.start(second)
    cluster.start(victim)
    wait_for(lambda: isr_full(cluster.bootstrap, "k9", 3), 40, "both back in the ISR")
    assert produce_once(cluster.bootstrap, "k9", 0) is None
    for p in producers:
        assert p.stop() == 0
    summary = history.check(read_all(cluster.bootstrap, "k9", 3))
    print("kill -9 history:", summary, "recovery s:", round(recovered, 2))
    assert recovered < 10
    cluster.wait_live({1, 2, 3})


def test_a_dead_leaders_unreplicated_suffix_is_truncated_when_it_returns(cluster: Cluster) -> None:
    """A leader appends acks=1 records its followers never copy (they are paused), dies; a follower
    from the ISR leads in a new epoch and takes other records at the same offsets. The old leader
    comes back, truncates to the new leader (OffsetForLeaderEpoch) and ends with its exact log."""
    create(cluster.bootstrap, "div", 1, 3, **{"min.insync.replicas": "1"})
    wait_for(lambda: isr_full(cluster.bootstrap, "div", 3), 20, "the ISR of div")
    acked = History()
    first = HistoryProducer(acked, cluster.bootstrap, "div", "before", rate_per_s=200)
    time.sleep(1)
    assert first.stop() == 0
    wait_for(lambda: isr_full(cluster.bootstrap, "div", 3), 20, "the followers caught up")
    old = leader_of(cluster.bootstrap, "div", 0)
    followers = [n for n in (1, 2, 3) if n != old]
    procs = [cluster.brokers[n].proc for n in followers]
    for proc in procs:
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)
    try:
        # a fetch already waiting at the leader would still carry the new records to the paused
        # follower's socket: let it be answered empty first (replica.fetch.wait.max.ms is 500)
        time.sleep(0.8)
        lost = Producer({"bootstrap.servers": cluster.brokers[old].bootstrap, "acks": "1", "linger.ms": 0})
        for i in range(20):  # acknowledged by the leader alone: they may be lost, as in Kafka
            lost.produce("div", f"acks1-{i}".encode(), partition=0)
        assert lost.flush(10) == 0
        cluster.brokers[old].kill9()
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGCONT)
    boot = cluster.brokers[followers[0]].bootstrap
    wait_for(lambda: leader_of(boot, "div", 0) in followers, 20, "a new leader from the ISR")
    second = HistoryProducer(acked, boot, "div", "after", rate_per_s=200)
    time.sleep(1.5)
    assert second.stop() == 0
    cluster.start(old)
    wait_for(lambda: isr_full(cluster.bootstrap, "div", 3), 40, "the old leader back in the ISR")
    assert "truncating div-0" in cluster.brokers[old].log_text()
    expected = read_all(cluster.bootstrap, "div", 1)
    acked.check(expected)
    assert not any(v.startswith(b"acks1-") for _, _, v in expected)  # the new leader never had them
    for n in followers:  # the old leader alone: its log must be the new leader's, record for record
        cluster.brokers[n].kill9()
    wait_for(lambda: leader_of(cluster.brokers[old].bootstrap, "div", 0) == old, 20, "the old leader to lead again")
    assert read_all(cluster.brokers[old].bootstrap, "div", 1) == expected
    for n in followers:
        cluster.start(n)
    cluster.wait_live({1, 2, 3})
    wait_for(lambda: isr_full(cluster.bootstrap, "div", 3), 40, "every broker back in the ISR of div")


def test_a_broker_with_a_wiped_data_dir_rebuilds_from_the_leaders(cluster: Cluster) -> None:
    create(cluster.bootstrap, "wipe", 2, 3, **{"min.insync.replicas": "2"})
    wait_for(lambda: isr_full(cluster.bootstrap, "wipe", 3), 20, "the ISR of wipe")
    history = History()
    producer = HistoryProducer(history, cluster.bootstrap, "wipe", rate_per_s=300)
    time.sleep(1.5)
    victim = next(n for n in (3, 2, 1) if n != controller_of(cluster.bootstrap))
    b = cluster.brokers[victim]
    b.kill9()
    shutil.rmtree(b.data_dir)
    survivor = cluster.brokers[next(n for n in (1, 2, 3) if n != victim)].bootstrap
    # back only once the controller has dropped it from every ISR (docs/replication.md: an empty
    # broker must not come back as the leader it was)
    wait_for(lambda: all(victim not in p.isrs for p in describe(survivor, "wipe").values()), 15,
             "the wiped broker to leave the ISR")
    b.start()
    wait_for(lambda: isr_full(cluster.bootstrap, "wipe", 3), 40, "the wiped broker back in the ISR")
    assert producer.stop() == 0
    # the rebuilt broker alone must hold everything: stop the others, it is elected from the ISR
    others = [n for n in (1, 2, 3) if n != victim]
    for n in others:
        cluster.brokers[n].kill9()
    wait_for(lambda: all(p.leader == victim for p in describe(b.bootstrap, "wipe").values()), 20,
             "the rebuilt broker to lead")
    history.check(read_all(b.bootstrap, "wipe", 2))
    for n in others:
        cluster.start(n)
    cluster.wait_live({1, 2, 3})
    wait_for(lambda: isr_full(cluster.bootstrap, "wipe", 3), 40, "every broker back in the ISR")


def test_operator_view_of_a_broker_down(cluster: Cluster, tmp_path: Path) -> None:
    """Metadata carries replicas, ISR and offline replicas; kcli topics describe shows them and
    filters as kafka-topics does; the replica manager's gauges count what is under-replicated."""
    import json

    from tests.fixtures_cli import run_kcli

    env = cli_environment(tmp_path)
    create(cluster.bootstrap, "ops", 3, 3, **{"min.insync.replicas": "3"})
    wait_for(lambda: isr_full(cluster.bootstrap, "ops", 3), 20, "the ISR of ops")
    victim = next(n for n in (3, 2, 1) if n != controller_of(cluster.bootstrap))
    cluster.brokers[victim].kill9()
    try:
        boot = cluster.bootstrap
        wait_for(lambda: all(victim not in p.isrs for p in describe(boot, "ops").values()), 15, "the ISR to shrink")
        for flag in ("--under-replicated-partitions", "--under-min-isr-partitions", "--unavailable-partitions"):
            out = run_kcli(env, "-b", boot, "topics", "describe", "-t", "ops", flag)
            assert out.returncode == 0, out.stderr
            lines = [line for line in out.stdout.splitlines() if line.strip()]
            assert len(lines) == 3 and all(f"Offline: {victim}" in line for line in lines), (flag, out.stdout)
            assert all("\tPartition: " in line for line in lines)  # partition lines only, as kafka-topics
        out = run_kcli(env, "-b", boot, "topics", "describe", "-t", "ops", "-o", "json")
        parts = json.loads(out.stdout)[0]["partitions"]
        assert all(p["offline_replicas"] == [victim] and victim not in p["isr"] and len(p["replicas"]) == 3 for p in parts)
        metrics = run_kcli(env, "-b", boot, "broker", "metrics", "-o", "json")
        assert metrics.returncode == 0, metrics.stderr
        under = [v for k, v in _walk(json.loads(metrics.stdout)) if k == "replica.under_replicated_partitions"]
        assert under and sum(under) >= 3, metrics.stdout[:2000]
    finally:
        cluster.start(victim)
    wait_for(lambda: isr_full(cluster.bootstrap, "ops", 3), 40, "the ISR of ops back to 3")
    out = run_kcli(env, "-b", cluster.bootstrap, "topics", "describe", "-t", "ops", "--under-replicated-partitions")
    assert out.returncode == 0 and out.stdout.strip() == "", out.stdout
    cluster.wait_live({1, 2, 3})


def cli_environment(tmp_path: Path) -> dict[str, str]:
    import os

    from tests.fixtures_cli import REPO

    env = {k: v for k, v in os.environ.items() if not k.startswith("KCLI_")}
    env["KCLI_CONFIG"], env["KCLI_DATA_DIR"] = str(tmp_path / "kcli-config.yaml"), str(tmp_path / "kcli-data")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _walk(obj: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k, v
            yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)
