"""How `--help` shows an option's value: flags as flags, ranges as ``N ≥ 1``.

Typer (0.16+) labels every option with its Python type: ``<bool>`` after a flag that takes no
value, ``<int range> [x>=0]`` after a number. Operators read those as "this flag wants a
value". Here a flag shows nothing, a number shows ``N`` (or the option's own metavar, e.g.
``MS``) and its range in the same name (``MS ≥ 0``, ``1 ≤ N ≤ 32767``), text shows ``TEXT``.
Installed once by kcli.cli.app on Typer's option class: help output only, parsing is untouched.

Width: piped, or on a narrow terminal, Rich lays the options table out in 80 columns (or fewer)
and by default cuts any cell that does not fit with ``…``, flag names included
(``--delete-partitions…``). Here the name columns never wrap or shrink: the type and the
description columns wrap instead, and the help is laid out at least :data:`MIN_WIDTH` wide (a
terminal narrower than that wraps the lines itself, but no flag name is ever cut).

Arguments read as in click's classic help: ``SHELL`` (required), ``[NAME]`` (optional), and an
argument with choices shows them in the usage line, ``{bash|zsh|fish}`` (Typer 0.16+ would print
``{shell}``).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

_LABELS = {"<int range>": "N", "<int>": "N", "<float range>": "X", "<float>": "X", "<str>": "TEXT",
           "<list[str]>": "TEXT", "<list[int]>": "N", "<Path>": "PATH", "<path>": "PATH", "<list[Path]>": "PATH"}


def _label(option: Any, ctx: Any) -> str | None:
    if getattr(option, "is_flag", False) and not getattr(option, "count", False):
        return None
    if option.metavar is not None:
        # an argument's metavar is already its name (PATH_OR_URI...): no second copy
        return None if getattr(option, "param_type_name", "") == "argument" else option.metavar
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


MIN_WIDTH = 80  # help is laid out at least this wide, so the name columns always fit


def _argument_name(argument: Any) -> str:
    """An argument's name in help: its metavar, else its name in capitals (``SHELL``)."""
    return argument.metavar if argument.metavar is not None else argument.name.upper()


def _argument_usage(argument: Any) -> str:
    """The usage line's form: ``{a|b|c}`` for a required choice, ``NAME`` / ``[NAME]``."""
    name = _argument_name(argument)
    desc = getattr(argument, "type_descriptor", None)
    choices = desc.choices if desc is not None and desc.is_choice else None
    if argument.required and choices:
        name = "{" + "|".join(str(getattr(c, "value", c)) for c in choices) + "}"
    elif not argument.required:
        name = f"[{name}]"
    if argument.nargs != 1 and not name.rstrip("]").endswith("..."):
        name += "..."
    return name


def _options_table_class(table_class: type) -> type:
    """Rich's Table, but the options panel's name columns (all but the last two: type and
    description) never wrap or shrink; the commands panel defines its own columns and is left
    as it is."""

    from rich.columns import Columns
    from rich.text import Text

    class OptionsTable(table_class):  # type: ignore[misc, valid-type]
        def add_row(self, *renderables: Any, **kwargs: Any) -> None:
            if not self.columns and len(renderables) > 2:
                for i in range(len(renderables)):
                    wraps = i >= len(renderables) - 2
                    self.add_column(no_wrap=not wraps, overflow="fold")
            if self.columns and len(self.columns) > 2 and renderables and isinstance(renderables[-1], Columns):
                # Typer's description cell (help, [default: ...], [required]) as one paragraph:
                # Columns would cut a word longer than the column (a URL) with "…"
                items = renderables[-1].renderables
                if all(isinstance(item, (Text, str)) for item in items):
                    renderables = (*renderables[:-1], Text(" ").join(
                        item if isinstance(item, Text) else Text(item) for item in items))
            super().add_row(*renderables, **kwargs)

    return OptionsTable


def install() -> None:
    """Make Typer's option class render values as above (idempotent). Typer's rich help module
    (and rich with it, ~0.15 s of imports) loads only when help or an error is rendered: it is
    patched as it loads, so a command that runs does not pay for it."""
    from typer.core import TyperArgument, TyperOption

    if getattr(TyperOption, "_kcli_help", False):
        return
    TyperOption.display_type_rich = lambda self, ctx: _label(self, ctx)  # type: ignore[method-assign]
    TyperArgument.display_type_rich = lambda self, ctx: _label(self, ctx)  # type: ignore[method-assign]
    TyperOption._get_number_range_help_str = _range  # type: ignore[method-assign]
    TyperArgument.display_name_raw = property(_argument_name)  # type: ignore[method-assign, assignment]
    TyperArgument._usage_display_name = _argument_usage  # type: ignore[method-assign]
    TyperOption._kcli_help = True  # type: ignore[attr-defined]
    if RICH_UTILS in sys.modules:
        _patch_rich_utils(sys.modules[RICH_UTILS])
    else:
        sys.meta_path.insert(0, _PatchOnImport())


RICH_UTILS = "typer.rich_utils"


def _patch_rich_utils(rich_utils: Any) -> None:
    rich_utils.Table = _options_table_class(rich_utils.Table)
    console = rich_utils._get_rich_console

    def wide_enough_console(stderr: bool = False) -> Any:
        c = console(stderr=stderr)
        if rich_utils.MAX_WIDTH is None and c.width < MIN_WIDTH:
            c.width = MIN_WIDTH
        return c

    rich_utils._get_rich_console = wide_enough_console


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when Typer's rich help module is imported, wraps its loader so the
    module is patched right after it runs, then steps out of the import path."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != RICH_UTILS:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _patch_rich_utils(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
