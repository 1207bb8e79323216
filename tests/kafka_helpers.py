"""Small helpers around real Kafka clients used by many tests."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def create_topic(bootstrap: str, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
    a = admin(bootstrap)  # keep the client alive until the future resolves
    fs = a.create_topics([NewTopic(name, partitions, 1, config=config or {})], operation_timeout=30)
    fs[name].result(30)


def produce(bootstrap: str, topic: str, values: list[bytes], *, keys: list[bytes] | None = None,
            partition: int | None = None, **conf: Any) -> list[tuple[int, int]]:
    """Produce and wait; return (partition, offset) per message; raise on any delivery error."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **conf})
    results: list[Any] = [None] * len(values)
    errors: list[Any] = []

    def cb(i: int):
        def done(err, msg):  # noqa: ANN001
            if err is not None:
                errors.append(err)
            else:
                results[i] = (msg.partition(), msg.offset())
        return done

    for i, v in enumerate(values):
        kwargs: dict[str, Any] = {"value": v, "on_delivery": cb(i)}
        if keys is not None:
            kwargs["key"] = keys[i]
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                p.produce(topic, **kwargs)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    remaining = p.flush(60)
    if errors or remaining:
        raise AssertionError(f"delivery failed: {errors[:3]} remaining={remaining}")
    return results


def consume_all(bootstrap: str, topic: str, expected: int, *, timeout: float = 30.0, group: str | None = None,
                **conf: Any) -> list[Any]:
    """Consume from the beginning until ``expected`` messages arrived (or time out)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group or f"t-{time.monotonic_ns()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": group is not None, **conf})
    c.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expected and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                raise KafkaException(m.error())
            out.append(m)
    finally:
        c.close()
    return out


def partition_values(bootstrap: str, topic: str, partition: int, expected: int, *, timeout: float = 20.0) -> list[bytes]:
    """Values of one partition from offset 0, until ``expected`` arrived (or time out)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{time.monotonic_ns()}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, partition, 0)])
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expected and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and not m.error():
                out.append(m.value())
    finally:
        c.close()
    return out
