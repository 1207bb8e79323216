"""Request routing: one async handler per API key, each owning a range of versions.

A handler receives the decoded kio request entity and returns a plain dict of response fields
(see :func:`kcli.protocol.codec.build`) or ``None`` when Kafka sends no response (Produce with
acks=0). Raising :class:`~kcli.protocol.errors.BrokerError` answers with that error code in the
response's top-level ``error_code`` where the schema has one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from kcli.protocol.codec import RequestHeader


@dataclass
class ConnectionState:
    """Per-connection facts a handler may need (peer, SASL progress)."""

    peer: str
    authenticated: bool = True
    principal: str = "User:ANONYMOUS"
    sasl_mechanism: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    listener: str = "PLAINTEXT"  # the listener's name: Metadata answers with its addresses
    sasl_listener: bool = False  # the listener's protocol is SASL_PLAINTEXT or SASL_SSL


@dataclass
class RequestContext:
    broker: Any  # the kcli.broker.broker.Broker serving the request (typed loosely: it imports the handlers)
    header: RequestHeader
    connection: ConnectionState

    @property
    def api_version(self) -> int:
        return self.header.api_version

    @property
    def client_id(self) -> str:
        return self.header.client_id or ""


HandlerFn = Callable[[RequestContext, Any], Awaitable[dict[str, Any] | None]]


@dataclass(frozen=True)
class ApiHandler:
    api_key: int
    name: str
    min_version: int
    max_version: int
    fn: HandlerFn


HANDLERS: dict[int, ApiHandler] = {}


def handler(api_key: int, name: str, min_version: int, max_version: int) -> Callable[[HandlerFn], HandlerFn]:
    """Register ``fn`` as the handler of ``api_key`` for versions min..max (inclusive)."""

    def register(fn: HandlerFn) -> HandlerFn:
        HANDLERS[api_key] = ApiHandler(api_key, name, min_version, max_version, fn)
        return fn

    return register


def load_all_handlers() -> dict[int, ApiHandler]:
    """Import every handler module so their decorators run."""
    import importlib
    import pkgutil

    import kcli.broker.handlers as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{pkg.__name__}.{mod.name}")
    return HANDLERS
