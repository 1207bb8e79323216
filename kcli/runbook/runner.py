"""Execute a validated runbook step by step: run, check ``expect``, ``wait_for``, record progress.

Order inside a step: the operation runs; its JSON result must satisfy every ``expect``
(checked at once, so an assertion never waits); then ``wait_for`` polls its describe
operation until the condition holds or the timeout passes. Only a step that got through all
three is recorded as finished. ``on_error: stop`` (the default) ends the run at a failed step;
the remaining steps are reported as skipped. A dry run never changes the cluster or the state
file: it reads the cluster once and plans every step against a model of it as the earlier steps
would leave it (kcli/runbook/simulate.py), adding the operation's own dry run where the live
cluster can still answer for the step.
"""

from __future__ import annotations

import sys
import time
import traceback
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Protocol

from kcli.cli.common import GlobalOptions
from kcli.errors import KcliError
from kcli.ops.connection import Connection, connect
from kcli.runbook import operations
from kcli.runbook.model import MISSING, Condition, Runbook, Step, WaitFor, format_duration
from kcli.runbook.simulate import ClusterModel, WouldFail, read_cluster, topic_names
from kcli.runbook.state import RunState, load_state, state_path

OUTCOMES = ("ok", "failed", "skipped", "dry-run")
# a plan's ACTION for a step the model refuses (a planned step says its own)
PLAN_ACTIONS = {"topics.create": "create", "topics.delete": "delete", "topics.alter": "change", "produce": "write",
                "sleep": "wait", "diskless.gc": "none"}


def _json_value(value: Any) -> Any:
    return None if value is MISSING else value


@dataclass
class ConditionResult:
    condition: str
    path: str
    comparator: str
    expected: Any
    actual: Any
    ok: bool
    missing: bool = False  # the path led nowhere

    def to_dict(self) -> dict[str, Any]:
        return {"condition": self.condition, "path": self.path, "comparator": self.comparator,
                "expected": self.expected, "actual": self.actual, "missing": self.missing, "ok": self.ok}


@dataclass
class WaitResult:
    condition: str
    ok: bool
    polls: int
    waited_ms: int
    last_value: Any
    last_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"condition": self.condition, "ok": self.ok, "polls": self.polls, "waited_ms": self.waited_ms,
                "last_value": self.last_value, "last_error": self.last_error}


@dataclass
class StepReport:
    index: int
    name: str
    op: str
    args: dict[str, Any]
    outcome: str = "skipped"
    duration_ms: int | None = None
    reason: str | None = None  # why skipped
    error: str | None = None
    result: Any = None
    plan: dict[str, Any] | None = None
    expect: list[ConditionResult] = field(default_factory=list)
    wait: WaitResult | None = None
    on_error: str = "stop"

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "op": self.op, "args": self.args, "outcome": self.outcome,
                "duration_ms": self.duration_ms, "reason": self.reason, "error": self.error,
                "on_error": self.on_error, "result": self.result, "plan": self.plan,
                "expect": [c.to_dict() for c in self.expect], "wait": self.wait.to_dict() if self.wait else None}


@dataclass
class RunReport:
    runbook: str
    state_file: str
    target: str
    dry_run: bool
    restart: bool
    started_at: str
    steps: list[StepReport] = field(default_factory=list)
    duration_ms: int = 0

    @property
    def failed(self) -> bool:
        return any(s.outcome == "failed" for s in self.steps)

    def summary(self) -> dict[str, int]:
        return {o: sum(1 for s in self.steps if s.outcome == o) for o in OUTCOMES}

    def to_dict(self) -> dict[str, Any]:
        return {"runbook": self.runbook, "state_file": self.state_file, "target": self.target,
                "dry_run": self.dry_run, "restart": self.restart, "started_at": self.started_at,
                "duration_ms": self.duration_ms, "outcome": "failed" if self.failed else "ok",
                "summary": self.summary(), "steps": [s.to_dict() for s in self.steps]}


class Listener(Protocol):
    """Progress callbacks, so a terminal can show each step as it happens."""

    def started(self, step: Step, total: int) -> None: ...

    def finished(self, report: StepReport, total: int) -> None: ...


def connection_options(runbook: Runbook, cli: GlobalOptions) -> tuple[GlobalOptions, str]:
    """Options to connect with and a target label. -b/--context on the command line replace the
    runbook's context/bootstrap_server (the operator's explicit choice wins)."""
    if cli.bootstrap_server or cli.context:
        opts = GlobalOptions(bootstrap_server=cli.bootstrap_server, context=cli.context, verbose=cli.verbose)
    else:
        opts = GlobalOptions(bootstrap_server=runbook.bootstrap_server, context=runbook.context, verbose=cli.verbose)
    if opts.bootstrap_server:
        label = f"bootstrap_server={opts.bootstrap_server}"
        if opts.context:
            label += f" context={opts.context}"
    elif opts.context:
        label = f"context={opts.context}"
    else:
        label = "default"
    return opts, label


class Runner:
    def __init__(self, runbook: Runbook, cli: GlobalOptions, *, dry_run: bool = False, restart: bool = False,
                 listener: Listener | None = None) -> None:
        self.runbook = runbook
        self.opts, self.target = connection_options(runbook, cli)
        self.verbose = cli.verbose
        self.dry_run = dry_run
        self.restart = restart
        self.listener = listener
        self._stack = ExitStack()
        self._conn: Connection | None = None
        self._model: ClusterModel | None = None  # a dry run's model of the cluster
        self._pending: list[Step] = []  # the steps a dry run plans
        self._live: set[str] = set()  # topics that exist on the cluster and no planned step touched yet
        self._failed_on: dict[str, int] = {}  # topic -> the last planned step that would fail on it

    def connection(self) -> Connection:
        """Connect on first use, so skipped or connection-free steps never touch a cluster."""
        if self._conn is None:
            self._conn = self._stack.enter_context(connect(self.opts))
        return self._conn

    def run(self) -> RunReport:
        path = state_path(self.runbook.path)
        if self.restart:
            state = RunState(path)
            if not self.dry_run:
                state.delete()
        else:
            state = load_state(path)
        report = RunReport(self.runbook.file, str(path), self.target, self.dry_run, self.restart,
                           time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        t0 = time.monotonic()
        total = len(self.runbook.steps)
        stopped_at: int | None = None
        with self._stack:
            if self.dry_run:
                self._pending = [s for s in self.runbook.steps
                                 if self.restart or state.finished(s.index, s.digest(self.target,
                                                                                     self.runbook.variables)) is None]
            for step in self.runbook.steps:
                digest = step.digest(self.target, self.runbook.variables)
                rep = StepReport(step.index, step.name, step.op, step.args, on_error=step.on_error)
                done = state.finished(step.index, digest) if not self.restart else None
                if stopped_at is not None:
                    rep.reason = f"not run: step {stopped_at} failed"
                elif done is not None:
                    rep.reason = f"finished in an earlier run ({done.finished_at})"
                else:
                    if self.listener:
                        self.listener.started(step, total)
                    if self.dry_run:
                        self._plan(step, rep)
                    else:
                        self._execute(step, rep)
                        if rep.outcome == "ok":
                            state.mark(step.index, step.name, step.op, digest, rep.duration_ms or 0)
                        else:
                            state.forget(step.index)
                    if rep.outcome == "failed" and step.on_error == "stop" and not self.dry_run:
                        stopped_at = step.index
                report.steps.append(rep)
                if self.listener:
                    self.listener.finished(rep, total)
        report.duration_ms = int((time.monotonic() - t0) * 1000)
        return report

    # --- one step --------------------------------------------------------------------------

    def _fail(self, rep: StepReport, err: BaseException) -> None:
        rep.outcome = "failed"
        if isinstance(err, KcliError):
            rep.error = str(err)
        else:  # a bug, or a client error nobody translated: one line, traceback with -v
            rep.error = f"unexpected {type(err).__name__}: {err}"
            if self.verbose:
                traceback.print_exception(err, file=sys.stderr)

    def _execute(self, step: Step, rep: StepReport) -> None:
        op = operations.get(step.op)
        assert op is not None
        t0 = time.monotonic()
        try:
            conn = self.connection() if op.needs_connection else None
            rep.result = operations.result_data(op.run(conn, step.args))
            message = op.failed(rep.result) if op.failed else None
            rep.expect = [self._check(c, rep.result) for c in step.expect]
            bad = [c for c in rep.expect if not c.ok]
            if message:
                rep.outcome, rep.error = "failed", message
            elif bad:
                rep.outcome = "failed"
                rep.error = "expect failed: " + "; ".join(
                    f"{c.condition} (got {'nothing at that path' if c.missing else _show(c.actual)})" for c in bad)
            elif step.wait_for is not None:
                rep.wait = self._wait(step.wait_for)
                if not rep.wait.ok:
                    rep.outcome = "failed"
                    got = rep.wait.last_error or f"last value {_show(rep.wait.last_value)}"
                    rep.error = (f"wait_for {rep.wait.condition}: not true after "
                                 f"{format_duration(step.wait_for.timeout_s)} ({got})")
                else:
                    rep.outcome = "ok"
            else:
                rep.outcome = "ok"
        except Exception as err:  # noqa: BLE001 - a failed step is reported, the run goes on or stops
            self._fail(rep, err)
        rep.duration_ms = int((time.monotonic() - t0) * 1000)

    @staticmethod
    def _check(cond: Condition, data: Any) -> ConditionResult:
        ok, actual = cond.evaluate(data)
        return ConditionResult(cond.describe(), cond.path, cond.op, cond.expected, _json_value(actual), ok,
                               missing=actual is MISSING)

    def _wait(self, wait: WaitFor) -> WaitResult:
        op = operations.get(wait.operation)
        assert op is not None
        t0 = time.monotonic()
        deadline = t0 + wait.timeout_s
        polls = 0
        last_value: Any = None
        last_error: str | None = None
        while True:
            polls += 1
            try:
                data = operations.result_data(op.run(self.connection() if op.needs_connection else None, wait.args))
                ok, actual = wait.condition.evaluate(data)
                last_value, last_error = _json_value(actual), None
            except KcliError as err:  # e.g. the topic is not there yet: keep polling
                ok, last_error = False, str(err)
            if ok:
                return WaitResult(wait.condition.describe(), True, polls, int((time.monotonic() - t0) * 1000),
                                  last_value)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return WaitResult(wait.condition.describe(), False, polls, int((time.monotonic() - t0) * 1000),
                                  last_value, last_error)
            time.sleep(min(wait.interval_s, remaining))

    def _cluster(self) -> ClusterModel:
        """Read the live state once, for the topics the steps to plan name (wait_for's too)."""
        if self._model is None:
            if any(operations.get(s.op).needs_connection for s in self._pending):  # type: ignore[union-attr]
                names = {n for s in self._pending for n in topic_names(s.args)}
                names |= {n for s in self._pending if s.wait_for for n in topic_names(s.wait_for.args)}
                self._model = read_cluster(self.connection(), names)
            else:
                self._model = ClusterModel({}, {})
            self._live = set(self._model.topics)
        return self._model

    def _plan(self, step: Step, rep: StepReport) -> None:
        op = operations.get(step.op)
        assert op is not None and op.simulate is not None
        t0 = time.monotonic()
        names = topic_names(step.args)
        plan: dict[str, Any] = {"op": step.op, "args": step.args, "action": PLAN_ACTIONS.get(step.op, "read"),
                                "resource": ", ".join(f"topic {n}" for n in names) or "cluster", "change": None,
                                "result": "ok", "error": None, "reason": None,
                                "depends_on": sorted({self._failed_on[n] for n in names if n in self._failed_on}),
                                "notes": [], "simulated": True}
        try:
            model = self._cluster()
            # the operation's own dry run only while the live topic is still what this step meets
            if op.dry_run is not None and all(n in self._live for n in names):
                try:
                    plan["cluster"] = operations.result_data(op.dry_run(self.connection(), step.args))
                except KcliError as err:
                    raise WouldFail(getattr(err, "name", None), getattr(err, "message", None) or str(err)) from None
            planned = op.simulate(model, step.args)
            plan.update(planned.to_dict())
            if planned.action != "none" and planned.action != "read":
                self._live -= set(names)
            if step.expect:
                plan["expect"] = [c.describe() for c in step.expect]
            if step.wait_for is not None:
                w = step.wait_for
                plan["wait_for"] = (f"{w.condition.describe()} on {w.operation} "
                                    f"{operations.result_data(w.args)} (timeout {format_duration(w.timeout_s)})")
            rep.outcome = "dry-run"
        except WouldFail as err:
            plan.update(result="would fail", error=err.error, reason=err.reason)
            rep.outcome = "failed"
            rep.error = f"would fail: {err}"
            if plan["depends_on"]:
                rep.error += f" (after step {', '.join(str(i) for i in plan['depends_on'])} would fail)"
            self._failed_on.update({n: step.index for n in names})
        except Exception as err:  # noqa: BLE001
            self._fail(rep, err)
            plan.update(result="would fail", reason=rep.error)
        rep.plan = plan
        rep.duration_ms = int((time.monotonic() - t0) * 1000)


def _show(value: Any) -> str:
    import json

    text = json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."
