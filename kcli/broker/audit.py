"""Audit lines for changes clients make to topics: who (principal, host) did what to which topic.

Kafka's controller logs "Created topic ... with topic ID ..." / "Deleted topic ..." and its authorizer logs the
principal and host of each operation; here one INFO line says both, with the same facts as
structured fields (``event``, ``topic``, ``principal``, ``client_host``, ...) for the json format.
A refused change is logged too (INFO: it is the client's error, not the broker's), validate-only
requests are not (nothing changed).
"""

from __future__ import annotations

import logging
from typing import Any

from kcli.broker.dispatch import HANDLERS, RequestContext
from kcli.protocol.errors import BrokerError, error_name

log = logging.getLogger("kcli.broker.audit")


def _who(ctx: RequestContext) -> dict[str, Any]:
    return {"principal": ctx.connection.principal, "client_host": ctx.connection.peer.rsplit(":", 1)[0],
            "client_id": ctx.client_id,
            "api": h.name if (h := HANDLERS.get(ctx.header.api_key)) else str(ctx.header.api_key)}


def changed(ctx: RequestContext, event: str, text: str, topic: str, **fields: Any) -> None:
    """``text`` (already formatted) plus " (principal P from HOST)"; ``event`` names it for machines."""
    who = _who(ctx)
    log.info("%s (principal %s from %s)", text, who["principal"], who["client_host"],
             extra={"event": event, "topic": topic, **fields, **who})


def refused(ctx: RequestContext, operation: str, topic: str, err: BrokerError) -> None:
    """A topic change the broker answered with an error code."""
    who = _who(ctx)
    code = error_name(err.code)
    log.info("Refused %s of topic %s: %s%s (principal %s from %s)", operation, topic, code,
             f": {err.message}" if err.message else "", who["principal"], who["client_host"],
             extra={"event": f"topic.{operation.replace(' ', '_')}.refused", "topic": topic, "error": code, **who})


def topic_id_str(topic_id: Any) -> str:
    """A topic id as Kafka and its tools print it (URL-safe base64, 22 characters)."""
    import base64
    import uuid

    if isinstance(topic_id, uuid.UUID):
        return base64.urlsafe_b64encode(topic_id.bytes).decode().rstrip("=")
    return str(topic_id)


def format_configs(configs: dict[str, str | None]) -> str:
    """``{a=1, b=<default>}``: Kafka's style for config maps in log lines."""
    return "{" + ", ".join(f"{k}={'<default>' if v is None else v}" for k, v in sorted(configs.items())) + "}"
