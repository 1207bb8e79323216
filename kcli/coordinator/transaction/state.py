"""Transaction state: one transactional id's :class:`TransactionMetadata` in Kafka's states, and
the one-broker :class:`TransactionLog` (``<data_dir>/__transaction_state/transactions.log``, one
CRC-checked JSON line per transition, fsynced before it is answered). The shared cluster state
stores the same metadata in PostgreSQL (kcli.cluster.pg_transactions)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.crcjson import decode_line, encode_line
from kcli.fsutil import fsync_dir

log = logging.getLogger("kcli.coordinator.transaction.state")

EMPTY = "Empty"
ONGOING = "Ongoing"
PREPARE_COMMIT = "PrepareCommit"
PREPARE_ABORT = "PrepareAbort"
COMPLETE_COMMIT = "CompleteCommit"
COMPLETE_ABORT = "CompleteAbort"
PREPARE_EPOCH_FENCE = "PrepareEpochFence"
DEAD = "Dead"
STATES = (EMPTY, ONGOING, PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT, COMPLETE_ABORT, PREPARE_EPOCH_FENCE, DEAD)

MAX_EPOCH = 32767 - 1  # Short.MaxValue - 1: past it the coordinator hands out a new producer id
NO_PRODUCER_EPOCH = -1

TopicPartition = tuple[str, int]
PendingOffset = tuple[int, int, str]  # offset, leader epoch, metadata


@dataclass
class TransactionMetadata:
    """One transactional id's state (Kafka's TransactionMetadata, what its log records hold)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: str = EMPTY
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    partitions: frozenset[TopicPartition] = frozenset()
    # TxnOffsetCommit offsets waiting for the commit: {group: {(topic, partition): offset}}
    pending_offsets: dict[str, dict[TopicPartition, PendingOffset]] = field(default_factory=dict)
    start_ms: int = -1
    update_ms: int = -1
    # KIP-890 transactions v2: the open (or last) transaction was begun by a TV2 client, which
    # gets an epoch bump at each EndTxn; prev_producer_id with last_producer_epoch is what the
    # ended transaction used, so a retried EndTxn v5 is recognised.
    tv2: bool = False
    prev_producer_id: int = -1

    def to_record(self) -> dict[str, Any]:
        return {
            "type": "txn", "transactional_id": self.transactional_id, "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch, "last_producer_epoch": self.last_producer_epoch,
            "timeout_ms": self.timeout_ms, "state": self.state,
            "partitions": sorted([t, p] for t, p in self.partitions),
            "pending_offsets": {g: [[t, p, *v] for (t, p), v in sorted(offs.items())]
                                for g, offs in self.pending_offsets.items()},
            "start_ms": self.start_ms, "update_ms": self.update_ms,
            "tv2": self.tv2, "prev_producer_id": self.prev_producer_id,
        }

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> "TransactionMetadata":
        state = rec["state"]
        if state not in STATES:
            raise ValueError(f"unknown transaction state {state!r}")
        return cls(
            transactional_id=rec["transactional_id"], producer_id=int(rec["producer_id"]),
            producer_epoch=int(rec["producer_epoch"]), timeout_ms=int(rec["timeout_ms"]), state=state,
            last_producer_epoch=int(rec.get("last_producer_epoch", NO_PRODUCER_EPOCH)),
            partitions=frozenset((t, int(p)) for t, p in rec.get("partitions", [])),
            pending_offsets={g: {(t, int(p)): (int(o), int(e), str(m)) for t, p, o, e, m in offs}
                             for g, offs in rec.get("pending_offsets", {}).items()},
            start_ms=int(rec.get("start_ms", -1)), update_ms=int(rec.get("update_ms", -1)),
            tv2=bool(rec.get("tv2", False)), prev_producer_id=int(rec.get("prev_producer_id", -1)),
        )


class TransactionStateError(Exception):
    """The transaction state log could not be written (answered as COORDINATOR_NOT_AVAILABLE)."""


class TransactionFencedError(TransactionStateError):
    """Another broker coordinates the transactional id now (answered as NOT_COORDINATOR)."""


def state_error_code(err: TransactionStateError) -> int:
    """What a client gets when the state could not be written: NOT_COORDINATOR (it asks
    FindCoordinator again) when another broker took the id over, else COORDINATOR_NOT_AVAILABLE."""
    return int(ErrorCode.not_coordinator if isinstance(err, TransactionFencedError) else ErrorCode.coordinator_not_available)


class TransactionLog:
    """The transaction state log in a directory: append-only, fsynced per write, compacted
    (last record per transactional id) on open and when it holds twice what is live."""

    shared = False  # one broker's own state: every transactional id is coordinated here

    def __init__(self, directory: Path, compact_min_lines: int = 1000) -> None:
        self.dir = Path(directory)
        self.path = self.dir / "transactions.log"
        self.compact_min_lines = compact_min_lines
        self.lines = 0
        self._fd: int | None = None
        self._io = threading.Lock()
        self._write_lock: asyncio.Lock | None = None

    @property
    def location(self) -> str:
        return f"transaction state log {self.path}"

    def open(self) -> dict[str, TransactionMetadata]:
        """Blocking: replay the log (dropping a torn tail) and return the state per id."""
        self.dir.mkdir(parents=True, exist_ok=True)
        state: dict[str, TransactionMetadata] = {}
        if self.path.exists():
            data = self.path.read_bytes()
            pos = good = 0
            while pos < len(data):
                nl = data.find(b"\n", pos)
                if nl < 0:
                    break
                rec = decode_line(data[pos:nl])
                if rec is None:
                    break
                self._apply(state, rec)
                self.lines += 1
                pos = good = nl + 1
            if good < len(data):
                log.warning("%s: dropping %d bytes after the last valid record", self.path, len(data) - good)
                with open(self.path, "r+b") as f:
                    f.truncate(good)
                    os.fsync(f.fileno())
        self._rewrite(state)
        return state

    @staticmethod
    def _apply(state: dict[str, TransactionMetadata], rec: dict[str, Any]) -> None:
        kind = rec.get("type")
        if kind == "txn":
            md = TransactionMetadata.from_record(rec)
            state[md.transactional_id] = md
        elif kind == "txn_delete":
            state.pop(rec["transactional_id"], None)
        else:
            log.warning("transaction state log: skipping unknown record type %r", kind)

    def _rewrite(self, state: dict[str, TransactionMetadata]) -> None:
        tmp = self.dir / "transactions.log.compacting"
        data = b"".join(encode_line(md.to_record()) for md in state.values())
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        with self._io:
            os.replace(tmp, self.path)
            fsync_dir(self.dir)
            if self._fd is not None:
                os.close(self._fd)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND, 0o644)
        self.lines = len(state)

    def _write_io(self, data: bytes) -> None:
        with self._io:
            if self._fd is None:
                raise OSError("the transaction state log is closed")
            size = os.fstat(self._fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view):]
                os.fsync(self._fd)
            except OSError:
                try:
                    os.ftruncate(self._fd, size)
                except OSError:
                    pass
                raise

    async def write(self, records: list[dict[str, Any]], live: dict[str, TransactionMetadata]) -> None:
        """Make ``records`` durable (TransactionStateError if not); compact when worthwhile."""
        if self._write_lock is None:
            self._write_lock = asyncio.Lock()
        async with self._write_lock:
            try:
                await asyncio.to_thread(self._write_io, b"".join(encode_line(r) for r in records))
            except OSError as err:
                raise TransactionStateError(f"cannot write {self.path}: {err}") from err
            self.lines += len(records)
            if self.lines > max(self.compact_min_lines, 2 * len(live)):
                snapshot = {tid: replace(md) for tid, md in live.items()}
                for rec in records:
                    self._apply(snapshot, rec)
                try:
                    await asyncio.to_thread(self._rewrite, snapshot)
                except OSError as err:
                    log.error("%s: compaction failed: %s", self.path, err)

    def release(self, tid: str) -> None:
        """Nothing to let go: a single broker coordinates every id."""

    def close(self) -> None:
        with self._io:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def offset_topics(offsets: dict[TopicPartition, PendingOffset]) -> list[dict[str, Any]]:
    """Offsets as the ``topics`` of an OffsetCommit / TxnOffsetCommit request."""
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), (offset, leader_epoch, metadata) in sorted(offsets.items()):
        by_topic.setdefault(topic, []).append({"partition_index": partition, "committed_offset": offset,
                                               "committed_leader_epoch": leader_epoch, "committed_metadata": metadata})
    return [{"name": t, "partitions": ps} for t, ps in by_topic.items()]


def now_ms() -> int:
    return int(time.time() * 1000)


_now_ms = now_ms
