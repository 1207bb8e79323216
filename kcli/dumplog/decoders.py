"""Key/value decoders for --print-data-log (Kafka's --key-decoder-class / --value-decoder-class).

Kafka loads a Decoder class; an operator tool mostly needs four fixed renderings, so we take a
name. ``string`` is Kafka's StringDecoder (UTF-8, malformed bytes become U+FFFD).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Callable

DECODERS = ("string", "hex", "base64", "json")


class DecodeError(ValueError):
    """One record's key or value could not be decoded; printed in place of the data."""


def _string(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _hex(data: bytes) -> str:
    return binascii.hexlify(data).decode("ascii")


def _base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _json_text(data: bytes) -> str:
    """Re-serialise compactly: one line per record whatever the producer's indentation."""
    return json.dumps(_json_value(data), separators=(",", ":"), ensure_ascii=False)


def _json_value(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise DecodeError(f"not JSON: {err}") from None


TEXT: dict[str, Callable[[bytes], str]] = {"string": _string, "hex": _hex, "base64": _base64, "json": _json_text}
# For -o json: the json decoder embeds the parsed value instead of a string holding JSON.
VALUE: dict[str, Callable[[bytes], Any]] = {"string": _string, "hex": _hex, "base64": _base64, "json": _json_value}


def text_decoder(name: str) -> Callable[[bytes], str]:
    try:
        return TEXT[name]
    except KeyError:
        raise ValueError(f"unknown decoder {name!r} (choose from {', '.join(DECODERS)})") from None


def value_decoder(name: str) -> Callable[[bytes], Any]:
    try:
        return VALUE[name]
    except KeyError:
        raise ValueError(f"unknown decoder {name!r} (choose from {', '.join(DECODERS)})") from None
