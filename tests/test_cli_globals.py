"""Global options may follow the command, as in kafkactl/rpk."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kcli.cli.app import hoist_global_options


@pytest.mark.parametrize("argv,expected", [
    (["topics", "list", "-o", "json"], ["-o", "json", "topics", "list"]),
    (["-b", "h:1", "topics", "describe", "--topic", "t", "-v"], ["-b", "h:1", "-v", "topics", "describe", "--topic", "t"]),
    (["topics", "list", "--output=yaml"], ["--output=yaml", "topics", "list"]),
    (["context", "set", "c", "-b", "h:1"], ["context", "set", "c", "-b", "h:1"]),
    (["produce", "--topic", "t", "--key-separator", "-v"], ["produce", "--topic", "t", "--key-separator", "-v"]),
    (["runbook", "run", "f.yaml", "--", "-o", "x"], ["runbook", "run", "f.yaml", "--", "-o", "x"]),
])
def test_hoisting(argv, expected):
    assert hoist_global_options(argv) == expected


def test_output_option_after_command_against_a_broker(broker):
    from tests.kafka_helpers import create_topic

    create_topic(broker.bootstrap, "after")
    out = subprocess.run([sys.executable, "-m", "kcli", "topics", "list", "-b", broker.bootstrap, "-o", "json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert [t["topic"] for t in json.loads(out.stdout)] == ["after"]
