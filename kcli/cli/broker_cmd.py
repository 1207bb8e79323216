"""`kcli broker ...`: run the embedded broker in the foreground, read its metrics."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from kcli.cli.common import options
from kcli.errors import UsageError

broker_app = typer.Typer(help="Run and inspect the embedded Kafka-compatible broker.", no_args_is_help=True)


@broker_app.command("start")
def start(
    ctx: typer.Context,
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Data directory (default: per-user, $KCLI_DATA_DIR)."),
    listen: Optional[str] = typer.Option(None, "--listen", help="HOST:PORT to listen on (default 127.0.0.1:9092); port 0 picks a free one. Several listeners: --config listeners=PLAINTEXT://HOST:PORT,SASL_SSL://HOST:PORT."),
    config: List[str] = typer.Option([], "--config", help="Broker config key=value (repeatable)."),
    config_file: Optional[Path] = typer.Option(None, "--config-file", help="Java-style properties file of broker configs."),
    object_store: Optional[str] = typer.Option(None, "--object-store", help="Object store for diskless and tiered data: file:///dir or s3://bucket/prefix."),
    coordinator: Optional[str] = typer.Option(None, "--coordinator", help="Batch coordinator of diskless topics: sqlite:///path.db or postgresql://user@host:port/database (default: SQLite in the data dir)."),
    cluster: Optional[str] = typer.Option(None, "--cluster", help="Join the cluster whose shared state is in this PostgreSQL database: postgresql://USER@HOST:PORT/DB (docs/cluster.md)."),
    node_id: Optional[str] = typer.Option(None, "--node-id", help="This broker's node id (node.id), unique in the cluster."),
    rack: Optional[str] = typer.Option(None, "--rack", help="This broker's rack (broker.rack)."),
) -> None:
    """Run a broker in the foreground until SIGINT/SIGTERM.

    Example: kcli broker start --data-dir /tmp/kcli --listen 127.0.0.1:0
    """
    from kcli.broker.runner import build_config, configure_logging, default_data_dir, run_foreground

    opts = options(ctx)
    configure_logging(opts.verbose)
    extra = {"diskless.storage.uri": object_store} if object_store else {}
    extra.update(cluster_options(cluster, node_id, rack))
    if coordinator or cluster:
        from kcli.diskless.storage_setup import coordinator_uri_settings

        # In a cluster the batch coordinator's tables live in the cluster database by default.
        extra.update(coordinator_uri_settings(coordinator or cluster))  # type: ignore[arg-type]
    cfg = build_config(config, config_file, extra)
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
    raise typer.Exit(run_foreground(data_dir or default_data_dir(), listen, cfg))


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
