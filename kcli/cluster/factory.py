"""Which cluster-state store a broker uses: PostgreSQL with ``--cluster URL``, else the local log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kcli.cluster.state import ClusterStateStore, StoreSettings

CLUSTER_URL = "kcli.cluster.url"  # set by `kcli broker start --cluster URL`


def settings_from_config(config: Any) -> StoreSettings:
    return StoreSettings(
        session_timeout_ms=config.get_int("broker.session.timeout.ms"),
        heartbeat_interval_ms=config.get_int("broker.heartbeat.interval.ms"),
    )


def open_store(config: Any, data_dir: Path) -> ClusterStateStore:
    """The store for this broker (not opened yet); the broker only uses the interface."""
    url = config.prefixed("kcli.cluster.").get("url")
    if url:
        from kcli.cluster.postgres import PostgresClusterStore

        return PostgresClusterStore(url, config.get_int("node.id"), settings_from_config(config))
    from kcli.cluster.local import LocalClusterStore

    return LocalClusterStore(data_dir, config.get_int("node.id"))


def check_reachable(config: Any) -> None:
    """Raise ClusterStoreError unless the configured shared store answers (within its connect
    timeout); called by `kcli broker start` before the data dir is made, so an unreachable
    database changes nothing on disk. The local store is always reachable."""
    url = config.prefixed("kcli.cluster.").get("url")
    if not url:
        return
    import psycopg

    from kcli.cluster.postgres import reason, redact
    from kcli.cluster.state import ClusterStoreError

    settings = settings_from_config(config)
    try:
        with psycopg.connect(url, connect_timeout=settings.connect_timeout_s, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as err:
        raise ClusterStoreError(f"cannot use the cluster database {redact(url)}: {reason(err)}") from None
