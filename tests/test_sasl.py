"""SASL/PLAIN on the broker listener: users file, CLI, Kafka wire semantics, real clients, contexts."""

from __future__ import annotations

import re
import shutil
import socket
import stat
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from kcli.security.sasl import (
    INVALID_CREDENTIALS,
    PlainAuthenticator,
    SaslAuthenticationFailed,
    UsersFile,
    UsersFileError,
    hash_password,
)
from kcli.errors import OperationError
from kcli.protocol.client import WireClient
from tests.brokerproc import BrokerProcess
from tests.fixtures_cli import assert_one_line_error, cli_env, run_kcli  # noqa: F401 - fixture
from tests.kafka_helpers import consume_all, produce

UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58

USERS = {"alice": "alice-Secret-1", "ops": "ops pass with spaces"}


def write_users(path: Path, users: dict[str, str], scheme: str = "scrypt") -> None:
    f = UsersFile.read(path, missing_ok=True)
    for name, password in users.items():
        f.set(name, hash_password(password, scheme))
    f.write()


def sasl_conf(user: str, password: str) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": user, "sasl.password": password}


@dataclass
class SaslBroker:
    proc: BrokerProcess
    users_file: Path

    @property
    def bootstrap(self) -> str:
        return self.proc.bootstrap


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslBroker]:
    root = tmp_path_factory.mktemp("sasl")
    users = root / "users.txt"
    write_users(users, USERS)
    b = BrokerProcess(root / "data", {"sasl.enabled.mechanisms": "PLAIN", "sasl.plain.users.file": str(users),
                                      "group.initial.rebalance.delay.ms": "0"}).start()
    yield SaslBroker(b, users)
    b.stop()


# --- the users file and the PLAIN check (real files, no broker) -----------------------------------


def test_users_file_stores_only_salted_hashes(tmp_path):
    path = tmp_path / "users"
    write_users(path, {"alice": "pw-1", "bob": "pw-1"})
    write_users(path, {"carol": "pw-2"}, scheme="pbkdf2-sha256")
    text = path.read_text()
    assert "pw-1" not in text and "pw-2" not in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = dict(line.split(":", 1) for line in text.splitlines())
    assert re.fullmatch(r"scrypt\$16384\$8\$1\$[A-Za-z0-9+/=]{24}\$[A-Za-z0-9+/=]{44}", lines["alice"])
    assert re.fullmatch(r"pbkdf2-sha256\$600000\$[A-Za-z0-9+/=]+\$[A-Za-z0-9+/=]+", lines["carol"])
    assert lines["alice"] != lines["bob"]  # same password, different salt

    auth = PlainAuthenticator(path)
    assert auth.authenticate(b"\0alice\0pw-1") == "alice"
    assert auth.authenticate(b"alice\0alice\0pw-1") == "alice"  # authzid equal to the user is fine
    assert auth.authenticate(b"\0alice\0pw-1") == "alice"  # second time from the verified cache
    assert auth.authenticate(b"\0carol\0pw-2") == "carol"
    refusals = {
        b"\0alice\0pw-2": INVALID_CREDENTIALS,
        b"\0nobody\0pw-1": INVALID_CREDENTIALS,  # same words as a bad password: no user enumeration
        b"bob\0alice\0pw-1": "authorization id that is different from username",
        b"\0alice": "expected 3 tokens, got 2",
        b"\0\0pw-1": "username not specified",
        b"\0alice\0": "password not specified",
    }
    for token, message in refusals.items():
        with pytest.raises(SaslAuthenticationFailed, match=re.escape(message)):
            auth.authenticate(token)


def test_authenticator_rereads_a_changed_file_and_keeps_the_old_users_on_a_bad_edit(tmp_path):
    path = tmp_path / "users"
    write_users(path, {"alice": "one"})
    auth = PlainAuthenticator(path)
    write_users(path, {"alice": "two", "bob": "three"})
    assert auth.authenticate(b"\0bob\0three") == "bob"
    with pytest.raises(SaslAuthenticationFailed):
        auth.authenticate(b"\0alice\0one")  # the cached success of the old password is not reused
    path.write_text(path.read_text() + "garbage line\n")
    assert auth.authenticate(b"\0alice\0two") == "alice"


@pytest.mark.parametrize("content, needle", [
    ("alice\n", "line 1: expected NAME:SECRET"),
    ("# ok\nalice:md5$abc\n", "line 2: unknown secret scheme 'md5'"),
    ("alice:scrypt$1000$8$1$c2FsdHNhbHQ=$aGFzaGhhc2hoYXNoaGFzaA==\n", "out of range"),
    ("alice:scrypt$16384$8$1$@@@$aGFzaGhhc2hoYXNoaGFzaA==\n", "base64"),
    ("alice:pbkdf2-sha256$10$c2FsdHNhbHQ=$aGFzaGhhc2hoYXNoaGFzaA==\n", "iterations 10 out of range"),
])
def test_malformed_users_file_is_refused_with_its_line(tmp_path, content, needle):
    path = tmp_path / "users"
    path.write_text(content)
    with pytest.raises(UsersFileError, match=re.escape(needle)):
        PlainAuthenticator(path)


def test_duplicate_and_missing_users_file(tmp_path):
    path = tmp_path / "users"
    write_users(path, {"alice": "x"})
    path.write_text(path.read_text() * 2)
    with pytest.raises(UsersFileError, match="line 2: user 'alice' is listed twice"):
        UsersFile.read(path)
    with pytest.raises(UsersFileError, match="does not exist"):
        UsersFile.read(tmp_path / "nope")


# --- kcli broker users ... -----------------------------------------------------------------------


def test_users_cli_add_list_update_delete(cli_env, tmp_path):
    path = tmp_path / "etc" / "users"
    ok = run_kcli(cli_env, "broker", "users", "add", "alice", "--users-file", str(path), "--password-stdin",
                  input="first\n")
    assert ok.returncode == 0, ok.stderr
    assert "Added user 'alice'" in ok.stdout
    path.write_text("# managed by ops\n" + path.read_text())
    assert run_kcli(cli_env, "broker", "users", "add", "bob", "--users-file", str(path), "--password-stdin",
                    input="bob-pw").returncode == 0
    listed = run_kcli(cli_env, "-o", "json", "broker", "users", "list", "--users-file", str(path))
    assert listed.returncode == 0 and '"user": "alice"' in listed.stdout and '"user": "bob"' in listed.stdout
    assert "scrypt$" not in listed.stdout  # hashes are never printed

    dup = run_kcli(cli_env, "broker", "users", "add", "alice", "--users-file", str(path), "--password-stdin",
                   input="again\n")
    assert_one_line_error(dup, 2, "already exists", "--update")
    before = path.read_text()
    upd = run_kcli(cli_env, "broker", "users", "add", "alice", "--update", "--users-file", str(path),
                   "--password-stdin", input="second\n")
    assert upd.returncode == 0, upd.stderr
    assert path.read_text() != before
    assert PlainAuthenticator(path).authenticate(b"\0alice\0second") == "alice"

    gone = run_kcli(cli_env, "broker", "users", "delete", "bob", "--users-file", str(path))
    assert gone.returncode == 0 and "Deleted user 'bob'" in gone.stdout
    assert path.read_text().startswith("# managed by ops\n")  # the operator's comment survives
    assert "bob:" not in path.read_text()
    assert_one_line_error(run_kcli(cli_env, "broker", "users", "delete", "bob", "--users-file", str(path)),
                          2, "'bob' is not in")


@pytest.mark.parametrize("args, stdin, needle", [
    (["add", "carol"], None, "--password-stdin"),  # not a terminal and no --password-stdin
    (["add", "a:b", "--password-stdin"], "x\n", "invalid user name"),
    (["list"], None, "does not exist"),
])
def test_users_cli_refusals_are_one_line(cli_env, tmp_path, args, stdin, needle):
    proc = run_kcli(cli_env, "broker", "users", *args, "--users-file", str(tmp_path / "users"),
                    input=stdin if stdin is not None else b"")
    assert_one_line_error(proc, 2, needle)


# --- start-up refusals ---------------------------------------------------------------------------


@pytest.mark.parametrize("setup, pairs, listen, needle", [
    ("alice\n", ["sasl.enabled.mechanisms=PLAIN", "sasl.plain.users.file={dir}/users"], None, "line 1"),
    ("# nobody yet\n", ["sasl.enabled.mechanisms=PLAIN", "sasl.plain.users.file={dir}/users"], None, "has no users"),
    (None, ["sasl.enabled.mechanisms=PLAIN"], None, "needs sasl.plain.users.file"),
    (None, ["sasl.enabled.mechanisms=GSSAPI", "sasl.plain.users.file={dir}/users"], None, "kcli supports PLAIN"),
    (None, ["sasl.enabled.mechanisms=SCRAM-SHA-256", "sasl.plain.users.file={dir}/users"], None, "PLAIN is not in"),
    ("users", ["sasl.plain.users.file={dir}/users"], None, "sasl.enabled.mechanisms is empty"),
    ("users", ["sasl.enabled.mechanisms=PLAIN", "sasl.plain.users.file={dir}/users"], "PLAINTEXT://127.0.0.1:0",
     "use SASL_PLAINTEXT://"),
])
def test_bad_sasl_setup_is_a_usage_error_before_the_data_dir_is_touched(tmp_path, setup, pairs, listen, needle):
    from kcli.broker.runner import build_config, run_foreground
    from kcli.errors import UsageError

    if setup == "users":
        write_users(tmp_path / "users", {"alice": "x"})
    elif setup is not None:
        (tmp_path / "users").write_text(setup)
    with pytest.raises(UsageError, match=re.escape(needle)):
        run_foreground(tmp_path / "data", listen or "127.0.0.1:0",
                       build_config([p.format(dir=tmp_path) for p in pairs], None))
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("args, needle", [
    (["--config", "sasl.enabled.mechanisms=PLAIN", "--config", "sasl.plain.users.file={dir}/missing"],
     "does not exist"),
    (["--listen", "SASL_PLAINTEXT://127.0.0.1:0"], "needs sasl.enabled.mechanisms=PLAIN"),
])
def test_bad_sasl_setup_stops_kcli_broker_start_with_exit_2(cli_env, tmp_path, args, needle):
    proc = run_kcli(cli_env, "broker", "start", "--data-dir", str(tmp_path / "data"), "--listen", "127.0.0.1:0",
                    *[a.format(dir=tmp_path) for a in args], timeout=60)
    assert_one_line_error(proc, 2, needle)
    assert not (tmp_path / "data").exists()


# --- the wire exchange ---------------------------------------------------------------------------


def _closed(c: WireClient) -> bool:
    """True when the broker has closed ``c`` (EOF or reset), within a few seconds."""
    sock = c.connect()
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _raw_token(c: WireClient, token: bytes) -> None:
    c.send_raw(struct.pack(">i", len(token)) + token)


def test_unauthenticated_connection_gets_only_api_versions(sasl_broker):
    with WireClient(sasl_broker.bootstrap) as c:
        av = c.request(18, 3, {"client_software_name": "probe", "client_software_version": "1"})
        keys = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in av.api_keys}
        assert int(av.error_code) == 0 and keys[17] == (0, 1) and keys[36] == (0, 2)
        with pytest.raises(OperationError):
            c.request(3, 12, {"topics": None})  # Metadata before authentication: connection closed
    with WireClient(sasl_broker.bootstrap) as c:  # a client that skips ApiVersions is refused the same way
        with pytest.raises(OperationError):
            c.request(19, 7, {"topics": [{"name": "sneaky", "num_partitions": 1, "replication_factor": 1}]})
    a = AdminClient({"bootstrap.servers": sasl_broker.bootstrap, "log_level": 0})
    with pytest.raises(KafkaException):
        a.list_topics(timeout=3)


def test_pre_auth_frames_are_size_limited(sasl_broker):
    with WireClient(sasl_broker.bootstrap) as c:
        c.send_raw(struct.pack(">i", 600_000) + b"\0" * 1024)
        assert _closed(c)


def test_handshake_v1_and_authenticate_then_full_service(sasl_broker):
    with WireClient(sasl_broker.bootstrap) as c:
        hs = c.request(17, 1, {"mechanism": "PLAIN"})
        assert int(hs.error_code) == 0 and list(hs.mechanisms) == ["PLAIN"]
        auth = c.request(36, 2, {"auth_bytes": b"\0alice\0" + USERS["alice"].encode()})
        assert int(auth.error_code) == 0 and auth.error_message is None
        md = c.request(3, 12, {"topics": None, "allow_auto_topic_creation": False})
        assert [int(b.node_id) for b in md.brokers] == [1]
        again = c.request(17, 1, {"mechanism": "PLAIN"})  # no re-authentication: refused, not closed
        assert int(again.error_code) == ILLEGAL_SASL_STATE
        assert int(c.request(18, 0, {}).error_code) == 0


def test_authenticate_failure_answers_58_then_closes(sasl_broker):
    with WireClient(sasl_broker.bootstrap) as c:
        c.request(17, 1, {"mechanism": "PLAIN"})
        started = time.monotonic()
        auth = c.request(36, 1, {"auth_bytes": b"\0alice\0wrong"})
        assert int(auth.error_code) == SASL_AUTHENTICATION_FAILED
        assert auth.error_message == INVALID_CREDENTIALS
        assert time.monotonic() - started >= 0.1  # connection.failed.authentication.delay.ms
        assert _closed(c)


def test_handshake_v0_takes_an_unframed_token(sasl_broker):
    with WireClient(sasl_broker.bootstrap) as c:
        assert int(c.request(17, 0, {"mechanism": "PLAIN"}).error_code) == 0
        _raw_token(c, b"\0ops\0" + USERS["ops"].encode())
        assert c._recv_exact(c.connect(), 4) == b"\0\0\0\0"  # empty size-prefixed challenge: success
        assert [int(b.node_id) for b in c.request(3, 1, {"topics": None}).brokers] == [1]
    with WireClient(sasl_broker.bootstrap) as c:
        c.request(17, 0, {"mechanism": "PLAIN"})
        _raw_token(c, b"\0ops\0nope")
        assert _closed(c)  # Kafka sends nothing back on a failed unframed exchange


@pytest.mark.parametrize("steps, expected", [
    ([(17, 1, {"mechanism": "SCRAM-SHA-512"})], UNSUPPORTED_SASL_MECHANISM),
    ([(36, 2, {"auth_bytes": b"\0alice\0alice-Secret-1"})], ILLEGAL_SASL_STATE),  # no handshake first
    ([(17, 1, {"mechanism": "PLAIN"}), (17, 1, {"mechanism": "PLAIN"})], ILLEGAL_SASL_STATE),
    ([(17, 0, {"mechanism": "PLAIN"})], None),  # then a framed SaslAuthenticate is not the raw token
])
def test_out_of_order_exchanges_are_refused_and_closed(sasl_broker, steps, expected):
    with WireClient(sasl_broker.bootstrap) as c:
        for key, version, body in steps[:-1]:
            assert int(c.request(key, version, body).error_code) == 0
        key, version, body = steps[-1]
        resp = c.request(key, version, body)
        if expected is None:
            assert int(resp.error_code) == 0
            with pytest.raises(OperationError):  # the request frame is taken as a (bad) PLAIN token
                c.request(36, 1, {"auth_bytes": b"\0alice\0" + USERS["alice"].encode()})
            return
        assert int(resp.error_code) == expected
        if expected == UNSUPPORTED_SASL_MECHANISM:
            assert list(resp.mechanisms) == ["PLAIN"]
        assert _closed(c)


# --- real clients ---------------------------------------------------------------------------------


def test_confluent_kafka_produce_consume_admin_with_good_password(sasl_broker):
    conf = sasl_conf("alice", USERS["alice"])
    admin = AdminClient({"bootstrap.servers": sasl_broker.bootstrap, **conf})
    admin.create_topics([NewTopic("sasl-ck", 2, 1)])["sasl-ck"].result(30)
    assert "sasl-ck" in admin.list_topics(timeout=10).topics
    values = [f"m{i}".encode() for i in range(10)]
    produce(sasl_broker.bootstrap, "sasl-ck", values, partition=1, **conf)
    got = consume_all(sasl_broker.bootstrap, "sasl-ck", 10, group="sasl-ck-g", **conf)
    assert [m.value() for m in got] == values


def test_confluent_kafka_bad_password_is_an_authentication_error(sasl_broker):
    errors: list[KafkaError] = []
    admin = AdminClient({"bootstrap.servers": sasl_broker.bootstrap, **sasl_conf("alice", "guess"),
                         "error_cb": errors.append, "log_level": 0})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    admin.poll(1)
    auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    assert auth and "Invalid username or password" in auth[0].str()


def test_kafka_python_good_and_bad_password(sasl_broker, caplog):
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic as KpNewTopic

    conf = dict(bootstrap_servers=sasl_broker.bootstrap, security_protocol="SASL_PLAINTEXT",
                sasl_mechanism="PLAIN", sasl_plain_username="ops", sasl_plain_password=USERS["ops"])
    admin = KafkaAdminClient(**conf)
    try:
        admin.create_topics([KpNewTopic("sasl-kp", 1, 1)])
        assert "sasl-kp" in admin.list_topics()
    finally:
        admin.close()
    producer = KafkaProducer(**conf)
    producer.send("sasl-kp", b"from-kafka-python").get(30)
    producer.close()
    consumer = KafkaConsumer("sasl-kp", auto_offset_reset="earliest", consumer_timeout_ms=20000, **conf)
    assert next(consumer).value == b"from-kafka-python"
    consumer.close()

    caplog.set_level("ERROR", logger="kafka")
    with pytest.raises(Exception):
        KafkaAdminClient(**dict(conf, sasl_plain_password="wrong"), bootstrap_timeout_ms=3000)
    assert "SaslAuthenticationFailedError" in caplog.text and "Invalid username or password" in caplog.text


def _frame(api_key: int, version: int, body: bytes) -> bytes:
    header = struct.pack(">hhih", api_key, version, 1, 3) + b"raw" + (b"\x00" if version >= 2 else b"")
    return struct.pack(">i", len(header) + len(body)) + header + body


def _read_frame(sock: socket.socket) -> bytes:
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
        chunk = sock.recv(4096)
        assert chunk, f"connection closed after {len(data)} bytes"
        data += chunk
    return data[4:]


def test_refused_client_reads_the_error_before_the_broker_closes(sasl_broker):
    """After a failed SaslAuthenticate the broker lets the client close first (for up to
    REFUSED_LINGER_S): kafka-python 3.0 drops a response that arrives together with the FIN and
    reports a bare disconnect, hiding "Invalid username or password" from the operator."""
    host, port = sasl_broker.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(_frame(17, 1, struct.pack(">h", 5) + b"PLAIN"))
        _read_frame(sock)
        token = b"ops\x00ops\x00wrong"
        sock.sendall(_frame(36, 2, bytes([len(token) + 1]) + token + b"\x00"))  # v2: compact bytes, no tags
        assert b"Invalid username or password" in _read_frame(sock)
        sock.settimeout(0.3)
        with pytest.raises(socket.timeout):
            sock.recv(1)  # no FIN right behind the answer
        sock.settimeout(10)
        started = time.monotonic()
        assert sock.recv(1) == b""  # the broker still closes a client that keeps the connection
        assert time.monotonic() - started < 3


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_with_an_older_librdkafka(sasl_broker):
    base = ["kcat", "-b", sasl_broker.bootstrap, "-X", "security.protocol=SASL_PLAINTEXT",
            "-X", "sasl.mechanism=PLAIN", "-X", "sasl.username=alice", "-m", "5"]
    ok = subprocess.run(base + ["-X", f"sasl.password={USERS['alice']}", "-L"], capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and "broker 1 at" in ok.stdout, ok.stderr
    bad = subprocess.run(base + ["-X", "sasl.password=nope", "-L"], capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0 and "Invalid username or password" in bad.stderr


def test_users_added_and_deleted_while_running_take_effect(sasl_broker, cli_env):
    users = str(sasl_broker.users_file)
    added = run_kcli(cli_env, "broker", "users", "add", "late", "--users-file", users, "--password-stdin",
                     input="late-pw\n")
    assert added.returncode == 0, added.stderr
    with WireClient(sasl_broker.bootstrap) as c:
        c.request(17, 1, {"mechanism": "PLAIN"})
        assert int(c.request(36, 2, {"auth_bytes": b"\0late\0late-pw"}).error_code) == 0
    assert run_kcli(cli_env, "broker", "users", "delete", "late", "--users-file", users).returncode == 0
    with WireClient(sasl_broker.bootstrap) as c:
        c.request(17, 1, {"mechanism": "PLAIN"})
        assert int(c.request(36, 2, {"auth_bytes": b"\0late\0late-pw"}).error_code) == SASL_AUTHENTICATION_FAILED


# --- kcli contexts carry the credentials ------------------------------------------------------------


def _contexts_file(path: Path, bootstrap: str, password: str) -> None:
    path.write_text(
        "current-context: secure\n"
        "contexts:\n"
        "  secure:\n"
        f"    bootstrap-servers: \"{bootstrap}\"\n"
        "    properties:\n"
        "      security.protocol: SASL_PLAINTEXT\n"
        "      sasl.mechanism: PLAIN\n"
        "      sasl.username: alice\n"
        f"      sasl.password: \"{password}\"\n"
    )


def test_kcli_context_with_sasl_properties(sasl_broker, cli_env, tmp_path):
    admin = AdminClient({"bootstrap.servers": sasl_broker.bootstrap, **sasl_conf("alice", USERS["alice"])})
    admin.create_topics([NewTopic("sasl-ctx", 1, 1)])["sasl-ctx"].result(30)  # admin stays alive meanwhile
    _contexts_file(Path(cli_env["KCLI_CONFIG"]), sasl_broker.bootstrap, USERS["alice"])
    ok = run_kcli(cli_env, "--context", "secure", "topics", "list")
    assert ok.returncode == 0, ok.stderr
    assert "sasl-ctx" in ok.stdout.split()

    _contexts_file(Path(cli_env["KCLI_CONFIG"]), sasl_broker.bootstrap, "not-the-password")
    bad = run_kcli(cli_env, "--context", "secure", "topics", "list")
    assert_one_line_error(bad, 1, "SASL_AUTHENTICATION_FAILED")


# --- the non-loopback warning -----------------------------------------------------------------------


def test_non_loopback_listener_warns_without_sasl_only(broker_factory, tmp_path):
    plain = broker_factory(name="open", extra_args=["--listen", "0.0.0.0:0"])
    assert "warning: listening on non-loopback address 0.0.0.0 without authentication" in plain.log_text()
    with WireClient(f"127.0.0.1:{plain.port}") as c:  # a plaintext listener refuses SASL, stays open
        assert int(c.request(17, 1, {"mechanism": "PLAIN"}).error_code) == ILLEGAL_SASL_STATE
        assert int(c.request(18, 0, {}).error_code) == 0

    users = tmp_path / "users"
    write_users(users, {"alice": "x"})
    secured = broker_factory(name="secured", extra_args=["--listen", "SASL_PLAINTEXT://0.0.0.0:0"],
                             configs={"sasl.enabled.mechanisms": "PLAIN", "sasl.plain.users.file": str(users)})
    assert secured.alive()
    assert "warning" not in secured.log_text()
