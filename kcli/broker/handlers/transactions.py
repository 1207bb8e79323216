"""Transaction APIs (KIP-98): AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit and
the transactional branch of InitProducerId; the logic is in kcli/coordinator/transaction/coordinator.py.

Clients older than each API's PRODUCER_FENCED version get INVALID_PRODUCER_EPOCH instead, as
Kafka's KafkaApis translates it.
"""

from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.broker.dispatch import RequestContext, handler
from kcli.broker.authz import from_a_broker
from kcli.protocol.interbroker import InterBrokerError, request as inter_broker_request


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


def tv2_enabled(ctx: RequestContext) -> bool:
    """Whether transactions v2 (KIP-890) is on: the finalized transaction.version is 2."""
    from kcli.broker.features import transaction_version

    return transaction_version(ctx.broker) >= 2


async def add_partitions_v4(ctx: RequestContext, req: Any) -> dict[str, Any]:
    """AddPartitionsToTxn v4+: a broker's batch of transactions (KIP-890), each either verified
    (verify_only: is every partition already in the transaction?) or added (transactions v2's
    implicit add for a Produce v12 that reached a partition leader here)."""
    coord = _coordinator(ctx)
    if not from_a_broker(ctx):  # v4+ is for brokers only (Kafka: CLUSTER_ACTION)
        return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed, "results_by_transaction": []}
    out = []
    for txn in req.transactions:
        wanted = [(t.name, int(p)) for t in txn.topics for p in t.partitions]
        pid, epoch = int(txn.producer_id), int(txn.producer_epoch)
        if coord is None:
            codes = {tp: int(ErrorCode.coordinator_not_available) for tp in wanted}
        elif txn.verify_only:
            routed = await coord.route(txn.transactional_id)
            codes = {tp: routed for tp in wanted} if routed else coord.verify_partitions(
                txn.transactional_id, pid, epoch, wanted)
        else:
            codes = await coord.add_partitions_implicit(txn.transactional_id, pid, epoch, wanted)
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition) in wanted:
            by_topic.setdefault(topic, []).append({"partition_index": partition,
                                                   "partition_error_code": int(codes[(topic, partition)])})
        out.append({"transactional_id": txn.transactional_id, "topic_results": [
            {"name": name, "results_by_partition": parts} for name, parts in by_topic.items()]})
    return {"throttle_time": 0, "error_code": 0, "results_by_transaction": out}


@handler(24, "AddPartitionsToTxn", 0, 5)
async def add_partitions_to_txn(ctx: RequestContext, req: Any) -> dict[str, Any]:
    if ctx.api_version >= 4:
        return await add_partitions_v4(ctx, req)
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


@handler(25, "AddOffsetsToTxn", 0, 4)
async def add_offsets_to_txn(ctx: RequestContext, req: Any) -> dict[str, Any]:
    coord = _coordinator(ctx)
    if coord is None:
        return {"throttle_time": 0, "error_code": ErrorCode.coordinator_not_available}
    err = await coord.add_offsets(req.transactional_id, int(req.producer_id), int(req.producer_epoch), req.group_id)
    return {"throttle_time": 0, "error_code": _fenced_for(err, ctx.api_version, 2)}


@handler(26, "EndTxn", 0, 5)
async def end_txn(ctx: RequestContext, req: Any) -> dict[str, Any]:
    coord = _coordinator(ctx)
    if coord is None:
        return {"throttle_time": 0, "error_code": ErrorCode.coordinator_not_available, "producer_id": -1,
                "producer_epoch": -1}
    if ctx.api_version >= 5:  # transactions v2: the epoch is bumped, the response says the next one
        if not tv2_enabled(ctx):
            return {"throttle_time": 0, "error_code": ErrorCode.unsupported_version, "producer_id": -1,
                    "producer_epoch": -1}
        err, pid, epoch = await coord.end_txn_v2(req.transactional_id, int(req.producer_id),
                                                 int(req.producer_epoch), bool(req.committed))
        return {"throttle_time": 0, "error_code": int(err), "producer_id": pid, "producer_epoch": epoch}
    err = await coord.end_txn(req.transactional_id, int(req.producer_id), int(req.producer_epoch), bool(req.committed))
    return {"throttle_time": 0, "error_code": _fenced_for(err, ctx.api_version, 2)}


@handler(28, "TxnOffsetCommit", 0, 5)
async def txn_offset_commit(ctx: RequestContext, req: Any) -> dict[str, Any]:
    """Sent to the group's coordinator, which checks the group and the membership; the offsets
    are kept with the transaction, at its coordinator — here, or passed on to the broker that
    coordinates the transactional id (kcli/protocol/interbroker.py), which takes a passed-on
    request without checking the group again."""
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
    passed_on = from_a_broker(ctx)
    group_err = 0
    if coord is None or b.groups is None:
        group_err = int(ErrorCode.coordinator_not_available)
    elif not passed_on:
        group_err = await b.groups.route(req.group_id)
        if not group_err and ctx.api_version >= 3:
            group_err = b.groups.check_txn_offset_commit(req.group_id, int(req.generation_id), req.member_id,
                                                         getattr(req, "group_instance_id", None))
    if not group_err and wanted and ctx.api_version >= 5 and not passed_on:
        # transactions v2: TxnOffsetCommit v5 adds the group to the transaction itself
        group_err = int(await _add_offsets_implicitly(ctx, req)) if tv2_enabled(ctx) else \
            int(ErrorCode.unsupported_version)
    if group_err:
        codes.update({tp: group_err for tp in wanted})
    elif wanted and not passed_on and coord.coordinator_of(req.transactional_id) != b.node_id:
        codes.update(await _pass_on(ctx, coord.coordinator_of(req.transactional_id), req, wanted))
        coord.note_passed_on(req.group_id, [tp for tp in wanted if codes[tp] == 0], int(req.producer_id))
    elif wanted:
        codes.update(await coord.txn_offset_commit(req.transactional_id, req.group_id, int(req.producer_id),
                                                   int(req.producer_epoch), wanted))
    topics: dict[str, list[dict[str, Any]]] = {}
    for tp in order:
        topics.setdefault(tp[0], []).append(
            {"partition_index": tp[1], "error_code": _fenced_for(codes[tp], ctx.api_version, 2)})
    return {"throttle_time": 0, "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]}


async def _add_offsets_implicitly(ctx: RequestContext, req: Any) -> int:
    """AddOffsetsToTxn for a TxnOffsetCommit v5: at the transaction's coordinator, here or on
    another broker (an AddOffsetsToTxn v3 from this one)."""
    coord = _coordinator(ctx)
    node = coord.coordinator_of(req.transactional_id)
    if node == ctx.broker.node_id:
        return int(await coord.add_offsets(req.transactional_id, int(req.producer_id), int(req.producer_epoch),
                                           req.group_id))
    body = {"transactional_id": req.transactional_id, "producer_id": int(req.producer_id),
            "producer_epoch": int(req.producer_epoch), "group_id": req.group_id}
    try:
        resp = await inter_broker_request(ctx.broker, node, 25, 3, body)
    except InterBrokerError:
        return int(ErrorCode.coordinator_not_available)
    return int(resp.error_code)


async def _pass_on(ctx: RequestContext, node: int, req: Any,
                   wanted: dict[tuple[str, int], tuple[int, int, str]]) -> dict[tuple[str, int], int]:
    """TxnOffsetCommit at the transactional id's coordinator ``node``; its codes per partition
    (COORDINATOR_NOT_AVAILABLE when it cannot be reached: the client retries)."""
    from kcli.coordinator.transaction.state import offset_topics

    body = {"transactional_id": req.transactional_id, "group_id": req.group_id, "producer_id": int(req.producer_id),
            "producer_epoch": int(req.producer_epoch), "generation_id": -1, "member_id": "",
            "group_instance_id": None, "topics": offset_topics(wanted)}
    try:
        resp = await inter_broker_request(ctx.broker, node, 28, 3, body)
    except InterBrokerError:
        return {tp: int(ErrorCode.coordinator_not_available) for tp in wanted}
    got = {(t.name, int(p.partition_index)): int(p.error_code) for t in resp.topics for p in t.partitions}
    return {tp: got.get(tp, int(ErrorCode.coordinator_not_available)) for tp in wanted}


# ---- admin: kafka-transactions.sh's APIs -------------------------------------------------------


def _diskless(b: Any, topic: str, partition: int) -> Any:
    """The topic when ``topic-partition`` is a diskless partition (any broker serves it), else None."""
    t = b.topic(topic)
    return t if t is not None and partition in t.partitions and b.is_diskless(t) else None


async def _diskless_producers(b: Any, t: Any, partition: int) -> tuple[int, str | None, list[dict[str, Any]]]:
    """DescribeProducers of a diskless partition: the batch coordinator keeps its producers."""
    try:
        producers = await b.diskless.describe_producers(t, partition)
    except Exception as err:  # noqa: BLE001 - an error code in the response, never a dropped connection
        code = getattr(err, "code", None)
        return int(code if code is not None else ErrorCode.kafka_storage_error), str(err), []
    return 0, None, [{"producer_id": p.producer_id, "producer_epoch": p.producer_epoch,
                      "last_sequence": p.last_sequence, "last_timestamp": p.last_timestamp,
                      "coordinator_epoch": 0, "current_txn_start_offset": p.current_txn_start_offset}
                     for p in producers]


def _local_log(b: Any, topic: str, partition: int) -> tuple[int, str | None, Any]:
    """(error, message, log) of a classic partition hosted here."""
    t = b.topic(topic)
    if t is None or partition not in t.partitions:
        return int(ErrorCode.unknown_topic_or_partition), "This server does not host this topic-partition.", None
    lg = b.logs.get((topic, partition))
    if lg is None:
        return int(ErrorCode.not_leader_or_follower), f"Broker {b.node_id} does not host {topic}-{partition}", None
    return 0, None, lg


@handler(61, "DescribeProducers", 0, 0)
async def describe_producers(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    topics = []
    for rt in req.topics:
        parts = []
        for idx in rt.partition_indexes:
            if (t := _diskless(b, rt.name, int(idx))) is not None:
                code, message, producers = await _diskless_producers(b, t, int(idx))
                parts.append({"partition_index": int(idx), "error_code": code, "error_message": message,
                              "active_producers": producers})
                continue
            code, message, lg = _local_log(b, rt.name, int(idx))
            producers = []
            if lg is not None:
                open_txns = lg.open_transactions()
                for pid, entry in sorted(lg.producer_state.producers().items()):
                    producers.append({"producer_id": pid, "producer_epoch": entry.producer_epoch,
                                      "last_sequence": entry.last_seq, "last_timestamp": entry.last_timestamp,
                                      "coordinator_epoch": 0, "current_txn_start_offset": open_txns.get(pid, -1)})
            parts.append({"partition_index": int(idx), "error_code": code, "error_message": message,
                          "active_producers": producers})
        topics.append({"name": rt.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}


def _ms_time(ms: int) -> int:
    """A datetime_i64 field from epoch ms. Kafka writes -1 when no transaction is open; kcli
    writes 0, because kio-based clients (kcli's own) refuse to read a negative timestamp."""
    return max(ms, 0)


@handler(65, "DescribeTransactions", 0, 0)
async def describe_transactions(ctx: RequestContext, req: Any) -> dict[str, Any]:
    coord = _coordinator(ctx)
    out = []
    for tid in req.transactional_ids:
        routed = await coord.route(tid) if coord is not None else ErrorCode.coordinator_not_available
        md = coord.txns.get(tid) if coord is not None and not routed else None
        if md is None:
            code = routed or ErrorCode.transactional_id_not_found
            out.append({"error_code": code, "transactional_id": tid, "transaction_state": "",
                        "transaction_timeout": 0, "transaction_start_time": _ms_time(-1), "producer_id": -1,
                        "producer_epoch": -1, "topics": []})
            continue
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(md.partitions):
            by_topic.setdefault(topic, []).append(partition)
        out.append({"error_code": 0, "transactional_id": tid, "transaction_state": md.state,
                    "transaction_timeout": md.timeout_ms, "transaction_start_time": _ms_time(md.start_ms),
                    "producer_id": md.producer_id, "producer_epoch": md.producer_epoch,
                    "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]})
    return {"throttle_time": 0, "transaction_states": out}


@handler(66, "ListTransactions", 0, 1)
async def list_transactions(ctx: RequestContext, req: Any) -> dict[str, Any]:
    from kcli.coordinator.transaction.state import ONGOING, STATES, now_ms

    coord = _coordinator(ctx)
    if coord is None:
        return {"throttle_time": 0, "error_code": ErrorCode.coordinator_not_available, "unknown_state_filters": [],
                "transaction_states": []}
    states = list(req.state_filters or ())
    pids = {int(p) for p in (req.producer_id_filters or ())}
    duration = int(getattr(req, "duration_filter", -1))
    now = now_ms()
    out = []
    for tid, md in sorted(coord.txns.items()):
        if states and md.state not in states:
            continue
        if pids and md.producer_id not in pids:
            continue
        if duration >= 0 and not (md.state == ONGOING and now - md.start_ms > duration):
            continue  # KIP-994: only transactions running longer than the filter
        out.append({"transactional_id": tid, "producer_id": md.producer_id, "transaction_state": md.state})
    return {"throttle_time": 0, "error_code": 0, "unknown_state_filters": [s for s in states if s not in STATES],
            "transaction_states": out}


@handler(27, "WriteTxnMarkers", 1, 1)
async def write_txn_markers(ctx: RequestContext, req: Any) -> dict[str, Any]:
    """What Admin.abortTransaction (kafka-transactions.sh abort) sends to a partition's leader to
    close a hanging transaction: the marker is appended as the coordinator would."""
    from kcli.coordinator.transaction.coordinator import GROUP_MARKER_TOPIC, write_marker

    b = ctx.broker
    markers = []
    for m in req.markers:
        topics = []
        for mt in m.topics:
            parts = []
            for idx in mt.partition_indexes:
                if mt.name == GROUP_MARKER_TOPIC and b.transactions is not None:
                    # from a transaction's coordinator: its offsets passed on from here are decided
                    b.transactions.resolve_passed_on(int(idx), int(m.producer_id))
                    parts.append({"partition_index": int(idx), "error_code": 0})
                    continue
                code, _message, lg = _local_log(b, mt.name, int(idx))
                if lg is not None or _diskless(b, mt.name, int(idx)) is not None:
                    code = await write_marker(b, mt.name, int(idx), bool(m.transaction_result), int(m.producer_id),
                                              int(m.producer_epoch), int(m.coordinator_epoch))
                parts.append({"partition_index": int(idx), "error_code": code})
            topics.append({"name": mt.name, "partitions": parts})
        markers.append({"producer_id": int(m.producer_id), "topics": topics})
    return {"markers": markers}
