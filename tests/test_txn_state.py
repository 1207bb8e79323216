"""Unit tests of the pieces under the transaction coordinator: marker batches, a partition's
open/aborted transactions (and their rebuild from the log), the transaction state log."""

from __future__ import annotations

import asyncio
import struct
import subprocess
import sys
from pathlib import Path

from kcli.coordinator.transaction.state import ONGOING, PREPARE_COMMIT, TransactionLog, TransactionMetadata
from kcli.dumplog.synth import build_batch
from kcli.records.batch import crc_is_valid, read_header
from kcli.records.control import ABORT, COMMIT, control_type, marker_batch
from kcli.storage.log import AppendOrigin, PartitionLog
from kcli.storage.txn_state import AbortedTxn, PartitionTxnState


def test_marker_batch_is_a_valid_control_batch() -> None:
    for commit, kind in ((True, COMMIT), (False, ABORT)):
        buf = marker_batch(commit, 7, 3, 0, 1_700_000_000_000)
        h = read_header(buf)
        assert h.is_control and h.is_transactional and crc_is_valid(buf, h)
        assert (h.producer_id, h.producer_epoch, h.base_sequence, h.records_count) == (7, 3, -1, 1)
        assert control_type(buf) == kind
    assert control_type(b"\x00" * 70) == -1


def test_partition_txn_state() -> None:
    s = PartitionTxnState()
    s.on_data(1, 10, transactional=True)
    s.on_data(1, 12, transactional=True)  # same transaction
    s.on_data(2, 15, transactional=True)
    s.on_data(3, 16, transactional=False)  # idempotent only: no transaction
    assert s.last_stable_offset(20) == 10
    assert s.on_marker(1, False, 18, 20) is not None
    assert s.last_stable_offset(20) == 15
    assert s.on_marker(2, True, 19, 20) is None
    assert s.last_stable_offset(21) == 21
    assert s.aborted_between(0, 21) == [AbortedTxn(1, 10, 18, 15)]
    assert s.aborted_between(19, 30) == []  # wholly before the fetch
    assert s.aborted_between(0, 10) == []  # wholly after it
    s.truncate_before(19)
    assert s.aborted == []


def test_log_tracks_and_rebuilds_transactions(tmp_path: Path) -> None:
    d = tmp_path / "p-0"
    lg = PartitionLog.open(d)
    data = build_batch([(None, b"a", [])], producer_id=5, producer_epoch=0, base_sequence=0, transactional=True)
    lg.append(data, now_ms=1)  # offset 0
    lg.append(build_batch([(None, b"b", [])], producer_id=6, producer_epoch=0, base_sequence=0,
                          transactional=True), now_ms=1)  # offset 1
    assert lg.last_stable_offset == 0
    lg.append(marker_batch(False, 5, 0, 0, 2), now_ms=2, origin=AppendOrigin.COORDINATOR)  # offset 2
    assert lg.last_stable_offset == 1
    assert [(a.producer_id, a.first_offset, a.last_offset) for a in lg.aborted_transactions(0, 3)] == [(5, 0, 2)]
    txnindex = d / "00000000000000000000.txnindex"
    entry = struct.pack(">hqqqq", 0, 5, 0, 2, 1)  # Kafka's AbortedTxn (version 0, lastStableOffset 1)
    assert txnindex.read_bytes() == entry
    lg.close()
    txnindex.unlink()
    (d / "00000000000000000042.txnindex").write_bytes(entry)  # orphan: no such segment
    lg = PartitionLog.open(d)  # unclean open: rebuilt from the batches
    try:
        assert lg.last_stable_offset == 1
        assert lg.open_transactions() == {6: 1}
        assert [(a.producer_id, a.first_offset, a.last_offset) for a in lg.aborted_transactions(0, 3)] == [(5, 0, 2)]
    finally:
        lg.close()
    assert txnindex.read_bytes()[:26] == entry[:26]  # rebuilt (its LSO is recomputed on replay)
    assert not (d / "00000000000000000042.txnindex").exists()
    out = subprocess.run([sys.executable, "-m", "kcli", "dump-log", str(txnindex)], capture_output=True, text=True, check=True)
    assert "producerId: 5 firstOffset: 0 lastOffset: 2" in out.stdout


def test_transaction_log_replays_last_state_and_drops_torn_tail(tmp_path: Path) -> None:
    store = TransactionLog(tmp_path / "__transaction_state")
    assert store.open() == {}
    md = TransactionMetadata("t", 1000, 0, 60000)
    live = {"t": md}
    ongoing = TransactionMetadata("t", 1000, 0, 60000, ONGOING, partitions=frozenset({("x", 0)}),
                                  pending_offsets={"g": {("x", 0): (5, -1, "m")}}, start_ms=1)
    prepared = TransactionMetadata("t", 1000, 0, 60000, PREPARE_COMMIT, partitions=frozenset({("x", 0)}), start_ms=1)

    async def write() -> None:
        await store.write([md.to_record()], live)
        await store.write([ongoing.to_record()], live)
        await store.write([{"type": "txn", "transactional_id": "u", "producer_id": 1, "producer_epoch": 0,
                            "timeout_ms": 1, "state": "Empty"}], live)
        await store.write([{"type": "txn_delete", "transactional_id": "u"}], live)

    asyncio.run(write())
    store.close()
    with open(store.path, "ab") as f:
        f.write(b"deadbeef {\"torn")
    again = TransactionLog(tmp_path / "__transaction_state")
    state = again.open()
    assert state == {"t": ongoing}
    assert again.path.read_bytes().endswith(b"}\n")  # compacted, torn tail gone
    asyncio.run(again.write([prepared.to_record()], state))
    again.close()
    assert TransactionLog(tmp_path / "__transaction_state").open()["t"].state == PREPARE_COMMIT
