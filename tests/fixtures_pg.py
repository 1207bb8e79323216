"""A real PostgreSQL server for the test session, on a loopback port (kcli/cluster/pgserver.py).

Started once per session (the first test that asks for it pays ~2 s) and stopped at the end.
The server management itself is kcli's own (``kcli cluster start`` uses the same module): as root
the server runs as the ``postgres`` OS user, so its directory is made under /tmp where that user
can reach it. Each test that wants a clean slate takes ``pg_database``: a fresh database on the
shared server.

Import the fixtures into a test module with ``from tests.fixtures_pg import pg_server, pg_database``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kcli.cluster.pgserver import START_TIMEOUT_S, PgServer, pg_bin_dir, start_server

__all__ = ["START_TIMEOUT_S", "PgServer", "pg_bin_dir", "pg_database", "pg_server", "start_pg_server",
           "stop_pg_server"]


def start_pg_server(root: Path) -> PgServer:
    """initdb + pg_ctl start under ``root`` (trust auth, loopback only, fsync on)."""
    return start_server(root)


def stop_pg_server(server: PgServer, mode: str = "fast") -> None:
    server.stop(mode)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    root = Path(tempfile.mkdtemp(prefix="kcli-pg-"))
    server = start_pg_server(root)
    try:
        yield server
    finally:
        stop_pg_server(server)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_database(pg_server: PgServer) -> str:
    """A fresh, empty database on the session's server; returns its ``postgresql://`` URL."""
    return pg_server.url(pg_server.create_database())
