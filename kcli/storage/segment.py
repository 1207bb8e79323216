"""One log segment: ``<base>.log`` with its ``<base>.index`` and ``<base>.timeindex``.

File names are Kafka's: the base offset zero-padded to 20 digits. The ``.log`` file holds v2
record batches exactly as they go over the wire (offsets and leader epoch already assigned),
so Kafka's own tools can read it. Index entries are added the way Kafka's LogSegment does:
before a batch, if more than ``index.interval.bytes`` were written since the last entry, the
offset index gets (that batch's last offset, its position) and the time index gets the
largest timestamp so far if it grew. Recovery rebuilds with the same rule, so a rebuilt index
equals the one appends produced.

Reads go through ``os.pread`` on the segment's fd: headers are read in small blocks, and the
returned records are one slice of the file (one copy, kernel to bytes).
"""

from __future__ import annotations

import logging
import mmap
import os
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from kcli.records.batch import HEADER_SIZE, BatchHeader, InvalidBatchError, crc_is_valid, read_header
from kcli.storage.errors import CORRUPT_MESSAGE, KAFKA_STORAGE_ERROR, LogError
from kcli.storage.index import INT32_MAX, NO_TIMESTAMP, IndexCorrupt, OffsetIndex, TimeIndex, _write_all
from kcli.storage.log_config import LogConfig

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
_SCAN_BLOCK = 8192  # bytes read per pread while walking batch headers

log = logging.getLogger(__name__)

# (position of the batch in the appended buffer, last offset, size, max timestamp)
Placement = tuple[int, int, int, int]


def segment_name(base_offset: int) -> str:
    """Kafka's file name stem: the base offset as 20 zero-padded digits."""
    return f"{base_offset:020d}"


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What other features (tiered upload, dump tools) need to know about one segment."""

    base_offset: int
    next_offset: int
    size: int
    max_timestamp: int
    log_path: Path
    index_path: Path
    timeindex_path: Path
    is_active: bool


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    truncated_bytes: int
    reason: str | None
    rebuilt_offset_index: bool
    rebuilt_time_index: bool


class Segment:
    """An open segment. Not thread-safe: PartitionLog serialises access."""

    def __init__(self, directory: Path, base_offset: int, config: LogConfig, *, created_ms: int, create: bool) -> None:
        self.base_offset = base_offset
        stem = segment_name(base_offset)
        self.log_path = directory / (stem + LOG_SUFFIX)
        self.index_path = directory / (stem + INDEX_SUFFIX)
        self.timeindex_path = directory / (stem + TIMEINDEX_SUFFIX)
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | (os.O_EXCL if create else 0)
        self.fd = os.open(self.log_path, flags, 0o644)
        self.size = os.fstat(self.fd).st_size
        self.index_interval = config.index_interval_bytes
        self.offset_index = OffsetIndex(self.index_path, base_offset, config.segment_index_bytes)
        self.time_index = TimeIndex(self.timeindex_path, base_offset, config.segment_index_bytes)
        self.next_offset = base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = base_offset
        self.rolling_timestamp: int | None = None  # first batch's max timestamp (time-based roll)
        self.created_ms = created_ms
        self.bytes_since_last_index_entry = 0
        if create:
            # Kafka creates the index files with the segment; empty is what it trims them to.
            self.offset_index.set_entries(array("i"), array("i"), write=True)
            self.time_index.set_entries(array("q"), array("i"), write=True)

    # -- recovery --------------------------------------------------------------------------
    def recover(self, *, check_crc: bool, on_batch: Callable[[BatchHeader], None] | None = None) -> RecoveryResult:
        """Walk every batch header (and CRC if ``check_crc``), cut a torn or corrupt tail,
        keep the index files if they are right for the valid batches or rewrite them, and
        set next offset / max timestamp. ``on_batch`` sees each valid batch in order."""
        base = self.base_offset
        old_offsets = _parse_or_none(OffsetIndex.parse, self.offset_index.read_file())
        old_times = _parse_or_none(TimeIndex.parse, self.time_index.read_file())
        # Rebuild into fresh in-memory indexes with the append rule, checking the old ones as we go.
        fresh_offsets = OffsetIndex(self.index_path, base, self.offset_index.max_entries * OffsetIndex.entry_size)
        fresh_times = TimeIndex(self.timeindex_path, base, self.time_index.max_entries * TimeIndex.entry_size)
        fresh_offsets.set_entries(array("i"), array("i"), write=False)
        fresh_times.set_entries(array("q"), array("i"), write=False)
        self.offset_index.close()
        self.time_index.close()
        self.offset_index, self.time_index = fresh_offsets, fresh_times
        self.max_timestamp, self.offset_of_max_timestamp = NO_TIMESTAMP, base
        self.bytes_since_last_index_entry = 0
        self.rolling_timestamp = None

        # The time index only has to be right (a restart adds Kafka's sealing entry that a
        # rebuild would not have); the offset index must equal the rebuild, so a missing or
        # sparser one is replaced too.
        times_ok = old_times is not None and self.timeindex_path.exists()
        t_ts, t_rel = old_times if old_times is not None else (array("q"), array("i"))
        ti = 0
        next_offset = base
        size = self.size
        pos = 0
        reason: str | None = None
        mm = mmap.mmap(self.fd, size, access=mmap.ACCESS_READ) if size else None
        try:
            while pos < size:
                if size - pos < HEADER_SIZE:
                    reason = f"{size - pos} trailing bytes are not a batch header"
                    break
                try:
                    h = read_header(mm, pos)  # type: ignore[arg-type]
                except InvalidBatchError as exc:
                    reason = str(exc)
                    break
                if pos + h.size > size:
                    reason = f"batch at position {pos} needs {h.size} bytes, {size - pos} remain"
                    break
                last = h.last_offset
                if h.base_offset < next_offset or h.last_offset_delta < 0 or last - base > INT32_MAX:
                    reason = f"batch at position {pos} has offsets {h.base_offset}..{last} out of order"
                    break
                if check_crc and not crc_is_valid(mm, h):  # type: ignore[arg-type]
                    reason = f"batch at position {pos} (offset {h.base_offset}) fails its CRC"
                    break
                if self.rolling_timestamp is None:
                    self.rolling_timestamp = h.max_timestamp
                self._index_batch(pos, last, h.size, h.max_timestamp)
                if times_ok and ti < len(t_ts):
                    entry_offset = t_rel[ti] + base
                    if entry_offset < last:
                        times_ok = False  # no batch ends at that offset
                    elif entry_offset == last:
                        times_ok = t_ts[ti] == self.max_timestamp
                        ti += 1
                if on_batch is not None:
                    on_batch(h)
                next_offset = last + 1
                pos += h.size
        finally:
            if mm is not None:
                mm.close()
        times_ok = times_ok and ti == len(t_ts)

        truncated = size - pos
        if truncated:
            log.warning("%s: truncating %d bytes at position %d: %s", self.log_path, truncated, pos, reason)
            os.ftruncate(self.fd, pos)
            self.size = pos
        self.next_offset = next_offset
        # A closed segment's time index ends with its max timestamp (Kafka does this on recover too).
        self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp, skip_full_check=True)
        rel, positions = self.offset_index._arrays()
        offsets_ok = old_offsets is not None and old_offsets == (rel, positions) and self.index_path.exists()
        self.offset_index.set_entries(rel, positions, write=not offsets_ok)
        if times_ok:
            self.time_index.set_entries(t_ts, t_rel, write=False)
        else:
            ts, rel = self.time_index._arrays()
            self.time_index.set_entries(ts, rel, write=True)
        last_entry = self.offset_index.last_entry()
        self.bytes_since_last_index_entry = self.size - (last_entry[1] if last_entry else 0)
        return RecoveryResult(truncated, reason, not offsets_ok, not times_ok)

    # -- appends ---------------------------------------------------------------------------
    def append(self, buf: bytearray, placements: list[Placement]) -> None:
        """Write already-validated batches with one write, then index them."""
        start = self.size
        try:
            _write_all(self.fd, buf)
        except OSError as exc:
            _truncate_quietly(self.fd, start)
            raise LogError(KAFKA_STORAGE_ERROR, f"write to {self.log_path} failed: {exc}") from exc
        if start == 0 and placements:
            self.rolling_timestamp = placements[0][3]
        for rel_pos, last, size, max_ts in placements:
            self._index_batch(start + rel_pos, last, size, max_ts)
        self.size = start + len(buf)
        self.next_offset = placements[-1][1] + 1
        try:
            self.offset_index.write_pending()
            self.time_index.write_pending()
        except OSError as exc:  # the log write stands; a bad index is rebuilt on open
            log.warning("%s: index write failed: %s", self.log_path, exc)

    def _index_batch(self, position: int, last_offset: int, size: int, max_timestamp: int) -> None:
        """Kafka's LogSegment rule for one batch (shared by append and recovery)."""
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = last_offset
        if self.bytes_since_last_index_entry > self.index_interval:
            if not self.offset_index.is_full():
                self.offset_index.append(last_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self.bytes_since_last_index_entry = 0
        self.bytes_since_last_index_entry += size

    def time_waited_for_roll(self, now_ms: int, message_timestamp: int) -> int:
        """Kafka's rule: the new batch's timestamp minus the first batch's, or wall time since
        the segment was created/opened when the first batch has no timestamp."""
        if self.rolling_timestamp is None and self.size >= HEADER_SIZE:
            self.rolling_timestamp = read_header(os.pread(self.fd, HEADER_SIZE, 0)).max_timestamp
        ts = self.rolling_timestamp if self.rolling_timestamp is not None else NO_TIMESTAMP
        if ts >= 0:
            return message_timestamp - ts
        return now_ms - self.created_ms

    def on_become_inactive(self) -> None:
        """Seal the segment at roll/close: final max-timestamp entry, pending index bytes out,
        index fds closed (Kafka's onBecomeInactiveSegment)."""
        self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp, skip_full_check=True)
        self.offset_index.write_pending()
        self.time_index.write_pending()
        self.offset_index.close()
        self.time_index.close()

    def unload_indexes(self) -> None:
        self.offset_index.unload()
        self.time_index.unload()

    # -- reads -----------------------------------------------------------------------------
    def headers_from(self, position: int, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of each batch from ``position`` (a batch boundary) to ``end``."""
        end = self.size if end is None else end
        block = b""
        block_start = position
        pos = position
        while end - pos >= HEADER_SIZE:
            rel = pos - block_start
            if rel + HEADER_SIZE > len(block):
                block = os.pread(self.fd, _SCAN_BLOCK, pos)
                block_start, rel = pos, 0
                if len(block) < HEADER_SIZE:
                    return
            try:
                header = read_header(block, rel)
            except InvalidBatchError as exc:
                raise LogError(CORRUPT_MESSAGE, f"{self.log_path} position {pos}: {exc}") from exc
            yield pos, header
            pos += header.size

    def find_batch(self, offset: int) -> tuple[int, BatchHeader] | None:
        """The first batch whose last offset is >= ``offset`` (the batch containing it)."""
        _, start = self.offset_index.lookup(offset)
        for pos, header in self.headers_from(start):
            if header.last_offset >= offset:
                return pos, header
        return None

    def read(self, offset: int, max_bytes: int, min_one_batch: bool, upper_bound: int) -> tuple[bytes, int, int] | None:
        """Whole batches from the one containing ``offset``: at most ``max_bytes`` (but the
        first batch regardless if ``min_one_batch``), only batches ending below
        ``upper_bound``. Returns (records, file position, next offset after them), or None
        when the segment has nothing at or after ``offset``."""
        found = self.find_batch(offset)
        if found is None:
            return None
        start, first = found
        if first.last_offset >= upper_bound or (first.size > max_bytes and not min_one_batch):
            return b"", start, offset
        end = start + first.size
        next_offset = first.last_offset + 1
        limit = start + max_bytes
        # Jump over whole batches with the index instead of walking every header.
        entry = self.offset_index.floor_entry(limit, upper_bound)
        scan_from = end
        if entry is not None and entry[1] > end:
            scan_from = entry[1]
        for pos, header in self.headers_from(scan_from):
            if pos + header.size > limit or header.last_offset >= upper_bound:
                if pos > end:  # jumped: batches up to ``pos`` are whole and below the bound
                    end, next_offset = pos, header.base_offset
                break
            end, next_offset = pos + header.size, header.last_offset + 1
        return os.pread(self.fd, end - start, start), start, next_offset

    def read_batch(self, position: int, size: int) -> bytes:
        return os.pread(self.fd, size, position)

    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int) -> tuple[int, int] | None:
        """First record with timestamp >= ``timestamp`` and offset >= ``starting_offset``
        (Kafka's LogSegment.findOffsetByTimestamp; records are decoded only in the one batch
        that holds the answer)."""
        _, indexed_offset = self.time_index.lookup(timestamp)
        _, start = self.offset_index.lookup(max(indexed_offset, starting_offset))
        for pos, header in self.headers_from(start):
            if header.max_timestamp >= timestamp and header.last_offset >= starting_offset:
                for rec_offset, rec_ts in iter_record_timestamps(self.read_batch(pos, header.size)):
                    if rec_ts >= timestamp and rec_offset >= starting_offset:
                        return rec_offset, rec_ts
        return None

    def largest_timestamp(self) -> int:
        """Max timestamp, or the file's mtime when no batch has one (Kafka's retention rule)."""
        if self.max_timestamp >= 0:
            return self.max_timestamp
        return int(os.fstat(self.fd).st_mtime * 1000)

    # -- lifecycle -------------------------------------------------------------------------
    def info(self, *, is_active: bool) -> SegmentInfo:
        return SegmentInfo(
            self.base_offset,
            self.next_offset,
            self.size,
            self.max_timestamp,
            self.log_path,
            self.index_path,
            self.timeindex_path,
            is_active,
        )

    def close(self) -> None:
        self.offset_index.close()
        self.time_index.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def delete_files(self) -> None:
        """Close and remove the files; indexes first so a crash midway leaves a log file
        whose indexes are simply rebuilt."""
        self.close()
        for path in (self.index_path, self.timeindex_path, self.log_path):
            try:
                path.unlink()
            except FileNotFoundError:
                pass


def iter_record_timestamps(batch: bytes) -> Iterator[tuple[int, int]]:
    """(offset, timestamp) of every record in one batch, decoded with aiokafka's compiled
    record module (handles compression and LogAppendTime)."""
    from aiokafka.record.default_records import DefaultRecordBatch

    try:
        for record in DefaultRecordBatch(batch):
            yield record.offset, record.timestamp
    except Exception as exc:  # aiokafka raises its own CorruptRecordException / codec errors
        raise LogError(CORRUPT_MESSAGE, f"cannot decode record batch: {exc}") from exc


def _parse_or_none(parse: Callable[[bytes], tuple[array, array]], data: bytes) -> tuple[array, array] | None:
    try:
        return parse(data)
    except IndexCorrupt:
        return None


def _truncate_quietly(fd: int, size: int) -> None:
    try:
        os.ftruncate(fd, size)
    except OSError:
        pass
