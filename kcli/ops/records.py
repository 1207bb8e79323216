"""DeleteRecords (kafka-delete-records.sh): move partitions' log start offsets forward."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import TopicPartition

from kcli.errors import KafkaApiError, UsageError
from kcli.ops.connection import Connection, admin
from kcli.ops.topics import validate_topic_name

HIGH_WATERMARK = -1  # Kafka's RecordsToDelete.beforeOffset(-1): everything up to the high watermark


@dataclass
class DeletedRecords:
    topic: str
    partition: int
    low_watermark: int | None  # the new log start offset; None when this partition failed
    error: str | None = None  # the Kafka exception message when it failed


def delete_records(conn: Connection, offsets: list[tuple[str, int, int]]) -> list[DeletedRecords]:
    """One DeleteRecords per leader (confluent-kafka groups them); each partition answers on its
    own, so one failing partition (unknown, offset beyond the high watermark) does not hide the
    others' new low watermarks."""
    for topic, partition, offset in offsets:
        validate_topic_name(topic)
        if partition < 0:
            raise UsageError(f"partition must be >= 0, got {partition} for topic '{topic}'")
        if offset < HIGH_WATERMARK:
            raise UsageError(f"offset must be >= -1, got {offset} for {topic}-{partition}")
    if not offsets:
        return []
    client = admin(conn)
    futures = client.delete_records([TopicPartition(t, p, o) for t, p, o in offsets],
                                    request_timeout=conn.timeout_s, operation_timeout=conn.timeout_s)
    out = []
    for tp, fut in sorted(futures.items(), key=lambda kv: (kv[0].topic, kv[0].partition)):
        try:
            answer = client.wait(fut, f"topic '{tp.topic}' partition {tp.partition}")
            out.append(DeletedRecords(tp.topic, tp.partition, int(answer.low_watermark)))
        except KafkaApiError as err:
            out.append(DeletedRecords(tp.topic, tp.partition, None, err.message or err.name))
    return out
