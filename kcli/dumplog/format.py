"""Output lines in Kafka's DumpLogSegments format, and the same facts as JSON objects.

The text lines are byte-for-byte what ``kafka-dump-log.sh`` (Kafka 3.x/4.x) prints for v2
batches, so scripts written against Kafka's tool keep working; kcli only appends fields
(WAL annotation) at the end of a batch line.

Batch headers travel as the raw ``struct`` tuple (see HEADER) rather than a dataclass: batch-level
dumps are bound by per-batch Python work, and building an object per batch costs more than the
checksum of a 16 KiB batch.
"""

from __future__ import annotations

import struct
from itertools import chain, repeat
from operator import attrgetter, sub
from typing import Any, Callable, Iterable

from aiokafka.codec import gzip_decode, lz4_decode, snappy_decode, zstd_decode
from aiokafka.record._crecords import DefaultRecordBatch

from kcli.dumplog.decoders import DecodeError

try:
    from kcli.dumplog._fastlines import record_lines as compiled_record_lines
except ImportError:  # not built (no compiler at install time, or a Spark executor without it)
    compiled_record_lines = None

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordsCount
HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
INT_MAX = 0x7FFFFFFF

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
CONTROL_TYPES = {
    0: "ABORT",
    1: "COMMIT",
    2: "LEADER_CHANGE",
    3: "SNAPSHOT_HEADER",
    4: "SNAPSHOT_FOOTER",
    5: "KRAFT_VERSION",
    6: "KRAFT_VOTERS",
}
_I16_I16 = struct.Struct(">hh")
_I16_I32 = struct.Struct(">hi")
# What aiokafka's DefaultRecordBatch decompresses with, by codec id, called as it calls them.
_DECOMPRESS: dict[int, Callable[[memoryview], bytes]] = {
    1: gzip_decode,
    2: lambda data: snappy_decode(data.tobytes()),
    3: lambda data: lz4_decode(data.tobytes()),
    4: zstd_decode,
}


def codec_name(attributes: int) -> str:
    c = attributes & 7
    return CODECS[c] if c < 5 else f"unknown({c})"


def increment_sequence(sequence: int, increment: int) -> int:
    """Kafka's DefaultRecordBatch.incrementSequence: sequences wrap at Integer.MAX_VALUE."""
    if sequence > INT_MAX - increment:
        return increment - (INT_MAX - sequence) - 1
    return sequence + increment


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    return -1 if base_sequence == -1 else increment_sequence(base_sequence, last_offset_delta)


def timestamp_type(attributes: int) -> str:
    return "LogAppendTime" if attributes & 0x08 else "CreateTime"


def delete_horizon(attributes: int, base_timestamp: int) -> str:
    """Java's OptionalLong.toString, which is what Kafka prints."""
    return f"OptionalLong[{base_timestamp}]" if attributes & 0x40 else "OptionalLong.empty"


def batch_text(h: tuple, position: int, valid: bool, extra: str = "") -> str:
    """One ``baseOffset: ... isvalid: ...`` line, newline included; ``extra`` goes before the newline."""
    base, length, ple, magic, crc, attrs, lod, base_ts, max_ts, pid, epoch, bseq, count = h
    return (
        f"baseOffset: {base} lastOffset: {base + lod} count: {count} baseSequence: {bseq} "
        f"lastSequence: {-1 if bseq == -1 else increment_sequence(bseq, lod)} producerId: {pid} "
        f"producerEpoch: {epoch} partitionLeaderEpoch: {ple} "
        f"isTransactional: {'true' if attrs & 0x10 else 'false'} isControl: {'true' if attrs & 0x20 else 'false'} "
        f"deleteHorizonMs: {delete_horizon(attrs, base_ts)} position: {position} "
        f"{'LogAppendTime' if attrs & 0x08 else 'CreateTime'}: {max_ts} size: {length + 12} magic: {magic} "
        f"compresscodec: {codec_name(attrs)} crc: {crc} isvalid: {'true' if valid else 'false'}{extra}\n"
    )


def batch_json(h: tuple, position: int, valid: bool, file: str) -> dict[str, Any]:
    base, length, ple, magic, crc, attrs, lod, base_ts, max_ts, pid, epoch, bseq, count = h
    return {
        "type": "batch",
        "file": file,
        "baseOffset": base,
        "lastOffset": base + lod,
        "count": count,
        "baseSequence": bseq,
        "lastSequence": last_sequence(bseq, lod),
        "producerId": pid,
        "producerEpoch": epoch,
        "partitionLeaderEpoch": ple,
        "isTransactional": bool(attrs & 0x10),
        "isControl": bool(attrs & 0x20),
        "deleteHorizonMs": base_ts if attrs & 0x40 else None,
        "position": position,
        "timestampType": timestamp_type(attrs),
        "timestamp": max_ts,
        "size": length + 12,
        "magic": magic,
        "compresscodec": codec_name(attrs),
        "crc": crc,
        "isvalid": valid,
    }


def control_text(key: bytes | None, value: bytes | None) -> str:
    """What Kafka appends for a control record: the end-transaction marker, else the type."""
    if key is None or len(key) < 4:
        return " controlType: UNKNOWN(-1)"
    _version, type_id = _I16_I16.unpack_from(key)
    name = CONTROL_TYPES.get(type_id, "UNKNOWN")
    if type_id in (0, 1) and value is not None and len(value) >= 6:
        _v, coordinator_epoch = _I16_I32.unpack_from(value)
        return f" endTxnMarker: {name} coordinatorEpoch: {coordinator_epoch}"
    return f" controlType: {name}({type_id})"


def control_json(key: bytes | None, value: bytes | None) -> dict[str, Any]:
    if key is None or len(key) < 4:
        return {"controlType": "UNKNOWN", "controlTypeId": -1}
    _version, type_id = _I16_I16.unpack_from(key)
    out: dict[str, Any] = {"controlType": CONTROL_TYPES.get(type_id, "UNKNOWN"), "controlTypeId": type_id}
    if type_id in (0, 1) and value is not None and len(value) >= 6:
        out["coordinatorEpoch"] = _I16_I32.unpack_from(value)[1]
    return out


# ----------------------------------------------------------------------------- record lines, by column
#
# Deep iteration spends its time turning ints into text, one Python step per record. The metadata
# lines (the default --deep-iteration output) are therefore built a batch at a time, by column:
# aiokafka's compiled decoder gives the records, C-level ``map``s pull each field out, and the lines
# come out of one ``str.join`` over per-record pieces. Ints are mostly not converted at all: record
# offsets and sequences are consecutive runs, so their text is a slice of a table of 4-digit
# strings under a shared prefix; timestamps of one batch share their leading digits too (else a
# per-batch dict does them once each); key/value sizes repeat and come from caches.

_OFFSET = attrgetter("offset")
_TIMESTAMP = attrgetter("timestamp")
_KEY = attrgetter("key")
_VALUE = attrgetter("value")
_HEADERS = attrgetter("headers")
BLOCK = 10_000  # digit tables cover the last 4 decimal digits
CACHE_LIMIT = 1 << 16


class _IntText(dict):
    """``n -> str(n) + suffix``, filled on demand (sizes repeat; cleared if it ever grows large)."""

    def __init__(self, suffix: str) -> None:
        super().__init__()
        self.suffix = suffix

    def __missing__(self, n: int) -> str:
        if len(self) >= CACHE_LIMIT:
            self.clear()
        text = self[n] = f"{n}{self.suffix}"
        return text


_DIGITS: dict[str, tuple[list[str], list[str]]] = {}
_SIZE_TEXT: dict[str, _IntText] = {}


def _digits(suffix: str) -> tuple[list[str], list[str]]:
    """Tables of ``0000..9999`` (zero-padded, and plain for numbers below BLOCK) + ``suffix``."""
    tables = _DIGITS.get(suffix)
    if tables is None:
        tables = _DIGITS[suffix] = ([f"{i:04d}{suffix}" for i in range(BLOCK)], [f"{i}{suffix}" for i in range(BLOCK)])
    return tables


def _size_text(suffix: str) -> _IntText:
    cache = _SIZE_TEXT.get(suffix)
    if cache is None:
        if len(_SIZE_TEXT) >= 256:  # suffixes carry sequence/size digits: keep the set bounded
            _SIZE_TEXT.clear()
        cache = _SIZE_TEXT[suffix] = _IntText(suffix)
    return cache


def _consecutive(values: list[int]) -> bool:
    n = len(values)
    if not n:
        return True
    first = values[0]
    return values[-1] - first == n - 1 and values == list(range(first, first + n))


def _run(first: int, n: int, label: str, suffix: str) -> tuple[Iterable[str], Iterable[str]]:
    """Text of the ints ``first .. first + n - 1`` (first >= 0) as two piece streams:
    ``label`` + leading digits, then the last four digits + ``suffix``."""
    padded, plain = _digits(suffix)
    high, low = divmod(first, BLOCK)
    heads: list[Iterable[str]] = []
    lows: list[Iterable[str]] = []
    while n > 0:
        k = min(n, BLOCK - low)
        if high:
            heads.append(repeat(f"{label}{high}", k))
            lows.append(padded[low : low + k])
        else:
            heads.append(repeat(label, k))
            lows.append(plain[low : low + k])
        n -= k
        high += 1
        low = 0
    if len(heads) == 1:
        return heads[0], lows[0]
    return chain.from_iterable(heads), chain.from_iterable(lows)


def _lengths(items: Iterable[bytes | None]) -> list[int]:
    try:
        return list(map(len, items))
    except TypeError:  # a null key or value: Kafka prints -1
        return []


def _shared_or_column(sizes: list[int], label: str, suffix: str) -> tuple[str, Iterable[str] | None]:
    """``label size suffix`` as one piece when every record has the same size (the text before it
    absorbs it), else the bare label and a column of ``size suffix`` pieces."""
    first = sizes[0]
    if sizes.count(first) == len(sizes):
        return f"{label}{first}{suffix}", None
    return label, map(_size_text(suffix).__getitem__, sizes)


def _metadata_lines(records: list, offsets: list[int], consecutive: bool, h: tuple) -> str | None:
    """The ``| offset: ...`` lines of a non-control batch, or None when it needs the per-record path
    (sequences that wrap or run over non-consecutive offsets).

    Each record's line is joined from as few pieces as the batch allows: a field that is the same
    for every record of the batch (value size, key size) or a run's leading digits (sequence) is
    folded into the text of the field before it, so it costs no piece of its own.
    """
    n = len(records)
    base = h[0]
    bseq = h[11]
    headers = list(map(_HEADERS, records)) if any(map(_HEADERS, records)) else None
    tail = " headerKeys: " if headers else " headerKeys: []\n"
    # sequence: a run, as its leading digits (folded into the value-size text) and a table slice
    seq_lows: Iterable[str] | None = None
    seq_head = ""
    if bseq >= 0:
        first_seq = bseq + offsets[0] - base
        if not consecutive or first_seq < 0 or first_seq + n - 1 > INT_MAX:
            return None  # wraps at Integer.MAX_VALUE, or gaps: incrementSequence per record
        high, low = divmod(first_seq, BLOCK)
        if low + n <= BLOCK:
            padded, plain = _digits(tail)
            seq_lows = padded[low : low + n] if high else plain[low : low + n]
            seq_head = str(high) if high else ""
        else:
            seq_head_col, seq_lows = _run(first_seq, n, "", tail)
            seq_lows = list(map("".join, zip(seq_head_col, seq_lows)))
        value_suffix = " sequence: " + seq_head
    else:
        value_suffix = " sequence: -1" + tail
    # offsets; the timestamp label rides on the end of the offset text
    label = " LogAppendTime: " if h[5] & 0x08 else " CreateTime: "
    if consecutive and offsets[0] >= 0:
        off_heads, off_lows = _run(offsets[0], n, "| offset: ", label)
    else:
        off_heads, off_lows = repeat("| offset: "), [f"{o}{label}" for o in offsets]
    columns: list[Iterable[str]] = [off_heads, off_lows]
    # key and value sizes: a size shared by the whole batch is folded into the text before it
    key_sizes = _lengths(map(_KEY, records)) or [-1 if k is None else len(k) for k in map(_KEY, records)]
    value_sizes = _lengths(map(_VALUE, records)) or [-1 if v is None else len(v) for v in map(_VALUE, records)]
    key_suffix, value_column = _shared_or_column(value_sizes, " valueSize: ", value_suffix)
    ts_suffix, key_column = _shared_or_column(key_sizes, " keySize: ", key_suffix)
    # timestamps: the leading digits once per batch and the last four from a table, or (when
    # few) each distinct timestamp converted once
    stamps = list(map(_TIMESTAMP, records))
    distinct = set(stamps)
    low_ts = min(distinct)
    high = low_ts // BLOCK
    if len(distinct) * 4 > n and low_ts >= BLOCK and max(distinct) // BLOCK == high:
        if key_column is None:  # the table's suffix would change from batch to batch
            key_column = repeat(ts_suffix[10:])
            ts_suffix = " keySize: "
        columns.append(repeat(str(high)))
        columns.append(map(_digits(ts_suffix)[0].__getitem__, map(sub, stamps, repeat(high * BLOCK))))
    else:
        by_ts = {t: f"{t}{ts_suffix}" for t in distinct}
        columns.append(map(by_ts.__getitem__, stamps))
    if key_column is not None:
        columns.append(key_column)
    if value_column is not None:
        columns.append(value_column)
    if seq_lows is not None:
        columns.append(seq_lows)
    if headers:
        columns.append([f"[{','.join([x[0] for x in hs])}]\n" if hs else "[]\n" for hs in headers])
    return "".join(map("".join, zip(*columns)))


class RecordFormatter:
    """Turns one batch's records into text or JSON; the per-record loops live here.

    Deep iteration must run at over a million records per second, so each variant is a plain
    loop over aiokafka's compiled DefaultRecordBatch with everything hoisted out of it.
    """

    def __init__(
        self,
        skip_metadata: bool,
        print_data: bool,
        key_decoder: Callable[[bytes], Any],
        value_decoder: Callable[[bytes], Any],
        track_offsets: bool,
    ) -> None:
        self.skip_metadata = skip_metadata
        self.print_data = print_data
        self.key_decoder = key_decoder
        self.value_decoder = value_decoder
        self.track_offsets = track_offsets
        self.first_offset = -1
        self.last_offset = -1
        self.non_consecutive: list[tuple[int, int]] = []
        self.decode_errors = 0

    def _track(self, offsets: list[int]) -> bool:
        """Kafka's non-consecutive offset check, done per batch with C-level comparisons.
        Returns whether the batch's own offsets are consecutive."""
        if not offsets:
            return True
        consecutive = _consecutive(offsets)
        gaps = None if consecutive else [(a, b) for a, b in zip(offsets, offsets[1:]) if b != a + 1]
        self._track_span(offsets[0], offsets[-1], gaps)
        return consecutive

    def text(self, buf: memoryview | bytes, h: tuple, out: list[str]) -> int:
        """Append the batch's record lines (each ending in newline); returns the record count."""
        if compiled_record_lines is not None and not self.skip_metadata and not self.print_data \
                and not h[5] & 0x20:
            got = self._compiled_lines(buf, h)
            if got is not None:
                text, first, last, gaps = got
                if self.track_offsets:
                    self._track_span(first, last, gaps)
                out.append(text)
                return h[12]
        records = list(DefaultRecordBatch(buf))
        offsets = list(map(_OFFSET, records))
        consecutive = self._track(offsets) if self.track_offsets else _consecutive(offsets)
        if not self.skip_metadata and not self.print_data and not h[5] & 0x20 and records:
            text = _metadata_lines(records, offsets, consecutive, h)
            if text is not None:
                out.append(text)
                return len(records)
        self._text_records(records, h, out)
        return len(records)

    @staticmethod
    def _compiled_lines(buf: memoryview | bytes, h: tuple) -> tuple[str, int, int, list | None] | None:
        """The metadata lines by the compiled walker, or None where aiokafka's reader decides
        (anything it would refuse or read differently; a codec that fails to decompress)."""
        attrs = h[5]
        codec = attrs & 7
        if codec == 0:
            data, pos = buf, HEADER_SIZE
        elif codec < 5:
            try:
                data, pos = _DECOMPRESS[codec](memoryview(buf)[HEADER_SIZE:]), 0
            except Exception:  # noqa: BLE001 - the reference path reports it as aiokafka does
                return None
        else:
            return None
        return compiled_record_lines(data, pos, h[0], h[7], h[8], attrs, h[11], h[12])

    def _track_span(self, first: int, last: int, gaps: list[tuple[int, int]] | None) -> None:
        """Record one batch's offsets: its first and last, and the non-consecutive pairs inside
        it (from :meth:`_track`, or from the compiled walker)."""
        if self.first_offset == -1:
            self.first_offset = first
        if self.last_offset != -1 and first != self.last_offset + 1:
            self.non_consecutive.append((self.last_offset, first))
        if gaps:
            self.non_consecutive.extend(gaps)
        self.last_offset = last

    def text_reference(self, buf: memoryview | bytes, h: tuple, out: list[str]) -> int:
        """:meth:`text` without the column fast path: one record at a time (tests compare the two)."""
        records = list(DefaultRecordBatch(buf))
        if self.track_offsets:
            self._track([r.offset for r in records])
        self._text_records(records, h, out)
        return len(records)

    def _text_records(self, records: list, h: tuple, out: list[str]) -> None:
        """Every variant (data, skipped metadata, control records), one record at a time."""
        attrs = h[5]
        base = h[0]
        bseq = h[11]
        control = bool(attrs & 0x20)
        ts_name = "LogAppendTime" if attrs & 0x08 else "CreateTime"
        append = out.append
        kdec = self.key_decoder
        vdec = self.value_decoder
        for r in records:
            k = r.key
            v = r.value
            prefix = "| "
            parts: list[str] = []
            if not self.skip_metadata:
                hs = r.headers
                seq = -1 if bseq < 0 else increment_sequence(bseq, r.offset - base)
                parts.append(
                    f"| offset: {r.offset} {ts_name}: {r.timestamp} keySize: {-1 if k is None else len(k)} "
                    f"valueSize: {-1 if v is None else len(v)} sequence: {seq} "
                    f"headerKeys: [{','.join([x[0] for x in hs])}]"
                )
                prefix = " "
                if control:
                    parts.append(control_text(k, v))
            if self.print_data and not control:
                if k is not None:
                    parts.append(f"{prefix}key: {self._decode(kdec, k)}")
                if v is not None:
                    parts.append(f" payload: {self._decode(vdec, v)}")
            parts.append("\n")
            append("".join(parts))

    def _decode(self, decoder: Callable[[bytes], Any], data: bytes) -> Any:
        try:
            return decoder(data)
        except DecodeError as err:
            self.decode_errors += 1
            return f"<decode error: {err}>"

    def json(self, buf: memoryview | bytes, h: tuple, file: str, position: int, out: list[Any]) -> int:
        attrs = h[5]
        base = h[0]
        bseq = h[11]
        control = bool(attrs & 0x20)
        ts_name = timestamp_type(attrs)
        records = list(DefaultRecordBatch(buf))
        if self.track_offsets:
            self._track(list(map(_OFFSET, records)))
        for r in records:
            k = r.key
            v = r.value
            obj: dict[str, Any] = {"type": "record", "file": file, "batchPosition": position, "offset": r.offset}
            if not self.skip_metadata:
                obj["timestampType"] = ts_name
                obj["timestamp"] = r.timestamp
                obj["keySize"] = -1 if k is None else len(k)
                obj["valueSize"] = -1 if v is None else len(v)
                obj["sequence"] = -1 if bseq < 0 else increment_sequence(bseq, r.offset - base)
                obj["headerKeys"] = [x[0] for x in r.headers]
                if control:
                    obj.update(control_json(k, v))
            if self.print_data and not control:
                if k is not None:
                    self._json_field(obj, "key", self.key_decoder, k)
                if v is not None:
                    self._json_field(obj, "payload", self.value_decoder, v)
            out.append(obj)
        return len(records)

    def _json_field(self, obj: dict[str, Any], name: str, decoder: Callable[[bytes], Any], data: bytes) -> None:
        try:
            obj[name] = decoder(data)
        except DecodeError as err:
            self.decode_errors += 1
            obj[name + "Error"] = str(err)
