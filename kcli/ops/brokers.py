"""Which broker of a cluster a kcli-only request goes to.

Kafka clients find the right broker themselves; kcli's own APIs (DeletePartitions, the admin API
behind ``kcli broker metrics`` and ``kcli diskless``) travel over
:class:`~kcli.protocol.client.WireClient`, which talks to one address. Sent to "the first
bootstrap entry" they would hit a dead broker, or a broker that does not hold the partition in
question. So, as a Kafka admin client does, kcli asks the cluster (DescribeCluster through
librdkafka, which fails over along the whole bootstrap list) and then picks:

* a per-partition request → the broker hosting the partition (Metadata's leader);
* a group's or a transactional id's request → its coordinator (FindCoordinator first);
* a cluster-wide decision (garbage collection) → the controller, the one broker that runs the
  background work it would otherwise race with;
* a cluster-wide read → the controller too, else any live broker.

A one-broker cluster is addressed by the bootstrap address the operator gave, not the address
the broker advertises (they differ behind NAT or a port forward).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from confluent_kafka import TopicCollection

from kcli.errors import KafkaApiError, OperationError
from kcli.ops.connection import Connection, admin


@dataclass(frozen=True)
class BrokerInfo:
    """One live broker as DescribeCluster lists it."""

    node_id: int
    host: str
    port: int
    rack: str | None = None

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass
class ClusterView:
    """The live brokers (sorted by node id) and the controller's node id (-1: unknown)."""

    brokers: list[BrokerInfo]
    controller_id: int
    bootstrap: str  # what the operator gave, for the one-broker case

    def address(self, broker: BrokerInfo) -> str:
        if len(self.brokers) == 1:
            return first_bootstrap(self.bootstrap)
        return broker.address

    def broker(self, node_id: int) -> BrokerInfo:
        for b in self.brokers:
            if b.node_id == node_id:
                return b
        live = ", ".join(str(b.node_id) for b in self.brokers) or "none"
        raise OperationError(f"broker {node_id} is not a live broker of the cluster at {self.bootstrap} "
                             f"(live: {live})")

    def controller(self) -> BrokerInfo:
        """The controller, else (none elected yet) the lowest live node id."""
        for b in self.brokers:
            if b.node_id == self.controller_id:
                return b
        if not self.brokers:
            raise OperationError(f"the cluster at {self.bootstrap} lists no live broker")
        return self.brokers[0]


def first_bootstrap(bootstrap: str) -> str:
    return bootstrap.split(",")[0].strip()


def cluster_view(conn: Connection) -> ClusterView:
    """DescribeCluster from whichever bootstrap broker answers."""
    client = admin(conn)
    desc = client.wait(client.describe_cluster(request_timeout=conn.timeout_s), "describe cluster")
    brokers = sorted((BrokerInfo(n.id, n.host, n.port, n.rack) for n in desc.nodes), key=lambda b: b.node_id)
    controller = desc.controller.id if desc.controller is not None else -1
    return ClusterView(brokers, controller, conn.bootstrap)


def partition_hosts(conn: Connection, topic: str) -> dict[int, int | None]:
    """partition → node id of its leader (the broker hosting a classic partition's log); None
    while it is offline (its host is down)."""
    client = admin(conn)
    future = client.describe_topics(TopicCollection([topic]), request_timeout=conn.timeout_s)[topic]
    try:
        desc = client.wait(future, f"topic '{topic}'")
    except KafkaApiError as err:
        if err.name == "UNKNOWN_TOPIC_OR_PARTITION":
            raise KafkaApiError(err.name, f"topic '{topic}' does not exist") from None
        raise
    return {p.id: (p.leader.id if p.leader is not None and p.leader.id >= 0 else None) for p in desc.partitions}


def controller_address(conn: Connection) -> str:
    """Where a cluster-wide kcli request goes (see the module docstring)."""
    view = cluster_view(conn)
    return view.address(view.controller())


def partition_address(conn: Connection, topic: str, partition: int) -> str:
    """Where a request for one partition goes: the broker hosting it."""
    hosts = partition_hosts(conn, topic)
    if partition not in hosts:
        raise KafkaApiError("UNKNOWN_TOPIC_OR_PARTITION", f"topic '{topic}' has no partition {partition}")
    host = hosts[partition]
    if host is None:
        raise KafkaApiError("LEADER_NOT_AVAILABLE", f"{topic}-{partition} is offline: its host is down")
    view = cluster_view(conn)
    return view.address(view.broker(host))


def coordinator_client(conn: Connection, key: str, key_type: int, what: str) -> Any:
    """kcli's protocol client connected to the coordinator of a group (``key_type`` 0) or a
    transactional id (1), found with FindCoordinator (retried while it is not available)."""
    import time

    from kcli.protocol.errors import error_name

    deadline = time.monotonic() + conn.timeout_s
    while True:
        with wire_client(conn) as wire:
            found = wire.request(10, 3, {"key": key, "key_type": key_type})
        if not found.error_code:
            break
        name = error_name(int(found.error_code))
        if name not in ("COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS") or time.monotonic() > deadline:
            raise KafkaApiError(name, f"{what} '{key}': {found.error_message or 'no coordinator'}",
                                int(found.error_code))
        time.sleep(0.2)
    return wire_client(conn, f"{found.host}:{found.port}")


def wire_client(conn: Connection, address: str | None = None) -> Any:
    """kcli's own protocol client to ``address`` (default: the first bootstrap broker), with the
    connection's timeout and security settings (TLS, SASL) — for the requests librdkafka cannot
    send (DeletePartitions, OffsetDelete, the transaction tools)."""
    from kcli.protocol.client import WireClient

    return WireClient(address or first_bootstrap(conn.bootstrap), timeout=conn.timeout_s, properties=conn.properties)
