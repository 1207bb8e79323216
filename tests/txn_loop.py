"""A consume-transform-produce loop with confluent-kafka's transactional API, run as its own
process so tests can kill -9 it (tests/test_transactions_crash.py, bench/txn_bench.py).

    python -m tests.txn_loop BOOTSTRAP INPUT OUTPUT GROUP TRANSACTIONAL_ID [BATCH [PAUSE_S]]

Each transaction copies up to BATCH consumed records to OUTPUT (value prefixed with ``out-``),
waits until they are in the log plus PAUSE_S seconds (so a kill lands inside transactions),
and commits the consumer's offsets with it. Any error aborts what it can and exits 2: the
caller starts a new instance, which fences this one and resumes from the committed offsets.
Exits 0 once every input partition is committed up to its end.
"""

from __future__ import annotations

import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition


def main(argv: list[str]) -> int:
    bootstrap, src, dst, group, tid = argv[:5]
    batch = int(argv[5]) if len(argv) > 5 else 20
    pause = float(argv[6]) if len(argv) > 6 else 0.0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                         "session.timeout.ms": 6000})
    # metadata.recovery.strategy=none: after its only broker went away, librdkafka's re-bootstrap
    # can leave send_offsets_to_transaction() waiting forever, past its timeout (librdkafka
    # issues #5511 and #5456); without it the call times out and this instance exits.
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5,
                         "transaction.timeout.ms": 10000, "metadata.recovery.strategy": "none"})
    try:
        producer.init_transactions(30)
        consumer.subscribe([src])
        idle_since = time.monotonic()
        while True:
            msgs = [m for m in consumer.consume(batch, 0.5) if not m.error()]
            if not msgs:
                assignment = consumer.assignment()
                if assignment and _at_end(consumer, assignment):
                    return 0
                if time.monotonic() - idle_since > 60:
                    return 3
                continue
            idle_since = time.monotonic()
            producer.begin_transaction()
            for m in msgs:
                producer.produce(dst, key=m.key(), value=b"out-" + m.value(), partition=m.partition())
            if pause:
                producer.flush(30)
                time.sleep(pause)
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(30)
    except KafkaException as err:
        print(f"txn_loop: {err}", file=sys.stderr)
        try:
            producer.abort_transaction(5)
        except KafkaException:
            pass
        return 2
    finally:
        consumer.close()


def _at_end(consumer: Consumer, assignment: list[TopicPartition]) -> bool:
    """Every assigned partition's committed offset is at its last stable offset."""
    committed = consumer.committed(assignment, timeout=10)
    for tp in committed:
        _low, high = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=10)
        if tp.offset < high:
            return False
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
