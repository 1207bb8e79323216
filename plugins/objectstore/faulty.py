"""An object store that misbehaves on purpose: failures, latency, slow and partial uploads.

Real object stores time out, throttle, drop connections halfway through a PUT and come back;
diskless topics and tiered storage must answer producers with retriable errors, lose nothing
that was acknowledged and recover once the store does. ``FaultyObjectStorage`` wraps any other
store and injects those faults with a seeded random generator, so a failing run can be repeated.

Broker configuration (the broker strips ``diskless.storage.``)::

    diskless.storage.class.name=plugins.objectstore.faulty.FaultyObjectStorage
    diskless.storage.delegate.uri=file:///var/lib/kcli/objects     # or s3://bucket/prefix
    diskless.storage.failure.rate=0.3

Settings (all optional except ``delegate.uri``):

- ``failure.rate`` (0..1): each operation fails with StorageBackendException before it reaches
  the delegate; ``failure.operations``: which (comma list of upload, fetch, delete, list, size;
  default all).
- ``partial.upload.rate`` (0..1): an upload stores only the first half of its bytes under the
  key, then fails — a store that leaves a torn object behind (orphan collection must remove it,
  verify must report it, nothing may reference it).
- ``latency.ms``: added before every operation.
- ``upload.bytes.per.second``: uploads trickle at this rate (a slow link).
- ``upload.ack.delay.ms``: an upload that succeeded returns this much later (the window between
  "object stored" and "object committed").
- ``key.prefixes``: only keys starting with one of these (comma list, e.g. ``wal/``) are faulted.
- ``switch.file``: faults happen only while this file exists (a test turns them on and off).
- ``active.after.ms`` / ``active.for.ms``: faults happen only in this window, counted from
  ``configure`` (the broker's start).
- ``seed``: seed of the random generator (default: random, printed in ``describe_faults``).
- ``stats.file``: a JSON document of injected-fault counters, rewritten after each fault.

Whatever is configured, an upload either stores the full object or raises (except a partial
upload, which is the fault being injected); fetch, list and size return the delegate's answers.
Uploads also pass the pause point ``objectstore.upload.<first key component>`` halfway through
their bytes (:mod:`kcli.faults`), where crash tests SIGKILL the broker.
"""

from __future__ import annotations

import io
import json
import os
import random
import threading
import time
from pathlib import Path
from typing import Iterable, Iterator

from plugins.objectstore.base import (
    ByteRange,
    ObjectInfo,
    ObjectStorage,
    StorageBackendException,
    Uploadable,
    length_mismatch,
)

OPERATIONS = ("upload", "fetch", "delete", "list", "size")
_KEYS = {
    "delegate.uri", "seed", "failure.rate", "failure.operations", "partial.upload.rate", "latency.ms",
    "upload.bytes.per.second", "upload.ack.delay.ms", "key.prefixes", "switch.file", "active.after.ms",
    "active.for.ms", "stats.file",
}
_CHUNK = 64 << 10


class InjectedFault(StorageBackendException):
    """A failure FaultyObjectStorage made up (a subclass, so tests can tell it from real ones)."""


def _rate(configs: dict[str, str], name: str) -> float:
    raw = configs.get(name, "0")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise StorageBackendException(f"FaultyObjectStorage config {name} must be a number in 0..1, got {raw!r}")
    return value


def _non_negative_int(configs: dict[str, str], name: str) -> int:
    raw = configs.get(name, "0")
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise StorageBackendException(f"FaultyObjectStorage config {name} must be an integer >= 0, got {raw!r}")
    return value


class FaultyObjectStorage(ObjectStorage):
    """Wraps ``delegate`` (or the store named by the ``delegate.uri`` config) and injects faults."""

    def __init__(self, delegate: ObjectStorage | None = None, **settings: str) -> None:
        self._delegate = delegate
        self._lock = threading.Lock()
        self._rng = random.Random()
        self.seed: int | None = None
        self.failure_rate = 0.0
        self.failure_operations: frozenset[str] = frozenset(OPERATIONS)
        self.partial_rate = 0.0
        self.latency_s = 0.0
        self.upload_rate = 0  # bytes per second, 0 = unlimited
        self.ack_delay_s = 0.0
        self.key_prefixes: tuple[str, ...] = ()
        self.switch_file: Path | None = None
        self._window: tuple[float, float] = (0.0, float("inf"))  # monotonic seconds
        self.stats_file: Path | None = None
        self.stats: dict[str, int] = {"failures": 0, "partial_uploads": 0, "delays": 0}
        for op in OPERATIONS:
            self.stats[f"failures.{op}"] = 0
        if settings or delegate is not None:
            self.configure({k.replace("_", "."): v for k, v in settings.items()}, require_delegate=delegate is None)

    # -- setup ---------------------------------------------------------------------------------

    def configure(self, configs: dict[str, str], *, require_delegate: bool = True) -> None:
        unknown = set(configs) - _KEYS
        if unknown:
            raise StorageBackendException(
                f"unknown FaultyObjectStorage config(s): {', '.join(sorted(unknown))} (known: {', '.join(sorted(_KEYS))})")
        uri = configs.get("delegate.uri", "")
        if uri:
            from plugins.objectstore import from_uri

            if self._delegate is not None:
                self._delegate.close()
            self._delegate = from_uri(uri)
        elif require_delegate and self._delegate is None:
            raise StorageBackendException(
                "FaultyObjectStorage needs config delegate.uri (the store it wraps: file:///dir or s3://bucket/prefix)")
        self.failure_rate = _rate(configs, "failure.rate")
        self.partial_rate = _rate(configs, "partial.upload.rate")
        ops = [o.strip() for o in configs.get("failure.operations", ",".join(OPERATIONS)).split(",") if o.strip()]
        bad = [o for o in ops if o not in OPERATIONS]
        if bad:
            raise StorageBackendException(
                f"FaultyObjectStorage config failure.operations: unknown operation(s) {', '.join(bad)} "
                f"(known: {', '.join(OPERATIONS)})")
        self.failure_operations = frozenset(ops)
        self.latency_s = _non_negative_int(configs, "latency.ms") / 1000
        self.upload_rate = _non_negative_int(configs, "upload.bytes.per.second")
        self.ack_delay_s = _non_negative_int(configs, "upload.ack.delay.ms") / 1000
        self.key_prefixes = tuple(p.strip() for p in configs.get("key.prefixes", "").split(",") if p.strip())
        self.switch_file = Path(configs["switch.file"]) if configs.get("switch.file") else None
        self.stats_file = Path(configs["stats.file"]) if configs.get("stats.file") else None
        start = time.monotonic() + _non_negative_int(configs, "active.after.ms") / 1000
        length = configs.get("active.for.ms")
        end = start + _non_negative_int(configs, "active.for.ms") / 1000 if length is not None else float("inf")
        self._window = (start, end)
        if "seed" in configs:
            try:
                self.seed = int(configs["seed"])
            except ValueError:
                raise StorageBackendException(
                    f"FaultyObjectStorage config seed must be an integer, got {configs['seed']!r}") from None
        else:
            self.seed = random.SystemRandom().randrange(2**32)
        self._rng = random.Random(self.seed)

    @property
    def delegate(self) -> ObjectStorage:
        if self._delegate is None:
            raise StorageBackendException("FaultyObjectStorage is not configured: set delegate.uri")
        return self._delegate

    def describe(self) -> str:
        # Where the objects really are: tools given this URI read the delegate directly.
        return self.delegate.describe() if self._delegate is not None else "faulty://<unconfigured>"

    def describe_faults(self) -> str:
        return (f"FaultyObjectStorage(seed={self.seed}, failure.rate={self.failure_rate}, "
                f"partial.upload.rate={self.partial_rate}, latency.ms={self.latency_s * 1000:g})")

    def close(self) -> None:
        if self._delegate is not None:
            self._delegate.close()

    def write_failure(self) -> str | None:
        return self.delegate.write_failure()  # real failures only: injected ones are the test's

    def probe(self) -> None:
        """The start-up probe checks the real store's configuration; injected faults are for
        the data traffic (a probe failing at random would make the broker refuse to start)."""
        self.delegate.probe()

    # -- fault decisions -------------------------------------------------------------------------

    def active(self, key: str = "") -> bool:
        """Faults apply now (switch file, time window) and to this key (key.prefixes)."""
        if self.key_prefixes and key and not key.startswith(self.key_prefixes):
            return False
        if self.switch_file is not None and not self.switch_file.exists():
            return False
        start, end = self._window
        return start <= time.monotonic() < end

    def _chance(self, rate: float) -> bool:
        if rate <= 0.0:
            return False
        with self._lock:
            return self._rng.random() < rate

    def _count(self, *names: str) -> None:
        with self._lock:
            for name in names:
                self.stats[name] = self.stats.get(name, 0) + 1
            snapshot = dict(self.stats)
        if self.stats_file is not None:
            tmp = self.stats_file.with_name(f".{self.stats_file.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            try:
                tmp.write_text(json.dumps(snapshot))
                os.replace(tmp, self.stats_file)
            except OSError:
                pass  # statistics are best effort; the fault itself already happened

    def _before(self, op: str, key: str = "") -> bool:
        """Latency and injected failure for one operation; returns whether faults apply."""
        if not self.active(key):
            return False
        if self.latency_s:
            self._count("delays")
            time.sleep(self.latency_s)
        if op in self.failure_operations and self._chance(self.failure_rate):
            self._count("failures", f"failures.{op}")
            raise InjectedFault(f"injected {op} failure{f' for {key!r}' if key else ''} (FaultyObjectStorage)")
        return True

    # -- ObjectStorage -----------------------------------------------------------------------------

    def upload(self, key: str, data: Uploadable, length: int) -> None:
        faulted = self._before("upload", key)
        if faulted and self._chance(self.partial_rate):
            self._partial_upload(key, data, length)
        from kcli import faults

        point = f"objectstore.upload.{key.split('/', 1)[0]}"
        rate = self.upload_rate if faulted else 0
        if rate or faults.is_set(point):
            data = _PacedStream(data, length, rate, point, key)
        self.delegate.upload(key, data, length)
        if faulted and self.ack_delay_s:
            time.sleep(self.ack_delay_s)

    def _partial_upload(self, key: str, data: Uploadable, length: int) -> None:
        """Store the first half of the bytes under ``key`` (a torn object), then fail."""
        half = length // 2
        if isinstance(data, (bytes, bytearray, memoryview)):
            head = bytes(memoryview(data).cast("B")[:half])
        else:
            parts, need = [], half
            while need > 0:
                chunk = data.read(min(need, _CHUNK))
                if not chunk:
                    break
                parts.append(bytes(chunk))
                need -= len(chunk)
            head = b"".join(parts)
        self.delegate.upload(key, head, len(head))
        self._count("partial_uploads")
        raise InjectedFault(f"injected partial upload of {key!r}: {len(head)} of {length} bytes stored")

    def fetch(self, key: str, range: ByteRange | None = None) -> bytes:  # noqa: A002 - Kafka's name
        self._before("fetch", key)
        return self.delegate.fetch(key, range)

    def delete(self, keys: Iterable[str]) -> None:
        keys = [keys] if isinstance(keys, str) else list(keys)
        self._before("delete", keys[0] if keys else "")
        self.delegate.delete(keys)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._before("list", prefix)
        return self.delegate.list(prefix)

    def size(self, key: str) -> int:
        self._before("size", key)
        return self.delegate.size(key)

    def delete_abandoned_uploads(self, older_than_ms: int) -> int:
        return self.delegate.delete_abandoned_uploads(older_than_ms)


class _PacedStream(io.RawIOBase):
    """The upload's bytes as a stream: at most ``rate`` bytes per second (0: unlimited), and the
    pause point passed once half of them were read."""

    def __init__(self, data: Uploadable, length: int, rate: int, point: str, key: str) -> None:
        super().__init__()
        if isinstance(data, (bytes, bytearray, memoryview)):
            view = memoryview(data).cast("B")
            if view.nbytes != length:
                raise length_mismatch(key, length, view.nbytes)
            self._source: Uploadable = io.BytesIO(view)
        else:
            self._source = data
        self._length = length
        self._rate = rate
        self._point = point
        self._read = 0
        self._paused = False
        self._started = time.monotonic()

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:  # type: ignore[override]
        if size is None or size < 0:
            size = max(self._length - self._read, 0) + 1  # the delegate's "anything more?" probe included
        half = self._length // 2
        if not self._paused and self._read < half:
            size = min(size, half - self._read) or size  # stop at the half so the pause falls there
        if self._rate:
            size = min(size, max(1, self._rate // 10))
        chunk = self._source.read(size)
        if chunk:
            self._read += len(chunk)
        if not self._paused and self._read >= half:
            self._paused = True
            from kcli import faults

            faults.pause(self._point)
        if self._rate and chunk:
            due = self._started + self._read / self._rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        return bytes(chunk) if chunk else b""

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        out = memoryview(buffer).cast("B")
        chunk = self.read(out.nbytes)
        out[: len(chunk)] = chunk
        return len(chunk)
