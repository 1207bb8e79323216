"""Every kcli command against a cluster bootstrap list (issue #16 "Topics in a cluster", last bullet).

One module-scoped cluster: three broker processes in racks a, b and c over one PostgreSQL
database and one local file object store. The real ``kcli`` CLI runs as a subprocess. Most
tests put a dead address first in the bootstrap list, as an operator's list does after a
machine is gone: a command that still talks to "the first bootstrap broker" fails there.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kcli.protocol.client import WireClient
from tests.brokerproc import BrokerProcess
from tests.fixtures_cli import REPO, run_kcli
from tests.fixtures_pg import pg_server  # noqa: F401 - fixture
from tests.test_cluster_state import FAST, wait_for
from tests.test_tiered import TIERED_BROKER

RACKS = {1: "a", 2: "b", 3: "c"}
CONFIGS = {**FAST, **TIERED_BROKER, "delete.topic.partition.enable": "true",
           "delete.topic.partition.interval.delay.ms": "500"}


@dataclass
class Cluster:
    brokers: dict[int, BrokerProcess]
    url: str  # the cluster's PostgreSQL database (also the batch coordinator)
    objects: Path  # the shared object store
    env: dict[str, str]
    dead: str  # an address nobody listens on

    @property
    def bootstrap(self) -> str:
        """The live brokers' addresses, after a dead one."""
        return ",".join([self.dead] + [b.bootstrap for _, b in sorted(self.brokers.items()) if b.alive()])

    def kcli(self, *args: str, input: str | None = None, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        return run_kcli(self.env, "-b", self.bootstrap, *args, input=input, timeout=timeout)

    def ok(self, *args: str, input: str | None = None) -> str:
        res = self.kcli(*args, input=input)
        assert res.returncode == 0, (args, res.stdout, res.stderr)
        return res.stdout


def seen_by(broker: BrokerProcess) -> set[int]:
    """The live brokers as this one broker sees them (DescribeCluster sent to it alone)."""
    with WireClient(broker.bootstrap, timeout=10) as client:
        resp = client.request(60, 0, {"include_cluster_authorized_operations": False})
    return {int(b.broker_id) for b in resp.brokers}


@pytest.fixture(scope="module")
def cluster(pg_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:  # noqa: F811
    root = tmp_path_factory.mktemp("cluster-cli")
    url = pg_server.url(pg_server.create_database())
    objects = root / "objects"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCLI_")}
    env.update(KCLI_CONFIG=str(root / "kcli-config.yaml"), KCLI_DATA_DIR=str(root / "kcli-data"),
               PYTHONPATH=str(REPO) + ":" + env.get("PYTHONPATH", ""))
    brokers: dict[int, BrokerProcess] = {}
    dead = socket.socket()  # bound, never listening: connections are refused, the port stays taken
    dead.bind(("127.0.0.1", 0))
    try:
        for node, rack in RACKS.items():
            brokers[node] = BrokerProcess(root / f"node{node}", CONFIGS, [
                "--cluster", url, "--node-id", str(node), "--rack", rack, "--object-store", objects.as_uri()]).start()
        c = Cluster(brokers, url, objects, env, f"127.0.0.1:{dead.getsockname()[1]}")
        wait_for(lambda: all(seen_by(b) == {1, 2, 3} for b in brokers.values()), 20,
                 "every broker to see the three registered brokers")  # placement uses its own view
        yield c
    finally:
        for b in brokers.values():
            b.stop()
        dead.close()


def topic_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def describe(cluster: Cluster, topic: str) -> dict:
    return json.loads(cluster.ok("topics", "describe", "-t", topic, "-o", "json"))[0]


# ---- topics ----------------------------------------------------------------------------------


def test_topics_describe_shows_each_partitions_broker_and_rack(cluster: Cluster) -> None:
    classic, diskless = topic_name("classic"), topic_name("diskless")
    cluster.ok("topics", "create", "-t", classic, "--partitions", "6")
    cluster.ok("topics", "create", "-t", diskless, "--partitions", "3", "--replication-factor", "3", "--diskless")

    desc = describe(cluster, classic)
    parts = desc["partitions"]
    assert {p["leader"] for p in parts} == {1, 2, 3}  # hosted over the three brokers
    for p in parts:
        assert p["replicas"] == [p["leader"]] and p["offline_replicas"] == []
        assert p["leader_rack"] == RACKS[p["leader"]] and p["replica_racks"] == [RACKS[p["leader"]]]
    for p in describe(cluster, diskless)["partitions"]:  # metadata-only replicas in every rack
        assert sorted(p["replica_racks"]) == ["a", "b", "c"]
        assert p["replica_racks"] == [RACKS[r] for r in p["replicas"]]

    table = cluster.ok("topics", "describe", "-t", classic)
    for p in parts:
        assert (f"Partition: {p['partition']}\tLeader: {p['leader']}\tReplicas: {p['leader']}\tIsr: {p['leader']}"
                f"\tLeaderRack: {RACKS[p['leader']]}\tReplicaRacks: {RACKS[p['leader']]}") in table

    # alter (configs, more partitions) and list work through the same list
    cluster.ok("topics", "alter", "-t", classic, "--partitions", "7", "--config", "retention.ms=3600000")
    desc = describe(cluster, classic)
    assert desc["partition_count"] == 7 and desc["configs"] == {"retention.ms": "3600000"}
    kinds = {t["topic"]: t["kind"] for t in json.loads(cluster.ok("topics", "list", "-o", "json"))}
    assert kinds[classic] == "classic" and kinds[diskless] == "diskless"


def test_shrink_asks_each_partitions_host_and_every_host_deletes_its_log(cluster: Cluster) -> None:
    """A classic partition's record count is known only to the broker holding its log, and only
    that broker can delete the log: the plan asks each host, and after a delete-now every
    removed partition's directory is gone from its own host."""
    topic = topic_name("shrink")
    cluster.ok("topics", "create", "-t", topic, "--partitions", "6")
    hosts = {p["partition"]: p["leader"] for p in describe(cluster, topic)["partitions"]}
    assert {hosts[p] for p in (3, 4, 5)} == {1, 2, 3}, hosts  # rack-alternated placement
    for p in range(6):
        cluster.ok("produce", "-t", topic, "--partition", str(p), input="".join(f"r{i}\n" for i in range(p + 1)))

    plan = json.loads(cluster.ok("topics", "alter", "-t", topic, "--partitions", "3", "--dry-run", "-o", "json"))
    assert {p["partition"]: p["records"] for p in plan["partition_deletion"]["partitions"]} == {3: 4, 4: 5, 5: 6}
    refused = cluster.kcli("topics", "alter", "-t", topic, "--partitions", "3")
    assert refused.returncode == 2 and "destroys 15 records" in refused.stderr, refused.stderr

    cluster.ok("topics", "alter", "-t", topic, "--partitions", "3", "--yes")
    dirs = {p: cluster.brokers[hosts[p]].data_dir / f"{topic}-{p}" for p in range(6)}
    wait_for(lambda: not any(dirs[p].exists() for p in (3, 4, 5)), 20, "every host to delete its removed partition")
    assert all(dirs[p].is_dir() for p in range(3))
    wait_for(lambda: describe(cluster, topic)["partition_count"] == 3, 10, "the topic to show 3 partitions")


def test_tiering_is_disabled_and_enabled_again_through_the_bootstrap_list(cluster: Cluster) -> None:
    topic = topic_name("tiered")
    cluster.ok("topics", "create", "-t", topic, "--partitions", "3", "--config", "remote.storage.enable=true")
    desc = describe(cluster, topic)
    assert desc["kind"] == "tiered" and desc["tiered_state"] == "ENABLED"
    assert {p["leader"] for p in desc["partitions"]} == {1, 2, 3}
    cluster.ok("produce", "-t", topic, input="".join(f"value-{i:05d}\n" for i in range(200)))

    plan = json.loads(cluster.ok("topics", "alter", "-t", topic, "--disable-tiering", "--policy", "delete",
                                 "--dry-run", "-o", "json"))
    assert plan["dry_run"] is True and plan["policy"] == "delete"
    assert describe(cluster, topic)["tiered_state"] == "ENABLED"
    cluster.ok("topics", "alter", "-t", topic, "--disable-tiering", "--policy", "delete")
    wait_for(lambda: describe(cluster, topic)["tiered_state"] == "DISABLED", 30, "tiering disabled on every host")
    cluster.ok("topics", "alter", "-t", topic, "--enable-tiering")
    again = describe(cluster, topic)
    assert again["tiered_state"] == "ENABLED" and again["tiered_epoch"] > desc["tiered_epoch"]  # a new epoch


# ---- brokers ---------------------------------------------------------------------------------


def test_broker_metrics_shows_every_broker_and_node_id_picks_one(cluster: Cluster) -> None:
    docs = json.loads(cluster.ok("broker", "metrics", "-o", "json"))
    assert sorted((d["node_id"], d["rack"]) for d in docs) == [(1, "a"), (2, "b"), (3, "c")]
    assert len({d["cluster_id"] for d in docs}) == 1
    one = json.loads(cluster.ok("broker", "metrics", "--node-id", "2", "-o", "json"))
    assert one["node_id"] == 2 and one["address"] == cluster.brokers[2].bootstrap
    table = cluster.ok("broker", "metrics")
    for node, b in cluster.brokers.items():
        assert f"broker {node}  rack {RACKS[node]}  at {b.bootstrap}" in table
    missing = cluster.kcli("broker", "metrics", "--node-id", "9")
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1
    assert "broker 9 is not a live broker" in missing.stderr and "(live: 1, 2, 3)" in missing.stderr


# ---- diskless tools and dump-log ---------------------------------------------------------------


def test_diskless_tools_online_offline_and_dump_log_of_the_shared_store(cluster: Cluster) -> None:
    topic = topic_name("dl")
    cluster.ok("topics", "create", "-t", topic, "--partitions", "3", "--diskless")
    for p in range(3):  # through the bootstrap list; the objects land in the shared store
        cluster.ok("produce", "-t", topic, "--partition", str(p), input="".join(f"{p}-{i}\n" for i in range(10)))

    online = json.loads(cluster.ok("diskless", "describe", "-t", topic, "-o", "json"))
    assert [t["totals"]["messages"] for t in online["topics"]] == [30]
    objects = json.loads(cluster.ok("diskless", "objects", "-t", topic, "-o", "json"))["objects"]
    assert objects and all((cluster.objects / o["object_key"]).is_file() for o in objects)
    assert "OK" in cluster.ok("diskless", "verify")
    gc = json.loads(cluster.ok("diskless", "gc", "--dry-run", "-o", "json"))
    assert gc["dry_run"] is True and gc["errors"] == []

    # offline: the cluster database is the coordinator, the shared store the object store
    offline = ["--coordinator", cluster.url, "--object-store", cluster.objects.as_uri()]
    doc = json.loads(run_kcli(cluster.env, "diskless", "describe", "-t", topic, "--coordinator", cluster.url,
                              "-o", "json").stdout)
    assert [t["totals"]["messages"] for t in doc["topics"]] == [30]
    res = run_kcli(cluster.env, "diskless", "verify", *offline, "--engine", "local")
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr

    key = objects[0]["object_key"]
    res = run_kcli(cluster.env, "dump-log", (cluster.objects / key).as_uri(), "--coordinator", cluster.url)
    assert res.returncode == 0, res.stderr
    assert f"topic: {topic}" in res.stdout and "isvalid: true" in res.stdout
    res = run_kcli(cluster.env, "dump-log", cluster.objects.as_uri() + "/wal/", "-o", "json")
    assert res.returncode == 0 and res.stdout.count("\n") >= len(objects), res.stderr


# ---- runbooks --------------------------------------------------------------------------------


def test_a_runbook_runs_against_the_cluster_bootstrap_list(cluster: Cluster, tmp_path: Path) -> None:
    topic = topic_name("rb")
    book = tmp_path / "book.yaml"
    book.write_text(textwrap.dedent(f"""
        bootstrap_server: "{cluster.bootstrap}"
        steps:
          - topics.create: {{topic: {topic}, partitions: 6}}
          - produce: {{topic: {topic}, count: 60, template: "v-{{i}}"}}
          - topics.alter: {{topic: {topic}, partitions: 2, yes: true}}
          - topics.describe: {{topic: {topic}}}
            wait_for: {{describe: topics, topic: {topic}, path: partition_count, equals: 2, timeout: 10s}}
          - topics.create: {{topic: {topic}-dl, partitions: 2, diskless: true}}
          - produce: {{topic: {topic}-dl, count: 20, template: "d-{{i}}"}}
          - diskless.describe: {{topic: {topic}-dl}}
            expect: {{path: totals.messages, equals: 20}}
          - diskless.verify: {{}}
          - diskless.gc: {{dry_run: true}}
        """).lstrip())
    res = run_kcli(cluster.env, "runbook", "run", str(book), "-o", "json", timeout=120)
    assert res.returncode == 0, (res.stdout, res.stderr)


# ---- a broker down (last: it restarts the broker) ---------------------------------------------------


def test_a_dead_brokers_partitions_show_offline_and_the_others_keep_working(cluster: Cluster) -> None:
    topic = topic_name("offline")
    cluster.ok("topics", "create", "-t", topic, "--partitions", "6")
    hosts = {p["partition"]: p["leader"] for p in describe(cluster, topic)["partitions"]}
    b3 = cluster.brokers[3]
    b3.kill9()
    try:
        wait_for(lambda: all(seen_by(cluster.brokers[n]) == {1, 2} for n in (1, 2)), 15,
                 "broker 3's lease to expire on both survivors")
        parts = {p["partition"]: p for p in describe(cluster, topic)["partitions"]}
        for i, host in hosts.items():
            if host == 3:
                assert parts[i]["leader"] is None and parts[i]["offline_replicas"] == [3], parts[i]
            else:
                assert parts[i]["leader"] == host and parts[i]["offline_replicas"] == []
        table = cluster.ok("topics", "describe", "-t", topic)
        offline = [i for i, h in hosts.items() if h == 3]
        assert f"Partition: {offline[0]}\tLeader: none\tReplicas: 3\tIsr: \tLeaderRack: -\tReplicaRacks: -\tOffline: 3" in table
        docs = json.loads(cluster.ok("broker", "metrics", "-o", "json"))
        assert sorted(d["node_id"] for d in docs) == [1, 2]
        assert "OK" in cluster.ok("diskless", "verify")
    finally:
        b3.start()
    wait_for(lambda: all(seen_by(b) == {1, 2, 3} for b in cluster.brokers.values()), 20, "broker 3 back")
