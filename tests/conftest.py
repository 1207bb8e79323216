"""Shared fixtures: real broker processes on loopback ports."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Iterator

import pytest

from tests.brokerproc import BrokerProcess


def pytest_configure(config: pytest.Config) -> None:
    """A suite started in the background by a non-interactive shell inherits SIGINT ignored, and so
    would every process it starts (an ignored signal survives exec): the Ctrl-C tests would then
    wait in vain. Python's own handler is not inherited, so the processes started get the default."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if not hasattr(config, "workerinput"):
        _compile_sources()


def _compile_sources() -> None:
    """Write the bytecode of kcli's own packages once per run: the suite starts a few thousand
    kcli processes (brokers, CLI commands), and under PYTHONDONTWRITEBYTECODE=1 each of them
    would compile every module it imports from source again."""
    import compileall

    root = Path(__file__).resolve().parents[1]
    for package in ("kcli", "plugins", "spark_tasks"):
        compileall.compile_dir(str(root / package), quiet=1, workers=1)


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator:
    """Start brokers with given configs; all are stopped at the end of the test."""
    started: list[BrokerProcess] = []

    def make(configs: dict[str, str] | None = None, name: str = "data", extra_args: list[str] | None = None,
             env: dict[str, str] | None = None) -> BrokerProcess:
        b = BrokerProcess(tmp_path / name, configs, extra_args, env).start()
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:  # noqa: ANN001
    """A fresh broker with Kafka's defaults."""
    return broker_factory()
