"""Topic administration: CreateTopics, DeleteTopics, CreatePartitions, configs."""

from __future__ import annotations

from kio.schema.errors import ErrorCode
from typing import Any

from kcli.broker import audit
from kcli.config.definitions import (BROKER_CONFIGS, DYNAMIC_BROKER_CONFIGS, KAFKA_ONLY_BROKER_CONFIGS, TOPIC_CONFIGS,
                                     broker_config_def)
from kcli.broker.dispatch import RequestContext, handler
from kcli.protocol.errors import BrokerError

# Kafka's controller refuses a request that would write more records than this (MAX_RECORDS_PER_USER_OP);
# without it one request asking for 2^31 partitions would stall the broker.
MAX_PARTITIONS_PER_REQUEST = 10000

TOPIC = 2
BROKER = 4
BROKER_LOGGER = 8

SOURCE_CODES = {"DYNAMIC_TOPIC_CONFIG": 1, "DYNAMIC_BROKER_CONFIG": 2, "STATIC_BROKER_CONFIG": 4, "DEFAULT_CONFIG": 5,
                "DYNAMIC_DEFAULT_BROKER_CONFIG": 3}
TYPE_CODES = {"boolean": 1, "string": 2, "int": 3, "short": 4, "long": 5, "double": 6, "list": 7, "class": 8, "password": 9}


@handler(19, "CreateTopics", 2, 7)
async def create_topics(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    out = []
    seen: set[str] = set()
    default = b.config.get_int("num.partitions")
    total = sum(len(rt.assignments) if rt.assignments else
                (default if rt.num_partitions == -1 else max(0, int(rt.num_partitions))) for rt in req.topics)
    if total > MAX_PARTITIONS_PER_REQUEST:
        return {"throttle_time": 0, "topics": [
            {"name": rt.name, "error_code": ErrorCode.policy_violation, "num_partitions": -1, "replication_factor": -1,
             "error_message": "Excessively large number of partitions per request.", "configs": None}
            for rt in req.topics]}
    for rt in req.topics:
        entry: dict[str, Any] = {"name": rt.name, "error_code": 0, "error_message": None,
                                 "num_partitions": -1, "replication_factor": -1, "configs": None}
        if rt.name in seen:
            entry.update(error_code=ErrorCode.invalid_request, error_message=f"Duplicate topic name {rt.name}")
            out.append(entry)
            continue
        seen.add(rt.name)
        configs = {c.name: c.value for c in rt.configs}
        assignments = {a.partition_index: list(a.broker_ids) for a in rt.assignments} or None
        try:
            if assignments and (rt.num_partitions != -1 or rt.replication_factor != -1):
                raise BrokerError(ErrorCode.invalid_request, "Both numPartitions or replicationFactor and replicasAssignments were set. Both cannot be used at the same time.")
            t = b.create_topic(rt.name, int(rt.num_partitions), int(rt.replication_factor), configs,
                               validate_only=bool(req.validate_only), assignments=assignments)
        except BrokerError as err:
            if not req.validate_only:
                audit.refused(ctx, "creation", rt.name, err)
            entry.update(error_code=err.code, error_message=err.message or None)
            out.append(entry)
            continue
        if t is not None and not req.validate_only:
            audit.changed(ctx, "topic.created", f"Created topic {t.name} with topic ID {audit.topic_id_str(t.topic_id)}, "
                          f"{len(t.partitions)} partition(s) and configs {audit.format_configs(configs)}", t.name,
                          topic_id=audit.topic_id_str(t.topic_id), partitions=len(t.partitions), configs=configs)
        if t is not None:
            eff = b.effective_topic_configs(t)
            entry.update(topic_id=t.topic_id, num_partitions=len(t.partitions), replication_factor=1,
                         configs=[{"name": k, "value": v, "read_only": False, "config_source": SOURCE_CODES[s],
                                   "is_sensitive": False} for k, (v, s) in sorted(eff.items())])
        else:
            entry.update(num_partitions=rt.num_partitions if rt.num_partitions > 0 else b.config.get_int("num.partitions"),
                         replication_factor=1)
        out.append(entry)
    return {"throttle_time": 0, "topics": out}


@handler(20, "DeleteTopics", 1, 6)
async def delete_topics(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    targets: list[tuple[str | None, Any]] = []
    if ctx.api_version >= 6:
        for rt in req.topics:
            targets.append((rt.name, rt.topic_id))
    else:
        targets = [(n, None) for n in req.topic_names]
    out = []
    for name, topic_id in targets:
        entry: dict[str, Any] = {"name": name, "topic_id": topic_id, "error_code": 0, "error_message": None}
        if name is None and topic_id is not None:
            t = b.topic_by_id(topic_id)
            if t is None:
                entry.update(error_code=ErrorCode.unknown_topic_id, error_message="This server does not host this topic ID.")
                out.append(entry)
                continue
            name = t.name
            entry["name"] = name
        try:
            t = b.topic(name)
            if t is not None:
                entry["topic_id"] = t.topic_id
            b.delete_topic(name)
            tid = audit.topic_id_str(entry["topic_id"])
            audit.changed(ctx, "topic.deleted", f"Deleted topic {name} with topic ID {tid}", name, topic_id=tid)
        except BrokerError as err:
            audit.refused(ctx, "deletion", name, err)
            entry.update(error_code=err.code, error_message=err.message or None)
        out.append(entry)
    return {"throttle_time": 0, "responses": out}


@handler(37, "CreatePartitions", 0, 3)
async def create_partitions(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    out = []
    total = sum(max(0, int(rt.count) - len(t.partitions)) for rt in req.topics if (t := b.topic(rt.name)) is not None)
    if total > MAX_PARTITIONS_PER_REQUEST:
        return {"throttle_time": 0, "results": [
            {"name": rt.name, "error_code": ErrorCode.policy_violation,
             "error_message": "Unable to perform excessively large batch operation."} for rt in req.topics]}
    for rt in req.topics:
        entry: dict[str, Any] = {"name": rt.name, "error_code": 0, "error_message": None}
        try:
            b.create_partitions(rt.name, int(rt.count), validate_only=bool(req.validate_only))
            if not req.validate_only:
                audit.changed(ctx, "topic.partitions.created", f"Increased the partition count of topic {rt.name} "
                              f"to {int(rt.count)}", rt.name, partitions=int(rt.count))
        except BrokerError as err:
            if not req.validate_only:
                audit.refused(ctx, "partition creation", rt.name, err)
            entry.update(error_code=err.code, error_message=err.message or None)
        out.append(entry)
    return {"throttle_time": 0, "results": out}


def _config_entry(name: str, value: str | None, source: str, type_: str, doc: str, include_docs: bool,
                  include_synonyms: bool, read_only: bool = False, sensitive: bool = False,
                  synonyms: list[tuple[str, str | None, str]] | None = None) -> dict[str, Any]:
    """One DescribeConfigs entry; ``synonyms`` are (name, value, source) from the level in effect
    down to the default (Kafka lists each level that sets the config)."""
    code = SOURCE_CODES[source]
    levels = synonyms if synonyms is not None else [(name, value, source)]
    return {"name": name, "value": None if sensitive else value, "read_only": read_only, "config_source": code,
            "is_sensitive": sensitive,
            "synonyms": [{"name": n, "value": None if sensitive else v, "source": SOURCE_CODES[src]}
                         for n, v, src in levels] if include_synonyms else [],
            "config_type": TYPE_CODES.get(type_, 0), "documentation": doc if include_docs else None}


def _kafka_only_levels(b: Any, name: str) -> list[tuple[str | None, str]]:
    """(value, source) of a Kafka broker config kcli does not implement at each dynamic level that
    sets it, the one in effect first (this broker's, then the cluster-wide default)."""
    return [(v, source) for resource, source in ((str(b.node_id), "DYNAMIC_BROKER_CONFIG"), ("", "DYNAMIC_DEFAULT_BROKER_CONFIG"))
            if (v := b.state.broker_configs.get(resource, {}).get(name)) is not None]


def _kafka_only_entries(b: Any, keys: set[str] | None, include_docs: bool, include_synonyms: bool) -> list[dict[str, Any]]:
    """The Kafka broker configs kcli does not implement that are set dynamically (for this broker
    or cluster-wide): listed with their source, and with documentation saying they have no effect
    in kcli. Unset ones are left out (kcli does not know Kafka's defaults)."""
    out = []
    for name, d in KAFKA_ONLY_BROKER_CONFIGS.items():
        levels = _kafka_only_levels(b, name) if keys is None or name in keys else []
        if levels:
            value, source = levels[0]
            out.append(_config_entry(name, value, source, d.type, d.doc, include_docs, include_synonyms,
                                     read_only=d.read_only, sensitive=d.sensitive,
                                     synonyms=[(name, v, src) for v, src in levels]))
    return out


@handler(32, "DescribeConfigs", 1, 4)
async def describe_configs(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    include_synonyms = bool(getattr(req, "include_synonyms", False))
    include_docs = bool(getattr(req, "include_documentation", False))
    results = []
    for r in req.resources:
        keys = set(r.configuration_keys) if r.configuration_keys is not None else None
        entry: dict[str, Any] = {"error_code": 0, "error_message": None, "resource_type": r.resource_type,
                                 "resource_name": r.resource_name, "configs": []}
        if r.resource_type == TOPIC:
            t = b.topic(r.resource_name)
            if t is None:
                entry.update(error_code=ErrorCode.unknown_topic_or_partition, error_message=f"Topic {r.resource_name} does not exist")
            else:
                for name, (value, source) in sorted(b.effective_topic_configs(t).items()):
                    if keys is None or name in keys:
                        d = TOPIC_CONFIGS[name]
                        entry["configs"].append(_config_entry(name, value, source, d.type, d.doc, include_docs, include_synonyms,
                                                              synonyms=b.topic_config_levels(t, name)))
                for name, value in sorted(b.extension_topic_state(t).items()):
                    if keys is None or name in keys:
                        entry["configs"].append(_config_entry(name, value, "DYNAMIC_TOPIC_CONFIG", "string",
                                                              "kcli state (read-only)", include_docs, include_synonyms, read_only=True))
        elif r.resource_type == BROKER:
            if r.resource_name not in ("", str(b.node_id)):
                entry.update(error_code=ErrorCode.invalid_request, error_message=f"Unexpected broker id, expected {b.node_id} or empty string, but received {r.resource_name}")
            elif r.resource_name == "":
                # Kafka's default broker resource holds only the cluster-wide dynamic defaults
                for name, value in sorted(b.state.broker_configs.get("", {}).items()):
                    if (keys is None or name in keys) and (d := broker_config_def(name)) is not None:
                        entry["configs"].append(_config_entry(name, value, "DYNAMIC_DEFAULT_BROKER_CONFIG", d.type, d.doc,
                                                              include_docs, include_synonyms, sensitive=d.sensitive))
            else:
                for name, d in sorted(BROKER_CONFIGS.items()):
                    if keys is None or name in keys:
                        levels = b.broker_config_levels(name)
                        value, source = levels[0]
                        entry["configs"].append(_config_entry(name, value, source, d.type, d.doc, include_docs, include_synonyms,
                                                              read_only=name not in DYNAMIC_BROKER_CONFIGS, sensitive=d.sensitive,
                                                              synonyms=[(name, v, src) for v, src in levels]))
                entry["configs"] += _kafka_only_entries(b, keys, include_docs, include_synonyms)
        elif r.resource_type == BROKER_LOGGER:
            entry["configs"] = []
        else:
            entry.update(error_code=ErrorCode.invalid_request, error_message=f"Unsupported resource type {r.resource_type}")
        results.append(entry)
    return {"throttle_time": 0, "results": results}


def _alter_one(ctx: RequestContext, resource_type: int, name: str, changes: dict[str, str | None],
               incremental: bool, validate_only: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"error_code": 0, "error_message": None, "resource_type": resource_type, "resource_name": name}
    try:
        if resource_type == TOPIC:
            ctx.broker.alter_topic_configs(name, changes, incremental=incremental, validate_only=validate_only)
            if not validate_only:
                audit.changed(ctx, "topic.configs.altered", f"{'Incrementally altered' if incremental else 'Altered'} "
                              f"configs of topic {name}: {audit.format_configs(changes)}", name, configs=changes)
        elif resource_type == BROKER:
            ctx.broker.alter_broker_configs(name, changes, incremental=incremental, validate_only=validate_only)
            if not validate_only:
                audit.changed(ctx, "broker.configs.altered", f"{'Incrementally altered' if incremental else 'Altered'} "
                              f"dynamic configs of broker {name or '<default>'}: {audit.format_configs(changes)}",
                              "", broker=name, configs=changes)
        else:
            raise BrokerError(ErrorCode.invalid_request, f"Unsupported resource type {resource_type}")
    except BrokerError as err:
        if not validate_only and resource_type == TOPIC:
            audit.refused(ctx, "config change", name, err)
        entry.update(error_code=err.code, error_message=err.message or None)
    return entry


@handler(33, "AlterConfigs", 0, 2)
async def alter_configs(ctx: RequestContext, req: Any) -> dict[str, Any]:
    out = []
    for r in req.resources:
        changes = {c.name: c.value for c in r.configs}
        out.append(_alter_one(ctx, r.resource_type, r.resource_name, changes, False, bool(req.validate_only)))
    return {"throttle_time": 0, "responses": out}


@handler(44, "IncrementalAlterConfigs", 0, 1)
async def incremental_alter_configs(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    out = []
    for r in req.resources:
        changes: dict[str, str | None] = {}
        error: BrokerError | None = None
        t = b.topic(r.resource_name) if r.resource_type == TOPIC else None
        for c in r.configs:
            op = int(c.config_operation)
            if c.name in changes:
                error = BrokerError(ErrorCode.invalid_request, f"Error due to duplicate config keys: {c.name}")
                break
            if op == 0:
                changes[c.name] = c.value
            elif op == 1:
                changes[c.name] = None
            elif op in (2, 3):
                d = broker_config_def(c.name) if r.resource_type == BROKER else TOPIC_CONFIGS.get(c.name)
                if d is None or d.type != "list":
                    error = BrokerError(ErrorCode.invalid_config, f"Config value append is not allowed for config key: {c.name}")
                    break
                # Kafka's ConfigAdminManager starts from the value in effect (the topic's own,
                # else the broker's, else the default), not from an unset topic value.
                if r.resource_type == BROKER and c.name in KAFKA_ONLY_BROKER_CONFIGS:
                    current = next(iter(_kafka_only_levels(b, c.name)), (None, ""))[0] or ""
                elif r.resource_type == BROKER:
                    current = b.broker_config_levels(c.name)[0][0] or ""
                else:
                    current = (b.effective_topic_configs(t)[c.name][0] if t is not None else None) or ""
                items = [x for x in current.split(",") if x]
                vals = [x for x in (c.value or "").split(",") if x]
                items = items + [v for v in vals if v not in items] if op == 2 else [x for x in items if x not in vals]
                changes[c.name] = ",".join(items)
            else:
                error = BrokerError(ErrorCode.invalid_request, f"Unknown config operation {op}")
                break
        if error is not None:
            out.append({"error_code": error.code, "error_message": error.message, "resource_type": r.resource_type,
                        "resource_name": r.resource_name})
            continue
        out.append(_alter_one(ctx, r.resource_type, r.resource_name, changes, True, bool(req.validate_only)))
    return {"throttle_time": 0, "responses": out}


@handler(22, "InitProducerId", 0, 5)
async def init_producer_id(ctx: RequestContext, req: Any) -> dict[str, Any]:
    b = ctx.broker
    if req.transactional_id is not None:
        from kcli.broker.handlers.transactions import init_transactional_producer

        return await init_transactional_producer(ctx, req)
    existing = int(getattr(req, "producer_id", -1))
    epoch = int(getattr(req, "producer_epoch", -1))
    if existing >= 0 and epoch >= 0 and epoch < 32766:
        # KIP-360: an idempotent producer may bump its epoch to recover from errors.
        return {"throttle_time": 0, "error_code": 0, "producer_id": existing, "producer_epoch": epoch + 1}
    return {"throttle_time": 0, "error_code": 0, "producer_id": b.allocate_producer_id(), "producer_epoch": 0}
