"""`kcli broker start --config-file server.properties`: a Kafka config file means what it says.

Real broker processes started from real properties files (Kafka's own sample files, with the
port and log.dirs changed), checked with confluent-kafka; the embedded default broker reading
the contexts file's ``embedded-broker:`` section through the CLI.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from kcli.config.definitions import ConfigError
from kcli.config.server_properties import translate
from tests.fixtures_cli import REPO, assert_one_line_error, cli_env, run_kcli, unique_topic  # noqa: F401

# config/kraft/server.properties of Apache Kafka 3.x (comments shortened), and config/server.properties
# of Kafka 4.x: {port} and {logs} are filled in by the tests.
KAFKA3_SAMPLE = """\
# Licensed to the Apache Software Foundation (ASF) under one or more contributor license agreements.
############################# Server Basics #############################
# The role of this server. Setting this puts us in KRaft mode
process.roles=broker,controller
# The node id associated with this instance's roles
node.id=1
# The connect string for the controller quorum
controller.quorum.voters=1@localhost:9093
############################# Socket Server Settings #############################
listeners=PLAINTEXT://:{port},CONTROLLER://:9093
inter.broker.listener.name=PLAINTEXT
advertised.listeners=PLAINTEXT://localhost:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL
num.network.threads=3
num.io.threads=8
socket.send.buffer.bytes=102400
socket.receive.buffer.bytes=102400
socket.request.max.bytes=104857600
############################# Log Basics #############################
log.dirs={logs}
num.partitions=1
num.recovery.threads.per.data.dir=1
############################# Internal Topic Settings  #############################
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
############################# Log Flush Policy #############################
#log.flush.interval.messages=10000
#log.flush.interval.ms=1000
############################# Log Retention Policy #############################
log.retention.hours=168
#log.retention.bytes=1073741824
log.segment.bytes=1073741824
log.retention.check.interval.ms=300000
"""

KAFKA4_SAMPLE = """\
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=localhost:9093
listeners=PLAINTEXT://:{port},CONTROLLER://:9093
inter.broker.listener.name=PLAINTEXT
advertised.listeners=PLAINTEXT://localhost:{port},CONTROLLER://localhost:9093
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL
num.network.threads=3
num.io.threads=8
socket.send.buffer.bytes=102400
socket.receive.buffer.bytes=102400
socket.request.max.bytes=104857600
log.dirs={logs}
num.partitions=1
num.recovery.threads.per.data.dir=1
offsets.topic.replication.factor=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
log.retention.hours=168
log.segment.bytes=1073741824
log.retention.check.interval.ms=300000
"""

# (inter.broker.listener.name is accepted: brokers share state through the database, so it has no effect; docs/security.md)
KRAFT_ONLY = ["process.roles", "controller.listener.names", "num.network.threads",
              "num.io.threads", "socket.send.buffer.bytes", "offsets.topic.replication.factor",
              "listeners CONTROLLER://:9093"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FileBroker:
    """`kcli broker start ARGS` as a child process; stderr kept for the ignored-settings line."""

    def __init__(self, args: list[str], env: dict[str, str], stderr_path: Path) -> None:
        self.stderr_path = stderr_path
        with open(stderr_path, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "kcli", "broker", "start", *args], cwd=REPO,
                                         stdout=subprocess.PIPE, stderr=err, env=env)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline().decode().strip() if ready else ""
        if not line.startswith("kcli broker listening on "):
            self.stop()
            raise AssertionError(f"broker did not start: {line!r}: {self.stderr}")
        self.address = line.rsplit(" ", 1)[1]
        self.port = int(self.address.rsplit(":", 1)[1])
        self.bootstrap = f"127.0.0.1:{self.port}"

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def start_broker(tmp_path: Path, cli_env: dict[str, str]) -> Iterator:  # noqa: F811
    started: list[FileBroker] = []

    def start(*args: str) -> FileBroker:
        b = FileBroker(list(args), cli_env, tmp_path / f"broker{len(started)}.stderr")
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def _broker_config(bootstrap: str, node_id: int = 1) -> dict[str, str]:
    res = ConfigResource(ConfigResource.Type.BROKER, str(node_id))
    admin = _admin(bootstrap)  # kept alive until the future is done
    entries = admin.describe_configs([res])[res].result(timeout=30)
    return {k: v.value for k, v in entries.items()}


def _topic_config(bootstrap: str, topic: str) -> dict[str, str]:
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = _admin(bootstrap)  # kept alive until the future is done
    entries = admin.describe_configs([res])[res].result(timeout=30)
    return {k: v.value for k, v in entries.items()}


def _partitions(bootstrap: str, topic: str) -> int:
    md = _admin(bootstrap).list_topics(topic, timeout=30)
    return len(md.topics[topic].partitions)


def _ignored_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if "ignoring settings kcli does not implement" in ln]
    assert len(lines) == 1, stderr
    return lines[0]


# --- the translation, on its own (a pure function) -------------------------------------------


@pytest.mark.parametrize("props, expected", [
    ({"log.retention.hours": "48"}, 48 * 3_600_000),
    ({"log.retention.minutes": "90", "log.retention.hours": "48"}, 90 * 60_000),
    ({"log.retention.ms": "1234", "log.retention.minutes": "90", "log.retention.hours": "48"}, 1234),
    ({"log.retention.hours": "-1"}, -1),
    ({"log.retention.minutes": "-1", "log.retention.hours": "5"}, -1),
    ({"log.retention.ms": "-1", "log.retention.hours": "5"}, -1),
])
def test_retention_units_follow_kafkas_precedence(props: dict[str, str], expected: int) -> None:
    assert translate(props).configs["log.retention.ms"] == str(expected)


@pytest.mark.parametrize("props, needle", [
    ({"log.dirs": "/a,/b"}, "log.dirs names 2 directories (/a, /b): kcli keeps one data dir"),
    ({"log.retention.hours": "a week"}, "log.retention.hours"),
    ({"node.id": "1", "broker.id": "2"}, "node.id (1) and broker.id (2) must be the same"),
    ({"listeners": "127.0.0.1:9092"}, "expected NAME://HOST:PORT"),
    ({"listeners": "PLAINTEXT://:9092", "listener.security.protocol.map": "BROKEN"}, "listener.security.protocol.map"),
])
def test_what_kcli_cannot_serve_is_refused_naming_the_setting(props: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        translate(props)
    assert needle in str(err.value)


@pytest.mark.parametrize("props", [
    {"listeners": "PLAINTEXT://:9092,SASL_PLAINTEXT://:9094", "advertised.listeners": "PLAINTEXT://h:9092"},
    {"listeners": "SSL://:9093", "advertised.listeners": "SSL://h:9093,CONTROLLER://h:9095"},
    {"listeners": "EXTERNAL://:9092"},  # the broker's listeners parser names the missing map entry
])
def test_several_or_tls_listeners_pass_through_as_the_listeners_config(props: dict[str, str]) -> None:
    out = translate({**props, "controller.listener.names": "CONTROLLER",
                     "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SSL:SSL,"
                                                       "EXTERNAL:SSL,CONTROLLER:PLAINTEXT"})
    assert out.listen is None and out.configs["listeners"] == props["listeners"]
    assert "listener.security.protocol.map" in out.configs
    if "advertised.listeners" in props:  # the served listeners' entries; a controller's is KRaft's
        assert out.configs["advertised.listeners"] == props["advertised.listeners"].split(",CONTROLLER")[0]


def test_advertising_a_listener_that_is_not_served_is_refused_as_kafka_refuses_it() -> None:
    with pytest.raises(ConfigError, match="advertised.listeners listener names must be equal to or a subset"):
        translate({"listeners": "PLAINTEXT://:9092", "advertised.listeners": "SSL://h:9093"})


def test_listeners_log_dirs_and_plugin_prefixes_map_to_kcli_settings() -> None:
    out = translate({"listeners": "INTERNAL://10.0.0.1:9092,CONTROLLER://:9093",
                     "listener.security.protocol.map": "INTERNAL:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
                     "controller.listener.names": "CONTROLLER", "log.dir": "/var/kafka",
                     "rsm.config.uri": "file:///objects", "num.io.threads": "8"})
    assert out.listen == "SASL_PLAINTEXT://10.0.0.1:9092"
    assert out.data_dir == Path("/var/kafka")
    assert out.configs == {"remote.log.storage.manager.impl.uri": "file:///objects"}
    assert out.unknown == ["controller.listener.names", "num.io.threads"]
    assert "listeners CONTROLLER://:9093 (controller listener: kcli has no KRaft quorum)" in out.ignored
    # log.dirs wins over log.dir; a custom RSM prefix replaces rsm.config.
    out = translate({"log.dir": "/x", "log.dirs": "/y", "remote.log.storage.manager.impl.prefix": "my.rsm.",
                     "my.rsm.uri": "file:///o"})
    assert out.data_dir == Path("/y") and out.configs == {"remote.log.storage.manager.impl.uri": "file:///o"}


# --- real brokers from real files -------------------------------------------------------------


@pytest.mark.parametrize("sample", [KAFKA3_SAMPLE, KAFKA4_SAMPLE], ids=["kafka3", "kafka4"])
def test_kafkas_sample_server_properties_starts_a_broker(sample: str, tmp_path: Path, start_broker) -> None:  # noqa: ANN001
    """Before: `Unknown broker config name: process.roles` (exit 2). Now the broker serves on the
    file's listener and data dir, lists the KRaft-only settings once, and applies the rest."""
    port, logs = _free_port(), tmp_path / "kraft-combined-logs"
    props = tmp_path / "server.properties"
    props.write_text(sample.format(port=port, logs=logs))
    b = start_broker("--config-file", str(props))
    assert b.port == port and b.address == f"0.0.0.0:{port}"  # PLAINTEXT://:PORT binds every interface
    assert json.loads((logs / "broker.json").read_text())["port"] == port  # log.dirs is the data dir
    line = _ignored_line(b.stderr)
    for name in KRAFT_ONLY:
        assert name in line, (name, line)
    for used in ("log.dirs", "log.retention.hours", "log.segment.bytes", "num.partitions", "node.id"):
        assert f" {used}," not in line and not line.endswith(f" {used}"), (used, line)
    configs = _broker_config(b.bootstrap)
    assert configs["log.retention.ms"] == str(168 * 3_600_000)
    assert configs["log.segment.bytes"] == "1073741824"
    topic = unique_topic()
    admin = _admin(b.bootstrap)
    admin.create_topics([NewTopic(topic)])[topic].result(timeout=30)
    from confluent_kafka import Consumer, Producer

    p = Producer({"bootstrap.servers": b.bootstrap})  # metadata answers localhost:PORT (advertised.listeners)
    p.produce(topic, b"v")
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    try:
        deadline = time.monotonic() + 30
        msg = None
        while msg is None and time.monotonic() < deadline:
            msg = c.poll(1)
        assert msg is not None and msg.value() == b"v"
    finally:
        c.close()


def test_strict_refuses_the_settings_it_would_ignore(tmp_path: Path, cli_env: dict[str, str]) -> None:  # noqa: F811
    props = tmp_path / "server.properties"
    props.write_text(KAFKA3_SAMPLE.format(port=_free_port(), logs=tmp_path / "logs"))
    proc = run_kcli(cli_env, "broker", "start", "--config-file", str(props), "--strict")
    assert_one_line_error(proc, 2, "settings kcli does not implement (--strict)", "process.roles", "num.io.threads",
                          "listeners CONTROLLER://:9093")
    assert not (tmp_path / "logs").exists()  # refused before the data dir is made


def test_flags_override_config_which_overrides_the_file(tmp_path: Path, start_broker) -> None:  # noqa: ANN001
    props = tmp_path / "server.properties"
    props.write_text(f"listeners=PLAINTEXT://127.0.0.1:{_free_port()}\nlog.dirs={tmp_path / 'from-file'}\n"
                     "advertised.listeners=PLAINTEXT://kafka.example:9092\n"
                     "node.id=5\nnum.partitions=2\nlog.retention.ms=1000\nlog.retention.hours=1\n")
    flag_dir = tmp_path / "from-flag"
    b = start_broker("--config-file", str(props), "--config", "num.partitions=3", "--config", "node.id=6",
                     "--config", "log.retention.hours=2", "--node-id", "7", "--data-dir", str(flag_dir),
                     "--listen", "127.0.0.1:0")
    assert (flag_dir / "broker.json").exists() and not (tmp_path / "from-file").exists()
    md = _admin(b.bootstrap).list_topics(timeout=30)
    assert list(md.brokers) == [7]  # --node-id over --config node.id=6 over the file's node.id=5
    assert (md.brokers[7].host, md.brokers[7].port) == ("127.0.0.1", b.port)  # not the file's advertised address
    configs = _broker_config(b.bootstrap, 7)
    assert configs["num.partitions"] == "3"
    assert configs["log.retention.ms"] == str(2 * 3_600_000)  # --config's hours over the file's ms
    assert "ignoring settings" not in b.stderr  # nothing unknown: no ignored line


def test_file_settings_drive_topic_defaults(tmp_path: Path, start_broker) -> None:  # noqa: ANN001
    """num.partitions for CreateTopics without a count and for auto-created topics;
    log.retention.hours=-1 (unlimited), log.retention.bytes, log.segment.bytes as topic defaults."""
    props = tmp_path / "server.properties"
    props.write_text(f"log.dirs={tmp_path / 'd'}\nlisteners=PLAINTEXT://127.0.0.1:0\nnum.partitions=3\n"
                     "log.retention.hours=-1\nlog.retention.bytes=5000000\nlog.segment.bytes=1048576\n"
                     "default.replication.factor=1\nauto.create.topics.enable=true\n")
    b = start_broker("--config-file", str(props))
    created = unique_topic()
    admin = _admin(b.bootstrap)
    admin.create_topics([NewTopic(created)])[created].result(timeout=30)
    assert _partitions(b.bootstrap, created) == 3
    cfg = _topic_config(b.bootstrap, created)
    assert (cfg["retention.ms"], cfg["retention.bytes"], cfg["segment.bytes"]) == ("-1", "5000000", "1048576")
    auto = unique_topic()
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": b.bootstrap})
    p.produce(auto, b"x")
    assert p.flush(30) == 0
    assert _partitions(b.bootstrap, auto) == 3


def test_auto_create_disabled_in_the_file(tmp_path: Path, start_broker) -> None:  # noqa: ANN001
    props = tmp_path / "server.properties"
    props.write_text(f"log.dirs={tmp_path / 'd'}\nlisteners=PLAINTEXT://127.0.0.1:0\nauto.create.topics.enable=false\n")
    b = start_broker("--config-file", str(props))
    md = _admin(b.bootstrap).list_topics("never-created", timeout=30)
    assert md.topics["never-created"].error is not None
    assert "never-created" not in _admin(b.bootstrap).list_topics(timeout=30).topics


@pytest.mark.parametrize("text, needle", [
    ("log.dirs=/tmp/a,/tmp/b\n", "kcli keeps one data dir"),
    ("listeners=PLAINTEXT://:9092\nlistener.security.protocol.map=BROKEN\n", "listener.security.protocol.map"),
    ("log.retention.hours=forever\n", "Invalid value forever for configuration log.retention.hours"),
    ("num.partitions=0\n", "Invalid value 0 for configuration num.partitions"),
    ("just-a-word\n", "expected key=value"),
])
def test_bad_files_are_one_line_usage_errors(text: str, needle: str, tmp_path: Path, cli_env: dict[str, str]) -> None:  # noqa: F811
    props = tmp_path / "bad.properties"
    props.write_text(text)
    proc = run_kcli(cli_env, "broker", "start", "--config-file", str(props), "--data-dir", str(tmp_path / "d"),
                    "--listen", "127.0.0.1:0")
    assert_one_line_error(proc, 2, needle)
    assert not (tmp_path / "d").exists()


def test_java_properties_syntax(tmp_path: Path) -> None:
    from kcli.config.broker_config import read_properties

    props = tmp_path / "p.properties"
    props.write_text("# comment\n! also a comment\nnum.partitions 3\nlog.dirs : /data/a\n"
                     "log.retention.hours=\\\n  168\nempty.value=\n")
    assert read_properties(props) == {"num.partitions": "3", "log.dirs": "/data/a", "log.retention.hours": "168",
                                      "empty.value": ""}


# --- the embedded default broker ---------------------------------------------------------------


def test_embedded_broker_reads_the_contexts_files_section(tmp_path: Path, cli_env: dict[str, str]) -> None:  # noqa: F811
    """With no cluster given, the broker a command boots takes `embedded-broker:` settings:
    num.partitions from the section's file, overridden by its config mapping; tiering on."""
    props = tmp_path / "server.properties"
    props.write_text("num.partitions=2\nprocess.roles=broker\n")
    Path(cli_env["KCLI_CONFIG"]).write_text(
        f"embedded-broker:\n  config-file: {props}\n  config:\n    num.partitions: 4\n"
        f"    remote.log.storage.system.enable: true\n"
        f"    remote.log.storage.manager.impl.uri: file://{tmp_path / 'objects'}\n")
    topic = unique_topic()
    proc = run_kcli(cli_env, "-v", "topics", "create", "--topic", topic, "--config", "remote.storage.enable=true")
    assert proc.returncode == 0, proc.stderr
    assert "ignoring settings kcli does not implement: process.roles" in proc.stderr  # said with -v
    proc = run_kcli(cli_env, "topics", "describe", "--topic", topic, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    doc = doc[0] if isinstance(doc, list) else doc
    assert len(doc["partitions"]) == 4
    # `kcli context set` rewrites the file: the section survives.
    assert run_kcli(cli_env, "context", "set", "other", "-b", "127.0.0.1:9092").returncode == 0
    assert "embedded-broker:" in Path(cli_env["KCLI_CONFIG"]).read_text()


@pytest.mark.parametrize("section, needle", [
    ("embedded-broker: [1]\n", "embedded-broker takes config-file: PATH and config: a mapping"),
    ("embedded-broker:\n  config:\n    no.such.config: 1\n", "Unknown broker config name: no.such.config"),
    ("embedded-broker:\n  config-file: /nonexistent/server.properties\n", "cannot read config file"),
])
def test_bad_embedded_broker_sections(section: str, needle: str, cli_env: dict[str, str]) -> None:  # noqa: F811
    Path(cli_env["KCLI_CONFIG"]).write_text(section)
    assert_one_line_error(run_kcli(cli_env, "topics", "list"), 2, needle)
    assert not Path(cli_env["KCLI_DATA_DIR"]).exists()


def test_broker_start_ctrl_c_exits_130(tmp_path: Path, start_broker) -> None:  # noqa: ANN001
    b = start_broker("--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0")
    assert b.stop(signal.SIGINT) == 130
    assert "Traceback" not in b.stderr
    b2 = start_broker("--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0")
    assert b2.stop(signal.SIGTERM) == 0  # a service manager's stop is a clean exit
    assert os.path.exists(tmp_path / "d" / "__cluster_metadata")
