"""How a run looks: one line per step as it finishes (rich on a terminal, plain otherwise),
a summary line, or the whole :class:`RunReport` as JSON/YAML for machines.

Plain lines are fixed-order and greppable::

    [1/3] ok         0.41s  topics.create orders
    [2/3] failed     0.02s  topics.alter orders: INVALID_PARTITIONS: ...
    [3/3] skipped        -  sleep 1s: not run: step 2 failed
"""

from __future__ import annotations

import json
import sys
from typing import IO, Any

from kcli.runbook.loader import Problem
from kcli.runbook.model import Step
from kcli.runbook.runner import RunReport, StepReport

_STYLE = {"ok": "green", "failed": "bold red", "skipped": "yellow", "dry-run": "cyan"}


def _duration(ms: int | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.2f}s"


def step_line(rep: StepReport, total: int) -> str:
    width = len(str(total))
    text = f"[{rep.index:>{width}}/{total}] {rep.outcome:<8} {_duration(rep.duration_ms):>8}  {rep.name}"
    if rep.name != rep.op and not rep.name.startswith(rep.op + " "):
        text += f" ({rep.op})"
    detail = rep.error or rep.reason
    return text + (f": {detail}" if detail else "")


def plan_lines(rep: StepReport) -> list[str]:
    """What a dry run would do, indented under its step line."""
    if rep.plan is None:
        return []
    plan = rep.plan
    lines = [f"would run {plan['op']} {json.dumps(plan['args'], default=str)}"]
    if plan.get("change"):
        lines.append(f"plan: {plan['action']} {plan['resource']}: {plan['change']}")
    lines += [f"note: {n}" for n in plan.get("notes") or []]
    cluster = plan.get("cluster")
    if isinstance(cluster, dict) and cluster.get("effect"):  # tiering change
        changes = ",".join([f"{k}={v}" for k, v in (cluster.get("set_configs") or {}).items()]
                           + [f"-{k}" for k in cluster.get("delete_configs") or []])
        lines.append(f"cluster: {changes or 'no change'}: {cluster['effect']}")
    elif isinstance(cluster, dict) and isinstance(cluster.get("steps"), list):  # alter_topic plan
        lines += [f"cluster: {s.get('action')} {s.get('detail')}" for s in cluster["steps"] if isinstance(s, dict)] \
            or ["cluster: no change"]
        shrink = cluster.get("partition_deletion")
        if isinstance(shrink, dict):
            gone = [p.get("partition") for p in shrink.get("partitions") or []]
            lines.append(f"cluster: partitions {gone} hold {shrink.get('records')} records "
                         f"({shrink.get('size_bytes')} bytes); deleted at {shrink.get('delete_at')} "
                         f"(delay {shrink.get('delay_ms')} ms); keyed records: {shrink.get('keyed')}")
            lines += [f"warning: {w}" for w in shrink.get("warnings") or []]
    elif cluster is not None:
        text = json.dumps(cluster, default=str)
        lines.append(f"cluster: {text if len(text) <= 300 else text[:297] + '...'}")
    for cond in plan.get("expect") or []:
        lines.append(f"expect {cond}")
    if plan.get("wait_for"):
        lines.append(f"then wait until {plan['wait_for']}")
    return lines


def plan_rows(report: RunReport) -> list[dict[str, Any]]:
    """The dry run as STEP, ACTION, RESOURCE, CHANGE, RESULT rows."""
    rows = []
    for rep in report.steps:
        plan = rep.plan or {}
        if rep.outcome == "skipped":
            result = f"skipped: {rep.reason}"
        elif plan.get("result") == "would fail" or rep.outcome == "failed":
            result = rep.error or "would fail"
        else:
            result = "ok"
        rows.append({"step": f"{rep.index} {rep.name}", "action": plan.get("action", "-"),
                     "resource": plan.get("resource", "-"), "change": plan.get("change") or "-", "result": result})
    return rows


def print_plan(report: RunReport) -> None:
    from kcli.cli.render import print_table

    sys.stdout.write("\nPlan:\n")
    print_table(plan_rows(report), [("STEP", "step"), ("ACTION", "action"), ("RESOURCE", "resource"),
                                    ("CHANGE", "change"), ("RESULT", "result")])


def summary_line(report: RunReport) -> str:
    counts = report.summary()
    parts = [f"{n} {o}" for o, n in counts.items() if n]
    mode = " (dry run)" if report.dry_run else ""
    return f"runbook {report.runbook}{mode}: {', '.join(parts)} in {report.duration_ms / 1000:.2f}s"


class PlainListener:
    """Pipes and logs: a plain line per finished step."""

    def __init__(self, out: IO[str] | None = None) -> None:
        self.out = out or sys.stdout

    def started(self, step: Step, total: int) -> None:
        pass

    def close(self) -> None:
        self.out.flush()

    def finished(self, rep: StepReport, total: int) -> None:
        self.out.write(step_line(rep, total) + "\n")
        for line in plan_lines(rep):
            self.out.write(f"      {line}\n")
        self.out.flush()


class RichListener:
    """A terminal: a spinner while a step runs, then its coloured line."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(highlight=False)
        self._status: Any = None

    def started(self, step: Step, total: int) -> None:
        from rich.text import Text

        self._status = self.console.status(Text(f"[{step.index}/{total}] {step.name} ..."))  # Text: no markup
        self._status.start()

    def close(self) -> None:
        """Stop the spinner (also on Ctrl-C, so the terminal gets its cursor back)."""
        if self._status is not None:
            self._status.stop()
            self._status = None

    def finished(self, rep: StepReport, total: int) -> None:
        from rich.text import Text

        self.close()
        line = Text(step_line(rep, total))
        start = line.plain.index("] ") + 2
        line.stylize(_STYLE.get(rep.outcome, ""), start, start + len(rep.outcome))
        self.console.print(line, soft_wrap=True)  # one line per step; the terminal wraps it
        for extra in plan_lines(rep):
            self.console.print(Text(f"      {extra}", style="dim"), soft_wrap=True)


def listener_for_terminal() -> PlainListener | RichListener:
    return RichListener() if sys.stdout.isatty() else PlainListener()


def print_summary(report: RunReport) -> None:
    sys.stdout.write(summary_line(report) + "\n")


def print_problems(problems: list[Problem]) -> None:
    """``FILE:LINE:COL: message`` on stderr, one per problem, in file order."""
    for p in problems:
        sys.stderr.write(f"{p}\n")
