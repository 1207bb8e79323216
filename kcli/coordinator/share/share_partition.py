"""One share partition: the record states of a share group on one topic-partition (Kafka's
SharePartition), kept by the partition's leader.

Records between the **share-partition start offset** (SPSO) and the **end offset** (the next
offset never handed out) are *in flight*, each in one of Kafka's states:

* ``AVAILABLE`` (0): may be acquired (new, released, or its acquisition lock expired);
* ``ACQUIRED`` (1): handed to one member, under an acquisition lock of
  ``group.share.record.lock.duration.ms``;
* ``ACKNOWLEDGED`` (2): accepted by the member that held it: never delivered again;
* ``ARCHIVED`` (4): rejected, a gap, or released / timed out once its delivery count reached
  ``group.share.delivery.count.limit`` (a poison record): never delivered again.

Acquiring a record bumps its delivery count. The SPSO moves past every acknowledged or archived
record at the front of the window, so the window holds at most what is in flight (new records are
acquired only while the window is shorter than ``group.share.partition.max.record.locks``).
Records below the SPSO are done; records from the end offset on are not delivered yet.

Offsets inside the window that no entry describes are AVAILABLE with delivery count 0 (a state
read back from the persister describes only what differs from that). Everything here runs on
the broker's event loop; the caller persists :meth:`snapshot` after each change it reports.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Any, Iterable

from kio.schema.errors import ErrorCode

AVAILABLE = 0
ACQUIRED = 1
ACKNOWLEDGED = 2
ARCHIVED = 4
STATE_NAMES = {AVAILABLE: "available", ACQUIRED: "acquired", ACKNOWLEDGED: "acknowledged", ARCHIVED: "archived"}

# Acknowledge types (ShareFetch / ShareAcknowledge AcknowledgementBatch.AcknowledgeTypes).
GAP = 0
ACCEPT = 1
RELEASE = 2
REJECT = 3
RENEW = 4

_BATCH_HEADER = struct.Struct(">qi")  # base offset, batch length
_LAST_DELTA = struct.Struct(">i")  # at byte 23 of a v2 batch


def now_ms() -> int:
    return int(time.monotonic() * 1000)


class _Rec:
    __slots__ = ("state", "count", "member", "deadline")

    def __init__(self, state: int, count: int, member: str | None = None, deadline: int = 0) -> None:
        self.state = state
        self.count = count
        self.member = member
        self.deadline = deadline


@dataclass
class Batch:
    """A stored record batch as read from the log: its offsets and its bytes."""

    base: int
    last: int
    data: memoryview


def split_batches(records: Any) -> list[Batch]:
    """The whole v2 batches of a read (a torn tail, which a read never returns, is dropped)."""
    if not records:
        return []
    view = memoryview(records) if not isinstance(records, memoryview) else records
    out = []
    pos, size = 0, len(view)
    while pos + 61 <= size:
        base, length = _BATCH_HEADER.unpack_from(view, pos)
        end = pos + 12 + length
        if length < 49 or end > size:
            break
        (delta,) = _LAST_DELTA.unpack_from(view, pos + 23)
        out.append(Batch(base, base + delta, view[pos:end]))
        pos = end
    return out


class InvalidRecordState(Exception):
    pass


class SharePartition:
    """The in-flight records of (group, topic, partition)."""

    def __init__(self, group_id: str, topic: str, partition: int, *, lock_ms: int, max_delivery: int,
                 max_locks: int) -> None:
        self.group_id = group_id
        self.topic = topic
        self.partition = partition
        self.lock_ms = lock_ms
        self.max_delivery = max_delivery
        self.max_locks = max_locks
        self.start_offset = 0
        self.end_offset = 0
        self.state_epoch = 0
        self.records: dict[int, _Rec] = {}
        self.acquired = 0
        self.next_deadline = 0
        self.fenced = False  # another broker wrote a newer state epoch: drop this copy

    # -- persisted form (Kafka's ShareSnapshotValue: state epoch, start offset, state batches)
    def load(self, state: dict[str, Any]) -> None:
        self.state_epoch = int(state.get("state_epoch", 0))
        self.start_offset = int(state.get("start_offset", 0))
        self.records = {}
        end = self.start_offset
        for first, last, st, count in state.get("batches", ()):
            for o in range(max(int(first), self.start_offset), int(last) + 1):
                self.records[o] = _Rec(int(st) if int(st) != ACQUIRED else AVAILABLE, int(count))
            end = max(end, int(last) + 1)
        self.end_offset = end
        self.acquired = 0
        self._advance()

    def snapshot(self) -> dict[str, Any]:
        """What a restart must keep: acquired records are kept as available (their locks do not
        survive the broker), with their delivery counts; a run of never-delivered available
        records is left out (that is what an offset no batch describes means)."""
        runs: list[list[int]] = []
        for o in sorted(self.records):
            r = self.records[o]
            st = AVAILABLE if r.state == ACQUIRED else r.state
            if st == AVAILABLE and r.count == 0:
                continue
            if runs and runs[-1][1] == o - 1 and runs[-1][2] == st and runs[-1][3] == r.count:
                runs[-1][1] = o
            else:
                runs.append([o, o, st, r.count])
        return {"state_epoch": self.state_epoch, "start_offset": self.start_offset, "batches": runs}

    def reset(self, start_offset: int) -> None:
        """AlterShareGroupOffsets: a new start offset, nothing in flight, a new state epoch."""
        self.start_offset = self.end_offset = int(start_offset)
        self.records = {}
        self.acquired = 0
        self.state_epoch += 1

    # -- views
    def available_in_window(self) -> int | None:
        """The lowest acquirable offset below the end offset, or None."""
        for o in range(self.start_offset, self.end_offset):
            r = self.records.get(o)
            if r is None or r.state == AVAILABLE:
                return o
        return None

    def in_flight(self) -> int:
        return self.end_offset - self.start_offset

    # -- the log moved
    def move_start(self, log_start: int) -> bool:
        """Records below the log start offset are gone (retention, DeleteRecords): the SPSO
        follows, as Kafka's share partition does. True when something changed."""
        if log_start <= self.start_offset:
            return False
        for o in [o for o in self.records if o < log_start]:
            if self.records.pop(o).state == ACQUIRED:
                self.acquired -= 1
        self.start_offset = log_start
        self.end_offset = max(self.end_offset, log_start)
        self._advance()
        return True

    # -- acquiring
    def acquire(self, member_id: str, batches: list[Batch], max_records: int, *, in_window_only: bool,
                from_offset: int | None = None, now: int | None = None) -> tuple[list[tuple[int, int, int]], list[Batch]]:
        """Acquire records of ``batches`` (read from the log) for ``member_id``: available ones in
        the window, then (unless ``in_window_only``) whole new batches from the end offset while
        ``max_records`` and the window limit allow. Returns the acquired ranges (first, last,
        delivery count) and the batches that hold them. ``from_offset``: where the read started;
        window offsets between it and the batches read hold no record (compacted or deleted) and
        are archived, as a client acknowledges such offsets with GAP."""
        now = now_ms() if now is None else now
        cursor = self.start_offset if from_offset is None else max(from_offset, self.start_offset)
        deadline = now + self.lock_ms
        got: list[int] = []
        counts: list[int] = []
        used: list[Batch] = []
        for b in batches:
            if len(got) >= max_records:
                break
            if b.last < self.start_offset:
                continue
            took = False
            for o in range(cursor, min(b.base, self.end_offset)):
                r = self.records.get(o)
                if r is None or r.state == AVAILABLE:
                    self.records[o] = _Rec(ARCHIVED, r.count if r is not None else 0)
            cursor = max(cursor, b.last + 1)
            if b.base < self.end_offset:  # (partly) inside the window: its available records
                for o in range(max(b.base, self.start_offset), min(b.last + 1, self.end_offset)):
                    r = self.records.get(o)
                    if r is None:
                        r = self.records[o] = _Rec(AVAILABLE, 0)
                    if r.state != AVAILABLE:
                        continue
                    r.state, r.member, r.deadline = ACQUIRED, member_id, deadline
                    r.count += 1
                    self.acquired += 1
                    got.append(o)
                    counts.append(r.count)
                    took = True
            if not in_window_only and b.last >= self.end_offset:
                if self.end_offset - self.start_offset >= self.max_locks:
                    if took:
                        used.append(b)
                    break
                first = max(b.base, self.end_offset)
                for o in range(self.end_offset, first):  # offsets no batch holds (compacted away)
                    self.records[o] = _Rec(ARCHIVED, 0)
                for o in range(first, b.last + 1):
                    self.records[o] = _Rec(ACQUIRED, 1, member_id, deadline)
                    got.append(o)
                    counts.append(1)
                self.acquired += b.last + 1 - first
                self.end_offset = b.last + 1
                took = True
            if took:
                used.append(b)
        if got and (self.next_deadline == 0 or deadline < self.next_deadline):
            self.next_deadline = deadline
        self._advance()
        return _ranges(got, counts), used

    # -- acknowledging
    def acknowledge(self, member_id: str, batches: Iterable[tuple[int, int, tuple[int, ...]]], *,
                    renew_allowed: bool = False, now: int | None = None) -> int:
        """Apply a member's acknowledgements: all of them or none (Kafka rolls back a partly
        applied request). Returns the error code: INVALID_REQUEST for a malformed batch,
        INVALID_RECORD_STATE when a record is not acquired by this member."""
        plan: list[tuple[int, int]] = []
        for first, last, types in batches:
            first, last = int(first), int(last)
            if first > last or not types or len(types) not in (1, last - first + 1):
                return ErrorCode.invalid_request
            for t in types:
                if t not in (GAP, ACCEPT, RELEASE, REJECT) and not (t == RENEW and renew_allowed):
                    return ErrorCode.invalid_request
            for i, o in enumerate(range(first, last + 1)):
                r = self.records.get(o)
                if r is None or r.state != ACQUIRED or r.member != member_id or not self.start_offset <= o < self.end_offset:
                    return ErrorCode.invalid_record_state
                plan.append((o, int(types[0] if len(types) == 1 else types[i])))
        if len({o for o, _ in plan}) != len(plan):
            return ErrorCode.invalid_request  # the same record acknowledged twice in one request
        now = now_ms() if now is None else now
        for o, t in plan:
            r = self.records[o]
            if t == RENEW:
                r.deadline = now + self.lock_ms
                continue
            self.acquired -= 1
            r.member = None
            if t == ACCEPT:
                r.state = ACKNOWLEDGED
            elif t in (GAP, REJECT):
                r.state = ARCHIVED
            else:
                r.state = ARCHIVED if r.count >= self.max_delivery else AVAILABLE
        self._advance()
        return ErrorCode.none

    def release_member(self, member_id: str) -> int:
        """Release every record ``member_id`` holds (it left, was fenced, closed its session or
        its connection). Returns how many."""
        n = 0
        for r in self.records.values():
            if r.state == ACQUIRED and r.member == member_id:
                self._release(r)
                n += 1
        if n:
            self._advance()
        return n

    def expire_locks(self, now: int | None = None) -> int:
        """Acquisition locks past their deadline: the records are available again (archived once
        their delivery count reached the limit). Returns how many expired."""
        now = now_ms() if now is None else now
        if not self.acquired or (self.next_deadline and now < self.next_deadline):
            return 0
        n = 0
        nxt = 0
        for r in self.records.values():
            if r.state != ACQUIRED:
                continue
            if r.deadline <= now:
                self._release(r)
                n += 1
            elif nxt == 0 or r.deadline < nxt:
                nxt = r.deadline
        self.next_deadline = nxt
        if n:
            self._advance()
        return n

    def _release(self, r: _Rec) -> None:
        r.state = ARCHIVED if r.count >= self.max_delivery else AVAILABLE
        r.member = None
        self.acquired -= 1

    def _advance(self) -> None:
        o = self.start_offset
        recs = self.records
        while o < self.end_offset:
            r = recs.get(o)
            if r is None or r.state not in (ACKNOWLEDGED, ARCHIVED):
                break
            del recs[o]
            o += 1
        self.start_offset = o
        if o == self.end_offset and recs:
            recs.clear()
        if not self.acquired:
            self.next_deadline = 0


def _ranges(offsets: list[int], counts: list[int]) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    for o, c in sorted(zip(offsets, counts)):
        if out and out[-1][1] == o - 1 and out[-1][2] == c:
            out[-1] = (out[-1][0], o, c)
        else:
            out.append((o, o, c))
    return out
