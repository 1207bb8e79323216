"""TLS listeners, several listeners at once, and kcli's own client speaking what the broker speaks.

One broker with PLAINTEXT, SSL, SASL_SSL and an mTLS listener (``MTLS`` mapped to SSL, with
listener-prefixed ``ssl.client.auth=required``), a CA and certificates made in a temp dir;
confluent-kafka, kafka-python and kcat as clients, and every kind of kcli command (including
kcli's own DeletePartitions and admin API requests) through a context per listener.
"""

from __future__ import annotations

import json
import shutil
import ssl
import stat
import subprocess
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

from kcli.config.broker_config import BrokerConfig
from kcli.config.definitions import ConfigError
from kcli.broker.listeners import parse_listeners, server_ssl_context
from kcli.cli.common import GlobalOptions
from kcli.contexts import validate_bootstrap
from kcli.errors import KafkaApiError, OperationError, UsageError
from kcli.ops.connection import Connection, resolve
from kcli.protocol.client import WireClient
from tests.brokerproc import BrokerProcess
from tests.certs import KEY_PASSWORD, Certs, make_certs
from tests.fixtures_cli import assert_one_line_error, cli_env, run_kcli, unique_topic  # noqa: F401 - fixture
from tests.fixtures_pg import pg_database, pg_server  # noqa: F401 - fixtures
from tests.kafka_helpers import consume_all, produce
from tests.test_sasl import write_users

PLAIN_USER = ("alice", "alice-pw")
SCRAM_USERS = {"SCRAM-SHA-256": ("sam", "sam-pw-256"), "SCRAM-SHA-512": ("sue", "sue-pw-512")}
LISTENERS = "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0,MTLS://localhost:0"


@dataclass
class TlsBroker:
    proc: BrokerProcess
    certs: Certs

    def address(self, listener: str) -> str:
        return self.proc.listeners[listener]


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    root = tmp_path_factory.mktemp("tls")
    certs = make_certs(root / "certs")
    users = root / "users"
    write_users(users, dict([PLAIN_USER]), "pbkdf2-sha256")
    configs = {
        "listeners": LISTENERS,
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL,MTLS:SSL",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "sasl.plain.users.file": str(users),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(certs.server),
        # the mTLS listener: its own (encrypted) key file, and client certificates required
        "listener.name.mtls.ssl.keystore.location": str(certs.encrypted_server),
        "listener.name.mtls.ssl.key.password": KEY_PASSWORD,
        "listener.name.mtls.ssl.client.auth": "required",
        "listener.name.mtls.ssl.truststore.location": str(certs.ca),
        "delete.topic.partition.enable": "true",
        "group.initial.rebalance.delay.ms": "0",
    }
    b = BrokerProcess(root / "data", configs).start()
    try:
        admin = AdminClient({"bootstrap.servers": b.listeners["PLAINTEXT"]})
        for mechanism, (user, password) in SCRAM_USERS.items():
            info = ScramCredentialInfo(getattr(ScramMechanism, mechanism.replace("-", "_")), 4096)
            admin.alter_user_scram_credentials([UserScramCredentialUpsertion(user, info, password.encode())])[user].result(15)
        yield TlsBroker(b, certs)
    finally:
        b.stop()


def client_props(b: TlsBroker, kind: str) -> dict[str, str]:
    """librdkafka properties for one way in: PLAINTEXT, SSL, MTLS, or SASL_SSL-<mechanism>."""
    ca = {"ssl.ca.location": str(b.certs.ca)}
    if kind == "PLAINTEXT":
        return {"security.protocol": "PLAINTEXT"}
    if kind == "SSL":
        return {"security.protocol": "SSL", **ca}
    if kind == "MTLS":
        return {"security.protocol": "SSL", **ca, "ssl.certificate.location": str(b.certs.client_cert),
                "ssl.key.location": str(b.certs.client_key)}
    mechanism = kind.split("-", 1)[1]
    user, password = PLAIN_USER if mechanism == "PLAIN" else SCRAM_USERS[mechanism]
    return {"security.protocol": "SASL_SSL", **ca, "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": password}


def listener_of(kind: str) -> str:
    return kind.split("-", 1)[0]


KINDS = ["PLAINTEXT", "SSL", "MTLS", "SASL_SSL-PLAIN", "SASL_SSL-SCRAM-SHA-256", "SASL_SSL-SCRAM-SHA-512"]


# --- the broker side ---------------------------------------------------------------------------------


def test_metadata_answers_with_the_listener_the_client_connected_to(tls_broker):
    for kind in KINDS:
        address = tls_broker.address(listener_of(kind))
        with WireClient(address, timeout=15, properties=client_props(tls_broker, kind)) as c:
            md = c.request(3, 12, {"topics": [], "allow_auto_topic_creation": False,
                                   "include_topic_authorized_operations": False})
            coordinator = c.request(10, 3, {"key": "g", "key_type": 0})
        assert [f"{b.host}:{b.port}" for b in md.brokers] == [address], kind
        assert f"{coordinator.host}:{coordinator.port}" == address, kind
    runtime = json.loads((tls_broker.proc.data_dir / "broker.json").read_text())
    assert f"{runtime['host']}:{runtime['port']}" == tls_broker.address("PLAINTEXT")
    assert runtime["listeners"] == [f"{name}://{tls_broker.address(name)}" for name in ("PLAINTEXT", "SSL", "SASL_SSL", "MTLS")]


def test_mtls_listener_requires_a_client_certificate(tls_broker):
    with pytest.raises(OperationError):  # handshake refused, or closed right after it
        with WireClient(tls_broker.address("MTLS"), timeout=15, properties=client_props(tls_broker, "SSL")) as c:
            c.request(18, 0, {})


def test_a_plaintext_client_on_a_tls_listener_is_closed_and_the_broker_serves_on(tls_broker):
    with pytest.raises(OperationError):
        with WireClient(tls_broker.address("SSL"), timeout=15) as c:
            c.request(18, 0, {})
    with WireClient(tls_broker.address("SSL"), timeout=15, properties=client_props(tls_broker, "SSL")) as c:
        assert c.request(18, 0, {}).error_code == 0


@pytest.mark.parametrize("kind", ["SSL", "MTLS", "SASL_SSL-PLAIN", "SASL_SSL-SCRAM-SHA-256", "SASL_SSL-SCRAM-SHA-512"])
def test_confluent_kafka_produces_and_consumes(tls_broker, kind):
    props = client_props(tls_broker, kind)
    address = tls_broker.address(listener_of(kind))
    topic = unique_topic("ck")
    produce(address, topic, [b"a", b"b", b"c"], **props)
    got = consume_all(address, topic, 3, **props)
    assert [m.value() for m in got] == [b"a", b"b", b"c"]


@pytest.mark.parametrize("kind", ["SSL", "SASL_SSL-PLAIN", "SASL_SSL-SCRAM-SHA-512"])
def test_kafka_python_produces_and_consumes(tls_broker, kind):
    from kafka import KafkaConsumer, KafkaProducer

    props = client_props(tls_broker, kind)
    conf = {"bootstrap_servers": tls_broker.address(listener_of(kind)), "security_protocol": props["security.protocol"],
            "ssl_cafile": props["ssl.ca.location"]}
    if "sasl.mechanism" in props:
        conf.update(sasl_mechanism=props["sasl.mechanism"], sasl_plain_username=props["sasl.username"],
                    sasl_plain_password=props["sasl.password"])
    topic = unique_topic("kp")
    producer = KafkaProducer(**conf)
    for v in (b"x", b"y"):
        producer.send(topic, v).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=10000, **conf)
    try:
        values = [m.value for m in consumer]
    finally:
        consumer.close()
    assert values == [b"x", b"y"]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is installed by the README test command")
def test_kcat_over_ssl_and_sasl_ssl(tls_broker):
    for kind in ("SSL", "SASL_SSL-SCRAM-SHA-256"):
        xs = [a for k, v in client_props(tls_broker, kind).items() for a in ("-X", f"{k}={v}")]
        bs = ["-b", tls_broker.address(listener_of(kind))]
        topic = unique_topic("kc")
        subprocess.run(["kcat", *bs, *xs, "-P", "-t", topic], input=b"one\ntwo\n", timeout=60, check=True)
        out = subprocess.run(["kcat", *bs, *xs, "-C", "-t", topic, "-o", "beginning", "-e", "-q"],
                             capture_output=True, timeout=60, check=True)
        assert out.stdout.split() == [b"one", b"two"], kind


# --- every kind of kcli command, through a context per way in -----------------------------------------


RUNBOOK = """
context: {context}
steps:
  - topics.create: {{topic: {topic}, partitions: 2}}
  - produce: {{topic: {topic}, records: [{{value: r1}}, {{value: r2}}], partition: 0}}
  - topics.alter: {{topic: {topic}, partitions: 1, yes: true}}
  - topics.describe: {{topic: {topic}}}
    expect: {{path: partition_count, equals: 1}}
  - diskless.describe: {{}}
"""


@pytest.mark.parametrize("kind", [k if k == "SASL_SSL-SCRAM-SHA-512" else pytest.param(k, marks=pytest.mark.slow)
                                  for k in KINDS])
def test_every_kind_of_kcli_command_through_a_context(tls_broker, cli_env, tmp_path, kind):  # noqa: F811
    props = client_props(tls_broker, kind)
    context = kind.lower()
    setting = [a for k, v in props.items() for a in ("--property", f"{k}={v}")]
    made = run_kcli(cli_env, "context", "set", context, "-b", tls_broker.address(listener_of(kind)), *setting)
    assert made.returncode == 0, made.stderr
    assert stat.S_IMODE(Path(cli_env["KCLI_CONFIG"]).stat().st_mode) == 0o600

    def kcli(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        done = run_kcli(cli_env, "--context", context, *args, input=input, timeout=120)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done

    topic, wal = unique_topic("cmd"), unique_topic("wal")
    kcli("topics", "create", "--topic", topic, "--partitions", "3")
    kcli("topics", "create", "--topic", wal, "--partitions", "1", "--config", "diskless.enable=true")
    kcli("produce", "--topic", topic, "--partition", "0", input="v1\nv2\n")
    kcli("produce", "--topic", wal, input="w1\nw2\nw3\n")
    consumed = kcli("consume", "--topic", topic, "--from-beginning", "--max-messages", "2", "--timeout-ms", "20000")
    assert consumed.stdout.split() == ["v1", "v2"]
    kcli("topics", "alter", "--topic", topic, "--config", "retention.ms=3600000")
    reduced = kcli("topics", "alter", "--topic", topic, "--partitions", "1", "--yes")  # kcli's DeletePartitions
    assert "Partitions 3 -> 1" in reduced.stdout
    described = json.loads(kcli("topics", "describe", "--topic", topic, "-o", "json").stdout)[0]
    assert described["partition_count"] == 1 and described["configs"]["retention.ms"] == "3600000"
    diskless = json.loads(kcli("diskless", "describe", "--topic", wal, "-o", "json").stdout)  # kcli's admin API
    assert diskless["topics"][0]["totals"]["messages"] == 3
    objects = json.loads(kcli("diskless", "objects", "--topic", wal, "-o", "json").stdout)
    assert objects["objects"]
    verified = json.loads(kcli("diskless", "verify", "-o", "json").stdout)
    assert verified["batches_checked"] >= 1 and verified["ok"]
    metrics = json.loads(kcli("broker", "metrics", "-o", "json").stdout)
    assert metrics["node_id"] == 1 and metrics["address"] == tls_broker.address(listener_of(kind))
    # commands added since: groups (OffsetDelete through kcli's client), transactions (kcli's client)
    kcli("consume", "--topic", topic, "--group", "ctx-group", "--from-beginning", "--max-messages", "2",
         "--timeout-ms", "20000")
    groups = json.loads(kcli("groups", "describe", "--group", "ctx-group", "-o", "json").stdout)
    assert groups and groups[0]["group"] == "ctx-group"
    kcli("groups", "delete-offsets", "--group", "ctx-group", "--topic", topic)
    assert json.loads(kcli("transactions", "list", "-o", "json").stdout) is not None

    book = tmp_path / "book.yaml"
    book.write_text(textwrap.dedent(RUNBOOK.format(context=context, topic=unique_topic("rb"))))
    ran = run_kcli(cli_env, "runbook", "run", str(book), timeout=120)
    assert ran.returncode == 0, (ran.stdout, ran.stderr)
    assert "5 ok" in ran.stdout


@pytest.mark.parametrize("kind", ["PLAINTEXT", "SSL", "MTLS", "SASL_SSL-PLAIN", "SASL_SSL-SCRAM-SHA-256"])
def test_kcli_own_requests_through_each_way_in(tls_broker, kind):
    """What kcli's own client sends (DeletePartitions, the admin API of `kcli diskless` and `kcli
    broker metrics`), in process, with the properties a context would hold (the slow test above
    runs every command as a subprocess)."""
    from kcli.cli.broker_metrics import fetch_metrics
    from kcli.ops import topics as topic_ops
    from kcli.ops.diskless import OnlineDiskless

    conn = Connection(tls_broker.address(listener_of(kind)), client_props(tls_broker, kind))
    topic = unique_topic("own")
    topic_ops.create_topic(conn, topic_ops.CreateTopicRequest(topic, partitions=2))
    topic_ops.alter_topic(conn, topic_ops.AlterTopicRequest(topic, partitions=1, delete_partitions_delay_ms=0,
                                                                 assume_yes=True))
    assert topic_ops.describe_topics(conn, [topic])[0].partition_count == 1
    assert "topics" in OnlineDiskless(conn).describe()
    assert fetch_metrics(conn.bootstrap, conn.properties)["node_id"] == 1


# --- clean failures -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_a_wrong_password_is_one_line_and_exit_1(tls_broker, cli_env, mechanism):  # noqa: F811
    props = {**client_props(tls_broker, f"SASL_SSL-{mechanism}"), "sasl.password": "wrong"}
    setting = [a for k, v in props.items() for a in ("--property", f"{k}={v}")]
    assert run_kcli(cli_env, "context", "set", "bad", "-b", tls_broker.address("SASL_SSL"), *setting).returncode == 0
    for command in (["topics", "list"], ["diskless", "describe"], ["broker", "metrics"]):
        assert_one_line_error(run_kcli(cli_env, "--context", "bad", *command), 1, "SASL_AUTHENTICATION_FAILED")
    # kcli's own client on its own: the broker's refusal, as one error
    with pytest.raises(KafkaApiError, match="SASL_AUTHENTICATION_FAILED: .*(Invalid username or password|invalid credentials)"):
        with WireClient(tls_broker.address("SASL_SSL"), timeout=15, properties=props) as c:
            c.request(18, 0, {})


def test_an_untrusted_server_certificate_is_one_line_and_exit_1(tls_broker, cli_env):  # noqa: F811
    props = {**client_props(tls_broker, "SSL"), "ssl.ca.location": str(tls_broker.certs.other_ca)}
    setting = [a for k, v in props.items() for a in ("--property", f"{k}={v}")]
    assert run_kcli(cli_env, "context", "set", "untrusted", "-b", tls_broker.address("SSL"), *setting).returncode == 0
    for command in (["topics", "list"], ["diskless", "describe"]):
        assert_one_line_error(run_kcli(cli_env, "--context", "untrusted", *command), 1, "SSL_AUTHENTICATION_FAILED",
                              "certificate verify failed")
    with pytest.raises(KafkaApiError, match="SSL_AUTHENTICATION_FAILED: TLS handshake with .* certificate verify failed"):
        with WireClient(tls_broker.address("SSL"), timeout=15, properties=props) as c:
            c.request(18, 0, {})


def test_host_name_checking_follows_ssl_endpoint_identification_algorithm(tls_broker, tmp_path):
    """`--listen SSL://...` with a certificate naming localhost only: 127.0.0.1 does not match it."""
    b = BrokerProcess(tmp_path / "data", {"ssl.keystore.location": str(tls_broker.certs.localhost_only)})
    b.host = "SSL://127.0.0.1"  # → --listen SSL://127.0.0.1:0
    b.start()
    try:
        props = client_props(tls_broker, "SSL")
        with pytest.raises(KafkaApiError, match="SSL_AUTHENTICATION_FAILED: .*(IP address mismatch|doesn't match)"):
            with WireClient(b.bootstrap, timeout=15, properties=props) as c:
                c.request(18, 0, {})
        for address, settings in ((f"localhost:{b.port}", props),
                                  (b.bootstrap, {**props, "ssl.endpoint.identification.algorithm": "none"})):
            with WireClient(address, timeout=15, properties=settings) as c:
                assert c.request(18, 0, {}).error_code == 0
    finally:
        b.stop()


def test_client_settings_kcli_cannot_use_are_usage_errors(tls_broker):
    address = tls_broker.address("SASL_SSL")
    cases = [({"security.protocol": "KERBEROS"}, "security.protocol"),
             ({**client_props(tls_broker, "SASL_SSL-PLAIN"), "sasl.mechanism": "GSSAPI"}, "GSSAPI"),
             ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}, "sasl.username"),
             ({"security.protocol": "SSL", "ssl.ca.location": "/nonexistent/ca.pem"}, "ssl.ca.location"),
             ({"security.protocol": "SSL", "ssl.certificate.location": str(tls_broker.certs.client_cert)}, "ssl.key.location")]
    for props, needle in cases:
        with pytest.raises(UsageError, match=needle):
            WireClient(address, timeout=5, properties=props).connect()


# --- configuration -------------------------------------------------------------------------------------


def test_bootstrap_without_a_port_means_9092():
    assert validate_bootstrap("127.0.0.1") == "127.0.0.1:9092"
    assert validate_bootstrap("kafka-1,kafka-2:9093,[::1]") == "kafka-1:9092,kafka-2:9093,[::1]:9092"
    assert validate_bootstrap("SASL_SSL://broker") == "SASL_SSL://broker:9092"
    conn = resolve(GlobalOptions(bootstrap_server="127.0.0.1"), environ={})
    assert isinstance(conn, Connection) and conn.bootstrap == "127.0.0.1:9092"
    assert WireClient(conn.bootstrap).address == ("127.0.0.1", 9092)
    for bad in ("h:0", "h:", "no:port", "two words"):
        with pytest.raises(UsageError):
            validate_bootstrap(bad)


def test_listener_configs_are_checked_as_kafka_checks_them(tmp_path):
    certs = make_certs(tmp_path / "certs")

    def listeners(**configs: str):  # noqa: ANN202
        return parse_listeners(BrokerConfig({k.replace("_", "."): v for k, v in configs.items()}))

    got = listeners(listeners="PLAINTEXT://:9092,INTERNAL://127.0.0.1:9093",
                    listener_security_protocol_map="PLAINTEXT:PLAINTEXT,INTERNAL:SASL_SSL")
    assert [(li.name, li.protocol, li.host, li.port) for li in got] == [
        ("PLAINTEXT", "PLAINTEXT", "0.0.0.0", 9092), ("INTERNAL", "SASL_SSL", "127.0.0.1", 9093)]
    for configs, needle in [
        ({"listeners": "CLIENT://127.0.0.1:9092"}, "not in listener.security.protocol.map"),
        ({"listeners": "PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9092"}, "different port"),
        ({"listeners": "PLAINTEXT://127.0.0.1:1,PLAINTEXT://127.0.0.1:2"}, "different name"),
        ({"listeners": "127.0.0.1:9092"}, "NAME://HOST:PORT"),
        ({"listeners": "PLAINTEXT://127.0.0.1:9092", "listener.security.protocol.map": "PLAINTEXT:TLS"}, "NAME:PROTOCOL"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            parse_listeners(BrokerConfig(configs))
    with pytest.raises(ConfigError, match="listener.name"):
        BrokerConfig({"listener.name.ssl.log.retention.ms": "1"})  # only ssl.* may be prefixed
    with pytest.raises(ConfigError, match="ssl.client.auth"):
        BrokerConfig({"ssl.client.auth": "maybe"})

    # key material: a file with key and chain, or both inline; encrypted keys need ssl.key.password
    pem = certs.server.read_text()
    assert isinstance(server_ssl_context(BrokerConfig({"ssl.keystore.location": str(certs.server)}), "SSL"), ssl.SSLContext)
    inline = BrokerConfig({"ssl.keystore.certificate.chain": certs.server_cert.read_text(),
                           "ssl.keystore.key": certs.server_key.read_text()})
    assert server_ssl_context(inline, "SSL").verify_mode == ssl.CERT_NONE
    for configs, needle in [
        ({}, "set ssl.keystore.location"),
        ({"ssl.keystore.location": str(tmp_path / "missing.pem")}, "cannot load the TLS key"),
        ({"ssl.keystore.location": str(certs.encrypted_server), "ssl.key.password": "wrong"}, "cannot load the TLS key"),
        ({"ssl.keystore.location": str(certs.server), "ssl.client.auth": "required"}, "needs ssl.truststore.location"),
        ({"ssl.keystore.location": str(certs.server), "ssl.keystore.key": pem}, "not both"),
        ({"ssl.keystore.location": str(certs.server), "ssl.keystore.type": "JKS"}, "ssl.keystore.type"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            server_ssl_context(BrokerConfig(configs), "SSL")
    required = BrokerConfig({"listener.name.mtls.ssl.client.auth": "required", "ssl.keystore.location": str(certs.server),
                             "ssl.truststore.location": str(certs.ca)})
    assert server_ssl_context(required, "MTLS").verify_mode == ssl.CERT_REQUIRED
    assert server_ssl_context(required, "SSL").verify_mode == ssl.CERT_NONE  # the override is MTLS's only


def test_broker_start_refuses_bad_listener_settings_in_one_line(tmp_path, cli_env):  # noqa: F811
    certs = make_certs(tmp_path / "certs")

    def start(*args: str) -> subprocess.CompletedProcess[str]:
        return run_kcli(cli_env, "broker", "start", "--data-dir", str(tmp_path / "data"), *args, timeout=60)

    listeners = "--config=listeners=PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0"
    assert_one_line_error(start(listeners, f"--config=ssl.keystore.location={certs.server}"), 2,
                          "SASL_SSL", "sasl.enabled.mechanisms is empty")
    assert_one_line_error(start("--config=listeners=SSL://127.0.0.1:0"), 2, "set ssl.keystore.location")
    assert_one_line_error(start("--listen", "127.0.0.1:0", "--config=listeners=PLAINTEXT://127.0.0.1:0"), 2,
                          "either --listen or --config listeners")
    assert_one_line_error(start("--config=listeners=PLAINTEXT://127.0.0.1:0",
                                "--config=advertised.listeners=SSL://example:9093"), 2, "advertised.listeners")
    assert_one_line_error(start("--config=listeners=BOGUS://127.0.0.1:0"), 2, "listener.security.protocol.map")
    assert not (tmp_path / "data").exists()


# --- a cluster: every listener of every broker is registered -------------------------------------------


def test_in_a_cluster_each_broker_registers_every_listener(tls_broker, broker_factory, pg_database):  # noqa: F811
    from kcli.ops.diskless import OnlineDiskless

    certs = tls_broker.certs
    configs = {"listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0", "ssl.keystore.location": str(certs.server),
               "broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500"}
    nodes = [broker_factory(configs, name=f"node{n}", extra_args=["--cluster", pg_database, "--node-id", str(n)])
             for n in (1, 2)]
    ssl_props = client_props(tls_broker, "SSL")

    def brokers_seen(listener: str, props: dict[str, str]) -> dict[int, str]:
        with WireClient(nodes[0].listeners[listener], timeout=15, properties=props) as c:
            md = c.request(3, 12, {"topics": [], "allow_auto_topic_creation": False,
                                   "include_topic_authorized_operations": False})
        return {int(b.node_id): f"{b.host}:{b.port}" for b in md.brokers}

    expected = {n: b.listeners["SSL"] for n, b in zip((1, 2), nodes)}
    deadline = time.monotonic() + 30
    while brokers_seen("SSL", ssl_props) != expected:
        assert time.monotonic() < deadline, brokers_seen("SSL", ssl_props)
        time.sleep(0.3)
    assert brokers_seen("PLAINTEXT", {}) == {n: b.listeners["PLAINTEXT"] for n, b in zip((1, 2), nodes)}

    topic = unique_topic("spread")  # two partitions: one on each broker, reached over SSL
    from kcli.ops import topics as topic_ops

    conn = Connection(nodes[1].listeners["SSL"], ssl_props)
    topic_ops.create_topic(conn, topic_ops.CreateTopicRequest(topic, partitions=2))
    produce(conn.bootstrap, topic, [b"p0"], partition=0, **ssl_props)
    produce(conn.bootstrap, topic, [b"p1"], partition=1, **ssl_props)
    assert sorted(m.value() for m in consume_all(conn.bootstrap, topic, 2, **ssl_props)) == [b"p0", b"p1"]
    online = OnlineDiskless(conn)  # kcli's admin API, to the controller at its SSL address
    assert "topics" in online.describe() and online.bootstrap in expected.values()


def test_a_client_certificate_is_the_principal_acls_see(tls_broker, tmp_path):
    """Kafka's default SSL principal: User:<subject, RFC 2253>. As a super user it may create a
    topic; as User:ANONYMOUS (no certificate principal) the authorizer would refuse."""
    certs = tls_broker.certs
    b = BrokerProcess(tmp_path / "data", {
        "ssl.keystore.location": str(certs.server), "ssl.client.auth": "required",
        "ssl.truststore.location": str(certs.ca),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:CN=kcli-client,O=kcli tests"})
    b.host = "SSL://127.0.0.1"  # → --listen SSL://127.0.0.1:0
    b.start()
    try:
        from kcli.ops import topics as topic_ops

        conn = Connection(b.bootstrap, client_props(tls_broker, "MTLS"))
        topic_ops.create_topic(conn, topic_ops.CreateTopicRequest("by-cert", partitions=1))
        assert [t.topic for t in topic_ops.describe_topics(conn, ["by-cert"])] == ["by-cert"]
    finally:
        b.stop()
