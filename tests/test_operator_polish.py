"""What an operator tripped over (issue #25 §3), each through the real CLI: `python3 -m kcli` as a
process (exit codes, pipes) or Typer's runner (help layout), against real brokers where a
cluster is involved.

1. produce to / consume from an offline partition (its broker is down) says which, and ends;
2. `topics alter --disable-tiering --wait` with nothing to do returns at once;
3. a tiering change on a broker without the tiered-storage system is refused (INVALID_CONFIG);
4. `--policy` is a choice (retain|delete);
5. `--help` never cuts a flag name, piped or on a narrow terminal;
6. output cut short by its reader (`| head`) exits 141, quietly, as cat does;
7. dump-log of a non-Kafka file says "Ignoring unknown file" and exits 0; `completion --help`
   shows the shells.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.brokerproc import BrokerProcess
from tests.fixtures_cli import REPO, assert_one_line_error, cli_env, run_kcli, unique_topic  # noqa: F401 - fixture
from tests.fixtures_pg import pg_server  # noqa: F401 - fixture
from tests.kafka_helpers import create_topic

TIERED_SYSTEM = {"remote.log.storage.system.enable": "true", "remote.log.manager.task.interval.ms": "200",
                 "log.retention.check.interval.ms": "200"}


def wait_for(cond, timeout: float, what: str):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# ---- 1. offline partitions -----------------------------------------------------------------------


@dataclass
class TwoBrokers:
    up: BrokerProcess  # broker 1, running
    down: BrokerProcess  # broker 2, killed
    env: dict[str, str]
    topic: str
    offline: list[int]  # partitions hosted by broker 2
    online: list[int]

    def kcli(self, *args: str, input: str | None = None, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        return run_kcli(self.env, "-b", self.up.bootstrap, *args, input=input, timeout=timeout)


def _live_seen_by(broker: BrokerProcess) -> set[int]:
    from kcli.protocol.client import WireClient

    with WireClient(broker.bootstrap, timeout=10) as client:
        resp = client.request(60, 0, {"include_cluster_authorized_operations": False})
    return {int(b.broker_id) for b in resp.brokers}


@pytest.fixture(scope="module")
def two_brokers(pg_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoBrokers]:  # noqa: ANN001
    """Brokers 1 and 2 over one PostgreSQL database; a classic topic with partitions on both;
    then broker 2 is killed, so its partitions are offline."""
    from confluent_kafka.admin import AdminClient

    from tests.test_cluster_state import FAST

    root = tmp_path_factory.mktemp("offline")
    url = pg_server.url(pg_server.create_database())
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCLI_")}
    env.update(KCLI_CONFIG=str(root / "kcli-config.yaml"), KCLI_DATA_DIR=str(root / "kcli-data"),
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    brokers = [BrokerProcess(root / f"node{n}", FAST, ["--cluster", url, "--node-id", str(n),
                                                       "--object-store", (root / "objects").as_uri()])
               for n in (1, 2)]
    try:
        for b in brokers:
            b.start()
        wait_for(lambda: all(_live_seen_by(b) == {1, 2} for b in brokers), 20, "both brokers to see each other")
        topic = unique_topic("offline")
        create_topic(brokers[0].bootstrap, topic, 6)
        md = AdminClient({"bootstrap.servers": brokers[0].bootstrap}).list_topics(topic, timeout=10)
        hosts = {p: pm.leader for p, pm in md.topics[topic].partitions.items()}
        assert set(hosts.values()) == {1, 2}, hosts
        ok = run_kcli(env, "-b", brokers[0].bootstrap, "produce", "-t", topic, "--key-separator", ":",
                      input="".join(f"k{i}:v{i}\n" for i in range(60)))
        assert ok.returncode == 0, ok.stderr
        brokers[1].kill9()
        wait_for(lambda: _live_seen_by(brokers[0]) == {1}, 20, "broker 2's lease to expire")
        yield TwoBrokers(brokers[0], brokers[1], env, topic, sorted(p for p, h in hosts.items() if h == 2),
                         sorted(p for p, h in hosts.items() if h == 1))
    finally:
        for b in brokers:
            b.stop()


def test_produce_to_an_offline_partition_times_out_naming_it(two_brokers: TwoBrokers) -> None:
    """Before: librdkafka's 300 s message.timeout.ms, silent. Now --timeout (default 30 s)."""
    c = two_brokers
    p = c.offline[0]
    t0 = time.monotonic()
    proc = c.kcli("produce", "-t", c.topic, "--partition", str(p), "--timeout", "3", input="a\nb\n")
    assert_one_line_error(proc, 1, "REQUEST_TIMED_OUT", f"2 of 2 records not delivered to '{c.topic}'",
                          "within 3s", f"topic '{c.topic}' partition {p} is offline (no leader: its broker 2 is down)")
    assert time.monotonic() - t0 < 30
    # the default is 30 s, not librdkafka's 300 s, and it is said in --help
    help_text = c.kcli("produce", "--help").stdout
    assert re.search(r"--timeout\s+SECONDS", help_text) and "(default 30)" in help_text
    # a partition that is up still takes records
    assert c.kcli("produce", "-t", c.topic, "--partition", str(c.online[0]), "--timeout", "10",
                  input="up\n").returncode == 0
    assert_one_line_error(c.kcli("produce", "-t", c.topic, "--timeout", "5", "--property", "message.timeout.ms=100",
                                 input="x\n"), 2, "--timeout and --property message.timeout.ms")


def test_consume_of_an_offline_partition_says_so_and_fails(two_brokers: TwoBrokers) -> None:
    """Before: exit 0 and no output at all."""
    c = two_brokers
    p = c.offline[0]
    proc = c.kcli("consume", "-t", c.topic, "--partition", str(p), "--from-beginning", "--timeout-ms", "2000")
    assert_one_line_error(proc, 1, "LEADER_NOT_AVAILABLE", f"topic '{c.topic}' partition {p} is offline",
                          "its broker 2 is down")
    assert proc.stdout == ""
    # the whole topic: the partitions that are up are read, the offline ones named, exit 1
    proc = c.kcli("consume", "-t", c.topic, "--from-beginning", "--timeout-ms", "3000")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stdout.strip(), "the partitions that are up were not read"
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr
    names = ", ".join(map(str, c.offline))
    assert lines[0].startswith("kcli: warning: ") and f"partition{'s' if len(c.offline) > 1 else ''} {names}" in lines[0]
    assert lines[-1].startswith("kcli: error: LEADER_NOT_AVAILABLE: ") and "were not read" in lines[-1], lines
    assert len(lines) == 2, lines


# ---- 2. --disable-tiering --wait with nothing to do ----------------------------------------------


@pytest.fixture(scope="module")
def tiered_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("tiered") / "data", TIERED_SYSTEM).start()
    yield b
    b.stop()


def test_disable_tiering_wait_on_a_topic_never_tiered_returns_at_once(tiered_broker: BrokerProcess,
                                                                     cli_env: dict[str, str]) -> None:  # noqa: F811
    """Before: it waited the whole --timeout and failed with `... is still None`."""
    topic = unique_topic("never")
    create_topic(tiered_broker.bootstrap, topic)
    t0 = time.monotonic()
    proc = run_kcli(cli_env, "-b", tiered_broker.bootstrap, "topics", "alter", "-t", topic, "--disable-tiering",
                    "--wait", "--timeout", "20")
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - t0 < 15
    assert f"Topic {topic} unchanged: tiering is already off on topic {topic}; nothing to do." in proc.stdout
    same = run_kcli(cli_env, "-b", tiered_broker.bootstrap, "topics", "alter", "-t", topic, "--disable-tiering")
    assert same.returncode == 0 and same.stdout == proc.stdout


# ---- 3. no tiering change without the tiered-storage system --------------------------------------


def test_tiering_change_without_the_tiered_system_is_refused(tmp_path: Path, cli_env: dict[str, str]) -> None:  # noqa: F811
    """Before: accepted, and after a restart with the system `remote.storage.enable=false` sat next
    to `TieredState: ENABLED`. Now INVALID_CONFIG, and config and state still agree."""
    b = BrokerProcess(tmp_path / "data", TIERED_SYSTEM).start()
    try:
        create_topic(b.bootstrap, "orders", 1, {"remote.storage.enable": "true"})
        b.configs["remote.log.storage.system.enable"] = "false"
        b.restart()
        for extra in ([], ["--dry-run"], ["--policy", "delete"]):
            proc = run_kcli(cli_env, "-b", b.bootstrap, "topics", "alter", "-t", "orders", "--disable-tiering", *extra)
            assert_one_line_error(proc, 1, "INVALID_CONFIG", "Tiered Storage functionality is disabled in the broker",
                                  "remote.log.storage.system.enable=true")
        # the same change spelled as a plain config change (what any Kafka client sends)
        for args in (["--config", "remote.storage.enable=false"], ["--delete-config", "remote.storage.enable"]):
            proc = run_kcli(cli_env, "-b", b.bootstrap, "topics", "alter", "-t", "orders", *args)
            assert_one_line_error(proc, 1, "INVALID_CONFIG", "Tiered Storage functionality is disabled in the broker")
        b.configs["remote.log.storage.system.enable"] = "true"
        b.restart()
        doc = json.loads(run_kcli(cli_env, "-b", b.bootstrap, "-o", "json", "topics", "describe", "-t", "orders").stdout)[0]
        assert (doc["configs"].get("remote.storage.enable"), doc["tiered_state"]) == ("true", "ENABLED")
        proc = run_kcli(cli_env, "-b", b.bootstrap, "-o", "json", "topics", "alter", "-t", "orders", "--disable-tiering",
                        "--wait", "--timeout", "60")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["tiered_state"] == "DISABLED"
    finally:
        b.stop()


# ---- 4. --policy is a choice -----------------------------------------------------------------------


def test_policy_is_a_choice(cli_env: dict[str, str]) -> None:  # noqa: F811
    """Before: `--policy nuke` exited 0 on a topic without tiering; help said TEXT."""
    for args in (["--disable-tiering", "--policy", "nuke"], ["--disable-tiering", "--policy", "Delete"]):
        proc = run_kcli(cli_env, "-b", "127.0.0.1:1", "topics", "alter", "-t", "orders", *args)
        assert_one_line_error(proc, 2, "--policy", "is not one of 'retain', 'delete'")
    help_text = run_kcli(cli_env, "topics", "alter", "--help").stdout
    assert re.search(r"--policy\s+\[retain\|delete\]", help_text), help_text
    env = dict(cli_env, _KCLI_COMPLETE="complete_bash", COMP_WORDS="kcli topics alter --policy ", COMP_CWORD="4")
    out = subprocess.run([sys.executable, "-c", "from kcli.cli.app import main; main()"], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=60).stdout
    assert out.split() == ["retain", "delete"]


# ---- 5. --help never cuts a flag name ---------------------------------------------------------------


def _long_options(cmd) -> list[str]:  # noqa: ANN001
    return [o for p in cmd.params if not getattr(p, "hidden", False) for o in p.opts + list(p.secondary_opts)
            if o.startswith("--")]


@pytest.mark.parametrize("columns", ["80", "40"])
def test_help_never_cuts_a_flag_name(columns: str) -> None:
    """Piped (Rich lays help out in 80 columns) or on a narrow terminal. Before:
    `--delete-partitions…`."""
    from typer.testing import CliRunner

    from kcli.cli.app import app
    from kcli.cli.docgen import iter_commands

    runner = CliRunner()
    cut = {}
    for path, cmd in iter_commands():
        out = runner.invoke(app, [*path, "--help"], env={"COLUMNS": columns}).output
        missing = [o for o in _long_options(cmd) if not re.search(re.escape(o) + r"(?![\w-])", out)]
        if missing or "…" in out:
            cut[" ".join(path)] = missing or [ln for ln in out.splitlines() if "…" in ln]
    assert not cut, cut


def test_piped_help_shows_whole_flag_names_and_wraps_descriptions(cli_env: dict[str, str]) -> None:  # noqa: F811
    env = {k: v for k, v in cli_env.items() if k != "COLUMNS"}
    out = run_kcli(env, "topics", "alter", "--help").stdout
    assert "--delete-partitions-delay" in out and "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 80
    row = next(ln for ln in out.splitlines() if "--delete-partitions-delay" in ln and ln.startswith("│"))
    assert "MS [MS ≥ 0]" in row and "With a smaller" in row  # the description wraps on its own column


# ---- 6. output cut short by its reader: exit 141, quietly -----------------------------------------


def _with_stdout_closed(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run kcli with a stdout pipe whose reader is already gone (`| head` that has ended)."""
    proc = subprocess.Popen([sys.executable, "-m", "kcli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env, cwd=REPO)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(60), err


@pytest.fixture
def big_segment(tmp_path: Path) -> Path:
    from kcli.dumplog.synth import build_batch, simple_records, write_segment

    batches, offset = [], 0
    for _ in range(400):
        batches.append(build_batch(simple_records(20, value_size=50), offset))
        offset += 20
    write_segment(str(tmp_path), 0, batches)
    return next(tmp_path.glob("*.log"))


def test_a_closed_pipe_exits_141_quietly(big_segment: Path, cli_env: dict[str, str]) -> None:  # noqa: F811
    """As cat and grep: killed by SIGPIPE, which a shell reports as 141. Before: exit 1."""
    assert 128 + signal.SIGPIPE == 141
    for args in (["--help"], ["topics", "alter", "--help"], ["dump-log", str(big_segment), "--deep-iteration"],
                 ["-o", "json", "dump-log", str(big_segment)]):
        code, err = _with_stdout_closed(args, cli_env)
        assert (code, err) == (141, ""), (args, code, err)
    # in a real pipeline, under pipefail: what `cat BIG | head -1` gives
    for cmd in (f"{sys.executable} -m kcli dump-log {big_segment} --deep-iteration | head -1",
                f"cat {big_segment} {big_segment} {big_segment} | head -c 1"):
        r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, env=cli_env, cwd=REPO,
                           timeout=60)
        assert r.returncode == 141 and r.stderr == b"", (cmd, r.returncode, r.stderr)
    head = subprocess.run(["bash", "-c", f"{sys.executable} -m kcli dump-log {big_segment} | head -1"],
                          capture_output=True, env=cli_env, cwd=REPO, timeout=60)
    assert head.stdout.decode() == f"Dumping {big_segment}\n"


# ---- 7. dump-log of an unknown file; completion --help -----------------------------------------------


def test_dump_log_ignores_an_unknown_file_as_kafka_does(big_segment: Path, tmp_path: Path,
                                                        cli_env: dict[str, str]) -> None:  # noqa: F811
    """Before: `kcli: error: Ignoring unknown file F` and exit 1 (the message said it was ignored)."""
    notes = tmp_path / "notes.txt"
    notes.write_text("not a segment\n")
    proc = run_kcli(cli_env, "dump-log", str(notes))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"Dumping {notes}\n", f"Ignoring unknown file {notes}\n")
    both = run_kcli(cli_env, "dump-log", str(notes), str(big_segment))
    assert both.returncode == 0 and f"Dumping {big_segment}" in both.stdout
    assert both.stderr == f"Ignoring unknown file {notes}\n"
    (tmp_path / "bad").mkdir()
    bad = tmp_path / "bad" / "00000000000000000000.log"  # a real failure still exits 1
    bad.write_bytes(big_segment.read_bytes()[:100])
    mixed = run_kcli(cli_env, "dump-log", str(notes), str(bad))
    assert mixed.returncode == 1 and f"Ignoring unknown file {notes}" in mixed.stderr
    help_text = " ".join(run_kcli(cli_env, "dump-log", "--help").stdout.split())
    assert "Ignoring unknown file FILE\" (exit 0)" in help_text and "141 when the reader" in help_text


def test_completion_help_shows_the_shells(cli_env: dict[str, str]) -> None:  # noqa: F811
    """Before: `Usage: kcli completion [OPTIONS] {shell}`."""
    out = run_kcli(cli_env, "completion", "--help").stdout
    assert "Usage: kcli completion [OPTIONS] {bash|zsh|fish}" in out
    assert "{shell}" not in out and re.search(r"SHELL\s+\[bash\|zsh\|fish\]", out), out
    # other arguments read as click's classic help: NAME (required), [NAME] (optional)
    assert "Usage: kcli context use [OPTIONS] NAME" in run_kcli(cli_env, "context", "use", "--help").stdout
    assert "Usage: kcli context show [OPTIONS] [NAME]" in run_kcli(cli_env, "context", "show", "--help").stdout
    assert_one_line_error(run_kcli(cli_env, "completion", "tcsh"), 2, "'tcsh' is not one of 'bash', 'zsh', 'fish'")
