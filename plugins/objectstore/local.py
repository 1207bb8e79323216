"""Object storage in a local directory: single-node diskless setups, tests, air-gapped demos.

It keeps the guarantees the broker relies on from a real object store: an object is either absent
or complete (write to a temp file, fsync, atomic rename, fsync the directory), and a key can never
address anything outside the root, whatever a client or a corrupted coordinator row contains.
"""

from __future__ import annotations

import os
import stat
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Iterable, Iterator

from plugins.objectstore.base import (
    ByteRange,
    FailureStreak,
    ObjectInfo,
    ObjectNotFound,
    ObjectStorage,
    StorageBackendException,
    Uploadable,
    length_mismatch,
    range_past_end,
)

# Temp files are hidden and carry this suffix; keys may not use it, so list() can skip them exactly.
TEMP_SUFFIX = ".kcli-upload"
_CHUNK = 1 << 20


def validate_key(key: str, *, what: str = "key") -> tuple[str, ...]:
    """Split ``key`` into safe path components or raise; shared by keys and list prefixes."""
    if not isinstance(key, str) or not key:
        raise StorageBackendException(f"invalid object {what} {key!r}: empty")
    if "\x00" in key:
        raise StorageBackendException(f"invalid object {what} {key!r}: contains NUL")
    if "\\" in key:
        raise StorageBackendException(f"invalid object {what} {key!r}: contains a backslash")
    if key.startswith("/"):
        raise StorageBackendException(f"invalid object {what} {key!r}: absolute")
    parts = tuple(key.split("/"))
    for part in parts:
        if part in ("", ".", ".."):
            raise StorageBackendException(f"invalid object {what} {key!r}: empty, '.' or '..' path component")
        if part.endswith(TEMP_SUFFIX):
            raise StorageBackendException(f"invalid object {what} {key!r}: reserved suffix {TEMP_SUFFIX}")
    return parts


class LocalObjectStorage(ObjectStorage):
    """Objects as files under ``root``; ``a/b`` keys become subdirectories. Config key: ``root``."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self._root: Path | None = Path(root).absolute() if root is not None else None
        self._write_failures = FailureStreak(self.describe)  # uploads: what write_failure() reports
        self._delete_failures = FailureStreak(self.describe)

    def configure(self, configs: dict[str, str]) -> None:
        unknown = set(configs) - {"root"}
        if unknown:
            raise StorageBackendException(f"unknown LocalObjectStorage config(s): {', '.join(sorted(unknown))}")
        if "root" in configs:
            if not configs["root"]:
                raise StorageBackendException("LocalObjectStorage config root must not be empty")
            self._root = Path(configs["root"]).absolute()

    @property
    def root(self) -> Path:
        if self._root is None:
            raise StorageBackendException("LocalObjectStorage is not configured: set root")
        return self._root

    def write_failure(self) -> str | None:
        return self._write_failures.error

    def describe(self) -> str:
        return self.root.as_uri() if self._root is not None else "file://<unconfigured>"

    # -- paths ---------------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        """The file for ``key``, proven to be inside the root after resolving symlinks."""
        parts = validate_key(key)
        root = self.root
        path = root.joinpath(*parts)
        real_root = root.resolve()
        real = path.resolve()
        if real == real_root or not real.is_relative_to(real_root):
            raise StorageBackendException(f"invalid object key {key!r}: resolves outside the store root")
        return path

    def _error(self, op: str, key: str, err: OSError) -> StorageBackendException:
        return StorageBackendException(f"{op} {key!r} in {self.describe()}: {err.strerror or err}")

    # -- operations ----------------------------------------------------------------------------

    def upload(self, key: str, data: Uploadable, length: int) -> None:
        try:
            self._upload(key, data, length)
        except StorageBackendException as err:
            self._write_failures.failed("upload", key, err)
            raise
        self._write_failures.succeeded()

    def _upload(self, key: str, data: Uploadable, length: int) -> None:
        if length < 0:
            raise StorageBackendException(f"upload of {key!r}: negative length {length}")
        path = self._path(key)
        if isinstance(data, (bytes, bytearray, memoryview)):
            view = memoryview(data).cast("B")
            if view.nbytes != length:
                raise length_mismatch(key, length, view.nbytes)
        else:
            view = None
        parent = path.parent
        tmp = parent / f".{path.name}.{uuid.uuid4().hex}{TEMP_SUFFIX}"
        with _uploading(tmp):  # the sweep of abandoned uploads never takes a live one
            created: list[Path] = []
            for attempt in range(MKDIR_ATTEMPTS):
                try:
                    # Within this process the lock orders it against _remove_empty_parents; another
                    # process sharing the directory (brokers over one file:// store) is why it retries.
                    with _dirs_lock:
                        created += _makedirs(parent)
                        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
                    break
                except FileNotFoundError as err:  # a delete emptied and removed the directory meanwhile
                    if attempt == MKDIR_ATTEMPTS - 1:
                        raise self._error("upload", key, err) from None
                except OSError as err:
                    raise self._error("upload", key, err) from None
            try:
                try:
                    if view is not None:
                        _write_all(fd, view)
                    else:
                        _copy_exact(fd, data, length, key)  # type: ignore[arg-type]
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, path)
                _fsync_dir(parent)
                for directory in created:  # new directories must be durable in their parents too
                    _fsync_dir(directory.parent)
            except StorageBackendException:
                _unlink_quietly(tmp)
                raise
            except OSError as err:
                _unlink_quietly(tmp)
                raise self._error("upload", key, err) from None
            except BaseException:
                _unlink_quietly(tmp)
                raise

    def fetch(self, key: str, range: ByteRange | None = None) -> bytes:  # noqa: A002
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(key, self.describe()) from None
        except OSError as err:
            raise self._error("fetch", key, err) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ObjectNotFound(key, self.describe())
            if range is None:
                start, want = 0, st.st_size
            else:
                if range.end > st.st_size:
                    raise range_past_end(key, range, st.st_size)
                start, want = range.offset, range.size
            return _pread_exact(fd, start, want, key)
        except OSError as err:
            raise self._error("fetch", key, err) from None
        finally:
            os.close(fd)

    def delete(self, keys: Iterable[str]) -> None:
        if isinstance(keys, str):
            keys = [keys]
        for key in keys:
            path = self._path(key)
            try:
                if path.is_dir():
                    continue  # a "directory" is not an object: nothing to delete
                path.unlink()
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as err:
                error = self._error("delete", key, err)
                self._delete_failures.failed("delete", key, error)
                raise error from None
            self._remove_empty_parents(path.parent)
        self._delete_failures.succeeded()

    def _remove_empty_parents(self, directory: Path) -> None:
        """Directories a delete left empty go too (an S3 prefix has no directories to leave
        behind). The root stays. An upload racing into a directory removed here retries its
        mkdir (see ``_upload``); a directory that is not empty simply stops the walk."""
        root = self.root
        with _dirs_lock:
            while directory != root and directory.is_relative_to(root):
                try:
                    directory.rmdir()
                except OSError:
                    return
                directory = directory.parent

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        if prefix:
            # The last component may be partial ("wal/ab"); validate it like a key.
            validate_key(prefix.rstrip("/") or prefix, what="prefix")
        root = self.root
        dir_part = prefix.rpartition("/")[0]
        start = root.joinpath(*dir_part.split("/")) if dir_part else root
        try:
            real_root = root.resolve()
            if not start.resolve().is_relative_to(real_root):
                raise StorageBackendException(f"invalid object prefix {prefix!r}: resolves outside the store root")
        except OSError as err:
            raise self._error("list", prefix, err) from None
        found: list[ObjectInfo] = []

        def on_error(err: OSError) -> None:
            if not isinstance(err, (FileNotFoundError, NotADirectoryError)):
                raise self._error("list", prefix, err)

        for dirpath, dirnames, filenames in os.walk(start, onerror=on_error):
            dirnames.sort()
            rel_dir = PurePosixPath(Path(dirpath).relative_to(root).as_posix())
            for name in filenames:
                if name.endswith(TEMP_SUFFIX):
                    continue
                key = name if str(rel_dir) == "." else f"{rel_dir}/{name}"
                if not key.startswith(prefix):
                    continue
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue  # deleted while listing
                if not stat.S_ISREG(st.st_mode):
                    continue  # symlinks and specials are never objects
                found.append(ObjectInfo(key, st.st_size, st.st_mtime_ns // 1_000_000))
        found.sort(key=lambda info: info.key)
        return iter(found)

    def delete_abandoned_uploads(self, older_than_ms: int) -> int:
        """Temp files of uploads a crash (SIGKILL) cut short: list() hides them, so the orphan
        collector cannot see them. Uploads running in this process are never touched, however
        slow; a temp file of another process untouched for ``older_than_ms`` is abandoned."""
        import time

        cutoff = time.time() - older_than_ms / 1000
        removed = 0
        for dirpath, _dirnames, filenames in os.walk(self.root):
            for name in filenames:
                if not name.endswith(TEMP_SUFFIX):
                    continue
                path = os.path.join(dirpath, name)
                with _uploads_lock:
                    live = path in _uploads_in_progress
                if live:
                    continue
                try:
                    if os.lstat(path).st_mtime < cutoff:
                        os.unlink(path)
                        removed += 1
                except FileNotFoundError:
                    continue
                except OSError as err:
                    raise self._error("delete abandoned upload", name, err) from None
        return removed

    def size(self, key: str) -> int:
        path = self._path(key)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFound(key, self.describe()) from None
        except OSError as err:
            raise self._error("stat", key, err) from None
        if not stat.S_ISREG(st.st_mode):
            raise ObjectNotFound(key, self.describe())
        return st.st_size


# Temp files of uploads running in this process (every store instance: diskless and tiered each
# have their own). delete_abandoned_uploads skips them however long they have been idle.
_uploads_in_progress: set[str] = set()
_uploads_lock = threading.Lock()
# Orders an upload's mkdir + create of its temporary file against the removal of empty directories.
_dirs_lock = threading.Lock()
MKDIR_ATTEMPTS = 10


@contextmanager
def _uploading(tmp: Path) -> Iterator[None]:
    with _uploads_lock:
        _uploads_in_progress.add(str(tmp))
    try:
        yield
    finally:
        with _uploads_lock:
            _uploads_in_progress.discard(str(tmp))


def _makedirs(directory: Path) -> list[Path]:
    """mkdir -p that reports which directories it created (they need a parent fsync)."""
    missing: list[Path] = []
    current = directory
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    created: list[Path] = []
    for path in reversed(missing):
        try:
            path.mkdir()
            created.append(path)
        except FileExistsError:
            pass
    return created


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _copy_exact(fd: int, stream: "Uploadable", length: int, key: str) -> None:
    remaining = length
    read = stream.read  # type: ignore[union-attr]
    while remaining > 0:
        chunk = read(min(_CHUNK, remaining))
        if not chunk:
            raise length_mismatch(key, length, length - remaining)
        _write_all(fd, memoryview(chunk).cast("B"))
        remaining -= len(chunk)
    if remaining < 0:  # a stream returned more than asked
        raise length_mismatch(key, length, f"more than {length}")
    if read(1):
        raise length_mismatch(key, length, f"more than {length}")


def _pread_exact(fd: int, offset: int, size: int, key: str) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) == size:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        chunk = os.pread(fd, size - got, offset + got)
        if not chunk:
            raise StorageBackendException(f"object {key!r} shrank while being read")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
