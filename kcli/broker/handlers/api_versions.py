"""ApiVersions: what this broker speaks, derived from the registered handlers."""

from __future__ import annotations

from typing import Any

from kcli.broker.dispatch import HANDLERS, RequestContext, handler


def supported_api_keys() -> list[dict[str, int]]:
    return [
        {"api_key": h.api_key, "min_version": h.min_version, "max_version": h.max_version}
        for h in sorted(HANDLERS.values(), key=lambda h: h.api_key)
    ]


@handler(18, "ApiVersions", 0, 3)
async def api_versions(ctx: RequestContext, req: Any) -> dict[str, Any]:
    return {"error_code": 0, "api_keys": supported_api_keys(), "throttle_time": 0}
