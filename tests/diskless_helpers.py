"""Helpers shared by tests/test_diskless.py and tests/test_diskless_s3.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterable

from aiokafka.record.default_records import DefaultRecordBatch

from kcli.diskless import admin_api
from kcli.diskless.wal import parse_wal

DISKLESS = {"diskless.enable": "true"}

# Short intervals so commits, cleaning and retention happen within a test's patience.
FAST = {
    "diskless.append.commit.interval.ms": "50",
    "diskless.file.cleaner.interval.ms": "200",
    "diskless.file.cleaner.retention.period.ms": "800",
    "diskless.retention.check.interval.ms": "300",
    "group.initial.rebalance.delay.ms": "0",
}

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.1, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(interval)


def admin(bootstrap: str, key: int, doc: dict[str, Any] | None = None) -> Any:
    return admin_api.call(bootstrap, key, doc or {})


def metrics(bootstrap: str) -> dict[str, Any]:
    return admin(bootstrap, admin_api.BROKER_METRICS_KEY)


def counter(bootstrap: str, name: str) -> int:
    return int(metrics(bootstrap)["counters"].get(name, 0))


def local_wal_objects(data_dir: Path) -> list[Path]:
    root = Path(data_dir) / "objects" / "wal"
    return sorted(p for p in root.glob("*") if p.is_file()) if root.is_dir() else []


def values_in_objects(blobs: Iterable[bytes]) -> list[bytes]:
    """Every record value stored in the given WAL objects (each must start with version 0)."""
    out: list[bytes] = []
    for blob in blobs:
        assert blob[:1] == b"\x00", "a WAL object starts with version byte 0"
        wal = parse_wal(blob)
        assert wal.invalid_bytes == 0 and wal.error is None
        for h in wal.batches:
            for rec in DefaultRecordBatch(blob[h.position:h.position + h.size]):
                out.append(bytes(rec.value))
    return out


def check_partition_order(msgs: list[Any]) -> dict[int, list[int]]:
    """Offsets per partition must be gapless from the first one, in consumption order."""
    by_part: dict[int, list[int]] = {}
    for m in msgs:
        by_part.setdefault(m.partition(), []).append(m.offset())
    for offsets in by_part.values():
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), offsets[:20]
    return by_part


def record_upload_intent(data_dir: Path, key: str, *, at_ms: int | None = None, broker_id: int = 1) -> None:
    """Record in a broker's coordinator database (a second SQLite connection, as a crashed upload
    would have left it) that ``key`` was going to be uploaded: the object becomes an orphan, not
    an unknown object (kcli/diskless/cleaner.py)."""
    from plugins.coordinator.sqlite import SqliteBatchCoordinator

    with SqliteBatchCoordinator(Path(data_dir) / "diskless" / "coordinator.db") as coordinator:
        coordinator.register_upload_intent(key, broker_id, int(time.time() * 1000) if at_ms is None else at_ms)
