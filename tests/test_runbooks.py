"""`kcli runbook validate|run`: validation positions, safe YAML, variables, resume, reports,
exit codes, and the worked examples in docs/runbooks/ against real broker processes."""

from __future__ import annotations

import fcntl
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Callable

import pytest
import yaml

from kcli.ops import tiering
from kcli.ops.connection import Connection
from kcli.ops.topics import describe_topics
from kcli.runbook import loader
from kcli.runbook.model import Condition, lookup, parse_duration
from kcli.runbook.state import state_path
from kcli.runbook.validate import validate
from tests.fixtures_cli import cli_env, run_kcli, unique_topic  # noqa: F401  (fixtures are used by name)
from tests.kafka_helpers import create_topic, produce

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "docs" / "runbooks"

Kcli = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def kcli(monkeypatch: pytest.MonkeyPatch, cli_env: dict[str, str]) -> Kcli:  # noqa: F811
    """kcli's real entry point (argument parsing, error boundary, exit code) run in this process:
    an interpreter start-up per call would dominate these tests. A few tests still run
    ``python3 -m kcli`` (run_kcli) to prove the same from a separate process."""
    from kcli.cli.app import main

    for key in [k for k in os.environ if k.startswith("KCLI_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("KCLI_CONFIG", cli_env["KCLI_CONFIG"])
    monkeypatch.setenv("KCLI_DATA_DIR", cli_env["KCLI_DATA_DIR"])

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        out, err = io.StringIO(), io.StringIO()
        monkeypatch.setattr(sys, "argv", ["kcli", *args])
        code = 0
        with redirect_stdout(out), redirect_stderr(err):
            try:
                main()
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())

    return run


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """One plain broker for the tests that only need topics (each uses its own topic names)."""
    from tests.brokerproc import BrokerProcess

    b = BrokerProcess(tmp_path_factory.mktemp("runbook-broker") / "data").start()
    yield b
    b.stop()


def write(tmp_path: Path, text: str, name: str = "book.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def problems_of(text: str, **cli_vars: str) -> list[str]:
    doc = loader.loads(textwrap.dedent(text).lstrip("\n"), "rb.yaml")
    runbook, problems = validate(doc, cli_vars)
    assert (runbook is None) == bool(problems)
    return [str(p) for p in problems]


def resolved(text: str, **cli_vars: str):  # noqa: ANN201
    doc = loader.loads(textwrap.dedent(text).lstrip("\n"), "rb.yaml")
    runbook, problems = validate(doc, cli_vars)
    assert not problems, problems
    return runbook


# ---- validation ----------------------------------------------------------------------------------

MANY_MISTAKES = """
description: several mistakes, all reported
bootstrap_server: ${bootstrap}
variables:
  bootstrap: "127.0.0.1:9092"
  topic: orders
steps:
  - topics.create: {topic: "${topic}", partitions: three}
  - topics.alterr: {topic: orders}
  - topics.alter:
      topic: ${topc}
      polcy: delete
      disable_tiering: true
  - sleep: 5
  - topics.describe: {topic: orders}
    expect: {path: partition_count, equalz: 3}
    wait_for: {describe: topics, topic: orders, path: tiered_state, equals: DISABLED, timeout: 10}
  - produce: {topic: x, records: [a, b], count: 3}
    on_error: maybe
  - topics.alter: {topic: orders, policy: retain}
  - bogus: 1
    wait_for: {describe: clusters, path: x, equals: 1}
"""


def test_validate_reports_every_problem_with_line_and_column(tmp_path: Path,  # noqa: F811
        cli_env: dict[str, str], kcli: Kcli) -> None:
    path = write(tmp_path, MANY_MISTAKES)
    proc = run_kcli(cli_env, "runbook", "validate", str(path))
    assert proc.returncode == 2, proc.stderr
    f = str(path)
    assert proc.stderr.splitlines() == [
        f"{f}:7:52: topics.create partitions: expected an integer, got 'three'",
        f"{f}:8:5: unknown operation 'topics.alterr' (did you mean 'topics.alter'?)",
        f"{f}:10:14: unknown variable 'topc' in '${{topc}}' (variables: bootstrap, topic)",
        f"{f}:11:7: unknown field 'polcy' for topics.alter (did you mean 'policy'?) (fields: topic, partitions, "
        "configs, delete_configs, disable_tiering, policy, enable_tiering, delete_partitions_delay, yes)",
        f"{f}:13:12: sleep duration: 5 needs a unit: 5ms, 5s or 5m",
        f"{f}:15:37: unknown key 'equalz' (did you mean 'equals'?) (allowed: path, equals, not_equals, gt, gte, "
        "lt, lte, contains, length, exists)",
        f"{f}:16:96: wait_for timeout: 10 needs a unit: 10ms, 10s or 10m",
        f"{f}:17:49: produce: give either records or count (with an optional template)",
        f"{f}:18:15: on_error must be stop or continue, got 'maybe'",
        f"{f}:19:43: topics.alter: policy goes with disable_tiering: true (re-enabling takes no policy)",
        f"{f}:20:5: unknown operation 'bogus'",
        f"{f}:21:26: wait_for cannot describe 'clusters' (one of: topics, diskless)",
        f"kcli: error: runbook {f} is invalid: 12 problem(s)",
    ]
    assert "Traceback" not in proc.stderr and proc.stdout == ""

    as_json = kcli("-o", "json", "runbook", "validate", str(path))
    assert as_json.returncode == 2
    doc = json.loads(as_json.stdout)
    assert doc["valid"] is False and len(doc["problems"]) == 12
    assert doc["problems"][0] == {"file": f, "line": 7, "column": 52,
                                  "message": "topics.create partitions: expected an integer, got 'three'"}

    # `run` refuses the same file before touching anything, with the same exit code
    ran = kcli("runbook", "run", str(path))
    assert ran.returncode == 2 and ran.stderr.count(f"{f}:") == 12
    assert not state_path(path).exists()


def test_structure_problems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCLI_CONFIG", str(tmp_path / "no-contexts.yaml"))
    assert problems_of("""
        stepz: []
        context: a
        bootstrap_server: b:1
        """) == [
        "rb.yaml:1:1: unknown top-level key 'stepz' (did you mean 'steps'?) (allowed: description, context, "
        "bootstrap_server, variables, steps)",
        "rb.yaml:1:1: the runbook has no steps: add `steps:` with a list of operations",
        "rb.yaml:2:10: unknown context 'a' (known: none defined; see `kcli context list`)",
        "rb.yaml:3:1: give context or bootstrap_server, not both",
    ]
    assert problems_of("""
        bootstrap_server: "not a host"
        steps:
          - topics.describe: {topic: a}
            topics.delete: {topic: a}
          - name: nothing here
          - [1, 2]
          - topics.list: [1]
          - topics.create: {topic: a, configs: [x]}
          - topics.alter: {topic: a}
          - consume: {topic: a, max_messages: 0}
          - produce: {topic: a, records: [x, {key: k, value: y}]}
          - produce: {topic: a, count: 2, template: "two\\nlines"}
        """) == [
        "rb.yaml:1:19: bootstrap_server expects HOST:PORT[,HOST:PORT...], got 'not a host'",
        "rb.yaml:4:5: a step runs one operation; this one has topics.describe and topics.delete",
        "rb.yaml:5:5: step 2 names no operation (one of: topics.create, topics.delete, topics.alter, topics.describe, "
        "topics.list, produce, consume, diskless.describe, diskless.objects, diskless.verify, diskless.gc, sleep)",
        "rb.yaml:6:5: step 3: expected a mapping such as `topics.describe: {topic: orders}`",
        "rb.yaml:7:18: topics.list takes a mapping of fields (kind, exclude_internal)",
        "rb.yaml:8:40: topics.create configs: expected a mapping of names to values, got a list",
        "rb.yaml:9:5: topics.alter: nothing to alter: give partitions, configs, delete_configs, disable_tiering "
        "or enable_tiering",
        "rb.yaml:10:39: consume max_messages: must be at least 1, got 0",
        "rb.yaml:11:34: produce: either every record has a key or none does",
        "rb.yaml:12:5: produce: record keys and values must be single lines",
    ]
    # YAML syntax errors carry the parser's position; duplicate keys are not silently merged
    with pytest.raises(loader.LoadError) as err:
        loader.loads("steps:\n  - sleep: {duration: 1s\n", "rb.yaml")
    assert str(err.value.problems[0]).startswith("rb.yaml:3:1: invalid YAML: expected ',' or '}'")
    assert problems_of("""
        steps:
          - sleep: 1s
            sleep: 2s
        """) == ["rb.yaml:3:5: duplicate key 'sleep' (first at line 2, column 5)"]


def test_unsafe_yaml_tags_are_refused_never_constructed(tmp_path: Path,  # noqa: F811
        cli_env: dict[str, str], kcli: Kcli) -> None:
    marker = tmp_path / "pwned"
    path = write(tmp_path, f"""
        variables:
          x: !!python/object/apply:os.system ["touch {marker}"]
        steps:
          - sleep: !!python/name:os.system 1s
          - topics.describe: !!python/object:kcli.runbook.model.Runbook {{topic: a}}
          - sleep: !custom 1s
          - sleep: !!binary aGVsbG8=
        """)
    proc = run_kcli(cli_env, "runbook", "validate", str(path))
    assert proc.returncode == 2
    f = str(path)
    allowed = "is not allowed: a runbook holds only strings, numbers, booleans, null, lists and mappings"
    assert proc.stderr.splitlines() == [
        f"{f}:2:6: YAML tag !!python/object/apply:os.system {allowed}",
        f"{f}:4:12: YAML tag !!python/name:os.system {allowed}",
        f"{f}:5:22: YAML tag !!python/object:kcli.runbook.model.Runbook {allowed}",
        f"{f}:6:12: YAML tag !custom {allowed}",
        f"{f}:7:12: YAML tag !!binary {allowed}",
        f"kcli: error: runbook {f} is invalid: 5 problem(s)",
    ]
    assert not marker.exists()
    kcli("runbook", "run", str(path))
    assert not marker.exists()


def test_variables_substitution_and_precedence() -> None:
    text = """
        bootstrap_server: ${host}:${port}
        variables:
          host: 127.0.0.1
          port: 9092
          topic: orders
          count: 3
          flag: false
        steps:
          - topics.create: {topic: "${topic}-x", partitions: "${count}", if_not_exists: "${flag}"}
            name: create ${topic} with ${count} partitions
            expect: {path: topic, equals: "$${literal} ${topic}"}
          - sleep: "${pause}"
        """
    assert problems_of(text) == ["rb.yaml:12:12: unknown variable 'pause' in '${pause}' "
                                 "(variables: count, flag, host, port, topic)"]
    rb = resolved(text.replace('"${pause}"', "100ms"))
    assert rb.bootstrap_server == "127.0.0.1:9092"
    step = rb.steps[0]
    assert step.args == {"topic": "orders-x", "partitions": 3, "if_not_exists": False, "diskless": False}
    assert step.name == "create orders with 3 partitions"
    assert step.expect[0].expected == "${literal} orders"
    assert rb.steps[1].args == {"duration": 0.1} and rb.steps[1].name == "sleep 100ms"

    # --var wins over the file, and arrives as text that fields coerce
    rb = resolved(text.replace('"${pause}"', "100ms"), topic="payments", count="12", flag="true")
    assert rb.steps[0].args == {"topic": "payments-x", "partitions": 12, "if_not_exists": True, "diskless": False}
    assert problems_of(text.replace('"${pause}"', "100ms"), count="many") == [
        "rb.yaml:9:54: topics.create partitions: expected an integer, got 'many'"]
    # an undeclared --var is a typo until proven otherwise; a null variable must be given
    assert problems_of(text.replace('"${pause}"', "100ms"), topc="x") == [
        "rb.yaml:2:1: --var topc: the runbook declares no variable 'topc' (variables: count, flag, host, port, topic)"]
    required = """
        variables: {topic: ~}
        steps:
          - topics.describe: {topic: "${topic}"}
        """
    assert problems_of(required) == ["rb.yaml:1:13: variable 'topic' has no value: pass --var topic=VALUE"]
    assert resolved(required, topic="t1").steps[0].args == {"topic": "t1"}


def test_conditions_paths_and_durations() -> None:
    data = {"partition_count": 3, "configs": {"retention.ms": "1000"}, "tiered_state": None,
            "partitions": [{"partition": 0, "leader": 1}, {"partition": 1, "leader": 2}], "kind": "tiered"}
    assert lookup(data, "configs.retention.ms") == "1000"
    assert lookup(data, 'configs["retention.ms"]') == "1000"
    assert lookup(data, "partitions[1].leader") == 2 == lookup(data, "partitions.-1.leader")
    cases = [
        (Condition("partition_count", "equals", 3), True), (Condition("partition_count", "equals", "3"), True),
        (Condition("partition_count", "equals", 4), False), (Condition("kind", "not_equals", "classic"), True),
        (Condition("configs.retention.ms", "gte", 1000), True), (Condition("configs.retention.ms", "lt", 1000), False),
        (Condition("partitions", "length", 2), True), (Condition("partitions.0", "contains", "leader"), True),
        (Condition("kind", "contains", "tier"), True), (Condition("tiered_state", "exists", True), True),
        (Condition("tiered_state", "equals", None), True), (Condition("nope", "exists", False), True),
        (Condition("nope", "equals", None), False), (Condition("kind", "gt", 1), False),
        (Condition("partition_count", "equals", True), False),
    ]
    for cond, want in cases:
        assert cond.evaluate(data)[0] is want, cond
    assert parse_duration("500ms") == 0.5 and parse_duration("2m") == 120 and parse_duration(0) == 0
    for bad in (5, "5", "five s", True):
        with pytest.raises(ValueError):
            parse_duration(bad)


# ---- running against a broker --------------------------------------------------------------------

RESUME = """
bootstrap_server: ${bootstrap}
variables:
  bootstrap: "127.0.0.1:9"
  topic: t
steps:
  - name: create a
    topics.create: {topic: "${topic}-a", partitions: 2, if_not_exists: true}
    expect: {path: topic, equals: "${topic}-a"}
  - name: tune b
    topics.alter: {topic: "${topic}-b", configs: {retention.ms: 3600000}}
  - name: b is tuned
    topics.describe: {topic: "${topic}-b"}
    expect:
      - {path: configs.retention.ms, equals: 3600000}
      - {path: partition_count, equals: 1}
"""


def _lines(proc) -> list[str]:  # noqa: ANN001
    return proc.stdout.splitlines()


def test_resume_after_failure_edit_and_restart(shared_broker, tmp_path: Path, kcli: Kcli) -> None:  # noqa: ANN001
    topic = unique_topic("rb")
    path = write(tmp_path, RESUME)
    args = ["runbook", "run", str(path), "--var", f"bootstrap={shared_broker.bootstrap}", "--var", f"topic={topic}"]
    state_file = tmp_path / "book.kcli-runbook-state.json"

    first = kcli(*args)
    assert first.returncode == 1, first.stderr
    out = _lines(first)
    assert out[0].startswith("[1/3] ok ") and out[0].endswith("  create a (topics.create)")
    assert out[1].startswith("[2/3] failed ") and "tune b (topics.alter): UNKNOWN_TOPIC_OR_PARTITION" in out[1]
    assert out[2].startswith("[3/3] skipped ")
    assert out[2].endswith("b is tuned (topics.describe): not run: step 2 failed")
    assert out[3].startswith(f"runbook {path}: 1 ok, 1 failed, 1 skipped in ")
    assert first.stderr == ""
    recorded = json.loads(state_file.read_text())
    assert [s["index"] for s in recorded["steps"]] == [1]

    # fix the cause outside the runbook, run again: step 1 is not repeated
    create_topic(shared_broker.bootstrap, f"{topic}-b", 1)
    second = kcli(*args)
    assert second.returncode == 0, second.stdout + second.stderr
    out = _lines(second)
    assert out[0].startswith("[1/3] skipped ") and "create a (topics.create): finished in an earlier run (" in out[0]
    assert out[1].startswith("[2/3] ok ") and out[2].startswith("[3/3] ok ")
    assert [s["index"] for s in json.loads(state_file.read_text())["steps"]] == [1, 2, 3]

    # nothing left to do; an edited step (and only it) runs again, and its failing expect fails it
    third = kcli(*args)
    assert third.returncode == 0 and [ln.split()[1] for ln in _lines(third)[:3]] == ["skipped"] * 3
    path.write_text(RESUME.replace("{path: partition_count, equals: 1}", "{path: partition_count, equals: 2}"))
    edited = kcli(*args)
    assert edited.returncode == 1
    out = _lines(edited)
    assert [ln.split()[1] for ln in out[:3]] == ["skipped", "skipped", "failed"]
    assert out[2].endswith("expect failed: partition_count equals 2 (got 1)")
    assert [s["index"] for s in json.loads(state_file.read_text())["steps"]] == [1, 2]

    # --restart runs everything again (create is if_not_exists, so it succeeds)
    path.write_text(RESUME)
    restarted = kcli("-o", "json", *args, "--restart")
    assert restarted.returncode == 0, restarted.stdout
    report = json.loads(restarted.stdout)
    assert [s["outcome"] for s in report["steps"]] == ["ok", "ok", "ok"]
    assert report["steps"][0]["result"] == {"topic": f"{topic}-a", "created": False}


def test_json_report_on_error_continue_and_exit_codes(shared_broker,  # noqa: ANN001
        tmp_path: Path, kcli: Kcli) -> None:
    topic = unique_topic("rj")
    path = write(tmp_path, f"""
        bootstrap_server: {shared_broker.bootstrap}
        steps:
          - topics.create: {{topic: {topic}, partitions: 3}}
          - topics.delete: {{topic: {topic}-missing}}
            on_error: continue
          - produce: {{topic: {topic}, records: [a, b], partition: 7}}
            on_error: continue
          - produce: {{topic: {topic}, count: 4, template: "v-{{i}}", key_template: "k-{{i}}"}}
            expect: {{path: records, equals: 4}}
          - consume: {{topic: {topic}, from_beginning: true, max_messages: 4, timeout: 10s}}
            expect:
              - {{path: count, equals: 4}}
              - {{path: records, length: 4}}
          - topics.list: {{exclude_internal: true}}
            expect: {{path: topics, contains: {topic}}}
          - topics.describe: {{topic: {topic}}}
            wait_for: {{describe: topics, topic: {topic}, path: partition_count, equals: 99, timeout: 600ms,
                        interval: 200ms}}
        """)
    proc = kcli("-o", "json", "runbook", "run", str(path))
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert set(report) == {"runbook", "state_file", "target", "dry_run", "restart", "started_at", "duration_ms",
                           "outcome", "summary", "steps"}
    assert report["outcome"] == "failed" and report["dry_run"] is False
    assert report["target"] == f"bootstrap_server={shared_broker.bootstrap}"
    assert report["state_file"] == str(tmp_path / "book.kcli-runbook-state.json")
    assert report["summary"] == {"ok": 4, "failed": 3, "skipped": 0, "dry-run": 0}
    steps = report["steps"]
    assert [s["outcome"] for s in steps] == ["ok", "failed", "failed", "ok", "ok", "ok", "failed"]
    assert set(steps[0]) == {"index", "name", "op", "args", "outcome", "duration_ms", "reason", "error", "on_error",
                             "result", "plan", "expect", "wait"}
    assert steps[1]["error"].startswith("UNKNOWN_TOPIC_OR_PARTITION") and steps[1]["on_error"] == "continue"
    assert steps[2]["error"] == ("UNKNOWN_TOPIC_OR_PARTITION: topic '%s' has 3 partitions; partition 7 does not exist"
                                 % topic)
    assert steps[3]["result"]["records"] == 4
    consumed = steps[4]["result"]
    assert consumed["count"] == 4 and sorted(r["value"] for r in consumed["records"]) == [f"v-{i}" for i in range(4)]
    assert sorted(r["key"] for r in consumed["records"]) == [f"k-{i}" for i in range(4)]
    assert steps[4]["expect"] == [
        {"condition": "count equals 4", "path": "count", "comparator": "equals", "expected": 4, "actual": 4,
         "missing": False, "ok": True},
        {"condition": "records length 4", "path": "records", "comparator": "length", "expected": 4, "actual": 4,
         "missing": False, "ok": True}]
    assert all(isinstance(s["duration_ms"], int) for s in steps)
    waited = steps[6]
    assert waited["error"] == 'wait_for partition_count equals 99: not true after 600ms (last value 3)'
    assert waited["wait"]["ok"] is False and waited["wait"]["polls"] >= 2 and waited["wait"]["last_value"] == 3
    assert 600 <= waited["wait"]["waited_ms"] < 20000  # bounded by the timeout plus one slow poll

    # YAML output is the same document; the dry run plans the steps that failed, and they would fail again
    as_yaml = kcli("-o", "yaml", "runbook", "run", str(path), "--dry-run")
    assert as_yaml.returncode == 1, as_yaml.stderr
    doc = yaml.safe_load(as_yaml.stdout)
    assert doc["dry_run"] is True and [s["outcome"] for s in doc["steps"]] == [
        "skipped", "failed", "failed", "skipped", "skipped", "skipped", "dry-run"]
    assert [doc["steps"][i]["plan"]["error"] for i in (1, 2)] == ["UNKNOWN_TOPIC_OR_PARTITION"] * 2


def test_dry_run_lock_and_connection_free_steps(tmp_path: Path,  # noqa: F811
        cli_env: dict[str, str], kcli: Kcli) -> None:
    path = write(tmp_path, """
        steps:
          - sleep: 50ms
          - name: nap
            sleep: {duration: 100ms}
        """)
    dry = kcli("runbook", "run", str(path), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert _lines(dry)[0].startswith("[1/2] dry-run ") and _lines(dry)[0].endswith("sleep 50ms")
    assert _lines(dry)[1] == '      would run sleep {"duration": 0.05}'
    assert not state_path(path).exists()  # a dry run records nothing

    with open(path) as held:  # another run in progress holds the runbook's lock
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        locked = run_kcli(cli_env, "runbook", "run", str(path))
    assert locked.returncode == 1
    assert locked.stderr == f"kcli: error: another `kcli runbook run` is running {path}; wait for it to finish\n"

    ran = kcli("runbook", "run", str(path))
    assert ran.returncode == 0 and _lines(ran)[1].split()[1] == "ok" and _lines(ran)[1].endswith("  nap (sleep)")
    assert (tmp_path / "book.kcli-runbook-state.json").exists()
    (tmp_path / "book.kcli-runbook-state.json").write_text("{not json")
    broken = kcli("runbook", "run", str(path))
    assert broken.returncode == 2 and "remove it or run with --restart" in broken.stderr
    assert kcli("runbook", "run", str(path), "--restart").returncode == 0
    missing = kcli("runbook", "validate", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and missing.stderr.startswith(f"{tmp_path / 'nope.yaml'}:1:1: no such file\n")


# ---- the worked examples in docs/runbooks/ -------------------------------------------------------


def example(tmp_path: Path, name: str) -> Path:
    """A copy, so the state file lands in the test's directory, not in docs/."""
    dest = tmp_path / name
    shutil.copy(EXAMPLES / name, dest)
    return dest


def test_examples_are_valid(kcli: Kcli) -> None:
    names = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
    assert names == ["disable-tiering.yaml", "diskless-topic.yaml", "shrink-partitions.yaml"]
    for name in names:
        proc = kcli("runbook", "validate", str(EXAMPLES / name))
        assert proc.returncode == 0 and proc.stdout.startswith(f"{EXAMPLES / name}: valid ("), proc.stderr


TIERED_BROKER = {"remote.log.storage.system.enable": "true", "remote.log.manager.task.interval.ms": "200",
                 "log.retention.check.interval.ms": "200"}


def _wait(check, what: str, timeout: float = 30.0):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_example_disable_tiering_with_delete(broker_factory,  # noqa: F811, ANN001
        tmp_path: Path, cli_env: dict[str, str], kcli: Kcli) -> None:
    b = broker_factory(TIERED_BROKER, name="tiered")
    conn = Connection(b.bootstrap)
    create_topic(b.bootstrap, "orders", 1, {"remote.storage.enable": "true", "segment.bytes": "4096",
                                            "local.retention.bytes": "8192"})
    produce(b.bootstrap, "orders", [b"order-%05d-" % i + b"x" * 100 for i in range(300)], **{"batch.size": 2000})
    _wait(lambda: (tiering.tiering_status(conn, "orders").remote_segments or 0) > 0, "remote segments")
    path = example(tmp_path, "disable-tiering.yaml")
    args = ["runbook", "run", str(path), "--var", f"bootstrap={b.bootstrap}"]

    dry = kcli(*args, "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    out = dry.stdout
    assert "[2/3] dry-run " in out
    assert ("cluster: remote.storage.enable=false,remote.log.disable.policy=delete: copying stops; " in out
            and "remote segment(s)" in out and "will be deleted" in out), out
    assert ("then wait until tiered_state equals \"DISABLED\" on topics.describe {'topic': 'orders'} "
            "(timeout 60s)") in out
    assert tiering.tiering_status(conn, "orders").remote_storage_enable is True  # the dry run changed nothing

    done = run_kcli(cli_env, "-o", "json", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert [s["outcome"] for s in report["steps"]] == ["ok", "ok", "ok"]
    disable = report["steps"][1]
    assert disable["result"]["set_configs"] == {"remote.storage.enable": "false", "remote.log.disable.policy": "delete"}
    assert disable["wait"]["ok"] is True and disable["wait"]["last_value"] == "DISABLED"
    status = tiering.tiering_status(conn, "orders")
    assert status.tiered_state == "DISABLED" and not status.remote_storage_enable
    assert status.remote_segments == 0  # policy delete removed the remote data


def test_example_shrink_partitions_with_drain_delay(broker_factory, tmp_path: Path, kcli: Kcli) -> None:  # noqa: ANN001
    b = broker_factory({"delete.topic.partition.enable": "true", "delete.topic.partition.interval.delay.ms": "200"},
                       name="shrink")
    conn = Connection(b.bootstrap)
    create_topic(b.bootstrap, "events", 6)
    for p in range(6):
        produce(b.bootstrap, "events", [b"before-%d-%d" % (p, i) for i in range(5)], partition=p)
    path = example(tmp_path, "shrink-partitions.yaml")
    args = ["runbook", "run", str(path), "--var", f"bootstrap={b.bootstrap}", "--var", "partitions=3"]

    dry = kcli(*args, "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "cluster: delete-partitions 6 -> 3" in dry.stdout
    assert "cluster: partitions [3, 4, 5] hold 15 records" in dry.stdout and "(delay 2000 ms)" in dry.stdout
    assert describe_topics(conn, ["events"])[0].partition_count == 6

    started = time.monotonic()
    done = kcli("-o", "json", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = json.loads(done.stdout)["steps"]
    assert [s["outcome"] for s in steps] == ["ok", "ok", "ok", "ok"]
    deletion = steps[1]["result"]["partition_deletion"]
    assert deletion["delay_ms"] == 2000 and [p["partition"] for p in deletion["partitions"]] == [3, 4, 5]
    assert steps[2]["result"]["records"] == 20 and set(steps[2]["result"]["partitions"]) <= {"0", "1", "2"}
    assert steps[3]["wait"]["ok"] is True
    assert time.monotonic() - started >= 2.0  # the partitions outlived the drain delay
    assert describe_topics(conn, ["events"])[0].partition_count == 3


DISKLESS_BROKER = {"diskless.append.commit.interval.ms": "50", "group.initial.rebalance.delay.ms": "0"}


def test_example_diskless_topic(broker_factory,  # noqa: F811, ANN001
        tmp_path: Path, cli_env: dict[str, str], kcli: Kcli) -> None:
    b = broker_factory(DISKLESS_BROKER, name="diskless")
    path = example(tmp_path, "diskless-topic.yaml")
    # the target may also come from a context in the contexts file instead of --var
    config = Path(cli_env["KCLI_CONFIG"])
    config.write_text(f"current-context: lab\ncontexts:\n  lab:\n    bootstrap-servers: \"{b.bootstrap}\"\n")
    path.write_text(path.read_text().replace("bootstrap_server: ${bootstrap}\n", "context: lab\n")
                    .replace("  bootstrap: localhost:9092\n", ""))
    done = kcli("runbook", "run", str(path), "--var", "records=40")
    assert done.returncode == 0, done.stdout + done.stderr
    out = _lines(done)
    assert [ln.split()[1] for ln in out[:6]] == ["ok"] * 6, out
    assert out[6].startswith(f"runbook {path}: 6 ok in ")
    again = kcli("-o", "json", "runbook", "run", str(path), "--var", "records=40")
    report = json.loads(again.stdout)
    assert report["target"] == "context=lab" and report["summary"]["skipped"] == 6
    assert [s["reason"].startswith("finished in an earlier run") for s in report["steps"]] == [True] * 6


# ---- dry run: a plan against the cluster as the earlier steps would leave it ----------------------


def _cluster_snapshot(conn: Connection) -> dict[str, tuple[int, dict[str, str | None]]]:
    from kcli.ops.topics import list_topics

    names = [t.topic for t in list_topics(conn, exclude_internal=True)]
    return {d.topic: (d.partition_count, dict(d.configs)) for d in describe_topics(conn, names)} if names else {}


def test_dry_run_plans_create_then_alter(shared_broker, tmp_path: Path, kcli: Kcli) -> None:  # noqa: ANN001
    """Issue #18: step 2 alters the topic step 1 creates; the plan must not ask the live cluster."""
    conn = Connection(shared_broker.bootstrap)
    path = write(tmp_path, f"""
        bootstrap_server: {shared_broker.bootstrap}
        steps:
          - topics.create: {{topic: plan-new, partitions: 2}}
          - topics.alter: {{topic: plan-new, configs: {{retention.ms: "60000"}}, partitions: 4}}
        """)
    before = _cluster_snapshot(conn)
    dry = kcli("runbook", "run", str(path), "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    table = dry.stdout[dry.stdout.index("Plan:\n"):].splitlines()
    assert table[1].split() == ["STEP", "ACTION", "RESOURCE", "CHANGE", "RESULT"]
    assert table[2].split()[:4] == ["1", "topics.create", "plan-new", "create"] and table[2].endswith(" ok")
    assert "classic, 2 partition(s), rf 1" in table[2]
    assert "retention.ms=60000; partitions 2 -> 4" in table[3] and table[3].endswith(" ok")
    assert _cluster_snapshot(conn) == before  # nothing was created
    assert "plan-new" not in before

    as_json = json.loads(kcli("-o", "json", "runbook", "run", str(path), "--dry-run").stdout)
    plans = [s["plan"] for s in as_json["steps"]]
    assert [(p["action"], p["resource"], p["result"]) for p in plans] == [
        ("create", "topic plan-new", "ok"), ("change", "topic plan-new", "ok")]
    assert as_json["outcome"] == "ok" and as_json["summary"]["dry-run"] == 2


SHRINK_BROKER = {"delete.topic.partition.enable": "true", "delete.topic.partition.interval.delay.ms": "200"}


def test_dry_run_whole_lifecycle_and_failures(broker_factory, tmp_path: Path, kcli: Kcli) -> None:  # noqa: ANN001
    b = broker_factory(SHRINK_BROKER, name="plan")
    conn = Connection(b.bootstrap)
    create_topic(b.bootstrap, "plan-live", 3)
    produce(b.bootstrap, "plan-live", [b"x"], partition=2)
    path = write(tmp_path, f"""
        bootstrap_server: {b.bootstrap}
        steps:
          - topics.create: {{topic: life, partitions: 6}}
          - topics.alter: {{topic: life, configs: {{cleanup.policy: compact}}, delete_configs: [retention.ms]}}
          - topics.alter: {{topic: life, partitions: 2}}
          - topics.alter: {{topic: life, partitions: 1, delete_partitions_delay: 5s}}
          - topics.alter: {{topic: life, partitions: 3}}
          - sleep: 6s
          - topics.alter: {{topic: life, partitions: 3}}
          - topics.delete: {{topic: life}}
          - topics.describe: {{topic: life}}
          - topics.create: {{topic: plan-live, partitions: 1}}
          - topics.alter: {{topic: plan-live, configs: {{retention.ms: soon}}}}
          - topics.alter: {{topic: plan-live, partitions: 1}}
          - topics.alter: {{topic: plan-live, enable_tiering: true}}
          - topics.create: {{topic: dl, diskless: true, configs: {{remote.storage.enable: "true"}}}}
          - topics.alter: {{topic: dl, configs: {{retention.ms: "1000"}}}}
          - diskless.gc: {{}}
        """)
    before = _cluster_snapshot(conn)
    proc = kcli("-o", "json", "runbook", "run", str(path), "--dry-run")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # some steps would fail
    report = json.loads(proc.stdout)
    plans = [s["plan"] for s in report["steps"]]
    rows = [(p["action"], p["result"], p["error"]) for p in plans]
    assert rows[:9] == [
        ("create", "ok", None), ("change", "ok", None), ("change", "ok", None), ("change", "ok", None),
        ("change", "would fail", "TOPIC_UNDER_CHANGES"),  # partitions 1 is still read-only for 5s
        ("wait", "ok", None),
        ("change", "ok", None),  # the delay passed on the plan clock
        ("delete", "ok", None),
        ("read", "would fail", "UNKNOWN_TOPIC_OR_PARTITION")]
    assert plans[1]["change"] == "cleanup.policy=compact,-retention.ms"
    assert plans[2]["change"] == "partitions 6 -> 2 (KIP-694, deleted now)"
    assert plans[3]["change"] == "partitions 2 -> 1 (KIP-694, read-only for 5s)"
    assert plans[6]["change"] == "partitions 1 -> 3"
    assert report["steps"][8]["error"].startswith("would fail: UNKNOWN_TOPIC_OR_PARTITION: topic 'life' does not")
    assert rows[9] == ("create", "would fail", "TOPIC_ALREADY_EXISTS")
    # planned against the live topic, as it stands, and marked as following a failed step
    assert rows[10] == ("change", "would fail", "INVALID_CONFIG") and plans[10]["depends_on"] == [10]
    assert "retention.ms" in plans[10]["reason"]
    assert plans[11]["result"] == "would fail" and "destroys the records in partition(s) [2]" in plans[11]["reason"]
    assert rows[12] == ("change", "would fail", "INVALID_CONFIG")  # this broker has no tiered storage
    assert "Tiered Storage functionality is disabled in the broker" in plans[12]["reason"]
    assert rows[13] == ("create", "would fail", "INVALID_CONFIG")
    assert plans[13]["reason"].startswith("Tiered Storage functionality is disabled in the broker")
    assert rows[14] == ("change", "would fail", "UNKNOWN_TOPIC_OR_PARTITION") and plans[14]["depends_on"] == [14]
    assert rows[15][:2] == ("none", "ok") and "cluster" in plans[15]
    assert report["summary"] == {"ok": 0, "failed": 8, "skipped": 0, "dry-run": 8}
    assert _cluster_snapshot(conn) == before  # a dry run changes nothing
    assert not state_path(path).exists()

    table = kcli("runbook", "run", str(path), "--dry-run")
    assert table.returncode == 1
    assert "would fail: TOPIC_UNDER_CHANGES: partitions 1..1 of 'life' are read-only" in table.stdout


def test_every_operation_can_be_planned() -> None:
    from kcli.runbook import operations

    assert [name for name, op in operations.REGISTRY.items() if op.simulate is None] == []


def test_dry_run_plans_tiering_and_diskless(broker_factory, tmp_path: Path, kcli: Kcli) -> None:  # noqa: ANN001
    """KIP-950 disable/enable on a topic that exists only in the plan, and on a diskless topic."""
    b = broker_factory(TIERED_BROKER, name="plan-tiered")
    conn = Connection(b.bootstrap)
    path = write(tmp_path, f"""
        bootstrap_server: {b.bootstrap}
        steps:
          - topics.create: {{topic: tiered, configs: {{remote.storage.enable: "true"}}}}
          - topics.alter: {{topic: tiered, disable_tiering: true, policy: delete}}
          - topics.alter: {{topic: tiered, enable_tiering: true}}
          - topics.alter: {{topic: tiered, configs: {{cleanup.policy: compact}}}}
          - topics.create: {{topic: dl, diskless: true, partitions: 2}}
          - topics.alter: {{topic: dl, enable_tiering: true}}
          - topics.alter: {{topic: dl, disable_tiering: true}}
          - diskless.describe: {{topic: tiered}}
          - diskless.verify: {{}}
        """)
    before = _cluster_snapshot(conn)
    proc = kcli("-o", "json", "runbook", "run", str(path), "--dry-run")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    plans = [s["plan"] for s in json.loads(proc.stdout)["steps"]]
    assert [(p["action"], p["result"], p["error"]) for p in plans] == [
        ("create", "ok", None),
        ("change", "ok", None),
        ("change", "ok", None),
        ("change", "would fail", "INVALID_CONFIG"),
        ("create", "ok", None),
        ("change", "ok", None),  # a diskless topic may tier (docs/diskless-tiering.md)
        ("change", "ok", None),
        ("read", "would fail", None),
        ("read", "ok", None)]
    assert plans[0]["change"] == "tiered, 1 partition(s), rf 1, remote.storage.enable=true"
    assert plans[1]["change"] == "disable tiering: remote.storage.enable=false,remote.log.disable.policy=delete"
    assert plans[2]["change"] == "enable tiering: remote.storage.enable=true,-remote.log.disable.policy"
    assert plans[3]["reason"] == "Remote log storage is unsupported for the compacted topics"
    assert plans[4]["change"] == "diskless, 2 partition(s), rf 1, diskless.enable=true"
    assert plans[5]["change"] == "enable tiering: remote.storage.enable=true"
    assert plans[6]["change"].startswith("disable tiering: remote.storage.enable=false")
    assert plans[7]["reason"] == "topic 'tiered' is not a diskless topic"
    assert plans[8]["simulated"] is False and plans[8]["notes"]
    assert _cluster_snapshot(conn) == before == {}
