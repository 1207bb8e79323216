"""The object storage plugin contract (KIP-1163 "Storage Backend").

Diskless topics keep every byte in an object store; the broker only needs put, ranged get,
delete and list. One ABC keeps the broker, the WAL tooling and dump-log independent of where the
bytes live (a local directory for tests and single-node use, S3 and S3-compatible stores for real
deployments).
"""

from __future__ import annotations

import abc
import logging
import threading
import uuid
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterable, Iterator

from kcli.errors import OperationError

log = logging.getLogger("kcli.objectstore")

# Start-up probe objects live here, apart from WAL objects (wal/) and tiered segments, so no
# listing of data ever sees one; a probe left behind by a crash is a few bytes.
PROBE_PREFIX = "_probe/"
_probing = threading.local()  # set while probe() runs: it reports its own failure, once


class StorageBackendException(OperationError):
    """Every failure of the object storage layer (Kafka's StorageBackendException)."""


class ObjectNotFound(StorageBackendException):
    """The key does not exist in the store."""

    def __init__(self, key: str, where: str = "") -> None:
        self.key = key
        super().__init__(f"object {key!r} not found" + (f" in {where}" if where else ""))


@dataclass(frozen=True, slots=True)
class ByteRange:
    """``size`` bytes starting at ``offset`` (Kafka's ByteRange; end is exclusive)."""

    offset: int
    size: int

    def __post_init__(self) -> None:
        if self.offset < 0 or self.size < 0:
            raise StorageBackendException(f"invalid byte range offset={self.offset} size={self.size}")

    @property
    def end(self) -> int:
        """First byte after the range."""
        return self.offset + self.size

    @property
    def empty(self) -> bool:
        return self.size == 0

    def __str__(self) -> str:
        return f"[{self.offset}, {self.end})"


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One listed object; ``key`` is relative to the store (its root or key prefix)."""

    key: str
    size: int
    last_modified_ms: int


Uploadable = bytes | bytearray | memoryview | BinaryIO


def range_past_end(key: str, byte_range: ByteRange, size: int | None) -> StorageBackendException:
    """The one message both backends use when a ranged read asks for bytes the object lacks."""
    where = f" (object size {size})" if size is not None else ""
    return StorageBackendException(f"byte range {byte_range} is past the end of object {key!r}{where}")


def length_mismatch(key: str, length: int, streamed: int | str) -> StorageBackendException:
    return StorageBackendException(
        f"upload of {key!r} streamed {streamed} bytes but length {length} was declared"
    )


class ObjectStorage(abc.ABC):
    """Put, ranged get, idempotent delete and list over one bucket/prefix or directory.

    Keys are ``/``-separated strings relative to the store; a store never reads or writes
    outside its own root or prefix.
    """

    def configure(self, configs: dict[str, str]) -> None:
        """Apply this class's own settings (prefix already stripped); default: none accepted."""
        if configs:
            raise StorageBackendException(
                f"{type(self).__name__} accepts no configs, got: {', '.join(sorted(configs))}"
            )

    @abc.abstractmethod
    def upload(self, key: str, data: Uploadable, length: int) -> None:
        """Store ``length`` bytes under ``key``; raises if ``data`` holds a different number of
        bytes, and then nothing is stored (a short WAL object must never become visible)."""

    @abc.abstractmethod
    def fetch(self, key: str, range: ByteRange | None = None) -> bytes:  # noqa: A002 - Kafka's name
        """The whole object (``range=None``) or exactly ``range``; a range past the end raises
        instead of returning fewer bytes."""

    @abc.abstractmethod
    def delete(self, keys: Iterable[str]) -> None:
        """Delete the keys; keys that do not exist are not an error (idempotent)."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Objects whose key starts with ``prefix`` (a plain string prefix), in key order."""

    @abc.abstractmethod
    def size(self, key: str) -> int:
        """Size in bytes; ObjectNotFound when missing."""

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except ObjectNotFound:
            return False
        return True

    def delete_abandoned_uploads(self, older_than_ms: int) -> int:
        """Remove what uploads cut short by a crash left behind and list() cannot show (a local
        store's temp files), untouched for ``older_than_ms``; returns how many. Default: none."""
        return 0

    def close(self) -> None:
        """Release clients or handles; the default has none."""

    def write_failure(self) -> str | None:
        """The error of the current streak of failed writes; None once a write works again (or
        when the store does not track it). The broker checks it before creating diskless topics."""
        return None

    def probe(self) -> None:
        """Write, read back and delete a small object, so a store the broker cannot use (missing
        bucket, no permission, read-only directory) is reported at start in one line naming the
        failing operation, not later as producers that hang. Raises StorageBackendException."""
        key = f"{PROBE_PREFIX}{uuid.uuid4()}"
        payload = f"kcli object store probe {key}".encode()
        where = self.describe().rstrip("/") or self.describe()  # as the operator wrote it: s3://b/p
        _probing.active = True
        try:
            self._probe_steps(key, payload, where)
        finally:
            _probing.active = False

    def _probe_steps(self, key: str, payload: bytes, where: str) -> None:
        for op in ("write", "read", "delete"):
            try:
                if op == "write":
                    self.upload(key, payload, len(payload))
                elif op == "read":
                    got = self.fetch(key)
                    if got != payload:
                        raise StorageBackendException(f"read back {len(got)} bytes that differ from the {len(payload)} written")
                else:
                    self.delete([key])
            except StorageBackendException as err:
                text = str(err)
                if text.startswith("bucket "):  # S3 NoSuchBucket: the configuration, not the operation
                    raise StorageBackendException(f"object store {where}: {text}") from None
                raise StorageBackendException(f"object store {where}: probe {op} of {key!r} failed: {text}") from None

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the objects live, as a URI an operator can paste (``file:///x``, ``s3://b/p``)."""

    def __enter__(self) -> "ObjectStorage":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()!r})"


def config_bool(value: str | bool | None, name: str) -> bool:
    """Parse a Kafka-style boolean config value."""
    if isinstance(value, bool):
        return value
    text = (value or "").strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise StorageBackendException(f"config {name} must be true or false, got {value!r}")


def config_int(value: str | int | None, name: str, minimum: int, maximum: int | None = None) -> int:
    """Parse an integer config value within [minimum, maximum]."""
    try:
        number = int(str(value).strip())
    except ValueError:
        number = None
    if number is None or number < minimum or (maximum is not None and number > maximum):
        bound = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise StorageBackendException(f"config {name} must be an integer {bound}, got {value!r}")
    return number


class FailureStreak:
    """One log line per streak of failed writes (with the key and the store's error), and one
    when writes work again: an outage retried for minutes must not flood the log, but the
    first failure must name what failed and why."""

    def __init__(self, where: Callable[[], str]) -> None:
        self._where = where
        self._lock = threading.Lock()
        self._failing = 0
        self._logged = False
        self.error: str | None = None  # "<op> of <key> failed: <error>" while failing

    def failed(self, op: str, key: str, err: BaseException) -> None:
        quiet = getattr(_probing, "active", False)  # the probe raises its own one-line error
        with self._lock:
            self._failing += 1
            self.error = f"{op} of {key!r} failed: {err}"
            log_it = not self._logged and not quiet
            self._logged = self._logged or log_it
        if log_it:
            log.warning("object store %s: %s", self._where(), self.error)

    def succeeded(self) -> None:
        with self._lock:
            count, logged = self._failing, self._logged
            self._failing, self._logged, self.error = 0, False, None
        if logged:
            log.warning("object store %s: writes work again after %d failed", self._where(), count)
