"""Operations behind ``kcli diskless`` (Kafka's kafka-diskless-metadata plus verify and gc).

Two data sources, one output: :class:`OnlineDiskless` asks a running broker over kcli's admin API
(kcli/diskless/admin_api.py, computed broker-side by kcli/diskless/admin_views.py);
:class:`OfflineDiskless` reads a batch coordinator database directly (``--coordinator
sqlite:///…``, e.g. a stopped broker's ``<data_dir>/diskless/coordinator.db``) and, for verify and
gc, the object store. Offline results are built with admin_views.py's own record→dict functions, so
``-o json`` is the same document either way; kcli adds per-topic totals (describe) and byte
counts (gc) to both.

Offline verify and gc are the heavy scans: their per-object work is a picklable task
(:class:`VerifyTask`, :class:`GcScanTask`) that kcli.engine runs locally or on Spark, with
identical results.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Sequence
from urllib.parse import unquote, urlsplit

from kio.schema.errors import ErrorCode

from kcli.diskless.cleaner import orphan_in_grace, uncommitted_kind
from kcli.engine.run import ChunkTask
from kcli.errors import KafkaApiError, OperationError, UsageError

if TYPE_CHECKING:
    from kcli.engine.progress import Progress
    from kcli.engine.select import Choice, Workload
    from kcli.ops.connection import Connection
    from plugins.coordinator.base import BatchCoordinator
    from plugins.objectstore.base import ObjectStorage

WAL_PREFIX = "wal/"  # kcli.diskless.wal.DEFAULT_PREFIX + "/": the only prefix verify/gc look at
DEFAULT_GRACE_MS = 60_000  # broker default of diskless.file.cleaner.retention.period.ms
ADMIN_TIMEOUT_S = 600.0  # verify/gc run on the broker for as long as the store takes
STATES = ("uploaded", "deleting")


def now_ms() -> int:
    return int(time.time() * 1000)


# -- shared post-processing (online and offline) ------------------------------------------------


def add_totals(describe: dict[str, Any]) -> dict[str, Any]:
    """Per-topic totals over its partitions (the overview's last line per topic)."""
    for topic in describe.get("topics", []):
        parts = topic.get("partitions", [])
        topic["totals"] = {
            "partitions": len(parts),
            "batch_count": sum(p["batch_count"] for p in parts),
            "byte_size": sum(p["byte_size"] for p in parts),
            "messages": sum(p["high_watermark"] - p["log_start_offset"] for p in parts),
        }
    return describe


def add_gc_bytes(report: dict[str, Any], marked_sizes: dict[str, int],
                 orphan_sizes: dict[str, int] | None) -> dict[str, Any]:
    """Bytes next to the broker's key lists (its report only names keys). ``orphan_sizes``
    holds the sizes of listed objects (orphans and unknown objects alike)."""
    report["deleted_bytes"] = sum(marked_sizes.get(k, 0) for k in report.get("deleted", []))
    report["waiting_bytes"] = sum(marked_sizes.get(k, 0) for k in report.get("waiting", []))
    for name in ("orphans", "unknown_objects"):
        report[f"{name}_bytes"] = (sum(orphan_sizes.get(k, 0) for k in report.get(name, []))
                                   if orphan_sizes is not None else None)
    return report


# -- online: a running broker --------------------------------------------------------------------


class OnlineDiskless:
    """The broker scans its own store; results are its admin API documents.

    Given a :class:`~kcli.ops.connection.Connection` (a bootstrap list), the requests go to the
    cluster's controller (kcli/ops/brokers.py): in a cluster it alone runs diskless garbage
    collection, and every broker reads the same coordinator and store. Given an address, to it."""

    mode = "online"

    def __init__(self, target: "str | Connection") -> None:
        self._conn = None if isinstance(target, str) else target
        self._addresses = [target.split(",")[0].strip()] if isinstance(target, str) else None

    @property
    def bootstrap(self) -> str:
        """The broker the requests go to first (resolved once, on first use)."""
        return self._targets()[0]

    def _targets(self) -> list[str]:
        """The controller first, then the other live brokers (for reads, should it be gone)."""
        if self._addresses is None:
            from kcli.ops.brokers import cluster_view

            assert self._conn is not None
            view = cluster_view(self._conn)
            first = view.controller()
            self._addresses = [view.address(first)] + [view.address(b) for b in view.brokers if b != first]
        return self._addresses

    def _call(self, key: int, doc: dict[str, Any], timeout: float = 30.0, *, controller_only: bool = False) -> Any:
        from kcli.diskless import admin_api

        targets = self._targets()[:1] if controller_only else self._targets()
        for i, address in enumerate(targets):
            try:
                return admin_api.call(address, key, doc, timeout=timeout,
                                      properties=self._conn.properties if self._conn is not None else None)
            except KafkaApiError:
                raise
            except OperationError:  # unreachable (e.g. just died, lease not yet expired): the next one
                if i == len(targets) - 1:
                    raise
        raise AssertionError("unreachable")

    def describe(self, topics: Sequence[str] | None = None, replicas: bool = False) -> dict[str, Any]:
        from kcli.diskless.admin_api import DISKLESS_DESCRIBE_KEY

        doc: dict[str, Any] = {"topics": list(topics) if topics else None}
        if replicas:  # ISR and replica caches: only a broker knows them
            doc["replicas"] = True
        return add_totals(self._call(DISKLESS_DESCRIBE_KEY, doc))

    def objects(self, *, state: str | None = None, topic: str | None = None, object_key: str | None = None,
                batches: bool = False) -> dict[str, Any]:
        from kcli.diskless.admin_api import DISKLESS_OBJECTS_KEY

        doc = {"state": state, "topic": topic, "object_key": object_key, "batches": batches}
        return self._call(DISKLESS_OBJECTS_KEY, {k: v for k, v in doc.items() if v is not None})

    def verify(self, *, object_keys: Sequence[str] | None = None, max_objects: int | None = None) -> dict[str, Any]:
        from kcli.diskless.admin_api import DISKLESS_VERIFY_KEY

        unknown_object_keys([k for k in object_keys or () if not self.objects(object_key=k)["objects"]])
        doc: dict[str, Any] = {"object_keys": list(object_keys) if object_keys else None}
        if max_objects is not None:
            doc["max_objects"] = max_objects
        return self._call(DISKLESS_VERIFY_KEY, doc, ADMIN_TIMEOUT_S)

    def gc(self, *, dry_run: bool = False, orphans: bool = True, unknown_objects: bool = False) -> dict[str, Any]:
        from kcli.diskless.admin_api import DISKLESS_GC_KEY

        marked = self.objects(state="deleting")
        marked_sizes = {o["object_key"]: o["file_size"] for o in marked["objects"]}
        orphan_sizes = _listing_sizes(marked.get("storage")) if orphans or unknown_objects else {}
        # only the controller: in a cluster its file cleaner is the one deleting objects
        report = self._call(DISKLESS_GC_KEY, {"dry_run": dry_run, "orphans": orphans,
                                              "unknown_objects": unknown_objects}, ADMIN_TIMEOUT_S,
                            controller_only=True)
        return add_gc_bytes(report, marked_sizes, orphan_sizes)


def unknown_object_keys(keys: list[str]) -> None:
    """`verify --key K` for a key the coordinator has no record of is an error, not "0 checked, ok"."""
    if keys:
        raise OperationError(f"no object {', '.join(map(repr, keys))} in the batch coordinator "
                             "(see `kcli diskless objects`)")


def _listing_sizes(storage_uri: str | None) -> dict[str, int] | None:
    """Sizes of the WAL objects in the broker's store, if this host can list it (else None)."""
    if not storage_uri:
        return None
    try:
        from plugins.objectstore import from_uri

        with from_uri(storage_uri) as storage:
            return {o.key: o.size for o in storage.list(WAL_PREFIX)}
    except Exception:  # noqa: BLE001 - a remote broker's file store: bytes stay unknown
        return None


# -- offline: a coordinator database (and the object store) --------------------------------------


def default_object_store(coordinator_uri: str) -> str | None:
    """``file://<dir of the db>/../objects`` when that directory exists (a broker's data dir
    keeps ``diskless/coordinator.db`` next to ``objects/``), else None."""
    path = _sqlite_path(coordinator_uri)
    if path is None:
        return None
    objects = Path(path).parent.parent / "objects"  # no resolve(): the URI the broker itself reports
    return objects.as_uri() if objects.is_dir() else None


def _sqlite_path(uri: str) -> str | None:
    parts = urlsplit(uri)
    if parts.scheme.lower() != "sqlite":
        return None
    return unquote(parts.path) or None


@dataclass
class OfflineDiskless:
    """Reads ``coordinator_uri`` (read-only unless gc deletes) and ``object_store_uri``."""

    coordinator_uri: str
    object_store_uri: str | None = None
    choice_for: "Callable[[Workload], Choice] | None" = None  # from --engine/--spark-master; default local
    progress: "Callable[[str, int], Progress] | None" = None  # default: rich bar on a terminal
    verbose: bool = False
    mode: ClassVar[str] = "offline"

    def __post_init__(self) -> None:
        if self.object_store_uri is None:
            self.object_store_uri = default_object_store(self.coordinator_uri)

    # resources

    def _coordinator(self, *, writable: bool = False) -> "BatchCoordinator":
        from plugins.coordinator import open_coordinator

        path = _sqlite_path(self.coordinator_uri)
        if path is not None and path.startswith("/") and not os.path.isfile(path):
            raise UsageError(f"--coordinator {self.coordinator_uri}: no database at {path}")
        try:
            return open_coordinator(self.coordinator_uri, read_only=not writable)
        except OperationError as err:
            raise UsageError(f"--coordinator: {err}") from None

    def _storage_uri(self) -> str:
        """The store URI, checked here so a bad one is a usage error before any scan starts."""
        if not self.object_store_uri:
            path = _sqlite_path(self.coordinator_uri)  # a missing database is the real problem then
            if path is not None and path.startswith("/") and not os.path.isfile(path):
                raise UsageError(f"--coordinator {self.coordinator_uri}: no database at {path}")
            if path is None:  # e.g. postgresql://: no data dir to find the objects next to
                raise UsageError("no object store: give --object-store URI (file:///dir or s3://bucket/prefix)")
            raise UsageError(
                "no object store: give --object-store URI (the default, file://<dir of the database>/../objects, "
                "does not exist)")
        from plugins.objectstore import from_uri

        try:
            from_uri(self.object_store_uri).close()
        except OperationError as err:
            raise UsageError(f"--object-store: {err}") from None
        return self.object_store_uri

    def _storage(self) -> "ObjectStorage":
        from plugins.objectstore import from_uri

        try:
            return from_uri(self._storage_uri())
        except OperationError as err:
            raise UsageError(f"--object-store: {err}") from None

    def _topic_ids(self, coordinator: "BatchCoordinator") -> dict[str, uuid.UUID]:
        return {li.topic_id_partition.topic: li.topic_id_partition.topic_id for li in coordinator.describe_logs()}

    # describe / objects

    def describe(self, topics: Sequence[str] | None = None, replicas: bool = False) -> dict[str, Any]:
        from kcli.diskless.admin_views import describe_topics

        if replicas:
            raise OperationError("--replicas needs a broker: replica caches and the ISR are known to brokers, "
                                 "not to the coordinator (drop --coordinator)")

        with self._coordinator() as coordinator:
            ids = self._topic_ids(coordinator)
            if topics:
                chosen = [(name, _known_topic(ids, name)) for name in topics]
            else:
                chosen = sorted(ids.items())
            if not chosen:
                return add_totals({"topics": []})
            wanted = [tid for _, tid in chosen]
            logs = coordinator.describe_logs(wanted)
            storage = {s.topic_id: s for s in coordinator.describe_topic_storage(wanted)}
        return add_totals({"topics": describe_topics(chosen, logs, storage)})

    def objects(self, *, state: str | None = None, topic: str | None = None, object_key: str | None = None,
                batches: bool = False) -> dict[str, Any]:
        from kcli.diskless.admin_views import _batch_dict, _file_dict

        if state not in (None, *STATES):
            raise UsageError(f"unknown object state {state!r} (uploaded or deleting)")
        with self._coordinator() as coordinator:
            topic_id = _known_topic(self._topic_ids(coordinator), topic) if topic else None
            out = []
            for f in coordinator.describe_files(state, object_key, topic_id):
                d = _file_dict(f)
                if batches:
                    d["batches"] = [_batch_dict(b) for b in coordinator.batches_in_file(f.object_key)]
                out.append(d)
        return {"storage": self.object_store_uri, "objects": out}

    # verify

    def verify(self, *, object_keys: Sequence[str] | None = None, max_objects: int | None = None) -> dict[str, Any]:
        from kcli.engine.run import run_task
        from kcli.engine.select import Workload

        storage_uri = self._storage_uri()
        with self._coordinator() as coordinator:
            if object_keys:
                by_key = {key: coordinator.describe_files(None, key, None) for key in object_keys}
                unknown_object_keys([key for key, found in by_key.items() if not found])
                files = [f for found in by_key.values() for f in found]
            else:
                files = coordinator.describe_files("uploaded", None, None)
            limit = len(files) if max_objects is None else max_objects
            items = [
                VerifyItem(f.object_key, f.file_size, tuple(
                    (b.metadata.byte_offset, b.metadata.byte_size, b.metadata.base_offset, b.metadata.last_offset,
                     str(b.metadata.topic_id_partition))
                    for b in coordinator.batches_in_file(f.object_key)))
                for f in files[:limit] if f.state == "uploaded"
            ]
            intents = {i.object_key for i in coordinator.list_upload_intents()}
            known = coordinator.known_object_keys()
        sizes = [i.file_size for i in items]
        choice = self._choose(Workload("verify", len(items), sum(sizes)))
        problems: list[dict[str, Any]] = []
        batches_checked = 0
        with self._progress("verify", len(items)) as progress:
            for verdict in run_task(VerifyTask(storage_uri), items, sizes, choice, progress, verbose=self.verbose):
                problems.extend(verdict.problems)
                batches_checked += verdict.batches_checked
        from kcli.diskless.admin_views import split_uncommitted

        with self._storage() as storage:
            orphans, unknown = split_uncommitted(list(storage.list(WAL_PREFIX)), intents, known, now_ms())
            where = storage.describe()
        return {"storage": where, "objects_checked": len(items), "batches_checked": batches_checked,
                "objects_skipped": max(0, len(files) - limit), "problems": problems, "orphans": orphans,
                "unknown_objects": unknown, "ok": not problems}

    # gc

    def gc(self, *, dry_run: bool = False, orphans: bool = True, grace_ms: int = DEFAULT_GRACE_MS,
           now: int | None = None, unknown_objects: bool = False) -> dict[str, Any]:
        """One file-cleaner pass like the broker's (kcli/diskless/cleaner.py), offline: orphans
        are objects with an upload intent and no commit; objects with no record at all are
        listed, and deleted only with ``unknown_objects``."""
        from kcli.engine.run import run_task
        from kcli.engine.select import Workload
        from plugins.coordinator.base import DeleteFilesRequest

        storage_uri = self._storage_uri()
        now = now_ms() if now is None else now
        report: dict[str, Any] = {"dry_run": dry_run, "deleted": [], "waiting": [], "unsafe": [], "orphans": [],
                                  "orphans_waiting": [], "unknown_objects": [],
                                  "unknown_objects_deleted": unknown_objects, "errors": []}
        scan_listing = orphans or unknown_objects
        with self._coordinator(writable=not dry_run) as coordinator:
            marked_sizes = {f.object_key: f.file_size for f in coordinator.describe_files("deleting", None, None)}
            due: list[str] = []
            for f in coordinator.get_files_to_delete():
                if now - f.marked_for_deletion_at_ms < grace_ms:
                    report["waiting"].append(f.object_key)
                elif not coordinator.is_safe_to_delete_file(f.object_key):
                    report["unsafe"].append(f.object_key)
                else:
                    due.append(f.object_key)
            listed: list[tuple[str, int, int]] = []
            if scan_listing:
                with self._storage() as storage:
                    _check_same_cluster(storage, coordinator)
                    listed = [(o.key, o.size, o.last_modified_ms) for o in storage.list(WAL_PREFIX)]
            # Listed before the keys are read, as the broker's cleaner does (nothing commits offline,
            # but the order keeps a concurrently running broker's fresh uploads out of the orphans).
            intents = {i.object_key: i.created_at_ms for i in coordinator.list_upload_intents()}
            known = frozenset(coordinator.known_object_keys())
            if orphans:
                report["orphans_waiting"] = [
                    key for key, _, mtime in listed
                    if uncommitted_kind(key, mtime, intents.get(key), known, now, grace_ms) is None
                    and orphan_in_grace(key, intents.get(key), known)]
            if orphans and not dry_run and listed:
                # Claimed before anything is deleted (kcli/diskless/cleaner.py): a running broker
                # still committing one of them is refused instead of committing a deleted object.
                candidates = {key: size for key, size, mtime in listed
                              if uncommitted_kind(key, mtime, intents.get(key), known, now, grace_ms) == "orphan"}
                claimed = set(coordinator.claim_orphans(candidates, now)) if candidates else set()
                listed = [row for row in listed if row[0] not in candidates or row[0] in claimed]
            items = [GcItem("marked", key, marked_sizes.get(key, 0), 0) for key in due]
            # --no-orphans: objects with an intent are left out, not mistaken for unknown ones.
            items += [GcItem("listed", key, size, mtime) for key, size, mtime in listed if orphans or key not in intents]
            sizes = [i.size for i in items]
            choice = self._choose(Workload("gc", len(items), sum(sizes)))
            task = GcScanTask(storage_uri, known, now, grace_ms, dry_run, intents, unknown_objects)
            deleted_marked: list[str] = []
            orphan_sizes: dict[str, int] = {}
            with self._progress("gc", len(items)) as progress:
                for outcome in run_task(task, items, sizes, choice, progress, verbose=self.verbose):
                    if outcome is None:
                        continue
                    if outcome.error:
                        if outcome.error not in report["errors"]:
                            report["errors"].append(outcome.error)
                        continue
                    if outcome.kind == "marked":
                        deleted_marked.append(outcome.key)
                    else:
                        report["orphans" if outcome.kind == "orphan" else "unknown_objects"].append(outcome.key)
                        orphan_sizes[outcome.key] = outcome.size
            if deleted_marked and not dry_run:
                try:
                    coordinator.delete_files(DeleteFilesRequest(deleted_marked))
                except OperationError as err:
                    report["errors"].append(f"deleting {len(deleted_marked)} object(s) from the coordinator: {err}")
                    deleted_marked = []
            report["deleted"] = deleted_marked
            if orphans and not dry_run:
                # Intents of deleted orphans, and of uploads that never produced an object.
                listed_keys = {key for key, _, _ in listed}
                stale = [key for key, at in intents.items() if key not in listed_keys and now - at >= grace_ms]
                gone = report["orphans"] + stale
                if gone:
                    try:
                        coordinator.delete_upload_intents(gone)
                        if report["orphans"]:  # the claims' deletion records go with the objects
                            coordinator.delete_files(DeleteFilesRequest(report["orphans"]))
                    except OperationError as err:
                        report["errors"].append(f"forgetting {len(gone)} upload intent(s): {err}")
        return add_gc_bytes(report, marked_sizes, orphan_sizes)

    # engine plumbing

    def _choose(self, work: "Workload") -> "Choice":
        from kcli.engine.select import choose

        choice = self.choice_for(work) if self.choice_for is not None else choose("local", work)
        if self.verbose:
            import sys

            sys.stderr.write(f"kcli: {work.kind}: {choice.describe()}\n")
        return choice

    def _progress(self, description: str, total: int) -> "Progress":
        from kcli.engine.progress import Progress

        if self.progress is not None:
            return self.progress(description, total)
        return Progress(description, total)


def _check_same_cluster(storage: "ObjectStorage", coordinator: "BatchCoordinator") -> None:
    """Offline gc deletes from a store: refuse one whose prefix marker names another cluster
    than the coordinator's (kcli/diskless/identity.py)."""
    from kcli.diskless.identity import read_prefix_owner

    owner = read_prefix_owner(storage)
    mine = coordinator.cluster_id()
    if owner is not None and mine is not None and owner != mine:
        raise OperationError(f"object store {storage.describe()} belongs to cluster {owner}, the coordinator"
                             f" to cluster {mine}: refusing to collect garbage across clusters")


def _known_topic(ids: dict[str, uuid.UUID], name: str) -> uuid.UUID:
    if name not in ids:
        raise KafkaApiError("UNKNOWN_TOPIC_OR_PARTITION", f"topic {name!r} does not exist",
                            ErrorCode.unknown_topic_or_partition)
    return ids[name]


# -- per-object tasks (run by kcli.engine: in this process or on Spark executors) ---------------


@dataclass(frozen=True, slots=True)
class VerifyItem:
    """One committed object and its live batches: (byte_offset, byte_size, base_offset,
    last_offset, "topic-partition") each, from the coordinator."""

    object_key: str
    file_size: int
    batches: tuple[tuple[int, int, int, int, str], ...]


@dataclass(slots=True)
class ObjectVerdict:
    object_key: str
    problems: list[dict[str, Any]] = field(default_factory=list)
    batches_checked: int = 0


@dataclass(frozen=True)
class VerifyTask(ChunkTask):
    """Fetch an object and check it against its batch coordinates: size, version byte, and per
    batch header, size, record count and CRC-32C (the broker's checks, kcli/diskless/admin_views.py)."""

    storage_uri: str
    job: ClassVar[str] = "verify"
    local_threads: ClassVar[int] = 4  # overlap object-store reads; CRC-32C releases the GIL

    def open(self) -> "ObjectStorage":
        from plugins.objectstore import from_uri

        return from_uri(self.storage_uri)

    def close(self, resource: "ObjectStorage") -> None:
        resource.close()

    def run(self, resource: "ObjectStorage", item: VerifyItem) -> ObjectVerdict:
        return verify_object(resource, item)


def verify_object(storage: "ObjectStorage", item: VerifyItem) -> ObjectVerdict:
    from kcli.diskless.wal import WAL_VERSION
    from kcli.records.batch import InvalidBatchError, crc_is_valid, read_header
    from plugins.objectstore.base import ObjectNotFound

    key = item.object_key
    verdict = ObjectVerdict(key)
    problems = verdict.problems
    try:
        data = storage.fetch(key)
    except ObjectNotFound:
        problems.append({"object_key": key, "problem": "missing from object storage"})
        return verdict
    except Exception as err:  # noqa: BLE001 - any storage failure is a finding, not a crash
        problems.append({"object_key": key, "problem": f"cannot read: {err}"})
        return verdict
    if len(data) != item.file_size:
        problems.append({"object_key": key, "problem": f"size {len(data)} differs from committed size {item.file_size}"})
    if not data or data[0] != WAL_VERSION:
        problems.append({"object_key": key,
                         "problem": f"version byte {data[0] if data else None}, expected {WAL_VERSION}"})
    for byte_offset, byte_size, base_offset, last_offset, partition in item.batches:
        verdict.batches_checked += 1
        where = {"object_key": key, "byte_offset": byte_offset, "byte_size": byte_size, "partition": partition}
        try:
            h = read_header(data, byte_offset)
        except InvalidBatchError as err:
            problems.append({**where, "problem": f"no batch header: {err}"})
            continue
        if h.size != byte_size:
            problems.append({**where, "problem": f"batch of {h.size} bytes, coordinator says {byte_size}"})
            continue
        if byte_offset + h.size > len(data):
            problems.append({**where, "problem": f"batch of {h.size} bytes runs past the end of the "
                                                 f"object ({len(data)} bytes)"})
            continue
        if h.last_offset_delta != last_offset - base_offset:
            problems.append({**where, "problem": f"{h.last_offset_delta + 1} records, coordinator says "
                                                 f"{last_offset - base_offset + 1}"})
        if not crc_is_valid(data, h):
            problems.append({**where, "problem": "CRC-32C mismatch"})
    return verdict


@dataclass(frozen=True, slots=True)
class GcItem:
    kind: str  # "marked": due for deletion; "listed": found by listing, maybe an orphan
    key: str
    size: int
    last_modified_ms: int


@dataclass(frozen=True, slots=True)
class GcOutcome:
    kind: str  # "marked" | "orphan" | "unknown"
    key: str
    size: int
    error: str | None = None
    kept: bool = False  # an unknown object reported, not deleted


@dataclass(frozen=True)
class GcScanTask(ChunkTask):
    """Sort listed objects older than the grace period: committed (``known_keys``) → kept;
    an upload intent (``intents``: key → time) → orphan, deleted; no record → unknown object,
    deleted only with ``delete_unknown`` (else reported as kept). Due marked objects are deleted
    too, a chunk per storage call; dry_run only reports. ``known_keys`` is a set, or on Spark a
    broadcast of it."""

    storage_uri: str
    known_keys: Any
    now_ms: int
    grace_ms: int
    dry_run: bool
    intents: Any = None  # dict[str, int] of uncommitted upload intents; None: none
    delete_unknown: bool = False
    job: ClassVar[str] = "gc_scan"

    def open(self) -> tuple["ObjectStorage", frozenset[str]]:
        from plugins.objectstore import from_uri

        known = self.known_keys.value if hasattr(self.known_keys, "value") else self.known_keys
        return from_uri(self.storage_uri), known

    def close(self, resource: tuple["ObjectStorage", frozenset[str]]) -> None:
        resource[0].close()

    def run(self, resource: Any, item: GcItem) -> GcOutcome | None:
        return self.run_chunk(resource, [item])[0]

    def run_chunk(self, resource: Any, items: Iterable[GcItem]) -> list[GcOutcome | None]:
        storage, known = resource
        intents = self.intents or {}
        out: list[GcOutcome | None] = []
        for item in items:
            if item.kind == "marked":
                out.append(GcOutcome("marked", item.key, item.size))
                continue
            kind = uncommitted_kind(item.key, item.last_modified_ms, intents.get(item.key), known, self.now_ms,
                                    self.grace_ms)
            if kind is None:
                out.append(None)
            else:
                out.append(GcOutcome(kind, item.key, item.size, kept=kind == "unknown" and not self.delete_unknown))
        doomed = [o.key for o in out if o is not None and not o.kept]
        if doomed and not self.dry_run:
            try:
                storage.delete(doomed)
            except Exception as err:  # noqa: BLE001 - reported per object; the pass goes on
                message = f"deleting {len(doomed)} object(s) from {storage.describe()}: {err}"
                out = [GcOutcome(o.kind, o.key, o.size, message) if o is not None and not o.kept else o for o in out]
        return out
