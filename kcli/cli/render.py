"""Rendering of command results: one data value, three formats (table, json, yaml).

Commands build plain data (dicts/lists, or dataclasses with ``to_dict``) and a table printer;
:func:`render` picks by ``-o``. Tables are plain aligned text (no box drawing) so they stay
greppable and stable in pipes.
"""

from __future__ import annotations

import dataclasses
import sys
from enum import Enum
from typing import Any, Callable, Iterable, Sequence

from kcli.cli.common import OutputFormat, emit_json, emit_yaml


def to_data(value: Any) -> Any:
    """Dataclasses (via ``to_dict`` when they define it), enums and containers → JSON-able data."""
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return to_data(value.to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_data(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    return value


def render(data: Any, output: OutputFormat, table: Callable[[], None] | None = None) -> None:
    """Print ``data`` as JSON/YAML, or call ``table`` (default: a generic table) for table mode."""
    if output == OutputFormat.json:
        emit_json(to_data(data))
    elif output == OutputFormat.yaml:
        emit_yaml(to_data(data))
    elif table is not None:
        table()
    else:
        plain = to_data(data)
        if isinstance(plain, list) and plain and isinstance(plain[0], dict):
            print_table(plain, [(k.upper().replace("_", "-"), k) for k in plain[0]])
        elif isinstance(plain, dict):
            print_fields(plain)
        else:
            sys.stdout.write(f"{plain}\n")


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(cell(v) for v in value)
    if isinstance(value, dict):
        return ",".join(f"{k}={cell(v)}" for k, v in value.items())
    return str(value)


def print_table(rows: Iterable[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> None:
    """Aligned columns with a header row; ``columns`` is ``[(HEADER, key), ...]``."""
    body = [[cell(row.get(key)) for _, key in columns] for row in rows]
    headers = [h for h, _ in columns]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(headers)]
    out = sys.stdout
    for line in [headers] + body:
        out.write("  ".join(v.ljust(widths[i]) for i, v in enumerate(line)).rstrip() + "\n")


def print_fields(data: dict[str, Any], indent: str = "") -> None:
    """``key: value`` lines, nesting dicts one level deeper."""
    for key, value in data.items():
        if isinstance(value, dict) and value:
            sys.stdout.write(f"{indent}{key}:\n")
            print_fields(value, indent + "  ")
        else:
            sys.stdout.write(f"{indent}{key}: {cell(value) if not isinstance(value, dict) else ''}\n")


def yaml_document(data: Any) -> str:
    """One YAML document (``---`` first), for streams (consume -o yaml)."""
    import yaml

    return yaml.safe_dump(to_data(data), sort_keys=False, explicit_start=True, allow_unicode=True)
