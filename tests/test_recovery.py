"""Start-up recovery never cuts good data; damage is reported where it is read; every failing
write names its path and OS error. All against a real broker process (docs/reliability.md,
"Start-up recovery and damaged segments").

Each test reproduces a failure of the old code: a read-only ``kcli topics list`` after a clean
stop cut half of a segment with one flipped byte; after a crash the whole active segment was
CRC-checked and cut at damage below the recovery point, the cut bytes deleted; a full disk
failed appends without a word in the broker log.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

from kcli.protocol.client import WireClient
from kcli.records.batch import BatchHeader, iter_headers
from tests.brokerproc import BrokerProcess
from tests.kafka_helpers import create_topic, produce
from tests.wire_helpers import batch, produce_body, produce_result

REPO = Path(__file__).resolve().parent.parent
SEGMENT = "00000000000000000000.log"
CORRUPT_MESSAGE = 2
KAFKA_STORAGE_ERROR = 56


def _values(n: int, tag: str) -> list[bytes]:
    return [f"{tag}-{i:07d}-".encode() + b"x" * 80 for i in range(n)]


def _batches(path: Path) -> list[BatchHeader]:
    return list(iter_headers(path.read_bytes()))


def _flip_body_byte(path: Path, h: BatchHeader) -> None:
    """Flip one byte inside a batch's records: its header stays possible, its CRC fails."""
    at = h.position + h.size - 3
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x5A]))


def _fetch(bootstrap: str, topic: str, offset: int) -> tuple[int, bytes]:
    """(error code, records) of one Fetch v4 of partition 0 at ``offset``."""
    with WireClient(bootstrap, timeout=20) as client:
        resp = client.request(1, 4, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "topics": [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": offset,
                                                        "partition_max_bytes": 1 << 20}]}]})
        p = resp.responses[0].partitions[0]
        return int(p.error_code), bytes(p.records or b"")


def _kcli(data_dir: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCLI_")}
    env.update(KCLI_DATA_DIR=str(data_dir), KCLI_CONFIG=str(tmp_path / "kcli-config.yaml"),
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "kcli", *args], check=False, capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=60)


def test_clean_stop_then_a_read_only_command_cuts_nothing_and_the_damage_is_reported_where_read(
        broker_factory, tmp_path: Path) -> None:
    """The issue's reproduction: many records, clean stop, one flipped byte mid-segment, then
    `kcli topics list` on the data dir. Old code: half the segment truncated, silently."""
    b = broker_factory()
    create_topic(b.bootstrap, "rec", 1)
    produce(b.bootstrap, "rec", _values(40_000, "a"), partition=0, **{"batch.size": 65536, "linger.ms": 20})
    assert b.stop() == 0
    assert (b.data_dir / ".kafka_cleanshutdown").exists()
    seg = b.data_dir / "rec-0" / SEGMENT
    headers = _batches(seg)
    assert len(headers) >= 20
    mid = headers[len(headers) // 2]
    _flip_body_byte(seg, mid)
    damaged = seg.read_bytes()

    proc = _kcli(b.data_dir, tmp_path, "topics", "list")
    assert proc.returncode == 0, proc.stderr
    assert "rec" in proc.stdout
    assert seg.read_bytes() == damaged, "a read-only command changed the segment"
    assert not list(seg.parent.glob("*.truncated-*"))
    assert (b.data_dir / ".kafka_cleanshutdown").exists()  # the embedded broker stopped cleanly too

    b.start()  # a clean start: no recovery either
    assert seg.read_bytes() == damaged
    code, records = _fetch(b.bootstrap, "rec", 0)
    assert code == 0 and records
    code, records = _fetch(b.bootstrap, "rec", mid.base_offset)
    assert (code, records) == (CORRUPT_MESSAGE, b"")
    code, records = _fetch(b.bootstrap, "rec", mid.last_offset + 1)  # past the damage reads on
    assert code == 0 and next(iter_headers(records)).base_offset == mid.last_offset + 1
    # Fetches stop short of the damaged batch rather than serving it.
    code, records = _fetch(b.bootstrap, "rec", headers[len(headers) // 2 - 1].base_offset)
    assert code == 0 and [h.base_offset for h in iter_headers(records)] == [headers[len(headers) // 2 - 1].base_offset]
    warnings = [ln for ln in b.log_text().splitlines() if "WARNING" in ln and "rec-0" in ln]
    assert any(f"{SEGMENT} position {mid.position}" in ln for ln in warnings), warnings
    assert len(warnings) == 1, warnings  # once, not once per fetch
    b.stop()
    assert seg.read_bytes() == damaged

    dump = _kcli(b.data_dir, tmp_path, "dump-log", str(seg))
    assert dump.returncode == 1
    assert f"the batch at position {mid.position} of" in dump.stderr and "CRC" in dump.stderr


def test_after_a_crash_only_what_lies_above_the_recovery_point_is_cut_and_it_is_moved_aside(
        broker_factory, tmp_path: Path) -> None:
    """kill -9, then one flipped byte below the recovery point and one above. Old code
    CRC-checked the whole active segment and deleted everything from the first damage on."""
    b = broker_factory()
    create_topic(b.bootstrap, "crash", 1)
    conf = {"batch.size": 65536, "linger.ms": 20}
    produce(b.bootstrap, "crash", _values(20_000, "durable"), partition=0, acks="all", **conf)
    rp_file = b.data_dir / "crash-0" / "recovery-point-offset"
    # acks=all flushes; the checkpoint is rewritten at most once a second by a flush.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        produce(b.bootstrap, "crash", [b"tick"], partition=0, acks="all")
        if rp_file.exists() and int(rp_file.read_text().split()[1]) >= 20_000:
            break
        time.sleep(0.25)
    produce(b.bootstrap, "crash", _values(5_000, "unflushed"), partition=0, acks=1, **conf)  # never fsynced
    b.kill9()
    assert not (b.data_dir / ".kafka_cleanshutdown").exists()
    recovery_point = int(rp_file.read_text().split()[1])
    seg = b.data_dir / "crash-0" / SEGMENT
    headers = _batches(seg)
    below = [h for h in headers if h.last_offset < recovery_point]
    above = [h for h in headers if h.base_offset >= recovery_point]
    assert len(below) >= 10 and len(above) >= 4, (recovery_point, len(headers))
    low, high = below[len(below) // 2], above[len(above) // 2]
    _flip_body_byte(seg, low)
    _flip_body_byte(seg, high)
    damaged = seg.read_bytes()

    b.start()
    assert seg.stat().st_size == high.position  # cut at the damage above the recovery point only
    (aside,) = seg.parent.glob(SEGMENT + ".truncated-*")
    assert aside.read_bytes() == damaged[high.position:]
    cuts = [ln for ln in b.log_text().splitlines() if "recovery cut" in ln]
    assert len(cuts) == 1 and "WARNING" in cuts[0], cuts
    assert aside.name in cuts[0] and f"{len(damaged) - high.position} bytes" in cuts[0]
    assert f"offsets {high.base_offset}..{headers[-1].last_offset}" in cuts[0], cuts[0]
    # Below the recovery point nothing was checked or cut: the damage is reported when read.
    assert _fetch(b.bootstrap, "crash", low.base_offset)[0] == CORRUPT_MESSAGE
    assert _fetch(b.bootstrap, "crash", high.base_offset - 1)[0] == 0
    produce(b.bootstrap, "crash", [b"after"], partition=0)
    code, records = _fetch(b.bootstrap, "crash", high.base_offset)
    assert code == 0 and next(iter_headers(records)).base_offset == high.base_offset  # the log goes on
    b.stop()

    dump = _kcli(b.data_dir, tmp_path, "dump-log", str(aside))
    assert dump.returncode == 1  # the cut starts with the damaged batch
    assert f"baseOffset: {high.base_offset} " in dump.stdout
    assert f"baseOffset: {headers[-1].base_offset} " in dump.stdout
    assert "the batch at position 0 of" in dump.stderr and "CRC" in dump.stderr


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (3 << 20, 3 << 20))  # EFBIG past 3 MiB (Python ignores SIGXFSZ)


def test_a_full_disk_fails_appends_with_storage_error_and_one_log_line_naming_path_and_os_error(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data", preexec_fn=_limit_file_size).start()
    try:
        create_topic(b.bootstrap, "full", 1)
        codes = []
        with WireClient(b.bootstrap, timeout=20) as client:
            chunk = batch([b"y" * 1000] * 200)  # ~200 KB per produce
            for _ in range(40):
                codes.append(produce_result(client.request(0, 7, produce_body("full", 0, chunk)))[0])
                if codes[-1] != 0 and len([c for c in codes if c != 0]) >= 3:
                    break
        assert codes[0] == 0 and codes[-3:] == [KAFKA_STORAGE_ERROR] * 3, codes
        seg = tmp_path / "data" / "full-0" / SEGMENT
        lines = [ln for ln in b.log_text().splitlines() if str(seg) in ln]
        assert len(lines) == 1, lines  # once per failure streak, not per produce
        assert "ERROR" in lines[0] and "File too large" in lines[0], lines[0]
        assert b.alive()
    finally:
        b.stop()
    assert re.search(r"Traceback", b.log_text()) is None
