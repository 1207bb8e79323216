"""Generate docs/cli.md from the Typer app, so the reference never drifts from the code.

Run ``python -m kcli.cli.docgen > docs/cli.md``; tests/test_cli_docs.py fails when the file is
stale, when a command has no help text, or when its help has no ``Example:`` line.
"""

from __future__ import annotations

from typing import Any, Iterator


def _click_root() -> Any:
    import typer

    from kcli.cli.app import app

    return typer.main.get_command(app)


def iter_commands(cmd: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every leaf command as (path, click command), in `--help` order."""
    cmd = cmd or _click_root()
    sub = getattr(cmd, "commands", None)
    if sub is None:
        yield path, cmd
        return
    for name in cmd.list_commands(None):  # type: ignore[arg-type]
        yield from iter_commands(sub[name], path + (name,))


def _param_rows(cmd: Any) -> list[str]:
    rows = []
    for p in cmd.params:
        if getattr(p, "hidden", False):
            continue
        if p.param_type_name == "argument":
            names = p.name.upper()
        else:
            names = ", ".join(f"`{o}`" for o in p.opts + list(p.secondary_opts))
        help_text = (getattr(p, "help", None) or "").replace("|", "\\|").replace("\n", " ")
        if p.param_type_name == "argument":
            names = f"`{names}`"
        rows.append(f"| {names} | {help_text} |")
    return rows


def render() -> str:
    root = _click_root()
    out = ["# kcli command reference", "",
           "Generated from the CLI by `python -m kcli.cli.docgen > docs/cli.md`; do not edit by hand.", "",
           "Global options (before or after the command): "
           + ", ".join(f"`{o}`" for p in root.params for o in p.opts) + ".", ""]
    for path, cmd in iter_commands(root):
        out.append(f"## kcli {' '.join(path)}")
        out.append("")
        out.append((cmd.help or "").strip())
        out.append("")
        rows = _param_rows(cmd)
        if rows:
            out += ["| option | meaning |", "|---|---|", *rows, ""]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(render())
