"""Broker memory under hostile and idle connections (issue 7), measured as the broker's VmRSS.

Three figures, each against a fresh kcli broker process on loopback:
  * hostile: 8 connections each announce a 100 MB frame, send a few bytes and stall;
  * idle: 500 connections each send one ApiVersions request, read the answer and stay open
    (the cost per connection is the RSS growth divided by 500, just after opening and after 5 s);
  * after close: RSS 5 s after those 500 connections closed, relative to that broker's baseline
    (the idle round runs twice; the figures are the second round's).
Usage: python bench/connection_memory_bench.py [--idle N] [--hostile N]
"""

from __future__ import annotations

import argparse
import resource
import socket
import struct
import time
from pathlib import Path

from brokers import machine
from report import record

from tests.brokerproc import BrokerProcess
from tests.wire_helpers import api_versions_request, read_response, rss_bytes

MiB = 1024 * 1024


def settle(pid: int, seconds: float, pick=min) -> int:
    """RSS after letting the broker run ``seconds`` (``pick`` of the last few samples)."""
    samples = []
    deadline = time.monotonic() + seconds
    while True:
        samples.append(rss_bytes(pid))
        if time.monotonic() >= deadline:
            return pick(samples[-3:])
        time.sleep(0.25)


def raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard) if hard != resource.RLIM_INFINITY else need, hard))


def open_idle(host: str, port: int, n: int) -> list[socket.socket]:
    socks = []
    for i in range(n):
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(api_versions_request(i))
        read_response(s)
        socks.append(s)
    return socks


def open_hostile(host: str, port: int, n: int, announced: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(struct.pack(">i", announced) + b"\x00" * 16)
        socks.append(s)
    return socks


def run(data_dir: Path, idle: int, hostile: int) -> dict[str, float]:
    """Each scenario on a fresh broker, so one cannot pre-grow the heap the other reuses."""
    raise_fd_limit(idle + 256)
    out: dict[str, float] = {}
    b = BrokerProcess(data_dir / "hostile").start()
    try:
        assert b.proc is not None
        open_idle(b.host, b.port, 4)  # warm the request path once (imports, caches)
        base = settle(b.proc.pid, 1.5)
        socks = open_hostile(b.host, b.port, hostile, 100_000_000)
        out["baseline_rss_mib"] = base / MiB
        out["hostile_growth_mib"] = (settle(b.proc.pid, 3.0, max) - base) / MiB
        for s in socks:
            s.close()
    finally:
        b.stop()
    b = BrokerProcess(data_dir / "idle").start()
    try:
        assert b.proc is not None
        open_idle(b.host, b.port, 4)
        base = settle(b.proc.pid, 1.5)
        for _ in range(2):  # the second round shows whether closed connections' memory is reused/returned
            socks = open_idle(b.host, b.port, idle)
            out["idle_kib_per_connection_fresh"] = (settle(b.proc.pid, 0.5, max) - base) / idle / 1024
            out["idle_kib_per_connection_5s"] = (settle(b.proc.pid, 5.0) - base) / idle / 1024
            for s in socks:
                s.close()
            out["after_close_over_baseline_mib"] = (settle(b.proc.pid, 5.0) - base) / MiB
    finally:
        b.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--idle", type=int, default=500)
    ap.add_argument("--hostile", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="same workload (it is already quick)")
    args = ap.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kcli-membench-") as tmp:
        r = run(Path(tmp), args.idle, args.hostile)
    print(f"# connection memory: {args.hostile} hostile 100 MB frames, {args.idle} idle connections — {machine()}")
    for k, v in r.items():
        print(f"{k:34} {v:10.2f}")
    record("broker RSS at start", round(r["baseline_rss_mib"], 1), unit="MiB", target="", better="lower")
    record(f"RSS growth, {args.hostile} connections announcing 100 MB and stalling",
           round(r["hostile_growth_mib"], 1), unit="MiB", target="< 64 MiB", better="lower")
    record("RSS per idle connection (just opened)", round(r["idle_kib_per_connection_fresh"], 1), unit="KiB",
           target="< 20 KiB", better="lower")
    record("RSS per idle connection (idle 5 s)", round(r["idle_kib_per_connection_5s"], 1), unit="KiB",
           target="< 20 KiB", better="lower")
    record(f"RSS over baseline after {args.idle} connections closed", round(r["after_close_over_baseline_mib"], 1),
           unit="MiB", target="near 0", better="lower")


if __name__ == "__main__":
    main()
