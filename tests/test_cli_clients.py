"""`kcli produce` / `kcli consume` against a real broker, run as subprocesses."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import time

import pytest

from tests.fixtures_cli import (  # noqa: F401  (fixtures are used by name)
    REPO,
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


def _topic(env: dict[str, str], bootstrap: str, partitions: int = 1, *configs: str) -> str:
    topic = unique_topic()
    args = ["-b", bootstrap, "topics", "create", "--topic", topic, "--partitions", str(partitions)]
    for c in configs:
        args += ["--config", c]
    r = run_kcli(env, *args)
    assert r.returncode == 0, r.stderr
    return topic


def test_produce_then_consume_with_keys(bootstrap: str, cli_env: dict[str, str]) -> None:
    topic = _topic(cli_env, bootstrap, partitions=1)
    lines = "k1:v1\nk2:v2:with:colons\nk3:\n"
    p = run_kcli(cli_env, "-b", bootstrap, "produce", "--topic", topic, "--key-separator", ":", input=lines)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "" and p.stderr == ""  # the summary is only for -v

    c = run_kcli(cli_env, "-b", bootstrap, "consume", "--topic", topic, "--from-beginning", "--max-messages", "3",
                 "--print-key", "--key-separator", "=")
    assert c.returncode == 0, c.stderr
    assert c.stdout.splitlines() == ["k1=v1", "k2=v2:with:colons", "k3="]

    plain = run_kcli(cli_env, "-b", bootstrap, "consume", "--topic", topic, "--from-beginning", "--max-messages", "3")
    assert plain.stdout.splitlines() == ["v1", "v2:with:colons", ""]

    as_json = run_kcli(cli_env, "-b", bootstrap, "-o", "json", "consume", "--topic", topic, "--from-beginning",
                       "--max-messages", "3")
    assert as_json.returncode == 0, as_json.stderr
    records = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [r["offset"] for r in records] == [0, 1, 2]
    assert [(r["key"], r["value"]) for r in records] == [("k1", "v1"), ("k2", "v2:with:colons"), ("k3", "")]
    for r in records:
        assert set(r) == {"topic", "partition", "offset", "timestamp", "key", "value", "headers"}
        assert r["topic"] == topic and r["partition"] == 0 and r["headers"] == []
        assert isinstance(r["timestamp"], int) and r["timestamp"] > 1_600_000_000_000


def test_produce_verbose_summary_and_json(bootstrap: str, cli_env: dict[str, str]) -> None:
    topic = _topic(cli_env, bootstrap, partitions=2)
    data = "".join(f"line-{i}\n" for i in range(50))
    p = run_kcli(cli_env, "-b", bootstrap, "-v", "produce", "--topic", topic, "--acks", "1",
                 "--compression", "gzip", input=data)
    assert p.returncode == 0, p.stderr
    assert f"kcli: 50 records produced to {topic}" in p.stderr
    j = run_kcli(cli_env, "-b", bootstrap, "-o", "json", "produce", "--topic", topic, "--partition", "1",
                 "--compression", "lz4", input="x\ny\n")
    assert j.returncode == 0, j.stderr
    assert json.loads(j.stdout) == {"topic": topic, "records": 2, "partitions": {"1": 2}}

    c = run_kcli(cli_env, "-b", bootstrap, "consume", "--topic", topic, "--from-beginning", "--max-messages", "52")
    assert c.returncode == 0, c.stderr
    assert sorted(c.stdout.splitlines()) == sorted([f"line-{i}" for i in range(50)] + ["x", "y"])


def test_partition_and_offset(bootstrap: str, cli_env: dict[str, str]) -> None:
    topic = _topic(cli_env, bootstrap, partitions=2)
    for part, text in ((0, "a0\na1\n"), (1, "b0\nb1\nb2\n")):
        r = run_kcli(cli_env, "-b", bootstrap, "produce", "--topic", topic, "--partition", str(part), input=text)
        assert r.returncode == 0, r.stderr
    c = run_kcli(cli_env, "-b", bootstrap, "-o", "json", "consume", "--topic", topic, "--partition", "1",
                 "--offset", "1", "--timeout-ms", "1500")
    assert c.returncode == 0, c.stderr
    got = [(r["partition"], r["offset"], r["value"]) for r in map(json.loads, c.stdout.splitlines())]
    assert got == [(1, 1, "b1"), (1, 2, "b2")]

    missing = run_kcli(cli_env, "-b", bootstrap, "produce", "--topic", topic, "--partition", "7", input="z\n")
    assert_one_line_error(missing, 1, "UNKNOWN_TOPIC_OR_PARTITION", "partition 7")


def test_group_commits_only_what_was_printed(request: pytest.FixtureRequest, cli_env: dict[str, str]) -> None:
    bootstrap = cluster_with(request, {"group.initial.rebalance.delay.ms": "0"}).bootstrap
    topic = _topic(cli_env, bootstrap)
    assert run_kcli(cli_env, "-b", bootstrap, "produce", "--topic", topic, input="m1\nm2\nm3\n").returncode == 0
    group = unique_topic("group")
    first = run_kcli(cli_env, "-b", bootstrap, "consume", "--topic", topic, "--group", group, "--from-beginning",
                     "--max-messages", "2", timeout=120)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == ["m1", "m2"]
    # The group resumes after what it printed, although the first run fetched all three.
    second = run_kcli(cli_env, "-b", bootstrap, "consume", "--topic", topic, "--group", group, "--from-beginning",
                      "--max-messages", "1", timeout=120)
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines() == ["m3"]


def test_sigint_and_closed_pipe_end_quietly(bootstrap: str, cli_env: dict[str, str]) -> None:
    topic = _topic(cli_env, bootstrap)
    data = "first\n" + "".join(f"{i}\n" for i in range(2000))
    assert run_kcli(cli_env, "-b", bootstrap, "produce", "--topic", topic, input=data).returncode == 0
    # `| head -n 1`: the reader leaves early; no traceback, no "Broken pipe", exit 0.
    cmd = (f"{sys.executable} -m kcli -b {bootstrap} consume --topic {topic} --from-beginning "
           f"--max-messages 2001 | head -n 1")
    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, env=cli_env, cwd=REPO, timeout=60)
    assert r.stdout == b"first\n"
    assert b"Traceback" not in r.stderr and b"Broken pipe" not in r.stderr, r.stderr
    assert r.returncode == 0, r.stderr

    # Ctrl-C on a consumer that would run forever: clean close, exit 130 (as Kafka's console
    # consumer and a shell report it), one line saying how many records were consumed.
    proc = subprocess.Popen([sys.executable, "-m", "kcli", "-b", bootstrap, "consume", "--topic", topic,
                             "--from-beginning"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env, cwd=REPO)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "consumer printed nothing"
        assert proc.stdout.readline() == b"first\n"
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert rc == 130, stderr
    assert "Traceback" not in stderr and stderr.startswith("kcli: interrupted: ") and stderr.count("\n") == 1
    assert stderr.endswith(" records consumed\n"), stderr


def test_missing_key_separator_delivers_earlier_lines(bootstrap: str, cli_env: dict[str, str]) -> None:
    topic = _topic(cli_env, bootstrap)
    p = run_kcli(cli_env, "-b", bootstrap, "produce", "--topic", topic, "--key-separator", "\\t",
                 input="k\tv\nno separator here\nk2\tv2\n")
    assert_one_line_error(p, 2, "line 2", "separator")
    # The line before the bad one was delivered; --timeout-ms then ends the idle consumer with exit 0.
    start = time.monotonic()
    c = run_kcli(cli_env, "-b", bootstrap, "-v", "consume", "--topic", topic, "--from-beginning",
                 "--timeout-ms", "1000", "--print-key")
    assert c.returncode == 0, c.stderr
    assert c.stdout.splitlines() == ["k\tv"]
    assert "1 records consumed (stopped by timeout)" in c.stderr
    assert time.monotonic() - start < 20


def test_delivery_failure_exits_1_with_kafka_error(cluster: Cluster, cli_env: dict[str, str]) -> None:
    if cluster.kind != "kcli":
        pytest.skip("tansu does not enforce max.message.bytes")
    topic = _topic(cli_env, cluster.bootstrap, 1, "max.message.bytes=2000")
    p = run_kcli(cli_env, "-b", cluster.bootstrap, "produce", "--topic", topic, input="x" * 10_000 + "\n")
    assert_one_line_error(p, 1, "MESSAGE_TOO_LARGE", "1 of 1 records not delivered")


def test_produce_to_unknown_topic_without_auto_create(request: pytest.FixtureRequest,
                                                      cli_env: dict[str, str]) -> None:
    c = cluster_with(request, {"auto.create.topics.enable": "false"})
    if c.kind != "kcli":
        pytest.skip("tansu always auto-creates topics")
    missing = unique_topic("missing")
    p = run_kcli(cli_env, "-b", c.bootstrap, "produce", "--topic", missing, input="a\n")
    assert_one_line_error(p, 1, "UNKNOWN_TOPIC_OR_PARTITION", missing)
    r = run_kcli(cli_env, "-b", c.bootstrap, "consume", "--topic", missing, "--timeout-ms", "500")
    assert_one_line_error(r, 1, "UNKNOWN_TOPIC_OR_PARTITION", missing)


BAD_INPUT = [
    (["produce", "--topic", "t", "--acks", "2"], "--acks"),
    (["produce", "--topic", "t", "--compression", "brotli"], "--compression"),
    (["produce", "--topic", "t", "--property", "acks"], "KEY=VALUE"),
    (["produce", "--topic", "t", "--bogus"], "No such option"),
    (["consume", "--topic", "t", "--offset", "3"], "--offset needs --partition"),
    (["consume", "--topic", "t", "--partition", "0", "--offset", "soon"], "--offset"),
    (["consume", "--topic", "t", "--partition", "0", "--offset", "3", "--from-beginning"], "together"),
    (["consume", "--topic", "t", "--group", "g", "--partition", "0"], "together"),
    (["consume", "--topic", "t", "--max-messages", "0"], "--max-messages"),
    (["consume", "--topic", "bad topic"], "illegal"),
]


def test_bad_input_exits_2(cli_env: dict[str, str]) -> None:
    """All fail before connecting (127.0.0.1:9 is never contacted); run them in parallel."""
    def case(args: list[str]) -> subprocess.CompletedProcess[str]:
        return run_kcli(cli_env, "-b", "127.0.0.1:9", *args, input="x\n")

    assert_usage_errors(BAD_INPUT, case)


def test_unreachable_cluster(cli_env: dict[str, str]) -> None:
    from tests.fixtures_cli import _free_port

    port = _free_port()
    p = run_kcli(cli_env, "-b", f"127.0.0.1:{port}", "produce", "--topic", "t", input="a\n")
    assert_one_line_error(p, 1, "NETWORK_EXCEPTION")
    c = run_kcli(cli_env, "-b", f"127.0.0.1:{port}", "consume", "--topic", "t")
    assert_one_line_error(c, 1, "NETWORK_EXCEPTION")
