"""The metadata log never bricks the broker, and a failing request handler still answers.

Each case drives a real broker process with real clients and reproduces a failure the old code
had: a record the broker could not replay was written (and start-up then refused the data dir),
or a handler exception dropped the client's connection instead of answering.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from kcli.crcjson import encode_line
from kcli.protocol.client import WireClient
from tests.kafka_helpers import (
    admin,
    consume_all,
    create_topic,
    partition_values,
    produce,
)

INVALID_CONFIG = 40
KAFKA_STORAGE_ERROR = 56


def incremental(bootstrap: str, topic: str, op: AlterConfigOpType, name: str, value: str) -> None:
    a = admin(bootstrap)
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[ConfigEntry(name, value, incremental_operation=op)])
    for fut in a.incremental_alter_configs([res]).values():
        fut.result(20)


def topic_config(bootstrap: str, topic: str, name: str) -> tuple[str, int]:
    a = admin(bootstrap)
    res = ConfigResource(ResourceType.TOPIC, topic)
    entry = a.describe_configs([res])[res].result(20)[name]
    return entry.value, int(entry.source)


def metadata_ok(c: WireClient, topic: str) -> int:
    md = c.request(3, 12, {"topics": [{"name": topic}], "allow_auto_topic_creation": False})
    return int(md.topics[0].error_code)




def metadata_log(data_dir: Path) -> Path:
    return data_dir / "__cluster_metadata" / "metadata.log"


def test_subtract_and_append_start_from_the_effective_value(broker_factory):
    """SUBTRACT on a list config the topic never set used to compute from "" and store "": the
    connection dropped and the broker never started again. Kafka starts from the value in effect."""
    b = broker_factory()
    create_topic(b.bootstrap, "t")
    produce(b.bootstrap, "t", [b"a", b"b"])

    incremental(b.bootstrap, "t", AlterConfigOpType.SUBTRACT, "cleanup.policy", "compact")
    assert topic_config(b.bootstrap, "t", "cleanup.policy") == ("delete", 1)  # DYNAMIC_TOPIC_CONFIG
    # Removing the last value would leave no policy: refused, nothing written.
    with pytest.raises(KafkaException) as info:
        incremental(b.bootstrap, "t", AlterConfigOpType.SUBTRACT, "cleanup.policy", "delete")
    assert info.value.args[0].code() == INVALID_CONFIG
    assert "cleanup.policy" in info.value.args[0].str()
    incremental(b.bootstrap, "t", AlterConfigOpType.APPEND, "follower.replication.throttled.replicas", "0:1")
    assert topic_config(b.bootstrap, "t", "follower.replication.throttled.replicas")[0] == "0:1"

    b.restart()  # the data dir it accepted still starts
    assert topic_config(b.bootstrap, "t", "cleanup.policy")[0] == "delete"
    assert [m.value() for m in consume_all(b.bootstrap, "t", 2)] == [b"a", b"b"]


def test_alter_configs_cannot_store_a_value_replay_refuses(broker_factory):
    """The legacy AlterConfigs path reaches the same gate: an empty cleanup.policy is INVALID_CONFIG
    in the response, and the broker restarts with the topic as it was."""
    b = broker_factory()
    create_topic(b.bootstrap, "t")
    with WireClient(b.bootstrap) as c:
        resp = c.request(33, 1, {"validate_only": False, "resources": [
            {"resource_type": 2, "resource_name": "t", "configs": [{"name": "cleanup.policy", "value": ""}]}]})
        assert int(resp.responses[0].error_code) == INVALID_CONFIG, resp
        assert metadata_ok(c, "t") == 0  # the same connection still serves
    assert all('"cleanup.policy"' not in ln for ln in metadata_log(b.data_dir).read_text().splitlines())
    b.restart()
    produce(b.bootstrap, "t", [b"x"])
    assert [m.value() for m in consume_all(b.bootstrap, "t", 1)] == [b"x"]


def test_handler_exception_is_an_error_response_and_the_broker_still_starts(broker_factory):
    """A regular file where a new partition dir must go makes CreatePartitions fail with an OSError.
    That used to drop the connection and leave a partition the next start could not open."""
    b = broker_factory()
    create_topic(b.bootstrap, "cp")
    produce(b.bootstrap, "cp", [b"kept"])
    (b.data_dir / "cp-1").write_text("in the way")

    with WireClient(b.bootstrap) as c:
        resp = c.request(37, 3, {"topics": [{"name": "cp", "count": 2, "assignments": None}],
                                 "timeout": 10000, "validate_only": False})
        result = resp.results[0]
        assert (result.name, int(result.error_code)) == ("cp", KAFKA_STORAGE_ERROR), resp
        assert metadata_ok(c, "cp") == 0  # answered, and the connection is still usable
    assert "CreatePartitions v3" in b.log_text() and "Traceback" in b.log_text()  # logged once, at ERROR

    b.restart()  # starts; the partition whose dir cannot be made is offline, the rest serves
    lines = [ln for ln in b.log_text().splitlines() if "is offline" in ln]
    assert len(lines) == 1 and "cp-1" in lines[0], lines
    assert partition_values(b.bootstrap, "cp", 0, 1) == [b"kept"]

    (b.data_dir / "cp-1").unlink()  # the operator clears the way: the partition comes back
    b.restart()
    produce(b.bootstrap, "cp", [b"p1"], partition=1)
    assert sorted(m.value() for m in consume_all(b.bootstrap, "cp", 2)) == [b"kept", b"p1"]


def test_unusable_records_written_by_hand_are_skipped_at_start(broker_factory):
    """A whole (good CRC) record whose content start-up cannot use: one log line each, the broker
    starts, the topic stays readable with the default config."""
    b = broker_factory()
    create_topic(b.bootstrap, "t")
    produce(b.bootstrap, "t", [b"m1", b"m2", b"m3"])
    b.stop()
    path = metadata_log(b.data_dir)
    bad = [{"type": "ConfigRecord", "data": {"resourceType": 2, "resourceName": "t", "name": "cleanup.policy", "value": ""}},
           {"type": "ConfigRecord", "data": {"resourceType": 2, "resourceName": "t", "name": "retention.ms", "value": "soon"}},
           {"type": "FutureRecord", "data": {}}]
    with open(path, "ab") as f:
        f.writelines(encode_line(rec) for rec in bad)

    b.start()
    lines = [ln for ln in b.log_text().splitlines() if "ignoring metadata record" in ln]
    assert len(lines) == 3, lines
    assert "cleanup.policy" in lines[0] and "retention.ms" in lines[1] and "FutureRecord" in lines[2]
    assert topic_config(b.bootstrap, "t", "cleanup.policy") == ("delete", 5)  # DEFAULT_CONFIG
    assert topic_config(b.bootstrap, "t", "retention.ms") == ("604800000", 5)
    assert [m.value() for m in consume_all(b.bootstrap, "t", 3)] == [b"m1", b"m2", b"m3"]
    create_topic(b.bootstrap, "after")  # new records still append after the skipped ones
    b.restart()
    assert {"t", "after"} <= set(admin(b.bootstrap).list_topics(timeout=20).topics)
    assert len([ln for ln in b.log_text().splitlines() if "ignoring metadata record" in ln]) == 6  # 3 per start


# ---- the error response a failing handler gets, for every API the broker serves -------------------
def _encode_decode(api_key: int, version: int, request: dict) -> object:
    from kcli.protocol import codec

    req = codec.build(codec.request_class(api_key, version), request)
    body = codec.error_response_body(api_key, version, req, KAFKA_STORAGE_ERROR, "disk failed")
    frame = codec.encode_response(api_key, version, 7, body)
    cls = codec.response_class(api_key, version)
    pos = 8 + (1 if cls.__header_schema__.__flexible__ else 0)
    return codec._reader(cls)(frame, pos)[0]


def test_every_api_and_version_has_an_error_response():
    from kcli.broker.dispatch import HANDLERS, load_all_handlers

    load_all_handlers()
    for key, h in sorted(HANDLERS.items()):
        for version in range(h.min_version, h.max_version + 1):
            _encode_decode(key, version, {})  # encodes and reads back


@pytest.mark.parametrize("api_key, version, request_doc, entries", [
    (0, 9, {"acks": -1, "timeout": 1000, "topic_data": [{"name": "a", "partition_data": [{"index": 3, "records": None}]}]},
     lambda r: [(t.name, p.index, p.error_code) for t in r.responses for p in t.partition_responses]),
    (1, 12, {"topics": [{"topic": "a", "partitions": [{"partition": 2}, {"partition": 5}]}]},
     lambda r: [(t.topic, p.partition_index, p.error_code) for t in r.responses for p in t.partitions]),
    (19, 7, {"topics": [{"name": "a", "num_partitions": 1, "replication_factor": 1}]},
     lambda r: [(t.name, t.error_code) for t in r.topics]),
    (20, 4, {"topic_names": ["a", "b"]}, lambda r: [(t.name, t.error_code) for t in r.responses]),
    (37, 3, {"topics": [{"name": "a", "count": 2}]}, lambda r: [(t.name, t.error_code) for t in r.results]),
    (44, 1, {"resources": [{"resource_type": 2, "resource_name": "a", "configs": []}]},
     lambda r: [(x.resource_name, x.error_code) for x in r.responses]),
])
def test_error_response_echoes_every_entry_of_the_request(api_key, version, request_doc, entries):
    """Kafka's getErrorResponse: each topic/partition/resource asked about comes back with the code."""
    got = entries(_encode_decode(api_key, version, request_doc))
    assert got and all(int(e[-1]) == KAFKA_STORAGE_ERROR for e in got), got
    names = [e[:-1] for e in got]
    expected = {0: [("a", 3)], 1: [("a", 2), ("a", 5)], 19: [("a",)], 20: [("a",), ("b",)], 37: [("a",)], 44: [("a",)]}
    assert names == expected[api_key]
