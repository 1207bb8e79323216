"""Physical deletion of WAL objects: emptied ones after a grace period, and orphans.

The coordinator only *marks* an object for deletion when its last live batch goes (retention,
DeleteRecords, topic deletion); the broker deletes it from storage once the grace period
(``diskless.file.cleaner.retention.period.ms``) has passed — long enough for fetches that
already hold its coordinates to finish — and only if the coordinator still says it is safe.

Orphans are objects this cluster provably wrote and never committed: the appender records an
upload intent (key, broker, time) in the coordinator BEFORE the PUT, and commit_file removes it.
An object with an intent, no commit and an age past the grace period is an orphan (an upload
whose commit failed or was cut short by a crash). An object the coordinator has no record of at
all ("unknown object": another cluster's, an older kcli's, a hand-copied one) is only reported;
it is deleted only when an operator asks (``kcli diskless gc --unknown-objects``).

The order matters: list first, then snapshot the appender's in-flight keys, then read the
coordinator's intents and keys — an object listed but committed meanwhile is either still in
flight at the snapshot or already known (its intent gone) when they are read, so it is never
taken for an orphan. The age floor (the grace period, counted from the later of the intent and
the object's mtime) spares uploads of other processes on the same coordinator that are merely
in progress.

The age floor alone does not prove anything about another broker of a cluster: its upload may
be slower than the grace period (a stalled store, a commit queued behind an earlier one), and
the controller cannot see its in-flight keys. So an orphan is CLAIMED before it is deleted
(``BatchCoordinator.claim_orphans``): in one coordinator transaction its intent is removed and
it becomes a file marked for deletion. The appender commits with ``require_intent=True``, so a
later commit of that key is refused (the uploading broker answers its producers with a retriable
error). Claim and commit contend for the same intent row, so exactly one of them wins: an object
is deleted only if no commit of it can ever succeed, whatever the clocks, leases or timings — and
a killed broker's uploads are collected once the grace period has passed since its intent and
its object.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from kcli.broker.background import TaskGuard
from kcli.diskless.wal import DEFAULT_PREFIX

if TYPE_CHECKING:
    from kcli.broker.metrics import Metrics
    from plugins.coordinator.base import BatchCoordinator, UploadIntent
    from plugins.objectstore.base import ObjectInfo, ObjectStorage

log = logging.getLogger("kcli.diskless.cleaner")


@dataclass
class CleanReport:
    """What one cleaner pass did (or, with dry_run, would do)."""

    deleted: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # marked, grace period not over yet
    unsafe: list[str] = field(default_factory=list)  # marked, but the coordinator says not yet
    orphans: list[str] = field(default_factory=list)  # intent recorded, never committed
    # No record in the coordinator: kept and listed, or (unknown_objects_deleted) deleted.
    unknown_objects: list[str] = field(default_factory=list)
    unknown_objects_deleted: bool = False
    errors: list[str] = field(default_factory=list)
    dry_run: bool = False
    orphans_waiting: list[str] = field(default_factory=list)  # orphans inside the grace period: kept

    def to_dict(self) -> dict[str, object]:
        return {"dry_run": self.dry_run, "deleted": self.deleted, "waiting": self.waiting,
                "unsafe": self.unsafe, "orphans": self.orphans, "orphans_waiting": self.orphans_waiting,
                "unknown_objects": self.unknown_objects, "unknown_objects_deleted": self.unknown_objects_deleted,
                "errors": self.errors}


class FileCleaner:
    def __init__(
        self,
        *,
        storage: "ObjectStorage",
        coordinator: "BatchCoordinator",
        io_pool: Executor,
        coordinator_pool: Executor,
        metrics: "Metrics",
        grace_ms: int,
        in_flight_keys: Callable[[], set[str]],
        on_deleted: Callable[[list[str]], None],
        prefix: str = DEFAULT_PREFIX,
        prefix_check: Callable[[], None] | None = None,
    ) -> None:
        self.storage = storage
        self.coordinator = coordinator
        self.io_pool = io_pool
        self.coordinator_pool = coordinator_pool
        self.metrics = metrics
        self.grace_ms = grace_ms
        self.in_flight_keys = in_flight_keys
        self.on_deleted = on_deleted
        self.prefix = prefix.strip("/") + "/"
        # Raises unless the store prefix is verified to be this cluster's (kcli/diskless/identity.py):
        # no orphan or unknown object is deleted from a prefix of unknown or foreign ownership.
        self.prefix_check = prefix_check
        self._lock = asyncio.Lock()  # one pass at a time (loop and admin API)
        # per object: one that cannot be deleted is logged once and backed off, the others go;
        # per error source ("get_files_to_delete", ...): a pass-wide failure is logged once per streak
        self.guard = TaskGuard("diskless-file-cleaner", metrics, log)
        # claimed orphans whose deletion failed: the marked path deletes them, counted as orphans
        self._claimed_pending: set[str] = set()

    async def _coord(self, fn: Callable, *args: object) -> object:  # type: ignore[type-arg]
        return await asyncio.get_running_loop().run_in_executor(self.coordinator_pool, fn, *args)

    async def _io(self, fn: Callable, *args: object) -> object:  # type: ignore[type-arg]
        return await asyncio.get_running_loop().run_in_executor(self.io_pool, fn, *args)

    async def run_once(self, *, orphans: bool = True, dry_run: bool = False, now_ms: int | None = None,
                       unknown_objects: bool = False) -> CleanReport:
        """``unknown_objects``: also delete objects the coordinator has no record of (an
        operator's explicit request; the background loop never sets it)."""
        async with self._lock:
            report = CleanReport(dry_run=dry_run)
            now = int(time.time() * 1000) if now_ms is None else now_ms
            await self._delete_marked(report, now, dry_run)
            if orphans or unknown_objects:
                await self._delete_orphans(report, now, dry_run, orphans=orphans, unknown_objects=unknown_objects)
            return report

    async def _delete_marked(self, report: CleanReport, now: int, dry_run: bool) -> None:
        from plugins.coordinator.base import DeleteFilesRequest

        try:
            files = await self._coord(self.coordinator.get_files_to_delete)
        except Exception as err:  # noqa: BLE001 - keep the loop alive; retry next pass
            report.errors.append(f"get_files_to_delete: {err}")
            return
        self._claimed_pending &= {f.object_key for f in files}  # type: ignore[attr-defined]
        due: list[str] = []
        for f in files:  # type: ignore[attr-defined]
            if now - f.marked_for_deletion_at_ms < self.grace_ms:
                report.waiting.append(f.object_key)
                continue
            if not dry_run and not self.guard.ready(f.object_key):
                continue  # its deletion failed recently: backing off
            if not await self._coord(self.coordinator.is_safe_to_delete_file, f.object_key):
                report.unsafe.append(f.object_key)
                continue
            due.append(f.object_key)
        if not due or dry_run:
            report.deleted.extend(due)
            return
        try:
            await self._io(self.storage.delete, due)
            await self._coord(self.coordinator.delete_files, DeleteFilesRequest(due))
        except Exception as err:  # noqa: BLE001
            self.metrics.inc("diskless.cleaner.errors")
            due = await self._delete_one_by_one(due, report, err)
            if not due:
                return
        report.deleted.extend(due)
        self.metrics.inc("diskless.cleaner.deleted_objects", len(due))
        orphans = self._claimed_pending.intersection(due)
        if orphans:
            self._claimed_pending -= orphans
            self.metrics.inc("diskless.cleaner.orphans_deleted", len(orphans))
        self.on_deleted(due)

    async def _delete_orphans(self, report: CleanReport, now: int, dry_run: bool, *, orphans: bool = True,
                              unknown_objects: bool = False) -> None:
        if self.prefix_check is not None:
            try:
                await self._io(self.prefix_check)
            except Exception as err:  # noqa: BLE001 - store down, or another cluster's prefix
                report.errors.append(f"orphan scan skipped, store prefix owner not verified: {err}")
                return
        if not dry_run:  # temp files of uploads a crash cut short (invisible to list())
            try:
                await self._io(self.storage.delete_abandoned_uploads, self.grace_ms)
            except Exception as err:  # noqa: BLE001
                report.errors.append(f"abandoned uploads: {err}")
        try:
            listed = await self._io(lambda: list(self.storage.list(self.prefix)))
            in_flight = set(self.in_flight_keys())
            intents = await self._coord(self.coordinator.list_upload_intents)
            known = await self._coord(self.coordinator.known_object_keys)
        except Exception as err:  # noqa: BLE001
            report.errors.append(f"orphan scan: {err}")
            return
        scan = classify_listing(listed, intents, known, in_flight, now, self.grace_ms)  # type: ignore[arg-type]
        report.unknown_objects_deleted = unknown_objects
        report.unknown_objects.extend(scan.unknown)
        if orphans:
            report.orphans_waiting.extend(scan.young_orphans)
        found = list(scan.orphans) if orphans else []
        doomed = found + (list(scan.unknown) if unknown_objects else [])
        if dry_run or not doomed:
            report.orphans.extend(found)
            if orphans and not dry_run and scan.stale_intents:
                await self._forget_intents(report, scan.stale_intents)
            return
        if found:
            # Claimed first: from here on a late commit of the object is refused, so deleting it
            # cannot pull it from under a commit (an upload in flight on another broker).
            wanted = set(found)
            sizes = {info.key: info.size for info in listed if info.key in wanted}  # type: ignore[attr-defined]
            try:
                claimed = set(await self._coord(self.coordinator.claim_orphans, sizes, now))  # type: ignore[arg-type]
            except Exception as err:  # noqa: BLE001 - nothing claimed, nothing deleted; next pass
                report.errors.append(f"claiming {len(found)} orphan(s): {err}")
                return
            found = [key for key in found if key in claimed]  # the others were committed meanwhile
            doomed = found + (list(scan.unknown) if unknown_objects else [])
            if not doomed:
                await self._forget_intents(report, scan.stale_intents)
                return
        try:
            await self._io(self.storage.delete, doomed)
        except Exception as err:  # noqa: BLE001
            self.metrics.inc("diskless.cleaner.errors")
            report.errors.append(f"deleting {len(doomed)} orphan/unknown object(s): {err}")
            if unknown_objects:
                report.unknown_objects.clear()  # not deleted after all
            self._claimed_pending.update(found)
            return  # claimed orphans are files marked for deletion now: the marked path retries them
        if found:  # counted as they go, not after the bookkeeping: a reader that sees them gone sees the count
            self.metrics.inc("diskless.cleaner.orphans_deleted", len(found))
        if unknown_objects and scan.unknown:
            self.metrics.inc("diskless.cleaner.unknown_deleted", len(scan.unknown))
        if found:
            try:  # their claim rows go with them (what the marked path would do after the grace period)
                from plugins.coordinator.base import DeleteFilesRequest

                await self._coord(self.coordinator.delete_files, DeleteFilesRequest(found))
            except Exception as err:  # noqa: BLE001 - the marked path removes them later
                report.errors.append(f"forgetting {len(found)} claimed orphan(s): {err}")
        if found:
            log.info("deleted %d orphan WAL object(s) (upload intent recorded, never committed)", len(found))
        if unknown_objects and scan.unknown:
            log.warning("deleted %d unknown object(s) on request: %s", len(scan.unknown), ", ".join(scan.unknown[:10]))
        report.orphans.extend(found)
        self.on_deleted(doomed)
        await self._forget_intents(report, scan.stale_intents if orphans else [])  # claims dropped the others

    async def _forget_intents(self, report: CleanReport, keys: list[str]) -> None:
        """Drop intents whose objects are gone (deleted now, or never uploaded): the table stays
        bounded. A failure only leaves them for the next pass."""
        if not keys:
            return
        try:
            await self._coord(self.coordinator.delete_upload_intents, keys)
        except Exception as err:  # noqa: BLE001
            report.errors.append(f"forgetting {len(keys)} upload intent(s): {err}")

    async def _delete_one_by_one(self, due: list[str], report: CleanReport, batch_err: Exception) -> list[str]:
        """After a failed batch delete: each object on its own, so one object that cannot be
        deleted never keeps the others (each failing one is backed off by the guard). When none
        of several (none already failing) can be deleted the store itself is failing: one
        pass-wide error, no per-object streaks."""
        from plugins.coordinator.base import DeleteFilesRequest

        done: list[str] = []
        failed: list[tuple[str, Exception]] = []
        for key in due:
            try:
                await self._io(self.storage.delete, [key])
                await self._coord(self.coordinator.delete_files, DeleteFilesRequest([key]))
            except Exception as err:  # noqa: BLE001
                failed.append((key, err))
                continue
            self.guard.succeeded(key)
            done.append(key)
        if not done and len(due) > 1 and not any(self.guard.failing(key) for key, _ in failed):
            report.errors.append(f"deleting {len(due)} object(s): {batch_err}")  # the store is failing
            return done
        for key, err in failed:
            self.guard.failed(key, f"WAL object {key}", err)
            report.errors.append(f"{key}: {err}")
        return done

    async def run_forever(self, interval_ms: int, orphan_interval_ms: int,
                          active: Callable[[], bool] = lambda: True) -> None:
        """Passes until cancelled; only while ``active()`` (in a cluster: on the controller, so
        one broker at a time deletes objects)."""
        last_orphan_scan = 0.0
        while True:
            await asyncio.sleep(interval_ms / 1000)
            if not active():
                continue
            scan = time.monotonic() - last_orphan_scan >= orphan_interval_ms / 1000

            async def one_pass(scan: bool = scan) -> None:
                nonlocal last_orphan_scan
                sources = [k for k in self.guard.streaks if isinstance(k, tuple) and k[:1] == ("pass",)]
                for key in sources:
                    self.guard.ready(key)  # still tracked this pass
                report = await self.run_once(orphans=scan)
                if scan:
                    last_orphan_scan = time.monotonic()
                self._log_pass_errors(report)

            await self.guard.round(one_pass, "file cleaner pass")

    def _log_pass_errors(self, report: CleanReport) -> None:
        """Pass-wide errors (``source: message``) are logged once per streak of their source,
        with one line when the source recovers; per-object ones were logged by the guard."""
        failing: dict[str, tuple[str, str]] = {}  # first word of the source → (source, error)
        for e in report.errors:
            source = e.partition(": ")[0]
            if self.guard.failing(source):
                continue  # a WAL object's own streak
            failing.setdefault(source.split(" ", 1)[0], (source, e))
        for word, (source, text) in failing.items():
            self.guard.failed(("pass", word), source, text)
        for key in [k for k in self.guard.streaks if isinstance(k, tuple) and k[:1] == ("pass",)]:
            if key[1] not in failing:
                self.guard.succeeded(key)


@dataclass(frozen=True)
class ListingScan:
    """A WAL listing sorted by what the coordinator knows (see the module docstring)."""

    orphans: list[str]  # intent recorded, never committed, past the grace period: garbage
    unknown: list[str]  # no record at all, past the grace period: reported, kept unless asked
    stale_intents: list[str]  # intents past the grace period whose object is not in the listing
    young_orphans: list[str] = field(default_factory=list)  # orphans still inside the grace period: kept


def uncommitted_kind(key: str, last_modified_ms: int, intent_at_ms: int | None, known: "set[str] | frozenset[str]",
                     now: int, grace_ms: int) -> str | None:
    """The garbage rule for one listed WAL object: ``None`` (committed, or too young to judge —
    the grace period counts from the later of its mtime and its intent), ``"orphan"`` (this
    cluster recorded an intent and never committed it: provably garbage) or ``"unknown"`` (no
    record at all: reported, deleted only on request). The broker's cleaner, offline gc and the
    Spark gc task all sort objects through this one function."""
    if key in known:
        return None
    born = last_modified_ms if intent_at_ms is None else max(last_modified_ms, intent_at_ms)
    if now - born < grace_ms:
        return None
    return "unknown" if intent_at_ms is None else "orphan"


def classify_listing(listed: "list[ObjectInfo]", intents: "list[UploadIntent]", known: set[str],
                     in_flight: set[str], now: int, grace_ms: int) -> ListingScan:
    """Pure, so the rule is tested on its own. An object in flight is neither orphan nor unknown yet."""
    by_key = {i.object_key: i.created_at_ms for i in intents}
    sorted_out: dict[str, list[str]] = {"orphan": [], "unknown": []}
    seen: set[str] = set()
    young: list[str] = []
    for info in listed:
        seen.add(info.key)
        if info.key in in_flight:
            continue
        kind = uncommitted_kind(info.key, info.last_modified_ms, by_key.get(info.key), known, now, grace_ms)
        if kind is not None:
            sorted_out[kind].append(info.key)
        elif orphan_in_grace(info.key, by_key.get(info.key), known):
            young.append(info.key)
    stale = [key for key, at in by_key.items() if key not in seen and key not in known
             and key not in in_flight and now - at >= grace_ms]
    return ListingScan(sorted_out["orphan"], sorted_out["unknown"], stale, young)


def orphan_in_grace(key: str, intent_at_ms: int | None, known: "set[str] | frozenset[str]") -> bool:
    """For an object :func:`uncommitted_kind` left alone: an upload intent and no commit, so
    an orphan once its grace period is over (listed as such by gc, not deleted)."""
    return intent_at_ms is not None and key not in known
