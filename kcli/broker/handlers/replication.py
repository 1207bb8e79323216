"""The controller's replica APIs: ElectLeaders, AlterPartitionReassignments and
ListPartitionReassignments (kcli/broker/replica/reassignment.py has the rules)."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kcli.broker import audit
from kcli.broker.dispatch import RequestContext, handler
from kcli.broker.replica import controller as ctl
from kcli.broker.replica import reassignment

ELECTION_TYPES = {0: ctl.PREFERRED, 1: ctl.UNCLEAN}


@handler(43, "ElectLeaders", 0, 2)
async def elect_leaders(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    kind = int(getattr(req, "election_type", 0))  # v0 elects preferred leaders only
    election = ELECTION_TYPES.get(kind)
    if election is None:
        return {"throttle_time": 0, "error_code": ErrorCode.invalid_request, "replica_election_results": []}
    wanted = None if req.topic_partitions is None else [
        (tp.topic, [int(p) for p in tp.partitions]) for tp in req.topic_partitions]
    results = reassignment.elect_leaders(b, election, wanted)
    elected = [f"{r['topic']}-{p['partition_id']}" for r in results for p in r["partition_result"] if not p["error_code"]]
    if elected:
        audit.changed(ctx, "partition.leaders_elected", f"Elected {election} leaders for partitions {', '.join(elected)}",
                      elected[0].rsplit("-", 1)[0], partitions=elected, election=election)
    return {"throttle_time": 0, "error_code": 0, "replica_election_results": results}


@handler(45, "AlterPartitionReassignments", 0, 0)
async def alter_partition_reassignments(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    topics = [(t.name, [(int(p.partition_index), None if p.replicas is None else [int(r) for r in p.replicas])
                        for p in t.partitions]) for t in req.topics]
    responses = reassignment.alter_reassignments(b, topics)
    for (name, parts), answer in zip(topics, responses):
        for (idx, target), res in zip(parts, answer["partitions"]):
            if not res["error_code"]:
                what = "Cancelled the reassignment" if target is None else f"Started a reassignment to replicas {target}"
                audit.changed(ctx, "partition.reassignment", f"{what} of partition {name}-{idx}", name,
                              partition=idx, replicas=target)
    return {"throttle_time": 0, "error_code": 0, "error_message": None, "responses": responses}


@handler(46, "ListPartitionReassignments", 0, 0)
async def list_partition_reassignments(ctx: RequestContext, req: Any) -> dict[str, Any]:
    topics = None if req.topics is None else [(t.name, [int(p) for p in t.partition_indexes]) for t in req.topics]
    return {"throttle_time": 0, "error_code": 0, "error_message": None,
            "topics": reassignment.list_reassignments(ctx.broker, topics)}
