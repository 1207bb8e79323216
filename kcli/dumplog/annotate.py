"""Annotating WAL batches with what the batch coordinator knows about them.

A WAL batch carries no topic or partition, and its offsets are the producer's (usually 0..n-1):
only the coordinator knows where each byte range went. Any metadata source works if it can
answer ``object_key -> list[BatchInfo]`` (plugins.coordinator's BatchInfo shape: ``.metadata``
with ``topic_id_partition``, ``byte_offset``, ``byte_size``, ``base_offset``, ``last_offset``);
the SQLite coordinator is one, a running broker queried over the protocol can be another.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable

BatchLookup = Callable[[str], list[Any]]


class MetadataSourceError(Exception):
    """The metadata source could not be opened or queried."""


@dataclass(frozen=True)
class BatchAnnotation:
    topic: str
    partition: int
    topic_id: str | None
    assigned_base_offset: int
    assigned_last_offset: int | None
    byte_size: int

    def text(self) -> str:
        return f" topic: {self.topic} partition: {self.partition} assignedBaseOffset: {self.assigned_base_offset}"

    def json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "topicId": self.topic_id,
            "assignedBaseOffset": self.assigned_base_offset,
            "assignedLastOffset": self.assigned_last_offset,
            "dead": False,
        }


@dataclass
class FileAnnotations:
    """The coordinator's view of one WAL object: live batches by byte offset."""

    object_key: str | None
    tried: list[str]
    by_offset: dict[int, BatchAnnotation]

    def unmatched(self, seen: Iterable[int]) -> list[tuple[int, BatchAnnotation]]:
        """Batches the coordinator lists that the scan did not find at their byte offset."""
        seen_set = set(seen)
        return sorted((off, a) for off, a in self.by_offset.items() if off not in seen_set)


def annotation_from_batch_info(info: Any) -> tuple[int, BatchAnnotation]:
    meta = getattr(info, "metadata", info)
    tip = getattr(meta, "topic_id_partition", None)
    topic_id = getattr(tip, "topic_id", None)
    return int(meta.byte_offset), BatchAnnotation(
        topic=str(getattr(tip, "topic", "")),
        partition=int(getattr(tip, "partition", -1)),
        topic_id=str(topic_id) if topic_id is not None else None,
        assigned_base_offset=int(meta.base_offset),
        assigned_last_offset=int(meta.last_offset) if getattr(meta, "last_offset", None) is not None else None,
        byte_size=int(meta.byte_size),
    )


def annotations_for(lookup: BatchLookup, candidates: list[str], object_key: str | None = None) -> FileAnnotations:
    """Ask ``lookup`` for the first candidate key it knows (longest, i.e. most specific, first)."""
    keys = [object_key] if object_key else sorted(dict.fromkeys(candidates), key=len, reverse=True)
    for key in keys:
        try:
            infos = lookup(key)
        except Exception as err:  # noqa: BLE001 - any metadata source's error type
            raise MetadataSourceError(f"batch metadata lookup for {key!r} failed: {_one_line(err)}") from None
        if infos:
            return FileAnnotations(key, keys, dict(annotation_from_batch_info(i) for i in infos))
    return FileAnnotations(None, keys, {})


def open_metadata_source(uri: str) -> tuple[BatchLookup, Callable[[], None]]:
    """``sqlite:///path/to/coordinator.db`` (or a plain path), or ``postgresql://...`` → (lookup, close)."""
    if uri.split("://", 1)[0].lower() in ("postgresql", "postgres") and "://" in uri:
        from plugins.coordinator import open_coordinator
        from kcli.cluster.pgconn import redact

        try:
            pg = open_coordinator(uri, read_only=True)  # read-only transactions: a dump changes nothing
        except Exception as err:  # noqa: BLE001
            raise MetadataSourceError(f"cannot open coordinator {redact(uri)}: {_one_line(err)}") from None
        return pg.batches_in_file, pg.close
    path = uri[len("sqlite://") :] if uri.startswith("sqlite://") else uri
    if "://" in path:
        raise MetadataSourceError(f"unsupported coordinator URI {uri!r} (expected sqlite:///path/to/coordinator.db)")
    if not path or not os.path.isfile(path):
        raise MetadataSourceError(f"coordinator database {path or uri!r} not found")
    try:
        from plugins.coordinator.sqlite import SqliteBatchCoordinator
    except ImportError as err:
        raise MetadataSourceError(f"the SQLite batch coordinator is not available: {err}") from None
    try:
        # Read-only: a dump must never change (or create) coordinator state.
        coordinator = SqliteBatchCoordinator(path, read_only=True)
    except Exception as err:  # noqa: BLE001
        raise MetadataSourceError(f"cannot open coordinator {uri}: {_one_line(err)}") from None
    return coordinator.batches_in_file, coordinator.close


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
