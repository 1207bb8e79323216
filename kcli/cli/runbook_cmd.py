"""`kcli runbook run|validate`: scripted, resumable sequences of kcli operations (docs/runbooks/)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List

import typer

from kcli.cli.common import OutputFormat, options, parse_key_values
from kcli.cli.render import render
from kcli.errors import UsageError
from kcli.runbook import loader, report, state
from kcli.runbook.model import Runbook
from kcli.runbook.runner import Runner
from kcli.runbook.validate import validate as validate_document

runbook_app = typer.Typer(help="Run scripted runbooks: ordered kcli operations in a YAML file (resumable).",
                          no_args_is_help=True)

_VAR_HELP = "Set a runbook variable NAME=VALUE (repeatable; wins over the file's variables:)."


def _load(file: Path, var: list[str], output: OutputFormat) -> Runbook:
    """Load and validate; on problems print each as FILE:LINE:COL and exit 2."""
    cli_vars = parse_key_values(var, "--var")
    try:
        runbook, problems = validate_document(loader.load(file, str(file)), cli_vars)
    except loader.LoadError as err:
        runbook, problems = None, err.problems
    if problems or runbook is None:
        report.print_problems(problems)
        if output != OutputFormat.table:
            render({"file": str(file), "valid": False, "problems": [p.to_dict() for p in problems]}, output)
        raise UsageError(f"runbook {file} is invalid: {len(problems)} problem(s)")
    return runbook


@runbook_app.command("validate")
def validate(
    ctx: typer.Context,
    file: Path = typer.Argument(..., help="The runbook (YAML)."),
    var: List[str] = typer.Option([], "--var", help=_VAR_HELP),
) -> None:
    """Check a runbook without running it: every problem is printed as FILE:LINE:COL: message.

    Exit 0 when valid, 2 when not.

    Example: kcli runbook validate docs/runbooks/disable-tiering.yaml
    """
    opts = options(ctx)
    runbook = _load(file, var, opts.output)

    def table() -> None:
        typer.echo(f"{file}: valid ({len(runbook.steps)} step{'s' if len(runbook.steps) != 1 else ''})")

    render({"file": str(file), "valid": True, "steps": [s.to_dict() for s in runbook.steps], "problems": []},
           opts.output, table)


@runbook_app.command("run")
def run(
    ctx: typer.Context,
    file: Path = typer.Argument(..., help="The runbook (YAML)."),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="Plan every step against the cluster as the earlier steps would leave it and print the plan (STEP, ACTION, RESOURCE, CHANGE, RESULT); change nothing. Exit 1 if a step would fail."),
    var: List[str] = typer.Option([], "--var", help=_VAR_HELP),
    restart: bool = typer.Option(False, "--restart", help="Forget recorded progress and run every step again."),
) -> None:
    """Run a runbook's steps in order, resuming after the last finished step.

    Progress is kept next to the file (NAME.kcli-runbook-state.json); finished steps are skipped on the next run unless the step changed or --restart is given. Exit 1 if a step failed (with --dry-run: would fail), 2 if the runbook is invalid.

    Example: kcli runbook run docs/runbooks/shrink-partitions.yaml --var topic=orders --var partitions=3 --dry-run
    """
    opts = options(ctx)
    runbook = _load(file, var, opts.output)
    listener = report.listener_for_terminal() if opts.output == OutputFormat.table else None
    with state.exclusive(file):
        try:
            result = Runner(runbook, opts, dry_run=dry_run, restart=restart, listener=listener).run()
        except KeyboardInterrupt:
            if listener is not None:
                listener.close()
            sys.stderr.write(f"kcli: runbook {file} interrupted; finished steps are recorded in "
                             f"{state.state_path(file)}: run it again to resume\n")
            raise SystemExit(130) from None
    if opts.output == OutputFormat.table:
        if dry_run:
            report.print_plan(result)
        report.print_summary(result)
    else:
        render(result.to_dict(), opts.output)
    # SystemExit, not typer.Exit: app.main runs click with standalone_mode=False.
    raise SystemExit(1 if result.failed else 0)


def register(app: typer.Typer) -> None:
    app.add_typer(runbook_app, name="runbook")
