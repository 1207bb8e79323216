"""What the kcli admin API reports about diskless storage (kafka-diskless-metadata's views).

Each function takes the running engine and returns plain JSON-able data: the handler in
kcli/broker/handlers/kcli_admin.py sends it as is, and the ``kcli diskless`` tools print it.
Slow calls run on the engine's worker threads, like everything else that touches storage.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from kcli.protocol.errors import BrokerError

if TYPE_CHECKING:
    from kcli.diskless.engine import DisklessEngine
    from plugins.coordinator.base import BatchInfo, FileInfo, LogInfo, TopicStorageInfo



def kafka_topic_id(topic_id: uuid.UUID) -> str:
    """Kafka prints topic ids as URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(topic_id.bytes).decode().rstrip("=")


async def _io(engine: "DisklessEngine", fn: Any, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(engine.io_pool, fn, *args)


def _require_open(engine: "DisklessEngine") -> None:
    """Diskless topics exist but the store is not open yet (it opens lazily): open it now."""
    if not engine.is_open:
        engine._ensure_open()


async def describe(engine: "DisklessEngine", topics: list[str] | None, *, replicas: bool = False) -> dict[str, Any]:
    """Per diskless topic: offsets, batches and bytes per partition, and object-storage use;
    with ``replicas``, also each partition's replicas, ISR and replica caches."""
    b = engine.broker
    if topics:
        chosen = []
        for name in topics:
            t = b.topic(name)
            if t is None:
                raise BrokerError(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist")
            if not b.is_diskless(t):
                raise BrokerError(ErrorCode.invalid_request, f"topic {name!r} is not a diskless topic")
            chosen.append(t)
    else:
        chosen = sorted((t for t in b.state.topics.values() if b.is_diskless(t)), key=lambda t: t.name)
    if not chosen:
        return {"topics": []}
    _require_open(engine)
    coordinator = engine.coordinator
    assert coordinator is not None
    ids = [t.topic_id for t in chosen]
    logs = await engine._coord(coordinator.describe_logs, ids)
    storage = {s.topic_id: s for s in await engine._coord(coordinator.describe_topic_storage, ids)}
    out = describe_topics([(t.name, t.topic_id) for t in chosen], logs, storage)
    for t, doc in zip(chosen, out):
        add_tiered(engine, t, doc)
        if replicas:
            add_replica_caches(engine, t, doc)
    return {"topics": out}


def add_tiered(engine: "DisklessEngine", t: Any, doc: dict[str, Any]) -> None:
    """Per partition of a topic that moves its WAL data to the remote tier (or still has remote
    segments): the tiered boundary from the remote log metadata (kcli/diskless/tiering.py) —
    remote segments and bytes, the remote tier's start, and ``highest_tiered_offset`` (tiered up
    to; -1: nothing yet). Below the coordinator's log start, reads come from the remote tier."""
    tiering = engine.tiering
    if tiering is None:
        return
    parts = doc["partitions"]
    if not tiering.copies(t) and not any(tiering.remote_segments(t, p["partition"]) for p in parts):
        return
    for p in parts:
        p.update(tiering.describe(t, p["partition"]))


def add_replica_caches(engine: "DisklessEngine", t: Any, doc: dict[str, Any]) -> None:
    """Per partition: replicas, ISR (in sync with the coordinator) and each replica's local cache
    range as this broker knows it (kcli/diskless/replica_cache.py)."""
    for p in doc["partitions"]:
        ps = t.partitions.get(p["partition"])
        if ps is None:
            continue
        p["replicas"] = list(ps.replicas)
        p["isr"] = engine.isr(t, ps)
        p["replica_caches"] = engine.cache_ranges(t, ps)


def describe_topics(chosen: list[tuple[str, uuid.UUID]], logs: list["LogInfo"],
                    storage: dict[uuid.UUID, "TopicStorageInfo"]) -> list[dict[str, Any]]:
    """The describe view from the coordinator's answers: online (above) and offline
    (kcli/ops/diskless.py) print the same thing."""
    parts: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for li in logs:
        tip = li.topic_id_partition
        parts.setdefault(tip.topic_id, []).append({
            "partition": tip.partition, "log_start_offset": li.log_start_offset,
            "high_watermark": li.high_watermark, "batch_count": li.batch_count, "byte_size": li.byte_size,
        })
    out = []
    for name, tid in chosen:
        s = storage.get(tid)
        out.append({
            "name": name, "topic_id": kafka_topic_id(tid),
            "partitions": sorted(parts.get(tid, []), key=lambda p: p["partition"]),
            "storage": {
                "live_bytes": s.live_bytes if s else 0,
                "file_count": s.file_count if s else 0,
                "files_size": s.files_size if s else 0,
                "dead_file_count": s.dead_file_count if s else 0,
                "dead_files_size": s.dead_files_size if s else 0,
            },
        })
    return out


def _file_dict(f: "FileInfo") -> dict[str, Any]:
    return {
        "object_key": f.object_key, "state": f.state, "file_size": f.file_size, "used_size": f.used_size,
        "batch_count": f.batch_count, "committed_at_ms": f.committed_at_ms,
        "marked_for_deletion_at_ms": f.marked_for_deletion_at_ms, "uploader_broker_id": f.uploader_broker_id,
        "partitions": [f"{tip.topic}-{tip.partition}" for tip in f.partitions],
    }


def _batch_dict(b: "BatchInfo") -> dict[str, Any]:
    md = b.metadata
    tip = md.topic_id_partition
    return {
        "topic": tip.topic, "partition": tip.partition, "byte_offset": md.byte_offset, "byte_size": md.byte_size,
        "base_offset": md.base_offset, "last_offset": md.last_offset, "timestamp_type": md.timestamp_type,
        "log_append_time": md.log_append_timestamp, "max_timestamp": md.batch_max_timestamp,
        "producer_id": md.producer_id, "producer_epoch": md.producer_epoch,
        "base_sequence": md.base_sequence, "last_sequence": md.last_sequence,
    }


async def objects(engine: "DisklessEngine", *, state: str | None = None, topic: str | None = None,
                  object_key: str | None = None, batches: bool = False) -> dict[str, Any]:
    """Committed WAL objects (optionally one state, one topic, one key), with their batches."""
    topic_id = None
    if topic:
        t = engine.broker.topic(topic)
        if t is None:
            raise BrokerError(ErrorCode.unknown_topic_or_partition, f"topic {topic!r} does not exist")
        topic_id = t.topic_id
    if state not in (None, "uploaded", "deleting"):
        raise BrokerError(ErrorCode.invalid_request, f"unknown object state {state!r} (uploaded or deleting)")
    if not engine.is_open:  # diskless never used on this broker: nothing to show, nothing to open
        return {"storage": None, "objects": []}
    coordinator = engine.coordinator
    assert coordinator is not None
    files = await engine._coord(coordinator.describe_files, state, object_key, topic_id)
    out = []
    for f in files:
        d = _file_dict(f)
        if batches:
            d["batches"] = [_batch_dict(b) for b in await engine._coord(coordinator.batches_in_file, f.object_key)]
        out.append(d)
    return {"storage": engine.storage.describe() if engine.storage else None, "objects": out}


async def verify(engine: "DisklessEngine", *, object_keys: list[str] | None = None,
                 max_objects: int = 1000) -> dict[str, Any]:
    """Check stored objects against the coordinator: every committed object exists with its
    size and version byte, every live batch parses where the coordinator says, with a valid
    CRC and the right record count; list orphans (upload intent recorded, never committed: the
    cleaner deletes them after the grace period) and unknown objects (no record at all: kept
    until `kcli diskless gc --unknown-objects`)."""
    from kcli.diskless.wal import DEFAULT_PREFIX, WAL_VERSION
    from kcli.records.batch import InvalidBatchError, crc_is_valid, read_header
    from plugins.objectstore.base import ObjectNotFound

    if not engine.is_open:
        return {"storage": None, "objects_checked": 0, "batches_checked": 0, "objects_skipped": 0,
                "problems": [], "orphans": [], "unknown_objects": [], "ok": True}
    coordinator, storage = engine.coordinator, engine.storage
    assert coordinator is not None and storage is not None
    if object_keys:
        files = []
        for key in object_keys:
            files.extend(await engine._coord(coordinator.describe_files, None, key, None))
    else:
        files = await engine._coord(coordinator.describe_files, "uploaded", None, None)
    problems: list[dict[str, Any]] = []
    checked = batches_checked = 0
    for f in files[:max_objects]:
        if f.state != "uploaded":
            continue
        checked += 1
        try:
            data = await _io(engine, storage.fetch, f.object_key)
        except ObjectNotFound:
            problems.append({"object_key": f.object_key, "problem": "missing from object storage"})
            continue
        except Exception as err:  # noqa: BLE001
            problems.append({"object_key": f.object_key, "problem": f"cannot read: {err}"})
            continue
        if len(data) != f.file_size:
            problems.append({"object_key": f.object_key,
                             "problem": f"size {len(data)} differs from committed size {f.file_size}"})
        if not data or data[0] != WAL_VERSION:
            problems.append({"object_key": f.object_key,
                             "problem": f"version byte {data[0] if data else None}, expected {WAL_VERSION}"})
        for b in await engine._coord(coordinator.batches_in_file, f.object_key):
            batches_checked += 1
            md = b.metadata
            where = {"object_key": f.object_key, "byte_offset": md.byte_offset, "byte_size": md.byte_size,
                     "partition": f"{md.topic_id_partition.topic}-{md.topic_id_partition.partition}"}
            try:
                h = read_header(data, md.byte_offset)
            except InvalidBatchError as err:
                problems.append({**where, "problem": f"no batch header: {err}"})
                continue
            if h.size != md.byte_size:
                problems.append({**where, "problem": f"batch of {h.size} bytes, coordinator says {md.byte_size}"})
                continue
            if md.byte_offset + h.size > len(data):
                problems.append({**where, "problem": f"batch of {h.size} bytes runs past the end of the "
                                                     f"object ({len(data)} bytes)"})
                continue
            if h.last_offset_delta != md.last_offset - md.base_offset:
                problems.append({**where, "problem": f"{h.last_offset_delta + 1} records, coordinator says "
                                                     f"{md.last_offset - md.base_offset + 1}"})
            if not crc_is_valid(data, h):
                problems.append({**where, "problem": "CRC-32C mismatch"})
    listed = await _io(engine, lambda: list(storage.list(DEFAULT_PREFIX + "/")))
    in_flight = engine.in_flight_keys()
    intents = {i.object_key for i in await engine._coord(coordinator.list_upload_intents)}
    known = await engine._coord(coordinator.known_object_keys)
    now = int(time.time() * 1000)
    orphans, unknown = split_uncommitted(listed, intents, known | in_flight, now)
    return {"storage": storage.describe(), "objects_checked": checked, "batches_checked": batches_checked,
            "objects_skipped": max(0, len(files) - max_objects), "problems": problems, "orphans": orphans,
            "unknown_objects": unknown, "ok": not problems}


def split_uncommitted(listed: list[Any], intent_keys: set[str], known: set[str] | frozenset[str],
                      now: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Listed objects the coordinator never committed, whatever their age: (orphans — an upload
    intent was recorded —, unknown objects — no record at all). Online and offline verify."""
    orphans: list[dict[str, Any]] = []
    unknown: list[dict[str, Any]] = []
    for i in listed:
        if i.key in known:
            continue
        (orphans if i.key in intent_keys else unknown).append(
            {"object_key": i.key, "size": i.size, "age_ms": now - i.last_modified_ms})
    return orphans, unknown


async def gc(engine: "DisklessEngine", *, dry_run: bool = False, orphans: bool = True,
             unknown_objects: bool = False) -> dict[str, Any]:
    """One file-cleaner pass now (grace period respected); dry_run only reports. Objects the
    coordinator has no record of are deleted only with ``unknown_objects``."""
    from kcli.diskless.cleaner import CleanReport

    if not engine.is_open:
        return CleanReport(dry_run=dry_run, unknown_objects_deleted=unknown_objects).to_dict()
    assert engine.cleaner is not None
    report = await engine.cleaner.run_once(orphans=orphans, dry_run=dry_run, unknown_objects=unknown_objects)
    return report.to_dict()
