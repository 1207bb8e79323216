"""A PostgreSQL server kcli runs itself: initdb, pg_ctl start/stop/status, from the machine's binaries.

Used by ``kcli cluster start`` (a local try-it-out cluster keeps its database in ``DIR/postgres``)
and by the tests' session server, so there is one implementation of the fiddly parts:

* finding the binaries — ``pg_ctl`` on PATH, else Debian's versioned ``/usr/lib/postgresql/*/bin``;
* PostgreSQL refuses to run as root, so as root every server command runs as the ``postgres`` OS
  user (Debian's package creates it) and the server's directory is chowned to it;
* every wait is bounded (initdb, start, stop and status run with timeouts).

Authentication is ``trust`` on loopback only: this is a local server for one machine's brokers.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from kcli.errors import OperationError
from kcli.ports import free_ports

START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
STATUS_TIMEOUT_S = 15
INITDB_TIMEOUT_S = 120
CONNECT_TIMEOUT_S = 5
DB_USER = "kcli"
SERVER_OS_USER = "postgres"  # who runs the server when kcli runs as root
DEBIAN_BIN_GLOB = "/usr/lib/postgresql/*/bin"
# A Unix socket path is limited to 107 bytes; a deeper directory gets TCP only.
_MAX_SOCKET_DIR_LEN = 80


class PgServerError(OperationError):
    """The local PostgreSQL server cannot be set up, started or stopped (exit 1, one line)."""


class PgNotInstalledError(PgServerError):
    """No PostgreSQL binaries on this machine."""


def pg_bin_dir() -> Path | None:
    """The directory holding initdb/pg_ctl: on PATH, else Debian's versioned directory (newest)."""
    found = shutil.which("pg_ctl")
    if found and (Path(os.path.realpath(found)).parent / "initdb").exists():
        return Path(os.path.realpath(found)).parent
    bases = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "pg_ctl").exists() and (p / "initdb").exists()]
    bases.sort(key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else -1, reverse=True)
    return bases[0] if bases else None


def require_bin_dir() -> Path:
    bindir = pg_bin_dir()
    if bindir is None:
        raise PgNotInstalledError(f"PostgreSQL is not installed (no pg_ctl/initdb on PATH or in {DEBIAN_BIN_GLOB}): "
                                  "install postgresql (Debian/Ubuntu: apt-get install postgresql)")
    return bindir


def server_os_user() -> str | None:
    """The OS user the server runs as: ``postgres`` when we are root, else None (ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVER_OS_USER)
    except KeyError:
        raise PgServerError(f"running as root, but there is no {SERVER_OS_USER!r} OS user to run PostgreSQL as "
                            "(PostgreSQL refuses root; Debian's postgresql package creates that user)") from None
    return SERVER_OS_USER


def unreachable_ancestor(path: Path, user: str) -> Path | None:
    """The first existing directory above ``path`` that ``user`` cannot search (x bit), else None.

    PostgreSQL changes into its data directory, so every directory on the way must be searchable
    by the OS user it runs as. Judged from mode bits (ACLs are not read).
    """
    import grp

    pw = pwd.getpwnam(user)
    groups = {pw.pw_gid} | {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}
    for parent in reversed(Path(path).absolute().parents):
        try:
            st = parent.stat()
        except OSError:
            break  # not created yet: we create it (mode 0755)
        if st.st_uid == pw.pw_uid:
            ok = bool(st.st_mode & stat.S_IXUSR)
        elif st.st_gid in groups:
            ok = bool(st.st_mode & stat.S_IXGRP)
        else:
            ok = bool(st.st_mode & stat.S_IXOTH)
        if not ok:
            return parent
    return None


def check_reachable(path: Path, user: str) -> None:
    """PgServerError naming the directory that keeps ``user`` from reaching ``path``, if any."""
    blocked = unreachable_ancestor(path, user)
    if blocked is not None:
        raise PgServerError(f"the {user} OS user (PostgreSQL refuses to run as root) cannot reach {path}: "
                            f"{blocked} is not searchable by it; choose a directory it can reach "
                            f"(e.g. under /var/tmp) or `chmod o+x {blocked}`")


def _run_as(user: str | None, args: list[str], timeout: float, new_session: bool = False
            ) -> subprocess.CompletedProcess[str]:
    """Run a PostgreSQL program, as ``user`` when given; a timeout is a PgServerError."""

    def demote() -> None:
        if user is not None:
            pw = pwd.getpwnam(user)
            os.initgroups(pw.pw_name, pw.pw_gid)  # its own groups, as unreachable_ancestor assumes
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)

    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, preexec_fn=demote, cwd="/",
                              env={**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"},
                              start_new_session=new_session, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise PgServerError(f"{Path(args[0]).name} did not finish within {timeout:.0f} s") from None


def _last_lines(text: str, limit: int = 600) -> str:
    """The tail of a program's output, on one line (error messages stay one line)."""
    return " ".join(line.strip() for line in text.strip().splitlines()[-6:] if line.strip())[-limit:]


@dataclass
class PgServer:
    """One server: its data directory (``root/pgdata``), port and the superuser kcli connects as."""

    host: str
    port: int
    user: str
    data_dir: Path

    @property
    def root(self) -> Path:
        return self.data_dir.parent

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{database}"

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """pg_ctl start (waits until it accepts connections); again after a stop: same port."""
        bindir = require_bin_dir()
        root = self.root
        socket_dir = str(root) if len(str(root)) <= _MAX_SOCKET_DIR_LEN else ""
        opts = (f"-c listen_addresses={self.host} -c port={self.port} -c unix_socket_directories='{socket_dir}' "
                "-c max_connections=200 -c shared_buffers=64MB")
        # Its own session: the server outlives the command that started it and no terminal's Ctrl-C reaches it.
        r = _run_as(server_os_user(), [str(bindir / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_path),
                                       "-o", opts, "-w", "-t", str(int(timeout)), "start"], timeout + 10,
                    new_session=True)
        if r.returncode != 0:
            log = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
            raise PgServerError(f"PostgreSQL did not start on {self.host}:{self.port} (log {self.log_path}): "
                                f"{_last_lines(r.stderr + chr(10) + log)}")

    def stop(self, mode: str = "fast", timeout: float = STOP_TIMEOUT_S) -> bool:
        """pg_ctl stop -m ``mode``; False when it was not running. Raises when it would not stop."""
        if not self.running():
            return False
        bindir = require_bin_dir()
        r = _run_as(server_os_user(), [str(bindir / "pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w",
                                       "-t", str(int(timeout)), "stop"], timeout + 10)
        if r.returncode != 0 and self.running():
            raise PgServerError(f"PostgreSQL in {self.data_dir} did not stop: {_last_lines(r.stderr)}")
        return True

    def restart(self) -> None:
        self.stop()
        self.start()

    def running(self) -> bool:
        """pg_ctl status: a postmaster runs on this data directory."""
        bindir = require_bin_dir()
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        r = _run_as(server_os_user(), [str(bindir / "pg_ctl"), "-D", str(self.data_dir), "status"], STATUS_TIMEOUT_S)
        return r.returncode == 0

    def accepts_connections(self) -> bool:
        """A session can be opened (within the connect timeout)."""
        import psycopg

        try:
            with psycopg.connect(self.url(), connect_timeout=CONNECT_TIMEOUT_S):
                return True
        except psycopg.Error:
            return False

    def create_database(self, name: str | None = None) -> str:
        """CREATE DATABASE (a fresh random name unless given); returns the name."""
        import psycopg

        name = name or f"kcli_{uuid.uuid4().hex[:12]}"
        try:
            with psycopg.connect(self.url(), autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
        except psycopg.Error as err:
            raise PgServerError(f"cannot create database {name!r} on {self.host}:{self.port}: "
                                f"{_last_lines(str(err))}") from None
        return name


def init_server(root: Path, port: int | None = None, host: str = "127.0.0.1") -> PgServer:
    """initdb a new server in ``root/pgdata`` (not started): trust auth, UTF-8, fsync on.

    As root, ``root`` is chowned to the ``postgres`` OS user, which must be able to reach it.
    """
    bindir = require_bin_dir()
    as_user = server_os_user()
    root = Path(root).absolute()
    root.mkdir(parents=True, exist_ok=True)
    if as_user is not None:
        check_reachable(root, as_user)
        pw = pwd.getpwnam(as_user)
        os.chown(root, pw.pw_uid, pw.pw_gid)
    os.chmod(root, 0o700)
    data = root / "pgdata"
    r = _run_as(as_user, [str(bindir / "initdb"), "-D", str(data), "-U", DB_USER, "--auth=trust",
                          "--encoding=UTF8", "--no-instructions"], INITDB_TIMEOUT_S)
    if r.returncode != 0:
        raise PgServerError(f"initdb in {data} failed: {_last_lines(r.stderr)}")
    # A free port below the ephemeral range, so that the server keeps it across restarts (kcli/ports.py).
    return PgServer(host, port if port is not None else free_ports(1, host)[0], DB_USER, data)


def start_server(root: Path, port: int | None = None) -> PgServer:
    """A new server in ``root`` (initdb + start) on ``port`` or a free loopback port."""
    server = init_server(root, port)
    server.start()
    return server
