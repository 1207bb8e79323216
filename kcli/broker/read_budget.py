"""The broker-wide budget of bytes buffered for large requests being read (queued.max.request.bytes).

Kafka draws every request buffer from one memory pool of ``queued.max.request.bytes`` and stops
reading a connection (mutes it) while the pool is empty. kcli charges the buffers of requests too
large for a connection's own small read buffer: an eagerly allocated frame is charged whole, a
lazily filled one window by window as bytes may arrive, so a client that announces 100 MB and
stalls holds one window, not 100 MB. A connection that cannot get budget pauses reading until
some is given back.

Like Kafka's non-strict pool, one holder at a time may go past the limit, by at most one request
(``socket.request.max.bytes``): otherwise connections that each hold part of the budget and each
need more could wait for each other forever. Memory for partly read large requests is therefore
bounded by ``limit + max_request``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

# A waiter's retry: True when it got what it waited for (or no longer needs it).
Retry = Callable[[], bool]


class ReadBudget:
    def __init__(self, limit: int, max_request: int) -> None:
        self.limit = limit  # <= 0: unbounded (Kafka's -1)
        self.max_request = max_request
        self.used = 0
        self._overdraft: Hashable | None = None  # the one holder allowed past the limit
        self._waiters: dict[Hashable, Retry] = {}  # insertion order = FIFO

    @property
    def bounded(self) -> bool:
        return self.limit > 0

    def take(self, owner: Hashable, n: int) -> bool:
        """Charge ``n`` bytes to ``owner`` if the budget allows; False means: wait()."""
        if not self.bounded or self.used + n <= self.limit:
            self.used += n
            return True
        if self._overdraft in (None, owner) and self.used + n <= self.limit + self.max_request:
            self._overdraft = owner
            self.used += n
            return True
        return False

    def charge(self, n: int) -> None:
        """Charge ``n`` bytes unasked (a read already under way); given back like any other."""
        self.used += n

    def wait(self, owner: Hashable, retry: Retry) -> None:
        """Call ``retry`` (in arrival order) whenever budget is given back, until it returns True."""
        self._waiters[owner] = retry

    def give_back(self, n: int) -> None:
        if n <= 0:
            return
        self.used -= n
        if self.used <= self.limit:
            self._overdraft = None  # nobody is past the limit any more
        self._wake()

    def forget(self, owner: Hashable) -> None:
        """``owner`` is gone (its charge must be given back separately)."""
        self._waiters.pop(owner, None)
        if self._overdraft is owner:
            self._overdraft = None
            self._wake()

    def _wake(self) -> None:
        for owner, retry in list(self._waiters.items()):
            if self._waiters.get(owner) is not retry:
                continue
            if retry():
                self._waiters.pop(owner, None)
