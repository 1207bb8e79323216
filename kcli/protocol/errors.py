"""Kafka protocol error codes, by Kafka's own upper-case names.

kio ships Kafka's error table; kcli adds the codes its proposals need that Kafka has not
assigned (documented in docs/protocol.md).
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

# Codes kcli defines for the proposals it implements. Kafka's table ends well below 200;
# these sit in a block Kafka does not use so they never collide with a future release.
TIERED_STORAGE_DISABLEMENT_IN_PROGRESS = 200
PARTITION_READ_ONLY = 201
TOPIC_UNDER_CHANGES = 202

_EXTRA = {
    TIERED_STORAGE_DISABLEMENT_IN_PROGRESS: "TIERED_STORAGE_DISABLEMENT_IN_PROGRESS",
    PARTITION_READ_ONLY: "PARTITION_READ_ONLY",
    TOPIC_UNDER_CHANGES: "TOPIC_UNDER_CHANGES",
}


def error_name(code: int) -> str:
    """Kafka's upper-case name for ``code`` (``42`` → ``INVALID_REQUEST``)."""
    if code in _EXTRA:
        return _EXTRA[code]
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"UNKNOWN_ERROR_CODE_{code}"


class BrokerError(Exception):
    """Raised inside the broker to answer a request (or one partition) with an error code."""

    def __init__(self, code: int | ErrorCode, message: str = "") -> None:
        self.code = int(code)
        self.message = message
        super().__init__(f"{error_name(self.code)}: {message}" if message else error_name(self.code))
