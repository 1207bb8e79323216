"""kcat's consumer format strings (``kcat -C -f '%t [%p] %o: %k %s\\n'``) for ``kcli consume -f``.

The string is parsed once into literal bytes and token letters; each record is then rendered to
bytes, so binary keys and values pass through unchanged as with kcat. Tokens and escapes are
kcat's (see ``kcat -h``): a null key or value prints as nothing, its size as -1; a null
header value as NULL.
"""

from __future__ import annotations

import re
import struct
from typing import Any, Callable

from kcli.errors import UsageError

TOKENS = "sSRkKThtpo"
_ESCAPE = re.compile(rb"\\(x[0-9a-fA-F]{1,3}|[nrt\\])")
_SIMPLE_ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"\\": b"\\"}


def _unescape(text: bytes) -> bytes:
    def one(m: re.Match[bytes]) -> bytes:
        code = m.group(1)
        if code.startswith(b"x"):
            value = int(code[1:], 16)
            if value > 255:
                raise UsageError(f"--format: \\{code.decode()} is not one byte")
            return bytes([value])
        return _SIMPLE_ESCAPES[code]

    return _ESCAPE.sub(one, text)


def _size(value: bytes | None) -> bytes:
    return b"-1" if value is None else str(len(value)).encode()


def _headers(headers: list[tuple[str, bytes | None]]) -> bytes:
    """kcat's %h: ``name=value`` pairs separated by commas; a null value prints as NULL."""
    return b",".join(k.encode() + b"=" + (b"NULL" if v is None else v) for k, v in headers)


_RENDER: dict[str, Callable[[Any], bytes]] = {
    "s": lambda r: r.value or b"",
    "S": lambda r: _size(r.value),
    "R": lambda r: struct.pack(">i", -1 if r.value is None else len(r.value)),
    "k": lambda r: r.key or b"",
    "K": lambda r: _size(r.key),
    "T": lambda r: str(-1 if r.timestamp is None else r.timestamp).encode(),
    "h": lambda r: _headers(r.headers),
    "t": lambda r: r.topic.encode(),
    "p": lambda r: str(r.partition).encode(),
    "o": lambda r: str(r.offset).encode(),
}


class RecordFormat:
    """A parsed format string; :meth:`render` turns one consumed record into bytes."""

    def __init__(self, fmt: str) -> None:
        if not fmt:
            raise UsageError("--format must not be empty")
        self.parts: list[bytes | str] = []  # literal bytes, or a token letter
        raw = fmt.encode()
        literal = b""
        i = 0
        while i < len(raw):
            if raw[i:i + 1] != b"%":
                literal += raw[i:i + 1]
                i += 1
                continue
            token = raw[i + 1:i + 2].decode(errors="replace")
            if token == "%":
                literal += b"%"
            elif token in TOKENS and token:
                if literal:
                    self.parts.append(_unescape(literal))
                    literal = b""
                self.parts.append(token)
            else:
                shown = f"%{token}" if token else "a trailing %"
                raise UsageError(f"--format: unsupported token {shown}; kcat's tokens are "
                                 + " ".join(f"%{t}" for t in TOKENS))
            i += 2
        if literal:
            self.parts.append(_unescape(literal))

    def render(self, record: Any) -> bytes:
        return b"".join(p if isinstance(p, bytes) else _RENDER[p](record) for p in self.parts)
