"""ProducerStateManager on its own: Kafka's idempotence rules without any log or file."""

from __future__ import annotations

import pytest

from kio.schema.errors import ErrorCode

from kcli.storage.errors import LogError
from kcli.storage.producer_state import (
    INT32_MAX,
    NUM_BATCHES_TO_RETAIN,
    ProducerStateManager,
    in_sequence,
)


def stage(mgr: ProducerStateManager, pid: int, epoch: int, first_seq: int, count: int, first_offset: int, ts: int = 0):
    """Stage and commit one batch of ``count`` records; returns the duplicate (or None)."""
    update = mgr.begin()
    last_seq = (first_seq + count - 1) & INT32_MAX
    dup = update.append(pid, epoch, first_seq, last_seq, first_offset, first_offset + count - 1, ts)
    update.commit()
    return dup


def test_in_sequence_wraps_at_int32_max() -> None:
    assert in_sequence(4, 5)
    assert not in_sequence(4, 6)
    assert not in_sequence(4, 4)
    assert in_sequence(INT32_MAX, 0)
    assert not in_sequence(INT32_MAX - 1, 0)
    assert in_sequence(-1, 0)  # no batch yet in this epoch: must start at 0


def test_sequences_advance_and_duplicates_return_original_offsets() -> None:
    mgr = ProducerStateManager()
    assert stage(mgr, 1, 0, 0, 10, 100) is None
    assert stage(mgr, 1, 0, 10, 5, 110) is None
    entry = mgr.last_entry(1)
    assert entry is not None and entry.last_seq == 14 and entry.last_offset == 114
    dup = stage(mgr, 1, 0, 0, 10, 999)
    assert dup is not None and (dup.first_offset, dup.last_offset) == (100, 109)
    # A duplicate stages nothing.
    assert mgr.last_entry(1).last_offset == 114


def test_only_the_last_five_batches_are_remembered() -> None:
    mgr = ProducerStateManager()
    for i in range(NUM_BATCHES_TO_RETAIN + 1):
        stage(mgr, 1, 0, i * 2, 2, i * 2)
    # Batch 0 fell out of the cache: its retry is now out of order, not a duplicate.
    with pytest.raises(LogError) as err:
        stage(mgr, 1, 0, 0, 2, 50)
    assert err.value.code == ErrorCode.out_of_order_sequence_number
    assert stage(mgr, 1, 0, 2, 2, 50).first_offset == 2


def test_sequence_gap_is_out_of_order() -> None:
    mgr = ProducerStateManager()
    stage(mgr, 1, 0, 0, 3, 0)
    with pytest.raises(LogError) as err:
        stage(mgr, 1, 0, 4, 1, 3)
    assert err.value.code == ErrorCode.out_of_order_sequence_number
    assert mgr.last_entry(1).last_seq == 2


def test_older_epoch_is_fenced_and_new_epoch_starts_at_zero() -> None:
    mgr = ProducerStateManager()
    stage(mgr, 1, 3, 0, 3, 0)
    with pytest.raises(LogError) as err:
        stage(mgr, 1, 2, 3, 1, 3)
    assert err.value.code == ErrorCode.invalid_producer_epoch
    with pytest.raises(LogError) as err:
        stage(mgr, 1, 4, 3, 1, 3)
    assert err.value.code == ErrorCode.out_of_order_sequence_number
    assert stage(mgr, 1, 4, 0, 1, 3) is None
    entry = mgr.last_entry(1)
    assert entry.producer_epoch == 4 and len(entry.batches) == 1  # old epoch's batches dropped
    # A retry of an old-epoch batch is no longer a duplicate: it is fenced.
    with pytest.raises(LogError) as err:
        stage(mgr, 1, 3, 0, 3, 9)
    assert err.value.code == ErrorCode.invalid_producer_epoch


def test_unknown_producer_may_start_at_any_sequence() -> None:
    mgr = ProducerStateManager()
    assert stage(mgr, 9, 0, 1234, 2, 0) is None
    assert mgr.last_entry(9).last_seq == 1235
    with pytest.raises(LogError):
        stage(mgr, 9, 0, 1237, 1, 2)


def test_wraparound_from_int32_max() -> None:
    mgr = ProducerStateManager()
    stage(mgr, 1, 0, INT32_MAX - 1, 2, 0)
    assert mgr.last_entry(1).last_seq == INT32_MAX
    assert stage(mgr, 1, 0, 0, 1, 2) is None
    # A batch spanning the wrap has last_seq computed modulo Int32.MAX+1.
    mgr2 = ProducerStateManager()
    stage(mgr2, 1, 0, INT32_MAX, 3, 0)
    assert mgr2.last_entry(1).last_seq == 1
    assert stage(mgr2, 1, 0, 2, 1, 3) is None


def test_uncommitted_update_changes_nothing_and_checks_within_one_append() -> None:
    mgr = ProducerStateManager()
    stage(mgr, 1, 0, 0, 1, 0)
    update = mgr.begin()
    assert update.append(1, 0, 1, 1, 1, 1, 0) is None
    assert update.append(1, 0, 2, 3, 2, 3, 0) is None  # follows the staged batch, not the committed one
    with pytest.raises(LogError):
        update.append(1, 0, 2, 2, 4, 4, 0)  # gap relative to the staged state
    assert mgr.last_entry(1).last_seq == 0  # not committed
    update.commit()
    assert mgr.last_entry(1).last_seq == 3


def test_replay_rebuilds_without_checks_and_markers_bump_epoch() -> None:
    mgr = ProducerStateManager()
    mgr.replay(5, 0, 0, 4, 10, 14, 1000)
    mgr.replay(5, 0, 7, 7, 20, 20, 1001)  # a gap is accepted when replaying the log
    assert mgr.last_entry(5).last_seq == 7
    mgr.replay_marker(5, 1, 1002)
    entry = mgr.last_entry(5)
    assert entry.producer_epoch == 1 and not entry.batches and entry.last_timestamp == 1002
    # After a marker-only epoch, the next data batch must start at 0.
    with pytest.raises(LogError) as err:
        stage(mgr, 5, 1, 3, 1, 21)
    assert err.value.code == ErrorCode.out_of_order_sequence_number
    assert stage(mgr, 5, 1, 0, 1, 21) is None


def test_unvalidated_update_skips_duplicate_and_sequence_checks_but_fences() -> None:
    mgr = ProducerStateManager()
    stage(mgr, 1, 2, 0, 1, 0)
    update = mgr.begin(validate=False)
    assert update.append(1, 2, 0, 0, 1, 1, 0) is None  # same seq range, not treated as a retry
    assert update.append(1, 2, 9, 9, 2, 2, 0) is None  # gap accepted
    with pytest.raises(LogError) as err:
        update.append(1, 1, 0, 0, 3, 3, 0)
    assert err.value.code == ErrorCode.invalid_producer_epoch


def test_expiry_by_last_timestamp() -> None:
    mgr = ProducerStateManager()
    stage(mgr, 1, 0, 0, 1, 0, ts=1_000)
    stage(mgr, 2, 0, 0, 1, 1, ts=5_000)
    assert mgr.remove_expired(now_ms=6_000, expiration_ms=3_000) == 1
    assert 1 not in mgr and 2 in mgr and len(mgr) == 1


def test_snapshot_copy_is_independent() -> None:
    mgr = ProducerStateManager()
    stage(mgr, 1, 0, 0, 1, 0)
    snap = mgr.producers()
    stage(mgr, 1, 0, 1, 1, 1)
    assert snap[1].last_seq == 0 and mgr.last_entry(1).last_seq == 1
