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
from typing import Any, Callable

from aiokafka.record._crecords import DefaultRecordBatch

from kcli.dumplog.decoders import DecodeError

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
_SIZE_STRINGS = [str(i) for i in range(1 << 14)]  # key/value sizes as text, for the record hot path
_I16_I16 = struct.Struct(">hh")
_I16_I32 = struct.Struct(">hi")


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

    def _track(self, offsets: list[int]) -> None:
        """Kafka's non-consecutive offset check, done per batch with C-level comparisons."""
        if not offsets:
            return
        last = self.last_offset
        first = offsets[0]
        if self.first_offset == -1:
            self.first_offset = first
        if last != -1 and first != last + 1:
            self.non_consecutive.append((last, first))
        n = len(offsets)
        if offsets[-1] - first != n - 1 or offsets != list(range(first, first + n)):
            prev = first
            for o in offsets[1:]:
                if o != prev + 1:
                    self.non_consecutive.append((prev, o))
                prev = o
        self.last_offset = offsets[-1]

    def text(self, buf: memoryview | bytes, h: tuple, out: list[str]) -> int:
        """Append one line per record (each ending in newline); returns the record count."""
        attrs = h[5]
        base = h[0]
        bseq = h[11]
        control = bool(attrs & 0x20)
        ts_name = "LogAppendTime" if attrs & 0x08 else "CreateTime"
        records = list(DefaultRecordBatch(buf))
        if self.track_offsets:
            self._track([r.offset for r in records])
        append = out.append
        if not self.skip_metadata and not self.print_data and not control:
            # The hot path (metadata only). Sizes come from a table of strings, timestamps from
            # a per-batch cache (producers stamp many records with the same millisecond), and
            # sequences from the offset when the batch does not wrap: every int->str saved counts.
            sizes = _SIZE_STRINGS
            pre = "| offset: "
            mid = f" {ts_name}: "
            tcache: dict[int, str] = {}
            wraps = bseq >= 0 and bseq > INT_MAX - h[6]
            shift = base - bseq
            for r in records:
                k = r.key
                v = r.value
                try:
                    ks = sizes[len(k)] if k is not None else "-1"
                    vs = sizes[len(v)] if v is not None else "-1"
                except IndexError:
                    ks = str(len(k)) if k is not None else "-1"
                    vs = str(len(v)) if v is not None else "-1"
                t = r.timestamp
                ts = tcache.get(t)
                if ts is None:
                    ts = tcache[t] = str(t)
                o = r.offset
                if bseq < 0:
                    seq = -1
                elif wraps:
                    seq = increment_sequence(bseq, o - base)
                else:
                    seq = o - shift
                hs = r.headers
                if hs:
                    hk = "[" + ",".join([x[0] for x in hs]) + "]"
                    append(f"{pre}{o}{mid}{ts} keySize: {ks} valueSize: {vs} sequence: {seq} headerKeys: {hk}\n")
                else:
                    append(f"{pre}{o}{mid}{ts} keySize: {ks} valueSize: {vs} sequence: {seq} headerKeys: []\n")
            return len(records)
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
        return len(records)

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
            self._track([r.offset for r in records])
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
