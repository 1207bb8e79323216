"""The broker's object store, as tiered storage finds it: the same one diskless topics use.

``kcli broker start --object-store URI`` (broker config ``diskless.storage.uri``), else the class
in ``diskless.storage.class.name``, else ``<data_dir>/objects``; settings under
``diskless.storage.<key>``. The rules live in :mod:`kcli.diskless.storage_setup`; this module
only gives tiered storage its own client of that store.

In a cluster that default would put each broker's remote segments under its own data dir, where
no other broker sees them and a lost disk takes them along: a cluster broker with tiered storage
on must name a shared store (:func:`check_shared`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

RSM_CLASS = "plugins.rsm.object_store.ObjectStoreRemoteStorageManager"
RSM_PREFIX = "remote.log.storage.manager.impl."

if TYPE_CHECKING:
    from kcli.broker.broker import Broker
    from kcli.config.broker_config import BrokerConfig
    from plugins.objectstore.base import ObjectStorage


def object_store_for(broker: "Broker") -> "ObjectStorage":
    """A new client for the broker's object store (raises StorageBackendException or
    PluginError when it is misconfigured)."""
    from kcli.diskless.storage_setup import open_object_storage

    return open_object_storage(broker.config, broker.data_dir)


SHARED_STORE_NEEDED = (
    "tiered storage in a cluster needs an object store every broker shares: start each broker with the same "
    "--object-store URI (or set remote.log.storage.manager.impl.uri); the default <data-dir>/objects is this "
    "broker's own")


def uses_data_dir(config: "BrokerConfig") -> bool:
    """Whether the default RemoteStorageManager would keep segments in ``<data_dir>/objects``."""
    from kcli.diskless.storage_setup import LOCAL_STORAGE_CLASS, STORAGE_PREFIX

    if config.get_str("remote.log.storage.manager.class.name") != RSM_CLASS:
        return False  # another plugin: where it writes is its own business
    if config.prefixed(RSM_PREFIX).get("uri"):
        return False
    if config.get_str("diskless.storage.uri"):
        return False
    cls = config.get_str("diskless.storage.class.name") or LOCAL_STORAGE_CLASS
    return cls == LOCAL_STORAGE_CLASS and "root" not in config.prefixed(STORAGE_PREFIX)


def check_shared(broker: "Broker") -> None:
    """Refuse to start tiered storage on a cluster broker whose remote segments would stay in
    its own data dir (DataDirError: one `kcli: error:` line, exit 1)."""
    if broker.metadata.single_broker or not uses_data_dir(broker.config):
        return
    from kcli.broker.broker import DataDirError

    raise DataDirError(SHARED_STORE_NEEDED)
