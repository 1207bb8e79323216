"""Produce: append producer batches byte-for-byte, group-commit fsync for acks=all.

Appends to classic logs happen synchronously before the handler first awaits, so the
order of requests on a connection is the order batches land in a partition — the
property idempotent producers with several in-flight requests depend on.
Diskless partitions are handed to the diskless appender and answered when their WAL
object is committed; a request mixing both kinds waits for both.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.broker.broker import now_ms
from kcli.broker.dispatch import RequestContext, handler
from kcli.metadata.metadata_log import MODE_READ_ONLY
from kcli.protocol.errors import BrokerError
from kcli.protocol.interbroker import InterBrokerError, request as inter_broker_request
from kcli.records.batch import InvalidBatchError, iter_headers, read_header

log = logging.getLogger("kcli.broker.produce")



def record_count(records: bytes) -> int:
    """Records in a produced record set (from the batch headers; a partial tail counts nothing)."""
    try:
        return sum(h.last_offset_delta + 1 for h in iter_headers(records))
    except InvalidBatchError:
        return 0


def _error(index: int, code: int, message: str | None = None) -> dict[str, Any]:
    return {"index": index, "error_code": code, "base_offset": -1, "log_append_time": -1,
            "log_start_offset": -1, "record_errors": [], "error_message": message}


def _verify_transactional(b: Any, transactional_id: str, records: bytes, key: tuple[str, int]) -> int:
    """A transactional Produce is accepted only from the current producer of the id, for a
    partition it added to its open transaction (0 when so)."""
    if b.transactions is None:
        return ErrorCode.coordinator_not_available
    try:
        h = read_header(records or b"")
    except InvalidBatchError:
        return ErrorCode.corrupt_message
    return int(b.transactions.verify_produce(transactional_id, h.producer_id, h.producer_epoch, key))


# What a Produce answers for the transaction coordinator's answer to an implicit add (Kafka's
# AddPartitionsToTxnManager): the retriable ones become NOT_ENOUGH_REPLICAS, which every client retries.
_IMPLICIT_ADD_ERRORS = {int(ErrorCode.producer_fenced): int(ErrorCode.invalid_producer_epoch),
                        int(ErrorCode.concurrent_transactions): int(ErrorCode.not_enough_replicas),
                        int(ErrorCode.coordinator_not_available): int(ErrorCode.not_enough_replicas),
                        int(ErrorCode.not_coordinator): int(ErrorCode.not_enough_replicas),
                        int(ErrorCode.coordinator_load_in_progress): int(ErrorCode.not_enough_replicas)}


async def _add_partitions_implicitly(ctx: RequestContext, req: Any) -> dict[tuple[str, int], int]:
    """Transactions v2 (KIP-890): a Produce v12 adds its partitions to the producer's transaction
    at the coordinator (here, or an AddPartitionsToTxn v5 to the broker coordinating the id).
    Awaits only when it writes or asks another broker."""
    b = ctx.broker
    coord = b.transactions
    wanted: dict[tuple[int, int], list[tuple[str, int]]] = {}
    codes: dict[tuple[str, int], int] = {}
    for td in req.topic_data:
        t = b.topic(td.name)
        for pd in td.partition_data:
            if t is None or pd.index not in t.partitions:
                continue
            try:
                h = read_header(pd.records or b"")
            except InvalidBatchError:
                continue  # the append answers CORRUPT_MESSAGE
            wanted.setdefault((h.producer_id, h.producer_epoch), []).append((td.name, pd.index))
    for (pid, epoch), tps in wanted.items():
        if coord is None:
            got = {tp: int(ErrorCode.coordinator_not_available) for tp in tps}
        elif coord.coordinator_of(req.transactional_id) == b.node_id:
            got = await coord.add_partitions_implicit(req.transactional_id, pid, epoch, tps)
        else:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in tps:
                by_topic.setdefault(topic, []).append(partition)
            body = {"transactions": [{"transactional_id": req.transactional_id, "producer_id": pid,
                                      "producer_epoch": epoch, "verify_only": False,
                                      "topics": [{"name": n, "partitions": ps} for n, ps in by_topic.items()]}]}
            try:
                resp = await inter_broker_request(b, coord.coordinator_of(req.transactional_id), 24, 5, body)
                got = {(t.name, int(p.partition_index)): int(p.partition_error_code)
                       for r in resp.results_by_transaction for t in r.topic_results for p in t.results_by_partition}
                if int(resp.error_code):
                    got = {tp: int(resp.error_code) for tp in tps}
            except InterBrokerError:
                got = {}
            got = {tp: got.get(tp, int(ErrorCode.coordinator_not_available)) for tp in tps}
        for tp, code in got.items():
            if int(code):
                codes[tp] = _IMPLICIT_ADD_ERRORS.get(int(code), int(code))
    return codes


@handler(0, "Produce", 3, 12)
async def produce(ctx: RequestContext, req: Any) -> dict[str, Any] | None:
    b = ctx.broker
    acks = int(req.acks)
    results: dict[tuple[str, int], dict[str, Any]] = {}
    implicit: dict[tuple[str, int], int] = {}
    if req.transactional_id is not None and ctx.api_version >= 12 and b.transactions is not None \
            and b.config.get_int("transaction.version") >= 2:
        # The add may wait (a state write, another broker): the connection's transactional
        # Produces take turns, so their appends still land in request order. The turn passes
        # on once this handler next waits, i.e. after its appends (or if it fails).
        turn = ctx.connection.extra.setdefault("produce.implicit_add_turn", asyncio.Lock())
        await turn.acquire()
        try:
            implicit = await _add_partitions_implicitly(ctx, req)
        finally:
            asyncio.get_running_loop().call_soon(turn.release)
    now = now_ms()
    pending: dict[tuple[str, int], asyncio.Future[dict[str, Any]]] = {}
    touched: set[Any] = set()
    appended: dict[tuple[str, int], bytes] = {}  # what each partition was sent, for the byte counters
    replicated: dict[tuple[str, int], tuple[Any, Any, int]] = {}  # acks=all: (topic, partition, offset to reach)
    order: list[tuple[str, list[int]]] = []
    for td in req.topic_data:
        name = td.name
        order.append((name, [pd.index for pd in td.partition_data]))
        t = b.topic(name)
        for pd in td.partition_data:
            key = (name, pd.index)
            if acks not in (0, 1, -1):
                results[key] = _error(pd.index, ErrorCode.invalid_required_acks)
                continue
            p = t.partitions.get(pd.index) if t is not None else None
            if key in implicit:
                results[key] = _error(pd.index, implicit[key])
                continue
            if req.transactional_id is not None and t is not None and p is not None:
                code = _verify_transactional(b, req.transactional_id, pd.records, key)
                if code:
                    results[key] = _error(pd.index, code, "the partition is not part of the producer's transaction"
                                          if code == ErrorCode.invalid_txn_state else None)
                    continue
            if t is None or p is None:
                results[key] = _error(pd.index, ErrorCode.unknown_topic_or_partition,
                                      "This server does not host this topic-partition.")
                continue
            if p.mode == MODE_READ_ONLY:
                # KIP-694: a retriable error makes unmodified clients refresh metadata, where
                # producers no longer see this partition; kcli's own PARTITION_READ_ONLY (201) is
                # unknown to them, and they would fail the records instead of moving on.
                results[key] = _error(pd.index, ErrorCode.not_leader_or_follower,
                                      f"Partition {name}-{pd.index} is read-only (being deleted, KIP-694) "
                                      "and takes no new records; refresh metadata")
                b.metrics.inc("produce.rejected.read_only")
                continue
            records = pd.records
            if not records:
                results[key] = _error(pd.index, ErrorCode.corrupt_message, "empty records")
                continue
            appended[key] = records
            if b.is_diskless(t):
                try:
                    pending[key] = b.diskless_engine().append(t, pd.index, records)
                except BrokerError as err:  # diskless.system.enable=false on this broker
                    results[key] = _error(pd.index, err.code, err.message)
                continue
            try:
                lg = b.log_for(t, pd.index)  # NOT_LEADER_OR_FOLLOWER when another broker hosts it
            except BrokerError as err:
                results[key] = _error(pd.index, err.code, err.message)
                continue
            log_append = b.topic_config_value(t, "message.timestamp.type") == "LogAppendTime"
            if acks == -1 and b.replicas is not None and len(p.replicas) > 1:
                refused = b.replicas.check_min_isr(t, p)  # NOT_ENOUGH_REPLICAS before the append
                if refused is not None:
                    results[key] = _error(pd.index, refused.code, refused.message)
                    continue
            try:
                res = lg.append(records, now_ms=now, log_append_time=log_append, leader_epoch=p.leader_epoch)
            except Exception as err:
                code = getattr(err, "code", None)
                if code is None:
                    log.exception("append to %s-%d failed", name, pd.index)
                    code = ErrorCode.kafka_storage_error
                results[key] = _error(pd.index, code, str(err) or None)
                # Kafka's RecordValidationException (a key-less record for a compacted topic):
                # which records were refused, in Produce v8+'s record_errors
                results[key]["record_errors"] = [
                    {"batch_index": i, "batch_index_error_message": m} for i, m in getattr(err, "record_errors", [])
                ]
                continue
            touched.add(lg)
            b.notifier.notify(name, pd.index)
            if b.replicas is not None and len(p.replicas) > 1:  # kcli/broker/replica/: the ISR must catch up
                b.replicas.appended(t, p)
                if acks == -1:
                    replicated[key] = (t, p, res.last_offset + 1)
            results[key] = {"index": pd.index, "error_code": 0, "base_offset": res.base_offset,
                            "log_append_time": res.log_append_time, "log_start_offset": res.log_start_offset,
                            "record_errors": [], "error_message": None}
    if touched and acks == -1 and b.config.get_bool("log.flush.fsync.acks.all"):
        try:
            await b.flusher.flush(touched)
        except OSError as err:
            log.error("fsync failed: %s", err)
            for key, r in results.items():
                if r["error_code"] == 0:
                    results[key] = _error(key[1], ErrorCode.kafka_storage_error, f"fsync failed: {err}")
    if replicated:  # acks=all on replicated partitions: until the high watermark passes each append
        timeout_s = max(0.0, req.timeout.total_seconds())
        waits = {key: b.replicas.wait_for_acks(t, p, offset, timeout_s) for key, (t, p, offset) in replicated.items()}
        for key, refused in zip(waits, await asyncio.gather(*waits.values())):
            if refused is not None and results[key]["error_code"] == 0:
                results[key] = _error(key[1], refused.code, refused.message)
    for key, fut in pending.items():
        try:
            results[key] = await fut
        except BrokerError as err:
            results[key] = _error(key[1], err.code, err.message or None)
    for key, records in appended.items():  # Kafka's BytesInPerSec / MessagesInPerSec, per topic
        if results[key]["error_code"] == 0:
            b.metrics.inc_labelled("topic.bytes_in", {"topic": key[0]}, len(records))
            b.metrics.inc_labelled("topic.messages_in", {"topic": key[0]}, record_count(records))
    if acks == 0:
        return None
    return {
        "responses": [
            {"name": name, "partition_responses": [results[(name, idx)] for idx in idxs]}
            for name, idxs in order
        ],
        "throttle_time": 0,
    }
