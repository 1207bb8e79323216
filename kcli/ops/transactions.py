"""Transactions of a running broker, as kafka-transactions.sh shows and fixes them: ListTransactions,
DescribeTransactions, DescribeProducers, and an abort of a hanging transaction with
WriteTxnMarkers (what Kafka's Admin.abortTransaction sends to the partition's leader).

confluent-kafka's admin client has none of these APIs, so they travel over
:class:`~kcli.protocol.client.WireClient` to the first bootstrap broker (kcli coordinates every
transactional id, and hosts every classic partition, on the broker that owns the data dir).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kcli.errors import KafkaApiError, OperationError, UsageError
from kcli.ops.connection import Connection

STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort",
          "PrepareEpochFence", "Dead")


@dataclass
class TransactionListing:
    transactional_id: str
    producer_id: int
    state: str


@dataclass
class TransactionDescription:
    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    start_time_ms: int  # -1 without an open transaction (the broker sends 0 then)
    partitions: list[str] = field(default_factory=list)  # topic-partition


@dataclass
class ProducerDescription:
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int


@dataclass
class AbortResult:
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int


def _client(conn: Connection, address: str | None = None) -> Any:
    """kcli's own protocol client with the context's security settings (TLS, SASL), as every
    other kcli request goes (to ``address``, else the first bootstrap broker)."""
    from kcli.ops.brokers import wire_client

    return wire_client(conn, address)


def _partition_client(conn: Connection, topic: str, partition: int) -> Any:
    """A client of the broker hosting ``topic``-``partition`` (in a cluster, another may not)."""
    from kcli.ops.brokers import partition_address

    return _client(conn, partition_address(conn, topic, partition))


def _check(code: int, message: str | None = None) -> None:
    if code:
        from kcli.protocol.errors import error_name

        raise KafkaApiError(error_name(int(code)), message or "", int(code))


def list_transactions(conn: Connection, states: list[str] | None = None, producer_ids: list[int] | None = None,
                      duration_ms: int | None = None) -> list[TransactionListing]:
    """Transactional ids the brokers coordinate, filtered as kafka-transactions.sh list filters
    (every live broker is asked, as Kafka's admin client does)."""
    for s in states or []:
        if s not in STATES:
            raise UsageError(f"--state must be one of: {', '.join(STATES)}, got {s!r}")
    if duration_ms is not None and duration_ms < 0:
        raise UsageError(f"--duration-filter expects milliseconds >= 0, got {duration_ms}")
    from kcli.ops.brokers import cluster_view

    view = cluster_view(conn)
    found: dict[str, TransactionListing] = {}
    for broker in view.brokers:
        with _client(conn, view.address(broker)) as client:
            resp = client.request(66, 1, {"state_filters": list(states or []),
                                          "producer_id_filters": list(producer_ids or []),
                                          "duration_filter": -1 if duration_ms is None else duration_ms})
        _check(int(resp.error_code))
        for t in resp.transaction_states:
            found[t.transactional_id] = TransactionListing(t.transactional_id, int(t.producer_id), t.transaction_state)
    return [found[tid] for tid in sorted(found)]


def describe_transaction(conn: Connection, transactional_id: str) -> TransactionDescription:
    if not transactional_id:
        raise UsageError("--transactional-id must not be empty")
    from kcli.ops.brokers import coordinator_client

    with coordinator_client(conn, transactional_id, 1, "transactional id") as client:
        resp = client.request(65, 0, {"transactional_ids": [transactional_id]})
    s = resp.transaction_states[0]
    _check(int(s.error_code), f"transactional id {transactional_id!r}")
    start = s.transaction_start_time
    return TransactionDescription(
        s.transactional_id, s.transaction_state, int(s.producer_id), int(s.producer_epoch),
        int(s.transaction_timeout.total_seconds() * 1000),
        int(start.timestamp() * 1000) if start is not None and start.timestamp() > 0 else -1,
        [f"{t.topic}-{p}" for t in s.topics for p in t.partitions])


def describe_producers(conn: Connection, topic: str, partition: int) -> list[ProducerDescription]:
    if partition < 0:
        raise UsageError(f"--partition must be >= 0, got {partition}")
    with _partition_client(conn, topic, partition) as client:
        resp = client.request(61, 0, {"topics": [{"name": topic, "partition_indexes": [partition]}]})
    p = resp.topics[0].partitions[0]
    _check(int(p.error_code), p.error_message or f"{topic}-{partition}")
    return [ProducerDescription(int(a.producer_id), int(a.producer_epoch), int(a.last_sequence), int(a.last_timestamp),
                                int(a.coordinator_epoch), int(a.current_txn_start_offset)) for a in p.active_producers]


def abort_transaction(conn: Connection, topic: str, partition: int, *, start_offset: int | None = None,
                      producer_id: int | None = None, producer_epoch: int | None = None,
                      coordinator_epoch: int | None = None) -> AbortResult:
    """Write an ABORT marker for a hanging transaction of one partition: named by its start offset
    (the producer is looked up with DescribeProducers) or by producer id, epoch and coordinator epoch."""
    by_ids = (producer_id, producer_epoch, coordinator_epoch)
    if (start_offset is None) == all(x is None for x in by_ids) or (start_offset is None and None in by_ids):
        raise UsageError("name the transaction either with --start-offset, or with --producer-id, "
                         "--producer-epoch and --coordinator-epoch")
    if start_offset is not None:
        open_here = [p for p in describe_producers(conn, topic, partition) if p.current_txn_start_offset == start_offset]
        if not open_here:
            raise OperationError(f"no open transaction starts at offset {start_offset} of {topic}-{partition} "
                                 f"(see kcli transactions describe-producers)")
        p = open_here[0]
        producer_id, producer_epoch, coordinator_epoch = p.producer_id, p.producer_epoch, p.coordinator_epoch
    assert producer_id is not None and producer_epoch is not None and coordinator_epoch is not None
    with _partition_client(conn, topic, partition) as client:
        resp = client.request(27, 1, {"markers": [{
            "producer_id": producer_id, "producer_epoch": producer_epoch, "transaction_result": False,
            "coordinator_epoch": coordinator_epoch, "topics": [{"name": topic, "partition_indexes": [partition]}]}]})
    _check(int(resp.markers[0].topics[0].partitions[0].error_code), f"{topic}-{partition}")
    return AbortResult(topic, partition, producer_id, producer_epoch, coordinator_epoch)
