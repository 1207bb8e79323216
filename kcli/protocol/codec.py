"""Kafka wire framing over kio's generated schemas.

Handlers speak plain dicts keyed by kio's snake_case field names; :func:`build` turns a dict
into the kio entity of whatever version the client asked for, filling defaults and dropping
fields that version lacks. That keeps each handler version-agnostic. Tagged fields are never
written (librdkafka < 2.2 mis-parses them); unknown tags in requests are skipped by kio's reader.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
import uuid
from functools import lru_cache
from types import NoneType, UnionType
from typing import Any, get_args, get_origin

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import (
    i8, i16, i32, i32Timedelta, i64, i64Timedelta, u16, f64,
)

_ZERO_UUID = uuid.UUID(int=0)
_HDR = struct.Struct(">hhi")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class ProtocolError(Exception):
    """A frame that cannot be parsed: the connection that sent it is closed."""


@dataclasses.dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def _to_td32(v: Any) -> Any:
    if isinstance(v, datetime.timedelta):
        return i32Timedelta.parse(v)
    return i32Timedelta.parse(datetime.timedelta(milliseconds=int(v)))


def _to_td64(v: Any) -> Any:
    if isinstance(v, datetime.timedelta):
        return i64Timedelta.parse(v)
    return i64Timedelta.parse(datetime.timedelta(milliseconds=int(v)))


def _to_dt(v: Any) -> Any:
    from kio.serial.readers import tz_aware_from_i64

    if v is None or isinstance(v, datetime.datetime):
        return v
    if int(v) == -1:
        return None  # Kafka's "no timestamp"; the nullable writer emits -1
    return tz_aware_from_i64(i64(int(v)))


def _to_uuid(v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, uuid.UUID):
        return v
    return uuid.UUID(str(v))


class _ExtraErrorCode(int):
    """A code kio's ErrorCode enum lacks (kcli's own, e.g. TIERED_STORAGE_DISABLEMENT_IN_PROGRESS
    = 200 in kcli/protocol/errors.py); kio's writer only needs ``.value``."""

    @property
    def value(self) -> int:
        return int(self)


def _to_error_code(v: Any) -> Any:
    try:
        return ErrorCode(int(v))
    except ValueError:
        return _ExtraErrorCode(int(v))


_CONVERT: dict[str, Any] = {
    "int8": lambda v: i8(int(v)),
    "int16": lambda v: i16(int(v)),
    "int32": lambda v: i32(int(v)),
    "int64": lambda v: i64(int(v)),
    "uint16": lambda v: u16(int(v)),
    "float64": lambda v: f64(float(v)),
    "bool": bool,
    "string": lambda v: v,
    "bytes": lambda v: v,
    "records": lambda v: v,
    "uuid": _to_uuid,
    "error_code": _to_error_code,
    "timedelta_i32": _to_td32,
    "timedelta_i64": _to_td64,
    "datetime_i64": _to_dt,
}

_ZERO: dict[str, Any] = {
    "int8": 0, "int16": 0, "int32": 0, "int64": 0, "uint16": 0, "float64": 0.0,
    "bool": False, "string": "", "bytes": b"", "records": None, "uuid": _ZERO_UUID,
    "error_code": 0, "timedelta_i32": 0, "timedelta_i64": 0, "datetime_i64": 0,
}


@dataclasses.dataclass(frozen=True, slots=True)
class _FieldPlan:
    name: str
    kind: str  # "prim" | "prims" | "entity" | "entities"
    kafka_type: str | None
    nested: type | None
    optional: bool
    tagged: bool
    default: Any  # dataclasses.MISSING when none


def _unwrap(t: Any) -> tuple[Any, bool]:
    if get_origin(t) is UnionType:
        args = [a for a in get_args(t) if a is not NoneType]
        return args[0], True
    return t, False


@lru_cache(maxsize=None)
def _plan(cls: type) -> tuple[_FieldPlan, ...]:
    plans = []
    for f in dataclasses.fields(cls):
        t, optional = _unwrap(f.type)
        kafka_type = f.metadata.get("kafka_type")
        tagged = "tag" in f.metadata
        default = f.default if f.default is not dataclasses.MISSING else dataclasses.MISSING
        if get_origin(t) is tuple:
            inner = get_args(t)[0]
            if dataclasses.is_dataclass(inner):
                plans.append(_FieldPlan(f.name, "entities", None, inner, optional, tagged, default))
            else:
                plans.append(_FieldPlan(f.name, "prims", kafka_type, None, optional, tagged, default))
        elif dataclasses.is_dataclass(t):
            plans.append(_FieldPlan(f.name, "entity", None, t, optional, tagged, default))
        else:
            plans.append(_FieldPlan(f.name, "prim", kafka_type, None, optional, tagged, default))
    return tuple(plans)


def build(cls: type, data: dict[str, Any] | None) -> Any:
    """Make a ``cls`` entity from ``data``; missing fields take the schema default or zero."""
    data = data or {}
    kwargs: dict[str, Any] = {}
    for p in _plan(cls):
        if p.tagged:
            continue  # never write tagged fields: leave the schema default
        if p.name in data:
            v = data[p.name]
        elif p.default is not dataclasses.MISSING:
            continue
        elif p.optional and p.kind != "prim":
            v = None
        elif p.kind in ("prims", "entities"):
            v = ()
        elif p.kind == "entity":
            v = {}
        else:
            v = None if p.optional else _ZERO[p.kafka_type]  # type: ignore[index]
        if v is None:
            kwargs[p.name] = None
        elif p.kind == "prim":
            kwargs[p.name] = _CONVERT[p.kafka_type](v)  # type: ignore[index]
        elif p.kind == "prims":
            conv = _CONVERT[p.kafka_type]  # type: ignore[index]
            kwargs[p.name] = tuple(conv(x) for x in v)
        elif p.kind == "entity":
            kwargs[p.name] = v if dataclasses.is_dataclass(v) else build(p.nested, v)  # type: ignore[arg-type]
        else:
            kwargs[p.name] = tuple(x if dataclasses.is_dataclass(x) else build(p.nested, x) for x in v)  # type: ignore[arg-type]
    return cls(**kwargs)


# kcli's own APIs (kcli/protocol/kcli_schemas.py): (api_key, version) -> (request, response).
# Consulted before kio, which only knows Kafka's messages.
EXTRA_SCHEMAS: dict[tuple[int, int], tuple[type, type]] = {}


def register_schema(api_key: int, version: int, request: type, response: type) -> None:
    EXTRA_SCHEMAS[(api_key, version)] = (request, response)


@lru_cache(maxsize=None)
def request_class(api_key: int, version: int) -> type:
    extra = EXTRA_SCHEMAS.get((api_key, version))
    return extra[0] if extra else load_request_schema(api_key, version)


@lru_cache(maxsize=None)
def response_class(api_key: int, version: int) -> type:
    extra = EXTRA_SCHEMAS.get((api_key, version))
    return extra[1] if extra else load_response_schema(api_key, version)


@lru_cache(maxsize=None)
def _reader(cls: type) -> Any:
    return entity_reader(cls)


@lru_cache(maxsize=None)
def _writer(cls: type) -> Any:
    return entity_writer(cls)


def decode_response(api_key: int, version: int, data: bytes, correlation: int) -> Any:
    """A response frame (without its size prefix) as kio's entity: what a client, kcli's own or a
    replica fetcher, reads back. ValueError when it answers another request (correlation id)."""
    (cid,) = struct.unpack_from(">i", data, 0)
    if cid != correlation:
        raise ValueError(f"correlation id mismatch: sent {correlation}, got {cid}")
    cls = response_class(api_key, version)
    pos = 4
    if cls.__header_schema__.__flexible__:
        pos = _skip_tagged_fields(data, pos)
    entity, _ = _reader(cls)(data, pos)
    return entity


def _skip_tagged_fields(buf: bytes | memoryview, pos: int) -> int:
    def uvarint(p: int) -> tuple[int, int]:
        shift = value = 0
        while True:
            if p >= len(buf):
                raise ProtocolError("truncated tagged fields")
            b = buf[p]
            p += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value, p
            shift += 7
            if shift > 35:
                raise ProtocolError("varint too long")

    count, pos = uvarint(pos)
    for _ in range(count):
        _, pos = uvarint(pos)
        size, pos = uvarint(pos)
        pos += size
    if pos > len(buf):
        raise ProtocolError("truncated tagged fields")
    return pos


def read_header(frame: bytes | memoryview) -> tuple[RequestHeader, int]:
    """Parse api key, version, correlation id and client id; return the body offset.

    Whether the header has a tagged-field section depends on the schema of the API version,
    so the caller passes the offset through :func:`skip_header_tags` once it knows that."""
    if len(frame) < 10:
        raise ProtocolError(f"frame of {len(frame)} bytes is too short for a request header")
    api_key, api_version, correlation_id = _HDR.unpack_from(frame, 0)
    (n,) = _I16.unpack_from(frame, 8)
    pos = 10
    client_id = None
    if n >= 0:
        if pos + n > len(frame):
            raise ProtocolError("client id runs past the end of the frame")
        client_id = bytes(frame[pos : pos + n]).decode("utf-8", "replace")
        pos += n
    return RequestHeader(api_key, api_version, correlation_id, client_id), pos


def is_flexible(api_key: int, version: int) -> bool:
    return bool(request_class(api_key, version).__flexible__)


def decode_request(frame: bytes | memoryview, header: RequestHeader, body_pos: int) -> Any:
    cls = request_class(header.api_key, header.api_version)
    if cls.__flexible__:
        body_pos = _skip_tagged_fields(frame, body_pos)
    guard_array_lengths(frame, body_pos, cls)
    try:
        entity, _size = _reader(cls)(frame, body_pos)
    except Exception as err:  # kio raises assorted errors on garbage
        raise ProtocolError(f"cannot decode {cls.__name__} v{header.api_version}: {err}") from err
    _check_nulls(entity, cls)
    return entity


@lru_cache(maxsize=None)
def _null_plan(cls: type) -> tuple[tuple[str, ...], tuple[tuple[str, type, bool], ...]]:
    """(non-nullable field names, (name, nested class, is array) of nested entities) of ``cls``."""
    plans = _plan(cls)
    required = tuple(p.name for p in plans if not p.optional and (
        p.kind != "prim" or p.kafka_type in ("string", "bytes", "records")))  # what kio can read as null
    nested = tuple((p.name, p.nested, p.kind == "entities") for p in plans
                   if p.kind in ("entity", "entities") and any(_null_plan(p.nested)))  # type: ignore[arg-type]
    return required, nested  # type: ignore[return-value]


def _check_nulls(entity: Any, cls: type) -> None:
    """kio reads a null (-1 length) even where the schema forbids it; Kafka refuses such a request."""
    required, nested = _null_plan(cls)
    for name in required:
        if getattr(entity, name) is None:
            raise ProtocolError(f"non-nullable field {name} of {cls.__name__} was serialized as null")
    for name, sub, many in nested:
        value = getattr(entity, name)
        if value is None:
            continue
        for item in (value if many else (value,)):
            _check_nulls(item, sub)


def encode_response(api_key: int, version: int, correlation_id: int, body: Any) -> bytes:
    """Frame a response: size, header (v0, or v1 with empty tags when flexible), body."""
    cls = response_class(api_key, version)
    entity = body if dataclasses.is_dataclass(body) else build(cls, body)
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    out.write(_I32.pack(correlation_id))
    # ApiVersions responses always use header v0 so a client can read them before it
    # knows the broker's versions; kio encodes that in __header_schema__.
    if cls.__header_schema__.__flexible__:
        out.write(b"\0")
    _writer(cls)(out, entity)
    buf = out.getbuffer()
    struct.pack_into(">i", buf, 0, len(buf) - 4)
    del buf
    return out.getvalue()


# --- error responses built from the schema ------------------------------------------------------
# When a handler fails as a whole, Kafka answers with AbstractRequest.getErrorResponse: the request's
# own entries echoed back, each carrying the error code. Doing that from the schemas here covers
# every API (and every version) without per-handler code.

_TOPIC_KEYS = ("name", "topic", "topic_name", "resource_name")
_PARTITION_KEYS = ("partition_index", "partition", "index", "partition_id")
# Fields Kafka fills with -1 ("unknown") in an error response instead of zero.
_UNKNOWN = frozenset({"high_watermark", "last_stable_offset", "log_start_offset", "base_offset",
                      "num_partitions", "replication_factor", "leader_id", "leader_epoch", "offset", "timestamp"})


def _field_value(req: Any, name: str) -> Any:
    """The request element's value for a response field: same name, else a synonym Kafka uses."""
    if hasattr(req, name):
        return getattr(req, name)
    for group in (_TOPIC_KEYS, _PARTITION_KEYS):
        if name in group:
            for alias in group:
                if hasattr(req, alias):
                    return getattr(req, alias)
    return dataclasses.MISSING


def _array_source(resp_field: _FieldPlan, req: Any) -> tuple[Any, ...] | None:
    """The request array that a response array answers: same name, else the best-matching one."""
    if req is None or not dataclasses.is_dataclass(req):
        return None
    arrays = [p for p in _plan(type(req)) if p.kind in ("entities", "prims") and not p.tagged]
    same = [p for p in arrays if p.name == resp_field.name]
    best, best_score = (same[0] if same else None), 0
    if best is None:
        wanted = [q.name for q in _plan(resp_field.nested) if q.kind == "prim"]  # type: ignore[arg-type]
        for p in arrays:
            if p.kind == "prims":
                score = 1 if p.kafka_type == "string" and any(n in _TOPIC_KEYS for n in wanted) else 0
            else:
                score = sum(1 for n in wanted if _field_value_in_class(p.nested, n))  # type: ignore[arg-type]
            if score > best_score:
                best, best_score = p, score
    if best is None:
        return None
    value = getattr(req, best.name)
    return tuple(value) if value is not None else ()


def _field_value_in_class(cls: type, name: str) -> bool:
    names = {p.name for p in _plan(cls)}
    if name in names:
        return True
    return any(name in g and names.intersection(g) for g in (_TOPIC_KEYS, _PARTITION_KEYS))


def _error_entity(cls: type, req: Any, code: int, message: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in _plan(cls):
        if p.tagged:
            continue
        if p.kind == "prim":
            if p.kafka_type == "error_code":
                out[p.name] = code
            elif p.name == "error_message":
                out[p.name] = message
            elif isinstance(req, str) and p.name in _TOPIC_KEYS:
                out[p.name] = req
            elif (v := _field_value(req, p.name)) is not dataclasses.MISSING and not isinstance(v, (tuple, list)) \
                    and not dataclasses.is_dataclass(v):
                out[p.name] = v
            elif p.name in _UNKNOWN and p.kafka_type in ("int32", "int64"):
                out[p.name] = -1
        elif p.kind == "entities":
            items = _array_source(p, req)
            if items is not None:
                out[p.name] = [_error_entity(p.nested, item, code, message) for item in items]  # type: ignore[arg-type]
    return out


def error_response_body(api_key: int, version: int, request: Any, code: int, message: str | None) -> dict[str, Any]:
    """A response body answering every entry of ``request`` with ``code`` (Kafka's getErrorResponse)."""
    return _error_entity(response_class(api_key, version), request, code, message)


# --- array lengths are checked before kio sees them --------------------------------------------
# kio's native reader reserves memory for an array's declared length before reading it, so one
# frame claiming 2^31 elements aborts the whole process (a Rust allocation failure cannot be
# caught). Walking the frame first and refusing an array longer than the bytes left (every
# element takes at least one byte) keeps a hostile frame to a closed connection.

_FIXED = {"int8": 1, "bool": 1, "int16": 2, "uint16": 2, "error_code": 2, "int32": 4, "timedelta_i32": 4,
          "int64": 8, "timedelta_i64": 8, "datetime_i64": 8, "float64": 8, "uuid": 16}


class _Stop(Exception):
    """The frame ends early or uses a layout the guard does not model: kio decides."""


def _uvarint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 35:
            raise _Stop
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _signed(buf: bytes | memoryview, pos: int, fmt: struct.Struct) -> tuple[int, int]:
    if pos + fmt.size > len(buf):
        raise _Stop
    return fmt.unpack_from(buf, pos)[0], pos + fmt.size


def _length(buf: bytes | memoryview, pos: int, flexible: bool, legacy: struct.Struct) -> tuple[int, int]:
    """Element/byte count of an array, string or bytes field; -1 for null."""
    if flexible:
        n, pos = _uvarint(buf, pos)
        return n - 1, pos
    return _signed(buf, pos, legacy)


def _skip_prim(buf: bytes | memoryview, pos: int, kafka_type: str | None, flexible: bool) -> int:
    size = _FIXED.get(kafka_type or "")
    if size is not None:
        return pos + size
    if kafka_type == "string":
        n, pos = _length(buf, pos, flexible, _I16)
    elif kafka_type in ("bytes", "records"):
        n, pos = _length(buf, pos, flexible, _I32)
    else:
        raise _Stop
    return pos + max(n, 0)


def _walk_field(buf: bytes | memoryview, pos: int, p: _FieldPlan, flexible: bool, owner: type) -> int:
    if p.kind == "prim":
        return _skip_prim(buf, pos, p.kafka_type, flexible)
    if p.kind == "entity":
        if p.optional and not p.tagged:
            raise _Stop  # a nullable struct has a presence byte; none is in a request kcli serves
        return _walk(buf, pos, p.nested)  # type: ignore[arg-type]
    n, pos = _length(buf, pos, flexible, _I32)
    if n > len(buf) - pos:
        raise ProtocolError(f"array {p.name} of {owner.__name__} claims {n} elements "
                            f"but only {len(buf) - pos} bytes follow")
    size = _FIXED.get(p.kafka_type or "") if p.kind == "prims" else _fixed_size(p.nested)  # type: ignore[arg-type]
    if size is not None and (p.kind == "prims" or not flexible):
        return pos + max(n, 0) * size
    if size is not None:  # flexible fixed-width entities: each is followed by its tag section
        for _ in range(n):
            pos += size
            if pos < len(buf) and buf[pos] == 0:
                pos += 1
            else:
                pos = _walk_tags(buf, pos, p.nested)  # type: ignore[arg-type]
        return pos
    for _ in range(max(n, 0)):
        pos = (_skip_prim(buf, pos, p.kafka_type, flexible) if p.kind == "prims"
               else _walk(buf, pos, p.nested))  # type: ignore[arg-type]
        if pos > len(buf):
            raise _Stop
    return pos


@lru_cache(maxsize=None)
def _tagged_structures(cls: type) -> dict[int, _FieldPlan]:
    """Tag number → plan of the tagged fields that can hold arrays (structs and arrays)."""
    tags = {f.name: f.metadata["tag"] for f in dataclasses.fields(cls) if "tag" in f.metadata}
    return {tags[p.name]: p for p in _plan(cls) if p.tagged and p.kind != "prim" and p.name in tags}


@lru_cache(maxsize=None)
def _fixed_size(cls: type) -> int | None:
    """Bytes of the untagged fields when all are fixed-width (most partition-level entities)."""
    sizes = [_FIXED.get(p.kafka_type or "") if p.kind == "prim" else None for p in _plan(cls) if not p.tagged]
    return None if None in sizes else sum(sizes)  # type: ignore[arg-type]


def _walk(buf: bytes | memoryview, pos: int, cls: type) -> int:
    flexible = bool(cls.__flexible__)
    fixed = _fixed_size(cls)
    if fixed is not None:
        pos += fixed
    else:
        for p in _plan(cls):
            if not p.tagged:
                pos = _walk_field(buf, pos, p, flexible, cls)
    if flexible:
        if pos < len(buf) and buf[pos] == 0:  # the usual empty tag section
            return pos + 1
        return _walk_tags(buf, pos, cls)
    return pos


def _walk_tags(buf: bytes | memoryview, pos: int, cls: type) -> int:
    structures = _tagged_structures(cls)
    count, pos = _uvarint(buf, pos)
    for _ in range(count):
        tag, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        if tag in structures:  # a tagged struct or array could hide a huge length too
            try:
                _walk_field(bytes(buf[pos:pos + size]), 0, structures[tag], True, cls)
            except _Stop:
                pass
        pos += size
    return pos


def guard_array_lengths(frame: bytes | memoryview, body_pos: int, cls: type) -> None:
    """Raise ProtocolError if an array in the request body claims more elements than bytes remain."""
    try:
        _walk(frame, body_pos, cls)
    except _Stop:
        pass

