"""Transaction state of diskless partitions, shared by both coordinators (seed 004: the batch
coordinator replaces the partition leader for it).

Per partition the coordinator keeps each producer's open transaction (producer id → the offset of
its first transactional batch there) and the aborted ranges (producer id, first offset, offset of
the ABORT marker). A commit collects what its batches do to transactions as events, in offset
order; :func:`apply_events` folds them into the open transactions read under the commit's locks
and says which rows change. The last stable offset of a partition is the smallest first offset of
its open transactions, else its high watermark.
"""

from __future__ import annotations

from typing import NamedTuple

from plugins.coordinator.base import TXN_ABORT, TXN_DATA


class TxnEvent(NamedTuple):
    """A committed transactional batch or marker: its log, producer, kind (TXN_*) and offset."""

    log_id: int
    producer_id: int
    kind: int
    offset: int


class TxnChanges(NamedTuple):
    """Rows to write: open transactions to delete and to insert (pair → first offset), and the
    aborted ranges (log_id, producer id, first offset, last offset) to add."""

    deleted: list[tuple[int, int]]
    inserted: dict[tuple[int, int], int]
    aborted: list[tuple[int, int, int, int]]


def apply_events(stored: dict[tuple[int, int], int], events: list[TxnEvent]) -> TxnChanges:
    """Fold ``events`` into ``stored`` (the open transactions of the events' (log, producer)
    pairs as committed so far). A data batch opens its producer's transaction unless one is
    open; a marker closes it, and an ABORT records the range up to the marker (an ABORT with no
    open transaction records just the marker, as Kafka's log does)."""
    final = dict(stored)
    aborted: list[tuple[int, int, int, int]] = []
    for log_id, pid, kind, offset in events:
        pair = (log_id, pid)
        if kind == TXN_DATA:
            final.setdefault(pair, offset)
            continue
        first = final.pop(pair, offset)
        if kind == TXN_ABORT:
            aborted.append((log_id, pid, first, offset))
    deleted = [pair for pair, first in stored.items() if final.get(pair) != first]
    inserted = {pair: first for pair, first in final.items() if stored.get(pair) != first}
    return TxnChanges(deleted, inserted, aborted)
