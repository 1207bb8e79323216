"""A real kcli broker in a child process, for tests: start, restart, SIGTERM, SIGKILL."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from kcli.broker.runner import parse_listening
from kcli.ports import free_ports


class BrokerProcess:
    def __init__(self, data_dir: Path, configs: dict[str, str] | None = None, extra_args: list[str] | None = None,
                 env: dict[str, str] | None = None, preexec_fn: Callable[[], None] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.preexec_fn = preexec_fn  # runs in the child before exec (e.g. resource.setrlimit)
        self.configs = dict(configs or {})
        self.extra_args = list(extra_args or [])
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self.listeners: dict[str, str] = {}  # name → host:port, with --config listeners=...
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.broker.log"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "BrokerProcess":
        for attempt in range(5):
            chosen = self.port == 0 and "listeners" not in self.configs
            if chosen:
                # below the ephemeral range, so a restart keeps it; the host may name its
                # listener (SSL://127.0.0.1)
                self.port = free_ports(1, self.host.split("://")[-1])[0]
            try:
                return self._start(timeout)
            except RuntimeError as err:
                if not chosen or "Address already in use" not in str(err) or attempt == 4:
                    raise
                self.port = 0  # another process took the port between the probe and the bind
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> "BrokerProcess":
        args = [sys.executable, "-m", "kcli", "broker", "start", "--data-dir", str(self.data_dir)]
        if "listeners" not in self.configs:  # Kafka's form names every listener itself
            args += ["--listen", f"{self.host}:{self.port}"]
        for k, v in self.configs.items():
            args += ["--config", f"{k}={v}"]
        args += self.extra_args
        env = dict(os.environ)
        env.update(self.env or {})
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, env=env, preexec_fn=self.preexec_fn)
        deadline = time.monotonic() + timeout
        line = b""
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            r, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if r:
                line = self.proc.stdout.readline()
                break
            if self.proc.poll() is not None:
                break
        text = line.decode().strip()
        address = parse_listening(text)  # the plain line, or its JSON form with --log-format json
        if address is None:
            self.proc.kill()
            raise RuntimeError(f"broker did not start: {text!r}; log:\n{self.log_path.read_text()[-3000:]}")
        hostport = address.split("://")[-1]  # NAME://HOST:PORT with --config listeners=...
        self.host, port = hostport.rsplit(":", 1)
        self.port = int(port)
        if "listeners" in self.configs:  # one line per listener: kcli broker listening on NAME://HOST:PORT
            addresses = [address] + [parse_listening(self.proc.stdout.readline().decode()) or ""
                                     for _ in self.configs["listeners"].split(",")[1:]]
            self.listeners = dict(a.split("://", 1) for a in addresses)
        return self

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc = self.proc.returncode
        self.proc = None
        return rc

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def restart(self) -> "BrokerProcess":
        self.stop()
        return self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text()
        except OSError:
            return ""
