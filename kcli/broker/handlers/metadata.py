"""Metadata and DescribeCluster: brokers, topics, partitions and their leaders."""

from __future__ import annotations

import logging
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.broker import audit
from kcli.broker.broker import INTERNAL_TOPICS, RESERVED_TOPICS
from kcli.broker.dispatch import RequestContext, handler
from kcli.protocol.errors import BrokerError

log = logging.getLogger("kcli.broker.metadata")

AUTHORIZED_OPS_OMITTED = -2147483648


def broker_entries(ctx: RequestContext) -> list[dict[str, Any]]:
    """Brokers with a live registration (kcli/cluster/); this broker at least, since it answers.
    Each at its address on the listener the client connected to (Kafka's rule); a broker
    without that listener is left out."""
    out = []
    for r in ctx.broker.live_brokers():
        endpoint = r.endpoint(ctx.connection.listener)
        if endpoint is not None:
            out.append({"node_id": r.node_id, "host": endpoint[0], "port": endpoint[1], "rack": r.rack})
    return out


def controller_id(ctx: RequestContext) -> int:
    """The broker elected for background decisions; this one when none is known yet."""
    cid = ctx.broker.metadata.controller_id()
    return cid if cid >= 0 else ctx.broker.node_id


def topic_entry(ctx: RequestContext, name: str, producer_view: bool = False) -> dict[str, Any]:
    b = ctx.broker
    t = b.topic(name)
    assert t is not None
    diskless = b.diskless is not None and b.is_diskless(t)
    live = {r.node_id for r in b.live_brokers()}
    # KIP-694: producers are not shown ReadOnly partitions (see kcli/broker/partition_reducer.py).
    if b.partition_reducer is not None:
        visible, topic_id = b.partition_reducer.metadata_view(t, producer_view)
    else:
        visible, topic_id = b.visible_partitions(t), t.topic_id
    parts = []
    for p in visible:
        if diskless:  # any live broker serves it; ISR = in sync with the batch coordinator (KIP-1163)
            parts.append(diskless_partition_entry(ctx, t, p, live))
            continue
        elif len(p.replicas) > 1 and b.replicas is not None:  # replicated (kcli/broker/replica/): leader, ISR
            leader = p.leader if p.leader in live else -1
            parts.append({
                "error_code": 0 if leader >= 0 else ErrorCode.leader_not_available, "partition_index": p.partition,
                "leader_id": leader, "leader_epoch": p.leader_epoch, "replica_nodes": list(p.replicas),
                "isr_nodes": list(p.isr), "offline_replicas": [r for r in p.replicas if r not in live],
            })
            continue
        else:  # one broker holds the log; while it is down the partition is offline, as in Kafka
            host = b.metadata.partition_host(p.leader)
            replicas = [host]
            leader, error = (host, 0) if host in live else (-1, ErrorCode.leader_not_available)
        parts.append({
            "error_code": error, "partition_index": p.partition, "leader_id": leader,
            "leader_epoch": p.leader_epoch, "replica_nodes": replicas,
            "isr_nodes": [r for r in replicas if r in live],
            "offline_replicas": [r for r in replicas if r not in live],
        })
    return {"error_code": 0, "name": name, "topic_id": topic_id, "is_internal": name in INTERNAL_TOPICS,
            "partitions": parts, "topic_authorized_operations": AUTHORIZED_OPS_OMITTED}


def diskless_partition_entry(ctx: RequestContext, t: Any, p: Any, live: set[int]) -> dict[str, Any]:
    """A diskless partition: the leader as kcli/cluster/placement.py picks it for this client; the
    ISR is the live replicas whose local cache is in sync with the batch coordinator
    (kcli/diskless/replica_cache.py)."""
    b = ctx.broker
    return {
        "error_code": 0, "partition_index": p.partition,
        "leader_id": b.diskless.leader_for_client(t, ctx.client_id, p), "leader_epoch": p.leader_epoch,
        "replica_nodes": list(p.replicas), "isr_nodes": b.diskless.isr(t, p),
        "offline_replicas": [r for r in p.replicas if r not in live],
    }


@handler(3, "Metadata", 0, 13)
async def metadata(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    producer_view = b.partition_reducer is not None and b.partition_reducer.producer_view(ctx, req)
    requested = req.topics
    if requested is None or (ctx.api_version == 0 and len(requested) == 0):
        names = sorted(b.state.topics)
        topics = [topic_entry(ctx, n, producer_view) for n in names]
    else:
        topics = []
        auto = b.config.get_bool("auto.create.topics.enable") and getattr(req, "allow_auto_topic_creation", True)
        for rt in requested:
            name = rt.name
            if name is None and getattr(rt, "topic_id", None) is not None:
                t = b.topic_by_id(rt.topic_id)
                if t is None:
                    topics.append({"error_code": ErrorCode.unknown_topic_id, "name": None, "topic_id": rt.topic_id, "partitions": []})
                    continue
                name = t.name
            if b.topic(name) is None:
                if auto and name not in RESERVED_TOPICS:
                    try:
                        t = b.create_topic(name, -1, -1, {})
                        if t is not None:
                            audit.changed(ctx, "topic.created", f"Auto-created topic {name} with topic ID "
                                          f"{audit.topic_id_str(t.topic_id)} and {len(t.partitions)} partition(s)",
                                          name, topic_id=audit.topic_id_str(t.topic_id), partitions=len(t.partitions),
                                          configs={}, auto_created=True)
                        # Kafka answers LEADER_NOT_AVAILABLE for a topic it just created.
                        topics.append({**topic_entry(ctx, name, producer_view), "error_code": ErrorCode.leader_not_available})
                        continue
                    except BrokerError as err:
                        topics.append({"error_code": err.code, "name": name, "partitions": []})
                        continue
                topics.append({"error_code": ErrorCode.unknown_topic_or_partition, "name": name, "partitions": []})
                continue
            topics.append(topic_entry(ctx, name, producer_view))
    return {
        "throttle_time": 0,
        "brokers": broker_entries(ctx),
        "cluster_id": b.cluster_id,
        "controller_id": controller_id(ctx),
        "topics": topics,
        "cluster_authorized_operations": AUTHORIZED_OPS_OMITTED,
    }


@handler(60, "DescribeCluster", 0, 1)
async def describe_cluster(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    return {
        "throttle_time": 0, "error_code": 0, "error_message": None, "endpoint_type": 1,
        "cluster_id": b.cluster_id, "controller_id": controller_id(ctx),
        "brokers": [{"broker_id": e["node_id"], "host": e["host"], "port": e["port"], "rack": e["rack"]}
                    for e in broker_entries(ctx)],
        "cluster_authorized_operations": AUTHORIZED_OPS_OMITTED,
    }
