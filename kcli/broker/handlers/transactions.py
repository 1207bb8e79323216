"""Transaction APIs (KIP-98): AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit and
the transactional branch of InitProducerId; the logic is in kcli/broker/transactions.py.

Clients older than each API's PRODUCER_FENCED version get INVALID_PRODUCER_EPOCH instead, as
Kafka's KafkaApis translates it.
"""

from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.broker.dispatch import RequestContext, handler


def _fenced_for(code: int, version: int, first_version: int) -> int:
    """PRODUCER_FENCED is known to clients from ``first_version`` of an API on."""
    if code == ErrorCode.producer_fenced and version < first_version:
        return int(ErrorCode.invalid_producer_epoch)
    return int(code)


def _ms(value: Any) -> int:
    if isinstance(value, datetime.timedelta):
        return round(value / datetime.timedelta(milliseconds=1))
    return int(value)


def _coordinator(ctx: RequestContext) -> Any:
    return ctx.broker.transactions


async def init_transactional_producer(ctx: RequestContext, req: Any) -> dict[str, Any]:
    coord = _coordinator(ctx)
    if coord is None:
        return {"throttle_time": 0, "error_code": ErrorCode.coordinator_not_available, "producer_id": -1,
                "producer_epoch": -1}
    err, pid, epoch = await coord.init_producer_id(
        req.transactional_id, _ms(req.transaction_timeout),
        int(getattr(req, "producer_id", -1)), int(getattr(req, "producer_epoch", -1)))
    return {"throttle_time": 0, "error_code": _fenced_for(err, ctx.api_version, 4), "producer_id": pid,
            "producer_epoch": epoch}


@handler(24, "AddPartitionsToTxn", 0, 3)
async def add_partitions_to_txn(ctx: RequestContext, req: Any) -> dict[str, Any]:
    wanted = [(t.name, int(p)) for t in req.v3_and_below_topics for p in t.partitions]
    coord = _coordinator(ctx)
    if coord is None:
        codes = {tp: int(ErrorCode.coordinator_not_available) for tp in wanted}
    else:
        codes = await coord.add_partitions(req.v3_and_below_transactional_id, int(req.v3_and_below_producer_id),
                                           int(req.v3_and_below_producer_epoch), wanted)
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition) in wanted:
        by_topic.setdefault(topic, []).append(
            {"partition_index": partition,
             "partition_error_code": _fenced_for(codes[(topic, partition)], ctx.api_version, 2)})
    return {"throttle_time": 0, "results_by_topic_v3_and_below": [
        {"name": name, "results_by_partition": parts} for name, parts in by_topic.items()]}


@handler(25, "AddOffsetsToTxn", 0, 3)
async def add_offsets_to_txn(ctx: RequestContext, req: Any) -> dict[str, Any]:
    coord = _coordinator(ctx)
    if coord is None:
        return {"throttle_time": 0, "error_code": ErrorCode.coordinator_not_available}
    err = await coord.add_offsets(req.transactional_id, int(req.producer_id), int(req.producer_epoch), req.group_id)
    return {"throttle_time": 0, "error_code": _fenced_for(err, ctx.api_version, 2)}


@handler(26, "EndTxn", 0, 4)
async def end_txn(ctx: RequestContext, req: Any) -> dict[str, Any]:
    coord = _coordinator(ctx)
    if coord is None:
        return {"throttle_time": 0, "error_code": ErrorCode.coordinator_not_available}
    err = await coord.end_txn(req.transactional_id, int(req.producer_id), int(req.producer_epoch), bool(req.committed))
    return {"throttle_time": 0, "error_code": _fenced_for(err, ctx.api_version, 2)}


@handler(28, "TxnOffsetCommit", 0, 3)
async def txn_offset_commit(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    coord = _coordinator(ctx)
    order: list[tuple[str, int]] = []
    codes: dict[tuple[str, int], int] = {}
    wanted: dict[tuple[str, int], tuple[int, int, str]] = {}
    for t in req.topics:
        exists = b.topic_exists(t.name)
        for p in t.partitions:
            tp = (t.name, int(p.partition_index))
            order.append(tp)
            if not exists:
                codes[tp] = int(ErrorCode.unknown_topic_or_partition)
            else:
                wanted[tp] = (int(p.committed_offset), int(getattr(p, "committed_leader_epoch", -1)),
                              p.committed_metadata or "")
    group_err = 0
    if coord is None or b.groups is None:
        group_err = int(ErrorCode.coordinator_not_available)
    elif ctx.api_version >= 3:
        group_err = b.groups.check_txn_offset_commit(req.group_id, int(req.generation_id), req.member_id,
                                                     getattr(req, "group_instance_id", None))
    if group_err:
        codes.update({tp: group_err for tp in wanted})
    elif wanted:
        codes.update(await coord.txn_offset_commit(req.transactional_id, req.group_id, int(req.producer_id),
                                                   int(req.producer_epoch), wanted))
    topics: dict[str, list[dict[str, Any]]] = {}
    for tp in order:
        topics.setdefault(tp[0], []).append(
            {"partition_index": tp[1], "error_code": _fenced_for(codes[tp], ctx.api_version, 2)})
    return {"throttle_time": 0, "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]}
