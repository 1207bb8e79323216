"""`kcli broker start --daemon`, `kcli broker status`, `kcli broker stop`: one broker in the background.

The data dir says which broker is meant: its ``.lock`` is held while a broker serves it, and its
``broker.json`` (written once the broker listens) names the pid and address. A process is only
signalled when it is that broker: alive and holding the data dir's lock file open (pids are
reused; a recorded pid alone proves nothing). The process handling (detached spawn, SIGTERM then
SIGKILL, the error line of a log) is `kcli cluster`'s (kcli/ops/cluster.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kcli.errors import OperationError, UsageError

LOG_FILE = "broker.log"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
POLL_S = 0.2


@dataclass
class BrokerProcessStatus:
    data_dir: str
    pid: int
    node_id: int | None
    cluster_id: str | None
    listeners: list[str]
    bootstrap: str
    started: str  # UTC, ISO 8601
    uptime_s: float
    log: str | None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "running": True}


@dataclass
class StopResult:
    data_dir: str
    pid: int
    killed: bool
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _resolve(data_dir: Path) -> Path:
    return Path(data_dir).expanduser().absolute()


def _holds_lock(pid: int, data_dir: Path) -> bool:
    """Whether ``pid`` has ``data_dir/.lock`` open (the broker keeps it open while it runs).
    Without /proc: whether anything holds the lock."""
    lock = os.path.realpath(data_dir / ".lock")
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return False
    except OSError:
        from kcli.broker.embedded import data_dir_lock_held

        return data_dir_lock_held(data_dir)
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == lock:
                return True
        except OSError:
            continue
    return False


def status(data_dir: Path) -> BrokerProcessStatus:
    """The broker serving ``data_dir``; OperationError (exit 1) when none runs."""
    from kcli.broker.embedded import data_dir_lock_held
    from kcli.ops.connection import process_alive

    data_dir = _resolve(data_dir)
    info_path = data_dir / "broker.json"
    not_running = OperationError(f"no broker is running on {data_dir}")
    if not data_dir_lock_held(data_dir):
        raise not_running
    try:
        info = json.loads(info_path.read_text())
        pid = int(info["pid"])
        started_at = info_path.stat().st_mtime  # written once, when the broker started listening
    except (OSError, ValueError, KeyError, TypeError):
        raise OperationError(f"a broker holds {data_dir} but is not listening yet (or is stopping): no "
                             f"{info_path.name}; retry in a moment") from None
    if not process_alive(pid) or not _holds_lock(pid, data_dir):
        raise not_running
    bootstrap = f"{info.get('host')}:{info.get('port')}"
    listeners = [str(x) for x in info.get("listeners") or [bootstrap]]
    log = data_dir / LOG_FILE
    return BrokerProcessStatus(
        data_dir=str(data_dir), pid=pid, node_id=info.get("node_id"), cluster_id=info.get("cluster_id"),
        listeners=listeners, bootstrap=bootstrap,
        started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at)),
        uptime_s=round(max(0.0, time.time() - started_at), 1), log=str(log) if log.exists() else None)


def start_daemon(data_dir: Path, argv: list[str], timeout_s: float = START_TIMEOUT_S) -> BrokerProcessStatus:
    """Run ``kcli <argv>`` (a `broker start` without --daemon) detached, output appended to
    DATA_DIR/broker.log; return once it listens. A broker already on ``data_dir``, or one that
    exits or does not listen within ``timeout_s``, is an OperationError (the latter is stopped)."""
    from kcli.ops.cluster import log_cause, spawn_detached, terminate

    data_dir = _resolve(data_dir)
    try:
        running = status(data_dir)
    except OperationError:
        running = None
    if running is not None:
        raise OperationError(f"a broker is already running on {data_dir} (pid {running.pid}, {running.bootstrap}); "
                             f"see `kcli broker status --data-dir {data_dir}`")
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OperationError(f"cannot use {data_dir}: {err.strerror or err}") from None
    log = data_dir / LOG_FILE
    args = [sys.executable, "-m", "kcli", *argv, "--data-dir", str(data_dir)]
    proc = spawn_detached(args, log)
    deadline = time.monotonic() + timeout_s
    while True:
        rc = proc.poll()
        if rc is not None:
            raise OperationError(f"the broker exited (code {rc}) before it listened: {log_cause(log)} (log {log})")
        try:
            st = status(data_dir)
            if st.pid == proc.pid:
                return st
        except OperationError:
            pass
        if time.monotonic() >= deadline:
            terminate([(0, proc.pid)], STOP_TIMEOUT_S)
            proc.poll()
            raise OperationError(f"the broker did not listen within {timeout_s:g} s and was stopped (log {log})")
        time.sleep(POLL_S)


def stop(data_dir: Path, timeout_s: float = STOP_TIMEOUT_S) -> StopResult:
    """SIGTERM the broker of ``data_dir``, SIGKILL it after ``timeout_s``; OperationError if none runs."""
    from kcli.ops.cluster import terminate

    if timeout_s <= 0:
        raise UsageError(f"--timeout expects a positive number of seconds, got {timeout_s:g}")
    st = status(data_dir)
    started = time.monotonic()
    killed = terminate([(0, st.pid)], timeout_s)
    return StopResult(st.data_dir, st.pid, bool(killed), round(time.monotonic() - started, 1))


def daemon_argv(argv: list[str]) -> list[str]:
    """This command line without --daemon/--detach: what the background broker runs."""
    return [a for a in argv if a not in ("--daemon", "--detach")]
