"""Command-line data safety: hostile runbook YAML, blank options that crash librdkafka, Ctrl-C
mid-produce, a broker.json that points at another cluster, and a consumer whose broker went away.

Every test runs `python -m kcli` as a subprocess against real broker processes.
"""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.fixtures_cli import (  # noqa: F401  (fixtures are used by name)
    REPO,
    assert_one_line_error,
    assert_usage_errors,
    cli_env,
    run_kcli,
    unique_topic,
)

# --- runbook YAML ----------------------------------------------------------------------------

# "Billion laughs": 9 levels of 9 aliases, ~10^9 nodes once expanded, from a few hundred bytes.
ALIAS_BOMB = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
steps:
  - sleep: 1s
"""


@pytest.mark.parametrize("name, text, where, needle", [
    ("bomb", ALIAS_BOMB, "5:8", "aliases expand the document past 10,000 nodes"),
    ("cycle", "a: &a [*a]\nsteps:\n  - sleep: 1s\n", "1:8", "alias *a refers to the node that contains it"),
    ("deep", "steps: " + "[" * 400 + "]" * 400 + "\n", "1:107", "nesting deeper than 100 levels"),
], ids=["alias-bomb", "alias-cycle", "deep-nesting"])
def test_hostile_runbook_yaml_is_refused_at_once(tmp_path: Path, cli_env: dict[str, str],  # noqa: F811
                                                 name: str, text: str, where: str, needle: str) -> None:
    """Before: the bomb ran for minutes eating GiBs; the cycle and the deep nesting ended in
    `unexpected RecursionError`. Now: FILE:LINE:COL, exit 2, in well under the timeout."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    for command in ("validate", "run"):
        proc = run_kcli(cli_env, "runbook", command, str(path), timeout=20)
        assert proc.returncode == 2, (proc.returncode, proc.stderr)
        lines = proc.stderr.splitlines()
        assert len(lines) == 2 and lines[0].startswith(f"{path}:{where}: invalid YAML: {needle}"), proc.stderr
        assert lines[1] == f"kcli: error: runbook {path} is invalid: 1 problem(s)"
        assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr


def test_runbook_aliases_within_the_budget_still_work(tmp_path: Path, cli_env: dict[str, str]) -> None:  # noqa: F811
    """An anchor reused a few times is ordinary YAML and stays allowed."""
    path = tmp_path / "ok.yaml"
    path.write_text("steps:\n  - &pause {sleep: 1ms}\n  - *pause\n  - sleep: 2ms\n  - *pause\n")
    proc = run_kcli(cli_env, "runbook", "validate", str(path), timeout=20)
    assert proc.returncode == 0, proc.stderr


# --- blank options ----------------------------------------------------------------------------

BLANK = [
    (["consume", "--topic", "t", "--group", ""], "--group must not be empty"),  # was: abort, exit 134
    (["consume", "--topic", "t", "--group", " "], "--group must not be empty"),  # also aborts librdkafka
    (["consume", "--topic", "t", "--property", "group.id="], "group.id must not be empty"),
    (["consume", "--topic", "t", "--property", "bootstrap.servers="], "bootstrap.servers must not be empty"),
    (["produce", "--topic", "t", "--property", "bootstrap.servers= "], "bootstrap.servers must not be empty"),
    (["consume", "--topic", ""], "topic name must not be empty"),
    (["produce", "--topic", ""], "topic name must not be empty"),
    (["produce", "--topic", "t", "--key-separator", ""], "--key-separator must not be empty"),
]


def test_blank_options_are_usage_errors(cli_env: dict[str, str]) -> None:  # noqa: F811
    """127.0.0.1:9 is never contacted: each case is refused before a client exists."""
    assert_usage_errors(BLANK, lambda args: run_kcli(cli_env, "-b", "127.0.0.1:9", *args, input="x\n"))


def test_blank_bootstrap_or_context_never_falls_back_to_the_default_cluster(cli_env: dict[str, str]) -> None:  # noqa: F811
    """`-b "$UNSET"` used to mean "no -b": kcli booted (or found) the default broker instead."""
    cases = [(["-b", "", "topics", "list"], "--bootstrap-server expects HOST:PORT, got ''"),
             (["--context", "", "topics", "list"], "unknown context ''")]
    assert_usage_errors(cases, lambda args: run_kcli(cli_env, *args))
    assert not Path(cli_env["KCLI_DATA_DIR"]).exists()  # no embedded broker was booted


# --- Ctrl-C ----------------------------------------------------------------------------------

# Writes lines fast; says "reading" on stderr once kcli has taken ~2 MB (far past the pipe buffer),
# so the SIGINT surely lands in the produce loop.
_GENERATOR = r"""
import sys
w = sys.stdout.buffer.write
line = b"0123456789abcdefghij\n"
try:
    for i in range(100_000_000):
        w(line)
        if i == 100_000:
            sys.stdout.flush()
            sys.stderr.write("reading\n")
            sys.stderr.flush()
except (BrokenPipeError, OSError):
    pass
"""


def _end_offset(bootstrap: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "kcli-test-watermark"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        c.close()


def test_ctrl_c_during_fast_produce_exits_130_with_the_delivered_count(broker, cli_env: dict[str, str]) -> None:  # noqa: F811
    """Before: `unexpected SystemError ... returned NULL` or `kcli: aborted`, exit 1 (the
    KeyboardInterrupt landed inside librdkafka's delivery callback). Now: 130 every time, one
    line with the delivered count, and the topic holds exactly what was reported delivered."""
    topic = unique_topic()
    assert run_kcli(cli_env, "-b", broker.bootstrap, "topics", "create", "--topic", topic).returncode == 0
    delivered = sent = 0
    for _ in range(5):
        gen = subprocess.Popen([sys.executable, "-c", _GENERATOR], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc = subprocess.Popen([sys.executable, "-m", "kcli", "-b", broker.bootstrap, "produce", "--topic", topic],
                                stdin=gen.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env,
                                cwd=REPO)
        assert gen.stdout is not None and gen.stderr is not None
        gen.stdout.close()
        try:
            ready, _, _ = select.select([gen.stderr], [], [], 30)
            assert ready and gen.stderr.readline() == b"reading\n", "kcli never read its input"
            time.sleep(0.3)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            for p in (proc, gen):
                if p.poll() is None:
                    p.kill()
                p.wait()
        stderr = err.decode()
        assert proc.returncode == 130, stderr
        assert "Traceback" not in stderr and "SystemError" not in stderr, stderr
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("kcli: interrupted: "), stderr
        words = lines[0].split()
        n, m = int(words[2]), int(words[4])  # "kcli: interrupted: N of M records delivered to T"
        assert 0 < n <= m and f"delivered to {topic}" in lines[0]
        delivered, sent = delivered + n, sent + m
    assert delivered <= _end_offset(broker.bootstrap, topic) <= sent


def test_ctrl_c_in_a_command_without_its_own_handling_exits_130(tmp_path: Path, cli_env: dict[str, str]) -> None:  # noqa: F811
    """Any command: one `kcli: interrupted` line, exit 130, no traceback (here: `kcli runbook
    validate` blocked reading a FIFO that never gets written)."""
    import os

    fifo = tmp_path / "never.yaml"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, "-m", "kcli", "runbook", "validate", str(fifo)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env, cwd=REPO)
    writer = None
    try:
        deadline = time.monotonic() + 30
        while writer is None:  # opening the write end succeeds once kcli has the read end open
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "kcli never opened the file"
                time.sleep(0.1)
        time.sleep(0.3)  # kcli now blocks reading: nothing is ever written
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if writer is not None:
            os.close(writer)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = err.decode()
    assert proc.returncode == 130, stderr
    assert [ln for ln in stderr.splitlines() if ln.strip()] == ["kcli: interrupted"], stderr


# --- the broker behind DIR/broker.json --------------------------------------------------------


def _point_broker_json_at(data_dir: Path, other) -> None:
    info = json.loads((other.data_dir / "broker.json").read_text())
    (data_dir / "broker.json").write_text(json.dumps(info))


def _cluster_id(data_dir: Path) -> str:
    """From the metadata log's ClusterIdRecord (lines are ``<crc32c hex> <json>``)."""
    for line in (data_dir / "__cluster_metadata" / "metadata.log").read_text().splitlines():
        rec = json.loads(line.split(" ", 1)[1])
        if rec["type"] == "ClusterIdRecord":
            return rec["data"]["clusterId"]
    raise AssertionError(f"no ClusterIdRecord in {data_dir}")


def test_broker_json_naming_another_clusters_broker_is_refused(broker_factory, cli_env: dict[str, str]) -> None:  # noqa: F811
    """DIR is served (its lock held) but DIR/broker.json names a live broker of another cluster:
    before, kcli used it (exit 0, topic created in the wrong cluster). Now: exit 1, both ids."""
    mine = broker_factory(name="mine")
    other = broker_factory(name="other")
    _point_broker_json_at(mine.data_dir, other)
    env = dict(cli_env, KCLI_DATA_DIR=str(mine.data_dir))
    topic = unique_topic()
    proc = run_kcli(env, "topics", "create", "--topic", topic)
    assert_one_line_error(proc, 1, _cluster_id(mine.data_dir), _cluster_id(other.data_dir), other.bootstrap)
    assert topic not in run_kcli(env, "-b", other.bootstrap, "topics", "list").stdout.split()
    # The read-only commands that find a broker through broker.json are checked the same way.
    metrics = run_kcli(env, "broker", "metrics")
    assert_one_line_error(metrics, 1, _cluster_id(mine.data_dir), _cluster_id(other.data_dir), other.bootstrap)
    assert mine.alive() and other.alive()


def test_stale_broker_json_with_a_live_pid_is_not_trusted(broker_factory, cli_env: dict[str, str]) -> None:  # noqa: F811
    """Nothing serves DIR (lock free) but DIR/broker.json names another cluster's live broker
    (pid alive, port answering): before, kcli talked to that broker. Now it starts its own
    broker on DIR, so the topic lands in DIR's cluster."""
    other = broker_factory(name="other")
    mine = broker_factory(name="mine")
    mine.stop()
    _point_broker_json_at(mine.data_dir, other)
    env = dict(cli_env, KCLI_DATA_DIR=str(mine.data_dir))
    topic = unique_topic()
    proc = run_kcli(env, "topics", "create", "--topic", topic)
    assert proc.returncode == 0, proc.stderr
    assert topic not in run_kcli(env, "-b", other.bootstrap, "topics", "list").stdout.split()
    assert topic in run_kcli(env, "topics", "list").stdout.split()


@pytest.mark.parametrize("group", [[], ["--group", "lost-broker"]], ids=["assigned", "group"])
def test_consumer_reports_the_lost_broker_of_another_command(broker_factory, cli_env: dict[str, str],  # noqa: F811
                                                             group: list[str]) -> None:
    """`kcli consume` on the broker a `kcli broker start` runs for KCLI_DATA_DIR; the broker is
    killed. Before: the consumer rode it out silently and --timeout-ms ended it with exit 0
    (in a group only after close() waited out the 45 s session timeout). Now: one line naming
    the lost broker, exit 1, within seconds."""
    b = broker_factory(name="served")
    env = dict(cli_env, KCLI_DATA_DIR=str(b.data_dir))
    topic = unique_topic()
    assert run_kcli(env, "produce", "--topic", topic, input="first\n").returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "kcli", "consume", "--topic", topic, "--from-beginning",
                             "--timeout-ms", "8000", *group], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, cwd=REPO)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready and proc.stdout.readline() == b"first\n"
        pid = b.proc.pid
        b.kill9()
        start = time.monotonic()
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    result = subprocess.CompletedProcess(proc.args, proc.returncode, "", err.decode())
    assert_one_line_error(result, 1, "lost the kcli broker serving", str(b.data_dir), f"process {pid} ended")
    assert took < 8, took  # before --timeout-ms could end it "successfully"
