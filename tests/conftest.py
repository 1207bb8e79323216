"""Shared fixtures: real broker processes on loopback ports."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.brokerproc import BrokerProcess


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
