"""Requests one kcli broker sends another in a cluster (Kafka's inter-broker channel, reduced).

The transaction coordinator sends WriteTxnMarkers to the broker hosting a classic partition of a
transaction and commits a transaction's offsets at the group's coordinator; a group coordinator
passes TxnOffsetCommit on to the transaction's coordinator. Each request is one connection
through kcli's own protocol client, to the endpoint of the target's live registration on
``inter.broker.listener.name`` (else its first listener), bounded by a timeout; the caller
retries while it still has work. Requests carry :data:`INTER_BROKER_CLIENT_ID`, by which the
receiving broker knows that the sender already did the checks a client's request gets — only
when the connection may also do what Kafka's inter-broker APIs need, ``ClusterAction`` on the
cluster (:func:`kcli.broker.authz.from_a_broker`; without an authorizer everything is allowed, as in Kafka).
"""

from __future__ import annotations

import asyncio
from typing import Any

INTER_BROKER_CLIENT_ID = "kcli-inter-broker"
REQUEST_TIMEOUT_S = 10.0


class InterBrokerError(Exception):
    """The other broker could not be reached or did not answer in time."""


def endpoint_of(b: Any, node_id: int) -> tuple[str, int]:
    """Where ``node_id`` takes inter-broker requests (InterBrokerError when it is not live)."""
    reg = next((r for r in b.live_brokers() if r.node_id == node_id), None)
    if reg is None:
        raise InterBrokerError(f"node {node_id} is not live")
    try:
        listener = b.config.get_str("inter.broker.listener.name")
    except Exception:  # a config without the name: the first listener
        listener = ""
    endpoint = reg.endpoint(listener) if listener else None
    return endpoint or (reg.host, reg.port)


async def request(b: Any, node_id: int, api_key: int, version: int, body: dict[str, Any],
                  timeout_s: float = REQUEST_TIMEOUT_S) -> Any:
    """Send one request to live broker ``node_id`` and return its response entity."""
    from kcli.protocol.client import WireClient

    host, port = endpoint_of(b, node_id)

    def call() -> Any:
        with WireClient(f"{host}:{port}", timeout=timeout_s, client_id=INTER_BROKER_CLIENT_ID) as client:
            return client.request(api_key, version, body)

    try:
        return await asyncio.wait_for(asyncio.to_thread(call), timeout_s + 1.0)
    except asyncio.TimeoutError:
        raise InterBrokerError(f"node {node_id} ({host}:{port}) did not answer within {timeout_s:g} s") from None
    except Exception as err:  # noqa: BLE001 - any failure of the exchange is "not reached" to the caller
        raise InterBrokerError(f"node {node_id} ({host}:{port}): {err}") from None
