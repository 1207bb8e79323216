"""Physical deletion of WAL objects: emptied ones after a grace period, and orphans.

The coordinator only *marks* an object for deletion when its last live batch goes (retention,
DeleteRecords, topic deletion); the broker deletes it from storage once the grace period
(``diskless.file.cleaner.retention.period.ms``) has passed — long enough for fetches that
already hold its coordinates to finish — and only if the coordinator still says it is safe.

Orphans are objects the coordinator never committed (an upload whose commit failed or was cut
short by a crash). They are found by listing the WAL prefix and subtracting what the
coordinator knows. The order matters: list first, then snapshot the appender's in-flight keys,
then read the coordinator's keys — an object listed but committed meanwhile is either still in
flight at the snapshot or already known when the keys are read, so it is never taken for an
orphan. The age floor (the same grace period) covers other brokers sharing the bucket.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from kcli.diskless.wal import DEFAULT_PREFIX

if TYPE_CHECKING:
    from kcli.broker.metrics import Metrics
    from plugins.coordinator.base import BatchCoordinator
    from plugins.objectstore.base import ObjectStorage

log = logging.getLogger("kcli.diskless.cleaner")


@dataclass
class CleanReport:
    """What one cleaner pass did (or, with dry_run, would do)."""

    deleted: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # marked, grace period not over yet
    unsafe: list[str] = field(default_factory=list)  # marked, but the coordinator says not yet
    orphans: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dry_run: bool = False

    def to_dict(self) -> dict[str, object]:
        return {"dry_run": self.dry_run, "deleted": self.deleted, "waiting": self.waiting,
                "unsafe": self.unsafe, "orphans": self.orphans, "errors": self.errors}


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
        self._lock = asyncio.Lock()  # one pass at a time (loop and admin API)

    async def _coord(self, fn: Callable, *args: object) -> object:  # type: ignore[type-arg]
        return await asyncio.get_running_loop().run_in_executor(self.coordinator_pool, fn, *args)

    async def _io(self, fn: Callable, *args: object) -> object:  # type: ignore[type-arg]
        return await asyncio.get_running_loop().run_in_executor(self.io_pool, fn, *args)

    async def run_once(self, *, orphans: bool = True, dry_run: bool = False, now_ms: int | None = None) -> CleanReport:
        async with self._lock:
            report = CleanReport(dry_run=dry_run)
            now = int(time.time() * 1000) if now_ms is None else now_ms
            await self._delete_marked(report, now, dry_run)
            if orphans:
                await self._delete_orphans(report, now, dry_run)
            return report

    async def _delete_marked(self, report: CleanReport, now: int, dry_run: bool) -> None:
        from plugins.coordinator.base import DeleteFilesRequest

        try:
            files = await self._coord(self.coordinator.get_files_to_delete)
        except Exception as err:  # noqa: BLE001 - keep the loop alive; retry next pass
            report.errors.append(f"get_files_to_delete: {err}")
            return
        due: list[str] = []
        for f in files:  # type: ignore[attr-defined]
            if now - f.marked_for_deletion_at_ms < self.grace_ms:
                report.waiting.append(f.object_key)
                continue
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
            report.errors.append(f"deleting {len(due)} object(s): {err}")
            log.warning("deleting %d WAL object(s) failed: %s", len(due), err)
            return
        report.deleted.extend(due)
        self.metrics.inc("diskless.cleaner.deleted_objects", len(due))
        self.on_deleted(due)

    async def _delete_orphans(self, report: CleanReport, now: int, dry_run: bool) -> None:
        if not dry_run:  # temp files of uploads a crash cut short (invisible to list())
            try:
                await self._io(self.storage.delete_abandoned_uploads, self.grace_ms)
            except Exception as err:  # noqa: BLE001
                report.errors.append(f"abandoned uploads: {err}")
        try:
            listed = await self._io(lambda: list(self.storage.list(self.prefix)))
            in_flight = set(self.in_flight_keys())
            known = await self._coord(self.coordinator.known_object_keys)
        except Exception as err:  # noqa: BLE001
            report.errors.append(f"orphan scan: {err}")
            return
        found = [
            info.key for info in listed  # type: ignore[attr-defined]
            if info.key not in known and info.key not in in_flight  # type: ignore[operator]
            and now - info.last_modified_ms >= self.grace_ms
        ]
        if not found:
            return
        if dry_run:
            report.orphans.extend(found)
            return
        try:
            await self._io(self.storage.delete, found)
        except Exception as err:  # noqa: BLE001
            self.metrics.inc("diskless.cleaner.errors")
            report.errors.append(f"deleting {len(found)} orphan(s): {err}")
            return
        log.info("deleted %d orphan WAL object(s)", len(found))
        report.orphans.extend(found)
        self.metrics.inc("diskless.cleaner.orphans_deleted", len(found))
        self.on_deleted(found)

    async def run_forever(self, interval_ms: int, orphan_interval_ms: int) -> None:
        last_orphan_scan = 0.0
        while True:
            await asyncio.sleep(interval_ms / 1000)
            scan = time.monotonic() - last_orphan_scan >= orphan_interval_ms / 1000
            try:
                report = await self.run_once(orphans=scan)
                if scan:
                    last_orphan_scan = time.monotonic()
                for e in report.errors:
                    log.warning("file cleaner: %s", e)
            except asyncio.CancelledError:
                raise
            except Exception:  # pragma: no cover - keep the loop alive
                log.exception("file cleaner pass failed")
