"""Kafka's log cleaner for classic partitions (``cleanup.policy=compact``): keep the latest record per key.

How a pass works, as Kafka's LogCleaner / Cleaner / LogCleanerManager do it:

- The *clean* section of a log is ``[log start, first dirty)``, the *dirty* section
  ``[first dirty, first uncleanable)``. ``first dirty`` comes from the cleaner checkpoint
  (``cleaner-offset-checkpoint`` in the data dir, atomically replaced after each pass, so a
  restart resumes); ``first uncleanable`` is the active segment's base, or earlier the first
  dirty segment whose newest record is younger than ``min.compaction.lag.ms``. The active
  segment is never cleaned.
- A log is cleaned when dirty bytes / (clean + dirty bytes) >= ``min.cleanable.dirty.ratio``,
  when its oldest dirty batch is older than ``max.compaction.lag.ms``, or when tombstones it
  keeps have passed their delete horizon.
- The offset map (Kafka's OffsetMap: key -> latest offset) is built over the dirty section,
  segment by segment, until its keys cost ``max_map_bytes`` (each key: its length plus
  ``MAP_ENTRY_OVERHEAD`` for Python's dict entry, int and bytes object): where it stops is the
  pass's end offset, and the next pass goes on from there. The map keeps the keys themselves, not
  Kafka's MD5 hashes, so no collision can ever drop a live record.
- Every segment below that end is rewritten, in groups no larger than ``segment.bytes``, into
  ``<base>.log.cleaned`` and swapped in by :meth:`PartitionLog.replace_segments` (``.swap``,
  recovered on start). A record survives if the map holds no later offset for its key; records
  without a key are dropped. Batches keep their base offset and lastOffsetDelta (Kafka's
  ``MemoryRecords.filterTo`` / ``overrideLastOffset``), so offsets never change; they are
  re-compressed with their codec. A batch left empty is dropped, except the last batch of a
  producer, kept as an empty batch so its sequence state survives (Kafka does the same).
- Tombstones (null value) follow KIP-534: the first pass that keeps one stamps its batch with a
  delete horizon (attribute bit 0x40, base timestamp = now + ``delete.retention.ms``); a pass
  after the horizon drops it.
- Transactions, as Kafka's CleanedTransactionMetadata handles them: the dirty section ends
  below the segment holding the first offset of an open transaction (nothing unstable is
  cleaned, so an open transaction's records never shadow committed ones); batches of aborted
  transactions are left out of the offset map and dropped (an empty batch stays where it is a
  producer's last); a COMMIT or ABORT marker is kept while the pass still read data of its
  transaction, then stamped with a delete horizon like a tombstone and dropped once that passed.
  One :class:`CleanedTransactions` follows the whole pass, from the log start, so a marker is
  only dropped when no batch of its transaction is left before it.
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from crc32c import crc32c

from kio.schema.errors import ErrorCode

from kcli import faults
from kcli.fsutil import fsync_dir
from kcli.records.control import COMMIT, control_type
from kcli.records.batch import (
    COMPRESSION_MASK,
    DELETE_HORIZON_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    InvalidBatchError,
    read_header,
)
from kcli.storage.errors import LogError
from kcli.storage.index import INT32_MAX
from kcli.storage.log import CleanableSegment, CleaningSnapshot, PartitionLog
from kcli.storage.segment import CLEANED_SUFFIX, LOG_SUFFIX, segment_name
from kcli.storage.txn_state import AbortedTxn

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "cleaner-offset-checkpoint"  # Kafka's LogCleanerManager.offsetCheckpointFile
DEFAULT_MAX_MAP_BYTES = 128 * 1024 * 1024  # Kafka's log.cleaner.dedupe.buffer.size default
MAP_ENTRY_OVERHEAD = 120  # bytes per key besides the key: dict slot, bytes and int objects
_READ_CHUNK = 1 << 20

_HEADER = struct.Struct(">qiibIhiqqqhii")


# ==========================================================================================
# checkpoint
# ==========================================================================================
def read_checkpoints(data_dir: Path) -> dict[tuple[str, int], int]:
    """Kafka's OffsetCheckpointFile: ``0`` / count / ``<topic> <partition> <offset>`` lines.
    A missing or malformed file is empty (the safe default: everything is dirty again)."""
    path = Path(data_dir) / CHECKPOINT_FILE
    try:
        lines = path.read_text().splitlines()
    except (FileNotFoundError, UnicodeDecodeError):
        return {}
    try:
        if lines[0].strip() != "0" or int(lines[1]) != len(lines) - 2:
            raise ValueError
        out: dict[tuple[str, int], int] = {}
        for line in lines[2:]:
            topic, partition, offset = line.split()
            out[(topic, int(partition))] = int(offset)
        return out
    except (IndexError, ValueError):
        log.warning("ignoring malformed cleaner checkpoint %s", path)
        return {}


def write_checkpoints(data_dir: Path, checkpoints: dict[tuple[str, int], int]) -> None:
    """Replace the checkpoint file atomically (tmp, fsync, rename, fsync the dir)."""
    path = Path(data_dir) / CHECKPOINT_FILE
    body = "".join(f"{t} {p} {o}\n" for (t, p), o in sorted(checkpoints.items()))
    data = f"0\n{len(checkpoints)}\n{body}".encode()
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise LogError(ErrorCode.kafka_storage_error, f"cannot write {path}: {exc}") from exc


# ==========================================================================================
# what is cleanable
# ==========================================================================================
@dataclass(frozen=True, slots=True)
class CleanableRange:
    """Kafka's LogToClean: the clean and dirty sections of one log."""

    first_dirty: int
    first_uncleanable: int
    clean_bytes: int
    dirty_bytes: int
    must_clean: bool  # max.compaction.lag.ms passed for the oldest dirty batch

    @property
    def ratio(self) -> float:
        """Dirty bytes / (clean + dirty bytes): what ``min.cleanable.dirty.ratio`` is held against."""
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


def cleanable_range(snap: CleaningSnapshot, checkpoint: int | None, min_lag_ms: int, max_lag_ms: int,
                    now_ms: int) -> CleanableRange:
    """Kafka's LogCleanerManager.cleanableOffsets and cleanable bytes, over inactive segments."""
    segs = snap.segments
    first_seg = segs[0].base_offset if segs else snap.active_base_offset
    start = max(snap.log_start_offset, first_seg)
    first_dirty = checkpoint if checkpoint is not None else start
    if first_dirty < start or first_dirty > snap.active_base_offset:
        first_dirty = start  # the log was truncated or its start moved past the checkpoint
    uncleanable = snap.active_base_offset
    if snap.first_unstable_offset is not None:
        # Not the offset itself: the segment holding it is not cleaned (its later records may be
        # an open transaction's), as Kafka bounds the dirty section by the first unstable offset.
        held = [s.base_offset for s in segs if s.base_offset <= snap.first_unstable_offset < s.end_offset]
        uncleanable = min(uncleanable, max(held[0] if held else snap.first_unstable_offset, first_dirty))
    dirty = [s for s in segs if s.end_offset > first_dirty]
    if min_lag_ms > 0:
        for s in dirty:
            if s.largest_timestamp > now_ms - min_lag_ms:
                uncleanable = min(uncleanable, max(s.base_offset, first_dirty))
                break
    clean_bytes = sum(s.size for s in segs if s.end_offset <= first_dirty)
    dirty_bytes = sum(s.size for s in dirty if s.base_offset < uncleanable)
    must = False
    if max_lag_ms < 2**63 - 1 and dirty_bytes:
        stamps = [s.first_batch_timestamp for s in dirty if s.base_offset < uncleanable and s.first_batch_timestamp >= 0]
        must = bool(stamps) and now_ms - min(stamps) > max_lag_ms
    return CleanableRange(first_dirty, uncleanable, clean_bytes, dirty_bytes, must)


# ==========================================================================================
# record codec (v2 records, as Kafka's DefaultRecord writes them)
# ==========================================================================================
@dataclass(frozen=True, slots=True)
class Rec:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def _varint(value: int, out: bytearray) -> None:
    v = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF  # zigzag
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _encode_record(rec: Rec, base_offset: int, base_ts: int, out: bytearray) -> None:
    body = bytearray(b"\x00")  # attributes
    _varint(rec.timestamp - base_ts, body)
    _varint(rec.offset - base_offset, body)
    for blob in (rec.key, rec.value):
        if blob is None:
            _varint(-1, body)
        else:
            _varint(len(blob), body)
            body += blob
    _varint(len(rec.headers), body)
    for hkey, hval in rec.headers:
        raw = hkey.encode()
        _varint(len(raw), body)
        body += raw
        if hval is None:
            _varint(-1, body)
        else:
            _varint(len(hval), body)
            body += hval
    _varint(len(body), out)
    out += body


def _compress(codec: int, data: bytes) -> bytes:
    from aiokafka import codec as c

    if codec == 1:
        return c.gzip_encode(data)
    if codec == 2:
        return c.snappy_encode(data)
    if codec == 3:
        return c.lz4_encode(data)
    if codec == 4:
        return c.zstd_encode(data)
    raise LogError(ErrorCode.corrupt_message, f"unknown compression codec {codec}")


def encode_batch(h: BatchHeader, records: list[Rec], delete_horizon: int | None) -> bytes:
    """A v2 batch holding ``records`` with ``h``'s base offset, lastOffsetDelta, producer
    fields, epoch, codec and flags (Kafka's filterTo builder with overrideLastOffset). An
    empty ``records`` gives Kafka's empty batch (writeEmptyHeader: uncompressed, no records)."""
    attributes = h.attributes & ~DELETE_HORIZON_MASK
    if delete_horizon is not None:
        attributes |= DELETE_HORIZON_MASK
    if not records:
        attributes &= ~COMPRESSION_MASK
        base_ts = max_ts = h.max_timestamp
        payload = b""
    else:
        if h.is_log_append_time:
            max_ts = h.max_timestamp
        else:
            max_ts = max(r.timestamp for r in records)
        base_ts = delete_horizon if delete_horizon is not None else records[0].timestamp
        body = bytearray()
        for rec in records:
            _encode_record(rec, h.base_offset, base_ts, body)
        codec = h.compression
        payload = _compress(codec, bytes(body)) if codec else bytes(body)
    length = HEADER_SIZE - LOG_OVERHEAD + len(payload)
    buf = bytearray(_HEADER.pack(
        h.base_offset, length, h.partition_leader_epoch, 2, 0, attributes, h.last_offset_delta,
        base_ts, max_ts, h.producer_id, h.producer_epoch, h.base_sequence, len(records),
    ))
    buf += payload
    struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[21:]))
    return bytes(buf)


def decode_records(batch: bytes) -> list[Rec]:
    """Every record of one batch (decompressed by aiokafka's compiled record module)."""
    from aiokafka.record.default_records import DefaultRecordBatch

    try:
        return [Rec(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in DefaultRecordBatch(batch)]
    except Exception as exc:  # aiokafka raises its own CorruptRecordException / codec errors
        raise LogError(ErrorCode.corrupt_message, f"cannot decode record batch: {exc}") from exc


def iter_batches(seg: CleanableSegment) -> Iterator[tuple[BatchHeader, bytes]]:
    """(header, bytes) of each whole batch of a snapshot segment, read through its fd."""
    pos = 0
    buf = b""
    buf_at = 0
    while seg.size - pos >= HEADER_SIZE:
        rel = pos - buf_at
        if rel + HEADER_SIZE > len(buf):
            buf, buf_at, rel = os.pread(seg.fd, _READ_CHUNK, pos), pos, 0
        try:
            h = read_header(buf, rel)
        except InvalidBatchError as exc:
            raise LogError(ErrorCode.corrupt_message, f"segment {seg.base_offset} position {pos}: {exc}") from exc
        if rel + h.size > len(buf):
            buf, buf_at, rel = os.pread(seg.fd, max(_READ_CHUNK, h.size), pos), pos, 0
            if h.size > len(buf):
                raise LogError(ErrorCode.corrupt_message, f"segment {seg.base_offset} position {pos}: batch cut short")
        yield h, buf[rel : rel + h.size]
        pos += h.size


# ==========================================================================================
# one cleaning pass
# ==========================================================================================
@dataclass
class CleanResult:
    """What one pass did (Kafka's CleanerStats)."""

    first_dirty: int
    end_offset: int  # the new checkpoint
    ratio: float
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_removed: int = 0
    segments_swapped: int = 0
    delete_horizon: int | None = None  # the earliest horizon of a tombstone still kept
    aborted: bool = False  # retention removed a segment meanwhile: checkpoint not moved

    def count(self, metrics: Any, prefix: str) -> None:
        """One pass in the cleaner metrics (``<prefix>.runs``, ``.bytes.read``, ...), the same
        names for the classic (``log.cleaner``) and the diskless (``diskless.log.cleaner``) cleaner."""
        metrics.inc(f"{prefix}.runs")
        metrics.inc(f"{prefix}.bytes.read", self.bytes_read)
        metrics.inc(f"{prefix}.bytes.written", self.bytes_written)
        metrics.inc(f"{prefix}.records.removed", self.records_removed)


def build_offset_map(segs: list[CleanableSegment], first_dirty: int, upper: int,
                     max_bytes: int, aborted: tuple[AbortedTxn, ...] = ()) -> tuple[dict[bytes, int], int, int]:
    """Kafka's buildOffsetMap: key -> latest offset over the dirty segments, segment by
    segment until the keys cost ``max_bytes`` (at least one segment is mapped). Records of
    ``aborted`` transactions are not mapped: they must never hide a committed record. Returns
    (map, end offset, bytes read)."""
    txns = CleanedTransactions(aborted)
    offsets: dict[bytes, int] = {}
    end = first_dirty
    read = 0
    cost = 0
    for seg in segs:
        if seg.end_offset <= first_dirty:
            continue
        if seg.base_offset >= upper:
            break
        if offsets and cost >= max_bytes:
            break
        for h, data in iter_batches(seg):
            read += len(data)
            if h.is_control or h.last_offset < first_dirty or txns.is_aborted(h):
                continue
            for rec in decode_records(data):
                if rec.key is not None and rec.offset >= first_dirty:
                    if rec.key not in offsets:
                        cost += len(rec.key) + MAP_ENTRY_OVERHEAD
                    offsets[rec.key] = rec.offset
        end = seg.end_offset
    return offsets, end, read


def clean_log(plog: PartitionLog, checkpoint: int | None, now_ms: int, *, force: bool = False,
              max_map_bytes: int = DEFAULT_MAX_MAP_BYTES) -> CleanResult | None:
    """One pass over ``plog`` if it needs one (or ``force``). None when it did not."""
    config = plog.config
    snap = plog.cleaning_snapshot()
    try:
        rng = cleanable_range(snap, checkpoint, config.min_compaction_lag_ms, config.max_compaction_lag_ms, now_ms)
        due = rng.dirty_bytes > 0 and (rng.ratio >= config.min_cleanable_dirty_ratio or rng.must_clean)
        if not (due or force) or not snap.segments:
            return None
        offsets, end, read = build_offset_map(snap.segments, rng.first_dirty, rng.first_uncleanable, max_map_bytes,
                                              snap.aborted)
        result = CleanResult(rng.first_dirty, end, rng.ratio, bytes_read=read)
        txns = CleanedTransactions(snap.aborted)
        for group in _groups([s for s in snap.segments if s.end_offset <= end], config.segment_bytes):
            if not _clean_group(plog, group, offsets, snap.producer_last_offsets, now_ms, result, txns):
                result.aborted = True
                break
        return result
    finally:
        snap.close()


def _groups(segs: list[CleanableSegment], max_bytes: int) -> list[list[CleanableSegment]]:
    """Kafka's groupSegmentsBySize: consecutive segments whose sizes sum to at most
    ``segment.bytes`` and whose offsets fit one segment's relative offsets."""
    groups: list[list[CleanableSegment]] = []
    for seg in segs:
        cur = groups[-1] if groups else None
        if (
            cur is not None
            and sum(s.size for s in cur) + seg.size <= max_bytes
            and seg.end_offset - 1 - cur[0].base_offset <= INT32_MAX
        ):
            cur.append(seg)
        else:
            groups.append([seg])
    return groups


def _clean_group(plog: PartitionLog, group: list[CleanableSegment], offsets: dict[bytes, int],
                 producer_last: dict[int, int], now_ms: int, result: CleanResult,
                 txns: "CleanedTransactions | None" = None) -> bool:
    """Rewrite one group into ``<base>.log.cleaned`` and swap it in (skipped when a lone
    segment would come out unchanged). False when the swap was refused (segments gone)."""
    horizon_new = now_ms + plog.config.delete_retention_ms
    cleaned = plog.dir / (segment_name(group[0].base_offset) + LOG_SUFFIX + CLEANED_SUFFIX)
    changed = len(group) > 1
    written = 0
    fd = os.open(cleaned, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        out = bytearray()
        for seg in group:
            for h, data in iter_batches(seg):
                kept, verbatim = filter_batch(h, data, offsets, producer_last, now_ms, horizon_new, result, txns)
                if kept is None:
                    changed = True
                    continue
                if not verbatim:
                    changed = True
                out += kept
                if len(out) >= _READ_CHUNK:
                    written += _write(fd, out)
        written += _write(fd, out)
        if changed:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        cleaned.unlink(missing_ok=True)
        raise
    os.close(fd)
    if not changed:
        cleaned.unlink(missing_ok=True)
        return True
    fsync_dir(plog.dir)
    faults.pause("log.cleaner.cleaned")  # crash tests only: the .cleaned file is complete, no swap yet
    if not plog.replace_segments(group, cleaned, now_ms):
        return False
    result.bytes_written += written
    result.segments_swapped += 1
    log.info("%s: cleaned segments %s into %d bytes (from %d)", plog.dir, [s.base_offset for s in group],
             written, sum(s.size for s in group))
    return True


def _write(fd: int, out: bytearray) -> int:
    n = len(out)
    view = memoryview(out)
    done = 0
    while done < n:
        done += os.write(fd, view[done:])
    view.release()
    del out[:]
    return n


class CleanedTransactions:
    """Kafka's CleanedTransactionMetadata: which batches of one pass belong to aborted
    transactions, and which markers no longer guard any data. Fed every batch in offset order."""

    def __init__(self, aborted: tuple[AbortedTxn, ...] | list[AbortedTxn]) -> None:
        self._pending = sorted(aborted, key=lambda a: a.first_offset)
        self._next = 0
        self._aborted: dict[int, list] = {}  # producer id -> [AbortedTxn, data batch read?]
        self._committed: set[int] = set()  # producers whose open (not aborted) data was read

    def _reach(self, offset: int) -> None:
        pending = self._pending
        while self._next < len(pending) and pending[self._next].first_offset <= offset:
            a = pending[self._next]
            self._next += 1
            if a.last_offset >= offset:
                self._aborted[a.producer_id] = [a, False]

    def is_aborted(self, h: BatchHeader) -> bool:
        """Whether data batch ``h`` belongs to an aborted transaction (its records must go)."""
        self._reach(h.last_offset)
        if not h.is_transactional:
            return False
        entry = self._aborted.get(h.producer_id)
        if entry is not None and entry[0].last_offset < h.base_offset:
            del self._aborted[h.producer_id]  # its marker was before this pass's first batch
            entry = None
        if entry is None:
            self._committed.add(h.producer_id)
            return False
        entry[1] = True
        return True

    def marker_is_free(self, h: BatchHeader, commit: bool) -> bool:
        """Whether marker ``h`` may go (after its delete horizon): no batch of its transaction
        was read in this pass."""
        self._reach(h.last_offset)
        pid = h.producer_id
        if commit:
            if pid in self._committed:
                self._committed.discard(pid)
                return False
            return True
        self._committed.discard(pid)
        entry = self._aborted.pop(pid, None)
        return not (entry is not None and entry[1])


def _filter_marker(h: BatchHeader, data: bytes, producer_last: dict[int, int], now_ms: int, horizon_new: int,
                   result: CleanResult, txns: CleanedTransactions) -> tuple[bytes | None, bool]:
    commit = control_type(data) == COMMIT
    if not txns.marker_is_free(h, commit) or producer_last.get(h.producer_id) == h.last_offset:
        return data, True  # still guards data, or the producer's last batch (its epoch state)
    if not h.has_delete_horizon:
        if result.delete_horizon is None or horizon_new < result.delete_horizon:
            result.delete_horizon = horizon_new
        return encode_batch(h, decode_records(data), horizon_new), False
    if now_ms >= h.base_timestamp:
        result.records_removed += 1
        return None, False
    if result.delete_horizon is None or h.base_timestamp < result.delete_horizon:
        result.delete_horizon = h.base_timestamp
    return data, True


def filter_batch(h: BatchHeader, data: bytes, offsets: dict[bytes, int], producer_last: dict[int, int],
                  now_ms: int, horizon_new: int, result: CleanResult,
                  txns: CleanedTransactions | None = None) -> tuple[bytes | None, bool]:
    """(bytes to write or None to drop, whether they are the original bytes). Without
    ``txns`` markers and transactional data are kept as they are."""
    if h.is_control:
        if txns is None:
            return data, True
        return _filter_marker(h, data, producer_last, now_ms, horizon_new, result, txns)
    if txns is not None and txns.is_aborted(h):
        result.records_read += h.records_count
        result.records_removed += h.records_count
        if h.producer_id >= 0 and producer_last.get(h.producer_id) == h.last_offset:
            return encode_batch(h, [], None), False  # keep the producer's sequence state
        return None, False
    records = decode_records(data)
    result.records_read += len(records)
    horizon = h.base_timestamp if h.has_delete_horizon else None
    expired = horizon is not None and now_ms >= horizon
    kept: list[Rec] = []
    tombstones = False
    for rec in records:
        if rec.key is None:
            continue  # Kafka's cleaner drops records without a key
        latest = offsets.get(rec.key, -1)
        if rec.offset < latest:
            continue  # a later record has this key
        if rec.value is None:
            if expired:
                continue  # a tombstone past its delete horizon
            tombstones = True
        kept.append(rec)
    result.records_removed += len(records) - len(kept)
    if tombstones:
        if horizon is None:
            horizon = horizon_new
        if result.delete_horizon is None or horizon < result.delete_horizon:
            result.delete_horizon = horizon
    if len(kept) == len(records) and not (tombstones and not h.has_delete_horizon):
        return data, True  # nothing removed and no horizon to stamp: the original bytes
    if not kept:
        if h.producer_id >= 0 and producer_last.get(h.producer_id) == h.last_offset:
            return encode_batch(h, [], None), False  # keep the producer's sequence state
        return None, False
    return encode_batch(h, kept, horizon if tombstones else None), False


# ==========================================================================================
# the cleaner of one data dir
# ==========================================================================================
@dataclass
class PartitionCleanerState:
    delete_horizon: int | None = 0  # 0: unknown since start (one pass finds out); None: no tombstone kept


@dataclass
class LogCleaner:
    """The checkpoints, per-partition state and totals of one data dir's cleaner. Each
    :meth:`clean` may run in a worker thread; one partition at a time per caller."""

    data_dir: Path
    max_map_bytes: int = DEFAULT_MAX_MAP_BYTES
    checkpoints: dict[tuple[str, int], int] = field(default_factory=dict)
    states: dict[tuple[str, int], PartitionCleanerState] = field(default_factory=dict)
    runs: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_removed: int = 0

    @classmethod
    def open(cls, data_dir: Path | str, max_map_bytes: int = DEFAULT_MAX_MAP_BYTES) -> "LogCleaner":
        d = Path(data_dir)
        return cls(d, max_map_bytes, read_checkpoints(d))

    def dirty_ratio(self, key: tuple[str, int], plog: PartitionLog, now_ms: int) -> CleanableRange:
        """The clean/dirty sections now (what ``kcli topics describe`` shows)."""
        config = plog.config
        snap = plog.cleaning_snapshot()
        try:
            return cleanable_range(snap, self.checkpoints.get(key), config.min_compaction_lag_ms,
                                   config.max_compaction_lag_ms, now_ms)
        finally:
            snap.close()

    def clean(self, key: tuple[str, int], plog: PartitionLog, now_ms: int) -> CleanResult | None:
        """One pass for one partition when it is due (ratio, max lag, or a kept tombstone's
        delete horizon passed); moves the checkpoint after a complete pass."""
        state = self.states.setdefault(key, PartitionCleanerState())
        force = state.delete_horizon is not None and now_ms >= state.delete_horizon
        result = clean_log(plog, self.checkpoints.get(key), now_ms, force=force, max_map_bytes=self.max_map_bytes)
        if result is None:
            return None
        self.runs += 1
        self.bytes_read += result.bytes_read
        self.bytes_written += result.bytes_written
        self.records_removed += result.records_removed
        if not result.aborted:
            state.delete_horizon = result.delete_horizon
            self.checkpoints[key] = result.end_offset
            self._persist()
        return result

    def forget(self, keep: set[tuple[str, int]]) -> None:
        """Drop the state of partitions no longer here (deleted topics)."""
        gone = [k for k in self.checkpoints if k not in keep]
        for k in list(self.states):
            if k not in keep:
                del self.states[k]
        if gone:
            for k in gone:
                del self.checkpoints[k]
            self._persist()

    def _persist(self) -> None:
        write_checkpoints(self.data_dir, self.checkpoints)


__all__ = [
    "CHECKPOINT_FILE",
    "CleanResult",
    "CleanableRange",
    "LogCleaner",
    "clean_log",
    "cleanable_range",
    "encode_batch",
    "filter_batch",
    "read_checkpoints",
    "write_checkpoints",
]
