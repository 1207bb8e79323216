"""The default RemoteStorageManager: segments as objects in the broker's object store.

One store serves diskless WAL objects and tiered segments (``--object-store`` / the broker config
``diskless.storage.uri``); tiered objects live under their own key prefix so neither feature's
garbage collection can touch the other's. Layout, one object per file::

    <key.prefix>/<topic>-<topicId>/<partition>/<startOffset 20 digits>-<segmentId>.<suffix>

(a topic name longer than 232 characters is cut in the key so ``<topic>-<topicId>`` fits 255
bytes, the file-name limit of the local store; the topic id keeps it unique)

with suffixes ``log``, ``index``, ``timeindex`` and ``leader-epoch-checkpoint``. Topic and segment
ids are Kafka's URL-safe base64 form. The log object is uploaded last, so a segment whose log
object exists has all its indexes.
"""

from __future__ import annotations

import base64
import os
import uuid
from pathlib import Path

from plugins.objectstore import ByteRange, ObjectNotFound, ObjectStorage, StorageBackendException, from_uri
from plugins.rsm.base import (
    IndexType,
    LogSegmentData,
    RemoteLogSegmentMetadata,
    RemoteResourceNotFoundException,
    RemoteStorageException,
    RemoteStorageManager,
)

DEFAULT_KEY_PREFIX = "tiered"
_SUFFIX = {
    IndexType.OFFSET: "index",
    IndexType.TIMESTAMP: "timeindex",
    IndexType.LEADER_EPOCH: "leader-epoch-checkpoint",
    IndexType.PRODUCER_SNAPSHOT: "snapshot",
    IndexType.TRANSACTION: "txnindex",
}
_CONFIG_KEYS = {"uri", "key.prefix"}


def kafka_uuid(u: uuid.UUID) -> str:
    """Kafka's Uuid.toString: URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(u.bytes).decode().rstrip("=")


MAX_KEY_COMPONENT_BYTES = 255  # a file name on the local store; S3 allows more, but keys must not change by store


def topic_component(topic: str, topic_id: uuid.UUID) -> str:
    """``<topic>-<topicId>``, with the topic cut so the whole fits 255 bytes (the local store makes
    each key component a file name). The topic id keeps it unique; names up to 232 characters are
    not cut, so keys of existing topics stay as they were (Kafka shortens its ``-delete`` dir names
    the same way)."""
    tid = kafka_uuid(topic_id)
    return f"{topic[:MAX_KEY_COMPONENT_BYTES - len(tid) - 1]}-{tid}"


class ObjectStoreRemoteStorageManager(RemoteStorageManager):
    """Configs (``remote.log.storage.manager.impl.<key>``): ``uri`` (an object store URI; default:
    the broker's own store) and ``key.prefix`` (default ``tiered``)."""

    def __init__(self, store: ObjectStorage | None = None, key_prefix: str = DEFAULT_KEY_PREFIX) -> None:
        self._store = store
        self._owns_store = False  # a store built from ``uri`` is ours to close; a shared one is not
        self._prefix = key_prefix.strip("/")

    # -- setup ---------------------------------------------------------------------------------
    def configure(self, configs: dict[str, str]) -> None:
        unknown = set(configs) - _CONFIG_KEYS
        if unknown:
            raise RemoteStorageException(
                f"unknown ObjectStoreRemoteStorageManager config(s): {', '.join(sorted(unknown))} "
                f"(known: {', '.join(sorted(_CONFIG_KEYS))})"
            )
        if "key.prefix" in configs:
            prefix = configs["key.prefix"].strip("/")
            if not prefix:
                raise RemoteStorageException("ObjectStoreRemoteStorageManager config key.prefix must not be empty")
            self._prefix = prefix
        if configs.get("uri"):
            try:
                self._store = from_uri(configs["uri"])
                self._owns_store = True
            except StorageBackendException as err:
                raise RemoteStorageException(str(err)) from None

    def use_store(self, store: ObjectStorage, *, owned: bool = False) -> None:
        """Give the broker's object store to an instance configured without ``uri``; ``owned``:
        close it with this manager."""
        if self._store is None:
            self._store, self._owns_store = store, owned

    @property
    def configured(self) -> bool:
        return self._store is not None

    @property
    def store(self) -> ObjectStorage:
        if self._store is None:
            raise RemoteStorageException("ObjectStoreRemoteStorageManager has no object store (set uri)")
        return self._store

    def describe(self) -> str:
        return f"{self.store.describe().rstrip('/')}/{self._prefix}"

    # -- keys ----------------------------------------------------------------------------------
    def partition_prefix(self, topic: str, topic_id: uuid.UUID, partition: int) -> str:
        return f"{self._prefix}/{topic_component(topic, topic_id)}/{partition}/"

    def object_key(self, metadata: RemoteLogSegmentMetadata, suffix: str) -> str:
        sid = metadata.segment_id
        return (f"{self.partition_prefix(sid.topic, sid.topic_id, sid.partition)}"
                f"{metadata.start_offset:020d}-{kafka_uuid(sid.id)}.{suffix}")

    def keys(self, metadata: RemoteLogSegmentMetadata) -> list[str]:
        return [self.object_key(metadata, s) for s in _SUFFIX.values()] + [self.object_key(metadata, "log")]

    # -- RemoteStorageManager --------------------------------------------------------------------
    def copy_log_segment_data(self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData) -> bytes | None:
        store = self.store
        try:
            for index_type, path in ((IndexType.OFFSET, data.offset_index), (IndexType.TIMESTAMP, data.time_index),
                                     (IndexType.PRODUCER_SNAPSHOT, data.producer_snapshot_index),
                                     (IndexType.TRANSACTION, data.transaction_index)):
                if path is None:
                    continue
                self._upload_file(self.object_key(metadata, _SUFFIX[index_type]), path, missing_ok=True)
            epochs = data.leader_epoch_index
            store.upload(self.object_key(metadata, _SUFFIX[IndexType.LEADER_EPOCH]), epochs, len(epochs))
            size = self._upload_file(self.object_key(metadata, "log"), data.log_segment, missing_ok=False)
        except StorageBackendException as err:
            raise RemoteStorageException(f"copying segment {metadata.start_offset} of {_tp(metadata)}: {err}") from None
        except OSError as err:
            raise RemoteStorageException(
                f"copying segment {metadata.start_offset} of {_tp(metadata)}: {err.strerror or err}") from None
        if size != metadata.segment_size_in_bytes:
            raise RemoteStorageException(
                f"segment {metadata.start_offset} of {_tp(metadata)} is {size} bytes, metadata says "
                f"{metadata.segment_size_in_bytes}")
        return None

    def _upload_file(self, key: str, path: Path, *, missing_ok: bool) -> int:
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            if not missing_ok:
                raise
            self.store.upload(key, b"", 0)  # a segment without index entries has no index file
            return 0
        with f:
            size = os.fstat(f.fileno()).st_size
            self.store.upload(key, f, size)
            return size

    def fetch_log_segment(self, metadata: RemoteLogSegmentMetadata, start_position: int,
                          end_position: int | None = None) -> bytes:
        last = metadata.segment_size_in_bytes - 1 if end_position is None else end_position
        last = min(last, metadata.segment_size_in_bytes - 1)
        if start_position < 0 or start_position > last + 1:
            raise RemoteStorageException(
                f"invalid position {start_position} for segment {metadata.start_offset} of {_tp(metadata)} "
                f"({metadata.segment_size_in_bytes} bytes)")
        if start_position > last:
            return b""
        key = self.object_key(metadata, "log")
        return self._fetch(key, ByteRange(start_position, last - start_position + 1), metadata)

    def segment_location(self, metadata: RemoteLogSegmentMetadata) -> str:
        return f"remote object {self.object_key(metadata, 'log')}"

    def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        return self._fetch(self.object_key(metadata, _SUFFIX[index_type]), None, metadata)

    def _fetch(self, key: str, byte_range: ByteRange | None, metadata: RemoteLogSegmentMetadata) -> bytes:
        try:
            return self.store.fetch(key, byte_range)
        except ObjectNotFound:
            raise RemoteResourceNotFoundException(
                f"remote object {key} of segment {metadata.start_offset} of {_tp(metadata)} not found") from None
        except StorageBackendException as err:
            raise RemoteStorageException(f"fetching {key}: {err}") from None

    def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        try:
            # The log object goes first: without it a reader treats the segment as absent.
            keys = self.keys(metadata)
            self.store.delete([keys[-1]])
            self.store.delete(keys[:-1])
        except StorageBackendException as err:
            raise RemoteStorageException(f"deleting segment {metadata.start_offset} of {_tp(metadata)}: {err}") from None

    def close(self) -> None:
        if self._store is not None and self._owns_store:
            self._store.close()


def _tp(metadata: RemoteLogSegmentMetadata) -> str:
    return f"{metadata.segment_id.topic}-{metadata.segment_id.partition}"
