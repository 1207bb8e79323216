"""Transactions as one partition sees them: open transactions, the last stable offset and the
aborted ranges a read_committed fetch must be told about (Kafka's ProducerStateManager
ongoing-transaction map plus its TransactionIndex, kept in memory).

A transactional batch of a producer with no open transaction opens one at its first offset; a
marker closes it. An ABORT marker records ``AbortedTxn(producer_id, first_offset, last_offset,
last_stable_offset)`` where ``last_offset`` is the marker's offset. The log rebuilds all of this
by replaying batch headers on open, so nothing here touches files.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from dataclasses import dataclass

TXN_ENTRY = struct.Struct(">hqqqq")  # Kafka's AbortedTxn in a .txnindex: version, producerId, first, last, lastStable


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """One aborted transaction of a partition (Kafka's AbortedTxn, as in a .txnindex entry)."""

    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset
    last_stable_offset: int


class PartitionTxnState:
    """Open and aborted transactions of one partition (see module docstring)."""

    def __init__(self) -> None:
        self.ongoing: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self.aborted: list[AbortedTxn] = []  # by last_offset, ascending
        self._last_offsets: list[int] = []

    def on_data(self, producer_id: int, first_offset: int, transactional: bool) -> None:
        """A data batch was appended: a transactional one may open a transaction."""
        if transactional and producer_id not in self.ongoing:
            self.ongoing[producer_id] = first_offset

    def on_marker(self, producer_id: int, commit: bool, offset: int, high_watermark: int) -> AbortedTxn | None:
        """A marker at ``offset`` closes the producer's transaction; returns the aborted range to
        index for an ABORT that closed an open transaction, else None."""
        first = self.ongoing.pop(producer_id, None)
        if commit or first is None:
            return None
        entry = AbortedTxn(producer_id, first, offset, self.last_stable_offset(high_watermark))
        self.aborted.append(entry)
        self._last_offsets.append(offset)
        return entry

    def last_stable_offset(self, high_watermark: int) -> int:
        """The first offset of the oldest open transaction, else the high watermark."""
        return min(self.ongoing.values(), default=high_watermark) if self.ongoing else high_watermark

    def aborted_between(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions a fetch of offsets ``start..end-1`` overlaps (Kafka's
        collectAbortedTransactions: last offset >= start and first offset < end)."""
        i = bisect_left(self._last_offsets, start)
        return [a for a in self.aborted[i:] if a.first_offset < end]

    def truncate_before(self, log_start: int) -> None:
        """Forget aborted ranges wholly below the log start (their records are gone)."""
        i = bisect_left(self._last_offsets, log_start)
        if i:
            del self.aborted[:i]
            del self._last_offsets[:i]

    def clear(self) -> None:
        self.ongoing.clear()
        self.aborted.clear()
        self._last_offsets.clear()


def parse_txn_index(data: bytes) -> list[AbortedTxn]:
    """The entries of a .txnindex (a torn last entry is ignored)."""
    size = TXN_ENTRY.size
    return [AbortedTxn(pid, first, last, lso)
            for _version, pid, first, last, lso in (TXN_ENTRY.unpack_from(data, i)
                                                    for i in range(0, len(data) - size + 1, size))]
