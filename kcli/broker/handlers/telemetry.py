"""Client telemetry (KIP-714): GetTelemetrySubscriptions (71) and PushTelemetry (72), answered as
a Kafka broker without a client telemetry receiver answers them. ApiVersions does not announce
them then (handlers/api_versions.py), so clients do not ask; one that asks anyway is told that no
metrics are requested, and a push it sends is accepted and dropped."""

from __future__ import annotations

import uuid
import zlib
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.broker.authz import register_gate
from kcli.broker.dispatch import RequestContext, handler

PUSH_INTERVAL_MS = 300000  # Kafka's interval.ms of a client metrics subscription (5 minutes)
TELEMETRY_MAX_BYTES = 1048576  # Kafka's telemetry.max.bytes
COMPRESSION_TYPES = [1, 2, 3, 4]  # gzip, snappy, lz4, zstd: what Kafka accepts (none is always accepted)
_ZERO = uuid.UUID(int=0)


def subscription_id(client_instance_id: uuid.UUID) -> int:
    """The id of the (empty) subscription a client instance gets, stable across requests."""
    crc = zlib.crc32(client_instance_id.bytes + PUSH_INTERVAL_MS.to_bytes(4, "big"))
    return crc - (1 << 32) if crc >= 1 << 31 else crc


@handler(71, "GetTelemetrySubscriptions", 0, 0)
async def get_telemetry_subscriptions(ctx: RequestContext, req: Any) -> dict[str, Any]:
    instance = req.client_instance_id if req.client_instance_id not in (None, _ZERO) else uuid.uuid4()
    return {"throttle_time": 0, "error_code": 0, "client_instance_id": instance,
            "subscription_id": subscription_id(instance), "accepted_compression_types": COMPRESSION_TYPES,
            "push_interval": PUSH_INTERVAL_MS, "telemetry_max_bytes": TELEMETRY_MAX_BYTES,
            "delta_temporality": True, "requested_metrics": []}


@handler(72, "PushTelemetry", 0, 0)
async def push_telemetry(ctx: RequestContext, req: Any) -> dict[str, Any]:
    instance = req.client_instance_id
    if instance in (None, _ZERO):
        code = ErrorCode.invalid_request
    elif int(req.subscription_id) != subscription_id(instance):
        code = ErrorCode.unknown_subscription_id
    elif req.metrics is not None and len(req.metrics) > TELEMETRY_MAX_BYTES:
        code = ErrorCode.telemetry_too_large
    else:
        code = ErrorCode.none  # no receiver: the metrics are dropped
    return {"throttle_time": 0, "error_code": code}


@register_gate(71, 72)
async def _gate(az: Any, req: Any, call: Any) -> dict[str, Any] | None:
    """A client's own telemetry: no ACL, as in Kafka."""
    return await call(req)
