"""The cluster-state interface the broker uses, whatever holds the state.

The broker never asks which implementation it runs on: a local store (one broker, the metadata
log in its data dir) and a PostgreSQL store (several brokers, one database) answer the same calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kcli.metadata.metadata_log import ClusterState

if TYPE_CHECKING:
    from kcli.coordinator.group.offsets import CommittedOffsetStore
    from kcli.coordinator.transaction.state import TransactionLog
    from kcli.tiered.metadata import RemoteLogMetadata

# Called with records after they were applied to the state, whether this broker appended them or
# learned them from another broker: the broker's one path for acting on metadata changes.
RecordsListener = Callable[[list[dict[str, Any]]], None]
# (topic id, partition, high watermark, log start offset) of diskless partitions another broker moved.
OffsetChange = tuple[uuid.UUID, int, int, int]
OffsetsListener = Callable[[list[OffsetChange]], None]


class ClusterStoreError(Exception):
    """The shared state cannot be reached or used (start-up refuses with this message)."""


class NodeIdInUseError(ClusterStoreError):
    """Another live broker process holds this node id's registration lease."""


def endpoints_of(listeners: list[dict[str, Any]] | None) -> tuple[tuple[str, str, int], ...]:
    """Registered listener entries ({name, host, port, ...}, as stored in JSON) as tuples."""
    out = []
    for entry in listeners or []:
        try:
            out.append((str(entry["name"]), str(entry["host"]), int(entry["port"])))
        except (KeyError, TypeError, ValueError):
            continue  # a row written by something else: skip the entry, keep the broker
    return tuple(out)


@dataclass(frozen=True)
class BrokerRegistration:
    """A broker as Metadata responses list it (Kafka's RegisterBrokerRecord, reduced)."""

    node_id: int
    host: str
    port: int
    rack: str | None = None
    incarnation: str = ""
    # Every listener as (name, host, port); empty: only the one above, whatever the listener.
    listeners: tuple[tuple[str, str, int], ...] = ()

    def endpoint(self, listener: str) -> tuple[str, int] | None:
        """Where clients of ``listener`` reach this broker; None if it has no such listener
        (Kafka then leaves the broker out of the Metadata answer)."""
        if not self.listeners:
            return self.host, self.port
        for name, host, port in self.listeners:
            if name == listener:
                return host, port
        return None


@dataclass
class StoreSettings:
    """Timing of leases and catch-up; defaults follow Kafka's broker.heartbeat.interval.ms and
    broker.session.timeout.ms, so a dead broker leaves Metadata within ~10 s."""

    session_timeout_ms: int = 9000
    heartbeat_interval_ms: int = 2000
    poll_interval_ms: int = 1000  # fallback catch-up when a NOTIFY is missed
    connect_timeout_s: int = 5
    statement_timeout_ms: int = 5000
    listen: bool = True  # LISTEN/NOTIFY wake-ups (polling always runs as the fallback)
    extra: dict[str, Any] = field(default_factory=dict)


class ClusterStateStore(Protocol):
    """What the broker needs from shared cluster state."""

    state: ClusterState
    # True when no other broker can apply these records (the local metadata log): then what a
    # broker keeps in its data dir (e.g. tiered segments in <data_dir>/objects) is not lost to
    # the others, which a cluster must refuse (kcli.tiered.store.check_shared).
    single_broker: bool

    def open(self) -> ClusterState:
        """Load every record so far into :attr:`state` (raises ClusterStoreError)."""

    def set_listener(self, listener: RecordsListener | None) -> None:
        """Who hears about applied records (local appends and records learned from others)."""

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        """Validate, then durably write ``records`` as one unit after every record written
        before them, then apply them. Raises InvalidRecordError / BrokerError (refused, nothing
        written) or a retriable BrokerError when the store cannot be reached."""

    def poll(self) -> list[dict[str, Any]]:
        """Apply records other brokers appended since the last call; returns them."""

    def publish_offsets(self, changes: list[OffsetChange]) -> None:
        """Tell the other brokers that diskless partitions moved on (they serve them too, and a
        fetch waiting at the log end should wake). Never blocks; best effort: a lost message is
        covered by their periodic refresh from the batch coordinator."""

    def set_offsets_listener(self, listener: OffsetsListener | None,
                             on_gap: Callable[[], None] | None = None) -> None:
        """Who hears of offsets other brokers published (called on the event loop); ``on_gap``
        is called when messages may have been missed (the channel was down and is back), so the
        receiver re-reads its offsets from the batch coordinator at once instead of waiting for
        its periodic refresh."""

    def register_broker(self, node_id: int, rack: str | None, host: str, port: int,
                        listeners: list[dict[str, Any]] | None = None) -> None:
        """Register this broker (``listeners``: every listener as {name, host, port,
        security_protocol}; the first is host:port); NodeIdInUseError if another live process
        holds ``node_id``."""

    def renew_lease(self) -> None:
        """Extend this broker's registration lease."""

    def live_brokers(self) -> list[BrokerRegistration]:
        """Brokers with a live lease, by node id (cached; refreshed by :meth:`run`)."""

    def partition_host(self, leader: int) -> int:
        """The node that holds the log of a classic partition whose PartitionRecord names
        ``leader``: that broker in a cluster; this broker alone holds every log of a single-node
        data dir, whatever node.id it ran with when the topic was made."""

    def offset_store(self, data_dir: Path) -> CommittedOffsetStore:
        """Where the group coordinator keeps committed offsets (not opened yet): the data dir's
        offsets log on one broker, the shared database in a cluster, so that no commit is lost
        with a broker's disk (:class:`kcli.coordinator.group.offsets.CommittedOffsetStore`)."""

    def transaction_store(self, data_dir: Path) -> TransactionLog:
        """Where the transaction coordinator keeps its state (not opened yet): the transaction
        state log in the data dir on one broker (:class:`kcli.coordinator.transaction.coordinator.TransactionLog`),
        the shared database in a cluster (``shared`` true: ids are claimed one by one, so that a
        transaction survives its coordinator's death)."""

    def remote_log_metadata(self, data_dir: Path) -> RemoteLogMetadata:
        """The remote log segment metadata of tiered topics (the RLMM; not opened yet): the data
        dir's event file on one broker, the shared database in a cluster, so that no tiered
        segment is lost with a broker's disk (:class:`kcli.tiered.metadata.RemoteLogMetadata`)."""

    def is_controller(self) -> bool:
        """Whether this broker is the one that makes background decisions now."""

    def controller_id(self) -> int:
        """Node id of the current controller, or -1 when none is known."""

    async def run(self, stopping: Callable[[], bool]) -> None:
        """Background work until ``stopping()``: catch-up, lease renewal, controller election."""

    def close(self) -> None:
        """Give up the registration and the controller role, release connections."""
