"""One log segment: ``<base>.log`` with its ``<base>.index`` and ``<base>.timeindex``.

File names are Kafka's: the base offset zero-padded to 20 digits. The ``.log`` file holds v2
record batches exactly as they go over the wire (offsets and leader epoch already assigned),
so Kafka's own tools can read it. Index entries are added the way Kafka's LogSegment does:
before a batch, if more than ``index.interval.bytes`` were written since the last entry, the
offset index gets (that batch's last offset, its position) and the time index gets the
largest timestamp so far if it grew. Recovery rebuilds with the same rule, so a rebuilt index
equals the one appends produced.

Reads go through ``os.pread`` on the segment's fd: headers are read in small blocks, and the
returned records are one slice of the file (one copy, kernel to bytes), CRC-checked before they
are served. A failing write logs its path and OS error once per failure streak.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from crc32c import crc32c

from kio.schema.errors import ErrorCode

from kcli.fsutil import fsync_dir
from kcli.records.batch import (
    HEADER_SIZE,
    BatchHeader,
    InvalidBatchError,
    crc_is_valid,
    read_header,
)
from kcli.storage.errors import LogError
from kcli.storage.index import (
    INT32_MAX,
    NO_TIMESTAMP,
    IndexCorrupt,
    OffsetIndex,
    TimeIndex,
    _write_all,
)
from kcli.storage.log_config import LogConfig

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
TXNINDEX_SUFFIX = ".txnindex"  # aborted transactions whose ABORT marker is in the segment (kcli/storage/log.py)
CLEANED_SUFFIX = ".cleaned"  # ``<base>.log.cleaned``: the log cleaner's output being written
SWAP_SUFFIX = ".swap"  # ``<base>.log.swap``: a complete cleaned segment being swapped in
_SCAN_BLOCK = 8192  # bytes read per pread while walking batch headers
_COPY_CHUNK = 1 << 20  # bytes per pread when copying a cut tail aside
# baseOffset, batchLength, (epoch), magic, crc, (attributes), lastOffsetDelta of a v2 header
_FETCH_CHECK = struct.Struct(">qi4xbI2xi")

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
    txnindex_path: Path | None = None  # aborted transactions whose marker is in the segment, if any


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    truncated_bytes: int
    reason: str | None
    rebuilt_offset_index: bool
    rebuilt_time_index: bool
    aside_path: Path | None = None  # where the cut bytes went (``<segment>.log.truncated-<ms>``)
    damaged_at: int = -1  # first damaged byte kept in place (below the recovery point), or -1


TRUNCATED_MARK = ".truncated-"  # ``<base>.log.truncated-<epoch ms>``: bytes recovery moved aside


class Segment:
    """An open segment. Not thread-safe: PartitionLog serialises access."""

    def __init__(self, directory: Path, base_offset: int, config: LogConfig, *, created_ms: int, create: bool) -> None:
        self.base_offset = base_offset
        stem = segment_name(base_offset)
        self.log_path = directory / (stem + LOG_SUFFIX)
        self.index_path = directory / (stem + INDEX_SUFFIX)
        self.timeindex_path = directory / (stem + TIMEINDEX_SUFFIX)
        self.txnindex_path = directory / (stem + TXNINDEX_SUFFIX)
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | (os.O_EXCL if create else 0)
        try:
            self.fd = os.open(self.log_path, flags, 0o644)
        except OSError as exc:
            log.error("%s: cannot open segment: %s", self.log_path, exc)
            raise
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
        # Offsets between batches may be missing: the log cleaner removed them (a cleaned
        # segment, kcli.storage.cleaner). Appends alone write contiguous offsets.
        self.has_gaps = False
        self._write_failing = False  # log a failing write once per failure streak, not per append
        self._index_failing = False
        if create:
            # Kafka creates the index files with the segment; empty is what it trims them to.
            try:
                self.offset_index.set_entries(array("i"), array("i"), write=True)
                self.time_index.set_entries(array("q"), array("i"), write=True)
            except OSError as exc:
                log.error("%s: cannot create the segment's index files: %s", self.index_path, exc)
                self.close()
                raise

    # -- recovery --------------------------------------------------------------------------
    def recover(
        self,
        *,
        verify_from: int,
        end_offset: int = -1,
        on_batch: Callable[[BatchHeader], None] | None = None,
        now_ms: int = 0,
        allow_gaps: bool = False,
    ) -> RecoveryResult:
        """Walk every batch header, keep the index files if they are right for the batches or
        rewrite them, and set next offset / max timestamp. ``on_batch`` sees each batch in order.

        Batches whose last offset is >= ``verify_from`` (the recovery point) were never
        fsynced, so they are CRC-checked and a torn or corrupt tail from the first bad one is
        cut and moved aside to ``<segment>.log.truncated-<now_ms>`` (never just deleted).
        Batches wholly below it are trusted: never CRC-checked, never cut. If one of their
        headers is impossible, the walk resumes at the next intact batch (found by its magic
        byte and CRC) and the damaged bytes stay where they are: a read of them answers
        CORRUPT_MESSAGE. ``end_offset`` (>= 0) is the segment's known end offset (the next
        segment's base; for the last segment the recovery point), used when damage with no
        intact batch after it hides the true end.

        ``allow_gaps``: the segment is not the last one (``end_offset`` is the next segment's
        base), so a batch may start above the expected offset, as after the log cleaner
        removed whole batches, provided it ends below ``end_offset``; the last segment, which
        the cleaner never rewrites, must stay contiguous."""
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
        damaged_at = -1
        aside: Path | None = None
        mm = mmap.mmap(self.fd, size, access=mmap.ACCESS_READ) if size else None
        try:
            while pos < size:
                trusted = next_offset < verify_from  # the batch here starts below the recovery point
                problem: str | None = None
                h: BatchHeader | None = None
                if size - pos < HEADER_SIZE:
                    problem = f"{size - pos} trailing bytes are not a batch header"
                else:
                    try:
                        h = read_header(mm, pos)  # type: ignore[arg-type]
                    except InvalidBatchError as exc:
                        problem = str(exc)
                if h is not None and problem is None:
                    last = h.last_offset
                    if pos + h.size > size:
                        problem = f"batch at position {pos} needs {h.size} bytes, {size - pos} remain"
                    elif (
                        h.base_offset < next_offset
                        or (h.base_offset > next_offset and not (allow_gaps and 0 <= last < end_offset))
                        or h.last_offset_delta < 0
                        or last - base > INT32_MAX
                    ):
                        # kcli writes contiguous offsets; the base offset is outside the CRC
                        problem = f"batch at position {pos} has offsets {h.base_offset}..{last}, {next_offset} expected"
                    else:
                        trusted = last < verify_from  # wholly below the recovery point
                    if problem is None and not trusted and not crc_is_valid(mm, h):  # type: ignore[arg-type]
                        problem = f"batch at position {pos} (offset {h.base_offset}) fails its CRC"
                if problem is not None:
                    if not trusted:
                        reason = problem
                        break
                    resume = _find_intact_batch(mm, pos + 1, size, next_offset, base)  # type: ignore[arg-type]
                    if damaged_at < 0:
                        damaged_at = pos
                    log.warning(
                        "%s: damaged batch at position %d below the recovery point (%s); kept in place, %s",
                        self.log_path, pos, problem,
                        f"intact batches resume at position {resume}" if resume is not None else "no intact batch follows",
                    )
                    if resume is None:
                        pos = size
                        break
                    pos = resume
                    next_offset = read_header(mm, pos).base_offset  # type: ignore[arg-type]  # offsets in the damage stay taken
                    self.bytes_since_last_index_entry = self.index_interval + 1  # index the resumed batch
                    continue
                assert h is not None
                if self.rolling_timestamp is None:
                    self.rolling_timestamp = h.max_timestamp
                if h.base_offset != next_offset:
                    self.has_gaps = True
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
            truncated = size - pos
            if truncated:
                aside = self._move_tail_aside(mm, pos, next_offset, reason or "", now_ms)  # type: ignore[arg-type]
        finally:
            if mm is not None:
                mm.close()
        times_ok = times_ok and ti == len(t_ts)

        if truncated:
            try:
                os.ftruncate(self.fd, pos)
            except OSError as exc:
                log.error("%s: cannot truncate to %d bytes: %s", self.log_path, pos, exc)
                raise
            self.size = pos
        if damaged_at >= 0 and end_offset > next_offset:
            next_offset = end_offset  # damage hid the last batches' headers; their offsets stay taken
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
        return RecoveryResult(truncated, reason, not offsets_ok, not times_ok, aside, damaged_at)

    def _move_tail_aside(self, mm: mmap.mmap, pos: int, first_offset: int, reason: str, now_ms: int) -> Path:
        """Copy bytes ``pos..`` to ``<segment>.log.truncated-<ms>`` (fsynced) before the cut,
        with one WARNING naming the file, bytes and offsets. A failure raises: no cut then."""
        length = len(mm) - pos
        last = _last_offset_hint(mm, pos)
        offsets = f"offsets {first_offset}..{last}" if last is not None and last >= first_offset else f"offsets from {first_offset}"
        target = write_aside(self.log_path, self.fd, pos, length, now_ms)
        log.warning(
            "%s: recovery cut %d bytes at position %d (%s; %s) and moved them to %s",
            self.log_path, length, pos, offsets, reason, target.name,
        )
        return target

    # -- appends ---------------------------------------------------------------------------
    def append(self, buf: bytearray, placements: list[Placement]) -> None:
        """Write already-validated batches with one write, then index them."""
        start = self.size
        try:
            _write_all(self.fd, buf)
        except OSError as exc:
            _truncate_quietly(self.fd, start)
            if not self._write_failing:
                self._write_failing = True
                log.error("%s: append of %d bytes failed: %s", self.log_path, len(buf), exc)
            raise LogError(ErrorCode.kafka_storage_error, f"write to {self.log_path} failed: {exc}") from exc
        if self._write_failing:
            self._write_failing = False
            log.info("%s: appends succeed again", self.log_path)
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
            if not self._index_failing:
                self._index_failing = True
                log.warning("%s: index write failed: %s", self.index_path, exc)
        else:
            self._index_failing = False

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
        try:
            self.offset_index.write_pending()
            self.time_index.write_pending()
        except OSError as exc:  # as in append: the log stands, open rebuilds a wrong index
            log.error("%s: cannot write the index of the sealed segment: %s", self.index_path, exc)
        finally:
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
                raise LogError(ErrorCode.corrupt_message, f"{self.log_path} position {pos}: {exc}") from exc
            yield pos, header
            pos += header.size

    def find_batch(self, offset: int) -> tuple[int, BatchHeader] | None:
        """The first batch whose last offset is >= ``offset`` (the batch containing it)."""
        _, start = self.offset_index.lookup(offset)
        found: tuple[int, BatchHeader] | None = None
        damage: LogError | None = None
        try:
            for pos, header in self.headers_from(start):
                if header.last_offset >= offset:
                    found = pos, header
                    break
        except LogError as exc:
            damage = exc
        if damage is None and (found is None or found[1].base_offset <= offset or offset < self.base_offset):
            return found
        # Damage kept in place (an impossible header, or a base offset that is not the one
        # expected) lies between the index entry and ``offset``: recovery indexed the batch
        # where its walk resumed, so the batch holding ``offset`` may lie beyond it.
        after = self.offset_index.ceiling_entry(offset)
        if after is not None and after[1] > (found[0] if found is not None else start):
            try:
                header = read_header(os.pread(self.fd, HEADER_SIZE, after[1]))
            except InvalidBatchError:
                header = None
            if header is not None and header.base_offset <= offset <= header.last_offset:
                return after[1], header
        if damage is not None:
            raise damage
        return found  # read() reports that no intact batch holds ``offset``

    def read(self, offset: int, max_bytes: int, min_one_batch: bool, upper_bound: int) -> tuple[bytes, int, int] | None:
        """Whole batches from the one containing ``offset``: at most ``max_bytes`` (but the
        first batch regardless if ``min_one_batch``), only batches ending below
        ``upper_bound``. Returns (records, file position, next offset after them), or None
        when the segment has nothing at or after ``offset``."""
        found = self.find_batch(offset)
        if found is None:
            return None
        start, first = found
        if self.base_offset <= offset < first.base_offset and not self.has_gaps:
            # Offsets are contiguous within a segment: the batch holding ``offset`` is before
            # ``start`` and its header (base offset, outside the CRC) is damaged.
            raise LogError(ErrorCode.corrupt_message, f"{self.log_path} position {start}: no intact batch holds offset {offset}")
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
        try:
            for pos, header in self.headers_from(scan_from):
                if pos + header.size > limit or header.last_offset >= upper_bound:
                    if pos > end:  # jumped: batches up to ``pos`` are whole and below the bound
                        end, next_offset = pos, header.base_offset
                    break
                end, next_offset = pos + header.size, header.last_offset + 1
        except LogError:
            pass  # an impossible header further on: serve what precedes it; a fetch from it reports it
        data = os.pread(self.fd, end - start, start)
        good, good_next, problem = _intact_prefix(data, self.has_gaps)
        if problem is not None:
            if good == 0:
                raise LogError(ErrorCode.corrupt_message, f"{self.log_path} position {start}: {problem}")
            data, next_offset = data[:good], good_next  # serve what is intact; the next fetch reports the rest
        return data, start, next_offset

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
            self.txnindex_path,
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
        for path in (self.txnindex_path, self.index_path, self.timeindex_path, self.log_path):
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
        raise LogError(ErrorCode.corrupt_message, f"cannot decode record batch: {exc}") from exc


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


def _intact_prefix(data: bytes, allow_gaps: bool = False) -> tuple[int, int, str | None]:
    """(length, next offset, problem) of the leading whole batches of ``data`` whose header
    is possible and whose CRC-32C holds: what a fetch may serve (a consumer would reject a
    corrupt batch anyway; the broker says CORRUPT_MESSAGE and where). Hot path: only the
    fields needed are unpacked (about 1 us a batch plus CRC-32C at ~30 GB/s)."""
    pos = 0
    next_offset = -1
    end = len(data)
    view = memoryview(data)
    unpack = _FETCH_CHECK.unpack_from
    while pos < end:
        if end - pos < HEADER_SIZE:
            return pos, next_offset, f"{end - pos} bytes are not a batch header"
        base_offset, length, magic, crc, last_delta = unpack(data, pos)
        size = length + 12
        if magic != 2 or length < HEADER_SIZE - 12:
            return pos, next_offset, f"impossible batch header (magic {magic}, length {length})"
        if pos + size > end:
            return pos, next_offset, f"batch at offset {base_offset} claims {size} bytes, {end - pos} stored"
        if next_offset >= 0 and (base_offset < next_offset or (base_offset > next_offset and not allow_gaps)):
            # appends write contiguous offsets; only a cleaned segment has gaps
            return pos, next_offset, f"batch has base offset {base_offset}, {next_offset} expected"
        if crc32c(view[pos + 21 : pos + size]) != crc:
            return pos, next_offset, f"batch at offset {base_offset} fails its CRC-32C check"
        next_offset = base_offset + last_delta + 1
        pos += size
    return pos, next_offset, None


def _find_intact_batch(mm: mmap.mmap, start: int, size: int, min_offset: int, base: int) -> int | None:
    """Position of the first batch at or after ``start`` that is whole, CRC-valid and has
    offsets in order after ``min_offset``: where a header walk resumes after damage. A
    candidate needs the v2 magic byte, so this looks at roughly one position in 256."""
    pos = start
    while True:
        magic_at = mm.find(b"\x02", pos + 16)
        if magic_at < 0:
            return None
        pos = magic_at - 16
        if size - pos < HEADER_SIZE:
            return None
        try:
            h = read_header(mm, pos)
        except InvalidBatchError:
            pos += 1
            continue
        if (
            pos + h.size <= size
            and h.base_offset >= min_offset
            and h.last_offset_delta >= 0
            and h.last_offset - base <= INT32_MAX
            and crc_is_valid(mm, h)
        ):
            return pos
        pos += 1


def _last_offset_hint(data: mmap.mmap, pos: int) -> int | None:
    """Best-effort last offset of the batches from ``pos`` on, the bytes being cut (headers only)."""
    last = None
    while len(data) - pos >= HEADER_SIZE:
        try:
            h = read_header(data, pos)
        except InvalidBatchError:
            break
        last = h.last_offset
        if pos + h.size > len(data):
            break
        pos += h.size
    return last


def swap_next_offset(path: Path, base_offset: int) -> int:
    """The offset after the last whole batch of a (cleaned) segment file: where the range of
    segments a ``.swap`` replaces ends. ``base_offset`` when it holds no batch."""
    end = base_offset
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        pos = 0
        while size - pos >= HEADER_SIZE:
            try:
                h = read_header(os.pread(fd, HEADER_SIZE, pos))
            except InvalidBatchError:
                break
            if pos + h.size > size:
                break
            end = h.last_offset + 1
            pos += h.size
    finally:
        os.close(fd)
    return end


def aside_path(log_path: Path, now_ms: int) -> Path:
    """A fresh ``<log>.truncated-<ms>`` name next to ``log_path`` (the ms bumped on a clash)."""
    stamp = now_ms
    while True:
        candidate = log_path.with_name(f"{log_path.name}{TRUNCATED_MARK}{stamp}")
        if not candidate.exists():
            return candidate
        stamp += 1


def write_aside(log_path: Path, src_fd: int, start: int, length: int, now_ms: int) -> Path:
    """Copy ``length`` bytes at ``start`` of ``src_fd`` durably to a fresh
    ``<log>.truncated-<ms>`` file (via ``.tmp``, which start-up removes, so a crash midway
    leaves no half file under the real name)."""
    target = aside_path(log_path, now_ms)
    tmp = target.with_name(target.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            done = 0
            while done < length:
                chunk = os.pread(src_fd, min(_COPY_CHUNK, length - done), start + done)
                if not chunk:
                    raise OSError(f"segment ended {length - done} bytes early")
                _write_all(fd, chunk)
                done += len(chunk)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except OSError as exc:
        log.error("%s: cannot write %s: %s", log_path, tmp.name, exc)
        try:
            tmp.unlink()
        except OSError:
            pass
        raise LogError(ErrorCode.kafka_storage_error, f"cannot move damaged bytes of {log_path} aside: {exc}") from exc
    return target


def move_aside(log_path: Path, now_ms: int) -> Path:
    """Rename a whole segment file to ``<log>.truncated-<ms>`` (its indexes are derived data
    and may simply be deleted by the caller)."""
    target = aside_path(log_path, now_ms)
    try:
        os.rename(log_path, target)
        fsync_dir(target.parent)
    except OSError as exc:
        log.error("%s: cannot rename to %s: %s", log_path, target.name, exc)
        raise LogError(ErrorCode.kafka_storage_error, f"cannot move {log_path} aside: {exc}") from exc
    return target

