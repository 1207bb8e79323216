"""The contexts file, `kcli context ...`, and how a command picks its cluster."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import yaml

from kcli import contexts
from kcli.cli.common import GlobalOptions
from kcli.errors import UsageError
from kcli.ops.connection import BOOTSTRAP_ENV, resolve
from tests.fixtures_cli import (  # noqa: F401  (fixtures are used by name)
    assert_one_line_error,
    bootstrap,
    cli_env,
    cluster,
    run_kcli,
    tansu_bootstrap,
    unique_topic,
)


def _config(env: dict[str, str]) -> Path:
    return Path(env["KCLI_CONFIG"])


def test_set_list_show_use_delete(cli_env: dict[str, str]) -> None:
    r = run_kcli(cli_env, "context", "set", "prod", "--bootstrap-server", "kafka-1:9092,kafka-2:9092",
                 "--property", "security.protocol=SASL_SSL", "--property", "sasl.password=hunter2")
    assert r.returncode == 0, r.stderr
    path = _config(cli_env)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it holds credentials
    on_disk = yaml.safe_load(path.read_text())
    assert on_disk == {
        "current-context": "prod",  # the first context becomes current
        "contexts": {"prod": {"bootstrap-servers": "kafka-1:9092,kafka-2:9092",
                              "properties": {"security.protocol": "SASL_SSL", "sasl.password": "hunter2"}}},
    }
    assert run_kcli(cli_env, "context", "set", "dev", "-b", "localhost:9092").returncode == 0

    table = run_kcli(cli_env, "context", "list").stdout.splitlines()
    assert table[0].split() == ["CURRENT", "NAME", "BOOTSTRAP-SERVERS", "PROPERTIES"]
    assert table[1].split()[:2] == ["dev", "localhost:9092"]
    assert table[2].split()[:3] == ["*", "prod", "kafka-1:9092,kafka-2:9092"]
    assert "hunter2" not in "\n".join(table)

    listed = json.loads(run_kcli(cli_env, "-o", "json", "context", "list").stdout)
    assert [(c["name"], c["current"]) for c in listed] == [("dev", False), ("prod", True)]
    assert listed[1]["properties"] == {"security.protocol": "SASL_SSL", "sasl.password": "******"}

    shown = run_kcli(cli_env, "context", "show")
    assert shown.returncode == 0, shown.stderr
    assert "name: prod" in shown.stdout and "sasl.password: ******" in shown.stdout and "hunter2" not in shown.stdout
    dev = yaml.safe_load(run_kcli(cli_env, "-o", "yaml", "context", "show", "dev").stdout)
    assert dev == {"name": "dev", "bootstrap_servers": "localhost:9092", "properties": {}, "current": False}

    assert run_kcli(cli_env, "context", "use", "dev").returncode == 0
    assert yaml.safe_load(path.read_text())["current-context"] == "dev"

    # Updating keeps what was not given; --unset-property removes one property.
    assert run_kcli(cli_env, "context", "set", "prod", "--unset-property", "sasl.password").returncode == 0
    prod = contexts.load(path).get("prod")
    assert prod.bootstrap_servers == "kafka-1:9092,kafka-2:9092"
    assert prod.properties == {"security.protocol": "SASL_SSL"}

    assert run_kcli(cli_env, "context", "delete", "dev").returncode == 0
    after = contexts.load(path)
    assert list(after.contexts) == ["prod"] and after.current_context is None
    no_current = run_kcli(cli_env, "context", "show")
    assert_one_line_error(no_current, 2, "no current context")


def test_context_errors_exit_2(cli_env: dict[str, str]) -> None:
    assert_one_line_error(run_kcli(cli_env, "context", "use", "ghost"), 2, "unknown context 'ghost'")
    assert_one_line_error(run_kcli(cli_env, "context", "delete", "ghost"), 2, "unknown context")
    assert_one_line_error(run_kcli(cli_env, "context", "show", "ghost"), 2, "unknown context")
    assert_one_line_error(run_kcli(cli_env, "context", "set", "new"), 2, "--bootstrap-server is required")
    assert_one_line_error(run_kcli(cli_env, "context", "set", "x", "-b", "no:port"), 2, "HOST:PORT")
    assert_one_line_error(run_kcli(cli_env, "context", "set", "x", "-b", "h:99999"), 2, "HOST:PORT")
    assert_one_line_error(run_kcli(cli_env, "context", "set", "x", "-b", "h:1", "--property", "novalue"), 2, "KEY=VALUE")
    assert_one_line_error(run_kcli(cli_env, "context", "set", "bad name", "-b", "h:1"), 2, "invalid context name")
    assert not _config(cli_env).exists()  # nothing half-written by failed commands
    assert_one_line_error(run_kcli(cli_env, "--context", "ghost", "topics", "list"), 2, "unknown context 'ghost'")


def test_malformed_file_is_a_usage_error(cli_env: dict[str, str]) -> None:
    path = _config(cli_env)
    path.write_text("contexts: [unclosed\n")
    assert_one_line_error(run_kcli(cli_env, "context", "list"), 2, "not valid YAML", str(path))
    path.write_text("contexts:\n  a: {properties: {x: 1}}\n")
    assert_one_line_error(run_kcli(cli_env, "context", "list"), 2, "bootstrap-servers")
    path.write_text("current-context: gone\ncontexts:\n  a: {bootstrap-servers: 'h:1'}\n")
    assert_one_line_error(run_kcli(cli_env, "topics", "list"), 2, "current-context 'gone'")


def test_yaml_scalars_become_client_strings(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("contexts:\n  a:\n    bootstrap-servers: 'h:1'\n    properties: {enable.ssl.certificate.verification: false, retries: 3}\n")
    props = contexts.load(path).get("a").properties
    assert props == {"enable.ssl.certificate.verification": "false", "retries": "3"}


def test_resolution_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config.yaml"
    monkeypatch.setenv("KCLI_CONFIG", str(path))
    cfg = contexts.load()
    contexts.set_context(cfg, "cur", "current:1", {"client.rack": "r1"})
    contexts.set_context(cfg, "named", "named:1", {"client.rack": "r2"})
    contexts.save(cfg)
    env = {BOOTSTRAP_ENV: "env:1"}

    conn = resolve(GlobalOptions(bootstrap_server="flag:1", context="named"), env)
    assert (conn.bootstrap, conn.properties) == ("flag:1", {"client.rack": "r2"})  # flag, named context's props
    conn = resolve(GlobalOptions(bootstrap_server="flag:1"), env)
    assert (conn.bootstrap, conn.properties) == ("flag:1", {})
    conn = resolve(GlobalOptions(context="named"), env)
    assert (conn.bootstrap, conn.properties) == ("named:1", {"client.rack": "r2"})
    conn = resolve(GlobalOptions(), env)
    assert (conn.bootstrap, conn.properties) == ("env:1", {})
    conn = resolve(GlobalOptions(), {})
    assert (conn.bootstrap, conn.properties, conn.origin) == ("current:1", {"client.rack": "r1"}, "current context 'cur'")

    cfg = contexts.load()
    cfg.current_context = None
    contexts.save(cfg)
    assert resolve(GlobalOptions(), {}) is None  # → the embedded default broker
    with pytest.raises(UsageError, match="unknown context"):
        resolve(GlobalOptions(bootstrap_server="flag:1", context="ghost"), {})


def test_commands_reach_the_cluster_through_contexts(bootstrap: str, cli_env: dict[str, str]) -> None:
    topic = unique_topic("ctx")
    assert run_kcli(cli_env, "-b", bootstrap, "topics", "create", "--topic", topic).returncode == 0
    assert run_kcli(cli_env, "context", "set", "local", "-b", bootstrap).returncode == 0
    # The current context is used when nothing else is given.
    assert topic in run_kcli(cli_env, "topics", "list").stdout.splitlines()
    # $KCLI_BOOTSTRAP_SERVER beats the current context ...
    env = dict(cli_env, KCLI_BOOTSTRAP_SERVER=bootstrap)
    assert run_kcli(cli_env, "context", "set", "dead", "-b", "127.0.0.1:9").returncode == 0
    assert run_kcli(cli_env, "context", "use", "dead").returncode == 0
    assert topic in run_kcli(env, "topics", "list").stdout.splitlines()
    # ... and --context beats $KCLI_BOOTSTRAP_SERVER.
    assert topic in run_kcli(dict(env, KCLI_BOOTSTRAP_SERVER="127.0.0.1:9"), "--context", "local",
                             "topics", "list").stdout.splitlines()
    # Context properties reach librdkafka: an unknown one is rejected as bad input.
    assert run_kcli(cli_env, "context", "set", "typo", "-b", bootstrap, "--property", "no.such.property=1").returncode == 0
    bad = run_kcli(cli_env, "--context", "typo", "topics", "list")
    assert_one_line_error(bad, 2, "no.such.property")
