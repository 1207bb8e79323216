"""A real PostgreSQL server for the test session: initdb + pg_ctl in a temp dir, on a loopback port.

Started once per session (the first test that asks for it pays ~2 s) and stopped at the end.
PostgreSQL refuses to run as root, so when the tests run as root the server runs as the
``postgres`` OS user (Debian's package creates it) in a directory that user owns. Each test that
wants a clean slate takes ``pg_database``: a fresh database on the shared server.

Import the fixtures into a test module with ``from tests.fixtures_pg import pg_server, pg_database``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

START_TIMEOUT_S = 60


def pg_bin_dir() -> Path | None:
    """The directory holding initdb/pg_ctl: on PATH, else Debian's versioned directory."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    for base in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (base / "pg_ctl").exists() and (base / "initdb").exists():
            return base
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PgServer:
    host: str
    port: int
    user: str
    data_dir: Path

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{database}"

    def stop(self) -> None:
        """Stop the server (fast shutdown: sessions are cut), for outage tests; start() again."""
        stop_pg_server(self)

    def start(self) -> None:
        _pg_ctl_start(self.data_dir, self.port)

    def restart(self) -> None:
        self.stop()
        self.start()

    def create_database(self) -> str:
        import psycopg

        name = f"kcli_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return name


def _run_as(user: str | None, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    def demote() -> None:
        if user is not None:
            pw = pwd.getpwnam(user)
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)

    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, preexec_fn=demote,
                          cwd="/", env={**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"})


def start_pg_server(root: Path) -> PgServer:
    """initdb + pg_ctl start under ``root`` (trust auth, loopback only, fsync on)."""
    bindir = pg_bin_dir()
    if bindir is None:
        raise RuntimeError("PostgreSQL is not installed (no pg_ctl); the README's test command installs it")
    as_user = "postgres" if os.geteuid() == 0 else None
    root.mkdir(parents=True, exist_ok=True)
    data = root / "pgdata"
    if as_user is not None:
        pw = pwd.getpwnam(as_user)
        os.chown(root, pw.pw_uid, pw.pw_gid)
        os.chmod(root, 0o700)
    db_user = "kcli"
    r = _run_as(as_user, [str(bindir / "initdb"), "-D", str(data), "-U", db_user, "--auth=trust",
                          "--encoding=UTF8", "--no-instructions"], 120)
    if r.returncode != 0:
        raise RuntimeError(f"initdb failed: {r.stderr.strip()[-2000:]}")
    port = _free_port()
    _pg_ctl_start(data, port)
    return PgServer("127.0.0.1", port, db_user, data)


def _pg_ctl_start(data: Path, port: int) -> None:
    """pg_ctl start of an initdb'd ``data`` dir on ``port`` (again after a stop: same port)."""
    bindir = pg_bin_dir()
    assert bindir is not None
    as_user = "postgres" if os.geteuid() == 0 else None
    root = data.parent
    opts = (f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories='{root}' "
            "-c max_connections=200 -c shared_buffers=64MB")
    r = _run_as(as_user, [str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-o", opts,
                          "-w", "-t", str(START_TIMEOUT_S), "start"], START_TIMEOUT_S + 10)
    if r.returncode != 0:
        log = (root / "server.log").read_text() if (root / "server.log").exists() else ""
        raise RuntimeError(f"pg_ctl start failed: {r.stderr.strip()[-1000:]} {log[-2000:]}")


def stop_pg_server(server: PgServer, mode: str = "fast") -> None:
    bindir = pg_bin_dir()
    as_user = "postgres" if os.geteuid() == 0 else None
    if bindir is not None:
        _run_as(as_user, [str(bindir / "pg_ctl"), "-D", str(server.data_dir), "-m", mode, "-w", "-t", "30", "stop"],
                60)


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
