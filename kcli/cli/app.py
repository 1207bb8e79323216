"""The root Typer app: global options, sub-command registration, and the error boundary."""

from __future__ import annotations

import importlib
import sys

import typer

from kcli.cli.common import GlobalOptions, OutputFormat, fail, interrupt_exit_code, interrupted, raise_keyboard_interrupt
from kcli.errors import KcliError, UsageError

app = typer.Typer(
    name="kcli",
    help="Operator toolkit for Kafka tiered storage, partition reduction and diskless topics.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Each module exposes register(app). Keep this list in the order of `kcli --help`.
COMMAND_MODULES = [
    "kcli.cli.context_cmd",
    "kcli.cli.topics",
    "kcli.cli.clients",
    "kcli.cli.groups_cmd",
    "kcli.cli.broker_cmd",
    "kcli.cli.cluster_cmd",
    "kcli.cli.scram_users_cmd",
    "kcli.cli.acls_cmd",
    "kcli.cli.transactions_cmd",
    "kcli.cli.dumplog",
    "kcli.cli.diskless_cmd",
    "kcli.cli.runbook_cmd",
    "kcli.cli.completion_cmd",
]


@app.callback()
def root(
    ctx: typer.Context,
    bootstrap_server: str = typer.Option(None, "--bootstrap-server", "-b", help="HOST:PORT of a broker; overrides the context."),
    context: str = typer.Option(None, "--context", help="Named context from the contexts file."),
    output: OutputFormat = typer.Option(OutputFormat.table, "--output", "-o", help="Output format."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Explain what runs; show tracebacks."),
    version: bool = typer.Option(False, "--version", callback=lambda v: print_version(v), is_eager=True,
                                 help="Print kcli's version and exit."),
) -> None:
    ctx.obj = GlobalOptions(bootstrap_server=bootstrap_server, context=context, output=output, verbose=verbose)


def print_version(value: bool) -> None:
    """`kcli --version`: the installed distribution's version (eager: runs before any command)."""
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("kcli-kafka")
    except PackageNotFoundError:  # running from a source tree that was never installed
        v = "unknown"
    sys.stdout.write(f"kcli {v}\n")
    raise typer.Exit(0)


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


_GLOBAL_FLAGS = {"-v", "--verbose"}
_GLOBAL_VALUED = {"-o", "--output", "--context", "-b", "--bootstrap-server"}
# Options of sub-commands whose value may itself look like a global option.
_VALUE_TAKING = {"--key-separator", "--config", "--property", "--var", "--files", "--format", "-f", "--header", "-H"}


def hoist_global_options(argv: list[str]) -> list[str]:
    """Let global options follow the command (`kcli topics list -o json`), as kafkactl and rpk
    allow, by moving them before it. `kcli context set NAME -b ...` keeps its own -b."""
    if not argv:
        return argv
    first = next((i for i, a in enumerate(argv) if not a.startswith("-") and (i == 0 or argv[i - 1] not in _GLOBAL_VALUED)), None)
    if first is None:
        return argv
    head, tail = argv[:first], argv[first:]
    keep_b = tail[0] == "context"
    moved: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(tail):
        a = tail[i]
        if a == "--":
            rest += tail[i:]
            break
        if i > 0 and tail[i - 1] in _VALUE_TAKING:
            rest.append(a)
        elif a in _GLOBAL_FLAGS:
            moved.append(a)
        elif a in _GLOBAL_VALUED and i + 1 < len(tail) and not (keep_b and a in ("-b", "--bootstrap-server")):
            moved += [a, tail[i + 1]]
            i += 1
        elif any(a.startswith(g + "=") for g in ("--output", "--context", "--bootstrap-server")) and not (keep_b and a.startswith("--bootstrap-server")):
            moved.append(a)
        else:
            rest.append(a)
        i += 1
    return head + moved + rest


def main() -> None:
    """Console entry point: run the app, turning kcli errors into one line and an exit code."""
    import typer.completion

    typer.completion.completion_init()  # `_KCLI_COMPLETE=source_bash kcli` prints the script
    sys.argv[1:] = hoist_global_options(sys.argv[1:])
    verbose = "-v" in sys.argv or "--verbose" in sys.argv
    import signal

    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when started with SIGINT ignored
        signal.signal(signal.SIGINT, raise_keyboard_interrupt)  # Python's behaviour, remembered
    try:
        rc = app(prog_name="kcli", standalone_mode=False)
    except KcliError as err:
        fail(err, verbose)
    except KeyboardInterrupt:  # Ctrl-C in a command that does not handle it itself
        sys.stderr.write("kcli: interrupted\n")
        raise SystemExit(interrupt_exit_code())
    except typer.Abort:  # click turns a KeyboardInterrupt into Abort
        if interrupted() is not None:
            sys.stderr.write("kcli: interrupted\n")
            raise SystemExit(interrupt_exit_code())
        sys.stderr.write("kcli: aborted\n")
        raise SystemExit(1)
    except Exception as err:  # click usage errors and anything unexpected
        # typer >= 0.16 vendors its own click (typer._click), so `import click` would not match
        # its exceptions: recognise them by shape instead.
        if type(err).__name__ == "NoArgsIsHelpError":  # `kcli topics`: show that group's help
            sys.stdout.write(err.format_message() + "\n")
            raise SystemExit(2)
        if hasattr(err, "format_message") and getattr(err, "exit_code", None) == 2:  # UsageError
            # One line: click spreads some messages over several ("Choose from:\n\tbash,\n\tzsh").
            message = " ".join(part.strip() for part in (err.format_message() or str(err)).splitlines() if part.strip())
            fail(UsageError(message), verbose)
        if isinstance(err, typer.Exit) or type(err).__name__ == "Exit":
            raise SystemExit(err.exit_code)
        if hasattr(err, "format_message") and hasattr(err, "exit_code"):  # other ClickException
            fail(UsageError(err.format_message()), verbose)
        if interrupted() is not None and not verbose:
            # e.g. Ctrl-C landing inside a librdkafka callback comes out as a SystemError
            sys.stderr.write("kcli: interrupted\n")
            raise SystemExit(interrupt_exit_code())
        if verbose:
            raise
        sys.stderr.write(f"kcli: error: unexpected {type(err).__name__}: {err}\n")
        raise SystemExit(1)
    # With standalone_mode=False click returns typer.Exit's code instead of exiting.
    if isinstance(rc, int) and rc:
        if rc == 130 and interrupted() is not None:  # typer's answer to a KeyboardInterrupt
            sys.stderr.write("kcli: interrupted\n")
        raise SystemExit(rc)
