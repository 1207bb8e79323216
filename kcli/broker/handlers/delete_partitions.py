"""DeletePartitions (KIP-694) on kcli's API key 32001: shrink topics to fewer partitions.

Request-wide refusals (feature disabled, negative delay) set the top-level error and every
partition's; a topic's refusal (pending deletion, not the highest partitions, ...) sets
that topic's partitions. kcli's tagged fields carry the plan (delete time, record count,
bytes) so ``validate_only`` doubles as the dry run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.broker import audit
from kcli.broker.dispatch import RequestContext, handler
from kcli.protocol.codec import build, response_class
from kcli.protocol.errors import BrokerError
from kcli.protocol.kcli_schemas import DELETE_PARTITIONS_KEY, DELETE_PARTITIONS_NAME



def _error_entry(partition: int, err: BrokerError) -> dict[str, Any]:
    return {"partition_index": partition, "status_code": 0, "error_code": err.code, "error_message": err.message or None}


@handler(DELETE_PARTITIONS_KEY, DELETE_PARTITIONS_NAME, 0, 0)
async def delete_partitions(ctx: RequestContext, req: Any) -> Any:
    reducer = ctx.broker.partition_reducer
    delay = int(req.delete_partitions_delay)
    validate_only = bool(req.validate_only)
    top: BrokerError | None = None
    try:
        if reducer is None:
            raise BrokerError(ErrorCode.invalid_request, "partition reduction is not available on this broker")
        reducer.check_request(delay)
    except BrokerError as err:
        top = err
    topics: list[dict[str, Any]] = []
    extras: list[list[Any]] = []  # per topic, per partition: PartitionOutcome or None
    for rt in req.topics:
        parts = [int(p) for p in rt.partitions]
        if top is not None:
            topics.append({"name": rt.name, "partitions": [_error_entry(p, top) for p in parts]})
            extras.append([None] * len(parts))
            continue
        try:
            outcomes = await reducer.delete_partitions(rt.name, parts, delay, validate_only=validate_only)
        except BrokerError as err:
            if not validate_only:
                audit.refused(ctx, "partition deletion", rt.name, err)
            topics.append({"name": rt.name, "partitions": [_error_entry(p, err) for p in parts]})
            extras.append([None] * len(parts))
            continue
        if not validate_only:
            audit.changed(ctx, "topic.partitions.deleted", f"Requested deletion of partitions {sorted(parts)} of topic "
                          f"{rt.name} (KIP-694, delay {delay} ms)", rt.name, partitions=sorted(parts), delay_ms=delay)
        topics.append({"name": rt.name, "partitions": [
            {"partition_index": o.partition, "status_code": o.mode, "error_code": 0, "error_message": None}
            for o in outcomes]})
        extras.append(outcomes)
    body = {"throttle_time_ms": 0, "error_code": top.code if top else 0,
            "error_message": (top.message or None) if top else None, "responses": topics}
    entity = build(response_class(DELETE_PARTITIONS_KEY, 0), body)
    return _with_plan(entity, extras)


def _with_plan(entity: Any, extras: list[list[Any]]) -> Any:
    """Fill kcli's tagged fields, which codec.build leaves at their defaults."""
    results = []
    for topic, outcomes in zip(entity.responses, extras):
        parts = []
        for entry, o in zip(topic.partitions, outcomes):
            if o is not None:
                entry = dataclasses.replace(entry, delete_at_ms=o.delete_at_ms, record_count=o.record_count,
                                            size_bytes=o.size_bytes)
            parts.append(entry)
        results.append(dataclasses.replace(topic, partitions=tuple(parts)))
    return dataclasses.replace(entity, responses=tuple(results))
