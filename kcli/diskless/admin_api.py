"""kcli's admin API: broker metrics and diskless inspection over the Kafka wire protocol.

Operators need numbers a Kafka client cannot ask for (upload latencies, WAL objects, garbage).
Rather than a second listener, kcli adds a few API keys in its reserved range 32000-32099 (see
kcli/protocol/kcli_schemas.py); each carries one JSON document each way, so adding a field
never needs a new wire version. Request ``{json: string}``; response ``{error_code: int16,
json: string}`` where ``json`` holds the result, or ``{"error": message}`` when error_code != 0.

Keys (all version 0, flexible):

- 32010 KcliBrokerMetrics     ``{}`` → counters, latency summaries and gauges
- 32011 KcliDisklessDescribe  ``{"topics": [names] | null}`` → offsets and storage per topic
- 32012 KcliDisklessObjects   ``{"state", "topic", "object_key", "batches": bool}`` → WAL objects
- 32013 KcliDisklessVerify    ``{"object_keys": [..] | null, "max_objects": n}`` → integrity report,
  orphans (upload intent recorded, never committed) and unknown objects (no record at all)
- 32014 KcliDisklessGc        ``{"dry_run": bool, "orphans": bool, "unknown_objects": bool}`` → what
  was (or would be) deleted; unknown objects only with ``"unknown_objects": true``

Documented in docs/diskless.md.
"""

# No `from __future__ import annotations`: kio and codec.build read the real field types.
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kio.schema.request_header.v2.header import RequestHeader
from kio.schema.response_header.v1.header import ResponseHeader
from kio.static.constants import EntityType
from kio.static.primitive import i16

from kcli.protocol import codec

BROKER_METRICS_KEY = 32010
DISKLESS_DESCRIBE_KEY = 32011
DISKLESS_OBJECTS_KEY = 32012
DISKLESS_VERIFY_KEY = 32013
DISKLESS_GC_KEY = 32014

API_NAMES = {
    BROKER_METRICS_KEY: "KcliBrokerMetrics",
    DISKLESS_DESCRIBE_KEY: "KcliDisklessDescribe",
    DISKLESS_OBJECTS_KEY: "KcliDisklessObjects",
    DISKLESS_VERIFY_KEY: "KcliDisklessVerify",
    DISKLESS_GC_KEY: "KcliDisklessGc",
}
VERSION = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class KcliJsonRequest:
    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(VERSION)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(BROKER_METRICS_KEY)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    json: str = field(metadata={"kafka_type": "string"})
    """The request document (a JSON object)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KcliJsonResponse:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(VERSION)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(BROKER_METRICS_KEY)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    error_code: i16 = field(metadata={"kafka_type": "int16"})
    """0, or a Kafka error code (kcli's own codes included)."""
    json: str = field(metadata={"kafka_type": "string"})
    """The result document, or {"error": message}."""


def _classes_for(api_key: int) -> tuple[type, type]:
    """One request/response pair per key so each entity reports its own __api_key__."""
    name = API_NAMES[api_key]
    req = type(f"{name}Request", (KcliJsonRequest,), {"__api_key__": i16(api_key), "__slots__": ()})
    resp = type(f"{name}Response", (KcliJsonResponse,), {"__api_key__": i16(api_key), "__slots__": ()})
    return req, resp


SCHEMAS: dict[int, tuple[type, type]] = {key: _classes_for(key) for key in API_NAMES}


def register() -> None:
    """Make codec.request_class/response_class resolve these keys (idempotent)."""
    for key, (req, resp) in SCHEMAS.items():
        codec.register_schema(key, VERSION, req, resp)


def encode_doc(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"), default=str)


def call(bootstrap: str, api_key: int, doc: dict[str, Any] | None = None, *, timeout: float = 30.0,
         properties: dict[str, str] | None = None) -> Any:
    """Send one admin request to ``bootstrap`` and return the decoded result document.
    ``properties``: the client's security settings (kcli/protocol/security.py).

    Raises KafkaApiError with the broker's error name when error_code != 0."""
    from kcli.errors import KafkaApiError, OperationError
    from kcli.protocol.client import WireClient
    from kcli.protocol.errors import error_name

    with WireClient(bootstrap, timeout=timeout, properties=properties) as client:
        resp = client.request(api_key, VERSION, {"json": encode_doc(doc or {})})
    try:
        result = json.loads(resp.json) if resp.json else {}
    except ValueError:
        raise OperationError(f"{API_NAMES[api_key]}: the broker sent a malformed JSON document") from None
    code = int(resp.error_code)
    if code != 0:
        message = result.get("error", "") if isinstance(result, dict) else ""
        raise KafkaApiError(error_name(code), message, code)
    return result


register()
