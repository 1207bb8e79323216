"""Build the diskless plugins (object storage, batch coordinator) from broker configs.

Kept apart from the engine so the rules about which setting wins live in one place:
``diskless.storage.uri`` (``kcli broker start --object-store``) beats the class name; settings
under ``diskless.storage.`` / ``diskless.coordinator.`` go to the plugin's ``configure``; with
nothing set, the broker keeps objects in ``<data_dir>/objects`` and coordinator state in
``<data_dir>/diskless/coordinator.db`` so a single node works out of the box.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from plugins.loader import load_class

if TYPE_CHECKING:
    from kcli.config.broker_config import BrokerConfig
    from plugins.coordinator.base import BatchCoordinator
    from plugins.objectstore.base import ObjectStorage

LOCAL_STORAGE_CLASS = "plugins.objectstore.local.LocalObjectStorage"
SQLITE_COORDINATOR_CLASS = "plugins.coordinator.sqlite.SqliteBatchCoordinator"
POSTGRES_COORDINATOR_CLASS = "plugins.coordinator.postgresql.PostgresBatchCoordinator"
STORAGE_PREFIX = "diskless.storage."
COORDINATOR_PREFIX = "diskless.coordinator."


def default_objects_dir(data_dir: Path) -> Path:
    return Path(data_dir) / "objects"


def default_coordinator_path(data_dir: Path) -> Path:
    return Path(data_dir) / "diskless" / "coordinator.db"


def check_plugin_classes(config: "BrokerConfig") -> None:
    """Fail at broker start (one line) when a configured class cannot load or the object store
    URI is malformed; nothing is opened or contacted here."""
    from plugins.coordinator.base import BatchCoordinator
    from plugins.objectstore import from_uri
    from plugins.objectstore.base import ObjectStorage

    uri = config.get_str("diskless.storage.uri")
    if uri:
        from plugins.loader import PluginError
        from plugins.objectstore.base import StorageBackendException

        try:
            storage = from_uri(uri)
            settings = config.prefixed(STORAGE_PREFIX)
            if settings:  # e.g. socket.timeout.ms=abc: refused here, before anything is contacted
                storage.configure(settings)
            storage.close()
        except StorageBackendException as err:  # a malformed setting: a config error (exit 2)
            raise PluginError(str(err)) from None
    else:
        load_class(config.get_str("diskless.storage.class.name") or LOCAL_STORAGE_CLASS, ObjectStorage)
    load_class(coordinator_class_name(config), BatchCoordinator)


def open_object_storage(config: "BrokerConfig", data_dir: Path) -> "ObjectStorage":
    """The store WAL objects go to; see the module docstring for precedence."""
    from plugins.objectstore import from_uri
    from plugins.objectstore.base import ObjectStorage

    settings = config.prefixed(STORAGE_PREFIX)
    uri = config.get_str("diskless.storage.uri")
    if uri:
        storage = from_uri(uri)
        if settings:
            storage.configure(settings)
        return storage
    name = config.get_str("diskless.storage.class.name") or LOCAL_STORAGE_CLASS
    cls = load_class(name, ObjectStorage)
    storage = cls()
    if name == LOCAL_STORAGE_CLASS and "root" not in settings:
        settings = {**settings, "root": str(default_objects_dir(data_dir))}
    storage.configure(settings)
    return storage


def coordinator_class_name(config: "BrokerConfig") -> str:
    """The class name if set; else a ``postgresql://`` (``postgres://``) ``diskless.coordinator.url``
    picks PostgreSQL; else SQLite (the single-node default)."""
    name = config.get_str("diskless.coordinator.class.name")
    if name:
        return name
    url = config.get_str("diskless.coordinator.url") or ""
    if url.split("://", 1)[0].lower() in ("postgresql", "postgres") and "://" in url:
        return POSTGRES_COORDINATOR_CLASS
    return SQLITE_COORDINATOR_CLASS


def coordinator_uri_settings(uri: str) -> dict[str, str]:
    """Broker configs for ``kcli broker start --coordinator URI``: ``sqlite:///abs/path.db`` or
    ``postgresql://user@host:port/db``; anything else is a usage error (exit 2)."""
    from urllib.parse import unquote, urlsplit

    from kcli.errors import UsageError

    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme in ("postgresql", "postgres") and parts.netloc:
        return {"diskless.coordinator.class.name": POSTGRES_COORDINATOR_CLASS, "diskless.coordinator.url": uri}
    path = unquote(parts.path)
    if scheme == "sqlite" and parts.netloc in ("", "localhost") and path.startswith("/") and not path.endswith("/"):
        return {"diskless.coordinator.class.name": SQLITE_COORDINATOR_CLASS, "diskless.coordinator.path": path}
    raise UsageError(f"--coordinator {uri!r}: expected sqlite:///absolute/path.db or postgresql://user@host:port/database")


def open_coordinator(config: "BrokerConfig", data_dir: Path) -> "BatchCoordinator":
    from plugins.coordinator.base import BatchCoordinator

    name = coordinator_class_name(config)
    cls = load_class(name, BatchCoordinator)
    settings = config.prefixed(COORDINATOR_PREFIX)
    if name == SQLITE_COORDINATOR_CLASS and "path" not in settings:
        settings = {**settings, "path": str(default_coordinator_path(data_dir))}
    coordinator = cls()
    coordinator.configure(settings)
    return coordinator


def storage_configured(config: "BrokerConfig") -> bool:
    """An operator chose a store (URI or class): it is probed at start even before any diskless
    topic exists, so a missing bucket is reported when the broker starts, not at first use."""
    return bool(config.get_str("diskless.storage.uri")) or "diskless.storage.class.name" in config.explicit


def probe_object_storage(config: "BrokerConfig", data_dir: Path) -> None:
    """Open the configured store, write/read/delete a probe object, close it; raises
    StorageBackendException naming the store and the failing operation."""
    storage = open_object_storage(config, data_dir)
    try:
        storage.probe()
    finally:
        storage.close()
