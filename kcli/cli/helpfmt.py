"""How `--help` shows an option's value: flags as flags, ranges as ``N ≥ 1``.

Typer (0.16+) labels every option with its Python type: ``<bool>`` after a flag that takes no
value, ``<int range> [x>=0]`` after a number. Operators read those as "this flag wants a
value". Here a flag shows nothing, a number shows ``N`` (or the option's own metavar, e.g.
``MS``) and its range in the same name (``MS ≥ 0``, ``1 ≤ N ≤ 32767``), text shows ``TEXT``.
Installed once by kcli.cli.app on Typer's option class: help output only, parsing is untouched.
"""

from __future__ import annotations

from typing import Any

_LABELS = {"<int range>": "N", "<int>": "N", "<float range>": "X", "<float>": "X", "<str>": "TEXT",
           "<list[str]>": "TEXT", "<list[int]>": "N", "<Path>": "PATH", "<path>": "PATH", "<list[Path]>": "PATH"}


def _label(option: Any, ctx: Any) -> str | None:
    if getattr(option, "is_flag", False) and not getattr(option, "count", False):
        return None
    if option.metavar is not None:
        return option.metavar
    raw = option.display_type(ctx)
    if raw in _LABELS:
        return _LABELS[raw]
    if raw.startswith("<") and raw.endswith(">"):
        inner = raw[1:-1]
        if inner.startswith("list[") and inner.endswith("]"):
            inner = inner[5:-1]
        return f"[{inner}]" if "|" in inner else inner.upper()
    return raw


def _range(option: Any) -> str | None:
    lo, hi = getattr(option, "min", None), getattr(option, "max", None)
    if lo is None and hi is None or getattr(option, "is_flag", False):
        return None
    name = option.metavar or ("X" if isinstance(lo if lo is not None else hi, float) else "N")
    if lo is None:
        return f"{name} ≤ {hi}"
    if hi is None:
        return f"{name} ≥ {lo}"
    return f"{lo} ≤ {name} ≤ {hi}"


def install() -> None:
    """Make Typer's option class render values as above (idempotent)."""
    from typer.core import TyperArgument, TyperOption

    if getattr(TyperOption, "_kcli_help", False):
        return
    TyperOption.display_type_rich = lambda self, ctx: _label(self, ctx)  # type: ignore[method-assign]
    TyperArgument.display_type_rich = lambda self, ctx: _label(self, ctx)  # type: ignore[method-assign]
    TyperOption._get_number_range_help_str = _range  # type: ignore[method-assign]
    TyperOption._kcli_help = True  # type: ignore[attr-defined]
