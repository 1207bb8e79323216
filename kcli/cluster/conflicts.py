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

from kcli.broker.metadata_log import ClusterState
from kcli.protocol.errors import BrokerError

TOPIC_RESOURCE = 2


def check_conflicts(state: ClusterState, records: list[dict[str, Any]]) -> None:
    """Raise BrokerError if ``records`` do not fit after ``state`` (records already checked
    with :func:`kcli.broker.metadata_log.check_record`)."""
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
