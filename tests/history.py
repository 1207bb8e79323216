"""A history of produced (acknowledged) and consumed records, checked for what Kafka promises, so
that a fault test is a few lines: run producers through the fault, read everything back, check.

* every acknowledged record is read back, at the offset its producer was told, with its value;
* the offsets read are unique and contiguous per partition (from the first one read);
* each producer's acknowledged records of a partition are in the order it sent them;
* with idempotent producers no value is read twice (nothing acknowledged or retried is doubled).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition


@dataclass
class Ack:
    producer: str
    seq: int  # the order the producer sent it in
    partition: int
    offset: int
    value: bytes
    at: float  # time.monotonic() of the delivery report


@dataclass
class History:
    acks: list[Ack] = field(default_factory=list)
    failures: list[tuple[str, int, Any, float]] = field(default_factory=list)  # (producer, seq, error, at)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record_ack(self, a: Ack) -> None:
        with self.lock:
            self.acks.append(a)

    def record_failure(self, producer: str, seq: int, err: Any) -> None:
        with self.lock:
            self.failures.append((producer, seq, err, time.monotonic()))

    def acked_between(self, start: float, end: float | None = None) -> list[Ack]:
        with self.lock:
            return [a for a in self.acks if a.at >= start and (end is None or a.at <= end)]

    def first_ack_after(self, t: float) -> float | None:
        with self.lock:
            later = [a.at for a in self.acks if a.at > t]
        return min(later) if later else None

    def check(self, consumed: list[tuple[int, int, bytes]], *, idempotent: bool = True) -> dict[str, Any]:
        """Raise AssertionError naming the first broken promise; return a small summary."""
        by_pos: dict[tuple[int, int], bytes] = {}
        for partition, offset, value in consumed:
            assert (partition, offset) not in by_pos, f"offset {offset} of partition {partition} read twice"
            by_pos[(partition, offset)] = value
        per_partition: dict[int, list[int]] = defaultdict(list)
        for partition, offset, _ in consumed:
            per_partition[partition].append(offset)
        for partition, offsets in per_partition.items():
            offsets.sort()
            gaps = [(a, b) for a, b in zip(offsets, offsets[1:]) if b != a + 1]
            assert not gaps, f"partition {partition}: offsets not contiguous, gaps after {gaps[:5]}"
        seen_acks: dict[tuple[int, int], Ack] = {}
        for a in self.acks:
            other = seen_acks.get((a.partition, a.offset))
            assert other is None, f"offset {a.offset} of partition {a.partition} acknowledged twice ({other.value!r}, {a.value!r})"
            seen_acks[(a.partition, a.offset)] = a
            got = by_pos.get((a.partition, a.offset))
            assert got is not None, f"acknowledged record {a.value!r} at {a.partition}/{a.offset} is missing"
            assert got == a.value, f"at {a.partition}/{a.offset}: acknowledged {a.value!r}, read {got!r}"
        order: dict[tuple[str, int], list[Ack]] = defaultdict(list)
        for a in sorted(self.acks, key=lambda a: a.seq):
            order[(a.producer, a.partition)].append(a)
        for (producer, partition), acks in order.items():
            for x, y in zip(acks, acks[1:]):
                assert x.offset < y.offset, f"{producer} partition {partition}: {x.value!r} (sent first) at {x.offset}, {y.value!r} at {y.offset}"
        if idempotent:
            values: dict[bytes, tuple[int, int]] = {}
            for partition, offset, value in consumed:
                assert value not in values, f"{value!r} read twice: at {values[value]} and {(partition, offset)}"
                values[value] = (partition, offset)
        return {"acknowledged": len(self.acks), "read": len(consumed), "failed": len(self.failures)}


class HistoryProducer:
    """A confluent-kafka producer in a thread sending ``<name>-<seq>`` values, each delivery report
    recorded in the history. ``stop()`` flushes and joins."""

    def __init__(self, history: History, bootstrap: str, topic: str, name: str = "p", *, rate_per_s: float = 200,
                 partition: int | None = None, **conf: Any) -> None:
        self.history, self.topic, self.name, self.partition = history, topic, name, partition
        self.interval = 1.0 / rate_per_s
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                  "linger.ms": 5, "message.timeout.ms": 60000, "retry.backoff.ms": 100,
                                  "topic.metadata.refresh.interval.ms": 1000, **conf})
        self.seq = 0
        self._stop = threading.Event()
        self._paused = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"history-producer-{name}", daemon=True)
        self.thread.start()

    def _report(self, seq: int, value: bytes):  # noqa: ANN202
        def done(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                self.history.record_failure(self.name, seq, err)
            else:
                self.history.record_ack(Ack(self.name, seq, msg.partition(), msg.offset(), value, time.monotonic()))
        return done

    def _run(self) -> None:
        while not self._stop.is_set():
            value = f"{self.name}-{self.seq:08d}".encode()
            kwargs: dict[str, Any] = {"value": value, "on_delivery": self._report(self.seq, value)}
            if self.partition is not None:
                kwargs["partition"] = self.partition
            try:
                self.producer.produce(self.topic, **kwargs)
                self.seq += 1
            except BufferError:
                pass
            self.producer.poll(self.interval)

    def stop(self, flush_s: float = 60.0) -> int:
        self._stop.set()
        self.thread.join(10)
        return self.producer.flush(flush_s)


def read_all(bootstrap: str, topic: str, partitions: int, timeout_s: float = 60.0) -> list[tuple[int, int, bytes]]:
    """Every record of ``topic`` from the start to each partition's high watermark."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"history-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", "enable.partition.eof": True})
    try:
        ends = {}
        deadline = time.monotonic() + timeout_s
        for p in range(partitions):
            while True:
                try:
                    ends[p] = c.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1]
                    break
                except Exception:  # noqa: BLE001 - leader moving: ask again
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: list[tuple[int, int, bytes]] = []
        done = {p for p, end in ends.items() if end == 0}
        while len(done) < partitions and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF and m.offset() >= ends[m.partition()]:
                    done.add(m.partition())
                continue
            if m.offset() < ends[m.partition()]:
                out.append((m.partition(), m.offset(), m.value()))
            if m.offset() + 1 >= ends[m.partition()]:
                done.add(m.partition())
        assert len(done) == partitions, f"read timed out: {len(out)} records, partitions done {sorted(done)} of {ends}"
        return out
    finally:
        c.close()


@dataclass
class TxnHistory:
    """Transactions a transactional producer ran, by outcome: ``committed`` (commit_transaction
    returned), ``aborted`` (abort_transaction returned, or never committed), ``unknown`` (the
    producer failed between the two: all or nothing of it may be visible). Values are unique."""

    committed: list[list[bytes]] = field(default_factory=list)
    aborted: list[list[bytes]] = field(default_factory=list)
    unknown: list[list[bytes]] = field(default_factory=list)

    def check(self, read_committed: list[tuple[int, int, bytes]]) -> dict[str, Any]:
        """What a read_committed consumer read is exactly the committed transactions: every
        committed value once, no aborted value, an unknown transaction whole or not at all, and
        nothing else; offsets unique per partition."""
        positions = [(p, o) for p, o, _ in read_committed]
        assert len(positions) == len(set(positions)), "an offset was read twice"
        seen: dict[bytes, int] = defaultdict(int)
        for _, _, value in read_committed:
            seen[value] += 1
        doubled = [v for v, n in seen.items() if n > 1]
        assert not doubled, f"read more than once: {doubled[:5]}"
        missing = [v for txn in self.committed for v in txn if v not in seen]
        assert not missing, f"{len(missing)} committed records missing, e.g. {missing[:5]}"
        leaked = [v for txn in self.aborted for v in txn if v in seen]
        assert not leaked, f"{len(leaked)} aborted records read with read_committed, e.g. {leaked[:5]}"
        for txn in self.unknown:
            present = sum(1 for v in txn if v in seen)
            assert present in (0, len(txn)), f"a transaction is partly visible: {present} of {len(txn)}"
        known = {v for group in (self.committed, self.aborted, self.unknown) for txn in group for v in txn}
        strangers = [v for v in seen if v not in known]
        assert not strangers, f"records no transaction wrote: {strangers[:5]}"
        return {"committed": len(self.committed), "aborted": len(self.aborted), "unknown": len(self.unknown),
                "read": len(read_committed)}


def read_committed(bootstrap: str, topic: str, partitions: int, timeout_s: float = 60.0) -> list[tuple[int, int, bytes]]:
    """Every record of ``topic`` a read_committed consumer gets, up to each partition's last stable
    offset (ListOffsets latest with read_committed)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"history-rc-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    try:
        deadline = time.monotonic() + timeout_s
        ends: dict[int, int] = {}
        for p in range(partitions):
            while True:
                try:
                    ends[p] = c.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1]
                    break
                except Exception:  # noqa: BLE001 - leader moving: ask again
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: list[tuple[int, int, bytes]] = []
        pos = {p: 0 for p in range(partitions)}
        while time.monotonic() < deadline:
            # control records and aborted data take offsets a consumer never sees: position() tells
            for tp in c.position([TopicPartition(topic, p) for p in range(partitions)]):
                if tp.offset >= 0:
                    pos[tp.partition] = max(pos[tp.partition], tp.offset)
            if all(pos[p] >= ends[p] for p in range(partitions)):
                break
            m = c.poll(0.5)
            if m is None or m.error() is not None:
                continue
            if m.offset() < ends[m.partition()]:
                out.append((m.partition(), m.offset(), m.value()))
            pos[m.partition()] = max(pos[m.partition()], m.offset() + 1)
        assert all(pos[p] >= ends[p] for p in range(partitions)), f"read timed out at {pos} of {ends}"
        return out
    finally:
        c.close()
