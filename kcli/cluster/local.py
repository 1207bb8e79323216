"""The single-node store: the metadata log in the data dir; this broker is the whole cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kcli.coordinator.group.offsets import OffsetStore
from kcli.coordinator.transaction.state import TransactionLog
from kcli.metadata.metadata_log import ClusterState, MetadataLog
from kcli.cluster.state import BrokerRegistration, RecordsListener, endpoints_of
from kcli.tiered.metadata import RemoteLogMetadataStore


class LocalClusterStore:
    """Wraps :class:`MetadataLog`; registrations are this broker only; it is always controller."""

    single_broker = True

    def __init__(self, data_dir: Path, node_id: int | None = None) -> None:
        self.log = MetadataLog(Path(data_dir))
        self._node_id = node_id
        self._listener: RecordsListener | None = None
        self._me: BrokerRegistration | None = None

    @property
    def state(self) -> ClusterState:
        return self.log.state

    @property
    def path(self) -> Path:
        return self.log.path

    def open(self) -> ClusterState:
        return self.log.open()

    def set_listener(self, listener: RecordsListener | None) -> None:
        self._listener = listener

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        records = list(records)
        self.log.append(records)
        if records and self._listener is not None:
            self._listener(records)

    def poll(self) -> list[dict[str, Any]]:
        return []

    def publish_offsets(self, changes: list[Any]) -> None:
        pass  # no other broker

    def set_offsets_listener(self, listener: Any, on_gap: Any = None) -> None:
        pass

    def register_broker(self, node_id: int, rack: str | None, host: str, port: int,
                        listeners: list[dict[str, Any]] | None = None) -> None:
        self._me = BrokerRegistration(node_id, host, port, rack, listeners=endpoints_of(listeners))

    def renew_lease(self) -> None:
        pass

    def live_brokers(self) -> list[BrokerRegistration]:
        return [self._me] if self._me is not None else []

    def partition_host(self, leader: int) -> int:
        if self._node_id is not None:  # known before registration: logs open before the listener
            return self._node_id
        return self._me.node_id if self._me is not None else leader

    def offset_store(self, data_dir: Path) -> OffsetStore:
        return OffsetStore(Path(data_dir) / "__consumer_offsets")

    def transaction_store(self, data_dir: Path) -> TransactionLog:
        return TransactionLog(Path(data_dir) / "__transaction_state")

    def remote_log_metadata(self, data_dir: Path) -> RemoteLogMetadataStore:
        return RemoteLogMetadataStore(Path(data_dir))  # <data_dir>/__remote_log_metadata, as always

    def is_controller(self) -> bool:
        return True

    def controller_id(self) -> int:
        return self._me.node_id if self._me is not None else -1

    async def run(self, stopping: Callable[[], bool]) -> None:
        await asyncio.sleep(0)

    def close(self) -> None:
        self.log.close()
