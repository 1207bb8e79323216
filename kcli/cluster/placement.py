"""Where partitions live and which broker a client is sent to, from the live registrations.

Pure functions over :class:`BrokerRegistration` lists, so every broker of a cluster computes the
same answer from the same inputs without asking anyone:

* :func:`assign_replicas` places a new topic's replicas the way Kafka's rack-aware assignment
  does (AdminUtils.assignReplicasToBrokersRackAware): brokers alternate by rack, each partition
  starts one broker further, and a partition's replicas go to distinct racks while there are
  racks left. For a classic partition (replication factor 1 in kcli's cluster) the one replica is
  the broker that hosts its log; for a diskless partition the replicas are metadata-only
  (KIP-1163 "Replicas"): any live broker serves it.
* :func:`diskless_leader` names the broker Metadata shows as a diskless partition's leader: a
  live broker in the client's rack if it said which (``diskless_rack_id=`` in client.id), else
  the first live replica, else a broker chosen by rendezvous hashing over the live brokers —
  stable between calls, and when a broker leaves only its partitions move.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from typing import Protocol


class Registered(Protocol):
    node_id: int
    rack: str | None


class PlacementError(ValueError):
    """The replicas cannot be placed (replication factor above the live brokers)."""


def rack_alternated(brokers: Sequence[Registered]) -> list[int]:
    """Node ids interleaved by rack (racks and ids sorted): a1, b1, c1, a2, b2, ... — Kafka's
    getRackAlternatedBrokerList, so consecutive picks land in different racks."""
    by_rack: dict[str, list[int]] = {}
    for b in brokers:
        by_rack.setdefault(b.rack or "", []).append(b.node_id)
    columns = [sorted(ids) for _, ids in sorted(by_rack.items())]
    out: list[int] = []
    for i in range(max((len(c) for c in columns), default=0)):
        out += [c[i] for c in columns if i < len(c)]
    return out


def _score(topic_id: uuid.UUID, partition: int, node_id: int) -> bytes:
    return hashlib.blake2b(b"%s/%d/%d" % (topic_id.bytes, partition, node_id), digest_size=8).digest()


def rendezvous(topic_id: uuid.UUID, partition: int, node_ids: Sequence[int]) -> int:
    """The node with the highest hash for this partition (highest-random-weight hashing)."""
    return max(node_ids, key=lambda n: _score(topic_id, partition, n))


def assign_replicas(topic_id: uuid.UUID, partitions: Sequence[int], replication_factor: int,
                    brokers: Sequence[Registered]) -> dict[int, list[int]]:
    """partition → replicas (leader first) over ``brokers``; the start broker comes from the
    topic id, so topics do not all begin on the lowest node id (Kafka picks it at random)."""
    order = rack_alternated(brokers)
    if replication_factor > len(order):
        raise PlacementError(
            f"Unable to replicate the partition {replication_factor} time(s): The target replication factor of "
            f"{replication_factor} cannot be reached because only {len(order)} broker(s) are registered.")
    rack_of = {b.node_id: b.rack or "" for b in brokers}
    n_racks = len(set(rack_of.values()))
    start = int.from_bytes(topic_id.bytes[:4], "big") % len(order)
    out: dict[int, list[int]] = {}
    for p in partitions:
        first = (start + p) % len(order)
        replicas = [order[first]]
        racks = {rack_of[order[first]]}
        for step in range(1, len(order)):
            if len(replicas) == replication_factor:
                break
            cand = order[(first + step) % len(order)]
            # a rack gets a second replica only once every rack has one
            if rack_of[cand] in racks and len(racks) < n_racks:
                continue
            replicas.append(cand)
            racks.add(rack_of[cand])
        for cand in order:  # racks exhausted: fill with any broker not yet chosen
            if len(replicas) == replication_factor:
                break
            if cand not in replicas:
                replicas.append(cand)
        out[p] = replicas
    return out


def diskless_leader(topic_id: uuid.UUID, partition: int, replicas: Sequence[int],
                    live: Sequence[Registered], client_rack: str | None) -> int:
    """The broker a client is sent to for a diskless partition (see the module docstring);
    -1 when no broker is live."""
    if not live:
        return -1
    live_ids = [b.node_id for b in live]
    if client_rack is not None:
        in_rack = [b.node_id for b in live if b.rack == client_rack]
        if in_rack:
            for r in replicas:
                if r in in_rack:
                    return r
            return rendezvous(topic_id, partition, in_rack)
    for r in replicas:
        if r in live_ids:
            return r
    return rendezvous(topic_id, partition, live_ids)
