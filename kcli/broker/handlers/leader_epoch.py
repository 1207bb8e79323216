"""OffsetForLeaderEpoch (API 23): the end offset of a leader epoch, with Kafka's semantics over
kcli's single leader epoch per partition (the one Metadata and Fetch report).

A consumer (librdkafka with KIP-320, after a leader change or when it validates a position) asks
where the epoch of its last fetched batch ends, to detect truncation. kcli's epoch cache has one
entry, the partition's epoch starting at the log start, so Kafka's LeaderEpochFileCache.endOffsetFor
gives: the current epoch → (epoch, log end offset); an older epoch → (that epoch, start of the
current epoch); a newer epoch or -1 → (-1, -1). current_leader_epoch fences as in Fetch.
"""

from __future__ import annotations

from typing import Any

from kcli.broker.dispatch import RequestContext, handler
from kcli.protocol.errors import BrokerError, ErrorCode


def _end_offset(ctx: RequestContext, topic: str, partition: int, current: int, requested: int) -> tuple[int, int, int]:
    """(error code, leader epoch, end offset) of one partition."""
    b = ctx.broker
    t = b.topic(topic)
    p = t.partitions.get(partition) if t is not None else None
    if t is None or p is None:
        return ErrorCode.unknown_topic_or_partition, -1, -1
    if current >= 0 and current < p.leader_epoch:
        return ErrorCode.fenced_leader_epoch, -1, -1
    if current > p.leader_epoch:
        return ErrorCode.unknown_leader_epoch, -1, -1
    if len(p.replicas) > 1 and not b.is_diskless(t):  # replicated: the log's leader-epoch cache (KIP-101)
        try:
            lg = b.log_for(t, partition)  # the leader answers (its followers truncate to it)
        except BrokerError as err:
            return err.code, -1, -1
        epoch, end = lg.end_offset_for_epoch(requested)
        return ErrorCode.none, epoch, end
    try:
        end, start = b.partition_offsets(t, partition) if b.is_diskless(t) else _classic(b, t, partition)
    except BrokerError as err:
        return err.code, -1, -1
    if end < 0:
        return ErrorCode.unknown_topic_or_partition, -1, -1
    if requested == p.leader_epoch:
        return ErrorCode.none, requested, end
    if 0 <= requested < p.leader_epoch:
        return ErrorCode.none, requested, start
    return ErrorCode.none, -1, -1


def _classic(b: Any, t: Any, partition: int) -> tuple[int, int]:
    lg = b.log_for(t, partition)  # NOT_LEADER_OR_FOLLOWER when another broker holds the log
    return lg.log_end_offset, lg.log_start_offset


@handler(23, "OffsetForLeaderEpoch", 2, 4)
async def offset_for_leader_epoch(ctx: RequestContext, req: Any) -> dict[str, Any]:
    topics = []
    for rt in req.topics:
        parts = []
        for rp in rt.partitions:
            code, epoch, end = _end_offset(ctx, rt.topic, int(rp.partition), int(rp.current_leader_epoch),
                                           int(rp.leader_epoch))
            parts.append({"error_code": code, "partition": int(rp.partition), "leader_epoch": epoch, "end_offset": end})
        topics.append({"topic": rt.topic, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}
