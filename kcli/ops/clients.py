"""Produce and consume with confluent-kafka, console-producer/consumer style.

Both functions stream: ``produce`` takes an iterable of lines (stdin), ``consume`` hands each
record to a callback as it arrives, so a CLI can print while runbooks collect. A delivery
failure raises ``KafkaApiError`` with Kafka's error name; consume stops on max-messages, on
idle timeout, or when ``stop`` is set (the CLI sets it on SIGINT) and always closes cleanly.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, KafkaException, TopicPartition

from kcli.errors import KafkaApiError, OperationError, UsageError
from kcli.ops.connection import Connection, consumer, kafka_error_name, producer, to_kcli_error
from kcli.ops.partitions import PartitionMode, ReadWritePartitioner, partition_modes, writable_partition
from kcli.ops.topics import validate_topic_name

ACKS = ("0", "1", "all", "-1")
COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
_POLL_S = 0.2
_WATCH_S = 0.5  # how often a consumer checks that the local broker it uses still runs
LOST_BROKER_CLOSE_S = 3.0  # how long a consumer whose broker process ended waits for close()
# After ``stop`` (Ctrl-C) produce waits at most this long for records already handed to librdkafka.
STOP_FLUSH_S = 10.0
# --timeout-ms does not run while a consumer group is still forming, up to this long.
GROUP_JOIN_GRACE_S = 45.0
# produce --timeout's default: how long a record may wait for its acknowledgement (librdkafka's
# message.timeout.ms, Kafka's delivery.timeout.ms). librdkafka's own default is 300 s, which
# leaves a CLI silent for five minutes when a partition's broker is down; 30 s is what
# kafka-console-producer's request timeouts add up to and what kcli's other requests wait.
PRODUCE_TIMEOUT_S = 30.0
_DELIVERY_TIMEOUT_PROPS = ("message.timeout.ms", "delivery.timeout.ms")


# --- produce -------------------------------------------------------------------------------


@dataclass
class ProduceRequest:
    topic: str
    key_separator: bytes | None = None  # split each line into key and value at the first SEP
    acks: str = "all"
    partition: int | None = None  # None: the partitioner picks
    compression: str = "none"
    properties: dict[str, str] = field(default_factory=dict)  # extra producer properties
    headers: list[tuple[str, bytes]] = field(default_factory=list)  # added to every record (kcat -H)
    timestamp_ms: int | None = None  # every record's CreateTime; None: the producer's clock
    timeout_s: float | None = None  # per record, until acknowledged; None: PRODUCE_TIMEOUT_S unless
    # a --property sets message.timeout.ms / delivery.timeout.ms


@dataclass
class ProduceResult:
    topic: str
    records: int  # records acknowledged
    partitions: dict[int, int] = field(default_factory=dict)  # partition -> records acknowledged


class ProduceInterrupted(Exception):
    """``stop`` was set (Ctrl-C): input ended early. ``result`` holds what was acknowledged,
    ``sent`` how many records were handed to the client, ``unconfirmed`` how many of those had
    no answer when the bounded final flush ended."""

    def __init__(self, result: ProduceResult, sent: int, unconfirmed: int) -> None:
        self.result = result
        self.sent = sent
        self.unconfirmed = unconfirmed
        super().__init__(f"{result.records} of {sent} records delivered to '{result.topic}'")


def split_key(line: bytes, separator: bytes | None, line_no: int) -> tuple[bytes | None, bytes]:
    """(key, value) of one input line; with a separator every line must contain it."""
    if separator is None:
        return None, line
    key, sep, value = line.partition(separator)
    if not sep:
        raise UsageError(f"line {line_no}: no key separator {separator.decode(errors='replace')!r} found")
    return key, value


def offline_partitions(client: Any, topic: str, partitions: Iterable[int] | None = None,
                       timeout_s: float = 5.0) -> dict[int, list[int]]:
    """Partitions of ``topic`` (of ``partitions``, default all) that have no leader, each with
    its replicas: a classic partition whose broker is down (Metadata answers LEADER_NOT_AVAILABLE
    and leader -1). Empty when the cluster cannot be asked right now."""
    wanted = None if partitions is None else set(partitions)
    try:
        md = client.list_topics(topic=topic, timeout=timeout_s)
    except KafkaException:
        return {}
    return _leaderless(md.topics.get(topic), wanted)


def _leaderless(meta: Any, wanted: set[int] | None = None) -> dict[int, list[int]]:
    if meta is None or meta.error is not None and meta.error.code() != KafkaError.LEADER_NOT_AVAILABLE:
        return {}
    out: dict[int, list[int]] = {}
    for p, pm in meta.partitions.items():
        if wanted is not None and p not in wanted:
            continue
        if pm.leader < 0 or (pm.error is not None and pm.error.code() == KafkaError.LEADER_NOT_AVAILABLE):
            out[p] = list(pm.replicas)
    return out


def offline_text(topic: str, offline: dict[int, list[int]]) -> str:
    """``topic 'T' partition 1 is offline (no leader: its broker 3 is down)``."""
    parts = sorted(offline)
    brokers = sorted({r for replicas in offline.values() for r in replicas})
    many = len(parts) > 1
    where = ""
    if brokers:
        where = (f": their brokers {', '.join(map(str, brokers))} are down" if len(brokers) > 1
                 else f": {'their' if many else 'its'} broker {brokers[0]} is down")
    return (f"topic '{topic}' partition{'s' if many else ''} {', '.join(map(str, parts))} "
            f"{'are' if many else 'is'} offline (no leader{where})")


def _metadata_partitions(client: Any, topic: str, timeout_s: float,
                         stop: threading.Event | None = None) -> int | None:
    """Partition count of ``topic``, None if the broker is creating it; raises if it is unknown."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            md = client.list_topics(topic=topic, timeout=1.0)
        except KafkaException as err:
            client.poll(0)
            client.errors.check()
            if stop is not None and stop.is_set():
                return None
            if time.monotonic() > deadline:
                raise to_kcli_error(err, "metadata") from err
            continue
        meta = md.topics.get(topic)
        if meta is None or meta.error is None:
            return len(meta.partitions) if meta is not None else None
        code = meta.error.code()
        if code == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise KafkaApiError("UNKNOWN_TOPIC_OR_PARTITION", f"topic '{topic}' does not exist")
        if code == KafkaError.LEADER_NOT_AVAILABLE:  # being auto-created: let the producer wait
            return None
        raise to_kcli_error(meta.error, f"topic '{topic}'")


def produce(conn: Connection, req: ProduceRequest, lines: Iterable[bytes],
            stop: threading.Event | None = None) -> ProduceResult:
    """Send each line as one record, flush, and raise if any delivery failed.

    When ``stop`` is set (the CLI sets it on Ctrl-C) reading stops, what was sent gets a flush
    bounded by :data:`STOP_FLUSH_S`, and :class:`ProduceInterrupted` says what was delivered.
    """
    validate_topic_name(req.topic)
    if req.acks not in ACKS:
        raise UsageError(f"--acks must be one of 0, 1, all; got {req.acks!r}")
    if req.compression not in COMPRESSIONS:
        raise UsageError(f"--compression must be one of {', '.join(COMPRESSIONS)}; got {req.compression!r}")
    if req.partition is not None and req.partition < 0:
        raise UsageError(f"--partition must be >= 0, got {req.partition}")
    if req.key_separator == b"":
        raise UsageError("--key-separator must not be empty")
    if req.timestamp_ms is not None and req.timestamp_ms < 0:
        raise UsageError(f"--timestamp must be >= 0 (ms since the epoch), got {req.timestamp_ms}")
    if any(not name for name, _ in req.headers):
        raise UsageError("--header expects NAME=VALUE with a non-empty NAME")
    own_timeout = [k for k in _DELIVERY_TIMEOUT_PROPS if k in req.properties]
    if req.timeout_s is not None and own_timeout:
        raise UsageError(f"--timeout and --property {own_timeout[0]} set the same thing: give one")
    if req.timeout_s is not None and req.timeout_s <= 0:
        raise UsageError(f"--timeout must be > 0 seconds, got {req.timeout_s:g}")
    props: dict[str, Any] = {"acks": req.acks, "compression.type": req.compression, "linger.ms": 5}
    timeout_s = req.timeout_s if req.timeout_s is not None else PRODUCE_TIMEOUT_S
    if not own_timeout:
        props["message.timeout.ms"] = max(1, round(timeout_s * 1000))
    props.update(req.properties)
    client = producer(conn, **props)
    count = _metadata_partitions(client, req.topic, conn.timeout_s, stop)
    # KIP-694: never write to a ReadOnly partition, whatever this client's metadata lists
    modes = _partition_modes(conn, req.topic) if count is not None else {}
    if req.partition is not None:
        writable_partition(modes, req.topic, req.partition)
    choose = ReadWritePartitioner(count, modes) if req.partition is None and modes and count else None
    if req.partition is not None and count is not None and req.partition >= count:
        raise KafkaApiError("UNKNOWN_TOPIC_OR_PARTITION",
                            f"topic '{req.topic}' has {count} partitions; partition {req.partition} does not exist")

    result = ProduceResult(req.topic, 0)
    failures: list[KafkaError] = []
    failed_partitions: set[int] = set()

    def delivered(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            failures.append(err)
            if msg is not None and msg.partition() is not None and msg.partition() >= 0:
                failed_partitions.add(msg.partition())
        else:
            result.records += 1
            result.partitions[msg.partition()] = result.partitions.get(msg.partition(), 0) + 1

    sent = 0
    input_error: UsageError | None = None
    fixed: dict[str, Any] = {}
    if req.headers:
        fixed["headers"] = list(req.headers)
    if req.timestamp_ms is not None:
        fixed["timestamp"] = req.timestamp_ms
    extra = {"partition": req.partition} if req.partition is not None else {}
    for line_no, raw in enumerate(lines, start=1):
        if stop is not None and stop.is_set():
            break
        line = raw[:-1] if raw.endswith(b"\n") else raw
        line = line[:-1] if line.endswith(b"\r") else line
        try:
            key, value = split_key(line, req.key_separator, line_no)
        except UsageError as err:
            input_error = err  # deliver what came before the bad line, then report it
            break
        if choose is not None:
            extra = {"partition": choose(key)}
        queued = False
        while not queued:
            try:
                client.produce(req.topic, value=value, key=key, on_delivery=delivered, **extra, **fixed)
                queued = True
            except BufferError:  # local queue full: let deliveries drain
                client.poll(0.1)
                client.errors.check()
                if stop is not None and stop.is_set():
                    break
            except KafkaException as err:
                raise to_kcli_error(err, f"topic '{req.topic}'") from err
        if not queued:
            break
        sent += 1
        client.poll(0)
        if failures:
            break  # stop reading input; what is queued still gets its answer below
        client.errors.check()
    flush_until: float | None = None
    while len(client) > 0:
        if stop is not None and stop.is_set():
            flush_until = flush_until or time.monotonic() + min(conn.timeout_s, STOP_FLUSH_S)
            if time.monotonic() > flush_until:
                break
        client.flush(_POLL_S)
        client.errors.check()
    if failures:
        first = to_kcli_error(failures[0])
        detail = first.message if isinstance(first, KafkaApiError) else str(first)
        if failures[0].code() == KafkaError._MSG_TIMED_OUT:
            # say why, when it is a partition without a leader (its broker is down)
            offline = offline_partitions(client, req.topic, failed_partitions or None)
            limit = "the --property timeout" if own_timeout else f"{timeout_s:g}s"
            detail = f"no acknowledgement within {limit}"
            if offline:
                detail += f": {offline_text(req.topic, offline)}"
        raise KafkaApiError(kafka_error_name(failures[0]),
                            f"{sent - result.records} of {sent} records not delivered to '{req.topic}': {detail}")
    if stop is not None and stop.is_set():
        raise ProduceInterrupted(result, sent, len(client))
    if input_error is not None:
        raise input_error
    return result


def _partition_modes(conn: Connection, topic: str) -> dict[int, PartitionMode]:
    """Non-ReadWrite partitions (KIP-694); none when the cluster cannot say."""
    try:
        return partition_modes(conn, topic)
    except KafkaApiError:
        return {}


# --- consume -------------------------------------------------------------------------------


@dataclass
class ConsumeRequest:
    topic: str
    group: str | None = None  # None: assign() every partition, commit nothing (like kcat)
    from_beginning: bool = False
    max_messages: int | None = None
    timeout_ms: int | None = None  # stop after this long without a record
    partition: int | None = None
    offset: int | str | None = None  # number, "earliest" or "latest"; a number needs partition
    offset_timestamp_ms: int | None = None  # start at the first record at/after this time (kcat s@MS)
    offset_tail: int | None = None  # start this many records before the end (kcat -o -N)
    properties: dict[str, str] = field(default_factory=dict)


@dataclass
class ConsumedRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int | None  # ms since epoch, None when the record has none
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    timestamp_type: str | None = None  # CreateTime | LogAppendTime (table output; not in JSON)

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: key/value/header values as UTF-8 text (invalid bytes → U+FFFD), or null."""
        return {
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "timestamp": self.timestamp,
            "key": _text(self.key),
            "value": _text(self.value),
            "headers": [{"key": k, "value": _text(v)} for k, v in self.headers],
        }


@dataclass
class ConsumeResult:
    records: int
    stopped_by: str  # "max-messages" | "timeout" | "stop"


OFFSET_TAIL_BASE = -2000  # librdkafka's RD_KAFKA_OFFSET_TAIL_BASE: -2000 - N is "N before the end"
_TIMESTAMP_TYPES = {1: "CreateTime", 2: "LogAppendTime"}


def _plain(err: KafkaError) -> str:
    return (err.str() or "").removeprefix("Local: ").removeprefix("Broker: ")


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", errors="replace")


def _start_offset(req: ConsumeRequest) -> int:
    if req.offset is None:
        return OFFSET_BEGINNING if req.from_beginning else OFFSET_END
    if req.offset == "earliest":
        return OFFSET_BEGINNING
    if req.offset == "latest":
        return OFFSET_END
    return int(req.offset)


def validate_consume(req: ConsumeRequest) -> None:
    validate_topic_name(req.topic)
    if req.max_messages is not None and req.max_messages < 1:
        raise UsageError(f"--max-messages must be at least 1, got {req.max_messages}")
    if req.timeout_ms is not None and req.timeout_ms < 0:
        raise UsageError(f"--timeout-ms must be >= 0, got {req.timeout_ms}")
    starts = [x for x in (req.offset, req.offset_timestamp_ms, req.offset_tail) if x is not None]
    if len(starts) > 1:
        raise UsageError("give one start offset: a number, earliest, latest, s@MS or -N")
    if starts:
        if isinstance(req.offset, int) and req.partition is None:
            raise UsageError("--offset needs --partition")
        if req.from_beginning:
            raise UsageError("--offset and --from-beginning cannot be used together")
        if req.group is not None:
            raise UsageError("--offset and --group cannot be used together (a group starts at its committed offsets)")
        if isinstance(req.offset, int) and req.offset < 0:
            raise UsageError(f"--offset must be >= 0, 'earliest' or 'latest'; got {req.offset}")
        if req.offset_timestamp_ms is not None and req.offset_timestamp_ms < 0:
            raise UsageError(f"--offset s@MS needs a timestamp >= 0; got {req.offset_timestamp_ms}")
        if req.offset_tail is not None and req.offset_tail < 1:
            raise UsageError(f"--offset -N needs N >= 1; got {req.offset_tail}")
    if req.partition is not None and req.partition < 0:
        raise UsageError(f"--partition must be >= 0, got {req.partition}")
    if req.group is not None and not req.group.strip():
        # librdkafka aborts the process on a blank group.id; Kafka's consumer refuses one (KAFKA-15909)
        raise UsageError("--group must not be empty (leave it out to read without a consumer group)")
    if req.group is not None and req.partition is not None:
        raise UsageError("--group and --partition cannot be used together (a group assigns partitions)")


def consume(conn: Connection, req: ConsumeRequest, on_record: Callable[[ConsumedRecord], None],
            stop: threading.Event | None = None, warn: Callable[[str], None] | None = None) -> ConsumeResult:
    """Deliver records to ``on_record`` until max-messages, idle timeout or ``stop``.

    With a group, offsets are stored only for records handed to ``on_record`` and committed on
    close, so ``--max-messages N`` commits exactly N records. Without a group nothing is
    committed and the throwaway group id never joins (assign() only).

    Offline partitions (no leader: their broker is down) are never silent: when every partition
    to read is offline, LEADER_NOT_AVAILABLE at once; when some are, ``warn`` hears which, the
    others are read, and a run that ends by its idle timeout while they are still offline
    raises LEADER_NOT_AVAILABLE naming them (their records were not read).
    """
    validate_consume(req)
    stop = stop or threading.Event()
    group_mode = req.group is not None
    props: dict[str, Any] = {
        "group.id": req.group if group_mode else f"kcli-console-{time.time_ns()}",
        "enable.auto.commit": group_mode,
        "enable.auto.offset.store": False,
        # an explicit start offset that falls outside the log is reported, not silently moved
        "auto.offset.reset": "error" if isinstance(req.offset, int) else "earliest" if req.from_beginning else "latest",
        "enable.partition.eof": False,
    }
    props.update(req.properties)
    client = consumer(conn, **props)
    count = 0
    stopped_by = "stop"
    offline: dict[int, list[int]] = {}
    try:
        idle_since = time.monotonic()
        waiting_for_group = group_mode
        group_assigned: list[int] | None = None  # partitions the group gave us, not yet checked
        if group_mode:
            def on_assign(c: Any, partitions: list[TopicPartition]) -> None:
                nonlocal idle_since, waiting_for_group, group_assigned
                idle_since = time.monotonic()  # joining a group is not idleness
                waiting_for_group = False
                group_assigned = [tp.partition for tp in partitions if tp.topic == req.topic]
                client.errors.fail_on_brokers_down = False  # reached the cluster: ride out outages

            client.subscribe([req.topic], on_assign=on_assign)
        else:
            offline = _assign(client, req, conn.timeout_s, warn)
            client.errors.fail_on_brokers_down = False  # reached the cluster: ride out outages
            idle_since = time.monotonic()
        watch_at = 0.0
        while not stop.is_set():
            msg = client.poll(_POLL_S)
            client.errors.check()
            if group_assigned:  # outside the callback: a Metadata request of its own
                offline = _check_offline(req.topic, offline_partitions(client, req.topic, group_assigned),
                                         len(group_assigned), warn)
                group_assigned = None
            if conn.broker_pid is not None and time.monotonic() >= watch_at:
                watch_at = time.monotonic() + _WATCH_S
                lost = conn.broker_lost()
                if lost is not None:
                    raise OperationError(lost)
            if msg is None:
                if req.timeout_ms is not None:
                    limit = req.timeout_ms / 1000
                    if waiting_for_group:  # a slow group join must not end the run before it starts
                        limit = max(limit, GROUP_JOIN_GRACE_S)
                    if time.monotonic() - idle_since >= limit:
                        stopped_by = "timeout"
                        break
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                if err.code() == KafkaError._AUTO_OFFSET_RESET:  # a start offset outside the log
                    raise KafkaApiError("OFFSET_OUT_OF_RANGE", f"topic '{req.topic}' partition {msg.partition()}: "
                                        f"{_plain(err)}")
                if err.fatal() or not err.retriable():
                    raise to_kcli_error(err, f"topic '{req.topic}'")
                continue
            idle_since = time.monotonic()
            ts_type, ts = msg.timestamp()
            record = ConsumedRecord(
                topic=msg.topic(), partition=msg.partition(), offset=msg.offset(),
                timestamp=ts if ts_type != 0 and ts >= 0 else None,
                key=msg.key(), value=msg.value(),
                headers=[(k, v) for k, v in (msg.headers() or [])],
                timestamp_type=_TIMESTAMP_TYPES.get(ts_type),
            )
            on_record(record)
            count += 1
            if group_mode:
                client.store_offsets(msg)
            if req.max_messages is not None and count >= req.max_messages:
                stopped_by = "max-messages"
                break
        if stopped_by == "timeout" and offline:
            still = offline_partitions(client, req.topic, offline)
            if still:
                its = "its" if len(still) == 1 else "their"
                raise KafkaApiError("LEADER_NOT_AVAILABLE", f"{offline_text(req.topic, still)}: {its} records were "
                                    f"not read ({count} records read from the other partitions)")
    finally:
        if conn.broker_lost() is None:
            _close(client)  # commits stored offsets in group mode, leaves the group
        else:
            # With the group coordinator gone, close() waits out session.timeout.ms (45 s) for a
            # commit and LeaveGroup that cannot succeed: give it a few seconds, not a minute.
            closer = threading.Thread(target=_close, args=(client,), name="kcli-consumer-close", daemon=True)
            closer.start()
            closer.join(LOST_BROKER_CLOSE_S)
    return ConsumeResult(count, stopped_by)


def _close(client: Any) -> None:
    try:
        client.close()
    except (KafkaException, RuntimeError):
        pass


def _check_offline(topic: str, offline: dict[int, list[int]], assigned: int,
                   warn: Callable[[str], None] | None) -> dict[int, list[int]]:
    """Every partition to read offline: LEADER_NOT_AVAILABLE; some: ``warn`` names them."""
    its = "its" if len(offline) == 1 else "their"
    if offline and len(offline) >= assigned:
        raise KafkaApiError("LEADER_NOT_AVAILABLE", f"{offline_text(topic, offline)}: nothing can be read until "
                                                    f"{its} broker is back")
    if offline and warn is not None:
        warn(f"{offline_text(topic, offline)}: reading the other partitions; {its} records cannot be read until "
             f"{its} broker is back")
    return offline


def _assign(client: Any, req: ConsumeRequest, timeout_s: float,
            warn: Callable[[str], None] | None = None) -> dict[int, list[int]]:
    """Assign the partitions to read; returns the offline ones among them (see consume)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            md = client.list_topics(topic=req.topic, timeout=1.0)
            break
        except KafkaException as err:
            client.poll(0)
            client.errors.check()
            if time.monotonic() > deadline:
                raise to_kcli_error(err, "metadata") from err
    meta = md.topics.get(req.topic)
    if meta is None or (meta.error is not None and meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
        raise KafkaApiError("UNKNOWN_TOPIC_OR_PARTITION", f"topic '{req.topic}' does not exist")
    if meta.error is not None:
        raise to_kcli_error(meta.error, f"topic '{req.topic}'")
    partitions = sorted(meta.partitions)
    if req.partition is not None:
        if req.partition not in meta.partitions:
            raise KafkaApiError("UNKNOWN_TOPIC_OR_PARTITION",
                                f"topic '{req.topic}' has {len(partitions)} partitions; partition {req.partition} does not exist")
        partitions = [req.partition]
    offline = _check_offline(req.topic, _leaderless(meta, set(partitions)), len(partitions), warn)
    start = _start_offset(req)
    if req.offset_tail is not None:
        start = OFFSET_TAIL_BASE - req.offset_tail
    assignment = [TopicPartition(req.topic, p, start) for p in partitions]
    if req.offset_timestamp_ms is not None:
        # an offline partition cannot answer ListOffsets: only the others are read
        assignment = _offsets_for_time(client, req, [p for p in partitions if p not in offline], timeout_s)
    elif isinstance(req.offset, int):
        _check_in_range(client, req.topic, partitions[0], req.offset, timeout_s)
    client.assign(assignment)
    return offline


def _offsets_for_time(client: Any, req: ConsumeRequest, partitions: list[int], timeout_s: float) -> list[TopicPartition]:
    """kcat's ``-o s@MS``: each partition from its first record at or after the time (its end when none)."""
    wanted = [TopicPartition(req.topic, p, req.offset_timestamp_ms) for p in partitions]
    try:
        found = client.offsets_for_times(wanted, timeout=timeout_s)
    except KafkaException as err:
        raise to_kcli_error(err, f"topic '{req.topic}'") from err
    return [TopicPartition(req.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END) for tp in found]


def _check_in_range(client: Any, topic: str, partition: int, offset: int, timeout_s: float) -> None:
    """An explicit start offset outside [log start, log end] is an error, said plainly (Kafka's
    consumer would silently jump by auto.offset.reset)."""
    try:
        low, high = client.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout_s)
    except KafkaException as err:
        raise to_kcli_error(err, f"topic '{topic}' partition {partition}") from err
    if not low <= offset <= high:
        raise KafkaApiError("OFFSET_OUT_OF_RANGE", f"offset {offset} is out of range for topic '{topic}' partition "
                                                   f"{partition}: its offsets run from {low} to {high} (log end)")
