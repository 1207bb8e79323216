"""Kafka's own tool syntax (issue #29): the installed ``kafka-*.sh`` console scripts, run as
subprocesses against one real broker, print the lines Kafka's tools print (a regex per line).

The invocations are those of Kafka's docs and quickstart, plus the seeds' extensions: KIP-950
through kafka-configs, KIP-694's ``--delete-partitions-delay``, KIP-1163's diskless create/list,
dump-log of a WAL object and kafka-diskless-metadata."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from tests.brokerproc import BrokerProcess
from tests.diskless_helpers import wait_until

BIN = Path(shutil.which("kcli") or "kcli").parent
BROKER_CONFIGS = {
    "remote.log.storage.system.enable": "true",
    "remote.log.manager.task.interval.ms": "200",
    "delete.topic.partition.enable": "true",
    "delete.topic.partition.interval.delay.ms": "200",
    "diskless.append.commit.interval.ms": "50",
    "group.initial.rebalance.delay.ms": "0",
}
TOPIC_ID = r"[A-Za-z0-9_-]{22}"
PARTITION = r"\tTopic: {t}\tPartition: {p}\tLeader: 1\tReplicas: 1\tIsr: 1\tElr: N/A\tLastKnownElr: N/A"

pytestmark = pytest.mark.skipif(not (BIN / "kafka-topics.sh").exists(),
                                reason="console scripts not installed: pip install -e . --no-deps")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("kafka-tools") / "data", BROKER_CONFIGS).start()
    yield b
    b.stop()


def tool(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / name), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def assert_lines(out: str, patterns: list[str]) -> None:
    lines = out.rstrip("\n").split("\n") if out.rstrip("\n") else []
    assert len(lines) == len(patterns), f"expected {len(patterns)} lines, got:\n{out}"
    for line, pattern in zip(lines, patterns):
        assert re.fullmatch(pattern, line), f"{line!r} !~ {pattern!r}"


# (script, arguments with {b} for the bootstrap, expected stdout lines as regexes); run in order
CASES = [
    ("create", "kafka-topics.sh", "--bootstrap-server {b} --create --topic quickstart-events --partitions 3 "
     "--replication-factor 1 --config retention.ms=86400000", [r"Created topic quickstart-events\."]),
    ("create-if-not-exists", "kafka-topics", "--bootstrap-server={b} --create --topic quickstart-events "
     "--if-not-exists", []),
    ("describe", "kafka-topics.sh", "--describe --topic quickstart-events --bootstrap-server {b}",
     [rf"Topic: quickstart-events\tTopicId: {TOPIC_ID}\tPartitionCount: 3\tReplicationFactor: 1\t"
      r"Configs: retention\.ms=86400000"] + [PARTITION.format(t="quickstart-events", p=p) for p in range(3)]),
    ("alter-partitions", "kafka-topics.sh", "--bootstrap-server {b} --alter --topic quickstart-events --partitions 4",
     []),
    ("configs-alter", "kafka-configs.sh", "--bootstrap-server {b} --alter --entity-type topics --entity-name "
     "quickstart-events --add-config retention.ms=3600000,cleanup.policy=[delete,compact]",
     [r"Completed updating config for topic quickstart-events\."]),
    ("configs-describe", "kafka-configs.sh", "--bootstrap-server {b} --describe --entity-type topics --entity-name "
     "quickstart-events",
     [r"Dynamic configs for topic quickstart-events are:",
      r"  cleanup\.policy=delete,compact sensitive=false synonyms=\{DYNAMIC_TOPIC_CONFIG:cleanup\.policy=delete,compact"
      r"(, DEFAULT_CONFIG:\S+=delete)?\}",
      r"  retention\.ms=3600000 sensitive=false synonyms=\{DYNAMIC_TOPIC_CONFIG:retention\.ms=3600000"
      r"(, DEFAULT_CONFIG:\S+=\d+)?\}"]),
    ("configs-delete", "kafka-configs", "--bootstrap-server {b} --alter --topic quickstart-events "
     "--delete-config cleanup.policy", [r"Completed updating config for topic quickstart-events\."]),
    ("tiered-create", "kafka-topics.sh", "--bootstrap-server {b} --create --topic tiered --partitions 1 "
     "--config remote.storage.enable=true --config segment.bytes=8192", [r"Created topic tiered\."]),
    ("kip950-disable", "kafka-configs.sh", "--bootstrap-server {b} --alter --entity-type topics --entity-name tiered "
     "--add-config remote.storage.enable=false,remote.log.disable.policy=delete",
     [r"Completed updating config for topic tiered\."]),
    ("kip950-describe", "kafka-topics.sh", "--bootstrap-server {b} --describe --topic tiered",
     [rf"Topic: tiered\tTopicId: {TOPIC_ID}\tPartitionCount: 1\tReplicationFactor: 1\tConfigs: "
      r".*remote\.storage\.enable=false.*", PARTITION.format(t="tiered", p=0)]),
    ("tiered39-create", "kafka-topics.sh", "--bootstrap-server {b} --create --topic tiered39 --partitions 1 "
     "--config remote.storage.enable=true", [r"Created topic tiered39\."]),
    ("kip950-kafka39", "kafka-configs.sh", "--bootstrap-server {b} --alter --entity-type topics --entity-name tiered39 "
     "--add-config remote.storage.enable=false,remote.log.delete.on.disable=true",
     [r"Completed updating config for topic tiered39\."]),
    ("kip694-shrink", "kafka-topics.sh", "--bootstrap-server {b} --alter --topic quickstart-events --partitions 2 "
     "--delete-partitions-delay 600000", []),
    ("kip694-describe", "kafka-topics.sh", "--bootstrap-server {b} --describe --topic quickstart-events",
     [rf"Topic: quickstart-events\tTopicId: {TOPIC_ID}\tPartitionCount: 4\tReplicationFactor: 1\t"
      r"Configs: retention\.ms=3600000"]
     + [PARTITION.format(t="quickstart-events", p=p) for p in range(2)]
     + [PARTITION.format(t="quickstart-events", p=p) + r"\tMode: ReadOnly\tDeleteAt: \S+" for p in (2, 3)]),
    ("diskless-create", "kafka-topics.sh", "--bootstrap-server {b} --create --topic diskless-events --partitions 2 "
     "--config diskless.enable=true", [r"Created topic diskless-events\."]),
    ("diskless-create-flag", "kafka-topics.sh", "--bootstrap-server {b} --create --topic diskless-orders --diskless",
     [r"Created topic diskless-orders\."]),
    ("diskless-list", "kafka-topics.sh", "--bootstrap-server {b} --list --diskless",
     [r"diskless-events", r"diskless-orders"]),
    ("list", "kafka-topics.sh", "--bootstrap-server {b} --list --exclude-internal",
     [r"diskless-events", r"diskless-orders", r"quickstart-events", r"tiered", r"tiered39"]),
]


@pytest.mark.parametrize("name,script,args,expected", CASES, ids=[c[0] for c in CASES])
def test_kafka_tool_invocation(broker, name, script, args, expected):
    res = tool(script, *args.format(b=broker.bootstrap).split())
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert_lines(res.stdout, expected)


@pytest.fixture(scope="module")
def group_offsets(broker):
    """10 records in each of quickstart-events' writable partitions, 7 consumed by group g1."""
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(20):
        p.produce("quickstart-events", value=b"event-%d" % i, key=b"k%d" % i, partition=i % 2)
    p.produce("diskless-events", value=b"wal-record", key=b"k", partition=0)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g1", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.assign([__import__("confluent_kafka").TopicPartition("quickstart-events", 0, 0)])
    got = 0
    deadline = time.monotonic() + 20
    while got < 7 and time.monotonic() < deadline:
        m = c.poll(1)
        if m is not None and not m.error():
            got += 1
            c.commit(message=m, asynchronous=False)
    c.close()
    assert got == 7
    return broker


def test_consumer_groups_describe_and_reset(group_offsets):
    b = group_offsets.bootstrap
    head = r"GROUP\s+TOPIC\s+PARTITION\s+CURRENT-OFFSET\s+LOG-END-OFFSET\s+LAG\s+CONSUMER-ID\s+HOST\s+CLIENT-ID"
    res = tool("kafka-consumer-groups.sh", "--bootstrap-server", b, "--describe", "--group", "g1")
    assert res.returncode == 0, res.stdout + res.stderr
    assert_lines(res.stdout, ["", head, r"g1\s+quickstart-events\s+0\s+7\s+10\s+3\s+-\s+-\s+-"])
    assert "Consumer group 'g1' has no active members." in res.stderr
    res = tool("kafka-consumer-groups.sh", "--bootstrap-server", b, "--group", "g1", "--reset-offsets",
               "--topic", "quickstart-events:0", "--to-earliest", "--dry-run")
    assert res.returncode == 0, res.stdout + res.stderr
    new = r"GROUP\s+TOPIC\s+PARTITION\s+NEW-OFFSET\s*"
    assert_lines(res.stdout, ["", new, r"g1\s+quickstart-events\s+0\s+0\s*"])
    res = tool("kafka-consumer-groups", "--bootstrap-server", b, "--group", "g1", "--reset-offsets",
               "--topic", "quickstart-events:0", "--shift-by", "-2", "--execute")
    assert_lines(res.stdout, ["", new, r"g1\s+quickstart-events\s+0\s+5\s*"])
    res = tool("kafka-consumer-groups.sh", "--bootstrap-server", b, "--describe", "--group", "g1")
    assert_lines(res.stdout, ["", head, r"g1\s+quickstart-events\s+0\s+5\s+10\s+5\s+-\s+-\s+-"])
    res = tool("kafka-consumer-groups.sh", "--bootstrap-server", b, "--list")
    assert "g1" in res.stdout.split()


def test_dump_log_of_a_segment_and_of_a_wal_object(group_offsets):
    data = group_offsets.data_dir
    segment = data / "quickstart-events-0" / "00000000000000000000.log"
    res = tool("kafka-dump-log.sh", "--files", str(segment), "--print-data-log")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == f"Dumping {segment}"
    assert re.fullmatch(r"Log starting offset: 0", lines[1])
    assert re.fullmatch(r"baseOffset: 0 lastOffset: \d+ count: \d+ baseSequence: -?\d+ lastSequence: -?\d+ "
                        r"producerId: -?\d+ producerEpoch: -?\d+ partitionLeaderEpoch: \d+ isTransactional: false "
                        r"isControl: false deleteHorizonMs: OptionalLong\.empty position: 0 CreateTime: \d+ size: \d+ "
                        r"magic: 2 compresscodec: \w+ crc: \d+ isvalid: true", lines[2])
    assert re.fullmatch(r"\| offset: 0 CreateTime: \d+ keySize: 2 valueSize: 7 sequence: -?\d+ headerKeys: \[\] "
                        r"key: k0 payload: event-0", lines[3])
    wal = wait_until(lambda: sorted((data / "objects" / "wal").glob("*")), what="a WAL object")
    res = tool("kafka-dump-log", f"--files={wal[-1]}", "--deep-iteration")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == f"Dumping {wal[-1]}"
    assert any(re.match(r"baseOffset: \d+ lastOffset: \d+ count: \d+ ", line) for line in lines)
    assert any(re.match(r"\| offset: \d+ CreateTime: \d+ keySize: ", line) for line in lines)


def test_kafka_diskless_metadata_describe_and_objects(group_offsets):
    b = group_offsets.bootstrap
    wait_until(lambda: "HighWatermark: 1" in tool("kafka-diskless-metadata.sh", "--bootstrap-server", b,
                                                  "--describe", "--topic", "diskless-events").stdout)
    res = tool("kafka-diskless-metadata.sh", "--bootstrap-server", b, "--describe", "--topic", "diskless-events")
    assert_lines(res.stdout, [
        rf"Topic: diskless-events\tTopicId: {TOPIC_ID}\tPartitionCount: 2\tMessages: 1\tLiveBytes: \d+\t"
        r"FileCount: 1\tFilesSize: \d+\tDeadFileCount: 0\tDeadFilesSize: 0",
        r"\tTopic: diskless-events\tPartition: 0\tLogStartOffset: 0\tHighWatermark: 1\tBatchCount: 1\tByteSize: \d+",
        r"\tTopic: diskless-events\tPartition: 1\tLogStartOffset: 0\tHighWatermark: 0\tBatchCount: 0\tByteSize: 0"])
    res = tool("kafka-diskless-metadata", "--bootstrap-server", b, "--list-objects", "--topic", "diskless-events")
    assert_lines(res.stdout, [r"ObjectKey: wal/\S+\tTotalSize: \d+\tUsedSize: \d+\tState: uploaded\tBatchCount: \d+\t"
                              r"CommittedAtMs: \d+\tMarkedForDeletionAtMs: none\tPartitions: .*diskless-events-0.*"])


def test_delete_records_with_an_offset_json_file(group_offsets, tmp_path):
    spec = tmp_path / "offsets.json"
    spec.write_text(json.dumps({"partitions": [{"topic": "quickstart-events", "partition": 1, "offset": 4}],
                                "version": 1}))
    res = tool("kafka-delete-records.sh", "--bootstrap-server", group_offsets.bootstrap,
               "--offset-json-file", str(spec))
    assert res.returncode == 0, res.stdout + res.stderr
    assert_lines(res.stdout, ["Executing records delete operation", "Records delete operation completed:",
                              r"partition: quickstart-events-1\tlow_watermark: 4"])


def test_command_config_and_kafka_path_as_librdkafka_harness_calls_it(broker, tmp_path):
    """librdkafka's harness: $KAFKA_PATH/bin/kafka-topics.sh ... --create ... --config k=v; the
    prefix pip installed the scripts into serves as KAFKA_PATH."""
    kafka_path = BIN.parent
    props = tmp_path / "client.properties"
    props.write_text("# Kafka client properties\nsecurity.protocol=PLAINTEXT\nclient.id=harness\n"
                     "request.timeout.ms=20000\n")
    res = subprocess.run([str(kafka_path / "bin" / "kafka-topics.sh"), "--bootstrap-server", broker.bootstrap,
                          "--command-config", str(props), "--create", "--topic", "rdkafkatest_1", "--partitions", "2",
                          "--replication-factor", "1", "--config", "min.insync.replicas=1"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert_lines(res.stdout, [r"WARNING: Due to limitations in metric names, topics with a period \('\.'\) or "
                              r"underscore \('_'\) could collide\. To avoid issues it is best to use either, but "
                              r"not both\.", r"Created topic rdkafkatest_1\."])


# (script, arguments, the one line, stream): Kafka's messages; every one exits 1 without a traceback
BAD = [
    ("kafka-topics.sh", "--zookeeper localhost:2181 --list", "zookeeper is not a recognized option", "err"),
    ("kafka-topics.sh", "--bootstrap-server {b} --list --no-such-flag", "no-such-flag is not a recognized option",
     "err"),
    ("kafka-topics.sh", "--bootstrap-server {b} --create", 'Missing required argument "[topic]"', "err"),
    ("kafka-topics.sh", "--list", "--bootstrap-server must be specified", "err"),
    ("kafka-topics.sh", "--bootstrap-server {b} --create --list --topic x",
     "Command must include exactly one action: --list, --describe, --create, --alter or --delete", "err"),
    ("kafka-topics.sh", "--bootstrap-server {b} --describe --topic nope",
     "Error while executing topic command : Topic 'nope' does not exist as expected", "out"),
    ("kafka-topics.sh", "--bootstrap-server {b} --alter --topic nope --partitions 3",
     "Error while executing topic command : Topic 'nope' does not exist as expected", "out"),
    ("kafka-topics.sh", "--bootstrap-server {b} --create --topic x --partitions many",
     "Cannot parse argument 'many' of option partitions", "err"),
    ("kafka-topics.sh", "--bootstrap-server {b} --list --partitions 3",
     'Option "[partitions]" can\'t be used with option "[list]"', "err"),
    ("kafka-configs.sh", "--zookeeper localhost:2181 --describe --entity-type topics",
     "zookeeper is not a recognized option", "err"),
    ("kafka-configs.sh", "--bootstrap-server {b} --alter --entity-type topics --entity-name quickstart-events",
     "At least one of --add-config, --add-config-file, or --delete-config must be specified with --alter", "err"),
    ("kafka-configs.sh", "--bootstrap-server {b} --alter --entity-type topics --entity-name quickstart-events "
     "--delete-config no.such.config", "Invalid config(s): no.such.config", "err"),
    ("kafka-consumer-groups.sh", "--bootstrap-server {b} --describe", "Option [describe] takes one of these "
     "options: [group], [all-groups]", "err"),
    ("kafka-consumer-groups.sh", "--bootstrap-server {b} --describe --group nope",
     "Error: Consumer group 'nope' does not exist.", "out"),
    ("kafka-dump-log.sh", "--print-data-log", 'Missing required argument "[files]"', "err"),
    ("kafka-delete-records.sh", "--bootstrap-server {b}", 'Missing required argument "[offset-json-file]"', "err"),
    ("kafka-reassign-partitions.sh", "--bootstrap-server {b} --list --verify",
     "Command must include exactly one action: --generate, --execute, --verify, --cancel, --list", "err"),
    ("kafka-leader-election.sh", "--bootstrap-server {b} --election-type PREFERRED",
     "One and only one of the following options is required: topic, all-topic-partitions, path-to-json-file", "err"),
    ("kafka-leader-election.sh", "--bootstrap-server {b} --bogus", "bogus is not a recognized option", "err"),
]


@pytest.mark.parametrize("script,args,line,stream", BAD, ids=[f"{s}:{a.split()[-1]}" for s, a, _, _ in BAD])
def test_bad_input_is_one_line_and_exit_1(broker, script, args, line, stream):
    res = tool(script, *args.format(b=broker.bootstrap).split())
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    text = (res.stdout if stream == "out" else res.stderr).strip("\n")
    assert text == line


def test_alter_to_the_same_partition_count_is_refused_as_kafka_does(broker):
    """kafka-topics --alter --partitions N with N the current count: Kafka's broker answers
    INVALID_PARTITIONS "Topic already has N partitions." and the tool exits 1 (kcli's own
    `topics alter` calls it nothing to do)."""
    res = tool("kafka-topics.sh", "--bootstrap-server", broker.bootstrap, "--create", "--topic", "same-count",
               "--partitions", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    res = tool("kafka-topics.sh", "--bootstrap-server", broker.bootstrap, "--alter", "--topic", "same-count",
               "--partitions", "2")
    assert res.returncode == 1 and "Traceback" not in res.stdout + res.stderr
    assert res.stdout.strip() == "Error while executing topic command : Topic already has 2 partitions."
