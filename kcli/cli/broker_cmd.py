"""`kcli broker ...`: run the embedded broker in the foreground, read its metrics."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, List, Optional

import typer

from kcli.cli.common import coordinator_uri, options
from kcli.errors import UsageError

broker_app = typer.Typer(help="Run and inspect the embedded Kafka-compatible broker.", no_args_is_help=True)


@broker_app.command("start")
def start(
    ctx: typer.Context,
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Data directory (default: per-user, $KCLI_DATA_DIR)."),
    listen: Optional[str] = typer.Option(None, "--listen", help="HOST:PORT to listen on; port 0 picks a free one (default: the config's listeners, else 127.0.0.1:9092). Several listeners: --config listeners=PLAINTEXT://HOST:PORT,SASL_SSL://HOST:PORT."),
    config: List[str] = typer.Option([], "--config", help="Broker config key=value (repeatable); overrides the config file."),
    config_file: Optional[Path] = typer.Option(None, "--config-file", help="Kafka server.properties file (log.dirs, listeners, node.id, log.retention.hours, ...); flags and --config override it."),
    strict: bool = typer.Option(False, "--strict", help="Refuse config-file settings kcli does not implement instead of ignoring them."),
    object_store: Optional[str] = typer.Option(None, "--object-store", help="Object store for diskless and tiered data: file:///dir or s3://bucket/prefix."),
    coordinator: Optional[str] = typer.Option(None, "--coordinator", help="Batch coordinator of diskless topics: a SQLite database path, sqlite:///path.db or postgresql://user@host:port/database (default: SQLite in the data dir)."),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="Join the cluster whose shared state is in this PostgreSQL database: postgresql://USER@HOST:PORT/DB (docs/cluster.md)."),
    node_id: Optional[str] = typer.Option(None, "--node-id", help="This broker's node id (node.id), unique in the cluster."),
    rack: Optional[str] = typer.Option(None, "--rack", help="This broker's rack (broker.rack)."),
    log_level: str = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING or ERROR (docs/observability.md)."),
    log_format: str = typer.Option("text", "--log-format", help="text, or json: one JSON object per line for log shippers."),
    metrics_listen: Optional[str] = typer.Option(None, "--metrics-listen", help="HOST:PORT of a Prometheus endpoint (GET /metrics); config metrics.listen."),
    daemon: bool = typer.Option(False, "--daemon", "--detach", help="Run in the background (kafka-server-start.sh -daemon), log in DATA_DIR/broker.log; returns once it listens."),
) -> None:
    """Run a broker in the foreground until SIGINT/SIGTERM, or in the background with --daemon.

    Settings: flags over --config over --config-file.

    Settings of the file that kcli does not implement are listed once as ignored (--strict: refused).

    Example: kcli broker start --data-dir /tmp/kcli --listen 127.0.0.1:0

    Example: kcli broker start --config-file server.properties --strict

    Example: kcli broker start --data-dir /tmp/kcli --daemon --metrics-listen 127.0.0.1:9308 --log-format json
    """
    from kcli.broker.runner import configure_logging, default_data_dir, load_settings, run_foreground
    from kcli.config.server_properties import ignored_line

    opts = options(ctx)
    level, fmt = check_log_options(log_level, log_format)
    configure_logging(opts.verbose, level, fmt)
    extra = {"diskless.storage.uri": object_store} if object_store else {}
    extra.update(cluster_options(cluster, node_id, rack))
    if coordinator or cluster:
        from kcli.diskless.storage_setup import coordinator_uri_settings

        # In a cluster the batch coordinator's tables live in the cluster database by default.
        extra.update(coordinator_uri_settings(coordinator_uri(coordinator) or cluster))  # type: ignore[arg-type]
    settings = load_settings(config, config_file, extra, data_dir=data_dir, listen=listen, strict=strict)
    cfg = settings.config
    if cluster is not None and "node.id" not in cfg.explicit:
        raise UsageError("--cluster needs --node-id N (each broker of a cluster has its own node id)")
    if cluster is not None:
        from kcli.diskless.storage_setup import POSTGRES_COORDINATOR_CLASS, coordinator_class_name

        if coordinator_class_name(cfg) != POSTGRES_COORDINATOR_CLASS:
            raise UsageError("--cluster: diskless data is shared through a PostgreSQL batch coordinator; give "
                             "--coordinator postgresql://... or leave it out to use the cluster database")
    if cluster is not None:
        from kcli.cluster.factory import check_reachable
        from kcli.cluster.state import ClusterStoreError
        from kcli.errors import OperationError

        try:
            check_reachable(cfg)  # exit 1 before the data dir is made
        except ClusterStoreError as err:
            raise OperationError(str(err)) from None
    if cfg.get_bool("diskless.system.enable"):
        from kcli.diskless.storage_setup import check_plugin_classes

        check_plugin_classes(cfg)  # a bad store URI or class: exit 2 before the data dir is made
    if settings.ignored:
        sys.stderr.write(f"kcli: warning: {ignored_line(settings.ignored, str(config_file or '--config'))}\n")
    from kcli.broker.runner import metrics_address, resolve_listeners

    resolve_listeners(settings.listen, cfg)
    metrics_address(metrics_listen, cfg)
    if daemon:  # everything above checked here too: a bad flag is exit 2 now, not a failed background start
        from kcli.ops.broker_process import daemon_argv, start_daemon

        started = start_daemon(settings.data_dir or default_data_dir(), daemon_argv(sys.argv[1:]))
        render_status(opts, started, f"Started broker (pid {started.pid}) on {started.data_dir}")
        return
    raise typer.Exit(run_foreground(settings.data_dir or default_data_dir(), settings.listen, cfg, metrics_listen))


def check_log_options(level: str, fmt: str) -> tuple[str, str]:
    """--log-level / --log-format, case-insensitive; UsageError (exit 2) on anything else."""
    from kcli.broker.logsetup import LOG_FORMATS, LOG_LEVELS

    if level.upper() not in LOG_LEVELS:
        raise UsageError(f"--log-level expects one of {', '.join(LOG_LEVELS)}, got {level!r}")
    if fmt.lower() not in LOG_FORMATS:
        raise UsageError(f"--log-format expects one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    return level.upper(), fmt.lower()


def cluster_options(cluster: str | None, node_id: str | None, rack: str | None) -> dict[str, str]:
    """Broker configs from --cluster/--node-id/--rack; UsageError (exit 2) on a bad value."""
    out: dict[str, str] = {}
    if cluster is not None:
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(cluster)
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            raise UsageError(f"--cluster expects postgresql://USER@HOST:PORT/DB, got {cluster!r}") from None
        if parts.scheme not in ("postgresql", "postgres") or not parts.hostname or not parts.path.strip("/"):
            raise UsageError(f"--cluster expects postgresql://USER@HOST:PORT/DB, got {cluster!r}")
        out["kcli.cluster.url"] = cluster
    if node_id is not None:
        if not node_id.strip().isdigit() or int(node_id) > 2**31 - 1:
            raise UsageError(f"--node-id expects a number 0..2147483647, got {node_id!r}")
        out["node.id"] = str(int(node_id))
    if rack is not None:
        if not rack.strip() or any(c.isspace() or not c.isprintable() for c in rack):
            raise UsageError(f"--rack expects a non-empty name without spaces, got {rack!r}")
        out["broker.rack"] = rack
    return out


def render_status(opts: Any, st: Any, heading: str) -> None:
    from kcli.cli.render import print_fields, render

    def table() -> None:
        typer.echo(heading)
        print_fields({"pid": st.pid, "node id": st.node_id, "cluster id": st.cluster_id,
                      "listeners": ", ".join(st.listeners), "started": st.started, "uptime": f"{st.uptime_s:g} s",
                      "log": st.log or "-"})
        typer.echo(f"Bootstrap servers: {st.bootstrap}")

    render(st, opts.output, table)


_DIR_HELP = "Data directory of the broker (default: per-user, $KCLI_DATA_DIR)."


@broker_app.command("status")
def status(
    ctx: typer.Context,
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=_DIR_HELP),
) -> None:
    """Say whether a broker runs on the data dir: pid, listeners, node id, uptime.

    Exit 1 when no broker runs there.

    Example: kcli broker status --data-dir /tmp/kcli -o json
    """
    from kcli.broker.runner import default_data_dir
    from kcli.ops.broker_process import status as broker_status

    st = broker_status(data_dir or default_data_dir())
    render_status(options(ctx), st, f"Broker running on {st.data_dir}")


@broker_app.command("stop")
def stop(
    ctx: typer.Context,
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help=_DIR_HELP),
    timeout: float = typer.Option(30.0, "--timeout", help="Seconds the broker gets to stop after SIGTERM before SIGKILL."),
) -> None:
    """Stop the broker running on the data dir: SIGTERM, then SIGKILL after the timeout.

    Exit 1 when no broker runs there.

    Example: kcli broker stop --data-dir /tmp/kcli --timeout 60
    """
    from kcli.broker.runner import default_data_dir
    from kcli.cli.render import render
    from kcli.ops.broker_process import stop as stop_broker

    result = stop_broker(data_dir or default_data_dir(), timeout)

    def table() -> None:
        how = f"killed (SIGKILL after {timeout:g} s)" if result.killed else "stopped"
        typer.echo(f"Broker (pid {result.pid}) on {result.data_dir} {how} in {result.seconds:g} s.")

    render(result, options(ctx).output, table)


@broker_app.command("metrics")
def metrics(
    ctx: typer.Context,
    node_id: Optional[int] = typer.Option(None, "--node-id", min=0, help="Only this broker of the cluster (default: every live broker)."),
) -> None:
    """Show running brokers' counters, latencies (P50/P99) and gauges: diskless uploads,
    commits, reads (GETs per Fetch), cache and garbage collection.

    Against a cluster (a bootstrap list) every live broker is shown,
    each under its own heading (-o json: a list, one document per broker);
    --node-id picks one.

    Example: kcli broker metrics -b 127.0.0.1:9092 -o json

    Example: kcli broker metrics -b host1:9092,host2:9092,host3:9092 --node-id 2
    """
    from kcli.cli.broker_metrics import run

    run(options(ctx), node_id)


def register(app: typer.Typer) -> None:
    from kcli.cli import users_cmd

    users_cmd.register(broker_app)  # kcli broker users add|list|delete
    app.add_typer(broker_app, name="broker")
