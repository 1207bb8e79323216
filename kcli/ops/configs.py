"""Configs of one topic or broker as kafka-configs.sh (ConfigCommand) reads and changes them:
DescribeConfigs with each entry's source, sensitivity and synonyms, and one
IncrementalAlterConfigs request that deletes and sets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from kcli.errors import KafkaApiError, UsageError
from kcli.ops.connection import Connection, admin
from kcli.ops.topics import _source_name, validate_topic_name

RESOURCE_TYPES = {"topic": ResourceType.TOPIC, "broker": ResourceType.BROKER}
# the source of a resource's own (dynamic) value, per resource kind; "" names the broker default
DYNAMIC_SOURCES = {"topic": "DYNAMIC_TOPIC_CONFIG", "broker": "DYNAMIC_BROKER_CONFIG",
                   "broker-default": "DYNAMIC_DEFAULT_BROKER_CONFIG"}


@dataclass
class ConfigItem:
    name: str
    value: str | None
    source: str  # Kafka's ConfigSource name (DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG, ...)
    sensitive: bool
    read_only: bool
    synonyms: list[tuple[str, str, str | None]] = field(default_factory=list)  # (source, name, value)


def _resource(kind: str, name: str) -> ConfigResource:
    if kind not in RESOURCE_TYPES:
        raise UsageError(f"config resource kind must be topic or broker, got {kind!r}")
    if kind == "topic":
        validate_topic_name(name)
    if kind == "broker" and name == "":
        # confluent-kafka refuses a ConfigResource with an empty name (Kafka's "default broker")
        raise UsageError("the cluster-wide broker default cannot be named here; name a broker id instead")
    return ConfigResource(RESOURCE_TYPES[kind], name)


def broker_ids(conn: Connection) -> list[int]:
    client = admin(conn)
    from kcli.ops.topics import _metadata

    return sorted(_metadata(client, conn.timeout_s).brokers)


def describe_configs(conn: Connection, kind: str, name: str, *, dynamic_only: bool = False) -> list[ConfigItem]:
    """Every config of the topic or broker ``name`` (``""``: the cluster-wide broker default),
    sorted by name; ``dynamic_only`` keeps those set on the resource itself, as kafka-configs
    --describe without --all does. kcli's read-only ``kcli.*`` state entries are left out."""
    resource = _resource(kind, name)
    client = admin(conn)
    what = f"{kind} '{name}'" if name else "the broker default"
    entries = client.wait(client.describe_configs([resource], request_timeout=conn.timeout_s)[resource], what)
    wanted = DYNAMIC_SOURCES["broker-default" if kind == "broker" and name == "" else kind]
    out = []
    for key in sorted(entries):
        if key.startswith("kcli."):
            continue
        e = entries[key]
        source = _source_name(e.source)
        if dynamic_only and source != wanted:
            continue
        synonyms = [(_source_name(s.source), s.name, s.value) for s in (getattr(e, "synonyms", None) or {}).values()]
        if source not in {s[0] for s in synonyms}:
            # Kafka lists the entry itself first; confluent-kafka keys synonyms by name, so an
            # override named as its default (kcli's broker does) is folded into the entry
            synonyms.insert(0, (source, key, e.value))
        out.append(ConfigItem(key, e.value, source, bool(e.is_sensitive), bool(e.is_read_only), synonyms))
    return out


def alter_configs(conn: Connection, kind: str, name: str, set_configs: dict[str, str],
                  delete_configs: list[str]) -> None:
    """One IncrementalAlterConfigs request: DELETE each of ``delete_configs`` (each must be set
    on the resource, else ``INVALID_CONFIG: Invalid config(s): ...`` as kafka-configs checks),
    then SET ``set_configs``."""
    if not set_configs and not delete_configs:
        raise UsageError("nothing to alter: give configs to set or delete")
    current = {c.name for c in describe_configs(conn, kind, name, dynamic_only=True)}
    invalid = [k for k in delete_configs if k not in current]
    if invalid:
        raise KafkaApiError("INVALID_CONFIG", "Invalid config(s): " + ",".join(invalid))
    ops = [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in delete_configs]
    ops += [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in set_configs.items()]
    resource = _resource(kind, name)
    resource = ConfigResource(resource.restype, name, incremental_configs=ops)
    client = admin(conn)
    what = f"{kind} '{name}'" if name else "the broker default"
    for fut in client.incremental_alter_configs([resource], request_timeout=conn.timeout_s).values():
        client.wait(fut, what)
