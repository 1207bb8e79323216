"""The object storage plugin contract (KIP-1163 "Storage Backend").

Diskless topics keep every byte in an object store; the broker only needs put, ranged get,
delete and list. One ABC keeps the broker, the WAL tooling and dump-log independent of where the
bytes live (a local directory for tests and single-node use, S3 and S3-compatible stores for real
deployments).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import BinaryIO, Iterable, Iterator

from kcli.errors import OperationError


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
