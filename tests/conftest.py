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
