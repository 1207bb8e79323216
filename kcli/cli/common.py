"""What every command shares: global options, output rendering, the error boundary."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from enum import Enum
from typing import Any

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
