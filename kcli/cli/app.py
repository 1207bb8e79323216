"""The root Typer app: global options, sub-command registration, and the error boundary."""

from __future__ import annotations

import importlib
import sys

import typer

from kcli.cli.common import (GlobalOptions, OutputFormat, fail, interrupt_exit_code, interrupted,
                             raise_keyboard_interrupt, stdout_closed)
from kcli.cli.helpfmt import install as install_help_format
from kcli.errors import KcliError, UsageError

install_help_format()  # flags without `<bool>`, ranges as `N ≥ 1` (kcli/cli/helpfmt.py)


def _rich_broken_pipe(console: object) -> None:
    stdout_closed()  # Rich's own answer (help, runbook output) would be exit 1


def _install_broken_pipe() -> None:
    from rich.console import Console

    Console.on_broken_pipe = _rich_broken_pipe  # type: ignore[method-assign, assignment]


_install_broken_pipe()

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
    "kcli.cli.replicas_cmd",
    "kcli.cli.clients",
    "kcli.cli.groups_cmd",
    "kcli.cli.share_groups_cmd",
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


def _global_short_cluster(arg: str) -> tuple[bool, bool] | None:
    """(takes the next word as its value, names -b) when ``arg`` is a cluster of global short
    options (``-v``, ``-vo``, ``-ojson``, ``-vb HOST:PORT``), else None."""
    if not arg.startswith("-") or arg.startswith("--") or len(arg) < 2:
        return None
    for i, letter in enumerate(arg[1:], 1):
        if letter == "v":
            continue
        if letter in "ob":
            return i == len(arg) - 1, letter == "b"
        return None
    return False, False


def _takes_value(arg: str) -> bool:
    cluster = _global_short_cluster(arg)
    return arg in _GLOBAL_VALUED or (cluster is not None and cluster[0])


def _need_value(args: list[str], i: int) -> None:
    """A global option after the command with no value: moved first, it would take the
    command's name as its value (`kcli topics list -o` → "'topics' is not one of ...")."""
    if i + 1 >= len(args) or args[i + 1] == "--":
        raise UsageError(f"Option '{args[i]}' requires an argument.")


def hoist_global_options(argv: list[str]) -> list[str]:
    """Let global options follow the command (`kcli topics list -o json`), as kafkactl and rpk
    allow, by moving them before it. `kcli context set NAME -b ...` keeps its own -b. Combined
    short options (`-vo json`) count as global when every letter is one; a global option left
    without its value (`kcli topics list -o`) still moves, so click names the missing value."""
    if not argv:
        return argv
    first = next((i for i, a in enumerate(argv) if not a.startswith("-") and (i == 0 or not _takes_value(argv[i - 1]))), None)
    if first is None:
        return argv
    head, tail = argv[:first], argv[first:]
    keep_b = tail[0] == "context"
    moved: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(tail):
        a = tail[i]
        cluster = _global_short_cluster(a) if a not in _GLOBAL_FLAGS | _GLOBAL_VALUED else None
        if a == "--":
            rest += tail[i:]
            break
        if i > 0 and tail[i - 1] in _VALUE_TAKING:
            rest.append(a)
        elif a in _GLOBAL_FLAGS:
            moved.append(a)
        elif a in _GLOBAL_VALUED and not (keep_b and a in ("-b", "--bootstrap-server")):
            _need_value(tail, i)
            moved += tail[i:i + 2]
            i += 1
        elif cluster is not None and not (keep_b and cluster[1]):
            if cluster[0]:
                _need_value(tail, i)
            moved += tail[i:i + 2] if cluster[0] else [a]
            i += 1 if cluster[0] else 0
        elif any(a.startswith(g + "=") for g in ("--output", "--context", "--bootstrap-server")) and not (keep_b and a.startswith("--bootstrap-server")):
            moved.append(a)
        else:
            rest.append(a)
        i += 1
    return head + moved + rest


def main() -> None:
    """Console entry point: run the app, turning kcli errors into one line and an exit code.

    Output cut short by its reader (``kcli --help | head -1``, ``kcli dump-log DIR | head``)
    ends quietly with exit 141, what a shell reports for cat or grep killed by SIGPIPE
    (:func:`kcli.cli.common.stdout_closed`)."""
    try:
        _run()
    except BrokenPipeError:
        stdout_closed()
    except SystemExit:
        if _stdout_pacified():  # typer's own answer to EPIPE: exit 1, silently
            stdout_closed()
        _flush_stdout()
        raise
    _flush_stdout()


def _stdout_pacified() -> bool:
    """Typer (like click) answers a write to a closed pipe with exit 1 after wrapping stdout
    in its PacifyFlushWrapper: that wrapper says the pipe was closed."""
    return type(sys.stdout).__name__ == "PacifyFlushWrapper"


def _flush_stdout() -> None:
    """Flush what is buffered now, while a closed pipe can still be answered with 141 (at
    interpreter exit it would be "Exception ignored ... BrokenPipeError" and exit 120)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_closed()
    except (OSError, ValueError):
        pass


def _run() -> None:
    import typer.completion

    typer.completion.completion_init()  # `_KCLI_COMPLETE=source_bash kcli` prints the script
    try:
        sys.argv[1:] = hoist_global_options(sys.argv[1:])
    except UsageError as err:
        fail(err)
    verbose = any(a == "--verbose" or (_global_short_cluster(a) is not None and "v" in a[1:].split("o")[0].split("b")[0])
                  for a in sys.argv[1:])
    import signal

    from kcli.cli.early_interrupt import is_early_handler

    current = signal.getsignal(signal.SIGINT)
    if current is signal.default_int_handler or is_early_handler(current):  # not when started with SIGINT ignored
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
