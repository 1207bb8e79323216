"""Saying a thing once: a bounded set of keys already reported, so a fault met on every request (a
damaged batch read by each fetch) is logged once, while memory stays bounded however many there are."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


class FirstTimes:
    """Keys seen so far, the oldest forgotten past ``keep`` (then reported again: never unbounded)."""

    def __init__(self, keep: int = 10_000) -> None:
        self.keep = keep
        self._seen: OrderedDict[Hashable, None] = OrderedDict()

    def first(self, key: Hashable) -> bool:
        """True the first time ``key`` is seen (and remembers it)."""
        if key in self._seen:
            return False
        self._seen[key] = None
        while len(self._seen) > self.keep:
            self._seen.popitem(last=False)
        return True
