"""`kcli partitions reassign execute --throttle` and `kafka-reassign-partitions --execute
--throttle` set Kafka's replication throttle configs (the two ``*.replication.throttled.replicas``
topic configs, the two ``*.replication.throttled.rate`` broker configs), the move catches up at
about the throttled byte rate, and a completed verify or a cancel removes them all. Real brokers
(the session's three-broker feature cluster, 2 x 1 s quota window), real CLI processes; configs
are read back with DescribeConfigs through confluent-kafka."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic, ResourceType

from tests.fixtures_cli import run_kcli
from tests.fixtures_pg import pg_server  # noqa: F401 - fixture
from tests.replication_cluster import FEATURE_CONFIGS, FeatureCluster, describe, feature_cluster  # noqa: F401
from tests.test_cluster_state import wait_for
from tests.test_replication import cli_environment
from tests.test_replication_throttle import fill

RATE = 250_000  # bytes/s
BIN = Path(sys.executable).parent
RATES = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")
LISTS = ("leader.replication.throttled.replicas", "follower.replication.throttled.replicas")


@pytest.fixture
def tc(feature_cluster: FeatureCluster) -> FeatureCluster:  # noqa: F811
    assert FEATURE_CONFIGS["replication.quota.window.num"] == "2"
    return feature_cluster


def own_configs(bootstrap: str, kind: ResourceType, name: str, keys: tuple[str, ...]) -> dict[str, str | None]:
    """The values of ``keys`` set on the resource itself (DescribeConfigs; absent when not set)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(kind, name)
    entries = admin.describe_configs([res])[res].result(20)
    dynamic = {ConfigSource.DYNAMIC_TOPIC_CONFIG.value, ConfigSource.DYNAMIC_BROKER_CONFIG.value}
    return {k: entries[k].value for k in keys if k in entries and entries[k].source in dynamic}


def kcli(tc: FeatureCluster, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    res = run_kcli(env, "-b", tc.bootstrap, *args)
    assert res.returncode == 0, res.stderr
    return res


def make_topic(tc: FeatureCluster, name: str) -> int:
    admin = AdminClient({"bootstrap.servers": tc.bootstrap})
    admin.create_topics([NewTopic(name, 1, replica_assignment=[[1]])])[name].result(20)
    return fill(tc.bootstrap, name)


def test_throttled_execute_sets_the_configs_and_verify_after_completion_removes_them(tc, tmp_path):
    env = cli_environment(tmp_path)
    size = make_topic(tc, "rth1")
    start = time.monotonic()
    out = kcli(tc, env, "partitions", "reassign", "execute", "-t", "rth1", "--partition", "0", "--replicas", "1,2",
               "--throttle", str(RATE)).stdout
    assert f"The inter-broker throttle limit was set to {RATE} B/s" in out
    assert own_configs(tc.bootstrap, ResourceType.TOPIC, "rth1", LISTS) == {LISTS[0]: "0:1", LISTS[1]: "0:2"}
    for node in ("1", "2"):
        assert own_configs(tc.bootstrap, ResourceType.BROKER, node, RATES) == dict.fromkeys(RATES, str(RATE))
    assert own_configs(tc.bootstrap, ResourceType.BROKER, "3", RATES) == {}  # not involved

    # while the move runs, verify leaves the throttles
    early = kcli(tc, env, "partitions", "reassign", "verify", "-t", "rth1", "--partition", "0", "--replicas", "1,2")
    assert "still in progress" in early.stdout, early.stdout  # 1.2 MB at 250 kB/s: several seconds
    assert "Throttle was removed." not in early.stdout
    assert own_configs(tc.bootstrap, ResourceType.TOPIC, "rth1", LISTS)[LISTS[1]] == "0:2"

    wait_for(lambda: sorted(describe(tc.bootstrap, "rth1")[0].isrs) == [1, 2], 60, "rth1 moved")
    rate = size / (time.monotonic() - start)
    assert rate <= 1.6 * RATE, rate  # the throttle held (one window's burst aside)

    def done() -> str | None:
        res = kcli(tc, env, "partitions", "reassign", "verify", "-t", "rth1", "--partition", "0", "--replicas", "1,2")
        assert "warning" not in res.stderr, res.stderr
        return res.stdout if "completed" in res.stdout else None

    out = wait_for(done, 20, "verify to report completion")
    assert "Throttle was removed." in out, out
    assert own_configs(tc.bootstrap, ResourceType.TOPIC, "rth1", LISTS) == {}
    for node in ("1", "2", "3"):
        assert own_configs(tc.bootstrap, ResourceType.BROKER, node, RATES) == {}
    print(f"throttled catch-up {rate / 1e3:.0f} kB/s (throttle {RATE / 1e3:.0f} kB/s)")


def test_the_kafka_tool_sets_the_throttles_a_rerun_changes_the_rates_and_cancel_removes_them(tc, tmp_path):
    env = cli_environment(tmp_path)
    make_topic(tc, "rth2")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": "rth2", "partition": 0, "replicas": [1, 3]}]}))
    # a topic's own entries are kept: the throttles are merged into them
    kcli(tc, env, "topics", "alter", "--topic", "rth2", "--config", f"{LISTS[0]}=5:2")
    slow = 20_000  # 1.2 MB at 20 kB/s: still moving when cancelled
    res = subprocess.run([str(BIN / "kafka-reassign-partitions.sh"), "--bootstrap-server", tc.bootstrap, "--execute",
                          "--reassignment-json-file", str(plan), "--throttle", str(slow)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"The inter-broker throttle limit was set to {slow} B/s" in res.stdout
    assert own_configs(tc.bootstrap, ResourceType.TOPIC, "rth2", LISTS) == {LISTS[0]: "5:2,0:1", LISTS[1]: "0:3"}
    for node in ("1", "3"):
        assert own_configs(tc.bootstrap, ResourceType.BROKER, node, RATES) == dict.fromkeys(RATES, str(slow))

    # re-running with a new throttle while it moves: only the rates change
    kcli(tc, env, "partitions", "reassign", "execute", "--reassignment-json-file", str(plan), "--additional",
         "--throttle", "30000")
    for node in ("1", "3"):
        assert own_configs(tc.bootstrap, ResourceType.BROKER, node, RATES) == dict.fromkeys(RATES, "30000")
    assert own_configs(tc.bootstrap, ResourceType.TOPIC, "rth2", LISTS) == {LISTS[0]: "5:2,0:1", LISTS[1]: "0:3"}

    out = kcli(tc, env, "partitions", "reassign", "cancel", "--reassignment-json-file", str(plan)).stdout
    assert "Successfully cancelled partition reassignment for: rth2-0" in out, out
    assert own_configs(tc.bootstrap, ResourceType.TOPIC, "rth2", LISTS) == {}
    for node in ("1", "2", "3"):
        assert own_configs(tc.bootstrap, ResourceType.BROKER, node, RATES) == {}
    wait_for(lambda: list(describe(tc.bootstrap, "rth2")[0].replicas) == [1], 20, "rth2 back on broker 1")


def test_the_kafka_tool_refuses_a_throttle_that_is_not_a_positive_number(tc, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": "rth3", "partition": 0, "replicas": [1, 2]}]}))
    admin = AdminClient({"bootstrap.servers": tc.bootstrap})
    admin.create_topics([NewTopic("rth3", 1, replica_assignment=[[1]])])["rth3"].result(20)
    for bad in ("0", "-1", "fast"):
        res = subprocess.run([str(BIN / "kafka-reassign-partitions.sh"), "--bootstrap-server", tc.bootstrap,
                              "--execute", "--reassignment-json-file", str(plan), "--throttle", bad],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 1, res.stdout + res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr, res.stderr
        assert bad in res.stderr
    assert list(describe(tc.bootstrap, "rth3")[0].replicas) == [1]  # nothing moved, nothing set
    assert own_configs(tc.bootstrap, ResourceType.TOPIC, "rth3", LISTS) == {}
    assert own_configs(tc.bootstrap, ResourceType.BROKER, "2", RATES) == {}
