"""`kcli broker start` refusals: each is one `kcli: error:` line, a non-zero exit, and no damage.

Tests run as root, where file modes do not stop writes, so "read-only" and "disk full" are made
with what does stop root: a path under a regular file (ENOTDIR), the immutable attribute
(chattr +i), and RLIMIT_FSIZE on the broker process (writes past the limit fail with EFBIG).
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from crc32c import crc32c

from kcli.protocol.client import WireClient
from tests.fixtures_cli import REPO, assert_one_line_error, cli_env  # noqa: F401 - fixture
from tests.kafka_helpers import consume_all, create_topic, produce


def start(env: dict[str, str], data_dir: Path, *args: str, listen: str = "127.0.0.1:0",
          fsize: int | None = None) -> subprocess.CompletedProcess[str]:
    """Run `kcli broker start` expecting it to fail fast (a broker that starts would time out)."""
    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    proc = subprocess.run([sys.executable, "-m", "kcli", "broker", "start", "--data-dir", str(data_dir),
                           "--listen", listen, *args], capture_output=True, env=env, cwd=REPO, timeout=60,
                          preexec_fn=limit)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def assert_metadata_log_whole(data_dir: Path) -> None:
    """Every line of the metadata log is a complete record with a good CRC (nothing torn)."""
    path = data_dir / "__cluster_metadata" / "metadata.log"
    if not path.exists():
        return
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), data
    for line in data.splitlines():
        crc, payload = line.split(b" ", 1)
        assert int(crc, 16) == crc32c(payload)
        json.loads(payload)


def assert_serves(broker_factory, name: str) -> None:
    b = broker_factory(name=name)
    create_topic(b.bootstrap, "after")
    produce(b.bootstrap, "after", [b"ok"])
    assert [m.value() for m in consume_all(b.bootstrap, "after", 1)] == [b"ok"]


# --- configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize("args, needle", [
    (["--config", "num.partitions=abc"], "Invalid value abc for configuration num.partitions: Not a 32-bit integer"),
    (["--config", "num.partitions=0"], "Value must be at least 1"),
    (["--config", "no.such.config=1"], "Unknown broker config name: no.such.config"),
    (["--config", "novalue"], "--config expects key=value"),
    (["--config-file", "/nonexistent/broker.properties"], "cannot read config file"),
])
def test_bad_config_is_exit_2(cli_env, tmp_path, args, needle):
    proc = start(cli_env, tmp_path / "data", *args)
    assert_one_line_error(proc, 2, needle)
    assert not (tmp_path / "data").exists()  # refused before the data dir is created


def test_bad_listen_value_is_exit_2(cli_env, tmp_path):
    assert_one_line_error(start(cli_env, tmp_path / "data", listen="127.0.0.1:99999"), 2, "port must be 0..65535")
    assert_one_line_error(start(cli_env, tmp_path / "data", listen="no-port"), 2, "HOST:PORT")


# --- the data directory --------------------------------------------------------------------------


def test_data_dir_under_a_regular_file(cli_env, tmp_path):
    (tmp_path / "file").write_text("not a directory")
    proc = start(cli_env, tmp_path / "file" / "data")
    assert_one_line_error(proc, 1, "cannot use data dir", "not a directory")


@pytest.fixture
def immutable_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory root cannot write into (chattr +i); skipped where the attribute is unavailable."""
    d = tmp_path / "ro"
    d.mkdir()
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode:
        pytest.skip("chattr +i is not available here")
    try:
        yield d
    finally:
        subprocess.run(["chattr", "-i", str(d)], check=True)


def test_read_only_data_dir(cli_env, immutable_dir):
    proc = start(cli_env, immutable_dir)
    assert_one_line_error(proc, 1, f"data dir {immutable_dir}", "Operation not permitted")
    assert list(immutable_dir.iterdir()) == []


def test_read_only_data_dir_of_an_existing_broker(cli_env, broker_factory, tmp_path):
    b = broker_factory(name="old")
    create_topic(b.bootstrap, "kept")
    b.stop()
    before = sorted(p.name for p in b.data_dir.iterdir())
    subprocess.run(["chattr", "+i", str(b.data_dir)], check=True)
    try:
        proc = start(cli_env, b.data_dir)
    finally:
        subprocess.run(["chattr", "-i", str(b.data_dir)], check=True)
    assert_one_line_error(proc, 1, "is not writable", "Operation not permitted")
    assert sorted(p.name for p in b.data_dir.iterdir()) == before
    assert_metadata_log_whole(b.data_dir)
    b.start()  # the same data dir, writable again, serves its topic
    with WireClient(b.bootstrap) as c:
        md = c.request(3, 12, {"topics": [{"name": "kept"}], "allow_auto_topic_creation": False})
    assert int(md.topics[0].error_code) == 0


@pytest.mark.parametrize("fsize", [0, 40, 100])
def test_disk_full_at_first_start_leaves_no_torn_state(cli_env, broker_factory, tmp_path, fsize):
    """RLIMIT_FSIZE stops writes at ``fsize`` bytes: in the write probe (0), mid-record in the metadata
    log (40), or in broker.json after the metadata is written (100)."""
    data = tmp_path / "data"
    proc = start(cli_env, data, fsize=fsize)
    assert_one_line_error(proc, 1, f"data dir {data}", "File too large")
    assert_metadata_log_whole(data)
    leftovers = sorted(p.name for p in data.rglob("*") if p.suffix in (".tmp",) or p.name == ".write-probe")
    assert leftovers == []
    assert not (data / "broker.json").exists()
    if fsize == 40:
        assert_serves(broker_factory, "data")  # the same dir starts normally once space is back


def test_metadata_log_damaged_before_its_end(cli_env, broker_factory, tmp_path):
    b = broker_factory(name="data")
    create_topic(b.bootstrap, "t1")
    create_topic(b.bootstrap, "t2")
    b.stop()
    log = b.data_dir / "__cluster_metadata" / "metadata.log"
    raw = bytearray(log.read_bytes())
    raw[12] ^= 0x01  # inside the first record: not a torn tail, so start-up must not guess
    log.write_bytes(bytes(raw))
    proc = start(cli_env, b.data_dir)
    assert_one_line_error(proc, 1, "cannot read cluster metadata", "corrupt record at byte 0")
    assert log.read_bytes() == bytes(raw)  # left as found for the operator


# --- the listener and the lock -------------------------------------------------------------------


def test_port_in_use(cli_env, broker_factory, tmp_path):
    first = broker_factory(name="first")
    proc = start(cli_env, tmp_path / "second", listen=f"127.0.0.1:{first.port}")
    assert_one_line_error(proc, 1, f"cannot listen on 127.0.0.1:{first.port}: Address already in use")
    assert not (tmp_path / "second" / "broker.json").exists()
    assert first.alive()
    assert_metadata_log_whole(tmp_path / "second")  # initialised, then closed cleanly


def test_second_broker_on_the_same_data_dir_is_refused(cli_env, broker_factory):
    first = broker_factory(name="shared")
    proc = start(cli_env, first.data_dir)
    assert_one_line_error(proc, 1, f"data dir {first.data_dir} is in use by another broker")
    assert first.alive()
    info = json.loads((first.data_dir / "broker.json").read_text())
    assert info["port"] == first.port  # the running broker's runtime file was not touched
    create_topic(first.bootstrap, "still-fine")
