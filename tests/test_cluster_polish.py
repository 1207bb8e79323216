"""What an operator tripped over (issue #25 §3), driven through real processes: the broker's
listening announcement in a JSON log, and `kcli cluster start|stop --timeout` in --help.

The cluster items (stable metrics ports, peers logging a broker leaving and joining) run in
tests/test_cluster_cli.py, on its one cluster; Kafka's broker configs that kcli does not
implement in tests/test_dynamic_broker_configs.py."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

from tests.brokerproc import BrokerProcess
from tests.fixtures_cli import cli_env, run_kcli  # noqa: F401 - fixture
from tests.kafka_helpers import produce


def test_json_log_format_announces_listening_as_a_json_log_object(tmp_path: Path, cli_env) -> None:  # noqa: ANN001, F811
    """With --log-format json, a background broker's log (stdout and stderr both go there) is JSON
    from its first line to its last: the listening announcement too, as a log object with
    event broker.listening and the address."""
    data = tmp_path / "bg"
    started = run_kcli(cli_env, "broker", "start", "--daemon", "--data-dir", str(data), "--listen", "127.0.0.1:0",
                       "--log-format", "json", "-o", "json", timeout=120)
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    try:
        produce(info["bootstrap"], "json-log", [b"x"])
        stopped = run_kcli(cli_env, "broker", "stop", "--data-dir", str(data), "--timeout", "60", timeout=120)
        assert stopped.returncode == 0, stopped.stderr
    finally:
        try:
            os.kill(info["pid"], signal.SIGKILL)  # only if the test failed before stopping it
        except ProcessLookupError:
            pass
    lines = [ln for ln in (data / "broker.log").read_text().splitlines() if ln.strip()]
    records = []
    for ln in lines:
        try:
            records.append(json.loads(ln))
        except ValueError:
            raise AssertionError(f"a line of the JSON log is not JSON: {ln!r}") from None
    [listening] = [r for r in records if r.get("event") == "broker.listening"]
    host, port = info["bootstrap"].rsplit(":", 1)
    assert listening["message"] == f"kcli broker listening on {host}:{port}"
    assert (listening["level"], listening["logger"], listening["listener"], listening["host"], listening["port"],
            listening["node_id"]) == ("INFO", "kcli.broker", "PLAINTEXT", host, int(port), 1)
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", listening["time"])
    assert any(r.get("event") == "broker.stopped" for r in records)


def test_text_log_format_keeps_the_plain_listening_line(tmp_path: Path, cli_env) -> None:  # noqa: ANN001, F811
    data = tmp_path / "bg"
    started = run_kcli(cli_env, "broker", "start", "--daemon", "--data-dir", str(data), "--listen", "127.0.0.1:0",
                       "-o", "json", timeout=120)
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    try:
        assert f"kcli broker listening on {info['bootstrap']}\n" in (data / "broker.log").read_text()
    finally:
        assert run_kcli(cli_env, "broker", "stop", "--data-dir", str(data), timeout=120).returncode == 0


def test_test_brokers_start_with_a_json_log(tmp_path: Path) -> None:
    """The tests' broker launcher reads the announcement in either form (several listeners too)."""
    b = BrokerProcess(tmp_path / "j", extra_args=["--log-format", "json"]).start()
    try:
        produce(b.bootstrap, "t", [b"x"])
    finally:
        assert b.stop() == 0
    m = BrokerProcess(tmp_path / "m", {"listeners": "PLAIN://127.0.0.1:0,OTHER://127.0.0.1:0",
                                       "listener.security.protocol.map": "PLAIN:PLAINTEXT,OTHER:PLAINTEXT"},
                      extra_args=["--log-format", "json"]).start()
    try:
        assert set(m.listeners) == {"PLAIN", "OTHER"} and all(":" in a for a in m.listeners.values())
        produce(m.listeners["OTHER"], "t", [b"x"])
    finally:
        assert m.stop() == 0


def test_cluster_timeouts_show_seconds_in_help(cli_env) -> None:  # noqa: ANN001, F811
    for command in ("start", "stop"):
        out = run_kcli({**cli_env, "COLUMNS": "200"}, "cluster", command, "--help")
        assert out.returncode == 0, out.stderr
        [line] = [ln for ln in out.stdout.splitlines() if "--timeout" in ln]
        assert re.search(r"--timeout\s+SECONDS\s", line), line
