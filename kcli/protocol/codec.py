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
    i8, i16, i32, i32Timedelta, i64, i64Timedelta, u16, f64, Records,
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
    "error_code": lambda v: ErrorCode(int(v)),
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


@lru_cache(maxsize=None)
def request_class(api_key: int, version: int) -> type:
    return load_request_schema(api_key, version)


@lru_cache(maxsize=None)
def response_class(api_key: int, version: int) -> type:
    return load_response_schema(api_key, version)


@lru_cache(maxsize=None)
def _reader(cls: type) -> Any:
    return entity_reader(cls)


@lru_cache(maxsize=None)
def _writer(cls: type) -> Any:
    return entity_writer(cls)


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
    try:
        entity, _size = _reader(cls)(frame, body_pos)
    except Exception as err:  # kio raises assorted errors on garbage
        raise ProtocolError(f"cannot decode {cls.__name__} v{header.api_version}: {err}") from err
    return entity


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
