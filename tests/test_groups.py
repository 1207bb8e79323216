"""Consumer groups and offsets (#18) through the real CLI against one real kcli broker: describe
with lag and a live confluent-kafka member, reset-offsets every way (plan, --execute, refusal
while the group has a member), delete-offsets, delete; produce with headers and timestamps,
consume with kcat's format strings (compared byte for byte with kcat where it is installed);
log start/end offsets in topics describe for classic, diskless and tiered topics."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.brokerproc import BrokerProcess
from tests.fixtures_cli import assert_one_line_error, run_kcli
from tests.test_output_formats import kcli as run_inproc

BROKER = {
    "remote.log.storage.system.enable": "true",
    "remote.log.manager.task.interval.ms": "200",
    "log.retention.check.interval.ms": "200",
    "group.initial.rebalance.delay.ms": "0",
    "diskless.append.commit.interval.ms": "20",
}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("groups") / "data", BROKER)
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def env(broker: BrokerProcess, tmp_path: Path) -> dict[str, str]:
    import os

    e = {k: v for k, v in os.environ.items() if not k.startswith("KCLI_")}
    e.update(KCLI_CONFIG=str(tmp_path / "config.yaml"), KCLI_DATA_DIR=str(tmp_path / "kcli-data"),
             KCLI_BOOTSTRAP_SERVER=broker.bootstrap)
    return e


def kcli(env: dict[str, str], *args: str, input: str | bytes | None = None) -> subprocess.CompletedProcess[str]:
    return run_kcli(env, *args, input=input)


def ok(env: dict[str, str], *args: str, input: str | bytes | None = None) -> str:
    proc = kcli(env, *args, input=input)
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return proc.stdout


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def produce(bootstrap: str, topic: str, partition: int, count: int, timestamps: list[int] | None = None) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        extra = {"timestamp": timestamps[i]} if timestamps else {}
        p.produce(topic, value=f"v{i}".encode(), key=f"k{i}".encode(), partition=partition, **extra)
    assert p.flush(30) == 0
    del p


def commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """Commit offsets for a group without joining it (simple consumer commit, as tools do)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        c.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False)
    finally:
        c.close()


def committed(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    from confluent_kafka import ConsumerGroupTopicPartitions

    a = AdminClient({"bootstrap.servers": bootstrap})
    res = a.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(30)
    return {(tp.topic, tp.partition): tp.offset for tp in res.topic_partitions if tp.offset >= 0}


def delete_records(bootstrap: str, topic: str, partition: int, before: int) -> None:
    a = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until its future answers
    assert list(a.delete_records([TopicPartition(topic, partition, before)]).values())[0].result(30).low_watermark == before


class Member:
    """A real group member: a confluent-kafka consumer polling in a thread until stopped."""

    def __init__(self, bootstrap: str, group: str, topics: list[str], client_id: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": client_id,
                                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        self.assigned = threading.Event()
        self.stop = threading.Event()
        self.consumer.subscribe(topics, on_assign=lambda c, parts: self.assigned.set())
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.assigned.wait(60), "the member was never assigned partitions"

    def _run(self) -> None:
        while not self.stop.is_set():
            self.consumer.poll(0.2)  # only keeps the membership alive; reads nothing it commits
        self.consumer.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)


def wait_state(env: dict[str, str], group: str, state: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:  # polled in this process: a new interpreter per poll would dominate
        proc = run_inproc("groups", "describe", "--group", group, "-o", "json", "-b", env["KCLI_BOOTSTRAP_SERVER"])
        assert proc.returncode == 0, proc.stderr
        desc = json.loads(proc.stdout)[0]
        if desc["state"] == state:
            return desc
        assert time.monotonic() < deadline, f"group {group} stayed {desc['state']}, not {state}"
        time.sleep(0.3)


# ---- describe, refusal with a member, delete-offsets, delete ----------------------------------


def test_describe_lag_members_refusals_delete_offsets_and_delete(env: dict[str, str], broker: BrokerProcess) -> None:
    b = broker.bootstrap
    topic, other, group = name("orders"), name("audit"), name("billing")
    ok(env, "topics", "create", "--topic", topic, "--partitions", "2")
    ok(env, "topics", "create", "--topic", other)
    produce(b, topic, 0, 5)
    produce(b, topic, 1, 3)
    produce(b, other, 0, 4)
    commit(b, group, {(topic, 0): 2, (topic, 1): 1, (other, 0): 4})
    member = Member(b, group, [topic], "billing-app")
    try:
        desc = wait_state(env, group, "Stable")
        table = ok(env, "groups", "describe", "--group", group)
        lines = table.splitlines()
        header = next(ln for ln in lines if ln.startswith("GROUP  ") and "TOPIC" in ln)
        assert header.split() == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                                  "CONSUMER-ID", "HOST", "CLIENT-ID"]
        rows = {tuple(ln.split()[1:3]): ln.split() for ln in lines if ln.startswith(group + " ")}
        member_id = desc["members"][0]["member_id"]
        assert rows[(topic, "0")] == [group, topic, "0", "2", "5", "3", member_id, "127.0.0.1", "billing-app"]
        assert rows[(topic, "1")] == [group, topic, "1", "1", "3", "2", member_id, "127.0.0.1", "billing-app"]
        assert rows[(other, "0")] == [group, other, "0", "4", "4", "0", "-", "-", "-"]  # committed, unassigned
        assert "STATE          Stable" in table and "PROTOCOL       range" in table and "TOTAL-LAG      5" in table
        assert any(ln.split() == [topic, "5"] for ln in lines)  # lag per topic
        assert any(ln.endswith(f"  {topic}(0,1)") for ln in lines)  # the member's assignment
        assert desc["protocol_type"] == "consumer" and desc["lag_by_topic"] == {topic: 5, other: 0}
        assert desc["total_lag"] == 5 and desc["members"][0]["client_id"] == "billing-app"
        assert desc["members"][0]["assignment"] == [{"topic": topic, "partition": 0}, {"topic": topic, "partition": 1}]

        # a group with a member: reset refused (Kafka's message), offsets untouched; delete refused
        before = committed(b, group)
        refused = kcli(env, "groups", "reset-offsets", "--group", group, "--topic", topic, "--to-earliest", "--execute")
        assert_one_line_error(refused, 1, f"Assignments can only be reset if the group '{group}' is inactive, "
                                          "but the current state is Stable.")
        refused = kcli(env, "groups", "delete", "--group", group)
        assert_one_line_error(refused, 1, "NON_EMPTY_GROUP")
        # delete-offsets: refused for the topic the member consumes, done for the other
        refused = kcli(env, "groups", "delete-offsets", "--group", group, "--topic", topic)
        assert_one_line_error(refused, 1, "GROUP_SUBSCRIBED_TO_TOPIC")
        assert committed(b, group) == before
        out = ok(env, "groups", "delete-offsets", "--group", group, "--topic", other)
        assert out.splitlines()[1].split() == [other, "0", "Successful"]
        assert committed(b, group) == {(topic, 0): 2, (topic, 1): 1}
    finally:
        member.close()
    empty = wait_state(env, group, "Empty")
    assert empty["members"] == [] and [r["consumer_id"] for r in empty["offsets"]] == [None, None]
    assert f"Consumer group '{group}' has no active members." in ok(env, "groups", "describe", "--group", group)
    listed = ok(env, "groups", "list", "--state", "Empty")
    assert any(ln.split() == [group, "Empty"] for ln in listed.splitlines())
    assert group in ok(env, "groups", "list").splitlines()
    out = ok(env, "groups", "delete", "--group", group)
    assert out == f"Deletion of requested consumer groups ('{group}') was successful.\n"
    assert group not in ok(env, "groups", "list").splitlines()
    assert_one_line_error(kcli(env, "groups", "describe", "--group", group), 1, "GROUP_ID_NOT_FOUND")
    assert_one_line_error(kcli(env, "groups", "delete", "--group", group), 1, "GROUP_ID_NOT_FOUND")


# ---- reset-offsets every way ---------------------------------------------------------------------


def test_reset_offsets_every_way_plan_then_execute(env: dict[str, str], broker: BrokerProcess, tmp_path: Path) -> None:
    b = broker.bootstrap
    topic, group = name("reset"), name("g")
    ok(env, "topics", "create", "--topic", topic, "--partitions", "2")
    now = int(time.time() * 1000)
    stamps = [now - (10 - i) * 600_000 for i in range(10)]  # one record every 10 minutes, the last 10 min ago
    produce(b, topic, 0, 10, stamps)
    produce(b, topic, 1, 4)
    delete_records(b, topic, 1, 1)
    commit(b, group, {(topic, 0): 4, (topic, 1): 2})

    def plan(*args: str, execute: bool) -> dict[tuple[str, int], int]:
        # kcli's real entry point in this process (as tests/test_output_formats.py): 22 runs
        # would otherwise spend most of their time starting interpreters
        flags = ["--execute"] if execute else []
        proc = run_inproc("groups", "reset-offsets", "--group", group, *args, *flags, "-b", b)
        assert proc.returncode == 0, (args, proc.stderr)
        lines = proc.stdout.splitlines()
        assert lines[0].split() == ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]
        if not execute:
            assert "add --execute" in proc.stderr
        return {(row.split()[1], int(row.split()[2])): int(row.split()[3]) for row in lines[1:]}

    iso = dt.datetime.fromtimestamp(stamps[5] / 1000, dt.timezone.utc).isoformat(timespec="milliseconds")
    cases = [  # (arguments, expected new offsets); offsets clamp to [log start, log end]
        (["--topic", topic, "--to-earliest"], {(topic, 0): 0, (topic, 1): 1}),
        (["--topic", topic, "--to-latest"], {(topic, 0): 10, (topic, 1): 4}),
        (["--topic", f"{topic}:0", "--to-offset", "7"], {(topic, 0): 7}),
        (["--topic", topic, "--to-offset", "100"], {(topic, 0): 10, (topic, 1): 4}),
        (["--all-topics", "--shift-by", "-3"], {(topic, 0): 1, (topic, 1): 1}),
        (["--all-topics", "--shift-by", "1"], {(topic, 0): 5, (topic, 1): 3}),
        (["--topic", f"{topic}:0", "--to-datetime", iso], {(topic, 0): 5}),
        (["--topic", f"{topic}:0", "--to-datetime", iso.replace("+00:00", "Z")], {(topic, 0): 5}),
        (["--topic", f"{topic}:0", "--by-duration", "PT35M"], {(topic, 0): 7}),
        (["--topic", f"{topic}:0", "--by-duration", "P1D"], {(topic, 0): 0}),
        (["--topic", f"{topic}:0", "--to-current"], {(topic, 0): 4}),
    ]
    start = {(topic, 0): 4, (topic, 1): 2}
    for args, expected in cases:
        assert plan(*args, execute=False) == expected, args
        assert committed(b, group) == start, f"a dry run changed offsets: {args}"
    for args, expected in cases:
        commit(b, group, start)
        assert plan(*args, execute=True) == expected, args
        assert committed(b, group) == {**start, **expected}, args

    # --from-file: Kafka's CSV (3 or 4 columns), as --export prints it
    commit(b, group, start)
    exported = ok(env, "groups", "reset-offsets", "--group", group, "--all-topics", "--to-offset", "3", "--export")
    assert exported == f"{group},{topic},0,3\n{group},{topic},1,3\n"
    (tmp_path / "four.csv").write_text(exported)
    (tmp_path / "three.csv").write_text(f"{topic},0,8\n{topic},1,0\n")
    assert plan("--from-file", str(tmp_path / "four.csv"), execute=True) == {(topic, 0): 3, (topic, 1): 3}
    assert plan("--from-file", str(tmp_path / "three.csv"), execute=True) == {(topic, 0): 8, (topic, 1): 1}
    assert committed(b, group) == {(topic, 0): 8, (topic, 1): 1}
    data = json.loads(ok(env, "groups", "reset-offsets", "--group", group, "--all-topics", "--to-earliest", "-o", "json"))
    assert data["dry_run"] is True and data["executed"] is False
    assert data["offsets"][1] == {"topic": topic, "partition": 1, "current_offset": 1, "new_offset": 1,
                                  "log_start_offset": 1, "log_end_offset": 4}
    (tmp_path / "other.csv").write_text(f"someone-else,{topic},0,1\n")
    assert_one_line_error(kcli(env, "groups", "reset-offsets", "--group", group, "--from-file",
                               str(tmp_path / "other.csv")), 2, "someone-else")


# ---- produce headers/timestamps, consume formats ---------------------------------------------------

FORMAT = r"%t|%p|%o|%k|%K|%s|%S|%T|%h|%%|\t\x41\n"


def test_produce_headers_timestamps_and_consume_format_like_kcat(env: dict[str, str], broker: BrokerProcess) -> None:
    topic = name("fmt")
    t0 = (int(time.time()) - 3600) * 1000  # an hour ago: inside retention.ms (old timestamps get deleted)
    ok(env, "topics", "create", "--topic", topic)
    ok(env, "produce", "--topic", topic, "--key-separator", ":", "-H", "source=docs", "--header", "trace=a=b",
       "--timestamp", str(t0), input="k1:v1\nk2:\n")
    p = Producer({"bootstrap.servers": broker.bootstrap})
    p.produce(topic, value=None, key=None, headers=[("nil", None)], timestamp=t0 + 1000)  # a tombstone
    p.produce(topic, value="värde".encode(), timestamp=t0 + 2000)
    assert p.flush(30) == 0
    del p
    args = ["consume", "--topic", topic, "--offset", "earliest", "--max-messages", "4", "--timeout-ms", "10000"]
    out = ok(env, *args, "-f", FORMAT)
    assert out.splitlines()[:2] == [f"{topic}|0|0|k1|2|v1|2|{t0}|source=docs,trace=a=b|%|\tA",
                                    f"{topic}|0|1|k2|2||0|{t0}|source=docs,trace=a=b|%|\tA"]
    assert out.splitlines()[2] == f"{topic}|0|2||-1||-1|{t0 + 1000}|nil=NULL|%|\tA"
    if shutil.which("kcat"):
        kcat = subprocess.run(["kcat", "-b", broker.bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q",
                               "-f", FORMAT], capture_output=True, timeout=60)
        assert kcat.returncode == 0, kcat.stderr
        assert out.encode() == kcat.stdout
        binary = run_kcli_bytes(env, *args, "-f", "%R%s")
        kcat_binary = subprocess.run(["kcat", "-b", broker.bootstrap, "-C", "-t", topic, "-o", "beginning", "-e",
                                      "-q", "-f", "%R%s"], capture_output=True, timeout=60).stdout
        assert binary == kcat_binary
    assert run_kcli_bytes(env, *args, "-f", "%R%s")[:6] == b"\x00\x00\x00\x02v1"
    # table mode: Kafka console consumer's print.timestamp / print.headers / print.key
    lines = ok(env, *args, "--print-timestamp", "--print-headers", "--print-key").splitlines()
    assert lines[0] == f"CreateTime:{t0}\tsource:docs,trace:a=b\tk1\tv1"
    assert lines[2] == f"CreateTime:{t0 + 1000}\tnil:null\tnull\tnull"
    assert lines[3] == f"CreateTime:{t0 + 2000}\tNO_HEADERS\tnull\tvärde"
    # start offsets as kcat's -o: s@MS (first record at or after), -N (N before the end)
    assert ok(env, "consume", "--topic", topic, "--offset", f"s@{t0 + 500}", "--max-messages", "1",
              "-f", "%o\n") == "2\n"
    assert ok(env, "consume", "--topic", topic, "--offset", f"@{t0 + 2000}", "--max-messages", "1",
              "-f", "%o\n") == "3\n"
    assert ok(env, "consume", "--topic", topic, "--offset", "-2", "--max-messages", "2", "-f", "%o\n") == "2\n3\n"
    # an offset outside the log: said plainly, no -v needed
    proc = kcli(env, "consume", "--topic", topic, "--partition", "0", "--offset", "99", "--max-messages", "1")
    assert_one_line_error(proc, 1, "OFFSET_OUT_OF_RANGE", "offset 99 is out of range", "from 0 to 4")
    assert_one_line_error(kcli(env, *args, "-f", "%x"), 2, "%x")
    assert_one_line_error(kcli(env, *args, "-f", "%s", "-o", "json"), 2, "--format")


def run_kcli_bytes(env: dict[str, str], *args: str) -> bytes:
    import sys

    from tests.fixtures_cli import REPO

    proc = subprocess.run([sys.executable, "-m", "kcli", *args], capture_output=True, env=env, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# ---- offsets in topics describe ------------------------------------------------------------------


def _partition_lines(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith("\tTopic:")]


def test_topics_describe_offsets_classic_diskless_tiered(env: dict[str, str], broker: BrokerProcess) -> None:
    b = broker.bootstrap
    classic, diskless, tiered = name("classic"), name("diskless"), name("tiered")
    ok(env, "topics", "create", "--topic", classic)
    ok(env, "topics", "create", "--topic", diskless, "--diskless")
    ok(env, "topics", "create", "--topic", tiered, "--config", "remote.storage.enable=true",
       "--config", "segment.bytes=4096", "--config", "local.retention.bytes=8192")
    produce(b, classic, 0, 5)
    delete_records(b, classic, 0, 2)
    produce(b, diskless, 0, 3)
    p = Producer({"bootstrap.servers": b, "linger.ms": 2, "batch.size": 2000})
    errors: list[Any] = []
    for i in range(400):  # ~40 KB in 4 KB segments: rolled segments go remote, local retention trims
        p.produce(tiered, value=b"x" * 90, partition=0, on_delivery=lambda err, _m: errors.append(err) if err else None)
        p.poll(0)
    assert p.flush(30) == 0 and not errors, errors[:3]
    del p

    assert _partition_lines(ok(env, "topics", "describe", "--topic", classic))[0].endswith(
        "\tLogStartOffset: 2\tLogEndOffset: 5")
    assert _partition_lines(ok(env, "topics", "describe", "--topic", diskless))[0].endswith(
        "\tLogStartOffset: 0\tLogEndOffset: 3")
    deadline = time.monotonic() + 60
    while True:
        part = json.loads(ok(env, "topics", "describe", "--topic", tiered, "-o", "json"))[0]["partitions"][0]
        if part["local_log_start_offset"]:
            break
        assert time.monotonic() < deadline, f"local log start never moved: {part}"
        time.sleep(0.5)
    assert part["log_start_offset"] == 0 and part["log_end_offset"] == 400
    assert 0 < part["local_log_start_offset"] < 400
    line = _partition_lines(ok(env, "topics", "describe", "--topic", tiered))[0]
    assert "\tLogStartOffset: 0\tLogEndOffset: 400\tLocalLogStartOffset: " in line
    c = json.loads(ok(env, "topics", "describe", "--topic", classic, "-o", "json"))[0]["partitions"][0]
    assert (c["log_start_offset"], c["log_end_offset"], c["local_log_start_offset"]) == (2, 5, None)


def test_reset_csv_and_duration_parsing() -> None:
    from kcli.errors import UsageError
    from kcli.ops import groups as ops

    assert ops.parse_duration_ms("PT1H") == 3_600_000
    assert ops.parse_duration_ms("P1DT2H3M4.5S") == ((24 + 2) * 60 + 3) * 60_000 + 4_500
    assert ops.parse_duration_ms("-PT1M") == -60_000
    for bad in ("1H", "PT", "P", "PT1X", ""):
        with pytest.raises(UsageError):
            ops.parse_duration_ms(bad)
    assert ops.parse_datetime_ms("2023-11-14T22:13:20.000Z") == 1_700_000_000_000
    assert ops.parse_datetime_ms("2023-11-14T23:13:20+01:00") == 1_700_000_000_000
    rows = ops.parse_offsets_csv("t,0,5\n\ng,t,1,6\n", "f.csv")
    assert rows == [(None, "t", 0, 5), ("g", "t", 1, 6)]
    for bad in ("t,0\n", "t,x,1\n", "t,0,-1\n", "", "bad topic!,0,1\n"):
        with pytest.raises(UsageError):
            ops.parse_offsets_csv(bad, "f.csv")
    assert ops.parse_topic_partitions(["a", "b:0,2"]) == [("a", None), ("b", [0, 2])]
    for bad in ("a:x", "a:", "a:-1"):
        with pytest.raises(UsageError):
            ops.parse_topic_partitions([bad])
