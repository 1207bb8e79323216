"""Rack-aware leaders for diskless partitions (KIP-1163 "Cluster Metadata").

Any broker can serve a diskless partition, so a client that says which rack it is in — by
adding ``diskless_rack_id=<rack>`` to its client.id, which every Kafka client sends — is shown
a broker of its own rack as the partition leader and never crosses racks. Clients without the
hint, or in a rack with no broker, see the true leader.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

_RACK_HINT = re.compile(r"diskless_rack_id=([^,;\s]+)")


@dataclass(frozen=True, slots=True)
class BrokerRack:
    node_id: int
    rack: str | None


def client_rack(client_id: str | None) -> str | None:
    """The rack a client asks for in its client.id, or None."""
    if not client_id:
        return None
    m = _RACK_HINT.search(client_id)
    return m.group(1) if m else None


def choose_leader(rack: str | None, partition: int, leader: int, replicas: Sequence[int],
                  brokers: Sequence[BrokerRack]) -> int:
    """A broker of ``rack`` for ``partition``: the real leader if it is there, else a replica
    there, else any broker there (spread by partition number); ``leader`` when none is."""
    if rack is None:
        return leader
    in_rack = sorted(b.node_id for b in brokers if b.rack == rack)
    if not in_rack:
        return leader
    if leader in in_rack:
        return leader
    candidates = [r for r in replicas if r in in_rack] or in_rack
    return candidates[partition % len(candidates)]
