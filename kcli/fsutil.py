"""Small file-system helpers shared by the modules that write operator-owned files."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_text(path: Path, text: str, mode: int = 0o600) -> None:
    """Write ``text`` to ``path`` via a fsynced temp file and rename, so a crash leaves either the
    old or the new file, never half of one. Raises OSError; the temp file is removed on failure."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fsync_dir(directory: Path) -> None:
    """fsync a directory, so a file created, renamed or removed in it survives a crash."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir_best_effort(directory: Path) -> None:
    """:func:`fsync_dir` where the directory may be gone or the filesystem refuse a directory
    fsync: the caller's data is already durable, the entry's durability is a bonus."""
    try:
        fsync_dir(directory)
    except OSError:
        pass
