"""What every Kafka-named tool shares: a joptsimple-like parser, the connection from
``--bootstrap-server`` / ``--command-config``, Kafka's table printer and the error boundary.

Failures are one line and exit code 1, as Kafka's tools exit (they use 1 for usage errors too):
no usage dump, no stack trace. A flag the tool does not know is joptsimple's ``X is not a
recognized option``; that is also Kafka 4's answer to ``--zookeeper``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any, Callable, NoReturn, Sequence

from kcli.errors import KafkaApiError, KcliError

_CONTEXT = re.compile(r"^(?:topic|group|transactional id) '[^']*'(?: partition \d+)?: ")


class ToolError(Exception):
    """Print ``message`` as one line on ``stream`` ("out" or "err") and exit with ``code``."""

    def __init__(self, message: str, code: int = 1, stream: str = "err") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.stream = stream


def spec(name: str) -> str:
    """joptsimple's OptionSpec.toString: ``[topic]``."""
    return f"[{name}]"


def missing(name: str) -> ToolError:
    """CommandLineUtils.checkRequiredArgs' message."""
    return ToolError(f'Missing required argument "{spec(name)}"')


def cannot_combine(used: str, other: str) -> ToolError:
    """CommandLineUtils.checkInvalidArgs' message."""
    return ToolError(f'Option "{spec(used)}" can\'t be used with option "{spec(other)}"')


def jopt_int(option: str) -> Callable[[str], int]:
    """An Integer/Long option: joptsimple's conversion message for anything else."""

    def convert(text: str) -> int:
        try:
            return int(text.strip())
        except ValueError:
            raise ToolError(f"Cannot parse argument '{text}' of option {option}") from None

    return convert


class ToolParser(argparse.ArgumentParser):
    """argparse with joptsimple's behaviour and messages: ``--opt value`` / ``--opt=value``,
    unique prefixes, a repeated single-valued option keeps the last value, and errors raise
    :class:`ToolError` instead of printing usage."""

    def __init__(self, prog: str, description: str) -> None:
        super().__init__(prog=prog, description=description, allow_abbrev=True, add_help=True,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
        self.add_argument("--version", action="store_true", help="Display Kafka version.")

    def flag(self, name: str, help: str) -> None:  # noqa: A002 - Kafka's word
        self.add_argument(f"--{name}", action="store_true", help=help)

    def value(self, name: str, help: str, *, metavar: str | None = None, repeat: bool = False,  # noqa: A002
              type: Callable[[str], Any] | None = None) -> None:  # noqa: A002
        self.add_argument(f"--{name}", action="append" if repeat else "store", metavar=metavar or name.upper(),
                          help=help, type=type, default=[] if repeat else None)

    def parse(self, argv: Sequence[str]) -> argparse.Namespace:
        try:
            ns, extra = self.parse_known_args(list(argv))
        except ToolError:
            raise
        for item in extra:
            if item.startswith("-") and item not in ("-", "--"):
                name = item.lstrip("-").split("=", 1)[0]
                raise ToolError(f"{name} is not a recognized option")
        # joptsimple keeps non-option arguments aside; Kafka's tools ignore them, and so do these
        if getattr(ns, "version", False):
            from kcli import __version__

            sys.stdout.write(f"{__version__} (kcli)\n")
            raise SystemExit(0)
        return ns

    def error(self, message: str) -> NoReturn:  # argparse's hook for every parse failure
        raise ToolError(_jopt_message(message))


def _jopt_message(message: str) -> str:
    """argparse's messages in joptsimple's words."""
    if message.startswith("argument ") and ": expected one argument" in message:
        name = message[len("argument "):].split(":", 1)[0].split("/")[0].lstrip("-")
        return f"Option {name} requires an argument"
    if message.startswith("ambiguous option: "):
        name = message[len("ambiguous option: "):].split(" could match", 1)[0].split("=", 1)[0].lstrip("-")
        return f"Option '{name}' cannot be resolved: it is an abbreviation of more than one option"
    if message.startswith("argument ") and "ignored explicit argument" in message:
        name = message[len("argument "):].split(":", 1)[0].lstrip("-")
        return f"Option {name} does not take an argument"
    if message.startswith("unrecognized arguments: "):
        first = message[len("unrecognized arguments: "):].split()[0]
        return f"{first.lstrip('-').split('=', 1)[0]} is not a recognized option"
    return message


def add_connection_options(parser: ToolParser, *, required_text: str = "REQUIRED: The Kafka server to connect to.",
                           config_help: str = "Property file containing configs to be passed to Admin Client.") -> None:
    parser.value("bootstrap-server", required_text, metavar="server to connect to")
    parser.value("command-config", config_help, metavar="command config property file")


def connection(ns: argparse.Namespace, missing_message: str | None = None) -> Any:
    """The Connection ``--bootstrap-server`` and ``--command-config`` name (Kafka's tools ignore
    ``bootstrap.servers`` in the file when the flag is given, and use it when not)."""
    from kcli.ops.client_properties import connection_from_java, load_properties

    props = load_properties(ns.command_config) if getattr(ns, "command_config", None) else {}
    bootstrap = ns.bootstrap_server or props.get("bootstrap.servers")
    if not bootstrap:
        raise ToolError(missing_message or 'Missing required argument "[bootstrap-server]"')
    conn = connection_from_java(bootstrap, props)
    return conn


def kafka_message(err: BaseException) -> str:
    """A kcli error as the message of the Java exception Kafka's tool would print."""
    text = (err.message or err.name) if isinstance(err, KafkaApiError) else str(err)
    # kcli's operations prefix what they were doing ("topic 'x': "); Kafka's exceptions do not
    stripped = _CONTEXT.sub("", text, count=1)
    if stripped == text and _CONTEXT.match(text + ": ") and isinstance(err, KafkaApiError):
        return f"{err.name}: {text}"  # only the context: the error's name says what went wrong
    return stripped


def print_table(headers: list[str], rows: list[list[str]], out: Callable[[str], Any] | None = None) -> None:
    """ToolsUtils.prettyPrintTable: each column padded to its widest cell, then a tab."""
    write = out or sys.stdout.write
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    for row in [headers, *rows]:
        write("".join(f"{c:<{w}}\t" for c, w in zip(row, widths)) + "\n")


def run(main: Callable[[list[str]], int | None], argv: Sequence[str] | None = None) -> NoReturn:
    """The error boundary: a :class:`ToolError` or kcli error is one line and exit 1 (or the
    error's code), a closed stdout exits quietly with 141, Ctrl-C with 130."""
    args = list(sys.argv[1:] if argv is None else argv)
    code: int = 0
    try:
        code = int(main(args) or 0)
        sys.stdout.flush()
    except ToolError as err:
        _line(err.message, err.stream)
        code = err.code
    except KcliError as err:
        _line(str(err), "err")
        code = 1
    except BrokenPipeError:
        from kcli.cli.common import stdout_closed

        stdout_closed()
    except KeyboardInterrupt:
        code = 130
    except SystemExit:
        raise
    except Exception as err:  # a bug or an unexpected client failure: still one line
        if os.environ.get("KCLI_KAFKA_TOOLS_TRACE"):
            raise
        _line(f"{type(err).__name__}: {err}", "err")
        code = 1
    raise SystemExit(code)


def _line(message: str, stream: str) -> None:
    target = sys.stdout if stream == "out" else sys.stderr
    try:
        target.flush() if target is sys.stderr else None
        target.write(" ".join(message.splitlines()) + "\n")
        target.flush()
    except BrokenPipeError:
        pass


def not_built_yet(tool: str, operation: str, argv: list[str], parser: ToolParser) -> int:
    """kafka-reassign-partitions / kafka-leader-election: parse (so an invalid flag is still
    joptsimple's error), then say in one line that kcli cannot do ``operation`` yet."""
    parser.parse(argv)
    raise ToolError(f"{tool}: {operation} is not supported by this kcli version yet (docs/replication.md)")
