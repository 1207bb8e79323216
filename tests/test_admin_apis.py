"""Admin APIs that operators' tools call (#17), with real clients against real broker processes:
ListOffsets max timestamp (KIP-734) on classic, tiered and diskless partitions, OffsetDelete,
OffsetForLeaderEpoch, DescribeLogDirs, and the answer to an API kcli does not serve."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import OffsetSpec
from kio.schema.errors import ErrorCode

from kcli.protocol.client import WireClient
from tests.diskless_helpers import DISKLESS, FAST
from tests.diskless_helpers import wait_until
from tests.kafka_helpers import admin, create_topic

NOW = int(time.time() * 1000) - 600_000  # inside the default retention


def produce_timestamps(bootstrap: str, topic: str, timestamps: list[int], **conf: Any) -> None:
    """One record per timestamp, in order, each its own batch (so batches interleave timestamps)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1, **conf})
    errors: list[Any] = []
    for i, ts in enumerate(timestamps):
        p.produce(topic, b"v%04d-" % i + b"x" * 100, partition=0, timestamp=ts,
                  on_delivery=lambda err, _m: errors.append(err) if err else None)
        p.poll(0)
    assert p.flush(30) == 0 and not errors, errors[:3]


def max_timestamp(bootstrap: str, topic: str) -> tuple[int, int]:
    """confluent-kafka's AdminClient.list_offsets with OffsetSpec.max_timestamp() (ListOffsets v7+, -3)."""
    a = admin(bootstrap)
    tp = TopicPartition(topic, 0)
    info = a.list_offsets({tp: OffsetSpec.max_timestamp()}, request_timeout=20)[tp].result(20)
    return info.offset, info.timestamp


# Offsets 0..29: the largest timestamp sits at offset 17 and again at 25 (the first one counts),
# inside a run of smaller ones, so neither the last record nor the last batch holds it.
TIMESTAMPS = [NOW + i for i in range(30)]
TIMESTAMPS[17] = TIMESTAMPS[25] = NOW + 5000


@pytest.mark.parametrize("kind", ["classic", "diskless"])
def test_list_offsets_max_timestamp(broker_factory, kind: str) -> None:  # noqa: ANN001
    b = broker_factory(FAST)
    config = {"segment.bytes": "1024"} if kind == "classic" else dict(DISKLESS)  # several classic segments
    create_topic(b.bootstrap, "ts", config=config)
    assert max_timestamp(b.bootstrap, "ts") == (-1, -1)  # an empty partition: no record
    produce_timestamps(b.bootstrap, "ts", TIMESTAMPS)
    if kind == "classic":
        assert len(list((b.data_dir / "ts-0").glob("*.log"))) > 2
    assert max_timestamp(b.bootstrap, "ts") == (17, NOW + 5000)
    # a later, larger timestamp takes over; kept across a restart
    produce_timestamps(b.bootstrap, "ts", [NOW + 9000, NOW + 1])
    assert max_timestamp(b.bootstrap, "ts") == (30, NOW + 9000)
    b.restart()
    assert max_timestamp(b.bootstrap, "ts") == (30, NOW + 9000)


def test_list_offsets_max_timestamp_tiered(broker_factory) -> None:  # noqa: ANN001
    """The largest timestamp sits in a segment that is only in remote storage now."""
    from tests.test_tiered import TIERED_BROKER, list_offset, remote_segments

    b = broker_factory(TIERED_BROKER)
    create_topic(b.bootstrap, "tt", config={"remote.storage.enable": "true", "segment.bytes": "1024",
                                             "local.retention.bytes": "1"})
    produce_timestamps(b.bootstrap, "tt", TIMESTAMPS + [NOW + 100 + i for i in range(30)])
    wait_until(lambda: list_offset(b.bootstrap, "tt", -4) > 25, 30, what="offset 25 only in remote storage")
    assert remote_segments(b.data_dir)
    assert max_timestamp(b.bootstrap, "tt") == (17, NOW + 5000)
