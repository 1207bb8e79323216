"""KIP-694 partition modes as any Kafka admin client sees them.

The broker reports partitions that are not ReadWrite in the read-only ``kcli.partition.modes``
DescribeConfigs entry (``3:ReadOnly@<deleteAtMs>,...``). Kept apart from :mod:`kcli.ops.partitions`
(the shrink) so that :mod:`kcli.ops.topics` can read modes without importing the shrink, which
itself uses topics: imports flow partitions → topics → partition_modes.
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka.admin import ConfigResource, ResourceType

from kcli.ops.connection import Connection, admin

MODES_KEY = "kcli.partition.modes"
READ_WRITE, READ_ONLY, NONE = "ReadWrite", "ReadOnly", "None"


@dataclass
class PartitionMode:
    partition: int
    mode: str  # ReadWrite | ReadOnly | None
    delete_at_ms: int | None = None


def parse_modes(value: str | None) -> dict[int, PartitionMode]:
    """``"3:ReadOnly@1700000000000,4:ReadOnly@..."`` → {3: PartitionMode(...), ...}; unknown text is skipped."""
    out: dict[int, PartitionMode] = {}
    for item in (value or "").split(","):
        head, _, at = item.strip().partition("@")
        pid, sep, mode = head.partition(":")
        try:
            partition = int(pid)
            delete_at = int(at) if at else None
        except ValueError:
            continue
        if sep and mode:
            out[partition] = PartitionMode(partition, mode, delete_at)
    return out


def partition_modes(conn: Connection, topic: str) -> dict[int, PartitionMode]:
    """Partitions of ``topic`` that are not ReadWrite (empty against brokers without KIP-694)."""
    client = admin(conn)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    futures = client.describe_configs([resource], request_timeout=conn.timeout_s)
    entries = client.wait(futures[resource], f"topic '{topic}'")
    entry = entries.get(MODES_KEY)
    return parse_modes(entry.value if entry is not None else None)
