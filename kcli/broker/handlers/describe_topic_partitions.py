"""DescribeTopicPartitions (API 75, KIP-966): Metadata's topic answer in pages, which Kafka 4's
admin client uses to describe topics. Topics are answered in name order, from the request's
cursor, until ``response_partition_limit`` partitions (at most Kafka's
``max.request.partition.size.limit``, 2000) are in the answer; ``next_cursor`` says where the
next page starts (null when nothing is left)."""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.broker.authz import authorize, peer_host, register_gate
from kcli.broker.dispatch import RequestContext, handler
from kcli.broker.handlers.metadata import topic_entry
from kcli.protocol.errors import BrokerError
from kcli.security.acl import AclOperation as Op, ResourceType as RT, all_operations_bits

MAX_REQUEST_PARTITION_SIZE_LIMIT = 2000  # Kafka's max.request.partition.size.limit default
_ZERO_ID = uuid.UUID(int=0)


def _partition(p: dict[str, Any]) -> dict[str, Any]:
    """A Metadata partition entry in this API's shape (no eligible leader replicas: KIP-966's ELR
    is not kept by kcli, so both lists are empty as on a Kafka cluster with it disabled)."""
    return {"error_code": p["error_code"], "partition_index": p["partition_index"], "leader_id": p["leader_id"],
            "leader_epoch": p["leader_epoch"], "replica_nodes": p["replica_nodes"], "isr_nodes": p["isr_nodes"],
            "eligible_leader_replicas": [], "last_known_elr": [], "offline_replicas": p["offline_replicas"]}


def _missing(name: str, code: int) -> dict[str, Any]:
    return {"error_code": code, "name": name, "topic_id": _ZERO_ID, "is_internal": False, "partitions": [],
            "topic_authorized_operations": 0}


@handler(75, "DescribeTopicPartitions", 0, 0)
async def describe_topic_partitions(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    cursor = req.cursor
    first = cursor.topic_name if cursor is not None else ""
    everything = not req.topics
    if everything:
        names = sorted(n for n in b.state.topics if n >= first)
    else:
        names = sorted({t.name for t in req.topics if t.name >= first})
        if cursor is not None and cursor.topic_name not in names:
            raise BrokerError(ErrorCode.invalid_request, "DescribeTopicPartitionsRequest topic list should contain "
                                                         f"the cursor topic: {cursor.topic_name}")
    if cursor is not None and int(cursor.partition_index) < 0:
        raise BrokerError(ErrorCode.invalid_request, "DescribeTopicPartitionsRequest cursor partition must be valid")
    remaining = max(1, min(int(req.response_partition_limit), MAX_REQUEST_PARTITION_SIZE_LIMIT))
    topics: list[dict[str, Any]] = []
    denied: list[dict[str, Any]] = []
    next_cursor = None
    for name in names:
        if not authorize(ctx, Op.DESCRIBE, RT.TOPIC, name, log_denied=not everything):
            if not everything:  # an all-topics answer hides them; a name asked for is refused
                denied.append(_missing(name, ErrorCode.topic_authorization_failed))
            continue
        if b.topic(name) is None:
            if not everything:
                topics.append(_missing(name, ErrorCode.unknown_topic_or_partition))
            continue
        if remaining <= 0:
            next_cursor = {"topic_name": name, "partition_index": 0}
            break
        entry = topic_entry(ctx, name)
        start = int(cursor.partition_index) if cursor is not None and name == cursor.topic_name else 0
        parts = [p for p in entry["partitions"] if p["partition_index"] >= start]
        parts.sort(key=lambda p: p["partition_index"])
        page, rest = parts[:remaining], parts[remaining:]
        remaining -= len(page)
        topics.append({**entry, "partitions": [_partition(p) for p in page],
                       "topic_authorized_operations": all_operations_bits(RT.TOPIC) if b.authorizer is None
                       else _operations(ctx, name)})
        if rest:
            next_cursor = {"topic_name": name, "partition_index": rest[0]["partition_index"]}
            break
    return {"throttle_time": 0, "topics": topics + denied, "next_cursor": next_cursor}


def _operations(ctx: RequestContext, name: str) -> int:
    conn = ctx.connection
    return ctx.broker.authorizer.authorized_operations(conn.principal, peer_host(conn.peer), RT.TOPIC, name)


@register_gate(75)
async def _gate(az: Any, req: Any, call: Any) -> dict[str, Any] | None:
    """Describe on each topic, checked by the handler itself: the page limit counts only the
    topics the principal may see, as Kafka's DescribeTopicPartitionsRequestHandler does."""
    return await call(req)
