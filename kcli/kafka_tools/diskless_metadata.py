"""kafka-diskless-metadata.sh, the tool KIP-1163 proposes, over kcli.ops.diskless.

KIP-1163 names two views and no flags; this tool gives them Kafka-style flags and lines:

* ``--describe [--topic T ...]``: the diskless topic overview — per partition the offsets, batch
  count and bytes on object storage, per topic the bytes of its live batches, the objects it is
  part of and their total size, and the objects it was part of whose batches are all deleted;
* ``--list-objects [--topic T | --object-key K]``: per WAL object its key, total size, used size,
  state, batch count and the partitions it holds.

Online (``--bootstrap-server``), the broker reads its own batch coordinator; offline
(``--coordinator sqlite:///.../coordinator.db`` or ``postgresql://...``), the coordinator is read
directly, as ``kcli diskless`` does."""

from __future__ import annotations

from typing import Any

from kcli.errors import KcliError
from kcli.kafka_tools import common
from kcli.kafka_tools.common import ToolError, ToolParser, cannot_combine

PROG = "kafka-diskless-metadata.sh"


def parser() -> ToolParser:
    p = ToolParser(PROG, "This tool describes diskless topics (KIP-1163) and the WAL segment objects that hold "
                         "them.")
    common.add_connection_options(p, required_text="The Kafka server to connect to (or --coordinator).")
    p.value("coordinator", "Read the batch coordinator directly instead: sqlite:///path/coordinator.db or "
                           "postgresql://user@host:port/database.", metavar="coordinator URI")
    p.flag("describe", "Diskless topic overview: offsets, size on object storage, objects the topic is part of.")
    p.flag("list-objects", "WAL segment objects: key, total size, used size, state, batches, partitions.")
    p.value("topic", "A diskless topic (repeatable with --describe).", repeat=True, metavar="topic")
    p.value("object-key", "One object, with --list-objects.", metavar="object key")
    return p


def check_args(ns: Any) -> str:
    actions = [a for a in ("describe", "list_objects") if getattr(ns, a)]
    if len(actions) != 1:
        raise ToolError("Command must include exactly one action: --describe, --list-objects")
    if ns.bootstrap_server is None and ns.coordinator is None:
        raise ToolError("One of --bootstrap-server or --coordinator must be specified")
    if ns.bootstrap_server is not None and ns.coordinator is not None:
        raise cannot_combine("bootstrap-server", "coordinator")
    if ns.describe and ns.object_key is not None:
        raise cannot_combine("object-key", "describe")
    if ns.list_objects:
        if ns.object_key is not None and ns.topic:
            raise cannot_combine("object-key", "topic")
        if len(ns.topic) > 1:
            raise ToolError("--list-objects takes at most one --topic")
    return actions[0]


def describe_lines(doc: dict[str, Any]) -> list[str]:
    lines = []
    for t in doc.get("topics", []):
        s = t.get("storage", {})
        totals = t.get("totals", {})
        lines.append(f"Topic: {t['name']}\tTopicId: {t.get('topic_id')}\tPartitionCount: {totals.get('partitions', len(t['partitions']))}\t"
                     f"Messages: {totals.get('messages')}\tLiveBytes: {s.get('live_bytes')}\t"
                     f"FileCount: {s.get('file_count')}\tFilesSize: {s.get('files_size')}\t"
                     f"DeadFileCount: {s.get('dead_file_count')}\tDeadFilesSize: {s.get('dead_files_size')}")
        for p in t["partitions"]:
            lines.append(f"\tTopic: {t['name']}\tPartition: {p['partition']}\tLogStartOffset: {p['log_start_offset']}\t"
                         f"HighWatermark: {p['high_watermark']}\tBatchCount: {p['batch_count']}\t"
                         f"ByteSize: {p['byte_size']}")
    return lines


def object_lines(doc: dict[str, Any]) -> list[str]:
    lines = []
    for o in doc.get("objects", []):
        lines.append(f"ObjectKey: {o['object_key']}\tTotalSize: {o['file_size']}\tUsedSize: {o['used_size']}\t"
                     f"State: {o['state']}\tBatchCount: {o['batch_count']}\t"
                     f"CommittedAtMs: {o.get('committed_at_ms')}\t"
                     f"MarkedForDeletionAtMs: {o.get('marked_for_deletion_at_ms') if o.get('marked_for_deletion_at_ms') is not None else 'none'}\t"
                     f"Partitions: {','.join(o.get('partitions', []))}")
    return lines


def main(argv: list[str]) -> int:
    ns = parser().parse(argv)
    action = check_args(ns)
    from kcli.ops import diskless as ops

    if ns.coordinator is not None:
        from kcli.cli.common import coordinator_uri

        source: Any = ops.OfflineDiskless(coordinator_uri(ns.coordinator) or ns.coordinator)
    else:
        source = ops.OnlineDiskless(common.connection(ns))
    try:
        if action == "describe":
            lines = describe_lines(source.describe(ns.topic or None))
        else:
            lines = object_lines(source.objects(topic=ns.topic[0] if ns.topic else None, object_key=ns.object_key))
    except KcliError as err:
        raise ToolError(common.kafka_message(err)) from None
    for line in lines:
        print(line)
    return 0


def entry() -> None:
    common.run(main)
