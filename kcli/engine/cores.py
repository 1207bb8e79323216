"""How many cores a Spark master offers, found without starting Spark (for ``--engine auto``).

``auto`` must decide before paying Spark's cold start, so it never creates a SparkSession to
ask ``defaultParallelism``. ``local[N]`` says N itself (``local[*]``: this host's CPUs). A
standalone master (``spark://host:port``) is asked over HTTP: its web UI serves ``/json/``
with ``cores`` (the total of its ALIVE workers) and ``status``. The web UI port is Spark's own
``SPARK_MASTER_WEBUI_PORT`` (default 8080, as in start-master.sh), since the master URL carries
only the RPC port. The request has a short timeout; any failure means "unknown", and auto then
stays local. YARN and Kubernetes masters are "unknown" too (their capacity is not one number).
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass

PROBE_TIMEOUT_S = 2.0
DEFAULT_WEBUI_PORT = 8080
_LOCAL = re.compile(r"^local(?:\[(\*|\d+)(?:,\s*\d+)?\])?$")


@dataclass(frozen=True)
class MasterCores:
    """The cores a master offers (None: unknown) and where that number came from."""

    cores: int | None
    source: str


def webui_port() -> int:
    raw = os.environ.get("SPARK_MASTER_WEBUI_PORT", "")
    return int(raw) if raw.isdigit() else DEFAULT_WEBUI_PORT


def master_cores(master: str, timeout: float = PROBE_TIMEOUT_S) -> MasterCores:
    local = _LOCAL.match(master)
    if local:
        n = local.group(1)
        if n is None:
            return MasterCores(1, "local")
        if n == "*":
            return MasterCores(os.cpu_count() or 1, f"{master}: this host's CPUs")
        return MasterCores(int(n), master)
    if master.startswith("spark://"):
        return _standalone_cores(master, timeout)
    return MasterCores(None, f"the cores of {master} are not known before Spark starts")


def _standalone_cores(master: str, timeout: float) -> MasterCores:
    """Ask each host of ``spark://h1:p1,h2:p2`` (HA masters) until the ALIVE one answers."""
    port = webui_port()
    errors: list[str] = []
    for hostport in master[len("spark://"):].split(","):
        host = hostport.rsplit(":", 1)[0] if ":" in hostport else hostport
        url = f"http://{host}:{port}/json/"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                state = json.load(response)
        except (OSError, ValueError, urllib.error.URLError) as err:
            errors.append(f"{url}: {getattr(err, 'reason', err)}")
            continue
        if not isinstance(state, dict) or state.get("status") != "ALIVE":
            errors.append(f"{url}: master status {state.get('status') if isinstance(state, dict) else '?'}")
            continue
        cores = state.get("cores")
        if not isinstance(cores, int):
            errors.append(f"{url}: no core count")
            continue
        workers = state.get("aliveworkers", "?")
        return MasterCores(cores, f"{url}: {cores} core(s) on {workers} alive worker(s)")
    return MasterCores(None, "could not ask the master for its cores (" + "; ".join(errors)
                       + "; set SPARK_MASTER_WEBUI_PORT if its web UI is not on 8080)")
