"""Remote log segment metadata that survives restarts: kcli's RemoteLogMetadataManager (RLMM).

Kafka's default RLMM writes RemoteLogSegmentMetadata events to the ``__remote_log_metadata``
topic and materialises them per partition. kcli does the same with a local append-only file,
``<data_dir>/__remote_log_metadata/metadata.log``: one ``<crc32c hex> <json>`` line per event,
fsynced before the caller goes on, so a segment is never deleted locally (or read remotely)
on the strength of an event that a crash could lose. Events are Kafka's two record kinds:

* ``RemoteLogSegmentMetadataRecord``: a new segment copy (state COPY_SEGMENT_STARTED);
* ``RemoteLogSegmentMetadataUpdateRecord``: a state change of an existing one.

A torn last line (crash mid-write) is dropped on replay. Segments reaching
DELETE_SEGMENT_FINISHED leave the materialised state; when the file holds far more events than
live segments it is rewritten (temp file, fsync, rename) at open.

This file is the single-node RLMM. A broker of a cluster gets the PostgreSQL one
(:mod:`kcli.cluster.pg_remote_log`) from its cluster state store instead; both satisfy
:class:`RemoteLogMetadata` and share :class:`MaterializedSegments`, the in-memory view that
answers every query without I/O (fetches ask it on the event loop).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from bisect import bisect_left, bisect_right, insort_right
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

from kcli.crcjson import decode_line, encode_line

from plugins.rsm.base import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState

DIR_NAME = "__remote_log_metadata"
FILE_NAME = "metadata.log"
_COMPACT_MIN_EVENTS = 1000

S = RemoteLogSegmentState


class RemoteLogMetadataError(Exception):
    """The remote log metadata file cannot be read or written."""


class SegmentOverlapError(RemoteLogMetadataError):
    """A copy would finish over offsets another finished segment of the partition already holds:
    two leaders (an old one still copying, the new one resuming) copied the same range. The
    later one is refused, so no offset is ever in two finished segments."""



def _now_ms() -> int:
    return int(time.time() * 1000)


def segment_to_json(md: RemoteLogSegmentMetadata) -> dict[str, Any]:
    sid = md.segment_id
    return {
        "topicId": str(sid.topic_id), "topic": sid.topic, "partition": sid.partition, "segmentId": str(sid.id),
        "startOffset": md.start_offset, "endOffset": md.end_offset, "maxTimestampMs": md.max_timestamp_ms,
        "brokerId": md.broker_id, "eventTimestampMs": md.event_timestamp_ms,
        "segmentSizeInBytes": md.segment_size_in_bytes, "state": md.state.value, "tieredEpoch": md.tiered_epoch,
        "segmentLeaderEpochs": {str(k): v for k, v in md.segment_leader_epochs.items()},
    }


def segment_from_json(d: dict[str, Any]) -> RemoteLogSegmentMetadata:
    sid = RemoteLogSegmentId(uuid.UUID(d["topicId"]), d["topic"], int(d["partition"]), uuid.UUID(d["segmentId"]))
    return RemoteLogSegmentMetadata(
        sid, int(d["startOffset"]), int(d["endOffset"]), int(d["maxTimestampMs"]), int(d["brokerId"]),
        int(d["eventTimestampMs"]), int(d["segmentSizeInBytes"]), S(d["state"]), int(d.get("tieredEpoch", 0)),
        {int(k): int(v) for k, v in d.get("segmentLeaderEpochs", {"0": 0}).items()},
    )


class RemoteLogMetadata(Protocol):
    """What the RemoteLogManager needs of an RLMM (Kafka's RemoteLogMetadataManager, reduced),
    whichever store holds it: the event file of a single node, or PostgreSQL in a cluster.

    Writes are durable before they return and validated before anything is written (a new
    segment must be COPY_SEGMENT_STARTED; a state change must be one of Kafka's transitions
    COPY_SEGMENT_STARTED → COPY_SEGMENT_FINISHED → DELETE_SEGMENT_STARTED →
    DELETE_SEGMENT_FINISHED, else RemoteStorageException); queries answer from memory."""

    def open(self) -> Any: ...
    def close(self) -> None: ...
    def refresh(self) -> None:
        """Learn what other brokers wrote since the last call (nothing to learn on one node)."""
    def add_copy_started(self, md: RemoteLogSegmentMetadata) -> None: ...
    def update_state(self, mds: Iterable[RemoteLogSegmentMetadata],
                     state: RemoteLogSegmentState) -> list[RemoteLogSegmentMetadata]: ...
    def mark_partitions_stopped(self, topic_id: uuid.UUID, tiered_epoch: int, partitions: Iterable[int]) -> None:
        """KIP-950: these partitions finished their part of disabling ``tiered_epoch``."""
    def stopped_partitions(self, topic_id: uuid.UUID, tiered_epoch: int) -> set[int]: ...
    def segments(self, topic_id: uuid.UUID, partition: int,
                 states: Iterable[RemoteLogSegmentState] = ...) -> list[RemoteLogSegmentMetadata]: ...
    def all_segments(self, topic_id: uuid.UUID | None = None,
                     states: Iterable[RemoteLogSegmentState] | None = None) -> list[RemoteLogSegmentMetadata]: ...
    def get(self, segment_id: uuid.UUID) -> RemoteLogSegmentMetadata | None: ...
    def partitions(self, topic_id: uuid.UUID) -> list[int]: ...
    def segment_for_offset(self, topic_id: uuid.UUID, partition: int, offset: int) -> RemoteLogSegmentMetadata | None: ...
    def highest_offset(self, topic_id: uuid.UUID, partition: int) -> int: ...


class MaterializedSegments:
    """Live remote segments per (topic id, partition), sorted by start offset, in memory.

    Mutations happen on the broker's event loop thread; readers may be anywhere (a lock keeps
    the per-partition lists consistent). Segments reaching DELETE_SEGMENT_FINISHED leave it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[uuid.UUID, RemoteLogSegmentMetadata] = {}
        # (topic id, partition) -> segments sorted by start offset
        self._parts: dict[tuple[uuid.UUID, int], list[RemoteLogSegmentMetadata]] = {}

    def _put(self, md: RemoteLogSegmentMetadata) -> None:
        sid = md.segment_id
        key = (sid.topic_id, sid.partition)
        segs = self._parts.setdefault(key, [])
        old = self._by_id.get(sid.id)
        if old is not None:  # replace in place: same start offset, so the order holds
            i = bisect_left(segs, old.start_offset, key=_start)
            while segs[i].segment_id.id != sid.id:
                i += 1
            del segs[i]
        if md.state is S.DELETE_SEGMENT_FINISHED:
            self._by_id.pop(sid.id, None)
        else:
            self._by_id[sid.id] = md
            insort_right(segs, md, key=_start)
        if not segs:
            del self._parts[key]

    def _transitions(self, mds: Iterable[RemoteLogSegmentMetadata], state: RemoteLogSegmentState,
                     current: Callable[[uuid.UUID], RemoteLogSegmentMetadata | None],
                     now: int, finished: Callable[[uuid.UUID, int], list[RemoteLogSegmentMetadata]] | None = None,
                     ) -> list[RemoteLogSegmentMetadata]:
        """The updated metadata of ``mds`` moved to ``state`` from what ``current`` says they are
        now; raises before anything is written (unknown segment, not Kafka's transition, or a copy
        finishing over a range another finished segment holds: :class:`SegmentOverlapError`).
        ``finished``: a partition's finished segments as the store has them now (default: ours)."""
        out: list[RemoteLogSegmentMetadata] = []
        for md in mds:
            cur = current(md.segment_id.id)
            if cur is None:
                raise RemoteLogMetadataError(f"unknown remote segment {md.segment_id.id}")
            if state is S.COPY_SEGMENT_FINISHED:
                sid = cur.segment_id
                others = (finished or self.segments)(sid.topic_id, sid.partition) + out
                clash = next((o for o in others if o.segment_id.id != sid.id and o.segment_id.partition == sid.partition
                              and o.segment_id.topic_id == sid.topic_id and o.state is S.COPY_SEGMENT_FINISHED
                              and o.start_offset <= cur.end_offset and cur.start_offset <= o.end_offset), None)
                if clash is not None:
                    raise SegmentOverlapError(
                        f"remote segment {sid.id} ({cur.start_offset}-{cur.end_offset}) of {sid.topic}-"
                        f"{sid.partition} overlaps finished segment {clash.segment_id.id} "
                        f"({clash.start_offset}-{clash.end_offset}) copied by broker {clash.broker_id}")
            out.append(cur.with_state(state, now))
        return out

    # -- queries -------------------------------------------------------------------------------
    def segments(self, topic_id: uuid.UUID, partition: int,
                 states: Iterable[RemoteLogSegmentState] = (S.COPY_SEGMENT_FINISHED,)) -> list[RemoteLogSegmentMetadata]:
        """Segments of one partition in ``states``, by start offset (Kafka's listRemoteLogSegments)."""
        wanted = set(states)
        with self._lock:
            return [s for s in self._parts.get((topic_id, partition), []) if s.state in wanted]

    def all_segments(self, topic_id: uuid.UUID | None = None,
                     states: Iterable[RemoteLogSegmentState] | None = None) -> list[RemoteLogSegmentMetadata]:
        wanted = set(states) if states is not None else None
        with self._lock:
            return [s for (tid, _p), segs in sorted(self._parts.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))
                    for s in segs
                    if (topic_id is None or tid == topic_id) and (wanted is None or s.state in wanted)]

    def get(self, segment_id: uuid.UUID) -> RemoteLogSegmentMetadata | None:
        """Current metadata of one segment (None once DELETE_SEGMENT_FINISHED)."""
        with self._lock:
            return self._by_id.get(segment_id)

    def partitions(self, topic_id: uuid.UUID) -> list[int]:
        with self._lock:
            return sorted(p for (tid, p) in self._parts if tid == topic_id)

    def segment_for_offset(self, topic_id: uuid.UUID, partition: int, offset: int) -> RemoteLogSegmentMetadata | None:
        """The finished segment holding ``offset``, else the first one after it (Kafka's
        remoteLogSegmentMetadata(tp, epoch, offset), falling forward over a gap)."""
        segs = self.segments(topic_id, partition)
        i = bisect_right([s.start_offset for s in segs], offset) - 1
        for s in segs[max(i, 0):]:
            if s.end_offset >= offset:
                return s
        return None

    def highest_offset(self, topic_id: uuid.UUID, partition: int) -> int:
        """Last offset of the finished remote segments, -1 if none (Kafka's highestOffsetForEpoch)."""
        segs = self.segments(topic_id, partition)
        return max((s.end_offset for s in segs), default=-1)


class RemoteLogMetadataStore(MaterializedSegments):
    """The single-node RLMM: :class:`MaterializedSegments` backed by the fsynced event file.

    KIP-950 "partition stopped" marks are kept in memory only: on one broker a disablement
    stops every partition in one go, and after a restart it is redone from the top anyway
    (kcli.tiered.disable), so the file format stays as it was."""

    def __init__(self, data_dir: Path, *, read_only: bool = False) -> None:
        super().__init__()
        self.dir = Path(data_dir) / DIR_NAME
        self.path = self.dir / FILE_NAME
        self.read_only = read_only
        self._fd: int | None = None
        self._events = 0
        self._stopped: dict[tuple[uuid.UUID, int], set[int]] = {}

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self) -> "RemoteLogMetadataStore":
        if self.path.exists():
            self._replay()
        if self.read_only:
            return self
        self.dir.mkdir(parents=True, exist_ok=True)
        if self._events >= _COMPACT_MIN_EVENTS and self._events > 4 * max(1, len(self._by_id)):
            self._compact()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return self

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _replay(self) -> None:
        data = self.path.read_bytes()
        good_end = 0
        pos = 0
        lines = data.split(b"\n")
        for i, line in enumerate(lines):
            end = pos + len(line) + 1
            if not line:
                pos = end
                continue
            rec = _decode(line)
            torn = i == len(lines) - 1  # no newline after it: the write did not finish
            if rec is None or torn:
                if i >= len(lines) - 2:
                    break  # torn tail from a crash: drop it
                raise RemoteLogMetadataError(f"corrupt record at byte {pos} of {self.path}")
            self._apply(rec)
            self._events += 1
            good_end = min(end, len(data))
            pos = end
        if good_end < len(data) and not self.read_only:
            with open(self.path, "r+b") as f:
                f.truncate(good_end)
                os.fsync(f.fileno())

    def _compact(self) -> None:
        tmp = self.path.with_name(FILE_NAME + ".tmp")
        chunk = b"".join(_encode({"type": "RemoteLogSegmentMetadataRecord", "data": segment_to_json(md)})
                         for md in self._by_id.values())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, chunk)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self._events = len(self._by_id)

    # -- events --------------------------------------------------------------------------------
    def _append(self, records: Iterable[dict[str, Any]]) -> None:
        records = list(records)
        if not records:
            return
        if self._fd is None:
            raise RemoteLogMetadataError("remote log metadata store is not open for writing")
        os.write(self._fd, b"".join(_encode(r) for r in records))
        os.fsync(self._fd)
        with self._lock:
            for r in records:
                self._apply(r)
                self._events += 1

    def _apply(self, rec: dict[str, Any]) -> None:
        kind, d = rec["type"], rec["data"]
        if kind == "RemoteLogSegmentMetadataRecord":
            self._put(segment_from_json(d))
        elif kind == "RemoteLogSegmentMetadataUpdateRecord":
            md = self._by_id.get(uuid.UUID(d["segmentId"]))
            if md is not None:
                self._put(md.with_state(S(d["state"]), int(d["eventTimestampMs"])))
        else:
            raise RemoteLogMetadataError(f"unknown remote log metadata record type {kind}")

    def add_copy_started(self, md: RemoteLogSegmentMetadata) -> None:
        """Record a new segment copy (Kafka's addRemoteLogSegmentMetadata)."""
        if md.state is not S.COPY_SEGMENT_STARTED:
            raise RemoteLogMetadataError(f"a new remote segment must be {S.COPY_SEGMENT_STARTED.value}, got {md.state.value}")
        if self.get(md.segment_id.id) is not None:
            raise RemoteLogMetadataError(f"remote segment {md.segment_id.id} already exists")
        self._append([{"type": "RemoteLogSegmentMetadataRecord", "data": segment_to_json(md)}])

    def update_state(self, mds: Iterable[RemoteLogSegmentMetadata], state: RemoteLogSegmentState) -> list[RemoteLogSegmentMetadata]:
        """Move segments to ``state`` in one fsynced write (Kafka's updateRemoteLogSegmentMetadata);
        returns the updated metadata. Invalid transitions raise before anything is written."""
        out = self._transitions(mds, state, self.get, _now_ms())
        self._append({"type": "RemoteLogSegmentMetadataUpdateRecord",
                      "data": {"segmentId": str(md.segment_id.id), "state": state.value,
                               "eventTimestampMs": md.event_timestamp_ms}}
                     for md in out)
        return out

    def refresh(self) -> None:
        """Nothing to learn: this broker is the only writer."""

    def mark_partitions_stopped(self, topic_id: uuid.UUID, tiered_epoch: int, partitions: Iterable[int]) -> None:
        self._stopped.setdefault((topic_id, tiered_epoch), set()).update(partitions)

    def stopped_partitions(self, topic_id: uuid.UUID, tiered_epoch: int) -> set[int]:
        return set(self._stopped.get((topic_id, tiered_epoch), ()))


def _start(md: RemoteLogSegmentMetadata) -> int:
    return md.start_offset


_encode = encode_line
_decode = decode_line


def load(data_dir: Path) -> RemoteLogMetadataStore:
    """Read the remote metadata of a (possibly running) broker's data dir without writing."""
    return RemoteLogMetadataStore(data_dir, read_only=True).open()
