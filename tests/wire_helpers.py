"""Building produce requests by hand, for protocol-level tests."""

from __future__ import annotations

from aiokafka.record.default_records import DefaultRecordBatchBuilder


def batch(values: list[bytes], *, producer_id: int = -1, epoch: int = -1, base_sequence: int = -1,
          compression: int = 0, timestamp: int = 1_700_000_000_000) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=0,
                                  producer_id=producer_id, producer_epoch=epoch, base_sequence=base_sequence,
                                  batch_size=1 << 22)
    for i, v in enumerate(values):
        b.append(i, timestamp=timestamp + i, key=None, value=v, headers=[])
    return bytes(b.build())


def produce_body(topic: str, partition: int, records: bytes, acks: int = -1) -> dict:
    return {"transactional_id": None, "acks": acks, "timeout": 30000,
            "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": records}]}]}


def produce_result(resp) -> tuple[int, int]:  # noqa: ANN001
    pr = resp.responses[0].partition_responses[0]
    return int(pr.error_code), int(pr.base_offset)
