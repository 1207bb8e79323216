"""The versioned JSON documents Kafka's tools read (reassignment plans, topics to move, offsets to
delete records to): one parser for the envelope, with Kafka's own messages."""

from __future__ import annotations

import json
from typing import Any

from kcli.errors import UsageError


def versioned_document(text: str, error: type[Exception] = UsageError) -> dict[str, Any]:
    """``{"version": 1, ...}`` as a dict; ``error`` (one line, Kafka's words) for anything else."""
    try:
        doc = json.loads(text)
    except ValueError:
        raise error("The input string is not a valid JSON") from None
    if not isinstance(doc, dict):
        raise error("The input string is not a valid JSON")
    version = doc.get("version", 1)
    if version != 1:
        raise error(f"Not supported version field value {version}")
    return doc
