"""Checks of new metadata records against the state they will follow in a shared log.

With one broker, request handlers validate against the state before they build records, and
nothing can change in between. With several brokers, another one may append first (the same
topic name, a deleted topic, the same producer id block); the store re-checks each new record
against the state that includes every record before it, inside the append's lock, and refuses
the whole batch before anything is written. Codes follow Kafka's answers for the same races.
"""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.metadata.metadata_log import ClusterState
from kcli.protocol.errors import BrokerError

TOPIC_RESOURCE = 2


def check_conflicts(state: ClusterState, records: list[dict[str, Any]]) -> None:
    """Raise BrokerError if ``records`` do not fit after ``state`` (records already checked
    with :func:`kcli.metadata.metadata_log.check_record`)."""
    new_names: set[str] = set()
    new_ids: set[uuid.UUID] = set()
    new_parts: set[tuple[uuid.UUID, int]] = set()
    known_ids = {t.topic_id for t in state.topics.values()}
    for rec in records:
        kind, d = rec["type"], rec["data"]
        if kind == "ClusterIdRecord":
            if state.cluster_id and state.cluster_id != d["clusterId"]:
                raise BrokerError(ErrorCode.not_controller, f"the cluster already has id {state.cluster_id}")
        elif kind == "TopicRecord":
            tid = uuid.UUID(d["topicId"])
            if d["name"] in state.topics or d["name"] in new_names:
                raise BrokerError(ErrorCode.topic_already_exists, f"Topic '{d['name']}' already exists.")
            if tid in known_ids or tid in new_ids:
                raise BrokerError(ErrorCode.not_controller, f"topic id {tid} is already in use")
            new_names.add(d["name"])
            new_ids.add(tid)
        elif kind == "ProducerIdsRecord":
            if d["nextProducerId"] <= state.next_producer_id:
                raise BrokerError(ErrorCode.not_controller, "producer ids were allocated by another broker meanwhile")
        elif kind == "ConfigRecord" and d["resourceType"] == TOPIC_RESOURCE:
            if d["resourceName"] not in state.topics and d["resourceName"] not in new_names:
                raise BrokerError(ErrorCode.unknown_topic_or_partition, f"Topic {d['resourceName']} does not exist")
        elif "topicId" in d:
            tid = uuid.UUID(d["topicId"])
            if tid not in known_ids and tid not in new_ids:
                raise BrokerError(ErrorCode.unknown_topic_or_partition, f"topic id {tid} does not exist")
            if kind == "PartitionRecord":
                t = state.topic_by_id(tid)
                key = (tid, d["partitionId"])
                if (t is not None and d["partitionId"] in t.partitions) or key in new_parts:
                    raise BrokerError(ErrorCode.invalid_partitions,
                                      f"partition {d['partitionId']} was created by another broker meanwhile")
                new_parts.add(key)
            elif kind == "PartitionChangeRecord":
                _check_partition_change(state, tid, d)


def _check_partition_change(state: ClusterState, tid: uuid.UUID, d: dict[str, Any]) -> None:
    """AlterPartition's fencing, at append time: an ISR or leader change computed from a partition
    state that is no longer current (another change came first: a new leader, a shrink by the
    controller) is refused, so a leader cut off or stale cannot commit it. The new ISR must be
    replicas of the partition and the leader one of them (Kafka's ReplicationControlManager
    checks, INELIGIBLE_REPLICA / INVALID_REQUEST)."""
    t = state.topic_by_id(tid)
    p = t.partitions.get(d["partitionId"]) if t is not None else None
    if p is None:
        if not {"leader", "isr", "expectedPartitionEpoch", "expectedLeaderEpoch"} & set(d):
            return  # a KIP-694 mode change of a partition already gone: applied as a no-op, as before
        raise BrokerError(ErrorCode.unknown_topic_or_partition, f"partition {d['partitionId']} of topic id {tid} does not exist")
    if "expectedPartitionEpoch" in d and d["expectedPartitionEpoch"] != p.partition_epoch:
        raise BrokerError(ErrorCode.fenced_leader_epoch if d.get("expectedLeaderEpoch", p.leader_epoch) != p.leader_epoch
                          else ErrorCode.invalid_update_version,
                          f"partition {t.name}-{p.partition} is at partition epoch {p.partition_epoch}, "
                          f"the change was made from {d['expectedPartitionEpoch']}")
    if "expectedLeaderEpoch" in d and d["expectedLeaderEpoch"] != p.leader_epoch:
        raise BrokerError(ErrorCode.fenced_leader_epoch,
                          f"partition {t.name}-{p.partition} is at leader epoch {p.leader_epoch}, "
                          f"the change was made from {d['expectedLeaderEpoch']}")
    replicas = d.get("replicas", p.replicas)  # a reassignment changes them in the same record
    if "isr" in d and any(r not in replicas for r in d["isr"]):
        raise BrokerError(ErrorCode.ineligible_replica, f"ISR {d['isr']} of {t.name}-{p.partition} names a broker "
                          f"that is not one of its replicas {replicas}")
    if d.get("leader", -1) >= 0 and d["leader"] not in replicas:
        raise BrokerError(ErrorCode.invalid_request, f"leader {d['leader']} of {t.name}-{p.partition} is not a replica")
    if "replicas" in d and "isr" not in d and any(r not in replicas for r in p.isr):
        raise BrokerError(ErrorCode.invalid_replica_assignment, f"replicas {replicas} of {t.name}-{p.partition} leave "
                          f"out ISR members {p.isr}")
    for name in ("addingReplicas", "removingReplicas"):
        if any(r not in replicas for r in d.get(name, [])):
            raise BrokerError(ErrorCode.invalid_replica_assignment, f"{name} {d[name]} of {t.name}-{p.partition} "
                              f"are not all in its replicas {replicas}")
