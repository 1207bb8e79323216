"""Fetch with Kafka's long poll: answer once min_bytes are ready or max_wait passes.

Whole stored batches are returned as they lie on disk (or in WAL objects), never decoded.
The first non-empty partition may exceed max_bytes by one batch so a consumer can always
make progress, as Kafka does. Fetch sessions (KIP-227) are declined with session id 0,
which makes clients send full requests.
"""

from __future__ import annotations

import time
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.broker.authz import from_a_broker
from kcli.broker.dispatch import RequestContext, handler

READ_COMMITTED = 1


def _partition_error(index: int, code: int) -> dict[str, Any]:
    return {"partition_index": index, "error_code": code, "high_watermark": -1, "last_stable_offset": -1,
            "log_start_offset": -1, "aborted_transactions": None, "preferred_read_replica": -1,
            "records": b""}  # empty, not null: librdkafka rejects a null record set ("invalid MessageSetSize -1")


def _preferred_replica(ctx: RequestContext, req: Any, t: Any, idx: int, fetch_offset: int = -1) -> int:
    """KIP-392 for diskless partitions: a consumer that sends its rack (client.rack, Fetch v11+)
    is pointed at a live broker of that rack, which serves the partition as well as any broker;
    -1 when this broker is the one (or the rack has none). A replicated classic partition's
    leader asks ``replica.selector.class`` (kcli/broker/replica/read_replica.py)."""
    b = ctx.broker
    rack = getattr(req, "rack_id", None)
    if rack and b.replicas is not None and not b.is_diskless(t) and replica_id_of(req) < 0:
        return b.replicas.preferred_read_replica(t, idx, rack, fetch_offset)
    if not rack or rack == b.rack or b.diskless is None or not b.is_diskless(t):
        return -1
    preferred = b.diskless.leader_in_rack(t, rack, t.partitions[idx])
    return preferred if preferred != b.node_id else -1


def _lso(b: Any, t: Any, idx: int) -> int | None:
    """The last stable offset of a classic partition hosted here (None otherwise)."""
    lg = b.logs.get((t.name, idx)) if not b.is_diskless(t) else None
    return lg.last_stable_offset if lg is not None else None


def _transactions(b: Any, t: Any, idx: int, res: Any, offset: int,
                  read_committed: bool) -> tuple[int, list[dict[str, int]] | None]:
    """(last stable offset, aborted transactions of the returned range) for a partition answer:
    read_committed fetches get the aborted list (Kafka sends null for read_uncommitted)."""
    if b.is_diskless(t):  # the batch coordinator's answer, carried by the read result
        lso = getattr(res, "last_stable_offset", -1)
        lso = res.high_watermark if lso < 0 else lso
        if not read_committed:
            return lso, None
        return lso, [{"producer_id": a.producer_id, "first_offset": a.first_offset}
                     for a in getattr(res, "aborted_transactions", ())]
    lg = b.logs.get((t.name, idx))
    if lg is None:
        return res.high_watermark, None
    lso = lg.last_stable_offset
    if not read_committed:
        return lso, None
    end = getattr(res, "next_offset", offset)
    # A remote-tier read brings the entries of its transaction indexes: after a restart the log's
    # own list holds only those of the local segments it replayed.
    seen: dict[tuple[int, int], None] = {}
    for a in (*getattr(res, "aborted_transactions", ()), *lg.aborted_transactions(offset, end)):
        seen.setdefault((a.producer_id, a.first_offset), None)
    return lso, [{"producer_id": pid, "first_offset": first} for pid, first in sorted(seen, key=lambda k: k[1])]


def replica_id_of(req: Any) -> int:
    """The fetching follower's broker id (Fetch <= v14 ``replica_id``, v15+ ``replica_state``); -1 for consumers."""
    state = getattr(req, "replica_state", None)
    return int(state.replica_id) if state is not None else int(getattr(req, "replica_id", -1))


async def _read_once(ctx: RequestContext, req: Any, by_id: bool) -> tuple[list[dict[str, Any]], int, bool]:
    b = ctx.broker
    replica_id = replica_id_of(req) if b.replicas is not None else -1
    # a follower's fetch moves the ISR and the high watermark: only another broker may send one
    # (Kafka's ClusterAction check in handleFetchRequest)
    follower_denied = replica_id >= 0 and not from_a_broker(ctx)
    redirected = False
    remaining = int(req.max_bytes) if req.max_bytes > 0 else 0x7FFFFFFF
    total = 0
    out = []
    first_data = True
    read_committed = int(getattr(req, "isolation_level", 0)) == READ_COMMITTED
    for ft in req.topics:
        if by_id:
            t = b.topic_by_id(ft.topic_id)
            name = t.name if t else None
            entry: dict[str, Any] = {"topic_id": ft.topic_id, "partitions": []}
        else:
            name = ft.topic
            t = b.topic(name)
            entry = {"topic": name, "partitions": []}
        for fp in ft.partitions:
            idx = fp.partition
            if t is None or idx not in t.partitions:
                entry["partitions"].append(_partition_error(idx, ErrorCode.unknown_topic_id if (by_id and t is None) else ErrorCode.unknown_topic_or_partition))
                continue
            preferred = _preferred_replica(ctx, req, t, idx, int(fp.fetch_offset))
            if preferred >= 0:
                redirected = True
                hw, ls = b.partition_offsets(t, idx)
                entry["partitions"].append({**_partition_error(idx, 0), "high_watermark": hw, "last_stable_offset": hw,
                                            "log_start_offset": ls, "preferred_read_replica": preferred})
                continue
            limit = min(int(fp.partition_max_bytes), remaining)
            if follower_denied:
                entry["partitions"].append(_partition_error(idx, ErrorCode.topic_authorization_failed))
                continue
            if replica_id >= 0:  # a follower of a replicated partition (kcli/broker/replica/): up to the log end
                answer = b.replicas.fetch_for_follower(t, idx, fp, replica_id, limit, first_data)
                if answer["records"]:
                    first_data = False
                    remaining = max(0, remaining - len(answer["records"]))
                    total += len(answer["records"])
                entry["partitions"].append(answer)
                continue
            try:
                if b.replicas is not None and ctx.api_version >= 11 and b.replicas.serves_as_follower(t, idx):
                    # KIP-392: a consumer (Fetch v11+) reads a follower up to its high watermark
                    res = await b.replicas.read_as_follower(t, idx, fp, limit, min_one=first_data,
                                                            read_committed=read_committed)
                else:
                    res = await b.read_partition(t, idx, int(fp.fetch_offset), limit, min_one=first_data,
                                                 **({"upper_bound": _lso(b, t, idx), "read_committed": True}
                                                    if read_committed else {}))
            except Exception as err:
                code = getattr(err, "code", None)
                if code is None:
                    raise
                pe = _partition_error(idx, code)
                if code == ErrorCode.offset_out_of_range:
                    hw, ls = b.partition_offsets(t, idx)
                    pe.update(high_watermark=hw, last_stable_offset=hw, log_start_offset=ls)
                entry["partitions"].append(pe)
                continue
            size = len(res.records) if res.records else 0
            if size:
                first_data = False
                remaining = max(0, remaining - size)
                total += size
            lso, aborted = _transactions(b, t, idx, res, int(fp.fetch_offset), read_committed)
            entry["partitions"].append({
                "partition_index": idx, "error_code": 0, "high_watermark": res.high_watermark,
                "last_stable_offset": lso, "log_start_offset": res.log_start_offset,
                "aborted_transactions": aborted, "preferred_read_replica": -1,
                "records": bytes(res.records) if size else b"",
            })
        out.append(entry)
    return out, total, redirected


@handler(1, "Fetch", 4, 17)
async def fetch(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    by_id = ctx.api_version >= 13
    max_wait_s = max(0.0, req.max_wait.total_seconds())
    deadline = time.monotonic() + max_wait_s
    keys = []
    for ft in req.topics:
        t = b.topic_by_id(ft.topic_id) if by_id else b.topic(ft.topic)
        if t is not None:
            keys += [(t.name, fp.partition) for fp in ft.partitions]
    while True:
        responses, total, redirected = await _read_once(ctx, req, by_id)
        left = deadline - time.monotonic()
        # a redirect to a preferred read replica is answered at once, as Kafka's ReplicaManager does
        if total >= max(1, int(req.min_bytes)) or left <= 0 or b.stopping or not keys or redirected:
            break
        await b.notifier.wait(keys, left)
    for entry in responses:  # Kafka's BytesOutPerSec, per topic: what this response carries
        sent = sum(len(p["records"]) for p in entry["partitions"] if p.get("records"))
        name = entry.get("topic") or (t.name if (t := b.topic_by_id(entry.get("topic_id"))) else None)
        if sent and name:
            b.metrics.inc_labelled("topic.bytes_out", {"topic": name}, sent)
    return {"throttle_time": 0, "error_code": 0, "session_id": 0, "responses": responses}
