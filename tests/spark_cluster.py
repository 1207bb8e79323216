"""A real Spark standalone cluster on 127.0.0.1 (one master, N workers) for tests and benches.

The pyspark 4.x wheel ships ``bin/spark-class`` but not ``sbin/start-master.sh`` /
``start-worker.sh``, so the daemons are started the way those scripts do it: ``spark-class
org.apache.spark.deploy.master.Master`` and ``...deploy.worker.Worker``, here as child processes
that :meth:`StandaloneCluster.stop` kills (process group, TERM then KILL). Every wait has a
timeout; a cluster that does not come up is torn down before the error is raised.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# Small daemons: the host has two cores and is shared.
DAEMON_JAVA_OPTS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"


def spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).resolve().parent / "bin" / "spark-class")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class StandaloneCluster:
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kcli-spark-cluster-")))
    port: int = 0
    webui_port: int = 0
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def json_url(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}/json/"

    def start(self, timeout: float = 180.0) -> "StandaloneCluster":
        self.port, self.webui_port = free_port(), free_port()
        try:
            self._spawn("master", MASTER_CLASS, "--host", "127.0.0.1", "--port", str(self.port),
                        "--webui-port", str(self.webui_port))
            for i in range(self.workers):
                self._spawn(f"worker{i}", WORKER_CLASS, self.master_url, "--host", "127.0.0.1",
                            "--cores", str(self.cores), "--memory", self.memory, "--webui-port", "0",
                            "--work-dir", str(self.log_dir / f"work{i}"))
            self._wait_alive(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def state(self) -> dict:
        with urllib.request.urlopen(self.json_url, timeout=5) as r:
            return json.load(r)

    def _spawn(self, name: str, cls: str, *args: str) -> None:
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_JAVA_OPTS": DAEMON_JAVA_OPTS,
               "SPARK_DAEMON_MEMORY": "256m", "SPARK_LOG_DIR": str(self.log_dir),
               "SPARK_WORKER_DIR": str(self.log_dir), "PYSPARK_PYTHON": sys.executable}
        log = open(self.log_dir / f"{name}.log", "wb")
        try:
            self.procs.append(subprocess.Popen([spark_class(), cls, *args], stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, env=env, start_new_session=True))
        finally:
            log.close()

    def _wait_alive(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"Spark daemon exited ({p.returncode}): {self.logs()}")
            try:
                last = self.state()
                if last.get("aliveworkers") == self.workers:  # type: ignore[union-attr]
                    return
            except OSError as err:
                last = err
            time.sleep(0.5)
        raise RuntimeError(f"Spark standalone cluster not up after {timeout:.0f} s ({last}): {self.logs()}")

    def logs(self) -> str:
        return " | ".join(f"{p.name}: {p.read_text(errors='replace')[-600:]}" for p in sorted(self.log_dir.glob("*.log")))

    def stop(self, timeout: float = 20.0) -> None:
        """Kill every daemon (and the executors a worker forked: same process group), then
        remove the logs and work dirs."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(5)
        self.procs.clear()
        shutil.rmtree(self.log_dir, ignore_errors=True)
