"""Which live broker coordinates a key: Kafka's partition of ``__consumer_offsets`` (or of
``__transaction_state``) for a group or transactional id, then rendezvous hashing of that
partition over the live brokers, so that a departing broker moves only its own keys and every
broker with the same live set agrees."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable

# ---- which broker coordinates a group ----------------------------------------------------------


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (31-polynomial over UTF-16 code units, int32 overflow)."""
    h = 0
    data = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


@functools.lru_cache(maxsize=65536)
def offsets_partition(group_id: str, num_partitions: int) -> int:
    """Kafka's ``GroupCoordinator.partitionFor``: ``Utils.abs(groupId.hashCode) % partitions``
    (Utils.abs maps Integer.MIN_VALUE to 0)."""
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % max(1, num_partitions)


def coordinator_node(partition: int, node_ids: Iterable[int]) -> int:
    """The node that coordinates the groups of ``__consumer_offsets`` partition ``partition``:
    the highest random weight over the live nodes (rendezvous hashing), so that a departing
    node moves only its own partitions and every broker with the same live set agrees."""

    def weight(node: int) -> tuple[int, int]:
        digest = hashlib.blake2b(f"{partition}/{node}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big"), node

    nodes = list(node_ids)
    if not nodes:
        raise ValueError("no live node to coordinate groups")
    return max(nodes, key=weight)
