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
    from kcli.broker.broker_config import BrokerConfig
    from plugins.coordinator.base import BatchCoordinator
    from plugins.objectstore.base import ObjectStorage

LOCAL_STORAGE_CLASS = "plugins.objectstore.local.LocalObjectStorage"
SQLITE_COORDINATOR_CLASS = "plugins.coordinator.sqlite.SqliteBatchCoordinator"
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
            from_uri(uri).close()
        except StorageBackendException as err:  # a malformed setting: a config error (exit 2)
            raise PluginError(str(err)) from None
    else:
        load_class(config.get_str("diskless.storage.class.name") or LOCAL_STORAGE_CLASS, ObjectStorage)
    load_class(config.get_str("diskless.coordinator.class.name") or SQLITE_COORDINATOR_CLASS, BatchCoordinator)


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


def open_coordinator(config: "BrokerConfig", data_dir: Path) -> "BatchCoordinator":
    from plugins.coordinator.base import BatchCoordinator

    name = config.get_str("diskless.coordinator.class.name") or SQLITE_COORDINATOR_CLASS
    cls = load_class(name, BatchCoordinator)
    settings = config.prefixed(COORDINATOR_PREFIX)
    if name == SQLITE_COORDINATOR_CLASS and "path" not in settings:
        settings = {**settings, "path": str(default_coordinator_path(data_dir))}
    coordinator = cls()
    coordinator.configure(settings)
    return coordinator
