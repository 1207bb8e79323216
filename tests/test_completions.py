"""Shell completion scripts: generated from the Typer app, checked in, and working."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_checked_in_scripts_match_the_app(shell):
    """Regenerate each script; a difference means completions/ drifted from the CLI."""
    env = dict(os.environ, _KCLI_COMPLETE=f"source_{shell}")
    generated = subprocess.run([sys.executable, "-c", "from kcli.cli.app import main; main()"], env=env,
                               capture_output=True, text=True, timeout=60).stdout
    via_command = subprocess.run([sys.executable, "-m", "kcli", "completion", shell], capture_output=True,
                                 text=True, timeout=60)
    assert via_command.returncode == 0
    assert generated.strip() == via_command.stdout.strip()
    checked_in = (ROOT / "completions" / f"kcli.{shell}").read_text()
    assert checked_in == via_command.stdout, f"completions/kcli.{shell} is stale: run `kcli completion {shell} > completions/kcli.{shell}`"


def test_bash_completion_lists_commands_and_subcommands():
    def complete(words: str, cword: int) -> list[str]:
        env = dict(os.environ, _KCLI_COMPLETE="complete_bash", COMP_WORDS=words, COMP_CWORD=str(cword))
        out = subprocess.run([sys.executable, "-c", "from kcli.cli.app import main; main()"], env=env,
                             capture_output=True, text=True, timeout=60).stdout
        return out.split()

    assert "topics" in complete("kcli to", 1)
    assert set(complete("kcli topics ", 2)) >= {"create", "list", "describe", "alter", "delete"}


def test_topic_names_complete_from_the_current_context(broker, tmp_path):
    from tests.kafka_helpers import create_topic

    create_topic(broker.bootstrap, "orders-eu")
    create_topic(broker.bootstrap, "orders-us")
    create_topic(broker.bootstrap, "payments")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"current-context: test\ncontexts:\n  test:\n    bootstrap-servers: \"{broker.bootstrap}\"\n")
    env = dict(os.environ, KCLI_CONFIG=str(cfg), _KCLI_COMPLETE="complete_bash",
               COMP_WORDS="kcli topics describe --topic ord", COMP_CWORD="4")
    out = subprocess.run([sys.executable, "-c", "from kcli.cli.app import main; main()"], env=env,
                         capture_output=True, text=True, timeout=60).stdout
    assert out.split() == ["orders-eu", "orders-us"]
