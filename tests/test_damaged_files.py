"""Damaged files through `kcli dump-log` and `kcli diskless verify`: never a traceback, a
non-zero exit, and the position of the damage named.

Pristine files come from kcli's own writers (a classic partition log written by
kcli.storage.log.PartitionLog; WAL objects laid out as the broker does and committed through the
SQLite batch coordinator by kcli.engine.synth). Hypothesis then damages copies — bit flips,
truncation, garbage appended, zeroed ranges — with a bounded number of examples, and an
independent oracle says where the first damaged batch starts:

- a changed byte inside a batch's CRC-protected part, its length, magic or CRC field damages
  that batch; the base offset and partition leader epoch are outside Kafka's CRC by design
  (the broker rewrites them), so changes there alone are not damage the tools can see — the
  tools must then exit 0 (no false alarm);
- a cut inside a batch damages that batch; a cut at a batch boundary leaves a valid, shorter file;
- garbage appended damages the position where the file used to end (for verify: the object's
  size no longer matches the committed size).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcli.dumplog.synth import build_batch
from kcli.records.batch import iter_headers
from tests.fixtures_engine import kcli_inproc

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = int(os.environ.get("KCLI_DAMAGE_EXAMPLES", "30"))  # bounded; raise it for a long hunt
UNPROTECTED = (range(0, 8), range(12, 16))  # base offset, partition leader epoch (outside the CRC)


@dataclass(frozen=True)
class Pristine:
    segment: Path  # a classic .log segment
    segment_batches: list[tuple[int, int]]  # (position, size)
    wal_root: Path  # <root>/diskless/coordinator.db and <root>/objects/wal/<uuid>
    wal_key: str
    wal_batches: list[tuple[int, int]]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    from kcli.engine.synth import make_dataset
    from kcli.storage.log import PartitionLog
    from kcli.storage.log_config import LogConfig

    root = tmp_path_factory.mktemp("pristine")
    log_dir = root / "orders-0"
    plog = PartitionLog.open(log_dir, LogConfig.from_dict({}))
    now = int(time.time() * 1000)
    for i in range(8):
        records = [(b"k%d" % j, b"value-%d-%d-" % (i, j) + b"v" * (20 * j), []) for j in range(1 + i % 4)]
        plog.append(build_batch(records, 0, [now + j for j in range(len(records))]), now_ms=now)
    plog.flush()
    plog.close()
    segment = log_dir / "00000000000000000000.log"
    data = segment.read_bytes()
    seg_batches = [(h.position, h.size) for h in iter_headers(data)]
    assert sum(s for _, s in seg_batches) == len(data) and len(seg_batches) == 8

    ds = make_dataset(root / "wal", objects=2, object_bytes=4 << 10, batch_records=4, value_size=40, topics=1,
                      partitions=2)
    key = ds.keys[0]
    blob = ds.path(key).read_bytes()
    wal_batches = [(h.position, h.size) for h in iter_headers(blob, 1)]
    assert blob[:1] == b"\x00" and 1 + sum(s for _, s in wal_batches) == len(blob) and len(wal_batches) >= 3
    return Pristine(segment, seg_batches, root / "wal", key, wal_batches)


# ---- damage and the oracle ----------------------------------------------------------------------

flip = st.tuples(st.just("flip"), st.integers(0, 2**31), st.integers(0, 7))
truncate = st.tuples(st.just("truncate"), st.integers(0, 2**31))
append = st.tuples(st.just("append"), st.binary(min_size=1, max_size=200))
zero = st.tuples(st.just("zero"), st.integers(0, 2**31), st.integers(1, 120))
damage = st.one_of(flip, truncate, append, zero)


def apply(data: bytes, d: tuple) -> bytes:
    kind = d[0]
    out = bytearray(data)
    if kind == "flip":
        out[d[1] % len(out)] ^= 1 << d[2]
    elif kind == "truncate":
        del out[d[1] % len(out):]
    elif kind == "append":
        out += d[1]
    else:
        start = d[1] % len(out)
        out[start:start + d[2]] = bytes(len(out[start:start + d[2]]))
    return bytes(out)


@dataclass(frozen=True)
class Expect:
    damaged: bool
    position: int | None = None  # where the first damaged batch starts (None: the file as a whole)
    size_changed: bool = False


def oracle(old: bytes, new: bytes, batches: list[tuple[int, int]], header: int) -> Expect:
    """What a correct tool reports for ``new`` (``header``: bytes before the first batch)."""
    if len(new) < len(old):  # truncated
        cut = len(new)
        if cut < header:
            return Expect(True, None, True)
        for pos, size in batches:
            if pos < cut < pos + size:
                return Expect(True, pos, True)
        return Expect(False, None, True)  # at a batch boundary: a valid, shorter file
    if len(new) > len(old):  # garbage appended
        return Expect(True, len(old), True)
    changed = [i for i in range(len(old)) if old[i] != new[i]]
    for i in changed:
        if i < header:
            return Expect(True, None)  # the WAL version byte
        for pos, size in batches:
            if pos <= i < pos + size:
                if not any(i - pos in r for r in UNPROTECTED):
                    return Expect(True, pos)
                break
    return Expect(False)


def reported_positions(text: str) -> set[int]:
    return {int(m) for m in re.findall(r"position (\d+)", text)}


def assert_clean_failure(run, what: str) -> None:  # noqa: ANN001
    """No traceback, no unexpected exception, every stderr line one `kcli: error:` line (or
    Kafka's "Ignoring unknown file" for a file that no longer looks like a Kafka file at all)."""
    assert "Traceback" not in run.err and "unexpected" not in run.err, (what, run.err)
    lines = [ln for ln in run.err.splitlines() if ln.strip()]
    assert all(ln.startswith(("kcli: error: ", "Ignoring unknown file ")) for ln in lines), (what, run.err)


def damaged_copy(src: Path, data: bytes) -> Path:
    d = Path(tempfile.mkdtemp(prefix="kcli-damaged-"))
    path = d / src.name
    path.write_bytes(data)
    return path


# ---- dump-log over a classic segment --------------------------------------------------------------


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(d=damage)
def test_dump_log_on_a_damaged_segment(pristine: Pristine, d: tuple) -> None:
    old = pristine.segment.read_bytes()
    new = apply(old, d)
    expect = oracle(old, new, pristine.segment_batches, 0)
    path = damaged_copy(pristine.segment, new)
    try:
        run = kcli_inproc("dump-log", str(path))
    finally:
        shutil.rmtree(path.parent)
    assert_clean_failure(run, d)
    if not expect.damaged:
        assert run.code == 0, (d, run.err)
        return
    assert run.code == 1, (d, expect, run.err)
    assert expect.position in reported_positions(run.err), (d, expect, run.err)


# ---- dump-log and verify over a WAL object ----------------------------------------------------------


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(d=damage)
def test_dump_log_and_offline_verify_on_a_damaged_wal_object(pristine: Pristine, d: tuple) -> None:
    path = pristine.wal_root / "objects" / pristine.wal_key
    old = path.read_bytes()
    new = apply(old, d)
    expect = oracle(old, new, pristine.wal_batches, 1)
    work = Path(tempfile.mkdtemp(prefix="kcli-damaged-wal-"))
    try:
        shutil.copytree(pristine.wal_root, work / "root")
        damaged = work / "root" / "objects" / pristine.wal_key
        damaged.write_bytes(new)
        dump = kcli_inproc("dump-log", str(damaged))
        verify = kcli_inproc("diskless", "verify", "--coordinator", f"sqlite://{work / 'root' / 'diskless' / 'coordinator.db'}",
                             "--object-store", (work / "root" / "objects").as_uri(), "--engine", "local",
                             "-k", pristine.wal_key, "-o", "json")
    finally:
        shutil.rmtree(work)
    assert_clean_failure(dump, ("dump-log", d))
    assert_clean_failure(verify, ("verify", d))
    problems = json.loads(verify.out)["problems"] if verify.out.strip() else None
    if not expect.damaged and not expect.size_changed:
        assert dump.code == 0 and verify.code == 0, (d, dump.err, verify.err)
        assert problems == []
        return
    # verify knows the committed size: any cut is damage to it, even at a batch boundary, where
    # dump-log (which only sees the file) rightly finds a valid, shorter object.
    assert verify.code == 1, (d, expect, verify.err)
    assert problems, (d, verify.out)
    if len(new) == 0:  # nothing left to recognise: Kafka's "Ignoring unknown file", exit 0
        assert dump.code == 0 and dump.err.startswith("Ignoring unknown file "), (d, dump.err)
    elif not expect.damaged:
        assert dump.code == 0, (d, dump.err)
    else:
        assert dump.code == 1, (d, expect, dump.err)
    if expect.position is not None:
        assert expect.position in reported_positions(dump.err) or len(new) == 0, (d, expect, dump.err)
    if expect.size_changed:
        assert any("differs from committed size" in p["problem"] for p in problems), problems
        if expect.position is not None and len(new) < len(old):
            assert expect.position in {p.get("byte_offset") for p in problems}, (d, expect, problems)
    elif expect.position is not None:
        assert expect.position in {p.get("byte_offset") for p in problems}, (d, expect, problems)
    else:
        assert any("version byte" in p["problem"] for p in problems), problems


# ---- the same through real processes, and an index file -------------------------------------------


def kcli_process(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCLI_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "kcli", *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=120)


def test_real_processes_name_the_damage_in_one_line_each(pristine: Pristine, tmp_path: Path) -> None:
    seg_pos, seg_size = pristine.segment_batches[3]
    old = pristine.segment.read_bytes()
    seg = tmp_path / "seg" / pristine.segment.name
    seg.parent.mkdir()
    seg.write_bytes(apply(old, ("flip", seg_pos + seg_size - 3, 5)))
    index = seg.with_suffix(".index")
    index.write_bytes(b"\x00\x00\x00\x09" + b"\xff" * 5)  # a torn entry pointing nowhere
    root = tmp_path / "wal"
    shutil.copytree(pristine.wal_root, root)
    wal = root / "objects" / pristine.wal_key
    wal_pos, wal_size = pristine.wal_batches[1]
    wal.write_bytes(wal.read_bytes()[: wal_pos + wal_size // 2])

    dump = kcli_process("dump-log", str(seg), str(index))
    assert dump.returncode == 1 and "Traceback" not in dump.stderr
    errors = [ln for ln in dump.stderr.splitlines() if ln.strip()]
    assert errors and all(ln.startswith("kcli: error: ") for ln in errors), dump.stderr
    assert any(f"position {seg_pos} " in ln and "CRC" in ln for ln in errors), dump.stderr
    assert f"position: {seg_pos} " in dump.stdout and "isvalid: false" in dump.stdout

    verify = kcli_process("diskless", "verify", "--coordinator", f"sqlite://{root / 'diskless' / 'coordinator.db'}",
                          "--engine", "local")
    assert verify.returncode == 1 and "Traceback" not in verify.stderr
    assert verify.stderr.strip().splitlines() == [verify.stderr.strip().splitlines()[0]]  # one line
    assert verify.stderr.startswith("kcli: error: verify found")
    assert pristine.wal_key in verify.stdout and f"{wal_pos}" in verify.stdout and "runs past the end" in verify.stdout
