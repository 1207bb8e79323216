"""`kcli broker ...`: run the embedded broker in the foreground, read its metrics."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from kcli.cli.common import options

broker_app = typer.Typer(help="Run and inspect the embedded Kafka-compatible broker.", no_args_is_help=True)


@broker_app.command("start")
def start(
    ctx: typer.Context,
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Data directory (default: per-user, $KCLI_DATA_DIR)."),
    listen: str = typer.Option("127.0.0.1:9092", "--listen", help="HOST:PORT to listen on; port 0 picks a free one."),
    config: List[str] = typer.Option([], "--config", help="Broker config key=value (repeatable)."),
    config_file: Optional[Path] = typer.Option(None, "--config-file", help="Java-style properties file of broker configs."),
    object_store: Optional[str] = typer.Option(None, "--object-store", help="Object store for diskless and tiered data: file:///dir or s3://bucket/prefix."),
) -> None:
    """Run a broker in the foreground until SIGINT/SIGTERM.

    Example: kcli broker start --data-dir /tmp/kcli --listen 127.0.0.1:0
    """
    from kcli.broker.runner import build_config, configure_logging, default_data_dir, run_foreground

    opts = options(ctx)
    configure_logging(opts.verbose)
    extra = {"diskless.storage.uri": object_store} if object_store else {}
    cfg = build_config(config, config_file, extra)
    if cfg.get_bool("diskless.system.enable"):
        from kcli.diskless.storage_setup import check_plugin_classes

        check_plugin_classes(cfg)  # a bad store URI or class: exit 2 before the data dir is made
    raise typer.Exit(run_foreground(data_dir or default_data_dir(), listen, cfg))


@broker_app.command("metrics")
def metrics(ctx: typer.Context) -> None:
    """Show a running broker's counters, latencies (P50/P99) and gauges: diskless uploads,
    commits, reads (GETs per Fetch), cache and garbage collection.

    Example: kcli broker metrics -b 127.0.0.1:9092 -o json
    """
    from kcli.cli.broker_metrics import run

    run(options(ctx))


def register(app: typer.Typer) -> None:
    from kcli.cli import users_cmd

    users_cmd.register(broker_app)  # kcli broker users add|list|delete
    app.add_typer(broker_app, name="broker")
