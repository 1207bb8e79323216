"""Batch coordinator plugins (KIP-1164) and ``open_coordinator`` for CLI arguments.

Commands that inspect diskless metadata take one string such as ``sqlite:///data/diskless/
coordinator.db``; this keeps the URI parsing and its error message in one place.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from plugins.coordinator.base import BatchCoordinator, CoordinatorException

__all__ = ["BatchCoordinator", "CoordinatorException", "open_coordinator"]


def open_coordinator(uri: str, *, read_only: bool = False) -> BatchCoordinator:
    """``sqlite:///abs/path.db`` → SqliteBatchCoordinator (``read_only`` for inspection tools:
    a missing file is an error instead of a new empty database); ``postgresql://`` (or
    ``postgres://``) → PostgresBatchCoordinator (``read_only``: read-only transactions, no
    schema migration)."""
    parts = urlsplit(uri) if isinstance(uri, str) else None
    if parts is not None and parts.scheme.lower() in ("postgresql", "postgres") and parts.netloc:
        from plugins.coordinator.postgresql import PostgresBatchCoordinator

        return PostgresBatchCoordinator(uri, read_only=read_only)
    if parts is None or parts.scheme.lower() != "sqlite" or parts.netloc not in ("", "localhost"):
        raise CoordinatorException(f"unsupported coordinator URI {uri!r} (expected sqlite:///absolute/path.db"
                                   " or postgresql://user@host:port/database)")
    path = unquote(parts.path)
    if not path.startswith("/") or path.endswith("/"):
        raise CoordinatorException(f"unsupported coordinator URI {uri!r}: needs an absolute file path")
    from plugins.coordinator.sqlite import SqliteBatchCoordinator

    return SqliteBatchCoordinator(path, read_only=read_only)
