"""Helpers for the `kcli diskless` and engine tests: kcli in this process, damaged datasets.

Running kcli in-process (``kcli_inproc``) matters for the Spark tests: the process's one Spark
session (started once by the session-scoped fixture) is reused by every command, where a
subprocess would pay Spark's 10-30 s cold start each time.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kcli.engine.synth import Dataset, make_dataset


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def kcli_inproc(*args: str) -> Run:
    """``kcli ARGS`` through kcli.cli.app.main in this process; stdout/stderr captured."""
    from kcli.cli import app as app_module

    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = ["kcli", *args]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                app_module.main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
    return Run(code, out.getvalue(), err.getvalue())


def without_ages(doc: dict[str, Any]) -> dict[str, Any]:
    """A verify document without the orphans' age_ms (it depends on when the listing ran)."""
    return {**doc, "orphans": [{k: v for k, v in o.items() if k != "age_ms"} for o in doc.get("orphans", [])]}


@dataclass
class Damaged:
    """A synthetic dataset with known damage, orphans and objects marked for deletion."""

    ds: Dataset
    crc_key: str  # one payload byte flipped
    crc_offset: int  # byte offset of the damaged batch
    short_key: str  # last 10 bytes cut off
    missing_key: str  # file removed
    old_orphans: list[str]
    young_orphan: str
    marked: list[str]


def damaged_dataset(root: Path, objects: int = 12, object_bytes: int = 256 << 10) -> Damaged:
    """Objects 0 and 1 marked for deletion, 3 with a bad CRC, 5 truncated, 7 missing."""
    assert objects >= 8
    from plugins.coordinator.base import DeleteRecordsRequest
    from plugins.coordinator.sqlite import SqliteBatchCoordinator

    ds = make_dataset(root, objects=objects, object_bytes=object_bytes, batch_records=50, value_size=200)
    db = root / "diskless" / "coordinator.db"
    with SqliteBatchCoordinator(db) as coordinator:
        batches = coordinator.batches_in_file(ds.keys[3])
        # Delete the first two objects' worth of records on every partition: both get marked.
        first = coordinator.batches_in_file(ds.keys[1])
        cut = {b.metadata.topic_id_partition: b.metadata.last_offset + 1 for b in first}
        coordinator.delete_records([DeleteRecordsRequest(tip, off) for tip, off in cut.items()])
        marked = [f.object_key for f in coordinator.describe_files("deleting")]
    victim = batches[2].metadata
    path = ds.path(ds.keys[3])
    data = bytearray(path.read_bytes())
    data[victim.byte_offset + victim.byte_size - 5] ^= 0xFF
    path.write_bytes(bytes(data))
    short = ds.path(ds.keys[5])
    short.write_bytes(short.read_bytes()[:-10])
    os.remove(ds.path(ds.keys[7]))
    old = []
    for _ in range(2):
        key = f"wal/{uuid.uuid4()}"
        ds.path(key).write_bytes(b"\x00orphan-" + key.encode())
        os.utime(ds.path(key), (time.time() - 3600, time.time() - 3600))
        old.append(key)
    young = f"wal/{uuid.uuid4()}"
    ds.path(young).write_bytes(b"\x00young")
    os.utime(ds.path(young), (time.time() + 3600, time.time() + 3600))  # never past any grace period
    # Orphans are uploads with a recorded intent and no commit (kcli/diskless/cleaner.py).
    with SqliteBatchCoordinator(db) as coordinator:
        for key in old:
            coordinator.register_upload_intent(key, 1, int(time.time() * 1000) - 3_600_000)
        coordinator.register_upload_intent(young, 1, int(time.time() * 1000))
    return Damaged(ds, ds.keys[3], victim.byte_offset, ds.keys[5], ds.keys[7], sorted(old), young, marked)
