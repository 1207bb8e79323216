"""GroupCoordinator driven directly on an event loop: rebalances, timeouts, durable offsets."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from kio.schema.errors import ErrorCode

from kcli.coordinator.group import coordinator as g
from kcli.coordinator.group.coordinator import GroupCoordinator, JoinRequest, JoinResult
from kcli.coordinator.group.offsets import OffsetAndMetadata, OffsetStore

REPO = Path(__file__).resolve().parents[1]


def config(**overrides: int) -> Callable[[str], int]:
    """A broker-config lookup: unknown names raise KeyError as the broker's does."""
    values = {
        "group.initial.rebalance.delay.ms": 0,
        "group.min.session.timeout.ms": 10,
        "group.max.session.timeout.ms": 600_000,
        "offsets.retention.minutes": 10080,
    }
    values.update({k.replace("_", "."): v for k, v in overrides.items()})
    return lambda name: values[name]


def subscription(*topics: str) -> bytes:
    """ConsumerProtocolSubscription v0 as a Java/librdkafka consumer sends it."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


def join_req(group: str, member_id: str = "", *, session_ms: int = 10_000, rebalance_ms: int = 5_000,
             protocols: list[tuple[str, bytes]] | None = None, instance: str | None = None,
             protocol_type: str = "consumer", version: int = 9) -> JoinRequest:
    return JoinRequest(group_id=group, member_id=member_id, group_instance_id=instance, client_id="client",
                       client_host="/127.0.0.1", session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms,
                       protocol_type=protocol_type,
                       protocols=protocols if protocols is not None else [("range", subscription("t"))],
                       require_known_member_id=version >= 4, supports_skip_assignment=version >= 9)


async def join(coord: GroupCoordinator, req: JoinRequest) -> JoinResult:
    """JoinGroup the way a v4+ client does: retry once with the id from MEMBER_ID_REQUIRED."""
    r = await coord.join_group(req)
    if r.error == ErrorCode.member_id_required:
        assert r.member_id and r.generation_id == -1
        r = await coord.join_group(dataclasses.replace(req, member_id=r.member_id))
    return r


async def started(tmp: Path, **cfg: int) -> GroupCoordinator:
    c = GroupCoordinator(tmp, config(**cfg))
    await c.start()
    return c


async def stable_pair(c: GroupCoordinator, group: str = "grp", **kw: Any) -> tuple[JoinResult, JoinResult]:
    """Two members joined and synced; returns (leader's join result, follower's)."""
    r1, r2 = await asyncio.gather(join(c, join_req(group, **kw)), join(c, join_req(group, **kw)))
    leader, follower = (r1, r2) if r1.member_id == r1.leader else (r2, r1)
    assignments = {leader.member_id: b"A", follower.member_id: b"B"}
    s1, s2 = await asyncio.gather(
        c.sync_group(group, leader.generation_id, leader.member_id, None, "consumer", "range", assignments),
        c.sync_group(group, follower.generation_id, follower.member_id, None, "consumer", "range", {}))
    assert (s1.error, s1.assignment, s2.error, s2.assignment) == (0, b"A", 0, b"B")
    return leader, follower


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


# ---- membership ----------------------------------------------------------------------------------


def test_first_join_requires_member_id_then_two_members_share_a_generation(tmp_path: Path) -> None:
    async def main() -> None:
        c = await started(tmp_path, group_initial_rebalance_delay_ms=100)
        first = await c.join_group(join_req("grp"))
        assert first.error == ErrorCode.member_id_required and first.member_id.startswith("client-")
        assert c.describe("grp")["members"] == []  # a pending member is not a member yet

        meta_a, meta_b = subscription("t"), subscription("t", "u")
        r1, r2 = await asyncio.gather(
            c.join_group(join_req("grp", first.member_id, protocols=[("range", meta_a)])),
            join(c, join_req("grp", protocols=[("range", meta_b), ("roundrobin", b"x")])))
        assert r1.error == r2.error == ErrorCode.none
        assert r1.generation_id == r2.generation_id == 1
        assert r1.leader == r2.leader == first.member_id
        assert r1.protocol_name == r2.protocol_name == "range"
        assert r1.protocol_type == "consumer"
        assert {m.member_id: m.metadata for m in r1.members} == {r1.member_id: meta_a, r2.member_id: meta_b}
        assert r2.members == []  # only the leader learns the members
        assert c.describe("grp")["state"] == g.COMPLETING_REBALANCE
        await c.close()

    run(main())


def test_sync_distributes_the_leaders_assignment(tmp_path: Path) -> None:
    async def main() -> None:
        c = await started(tmp_path)
        r1, r2 = await asyncio.gather(join(c, join_req("grp")), join(c, join_req("grp")))
        leader, follower = (r1, r2) if r1.member_id == r1.leader else (r2, r1)
        # The follower parks until the leader has sent the assignment.
        follower_sync = asyncio.create_task(
            c.sync_group("grp", follower.generation_id, follower.member_id, None, "consumer", "range", {}))
        await asyncio.sleep(0.05)
        assert not follower_sync.done()
        bad = await c.sync_group("grp", leader.generation_id + 1, leader.member_id, None, None, None, {})
        assert bad.error == ErrorCode.illegal_generation
        assert (await c.sync_group("grp", leader.generation_id, "nobody", None, None, None, {})).error \
            == ErrorCode.unknown_member_id
        assert (await c.sync_group("grp", leader.generation_id, leader.member_id, None, "other", None, {})).error \
            == ErrorCode.inconsistent_group_protocol
        lead = await c.sync_group("grp", leader.generation_id, leader.member_id, None, "consumer", "range",
                                  {leader.member_id: b"L", follower.member_id: b"F"})
        assert (lead.error, lead.assignment, lead.protocol_name) == (0, b"L", "range")
        f = await follower_sync
        assert (f.error, f.assignment) == (0, b"F")
        d = c.describe("grp")
        assert d["state"] == g.STABLE and d["generation_id"] == 1
        assert {m["member_id"]: m["assignment"] for m in d["members"]} == {leader.member_id: b"L",
                                                                           follower.member_id: b"F"}
        # DescribeGroups shows metadata and assignment once Stable.
        wire = c.describe_group("grp")
        assert wire["group_state"] == "Stable" and wire["protocol_data"] == "range"
        assert {m["member_assignment"] for m in wire["members"]} == {b"L", b"F"}
        # A repeated SyncGroup in Stable returns the stored assignment.
        again = await c.sync_group("grp", follower.generation_id, follower.member_id, None, None, None, {})
        assert (again.error, again.assignment) == (0, b"F")
        await c.close()

    run(main())


def test_heartbeat_reports_rebalance_in_progress_when_a_member_joins(tmp_path: Path) -> None:
    async def main() -> None:
        c = await started(tmp_path)
        leader, follower = await stable_pair(c)
        gen = leader.generation_id
        assert c.heartbeat("grp", gen, follower.member_id) == ErrorCode.none
        assert c.heartbeat("grp", gen + 1, follower.member_id) == ErrorCode.illegal_generation
        assert c.heartbeat("grp", gen, "stranger") == ErrorCode.unknown_member_id
        assert c.heartbeat("nogroup", gen, "stranger") == ErrorCode.unknown_member_id
        assert c.heartbeat("", gen, "x") == ErrorCode.invalid_group_id

        third = asyncio.create_task(join(c, join_req("grp")))
        await asyncio.sleep(0.05)
        assert c.describe("grp")["state"] == g.PREPARING_REBALANCE
        assert c.heartbeat("grp", gen, leader.member_id) == ErrorCode.rebalance_in_progress
        assert c.heartbeat("grp", gen, follower.member_id) == ErrorCode.rebalance_in_progress
        # SyncGroup of the old generation is refused while preparing.
        assert (await c.sync_group("grp", gen, follower.member_id, None, None, None, {})).error \
            == ErrorCode.rebalance_in_progress
        # Old members rejoin (as clients do on REBALANCE_IN_PROGRESS); the new generation forms.
        results = await asyncio.gather(
            c.join_group(join_req("grp", leader.member_id)), c.join_group(join_req("grp", follower.member_id)), third)
        assert {r.generation_id for r in results} == {gen + 1}
        assert all(r.error == ErrorCode.none for r in results)
        assert c.heartbeat("grp", gen + 1, follower.member_id) == ErrorCode.none  # CompletingRebalance is fine
        await c.close()

    run(main())


def test_session_timeout_removes_a_silent_member_and_rebalances(tmp_path: Path) -> None:
    async def main() -> None:
        c = await started(tmp_path)
        leader, follower = await stable_pair(c, session_ms=300)
        gen = leader.generation_id
        t0 = time.monotonic()
        # Only the follower keeps heartbeating; the leader goes silent.
        codes = []
        while time.monotonic() - t0 < 1.0:
            codes.append(c.heartbeat("grp", gen, follower.member_id))
            if codes[-1] != ErrorCode.none:
                break
            await asyncio.sleep(0.05)
        assert codes[-1] == ErrorCode.rebalance_in_progress
        elapsed = time.monotonic() - t0
        assert 0.2 < elapsed < 0.9, elapsed
        d = c.describe("grp")
        assert [m["member_id"] for m in d["members"]] == [follower.member_id]
        rejoined = await c.join_group(join_req("grp", follower.member_id, session_ms=300))
        assert rejoined.error == ErrorCode.none and rejoined.generation_id == gen + 1
        assert rejoined.leader == follower.member_id and len(rejoined.members) == 1
        assert c.heartbeat("grp", gen, leader.member_id) == ErrorCode.unknown_member_id
        await c.close()

    run(main())


def test_pending_member_that_never_rejoins_expires(tmp_path: Path) -> None:
    async def main() -> None:
        c = await started(tmp_path)
        r = await c.join_group(join_req("grp", session_ms=100))
        assert r.error == ErrorCode.member_id_required
        assert r.member_id in c.groups["grp"].pending_members
        await asyncio.sleep(0.25)
        assert r.member_id not in c.groups["grp"].pending_members
        late = await c.join_group(join_req("grp", r.member_id))
        assert late.error == ErrorCode.unknown_member_id
        await c.close()

    run(main())


def test_leave_triggers_a_rebalance_and_last_leave_empties_the_group(tmp_path: Path) -> None:
    async def main() -> None:
        c = await started(tmp_path)
        leader, follower = await stable_pair(c)
        gen = leader.generation_id
        top, members = c.leave_group("grp", [(leader.member_id, None), ("ghost", None)])
        assert top == ErrorCode.none
        assert members == [(leader.member_id, None, ErrorCode.none), ("ghost", None, ErrorCode.unknown_member_id)]
        assert c.describe("grp")["state"] == g.PREPARING_REBALANCE
        assert c.heartbeat("grp", gen, follower.member_id) == ErrorCode.rebalance_in_progress
        r = await c.join_group(join_req("grp", follower.member_id))
        assert (r.error, r.generation_id, r.leader) == (ErrorCode.none, gen + 1, follower.member_id)
        assert c.leave_group("grp", [(follower.member_id, None)]) == (ErrorCode.none, [(follower.member_id, None, ErrorCode.none)])
        d = c.describe("grp")
        assert d["state"] == g.EMPTY and d["members"] == [] and d["generation_id"] == gen + 2
        assert c.leave_group("nogroup", [("x", None)]) == (ErrorCode.none, [("x", None, ErrorCode.unknown_member_id)])
        await c.close()

    run(main())


def test_member_that_does_not_rejoin_within_rebalance_timeout_is_dropped(tmp_path: Path) -> None:
    async def main() -> None:
        c = await started(tmp_path)
        leader, follower = await stable_pair(c, rebalance_ms=300)
        t0 = time.monotonic()
        # The follower rejoins with new metadata; the leader never does (but its session is long).
        r = await c.join_group(join_req("grp", follower.member_id, rebalance_ms=300,
                                        protocols=[("range", subscription("t", "v"))]))
        assert 0.25 < time.monotonic() - t0 < 1.0
        assert r.error == ErrorCode.none and r.generation_id == leader.generation_id + 1
        assert r.leader == follower.member_id and [m.member_id for m in r.members] == [follower.member_id]
        await c.close()

    run(main())


def test_protocol_checks(tmp_path: Path) -> None:
    async def main() -> None:
        c = await started(tmp_path)
        assert (await c.join_group(join_req("grp", protocol_type=""))).error == ErrorCode.inconsistent_group_protocol
        assert (await c.join_group(join_req("grp", session_ms=5))).error == ErrorCode.invalid_session_timeout
        assert (await c.join_group(join_req(""))).error == ErrorCode.invalid_group_id
        assert (await c.join_group(join_req("nogroup", "some-id"))).error == ErrorCode.unknown_member_id
        await stable_pair(c)
        other = await c.join_group(join_req("grp", protocols=[("cooperative-sticky", b"")]))
        assert other.error == ErrorCode.inconsistent_group_protocol
        other = await c.join_group(join_req("grp", protocol_type="connect"))
        assert other.error == ErrorCode.inconsistent_group_protocol
        # Before v4 a new member is admitted straight away, no MEMBER_ID_REQUIRED round trip.
        old = c.join_group(join_req("grp", version=3))
        task = asyncio.create_task(old)
        await asyncio.sleep(0.05)
        assert c.describe("grp")["state"] == g.PREPARING_REBALANCE and len(c.describe("grp")["members"]) == 3
        task.cancel()
        await c.close()

    run(main())


def test_static_member_rejoin_keeps_the_assignment_without_rebalance(tmp_path: Path) -> None:
    async def main() -> None:
        c = await started(tmp_path)
        a, b = await asyncio.gather(join(c, join_req("grp", instance="i-a")), join(c, join_req("grp", instance="i-b")))
        assert a.error == b.error == ErrorCode.none and a.generation_id == 1  # static members skip MEMBER_ID_REQUIRED
        leader, follower = (a, b) if a.member_id == a.leader else (b, a)
        inst = {leader.member_id: "i-a" if leader is a else "i-b", follower.member_id: "i-b" if leader is a else "i-a"}
        await asyncio.gather(
            c.sync_group("grp", 1, leader.member_id, inst[leader.member_id], None, None,
                         {leader.member_id: b"L", follower.member_id: b"F"}),
            c.sync_group("grp", 1, follower.member_id, inst[follower.member_id], None, None, {}))
        # The follower restarts: unknown member id, same instance id → new id, same generation.
        again = await c.join_group(join_req("grp", instance=inst[follower.member_id]))
        assert again.error == ErrorCode.none and again.generation_id == 1 and again.member_id != follower.member_id
        assert c.describe("grp")["state"] == g.STABLE
        s = await c.sync_group("grp", 1, again.member_id, inst[follower.member_id], None, None, {})
        assert (s.error, s.assignment) == (ErrorCode.none, b"F")
        # The old incarnation is fenced.
        assert c.heartbeat("grp", 1, follower.member_id, inst[follower.member_id]) == ErrorCode.fenced_instance_id
        # Admin removal by instance id (LeaveGroup with an empty member id).
        top, res = c.leave_group("grp", [("", inst[follower.member_id])])
        assert res == [("", inst[follower.member_id], ErrorCode.none)]
        assert c.describe("grp")["state"] == g.PREPARING_REBALANCE
        await c.close()

    run(main())


# ---- initial rebalance delay ------------------------------------------------------------------


def test_initial_delay_is_honoured_and_extended_by_new_members(tmp_path: Path) -> None:
    async def main() -> None:
        c = await started(tmp_path, group_initial_rebalance_delay_ms=300)
        t0 = time.monotonic()
        first = asyncio.create_task(join(c, join_req("grp")))
        await asyncio.sleep(0.2)
        assert not first.done()
        second = asyncio.create_task(join(c, join_req("grp")))  # arrives inside the delay: extends it
        r1 = await first
        t1 = time.monotonic() - t0
        r2 = await second
        assert 0.55 <= t1 < 0.9, t1
        assert r1.generation_id == r2.generation_id == 1
        await c.close()

    run(main())


def test_initial_delay_alone_is_about_the_configured_delay(tmp_path: Path) -> None:
    async def main() -> None:
        c = await started(tmp_path, group_initial_rebalance_delay_ms=250)
        t0 = time.monotonic()
        r = await join(c, join_req("grp"))
        elapsed = time.monotonic() - t0
        assert r.error == ErrorCode.none and 0.24 <= elapsed < 0.5, elapsed
        await c.close()

    run(main())


def test_initial_delay_is_bounded_by_the_rebalance_timeout(tmp_path: Path) -> None:
    async def main() -> None:
        c = await started(tmp_path, group_initial_rebalance_delay_ms=300)
        t0 = time.monotonic()
        tasks = [asyncio.create_task(join(c, join_req("grp", rebalance_ms=1000)))]
        # A new member every 100 ms would extend the delay for ever without the bound.
        while not tasks[0].done() and time.monotonic() - t0 < 3:
            await asyncio.sleep(0.1)
            tasks.append(asyncio.create_task(join(c, join_req("grp", rebalance_ms=1000))))
        elapsed = time.monotonic() - t0
        assert 0.95 <= elapsed < 1.6, elapsed
        r = tasks[0].result()
        assert r.error == ErrorCode.none and r.generation_id == 1 and len(r.members) >= 9
        for t in tasks:
            t.cancel()
        await c.close()

    run(main())


# ---- offsets ----------------------------------------------------------------------------------


def test_offset_commit_rules(tmp_path: Path) -> None:
    async def main() -> None:
        c = await started(tmp_path)
        om = {("t", 0): OffsetAndMetadata(5)}
        # Unknown group: generation -1 (standalone consumer / admin) may commit, others may not.
        assert await c.commit_offsets("solo", 3, "m", None, om) == {("t", 0): ErrorCode.illegal_generation}
        assert await c.commit_offsets("solo", -1, "", None, om) == {("t", 0): ErrorCode.none}
        assert c.committed_offsets("solo") == {("t", 0): 5}
        assert c.list_groups() == [("solo", "", "Empty")]

        leader, follower = await stable_pair(c)
        gen = leader.generation_id
        ok = await c.commit_offsets("grp", gen, follower.member_id, None,
                                    {("t", 0): OffsetAndMetadata(10, 2, "meta"), ("t", 1): OffsetAndMetadata(11)})
        assert ok == {("t", 0): 0, ("t", 1): 0}
        assert await c.commit_offsets("grp", gen + 1, follower.member_id, None, om) == {("t", 0): ErrorCode.illegal_generation}
        assert await c.commit_offsets("grp", gen, "stranger", None, om) == {("t", 0): ErrorCode.unknown_member_id}
        assert await c.commit_offsets("grp", -1, "", None, om) == {("t", 0): ErrorCode.unknown_member_id}
        too_big = {("t", 2): OffsetAndMetadata(1, -1, "x" * 5000)}
        assert await c.commit_offsets("grp", gen, leader.member_id, None, too_big) == \
            {("t", 2): ErrorCode.offset_metadata_too_large}

        err, got = c.fetch_offsets("grp", [("t", 0), ("t", 1), ("t", 9)])
        assert err == ErrorCode.none
        assert got[("t", 0)] is not None and (got[("t", 0)].offset, got[("t", 0)].leader_epoch,
                                               got[("t", 0)].metadata) == (10, 2, "meta")
        assert got[("t", 1)].offset == 11 and got[("t", 9)] is None  # type: ignore[union-attr]
        assert sorted(c.fetch_offsets("grp", None)[1]) == [("t", 0), ("t", 1)]
        assert c.fetch_offsets("nogroup", None) == (ErrorCode.none, {})

        # While CompletingRebalance a member's commit is answered REBALANCE_IN_PROGRESS.
        third = asyncio.create_task(join(c, join_req("grp")))
        await asyncio.sleep(0.02)
        # PreparingRebalance still accepts commits from the current generation.
        assert await c.commit_offsets("grp", gen, follower.member_id, None, om) == {("t", 0): ErrorCode.none}
        r = await asyncio.gather(c.join_group(join_req("grp", leader.member_id)),
                                 c.join_group(join_req("grp", follower.member_id)), third)
        assert await c.commit_offsets("grp", gen + 1, r[1].member_id, None, om) == {("t", 0): ErrorCode.rebalance_in_progress}
        await c.close()

    run(main())


def test_offsets_survive_a_coordinator_restart_and_group_deletion_is_durable(tmp_path: Path) -> None:
    async def main() -> None:
        c = await started(tmp_path)
        await c.commit_offsets("g1", -1, "", None, {("t", 0): OffsetAndMetadata(7, 1, "a"),
                                                    ("u", 3): OffsetAndMetadata(9)})
        await c.commit_offsets("g2", -1, "", None, {("t", 0): OffsetAndMetadata(1)})
        await c.commit_offsets("g1", -1, "", None, {("t", 0): OffsetAndMetadata(8, 1, "b")})
        await c.close()

        c = await started(tmp_path)
        assert c.committed_offsets("g1") == {("t", 0): 8, ("u", 3): 9}
        assert c.fetch_offsets("g1", [("t", 0)])[1][("t", 0)] == OffsetAndMetadata(
            8, 1, "b", c.store.offsets["g1"][("t", 0)].commit_timestamp_ms)
        assert sorted(gid for gid, _pt, _st in c.list_groups()) == ["g1", "g2"]
        assert await c.delete_groups(["g2", "missing"]) == {"g2": ErrorCode.none, "missing": ErrorCode.group_id_not_found}
        assert c.delete_topic_offsets("u") == 1
        await c.close()

        c = await started(tmp_path)
        assert c.committed_offsets("g1") == {("t", 0): 8}
        assert c.committed_offsets("g2") == {}
        assert [gid for gid, _pt, _st in c.list_groups()] == ["g1"]
        await c.close()

    run(main())


def test_committed_offsets_survive_kill_9_right_after_the_answer(tmp_path: Path) -> None:
    script = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from kcli.coordinator.group.coordinator import GroupCoordinator\nfrom kcli.coordinator.group.offsets import OffsetAndMetadata\n"
        "async def main():\n"
        "    c = GroupCoordinator(Path(sys.argv[1]), lambda name: {}[name])\n"
        "    await c.start()\n"
        "    for i in range(50):\n"
        "        r = await c.commit_offsets('g', -1, '', None, {('t', i % 4): OffsetAndMetadata(i)})\n"
        "        assert r == {('t', i % 4): 0}, r\n"
        "    print('committed', flush=True)\n"
        "    await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"committed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    async def main() -> None:
        c = await started(tmp_path)
        assert c.committed_offsets("g") == {("t", 0): 48, ("t", 1): 49, ("t", 2): 46, ("t", 3): 47}
        await c.close()

    run(main())


def test_torn_tail_is_cut_and_later_commits_still_persist(tmp_path: Path) -> None:
    async def main() -> None:
        c = await started(tmp_path)
        await c.commit_offsets("g", -1, "", None, {("t", 0): OffsetAndMetadata(1)})
        await c.close()
        path = tmp_path / "__consumer_offsets" / "offsets.log"
        good = path.read_bytes()
        path.write_bytes(good + b'0badc0de {"type":"offset","gro')  # a crash mid-write
        c = await started(tmp_path)
        assert path.read_bytes() == good
        await c.commit_offsets("g", -1, "", None, {("t", 1): OffsetAndMetadata(2)})
        await c.close()
        c = await started(tmp_path)
        assert c.committed_offsets("g") == {("t", 0): 1, ("t", 1): 2}
        await c.close()

    run(main())


def test_store_compacts_superseded_records(tmp_path: Path) -> None:
    async def main() -> None:
        store = OffsetStore(tmp_path / "offs", compact_min_lines=50)
        store.open()
        for i in range(200):
            await store.append([{"type": "offset", "group": "g", "topic": "t", "partition": i % 2, "offset": i}])
        assert store.compactions >= 1
        assert store.lines < 60
        size = store.path.stat().st_size
        await store.close()
        assert size < 60 * 120
        again = OffsetStore(tmp_path / "offs", compact_min_lines=50)
        again.open()
        assert {tp: om.offset for tp, om in again.offsets["g"].items()} == {("t", 0): 198, ("t", 1): 199}
        await again.close()

    run(main())


def test_concurrent_commits_share_fsyncs_and_all_land(tmp_path: Path) -> None:
    async def main() -> None:
        c = await started(tmp_path)
        results = await asyncio.gather(*[
            c.commit_offsets(f"g{i % 5}", -1, "", None, {("t", i): OffsetAndMetadata(i)}) for i in range(200)])
        assert all(list(r.values()) == [0] for r in results)
        lines = c.store.lines
        await c.close()
        assert lines == 200
        c = await started(tmp_path)
        assert sum(len(c.committed_offsets(f"g{k}")) for k in range(5)) == 200
        await c.close()

    run(main())


def test_delete_group_only_when_empty(tmp_path: Path) -> None:
    async def main() -> None:
        c = await started(tmp_path)
        leader, follower = await stable_pair(c)
        await c.commit_offsets("grp", leader.generation_id, leader.member_id, None, {("t", 0): OffsetAndMetadata(3)})
        assert await c.delete_groups(["grp"]) == {"grp": ErrorCode.non_empty_group}
        c.leave_group("grp", [(leader.member_id, None), (follower.member_id, None)])
        assert c.describe("grp")["state"] == g.EMPTY
        assert await c.delete_groups(["grp"]) == {"grp": ErrorCode.none}
        assert c.committed_offsets("grp") == {}
        assert c.describe("grp")["state"] == g.DEAD
        assert c.describe_group("grp")["group_state"] == "Dead"
        assert await c.delete_groups(["grp"]) == {"grp": ErrorCode.group_id_not_found}
        assert c.list_groups() == []
        await c.close()

    run(main())


def test_retention_expires_offsets_of_empty_groups_and_forgets_them(tmp_path: Path) -> None:
    async def main() -> None:
        c = await started(tmp_path, offsets_retention_minutes=1)
        await c.commit_offsets("solo", -1, "", None, {("t", 0): OffsetAndMetadata(1)})
        leader, follower = await stable_pair(c)
        await c.commit_offsets("grp", leader.generation_id, leader.member_id, None, {("t", 0): OffsetAndMetadata(2)})
        now = int(time.time() * 1000)
        assert c.expire_offsets(now) == 0
        # A Stable consumer group keeps offsets of subscribed topics however old.
        assert c.expire_offsets(now + 120_000) == 1
        assert c.committed_offsets("solo") == {} and "solo" not in c.groups
        assert c.committed_offsets("grp") == {("t", 0): 2}
        c.leave_group("grp", [(leader.member_id, None), (follower.member_id, None)])
        assert c.expire_offsets(now + 10_000) == 0  # empty for less than the retention
        assert c.expire_offsets(int(time.time() * 1000) + 61_000) == 1
        assert "grp" not in c.groups
        await c.close()
        c = await started(tmp_path)
        assert c.list_groups() == []
        await c.close()

    run(main())


def test_close_answers_parked_requests(tmp_path: Path) -> None:
    async def main() -> None:
        c = await started(tmp_path, group_initial_rebalance_delay_ms=10_000)
        parked = asyncio.create_task(join(c, join_req("grp")))
        await asyncio.sleep(0.05)
        await c.close()
        r = await parked
        assert r.error == ErrorCode.not_coordinator
        assert c.heartbeat("grp", 0, r.member_id) == ErrorCode.coordinator_not_available

    run(main())


def test_parse_consumer_subscription() -> None:
    assert g.parse_consumer_subscription(subscription("a", "bb")) == ["a", "bb"]
    assert g.parse_consumer_subscription(b"\x00") is None


@pytest.mark.parametrize("state", g.STATES)
def test_list_groups_filters_states_case_insensitively(tmp_path: Path, state: str) -> None:
    async def main() -> None:
        c = await started(tmp_path)
        await c.commit_offsets("solo", -1, "", None, {("t", 0): OffsetAndMetadata(1)})
        expect = [("solo", "", "Empty")] if state == g.EMPTY else []
        assert c.list_groups([state.upper()]) == expect
        await c.close()

    run(main())


# ---- every version of every group API, over the wire against a real broker process -----------


def _api_versions(jv: int) -> dict[str, int]:
    """Versions of the other group APIs to pair with JoinGroup ``jv`` (each clamped to its range)."""
    return {"sync": min(jv, 5), "hb": min(jv, 4), "leave": min(jv, 5), "commit": min(max(jv, 2), 8),
            "fetch": min(max(jv, 1), 8), "describe": min(jv, 5), "list": min(jv, 4), "delete": min(jv, 2),
            "find": min(jv, 5)}


def test_every_api_version_over_the_wire(broker_factory: Any) -> None:
    from kcli.protocol.client import WireClient
    from tests.kafka_helpers import create_topic

    broker = broker_factory({"group.initial.rebalance.delay.ms": "0"})
    create_topic(broker.bootstrap, "t", partitions=2)
    meta = subscription("t")
    node_id = json.loads((broker.data_dir / "broker.json").read_text())["node_id"]
    with WireClient(broker.bootstrap) as c:
        txn = c.request(10, 4, {"key_type": 1, "coordinator_keys": ["tx"]}).coordinators[0]
        assert (int(txn.error_code), int(txn.node_id)) == (0, node_id)
        bad = c.request(10, 3, {"key": "k", "key_type": 7})
        assert int(bad.error_code) == 42  # INVALID_REQUEST
        for jv in range(10):
            v = _api_versions(jv)
            gid = f"grp-v{jv}"
            find = c.request(10, v["find"], {"key": gid, "key_type": 0, "coordinator_keys": [gid]})
            coord = find.coordinators[0] if v["find"] >= 4 else find
            assert (int(coord.error_code), int(coord.node_id), int(coord.port)) == (0, node_id, broker.port), (jv, find)

            body = {"group_id": gid, "session_timeout": 10_000, "rebalance_timeout": 10_000, "member_id": "",
                    "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": meta}]}
            j = c.request(11, jv, body)
            if jv >= 4:
                assert int(j.error_code) == ErrorCode.member_id_required and j.member_id, (jv, j)
                j = c.request(11, jv, {**body, "member_id": j.member_id})
            assert int(j.error_code) == 0 and int(j.generation_id) == 1, (jv, j)
            assert j.leader == j.member_id and [m.member_id for m in j.members] == [j.member_id]
            assert bytes(j.members[0].metadata) == meta and j.protocol_name == "range"
            mid, gen = j.member_id, int(j.generation_id)

            s = c.request(14, v["sync"], {"group_id": gid, "generation_id": gen, "member_id": mid,
                                          "protocol_type": "consumer", "protocol_name": "range",
                                          "assignments": [{"member_id": mid, "assignment": b"ASSIGN"}]})
            assert (int(s.error_code), bytes(s.assignment)) == (0, b"ASSIGN"), (jv, s)
            hb = c.request(12, v["hb"], {"group_id": gid, "generation_id": gen, "member_id": mid})
            assert int(hb.error_code) == 0
            hb = c.request(12, v["hb"], {"group_id": gid, "generation_id": gen + 5, "member_id": mid})
            assert int(hb.error_code) == ErrorCode.illegal_generation

            oc = c.request(8, v["commit"], {
                "group_id": gid, "generation_id_or_member_epoch": gen, "member_id": mid,
                "topics": [{"name": "t", "partitions": [{"partition_index": 0, "committed_offset": 42,
                                                         "committed_leader_epoch": 3, "committed_metadata": "m"}]},
                           {"name": "missing", "partitions": [{"partition_index": 0, "committed_offset": 1,
                                                               "committed_metadata": None}]}]})
            codes = {(t.name, int(p.partition_index)): int(p.error_code) for t in oc.topics for p in t.partitions}
            assert codes == {("t", 0): 0, ("missing", 0): ErrorCode.unknown_topic_or_partition}, (jv, oc)

            topics = [{"name": "t", "partition_indexes": [0, 1]}]
            if v["fetch"] >= 8:
                of = c.request(9, 8, {"groups": [{"group_id": gid, "topics": topics}]})
                assert int(of.groups[0].error_code) == 0
                parts = of.groups[0].topics[0].partitions
            else:
                of = c.request(9, v["fetch"], {"group_id": gid, "topics": topics})
                parts = of.topics[0].partitions
            got = {int(p.partition_index): (int(p.committed_offset), p.metadata) for p in parts}
            assert got == {0: (42, "m"), 1: (-1, "")}, (jv, of)
            if v["fetch"] >= 2:  # null topics: everything the group committed
                every = (c.request(9, v["fetch"], {"groups": [{"group_id": gid, "topics": None}]}).groups[0]
                         if v["fetch"] >= 8 else c.request(9, v["fetch"], {"group_id": gid, "topics": None}))
                assert [(t.name, [int(p.partition_index) for p in t.partitions]) for t in every.topics] == [("t", [0])]

            d = c.request(15, v["describe"], {"groups": [gid, "nope"], "include_authorized_operations": True})
            mine, nope = d.groups
            assert (int(mine.error_code), mine.group_state, mine.protocol_data) == (0, "Stable", "range")
            assert [(m.member_id, bytes(m.member_assignment)) for m in mine.members] == [(mid, b"ASSIGN")]
            assert (int(nope.error_code), nope.group_state) == (0, "Dead")

            lg = c.request(16, v["list"], {"states_filter": ["Stable"]})
            assert (gid, "consumer") in [(x.group_id, x.protocol_type) for x in lg.groups]

            dg = c.request(42, v["delete"], {"groups_names": [gid]})
            assert [(r.group_id, int(r.error_code)) for r in dg.results] == [(gid, ErrorCode.non_empty_group)]

            if v["leave"] >= 3:
                lv = c.request(13, v["leave"], {"group_id": gid, "members": [{"member_id": mid}, {"member_id": "x"}]})
                assert [(m.member_id, int(m.error_code)) for m in lv.members] == [(mid, 0), ("x", ErrorCode.unknown_member_id)]
            else:
                lv = c.request(13, v["leave"], {"group_id": gid, "member_id": mid})
            assert int(lv.error_code) == 0, (jv, lv)

            dg = c.request(42, v["delete"], {"groups_names": [gid, gid + "-none"]})
            assert [(r.group_id, int(r.error_code)) for r in dg.results] == [(gid, 0), (gid + "-none", ErrorCode.group_id_not_found)]
