"""Committed offsets: the :class:`CommittedOffsetStore` contract the group coordinator writes
through, and the one-broker :class:`OffsetStore` (``<data_dir>/__consumer_offsets/offsets.log``,
one ``<crc32c hex> <json>`` line per record, fsynced before a commit is answered). The cluster's
PostgreSQL store (kcli.cluster.pg_offsets) implements the same contract."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Protocol

from kio.schema.errors import ErrorCode

from kcli.fsutil import fsync_dir_best_effort
from kcli.crcjson import decode_line, encode_line

log = logging.getLogger("kcli.coordinator.group.offsets")

@dataclass
class OffsetAndMetadata:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp_ms: int = 0


# ---- durable offsets ---------------------------------------------------------------------------


class OffsetStoreError(Exception):
    """The offsets store cannot be read or written; ``error_code`` is what a client gets (Kafka
    answers a failed offsets-log append with NOT_COORDINATOR; an unreachable shared store is
    COORDINATOR_NOT_AVAILABLE). ``fenced``: another broker took the group over through the store."""

    def __init__(self, message: str, error_code: int = ErrorCode.not_coordinator, *, fenced: bool = False) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.fenced = fenced


class CommittedOffsetStore(Protocol):
    """What the coordinator needs from durable offsets, whoever holds them.

    ``offsets`` and ``protocol_types`` hold the groups loaded here. A group is read and written
    only between :meth:`load_group` and :meth:`unload_group`; a store shared by several brokers
    makes the last broker that loaded a group its only writer (the others' writes fail with a
    fenced OffsetStoreError) and loads the state the store has at that moment.
    """

    offsets: dict[str, dict[tuple[str, int], OffsetAndMetadata]]
    protocol_types: dict[str, str]

    @property
    def location(self) -> str:
        """Where the offsets are, for messages."""

    def open(self) -> None:
        """Blocking: make the store usable (raises OSError / OffsetStoreError)."""

    async def close(self) -> None:
        """Finish pending writes and release files or connections."""

    def group_offsets(self, group_id: str) -> dict[tuple[str, int], OffsetAndMetadata]:
        """Committed offsets of a loaded group."""

    def has_offsets(self, group_id: str) -> bool:
        """Whether a loaded group has committed offsets."""

    async def append(self, records: list[dict[str, Any]]) -> None:
        """Make ``records`` durable, then apply them; OffsetStoreError when they are not stored."""

    def append_behind(self, records: list[dict[str, Any]]) -> None:
        """Apply ``records`` now and write them without waiting (deletions, protocol types)."""

    async def load_group(self, group_id: str) -> None:
        """Become the group's writer and load its stored state (OffsetStoreError if unreachable)."""

    def unload_group(self, group_id: str) -> None:
        """Forget the group here (another broker coordinates it now, or nothing is left of it)."""

    async def stored_groups(self) -> dict[str, str]:
        """``{group_id: protocol_type}`` of every group with stored state, loaded or not."""

    async def lost_groups(self, group_ids: Iterable[str]) -> set[str]:
        """Of ``group_ids``, the loaded groups another broker has taken over since."""

    # KIP-932 share-partition state (Kafka's __share_group_state), kcli/coordinator/share/persister.py
    async def share_state_read(self, group_id: str, topic: str, partition: int) -> dict[str, Any] | None:
        """The persisted state of a share partition, or None."""

    async def share_state_write(self, group_id: str, topic: str, partition: int, state: dict[str, Any]) -> bool:
        """Make ``state`` durable; False when a newer state epoch is stored (this writer is fenced)."""

    async def share_states(self, group_id: str | None = None) -> dict[tuple[str, str, int], dict[str, Any]]:
        """Every persisted share-partition state (of one group)."""

    async def share_state_delete(self, group_id: str, topic: str | None = None) -> None:
        """Forget a share group's state (of one topic)."""


_encode = encode_line
_decode = decode_line


class OffsetStore:
    """Committed offsets per group, backed by an append-only fsynced log.

    A commit becomes visible only after its record is on disk, so a commit that was answered
    survives kill -9. Deletions (group, topic, expired offsets) take effect at once and are
    written behind: losing one in a crash only brings back offsets nobody can use.
    """

    def __init__(self, directory: Path, compact_min_lines: int = 10000) -> None:
        self.dir = Path(directory)
        self.path = self.dir / "offsets.log"
        self.compact_min_lines = compact_min_lines
        self.offsets: dict[str, dict[tuple[str, int], OffsetAndMetadata]] = {}
        self.protocol_types: dict[str, str] = {}
        # KIP-932: (group, topic, partition) -> persisted share-partition state, in the same log
        self.share: dict[tuple[str, str, int], dict[str, Any]] = {}
        self.lines = 0
        self.compactions = 0
        self._next_check = 0
        self._fd: int | None = None
        self._size = 0
        self._io_lock = threading.Lock()
        self._pending: list[tuple[list[dict[str, Any]], asyncio.Future[None] | None]] = []
        self._flusher: asyncio.Task[None] | None = None

    # -- lifecycle
    def open(self) -> None:
        created = not self.dir.exists()
        self.dir.mkdir(parents=True, exist_ok=True)
        if created:
            fsync_dir_best_effort(self.dir.parent)
        if self.path.exists():
            self._replay()
        existed = self.path.exists()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if not existed:
            fsync_dir_best_effort(self.dir)
        self._size = os.fstat(self._fd).st_size
        if self._should_compact():
            self._rewrite(self._snapshot())

    def _replay(self) -> None:
        data = self.path.read_bytes()
        pos = good_end = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            if nl < 0:
                break  # torn tail
            line = data[pos:nl]
            if line:
                rec = _decode(line)
                if rec is None:
                    break  # like Kafka's log recovery: stop at the first invalid record
                self._apply(rec)
                self.lines += 1
            pos = good_end = nl + 1
        if good_end < len(data):
            log.warning("offsets log %s: dropping %d bytes after the last valid record at byte %d",
                        self.path, len(data) - good_end, good_end)
            with open(self.path, "r+b") as f:
                f.truncate(good_end)
                os.fsync(f.fileno())

    async def close(self) -> None:
        while self._flusher is not None and not self._flusher.done():
            try:
                await asyncio.shield(self._flusher)
            except Exception:
                log.exception("offsets log %s: flush failed", self.path)
        if self._pending:  # written behind without a running flusher
            self._write_batch(self._take_pending())
        with self._io_lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    @property
    def location(self) -> str:
        return f"offsets log in {self.dir}"

    # -- groups: this broker is the only writer of its data dir, so every group stays loaded
    async def load_group(self, group_id: str) -> None:
        return None

    def unload_group(self, group_id: str) -> None:
        return None

    async def stored_groups(self) -> dict[str, str]:
        return {gid: self.protocol_types.get(gid, "") for gid in set(self.offsets) | set(self.protocol_types)}

    async def lost_groups(self, group_ids: Iterable[str]) -> set[str]:
        return set()

    # -- reading
    def group_offsets(self, group_id: str) -> dict[tuple[str, int], OffsetAndMetadata]:
        return self.offsets.get(group_id, {})

    def has_offsets(self, group_id: str) -> bool:
        return bool(self.offsets.get(group_id))

    def live_records(self) -> int:
        return sum(len(v) for v in self.offsets.values()) + len(self.protocol_types) + len(self.share)

    # -- share-partition state (records "share_state" / "share_state_delete" in the same log)
    async def share_state_read(self, group_id: str, topic: str, partition: int) -> dict[str, Any] | None:
        return self.share.get((group_id, topic, int(partition)))

    async def share_state_write(self, group_id: str, topic: str, partition: int, state: dict[str, Any]) -> bool:
        await self.append([{"type": "share_state", "group": group_id, "topic": topic, "partition": int(partition),
                            "state": state}])
        return True  # one broker: the only writer

    async def share_states(self, group_id: str | None = None) -> dict[tuple[str, str, int], dict[str, Any]]:
        return {k: v for k, v in self.share.items() if group_id is None or k[0] == group_id}

    async def share_state_delete(self, group_id: str, topic: str | None = None) -> None:
        if any(k[0] == group_id and (topic is None or k[1] == topic) for k in self.share):
            rec: dict[str, Any] = {"type": "share_state_delete", "group": group_id}
            if topic is not None:
                rec["topic"] = topic
            await self.append([rec])

    # -- writing
    async def append(self, records: list[dict[str, Any]]) -> None:
        """Make ``records`` durable, then apply them; raises OffsetStoreError on I/O failure."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((records, fut))
        self._kick()
        await fut

    def append_behind(self, records: list[dict[str, Any]]) -> None:
        """Apply ``records`` now and write them without waiting (deletions, metadata)."""
        # Every group is in memory here: a topic deletion that drops nothing needs no line.
        records = [r for r in records if r.get("type") != "topic_delete"
                   or any(tp[0] == r["topic"] for offs in self.offsets.values() for tp in offs)
                   or any(k[1] == r["topic"] for k in self.share)]
        if not records:
            return
        for rec in records:
            self._apply(rec)
        self._pending.append((records, None))
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._write_batch(self._take_pending())
            return
        self._kick()

    def _kick(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    def _take_pending(self) -> list[tuple[list[dict[str, Any]], asyncio.Future[None] | None]]:
        batch, self._pending = self._pending, []
        return batch

    async def _flush_loop(self) -> None:
        while self._pending:
            batch = self._take_pending()
            try:
                await asyncio.to_thread(self._write_batch_io, batch)
            except Exception as err:  # OSError mostly; whatever it is, no commit may hang
                log.error("offsets log %s: write failed: %s", self.path, err)
                for _recs, fut in batch:
                    if fut is not None and not fut.done():
                        fut.set_exception(OffsetStoreError(str(err)))
                continue
            self._after_write(batch)
            if self._should_compact():
                snapshot = self._snapshot()
                try:
                    await asyncio.to_thread(self._rewrite, snapshot)
                except OSError as err:
                    log.error("offsets log %s: compaction failed: %s", self.path, err)

    def _write_batch(self, batch: list[tuple[list[dict[str, Any]], asyncio.Future[None] | None]]) -> None:
        self._write_batch_io(batch)
        self._after_write(batch)

    def _write_batch_io(self, batch: list[tuple[list[dict[str, Any]], asyncio.Future[None] | None]]) -> None:
        data = b"".join(_encode(rec) for recs, _ in batch for rec in recs)
        if not data:
            return
        with self._io_lock:
            if self._fd is None:
                raise OSError("offsets log is closed")
            try:
                view = memoryview(data)
                while view:
                    n = os.write(self._fd, view)
                    view = view[n:]
                os.fsync(self._fd)
            except OSError:
                try:  # do not leave a torn line that later appends would glue onto
                    os.ftruncate(self._fd, self._size)
                except OSError:
                    pass
                raise
            self._size += len(data)

    def _after_write(self, batch: list[tuple[list[dict[str, Any]], asyncio.Future[None] | None]]) -> None:
        # Re-apply written-behind records too (they are idempotent) so memory ends in the same
        # state a replay of the file gives, whatever was queued in between.
        for recs, fut in batch:
            self.lines += len(recs)
            for rec in recs:
                self._apply(rec)
            if fut is not None and not fut.done():
                fut.set_result(None)

    def _should_compact(self) -> bool:
        # Counting live records walks every offset, so only count when the log has grown past
        # the last count's threshold.
        if self.lines <= max(self.compact_min_lines, self._next_check):
            return False
        live = self.live_records()
        self._next_check = 2 * live
        return self.lines > 2 * live

    def _snapshot(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"type": "group", "group": g, "protocol_type": pt}
                                     for g, pt in self.protocol_types.items()]
        for g, offs in self.offsets.items():
            for (t, p), om in offs.items():
                out.append(commit_record(g, t, p, om))
        for (g, t, p), state in self.share.items():
            out.append({"type": "share_state", "group": g, "topic": t, "partition": p, "state": state})
        return out

    def _rewrite(self, records: list[dict[str, Any]]) -> None:
        tmp = self.dir / "offsets.log.compacting"
        data = b"".join(_encode(r) for r in records)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        with self._io_lock:
            os.replace(tmp, self.path)
            fsync_dir_best_effort(self.dir)
            if self._fd is not None:
                os.close(self._fd)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND, 0o644)
            self._size = len(data)
        self.lines = len(records)
        self.compactions += 1
        log.info("offsets log %s compacted to %d records", self.path, len(records))

    # -- state
    def _apply(self, rec: dict[str, Any]) -> None:
        if apply_share_record(self.share, rec):
            return
        if not apply_offset_record(self.offsets, self.protocol_types, rec):
            log.warning("offsets log %s: skipping unknown record type %r", self.path, rec.get("type"))


def apply_offset_record(offsets: dict[str, dict[tuple[str, int], OffsetAndMetadata]],
                        protocol_types: dict[str, str], rec: dict[str, Any]) -> bool:
    """Apply one offsets record to the in-memory state; False for a type it does not know."""
    kind = rec.get("type")
    if kind == "offset":
        om = OffsetAndMetadata(int(rec["offset"]), int(rec.get("leader_epoch", -1)),
                               rec.get("metadata") or "", int(rec.get("commit_timestamp", 0)))
        offsets.setdefault(rec["group"], {})[(rec["topic"], int(rec["partition"]))] = om
    elif kind == "offset_delete":
        offs = offsets.get(rec["group"])
        if offs is not None:
            offs.pop((rec["topic"], int(rec["partition"])), None)
            if not offs:
                del offsets[rec["group"]]
    elif kind == "group":
        if rec.get("protocol_type"):
            protocol_types[rec["group"]] = rec["protocol_type"]
        else:
            protocol_types.pop(rec["group"], None)
    elif kind == "group_delete":
        offsets.pop(rec["group"], None)
        protocol_types.pop(rec["group"], None)
    elif kind == "topic_delete":
        topic = rec["topic"]
        for g in list(offsets):
            offs = offsets[g]
            for tp in [tp for tp in offs if tp[0] == topic]:
                del offs[tp]
            if not offs:
                del offsets[g]
    else:
        return False
    return True


def apply_share_record(share: dict[tuple[str, str, int], dict[str, Any]], rec: dict[str, Any]) -> bool:
    """Apply a record to the share-partition states: True when it was one of theirs (the deletion
    of a group or a topic also drops its share states, and is then left to the offsets too)."""
    kind = rec.get("type")
    if kind == "share_state":
        share[(rec["group"], rec["topic"], int(rec["partition"]))] = rec["state"]
        return True
    if kind == "share_state_delete":
        for k in [k for k in share if k[0] == rec["group"] and (rec.get("topic") is None or k[1] == rec["topic"])]:
            del share[k]
        return True
    if kind == "group_delete":
        for k in [k for k in share if k[0] == rec["group"]]:
            del share[k]
    elif kind == "topic_delete":
        for k in [k for k in share if k[1] == rec["topic"]]:
            del share[k]
    return False


def commit_record(group: str, topic: str, partition: int, om: OffsetAndMetadata) -> dict[str, Any]:
    return {"type": "offset", "group": group, "topic": topic, "partition": partition,
            "offset": om.offset, "leader_epoch": om.leader_epoch, "metadata": om.metadata,
            "commit_timestamp": om.commit_timestamp_ms}
