"""One failing partition never stalls the others: background tasks on real broker processes.

The broker's object store is FaultyObjectStorage over a local directory with every operation
failing, but only for the remote keys of ONE topic (``key.prefixes=tiered/bad-``: tiered keys are
``tiered/<topic>-<topicId>/<partition>/...``, see plugins/rsm/object_store.py) and only while a
switch file exists. Before kcli.broker.background, the first failing partition ended the whole
round, so every topic after it was never tiered (or never had its partitions deleted).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from kcli.broker.background import BACKOFF_GAUGE, FAILURES_METRIC, TaskGuard, metric_name
from kcli.broker.metrics import Metrics
from kcli.diskless import admin_api
from kcli.ops import partitions as shrink_ops
from kcli.ops.connection import Connection
from kcli.tiered import metadata as rlmm
from tests.diskless_helpers import metrics as broker_metrics
from tests.diskless_helpers import wait_until as poll_until
from tests.fixtures_cli import cli_env, run_kcli  # noqa: F401 - fixture
from tests.diskless_helpers import DISKLESS, FAST
from tests.diskless_helpers import admin as admin_call
from tests.kafka_helpers import admin, create_topic, produce

FAULTY = "plugins.objectstore.faulty.FaultyObjectStorage"
TIERED_TOPIC = {"remote.storage.enable": "true", "segment.bytes": "4096"}


def wait_until(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    return poll_until(check, timeout, what=what)


def faulty_tiered_broker(tmp_path: Path, switch: Path, **extra: str) -> dict[str, str]:
    """A tiered broker whose object store fails every operation on topic ``bad``'s remote keys
    while ``switch`` exists."""
    return {
        "diskless.storage.class.name": FAULTY,
        "diskless.storage.delegate.uri": (tmp_path / "objects").as_uri(),
        "diskless.storage.failure.rate": "1",
        "diskless.storage.key.prefixes": "tiered/bad-",
        "diskless.storage.switch.file": str(switch),
        "remote.log.storage.system.enable": "true",
        "remote.log.manager.task.interval.ms": "200",
        "log.retention.check.interval.ms": "200",
        **extra,
    }


def fill(bootstrap: str, topic: str, partition: int = 0, count: int = 150) -> None:
    produce(bootstrap, topic, [b"%s-%d-%05d-" % (topic.encode(), partition, i) + b"x" * 100 for i in range(count)],
            partition=partition, **{"batch.size": 2000})


def set_topic_config(bootstrap: str, topic: str, name: str, value: str) -> None:
    res = ConfigResource(ResourceType.TOPIC, topic,
                         incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)])
    a = admin(bootstrap)  # keep the client alive until the future resolves
    for fut in a.incremental_alter_configs([res]).values():
        fut.result(20)


def remote(data_dir: Path, topic: str, partition: int | None = None) -> list[Any]:
    """Finished remote segments of ``topic`` (one partition, or all)."""
    return [s for s in rlmm.load(data_dir).all_segments(states=(rlmm.S.COPY_SEGMENT_FINISHED,))
            if s.segment_id.topic == topic and (partition is None or s.segment_id.partition == partition)]


def warnings_about(log_text: str, task: str, label: str) -> list[str]:
    return [line for line in log_text.splitlines()
            if " WARNING " in line and f"{task} of {label} failed" in line]


def test_one_topic_whose_copies_fail_does_not_stop_tiering_of_the_others(broker_factory, tmp_path, cli_env):  # noqa: F811
    switch = tmp_path / "faults-on"
    switch.touch()
    b = broker_factory(faulty_tiered_broker(tmp_path, switch), extra_args=["-v"])  # -v: INFO lines too
    create_topic(b.bootstrap, "bad", 1, TIERED_TOPIC)  # first in every round
    fill(b.bootstrap, "bad")
    create_topic(b.bootstrap, "good", 1, TIERED_TOPIC)
    fill(b.bootstrap, "good")

    # the topic created after the failing one is tiered anyway
    wait_until("segments of 'good' copied while 'bad' fails", lambda: len(remote(b.data_dir, "good")) >= 3)
    assert remote(b.data_dir, "bad") == []

    # the failure is counted, the partition is in back-off, and `kcli broker metrics` shows both
    failures = metric_name(FAILURES_METRIC, "tiered-copy")
    backoff = metric_name(BACKOFF_GAUGE, "tiered-copy")
    wait_until("failures counted", lambda: broker_metrics(b.bootstrap)["counters"].get(failures, 0) >= 2)
    res = run_kcli(cli_env, "broker", "metrics", "-b", b.bootstrap, "-o", "json")
    assert res.returncode == 0, res.stderr
    shown = json.loads(res.stdout)
    assert shown["counters"][failures] >= 2 and shown["gauges"][backoff] == 1
    # logged once for the streak, not every round
    assert len(warnings_about(b.log_text(), "tiered-copy", "bad-0")) == 1, b.log_text()[-3000:]

    # the store comes back: the failing partition recovers (after its back-off), logged once
    switch.unlink()
    wait_until("segments of 'bad' copied after recovery", lambda: len(remote(b.data_dir, "bad")) >= 3, timeout=60)
    wait_until("back-off gauge back to 0", lambda: broker_metrics(b.bootstrap)["gauges"].get(backoff) == 0)
    assert re.search(r" INFO .*tiered-copy of bad-0 recovered after \d+ failure", b.log_text())
    assert len(warnings_about(b.log_text(), "tiered-copy", "bad-0")) == 1


@pytest.fixture
def immutable(tmp_path: Path) -> Iterator[Callable[[Path, bool], None]]:
    """``immutable(dir, True)``: nothing in ``dir`` can be created, renamed or deleted, and ``dir``
    itself cannot be renamed (chattr +i: a failing disk as even root sees it). Undone at the end."""
    probe = tmp_path / "chattr-probe"
    probe.touch()
    if subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")
    subprocess.run(["chattr", "-i", str(probe)], check=True)
    marked: list[Path] = []

    def set_(path: Path, on: bool) -> None:
        subprocess.run(["chattr", "+i" if on else "-i", str(path)], check=True)
        if on:
            marked.append(path)

    yield set_
    for path in marked:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)


def test_one_partition_whose_local_retention_fails_does_not_stop_the_others(broker_factory, immutable):
    b = broker_factory({"log.retention.check.interval.ms": "200"}, extra_args=["-v"])
    create_topic(b.bootstrap, "bad", 1, {"segment.bytes": "4096"})  # first in every round
    create_topic(b.bootstrap, "good", 1, {"segment.bytes": "4096"})
    fill(b.bootstrap, "bad")
    fill(b.bootstrap, "good")
    immutable(b.data_dir / "bad-0", True)  # retention of bad-0 cannot write its log start checkpoint
    for topic in ("bad", "good"):
        set_topic_config(b.bootstrap, topic, "retention.bytes", "8192")

    def segments(topic: str) -> int:
        return len(list((b.data_dir / f"{topic}-0").glob("*.log")))

    wait_until("good-0 shrunk by retention.bytes while bad-0 fails", lambda: segments("good") <= 3)
    failures = metric_name(FAILURES_METRIC, "log-retention")
    wait_until("failures counted", lambda: broker_metrics(b.bootstrap)["counters"].get(failures, 0) >= 1)
    assert segments("bad") > 3
    assert len(warnings_about(b.log_text(), "log-retention", "bad-0")) == 1

    immutable(b.data_dir / "bad-0", False)
    wait_until("bad-0 shrunk after recovery", lambda: segments("bad") <= 3, timeout=60)
    assert re.search(r" INFO .*log-retention of bad-0 recovered after \d+ failure", b.log_text())


def test_one_topic_whose_partition_deletion_fails_does_not_stop_the_others(broker_factory, immutable):
    b = broker_factory({"delete.topic.partition.enable": "true", "delete.topic.partition.interval.delay.ms": "200"},
                       extra_args=["-v"])
    create_topic(b.bootstrap, "bad", 2)  # first in every round
    create_topic(b.bootstrap, "good", 2)
    for topic in ("bad", "good"):
        fill(b.bootstrap, topic, partition=1, count=20)
    immutable(b.data_dir / "bad-1", True)  # its directory cannot be renamed away

    conn = Connection(b.bootstrap)
    shrink_ops.shrink_topic(conn, "bad", 1, 300, assume_yes=True)
    shrink_ops.shrink_topic(conn, "good", 1, 300, assume_yes=True)
    wait_until("good-1 deleted while bad-1's deletion fails", lambda: not (b.data_dir / "good-1").exists())
    failures = metric_name(FAILURES_METRIC, "partition-deletion")
    wait_until("failures counted", lambda: broker_metrics(b.bootstrap)["counters"].get(failures, 0) >= 1)
    assert (b.data_dir / "bad-1").exists()
    assert len(warnings_about(b.log_text(), "partition-deletion", "bad partitions [1]")) == 1

    # an overdue deletion that fails never stops the broker from starting
    b.restart()
    assert b.alive() and (b.data_dir / "bad-1").exists()

    immutable(b.data_dir / "bad-1", False)
    wait_until("bad-1 deleted after recovery", lambda: not (b.data_dir / "bad-1").exists(), timeout=60)


def test_one_wal_object_that_cannot_be_deleted_does_not_keep_the_others(broker_factory, immutable):
    b = broker_factory(FAST, extra_args=["-v"])
    create_topic(b.bootstrap, "dr", 1, DISKLESS)
    for i in range(3):  # three produce rounds: three WAL objects
        produce(b.bootstrap, "dr", [b"dr-%d-%d" % (i, j) for j in range(10)])

    def known(key: str) -> bool:
        return bool(admin_call(b.bootstrap, admin_api.DISKLESS_OBJECTS_KEY, {"object_key": key})["objects"])

    keys = sorted(o["object_key"] for o in
                  admin_call(b.bootstrap, admin_api.DISKLESS_OBJECTS_KEY, {"topic": "dr"})["objects"])
    assert len(keys) == 3
    stuck, others = keys[1], [keys[0], keys[2]]
    immutable(b.data_dir / "objects" / stuck, True)  # this one object cannot be deleted
    a = admin(b.bootstrap)
    assert list(a.delete_records([TopicPartition("dr", 0, 30)]).values())[0].result(20).low_watermark == 30

    # after the grace period the other objects go, from the store and from the coordinator
    wait_until("the other objects deleted", lambda: not any(known(k) or (b.data_dir / "objects" / k).exists()
                                                            for k in others))
    assert known(stuck) and (b.data_dir / "objects" / stuck).exists()
    failures = metric_name(FAILURES_METRIC, "diskless-file-cleaner")
    wait_until("a retry after the back-off failed too",
               lambda: broker_metrics(b.bootstrap)["counters"].get(failures, 0) >= 2)
    assert broker_metrics(b.bootstrap)["gauges"][metric_name(BACKOFF_GAUGE, "diskless-file-cleaner")] == 1
    text = b.log_text()
    assert len(warnings_about(text, "diskless-file-cleaner", f"WAL object {stuck}")) == 1
    assert not [line for line in text.splitlines() if " WARNING " in line and "diskless-file-cleaner" in line
                and stuck not in line], "one object's failure is not reported as the store failing"

    immutable(b.data_dir / "objects" / stuck, False)
    wait_until("the stuck object deleted after recovery", lambda: not known(stuck), timeout=60)
    assert not (b.data_dir / "objects" / stuck).exists()


def test_guard_backs_off_exponentially_logs_once_and_forgets_vanished_keys(caplog):
    """The mechanism itself, on a fake clock: 1 s, 2 s, 4 s ... capped; one warning per streak."""
    import asyncio
    import logging

    now = [100.0]
    m = Metrics()
    logger = logging.getLogger("kcli.test.background")
    g = TaskGuard("t", m, logger, clock=lambda: now[0], max_s=4)

    def boom() -> None:
        raise OSError("disk says no")

    with caplog.at_level(logging.INFO, logger="kcli.test.background"):
        assert g.step_sync("k", "x-0", boom) is None
        assert not g.ready("k")
        delays = []
        for _ in range(4):
            start = now[0]
            while not g.ready("k"):
                now[0] += 0.5
            delays.append(now[0] - start)
            g.step_sync("k", "x-0", boom)
        assert delays == [1.0, 2.0, 4.0, 4.0]  # doubling, capped
        assert g.step_sync("other", "y-0", lambda: 7) == 7  # the others are never held up
        assert m.counters[metric_name(FAILURES_METRIC, "t")] == 5
        assert m.snapshot()["gauges"][metric_name(BACKOFF_GAUGE, "t")] == 1
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "disk says no" in warnings[0].getMessage()
        now[0] += 10
        assert g.step_sync("k", "x-0", lambda: 1) == 1
        assert any("recovered after 5 failure" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)

    async def round_without(key: str) -> None:
        g.step_sync(key, key, boom)

    asyncio.run(g.round(lambda: round_without("k")))
    assert "k" in g.streaks
    now[0] += 100
    asyncio.run(g.round(lambda: asyncio.sleep(0)))  # 'k' was not visited: its topic is gone
    assert g.in_backoff() == 0
