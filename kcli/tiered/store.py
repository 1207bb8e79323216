"""The broker's object store, as tiered storage finds it: the same one diskless topics use.

``kcli broker start --object-store URI`` (broker config ``diskless.storage.uri``), else the class
in ``diskless.storage.class.name``, else ``<data_dir>/objects``; settings under
``diskless.storage.<key>``. The rules live in :mod:`kcli.diskless.storage_setup`; this module
only gives tiered storage its own client of that store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kcli.broker.broker import Broker
    from plugins.objectstore.base import ObjectStorage


def object_store_for(broker: "Broker") -> "ObjectStorage":
    """A new client for the broker's object store (raises StorageBackendException or
    PluginError when it is misconfigured)."""
    from kcli.diskless.storage_setup import open_object_storage

    return open_object_storage(broker.config, broker.data_dir)
