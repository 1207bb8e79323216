"""Object storage on S3 and S3-compatible stores (MinIO, LocalStack, moto) through boto3.

Endpoint, region and credentials come from wherever boto3 normally finds them (AWS_ENDPOINT_URL,
AWS_REGION / AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID, profiles, instance roles), so kcli needs no
secrets in its own config. Config keys (prefix stripped): ``bucket``, ``prefix``, ``endpoint.url``,
``region``, ``path.style.access.enabled``, and the time bounds below.

Every call is bounded in time (``connection.timeout.ms``, ``socket.timeout.ms``, ``max.attempts``,
named after the AWS SDK's settings): botocore's defaults (60 s per socket read) let one request on
a connection that died silently — a NAT or load balancer dropping its state, no RST — hold a
producer for a minute. A timed-out or broken connection also empties the client's connection
pool, because its idle neighbours went through the same dead path: without that, each retry
picks the next dead pooled connection and pays the full timeout again.
"""

from __future__ import annotations

import io
import tempfile
import threading
from typing import Any, BinaryIO, Iterable, Iterator

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from plugins.objectstore.base import (
    ByteRange,
    FailureStreak,
    ObjectInfo,
    ObjectNotFound,
    ObjectStorage,
    StorageBackendException,
    Uploadable,
    config_bool,
    config_int,
    length_mismatch,
    range_past_end,
)

DELETE_BATCH = 1000  # DeleteObjects accepts at most 1000 keys per call
_SPOOL_MAX = 32 << 20  # non-seekable uploads spool to disk beyond this
_CHUNK = 1 << 20
_CONFIG_KEYS = {
    "bucket", "prefix", "endpoint.url", "region", "path.style.access.enabled",
    "connection.timeout.ms", "socket.timeout.ms", "max.attempts", "tcp.keepalive.enabled",
}
# Defaults: together with the broker's retries a producer gets an answer well within its 30 s
# request.timeout.ms, and produce resumes within ~socket.timeout.ms of the store answering again.
DEFAULT_CONNECTION_TIMEOUT_MS = 3_000
DEFAULT_SOCKET_TIMEOUT_MS = 5_000
DEFAULT_MAX_ATTEMPTS = 3
# Errors that say "this connection (and so maybe every pooled one) is dead": the pool is emptied.
_DEAD_CONNECTION = (ReadTimeoutError, ConnectTimeoutError, ConnectionClosedError, EndpointConnectionError)
_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}

_loader_lock = threading.Lock()
_loader: Any = None


def _new_session() -> boto3.session.Session:
    """A fresh session (so environment and credentials are read now) sharing one model loader:
    parsing botocore's service JSON costs ~0.1 s per session, the rest is cheap."""
    global _loader
    with _loader_lock:
        if _loader is None:
            _loader = botocore.session.get_session().get_component("data_loader")
        core = botocore.session.Session()
        core.register_component("data_loader", _loader)
    return boto3.session.Session(botocore_session=core)


class S3ObjectStorage(ObjectStorage):
    """Objects under ``s3://bucket/prefix/``; keys are relative to the prefix."""

    def __init__(
        self,
        bucket: str | None = None,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        path_style: bool = False,
        connection_timeout_ms: int = DEFAULT_CONNECTION_TIMEOUT_MS,
        socket_timeout_ms: int = DEFAULT_SOCKET_TIMEOUT_MS,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        tcp_keepalive: bool = True,
    ) -> None:
        self._bucket = bucket
        self._prefix = _norm_prefix(prefix)
        self._endpoint_url = endpoint_url
        self._region = region
        self._path_style = path_style
        self.connection_timeout_ms = connection_timeout_ms
        self.socket_timeout_ms = socket_timeout_ms
        self.max_attempts = max_attempts
        self.tcp_keepalive = tcp_keepalive
        self._client: Any = None
        self._lock = threading.Lock()
        self._write_failures = FailureStreak(self.describe)  # uploads: what write_failure() reports
        self._delete_failures = FailureStreak(self.describe)

    def configure(self, configs: dict[str, str]) -> None:
        unknown = set(configs) - _CONFIG_KEYS
        if unknown:
            raise StorageBackendException(f"unknown S3ObjectStorage config(s): {', '.join(sorted(unknown))}")
        if "bucket" in configs:
            self._bucket = configs["bucket"]
        if "prefix" in configs:
            self._prefix = _norm_prefix(configs["prefix"])
        if "endpoint.url" in configs:
            self._endpoint_url = configs["endpoint.url"] or None
        if "region" in configs:
            self._region = configs["region"] or None
        if "path.style.access.enabled" in configs:
            self._path_style = config_bool(configs["path.style.access.enabled"], "path.style.access.enabled")
        if "connection.timeout.ms" in configs:
            self.connection_timeout_ms = config_int(configs["connection.timeout.ms"], "connection.timeout.ms", 1)
        if "socket.timeout.ms" in configs:
            self.socket_timeout_ms = config_int(configs["socket.timeout.ms"], "socket.timeout.ms", 1)
        if "max.attempts" in configs:
            self.max_attempts = config_int(configs["max.attempts"], "max.attempts", 1, 20)
        if "tcp.keepalive.enabled" in configs:
            self.tcp_keepalive = config_bool(configs["tcp.keepalive.enabled"], "tcp.keepalive.enabled")
        self.close()  # settings changed: the next call builds a fresh client

    @property
    def bucket(self) -> str:
        if not self._bucket:
            raise StorageBackendException("S3ObjectStorage is not configured: set bucket")
        return self._bucket

    @property
    def prefix(self) -> str:
        return self._prefix

    def write_failure(self) -> str | None:
        return self._write_failures.error

    def describe(self) -> str:
        where = f"s3://{self._bucket or '<unconfigured>'}/{self._prefix}"
        return where.rstrip("/") if not self._prefix else where

    def _s3(self) -> Any:
        with self._lock:
            if self._client is None:
                options: dict[str, Any] = {}
                if self._path_style:
                    options["s3"] = {"addressing_style": "path"}
                # Checksums only where S3 requires them (DeleteObjects): third-party S3 stores
                # reject the newer default trailing checksums, and WAL batches carry CRC-32C anyway.
                config = Config(
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                    connect_timeout=self.connection_timeout_ms / 1000,
                    read_timeout=self.socket_timeout_ms / 1000,
                    retries={"mode": "standard", "total_max_attempts": self.max_attempts},  # first try included
                    tcp_keepalive=self.tcp_keepalive,
                    **options,
                )
                try:
                    client = _new_session().client(
                        "s3", endpoint_url=self._endpoint_url, region_name=self._region, config=config
                    )
                except (BotoCoreError, ValueError) as err:
                    raise StorageBackendException(f"cannot create S3 client for {self.describe()}: {err}") from None
                client.meta.events.register("needs-retry.s3", self._on_attempt_done)
                self._client = client
            return self._client

    def _on_attempt_done(self, caught_exception: Exception | None = None, **_: Any) -> None:
        """botocore's per-attempt hook (it decides nothing: returns None)."""
        if isinstance(caught_exception, _DEAD_CONNECTION):
            self._drop_connections()

    def _drop_connections(self) -> None:
        """Close every pooled connection (the client stays usable and opens new ones); requests
        in flight keep theirs until they end, then those are closed instead of pooled."""
        client = self._client
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - best effort: the next attempt still has its timeouts
                pass

    def _full(self, key: str) -> str:
        if not isinstance(key, str) or not key:
            raise StorageBackendException(f"invalid object key {key!r}: empty")
        return f"{self._prefix}{key}"

    def _error(self, op: str, key: str, err: Exception) -> StorageBackendException:
        if isinstance(err, _DEAD_CONNECTION):
            self._drop_connections()  # e.g. a streamed GET body that timed out (outside botocore's retries)
        if isinstance(err, ClientError):
            error = err.response.get("Error", {})
            code = str(error.get("Code", ""))
            if code in _NOT_FOUND:
                return ObjectNotFound(key, self.describe())
            if code == "NoSuchBucket":
                return BucketNotFound(f"bucket {self._bucket!r} does not exist")
            message = error.get("Message") or ""
            return StorageBackendException(
                f"S3 {op} {key!r} in {self.describe()} failed: {code}" + (f": {message}" if message else "")
            )
        return StorageBackendException(f"S3 {op} {key!r} in {self.describe()} failed: {err}")

    # -- operations ----------------------------------------------------------------------------

    def upload(self, key: str, data: Uploadable, length: int) -> None:
        if length < 0:
            raise StorageBackendException(f"upload of {key!r}: negative length {length}")
        full = self._full(key)
        spool: BinaryIO | None = None
        if isinstance(data, (bytes, bytearray, memoryview)):
            view = memoryview(data).cast("B")
            if view.nbytes != length:
                raise length_mismatch(key, length, view.nbytes)
            body: Any = bytes(view) if not isinstance(data, bytes) else data
        elif _seekable(data):
            # Check the declared length before sending a byte: a short body must not be stored.
            start = data.tell()
            end = data.seek(0, io.SEEK_END)
            data.seek(start)
            if end - start != length:
                raise length_mismatch(key, length, end - start)
            body = data
        else:
            spool = _spool_exact(data, length, key)  # type: ignore[arg-type]
            body = spool
        try:
            self._s3().put_object(Bucket=self.bucket, Key=full, Body=body, ContentLength=length)
        except (ClientError, BotoCoreError) as err:
            error = self._error("upload", key, err)
            self._write_failures.failed("upload", key, error)
            raise error from None
        finally:
            if spool is not None:
                spool.close()
        self._write_failures.succeeded()

    def fetch(self, key: str, range: ByteRange | None = None) -> bytes:  # noqa: A002
        full = self._full(key)
        if range is not None and range.size == 0:
            # S3 has no empty Range; an empty read is valid iff the object reaches the offset.
            size = self.size(key)
            if range.offset > size:
                raise range_past_end(key, range, size)
            return b""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": full}
        if range is not None:
            kwargs["Range"] = f"bytes={range.offset}-{range.end - 1}"
        try:
            response = self._s3().get_object(**kwargs)
            body = response["Body"]
            try:
                data = body.read()
            finally:
                body.close()
        except ClientError as err:
            if range is not None and err.response.get("Error", {}).get("Code") == "InvalidRange":
                raise range_past_end(key, range, _total_from_range(err.response)) from None
            raise self._error("fetch", key, err) from None
        except BotoCoreError as err:
            raise self._error("fetch", key, err) from None
        if range is not None and len(data) != range.size:
            # S3 clamps a range that starts inside the object but ends past it.
            total = _total_from_content_range(response.get("ContentRange"))
            raise range_past_end(key, range, total)
        return data

    def delete(self, keys: Iterable[str]) -> None:
        if isinstance(keys, str):
            keys = [keys]
        full_keys = [self._full(k) for k in dict.fromkeys(keys)]
        client = self._s3() if full_keys else None
        for i in range(0, len(full_keys), DELETE_BATCH):
            chunk = full_keys[i : i + DELETE_BATCH]
            try:
                response = client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True}
                )
            except (ClientError, BotoCoreError) as err:
                error = self._error("delete", chunk[0][len(self._prefix) :], err)
                self._delete_failures.failed("delete", chunk[0][len(self._prefix) :], error)
                raise error from None
            errors = [e for e in response.get("Errors", []) if e.get("Code") not in _NOT_FOUND]
            if errors:
                first = errors[0]
                error = StorageBackendException(
                    f"S3 delete failed for {len(errors)} object(s) in {self.describe()}, first "
                    f"{first.get('Key', '')[len(self._prefix):]!r}: {first.get('Code')}: {first.get('Message', '')}"
                )
                self._delete_failures.failed("delete", first.get("Key", "")[len(self._prefix):], error)
                raise error
        if full_keys:
            self._delete_failures.succeeded()

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        full_prefix = f"{self._prefix}{prefix}"
        strip = len(self._prefix)
        try:
            paginator = self._s3().get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full_prefix):
                for item in page.get("Contents", []):
                    modified = item["LastModified"]
                    yield ObjectInfo(item["Key"][strip:], int(item["Size"]), int(modified.timestamp() * 1000))
        except (ClientError, BotoCoreError) as err:
            raise self._error("list", prefix, err) from None

    def size(self, key: str) -> int:
        try:
            response = self._s3().head_object(Bucket=self.bucket, Key=self._full(key))
        except (ClientError, BotoCoreError) as err:
            raise self._error("stat", key, err) from None
        return int(response["ContentLength"])

    def create_bucket(self) -> None:
        """Create the bucket if missing (test and demo setups; production buckets pre-exist)."""
        try:
            kwargs: dict[str, Any] = {"Bucket": self.bucket}
            region = self._s3().meta.region_name
            if region and region != "us-east-1":
                kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
            self._s3().create_bucket(**kwargs)
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                return
            raise self._error("create bucket", "", err) from None
        except BotoCoreError as err:
            raise self._error("create bucket", "", err) from None

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing must not fail shutdown
                pass


class BucketNotFound(StorageBackendException):
    """The configured bucket does not exist (S3's NoSuchBucket): a configuration error."""


def _norm_prefix(prefix: str) -> str:
    """``"a/b"`` and ``"/a/b/"`` both mean keys under ``a/b/``."""
    prefix = (prefix or "").strip("/")
    return f"{prefix}/" if prefix else ""


def _seekable(data: Any) -> bool:
    try:
        return bool(data.seekable())
    except (AttributeError, OSError, ValueError):
        return False


def _spool_exact(stream: BinaryIO, length: int, key: str) -> BinaryIO:
    """Copy a non-seekable stream to a spool, proving it holds exactly ``length`` bytes."""
    spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_MAX)
    try:
        remaining = length
        while remaining > 0:
            chunk = stream.read(min(_CHUNK, remaining))
            if not chunk:
                raise length_mismatch(key, length, length - remaining)
            spool.write(chunk)
            remaining -= len(chunk)
        if remaining < 0 or stream.read(1):
            raise length_mismatch(key, length, f"more than {length}")
        spool.seek(0)
        return spool  # type: ignore[return-value]
    except BaseException:
        spool.close()
        raise


def _total_from_content_range(value: str | None) -> int | None:
    """``bytes 0-9/10`` → 10."""
    if not value or "/" not in value:
        return None
    total = value.rsplit("/", 1)[1]
    return int(total) if total.isdigit() else None


def _total_from_range(response: dict[str, Any]) -> int | None:
    headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    return _total_from_content_range(headers.get("content-range"))

