"""`kcli cluster start|status|stop`: a local cluster (PostgreSQL + N brokers) in one directory.

Parsing and rendering only; the work is in :mod:`kcli.ops.cluster`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import List, Optional

import typer

from kcli.cli.common import options, parse_key_values
from kcli.cli.render import print_table, render

cluster_app = typer.Typer(help="Run a local cluster for trying things out: its own PostgreSQL and N brokers "
                               "in one directory (docs/cluster.md).", no_args_is_help=True)

_DIR_HELP = "The cluster's directory (default: $KCLI_CLUSTER_DIR, else ~/.local/share/kcli/cluster)."


def _dir(data_dir: Optional[Path]) -> Path:
    from kcli.ops.cluster import default_cluster_dir

    return data_dir if data_dir is not None else default_cluster_dir()


def _progress(verbose: bool) -> Callable[[str], None] | None:
    return (lambda message: sys.stderr.write(f"kcli: {message}\n")) if verbose else None


@cluster_app.command("start")
def start(
    ctx: typer.Context,
    brokers: Optional[int] = typer.Option(None, "--brokers", help="Number of brokers, node ids 1..N (default 3)."),
    racks: Optional[str] = typer.Option(None, "--racks", help="Comma-separated racks, cycled over the brokers (default a,b,c)."),
    object_store: Optional[str] = typer.Option(None, "--object-store", help="Shared object store: file:///dir or s3://bucket/prefix (default: DIR/objects)."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=_DIR_HELP),
    base_port: Optional[int] = typer.Option(None, "--base-port", help="Brokers listen on 127.0.0.1:P..P+N-1 (default: free ports)."),
    timeout: float = typer.Option(60.0, "--timeout", metavar="SECONDS", help="Seconds to wait for PostgreSQL and every broker to register."),
    config: List[str] = typer.Option([], "--config", help="Broker config KEY=VALUE for every broker (repeatable), e.g. remote.log.storage.system.enable=true; kept for restarts."),
) -> None:
    """Start PostgreSQL and N brokers in the background and print the bootstrap list.

    Over a stopped cluster's directory it starts that cluster again (same node ids, ports and
    database); over one whose brokers or PostgreSQL are partly down (a broker killed) it starts
    only those and leaves the running ones alone; over a running one it refuses. If a step fails,
    what was started is stopped again.

    Example: kcli cluster start --brokers 3 --racks a,b,c --data-dir /var/tmp/kcli-cluster

    Example: kcli cluster start --config remote.log.storage.system.enable=true
    """
    from kcli.ops.cluster import StartRequest, check_configs, parse_racks
    from kcli.ops.cluster import start as start_cluster

    opts = options(ctx)
    req = StartRequest(brokers=brokers, racks=parse_racks(racks) if racks is not None else None,
                       object_store=object_store, base_port=base_port, timeout_s=timeout,
                       configs=check_configs(parse_key_values(config, "--config")) if config else None)
    result = start_cluster(_dir(data_dir), req, _progress(opts.verbose))
    cluster = result.cluster

    def table() -> None:
        whole = len(result.started_brokers) == len(cluster.brokers) and result.started_postgresql
        if not result.restarted:
            typer.echo(f"Started a {len(cluster.brokers)}-broker cluster in {cluster.data_dir}")
        elif whole:
            typer.echo(f"Restarted a {len(cluster.brokers)}-broker cluster in {cluster.data_dir}")
        else:
            ids = result.started_brokers
            parts = ([f"broker{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}"] if ids else []) + (
                ["PostgreSQL"] if result.started_postgresql else [])
            typer.echo(f"Restarted {' and '.join(parts)} of the {len(cluster.brokers)}-broker cluster in"
                       f" {cluster.data_dir}; the rest was running")
        typer.echo(f"PostgreSQL: {cluster.postgresql.url}")
        typer.echo(f"Object store: {cluster.object_store}")
        print_table([{"node_id": b.node_id, "rack": b.rack, "listener": b.listener, "pid": b.pid,
                      "metrics": b.metrics_url or "-", "log": b.log} for b in cluster.brokers],
                    [("NODE-ID", "node_id"), ("RACK", "rack"), ("LISTENER", "listener"), ("PID", "pid"),
                     ("METRICS", "metrics"), ("LOG", "log")])
        typer.echo(f"Bootstrap servers: {cluster.bootstrap}")

    render(result, opts.output, table)


@cluster_app.command("status")
def status(
    ctx: typer.Context,
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=_DIR_HELP),
) -> None:
    """Show whether PostgreSQL is up and, per broker, its process and registration.

    Exit 1 when PostgreSQL or any broker is down (or not registered).

    Example: kcli cluster status --data-dir /var/tmp/kcli-cluster -o json
    """
    from kcli.ops.cluster import status as cluster_status

    opts = options(ctx)
    result = cluster_status(_dir(data_dir))

    def table() -> None:
        typer.echo(f"Cluster: {result.data_dir}")
        typer.echo(f"PostgreSQL: {'up' if result.postgresql_up else 'down'} ({result.postgresql_url})")
        print_table([{"node_id": b.node_id, "rack": b.rack, "listener": b.listener, "pid": b.pid,
                      "alive": b.alive, "registered": b.registered, "metrics": b.metrics_url or "-"}
                     for b in result.brokers],
                    [("NODE-ID", "node_id"), ("RACK", "rack"), ("LISTENER", "listener"), ("PID", "pid"),
                     ("ALIVE", "alive"), ("REGISTERED", "registered"), ("METRICS", "metrics")])
        if result.up:
            typer.echo(f"Bootstrap servers: {result.bootstrap}")

    render(result, opts.output, table)
    if not result.up:
        hint = ""
        if any(not b.alive for b in result.brokers) or not result.postgresql_up:
            hint = f" (`kcli cluster start --data-dir {result.data_dir}` starts what is down)"
        sys.stderr.write(f"kcli: error: the cluster in {result.data_dir} is not up: {'; '.join(result.problems())}{hint}\n")
        raise typer.Exit(1)


@cluster_app.command("stop")
def stop(
    ctx: typer.Context,
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=_DIR_HELP),
    timeout: float = typer.Option(30.0, "--timeout", metavar="SECONDS", help="Seconds each broker gets to stop after SIGTERM before SIGKILL."),
) -> None:
    """Stop the brokers (SIGTERM, then SIGKILL after the timeout) and then PostgreSQL.

    Stopping a stopped cluster says so and exits 0. The directory is kept: `kcli cluster start`
    starts the same cluster again.

    Example: kcli cluster stop --data-dir /var/tmp/kcli-cluster
    """
    from kcli.ops.cluster import stop as stop_cluster

    opts = options(ctx)
    result = stop_cluster(_dir(data_dir), timeout, _progress(opts.verbose))

    def table() -> None:
        if result.already_stopped:
            typer.echo(f"The cluster in {result.data_dir} is already stopped.")
            return
        parts = []
        if result.stopped_brokers:
            parts.append(f"broker{'s' if len(result.stopped_brokers) > 1 else ''} "
                         f"{', '.join(map(str, result.stopped_brokers))}")
        if result.postgresql_stopped:
            parts.append("PostgreSQL")
        typer.echo(f"Stopped {' and '.join(parts)} in {result.data_dir}.")
        if result.killed_brokers:
            typer.echo(f"Killed (SIGKILL after {timeout:g} s): {', '.join(map(str, result.killed_brokers))}")

    render(result, opts.output, table)


def register(app: typer.Typer) -> None:
    app.add_typer(cluster_app, name="cluster")
