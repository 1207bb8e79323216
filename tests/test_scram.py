"""SASL/SCRAM-SHA-256/-512: the RFC computation, the metadata records, the wire exchange, the
Describe/AlterUserScramCredentials APIs, real clients (confluent-kafka, kafka-python, kcat),
`kcli users`, restarts and a two-broker cluster over PostgreSQL."""

from __future__ import annotations

import base64
import secrets
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic, ScramCredentialInfo, UserScramCredentialUpsertion
from confluent_kafka.admin import ScramMechanism as CkScramMechanism

from kcli.metadata.metadata_log import InvalidRecordError, MetadataLog, record
from kcli.security.sasl import UsersFile, hash_password
from kcli.security.scram import (
    MECHANISMS,
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    ScramAuthenticationFailed,
    ScramCredential,
    ScramServer,
)
from kcli.protocol.client import WireClient
from tests.brokerproc import BrokerProcess
from tests.fixtures_cli import assert_one_line_error, cli_env, run_kcli  # noqa: F401 - fixture
from tests.fixtures_pg import pg_database, pg_server  # noqa: F401 - fixtures
from tests.kafka_helpers import consume_all, produce

SASL_AUTHENTICATION_FAILED = 58
RESOURCE_NOT_FOUND, DUPLICATE_RESOURCE, UNACCEPTABLE_CREDENTIAL, UNSUPPORTED_SASL_MECHANISM = 91, 92, 93, 33
GENERIC = "Authentication failed during authentication due to invalid credentials with SASL mechanism {}"
ADMIN = ("admin", "admin-pw")  # the PLAIN user that creates the SCRAM users
DELAY_MS = 300
SASL_CONFIGS = {"sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
                "connection.failed.authentication.delay.ms": str(DELAY_MS),
                "group.initial.rebalance.delay.ms": "0"}
_CK = {"SCRAM-SHA-256": CkScramMechanism.SCRAM_SHA_256, "SCRAM-SHA-512": CkScramMechanism.SCRAM_SHA_512}


def sasl_conf(mechanism: str, user: str, password: str) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": password}


def sasl_broker_configs(root: Path) -> dict[str, str]:
    users = root / "plain-users"
    f = UsersFile.read(users, missing_ok=True)
    f.set(ADMIN[0], hash_password(ADMIN[1], "pbkdf2-sha256"))
    f.write()
    return {**SASL_CONFIGS, "sasl.plain.users.file": str(users)}


def plain_admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **sasl_conf("PLAIN", *ADMIN)})


def set_scram(bootstrap: str, user: str, password: str, mechanism: str, iterations: int = 4096,
              admin_conf: dict[str, str] | None = None) -> None:
    """As an operator's admin client does: librdkafka salts the password and sends the salted form."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(admin_conf if admin_conf is not None else sasl_conf("PLAIN", *ADMIN))})
    upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(_CK[mechanism], iterations), password.encode())
    admin.alter_user_scram_credentials([upsert])[user].result(15)


@pytest.fixture(scope="module")
def scram_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("scram")
    b = BrokerProcess(root / "data", sasl_broker_configs(root)).start()
    yield b
    b.stop()


# --- a SCRAM client over raw frames (to drive the exchange step by step) -----------------------------


class ScramClient:
    """RFC 5802 client side over WireClient: SaslHandshake v1 + SaslAuthenticate v2."""

    def __init__(self, wire: WireClient, mechanism: str, user: str, password: str) -> None:
        self.wire, self.mechanism, self.user, self.password = wire, MECHANISMS[mechanism], user, password
        self.nonce = base64.b64encode(secrets.token_bytes(18)).decode().replace("=", "")

    def first(self, extensions: str = "", gs2: str = "n,,") -> tuple[int, str, bytes]:
        assert int(self.wire.request(17, 1, {"mechanism": self.mechanism.name}).error_code) == 0
        self.gs2 = gs2
        self.bare = f"n={self.user},r={self.nonce}{extensions}"
        return self._send((gs2 + self.bare).encode())

    def final(self, server_first: bytes, *, nonce_prefix: str = "", nonce_suffix: str = "",
              password: str | None = None) -> tuple[int, str, bytes]:
        attrs = dict(a.split("=", 1) for a in server_first.decode().split(","))
        salt, iterations = base64.b64decode(attrs["s"]), int(attrs["i"])
        m = self.mechanism
        salted = m.salted_password(password if password is not None else self.password, salt, iterations)
        without_proof = f"c={base64.b64encode(self.gs2.encode()).decode()},r={nonce_prefix}{attrs['r']}{nonce_suffix}"
        auth_message = f"{self.bare},{server_first.decode()},{without_proof}".encode()
        client_key = m.client_key(salted)
        signature = m.hmac(m.hash(client_key), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        code, message, server_final = self._send(f"{without_proof},p={base64.b64encode(proof).decode()}".encode())
        if code == 0:
            expected = m.hmac(m.server_key(salted), auth_message)
            assert server_final == b"v=" + base64.b64encode(expected)  # the broker proves it knows the key
        return code, message, server_final

    def _send(self, token: bytes) -> tuple[int, str, bytes]:
        resp = self.wire.request(36, 2, {"auth_bytes": token})
        return int(resp.error_code), resp.error_message or "", bytes(resp.auth_bytes)

    def login(self) -> None:
        code, message, server_first = self.first()
        assert code == 0, message
        code, message, _ = self.final(server_first)
        assert code == 0, message


# --- the computation and the records (no broker) ---------------------------------------------------


def test_rfc7677_scram_sha256_test_vector():
    """RFC 7677 section 3: user 'user', password 'pencil', 4096 iterations, fixed nonces."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    cred = ScramCredential.from_password(SCRAM_SHA_256, "pencil", 4096, salt=salt)
    server = ScramServer(SCRAM_SHA_256, lambda name, mech: cred if name == "user" else None,
                         server_nonce=lambda: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    server_first = server.evaluate(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert server_first == b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    server_final = server.evaluate(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                                   b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert server_final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.complete and server.username == "user"

    wrong = ScramServer(SCRAM_SHA_256, lambda name, mech: cred, server_nonce=lambda: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    wrong.evaluate(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    with pytest.raises(ScramAuthenticationFailed) as err:  # one bit of the proof flipped
        wrong.evaluate(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                       b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVM=")
    assert str(err.value) == GENERIC.format("SCRAM-SHA-256") and err.value.reason == "Invalid client credentials"


def test_scram_records_are_validated_before_they_are_written(tmp_path):
    log = MetadataLog(tmp_path)
    log.open()
    log.append([record("ClusterIdRecord", clusterId="c1")])
    good = ScramCredential.from_password(SCRAM_SHA_512, "pw", 8192).record_data("alice", SCRAM_SHA_512)
    bad = {
        "too few iterations": dict(good, iterations=1000),
        "too many iterations": dict(good, iterations=16385),
        "unknown mechanism": dict(good, mechanism=3),
        "key of the wrong size": dict(good, storedKey=base64.b64encode(b"x" * 32).decode()),
        "not base64": dict(good, salt="%%%"),
        "empty name": dict(good, name=""),
        "missing field": {k: v for k, v in good.items() if k != "serverKey"},
    }
    size = log.path.stat().st_size
    for why, data in bad.items():
        with pytest.raises(InvalidRecordError):
            log.append([record("ClusterIdRecord", clusterId="c1"), record("UserScramCredentialRecord", **data)])
        assert log.path.stat().st_size == size, why  # nothing written, not even the good record before it
    with pytest.raises(InvalidRecordError):
        log.append([record("RemoveUserScramCredentialRecord", name="alice", mechanism=7)])
    assert log.state.scram_credentials == {}

    log.append([record("UserScramCredentialRecord", **good)])
    log.close()
    again = MetadataLog(tmp_path)
    again.open()  # replayed from the file
    assert again.state.scram_credential("alice", SCRAM_SHA_512.type) == ScramCredential.from_record_data(good)
    again.append([record("RemoveUserScramCredentialRecord", name="alice", mechanism=2)])
    assert again.state.scram_credentials == {}
    again.close()


# --- the wire exchange ---------------------------------------------------------------------------


def test_handshake_lists_enabled_mechanisms_and_api_versions_lists_scram_apis(scram_broker):
    with WireClient(scram_broker.bootstrap) as c:
        keys = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in c.request(18, 0, {}).api_keys}
        assert keys[50] == (0, 0) and keys[51] == (0, 0)
        resp = c.request(17, 1, {"mechanism": "SCRAM-SHA-512"})
        assert int(resp.error_code) == 0
        assert list(resp.mechanisms) == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_wire_exchange_then_full_service(scram_broker, mechanism):
    set_scram(scram_broker.bootstrap, f"wire-{mechanism}", "s3cret", mechanism)
    with WireClient(scram_broker.bootstrap) as c:
        ScramClient(c, mechanism, f"wire-{mechanism}", "s3cret").login()
        assert int(c.request(18, 0, {}).error_code) == 0
        assert c.request(3, 1, {"topics": []}).brokers  # Metadata: served after authentication
    with WireClient(scram_broker.bootstrap) as c:
        # librdkafka < 2.6.1 (kcat here) repeats its own nonce before the server's: accepted as Kafka 3.9 does
        client = ScramClient(c, mechanism, f"wire-{mechanism}", "s3cret")
        _, _, server_first = client.first()
        assert client.final(server_first, nonce_prefix=client.nonce)[0] == 0


@pytest.mark.parametrize("case", ["wrong password", "unknown user", "other mechanism only", "bad nonce",
                                  "foreign nonce prefix", "tokenauth", "channel binding"])
def test_refusals_are_sasl_authentication_failed_with_kafkas_message(scram_broker, case):
    set_scram(scram_broker.bootstrap, "refused", "right", "SCRAM-SHA-256")
    user = {"unknown user": "nobody"}.get(case, "refused")
    mechanism = "SCRAM-SHA-512" if case == "other mechanism only" else "SCRAM-SHA-256"
    with WireClient(scram_broker.bootstrap) as c:
        client = ScramClient(c, mechanism, user, "right")
        started = time.monotonic()
        code, message, server_first = client.first(",tokenauth=true" if case == "tokenauth" else "",
                                                   gs2="n,a=refused," if case == "channel binding" else "n,,")
        if case in ("wrong password", "bad nonce", "foreign nonce prefix", "channel binding"):
            assert code == 0, message
            if case == "channel binding":
                client.gs2 = "n,,"  # c= no longer repeats the gs2 header the client sent
            code, message, _ = client.final(server_first, password="wrong" if case == "wrong password" else None,
                                            nonce_suffix="x" if case == "bad nonce" else "",
                                            nonce_prefix="zz" if case == "foreign nonce prefix" else "")
        assert (code, message) == (SASL_AUTHENTICATION_FAILED, GENERIC.format(mechanism))
        assert time.monotonic() - started >= DELAY_MS / 1000 * 0.9  # connection.failed.authentication.delay.ms
        c.close()


def test_handshake_v0_carries_scram_in_bare_frames(scram_broker):
    set_scram(scram_broker.bootstrap, "raw", "raw-pw", "SCRAM-SHA-512")
    host, port = scram_broker.bootstrap.rsplit(":", 1)
    m = SCRAM_SHA_512
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        name = b"SCRAM-SHA-512"
        header = struct.pack(">hhih", 17, 0, 1, 3) + b"raw"
        body = header + struct.pack(">h", len(name)) + name
        sock.sendall(struct.pack(">i", len(body)) + body)
        _read_frame(sock)
        bare = "n=raw,r=abcdef"
        sock.sendall(_sized(f"n,,{bare}".encode()))
        server_first = _read_frame(sock)
        attrs = dict(a.split("=", 1) for a in server_first.decode().split(","))
        assert attrs["r"].startswith("abcdef") and int(attrs["i"]) == 4096
        salted = m.salted_password("raw-pw", base64.b64decode(attrs["s"]), 4096)
        without_proof = f"c=biws,r={attrs['r']}"
        auth = f"{bare},{server_first.decode()},{without_proof}".encode()
        proof = bytes(a ^ b for a, b in zip(m.client_key(salted), m.hmac(m.hash(m.client_key(salted)), auth)))
        sock.sendall(_sized(f"{without_proof},p={base64.b64encode(proof).decode()}".encode()))
        assert _read_frame(sock) == b"v=" + base64.b64encode(m.hmac(m.server_key(salted), auth))
        api_versions = struct.pack(">hhih", 18, 0, 2, 3) + b"raw"
        sock.sendall(_sized(api_versions))
        assert struct.unpack(">ih", _read_frame(sock)[:6]) == (2, 0)  # correlation id, no error: authenticated


def _sized(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def _read_frame(sock: socket.socket) -> bytes:
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
        chunk = sock.recv(4096)
        assert chunk, f"connection closed after {len(data)} bytes"
        data += chunk
    return data[4:]


# --- Describe/AlterUserScramCredentials ---------------------------------------------------------------


def test_alter_then_describe_with_kafkas_per_user_errors(scram_broker):
    set_scram(scram_broker.bootstrap, "api-admin", "api-pw", "SCRAM-SHA-256")
    salt, salted = b"0123456789abcdef", SCRAM_SHA_512.salted_password("pw", b"0123456789abcdef", 8192)

    def up(name: str, mechanism: int = 2, iterations: int = 8192, salt: bytes = salt) -> dict:
        return {"name": name, "mechanism": mechanism, "iterations": iterations, "salt": salt, "salted_password": salted}

    with WireClient(scram_broker.bootstrap) as c:
        ScramClient(c, "SCRAM-SHA-256", "api-admin", "api-pw").login()
        resp = c.request(51, 0, {
            "deletions": [{"name": "ghost", "mechanism": 1}, {"name": "mixed", "mechanism": 1}],
            "upsertions": [up("good"), up("few", iterations=4095), up("many", iterations=16385),
                           up("weird", mechanism=3), up(""), up("dup"), up("dup"), up("mixed"), up("nosalt", salt=b"")],
        })
        got = {r.user: (int(r.error_code), r.error_message) for r in resp.results}
        assert got == {
            "good": (0, None),
            "ghost": (RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist"),
            "mixed": (RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist"),
            "few": (UNACCEPTABLE_CREDENTIAL, "Too few iterations"),
            "many": (UNACCEPTABLE_CREDENTIAL, "Too many iterations"),
            "weird": (UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"),
            "": (UNACCEPTABLE_CREDENTIAL, "Username must not be empty"),
            "dup": (DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request"),
            "nosalt": (UNACCEPTABLE_CREDENTIAL, "Salt must not be empty"),
        }
        resp = c.request(50, 0, {"users": [{"name": "good"}, {"name": "few"}, {"name": "twice"}, {"name": "twice"}]})
        got = {r.user: (int(r.error_code), r.error_message, [(int(i.mechanism), int(i.iterations)) for i in r.credential_infos])
               for r in resp.results}
        assert got == {
            "good": (0, None, [(2, 8192)]),
            "few": (RESOURCE_NOT_FOUND, "Attempt to describe a user credential that does not exist: few", []),
            "twice": (DUPLICATE_RESOURCE, "Cannot describe SCRAM credentials for the same user twice in a single request: twice", []),
        }
        everyone = {r.user for r in c.request(50, 0, {"users": None}).results}
        assert {"good", "api-admin"} <= everyone and "few" not in everyone
    with WireClient(scram_broker.bootstrap) as c:  # the salted password the request carried logs in
        ScramClient(c, "SCRAM-SHA-512", "good", "pw").login()
        resp = c.request(51, 0, {"deletions": [{"name": "good", "mechanism": 2}]})
        assert [(r.user, int(r.error_code)) for r in resp.results] == [("good", 0)]
    with WireClient(scram_broker.bootstrap) as c:
        assert ScramClient(c, "SCRAM-SHA-512", "good", "pw").first()[0] == SASL_AUTHENTICATION_FAILED


# --- real clients ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_confluent_kafka_produce_consume_with_scram(scram_broker, mechanism):
    user = f"ck-{mechanism.lower()}"
    set_scram(scram_broker.bootstrap, user, "ck pass ü", mechanism, iterations=8192)
    conf = sasl_conf(mechanism, user, "ck pass ü")
    topic = f"scram-ck-{mechanism[-3:]}"
    admin = AdminClient({"bootstrap.servers": scram_broker.bootstrap, **conf})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    described = admin.describe_user_scram_credentials([user])[user].result(15)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == [(_CK[mechanism], 8192)]
    values = [f"m{i}".encode() for i in range(10)]
    produce(scram_broker.bootstrap, topic, values, **conf)
    got = consume_all(scram_broker.bootstrap, topic, 10, group=f"{topic}-g", **conf)
    assert [m.value() for m in got] == values


def test_confluent_kafka_wrong_password_is_refused(scram_broker):
    set_scram(scram_broker.bootstrap, "ck-bad", "right", "SCRAM-SHA-512")
    errors: list[KafkaError] = []
    admin = AdminClient({"bootstrap.servers": scram_broker.bootstrap, **sasl_conf("SCRAM-SHA-512", "ck-bad", "wrong"),
                         "error_cb": errors.append, "log_level": 0})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    admin.poll(1)
    auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    assert auth and GENERIC.format("SCRAM-SHA-512") in auth[0].str()


def test_kafka_python_scram_good_and_bad_password(scram_broker, caplog):
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic as KpNewTopic

    set_scram(scram_broker.bootstrap, "kp", "kp-pw", "SCRAM-SHA-512")
    conf = dict(bootstrap_servers=scram_broker.bootstrap, security_protocol="SASL_PLAINTEXT",
                sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="kp", sasl_plain_password="kp-pw")
    admin = KafkaAdminClient(**conf)
    try:
        admin.create_topics([KpNewTopic("scram-kp", 1, 1)])
    finally:
        admin.close()
    producer = KafkaProducer(**conf)
    producer.send("scram-kp", b"from-kafka-python").get(30)
    producer.close()
    consumer = KafkaConsumer("scram-kp", auto_offset_reset="earliest", consumer_timeout_ms=20000, **conf)
    assert next(consumer).value == b"from-kafka-python"
    consumer.close()

    caplog.set_level("ERROR", logger="kafka")
    with pytest.raises(Exception):
        KafkaAdminClient(**dict(conf, sasl_plain_password="wrong"), bootstrap_timeout_ms=3000)
    assert "SaslAuthenticationFailedError" in caplog.text and GENERIC.format("SCRAM-SHA-512") in caplog.text


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_with_scram(scram_broker):
    set_scram(scram_broker.bootstrap, "kc", "kc-pw", "SCRAM-SHA-256")
    base = ["kcat", "-b", scram_broker.bootstrap, "-X", "security.protocol=SASL_PLAINTEXT",
            "-X", "sasl.mechanism=SCRAM-SHA-256", "-X", "sasl.username=kc", "-m", "5"]
    ok = subprocess.run(base + ["-X", "sasl.password=kc-pw", "-L"], capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0 and "broker 1 at" in ok.stdout, ok.stderr
    bad = subprocess.run(base + ["-X", "sasl.password=nope", "-L"], capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0 and GENERIC.format("SCRAM-SHA-256") in bad.stderr


# --- kcli users ---------------------------------------------------------------------------------------


def test_kcli_users_set_list_delete(scram_broker, cli_env):
    Path(cli_env["KCLI_CONFIG"]).write_text(
        "current-context: secure\ncontexts:\n  secure:\n"
        f"    bootstrap-servers: \"{scram_broker.bootstrap}\"\n"
        "    properties:\n      security.protocol: SASL_PLAINTEXT\n      sasl.mechanism: PLAIN\n"
        f"      sasl.username: {ADMIN[0]}\n      sasl.password: {ADMIN[1]}\n")
    ok = run_kcli(cli_env, "users", "set", "carol", "--mechanism", "SCRAM-SHA-512", "--iterations", "8192",
                  "--password-stdin", input="carol pw\n")
    assert ok.returncode == 0 and "carol" in ok.stdout, ok.stderr
    assert run_kcli(cli_env, "users", "set", "carol", "--mechanism", "scram-sha-256", "--password-stdin",
                    input="carol pw\n").returncode == 0
    listed = run_kcli(cli_env, "users", "list", "carol", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert '"mechanism": "SCRAM-SHA-256"' in listed.stdout and '"iterations": 8192' in listed.stdout
    assert "carol pw" not in listed.stdout
    table = run_kcli(cli_env, "users", "list")
    assert any(line.split() == ["carol", "SCRAM-SHA-512", "8192"] for line in table.stdout.splitlines()), table.stdout
    with WireClient(scram_broker.bootstrap) as c:
        ScramClient(c, "SCRAM-SHA-512", "carol", "carol pw").login()

    assert_one_line_error(run_kcli(cli_env, "users", "set", "carol", "--iterations", "100", "--password-stdin",
                                   input="x\n"), 1, "UNACCEPTABLE_CREDENTIAL", "Too few iterations")
    assert_one_line_error(run_kcli(cli_env, "users", "set", "carol", "--mechanism", "MD5", "--password-stdin",
                                   input="x\n"), 2, "--mechanism must be one of")
    assert_one_line_error(run_kcli(cli_env, "users", "set", "carol", input=b""), 2, "--password-stdin")
    gone = run_kcli(cli_env, "users", "delete", "carol")
    assert gone.returncode == 0 and "SCRAM-SHA-256, SCRAM-SHA-512" in gone.stdout, gone.stderr
    assert_one_line_error(run_kcli(cli_env, "users", "list", "carol"), 1, "RESOURCE_NOT_FOUND")
    assert_one_line_error(run_kcli(cli_env, "users", "delete", "carol", "--mechanism", "SCRAM-SHA-256"), 1,
                          "RESOURCE_NOT_FOUND")
    with WireClient(scram_broker.bootstrap) as c:
        code, _, _ = ScramClient(c, "SCRAM-SHA-512", "carol", "carol pw").first()
        assert code == SASL_AUTHENTICATION_FAILED


# --- persistence: restart, cluster --------------------------------------------------------------------


def test_credentials_survive_a_restart_and_scram_only_needs_no_users_file(broker_factory, tmp_path):
    b = broker_factory(sasl_broker_configs(tmp_path))
    set_scram(b.bootstrap, "keep", "keep-pw", "SCRAM-SHA-256")
    b.stop()
    b.configs = {k: v for k, v in b.configs.items() if k != "sasl.plain.users.file"}
    b.configs["sasl.enabled.mechanisms"] = "SCRAM-SHA-256"  # SCRAM only: no PLAIN users file at all
    b.start()
    with WireClient(b.bootstrap) as c:
        assert list(c.request(17, 1, {"mechanism": "PLAIN"}).mechanisms) == ["SCRAM-SHA-256"]
    with WireClient(b.bootstrap) as c:
        ScramClient(c, "SCRAM-SHA-256", "keep", "keep-pw").login()
    admin = AdminClient({"bootstrap.servers": b.bootstrap, **sasl_conf("SCRAM-SHA-256", "keep", "keep-pw")})
    assert admin.list_topics(timeout=10).brokers  # confluent-kafka logs in too


def test_credentials_set_on_one_cluster_broker_log_in_on_another(broker_factory, tmp_path, pg_database):  # noqa: F811
    configs = sasl_broker_configs(tmp_path)
    fast = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500"}
    b1 = broker_factory({**configs, **fast}, name="node1", extra_args=["--cluster", pg_database, "--node-id", "1"])
    b2 = broker_factory({**configs, **fast}, name="node2", extra_args=["--cluster", pg_database, "--node-id", "2"])
    set_scram(b1.bootstrap, "shared", "shared-pw", "SCRAM-SHA-512")
    deadline = time.monotonic() + 20
    while True:  # broker 2 learns the record from PostgreSQL (NOTIFY, else its poll)
        with WireClient(b2.bootstrap) as c:
            client = ScramClient(c, "SCRAM-SHA-512", "shared", "shared-pw")
            code, message, server_first = client.first()
            if code == 0:
                assert client.final(server_first)[0] == 0
                break
        assert time.monotonic() < deadline, message
        time.sleep(0.3)
