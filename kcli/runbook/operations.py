"""The operations a runbook step may name, each mapped to a kcli.ops function with its fields.

A step ``topics.alter: {topic: orders, disable_tiering: true}`` looks up ``topics.alter``
here; its :class:`Field` schema drives validation (unknown field, wrong type, missing value)
and its ``run`` calls the operations layer. Results are plain JSON data, which ``expect`` and
``wait_for`` read and ``-o json`` reports. Adding an operation is one :func:`register` call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

from kcli.cli.render import to_data
from kcli.errors import OperationError, UsageError
from kcli.ops.connection import Connection
from kcli.runbook import simulate as sim
from kcli.runbook.model import parse_duration

# --- field schema --------------------------------------------------------------------------

FIELD_TYPES = ("str", "int", "bool", "duration", "str_map", "str_list", "records")


@dataclass(frozen=True)
class Field:
    """One argument of an operation. ``duration`` values become seconds (float)."""

    type: str
    required: bool = False
    default: Any = None
    choices: tuple[str, ...] = ()
    min: int | None = None
    help: str = ""


def _scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise ValueError(f"expected a string, got {_kind(value)}")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "a mapping", list: "a list", bool: "a boolean", int: "a number", float: "a number",
            str: "a string"}.get(type(value), type(value).__name__)


def coerce(spec: Field, value: Any) -> Any:
    """``value`` as ``spec.type``; raises ValueError with a message fit for FILE:LINE:COL.

    Strings are accepted for numbers and booleans because ``${var}`` substitution yields text."""
    t = spec.type
    if t == "str":
        if isinstance(value, (dict, list)) or value is None:
            raise ValueError(f"expected a string, got {_kind(value)}")
        out: Any = _scalar_text(value)
        if spec.choices and out not in spec.choices:
            raise ValueError(f"expected one of {', '.join(spec.choices)}, got {out!r}")
        return out
    if t == "int":
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError(f"expected an integer, got {_kind(value)}")
        try:
            out = int(value)
        except ValueError:
            raise ValueError(f"expected an integer, got {value!r}") from None
        if spec.min is not None and out < spec.min:
            raise ValueError(f"must be at least {spec.min}, got {out}")
        return out
    if t == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise ValueError(f"expected true or false, got {value!r}")
    if t == "duration":
        return parse_duration(value)
    if t == "str_map":
        if not isinstance(value, dict):
            raise ValueError(f"expected a mapping of names to values, got {_kind(value)}")
        return {str(k): _scalar_text(v) for k, v in value.items()}
    if t == "str_list":
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list):
            raise ValueError(f"expected a list of strings, got {_kind(value)}")
        return [_scalar_text(v) for v in value]
    if t == "records":
        if not isinstance(value, list):
            raise ValueError(f"expected a list of records (strings or {{key, value}} mappings), got {_kind(value)}")
        out_records: list[dict[str, str | None]] = []
        for i, item in enumerate(value):
            if isinstance(item, dict):
                unknown = sorted(set(item) - {"key", "value"})
                if unknown:
                    raise ValueError(f"record {i}: unknown field {unknown[0]!r} (records have key and value)")
                if item.get("value") is None:
                    raise ValueError(f"record {i}: value is required")
                key = item.get("key")
                out_records.append({"key": None if key is None else _scalar_text(key),
                                    "value": _scalar_text(item["value"])})
            else:
                try:
                    out_records.append({"key": None, "value": _scalar_text(item)})
                except ValueError:
                    raise ValueError(f"record {i}: expected a string or a {{key, value}} mapping, "
                                     f"got {_kind(item)}") from None
        return out_records
    raise AssertionError(f"unknown field type {t}")


# --- operations ----------------------------------------------------------------------------

Args = dict[str, Any]
Check = Callable[[Args], list[tuple[str | None, str]]]  # (field or None for the step, message)


@dataclass(frozen=True)
class Operation:
    """``run(conn, args)`` does it; ``dry_run(conn, args)`` (when the ops module has one) asks
    the cluster what it would do; ``failed(result)`` turns a result into a step failure
    (e.g. verify found damage). ``describe_as`` makes it usable as ``wait_for: {describe: X}``.
    ``simulate(model, args)`` applies the step to a dry run's model of the cluster."""

    name: str
    summary: str
    fields: dict[str, Field]
    run: Callable[[Connection | None, Args], Any]
    dry_run: Callable[[Connection, Args], Any] | None = None
    check: Check | None = None
    failed: Callable[[Any], str | None] | None = None
    shorthand: str | None = None  # `sleep: 2s` means `sleep: {duration: 2s}`
    needs_connection: bool = True
    describe_as: str | None = None
    title_field: str | None = "topic"  # which argument names the step by default
    # what the step does to a dry run's model of the cluster (kcli/runbook/simulate.py)
    simulate: sim.Simulator | None = None


REGISTRY: dict[str, Operation] = {}


def register(op: Operation) -> Operation:
    REGISTRY[op.name] = op
    return op


def get(name: str) -> Operation | None:
    return REGISTRY.get(name)


def describers() -> dict[str, Operation]:
    """``wait_for: {describe: NAME}`` targets."""
    return {op.describe_as: op for op in REGISTRY.values() if op.describe_as}


# --- topics --------------------------------------------------------------------------------


def _topics() -> ModuleType:
    from kcli.ops import topics

    return topics


def _create(conn: Connection | None, a: Args) -> Any:
    t = _topics()
    configs = dict(a.get("configs") or {})
    if a.get("diskless"):
        configs[t.DISKLESS_ENABLE] = "true"
    req = t.CreateTopicRequest(a["topic"], a.get("partitions"), a.get("replication_factor"), configs,
                               bool(a.get("if_not_exists")))
    assert conn is not None
    return t.create_topic(conn, req)


def _check_create(a: Args) -> list[tuple[str | None, str]]:
    value = (a.get("configs") or {}).get("diskless.enable")
    if a.get("diskless") and value is not None and value.lower() != "true":
        return [("diskless", f"diskless: true conflicts with configs diskless.enable={value}")]
    return []


def _describe(conn: Connection | None, a: Args) -> Any:
    assert conn is not None
    if a.get("topic"):
        return _topics().describe_topics(conn, [a["topic"]])[0]
    return _topics().describe_topics(conn, a.get("topics") or None)


def _one_of_topic_topics(a: Args) -> list[tuple[str | None, str]]:
    if a.get("topic") and a.get("topics"):
        return [("topics", "give topic or topics, not both")]
    return []


def _list(conn: Connection | None, a: Args) -> Any:
    t = _topics()
    assert conn is not None
    kind = t.TopicKind(a["kind"]) if a.get("kind") else None
    listings = t.list_topics(conn, kind=kind, exclude_internal=bool(a.get("exclude_internal")), with_kind=True)
    return {"topics": [x.topic for x in listings],
            "kinds": {x.topic: x.kind.value if x.kind else None for x in listings}}


def _delete(conn: Connection | None, a: Args) -> Any:
    assert conn is not None
    return _topics().delete_topic(conn, a["topic"], bool(a.get("if_exists")))


_SHRINK_FIELDS = ("delete_partitions_delay", "yes")


def _check_alter(a: Args) -> list[tuple[str | None, str]]:
    out: list[tuple[str | None, str]] = []
    tiering = bool(a.get("disable_tiering") or a.get("enable_tiering"))
    if a.get("disable_tiering") and a.get("enable_tiering"):
        out.append(("enable_tiering", "disable_tiering and enable_tiering are mutually exclusive"))
    if a.get("policy") is not None and not a.get("disable_tiering"):
        out.append(("policy", "policy goes with disable_tiering: true (re-enabling takes no policy)"))
    if tiering:
        for name in ("partitions", "configs", "delete_configs"):
            if a.get(name):
                out.append((name, f"{name} cannot be combined with disable_tiering/enable_tiering; use two steps"))
    for name in _SHRINK_FIELDS:
        if a.get(name) is not None and a.get("partitions") is None:
            out.append((name, f"{name} goes with partitions (shrinking a topic)"))
    clash = sorted(set(a.get("configs") or {}) & set(a.get("delete_configs") or []))
    if clash:
        out.append(("delete_configs", f"config {clash[0]!r} is both set (configs) and deleted (delete_configs)"))
    if (not tiering and a.get("policy") is None and a.get("partitions") is None and not a.get("configs")
            and not a.get("delete_configs")):
        out.append((None, "nothing to alter: give partitions, configs, delete_configs, disable_tiering or enable_tiering"))
    return out


def _alter(conn: Connection | None, a: Args, dry_run: bool = False) -> Any:
    assert conn is not None
    if a.get("disable_tiering") or a.get("enable_tiering"):
        from kcli.ops import tiering

        if a.get("disable_tiering"):
            return tiering.disable_tiering(conn, a["topic"], a.get("policy"), dry_run=dry_run)
        return tiering.enable_tiering(conn, a["topic"], dry_run=dry_run)
    t = _topics()
    delay = a.get("delete_partitions_delay")
    # Fewer partitions than now is a KIP-694 shrink inside alter_topic (kcli.ops.partitions);
    # a runbook never prompts, so deleting stored records right away needs `yes: true`.
    req = t.AlterTopicRequest(topic=a["topic"], partitions=a.get("partitions"),
                              set_configs=dict(a.get("configs") or {}),
                              delete_configs=list(a.get("delete_configs") or []), dry_run=dry_run,
                              delete_partitions_delay_ms=int(round(delay * 1000)) if delay is not None else None,
                              assume_yes=bool(a.get("yes")))
    result = t.alter_topic(conn, req)
    data: dict[str, Any] = {"topic": result.topic, "changed": result.changed, "dry_run": result.dry_run,
                            "steps": result.steps}
    if result.shrink is not None:  # same shape as `kcli -o json topics alter`
        data["partition_deletion"] = result.shrink
    return data


# --- produce / consume ---------------------------------------------------------------------

_SEPARATOR_CANDIDATES = (b"\x1f", b"\x1e", b"\x1d", b"\x1c", b"\x00")


def _records(a: Args) -> list[dict[str, str | None]]:
    if a.get("records") is not None:
        return list(a["records"])
    template = a.get("template") or "record-{i}"
    key_template = a.get("key_template")
    return [{"key": key_template.replace("{i}", str(i)) if key_template else None,
             "value": template.replace("{i}", str(i))} for i in range(a["count"])]


def _produce(conn: Connection | None, a: Args) -> Any:
    """kcli.ops.clients.produce reads lines; keyed records are joined with a separator byte
    that occurs in no key (the ops layer splits at its first occurrence)."""
    from kcli.ops import clients

    assert conn is not None
    records = _records(a)
    keyed = any(r["key"] is not None for r in records)  # all or none: see _check_produce
    separator = None
    if keyed:
        keys = [r["key"].encode() for r in records if r["key"] is not None]
        separator = next((s for s in _SEPARATOR_CANDIDATES if not any(s in k for k in keys)), None)
        if separator is None:
            raise UsageError("record keys contain every control byte kcli could split on")
        lines = [r["key"].encode() + separator + r["value"].encode() for r in records]  # type: ignore[union-attr]
    else:
        lines = [r["value"].encode() for r in records]  # type: ignore[union-attr]
    if any(b"\n" in line or b"\r" in line for line in lines):
        raise UsageError("record keys and values must be single lines")
    req = clients.ProduceRequest(topic=a["topic"], key_separator=separator, acks=a.get("acks") or "all",
                                 partition=a.get("partition"), compression=a.get("compression") or "none")
    return clients.produce(conn, req, lines)


def _check_produce(a: Args) -> list[tuple[str | None, str]]:
    out: list[tuple[str | None, str]] = []
    has_records, has_count = a.get("records") is not None, a.get("count") is not None
    if has_records == has_count:
        out.append((None if not has_records else "count", "give either records or count (with an optional template)"))
    if has_records:
        for name in ("template", "key_template"):
            if a.get(name) is not None:
                out.append((name, f"{name} goes with count, not records"))
        keys = [r["key"] is not None for r in a["records"]]
        if any(keys) and not all(keys):
            out.append(("records", "either every record has a key or none does"))
    texts = [r[k] or "" for r in a.get("records") or [] for k in ("key", "value")]
    texts += [a.get("template") or "", a.get("key_template") or ""]
    if any("\n" in t or "\r" in t for t in texts):
        out.append((None, "record keys and values must be single lines"))
    return out


MAX_REPORTED_RECORDS = 1000


def _consume(conn: Connection | None, a: Args) -> Any:
    from kcli.ops import clients

    assert conn is not None
    req = clients.ConsumeRequest(topic=a["topic"], group=a.get("group"), from_beginning=bool(a.get("from_beginning")),
                                 max_messages=a.get("max_messages"), timeout_ms=int(round(a["timeout"] * 1000)),
                                 partition=a.get("partition"))
    kept: list[dict[str, Any]] = []

    def on_record(record: Any) -> None:
        if len(kept) < MAX_REPORTED_RECORDS:
            kept.append(record.to_dict())

    result = clients.consume(conn, req, on_record)
    return {"topic": a["topic"], "count": result.records, "stopped_by": result.stopped_by,
            "records": kept, "records_truncated": result.records > len(kept)}


# --- diskless ------------------------------------------------------------------------------


def _diskless(conn: Connection | None) -> Any:
    """kcli.ops.diskless against the running broker (its admin API), as `kcli diskless` does."""
    from kcli.ops.diskless import OnlineDiskless

    assert conn is not None
    return OnlineDiskless(conn)


def _diskless_describe(conn: Connection | None, a: Args) -> Any:
    names = [a["topic"]] if a.get("topic") else (a.get("topics") or None)
    result = _diskless(conn).describe(names)
    if a.get("topic"):
        topics = result.get("topics") or []
        if not topics:
            raise OperationError(f"topic '{a['topic']}' is not a diskless topic")
        return topics[0]
    return result


def _verify_failed(result: Any) -> str | None:
    if isinstance(result, dict) and result.get("ok") is False:
        problems = result.get("problems") or []
        first = problems[0] if problems else {}
        where = first.get("object_key", "?")
        return f"verify found {len(problems)} problem(s); first: {where}: {first.get('problem', '?')}"
    return None


# --- registry ------------------------------------------------------------------------------

_TOPIC = Field("str", required=True, help="Topic name.")

register(Operation(
    "topics.create", "Create a topic (CreateTopics).",
    {"topic": _TOPIC, "partitions": Field("int", min=1), "replication_factor": Field("int", min=1),
     "configs": Field("str_map"), "if_not_exists": Field("bool", default=False),
     "diskless": Field("bool", default=False, help="Same as configs diskless.enable=true.")},
    _create, check=_check_create,
    simulate=sim.create))
register(Operation(
    "topics.delete", "Delete a topic (DeleteTopics).",
    {"topic": _TOPIC, "if_exists": Field("bool", default=False)}, _delete,
    simulate=sim.delete))
register(Operation(
    "topics.alter", "Change configs, add or remove partitions, disable or enable tiering.",
    {"topic": _TOPIC, "partitions": Field("int", min=1), "configs": Field("str_map"),
     "delete_configs": Field("str_list"), "disable_tiering": Field("bool", default=False),
     "policy": Field("str", choices=("retain", "delete")), "enable_tiering": Field("bool", default=False),
     "delete_partitions_delay": Field("duration"), "yes": Field("bool")},
    _alter, dry_run=lambda conn, a: _alter(conn, a, dry_run=True), check=_check_alter,
    simulate=sim.alter))
register(Operation(
    "topics.describe", "Describe one topic (a mapping) or several (a list).",
    {"topic": Field("str"), "topics": Field("str_list")}, _describe, check=_one_of_topic_topics,
    describe_as="topics",
    simulate=sim.describe))
register(Operation(
    "topics.list", "Topic names and kinds: {topics: [...], kinds: {name: kind}}.",
    {"kind": Field("str", choices=("classic", "tiered", "diskless")), "exclude_internal": Field("bool", default=False)},
    _list, title_field=None,
    simulate=sim.list_topics))
register(Operation(
    "produce", "Write records (a list, or count records from a template with {i}).",
    {"topic": _TOPIC, "records": Field("records"), "count": Field("int", min=1), "template": Field("str"),
     "key_template": Field("str"), "partition": Field("int", min=0),
     "acks": Field("str", choices=("0", "1", "all", "-1")),
     "compression": Field("str", choices=("none", "gzip", "snappy", "lz4", "zstd"))},
    _produce, check=_check_produce,
    simulate=sim.produce))
register(Operation(
    "consume", "Read records; the result has count, stopped_by and the records.",
    {"topic": _TOPIC, "max_messages": Field("int", min=1), "from_beginning": Field("bool", default=False),
     "timeout": Field("duration", default=10.0, help="Stop after this long without a record."),
     "group": Field("str"), "partition": Field("int", min=0)},
    _consume,
    simulate=sim.consume))
register(Operation(
    "diskless.describe", "Diskless offsets and storage use: one topic (a mapping) or {topics: [...]}.",
    {"topic": Field("str"), "topics": Field("str_list")}, _diskless_describe, check=_one_of_topic_topics,
    describe_as="diskless",
    simulate=sim.diskless_describe))
register(Operation(
    "diskless.objects", "WAL objects the coordinator knows.",
    {"topic": Field("str"), "key": Field("str"), "state": Field("str", choices=("uploaded", "deleting")),
     "batches": Field("bool", default=False)},
    lambda conn, a: _diskless(conn).objects(state=a.get("state"), topic=a.get("topic"), object_key=a.get("key"),
                                            batches=bool(a.get("batches"))),
    simulate=sim.diskless_objects))
register(Operation(
    "diskless.verify", "Check every committed batch's bytes and CRC; the step fails on damage.",
    {"object_keys": Field("str_list"), "max_objects": Field("int", min=0)},
    lambda conn, a: _diskless(conn).verify(object_keys=a.get("object_keys"), max_objects=a.get("max_objects")),
    failed=_verify_failed, title_field=None,
    simulate=sim.diskless_verify))
register(Operation(
    "diskless.gc", "Delete orphan and expired WAL objects (grace period respected); objects the coordinator"
    " has no record of only with unknown_objects: true.",
    {"dry_run": Field("bool", default=False), "orphans": Field("bool", default=True),
     "unknown_objects": Field("bool", default=False)},
    lambda conn, a: _diskless(conn).gc(dry_run=bool(a.get("dry_run")), orphans=a.get("orphans", True),
                                       unknown_objects=bool(a.get("unknown_objects"))),
    dry_run=lambda conn, a: _diskless(conn).gc(dry_run=True, orphans=a.get("orphans", True),
                                               unknown_objects=bool(a.get("unknown_objects"))),
    title_field=None,
    simulate=sim.diskless_gc))
register(Operation(
    "sleep", "Pause, e.g. to let a partition-deletion delay pass.",
    {"duration": Field("duration", required=True)},
    lambda conn, a: (time.sleep(a["duration"]), {"slept_s": a["duration"]})[1],
    shorthand="duration", needs_connection=False, title_field="duration",
    simulate=sim.sleep))


def result_data(value: Any) -> Any:
    """Any ops return value as JSON-able data (dataclasses via to_dict, enums by value)."""
    return to_data(value)
