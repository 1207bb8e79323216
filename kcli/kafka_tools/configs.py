"""kafka-configs.sh (Kafka 4's ConfigCommand) for topics and brokers over kcli.ops.configs.

KIP-950 is driven through it: ``--alter --entity-type topics --entity-name T --add-config
remote.storage.enable=false,remote.log.disable.policy=delete`` (or Kafka 3.9's
``remote.log.delete.on.disable=true`` / ``remote.log.copy.disable=true``) is one
IncrementalAlterConfigs request the broker turns into a disablement."""

from __future__ import annotations

import re
from typing import Any

from kcli.errors import KcliError
from kcli.kafka_tools import common
from kcli.kafka_tools.common import ToolError, ToolParser, cannot_combine

PROG = "kafka-configs.sh"
# ConfigCommand's entity types (BROKER_SUPPORTED_CONFIG_TYPES); kcli serves topics and brokers
ENTITY_TYPES = ("broker-loggers", "topics", "clients", "users", "brokers", "ips", "client-metrics", "groups")
SUPPORTED = ("topics", "brokers")
ENTITY_FLAGS = (("topic", "topics"), ("client", "clients"), ("user", "users"), ("broker", "brokers"),
                ("broker_logger", "broker-loggers"), ("ip", "ips"), ("client_metrics", "client-metrics"),
                ("group", "groups"))
DEFAULT_FLAGS = (("client_defaults", "clients"), ("user_defaults", "users"), ("broker_defaults", "brokers"),
                 ("ip_defaults", "ips"))
_SPLIT_COMMA = re.compile(r",(?=[^\]]*(?:\[|$))")
_SPLIT_EQ = re.compile(r"\s*=\s*(?=[^\]]*(?:\[|$))")


class _EntityName:
    """--entity-name / --entity-default in command-line order (Kafka pairs them with the types)."""


def parser() -> ToolParser:
    p = ToolParser(PROG, "This tool helps to manipulate and describe entity config for a topic, client, user, "
                         "broker, ip, client-metrics or group")
    p.value("bootstrap-server", "The Kafka servers to connect to.", metavar="server to connect to")
    p.value("bootstrap-controller", "The Kafka controllers to connect to (kcli: the broker).",
            metavar="controller to connect to")
    p.value("command-config", "Property file containing configs to be passed to Admin Client.",
            metavar="command config property file")
    p.flag("alter", "Alter the configuration for the entity.")
    p.flag("describe", "List configs for the given entity.")
    p.flag("all", "List all configs for the given entity, including static configs if available.")
    p.value("entity-type", "Type of entity (topics/clients/users/brokers/broker-loggers/ips/client-metrics/groups)",
            repeat=True, metavar="entity-type")
    p.add_argument("--entity-name", action="append", dest="entity_names", default=[], metavar="entity-name",
                   help="Name of entity (topic name/broker id)")
    p.add_argument("--entity-default", action="append_const", const="", dest="entity_names",
                   help="Default entity name for brokers (applies to corresponding entity type)")
    p.value("add-config", "Key Value pairs of configs to add. Square brackets can be used to group values which "
                          "contain commas: 'k1=v1,k2=[v1,v2,v2],k3=v3'.", metavar="add-config")
    p.value("add-config-file", "Path to a properties file with configs to add.", metavar="add-config-file")
    p.value("delete-config", "config keys to remove 'k1,k2'", repeat=True, metavar="delete-config")
    for flag, _ in ENTITY_FLAGS:
        p.value(flag.replace("_", "-"), f"The {flag.replace('_', ' ')}'s name or ID.", metavar=flag)
    for flag, kind in DEFAULT_FLAGS:
        p.flag(flag.replace("_", "-"), f"The config defaults for all {kind}.")
    return p


def entity_types(ns: Any) -> list[str]:
    return list(ns.entity_type) + [k for f, k in ENTITY_FLAGS if getattr(ns, f) is not None] + \
        [k for f, k in DEFAULT_FLAGS if getattr(ns, f)]


def entity_names(ns: Any) -> list[str]:
    return list(ns.entity_names) + [getattr(ns, f) for f, _ in ENTITY_FLAGS if getattr(ns, f) is not None] + \
        ["" for f, _ in DEFAULT_FLAGS if getattr(ns, f)]


def check_args(ns: Any) -> tuple[str, list[str], list[str]]:
    """ConfigCommandOptions.checkArgs, in Kafka's order and words."""
    actions = [a for a in ("alter", "describe") if getattr(ns, a)]
    if len(actions) != 1:
        raise ToolError("Command must include exactly one action: --describe, --alter")
    if ns.describe:
        for other, given in (("alter", ns.alter), ("add-config", ns.add_config is not None),
                             ("delete-config", bool(ns.delete_config))):
            if given:
                raise cannot_combine("describe", other)
    types = entity_types(ns)
    dups = sorted({t for t in types if types.count(t) > 1})
    if dups:
        raise ToolError("Duplicate entity type(s) specified: " + ",".join(dups))
    if ns.bootstrap_server is None and ns.bootstrap_controller is None:
        raise ToolError("Either --bootstrap-server or --bootstrap-controller must be specified.")
    for t in types:
        if t not in ENTITY_TYPES:
            raise ToolError(f"Invalid entity type {t}, the entity type must be one of {', '.join(ENTITY_TYPES)} "
                            "with a --bootstrap-server or --bootstrap-controller argument")
    if not types:
        raise ToolError("At least one entity type must be specified")
    if len(types) > 1 and set(types) != {"users", "clients"}:
        raise ToolError("Only 'users' and 'clients' entity types may be specified together")
    flags_given = any(getattr(ns, f) is not None for f, _ in ENTITY_FLAGS) or any(getattr(ns, f) for f, _ in DEFAULT_FLAGS)
    if (ns.entity_names or ns.entity_type) and flags_given:
        raise ToolError("--entity-{type,name,default} should not be used in conjunction with specific entity flags")
    names = entity_names(ns)
    has_name = any(n for n in names)
    has_default = any(n == "" for n in names)
    if ns.bootstrap_server is not None and ns.bootstrap_controller is not None:
        raise ToolError("Only one of --bootstrap-server or --bootstrap-controller can be specified")
    if has_name and types[0] in ("brokers", "broker-loggers"):
        for n in names:
            if n and not re.fullmatch(r"-?\d+", n):
                raise ToolError(f"The entity name for {types[0]} must be a valid integer broker id, but it is: {n}")
    if ns.describe:
        if types[0] not in ("users", "clients", "brokers", "ips") and has_default:
            raise ToolError(f"--entity-default must not be specified with --describe of {','.join(types)}")
        if "broker-loggers" in types and not has_name:
            raise ToolError(f"An entity name must be specified with --describe of {','.join(types)}")
    if ns.alter:
        if types[0] in ("users", "clients", "brokers", "ips"):
            if not has_name and not has_default:
                raise ToolError("An entity-name or default entity must be specified with --alter of users, clients, "
                                "brokers or ips")
        elif not has_name:
            raise ToolError(f"An entity name must be specified with --alter of {','.join(types)}")
        if ns.add_config is not None and ns.add_config_file is not None:
            raise ToolError("Only one of --add-config or --add-config-file must be specified")
        if ns.add_config is None and ns.add_config_file is None and not ns.delete_config:
            raise ToolError("At least one of --add-config, --add-config-file, or --delete-config must be specified "
                            "with --alter")
    if types[0] not in SUPPORTED:
        raise ToolError(f"Entity type {types[0]} is not supported by kcli's kafka-configs (topics and brokers are)")
    return actions[0], types, names


def parse_add_config(ns: Any) -> dict[str, str]:
    """ConfigCommand.parseConfigsToBeAdded: ``k1=v1,k2=[v1,v2],k3=v3`` and/or a properties file."""
    out: dict[str, str] = {}
    if ns.add_config_file is not None:
        from kcli.ops.client_properties import load_properties

        out.update(load_properties(ns.add_config_file))
    if ns.add_config is not None:
        pairs = [_SPLIT_EQ.split(item) for item in _SPLIT_COMMA.split(ns.add_config)]
        if any(len(p) != 2 for p in pairs):
            raise ToolError('Invalid entity config: all configs to be added must be in the format "key=val" or  '
                            '"key=[val1,val2]" to group values which contain commas.')
        for key, value in pairs:
            out[key.strip()] = re.sub(r"\[?\]?", "", value).strip()
    for key in out:
        if not re.fullmatch(r"[$a-zA-Z0-9._-]*", key):
            raise ToolError(f"Invalid character found for config key: {key}")
    return out


def parse_delete_config(ns: Any) -> list[str]:
    return [k.strip() for value in ns.delete_config for k in value.split(",")]


def alter(conn: Any, kind: str, name: str, ns: Any) -> None:
    from kcli.ops import configs as ops

    singular = kind[:-1]
    ops.alter_configs(conn, singular, name, parse_add_config(ns), parse_delete_config(ns))
    if name:
        print(f"Completed updating config for {singular} {name}.")
    else:
        print(f"Completed updating default config for {kind} in the cluster.")


def describe(conn: Any, kind: str, name: str | None, describe_all: bool) -> None:
    from kcli.ops import configs as ops
    from kcli.ops import topics as topic_ops

    singular = kind[:-1]
    if name is not None and not describe_all:
        if kind == "topics":
            topic_ops.validate_topic_name(name)
            if name not in {lst.topic for lst in topic_ops.list_topics(conn)}:
                print(f"The {singular} '{name}' doesn't exist and doesn't have dynamic config.")
                return
        elif name != "" and int(name) not in ops.broker_ids(conn):
            print(f"The {singular} '{name}' doesn't exist and doesn't have dynamic config.")
            return
    if name is not None:
        entities = [name]
    elif kind == "topics":
        entities = [lst.topic for lst in topic_ops.list_topics(conn)]
    else:
        entities = [str(b) for b in ops.broker_ids(conn)]  # kcli: without the default entity (see docs)
    for entity in entities:
        items = ops.describe_configs(conn, singular, entity, dynamic_only=not describe_all)
        if entity == "":
            print(f"Default configs for {kind} in the cluster are:")
        else:
            print(f"{'All' if describe_all else 'Dynamic'} configs for {singular} {entity} are:")
        for item in items:
            synonyms = ", ".join(f"{s}:{n}={v}" for s, n, v in item.synonyms)
            value = "null" if item.sensitive or item.value is None else item.value
            print(f"  {item.name}={value} sensitive={str(item.sensitive).lower()} synonyms={{{synonyms}}}")


def main(argv: list[str]) -> int:
    ns = parser().parse(argv)
    action, types, names = check_args(ns)
    if ns.bootstrap_server is None:
        ns.bootstrap_server = ns.bootstrap_controller
    conn = common.connection(ns)
    kind = types[0]
    try:
        if action == "alter":
            alter(conn, kind, names[0], ns)
        else:
            describe(conn, kind, names[0] if names else None, ns.all)
    except KcliError as err:
        raise ToolError(common.kafka_message(err)) from None
    return 0


def entry() -> None:
    common.run(main)
