#!/usr/bin/env python3
"""Crash soak: SIGKILL the broker at named moments while an idempotent producer writes.

One confluent-kafka idempotent producer (acks=all) writes uniquely numbered records to a
classic, a tiered and a diskless topic. Each round SIGKILLs the broker inside one window —

- ``objectstore.upload.wal``: halfway through a WAL object upload,
- ``diskless.commit``: inside the batch coordinator's commit transaction,
- ``log.roll``: between closing a classic segment and creating the next,
- ``objectstore.upload.tiered``: halfway through copying a segment to the remote tier,
- ``random``: no pause point, a random moment —

found by the broker's pause points (kcli/faults.py: the broker prints one line and sleeps there,
this script kills it during the sleep), restarts it, and checks:

- every ACKNOWLEDGED record is readable exactly once, at the offset its acknowledgement gave,
  and in production order per partition (losses, duplicates, misplaced, order violations: 0);
- duplicates counts payload ids read more than once, acknowledged or not. A record that was
  never acknowledged may be present or absent; the producer outlives the broker, so its retries
  keep their producer id and sequence and are deduplicated — if it had to be recreated (a fatal
  error), its predecessor's unacknowledged retries could appear once each, never twice;
- WAL objects the coordinator does not know that existed at the kill (orphans) are deleted
  within the grace period plus a cleaner pass; remote-tier objects always belong to a segment
  the remote log metadata knows (no leaked copy).

Usage: python3 bench/crash_soak.py [--rounds 40] [--quick] [--seed N] [--failure-rate 0.05]
Figures go to bench/run_all's table (rounds, records, losses, duplicates, restart and recovery
times, orphans collected); tests/test_crash.py runs the same rounds in its default and slow
variants. Documented in docs/reliability.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.brokerproc import BrokerProcess  # noqa: E402

POINTS = ("objectstore.upload.wal", "diskless.commit", "log.roll", "objectstore.upload.tiered", "random")
# Windows in different threads can be open at once: one kill inside both (the default test's rounds).
COMBINED = ("objectstore.upload.wal+diskless.commit", "log.roll+objectstore.upload.tiered", "random")
# The default test's and --quick's rounds: every window once. A WAL upload and a commit are only
# open together for the gap between the starts of two consecutive uploads (the next upload starts
# at most an append interval after the one being committed, and pauses as long), so that pair is
# killed apart here; the soak's schedule still tries the combination.
QUICK = ("objectstore.upload.wal", "diskless.commit", "log.roll+objectstore.upload.tiered", "random")
KINDS = ("classic", "tiered", "diskless")
PARTITIONS = 2
GRACE_MS = 800  # diskless.file.cleaner.retention.period.ms
CLEANER_INTERVAL_MS = 200
PAYLOAD_BYTES = 200
WINDOW_TIMEOUT_S = 40.0  # waiting for a round's windows to be open at once; then kill anyway
MISS_RETRIES = 2  # a round that missed its window(s) is run again this many times

BROKER_CONFIGS = {
    "remote.log.storage.system.enable": "true",
    "remote.log.manager.task.interval.ms": "200",
    "log.retention.check.interval.ms": "300",
    "diskless.append.commit.interval.ms": "50",
    "diskless.file.cleaner.interval.ms": str(CLEANER_INTERVAL_MS),
    "diskless.file.cleaner.retention.period.ms": str(GRACE_MS),
    "diskless.retention.check.interval.ms": "300",
    "group.initial.rebalance.delay.ms": "0",
    "diskless.storage.class.name": "plugins.objectstore.faulty.FaultyObjectStorage",
}
TOPIC_CONFIGS = {
    "classic": {"segment.bytes": "32768"},
    "tiered": {"segment.bytes": "32768", "remote.storage.enable": "true", "local.retention.bytes": "65536"},
    "diskless": {"diskless.enable": "true"},
}


def topic_name(kind: str) -> str:
    return f"crash-{kind}"


# ---------------------------------------------------------------------------------------------
# the producer and what it was told
# ---------------------------------------------------------------------------------------------


def payload(kind: str, producer: str, seq: int) -> bytes:
    """``kind|producer|seq|`` then padding; ``producer`` names the producer instance."""
    head = b"%s|%s|%09d|" % (kind.encode(), producer.encode(), seq)
    return head + b"x" * max(0, PAYLOAD_BYTES - len(head))


def payload_id(value: bytes) -> tuple[str, str, int]:
    kind, producer, seq, _ = value.split(b"|", 3)
    return kind.decode(), producer.decode(), int(seq)


class Ledger:
    """What the producer sent and what the broker acknowledged (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: dict[tuple[str, str, int], tuple[int, int]] = {}  # id -> (partition, offset)
        self.failed: dict[tuple[str, str, int], str] = {}
        self.sent = 0
        self.ack_times: list[float] = []

    def on_delivery(self, err: Any, msg: Any) -> None:
        pid = payload_id(msg.value())
        with self.lock:
            if err is not None:
                self.failed[pid] = str(err)
            else:
                self.acked[pid] = (msg.partition(), msg.offset())
                self.ack_times.append(time.monotonic())

    def failure_reasons(self) -> dict[str, int]:
        with self.lock:
            return dict(collections.Counter(self.failed.values()).most_common(5))

    def acked_count(self) -> int:
        with self.lock:
            return len(self.acked)

    def snapshot(self) -> dict[tuple[str, str, int], tuple[int, int]]:
        with self.lock:
            return dict(self.acked)

    def acks_after(self, t: float) -> int:
        with self.lock:
            return sum(1 for x in self.ack_times if x > t)

    def first_ack_after(self, t: float) -> float | None:
        with self.lock:
            return next((x for x in self.ack_times if x > t), None)


class ProducerThread(threading.Thread):
    """Writes ``rate`` records per second over the three topics through ``lanes`` idempotent
    producers (one connection each: the broker serves a connection's requests one at a time, so
    with two, one request's upload overlaps another's commit) until stopped. A producer is
    recreated — a new producer id, a new name ``L<lane>.<incarnation>`` — only after a fatal error."""

    def __init__(self, bootstrap: str, ledger: Ledger, rate: int, lanes: int = 2, max_outstanding: int = 3000) -> None:
        super().__init__(name="crash-soak-producer", daemon=True)
        self.bootstrap = bootstrap
        self.ledger = ledger
        self.rate = rate
        self.max_outstanding = max_outstanding
        self.stop_event = threading.Event()
        self.fatal_errors: list[str] = []
        self._fatal: set[int] = set()
        self.incarnation = [0] * lanes
        self.producers = [self._new_producer(lane) for lane in range(lanes)]

    def name_of(self, lane: int) -> str:
        return f"L{lane}.{self.incarnation[lane]}"

    def _new_producer(self, lane: int) -> Any:
        from confluent_kafka import Producer

        def on_error(err: Any) -> None:
            if err.fatal():
                self.fatal_errors.append(str(err))
                self._fatal.add(lane)

        return Producer({
            # Different lingers keep the lanes' requests in different WAL objects (two producers
            # answered together would otherwise stay in step, their uploads never overlapping a commit).
            "bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 5 + 95 * lane,
            "batch.size": 16384,  # below the topics' segment.bytes (else RECORD_LIST_TOO_LARGE)
            "message.timeout.ms": 180000, "retry.backoff.ms": 50, "retry.backoff.max.ms": 500,
            "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500, "error_cb": on_error,
            "log_level": 0,  # connection refused while the broker is down is expected, not news
        })

    def outstanding(self) -> int:
        return sum(len(p) for p in self.producers)

    def run(self) -> None:
        seq: dict[tuple[str, str], int] = collections.defaultdict(int)
        started = time.monotonic()
        sent = 0
        lanes = len(self.producers)
        while not self.stop_event.is_set():
            for lane in list(self._fatal):
                self._replace_producer(lane)
            due = int((time.monotonic() - started) * self.rate)
            while sent < due and self.outstanding() < self.max_outstanding and not self.stop_event.is_set():
                kind = KINDS[sent % len(KINDS)]
                lane = (sent // len(KINDS)) % lanes
                name = self.name_of(lane)
                n = seq[(kind, name)]
                try:
                    self.producers[lane].produce(topic_name(kind), payload(kind, name, n), key=b"%d" % n,
                                                 on_delivery=self.ledger.on_delivery)
                except BufferError:
                    self.producers[lane].poll(0.05)
                    continue
                seq[(kind, name)] += 1
                sent += 1
                with self.ledger.lock:
                    self.ledger.sent += 1
            if self.outstanding() >= self.max_outstanding:
                started += 0.01  # back-pressure: do not build up a debt of records to send
            for p in self.producers:
                p.poll(0.005)

    def _replace_producer(self, lane: int) -> None:
        old = self.producers[lane]
        old.flush(0)
        old.poll(0.5)
        self.incarnation[lane] += 1
        self._fatal.discard(lane)
        self.producers[lane] = self._new_producer(lane)

    def finish(self, timeout: float = 120.0) -> int:
        """Stop producing and wait for every outstanding delivery report; returns how many are left."""
        self.stop_event.set()
        self.join(30)
        return sum(p.flush(timeout) for p in self.producers)


# ---------------------------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------------------------


def read_topic(bootstrap: str, topic: str, timeout: float = 90.0) -> list[tuple[int, int, bytes]]:
    """Every record of ``topic`` from the log start to the high watermark: (partition, offset, value)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"crash-verify-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "enable.partition.eof": True, "auto.offset.reset": "earliest",
                  "fetch.wait.max.ms": 100})
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(PARTITIONS)}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        out: list[tuple[int, int, bytes]] = []
        position = {p: -1 for p in range(PARTITIONS)}
        deadline = time.monotonic() + timeout
        while any(position[p] + 1 < ends[p] for p in ends):
            if time.monotonic() > deadline:
                raise AssertionError(f"reading {topic} timed out at {position} of {ends}")
            for m in c.consume(1000, 0.5):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(m.error())
                if m.offset() < ends[m.partition()]:
                    out.append((m.partition(), m.offset(), m.value()))
                position[m.partition()] = max(position[m.partition()], m.offset())
        return out
    finally:
        c.close()


@dataclass
class DataCheck:
    acked: int = 0
    read: int = 0
    losses: int = 0
    duplicates: int = 0
    misplaced: int = 0
    order_violations: int = 0
    unacked_present: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.losses or self.duplicates or self.misplaced or self.order_violations)


def check_data(bootstrap: str, acked: dict[tuple[str, str, int], tuple[int, int]],
               later: Any = None) -> DataCheck:
    """Read all three topics and compare them with the acknowledgements in ``acked`` (taken
    before reading); ``later()``, called after reading, tells which records read were
    acknowledged meanwhile (they are not "unacknowledged but present")."""
    result = DataCheck(acked=len(acked))
    topics = {kind: read_topic(bootstrap, topic_name(kind)) for kind in KINDS}
    acked_after = later() if later is not None else acked
    for kind, records in topics.items():
        result.read += len(records)
        where: dict[tuple[str, str, int], list[tuple[int, int]]] = collections.defaultdict(list)
        last_seq: dict[tuple[int, str], tuple[int, int]] = {}  # (partition, producer) -> (offset, seq)
        for partition, offset, value in sorted(records, key=lambda r: (r[0], r[1])):
            pid = payload_id(value)
            where[pid].append((partition, offset))
            prev = last_seq.get((partition, pid[1]))
            if prev is not None and pid[2] <= prev[1]:
                result.order_violations += 1
                result.examples.append(f"{kind}-{partition}: seq {pid[2]} at {offset} after seq {prev[1]} at {prev[0]}")
            last_seq[(partition, pid[1])] = (offset, pid[2])
        for pid, places in where.items():
            if len(places) > 1:
                result.duplicates += len(places) - 1
                result.examples.append(f"duplicate {pid} at {places}")
            if pid not in acked_after:
                result.unacked_present += 1
        for pid, place in acked.items():
            if pid[0] != kind:
                continue
            places = where.get(pid)
            if not places:
                result.losses += 1
                result.examples.append(f"lost acknowledged {pid} (acknowledged at {place})")
            elif place not in places:
                result.misplaced += 1
                result.examples.append(f"{pid} acknowledged at {place}, read at {places}")
    del result.examples[20:]
    return result


def wal_listing(objects_dir: Path) -> tuple[dict[str, float], set[str]]:
    """WAL objects (key -> mtime) under ``objects/wal``, and upload temp files anywhere in the
    store (a crash mid-upload leaves them; list() never shows them)."""
    from plugins.objectstore.local import TEMP_SUFFIX

    objects: dict[str, float] = {}
    wal = objects_dir / "wal"
    if wal.is_dir():
        for p in wal.iterdir():
            try:
                mtime = p.stat().st_mtime
            except FileNotFoundError:
                continue
            if not p.name.endswith(TEMP_SUFFIX):
                objects[f"wal/{p.name}"] = mtime
    temps = {str(p) for p in objects_dir.rglob(f"*{TEMP_SUFFIX}")} if objects_dir.is_dir() else set()
    return objects, temps


def known_wal_keys(data_dir: Path) -> set[str]:
    from plugins.coordinator.sqlite import SqliteBatchCoordinator

    with SqliteBatchCoordinator(data_dir / "diskless" / "coordinator.db", read_only=True) as c:
        return c.known_object_keys()


def remote_segment_ids(data_dir: Path) -> dict[str, str]:
    """Segment id (Kafka form) -> state of every remote segment the metadata still knows."""
    from kcli.tiered.metadata import RemoteLogMetadataStore
    from plugins.rsm.object_store import kafka_uuid

    store = RemoteLogMetadataStore(data_dir, read_only=True).open()
    try:
        return {kafka_uuid(md.segment_id.id): md.state.value for md in store.all_segments()}
    finally:
        store.close()


def tiered_unfinished(data_dir: Path, before_ms: float) -> list[str]:
    """Remote segments a crash left mid-copy or mid-delete (state changed before ``before_ms``) that
    recovery has not finished yet."""
    from kcli.tiered.metadata import RemoteLogMetadataStore
    from plugins.rsm.base import RemoteLogSegmentState as S

    store = RemoteLogMetadataStore(data_dir, read_only=True).open()
    try:
        return [f"{md.segment_id.topic}-{md.segment_id.partition}@{md.start_offset} {md.state.value}"
                for md in store.all_segments(states=(S.COPY_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED))
                if md.event_timestamp_ms < before_ms]
    finally:
        store.close()


def tiered_leaks(data_dir: Path, objects_dir: Path) -> list[str]:
    """Remote-tier objects whose segment the remote log metadata does not know (before or after
    the listing: a segment is recorded before its first object and forgotten after its last)."""
    before = remote_segment_ids(data_dir)
    keys = [str(p.relative_to(objects_dir)) for p in (objects_dir / "tiered").rglob("*")
            if p.is_file() and not p.name.startswith(".")] if (objects_dir / "tiered").is_dir() else []
    after = remote_segment_ids(data_dir)
    known = set(before) | set(after)
    leaks = []
    for key in keys:
        name = key.rsplit("/", 1)[-1]
        segment_id = name.split("-", 1)[1].rsplit(".", 1)[0] if "-" in name else name
        if segment_id not in known:
            leaks.append(key)
    return leaks


# ---------------------------------------------------------------------------------------------
# the soak
# ---------------------------------------------------------------------------------------------


@dataclass
class RoundResult:
    round: int
    point: str
    hit: bool  # the kill landed inside the named window(s)
    restart_s: float  # SIGKILL -> listening again
    recovery_s: float | None  # listening -> first new acknowledgement
    check: DataCheck
    orphans_at_kill: int
    orphans_left: int
    orphans_collected_s: float | None  # SIGKILL -> the last orphan of the crash deleted
    upload_temp_files_at_kill: int
    upload_temp_files_left: int
    tiered_leaks: int
    tiered_unfinished: int  # remote segments left mid-copy/mid-delete by the crash, not cleaned up
    failed_deliveries: int
    fatal_errors: int
    seconds: dict[str, float] = field(default_factory=dict)  # where the round's time went

    @property
    def ok(self) -> bool:
        return (self.check.ok and self.orphans_left == 0 and self.upload_temp_files_left == 0
                and self.tiered_leaks == 0 and self.tiered_unfinished == 0)

    def line(self) -> str:
        c = self.check
        recovery = "-" if self.recovery_s is None else f"{self.recovery_s:.2f}s"
        return (f"round {self.round:3d} {self.point:40s} in-window={'yes' if self.hit else 'NO'} "
                f"restart={self.restart_s:.2f}s first-ack={recovery} acked={c.acked} read={c.read} "
                f"losses={c.losses} duplicates={c.duplicates} misplaced={c.misplaced} order={c.order_violations} "
                f"unacked-present={c.unacked_present} orphans={self.orphans_at_kill}->{self.orphans_left} "
                f"temp-files={self.upload_temp_files_at_kill}->{self.upload_temp_files_left} "
                f"tiered-leaks={self.tiered_leaks} tiered-unfinished={self.tiered_unfinished} seconds={self.seconds}")


class CrashSoak:
    """A broker, its three topics and a producer; :meth:`round` kills and checks once."""

    def __init__(self, work_dir: Path, *, seed: int | None = None, pause_ms: int = 600, rate: int = 400,
                 failure_rate: float = 0.0, log: Any = print) -> None:
        self.work_dir = Path(work_dir)
        self.data_dir = self.work_dir / "data"
        self.objects_dir = self.data_dir / "objects"
        self.switch = self.work_dir / "fault-points-armed"  # kcli.fault.switch.file
        self.seed = random.SystemRandom().randrange(2**31) if seed is None else seed
        self.rng = random.Random(self.seed)
        self.pause_ms = pause_ms
        self.rate = rate
        self.failure_rate = failure_rate
        self.log = log
        self.ledger = Ledger()
        self.broker: BrokerProcess | None = None
        self.producer: ProducerThread | None = None
        self.results: list[RoundResult] = []

    # -- lifecycle ---------------------------------------------------------------------------
    def configs(self, point: str | None) -> dict[str, str]:
        """Broker configs with the pause of each of ``point``'s windows ("a+b": several)."""
        c = dict(BROKER_CONFIGS)
        c["diskless.storage.delegate.uri"] = self.objects_dir.absolute().as_uri()
        c["diskless.storage.seed"] = str(self.seed)
        if self.failure_rate:
            c["diskless.storage.failure.rate"] = str(self.failure_rate)
        c["kcli.fault.switch.file"] = str(self.switch)
        for p in (point or "").split("+"):
            if p and p != "random":
                c[f"kcli.fault.{p}.pause.ms"] = str(self.pause_for(p))
        return c

    def pause_for(self, point: str) -> int:
        """Uploads pause twice as long as the rest, so an upload started just before a commit or a
        roll is still open when that pauses (combined rounds need both open at once)."""
        return self.pause_ms * 2 if point.startswith("objectstore.upload.") else self.pause_ms

    def start(self, first_point: str | None) -> "CrashSoak":
        from confluent_kafka.admin import AdminClient, NewTopic

        self.objects_dir.mkdir(parents=True, exist_ok=True)
        self.broker = BrokerProcess(self.data_dir, self.configs(first_point)).start()
        admin = AdminClient({"bootstrap.servers": self.broker.bootstrap})
        fs = admin.create_topics([NewTopic(topic_name(k), PARTITIONS, 1, config=TOPIC_CONFIGS[k]) for k in KINDS],
                                 operation_timeout=30)
        for f in fs.values():
            f.result(30)
        self.producer = ProducerThread(self.broker.bootstrap, self.ledger, self.rate)
        self.producer.start()
        self._wait_acks(200, 60, "first acknowledgements")
        self.log(f"crash soak: seed {self.seed}, broker {self.broker.bootstrap}, data {self.data_dir}")
        return self

    def close(self) -> None:
        if self.producer is not None and self.producer.is_alive():
            self.producer.stop_event.set()
            self.producer.join(30)
        if self.broker is not None:
            self.broker.stop()

    def __enter__(self) -> "CrashSoak":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wait_acks(self, n: int, timeout: float, what: str) -> None:
        target = self.ledger.acked_count() + n
        deadline = time.monotonic() + timeout
        while self.ledger.acked_count() < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; broker log:\n{self._log_tail()}")
            time.sleep(0.05)

    def _log_tail(self) -> str:
        return self.broker.log_text()[-3000:] if self.broker else ""

    def _kill_inside(self, points: list[str], since: int, timeout: float) -> bool:
        """SIGKILL the broker while every one of ``points`` is inside its pause (each announces
        itself in the broker log when it starts pausing); True if that happened in time, else the
        broker is killed anyway when ``timeout`` runs out."""
        assert self.broker is not None
        announce = re.compile(rb"kcli fault point (\S+): pausing \d+ ms until ([0-9.]+)")
        until: dict[str, float] = {}  # wall-clock end of each point's latest pause
        margin = 0.15  # delivering SIGKILL takes a little while
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(self.broker.log_path, "rb") as f:
                    f.seek(since)
                    text = f.read()
            except FileNotFoundError:
                text = b""
            for m in announce.finditer(text):
                p = m.group(1).decode()
                if p in points:
                    until[p] = float(m.group(2))
            if len(until) == len(points):
                # Seconds until the first of the pauses ends: the broker wrote when each ends, so
                # a loaded machine that lets this loop notice late cannot make it kill too late.
                left = min(until.values()) - time.time() - margin
                if left > 0:
                    time.sleep(self.rng.uniform(0, left / 2))
                    if time.time() < min(until.values()) - margin:  # a starved sleep may overrun
                        self.broker.kill9()
                        return True
            time.sleep(0.005)
        self.broker.kill9()
        return False

    # -- one round -----------------------------------------------------------------------------
    def round(self, point: str, next_point: str | None, retry_miss: bool = False) -> RoundResult:
        """Kill inside ``point``'s window(s) (the broker runs with their pauses configured),
        restart with ``next_point``'s pauses configured, then check everything."""
        assert self.broker is not None and self.producer is not None
        n = len(self.results) + 1
        t0 = time.monotonic()
        since = self.broker.log_path.stat().st_size if self.broker.log_path.exists() else 0
        if point == "random":
            time.sleep(self.rng.uniform(0.2, 1.5))
            self.broker.kill9()
            hit = True
        else:
            self.switch.touch()  # arm the pause points only now: the checks ran at full speed
            try:
                hit = self._kill_inside(point.split("+"), since, WINDOW_TIMEOUT_S)
            finally:
                self.switch.unlink(missing_ok=True)
        killed = time.monotonic()
        killed_wall = time.time()
        failed_before = len(self.ledger.failed)
        objects, temps = wal_listing(self.objects_dir)
        self.broker.configs = self.configs(point if retry_miss and not hit else next_point)
        self.broker.start()
        restarted = time.monotonic()
        # Orphans of the crash: objects the coordinator does not know that were there at the kill.
        known = known_wal_keys(self.data_dir)
        orphans = {k for k, mtime in objects.items() if k not in known and mtime <= killed_wall}
        self._wait_acks(100, 90, f"acknowledgements after restart in round {n}")
        t_acks = time.monotonic()
        first = self.ledger.first_ack_after(restarted)
        acked = self.ledger.snapshot()
        check = check_data(self.broker.bootstrap, acked, self.ledger.snapshot)
        t_check = time.monotonic()
        # The cleaner deletes orphans and abandoned upload temp files once past the grace period.
        orphans_left, temps_left, collected_s = self._wait_collected(orphans, temps, killed)
        unfinished = self._wait_tiered_recovered(killed_wall * 1000, killed)
        leaks = tiered_leaks(self.data_dir, self.objects_dir)
        t_end = time.monotonic()
        seconds = {"window": round(killed - t0, 2), "restart": round(restarted - killed, 2),
                   "acks": round(t_acks - restarted, 2), "check": round(t_check - t_acks, 2),
                   "collect": round(t_end - t_check, 2)}
        result = RoundResult(
            n, point, hit, round(restarted - killed, 3), None if first is None else round(first - restarted, 3),
            check, len(orphans), orphans_left, collected_s, len(temps), temps_left, len(leaks), len(unfinished),
            len(self.ledger.failed) - failed_before, len(self.producer.fatal_errors), seconds)
        self.results.append(result)
        self.log(result.line())
        for example in check.examples[:5] + leaks[:5] + unfinished[:5]:
            self.log(f"  {example}")
        return result

    def _wait_tiered_recovered(self, before_ms: float, killed: float) -> list[str]:
        deadline = killed + 30
        while True:
            left = tiered_unfinished(self.data_dir, before_ms)
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)

    def _wait_collected(self, orphans: set[str], temps: set[str], killed: float) -> tuple[int, int, float | None]:
        deadline = killed + (GRACE_MS + 4 * max(CLEANER_INTERVAL_MS, GRACE_MS // 2)) / 1000 + 15
        while True:
            present, temps_now = wal_listing(self.objects_dir)
            left, temps_left = orphans & set(present), temps & temps_now
            if not left and not temps_left:
                return 0, 0, round(time.monotonic() - killed, 3) if orphans or temps else None
            if time.monotonic() > deadline:
                return len(left), len(temps_left), None
            time.sleep(0.1)

    def run(self, points: list[str]) -> list[RoundResult]:
        """One round per point. A kill that missed its window (the windows did not overlap in
        time) still counts as a checked round, and the point is tried again, up to
        MISS_RETRIES times, so every window is hit however the host's timing falls."""
        self.start(points[0] if points else None)
        i = misses = 0
        while i < len(points):
            retry = misses < MISS_RETRIES
            result = self.round(points[i], points[i + 1] if i + 1 < len(points) else None, retry_miss=retry)
            if not result.hit and retry:
                misses += 1
                continue
            i, misses = i + 1, 0
        return self.results

    # -- the end -------------------------------------------------------------------------------
    def final_check(self) -> DataCheck:
        """Stop producing, wait for every delivery report, check once more with everything."""
        assert self.producer is not None and self.broker is not None
        left = self.producer.finish()
        if left:
            raise AssertionError(f"{left} deliveries still outstanding")
        return check_data(self.broker.bootstrap, self.ledger.snapshot())

    def offline_tools(self) -> dict[str, int]:
        """Stop the broker and run `kcli diskless verify` (offline) and `kcli dump-log` over what
        the crashes left: exit codes (0 = nothing damaged). In this process: kcli's own entry
        point, without paying an interpreter start per command."""
        import contextlib
        import io

        from kcli.cli import app as app_module

        assert self.broker is not None
        self.broker.stop()
        db = self.data_dir / "diskless" / "coordinator.db"
        codes: dict[str, int] = {}
        for name, args in (
            ("diskless verify", ["diskless", "verify", "--coordinator", f"sqlite://{db}",
                                 "--object-store", self.objects_dir.absolute().as_uri(), "--engine", "local"]),
            ("dump-log", ["dump-log", *sorted(str(p) for p in self.data_dir.glob(f"{topic_name('classic')}-*/*.log"))]),
        ):
            out, err = io.StringIO(), io.StringIO()
            saved, sys.argv = sys.argv, ["kcli", *args]
            code = 0
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    app_module.main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            finally:
                sys.argv = saved
            codes[name] = code
            if code != 0:
                self.log(f"{name} exited {code}: {err.getvalue()[-2000:]}")
        return codes


def summary(results: list[RoundResult], final: DataCheck | None) -> dict[str, Any]:
    restart = [r.restart_s for r in results]
    recovery = [r.recovery_s for r in results if r.recovery_s is not None]
    collected = [r.orphans_collected_s for r in results if r.orphans_collected_s is not None]
    last = final or (results[-1].check if results else DataCheck())
    return {
        "rounds": len(results),
        "rounds_in_window": sum(r.hit for r in results),
        "records_acknowledged": last.acked,
        "records_read": last.read,
        "losses": sum(r.check.losses for r in results) + (final.losses if final else 0),
        "duplicates": sum(r.check.duplicates for r in results) + (final.duplicates if final else 0),
        "misplaced": sum(r.check.misplaced for r in results) + (final.misplaced if final else 0),
        "order_violations": sum(r.check.order_violations for r in results) + (final.order_violations if final else 0),
        "unacknowledged_present": last.unacked_present,
        "failed_deliveries": sum(r.failed_deliveries for r in results),
        "fatal_producer_errors": max((r.fatal_errors for r in results), default=0),
        "orphans_at_kill": sum(r.orphans_at_kill for r in results),
        "orphans_left": sum(r.orphans_left for r in results),
        "upload_temp_files_at_kill": sum(r.upload_temp_files_at_kill for r in results),
        "upload_temp_files_left": sum(r.upload_temp_files_left for r in results),
        "tiered_leaks": sum(r.tiered_leaks for r in results),
        "tiered_unfinished": sum(r.tiered_unfinished for r in results),
        "restart_s_mean": round(sum(restart) / len(restart), 3) if restart else None,
        "restart_s_max": max(restart, default=None),
        "recovery_s_mean": round(sum(recovery) / len(recovery), 3) if recovery else None,
        "recovery_s_max": max(recovery, default=None),
        "orphans_collected_s_max": max(collected, default=None),
        "by_point": dict(collections.Counter(r.point for r in results)),
    }


def schedule(rounds: int, rng: random.Random) -> list[str]:
    """Every window alone and the two combined kills in turn, shuffled per cycle (each window
    gets its share of kills)."""
    out: list[str] = []
    while len(out) < rounds:
        cycle = list(POINTS) + list(COMBINED[:2])
        rng.shuffle(cycle)
        out += cycle
    return out[:rounds]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="the default test's 4 rounds (every window once)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--rate", type=int, default=400, help="records per second over the three topics")
    parser.add_argument("--pause-ms", type=int, default=600, help="length of the window at each pause point")
    parser.add_argument("--failure-rate", type=float, default=0.0,
                        help="also fail this share of object-store operations (FaultyObjectStorage)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    points = list(QUICK) if args.quick else schedule(args.rounds, random.Random(seed))
    work = Path(tempfile.mkdtemp(prefix="kcli-crash-soak-"))
    started = time.monotonic()
    soak = CrashSoak(work, seed=seed, pause_ms=args.pause_ms, rate=args.rate, failure_rate=args.failure_rate)
    try:
        soak.run(points)
        final = soak.final_check()
        tools = soak.offline_tools()
    finally:
        soak.close()
        if not args.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    s = summary(soak.results, final)
    s.update({"seed": seed, "seconds": round(time.monotonic() - started, 1), "offline_tools_exit_codes": tools,
              "failure_rate": args.failure_rate})
    if args.json:
        print(json.dumps(s, indent=2))
    else:
        for k, v in s.items():
            print(f"{k:28s} {v}")
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from report import record

        record("crash soak: rounds (SIGKILL + restart)", s["rounds"], target="", unit="rounds")
        record("crash soak: acknowledged records checked", s["records_acknowledged"], unit="records")
        record("crash soak: acknowledged records lost", s["losses"], target="0", better="lower")
        record("crash soak: duplicate records", s["duplicates"], target="0", better="lower")
        record("crash soak: orphan WAL objects left after grace", s["orphans_left"], target="0", better="lower")
        record("crash soak: restart time (mean)", s["restart_s_mean"], unit="s", better="lower")
        record("crash soak: first acknowledgement after restart (mean)", s["recovery_s_mean"], unit="s",
               better="lower")
    except ImportError:
        pass
    bad = (s["losses"] or s["duplicates"] or s["misplaced"] or s["order_violations"] or s["orphans_left"]
           or s["upload_temp_files_left"] or s["tiered_leaks"] or s["tiered_unfinished"] or any(tools.values()))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
