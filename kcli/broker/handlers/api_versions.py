"""ApiVersions: what this broker speaks, derived from the registered handlers, and (v3+) its
feature levels for clients that read tagged fields (kcli/broker/features.py)."""

from __future__ import annotations

import dataclasses
from typing import Any, get_args

from kio.static.primitive import i64

from kcli.broker import features as feat
from kcli.broker.dispatch import HANDLERS, RequestContext, handler
from kcli.protocol import codec

# Not announced while no client telemetry receiver is configured (kcli has none), as Kafka's
# ApiVersionManager leaves them out; requests for them are still answered (handlers/telemetry.py).
UNADVERTISED = frozenset({71, 72})  # GetTelemetrySubscriptions, PushTelemetry


def supported_api_keys() -> list[dict[str, int]]:
    return [
        {"api_key": h.api_key, "min_version": h.min_version, "max_version": h.max_version}
        for h in sorted(HANDLERS.values(), key=lambda h: h.api_key) if h.api_key not in UNADVERTISED
    ]


def with_features(ctx: RequestContext, body: dict[str, Any]) -> Any:
    """The v3+ response entity with the supported and finalized features in its tagged fields."""
    cls = codec.response_class(18, ctx.api_version)
    entity = codec.build(cls, body)
    fs = feat.features(ctx.broker, set(HANDLERS))
    types = {f.name: f.type for f in dataclasses.fields(cls)}
    sup_cls = _element(types["supported_features"])
    fin_cls = _element(types["finalized_features"])
    # Before v4 a supported feature whose minimum is 0 is left out: older Java clients cannot
    # read it (KAFKA-17492; v4 is KAFKA-17011's fix), as Kafka's ApiVersionsResponse does.
    supported = [f for f in fs if ctx.api_version >= 4 or f.min_version > 0]
    return dataclasses.replace(
        entity,
        supported_features=tuple(codec.build(sup_cls, {"name": f.name, "min_version": f.min_version,
                                                       "max_version": f.max_version}) for f in supported),
        finalized_features_epoch=i64(feat.finalized_epoch(fs)),
        finalized_features=tuple(codec.build(fin_cls, {"name": f.name, "max_version_level": f.level,
                                                       "min_version_level": f.level}) for f in fs if f.level > 0),
    )


def _element(tuple_type: Any) -> type:
    return get_args(tuple_type)[0]


@handler(18, "ApiVersions", 0, 4)
async def api_versions(ctx: RequestContext, req: Any) -> Any:
    body = {"error_code": 0, "api_keys": supported_api_keys(), "throttle_time": 0}
    if ctx.api_version >= 3 and feat.reads_tagged_fields(getattr(req, "client_software_name", None),
                                                         getattr(req, "client_software_version", None)):
        return with_features(ctx, body)
    return body
