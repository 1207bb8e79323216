"""Free TCP ports for servers that restart on the port they were given.

A port the kernel picks (bind to port 0) lies in its ephemeral range, the range it also gives
outgoing connections as source ports. While a server that owns such a port is down for a
restart, any outgoing connection of the machine may take it (a client reconnecting to it may
even connect to itself), and the restart then fails with "Address already in use"; SO_REUSEADDR
covers TIME_WAIT, not a live connection. A port below the range is never handed out that way, so
`kcli cluster start` records those for its brokers and PostgreSQL.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable
from pathlib import Path

LOWEST = 10000  # below this, well-known and registered services
PROBES = 200


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux default 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``port`` can be bound on ``host`` right now."""
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(n: int, host: str = "127.0.0.1", avoid: Iterable[int] = ()) -> list[int]:
    """``n`` distinct ports free right now, below the ephemeral range where one can be found
    (else the kernel's pick). The probes stay bound until all are chosen, so they differ; a
    caller still binds later, so another process may take one meanwhile (then pick again)."""
    taken = set(avoid)
    held: list[socket.socket] = []
    ports: list[int] = []
    low = ephemeral_low()
    try:
        for _ in range(PROBES if low > LOWEST + 1 else 0):
            if len(ports) == n:
                break
            port = random.randrange(LOWEST, low)
            if port in taken:
                continue
            probe = socket.socket()
            try:
                probe.bind((host, port))
            except OSError:
                probe.close()
                continue
            held.append(probe)
            taken.add(port)
            ports.append(port)
        while len(ports) < n:  # nothing free below the range: let the kernel choose
            probe = socket.socket()
            held.append(probe)
            probe.bind((host, 0))
            port = int(probe.getsockname()[1])
            if port not in taken:
                taken.add(port)
                ports.append(port)
    finally:
        for probe in held:
            probe.close()
    return ports
