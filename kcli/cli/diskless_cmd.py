"""`kcli diskless describe|objects|verify|gc`: Kafka's kafka-diskless-metadata, plus integrity
checks and garbage collection of WAL objects.

Online (default) the broker answers over kcli's admin API (in a cluster: the controller, see
kcli/ops/brokers.py); with ``--coordinator sqlite:///…`` or ``postgresql://…`` the tools read a
coordinator database directly (a stopped broker's ``<data_dir>/diskless/coordinator.db``, or a
cluster's database) and, for verify/gc, the object store (``--object-store``, default
``file://<dir of the db>/../objects`` for SQLite). Offline verify and gc run on the local engine or
on Spark (``--engine``). Documented in docs/diskless-metadata.md.
"""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from enum import Enum
from typing import Any, Callable, List, Optional

import typer

from kcli.cli.common import GlobalOptions, OutputFormat, coordinator_uri, options
from kcli.errors import UsageError

diskless_app = typer.Typer(
    help="Inspect, verify and garbage-collect diskless storage (kafka-diskless-metadata).", no_args_is_help=True)


class ObjectState(str, Enum):
    uploaded = "uploaded"
    deleting = "deleting"


class EngineOption(str, Enum):
    auto = "auto"
    local = "local"
    spark = "spark"


COORDINATOR_HELP = ("Read this batch coordinator instead of asking a broker: sqlite:///path/to/coordinator.db"
                    " or postgresql://user@host:port/database.")
OBJECT_STORE_HELP = ("With --coordinator: the object store, file:///dir or s3://bucket/prefix "
                     "(default for sqlite://: file://<dir of the database>/../objects, if it exists; "
                     "required for postgresql://).")
ENGINE_HELP = "With --coordinator: scan here (local), on PySpark (spark), or pick by size (auto)."
MASTER_HELP = "Spark master URL for --engine spark/auto (default local[*])."
OUTPUT_HELP = "Output format (overrides the global -o)."


def _opts(ctx: typer.Context, output: Optional[OutputFormat]) -> GlobalOptions:
    from dataclasses import replace

    opts = options(ctx)
    return replace(opts, output=output) if output is not None else opts


def _source(opts: GlobalOptions, coordinator: Optional[str], object_store: Optional[str] = None,
            engine: EngineOption = EngineOption.auto, spark_master: Optional[str] = None) -> Any:
    """An OfflineDiskless for --coordinator, else a context yielding OnlineDiskless."""
    from kcli.ops import diskless as ops

    if coordinator is None:
        if object_store is not None:
            raise UsageError("--object-store goes with --coordinator (offline); online, the broker uses its own store")
        if engine is not EngineOption.auto or spark_master is not None:
            raise UsageError("--engine and --spark-master go with --coordinator (offline); online, the broker "
                             "scans its own store")
        return None
    from kcli.engine.select import choose

    return ops.OfflineDiskless(
        coordinator_uri(coordinator), object_store,
        choice_for=lambda work: choose(engine.value, work, spark_master),
        verbose=opts.verbose,
    )


def _run(opts: GlobalOptions, offline: Any, action: Callable[[Any], Any]) -> Any:
    if offline is not None:
        if opts.verbose:
            sys.stderr.write(f"kcli: offline: coordinator {offline.coordinator_uri}, "
                             f"object store {offline.object_store_uri or '-'}\n")
        return action(offline)
    from kcli.ops import diskless as ops
    from kcli.ops.connection import connect

    with connect(opts) as conn:
        if opts.verbose:
            sys.stderr.write("kcli: online: the broker computes the result (kcli admin API)\n")
        return action(ops.OnlineDiskless(conn))


def _render(opts: GlobalOptions, data: Any, table: Callable[[], None]) -> None:
    from kcli.cli.render import render

    render(data, opts.output, table)


def _time(ms: Optional[int]) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _bytes(n: Optional[int]) -> str:
    from kcli.engine.select import human_bytes

    return human_bytes(n)


# -- describe ---------------------------------------------------------------------------------


@diskless_app.command("describe")
def describe(
    ctx: typer.Context,
    topic: List[str] = typer.Option([], "--topic", "-t", help="Diskless topic (repeatable; default: all)."),
    coordinator: Optional[str] = typer.Option(None, "--coordinator", help=COORDINATOR_HELP),
    replicas: bool = typer.Option(False, "--replicas", help="Also each partition's ISR and every replica's local cache range (needs a broker)."),
    output: Optional[OutputFormat] = typer.Option(None, "--output", "-o", help=OUTPUT_HELP),
) -> None:
    """Offsets, batches and object-storage use of diskless topics.

    Per partition: log start offset, high watermark, batch count and bytes; per topic: totals,
    live bytes on object storage, the objects it is part of (count, total size) and the objects
    where all its batches were deleted but that are still stored. With --replicas, per partition
    also the ISR (replicas in sync with the batch coordinator) and each replica's local cache
    range (docs/diskless.md, "Replicas and their local cache"). Online, a topic with
    remote.storage.enable=true also shows per partition the offset its data is tiered up to and
    its remote segments: below the log start offset, reads come from the remote tier
    (docs/diskless-tiering.md).

    Example: kcli diskless describe --topic orders

    Example: kcli diskless describe --topic orders --replicas

    Example: kcli diskless describe --coordinator sqlite:///var/lib/kcli/diskless/coordinator.db -o json

    Example: kcli -b host1:9092,host2:9092,host3:9092 diskless describe --topic orders
    """
    opts = _opts(ctx, output)
    data = _run(opts, _source(opts, coordinator), lambda src: src.describe(topic or None, replicas))

    def table() -> None:
        from kcli.cli.render import print_table

        topics = data["topics"]
        if not topics:
            sys.stdout.write("No diskless topics.\n")
            return
        rows = []
        for t in topics:
            for p in t["partitions"]:
                rows.append({"topic": t["name"], **p, **_replica_cache_columns(p)})
            tot = t["totals"]
            rows.append({"topic": t["name"], "partition": "total", "log_start_offset": "",
                         "high_watermark": "", "batch_count": tot["batch_count"], "byte_size": tot["byte_size"]})
        columns = [("TOPIC", "topic"), ("PARTITION", "partition"), ("LOG-START-OFFSET", "log_start_offset"),
                   ("HIGH-WATERMARK", "high_watermark"), ("BATCHES", "batch_count"), ("BYTES", "byte_size")]
        if any("highest_tiered_offset" in p for t in topics for p in t["partitions"]):  # online, with remote storage
            for r in rows:
                r.setdefault("highest_tiered_offset", "")
                r.setdefault("remote_segments", "")
            columns += [("TIERED-UP-TO", "highest_tiered_offset"), ("REMOTE-SEGMENTS", "remote_segments")]
        if any("isr" in p for t in topics for p in t["partitions"]):  # online: the broker knows the caches
            columns += [("ISR", "isr_text"), ("LOCAL-CACHE (BROKER:START-END)", "cache_text")]
        print_table(rows, columns)
        sys.stdout.write("\n")
        storage = [{"topic": t["name"], "topic_id": t["topic_id"], **t["storage"]} for t in topics]
        print_table(storage, [("TOPIC", "topic"), ("TOPIC-ID", "topic_id"), ("LIVE-BYTES", "live_bytes"),
                              ("OBJECTS", "file_count"), ("OBJECTS-BYTES", "files_size"),
                              ("DEAD-OBJECTS", "dead_file_count"), ("DEAD-OBJECTS-BYTES", "dead_files_size")])

    _render(opts, data, table)


def _replica_cache_columns(p: dict) -> dict:
    """ISR and each replica's local cache range (kcli/diskless/replica_cache.py) as table cells."""
    if "isr" not in p:
        return {}
    caches = []
    for c in p.get("replica_caches", []):
        span = "none" if c.get("log_end_offset") is None else f"{c['log_start_offset']}-{c['log_end_offset']}"
        caches.append(f"{c['broker']}:{span}" + ("" if c.get("in_sync") else "(out of sync)"))
    return {"isr_text": ",".join(str(r) for r in p["isr"]) or "-", "cache_text": " ".join(caches) or "-"}


# -- objects ----------------------------------------------------------------------------------


@diskless_app.command("objects")
def objects(
    ctx: typer.Context,
    key: Optional[str] = typer.Option(None, "--key", "-k", help="Only this object key."),
    topic: Optional[str] = typer.Option(None, "--topic", "-t", help="Only objects holding live batches of this topic."),
    state: Optional[ObjectState] = typer.Option(None, "--state", help="Only objects in this state."),
    batches: bool = typer.Option(False, "--batches", help="List each object's live batches too."),
    coordinator: Optional[str] = typer.Option(None, "--coordinator", help=COORDINATOR_HELP),
    output: Optional[OutputFormat] = typer.Option(None, "--output", "-o", help=OUTPUT_HELP),
) -> None:
    """WAL objects and their metadata.

    Key, total size, used size (bytes of live batches), state (uploaded or deleting), when it
    was marked for deletion, batch count and the partitions with live batches in it.

    Example: kcli diskless objects --state deleting

    Example: kcli diskless objects --key wal/1b9d6bcd-bbfd-4b2d-9b5d-ab8dfbbd4bed --batches -o yaml
    """
    if key is not None and topic is not None:
        raise UsageError("give --key or --topic, not both")
    opts = _opts(ctx, output)
    data = _run(opts, _source(opts, coordinator), lambda src: src.objects(
        state=state.value if state else None, topic=topic, object_key=key, batches=batches))

    def table() -> None:
        from kcli.cli.render import print_table

        rows = [{**o, "marked": _time(o.get("marked_for_deletion_at_ms"))} for o in data["objects"]]
        if not rows:
            sys.stdout.write("No objects.\n")
            return
        print_table(rows, [("KEY", "object_key"), ("SIZE", "file_size"), ("USED", "used_size"), ("STATE", "state"),
                           ("MARKED-FOR-DELETION", "marked"), ("BATCHES", "batch_count"),
                           ("PARTITIONS", "partitions")])
        if batches:
            for o in data["objects"]:
                sys.stdout.write(f"\n{o['object_key']}:\n")
                batch_rows = [{**b, "tp": f"  {b['topic']}-{b['partition']}"} for b in o.get("batches", [])]
                print_table(batch_rows, [
                    ("  PARTITION", "tp"), ("BYTE-OFFSET", "byte_offset"), ("SIZE", "byte_size"),
                    ("BASE-OFFSET", "base_offset"), ("LAST-OFFSET", "last_offset"), ("PRODUCER-ID", "producer_id")])

    _render(opts, data, table)


# -- verify -----------------------------------------------------------------------------------


@diskless_app.command("verify")
def verify(
    ctx: typer.Context,
    key: List[str] = typer.Option([], "--key", "-k", help="Only these object keys (repeatable)."),
    max_objects: Optional[int] = typer.Option(None, "--max-objects", min=0,
                                              help="Check at most N objects (online default: the broker's, 1000; offline: all)."),
    coordinator: Optional[str] = typer.Option(None, "--coordinator", help=COORDINATOR_HELP),
    object_store: Optional[str] = typer.Option(None, "--object-store", help=OBJECT_STORE_HELP),
    engine: EngineOption = typer.Option(EngineOption.auto, "--engine", help=ENGINE_HELP),
    spark_master: Optional[str] = typer.Option(None, "--spark-master", help=MASTER_HELP),
    output: Optional[OutputFormat] = typer.Option(None, "--output", "-o", help=OUTPUT_HELP),
) -> None:
    """Check every committed batch against its object: byte range, header and CRC.

    Also lists orphan objects (an upload intent recorded, never committed: `kcli diskless gc`
    deletes them after the grace period) and unknown objects (in storage, no record in the
    coordinator: kept until `kcli diskless gc --unknown-objects`).

    Exit status: 0 when nothing is damaged, 1 when a problem was found (each names the object
    and byte position), 2 for usage errors.

    Example: kcli diskless verify

    Example: kcli diskless verify --coordinator sqlite:///data/diskless/coordinator.db --engine spark

    Example: kcli diskless verify --coordinator postgresql://kcli@db:5432/kcli --object-store s3://bucket/kcli
    """
    opts = _opts(ctx, output)
    offline = _source(opts, coordinator, object_store, engine, spark_master)
    data = _run(opts, offline, lambda src: src.verify(object_keys=key or None, max_objects=max_objects))

    def table() -> None:
        from kcli.cli.render import print_table

        problems = data["problems"]
        skipped = f", {data['objects_skipped']} skipped (--max-objects)" if data.get("objects_skipped") else ""
        sys.stdout.write(f"Checked {data['objects_checked']} objects and {data['batches_checked']} batches in "
                         f"{data.get('storage') or '-'}{skipped}: "
                         f"{'OK' if not problems else f'{len(problems)} problem(s)'}\n")
        if problems:
            sys.stdout.write("\n")
            print_table(problems, [("OBJECT", "object_key"), ("POSITION", "byte_offset"), ("BYTES", "byte_size"),
                                   ("PARTITION", "partition"), ("PROBLEM", "problem")])
        for field, what, why in (
            ("orphans", "orphan", "upload intent recorded, never committed; `kcli diskless gc` deletes them after"
                                  " the grace period"),
            ("unknown_objects", "unknown", "no record in the coordinator: kept; `kcli diskless gc --unknown-objects`"
                                           " deletes them"),
        ):
            listed = data.get(field) or []
            if listed:
                sys.stdout.write(f"\n{len(listed)} {what} object(s), {_bytes(sum(o['size'] for o in listed))} ({why}):\n")
                print_table(listed, [("OBJECT", "object_key"), ("SIZE", "size"), ("AGE-MS", "age_ms")])

    _render(opts, data, table)
    if data["problems"]:
        objects_hit = len({p["object_key"] for p in data["problems"]})
        sys.stderr.write(f"kcli: error: verify found {len(data['problems'])} problem(s) in {objects_hit} object(s)\n")
        raise SystemExit(1)


# -- gc ---------------------------------------------------------------------------------------


@diskless_app.command("gc")
def gc(
    ctx: typer.Context,
    dry_run: bool = typer.Option(False, "--dry-run", help="Only report what would be deleted."),
    orphans: bool = typer.Option(True, "--orphans/--no-orphans", help="Also delete orphan objects (default: yes)."),
    unknown_objects: bool = typer.Option(
        False, "--unknown-objects",
        help="Also delete objects the coordinator has no record of (listed by verify; never deleted otherwise)."),
    grace_ms: Optional[int] = typer.Option(None, "--grace-ms", min=0, metavar="MS",
                                           help="Offline: the grace period, as the broker's diskless.file.cleaner.retention.period.ms (default 60000)."),
    coordinator: Optional[str] = typer.Option(None, "--coordinator", help=COORDINATOR_HELP),
    object_store: Optional[str] = typer.Option(None, "--object-store", help=OBJECT_STORE_HELP),
    engine: EngineOption = typer.Option(EngineOption.auto, "--engine", help=ENGINE_HELP),
    spark_master: Optional[str] = typer.Option(None, "--spark-master", help=MASTER_HELP),
    output: Optional[OutputFormat] = typer.Option(None, "--output", "-o", help=OUTPUT_HELP),
) -> None:
    """Delete unused WAL objects: marked for deletion or orphaned, past the grace period.

    Objects the coordinator marked for deletion go once the grace period is over; orphans (an
    upload intent recorded by this cluster, never committed) once they are older than it.
    Unknown objects (no record at all: another cluster's, an older kcli's, copied by hand) are
    only listed, unless --unknown-objects is given. Prints counts and bytes.

    Online, the request goes to the controller: in a cluster its cleaner is
    the one deleting.

    Exit status: 0 ok, 1 when a deletion failed, 2 for usage errors.

    Example: kcli diskless gc --dry-run

    Example: kcli diskless gc --coordinator sqlite:///data/diskless/coordinator.db --grace-ms 0

    Example: kcli diskless gc --unknown-objects --dry-run
    """
    from kcli.ops import diskless as ops

    opts = _opts(ctx, output)
    offline = _source(opts, coordinator, object_store, engine, spark_master)
    if offline is None and grace_ms is not None:
        raise UsageError("--grace-ms goes with --coordinator; online, the broker's "
                         "diskless.file.cleaner.retention.period.ms applies")
    if offline is not None:
        data = _run(opts, offline, lambda src: src.gc(
            dry_run=dry_run, orphans=orphans, grace_ms=ops.DEFAULT_GRACE_MS if grace_ms is None else grace_ms,
            unknown_objects=unknown_objects))
    else:
        data = _run(opts, None, lambda src: src.gc(dry_run=dry_run, orphans=orphans, unknown_objects=unknown_objects))

    def table() -> None:
        verb = "Would delete" if data["dry_run"] else "Deleted"
        sys.stdout.write(f"{verb} {len(data['deleted'])} object(s) marked for deletion "
                         f"({_bytes(data.get('deleted_bytes'))})\n")
        sys.stdout.write(f"{verb} {len(data['orphans'])} orphan object(s) ({_bytes(data.get('orphans_bytes'))})\n")
        unknown = data.get("unknown_objects") or []
        if data.get("unknown_objects_deleted"):
            sys.stdout.write(f"{verb} {len(unknown)} unknown object(s) ({_bytes(data.get('unknown_objects_bytes'))})\n")
        elif unknown:
            sys.stdout.write(f"Kept {len(unknown)} unknown object(s) ({_bytes(data.get('unknown_objects_bytes'))}):"
                             " not recorded by the coordinator; `--unknown-objects` deletes them\n")
        if data.get("orphans_waiting"):
            sys.stdout.write(f"Orphans inside the grace period (kept until it is over): "
                             f"{len(data['orphans_waiting'])} object(s)\n")
            if data["dry_run"] and not opts.verbose:  # -v lists every group below
                for k in data["orphans_waiting"]:
                    sys.stdout.write(f"  orphans_waiting: {k}\n")
        if data["waiting"]:
            sys.stdout.write(f"Waiting for the grace period: {len(data['waiting'])} object(s) "
                             f"({_bytes(data.get('waiting_bytes'))})\n")
        if data["unsafe"]:
            sys.stdout.write(f"Kept (the coordinator says not yet safe): {len(data['unsafe'])} object(s)\n")
        if opts.verbose:
            for label in ("deleted", "orphans", "orphans_waiting", "unknown_objects", "waiting", "unsafe"):
                for k in data.get(label, []):
                    sys.stdout.write(f"  {label}: {k}\n")

    _render(opts, data, table)
    for message in data["errors"]:
        sys.stderr.write(f"kcli: error: {message}\n")
    if data["errors"]:
        raise SystemExit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(diskless_app, name="diskless")
