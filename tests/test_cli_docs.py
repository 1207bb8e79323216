"""docs/cli.md is generated from the app, and every command documents itself with an example."""

from __future__ import annotations

from pathlib import Path

from kcli.cli.docgen import iter_commands, render

ROOT = Path(__file__).resolve().parents[1]


def test_every_command_has_help_and_an_example():
    missing = []
    for path, cmd in iter_commands():
        text = (cmd.help or "").strip()
        if not text:
            missing.append(f"kcli {' '.join(path)}: no help text")
        elif "Example:" not in text and "Examples:" not in text:
            missing.append(f"kcli {' '.join(path)}: no 'Example:' line")
        for p in cmd.params:
            if p.param_type_name == "option" and not getattr(p, "hidden", False) and not (getattr(p, "help", None) or "").strip():
                missing.append(f"kcli {' '.join(path)} {p.opts[0]}: no help text")
    assert not missing, "\n".join(missing)


def test_docs_cli_md_is_current():
    current = (ROOT / "docs" / "cli.md").read_text()
    assert current == render(), "docs/cli.md is stale: run `python -m kcli.cli.docgen > docs/cli.md`"
