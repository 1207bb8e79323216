"""One record per line as ``<crc32c hex> <json>``: the format of kcli's small durable logs.

The cluster metadata log, the committed-offsets log and the remote log metadata log all use it,
so a torn or damaged line is recognised the same way everywhere (decode returns None).
"""

from __future__ import annotations

import json
from typing import Any

from crc32c import crc32c


def encode_line(rec: dict[str, Any]) -> bytes:
    payload = json.dumps(rec, separators=(",", ":"), sort_keys=True).encode()
    return b"%08x " % crc32c(payload) + payload + b"\n"


def decode_line(line: bytes) -> dict[str, Any] | None:
    """The record on ``line`` (without its newline), or None if the CRC or JSON is bad."""
    try:
        crc_hex, payload = line.split(b" ", 1)
        if int(crc_hex, 16) != crc32c(payload):
            return None
        rec = json.loads(payload)
        return rec if isinstance(rec, dict) else None
    except (ValueError, json.JSONDecodeError):
        return None
