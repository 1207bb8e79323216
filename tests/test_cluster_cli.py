"""`kcli cluster start|status|stop`: a real local cluster (its own PostgreSQL + 3 broker processes)
driven through the CLI, with confluent-kafka clients writing and reading through it.

One cluster is started once for the module (start costs a few seconds); the tests run in file
order: start → use → status → refused start → stop → restart. The directory is made under /tmp
because, as root, the cluster's PostgreSQL runs as the ``postgres`` OS user, which must reach it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.fixtures_cli import REPO, assert_one_line_error, assert_usage_errors
from tests.kafka_helpers import create_topic, produce
from tests.test_output_formats import assert_documented

pytestmark = pytest.mark.skipif(
    __import__("kcli.cluster.pgserver", fromlist=["pg_bin_dir"]).pg_bin_dir() is None,
    reason="PostgreSQL binaries are not installed")

VALUES = [b"v%03d" % i for i in range(60)]


def kcli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kcli", *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=timeout, check=False)


def processes_naming(path: Path) -> list[int]:
    """Pids whose command line mentions ``path`` (brokers, PostgreSQL): none may outlive a stop."""
    out = []
    needle = os.fsencode(str(path))
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rpartition(")")[2].split()[:1]
            except OSError:
                continue
            if needle in cmdline and state != ["Z"]:
                out.append(int(entry.name))
    return out


def read_back(bootstrap: str, topic: str, partitions: int, expected: int, timeout: float = 30.0) -> list[bytes]:
    """Every partition from offset 0 (assigned, no group) until ``expected`` values arrived."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expected and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                out.append(m.value())
    finally:
        c.close()
    return out


@pytest.fixture(scope="module")
def env() -> Iterator[dict[str, str]]:
    home = Path(tempfile.mkdtemp(prefix="kcli-cluster-cli-env-"))
    e = {k: v for k, v in os.environ.items() if not k.startswith("KCLI_")}
    e["KCLI_CONFIG"] = str(home / "config.yaml")
    e["KCLI_DATA_DIR"] = str(home / "data")
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    yield e
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster_dir(env: dict[str, str]) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="kcli-cluster-cli-"))  # empty, mode 0700: start opens it to postgres
    try:
        yield root
    finally:
        kcli(env, "cluster", "stop", "--data-dir", str(root))
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def started(env: dict[str, str], cluster_dir: Path) -> dict[str, Any]:
    proc = kcli(env, "cluster", "start", "--brokers", "3", "--racks", "a,b,c", "--data-dir", str(cluster_dir),
                "--config", "remote.log.storage.system.enable=true", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert_documented("kcli cluster start", document)
    return document


def test_start_runs_three_brokers_in_racks_and_prints_the_bootstrap(started: dict[str, Any], cluster_dir: Path,
                                                                     env: dict[str, str]) -> None:
    brokers = started["brokers"]
    assert [(b["node_id"], b["rack"]) for b in brokers] == [(1, "a"), (2, "b"), (3, "c")]
    assert started["bootstrap"] == ",".join(b["listener"] for b in brokers)
    assert started["restarted"] is False
    assert started["object_store"] == (cluster_dir / "objects").as_uri()
    recorded = json.loads((cluster_dir / "cluster.json").read_text())
    assert [b["pid"] for b in recorded["brokers"]] == [b["pid"] for b in brokers]
    assert recorded["postgresql"]["url"] == started["postgresql"]["url"]
    for b in brokers:
        assert Path(b["log"]) == cluster_dir / f"broker-{b['node_id']}" / "broker.log"
    # Ports a restart reuses lie below the kernel's ephemeral range, where no outgoing
    # connection takes them while their server is down (kcli/ports.py).
    from kcli.ports import LOWEST, ephemeral_low

    if ephemeral_low() > LOWEST + 100:
        assert all(LOWEST <= p < ephemeral_low() for p in [b["port"] for b in brokers] + [started["postgresql"]["port"]])
    assert started["started_brokers"] == [1, 2, 3] and started["started_postgresql"] is True
    assert started["configs"] == {"remote.log.storage.system.enable": "true"} == recorded["configs"]
    # every broker is registered with its rack, as any client sees it
    admin = AdminClient({"bootstrap.servers": started["bootstrap"]})
    nodes = admin.describe_cluster(request_timeout=10).result(15).nodes
    assert {n.id: (f"{n.host}:{n.port}", n.rack) for n in nodes} == {
        b["node_id"]: (b["listener"], b["rack"]) for b in brokers}


def test_a_diskless_topic_is_written_and_read_back_through_the_cluster(started: dict[str, Any]) -> None:
    bootstrap = started["bootstrap"]
    create_topic(bootstrap, "orders", 3, {"diskless.enable": "true"})
    produce(bootstrap, "orders", VALUES, keys=[b"%d" % (i % 5) for i in range(len(VALUES))],
            **{"enable.idempotence": True})
    got = read_back(bootstrap, "orders", 3, len(VALUES))
    assert sorted(got) == VALUES, f"read {len(got)} of {len(VALUES)}: missing {sorted(set(VALUES) - set(got))[:5]}"


def test_config_reaches_every_broker_so_a_tiered_topic_can_be_created(started: dict[str, Any]) -> None:
    """--config remote.log.storage.system.enable=true (Kafka's default is false, and a broker
    without it refuses remote.storage.enable=true): every broker got it, whichever hosts a partition."""
    create_topic(started["bootstrap"], "tiered", 3, {"remote.storage.enable": "true"})
    admin = AdminClient({"bootstrap.servers": started["bootstrap"]})
    leaders = {p.leader for p in admin.list_topics("tiered", timeout=10).topics["tiered"].partitions.values()}
    assert leaders == {1, 2, 3}


def test_status_shows_three_live_registered_brokers_and_postgres_up(started: dict[str, Any], cluster_dir: Path,
                                                                    env: dict[str, str]) -> None:
    proc = kcli(env, "cluster", "status", "--data-dir", str(cluster_dir), "-o", "json")
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    assert_documented("kcli cluster status", status)
    assert status["up"] is True and status["postgresql"]["up"] is True
    assert [(b["node_id"], b["rack"], b["listener"], b["alive"], b["registered"]) for b in status["brokers"]] == [
        (b["node_id"], b["rack"], b["listener"], True, True) for b in started["brokers"]]
    table = kcli(env, "cluster", "status", "--data-dir", str(cluster_dir))
    assert table.returncode == 0, table.stderr
    assert "PostgreSQL: up" in table.stdout and f"Bootstrap servers: {started['bootstrap']}" in table.stdout


def scrape(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        return resp.read().decode()


def test_each_broker_serves_prometheus_on_its_recorded_metrics_port(started: dict[str, Any], cluster_dir: Path,
                                                                   env: dict[str, str]) -> None:
    """Every broker gets a Prometheus endpoint on a port of its own, chosen at the first start like
    the broker ports (below the ephemeral range), recorded in cluster.json and shown by status."""
    brokers = started["brokers"]
    ports = [b["metrics_port"] for b in brokers]
    assert len(set(ports) | {b["port"] for b in brokers} | {started["postgresql"]["port"]}) == 7
    from kcli.ports import LOWEST, ephemeral_low

    if ephemeral_low() > LOWEST + 100:
        assert all(LOWEST <= p < ephemeral_low() for p in ports)
    assert [b["metrics_url"] for b in brokers] == [f"http://127.0.0.1:{p}/metrics" for p in ports]
    recorded = json.loads((cluster_dir / "cluster.json").read_text())
    assert [b["metrics_port"] for b in recorded["brokers"]] == ports
    status = json.loads(kcli(env, "cluster", "status", "--data-dir", str(cluster_dir), "-o", "json").stdout)
    assert [b["metrics_url"] for b in status["brokers"]] == [b["metrics_url"] for b in brokers]
    table = kcli(env, "cluster", "status", "--data-dir", str(cluster_dir))
    assert "METRICS" in table.stdout and all(b["metrics_url"] in table.stdout for b in brokers), table.stdout
    for b in brokers:
        assert f'node_id="{b["node_id"]}"' in scrape(b["metrics_url"])


def test_starting_over_a_running_cluster_is_refused(started: dict[str, Any], cluster_dir: Path,
                                                    env: dict[str, str]) -> None:
    proc = kcli(env, "cluster", "start", "--data-dir", str(cluster_dir))
    assert_one_line_error(proc, 1, "already running", str(cluster_dir))
    status = kcli(env, "cluster", "status", "--data-dir", str(cluster_dir), "-o", "json")
    assert status.returncode == 0 and [b["pid"] for b in json.loads(status.stdout)["brokers"]] == [
        b["pid"] for b in started["brokers"]]  # untouched


def test_start_over_a_cluster_with_a_killed_broker_starts_only_that_broker(
        started: dict[str, Any], cluster_dir: Path, env: dict[str, str]) -> None:
    """An operator restarts a failed broker with the command that started the cluster: only the
    broker that is down starts again (same node id, rack, port and data dir); the running ones
    and PostgreSQL are left alone, and nothing written before is lost."""
    import signal

    def kill_broker_2() -> int:
        status = json.loads(kcli(env, "cluster", "status", "--data-dir", str(cluster_dir), "-o", "json").stdout)
        pid = status["brokers"][1]["pid"]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pid in processes_naming(cluster_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        return pid

    before = {b["node_id"]: b["pid"] for b in json.loads(
        kcli(env, "cluster", "status", "--data-dir", str(cluster_dir), "-o", "json").stdout)["brokers"]}
    killed = kill_broker_2()
    proc = kcli(env, "cluster", "start", "--data-dir", str(cluster_dir), "-o", "json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert_documented("kcli cluster start", info)
    assert (info["restarted"], info["started_brokers"], info["started_postgresql"]) == (True, [2], False)
    assert info["bootstrap"] == started["bootstrap"]
    pids = {b["node_id"]: b["pid"] for b in info["brokers"]}
    assert (pids[1], pids[3]) == (before[1], before[3]) and pids[2] not in (killed, None)
    assert json.loads((cluster_dir / "cluster.json").read_text())["brokers"][1]["pid"] == pids[2]
    up = kcli(env, "cluster", "status", "--data-dir", str(cluster_dir))
    assert up.returncode == 0, up.stdout + up.stderr
    got = read_back(started["bootstrap"], "orders", 3, len(VALUES))
    assert sorted(got) == VALUES, f"read {len(got)} of {len(VALUES)} after broker 2's restart"

    kill_broker_2()
    changed = kcli(env, "cluster", "start", "--data-dir", str(cluster_dir), "--racks", "x,y,z")
    assert_one_line_error(changed, 1, "--racks x,y,z (it has a,b,c)")  # and nothing started:
    down = kcli(env, "cluster", "status", "--data-dir", str(cluster_dir), "-o", "json")
    assert down.returncode == 1 and [b["alive"] for b in json.loads(down.stdout)["brokers"]] == [True, False, True]
    assert_one_line_error(subprocess.CompletedProcess(down.args, 1, "", down.stderr), 1, "broker 2 is not running",
                          f"`kcli cluster start --data-dir {cluster_dir}` starts what is down")
    text = kcli(env, "cluster", "start", "--data-dir", str(cluster_dir))  # the table form says what it did
    assert text.returncode == 0, text.stderr
    assert f"Restarted broker 2 of the 3-broker cluster in {cluster_dir}; the rest was running" in text.stdout


def test_a_restarted_broker_keeps_its_metrics_port_and_the_others_log_it_leaving_and_joining(
        started: dict[str, Any], cluster_dir: Path, env: dict[str, str]) -> None:
    """After broker 2 was killed and started again (above): its Prometheus endpoint is back on the
    recorded port, and brokers 1 and 3 each logged one line when it left and one when it joined."""
    status = json.loads(kcli(env, "cluster", "status", "--data-dir", str(cluster_dir), "-o", "json").stdout)
    assert [b["metrics_url"] for b in status["brokers"]] == [b["metrics_url"] for b in started["brokers"]]
    assert 'node_id="2"' in scrape(started["brokers"][1]["metrics_url"])
    b2 = started["brokers"][1]
    at = f"Broker 2 at PLAINTEXT://{b2['listener']} (rack b)"
    for node in (1, 3):
        log = cluster_dir / f"broker-{node}" / "broker.log"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and f"{at} joined" not in log.read_text().rsplit(f"{at} left", 1)[-1]:
            time.sleep(0.2)
        lines = log.read_text().splitlines()
        left = [ln for ln in lines if f"{at} left the cluster; live brokers: 1,3" in ln]
        joined = [ln for ln in lines if f"{at} joined the cluster; live brokers: 1,2,3" in ln]
        assert left and joined, lines[-20:]
        assert all(f" INFO kcli.broker: [KafkaServer id={node}] " in ln for ln in left + joined), left + joined
        # the killed broker left and joined again twice (the test above killed it twice); at the
        # first start it may have joined after this broker too
        assert len(left) == 2 and len(joined) in (2, 3), (left, joined)
        assert lines.index(left[0]) < lines.index(joined[-2]) and lines.index(left[1]) < lines.index(joined[-1])


def test_stop_then_status_is_down_then_start_again_restarts_the_same_cluster(
        started: dict[str, Any], cluster_dir: Path, env: dict[str, str]) -> None:
    stopped = kcli(env, "cluster", "stop", "--data-dir", str(cluster_dir), "-o", "json")
    assert stopped.returncode == 0, stopped.stderr
    result = json.loads(stopped.stdout)
    assert_documented("kcli cluster stop", result)
    assert result["stopped_brokers"] == [1, 2, 3] and result["killed_brokers"] == [] and result["postgresql_stopped"]
    assert processes_naming(cluster_dir) == []

    down = kcli(env, "cluster", "status", "--data-dir", str(cluster_dir), "-o", "json")
    assert down.returncode == 1
    status = json.loads(down.stdout)
    assert status["up"] is False and status["postgresql"]["up"] is False
    assert [(b["alive"], b["registered"]) for b in status["brokers"]] == [(False, False)] * 3
    assert_one_line_error(subprocess.CompletedProcess(down.args, 1, "", down.stderr), 1, "PostgreSQL is down",
                          "broker 1 is not running")

    again = kcli(env, "cluster", "stop", "--data-dir", str(cluster_dir))
    assert again.returncode == 0 and "already stopped" in again.stdout, again

    changed = kcli(env, "cluster", "start", "--data-dir", str(cluster_dir), "--brokers", "2")
    assert_one_line_error(changed, 1, "--brokers 2 (it has 3)")
    changed = kcli(env, "cluster", "start", "--data-dir", str(cluster_dir), "--config", "log.retention.ms=1000")
    assert_one_line_error(changed, 1, "--config log.retention.ms=1000 (it has remote.log.storage.system.enable=true)")

    restarted = kcli(env, "cluster", "start", "--data-dir", str(cluster_dir), "-o", "json")
    assert restarted.returncode == 0, restarted.stderr
    info = json.loads(restarted.stdout)
    assert info["restarted"] is True
    assert info["bootstrap"] == started["bootstrap"] and info["postgresql"]["url"] == started["postgresql"]["url"]
    assert [(b["node_id"], b["rack"]) for b in info["brokers"]] == [(1, "a"), (2, "b"), (3, "c")]
    assert info["configs"] == started["configs"]  # a restart without --config keeps the recorded ones
    assert [b["metrics_port"] for b in info["brokers"]] == [b["metrics_port"] for b in started["brokers"]]
    up = kcli(env, "cluster", "status", "--data-dir", str(cluster_dir))
    assert up.returncode == 0, up.stdout + up.stderr
    # the same database and object store: what was written before the stop is still there
    got = read_back(info["bootstrap"], "orders", 3, len(VALUES))
    assert sorted(got) == VALUES, f"read {len(got)} of {len(VALUES)} after the restart"


def test_a_restart_that_fails_stops_the_brokers_and_postgres_it_started(
        started: dict[str, Any], cluster_dir: Path, env: dict[str, str]) -> None:
    assert kcli(env, "cluster", "stop", "--data-dir", str(cluster_dir)).returncode == 0
    taken = started["brokers"][1]
    with socket.socket() as blocker:  # broker 2's recorded port is taken meanwhile
        blocker.bind((taken["host"], taken["port"]))
        blocker.listen()
        proc = kcli(env, "cluster", "start", "--data-dir", str(cluster_dir))
    # Brokers 1 and 3 got past joining the database before broker 2 failed to listen: unless the
    # launcher stops them, they outlive it (a broker rides out a database outage).
    assert_one_line_error(proc, 1, "broker 2 exited", "cannot listen on", str(taken["port"]))
    assert processes_naming(cluster_dir) == [], "a broker or PostgreSQL outlived the failed restart"
    assert json.loads((cluster_dir / "cluster.json").read_text())["bootstrap"] == started["bootstrap"]  # kept


def test_bad_input_is_one_line_and_exit_2(env: dict[str, str]) -> None:
    where = Path(tempfile.gettempdir()) / f"kcli-cluster-never-{os.getpid()}"
    assert_usage_errors([
        (["--brokers", "0"], "--brokers expects 1..16"),
        (["--brokers", "many"], "--brokers"),
        (["--racks", "a,,b"], "--racks expects comma-separated rack names"),
        (["--racks", "a;b"], "--racks"),
        (["--racks", ""], "--racks"),
        (["--base-port", "65535"], "--base-port"),
        (["--object-store", "ftp://x/y"], "--object-store"),
        (["--timeout", "-1"], "--timeout"),
    ], lambda args: kcli(env, "cluster", "start", "--data-dir", str(where), *args))
    assert not where.exists()  # refused before anything was made


def test_status_and_stop_of_no_cluster_say_so(env: dict[str, str]) -> None:
    where = Path(tempfile.gettempdir()) / f"kcli-cluster-none-{os.getpid()}"
    for command in ("status", "stop"):
        assert_one_line_error(kcli(env, "cluster", command, "--data-dir", str(where)), 1, "no cluster in")
    assert not where.exists()


def test_a_start_that_fails_stops_what_it_started_and_leaves_nothing(env: dict[str, str]) -> None:
    root = Path(tempfile.mkdtemp(prefix="kcli-cluster-fail-"))
    os.chmod(root, 0o755)
    try:
        where = root / "c"
        started = time.monotonic()
        # PostgreSQL starts, the brokers are spawned, but they cannot all register within 0.2 s
        proc = kcli(env, "cluster", "start", "--brokers", "2", "--data-dir", str(where), "--timeout", "0.2")
        assert_one_line_error(proc, 1)
        assert time.monotonic() - started < 60
        assert processes_naming(where) == [], "a broker or PostgreSQL outlived the failed start"
        assert not where.exists()  # made by the failed start: removed
    finally:
        shutil.rmtree(root, ignore_errors=True)
