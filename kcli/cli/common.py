"""What every command shares: global options, output rendering, the error boundary."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Iterator, NoReturn

import typer

from kcli.errors import KcliError


class OutputFormat(str, Enum):
    table = "table"
    json = "json"
    yaml = "yaml"


@dataclass
class GlobalOptions:
    """Set by the root callback; commands read it from ``ctx.obj``."""

    bootstrap_server: str | None = None
    context: str | None = None
    output: OutputFormat = OutputFormat.table
    verbose: bool = False


def options(ctx: typer.Context) -> GlobalOptions:
    obj = ctx.find_root().obj
    return obj if isinstance(obj, GlobalOptions) else GlobalOptions()


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def emit_yaml(data: Any) -> None:
    import yaml

    sys.stdout.write(yaml.safe_dump(json.loads(json.dumps(data, default=str)), sort_keys=False))


def fail(err: KcliError, verbose: bool = False) -> None:
    """Print one line for ``err`` on stderr and exit with its code."""
    if verbose:
        import traceback

        traceback.print_exception(err)
    sys.stderr.write(f"kcli: error: {err}\n")
    raise SystemExit(err.exit_code)


# What a shell reports for a command that wrote to a pipe whose reader had left (`| head`): cat
# and grep die of SIGPIPE there, which the shell shows as 128 + 13. Python ignores SIGPIPE, so
# kcli sees EPIPE (BrokenPipeError) instead and exits with the same status, quietly.
STDOUT_CLOSED_EXIT = 128 + signal.SIGPIPE


def stdout_closed() -> NoReturn:
    """The reader of stdout went away: exit quietly with 141, as cat and grep do.

    Python's documented recipe (library/signal.html, "Note on SIGPIPE"): point stdout at
    /dev/null first, so the interpreter's final flush of what is still buffered cannot fail
    again with "Exception ignored ... BrokenPipeError"."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout already closed or not a file
        pass
    raise SystemExit(STDOUT_CLOSED_EXIT)


def parse_key_values(items: list[str] | None, option: str) -> dict[str, str]:
    """``["k=v", ...]`` from a repeatable option; the value may itself contain '='."""
    from kcli.errors import UsageError

    result: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"{option} expects KEY=VALUE, got {item!r}")
        result[key] = value.strip()
    return result


def coordinator_uri(value: str | None, option: str = "--coordinator") -> str | None:
    """``--coordinator`` in every command takes the same forms: a plain path to a SQLite
    database (relative to the cwd), ``sqlite:///abs/path.db`` (``sqlite://rel/path.db``), or
    ``postgresql://user@host:port/db``. Returns ``sqlite:///abs`` or the PostgreSQL URI as given."""
    import os
    from urllib.parse import unquote, urlsplit

    from kcli.errors import UsageError

    if value is None:
        return None
    text = value.strip()
    expected = f"{option} expects a SQLite database path, sqlite:///path.db or postgresql://user@host:port/database"
    if "://" not in text:
        path = text
    else:
        scheme, rest = text.split("://", 1)
        if scheme.lower() in ("postgresql", "postgres"):
            if not urlsplit(text).netloc:
                raise UsageError(f"{expected}, got {value!r}")
            return text
        if scheme.lower() != "sqlite":
            raise UsageError(f"{expected}, got {value!r}")
        path = unquote(rest[len("localhost"):] if rest.startswith("localhost/") else rest)
    if not path or path.endswith("/"):
        raise UsageError(f"{expected}, got {value!r}")
    return "sqlite://" + os.path.abspath(os.path.expanduser(path))


# --- Ctrl-C ------------------------------------------------------------------------------------

_signals: list[int] = []  # SIGINT/SIGTERM received by kcli's handlers, in order


def interrupted() -> int | None:
    """The first SIGINT/SIGTERM this process received (through kcli's handlers), else None."""
    return _signals[0] if _signals else None


def interrupt_exit_code() -> int:
    """128 + signal number, as a shell reports a command ended by that signal (Ctrl-C: 130)."""
    return 128 + (interrupted() or signal.SIGINT)


def raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    """Python's own SIGINT behaviour, remembering that it happened (see :func:`interrupted`)."""
    _signals.append(signum)
    raise KeyboardInterrupt


@contextmanager
def deferred_signals(stop: threading.Event, interruptible: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """Inside: SIGINT/SIGTERM only set ``stop``, for a loop to notice between librdkafka calls.

    A KeyboardInterrupt raised while librdkafka runs one of our callbacks (delivery report,
    error_cb, logger) escapes the C code as ``SystemError ... returned NULL``; so the signal
    must not raise there. ``interruptible()`` says when raising is safe and needed (blocked
    reading stdin, where a flag alone would wait for the next line).
    """

    def handler(signum: int, frame: Any) -> None:
        _signals.append(signum)
        stop.set()
        if interruptible():
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(sig) != signal.SIG_IGN}  # e.g. `nohup`, a background job
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
