"""Wire schemas of kcli's own APIs, written the way kio generates Kafka's.

kio only knows Kafka's message definitions, so the DeletePartitions API of KIP-694 is defined
here as frozen dataclasses with the ClassVars and ``kafka_type`` metadata kio's serializers
read; :func:`register` makes :mod:`kcli.protocol.codec` find them by API key.

API keys: Kafka's own keys are small (below 100 in 4.x). kcli reserves 32000-32099 (still a
valid int16) for its APIs so a future Kafka key can never collide:

- 32001 DeletePartitions v0 (KIP-694)

DeletePartitions keeps the seed's wire layout. Error codes are typed ``int16`` rather than
kio's ``error_code`` enum so kcli's own codes (201, 202) can be sent. kcli's additions are
tagged fields, which a reader that follows the seed alone skips:
request ``validate_only`` (tag 0); per partition ``delete_at_ms`` (tag 0), ``record_count``
(tag 1) and ``size_bytes`` (tag 2).
"""

# No `from __future__ import annotations`: kio and codec.build read the real field types.
from dataclasses import dataclass, field
from typing import ClassVar

from kio.schema.request_header.v2.header import RequestHeader
from kio.schema.response_header.v1.header import ResponseHeader
from kio.static.constants import EntityType
from kio.static.primitive import i8, i16, i32, i64

from kcli.protocol import codec

DELETE_PARTITIONS_KEY = 32001
DELETE_PARTITIONS_NAME = "DeletePartitions"


# ---- request --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DeletePartitionsTopic:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(DELETE_PARTITIONS_KEY)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    name: str = field(metadata={"kafka_type": "string"})
    """The topic."""
    partitions: tuple[i32, ...] = field(metadata={"kafka_type": "int32"}, default=())
    """The partitions to remove: the highest-numbered ones, N..M-1."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeletePartitionsRequest:
    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(DELETE_PARTITIONS_KEY)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    timeout_ms: i32 = field(metadata={"kafka_type": "int32"})
    """How long the client waits for the answer."""
    delete_partitions_delay: i64 = field(metadata={"kafka_type": "int64"})
    """Milliseconds the partitions stay readable (ReadOnly) before their data is deleted; 0 = now."""
    topics: tuple[DeletePartitionsTopic, ...]
    """The topics to shrink."""
    validate_only: bool = field(metadata={"kafka_type": "bool", "tag": 0}, default=False)
    """kcli: check and plan only, change nothing."""


# ---- response -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DeletePartitionsPartitionResult:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(DELETE_PARTITIONS_KEY)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    status_code: i8 = field(metadata={"kafka_type": "int8"})
    """The partition's mode afterwards: 0 ReadWrite, 1 ReadOnly, -1 None (deleted)."""
    error_code: i16 = field(metadata={"kafka_type": "int16"})
    error_message: str | None = field(metadata={"kafka_type": "string"}, default=None)
    delete_at_ms: i64 = field(metadata={"kafka_type": "int64", "tag": 0}, default=i64(-1))
    """kcli: when the data is (or was) deleted, ms since the epoch."""
    record_count: i64 = field(metadata={"kafka_type": "int64", "tag": 1}, default=i64(-1))
    """kcli: high watermark minus log start offset at the time of the request."""
    size_bytes: i64 = field(metadata={"kafka_type": "int64", "tag": 2}, default=i64(-1))
    """kcli: bytes stored for the partition (local + remote), -1 when unknown."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeletePartitionsTopicResult:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(DELETE_PARTITIONS_KEY)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    name: str = field(metadata={"kafka_type": "string"})
    partitions: tuple[DeletePartitionsPartitionResult, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeletePartitionsResponse:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(DELETE_PARTITIONS_KEY)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    throttle_time_ms: i32 = field(metadata={"kafka_type": "int32"})
    error_code: i16 = field(metadata={"kafka_type": "int16"})
    """Request-level error (e.g. the feature is disabled); per-partition errors are below."""
    error_message: str | None = field(metadata={"kafka_type": "string"}, default=None)
    responses: tuple[DeletePartitionsTopicResult, ...]


def register() -> None:
    """Make codec.request_class/response_class resolve kcli's API keys (idempotent)."""
    codec.register_schema(DELETE_PARTITIONS_KEY, 0, DeletePartitionsRequest, DeletePartitionsResponse)


register()
