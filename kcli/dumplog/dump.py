"""``dump_file``: everything dump-log does for one file, as a pure function of (source, options).

No globals, no printing: text goes to ``emit`` (streaming, for the CLI) or into the returned
FileResult (for a Spark/process-pool map over many objects). Stderr material is returned as
``errors`` (one-line problems; each makes the file invalid) and ``reports`` (Kafka's end-of-run
blocks such as "Mismatches in :FILE", and Kafka's "Ignoring unknown file FILE", which is not a
failure).

With deep iteration, big local log/WAL files are cut at batch boundaries and the ranges dumped
by worker processes (``DumpOptions.jobs``); output order and content are the same as a serial run.
"""

from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from aiokafka.record._crecords import DefaultRecordBatch

import kcli.dumplog.decoders as decoders
from kcli.dumplog.annotate import BatchLookup, FileAnnotations, MetadataSourceError, annotations_for
from kcli.dumplog.batchlines import scan_batch_lines
from kcli.dumplog.detect import Detection, Kind, UnsupportedWalVersion, detect
from kcli.dumplog.format import RecordFormatter, batch_json, batch_text
from kcli.dumplog.readers import (
    LOG_OVERHEAD,
    ScanState,
    batch_boundaries,
    header_at,
    iter_batches,
    offset_index_lookup,
    read_offset_index,
    read_time_index,
    read_txn_index,
)
from kcli.dumplog.sources import LocalSource, Source, SourceError

FLUSH_ITEMS = 2048  # lines/objects buffered before they are handed to emit
# Deep iteration buffers one text block per batch: hand them on every FLUSH_RECORDS records (or
# FLUSH_LOG_BYTES of log), so each write is a few hundred KiB. Blocks of tens of MiB (2048
# batches) cost a third of the run: fresh pages for the joined text and its encoded copy, and
# text that has left the CPU caches before it is copied out.
FLUSH_RECORDS = 2048
FLUSH_LOG_BYTES = 1 << 20
NO_TIMESTAMP = -1
PARALLEL_MIN_BYTES = 64 << 20  # smaller files are not worth a process pool
RANGE_BYTES = 16 << 20  # bytes of log per worker task

Emit = Callable[[str], None]
_encode_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode


@dataclass
class DumpOptions:
    """Kafka's DumpLogSegments options, plus kcli's WAL annotation, JSON output and parallelism."""

    deep_iteration: bool = False
    print_data_log: bool = False
    skip_record_metadata: bool = False
    max_bytes: int | None = None  # None = Kafka's default Integer.MAX_VALUE (whole file)
    key_decoder: str = "string"
    value_decoder: str = "string"
    index_sanity_check: bool = False
    verify_index_only: bool = False
    json: bool = False
    batch_lookup: BatchLookup | None = None  # object_key -> list[BatchInfo], for WAL objects
    object_key: str | None = None  # force the key used with batch_lookup
    jobs: int = 1  # worker processes for one big local log/WAL file
    parallel_min_bytes: int = PARALLEL_MIN_BYTES
    range_bytes: int = RANGE_BYTES

    @property
    def deep(self) -> bool:
        """--print-data-log implies deep iteration, as in Kafka."""
        return self.deep_iteration or self.print_data_log


@dataclass
class FileResult:
    file: str
    kind: str
    output: list[str] = field(default_factory=list)  # text (JSON lines with json=True), if not streamed
    invalid: bool = False
    bytes_read: int = 0
    batches: int = 0
    records: int = 0
    errors: list[str] = field(default_factory=list)
    reports: list[str] = field(default_factory=list)

    @property
    def lines(self) -> list[str]:
        """Text output as lines (only when not streamed)."""
        return "".join(self.output).splitlines()

    @property
    def objects(self) -> list[dict[str, Any]]:
        """JSON output as objects (only when not streamed)."""
        return [json.loads(line) for line in self.lines]


class _Out:
    """Collects lines (text) or objects (JSON) and hands them on as text in blocks."""

    def __init__(self, emit: Emit | None, json_mode: bool, kept: list[str]) -> None:
        self.emit = emit
        self.json = json_mode
        self.kept = kept
        self.buf: list[Any] = []
        self.append = self.buf.append  # stays valid: the list is cleared, never replaced

    def maybe_flush(self) -> None:
        if len(self.buf) >= FLUSH_ITEMS:
            self.flush()

    def text(self, text: str) -> None:
        """Already-rendered output (from a worker process)."""
        self.flush()
        self._send(text)

    def flush(self) -> None:
        if not self.buf:
            return
        if self.json:
            text = "\n".join(map(_encode_json, self.buf)) + "\n"
        else:
            text = "".join(self.buf)
        self.buf.clear()
        self._send(text)

    def _send(self, text: str) -> None:
        if not text:
            return
        if self.emit is not None:
            self.emit(text)
        else:
            self.kept.append(text)


def dump_file(
    source: Source,
    options: DumpOptions,
    emit: Emit | None = None,
    detection: Detection | None = None,
) -> FileResult:
    """Dump one file or object. Never raises for bad data: problems land in the result."""
    result = FileResult(file=source.name, kind=Kind.UNKNOWN.value)
    out = _Out(emit, options.json, result.output)
    header: dict[str, Any] = {"type": "file", "file": source.name}
    try:
        try:
            if detection is None:
                detection = detect(source)
        finally:
            if detection is not None:
                header["kind"] = detection.kind.value
            out.append(header if options.json else f"Dumping {source.name}\n")
        result.kind = detection.kind.value
        if detection.kind in (Kind.LOG, Kind.WAL):
            _dump_log(source, detection, options, out, result, header)
        elif detection.kind is Kind.INDEX:
            _dump_index(source, detection, options, out, result)
        elif detection.kind is Kind.TIMEINDEX:
            _dump_time_index(source, detection, options, out, result)
        elif detection.kind is Kind.TXNINDEX:
            _dump_txn_index(source, options, out, result)
        elif detection.kind is Kind.CHECKPOINT:
            _dump_checkpoint(source, options, out, result)
        elif detection.kind is Kind.KCLI_LOG:
            _dump_kcli_log(source, options, out, result)
        else:
            # Kafka's DumpLogSegments says so on stderr and goes on: not a failure (exit 0)
            result.reports.append(f"Ignoring unknown file {source.name}")
    except UnsupportedWalVersion as err:
        result.kind = header["kind"] = Kind.WAL.value  # header is still buffered: not yet sent
        header["walVersion"] = err.version
        result.errors.append(str(err))
    except SourceError as err:
        result.errors.append(str(err))
    except MemoryError:
        result.errors.append(f"out of memory while dumping {source.name}")
    out.flush()
    result.invalid = result.invalid or bool(result.errors)
    return result


# ----------------------------------------------------------------------------- log segments / WAL


@dataclass
class RangeResult:
    """What dumping one byte range of a log/WAL file found (merged across ranges)."""

    end: int = 0  # scan end position (first byte not in a complete batch)
    reason: str | None = None
    batches: int = 0
    records: int = 0
    bad_crc: bool = False
    first_bad_crc: int = -1  # position of the first batch failing its CRC (for the error line)
    errors: list[str] = field(default_factory=list)
    seen: list[int] = field(default_factory=list)  # batch positions (for WAL annotation)
    first_offset: int = -1
    last_offset: int = -1
    non_consecutive: list[tuple[int, int]] = field(default_factory=list)
    decode_errors: int = 0
    text: str = ""  # rendered output, for ranges dumped in a worker process


@dataclass
class _LogContext:
    """Everything a range scan needs; picklable so worker processes get a copy."""

    deep: bool
    json: bool
    wal: bool
    skip_metadata: bool
    print_data: bool
    key_decoder: str
    value_decoder: str
    annotations: FileAnnotations | None


def _dump_log(
    source: Source, det: Detection, opts: DumpOptions, out: _Out, result: FileResult, header: dict[str, Any]
) -> None:
    wal = det.kind is Kind.WAL
    name = source.name
    if wal:
        start = 1
        header["walVersion"] = det.wal_version
        if not opts.json:
            out.append(f"WAL segment version: {det.wal_version}\n")
    else:
        start = 0
        if det.base_offset is not None:
            header["logStartOffset"] = det.base_offset
            if not opts.json:
                out.append(f"Log starting offset: {det.base_offset}\n")
    end = source.size if opts.max_bytes is None else min(source.size, max(opts.max_bytes, 0))
    result.bytes_read = end

    annotations: FileAnnotations | None = None
    if wal and opts.batch_lookup is not None:
        try:
            annotations = annotations_for(opts.batch_lookup, source.key_candidates(), opts.object_key)
        except MetadataSourceError as err:
            result.errors.append(str(err))
        if annotations is not None and annotations.object_key is None:
            result.reports.append(
                f"No batch metadata for {name} (tried object keys: {', '.join(annotations.tried)}); "
                "every batch in it is shown as dead"
            )
    if opts.deep:
        for dec in (opts.key_decoder, opts.value_decoder):
            if dec not in decoders.DECODERS:
                result.errors.append(f"unknown decoder {dec!r} (choose from {', '.join(decoders.DECODERS)})")
                return
    ctx = _LogContext(
        deep=opts.deep,
        json=opts.json,
        wal=wal,
        skip_metadata=opts.skip_record_metadata,
        print_data=opts.print_data_log,
        key_decoder=opts.key_decoder,
        value_decoder=opts.value_decoder,
        annotations=annotations,
    )
    # Only deep iteration is CPU-bound enough to gain from workers: a batch-level scan runs near
    # memory bandwidth, and shipping its output between processes would cost more than it saves.
    if (ctx.deep and opts.jobs > 1 and isinstance(source, LocalSource)
            and end - start >= max(opts.parallel_min_bytes, 1)):
        rr = _scan_parallel(source, start, end, ctx, opts, out)
    else:
        rr = _scan_range(source, start, end, ctx, out)
    _finish_log(source, opts, ctx, rr, start, end, out, result)


def _finish_log(
    source: Source, opts: DumpOptions, ctx: _LogContext, rr: RangeResult, start: int, end: int, out: _Out,
    result: FileResult,
) -> None:
    name = source.name
    result.batches, result.records = rr.batches, rr.records
    result.errors.extend(rr.errors)
    if rr.bad_crc:
        result.invalid = True
    if rr.reason:
        result.errors.append(rr.reason)
    if rr.bad_crc:  # stdout says "isvalid: false"; stderr says where, so exit 1 is never silent
        result.errors.append(f"the batch at position {rr.first_bad_crc} of {name} fails its CRC-32C check")
    trailing = end - rr.end
    if trailing > 0 and (opts.max_bytes is None or rr.reason):
        if opts.json:
            out.append({"type": "invalidBytes", "file": name, "position": rr.end, "bytes": trailing})
        else:
            out.append(f"Found {trailing} invalid bytes at the end of {source.basename}\n")
        result.invalid = True
        if not rr.reason:  # a truncated batch: say where on stderr too (exit 1 is never silent)
            result.errors.append(f"{trailing} bytes at position {rr.end} of {name} are not a complete batch")
    ann = ctx.annotations
    if ann is not None and ann.object_key is not None:
        for off, a in ann.unmatched(rr.seen):
            if opts.max_bytes is not None and off >= end:
                continue
            result.errors.append(
                f"batch metadata for {ann.object_key} lists a {a.byte_size}-byte batch of "
                f"{a.topic}-{a.partition} at byte offset {off}, but {name} has no batch there"
            )
    if rr.non_consecutive:
        lines = [f"Non-consecutive offsets in {source.absolute()}"]
        # Kafka prepends to its list, so the most recent gap comes first.
        lines += [f"  {a} is followed by {b}" for a, b in reversed(rr.non_consecutive)]
        result.reports.append("\n".join(lines))
    if rr.decode_errors:
        result.reports.append(
            f"{rr.decode_errors} keys/values in {name} could not be decoded "
            f"(--key-decoder {opts.key_decoder}, --value-decoder {opts.value_decoder})"
        )


def _scan_range(source: Source, start: int, end: int, ctx: _LogContext, out: _Out) -> RangeResult:
    """Dump the batches in [start, end): the per-batch loop (kept lean: it bounds throughput)."""
    rr = RangeResult(end=start)
    state = ScanState(end=end, position=start)
    formatter = None
    if ctx.deep:
        pick = decoders.value_decoder if ctx.json else decoders.text_decoder
        # WAL batches keep producer offsets (each starts at 0): gaps between them mean nothing.
        formatter = RecordFormatter(ctx.skip_metadata, ctx.print_data, pick(ctx.key_decoder),
                                    pick(ctx.value_decoder), track_offsets=not ctx.wal)
    ann = ctx.annotations
    append = out.append
    buf = out.buf
    name = source.name
    position = start
    batches = records = 0
    flush_records = records + FLUSH_RECORDS
    flush_position = position + FLUSH_LOG_BYTES
    bad_crc = False
    if not ctx.deep and not ctx.json and ann is None:
        # Batch-level text, the common case: a loop of its own (kcli/dumplog/batchlines.py).
        batches, first_bad = scan_batch_lines(source, start, end, state, buf, out.flush)
        if first_bad >= 0:
            bad_crc, rr.first_bad_crc = True, first_bad
    else:
        for h, win, rel, valid in iter_batches(source, start, end, state):
            size = h[1] + LOG_OVERHEAD
            batches += 1
            if not valid and not bad_crc:
                bad_crc, rr.first_bad_crc = True, position
            extra_text = ""
            extra_json: dict[str, Any] | None = None
            if ann is not None:
                rr.seen.append(position)
                a = ann.by_offset.get(position)
                if a is None:
                    extra_text, extra_json = " dead: true", {"dead": True}
                else:
                    extra_text, extra_json = a.text(), a.json()
                    if a.byte_size != size:
                        rr.errors.append(
                            f"batch metadata for {ann.object_key} says the batch at byte offset {position} "
                            f"is {a.byte_size} bytes, but {name} has a {size}-byte batch there"
                        )
            if ctx.json:
                obj = batch_json(h, position, valid, name)
                if extra_json:
                    obj.update(extra_json)
                append(obj)
            else:
                append(batch_text(h, position, valid, extra_text))
            if formatter is not None:
                batch = win[rel : rel + size]
                try:
                    if ctx.json:
                        records += formatter.json(batch, h, name, position, buf)
                    else:
                        records += formatter.text(batch, h, buf)
                except Exception as err:  # noqa: BLE001 - aiokafka raises several types for bad bytes
                    rr.errors.append(
                        f"cannot decode the records of the batch at position {position} in {name}: {_one_line(err)}"
                    )
                del batch
            position += size
            if len(buf) >= FLUSH_ITEMS or records >= flush_records or position >= flush_position:
                out.flush()
                flush_records = records + FLUSH_RECORDS
                flush_position = position + FLUSH_LOG_BYTES
    rr.end = state.position
    rr.reason = state.reason
    rr.batches, rr.records, rr.bad_crc = batches, records, bad_crc
    if formatter is not None:
        rr.first_offset, rr.last_offset = formatter.first_offset, formatter.last_offset
        rr.non_consecutive = formatter.non_consecutive
        rr.decode_errors = formatter.decode_errors
    return rr


def _range_worker(args: tuple[str, str, int, int, _LogContext]) -> RangeResult:
    """Runs in a worker process: dump one range of a local file, return its text."""
    path, display, start, end, ctx = args
    source = LocalSource(path, display)
    try:
        kept: list[str] = []
        out = _Out(None, ctx.json, kept)
        rr = _scan_range(source, start, end, ctx, out)
        out.flush()
        rr.text = "".join(kept)
        return rr
    finally:
        source.close()


def _scan_parallel(source: LocalSource, start: int, end: int, ctx: _LogContext, opts: DumpOptions,
                   out: _Out) -> RangeResult:
    """Cut [start, end) at batch boundaries, dump the ranges in a process pool, emit in order.

    At most ``2 * jobs`` ranges are in flight, so memory stays bounded when the output is slow.
    """
    import multiprocessing

    cuts = batch_boundaries(source, start, end, max(opts.range_bytes, 1))
    if len(cuts) <= 2:
        return _scan_range(source, start, end, ctx, out)
    tasks = [(source.path, source.name, cuts[i], cuts[i + 1], ctx) for i in range(len(cuts) - 1)]
    merged = RangeResult(end=start)
    out.flush()
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    with multiprocessing.get_context(method).Pool(min(opts.jobs, len(tasks))) as pool:
        pending: deque = deque()
        next_task = 0
        while next_task < len(tasks) or pending:
            while next_task < len(tasks) and len(pending) < 2 * opts.jobs:
                pending.append((tasks[next_task][3], pool.apply_async(_range_worker, (tasks[next_task],))))
                next_task += 1
            range_end, async_result = pending.popleft()
            rr = async_result.get()
            out.text(rr.text)
            _merge(merged, rr)
            if rr.reason or rr.end < range_end:
                # Damage inside this range: Kafka stops reading here, so do the later ranges.
                pool.terminate()
                break
    return merged


def _merge(into: RangeResult, rr: RangeResult) -> None:
    if rr.first_offset != -1:
        if into.last_offset != -1 and rr.first_offset != into.last_offset + 1:
            into.non_consecutive.append((into.last_offset, rr.first_offset))
        if into.first_offset == -1:
            into.first_offset = rr.first_offset
        into.last_offset = rr.last_offset
    into.non_consecutive.extend(rr.non_consecutive)
    into.end = rr.end
    into.reason = rr.reason
    into.batches += rr.batches
    into.records += rr.records
    if not into.bad_crc and rr.bad_crc:
        into.first_bad_crc = rr.first_bad_crc
    into.bad_crc = into.bad_crc or rr.bad_crc
    into.errors.extend(rr.errors)
    into.seen.extend(rr.seen)
    into.decode_errors += rr.decode_errors


# ----------------------------------------------------------------------------- indexes


def _segment_stem(basename: str) -> str:
    return basename.split(".")[0]


def _dump_index(source: Source, det: Detection, opts: DumpOptions, out: _Out, result: FileResult) -> None:
    name = source.name
    if det.base_offset is None:
        result.errors.append(f"cannot tell the base offset of {name} from its name")
        return
    base = det.base_offset
    index = read_offset_index(source, base)
    result.bytes_read = index.length
    entries = index.entries
    if not entries:
        _line(out, opts, f"{name} is empty.", {"type": "indexEmpty", "file": name})
        return
    if opts.index_sanity_check:
        abs_name = source.absolute()
        last_offset = entries[-1][0]
        if last_offset < base:
            result.errors.append(
                f"Corrupt index found, index file {abs_name} has non-zero size but the last offset is "
                f"{last_offset} which is less than the base offset {base}"
            )
        elif index.length % 8:
            result.errors.append(
                f"Index file {abs_name} is corrupt, found {index.length} bytes which is neither positive "
                f"nor a multiple of 8"
            )
        else:
            _line(out, opts, f"{name} passed sanity check.", {"type": "sanityCheck", "file": name, "passed": True})
        return
    log = source.sibling(_segment_stem(source.basename) + ".log")
    if log is None:
        _note_no_log(source, opts, result)
    mismatches: list[tuple[int, int]] = []
    try:
        for i, (offset, position) in enumerate(entries):
            # A preallocated index left by a crash is zero-filled: stop at the first empty slot.
            if offset == base and i > 0:
                break
            if log is not None:
                h = header_at(log, position)
                log_offset = h[0] + h[6] if h is not None else -1
                if log_offset != offset:
                    mismatches.append((offset, log_offset))
            if not opts.verify_index_only:
                _line(
                    out,
                    opts,
                    f"offset: {offset} position: {position}",
                    {"type": "indexEntry", "file": name, "offset": offset, "position": position},
                )
            out.maybe_flush()
    finally:
        if log is not None:
            log.close()
    if mismatches:
        result.invalid = True
        lines = [f"Mismatches in :{source.absolute()}"]
        lines += [f"  Index offset: {a}, log offset: {b}" for a, b in reversed(mismatches)]
        result.reports.append("\n".join(lines))


def _dump_time_index(source: Source, det: Detection, opts: DumpOptions, out: _Out, result: FileResult) -> None:
    name = source.name
    if det.base_offset is None:
        result.errors.append(f"cannot tell the base offset of {name} from its name")
        return
    base = det.base_offset
    tindex = read_time_index(source, base)
    result.bytes_read = tindex.length
    entries = tindex.entries
    abs_name = source.absolute()
    if opts.index_sanity_check:
        last_ts, last_offset = entries[-1] if entries else (NO_TIMESTAMP, base)
        if entries and last_ts < entries[0][0]:
            result.errors.append(
                f"Corrupt time index found, time index file ({abs_name}) has non-zero size but the last "
                f"timestamp is {last_ts} which is less than the first timestamp {entries[0][0]}"
            )
        elif entries and last_offset < base:
            result.errors.append(
                f"Corrupt time index found, time index file ({abs_name}) has non-zero size but the last "
                f"offset is {last_offset} which is less than the first offset {base}"
            )
        elif tindex.length % 12:
            result.errors.append(
                f"Time index file {abs_name} is corrupt, found {tindex.length} bytes which is neither "
                f"positive nor a multiple of 12"
            )
        else:
            _line(out, opts, f"{name} passed sanity check.", {"type": "sanityCheck", "file": name, "passed": True})
        return
    stem = _segment_stem(source.basename)
    log = source.sibling(stem + ".log")
    offset_entries: list[tuple[int, int]] = []
    if log is None:
        _note_no_log(source, opts, result)
    else:
        index_source = source.sibling(stem + ".index")
        if index_source is not None:
            offset_entries = read_offset_index(index_source, base).entries
            index_source.close()
    mismatches: list[tuple[int, int]] = []
    out_of_order: list[tuple[int, int]] = []
    not_found: list[tuple[int, int]] = []
    prev_ts = NO_TIMESTAMP
    try:
        for i, (ts, offset) in enumerate(entries):
            if offset == base and i > 0:
                break
            if log is not None:
                position = offset_index_lookup(offset_entries, base, offset)
                found = _first_batch_reaching(log, position, offset)
                if found is None:
                    not_found.append((offset, -1))
                elif found[0][0] + found[0][6] != offset:
                    not_found.append((offset, found[0][0] + found[0][6]))
                else:
                    max_ts = _max_record_timestamp(found[0], found[1])
                    if max_ts != ts:
                        mismatches.append((ts, max_ts))
                    if prev_ts >= ts:
                        out_of_order.append((ts, prev_ts))
            if not opts.verify_index_only:
                _line(
                    out,
                    opts,
                    f"timestamp: {ts} offset: {offset}",
                    {"type": "timeIndexEntry", "file": name, "timestamp": ts, "offset": offset},
                )
            prev_ts = ts
            out.maybe_flush()
    finally:
        if log is not None:
            log.close()
    if mismatches:
        lines = [f"Found timestamp mismatch in :{abs_name}"]
        lines += [f"  Index timestamp: {a}, log timestamp: {b}" for a, b in mismatches]
        result.reports.append("\n".join(lines))
    if out_of_order:
        lines = [f"Found out of order timestamp in :{abs_name}"]
        lines += [f"  Index timestamp: {a}, Previously indexed timestamp: {b}" for a, b in out_of_order]
        result.reports.append("\n".join(lines))
    if not_found:
        lines = ["The following indexed offsets are not found in the log."]
        lines += [f"Indexed offset: {a}, found log offset: {b}" for a, b in not_found]
        result.reports.append("\n".join(lines))
    if mismatches or out_of_order or not_found:
        result.invalid = True


def _first_batch_reaching(log: Source, position: int, offset: int) -> tuple[tuple, bytes] | None:
    """Kafka's ``batches.find(_.lastOffset >= offset)`` from ``position`` on."""
    if position > log.size:
        return None
    state = ScanState(end=log.size)
    for h, win, rel, _valid in iter_batches(log, position, log.size, state):
        if h[0] + h[6] >= offset:
            return h, bytes(win[rel : rel + h[1] + LOG_OVERHEAD])
    return None


def _max_record_timestamp(h: tuple, batch: bytes) -> int:
    if h[5] & 0x08:  # LogAppendTime: every record carries the batch's maxTimestamp
        return h[8] if h[12] > 0 else NO_TIMESTAMP
    try:
        return max((r.timestamp for r in DefaultRecordBatch(batch)), default=NO_TIMESTAMP)
    except Exception:  # noqa: BLE001 - undecodable batch: nothing to compare
        return NO_TIMESTAMP


def _dump_txn_index(source: Source, opts: DumpOptions, out: _Out, result: FileResult) -> None:
    entries, trailing = read_txn_index(source)
    result.bytes_read = source.size
    for version, pid, first, last, lso in entries:
        _line(
            out,
            opts,
            f"version: {version} producerId: {pid} firstOffset: {first} lastOffset: {last} lastStableOffset: {lso}",
            {
                "type": "abortedTxn",
                "file": source.name,
                "version": version,
                "producerId": pid,
                "firstOffset": first,
                "lastOffset": last,
                "lastStableOffset": lso,
            },
        )
    if trailing:
        _trailing_bytes(out, opts, source, trailing, result)


def _dump_checkpoint(source: Source, opts: DumpOptions, out: _Out, result: FileResult) -> None:
    """Kafka's OffsetCheckpointFile (e.g. the log cleaner's ``cleaner-offset-checkpoint``): one
    line per partition; a malformed file is an error naming the line."""
    data = bytes(source.view(0, source.size)) if source.size else b""
    result.bytes_read = source.size
    lines = data.decode(errors="replace").splitlines()
    if len(lines) < 2 or lines[0].strip() != "0" or not lines[1].strip().isdigit():
        result.errors.append(f"{source.name} is not a version-0 offset checkpoint file")
        return
    if int(lines[1]) != len(lines) - 2:
        result.errors.append(f"{source.name} says {int(lines[1])} entries but holds {len(lines) - 2}")
    for n, line in enumerate(lines[2:], start=3):
        parts = line.split()
        if len(parts) != 3 or not parts[1].lstrip("-").isdigit() or not parts[2].lstrip("-").isdigit():
            result.errors.append(f"{source.name} line {n} is not '<topic> <partition> <offset>': {line!r}")
            continue
        topic, partition, offset = parts[0], int(parts[1]), int(parts[2])
        _line(out, opts, f"topic: {topic} partition: {partition} offset: {offset}",
              {"type": "checkpoint", "file": source.name, "topic": topic, "partition": partition, "offset": offset})


def _dump_kcli_log(source: Source, opts: DumpOptions, out: _Out, result: FileResult) -> None:
    """kcli's own logs: one ``<crc32c hex> <json>`` record per line. A line failing its CRC
    is invalid data (an error naming it); a last line without its newline is a torn write,
    reported like a segment's trailing bytes (the broker drops it when it next opens the log)."""
    from kcli.crcjson import decode_line

    data = bytes(source.view(0, source.size)) if source.size else b""
    result.bytes_read = source.size
    position = 0
    for n, line in enumerate(data.split(b"\n"), start=1):
        end = position + len(line) + 1
        if end > len(data):  # no newline: the last, torn line (or nothing)
            if line:
                _trailing_bytes(out, opts, source, len(line), result)
            break
        rec = decode_line(line)
        if rec is None:
            result.errors.append(f"line {n} at position {position} of {source.name} fails its CRC or is not JSON")
        else:
            result.records += 1
            text = json.dumps(rec, separators=(",", ":"), sort_keys=True)
            _line(out, opts, f"line: {n} position: {position} record: {text}",
                  {"type": "kcliRecord", "file": source.name, "line": n, "position": position, "record": rec})
        position = end


def _trailing_bytes(out: _Out, opts: DumpOptions, source: Source, trailing: int, result: FileResult) -> None:
    if opts.json:
        out.append({"type": "invalidBytes", "file": source.name, "position": source.size - trailing, "bytes": trailing})
    else:
        out.append(f"Found {trailing} invalid bytes at the end of {source.basename}\n")
    result.invalid = True


def _note_no_log(source: Source, opts: DumpOptions, result: FileResult) -> None:
    stem = _segment_stem(source.basename)
    msg = f"no {stem}.log next to {source.name}: entries not checked against the log"
    if opts.verify_index_only:
        result.errors.append(msg)
    else:
        result.reports.append(msg)


def _line(out: _Out, opts: DumpOptions, text: str, obj: dict[str, Any]) -> None:
    out.append(obj if opts.json else text + "\n")


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def default_jobs() -> int:
    """Worker processes for deep iteration of one big file: the usable CPUs (at most 8), but
    none on machines with fewer than 4 — there the parent process, which parses the file's
    headers and writes the output, competes with the workers and measured no gain."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return min(8, cpus) if cpus >= 4 else 1
