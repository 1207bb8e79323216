"""SIGKILL the broker inside named windows while an idempotent producer writes, restart, and
prove nothing acknowledged was lost, duplicated, moved or reordered, and that the debris of
the crash (orphan WAL objects, abandoned upload temp files, half-copied remote segments) is
collected.

The harness lives in bench/crash_soak.py (shared with the soak); the windows come from the
broker's pause points (kcli/faults.py). Definitions (also in docs/reliability.md):

- loss: an acknowledged payload id that cannot be read back;
- duplicate: a payload id read more than once (acknowledged or not);
- misplaced: an acknowledged payload id read at another offset than its acknowledgement said;
- order violation: two records of one producer in one partition read in the reverse order of
  their sequence numbers.
"""

from __future__ import annotations

import random

import pytest

from bench.crash_soak import QUICK, CrashSoak, schedule, summary


def _report(soak: CrashSoak, final: object) -> dict:
    s = summary(soak.results, final)  # type: ignore[arg-type]
    print(f"\ncrash rounds={s['rounds']} records={s['records_acknowledged']} losses={s['losses']} "
          f"duplicates={s['duplicates']} misplaced={s['misplaced']} order-violations={s['order_violations']} "
          f"orphans collected={s['orphans_at_kill']} left={s['orphans_left']} "
          f"temp-files collected={s['upload_temp_files_at_kill']} left={s['upload_temp_files_left']} "
          f"restart mean={s['restart_s_mean']}s")
    return s


def _assert_clean(soak: CrashSoak, final: object) -> None:
    s = _report(soak, final)
    lines = "\n".join(r.line() for r in soak.results)
    # A missed window is retried (CrashSoak.run); every point must be hit in the end.
    missed = {r.point for r in soak.results} - {r.point for r in soak.results if r.hit}
    assert not missed, f"kills missed these windows on every try: {missed}\n{lines}"
    for r in soak.results:
        assert r.check.ok, f"round {r.round}: {r.check.examples}\n{lines}"
        assert r.orphans_left == 0, f"orphan WAL objects outlived the grace period:\n{lines}"
        assert r.upload_temp_files_left == 0, f"abandoned upload temp files were never collected:\n{lines}"
        assert r.tiered_leaks == 0, f"remote objects without a remote segment:\n{lines}"
        assert r.tiered_unfinished == 0, f"remote segments left mid-copy by the crash were not cleaned up:\n{lines}"
        assert r.fatal_errors == 0, f"the idempotent producer hit a fatal error:\n{lines}"
    assert s["losses"] == s["duplicates"] == s["misplaced"] == s["order_violations"] == 0
    assert soak.ledger.failed == {}, f"deliveries failed: {soak.ledger.failure_reasons()}"
    # After the last flush every record was acknowledged, so every record read is one of them.
    assert final.unacked_present == 0 and final.read == final.acked == soak.ledger.sent  # type: ignore[attr-defined]


def test_crashes_inside_upload_commit_roll_and_tiering_windows_keep_every_acknowledged_record(tmp_path):
    """Round 1 kills while a WAL object is half uploaded; round 2 while a commit transaction is
    open; round 3 while a classic segment rolls AND a segment is half copied to the remote tier;
    round 4 at a random moment. The final offline checks see no damaged WAL batch or segment."""
    soak = CrashSoak(tmp_path, seed=20240611)
    with soak:
        soak.run(list(QUICK))
        final = soak.final_check()
        tools = soak.offline_tools()
    _assert_clean(soak, final)
    upload, commit, roll_tiered = (next(r for r in soak.results if r.hit and r.point == p) for p in QUICK[:3])
    # What the windows leave behind proves the kills landed in them: a half-written upload temp
    # file (upload), an uploaded object the rolled-back commit never recorded (commit), a
    # half-copied remote segment's temp file (tiering copy).
    assert upload.upload_temp_files_at_kill >= 1, upload.line()
    assert commit.orphans_at_kill >= 1, commit.line()
    assert roll_tiered.upload_temp_files_at_kill >= 1, roll_tiered.line()
    assert tools == {"diskless verify": 0, "dump-log": 0}, tools


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_crash_soak_many_rounds_with_object_store_failures(tmp_path):
    """Every window alone and combined, 20 rounds, with 2% of object-store operations failing."""
    seed = random.SystemRandom().randrange(2**31)
    soak = CrashSoak(tmp_path, seed=seed, rate=800, failure_rate=0.02)
    with soak:
        soak.run(schedule(20, random.Random(seed)))
        final = soak.final_check()
        tools = soak.offline_tools()
    _assert_clean(soak, final)
    assert tools == {"diskless verify": 0, "dump-log": 0}, tools
