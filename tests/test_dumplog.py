"""kcli dump-log: Kafka DumpLogSegments output on real files we write in Kafka's formats.

Segments are built with aiokafka's DefaultRecordBatchBuilder and laid out like Kafka's
LogSegment (kcli.dumplog.synth); S3 runs against moto's HTTP server; exit codes are checked by
running ``python3 -m kcli`` in a subprocess.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import boto3
import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kcli.dumplog import (
    BytesSource,
    DumpOptions,
    LocalSource,
    batchlines,
    dump_file,
    readers,
    sources,
)
from kcli.dumplog import format as dumpformat
from kcli.dumplog.decoders import text_decoder
from kcli.dumplog.detect import Kind, detect
from kcli.dumplog.format import HEADER, RecordFormatter, batch_text
from kcli.dumplog.readers import ScanState, iter_batches
from kcli.dumplog.synth import (
    build_batch,
    control_batch,
    segment_name,
    simple_records,
    wal_object,
    write_segment,
)
from tests.fixtures_s3 import _moto_admin, moto_server, s3_bucket, s3_env  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
T0 = 1_700_000_000_000
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "kcli", *args], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=60
    )


def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str, str]:
    """The real entry point in-process (fast); subprocess runs are kept for exit-code checks."""
    from kcli.cli.app import main

    monkeypatch.setattr(sys, "argv", ["kcli", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main()
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def crc_of(batch: bytes) -> int:
    return struct.unpack_from(">I", batch, 17)[0]


def dump(path: str | Path, **opts: object):  # noqa: ANN201
    src = LocalSource(str(path))
    try:
        return dump_file(src, DumpOptions(**opts))  # type: ignore[arg-type]
    finally:
        src.close()


@pytest.fixture
def segment(tmp_path: Path):  # noqa: ANN201
    """Offsets 100..: five idempotent batches (one per codec), a COMMIT marker, a LogAppendTime batch."""
    batches = []
    offset = 100
    for i, codec in enumerate(CODECS):
        ts = [T0 + 10 * i + j for j in range(3)]
        batches.append(
            build_batch(simple_records(3), offset, ts, compression=codec, producer_id=7, producer_epoch=1,
                        base_sequence=offset - 100, partition_leader_epoch=5)
        )
        offset += 3
    batches.append(control_batch(offset, True, 7, 1, coordinator_epoch=4, timestamp=T0 + 60))
    offset += 1
    batches.append(build_batch([(None, b"x", [("h1", b"a"), ("h2", None)])], offset, [T0 + 70],
                               log_append_time=T0 + 99_999))
    seg = write_segment(str(tmp_path), 100, batches, index_interval_bytes=100)
    return seg, batches


# ----------------------------------------------------------------------------- Kafka's exact lines


def test_batch_lines_match_kafka_format(segment) -> None:  # noqa: ANN001
    seg, batches = segment
    res = dump(seg.log)
    assert not res.invalid and res.batches == 7
    lines = res.lines
    assert lines[0] == f"Dumping {seg.log}"
    assert lines[1] == "Log starting offset: 100"
    assert lines[2] == (
        "baseOffset: 100 lastOffset: 102 count: 3 baseSequence: 0 lastSequence: 2 producerId: 7 "
        "producerEpoch: 1 partitionLeaderEpoch: 5 isTransactional: false isControl: false "
        "deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: 1700000000002 "
        f"size: {len(batches[0])} magic: 2 compresscodec: none crc: {crc_of(batches[0])} isvalid: true"
    )
    codecs = [line.split("compresscodec: ")[1].split()[0] for line in lines[2:]]
    assert codecs == CODECS + ["none", "none"]
    positions = [int(line.split("position: ")[1].split()[0]) for line in lines[2:]]
    assert positions == seg.positions
    assert "isTransactional: true isControl: true" in lines[7]
    assert f"LogAppendTime: {T0 + 99_999} " in lines[8]
    assert len(lines) == 9


def test_deep_iteration_record_lines(segment) -> None:  # noqa: ANN001
    seg, _ = segment
    lines = dump(seg.log, deep_iteration=True).lines
    records = [line for line in lines if line.startswith("| ")]
    assert records[0] == "| offset: 100 CreateTime: 1700000000000 keySize: 5 valueSize: 100 sequence: 0 headerKeys: []"
    # every codec decodes (compiled aiokafka decoder), sequences continue across batches
    assert [int(r.split("offset: ")[1].split()[0]) for r in records] == list(range(100, 117))
    assert records[14] == "| offset: 114 CreateTime: 1700000000042 keySize: 5 valueSize: 100 sequence: 14 headerKeys: []"
    assert records[15] == (
        "| offset: 115 CreateTime: 1700000000060 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] "
        "endTxnMarker: COMMIT coordinatorEpoch: 4"
    )
    assert records[16] == (
        f"| offset: 116 LogAppendTime: {T0 + 99_999} keySize: -1 valueSize: 1 sequence: -1 headerKeys: [h1,h2]"
    )


def test_print_data_log_and_skip_metadata(segment) -> None:  # noqa: ANN001
    seg, _ = segment
    lines = dump(seg.log, print_data_log=True).lines
    recs = [line for line in lines if line.startswith("| ") or line.startswith(" ")]
    assert recs[0].endswith(" headerKeys: [] key: key-0 payload: " + "v" * 100)
    # control records print no data; a null key prints no key
    assert recs[15].endswith("endTxnMarker: COMMIT coordinatorEpoch: 4")
    assert recs[16].endswith("headerKeys: [h1,h2] payload: x")
    skipped = dump(seg.log, print_data_log=True, skip_record_metadata=True).lines
    body = [line for line in skipped if not line.startswith(("Dumping", "Log starting", "baseOffset"))]
    assert body[0] == "| key: key-0 payload: " + "v" * 100
    assert body[15] == ""  # control record with metadata skipped: Kafka prints an empty line
    assert body[16] == " payload: x"  # no key: Kafka's prefix quirk


@pytest.mark.parametrize("codec", CODECS)
def test_every_codec_round_trips(tmp_path: Path, codec: str) -> None:
    recs = [(f"k{i}".encode(), f"value-{i}-".encode() * 20, []) for i in range(50)]
    seg = write_segment(str(tmp_path), 0, [build_batch(recs, 0, compression=codec)])
    lines = dump(seg.log, print_data_log=True).lines
    assert f"compresscodec: {codec} " in lines[2]
    payloads = [line.split(" payload: ")[1] for line in lines[3:]]
    assert payloads == [(f"value-{i}-" * 20) for i in range(50)]


def test_decoders(tmp_path: Path) -> None:
    recs = [(b'{"a": 1,  "b": [1, 2]}', b"\x00\xffhi", []), (b"not json", b"ok", [])]
    seg = write_segment(str(tmp_path), 0, [build_batch(recs, 0)])
    res = dump(seg.log, print_data_log=True, key_decoder="json", value_decoder="hex")
    assert res.lines[3].endswith('key: {"a":1,"b":[1,2]} payload: 00ff6869')
    assert "key: <decode error: not JSON: Expecting value: line 1 column 1 (char 0)> payload: 6f6b" in res.lines[4]
    assert not res.invalid and any("could not be decoded" in r for r in res.reports)
    b64 = dump(seg.log, print_data_log=True, value_decoder="base64").lines
    assert b64[3].endswith("payload: AP9oaQ==")
    text = dump(seg.log, print_data_log=True).lines
    assert text[3].endswith("payload: \x00\ufffdhi")  # Kafka's StringDecoder: U+FFFD for bad UTF-8


def test_non_consecutive_offsets_reported(tmp_path: Path) -> None:
    batches = [build_batch(simple_records(2), 0), build_batch(simple_records(2), 5),
               build_batch(simple_records(3), 7, offset_deltas=[0, 2, 3])]
    seg = write_segment(str(tmp_path), 0, batches)
    res = dump(seg.log, deep_iteration=True)
    assert not res.invalid
    assert res.reports == [f"Non-consecutive offsets in {os.path.abspath(seg.log)}\n  7 is followed by 9\n  1 is followed by 5"]


# ----------------------------------------------------------------------------- damage


def test_bad_crc_is_reported_and_dump_continues(tmp_path: Path) -> None:
    batches = [build_batch(simple_records(3), 0), build_batch(simple_records(3), 3)]
    seg = write_segment(str(tmp_path), 0, batches)
    data = bytearray(Path(seg.log).read_bytes())
    data[len(batches[0]) - 5] ^= 0xFF  # inside the first batch's last record
    Path(seg.log).write_bytes(bytes(data))
    res = dump(seg.log)
    assert res.invalid
    assert res.lines[2].endswith("isvalid: false") and res.lines[3].endswith("isvalid: true")
    proc = run("dump-log", seg.log, "--deep-iteration")
    assert proc.returncode == 1
    assert "isvalid: false" in proc.stdout and "| offset: 5 " in proc.stdout
    assert "Traceback" not in proc.stderr


def test_truncated_tail_and_max_bytes(tmp_path: Path) -> None:
    batches = [build_batch(simple_records(3), 0), build_batch(simple_records(3), 3)]
    seg = write_segment(str(tmp_path), 0, batches)
    full = Path(seg.log).read_bytes()
    Path(seg.log).write_bytes(full[:-10])
    res = dump(seg.log)
    assert res.invalid and res.batches == 1
    assert res.lines[-1] == f"Found {len(batches[1]) - 10} invalid bytes at the end of {segment_name(0)}.log"
    # --max-bytes stops early without calling the rest invalid, as Kafka does
    Path(seg.log).write_bytes(full)
    limited = dump(seg.log, max_bytes=len(batches[0]) + 20)
    assert limited.batches == 1 and not limited.invalid and "invalid bytes" not in "\n".join(limited.lines)


def test_garbage_header_stops_with_reason(tmp_path: Path) -> None:
    good = build_batch(simple_records(1), 0)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(good + struct.pack(">qi", 1, 3) + b"\x00" * 30)
    res = dump(path)
    assert res.invalid and res.batches == 1
    assert res.lines[-1] == "Found 42 invalid bytes at the end of 00000000000000000000.log"
    assert "smaller than minimum record overhead (14)" in res.errors[0]


def test_exit_codes_unreadable_and_usage(tmp_path: Path, segment, capsys, monkeypatch) -> None:  # noqa: ANN001
    seg, _ = segment
    missing = tmp_path / "nope.log"
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    proc = run("dump-log", str(missing), str(fifo), seg.log)
    assert proc.returncode == 1
    assert f"cannot read {missing}: No such file or directory" in proc.stderr
    assert f"cannot read {fifo}: not a regular file" in proc.stderr
    assert f"Dumping {seg.log}" in proc.stdout and "Traceback" not in proc.stderr
    assert run("dump-log", seg.log).returncode == 0
    proc = run("-o", "yaml", "dump-log", seg.log)
    assert proc.returncode == 2 and proc.stderr.startswith("kcli: error:") and "yaml" in proc.stderr
    for bad in (["dump-log"], ["dump-log", seg.log, "--key-decoder", "avro"],
                ["dump-log", seg.log, "--max-bytes", "-1"], ["dump-log", seg.log, "--coordinator", "mysql://x"]):
        code, _out, err = cli(capsys, monkeypatch, *bad)
        assert code == 2, (bad, err)
        assert err.startswith("kcli: error:") and "Traceback" not in err


# ----------------------------------------------------------------------------- inputs


def test_directories_globs_and_files_option(tmp_path: Path, capsys, monkeypatch) -> None:  # noqa: ANN001
    write_segment(str(tmp_path), 0, [build_batch(simple_records(2), 0)])
    write_segment(str(tmp_path), 2, [build_batch(simple_records(2), 2)])
    (tmp_path / "leader-epoch-checkpoint").write_text("0\n1\n0 0\n")
    (tmp_path / "partition.metadata").write_text("version: 0\n")
    code, out, err = cli(capsys, monkeypatch, "dump-log", str(tmp_path))
    assert code == 0, err
    dumped = [line[len("Dumping "):] for line in out.splitlines() if line.startswith("Dumping ")]
    names = [os.path.basename(p) for p in dumped]
    assert names == sorted(f"{segment_name(b)}{s}" for b in (0, 2) for s in (".index", ".log", ".timeindex"))
    _, out, _ = cli(capsys, monkeypatch, "dump-log", str(tmp_path / "*.log"))
    assert [line for line in out.splitlines() if line.startswith("Log starting offset")] == [
        "Log starting offset: 0", "Log starting offset: 2"]
    _, out, _ = cli(capsys, monkeypatch, "dump-log", "--files", f"{tmp_path}/{segment_name(2)}.log,{tmp_path}/{segment_name(0)}.log")
    assert [line for line in out.splitlines() if line.startswith("Log starting offset")] == [
        "Log starting offset: 2", "Log starting offset: 0"]
    code, _, err = cli(capsys, monkeypatch, "dump-log", str(tmp_path / "*.nothing"))
    assert code == 1 and "no files match" in err
    (tmp_path / "empty").mkdir()
    code, _, err = cli(capsys, monkeypatch, "dump-log", str(tmp_path / "empty"))
    assert code == 1 and "no log, index or WAL files in that directory" in err


def test_unknown_explicit_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    res = dump(path)  # Kafka's tool says so and goes on: not invalid (docs/dump-log.md)
    assert not res.invalid and res.errors == [] and res.reports == [f"Ignoring unknown file {path}"]


# ----------------------------------------------------------------------------- WAL objects


def test_wal_object_positions_start_after_version_byte(tmp_path: Path) -> None:
    batches = [build_batch(simple_records(2), 0, compression="zstd"), build_batch(simple_records(3), 0)]
    path = tmp_path / "3f1c0b7e-9d2a-4b8e-8f00-0123456789ab"
    path.write_bytes(wal_object(batches))
    assert detect(LocalSource(str(path))).kind is Kind.WAL
    res = dump(path, deep_iteration=True)
    assert not res.invalid and res.reports == []  # producer offsets restart per batch: not a gap
    assert res.lines[1] == "WAL segment version: 0"
    assert "position: 1 " in res.lines[2] and f"position: {1 + len(batches[0])} " in res.lines[5]
    assert res.records == 5


def test_wal_unsupported_version(tmp_path: Path) -> None:
    path = tmp_path / "3f1c0b7e-9d2a-4b8e-8f00-0123456789ac"
    path.write_bytes(wal_object([build_batch(simple_records(1), 0)], version=3))
    proc = run("dump-log", str(path))
    assert proc.returncode == 1
    assert f"kcli: error: unsupported WAL segment version 3 in {path}" in proc.stderr
    assert "baseOffset" not in proc.stdout


def test_wal_truncated_and_empty(tmp_path: Path) -> None:
    batch = build_batch(simple_records(2), 0)
    path = tmp_path / "a0000000-0000-4000-8000-000000000001"
    path.write_bytes(wal_object([batch, batch])[:-7])
    res = dump(path)
    assert res.invalid and res.batches == 1
    assert res.lines[-1] == f"Found {len(batch) - 7} invalid bytes at the end of {path.name}"
    empty = tmp_path / "a0000000-0000-4000-8000-000000000002"
    empty.write_bytes(b"\x00")
    res = dump(empty)
    assert not res.invalid and res.lines == [f"Dumping {empty}", "WAL segment version: 0"]


def test_pure_dump_file_on_bytes() -> None:
    data = wal_object([build_batch(simple_records(4), 0)])
    res = dump_file(BytesSource(data, "s3://b/wal/x"), DumpOptions(deep_iteration=True))
    assert (res.kind, res.invalid, res.bytes_read, res.batches, res.records) == ("wal", False, len(data), 1, 4)
    streamed: list[str] = []
    res2 = dump_file(BytesSource(data, "s3://b/wal/x"), DumpOptions(deep_iteration=True), emit=streamed.append)
    assert res2.output == [] and "".join(streamed).splitlines() == res.lines


# ----------------------------------------------------------------------------- indexes


def test_index_and_timeindex_dump(segment) -> None:  # noqa: ANN001
    seg, _ = segment
    res = dump(seg.index)
    assert not res.invalid and res.reports == []
    assert res.lines[1:] == [f"offset: {o} position: {p}" for o, p in seg.index_entries]
    assert len(seg.index_entries) >= 3
    tres = dump(seg.timeindex)
    assert not tres.invalid and tres.reports == [], tres.reports
    assert tres.lines[1:] == [f"timestamp: {t} offset: {o}" for t, o in seg.time_entries]
    assert dump(seg.index, verify_index_only=True).lines == [f"Dumping {seg.index}"]
    assert dump(seg.index, index_sanity_check=True).lines[1] == f"{seg.index} passed sanity check."
    assert dump(seg.timeindex, index_sanity_check=True).lines[1] == f"{seg.timeindex} passed sanity check."


def test_index_mismatch_and_sanity_failures(segment, capsys, monkeypatch) -> None:  # noqa: ANN001
    seg, _ = segment
    raw = bytearray(Path(seg.index).read_bytes())
    off0, pos0 = seg.index_entries[0]
    struct.pack_into(">i", raw, 0, off0 - 100 + 1)  # wrong relative offset for the first entry
    Path(seg.index).write_bytes(bytes(raw) + b"\x01\x02\x03")  # and a torn entry
    res = dump(seg.index)
    assert res.invalid
    assert res.reports == [f"Mismatches in :{os.path.abspath(seg.index)}\n  Index offset: {off0 + 1}, log offset: {off0}"]
    sanity = dump(seg.index, index_sanity_check=True)
    assert sanity.invalid and sanity.errors == [
        f"Index file {os.path.abspath(seg.index)} is corrupt, found {len(raw) + 3} bytes which is neither "
        "positive nor a multiple of 8"
    ]
    traw = bytearray(Path(seg.timeindex).read_bytes())
    struct.pack_into(">q", traw, 0, seg.time_entries[0][0] + 5)
    Path(seg.timeindex).write_bytes(bytes(traw))
    tres = dump(seg.timeindex)
    assert tres.invalid
    assert tres.reports[0] == (
        f"Found timestamp mismatch in :{os.path.abspath(seg.timeindex)}\n"
        f"  Index timestamp: {seg.time_entries[0][0] + 5}, log timestamp: {seg.time_entries[0][0]}"
    )
    code, out, err = cli(capsys, monkeypatch, "dump-log", seg.index, "--verify-index-only")
    assert code == 1 and "Mismatches in :" in err and out == f"Dumping {seg.index}\n"


def test_empty_index_and_missing_log(tmp_path: Path) -> None:
    empty = tmp_path / "00000000000000000000.index"
    empty.write_bytes(b"")
    assert dump(empty).lines == [f"Dumping {empty}", f"{empty} is empty."]
    lone = tmp_path / "00000000000000000050.index"
    lone.write_bytes(struct.pack(">ii", 3, 0))
    res = dump(lone)
    assert not res.invalid and res.lines[1] == "offset: 53 position: 0"
    assert "entries not checked" in res.reports[0]
    assert dump(lone, verify_index_only=True).invalid


def test_tiered_segment_names(tmp_path: Path) -> None:
    stem = "00000000000000000200-Zm9vYmFyLXV1aWQtMDAwMQ"
    seg = write_segment(str(tmp_path), 200, [build_batch(simple_records(40), 200 + 40 * i) for i in range(4)],
                        index_interval_bytes=1000, stem=stem)
    assert dump(seg.log).lines[1] == "Log starting offset: 200"
    res = dump(seg.index)
    assert not res.invalid and res.reports == [] and len(res.lines) > 1


def test_txn_index(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.txnindex"
    path.write_bytes(struct.pack(">hqqqq", 0, 9, 10, 20, 21) + b"\x00\x01")
    res = dump(path)
    assert res.lines[1] == "version: 0 producerId: 9 firstOffset: 10 lastOffset: 20 lastStableOffset: 21"
    assert res.lines[2] == f"Found 2 invalid bytes at the end of {path.name}" and res.invalid


# ----------------------------------------------------------------------------- JSON


def test_json_output_shape(segment, capsys, monkeypatch) -> None:  # noqa: ANN001
    seg, batches = segment
    code, out, err = cli(capsys, monkeypatch, "-o", "json", "dump-log", seg.log, "--print-data-log", "--value-decoder", "json")
    assert code == 0, err
    objs = [json.loads(line) for line in out.splitlines()]
    assert objs[0] == {"type": "file", "file": seg.log, "kind": "log", "logStartOffset": 100}
    b = objs[1]
    assert b["type"] == "batch" and b["baseOffset"] == 100 and b["crc"] == crc_of(batches[0])
    assert b["isvalid"] is True and b["deleteHorizonMs"] is None and b["compresscodec"] == "none"
    r = objs[2]
    assert r["type"] == "record" and r["offset"] == 100 and r["key"] == "key-0" and r["batchPosition"] == 0
    assert "payloadError" in r and "payload" not in r  # "vvvv..." is not JSON
    ctrl = [o for o in objs if o.get("controlType")]
    assert ctrl[0]["controlType"] == "COMMIT" and ctrl[0]["coordinatorEpoch"] == 4
    assert {o["type"] for o in objs} == {"file", "batch", "record"}
    idx = [json.loads(line) for line in cli(capsys, monkeypatch, "-o", "json", "dump-log", seg.index)[1].splitlines()]
    assert idx[1] == {"type": "indexEntry", "file": seg.index, "offset": seg.index_entries[0][0],
                      "position": seg.index_entries[0][1]}


# ----------------------------------------------------------------------------- S3


def test_s3_objects_prefixes_and_errors(s3_bucket: str, tmp_path: Path, capsys, monkeypatch) -> None:  # noqa: ANN001, F811
    seg = write_segment(str(tmp_path), 0, [build_batch(simple_records(30), 30 * i) for i in range(5)],
                        index_interval_bytes=500)
    wal = wal_object([build_batch(simple_records(2), 0, compression="lz4")])
    s3 = boto3.client("s3")
    for path in (seg.log, seg.index, seg.timeindex):
        s3.put_object(Bucket=s3_bucket, Key=f"tiered/orders-0/{os.path.basename(path)}", Body=Path(path).read_bytes())
    s3.put_object(Bucket=s3_bucket, Key="wal/6a1e3c2d-0000-4000-8000-00000000abcd", Body=wal)
    s3.put_object(Bucket=s3_bucket, Key="wal/readme.txt", Body=b"ignored by listing")

    proc = run("dump-log", f"s3://{s3_bucket}/wal/6a1e3c2d-0000-4000-8000-00000000abcd", "--deep-iteration")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == [f"Dumping s3://{s3_bucket}/wal/6a1e3c2d-0000-4000-8000-00000000abcd", "WAL segment version: 0"]
    assert "compresscodec: lz4" in lines[2] and lines[3].startswith("| offset: 0 ")

    code, out, err = cli(capsys, monkeypatch, "dump-log", f"s3://{s3_bucket}/tiered/orders-0/")
    assert code == 0, err
    local = cli(capsys, monkeypatch, "dump-log", seg.index, seg.log, seg.timeindex)[1]  # S3 lists in key order
    assert out.replace(f"s3://{s3_bucket}/tiered/orders-0", str(tmp_path)) == local

    code, out, err = cli(capsys, monkeypatch, "dump-log", f"s3://{s3_bucket}/tiered/*/*.log", f"s3://{s3_bucket}/wal/missing")
    assert code == 1
    assert out.count("Dumping ") == 1 and "Log starting offset: 0" in out
    assert f"cannot read s3://{s3_bucket}/wal/missing" in err and "Traceback" not in err


# ----------------------------------------------------------------------------- WAL + batch coordinator


def test_wal_annotated_from_sqlite_coordinator(tmp_path: Path, capsys, monkeypatch) -> None:  # noqa: ANN001
    import uuid

    from plugins.coordinator.base import (
        CommitBatchRequest,
        CreateTopicAndPartitionsRequest,
        DeleteRecordsRequest,
        TopicIdPartition,
    )
    from plugins.coordinator.sqlite import SqliteBatchCoordinator

    orders = TopicIdPartition(uuid.uuid4(), "orders", 0)
    clicks = TopicIdPartition(uuid.uuid4(), "clicks", 1)
    from kcli.diskless.wal import WalBuilder, commit_batch_requests

    batches = [build_batch(simple_records(2), 0), build_batch(simple_records(3), 0), build_batch(simple_records(4), 0)]
    builder = WalBuilder()  # the broker's own WAL writer, so dump-log and the writer agree
    for tip, b in zip([orders, orders, clicks], batches):
        builder.add(tip, b)
    data, refs = builder.build()
    assert data == wal_object(batches)
    key = "wal/9b2f4c1e-0000-4000-8000-000000000001"
    local = tmp_path / "wal" / key.split("/")[1]
    local.parent.mkdir()
    local.write_bytes(data)

    db = tmp_path / "coordinator.db"
    coord = SqliteBatchCoordinator(db)
    coord.create_topic_and_partitions([CreateTopicAndPartitionsRequest(orders.topic_id, "orders", 1),
                                       CreateTopicAndPartitionsRequest(clicks.topic_id, "clicks", 2)])
    # an earlier object puts clicks-1 at offset 10, so its batch here is assigned 10
    coord.commit_file("wal/earlier", 1, 1000, [CommitBatchRequest(0, clicks, 1, 500, 0, 9, T0, 0)])
    responses = coord.commit_file(key, 1, len(data), commit_batch_requests(refs))
    assert [r.errors for r in responses] == [0, 0, 0]
    coord.delete_records([DeleteRecordsRequest(orders, 2)])  # the first orders batch (offsets 0-1) is deleted
    coord.close()

    code, out, err = cli(capsys, monkeypatch, "dump-log", str(local), "--coordinator", f"sqlite://{db}")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[2].endswith("isvalid: true dead: true")
    assert lines[3].endswith("isvalid: true topic: orders partition: 0 assignedBaseOffset: 2")
    assert lines[4].endswith("isvalid: true topic: clicks partition: 1 assignedBaseOffset: 10")

    code, out, _ = cli(capsys, monkeypatch, "-o", "json", "dump-log", str(local), "--coordinator", str(db))
    objs = [json.loads(line) for line in out.splitlines()]
    assert objs[1]["dead"] is True and "topic" not in objs[1]
    assert (objs[2]["topic"], objs[2]["partition"], objs[2]["assignedBaseOffset"], objs[2]["assignedLastOffset"],
            objs[2]["topicId"], objs[2]["dead"]) == ("orders", 0, 2, 4, str(orders.topic_id), False)

    # the coordinator lists a batch the file does not have: a real inconsistency, exit 1
    truncated = tmp_path / "cut" / "wal" / key.split("/")[1]
    truncated.parent.mkdir(parents=True)
    truncated.write_bytes(data[: 1 + len(batches[0]) + len(batches[1])])
    code, out, err = cli(capsys, monkeypatch, "dump-log", str(truncated), "--coordinator", f"sqlite://{db}")
    assert code == 1
    assert f"lists a {len(batches[2])}-byte batch of clicks-1 at byte offset {1 + len(batches[0]) + len(batches[1])}" in err

    # an object the coordinator never heard of (an orphan upload): every batch is dead
    orphan = tmp_path / "0f0f0f0f-0000-4000-8000-000000000009"
    orphan.write_bytes(data)
    code, out, err = cli(capsys, monkeypatch, "dump-log", str(orphan), "--coordinator", f"sqlite://{db}")
    assert code == 0 and out.count(" dead: true") == 3 and "No batch metadata for" in err

    code, _, err = cli(capsys, monkeypatch, "dump-log", str(local), "--coordinator", f"sqlite://{tmp_path}/none.db")
    assert code == 2 and "not found" in err


def test_annotation_from_any_lookup_callable() -> None:
    """The metadata source is just object_key -> list[BatchInfo]: a broker RPC can stand in later."""
    from types import SimpleNamespace as NS

    batch = build_batch(simple_records(2), 0)
    data = wal_object([batch])
    info = NS(batch_id=1, object_key="wal/x", metadata=NS(
        topic_id_partition=NS(topic_id=None, topic="t", partition=3), byte_offset=1, byte_size=len(batch),
        base_offset=40, last_offset=41))
    asked: list[str] = []

    def lookup(key: str) -> list:
        asked.append(key)
        return [info] if key == "wal/x" else []

    res = dump_file(BytesSource(data, "s3://bucket/prefix/wal/x"), DumpOptions(batch_lookup=lookup))
    assert res.lines[2].endswith(" topic: t partition: 3 assignedBaseOffset: 40")
    assert asked == ["prefix/wal/x", "wal/x"]  # most specific key first


# ----------------------------------------------------------------------------- worker processes


@pytest.mark.parametrize("as_json", [False, True])
def test_parallel_deep_iteration_matches_serial(tmp_path: Path, as_json: bool) -> None:
    batches = [build_batch(simple_records(20), 20 * i, compression=CODECS[i % 5], producer_id=3, producer_epoch=0,
                           base_sequence=20 * i) for i in range(60)]
    batches.insert(30, build_batch(simple_records(5), 5000))  # a gap, reported across a range cut
    seg = write_segment(str(tmp_path), 0, batches)
    with open(seg.log, "ab") as f:
        f.write(batches[0][:40])  # torn tail
    opts = dict(deep_iteration=True, json=as_json, parallel_min_bytes=0, range_bytes=4000)
    serial = dump(seg.log, **opts)
    parallel = dump(seg.log, jobs=2, **opts)
    assert parallel.output and "".join(parallel.output) == "".join(serial.output)
    assert (parallel.batches, parallel.records, parallel.invalid) == (serial.batches, serial.records, True)
    assert parallel.reports == serial.reports and "5004 is followed by 600\n  599 is followed by 5000" in serial.reports[0]
    assert parallel.errors == serial.errors


# ----------------------------------------------------------------------------- fast paths vs reference
#
# Batch-level text (kcli/dumplog/batchlines.py) and metadata-only record lines (format.py, by
# column) have loops of their own for speed; both must print exactly what the straightforward
# per-batch / per-record code prints, on anything a producer or a damaged disk can leave behind.

_record = st.tuples(
    st.one_of(st.none(), st.binary(max_size=12), st.just(b"k" * 17_000)),
    st.one_of(st.none(), st.binary(max_size=120)),
    st.lists(st.tuples(st.sampled_from(["a", "trace", "h2", "", "clé-ключ"]), st.one_of(st.none(), st.binary(max_size=3))),
             max_size=2),
)
# Batches whose records share a key size and/or a value size (keyless, fixed-size payloads): the
# column path folds such a size into the text before it, so these need cases of their own.
_uniform_records = st.builds(
    lambda n, keys, values, headers, vary: [
        (None if keys is None else keys + (b"x" * i if vary == "key" else b""),
         None if values is None else values + (b"y" * i if vary == "value" else b""), headers)
        for i in range(n)
    ],
    st.integers(min_value=1, max_value=25),
    st.one_of(st.none(), st.binary(max_size=6)),
    st.one_of(st.none(), st.binary(max_size=300)),
    st.sampled_from([[], [("a", b"1")]]),
    st.sampled_from(["", "key", "value"]),
)
_batch = st.fixed_dictionaries({
    "records": st.one_of(st.lists(_record, min_size=1, max_size=25), _uniform_records),
    "base": st.sampled_from([0, 7, 9_990, 99_999_995, 2**40 + 9_998, 2**63 - 100]),
    "ts0": st.sampled_from([-1, 0, 9_999, 1_700_000_000_000, 1_700_000_009_995]),
    "ts_step": st.sampled_from([0, 1, 7, 10_000]),
    "codec": st.sampled_from(CODECS),
    # (producerId, producerEpoch, baseSequence): plain, idempotent, about to wrap at Integer.MAX_VALUE,
    # a sequence run crossing a multiple of 10,000 inside the batch
    "producer": st.sampled_from([(-1, -1, -1), (7, 1, 0), (7, 1, 2**31 - 5), (9, 0, 12_345), (9, 0, 9_990)]),
    "gaps": st.booleans(),
    "log_append_time": st.booleans(),
    "control": st.sampled_from([False] * 5 + [True]),
    "transactional": st.booleans(),
    "leader_epoch": st.sampled_from([0, 5, -1]),
})


def _make_batch(b: dict) -> bytes:
    pid, epoch, seq = b["producer"]
    if b["control"]:
        return control_batch(b["base"], True, max(pid, 0), max(epoch, 0), coordinator_epoch=3)
    n = len(b["records"])
    deltas = [2 * i for i in range(n)] if b["gaps"] else None
    return build_batch(b["records"], b["base"], [b["ts0"] + b["ts_step"] * i for i in range(n)],
                       compression=b["codec"], producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                       transactional=b["transactional"], partition_leader_epoch=b["leader_epoch"],
                       log_append_time=T0 + 5 if b["log_append_time"] else None, offset_deltas=deltas)


@contextlib.contextmanager
def _patched(module: object, **values: object):  # noqa: ANN202
    old = {k: getattr(module, k) for k in values}
    for k, v in values.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(module, k, v)


_RECORD_PATHS = pytest.mark.parametrize("compiled", [dumpformat.compiled_record_lines, None], ids=["compiled", "columns"])


@_RECORD_PATHS
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_batch, min_size=1, max_size=4), st.booleans())
def test_record_lines_by_column_match_per_record_reference(compiled: object, batches: list[dict], wal: bool) -> None:
    """Both fast paths (compiled walker, and the column path it falls back to) against the reference."""
    with _patched(dumpformat, compiled_record_lines=compiled):
        _compare_record_lines(batches, wal)


def _compare_record_lines(batches: list[dict], wal: bool) -> None:
    fast = RecordFormatter(False, False, text_decoder("string"), text_decoder("string"), track_offsets=not wal)
    ref = RecordFormatter(False, False, text_decoder("string"), text_decoder("string"), track_offsets=not wal)
    for b in batches:
        raw = _make_batch(b)
        h = HEADER.unpack_from(raw)
        got: list[str] = []
        want: list[str] = []
        assert fast.text(raw, h, got) == ref.text_reference(raw, h, want)
        assert "".join(got) == "".join(want)
    assert (fast.first_offset, fast.last_offset, fast.non_consecutive) == (
        ref.first_offset, ref.last_offset, ref.non_consecutive)


def test_record_lines_across_digit_table_blocks() -> None:
    """Offsets, sequences and timestamps whose last four digits roll over inside one batch."""
    recs = simple_records(30)
    for base, seq, ts0 in [(9_985, 9_990, 1_700_000_009_990), (0, 0, 5), (19_999, 2**31 - 31, 9_999_999)]:
        raw = build_batch(recs, base, [ts0 + i for i in range(30)], producer_id=1, producer_epoch=0,
                          base_sequence=seq)
        h = HEADER.unpack_from(raw)
        got: list[str] = []
        want: list[str] = []
        RecordFormatter(False, False, str, str, True).text(raw, h, got)
        RecordFormatter(False, False, str, str, True).text_reference(raw, h, want)
        assert got == ["".join(want)]
    lines = "".join(want).splitlines()
    assert lines[0].startswith("| offset: 19999 CreateTime: 9999999 ") and lines[-1].startswith("| offset: 20028 ")
    assert lines[-1].endswith(f"sequence: {2**31 - 2} headerKeys: []")


def _reference_batch_lines(path: str) -> tuple[str, ScanState]:
    src = LocalSource(path)
    try:
        state = ScanState(end=src.size)
        out = [batch_text(h, pos, valid) for h, pos, valid in _walk(src, state)]
        return "".join(out), state
    finally:
        src.close()


def _walk(src: LocalSource, state: ScanState):  # noqa: ANN202
    pos = 0
    for h, _win, _rel, valid in iter_batches(src, 0, src.size, state):
        yield h, pos, valid
        pos += h[1] + 12


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_batch, min_size=1, max_size=6), st.sampled_from(["", "crc", "tail", "magic", "short", "tiny"]),
       st.sampled_from([4096, 1 << 20]), st.sampled_from([1, 300, 1 << 21]), st.sampled_from([2, 1 << 16]),
       st.sampled_from([batchlines.compiled_batch_lines, None]))
def test_batch_lines_match_reference(batches: list[dict], damage: str, window: int, chunk: int, cache: int,
                                     compiled: object) -> None:
    """Both fast loops (compiled, and the pure-Python one it falls back to) against the reference."""
    data = bytearray(b"".join(_make_batch(b) for b in batches))
    first = len(_make_batch(batches[0]))
    if damage == "crc":
        data[first - 1] ^= 0xFF  # the last byte of the first batch
    elif damage == "tail":
        data += _make_batch(batches[-1])[:-3]
    elif damage == "magic":
        data += _make_batch(batches[0])
        data[first + 16] = 1
    elif damage == "short":
        data += struct.pack(">qiib", 5, 30, 0, 2) + b"\x00" * 40  # a 42-byte "batch": smaller than a header
    elif damage == "tiny":
        data += struct.pack(">qi", 1, 3) + b"\x00" * 30
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "00000000000000000000.log")
        Path(path).write_bytes(bytes(data))
        want, state = _reference_batch_lines(path)
        with _patched(readers, WINDOW=window), _patched(sources, READ_WINDOW=window), \
                _patched(batchlines, CHUNK_BYTES=chunk, CACHE_LIMIT=cache, compiled_batch_lines=compiled):
            emitted: list[str] = []
            res = dump(path)
            src = LocalSource(path)
            try:
                dump_file(src, DumpOptions(), emit=emitted.append)
            finally:
                src.close()
    body = "".join(line + "\n" for line in res.lines if line.startswith("baseOffset: "))
    assert body == want
    assert "".join(emitted) == "".join(res.output)
    assert res.batches == want.count("\n")
    assert (state.reason in res.errors) if state.reason else not any("smaller" in e or "magic" in e for e in res.errors)
    if damage == "crc":
        assert any(f"the batch at position 0 of {path} fails its CRC-32C check" in e for e in res.errors)
    if damage:
        assert res.invalid


def test_batch_lines_bad_crc_position_and_many_producers(tmp_path: Path) -> None:
    """The first failing batch is named on stderr; producers interleave (cached per producer)."""
    batches = [build_batch(simple_records(2), 2 * i, producer_id=i % 3, producer_epoch=i % 2, base_sequence=i)
               for i in range(12)]
    data = bytearray(b"".join(batches))
    bad_at = sum(len(b) for b in batches[:5])
    data[bad_at + 70] ^= 0x01
    seg = tmp_path / "00000000000000000000.log"
    seg.write_bytes(bytes(data))
    res = dump(seg)
    assert res.invalid and res.batches == 12
    assert [line.endswith("isvalid: false") for line in res.lines[2:]] == [i == 5 for i in range(12)]
    assert f"the batch at position {bad_at} of {seg} fails its CRC-32C check" in res.errors
    assert "producerId: 2 producerEpoch: 0 " in res.lines[2 + 8]  # i = 8: 8 % 3, 8 % 2
    want, _ = _reference_batch_lines(str(seg))
    assert "".join(line + "\n" for line in res.lines[2:]) == want


def test_batch_lines_follow_each_field_of_the_producer_group(tmp_path: Path) -> None:
    """Consecutive batches that differ in only one of producerId, producerEpoch, attributes or
    partitionLeaderEpoch: the batch-level loop reuses the last batch's text only when all match."""
    idem = dict(producer_id=4, producer_epoch=0, base_sequence=0)
    variants = [idem, {**idem, "partition_leader_epoch": 3}, {**idem, "producer_epoch": 1},
                {**idem, "producer_id": 5}, {**idem, "transactional": True}, {**idem, "compression": "gzip"}]
    batches = [build_batch(simple_records(2), 2 * i, **variants[i % len(variants)]) for i in range(14)]
    seg = tmp_path / "00000000000000000000.log"
    seg.write_bytes(b"".join(batches))
    res = dump(seg)
    want, _ = _reference_batch_lines(str(seg))
    assert "".join(line + "\n" for line in res.lines[2:]) == want
    assert "partitionLeaderEpoch: 3 " in res.lines[3] and "partitionLeaderEpoch: 0 " in res.lines[4]


def test_compiled_batch_scanner_is_built() -> None:
    """``pip install`` compiles kcli/dumplog/_fastlines.pyx; without it dump-log still works but
    batch-level dumps run at under half their speed, so a silent build failure must show here."""
    assert batchlines.compiled_batch_lines is not None, "kcli.dumplog._fastlines was not built by pip install"


_EXTREMES = [  # (baseOffset, partitionLeaderEpoch, attributes, lastOffsetDelta, baseTimestamp, maxTimestamp,
               #  producerId, producerEpoch, baseSequence, recordsCount): what a damaged disk can hold
    (2**63 - 1, 2**31 - 1, 0x7F, 2**31 - 1, 2**63 - 1, 2**63 - 1, 2**63 - 1, 2**15 - 1, 2**31 - 1, 2**31 - 1),
    (-(2**63), -(2**31), -1, -(2**31), -(2**63), -(2**63), -(2**63), -(2**15), -(2**31), -(2**31)),
    (2**63 - 2**31, 5, 0x47, 2**31 - 1, -1, -5, 0, 0, 2**31 - 10, 0),
    (0x7FFFFFFF00000000, -1, 0x06, 7, 0, 0, -1, -1, -2, 3),
    (12, 0, 0x5D, -3, 10, 20, 99, 3, 2**31 - 1, 1),
    (-0x7FFFFFFF00000000, 1, 0x18, 0, -(2**63), -(2**63), -(2**63), -(2**15), -(2**31), -(2**31)),
]
_COMPILED_TAKES = 3  # the last rows: the compiled loop prints them itself (the others need Python's ints)


@pytest.mark.parametrize("compiled", [batchlines.compiled_batch_lines, None], ids=["compiled", "python"])
def test_batch_lines_extreme_header_values(tmp_path: Path, compiled: object) -> None:
    """Every header field at or near its limits: the compiled loop must print what Python's
    unbounded ints print (or hand the batch back), never wrap around."""
    template = bytearray(build_batch(simple_records(1)))
    batches = []
    for base, ple, attrs, lod, base_ts, max_ts, pid, epoch, bseq, count in _EXTREMES:
        b = bytearray(template)
        struct.pack_into(">qiib", b, 0, base, len(b) - 12, ple, 2)
        struct.pack_into(">hiqqqhii", b, 21, attrs, lod, base_ts, max_ts, pid, epoch, bseq, count)
        if len(batches) % 2 == 0:  # every other batch keeps a valid CRC
            struct.pack_into(">I", b, 17, crc32c(bytes(b[21:])))
        batches.append(bytes(b))
    seg = tmp_path / "00000000000000000000.log"
    seg.write_bytes(b"".join(batches))
    want, _ = _reference_batch_lines(str(seg))
    with _patched(batchlines, compiled_batch_lines=compiled):
        res = dump(seg)
    assert "".join(line + "\n" for line in res.lines[2:]) == want
    assert want.count("isvalid: true") == 3 and "compresscodec: unknown(7)" in want
    if compiled is not None:  # the rows meant for the compiled loop are not all handed back
        tail = b"".join(batches[-_COMPILED_TAKES:])
        rel, n, _bad, text = compiled(memoryview(tail), 0, len(tail) - 61, len(tail), 0, crc32c)
        assert (rel, n, text.count("\n")) == (len(tail), _COMPILED_TAKES, _COMPILED_TAKES)
        assert "producerId: -9223372036854775808 " in text
    assert f"lastOffset: {2**63 - 1 + 2**31 - 1} " in want  # past 64 bits, as Python (and no C) prints it


def _lines_or_error(method, raw: bytes, h: tuple) -> tuple:  # noqa: ANN001
    out: list[str] = []
    try:
        return "ok", method(raw, h, out), "".join(out)
    except Exception as err:  # noqa: BLE001 - whatever aiokafka raises, both paths must raise it
        return "error", type(err).__name__, str(err)


@_RECORD_PATHS
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_batch, st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=3))
@example(b={"records": [(None, None, [])], "base": 0, "ts0": -1, "ts_step": 0, "codec": "zstd",  # found by Hypothesis
            "producer": (-1, -1, -1), "gaps": False, "log_append_time": False, "control": False,
            "transactional": False, "leader_epoch": 0}, flips=[(15, 130)])
def test_record_lines_on_damaged_records_match_reference(compiled: object, b: dict,
                                                          flips: list[tuple[int, int]]) -> None:
    """Bytes changed anywhere after the header (lengths, varints, counts, UTF-8 of header keys,
    compressed data): the fast paths print what the reference prints or raise what it raises."""
    raw = bytearray(_make_batch(b))
    for at, value in flips:
        raw[61 + at % (len(raw) - 61)] = value
    h = HEADER.unpack_from(raw)
    fast = RecordFormatter(False, False, str, str, track_offsets=True)
    ref = RecordFormatter(False, False, str, str, track_offsets=True)
    with _patched(dumpformat, compiled_record_lines=compiled):
        got, want = _lines_or_error(fast.text, bytes(raw), h), _lines_or_error(ref.text_reference, bytes(raw), h)
    if h[5] & 7 and want[0] == "error" and "Can't read" in want[2]:
        # aiokafka's compiled reader reads a varint past the end of a short decompressed buffer
        # and reports whatever bytes lie there ("Can't read <garbage> bytes from pos 11", a
        # different number from one call to the next): only the kind of error can be compared.
        assert got[:2] == want[:2]
    else:
        assert got == want
    assert (fast.first_offset, fast.last_offset, fast.non_consecutive) == (
        ref.first_offset, ref.last_offset, ref.non_consecutive)


def test_compiled_record_walker_takes_plain_batches() -> None:
    """The walker reads plain batches itself (so the comparisons above test it) and hands back a
    header key that is not UTF-8, which aiokafka reports."""
    walker = dumpformat.compiled_record_lines
    assert walker is not None, "kcli.dumplog._fastlines was not built by pip install"
    recs = [(b"k", b"v" * i, [("trace", b"1"), ("clé", None)]) for i in range(5)]
    for codec in CODECS:
        raw = build_batch(recs, 41, compression=codec, producer_id=3, producer_epoch=0, base_sequence=2**31 - 2)
        h = HEADER.unpack_from(raw)
        got = RecordFormatter._compiled_lines(raw, h)
        assert got is not None, codec
        want: list[str] = []
        RecordFormatter(False, False, str, str, True).text_reference(raw, h, want)
        assert got == ("".join(want), 41, 45, None)
    assert "sequence: 0 headerKeys: [trace,clé]" in got[0]  # wrapped at Integer.MAX_VALUE
    bad = bytearray(build_batch([(b"k", b"v", [("ab", b"1")])]))
    at = bytes(bad).index(b"ab")
    bad[at] = 0xFF  # not UTF-8
    h = HEADER.unpack_from(bad)
    assert RecordFormatter._compiled_lines(bytes(bad), h) is None
    assert _lines_or_error(RecordFormatter(False, False, str, str, True).text, bytes(bad), h)[:2] == (
        "error", "UnicodeDecodeError")


def test_read_window_reads_each_byte_once_and_keeps_the_overlap(tmp_path: Path) -> None:
    """The batch-level scan's reader: windows that overlap the last one keep the overlap, a
    longer request grows the buffer, and views are exact whatever the order of calls."""
    data = bytes(range(256)) * 64  # 16 KiB
    path = tmp_path / "f"
    path.write_bytes(data)
    src = LocalSource(str(path))
    try:
        reader = sources.ReadWindow(src, 1000)
        assert bytes(reader.view(0, 1000)) == data[:1000]
        assert bytes(reader.view(900, 1000)) == data[900:1900]  # 100 bytes kept, 900 read
        grown = reader.view(1500, 3000)  # 400 kept, into a grown buffer
        assert bytes(grown) == data[1500:4500]
        # A shorter request inside the window keeps only what it asked for; the buffer (still
        # exported through ``grown``) must not change size.
        assert bytes(reader.view(4400, 20)) == data[4400:4420]
        assert bytes(reader.view(4410, 1000)) == data[4410:5410]
        del grown
        assert bytes(reader.view(16_000, 1000)) == data[16_000:]  # the end of the file
        assert bytes(reader.view(50, 10)) == data[50:60]  # backwards: read afresh
        assert bytes(reader.view(len(data), 10)) == b""
    finally:
        src.close()


def test_a_file_that_shrinks_during_a_batch_level_dump_is_an_error(tmp_path: Path) -> None:
    seg = tmp_path / "00000000000000000000.log"
    seg.write_bytes(b"".join(build_batch(simple_records(50), 50 * i) for i in range(40)))
    src = LocalSource(str(seg))
    try:
        os.truncate(seg, 3000)  # after the size was taken
        res = dump_file(src, DumpOptions())
    finally:
        src.close()
    assert res.invalid and any("shrank while being read" in e for e in res.errors), res.errors
