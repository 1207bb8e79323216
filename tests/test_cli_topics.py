"""`kcli topics ...` against a real broker, run as a subprocess for real exit codes and output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
import yaml

from tests.fixtures_cli import (  # noqa: F401  (fixtures are used by name)
    Cluster,
    assert_one_line_error,
    assert_usage_errors,
    bootstrap,
    cli_env,
    cluster,
    cluster_with,
    run_kcli,
    tansu_bootstrap,
    unique_topic,
)

TOPIC_ID = r"[A-Za-z0-9_-]{22}"


def test_create_describe_list_delete_roundtrip(cluster: Cluster, cli_env: dict[str, str]) -> None:
    b = ["-b", cluster.bootstrap]
    topic = unique_topic("orders")
    created = run_kcli(cli_env, *b, "topics", "create", "--topic", topic, "--partitions", "3",
                       "--replication-factor", "1", "--config", "retention.ms=86400000")
    assert created.returncode == 0, created.stderr
    assert created.stdout == f"Created topic {topic}.\n"

    listed = run_kcli(cli_env, *b, "topics", "list", "--exclude-internal")
    assert listed.returncode == 0, listed.stderr
    assert topic in listed.stdout.splitlines() and "__consumer_offsets" not in listed.stdout

    described = run_kcli(cli_env, *b, "topics", "describe", "--topic", topic)
    assert described.returncode == 0, described.stderr
    lines = described.stdout.splitlines()
    assert len(lines) == 4
    configs = "retention.ms=86400000" if cluster.kind == "kcli" else ".*"  # tansu reports every config as default
    assert re.fullmatch(rf"Topic: {topic}\tTopicId: {TOPIC_ID}\tPartitionCount: 3\tReplicationFactor: 1"
                        rf"\tConfigs: {configs}\tKind: classic", lines[0]), lines[0]
    for p, line in enumerate(lines[1:]):
        assert re.fullmatch(rf"\tTopic: {topic}\tPartition: {p}\tLeader: (\d+)\tReplicas: (\d+)\tIsr: (\d+)"
                            r"(\tLogStartOffset: 0\tLogEndOffset: 0)?", line), line  # tansu: no offsets
        leader, replicas, isr = re.findall(r"\d+", line.split("Leader: ")[1])[:3]
        assert leader == replicas == isr

    as_json = run_kcli(cli_env, *b, "-o", "json", "topics", "describe", "--topic", topic)
    assert as_json.returncode == 0, as_json.stderr
    [desc] = json.loads(as_json.stdout)
    assert {"topic", "topic_id", "kind", "partition_count", "replication_factor", "configs", "partitions"} <= set(desc)
    assert desc["topic"] == topic and desc["kind"] == "classic"
    assert desc["partition_count"] == 3 and desc["replication_factor"] == 1
    assert re.fullmatch(TOPIC_ID, desc["topic_id"])
    assert desc["topic_id"] in lines[0]  # table and JSON agree on Kafka's Uuid.toString form
    assert [p["partition"] for p in desc["partitions"]] == [0, 1, 2]
    assert all(set(p) >= {"partition", "leader", "replicas", "isr"} for p in desc["partitions"])
    if cluster.kind == "kcli":
        assert desc["configs"] == {"retention.ms": "86400000"}

    deleted = run_kcli(cli_env, *b, "topics", "delete", "--topic", topic)
    assert deleted.returncode == 0 and deleted.stdout == f"Deleted topic {topic}.\n", deleted.stderr
    deadline = time.monotonic() + 10
    while topic in run_kcli(cli_env, *b, "topics", "list").stdout.splitlines():
        assert time.monotonic() < deadline, "topic still listed after delete"
        time.sleep(0.2)
    again = run_kcli(cli_env, *b, "topics", "delete", "--topic", topic)
    assert_one_line_error(again, 1, "UNKNOWN_TOPIC_OR_PARTITION", topic)
    tolerant = run_kcli(cli_env, *b, "topics", "delete", "--topic", topic, "--if-exists")
    assert tolerant.returncode == 0, tolerant.stderr


def test_create_existing_topic(bootstrap: str, cli_env: dict[str, str]) -> None:
    topic = unique_topic()
    assert run_kcli(cli_env, "-b", bootstrap, "topics", "create", "--topic", topic).returncode == 0
    dup = run_kcli(cli_env, "-b", bootstrap, "topics", "create", "--topic", topic)
    assert_one_line_error(dup, 1, "TOPIC_ALREADY_EXISTS")
    ok = run_kcli(cli_env, "-b", bootstrap, "-o", "json", "topics", "create", "--topic", topic, "--if-not-exists")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"topic": topic, "created": False}


def _create_or_skip(env: dict[str, str], bootstrap: str, topic: str, *args: str) -> None:
    """Create ``topic``. Only a tansu run (KCLI_TEST_BROKER=tansu), whose broker has no diskless
    or tiered topics, skips on INVALID_CONFIG; on kcli's own broker that is a failure."""
    r = run_kcli(env, "-b", bootstrap, "topics", "create", "--topic", topic, *args)
    if r.returncode == 1 and "INVALID_CONFIG" in r.stderr and os.environ.get("KCLI_TEST_BROKER") == "tansu":
        pytest.skip(f"tansu cannot create {' '.join(args)} topics: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr


def test_kinds_and_list_filters(request: pytest.FixtureRequest, cli_env: dict[str, str]) -> None:
    bootstrap = cluster_with(request, {"remote.log.storage.system.enable": "true"}).bootstrap
    b = ["-b", bootstrap]
    classic = unique_topic("cl")
    r = run_kcli(cli_env, *b, "topics", "create", "--topic", classic, "--partitions", "1")
    assert r.returncode == 0, r.stderr
    only_classic = run_kcli(cli_env, *b, "topics", "list", "--classic").stdout.splitlines()
    assert classic in only_classic
    assert classic not in run_kcli(cli_env, *b, "topics", "list", "--diskless").stdout.splitlines()
    assert classic not in run_kcli(cli_env, *b, "topics", "list", "--tiered").stdout.splitlines()

    diskless = unique_topic("dl")
    _create_or_skip(cli_env, bootstrap, diskless, "--partitions", "2", "--diskless")
    only_diskless = run_kcli(cli_env, *b, "topics", "list", "--diskless").stdout.splitlines()
    assert diskless in only_diskless and classic not in only_diskless
    assert diskless not in run_kcli(cli_env, *b, "topics", "list", "--classic").stdout.splitlines()

    as_yaml = yaml.safe_load(run_kcli(cli_env, *b, "-o", "yaml", "topics", "list").stdout)
    kinds = {entry["topic"]: entry["kind"] for entry in as_yaml}
    assert kinds[diskless] == "diskless" and kinds[classic] == "classic"

    head = run_kcli(cli_env, *b, "topics", "describe", "--topic", diskless).stdout.splitlines()[0]
    assert head.endswith("\tKind: diskless"), head
    if "diskless.enable" in head:  # a non-default config shows up like kafka-topics shows it
        assert "diskless.enable=true" in head

    tiered = unique_topic("ts")
    _create_or_skip(cli_env, bootstrap, tiered, "--config", "remote.storage.enable=true")
    only_tiered = run_kcli(cli_env, *b, "topics", "list", "--tiered").stdout.splitlines()
    assert tiered in only_tiered and diskless not in only_tiered and classic not in only_tiered


def test_alter_configs(cluster: Cluster, cli_env: dict[str, str]) -> None:
    b = ["-b", cluster.bootstrap]
    topic = unique_topic()
    assert run_kcli(cli_env, *b, "topics", "create", "--topic", topic, "--config", "segment.ms=3600000").returncode == 0
    r = run_kcli(cli_env, *b, "topics", "alter", "--topic", topic, "--config", "retention.ms=5000",
                 "--delete-config", "segment.ms")
    assert r.returncode == 0, r.stderr
    assert f"Altered topic {topic}: Set configs retention.ms=5000" in r.stdout
    assert f"Altered topic {topic}: Deleted configs segment.ms" in r.stdout
    if cluster.kind == "kcli":  # tansu marks every config as default, so Configs stays empty there
        [desc] = json.loads(run_kcli(cli_env, *b, "-o", "json", "topics", "describe", "--topic", topic).stdout)
        assert desc["configs"].get("retention.ms") == "5000"
        assert "segment.ms" not in desc["configs"]


def test_alter_partitions(cluster: Cluster, cli_env: dict[str, str]) -> None:
    b = ["-b", cluster.bootstrap]
    topic = unique_topic()
    assert run_kcli(cli_env, *b, "topics", "create", "--topic", topic, "--partitions", "2").returncode == 0

    same = run_kcli(cli_env, *b, "topics", "alter", "--topic", topic, "--partitions", "2")
    assert same.returncode == 0 and same.stdout == f"Topic {topic} unchanged.\n", same.stderr

    up = run_kcli(cli_env, *b, "-o", "json", "topics", "alter", "--topic", topic, "--partitions", "4")
    if cluster.kind == "tansu":  # tansu has no CreatePartitions: the error must still be Kafka's name
        assert_one_line_error(up, 1, "UNSUPPORTED_VERSION")
        return
    assert up.returncode == 0, up.stderr
    assert json.loads(up.stdout)["steps"] == [{"action": "create-partitions", "detail": "2 -> 4", "done": True}]
    [desc] = json.loads(run_kcli(cli_env, *b, "-o", "json", "topics", "describe", "--topic", topic).stdout)
    assert desc["partition_count"] == 4


def test_describe_unknown_topic(bootstrap: str, cli_env: dict[str, str]) -> None:
    missing = unique_topic("missing")
    r = run_kcli(cli_env, "-b", bootstrap, "topics", "describe", "--topic", missing)
    assert_one_line_error(r, 1, "UNKNOWN_TOPIC_OR_PARTITION", missing)
    # -v: the same error, now with the traceback an engineer needs.
    r = run_kcli(cli_env, "-b", bootstrap, "-v", "topics", "describe", "--topic", missing)
    assert r.returncode == 1
    assert "Traceback" in r.stderr and "kcli: error: UNKNOWN_TOPIC_OR_PARTITION" in r.stderr


BAD_INPUT = [
    (["topics", "create", "--topic", "x", "--bogus"], "No such option"),
    (["topics", "create", "--topic", "x", "--partitions", "0"], "--partitions"),
    (["topics", "create", "--topic", "x", "--replication-factor", "0"], "--replication-factor"),
    (["topics", "create", "--topic", "x", "--config", "retention.ms"], "KEY=VALUE"),
    (["topics", "create", "--topic", "bad/name"], "illegal"),
    (["topics", "create", "--topic", "x", "--diskless", "--config", "diskless.enable=false"], "conflicts"),
    (["topics", "create"], "--topic"),
    (["topics", "alter", "--topic", "x", "--config", "a"], "KEY=VALUE"),
    (["topics", "alter", "--topic", "x"], "nothing to alter"),
    (["topics", "alter", "--topic", "x", "--partitions", "0"], "--partitions"),
    (["topics", "alter", "--topic", "x", "--config", "a=1", "--delete-config", "a"], "both set"),
    (["topics", "list", "--diskless", "--tiered"], "at most one"),
    (["--context", "nope", "topics", "list"], "unknown context"),
    (["-o", "xml", "topics", "list"], "xml"),
    (["-b", "no:port", "topics", "list"], "HOST:PORT"),
]


def test_bad_input_exits_2(cli_env: dict[str, str]) -> None:
    """Each case fails before connecting (127.0.0.1:9 is never contacted); run them in parallel."""
    def case(args: list[str]) -> subprocess.CompletedProcess[str]:
        base = [] if args[0] in ("-b", "--context") else ["-b", "127.0.0.1:9"]
        return run_kcli(cli_env, *base, *args)

    assert_usage_errors(BAD_INPUT, case)


def test_unreachable_cluster_fails_fast(cli_env: dict[str, str]) -> None:
    from tests.fixtures_cli import _free_port

    start = time.monotonic()
    r = run_kcli(cli_env, "-b", f"127.0.0.1:{_free_port()}", "topics", "list")
    assert_one_line_error(r, 1, "NETWORK_EXCEPTION", "cannot reach")
    assert time.monotonic() - start < 15


def test_embedded_default_cluster(cli_env: dict[str, str]) -> None:
    """No --bootstrap-server, context or env: the command boots kcli's broker in-process."""
    if os.environ.get("KCLI_TEST_BROKER") == "tansu":
        pytest.skip("KCLI_TEST_BROKER=tansu: the kcli broker is not being tested")
    topic = unique_topic("embedded")
    r = run_kcli(cli_env, "-v", "topics", "create", "--topic", topic, "--partitions", "2")
    assert r.returncode == 0, r.stderr
    assert "embedded broker" in r.stderr
    # The data dir persists between commands: the next embedded run sees the topic.
    [desc] = json.loads(run_kcli(cli_env, "-o", "json", "topics", "describe", "--topic", topic).stdout)
    assert desc["partition_count"] == 2
