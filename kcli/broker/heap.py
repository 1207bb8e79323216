"""Give freed heap memory back to the operating system (glibc's malloc_trim).

After many connections close, their small objects leave the C heap full of free holes that
glibc keeps: RSS would stay at its peak (measured: ~10 KiB per closed connection, never
returned). ``malloc_trim`` releases the free pages inside the heap too, not only its top. On a
libc without it (musl, macOS) this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

_trim: Callable[[int], int] | None = None
try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    _trim = _libc.malloc_trim
    _trim.argtypes = [ctypes.c_size_t]  # type: ignore[attr-defined]
    _trim.restype = ctypes.c_int  # type: ignore[attr-defined]
except (OSError, AttributeError):
    _trim = None


def release_free_memory() -> bool:
    """Return free heap pages to the OS; False when this libc cannot."""
    if _trim is None:
        return False
    _trim(0)
    return True
