"""Small things operators hit (#18 part 7), each through the CLI as a real process where exit
codes and signals matter, against real brokers and real files."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures_cli import REPO, assert_one_line_error, cli_env, run_kcli, unique_topic  # noqa: F401
from tests.kafka_helpers import create_topic, produce

# ---- completion scripts -------------------------------------------------------------------------


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts_end_with_one_newline(shell: str) -> None:
    text = (REPO / "completions" / f"kcli.{shell}").read_text()
    assert text.endswith("\n") and not text.endswith("\n\n") and not text.startswith("\n")


def test_zsh_completion_is_an_autoload_file(tmp_path: Path) -> None:
    """compinit registers a file of $fpath for `kcli` only when its first line is `#compdef kcli`."""
    text = (REPO / "completions" / "kcli.zsh").read_text()
    assert text.splitlines()[0] == "#compdef kcli"
    zsh = shutil.which("zsh")
    if zsh is None:
        pytest.skip("zsh is not installed (apt-get install zsh); the first-line check above still ran")
    fdir = tmp_path / "functions"
    fdir.mkdir()
    shutil.copy(REPO / "completions" / "kcli.zsh", fdir / "_kcli")
    script = (f"fpath=({fdir} $fpath); autoload -Uz compinit; compinit -u -d {tmp_path}/zcompdump; "
              "print -r -- ${_comps[kcli]}")
    out = subprocess.run([zsh, "-f", "-c", script], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "_kcli", (out.stdout, out.stderr)
    syntax = subprocess.run([zsh, "-n", str(fdir / "_kcli")], capture_output=True, text=True, timeout=60)
    assert syntax.returncode == 0, syntax.stderr


# ---- --help ---------------------------------------------------------------------------------------


def _all_help() -> dict[str, str]:
    from typer.testing import CliRunner

    from kcli.cli.app import app
    from kcli.cli.docgen import iter_commands

    runner = CliRunner()
    out = {"": runner.invoke(app, ["--help"], terminal_width=200).output}
    for path, _ in iter_commands():
        out[" ".join(path)] = runner.invoke(app, [*path, "--help"], terminal_width=200).output
    return out


def test_help_shows_flags_as_flags_and_ranges_readably() -> None:
    helps = _all_help()
    bad = {cmd: [m for m in ("<bool>", "<int range>", "<int>", "<str>", "x>=", "<=x") if m in text]
           for cmd, text in helps.items()}
    assert not {cmd: found for cmd, found in bad.items() if found}
    create = helps["topics create"]
    assert re.search(r"--if-not-exists\s+Succeed", create), create  # a flag: no value shown
    assert "N [N ≥ 1]" in create and "N [1 ≤ N ≤ 32767]" in create
    assert "MS [MS ≥ 0]" in helps["diskless gc"]  # an option's own metavar names its range
    assert "[table|json|yaml]" in helps[""]


# ---- global options after the command ---------------------------------------------------------


def test_output_option_without_value_and_combined_short_flags(broker, cli_env: dict[str, str]) -> None:  # noqa: F811
    topic = unique_topic()
    create_topic(broker.bootstrap, topic)
    for args in (["topics", "list", "-o"], ["-b", broker.bootstrap, "topics", "list", "-vo"], ["-o"]):
        proc = run_kcli(cli_env, *args)
        assert_one_line_error(proc, 2, "requires an argument")
        assert "not one of" not in proc.stderr  # before: "'topics' is not one of 'table', ..."
    for args in (["-vo", "json", "topics", "list", "-b", broker.bootstrap],
                 ["topics", "list", "-vo", "json", "-b", broker.bootstrap],
                 ["topics", "list", "-ojson", "-b", broker.bootstrap],
                 ["-b", broker.bootstrap, "topics", "list", "-o", "yaml", "-v"]):
        proc = run_kcli(cli_env, *args)
        assert proc.returncode == 0, (args, proc.stderr)
        assert topic in proc.stdout
        assert ("using " in proc.stderr) == any("v" in a for a in args if a.startswith("-") and a != "-ojson")  # -v
        if "yaml" not in args:
            json.loads(proc.stdout)
    bad = run_kcli(cli_env, "-b", broker.bootstrap, "topics", "list", "-vo", "xml")  # -v: with its traceback
    assert bad.returncode == 2 and bad.stderr.splitlines()[-1].startswith("kcli: error: ")
    assert "'xml' is not one of" in bad.stderr.splitlines()[-1]
    assert_one_line_error(run_kcli(cli_env, "-b", broker.bootstrap, "topics", "list", "-oxml"), 2, "'xml' is not one of")


# ---- data dir ---------------------------------------------------------------------------------


def test_a_regular_file_as_data_dir_says_not_a_directory(tmp_path: Path, cli_env: dict[str, str]) -> None:  # noqa: F811
    afile = tmp_path / "afile"
    afile.write_text("x")
    for args, env in ((["broker", "start", "--data-dir", str(afile), "--listen", "127.0.0.1:0"], cli_env),
                      (["broker", "start", "--data-dir", str(afile / "sub"), "--listen", "127.0.0.1:0"], cli_env),
                      (["topics", "list"], {**cli_env, "KCLI_DATA_DIR": str(afile)})):
        assert_one_line_error(run_kcli(env, *args), 1, "not a directory")
    assert afile.read_text() == "x"


# ---- never the embedded broker when a cluster was named ---------------------------------------


def test_a_context_or_env_bootstrap_is_used_even_when_unreachable(tmp_path: Path, cli_env: dict[str, str]) -> None:  # noqa: F811
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    cases = [({"KCLI_BOOTSTRAP_SERVER": dead}, None), ({"KAFKA_BOOTSTRAP_SERVERS": dead}, None),
             ({}, f"current-context: dev\ncontexts:\n  dev:\n    bootstrap-servers: \"{dead}\"\n")]
    for extra, contexts in cases:
        Path(cli_env["KCLI_CONFIG"]).unlink(missing_ok=True)
        if contexts:
            Path(cli_env["KCLI_CONFIG"]).write_text(contexts)
        proc = run_kcli({**cli_env, **extra}, "topics", "list")
        assert_one_line_error(proc, 1, f"cannot reach {dead}")
        assert not Path(cli_env["KCLI_DATA_DIR"]).exists()  # no embedded broker was booted


# ---- --coordinator --------------------------------------------------------------------------------


def test_coordinator_takes_the_same_forms_everywhere(broker_factory, tmp_path: Path, cli_env: dict[str, str]) -> None:  # noqa: F811
    b = broker_factory()
    create_topic(b.bootstrap, "dl", 1, {"diskless.enable": "true"})
    produce(b.bootstrap, "dl", [b"a", b"b"])
    assert b.stop() == 0
    db = b.data_dir / "diskless" / "coordinator.db"
    rel = os.path.relpath(db, REPO)  # run_kcli runs in REPO
    forms = [str(db), f"sqlite://{db}", f"sqlite://localhost{db}", rel, f"sqlite://{rel}"]
    docs = []
    for form in forms:
        proc = run_kcli(cli_env, "diskless", "describe", "--coordinator", form, "-o", "json")
        assert proc.returncode == 0, (form, proc.stderr)
        docs.append(json.loads(proc.stdout))
    assert all(d == docs[0] for d in docs) and docs[0]["topics"]
    wal = next((b.data_dir / "objects" / "wal").iterdir())
    for form in (str(db), f"sqlite://{db}"):
        proc = run_kcli(cli_env, "dump-log", str(wal), "--coordinator", form)
        assert proc.returncode == 0, (form, proc.stderr)
        assert "topic: dl" in proc.stdout or "dl-0" in proc.stdout or "partition" in proc.stdout, proc.stdout
    for form in ("mysql://h/db", "sqlite://", "postgresql:///nohost"):
        for cmd in (["diskless", "describe"], ["dump-log", str(wal)]):
            assert_one_line_error(run_kcli(cli_env, *cmd, "--coordinator", form), 2, "--coordinator expects")


# ---- dump-log on kcli's own logs -------------------------------------------------------------------


def test_dump_log_reads_kclis_internal_logs(broker_factory, tmp_path: Path, cli_env: dict[str, str]) -> None:  # noqa: F811
    from confluent_kafka import Consumer, TopicPartition

    from kcli.crcjson import encode_line

    b = broker_factory()
    create_topic(b.bootstrap, "t", 1)
    produce(b.bootstrap, "t", [b"x"])
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g1", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition("t", 0, 1)], asynchronous=False)
    c.close()
    assert b.stop() == 0
    rlmm = b.data_dir / "__remote_log_metadata"  # as the tiered RLMM writes it (kcli/tiered/metadata.py)
    rlmm.mkdir()
    (rlmm / "metadata.log").write_bytes(encode_line({"type": "RemoteLogSegmentMetadataRecord", "data": {"x": 1}}))
    for d, first in (("__cluster_metadata", "ClusterIdRecord"), ("__consumer_offsets", "g1"),
                     ("__remote_log_metadata", "RemoteLogSegmentMetadataRecord")):
        for arg in (str(b.data_dir / d), next(str(p) for p in (b.data_dir / d).glob("*.log"))):
            proc = run_kcli(cli_env, "dump-log", arg)
            assert proc.returncode == 0, (arg, proc.stderr)
            assert proc.stderr == "" and "invalid" not in proc.stdout, proc.stdout
            assert first in proc.stdout and "line: 1 position: 0 record: {" in proc.stdout
        proc = run_kcli(cli_env, "dump-log", str(b.data_dir / d), "-o", "json")
        objs = [json.loads(ln) for ln in proc.stdout.splitlines()]
        assert objs[0]["kind"] == "kcli-log" and objs[1]["type"] == "kcliRecord" and objs[1]["line"] == 1
    # a damaged line is invalid data (exit 1, naming it); a torn last line is reported as trailing bytes
    damaged = tmp_path / "metadata.log"
    good = encode_line({"type": "A"})
    damaged.write_bytes(good + b"00000000 {\"type\":\"B\"}\n" + good + good[:7])
    proc = run_kcli(cli_env, "dump-log", str(damaged))
    assert proc.returncode == 1
    assert "line 2 at position" in proc.stderr and "fails its CRC" in proc.stderr
    assert "Found 7 invalid bytes at the end of metadata.log" in proc.stdout
    assert proc.stdout.count("record: {") == 2


def test_a_directory_without_segments_is_one_error_everywhere(tmp_path: Path, cli_env: dict[str, str]) -> None:  # noqa: F811
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a segment")
    for arg in (str(empty), f"file://{empty}", f"{empty}/"):
        for extra in ([], ["-o", "json"]):
            assert_one_line_error(run_kcli(cli_env, "dump-log", arg, *extra), 1,
                                  "no log, index or WAL files in that directory")


# ---- topics alter --wait ------------------------------------------------------------------------


def test_tiering_alter_waits_until_disabled(broker_factory, cli_env: dict[str, str]) -> None:  # noqa: F811
    tiered = {"remote.log.storage.system.enable": "true", "remote.log.manager.task.interval.ms": "200",
              "log.retention.check.interval.ms": "200"}
    b = broker_factory({**tiered, "kcli.fault.remote.log.disable.delay.ms": "60000"})  # held in DISABLING
    create_topic(b.bootstrap, "held", 1, {"remote.storage.enable": "true"})
    t0 = time.monotonic()
    proc = run_kcli(cli_env, "-b", b.bootstrap, "topics", "alter", "-t", "held", "--disable-tiering", "--wait",
                    "--timeout", "1.5")
    assert_one_line_error(proc, 1, "topic 'held' is still DISABLING after 2s (waiting for DISABLED)")
    assert time.monotonic() - t0 < 30
    b2 = broker_factory(tiered, name="data2")
    create_topic(b2.bootstrap, "free", 1, {"remote.storage.enable": "true"})
    proc = run_kcli(cli_env, "-b", b2.bootstrap, "-o", "json", "topics", "alter", "-t", "free", "--disable-tiering",
                    "--wait")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tiered_state"] == "DISABLED"  # not DISABLING: it waited
    proc = run_kcli(cli_env, "-b", b2.bootstrap, "-o", "json", "topics", "alter", "-t", "free", "--enable-tiering",
                    "--wait")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tiered_state"] == "ENABLED"
    for args, needle in ((["--wait"], "--wait goes with"), (["--disable-tiering", "--timeout", "5"], "--timeout goes with --wait"),
                         (["--disable-tiering", "--wait", "--dry-run"], "mutually exclusive"),
                         (["--disable-tiering", "--wait", "--timeout", "0"], "--timeout")):
        assert_one_line_error(run_kcli(cli_env, "-b", b2.bootstrap, "topics", "alter", "-t", "free", *args), 2, needle)


# ---- Ctrl-C -------------------------------------------------------------------------------------


def _interrupt(args: list[str], env: dict[str, str], after_s: float) -> tuple[int, str]:
    proc = subprocess.Popen([sys.executable, "-m", "kcli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env, cwd=REPO)
    try:
        time.sleep(after_s)
        assert proc.poll() is None, f"{args} ended before the signal: {proc.stderr.read().decode()}"  # type: ignore[union-attr]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err.decode()


def test_ctrl_c_exits_130_in_commands_waiting_on_a_cluster(tmp_path: Path, cli_env: dict[str, str]) -> None:  # noqa: F811
    """A broker that accepts connections and never answers: each command waits (within its
    timeout); Ctrl-C ends it with one line and 130."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # the kernel completes the handshakes; nobody ever reads
        bs = f"127.0.0.1:{silent.getsockname()[1]}"
        # (consume: librdkafka gives up on a silent broker within ~2 s here; its Ctrl-C is tested
        # against a real broker in tests/test_cli_clients.py)
        for args in (["topics", "list"], ["diskless", "describe"], ["topics", "alter", "-t", "x", "--disable-tiering"]):
            code, err = _interrupt(["-b", bs, *args], cli_env, 4.0)  # past start-up and imports even on a loaded machine
            assert code == 130, (args, err)
            lines = [ln for ln in err.splitlines() if ln.strip()]
            assert len(lines) == 1 and lines[0].startswith("kcli: interrupted"), (args, err)


def test_ctrl_c_exits_130_in_dump_log(broker, tmp_path: Path, cli_env: dict[str, str]) -> None:  # noqa: F811
    """dump-log blocked writing to a full pipe (nobody reads its output yet)."""
    topic = unique_topic()
    create_topic(broker.bootstrap, topic)
    produce(broker.bootstrap, topic, [b"v" * 200] * 3000)
    segment = next((broker.data_dir / f"{topic}-0").glob("*.log"))
    code, err = _interrupt(["dump-log", str(segment), "--print-data-log"], cli_env, 3.0)
    assert code == 130, err
    assert [ln for ln in err.splitlines() if ln.strip()] == ["kcli: interrupted"], err
