"""ListOffsets and DeleteRecords."""

from __future__ import annotations

import asyncio
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.broker.dispatch import RequestContext, handler

LATEST = -1


@handler(2, "ListOffsets", 1, 10)
async def list_offsets(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    topics = []
    read_committed = int(getattr(req, "isolation_level", 0)) == 1
    timeout = getattr(req, "timeout", None)
    timeout_s = timeout.total_seconds() if timeout is not None and timeout.total_seconds() > 0 else None
    for rt in req.topics:
        t = b.topic(rt.name)
        parts = []
        for rp in rt.partitions:
            idx = rp.partition_index
            if t is None or idx not in t.partitions:
                parts.append({"partition_index": idx, "error_code": ErrorCode.unknown_topic_or_partition,
                              "timestamp": -1, "offset": -1, "leader_epoch": -1})
                continue
            try:
                # v10 (KIP-1075): a read of the remote tier waits at most timeout_ms
                offset, ts = await asyncio.wait_for(b.list_offset(t, idx, int(rp.timestamp)), timeout_s)
                if int(rp.timestamp) == LATEST and read_committed:  # Kafka: the latest offset it can see
                    if b.is_diskless(t):
                        offset = await b.diskless.last_stable_offset(t, idx)
                    elif (lg := b.logs.get((t.name, idx))) is not None:
                        offset = lg.last_stable_offset
            except asyncio.TimeoutError:
                parts.append({"partition_index": idx, "error_code": ErrorCode.request_timed_out, "timestamp": -1,
                              "offset": -1, "leader_epoch": -1})
                continue
            except Exception as err:
                code = getattr(err, "code", None)
                if code is None:
                    raise
                parts.append({"partition_index": idx, "error_code": code, "timestamp": -1, "offset": -1, "leader_epoch": -1})
                continue
            parts.append({"partition_index": idx, "error_code": 0, "timestamp": ts, "offset": offset,
                          "leader_epoch": t.partitions[idx].leader_epoch if offset >= 0 else -1,
                          "old_style_offsets": [offset]})
        topics.append({"name": rt.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}


@handler(21, "DeleteRecords", 0, 2)
async def delete_records(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    topics = []
    for rt in req.topics:
        t = b.topic(rt.name)
        parts = []
        for rp in rt.partitions:
            idx = rp.partition_index
            if t is None or idx not in t.partitions:
                parts.append({"partition_index": idx, "low_watermark": -1, "error_code": ErrorCode.unknown_topic_or_partition})
                continue
            try:
                low = await b.delete_records(t, idx, int(rp.offset))
            except Exception as err:
                code = getattr(err, "code", None)
                if code is None:
                    raise
                parts.append({"partition_index": idx, "low_watermark": -1, "error_code": code})
                continue
            parts.append({"partition_index": idx, "low_watermark": low, "error_code": 0})
        topics.append({"name": rt.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}
