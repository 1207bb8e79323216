"""`kcli broker metrics`: counters, latency summaries and gauges of a running kcli broker.

Read over kcli's admin API (KcliBrokerMetrics, key 32010) from the broker named by
--bootstrap-server / --context / $KCLI_BOOTSTRAP_SERVER, else the broker already serving the
default data dir. It never boots an embedded broker: a fresh one would only show zeros.
"""

from __future__ import annotations

import sys
from typing import Any

from kcli.cli.common import GlobalOptions
from kcli.errors import OperationError


def target_bootstrap(opts: GlobalOptions) -> str:
    from kcli.broker.embedded import default_data_dir, running_broker
    from kcli.ops.connection import resolve

    conn = resolve(opts)
    if conn is not None:
        return conn.bootstrap.split(",")[0].strip()
    running = running_broker(default_data_dir())  # checked like every other command's (lock, cluster id)
    if running is not None:
        return running.bootstrap
    raise OperationError(
        "no broker to ask: give --bootstrap-server (or --context), or start one with `kcli broker start`")


def fetch_metrics(bootstrap: str) -> dict[str, Any]:
    from kcli.diskless.admin_api import BROKER_METRICS_KEY, call

    return call(bootstrap, BROKER_METRICS_KEY, {})


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.3f}".rstrip("0").rstrip(".") if v != int(v) else str(int(v))
    return str(v)


def print_table(data: dict[str, Any]) -> None:
    from kcli.cli.render import print_table as table

    out = sys.stdout
    out.write(f"broker {data.get('node_id')}  cluster {data.get('cluster_id')}  uptime {data.get('uptime_ms', 0) / 1000:.0f}s\n")
    counters = data.get("counters") or {}
    gauges = data.get("gauges") or {}
    summaries = data.get("summaries") or {}
    if counters or gauges:
        out.write("\n")
        rows = [{"name": k, "value": _fmt(v)} for k, v in counters.items()]
        rows += [{"name": k, "value": _fmt(v)} for k, v in gauges.items()]
        table(rows, [("METRIC", "name"), ("VALUE", "value")])
    if summaries:
        out.write("\n")
        rows = [{"name": k, **{f: _fmt(s.get(f)) for f in ("count", "avg", "p50", "p99", "max")}}
                for k, s in summaries.items()]
        table(rows, [("SUMMARY", "name"), ("COUNT", "count"), ("AVG", "avg"), ("P50", "p50"), ("P99", "p99"),
                     ("MAX", "max")])
    if not (counters or gauges or summaries):
        out.write("no metrics recorded yet\n")


def run(opts: GlobalOptions) -> None:
    from kcli.cli.render import render

    data = fetch_metrics(target_bootstrap(opts))
    render(data, opts.output, lambda: print_table(data))
