"""Rack-aware leaders for diskless partitions (KIP-1163 "Cluster Metadata").

Any broker can serve a diskless partition, so a client that says which rack it is in — by
adding ``diskless_rack_id=<rack>`` to its client.id, which every Kafka client sends — is shown
a broker of its own rack as the partition leader and never crosses racks (the choice itself is
kcli.cluster.placement.diskless_leader). Clients without the hint, or in a rack with no live
broker, see a leader spread over the live brokers.
"""

from __future__ import annotations

import re

_RACK_HINT = re.compile(r"diskless_rack_id=([^,;\s]+)")


def client_rack(client_id: str | None) -> str | None:
    """The rack a client asks for in its client.id, or None."""
    if not client_id:
        return None
    m = _RACK_HINT.search(client_id)
    return m.group(1) if m else None
