"""DescribeLogDirs (API 35): kcli's one log dir (the data dir) and the classic partition logs in it.

Kafka's answer per partition: the local log size, the offset lag (LEO - high watermark; a kcli
log's high watermark is its end, so 0) and is_future false (kcli has no AlterReplicaLogDirs).
Diskless partitions have no local log and are not listed; tiered ones count their local bytes only.
"""

from __future__ import annotations

import os
from typing import Any

from kcli.broker.dispatch import RequestContext, handler
from kcli.protocol.errors import ErrorCode


@handler(35, "DescribeLogDirs", 1, 4)
async def describe_log_dirs(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    wanted: dict[str, set[int]] | None = None
    if req.topics is not None:
        wanted = {}
        for rt in req.topics:
            wanted.setdefault(rt.topic, set()).update(int(p) for p in rt.partitions)
    topics: dict[str, list[dict[str, Any]]] = {}
    for (name, partition), lg in sorted(b.logs.items()):
        if wanted is not None and partition not in wanted.get(name, ()):
            continue
        topics.setdefault(name, []).append({"partition_index": partition, "partition_size": lg.size_in_bytes,
                                            "offset_lag": max(0, lg.log_end_offset - lg.high_watermark), "is_future_key": False})
    try:
        st = os.statvfs(b.data_dir)
        total, usable = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        code = ErrorCode.none
    except OSError:  # Kafka marks a log dir it cannot read KAFKA_STORAGE_ERROR
        total = usable = -1
        code = ErrorCode.kafka_storage_error
    result = {"error_code": code, "log_dir": str(b.data_dir.resolve()), "total_bytes": total, "usable_bytes": usable,
              "topics": [{"name": n, "partitions": parts} for n, parts in sorted(topics.items())]}
    return {"throttle_time": 0, "error_code": ErrorCode.none, "results": [result]}
