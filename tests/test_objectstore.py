"""Object storage contract, run against a local directory and against S3 (moto's HTTP server)."""

from __future__ import annotations

import io
import os
import socket
import threading
from pathlib import Path

import pytest

from plugins.loader import PluginError, load_class
from plugins.objectstore import (
    ByteRange,
    ObjectNotFound,
    ObjectStorage,
    StorageBackendException,
    from_uri,
)
from plugins.objectstore.local import TEMP_SUFFIX, LocalObjectStorage
from plugins.objectstore.s3 import S3ObjectStorage
from tests.fixtures_s3 import moto_server, s3_bucket, s3_env  # noqa: F401


class OneWayStream(io.RawIOBase):
    """A non-seekable byte stream (like a socket or pipe) over ``data``; fails at ``fail_at``."""

    def __init__(self, data: bytes, fail_at: int | None = None) -> None:
        self._data = data
        self._pos = 0
        self._fail_at = fail_at

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readinto(self, buffer) -> int:  # type: ignore[override]
        if self._fail_at is not None and self._pos >= self._fail_at:
            raise OSError("source stream broke")
        end = len(self._data) if self._fail_at is None else min(len(self._data), self._fail_at)
        n = min(len(buffer), end - self._pos)
        buffer[:n] = self._data[self._pos : self._pos + n]
        self._pos += n
        return n


@pytest.fixture(params=["local", "s3", "s3-prefixed"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStorage:
    if request.param == "local":
        storage: ObjectStorage = LocalObjectStorage(tmp_path / "objects")
    else:
        bucket = request.getfixturevalue("s3_bucket")
        storage = S3ObjectStorage(bucket, "cluster-a/diskless" if request.param == "s3-prefixed" else "")
    yield storage
    storage.close()


PAYLOAD = bytes(range(256)) * 40  # 10240 bytes


# -- contract --------------------------------------------------------------------------------


def test_roundtrip_whole_and_ranges(store: ObjectStorage) -> None:
    store.upload("wal/obj-1", PAYLOAD, len(PAYLOAD))
    assert store.fetch("wal/obj-1") == PAYLOAD
    assert store.fetch("wal/obj-1", None) == PAYLOAD
    assert store.fetch("wal/obj-1", ByteRange(1, 100)) == PAYLOAD[1:101]
    assert store.fetch("wal/obj-1", ByteRange(len(PAYLOAD) - 7, 7)) == PAYLOAD[-7:]
    assert store.fetch("wal/obj-1", ByteRange(0, len(PAYLOAD))) == PAYLOAD
    assert store.fetch("wal/obj-1", ByteRange(len(PAYLOAD), 0)) == b""
    assert store.size("wal/obj-1") == len(PAYLOAD)
    assert store.exists("wal/obj-1")


@pytest.mark.parametrize(
    "byte_range",
    [ByteRange(10240, 1), ByteRange(10000, 241), ByteRange(20000, 10), ByteRange(10241, 0)],
    ids=["one-past", "straddles-end", "far-past", "empty-past"],
)
def test_range_past_end_is_an_error_not_a_short_read(store: ObjectStorage, byte_range: ByteRange) -> None:
    store.upload("k", PAYLOAD, len(PAYLOAD))
    with pytest.raises(StorageBackendException, match="past the end of object 'k'"):
        store.fetch("k", byte_range)


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "file", "stream"])
def test_upload_accepts_buffers_and_streams(store: ObjectStorage, kind: str, tmp_path: Path) -> None:
    if kind == "bytes":
        data = PAYLOAD
    elif kind == "bytearray":
        data = bytearray(PAYLOAD)
    elif kind == "memoryview":
        data = memoryview(b"xx" + PAYLOAD)[2:]
    elif kind == "file":
        src = tmp_path / "src.bin"
        src.write_bytes(b"skip" + PAYLOAD)
        data = open(src, "rb")  # noqa: SIM115
        data.read(4)  # upload streams from the current position
    else:
        data = io.BufferedReader(OneWayStream(PAYLOAD))
    store.upload(f"up/{kind}", data, len(PAYLOAD))
    if hasattr(data, "close"):
        data.close()
    assert store.fetch(f"up/{kind}") == PAYLOAD


@pytest.mark.parametrize("kind", ["bytes-short", "bytes-long", "file-short", "file-long", "stream-short", "stream-long"])
def test_upload_length_mismatch_raises_and_stores_nothing(store: ObjectStorage, kind: str, tmp_path: Path) -> None:
    declared = len(PAYLOAD) + 1 if kind.endswith("short") else len(PAYLOAD) - 1
    if kind.startswith("bytes"):
        data = PAYLOAD
    elif kind.startswith("file"):
        src = tmp_path / "src.bin"
        src.write_bytes(PAYLOAD)
        data = open(src, "rb")  # noqa: SIM115
    else:
        data = io.BufferedReader(OneWayStream(PAYLOAD))
    with pytest.raises(StorageBackendException, match="declared"):
        store.upload("bad", data, declared)
    assert not store.exists("bad")
    assert [o.key for o in store.list()] == []


def test_missing_object(store: ObjectStorage) -> None:
    with pytest.raises(ObjectNotFound):
        store.fetch("nope")
    with pytest.raises(ObjectNotFound):
        store.fetch("nope", ByteRange(0, 1))
    with pytest.raises(ObjectNotFound):
        store.size("nope")
    assert not store.exists("nope")
    assert issubclass(ObjectNotFound, StorageBackendException)


def test_overwrite_replaces_content(store: ObjectStorage) -> None:
    store.upload("k", b"first-version", 13)
    store.upload("k", b"2nd", 3)
    assert store.fetch("k") == b"2nd"


def test_empty_object(store: ObjectStorage) -> None:
    store.upload("empty", b"", 0)
    assert store.fetch("empty") == b""
    assert store.size("empty") == 0
    assert store.fetch("empty", ByteRange(0, 0)) == b""


def test_delete_is_idempotent(store: ObjectStorage) -> None:
    for key in ("a", "b/c", "b/d"):
        store.upload(key, b"x", 1)
    store.delete(["a", "b/c", "never-existed", "a"])
    assert [o.key for o in store.list()] == ["b/d"]
    store.delete(["a", "b/c"])  # again: no error
    store.delete([])
    store.delete(iter(["b/d"]))
    assert list(store.list()) == []


def test_delete_more_than_one_s3_batch(store: ObjectStorage) -> None:
    # S3 takes 1000 keys per DeleteObjects call: the real objects sit past the first batch.
    keys = [f"many/{i:05d}" for i in range(2503)]
    for key in keys[998:1002] + keys[2000:2003]:
        store.upload(key, b"", 0)
    store.delete(keys[:2001] + keys[2002:])
    assert [o.key for o in store.list("many/")] == [keys[2001]]


def test_list_prefix_order_and_metadata(store: ObjectStorage) -> None:
    keys = ["wal/abc", "wal/abd", "wal/b", "wal-x", "tiered/t-0/0001.log", "top"]
    for i, key in enumerate(keys):
        store.upload(key, b"z" * i, i)
    listed = list(store.list())
    assert [o.key for o in listed] == sorted(keys)
    sizes = {o.key: o.size for o in listed}
    assert sizes == {k: i for i, k in enumerate(keys)}
    assert all(o.last_modified_ms > 1_600_000_000_000 for o in listed)
    assert [o.key for o in store.list("wal/")] == ["wal/abc", "wal/abd", "wal/b"]
    assert [o.key for o in store.list("wal/ab")] == ["wal/abc", "wal/abd"]
    assert [o.key for o in store.list("wal")] == ["wal-x", "wal/abc", "wal/abd", "wal/b"]
    assert [o.key for o in store.list("tiered/t-0/")] == ["tiered/t-0/0001.log"]
    assert list(store.list("zzz")) == []


def test_describe(store: ObjectStorage, tmp_path: Path) -> None:
    text = store.describe()
    if isinstance(store, LocalObjectStorage):
        assert text == (tmp_path / "objects").as_uri()
    else:
        assert text.startswith("s3://kcli-test-")
    assert from_uri(text).describe() == text


def test_concurrent_uploads_and_fetches(store: ObjectStorage) -> None:
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(10):
                data = f"{n}-{i}".encode() * 50
                store.upload(f"c/{n}/{i}", data, len(data))
                assert store.fetch(f"c/{n}/{i}") == data
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(list(store.list("c/"))) == 40


# -- local specifics --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "../escape",
        "a/../../escape",
        "a/../b",
        "/etc/passwd",
        "..",
        ".",
        "",
        "a//b",
        "a/",
        "a\\..\\..\\escape",
        "..\\escape",
        "a\x00b",
        "a/./b",
        f"x{TEMP_SUFFIX}",
    ],
)
def test_local_rejects_keys_that_could_escape(tmp_path: Path, key: str) -> None:
    root = tmp_path / "root"
    store = LocalObjectStorage(root)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(StorageBackendException, match="invalid object key"):
        store.upload(key, b"evil", 4)
    with pytest.raises(StorageBackendException, match="invalid object key"):
        store.fetch(key)
    with pytest.raises(StorageBackendException, match="invalid object key"):
        store.delete([key])
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not (tmp_path / "escape").exists()


def test_local_symlink_out_of_root_is_rejected(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(outside, target_is_directory=True)
    (root / "filelink").symlink_to(outside / "secret")
    store = LocalObjectStorage(root)
    with pytest.raises(StorageBackendException, match="outside the store root"):
        store.fetch("link/secret")
    with pytest.raises(StorageBackendException, match="outside the store root"):
        store.upload("link/new", b"x", 1)
    with pytest.raises(StorageBackendException, match="outside the store root"):
        store.fetch("filelink")
    with pytest.raises(StorageBackendException, match="outside the store root"):
        store.delete(["filelink"])
    assert not (outside / "new").exists()
    assert (outside / "secret").read_bytes() == b"secret"
    assert [o.key for o in store.list()] == []  # symlinks are not objects
    with pytest.raises(StorageBackendException):
        list(store.list("../"))


def test_local_failed_stream_leaves_no_file_or_temp(tmp_path: Path) -> None:
    store = LocalObjectStorage(tmp_path)
    with pytest.raises(StorageBackendException, match="source stream broke"):
        store.upload("wal/x", io.BufferedReader(OneWayStream(PAYLOAD, fail_at=3000), buffer_size=1024), len(PAYLOAD))
    assert os.listdir(tmp_path / "wal") == []
    assert not store.exists("wal/x")


def test_local_temp_files_are_not_listed(tmp_path: Path) -> None:
    store = LocalObjectStorage(tmp_path)
    store.upload("wal/real", b"data", 4)
    (tmp_path / "wal" / f".real.0123abcd{TEMP_SUFFIX}").write_bytes(b"partial")
    assert [o.key for o in store.list()] == ["wal/real"]
    assert [o.key for o in store.list("wal/")] == ["wal/real"]


def test_local_missing_root_lists_empty_and_is_created_on_upload(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b"
    store = LocalObjectStorage(root)
    assert list(store.list()) == []
    assert not root.exists()  # reading never creates directories
    store.upload("x/y/z", b"1", 1)
    assert (root / "x" / "y" / "z").read_bytes() == b"1"
    assert [p.name for p in root.iterdir()] == ["x"]  # no temp left behind


def test_local_directory_is_not_an_object(tmp_path: Path) -> None:
    store = LocalObjectStorage(tmp_path)
    store.upload("d/x", b"1", 1)
    with pytest.raises(ObjectNotFound):
        store.fetch("d")
    assert not store.exists("d")
    store.delete(["d"])
    assert store.exists("d/x")


def test_local_configure(tmp_path: Path) -> None:
    store = LocalObjectStorage()
    with pytest.raises(StorageBackendException, match="not configured"):
        store.upload("k", b"", 0)
    store.configure({"root": str(tmp_path)})
    store.upload("k", b"v", 1)
    assert (tmp_path / "k").read_bytes() == b"v"
    with pytest.raises(StorageBackendException, match="unknown LocalObjectStorage config"):
        store.configure({"bucket": "x"})


# -- S3 specifics ----------------------------------------------------------------------------


def test_s3_prefixes_isolate_stores(s3_bucket: str) -> None:
    a = S3ObjectStorage(s3_bucket, "a")
    b = S3ObjectStorage(s3_bucket, "/b/")
    root = S3ObjectStorage(s3_bucket)
    a.upload("k", b"from-a", 6)
    b.upload("k", b"from-b", 6)
    assert a.fetch("k") == b"from-a"
    assert b.fetch("k") == b"from-b"
    assert [o.key for o in a.list()] == ["k"]
    assert [o.key for o in root.list()] == ["a/k", "b/k"]
    a.delete(["k"])
    assert b.fetch("k") == b"from-b"
    assert b.describe() == f"s3://{s3_bucket}/b/"


def test_s3_configure_from_dict(s3_bucket: str, s3_env: str) -> None:
    store = S3ObjectStorage()
    store.configure({"bucket": s3_bucket, "prefix": "p", "endpoint.url": s3_env, "region": "us-east-1",
                     "path.style.access.enabled": "true"})
    store.upload("k", b"v", 1)
    assert S3ObjectStorage(s3_bucket).fetch("p/k") == b"v"
    with pytest.raises(StorageBackendException, match="unknown S3ObjectStorage config"):
        store.configure({"root": "/x"})
    with pytest.raises(StorageBackendException, match="path.style.access.enabled must be true or false"):
        store.configure({"path.style.access.enabled": "maybe"})


def test_s3_missing_bucket(s3_env: str) -> None:
    store = S3ObjectStorage("kcli-no-such-bucket-4711")
    with pytest.raises(StorageBackendException, match="does not exist"):
        store.upload("k", b"v", 1)
    with pytest.raises(StorageBackendException, match="does not exist"):
        list(store.list())


def test_s3_unreachable_endpoint_is_one_error(s3_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    store = S3ObjectStorage("bucket")
    with pytest.raises(StorageBackendException, match="S3 fetch 'k' in s3://bucket failed"):
        store.fetch("k")


def test_s3_create_bucket_is_idempotent(s3_env: str) -> None:
    store = S3ObjectStorage("kcli-created-bucket")
    store.create_bucket()
    store.create_bucket()
    store.upload("k", b"v", 1)
    assert store.fetch("k") == b"v"


# -- from_uri and the plugin loader ------------------------------------------------------------


def test_from_uri(tmp_path: Path) -> None:
    local = from_uri(tmp_path.as_uri())
    assert isinstance(local, LocalObjectStorage) and local.root == tmp_path
    spaced = from_uri("file:///tmp/with%20space")
    assert isinstance(spaced, LocalObjectStorage) and str(spaced.root) == "/tmp/with space"
    s3 = from_uri("s3://bucket/some/prefix")
    assert isinstance(s3, S3ObjectStorage) and s3.bucket == "bucket" and s3.prefix == "some/prefix/"
    assert from_uri("s3://bucket").describe() == "s3://bucket"


@pytest.mark.parametrize(
    "uri", ["gs://bucket/x", "/plain/path", "file://host/dir", "file:relative", "s3:///nobucket", "", "s3://b/p?x=1"]
)
def test_from_uri_rejects(uri: str) -> None:
    with pytest.raises(StorageBackendException, match="unsupported object store URI"):
        from_uri(uri)


def test_loader_resolves_and_checks_base(tmp_path: Path) -> None:
    cls = load_class("plugins.objectstore.local.LocalObjectStorage", ObjectStorage)
    store = cls()
    store.configure({"root": str(tmp_path)})
    store.upload("k", b"v", 1)
    assert (tmp_path / "k").read_bytes() == b"v"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("plugins.objectstore.local.NoSuchClass", "has no 'NoSuchClass'"),
        ("plugins.no_such_module.Cls", "no module named 'plugins.no_such_module'"),
        ("NoDots", "not of the form package.module.ClassName"),
        ("", "empty"),
        ("plugins.objectstore.local.TEMP_SUFFIX", "is not a class"),
        ("plugins.loader.PluginError", "is not a plugins.objectstore.base.ObjectStorage"),
    ],
)
def test_loader_errors_are_one_line(name: str, message: str) -> None:
    with pytest.raises(PluginError, match=message) as info:
        load_class(name, ObjectStorage)
    assert "\n" not in str(info.value)
    assert info.value.exit_code == 2


def test_local_delete_removes_directories_it_leaves_empty(tmp_path: Path) -> None:
    """Deletions leave no empty directories behind (an S3 prefix leaves none either), the root
    stays, and an upload racing with the clean-up of its directory still lands."""
    root = tmp_path / "objects"
    store = LocalObjectStorage(root)
    store.upload("wal/ab/one", b"1", 1)
    store.upload("wal/ab/two", b"2", 1)
    store.delete(["wal/ab/one"])
    assert (root / "wal" / "ab").is_dir()  # still holds "two"
    store.delete(["wal/ab/two"])
    assert root.is_dir() and list(root.iterdir()) == []
    errors: list[BaseException] = []

    def churn(n: int) -> None:
        try:
            for i in range(200):
                key = f"wal/x/{n}-{i}"
                store.upload(key, b"x", 1)
                assert store.fetch(key) == b"x"
                store.delete([key])
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert list(root.iterdir()) == []
