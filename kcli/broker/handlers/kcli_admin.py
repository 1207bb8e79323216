"""kcli's admin API on the Kafka listener: broker metrics and diskless inspection.

Wire format and keys: kcli/diskless/admin_api.py (documented in docs/diskless.md). Every
answer is ``{error_code, json}``; a bad request or a broker-side failure becomes an error code
with ``{"error": message}`` so a tool can print one line.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Awaitable, Callable

from kio.schema.errors import ErrorCode

from kcli.broker.dispatch import RequestContext, handler
from kcli.diskless import admin_api
from kcli.protocol.errors import BrokerError

log = logging.getLogger("kcli.broker.kcli_admin")



def _parse(req: Any) -> dict[str, Any]:
    try:
        doc = json.loads(req.json) if req.json else {}
    except ValueError as err:
        raise BrokerError(ErrorCode.invalid_request, f"request is not a JSON document: {err}") from None
    if not isinstance(doc, dict):
        raise BrokerError(ErrorCode.invalid_request, "request must be a JSON object")
    return doc


async def _answer(fn: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
    try:
        result = await fn()
    except BrokerError as err:
        return {"error_code": err.code, "json": admin_api.encode_doc({"error": err.message})}
    except Exception as err:  # noqa: BLE001 - one line to the tool, details in the broker log
        log.exception("kcli admin request failed")
        code = getattr(err, "code", None)
        return {"error_code": code if isinstance(code, int) else ErrorCode.unknown_server_error,
                "json": admin_api.encode_doc({"error": str(err) or type(err).__name__})}
    return {"error_code": 0, "json": admin_api.encode_doc(result)}


def _engine(ctx: RequestContext) -> Any:
    engine = ctx.broker.diskless
    if engine is None:
        raise BrokerError(ErrorCode.invalid_request, "diskless topics are disabled on this broker (diskless.system.enable=false)")
    return engine


def _str_list(doc: dict[str, Any], key: str) -> list[str] | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BrokerError(ErrorCode.invalid_request, f"{key} must be a list of strings")
    return value


@handler(admin_api.BROKER_METRICS_KEY, admin_api.API_NAMES[admin_api.BROKER_METRICS_KEY], 0, 0)
async def broker_metrics(ctx: RequestContext, req: Any) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        _parse(req)
        b = ctx.broker
        snap = b.metrics.snapshot()
        gauges: dict[str, Any] = dict(snap.get("gauges", {}))  # e.g. background tasks in back-off
        for ext in b.extensions:
            fn = getattr(ext, "gauges", None)
            if callable(fn):
                gauges.update(fn())
        return {"node_id": b.node_id, "rack": b.rack, "cluster_id": b.cluster_id,
                "uptime_ms": int(time.time() * 1000) - b.started_ms,
                "process_cpu_s": round(time.process_time(), 3),
                "counters": snap["counters"], "summaries": snap["summaries"], "gauges": gauges}

    return await _answer(run)


@handler(admin_api.DISKLESS_DESCRIBE_KEY, admin_api.API_NAMES[admin_api.DISKLESS_DESCRIBE_KEY], 0, 0)
async def diskless_describe(ctx: RequestContext, req: Any) -> dict[str, Any]:
    from kcli.diskless import admin_views as views

    async def run() -> Any:
        doc = _parse(req)
        return await views.describe(_engine(ctx), _str_list(doc, "topics"), replicas=doc.get("replicas") is True)

    return await _answer(run)


@handler(admin_api.DISKLESS_OBJECTS_KEY, admin_api.API_NAMES[admin_api.DISKLESS_OBJECTS_KEY], 0, 0)
async def diskless_objects(ctx: RequestContext, req: Any) -> dict[str, Any]:
    from kcli.diskless import admin_views as views

    async def run() -> Any:
        doc = _parse(req)
        return await views.objects(_engine(ctx), state=doc.get("state"), topic=doc.get("topic"),
                                     object_key=doc.get("object_key"), batches=bool(doc.get("batches", False)))

    return await _answer(run)


@handler(admin_api.DISKLESS_VERIFY_KEY, admin_api.API_NAMES[admin_api.DISKLESS_VERIFY_KEY], 0, 0)
async def diskless_verify(ctx: RequestContext, req: Any) -> dict[str, Any]:
    from kcli.diskless import admin_views as views

    async def run() -> Any:
        doc = _parse(req)
        max_objects = doc.get("max_objects", 1000)
        if not isinstance(max_objects, int) or max_objects < 0:
            raise BrokerError(ErrorCode.invalid_request, "max_objects must be a non-negative integer")
        return await views.verify(_engine(ctx), object_keys=_str_list(doc, "object_keys"), max_objects=max_objects)

    return await _answer(run)


@handler(admin_api.DISKLESS_GC_KEY, admin_api.API_NAMES[admin_api.DISKLESS_GC_KEY], 0, 0)
async def diskless_gc(ctx: RequestContext, req: Any) -> dict[str, Any]:
    from kcli.diskless import admin_views as views

    async def run() -> Any:
        doc = _parse(req)
        return await views.gc(_engine(ctx), dry_run=bool(doc.get("dry_run", False)),
                                orphans=bool(doc.get("orphans", True)),
                                unknown_objects=doc.get("unknown_objects", False) is True)

    return await _answer(run)
