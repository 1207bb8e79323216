"""Kafka's legal topic names work through every feature; internal names cannot be created.

249 characters is Kafka's limit for a topic name (so ``<topic>-<partition>`` fits a 255-byte file
name). Anything kcli derives a file or object name from must still fit: the ``-delete`` dir of a
partition reduction, the remote keys of tiered storage on the local object store. Each case runs
a real broker process and real clients.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kcli.protocol.client import WireClient
from tests.diskless_helpers import local_wal_objects, wait_until
from tests.fixtures_cli import cli_env, run_kcli  # noqa: F401 - fixture
from tests.kafka_helpers import consume_all, create_topic, partition_values, produce

LONG = "l" * 240 + "-orders.x"  # 249 characters, Kafka's maximum
assert len(LONG) == 249
INVALID_REQUEST = 42

SHRINK = {"delete.topic.partition.enable": "true", "delete.topic.partition.interval.delay.ms": "200",
          "group.initial.rebalance.delay.ms": "0"}
TIERED = {"remote.log.storage.system.enable": "true", "remote.log.manager.task.interval.ms": "200",
          "log.retention.check.interval.ms": "200", "group.initial.rebalance.delay.ms": "0"}
DISKLESS = {"diskless.append.commit.interval.ms": "50", "group.initial.rebalance.delay.ms": "0"}




def test_shrink_of_a_249_character_topic(broker_factory, cli_env):  # noqa: F811
    """The rename to ``<topic>-<p>.<uuid>-delete`` overflowed 255 bytes: the request dropped its
    connection and the broker never started again. Kafka cuts the topic part of that name."""
    b = broker_factory(SHRINK)
    create_topic(b.bootstrap, LONG, 3)
    for p in range(3):
        produce(b.bootstrap, LONG, [f"v{p}".encode()], partition=p)
    done = run_kcli(cli_env, "-b", b.bootstrap, "topics", "alter", "--topic", LONG, "--partitions", "2", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Partition 2: deleted now" in done.stdout
    assert not (b.data_dir / f"{LONG}-2").exists()
    assert [d.name for d in b.data_dir.iterdir() if d.name.endswith("-delete")] == []
    b.restart()
    assert [partition_values(b.bootstrap, LONG, p, 1) for p in range(2)] == [[b"v0"], [b"v1"]]


def test_tiered_249_character_topic_tiers_and_reads_back(broker_factory):
    """The remote key component ``<topic>-<topicId>`` overflowed the local store's 255-byte file
    names, so the topic never tiered. The topic part is cut; the topic id keeps keys unique."""
    b = broker_factory(TIERED)
    create_topic(b.bootstrap, LONG, 1, {"remote.storage.enable": "true", "segment.bytes": "4096",
                                        "local.retention.bytes": "1"})
    values = [b"tiered-%04d-" % i + b"x" * 200 for i in range(120)]
    produce(b.bootstrap, LONG, values, **{"batch.size": 2000})
    root = b.data_dir / "objects" / "tiered"
    wait_until(lambda: root.exists() and any(p.suffix == ".log" for p in root.rglob("*")), 30,
               what="remote segments of the long-named topic")
    components = {p.relative_to(root).parts[0] for p in root.rglob("*.log")}
    assert len(components) == 1 and all(len(c.encode()) <= 255 for c in components), components
    assert next(iter(components)).startswith("l" * 200)
    wait_until(lambda: min(int(p.name[:20]) for p in (b.data_dir / f"{LONG}-0").glob("*.log")) > 0, 30,
               what="local segments deleted after tiering")
    got = consume_all(b.bootstrap, LONG, len(values))
    assert [m.value() for m in got] == values  # the first ones come from the remote tier


def test_diskless_249_character_topic_and_dump_log(broker_factory, cli_env):  # noqa: F811
    b = broker_factory(DISKLESS)
    create_topic(b.bootstrap, LONG, 1, {"diskless.enable": "true"})
    produce(b.bootstrap, LONG, [b"d1", b"d2"])
    assert [m.value() for m in consume_all(b.bootstrap, LONG, 2)] == [b"d1", b"d2"]
    wal = local_wal_objects(b.data_dir)
    assert wal
    dumped = run_kcli(cli_env, "dump-log", "--print-data-log", *map(str, wal))
    assert dumped.returncode == 0, dumped.stderr
    assert "d1" in dumped.stdout and "d2" in dumped.stdout

    create_topic(b.bootstrap, LONG[:-1] + "c", 1)  # a classic 249-character topic: dump-log of its dir
    produce(b.bootstrap, LONG[:-1] + "c", [b"c1"])
    b.restart()
    local = run_kcli(cli_env, "dump-log", "--print-data-log", str(b.data_dir / f"{LONG[:-1]}c-0"))
    assert local.returncode == 0, local.stderr
    assert "payload: c1" in local.stdout
    assert [m.value() for m in consume_all(b.bootstrap, LONG, 2)] == [b"d1", b"d2"]


def test_runbook_creates_a_249_character_topic(broker_factory, cli_env, tmp_path: Path):  # noqa: F811
    b = broker_factory(DISKLESS)
    book = tmp_path / "long.yaml"
    book.write_text(
        "bootstrap_server: ${bootstrap}\n"
        "variables: {bootstrap: localhost:9092, topic: t}\n"
        "steps:\n"
        "  - name: create\n"
        "    topics.create: {topic: \"${topic}\", partitions: 2, if_not_exists: true}\n"
        "  - name: write\n"
        "    produce: {topic: \"${topic}\", count: 5, template: \"r-{i}\"}\n"
        "    expect: {path: records, equals: 5}\n"
        "  - name: read\n"
        "    consume: {topic: \"${topic}\", from_beginning: true, max_messages: 5, timeout: 15s}\n"
        "    expect: {path: count, equals: 5}\n")
    ran = run_kcli(cli_env, "runbook", "run", str(book), "--var", f"bootstrap={b.bootstrap}", "--var", f"topic={LONG}")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert (b.data_dir / f"{LONG}-1").is_dir()


@pytest.mark.parametrize("name", ["__cluster_metadata", "__consumer_offsets", "__transaction_state",
                                  "__share_group_state", "__remote_log_metadata"])
def test_internal_topic_names_cannot_be_created(broker, name):
    """Kafka's controller answers INVALID_REQUEST "Creation of internal topic ... is prohibited."; kcli
    keeps its own state under several of these names in the data dir."""
    with WireClient(broker.bootstrap) as c:
        resp = c.request(19, 5, {"timeout": 10000, "validate_only": False, "topics": [
            {"name": name, "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}]})
        t = resp.topics[0]
        assert (t.name, int(t.error_code)) == (name, INVALID_REQUEST), t
        assert t.error_message == f"Creation of internal topic {name} is prohibited."
        md = c.request(3, 12, {"topics": [{"name": name}], "allow_auto_topic_creation": False})
        assert int(md.topics[0].error_code) != 0  # nothing was created
    assert not list(broker.data_dir.glob(f"{name}-*"))
