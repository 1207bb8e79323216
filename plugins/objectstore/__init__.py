"""Object storage plugins (KIP-1163 Storage Backend) and ``from_uri`` for CLI arguments.

``from_uri`` lets every command take one string (``file:///data/wal`` or ``s3://bucket/prefix``)
instead of backend-specific flags; S3 settings beyond bucket and prefix come from the standard
AWS environment.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from plugins.objectstore.base import (
    ByteRange,
    ObjectInfo,
    ObjectNotFound,
    ObjectStorage,
    StorageBackendException,
)

__all__ = [
    "ByteRange",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStorage",
    "StorageBackendException",
    "from_uri",
]


def from_uri(uri: str) -> ObjectStorage:
    """``file:///abs/dir`` → LocalObjectStorage, ``s3://bucket[/prefix]`` → S3ObjectStorage."""
    if not isinstance(uri, str) or "://" not in uri:
        raise StorageBackendException(
            f"unsupported object store URI {uri!r} (expected file:///absolute/dir or s3://bucket/prefix)"
        )
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise StorageBackendException(
                f"unsupported object store URI {uri!r}: file URIs must be local (file:///absolute/dir)"
            )
        path = unquote(parts.path)
        if not path.startswith("/") or "\x00" in path:
            raise StorageBackendException(f"unsupported object store URI {uri!r}: file URIs need an absolute path")
        from plugins.objectstore.local import LocalObjectStorage

        return LocalObjectStorage(path)
    if scheme == "s3":
        bucket = parts.netloc
        if not bucket:
            raise StorageBackendException(f"unsupported object store URI {uri!r}: missing bucket (s3://bucket/prefix)")
        if parts.query or parts.fragment:
            raise StorageBackendException(f"unsupported object store URI {uri!r}: no query or fragment allowed")
        from plugins.objectstore.s3 import S3ObjectStorage

        return S3ObjectStorage(bucket, unquote(parts.path))
    raise StorageBackendException(
        f"unsupported object store URI {uri!r} (expected file:///absolute/dir or s3://bucket/prefix)"
    )
