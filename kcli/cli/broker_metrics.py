"""`kcli broker metrics`: counters, latency summaries and gauges of running kcli brokers.

Read over kcli's admin API (KcliBrokerMetrics, key 32010) from every live broker of the cluster
named by --bootstrap-server / --context / $KCLI_BOOTSTRAP_SERVER (DescribeCluster lists them;
``--node-id N`` picks one), else from the broker already serving the default data dir. It never
boots an embedded broker: a fresh one would only show zeros.
"""

from __future__ import annotations

import sys
from typing import Any

from kcli.cli.common import GlobalOptions
from kcli.errors import KcliError, OperationError


def targets(opts: GlobalOptions, node_id: int | None = None) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    """(address, what to add to its document, client security properties) per broker to ask:
    ``node_id``'s, else all."""
    from kcli.broker.embedded import default_data_dir, running_broker
    from kcli.ops.connection import connect, resolve

    if resolve(opts) is None:
        running = running_broker(default_data_dir())  # checked like every other command's (lock, cluster id)
        if running is None:
            raise OperationError(
                "no broker to ask: give --bootstrap-server (or --context), or start one with `kcli broker start`")
        return [(running.bootstrap, {}, {})]
    from kcli.ops.brokers import cluster_view

    with connect(opts) as conn:
        view = cluster_view(conn)
    chosen = [view.broker(node_id)] if node_id is not None else view.brokers
    return [(view.address(b), {"address": view.address(b)}, conn.properties) for b in chosen]


def fetch_metrics(bootstrap: str, properties: dict[str, str] | None = None) -> dict[str, Any]:
    from kcli.diskless.admin_api import BROKER_METRICS_KEY, call

    return call(bootstrap, BROKER_METRICS_KEY, {}, properties=properties)


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
    rack = f"  rack {data['rack']}" if data.get("rack") else ""
    at = f"  at {data['address']}" if data.get("address") else ""
    out.write(f"broker {data.get('node_id')}{rack}{at}  cluster {data.get('cluster_id')}  "
              f"uptime {data.get('uptime_ms', 0) / 1000:.0f}s\n")
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


def run(opts: GlobalOptions, node_id: int | None = None) -> None:
    """One document per broker; a broker that cannot answer gets one error line and exit 1
    after the others are shown. ``-o json``: the document, or a list of them for several."""
    from kcli.cli.render import render

    docs: list[dict[str, Any]] = []
    failed: list[str] = []
    asked = targets(opts, node_id)
    for address, extra, properties in asked:
        try:
            doc = {**fetch_metrics(address, properties), **extra}
        except KcliError as err:
            failed.append(f"broker at {address}: {err}")
            continue
        if node_id is not None and doc.get("node_id") != node_id:  # the default data dir's broker
            raise OperationError(f"the broker at {address} is node {doc.get('node_id')}, not {node_id}")
        docs.append(doc)
    if len(asked) == 1 and failed:  # the one broker asked: its error is the command's
        raise OperationError(failed[0])

    def table() -> None:
        for i, doc in enumerate(docs):
            if i:
                sys.stdout.write("\n")
            print_table(doc)

    if docs:
        render(docs if len(asked) > 1 else docs[0], opts.output, table)
    for message in failed:
        sys.stderr.write(f"kcli: error: {message}\n")
    if failed:
        raise SystemExit(1)
