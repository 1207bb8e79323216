"""Diskless garbage is only what is provably garbage (docs/reliability.md, "Diskless garbage:
identity and intents").

Each test reproduces a way the old broker destroyed diskless data, against real broker processes
on real files: a deleted ``coordinator.db`` (the broker recreated empty logs and the orphan
collector then deleted every WAL object), two clusters on one object-store prefix (each collected
the other's objects), and objects the coordinator has no record of (deleted automatically).
"""

from __future__ import annotations

import json
import os
import select
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

from kcli.diskless import admin_api
from kcli.diskless.identity import PREFIX_MARKER_KEY
from tests.diskless_helpers import (
    DISKLESS,
    FAST,
    admin,
    counter,
    record_upload_intent,
    wait_until,
)
from tests.fixtures_cli import REPO, assert_one_line_error, cli_env, run_kcli  # noqa: F401 - fixture
from tests.kafka_helpers import consume_all, create_topic, produce

CONFIGS = {**FAST, "diskless.file.cleaner.interval.ms": "100"}  # grace period 800 ms (FAST)


def config_args(configs: dict[str, str]) -> list[str]:
    return [a for k, v in configs.items() for a in ("--config", f"{k}={v}")]


def try_start(env: dict[str, str], data_dir: Path, *args: str, timeout: float = 40.0
              ) -> tuple[subprocess.CompletedProcess[str] | None, subprocess.Popen[bytes] | None]:
    """`kcli broker start`, expecting a refusal: (the finished process, None), or — a broker
    that started anyway (the old code) — (None, the running process, for the test to show the
    damage it does and then kill)."""
    proc = subprocess.Popen([sys.executable, "-m", "kcli", "broker", "start", "--data-dir", str(data_dir),
                             "--listen", "127.0.0.1:0", *config_args(CONFIGS), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
    assert proc.stdout is not None and proc.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline().decode()
            if line.startswith("kcli broker listening on "):
                proc.bootstrap = line.rsplit(" ", 1)[1].strip()  # type: ignore[attr-defined]
                return None, proc
            if not line:  # stdout closed: the process is exiting
                break
        elif proc.poll() is not None:
            break
    try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("kcli broker start neither started nor exited") from None
    out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode()), None


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


def wal_files(objects_dir: Path) -> dict[str, bytes]:
    root = objects_dir / "wal"
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()} if root.is_dir() else {}


def values(bootstrap: str, topic: str, n: int) -> list[bytes]:
    return [m.value() for m in consume_all(bootstrap, topic, n)]


def test_deleted_coordinator_db_refuses_the_start_and_deletes_no_object(broker_factory, cli_env, tmp_path):
    b = broker_factory(CONFIGS)
    create_topic(b.bootstrap, "kept", 2, DISKLESS)
    sent = [b"kept-%d" % i for i in range(20)]
    produce(b.bootstrap, "kept", sent[:10], partition=0)
    produce(b.bootstrap, "kept", sent[10:], partition=1)
    b.stop()
    before = wal_files(b.data_dir / "objects")
    assert len(before) >= 2
    saved = tmp_path / "coordinator-backup"
    saved.mkdir()
    for f in (b.data_dir / "diskless").glob("coordinator.db*"):
        os.replace(f, saved / f.name)  # the operator "deletes" coordinator.db (kept here to restore)

    refused, started = try_start(cli_env, b.data_dir)
    try:
        if started is not None:  # the old code: empty logs, and the cleaner takes every object
            time.sleep(3)
            assert wal_files(b.data_dir / "objects") == before, "objects were deleted after coordinator.db was lost"
            raise AssertionError("the broker started on a data dir whose coordinator lost its state")
    finally:
        stop(started)
    assert refused is not None
    assert_one_line_error(refused, 1, "kept-0", "does not know 2 diskless partition(s)", "restore it")
    assert wal_files(b.data_dir / "objects") == before, "a refused start deletes nothing"
    # Refused again on the next try: never a silent reset.
    again, started = try_start(cli_env, b.data_dir)
    stop(started)
    assert again is not None and again.returncode == 1

    # Restoring the database brings everything back, in order, nothing lost.
    for f in (b.data_dir / "diskless").glob("coordinator.db*"):
        f.unlink()
    for f in saved.iterdir():
        os.replace(f, b.data_dir / "diskless" / f.name)
    b.start()
    assert sorted(values(b.bootstrap, "kept", 20)) == sorted(sent)


def test_second_cluster_on_one_prefix_is_refused_and_the_first_keeps_every_record(broker_factory, cli_env,
                                                                                   tmp_path):
    shared = tmp_path / "shared-store"
    shared.mkdir()
    store = ["--object-store", shared.as_uri()]
    first = broker_factory(CONFIGS, name="first", extra_args=store)
    create_topic(first.bootstrap, "ours", 1, DISKLESS)
    sent = [b"ours-%d" % i for i in range(30)]
    for i in range(3):
        produce(first.bootstrap, "ours", sent[i * 10:(i + 1) * 10])
    owner = json.loads((first.data_dir / "broker.json").read_text())["cluster_id"]
    before = wal_files(shared)
    assert len(before) == 3

    refused, started = try_start(cli_env, tmp_path / "second", *store)
    try:
        if started is not None:  # the old code: its first diskless topic opens the store and its
            create_topic(started.bootstrap, "theirs", 1, DISKLESS)  # type: ignore[attr-defined]
            time.sleep(3)  # cleaner takes the first cluster's objects for orphans
    finally:
        stop(started)
    assert wal_files(shared) == before, "the second cluster deleted the first one's objects"
    first.restart()  # reads come from the objects, not the broker's cache of recent commits
    assert values(first.bootstrap, "ours", 30) == sent, "the first cluster lost acknowledged records"
    assert refused is not None, "a second cluster started on a prefix another cluster owns"
    assert_one_line_error(refused, 1, "belongs to cluster " + owner, PREFIX_MARKER_KEY)
    assert json.loads((shared / PREFIX_MARKER_KEY).read_text())["cluster_id"] == owner
    assert not (tmp_path / "second" / "diskless").exists(), "the refused broker opened no coordinator"

    # The first cluster goes on as before.
    produce(first.bootstrap, "ours", [b"after"])
    assert values(first.bootstrap, "ours", 31) == sent + [b"after"]


def test_unknown_object_is_reported_kept_and_deleted_only_on_request(broker_factory, cli_env):
    b = broker_factory(CONFIGS)
    create_topic(b.bootstrap, "u", 1, DISKLESS)
    sent = [b"u-%d" % i for i in range(10)]
    produce(b.bootstrap, "u", sent)
    wal = b.data_dir / "objects" / "wal"
    stranger = wal / str(uuid.uuid4())
    stranger.write_bytes(b"\x00not recorded by this coordinator")
    os.utime(stranger, (time.time() - 3600, time.time() - 3600))
    key = f"wal/{stranger.name}"
    time.sleep(2)  # ~5 orphan scans (every max(interval, grace / 2) = 400 ms), all past the grace period
    assert stranger.exists(), "the cleaner deleted an object the coordinator has no record of"

    cli = ["-b", b.bootstrap, "diskless"]
    verify = run_kcli(cli_env, *cli, "verify", "-o", "json")
    assert verify.returncode == 0, verify.stderr
    doc = json.loads(verify.stdout)
    assert [o["object_key"] for o in doc["unknown_objects"]] == [key] and doc["orphans"] == []
    table = run_kcli(cli_env, *cli, "verify")
    assert "1 unknown object(s)" in table.stdout and "gc --unknown-objects" in table.stdout

    kept = json.loads(run_kcli(cli_env, *cli, "gc", "-o", "json").stdout)
    assert kept["unknown_objects"] == [key] and not kept["unknown_objects_deleted"] and kept["orphans"] == []
    assert stranger.exists()
    dry = run_kcli(cli_env, *cli, "gc", "--unknown-objects", "--dry-run", "-o", "json")
    assert json.loads(dry.stdout)["unknown_objects"] == [key] and stranger.exists()
    done = run_kcli(cli_env, *cli, "gc", "--unknown-objects")
    assert done.returncode == 0, done.stderr
    assert "Deleted 1 unknown object(s)" in done.stdout and not stranger.exists()
    assert (b.data_dir / "objects" / PREFIX_MARKER_KEY).exists(), "the prefix marker is no WAL object"
    assert values(b.bootstrap, "u", 10) == sent

    # Offline (stopped broker, its coordinator database): the same rules.
    b.stop()
    other = wal / str(uuid.uuid4())
    other.write_bytes(b"\x00also unknown")
    okey = f"wal/{other.name}"
    off = ["--coordinator", f"sqlite://{b.data_dir / 'diskless' / 'coordinator.db'}", "-o", "json"]
    offline = json.loads(run_kcli(cli_env, "diskless", "verify", *off).stdout)
    assert [o["object_key"] for o in offline["unknown_objects"]] == [okey] and offline["orphans"] == []
    gc = json.loads(run_kcli(cli_env, "diskless", "gc", *off, "--grace-ms", "0").stdout)
    assert gc["unknown_objects"] == [okey] and gc["orphans"] == [] and other.exists()
    dry = json.loads(run_kcli(cli_env, "diskless", "gc", *off, "--grace-ms", "0", "--unknown-objects",
                              "--dry-run").stdout)
    assert dry["unknown_objects"] == [okey] and other.exists()
    gone = json.loads(run_kcli(cli_env, "diskless", "gc", *off, "--grace-ms", "0", "--unknown-objects").stdout)
    assert gone["unknown_objects"] == [okey] and gone["unknown_objects_deleted"] and not other.exists()
    # A store whose marker names another cluster than the coordinator's: offline gc refuses.
    marker = b.data_dir / "objects" / PREFIX_MARKER_KEY
    mine = marker.read_bytes()
    marker.write_text(json.dumps({"cluster_id": "someone-else"}))
    third = wal / str(uuid.uuid4())
    third.write_bytes(b"\x00kept")
    refused = run_kcli(cli_env, "diskless", "gc", *off[:2], "--grace-ms", "0", "--unknown-objects")
    assert_one_line_error(refused, 1, "belongs to cluster someone-else", "refusing to collect garbage")
    assert third.exists()
    third.unlink()
    marker.write_bytes(mine)
    b.start()
    assert values(b.bootstrap, "u", 10) == sent


def test_abandoned_upload_with_an_intent_is_collected_after_the_grace_period(broker_factory):
    b = broker_factory(CONFIGS)
    create_topic(b.bootstrap, "a", 1, DISKLESS)
    sent = [b"a-%d" % i for i in range(10)]
    produce(b.bootstrap, "a", sent)
    db = b.data_dir / "diskless" / "coordinator.db"
    with sqlite3.connect(db) as raw:  # committed uploads leave no intent behind
        assert raw.execute("SELECT COUNT(*) FROM upload_intents").fetchone() == (0,)

    # An upload this broker announced, whose commit never came (a crash between PUT and commit).
    abandoned = b.data_dir / "objects" / "wal" / str(uuid.uuid4())
    key = f"wal/{abandoned.name}"
    record_upload_intent(b.data_dir, key)
    abandoned.write_bytes(b"\x00uploaded, never committed")
    report = admin(b.bootstrap, admin_api.DISKLESS_VERIFY_KEY)
    assert [o["object_key"] for o in report["orphans"]] == [key] or not abandoned.exists()
    wait_until(lambda: not abandoned.exists(), 15, what="the abandoned upload collected")
    assert counter(b.bootstrap, "diskless.cleaner.orphans_deleted") >= 1
    with sqlite3.connect(db) as raw:  # its intent goes with it: the table stays bounded
        wait_until(lambda: raw.execute("SELECT COUNT(*) FROM upload_intents").fetchone() == (0,), 10,
                   what="the intent forgotten")
    assert values(b.bootstrap, "a", 10) == sent
