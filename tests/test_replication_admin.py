"""The controller's replica operations (issue #26 items 2 and 6, docs/replication.md): preferred
and unclean leader elections (ElectLeaders, auto.leader.rebalance.enable, `kcli topics
elect-leaders`, kafka-leader-election.sh) and partition reassignment (AlterPartitionReassignments,
ListPartitionReassignments, `kcli partitions reassign`, kafka-reassign-partitions.sh).

One module-scoped three-broker cluster over PostgreSQL (tests/test_replication.py's Cluster) with
a 2 s leader-imbalance check; a ballast topic keeps each broker's imbalance ratio under the 10 %
threshold, so a leader the tests move away on purpose stays there until they elect it back.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.brokerproc import BrokerProcess
from tests.fixtures_pg import pg_server  # noqa: F401 - fixture
from tests.history import History, HistoryProducer, read_all
from tests.test_output_formats import assert_documented
from tests.test_cluster_state import controller_of, wait_for
from tests.test_replication import CONFIGS, Cluster, cli_environment, create, describe, isr_full

# A paused (SIGSTOP) broker must stay registered while a CLI process started after the pause asks
# for the move to it: with the 3 s lease of CONFIGS, a CLI start on a loaded machine outlives the
# lease and the target is refused ("Unknown broker id"). A killed broker still leaves at once (its
# node lock goes with its database session), so elections are not slowed down.
ADMIN_CONFIGS = {**CONFIGS, "leader.imbalance.check.interval.seconds": "2", "broker.session.timeout.ms": "10000"}
BIN = Path(sys.executable).parent


class AdminCluster(Cluster):
    def make(self, node: int) -> BrokerProcess:
        return BrokerProcess(self.root / f"node{node}", ADMIN_CONFIGS,
                             ["--cluster", self.url, "--node-id", str(node), "--rack", "abc"[node - 1]])


@pytest.fixture(scope="module")
def cluster(pg_server, tmp_path_factory) -> Iterator[AdminCluster]:  # noqa: F811
    url = pg_server.url(pg_server.create_database())
    c = AdminCluster(url, tmp_path_factory.mktemp("replication-admin"))
    c.start(1)
    wait_for(lambda: controller_of(c.brokers[1].bootstrap) == 1, 15, "broker 1 to be the controller")
    c.start(2)
    c.start(3)
    c.wait_live({1, 2, 3})
    time.sleep(1)
    c.wait_live({1, 2, 3})
    # ballast: 15 partitions preferred by each broker, so one partition led elsewhere is 1/16 < 10 %
    create(c.bootstrap, "ballast", 45, 2)
    settle(c, "ballast")
    yield c
    for b in c.brokers.values():
        if b.proc is not None:
            try:
                b.proc.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
        b.stop()


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    return cli_environment(tmp_path_factory.mktemp("cli"))


def kcli(env: dict[str, str], cluster: AdminCluster, *args: str) -> subprocess.CompletedProcess[str]:
    from tests.fixtures_cli import run_kcli

    return run_kcli(env, "-b", cluster.bootstrap, *args)


def tool(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / name), *args], capture_output=True, text=True, timeout=60)


def create_assigned(bootstrap: str, name: str, assignment: list[list[int]], **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, len(assignment), replica_assignment=assignment, config=configs)])[name].result(20)


def replicas_of(bootstrap: str, topic: str) -> dict[int, list[int]]:
    return {i: list(p.replicas) for i, p in describe(bootstrap, topic).items()}


def balanced(bootstrap: str, topic: str) -> bool:
    parts = describe(bootstrap, topic)
    return all(p.leader == p.replicas[0] and len(p.isrs) == len(p.replicas) for p in parts.values())


def settle(cluster: AdminCluster, *topics: str) -> None:
    """Wait for full ISRs, then elect every preferred leader (ElectLeaders for all partitions), so
    a test starts from a balanced cluster whatever moved leaders before it."""
    for t in topics:
        wait_for(lambda t=t: all(len(p.isrs) == len(p.replicas) for p in describe(cluster.bootstrap, t).values()), 40,
                 f"the ISRs of {t}")

    def elected() -> bool:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})  # kept alive until the result
        admin.elect_leaders(ElectionType.PREFERRED, None).result(20)
        return all(balanced(cluster.bootstrap, t) for t in topics)

    wait_for(elected, 40, f"preferred leaders of {', '.join(topics)}")


# ---------------------------------------------------------------------------------------------
# the rules (pure functions, Kafka's PartitionChangeBuilder)
# ---------------------------------------------------------------------------------------------
def test_reassignment_and_election_rules() -> None:
    import uuid

    from kio.schema.errors import ErrorCode

    from kcli.broker.replica import controller as c
    from kcli.cluster.conflicts import check_conflicts
    from kcli.metadata.metadata_log import (ClusterState, InvalidRecordError, PartitionState, apply_record,
                                            check_record, partition_record, record)

    tid = uuid.uuid4()
    st = ClusterState()
    for rec in (record("TopicRecord", name="t", topicId=tid), partition_record(tid, PartitionState(0, 1, [1], [1]))):
        apply_record(st, rec)
    p = st.topics["t"].partitions[0]

    def apply(rec: Any) -> None:
        check_record(rec)
        check_conflicts(st, [rec])
        apply_record(st, rec)

    # RF 1 -> 3: the new replicas are added, and the move waits for them to join the ISR
    apply(c.reassign(tid, p, [1, 2, 3], {1, 2, 3}))
    assert (p.replicas, p.adding_replicas, p.removing_replicas, p.isr) == ([1, 2, 3], [2, 3], [], [1])
    assert c.completion_records(st, {1, 2, 3}, lambda t: True) == []
    apply(record("PartitionChangeRecord", topicId=tid, partitionId=0, isr=[1, 2], expectedPartitionEpoch=p.partition_epoch))
    assert c.completion_records(st, {1, 2, 3}, lambda t: True) == []  # 3 not in the ISR yet
    apply(record("PartitionChangeRecord", topicId=tid, partitionId=0, isr=[1, 2, 3], expectedPartitionEpoch=p.partition_epoch))
    [done] = c.completion_records(st, {1, 2, 3}, lambda t: True)
    apply(done)
    assert (p.replicas, p.adding_replicas, p.isr, p.leader) == ([1, 2, 3], [], [1, 2, 3], 1)
    # 3 -> 2 removing the leader: completes at once (the target is in the ISR), a new leader, epoch up
    epoch = p.leader_epoch
    apply(c.reassign(tid, p, [3, 2], {1, 2, 3}))
    assert (p.replicas, p.isr, p.leader, p.leader_epoch) == ([3, 2], [2, 3], 3, epoch + 1)
    # a move adding 1 and removing 3, cancelled: the original replicas in the reassignment's order
    # (Kafka's PartitionReassignmentRevert: replicas minus adding), 1 out of the ISR, leader kept
    apply(c.reassign(tid, p, [2, 1], {1, 2, 3}))
    assert (p.replicas, p.adding_replicas, p.removing_replicas) == ([2, 1, 3], [1], [3])
    apply(c.cancel(tid, p, {1, 2, 3}, unclean_allowed=False))
    assert (p.replicas, p.adding_replicas, p.removing_replicas, p.leader) == ([2, 3], [], [], 3)
    # the leader is no longer the preferred replica: a preferred election moves it
    code, _msg, rec = c.elect_leader(st, "t", 0, c.PREFERRED, {2, 3})
    assert code == ErrorCode.none and rec["data"]["leader"] == 2
    assert c.elect_leader(st, "t", 0, c.PREFERRED, {3})[0] == ErrorCode.preferred_leader_not_available
    apply(rec)
    assert c.elect_leader(st, "t", 0, c.PREFERRED, {2, 3})[0] == ErrorCode.election_not_needed
    assert c.elect_leader(st, "t", 0, c.UNCLEAN, {2, 3})[0] == ErrorCode.election_not_needed
    assert c.elect_leader(st, "t", 7, c.PREFERRED, {2, 3})[0] == ErrorCode.unknown_topic_or_partition
    assert c.elect_leader(st, "nope", 0, c.PREFERRED, {2, 3})[0] == ErrorCode.unknown_topic_or_partition
    # offline (leader -1, last ISR [2] down): unclean elects the live replica 3, alone in the ISR
    apply(record("PartitionChangeRecord", topicId=tid, partitionId=0, leader=-1, isr=[2], leaderEpoch=p.leader_epoch + 1,
                 expectedPartitionEpoch=p.partition_epoch))
    assert c.elect_leader(st, "t", 0, c.UNCLEAN, set())[0] == ErrorCode.eligible_leaders_not_available
    code, _msg, rec = c.elect_leader(st, "t", 0, c.UNCLEAN, {3})
    assert code == ErrorCode.none and rec["data"]["leader"] == 3 and rec["data"]["isr"] == [3]
    # the records are checked before they are written
    for bad in ({"replicas": []}, {"replicas": [1, 1]}, {"replicas": [1], "addingReplicas": [2]},
                {"replicas": [1, 2], "addingReplicas": [2], "removingReplicas": [2]}, {"replicas": [1], "leader": 2}):
        with pytest.raises(InvalidRecordError):
            check_record(record("PartitionChangeRecord", topicId=tid, partitionId=0, **bad))


def test_a_caught_up_follower_outside_the_isr_holds_the_high_watermark(tmp_path: Path) -> None:
    """KAFKA-7128, and what let RF 1 -> 3 under load hang: a follower outside the ISR that fetched
    the leader's log end holds the HW back (within replica.lag.time.max.ms), so at its next fetch
    its log end is at the HW and it joins, however fast the ISR members fetch."""
    from kcli.broker.replica.partition import LeaderPartition
    from kcli.storage.log import PartitionLog
    from kcli.storage.log_config import LogConfig
    from tests.test_storage_log import build

    lg = PartitionLog.open(tmp_path / "t-0", LogConfig.from_dict({}))
    lg.append(build(10, pid=-1, epoch=-1, seq=-1), now_ms=1, leader_epoch=0)
    lg.set_high_watermark(0)
    lp = LeaderPartition("t", 0, lg, 0, [1, 2, 3], [1, 2], 1, lag_max_ms=3000)
    lp.follower_fetched(3, 10)  # 3 (adding) fetched at the log end: caught up
    lg.append(build(5, pid=-1, epoch=-1, seq=-1), now_ms=2, leader_epoch=0)
    lp.follower_fetched(2, 15)  # the ISR member is further on
    lp.maybe_increase_hw()
    assert lg.high_watermark == 10  # held at 3's log end, not 15
    lp.follower_fetched(3, 15)
    assert lp.expand_candidates() == [3]


# ---------------------------------------------------------------------------------------------
# elections
# ---------------------------------------------------------------------------------------------
def reorder(env: dict[str, str], cluster: AdminCluster, topic: str, partition: int) -> list[int]:
    """Rotate the replicas so the current leader is no longer the preferred one (a reassignment
    that only reorders completes at once and keeps the leader). Retried when leadership moved
    meanwhile (a broker's restart elsewhere in the suite can still be settling)."""
    for _attempt in range(5):
        settle(cluster, "ballast", topic)
        current = describe(cluster.bootstrap, topic)[partition]
        leader = current.leader
        target = [r for r in current.replicas if r != leader] + [leader]
        out = kcli(env, cluster, "partitions", "reassign", "execute", "-t", topic, "--partition", str(partition),
                   "--replicas", ",".join(map(str, target)))
        assert out.returncode == 0, out.stderr
        wait_for(lambda: list(describe(cluster.bootstrap, topic)[partition].replicas) == target, 15,
                 "the new replica order")
        time.sleep(0.5)
        if describe(cluster.bootstrap, topic)[partition].leader == leader:
            return target
    raise AssertionError("leadership kept moving")


def test_preferred_leader_election_on_demand(cluster: AdminCluster, env: dict[str, str]) -> None:
    create(cluster.bootstrap, "pe", 2, 3)
    settle(cluster, "ballast", "pe")
    # kcli topics elect-leaders
    target = reorder(env, cluster, "pe", 0)
    out = kcli(env, cluster, "topics", "elect-leaders", "-t", "pe")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["Successfully completed leader election (PREFERRED) for partitions pe-0",
                                       "Valid replica already elected for partitions pe-1"]
    assert describe(cluster.bootstrap, "pe")[0].leader == target[0]
    out = kcli(env, cluster, "-o", "json", "topics", "elect-leaders", "-t", "pe", "--partition", "1")
    assert json.loads(out.stdout) == [{"topic": "pe", "partition": 1, "error": "ELECTION_NOT_NEEDED", "message": None,
                                       "result": "not_needed"}]
    assert_documented("kcli topics elect-leaders", json.loads(out.stdout))
    # kafka-leader-election.sh
    target = reorder(env, cluster, "pe", 0)
    res = tool("kafka-leader-election.sh", "--bootstrap-server", cluster.bootstrap, "--election-type", "PREFERRED",
               "--topic", "pe", "--partition", "0")
    assert res.returncode == 0 and res.stdout == "Successfully completed leader election (PREFERRED) for partitions pe-0\n", res
    assert describe(cluster.bootstrap, "pe")[0].leader == target[0]
    res = tool("kafka-leader-election.sh", "--bootstrap-server", cluster.bootstrap, "--election-type", "preferred",
               "--topic", "pe", "--partition", "9")
    assert res.returncode == 1
    assert res.stdout == ("Error completing leader election (PREFERRED) for partition: pe-9: org.apache.kafka.common."
                          "errors.UnknownTopicOrPartitionException: No such partition as pe-9\n"), res.stdout
    assert res.stderr == "1 replica(s) could not be elected\n"
    # the Admin API of a real client (librdkafka's ElectLeaders)
    target = reorder(env, cluster, "pe", 0)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    got = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition("pe", 0), TopicPartition("pe", 1)]).result(20)
    assert got[TopicPartition("pe", 0)] is None
    assert got[TopicPartition("pe", 1)] is not None and "ELECTION_NOT_NEEDED" in got[TopicPartition("pe", 1)].name()
    assert describe(cluster.bootstrap, "pe")[0].leader == target[0]


def test_preferred_leaders_come_back_after_a_restart(cluster: AdminCluster) -> None:
    """auto.leader.rebalance.enable: a restarted broker leads its preferred partitions again once
    it is back in their ISR (leader.imbalance.check.interval.seconds=2 here)."""
    create(cluster.bootstrap, "auto", 3, 3, **{"min.insync.replicas": "2"})
    settle(cluster, "ballast", "auto")
    victim = next(n for n in (3, 2) if n != controller_of(cluster.bootstrap))
    preferred = [i for i, p in describe(cluster.bootstrap, "auto").items() if p.replicas[0] == victim]
    history = History()
    producer = HistoryProducer(history, cluster.bootstrap, "auto", rate_per_s=200)
    time.sleep(1)
    cluster.brokers[victim].kill9()
    other = cluster.brokers[next(n for n in (1, 2, 3) if n != victim)].bootstrap
    wait_for(lambda: all(describe(other, "auto")[i].leader != victim for i in preferred), 15, "leaders moved away")
    cluster.start(victim)
    back = time.monotonic()
    wait_for(lambda: balanced(cluster.bootstrap, "auto"), 40, "the preferred leaders back")
    print(f"preferred leaders back {time.monotonic() - back:.1f} s after the restart")
    assert producer.stop() == 0
    history.check(read_all(cluster.bootstrap, "auto", 3))
    cluster.wait_live({1, 2, 3})
    wait_for(lambda: balanced(cluster.bootstrap, "ballast"), 40, "ballast balanced again")


def test_unclean_election_only_when_asked(cluster: AdminCluster, env: dict[str, str]) -> None:
    controller = controller_of(cluster.bootstrap)
    a, b = [n for n in (1, 2, 3) if n != controller]
    create_assigned(cluster.bootstrap, "unc", [[a, b]])
    wait_for(lambda: isr_full(cluster.bootstrap, "unc", 2), 20, "the ISR of unc")
    boot = cluster.brokers[controller].bootstrap
    cluster.brokers[b].kill9()
    wait_for(lambda: describe(boot, "unc")[0].isrs == [a], 15, "the ISR down to the leader")
    cluster.brokers[a].kill9()
    wait_for(lambda: describe(boot, "unc")[0].leader == -1, 15, "unc offline")
    cluster.start(b)  # not in the last ISR: the partition stays offline
    time.sleep(3)
    assert describe(boot, "unc")[0].leader == -1
    out = kcli(env, cluster, "topics", "elect-leaders", "-t", "unc", "--partition", "0")
    assert out.returncode == 1
    assert out.stdout == ("Error completing leader election (PREFERRED) for partition: unc-0: org.apache.kafka.common."
                          "errors.PreferredLeaderNotAvailableException: The preferred leader was not available.\n")
    out = kcli(env, cluster, "topics", "elect-leaders", "-t", "unc", "--partition", "0", "--election-type", "unclean")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == "Successfully completed leader election (UNCLEAN) for partitions unc-0\n"
    wait_for(lambda: describe(boot, "unc")[0].leader == b, 15, "the unclean leader")
    assert describe(boot, "unc")[0].isrs == [b]
    res = tool("kafka-leader-election.sh", "--bootstrap-server", cluster.bootstrap, "--election-type", "UNCLEAN",
               "--topic", "unc", "--partition", "0")
    assert res.returncode == 0 and res.stdout == "Valid replica already elected for partitions unc-0\n", res
    cluster.start(a)
    cluster.wait_live({1, 2, 3})
    wait_for(lambda: isr_full(cluster.bootstrap, "unc", 2), 40, "the old leader back in the ISR")


# ---------------------------------------------------------------------------------------------
# reassignment
# ---------------------------------------------------------------------------------------------
def data_dirs(cluster: AdminCluster, topic: str, partition: int) -> set[int]:
    return {n for n, b in cluster.brokers.items() if (b.data_dir / f"{topic}-{partition}").exists()}


def test_reassignment_under_load_loses_nothing(cluster: AdminCluster, env: dict[str, str], tmp_path: Path) -> None:
    """Move a replica off a broker (its log deleted, the leader moved off it), add one (RF 2 -> 3),
    RF 1 -> 3 and 3 -> 2, with acks=all producers running; the move completes only once the new
    replicas are in the ISR."""
    controller = controller_of(cluster.bootstrap)
    x, y = [n for n in (1, 2, 3) if n != controller]
    create_assigned(cluster.bootstrap, "mv", [[x, controller], [controller, y]], **{"min.insync.replicas": "2"})
    create_assigned(cluster.bootstrap, "rf", [[y]])
    wait_for(lambda: isr_full(cluster.bootstrap, "mv", 2), 20, "the ISR of mv")
    history, rf_history = History(), History()
    producers = [HistoryProducer(history, cluster.bootstrap, "mv", f"p{i}", rate_per_s=150) for i in range(2)]
    producers.append(HistoryProducer(rf_history, cluster.bootstrap, "rf", "rf", rate_per_s=150))
    time.sleep(1.5)
    # the broker that will receive mv-0 is paused: the move cannot complete before it catches up
    proc = cluster.brokers[y].proc
    assert proc is not None
    plan = {"version": 1, "partitions": [{"topic": "mv", "partition": 0, "replicas": [y, controller]},
                                          {"topic": "mv", "partition": 1, "replicas": [controller, y, x]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    proc.send_signal(signal.SIGSTOP)
    try:
        res = tool("kafka-reassign-partitions.sh", "--bootstrap-server", cluster.brokers[controller].bootstrap,
                   "--execute", "--reassignment-json-file", str(tmp_path / "plan.json"))
        assert res.returncode == 0, res.stdout + res.stderr
        assert res.stdout.splitlines() == [
            "Current partition replica assignment", "",
            json.dumps({"version": 1, "partitions": [
                {"topic": "mv", "partition": 0, "replicas": [x, controller], "log_dirs": ["any", "any"]},
                {"topic": "mv", "partition": 1, "replicas": [controller, y], "log_dirs": ["any", "any"]}]},
                separators=(",", ":")),
            "", "Save this to use as the --reassignment-json-file option during rollback",
            "Successfully started partition reassignments for mv-0,mv-1"]
        time.sleep(1.5)
        res = tool("kafka-reassign-partitions.sh", "--bootstrap-server", cluster.brokers[controller].bootstrap, "--list")
        assert f"mv-0: replicas: {y},{controller},{x}. adding: {y}. removing: {x}." in res.stdout, res.stdout
        assert res.stdout.startswith("Current partition reassignments:\n")
        out = kcli(env, cluster, "-b", cluster.brokers[controller].bootstrap, "partitions", "reassign", "verify",
                   "--reassignment-json-file", str(tmp_path / "plan.json"))
        assert "Reassignment of partition mv-0 is still in progress." in out.stdout, out.stdout + out.stderr
        assert x in data_dirs(cluster, "mv", 0)
    finally:
        proc.send_signal(signal.SIGCONT)
    # RF 1 -> 3 of a partition with data, while its producer runs
    out = kcli(env, cluster, "partitions", "reassign", "execute", "-t", "rf", "--partition", "0", "--replicas",
               f"{y},{x},{controller}", "--additional")
    assert out.returncode == 0, out.stdout + out.stderr
    wait_for(lambda: "No partition reassignments found." in kcli(env, cluster, "partitions", "reassign", "list").stdout,
             40, "every reassignment to complete")
    res = tool("kafka-reassign-partitions.sh", "--bootstrap-server", cluster.bootstrap, "--verify",
               "--reassignment-json-file", str(tmp_path / "plan.json"))
    assert res.stdout.splitlines() == ["Status of partition reassignment:", "Reassignment of partition mv-0 is completed.",
                                       "Reassignment of partition mv-1 is completed."], res.stdout
    parts = describe(cluster.bootstrap, "mv")
    assert list(parts[0].replicas) == [y, controller] and sorted(parts[0].isrs) == sorted([y, controller])
    assert parts[0].leader in (y, controller)  # the leader was moved off x
    out = kcli(env, cluster, "-o", "json", "partitions", "reassign", "verify", "--reassignment-json-file",
               str(tmp_path / "plan.json"))
    assert [d["state"] for d in json.loads(out.stdout)] == ["completed", "completed"], out.stdout + out.stderr
    assert_documented("kcli partitions reassign verify", json.loads(out.stdout))
    assert list(parts[1].replicas) == [controller, y, x] and len(parts[1].isrs) == 3
    wait_for(lambda: data_dirs(cluster, "mv", 0) == {y, controller}, 15, "x's log of mv-0 deleted")
    assert data_dirs(cluster, "mv", 1) == {1, 2, 3}
    wait_for(lambda: isr_full(cluster.bootstrap, "rf", 3), 30, "rf at RF 3")
    assert data_dirs(cluster, "rf", 0) == {1, 2, 3}
    # 3 -> 2 (the controller's replica goes), producers still running
    out = kcli(env, cluster, "-o", "json", "partitions", "reassign", "execute", "-t", "rf", "--partition", "0",
               "--replicas", f"{y},{x}")
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["previous"]["partitions"][0]["replicas"] == [y, x, controller]
    assert_documented("kcli partitions reassign execute", json.loads(out.stdout))
    wait_for(lambda: list(describe(cluster.bootstrap, "rf")[0].replicas) == [y, x], 20, "rf at RF 2")
    wait_for(lambda: data_dirs(cluster, "rf", 0) == {x, y}, 15, "the controller's log of rf-0 deleted")
    time.sleep(1)
    for p in producers:
        assert p.stop() == 0
    summary = history.check(read_all(cluster.bootstrap, "mv", 2))
    rf_summary = rf_history.check(read_all(cluster.bootstrap, "rf", 1))
    print("reassignment under load:", summary, rf_summary)
    assert summary["acknowledged"] > 300 and rf_summary["acknowledged"] > 200
    cluster.wait_live({1, 2, 3})


def test_cancel_list_and_refusals(cluster: AdminCluster, env: dict[str, str], tmp_path: Path) -> None:
    from kio.schema.errors import ErrorCode

    from kcli.protocol.client import WireClient

    controller = controller_of(cluster.bootstrap)
    x, y = [n for n in (1, 2, 3) if n != controller]
    create_assigned(cluster.bootstrap, "cx", [[controller, x]])
    wait_for(lambda: isr_full(cluster.bootstrap, "cx", 2), 20, "the ISR of cx")
    before = replicas_of(cluster.bootstrap, "cx")
    # an unknown broker: one clear error, exit 2, nothing changed
    out = kcli(env, cluster, "partitions", "reassign", "execute", "-t", "cx", "--partition", "0", "--replicas",
               f"{controller},9")
    assert out.returncode == 2 and out.stdout == "", out
    assert out.stderr.strip().splitlines() == ["Error: Unknown broker id 9"] or \
        out.stderr.strip().endswith("Unknown broker id 9"), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    res = tool("kafka-reassign-partitions.sh", "--bootstrap-server", cluster.bootstrap, "--execute",
               "--reassignment-json-file", str(_plan(tmp_path, "cx", 0, [controller, 9])))
    assert res.returncode == 1 and res.stdout == "Error: Unknown broker id 9\n", res
    with WireClient(cluster.brokers[x].bootstrap) as w:  # the API itself, on a broker that is not the controller
        resp = w.request(45, 0, {"timeout": 5000, "topics": [
            {"name": "cx", "partitions": [{"partition_index": 0, "replicas": [controller, 9]},
                                          {"partition_index": 5, "replicas": [controller]}]},
            {"name": "nope", "partitions": [{"partition_index": 0, "replicas": [controller]}]}]})
        codes = {(t.name, int(p.partition_index)): (int(p.error_code), p.error_message) for t in resp.responses
                 for p in t.partitions}
        assert codes[("cx", 0)] == (ErrorCode.invalid_replica_assignment, "The manual partition assignment includes "
                                    "broker 9, but no such broker is registered.")
        assert codes[("cx", 5)][0] == ErrorCode.unknown_topic_or_partition
        assert codes[("nope", 0)][0] == ErrorCode.unknown_topic_or_partition
        resp = w.request(45, 0, {"timeout": 5000, "topics": [
            {"name": "cx", "partitions": [{"partition_index": 0, "replicas": None}]}]})
        assert int(resp.responses[0].partitions[0].error_code) == ErrorCode.no_reassignment_in_progress
    assert replicas_of(cluster.bootstrap, "cx") == before
    # a move to a paused broker stays in progress; list shows it; cancel takes it back
    proc = cluster.brokers[y].proc
    assert proc is not None
    proc.send_signal(signal.SIGSTOP)
    try:
        out = kcli(env, cluster, "-b", cluster.brokers[controller].bootstrap, "partitions", "reassign", "execute",
                   "-t", "cx", "--partition", "0", "--replicas", f"{controller},{y}")
        assert out.returncode == 0, out.stdout + out.stderr
        out = kcli(env, cluster, "-b", cluster.brokers[controller].bootstrap, "-o", "json", "partitions", "reassign",
                   "list")
        assert json.loads(out.stdout) == [{"topic": "cx", "partition": 0, "replicas": [controller, y, x],
                                           "adding_replicas": [y], "removing_replicas": [x]}]
        assert_documented("kcli partitions reassign list", json.loads(out.stdout))
        out = kcli(env, cluster, "-b", cluster.brokers[controller].bootstrap, "-o", "json", "partitions", "reassign",
                   "cancel", "-t", "cx", "--partition", "0")
        assert out.returncode == 0 and json.loads(out.stdout) == [
            {"topic": "cx", "partition": 0, "error": None, "message": None}], out
        assert_documented("kcli partitions reassign cancel", json.loads(out.stdout))
    finally:
        proc.send_signal(signal.SIGCONT)
    assert replicas_of(cluster.brokers[controller].bootstrap, "cx") == before
    out = kcli(env, cluster, "partitions", "reassign", "cancel", "-t", "cx", "--partition", "0")
    assert out.returncode == 0 and out.stdout == "None of the specified partition reassignments are active.\n"
    res = tool("kafka-reassign-partitions.sh", "--bootstrap-server", cluster.bootstrap, "--list")
    assert res.returncode == 0 and res.stdout == "No partition reassignments found.\n"
    cluster.wait_live({1, 2, 3})
    wait_for(lambda: data_dirs(cluster, "cx", 0) == {controller, x}, 20, "the cancelled replica's log deleted")
    # --generate proposes a placement of the topic over the broker list (Kafka's JSON, nothing changes)
    (tmp_path / "move.json").write_text(json.dumps({"version": 1, "topics": [{"topic": "cx"}]}))
    res = tool("kafka-reassign-partitions.sh", "--bootstrap-server", cluster.bootstrap, "--generate",
               "--topics-to-move-json-file", str(tmp_path / "move.json"), "--broker-list", f"{x},{y}")
    lines = res.stdout.splitlines()
    assert lines[0] == "Current partition replica assignment" and lines[3] == "Proposed partition reassignment configuration"
    proposed = json.loads(lines[4])["partitions"]
    assert [sorted(p["replicas"]) for p in proposed] == [sorted([x, y])]
    out = kcli(env, cluster, "-o", "json", "partitions", "reassign", "plan", "-t", "cx", "--broker-list", f"{x},{y}")
    assert out.returncode == 0, out.stdout + out.stderr
    assert [sorted(p["replicas"]) for p in json.loads(out.stdout)["proposed"]["partitions"]] == [sorted([x, y])]
    assert_documented("kcli partitions reassign plan", json.loads(out.stdout))


def _plan(tmp_path: Path, topic: str, partition: int, replicas: list[int]) -> Path:
    path = tmp_path / f"{topic}-{partition}.json"
    path.write_text(json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": partition,
                                                              "replicas": replicas}]}))
    return path
