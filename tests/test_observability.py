"""Observability (#18): the broker's INFO log (audit lines with the principal, text and json),
--log-level, the Prometheus endpoint after real produce/consume, `kcli --version`, and
`kcli broker start --daemon` / `status` / `stop` — all against real broker processes."""

from __future__ import annotations

import json
import re
import urllib.request
from importlib.metadata import version
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from tests.brokerproc import BrokerProcess
from tests.diskless_helpers import FAST, wait_until
from tests.fixtures_cli import assert_one_line_error, cli_env, run_kcli  # noqa: F401 - fixture
from tests.kafka_helpers import consume_all, create_topic, produce
from tests.test_sasl import sasl_conf, write_users

USER, PASSWORD = "alice", "alice-Secret-1"


def sasl_broker(tmp_path: Path, name: str, *extra: str) -> BrokerProcess:
    users = tmp_path / f"{name}-users.txt"
    write_users(users, {USER: PASSWORD})
    return BrokerProcess(tmp_path / name, {"sasl.enabled.mechanisms": "PLAIN", "sasl.plain.users.file": str(users)},
                         extra_args=list(extra)).start()


def change_topics(bootstrap: str, topic: str) -> None:
    """Create, alter (incrementally), grow, fail to re-create, and delete ``topic`` as alice."""
    a = AdminClient({"bootstrap.servers": bootstrap, **sasl_conf(USER, PASSWORD)})
    a.create_topics([NewTopic(topic, 2, 1, config={"retention.ms": "3600000"})])[topic].result(30)
    res = ConfigResource("TOPIC", topic, incremental_configs=[])
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    res.add_incremental_config(ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET))
    list(a.incremental_alter_configs([res]).values())[0].result(30)
    a.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
    with pytest.raises(Exception, match="TOPIC_ALREADY_EXISTS|already exists"):
        a.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    a.delete_topics([topic])[topic].result(30)


def test_audit_lines_name_the_principal_in_text(tmp_path):
    b = sasl_broker(tmp_path, "text")
    try:
        change_topics(b.bootstrap, "audited")
        wait_until(lambda: "Deleted topic audited" in b.log_text(), timeout=20, what="the deletion line")
    finally:
        assert b.stop() == 0
    lines = b.log_text().splitlines()

    def line(pattern: str) -> str:
        found = [ln for ln in lines if re.search(pattern, ln)]
        assert len(found) == 1, (pattern, lines[-30:])
        assert " INFO " in found[0] and "principal User:alice from 127.0.0.1" in found[0], found[0]
        return found[0]

    assert "retention.ms=3600000" in line(r"Created topic audited with topic ID \S{22}, 2 partition\(s\)")
    assert "{retention.ms=7200000}" in line(r"Incrementally altered configs of topic audited")
    line(r"Increased the partition count of topic audited to 3")
    line(r"Refused creation of topic audited: TOPIC_ALREADY_EXISTS")
    line(r"Deleted topic audited with topic ID \S{22} ")
    assert any(re.search(r"INFO kcli.broker: \[KafkaServer id=1\] started: listeners SASL_PLAINTEXT://127.0.0.1:\d+", ln)
               for ln in lines)
    assert any("[KafkaServer id=1] shut down completed" in ln for ln in lines)


def test_json_log_is_one_object_per_line_with_structured_fields(tmp_path):
    b = sasl_broker(tmp_path, "json", "--log-format", "json")
    try:
        change_topics(b.bootstrap, "audited-json")
        wait_until(lambda: "Deleted topic audited-json" in b.log_text(), timeout=20, what="the deletion line")
    finally:
        assert b.stop() == 0
    records = [json.loads(ln) for ln in b.log_text().splitlines() if ln.strip()
               and not ln.startswith("kcli broker listening")]  # stdout goes elsewhere; every stderr line is JSON
    for r in records:
        assert {"time", "level", "logger", "message"} <= set(r), r
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", r["time"]), r
    by_event = {r.get("event"): r for r in records}
    created = by_event["topic.created"]
    assert created["level"] == "INFO" and created["topic"] == "audited-json" and created["partitions"] == 2
    assert created["principal"] == "User:alice" and created["client_host"] == "127.0.0.1"
    assert created["api"] == "CreateTopics" and created["configs"] == {"retention.ms": "3600000"}
    assert by_event["topic.configs.altered"]["configs"] == {"retention.ms": "7200000"}
    assert by_event["topic.deleted"]["principal"] == "User:alice"
    assert by_event["topic.creation.refused"]["error"] == "TOPIC_ALREADY_EXISTS"
    assert by_event["broker.started"]["node_id"] == 1
    assert by_event["broker.stopped"]["message"] == "[KafkaServer id=1] shut down completed"


def test_log_level_warning_silences_info(tmp_path):
    b = BrokerProcess(tmp_path / "quiet", extra_args=["--log-level", "warning"]).start()
    try:
        create_topic(b.bootstrap, "quiet-topic", 1)
        produce(b.bootstrap, "quiet-topic", [b"x"])
    finally:
        assert b.stop() == 0
    text = b.log_text()
    assert " INFO " not in text and "Created topic" not in text and "KafkaServer" not in text, text[-2000:]


# --- Prometheus -------------------------------------------------------------------------------------


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value}, parsed by prometheus_client's own text parser."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def metrics_url(b: BrokerProcess) -> str:
    m = wait_until(lambda: re.search(r"metrics (http://\S+/metrics)", b.log_text()), timeout=20, what="metrics line")
    return m.group(1)


def test_prometheus_endpoint_after_produce_and_consume(tmp_path):
    b = BrokerProcess(tmp_path / "prom", {**FAST}, extra_args=["--metrics-listen", "127.0.0.1:0"]).start()
    try:
        url = metrics_url(b)
        before = scrape(url)
        assert before[("kcli_broker_info", (("cluster_id", before_cluster_id(before)), ("node_id", "1"),
                                            ("version", version("kcli-kafka"))))] == 1
        assert before[("kcli_objectstore_errors_total", (("operation", "put"),))] == 0
        create_topic(b.bootstrap, "classic", 2)
        create_topic(b.bootstrap, "dl", 1, {"diskless.enable": "true"})
        produce(b.bootstrap, "classic", [b"v%d" % i for i in range(20)], partition=0)
        produce(b.bootstrap, "dl", [b"d%d" % i for i in range(5)])
        assert len(consume_all(b.bootstrap, "classic", 20, group="g-prom")) == 20
        mid = scrape(url)  # every batch stored so far was read once: out covers in, byte for byte
        assert len(consume_all(b.bootstrap, "dl", 5)) == 5
        produce(b.bootstrap, "classic", [b"late"] * 3, partition=0)  # the group's committed offset now lags by 3
        after = scrape(url)
    finally:
        assert b.stop() == 0
    produce_key = ("kafka_network_requestmetrics_requests_total", (("request", "Produce"),))
    assert after[produce_key] > before.get(produce_key, 0)
    assert after[("kafka_network_requestmetrics_totaltimems_count", (("request", "Produce"),))] == after[produce_key]
    assert after[("kafka_network_requestmetrics_totaltimems_bucket", (("le", "+Inf"), ("request", "Fetch")))] >= 1
    assert after[("kafka_network_requestmetrics_totaltimems_sum", (("request", "CreateTopics"),))] > 0
    assert after[("kafka_server_brokertopicmetrics_messagesin_total", (("topic", "classic"),))] == 23
    classic = (("topic", "classic"),)
    assert mid[("kafka_server_brokertopicmetrics_bytesin_total", classic)] > 20 * 2  # batches: values plus headers
    assert mid[("kafka_server_brokertopicmetrics_bytesout_total", classic)] >= \
        mid[("kafka_server_brokertopicmetrics_bytesin_total", classic)]
    assert after[("kafka_server_brokertopicmetrics_bytesin_total", classic)] > \
        mid[("kafka_server_brokertopicmetrics_bytesin_total", classic)]
    assert after[("kafka_server_brokertopicmetrics_bytesin_total", (("topic", "dl"),))] > 0
    assert after[("kcli_diskless_upload_latency_ms_count", ())] >= 1
    assert after[("kcli_diskless_commit_latency_ms_count", ())] >= 1
    # the diskless consume was served: through the coordinator (a find) or the replica's local cache
    served = {name: v for (name, labels), v in after.items()
              if name in ("kcli_diskless_find_latency_ms_count", "kcli_diskless_replica_cache_reads_total")}
    assert sum(served.values()) >= 1, served
    lags = {dict(labels)["partition"]: v for (name, labels), v in after.items()
            if name == "kafka_consumergroup_lag" and dict(labels)["consumergroup"] == "g-prom"}
    assert lags == {"0": 3}, lags
    assert after[("process_resident_memory_bytes", ())] > 0


def before_cluster_id(samples: dict) -> str:
    return next(dict(labels)["cluster_id"] for name, labels in samples if name == "kcli_broker_info")


def test_metrics_endpoint_answers_only_get_metrics_and_the_admin_api_still_works(tmp_path, cli_env):  # noqa: F811
    b = BrokerProcess(tmp_path / "prom2", extra_args=["--metrics-listen", "127.0.0.1:0"]).start()
    try:
        url = metrics_url(b)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url.replace("/metrics", "/nothing"), timeout=10)
        assert err.value.code == 404
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(url, data=b"x", method="POST"), timeout=10)
        assert err.value.code == 405
        produce(b.bootstrap, "auto", [b"x"])
        proc = run_kcli(cli_env, "-b", b.bootstrap, "broker", "metrics", "-o", "json")
        assert proc.returncode == 0, proc.stderr
        assert "counters" in json.loads(proc.stdout)
    finally:
        assert b.stop() == 0


# --- kcli --version ---------------------------------------------------------------------------------


def test_version(cli_env):  # noqa: F811
    proc = run_kcli(cli_env, "--version")
    assert proc.returncode == 0 and proc.stdout == f"kcli {version('kcli-kafka')}\n" and proc.stderr == ""
    assert_one_line_error(run_kcli(cli_env, "--version=1"), 2, "--version")


# --- broker start --daemon / status / stop --------------------------------------------------------------


def test_daemon_start_status_stop(tmp_path, cli_env):  # noqa: F811
    data = tmp_path / "bg"
    started = run_kcli(cli_env, "broker", "start", "--daemon", "--data-dir", str(data), "--listen", "127.0.0.1:0",
                       "-o", "json", timeout=120)
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    pid = info["pid"]
    try:
        assert info["running"] and info["node_id"] == 1 and info["data_dir"] == str(data)
        assert info["log"] == str(data / "broker.log")
        produce(info["bootstrap"], "bg-topic", [b"x"])  # it serves
        again = run_kcli(cli_env, "broker", "start", "--daemon", "--data-dir", str(data), "--listen", "127.0.0.1:0")
        assert_one_line_error(again, 1, "already running", str(pid))
        st = run_kcli(cli_env, "broker", "status", "--data-dir", str(data))
        assert st.returncode == 0, st.stderr
        assert f"pid: {pid}" in st.stdout and f"Bootstrap servers: {info['bootstrap']}" in st.stdout
        assert "uptime: " in st.stdout and "node id: 1" in st.stdout
        stopped = run_kcli(cli_env, "broker", "stop", "--data-dir", str(data), "--timeout", "60", timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        assert f"Broker (pid {pid}) on {data} stopped" in stopped.stdout
    finally:
        import os
        import signal

        try:
            os.kill(pid, signal.SIGKILL)  # only if the test failed before stopping it
        except ProcessLookupError:
            pass
    log = (data / "broker.log").read_text()
    assert "[KafkaServer id=1] shut down completed" in log
    assert re.search(r" INFO kcli.broker.audit: Auto-created topic bg-topic with topic ID \S{22} and 1 partition\(s\) "
                     r"\(principal User:ANONYMOUS from 127.0.0.1\)", log), log[-3000:]
    for cmd in ("status", "stop"):
        assert_one_line_error(run_kcli(cli_env, "broker", cmd, "--data-dir", str(data)), 1,
                              f"no broker is running on {data}")


def test_daemon_that_cannot_start_reports_the_cause(tmp_path, cli_env):  # noqa: F811
    data = tmp_path / "bad"
    proc = run_kcli(cli_env, "broker", "start", "--daemon", "--data-dir", str(data), "--listen", "127.0.0.1:0",
                    "--config", "sasl.enabled.mechanisms=PLAIN", "--config", f"sasl.plain.users.file={tmp_path}/none",
                    timeout=120)
    assert_one_line_error(proc, 1, "exited (code 2) before it listened", str(data / "broker.log"))



def test_object_store_errors_are_one_warning_line_and_a_counter(tmp_path):
    """An upload the store refuses: one WARNING line (no traceback), kcli_objectstore_errors_total moves."""
    from confluent_kafka import Producer

    b = BrokerProcess(tmp_path / "faulty", {
        **FAST, "diskless.storage.class.name": "plugins.objectstore.faulty.FaultyObjectStorage",
        "diskless.storage.delegate.uri": (tmp_path / "objects").as_uri(),
        "diskless.storage.failure.rate": "1", "diskless.storage.failure.operations": "upload",
    }, extra_args=["--metrics-listen", "127.0.0.1:0"]).start()
    try:
        url = metrics_url(b)
        create_topic(b.bootstrap, "dl-broken", 1, {"diskless.enable": "true"})
        errors: list[object] = []
        p = Producer({"bootstrap.servers": b.bootstrap, "message.timeout.ms": 3000, "retries": 0})
        p.produce("dl-broken", b"x", on_delivery=lambda err, _m: errors.append(err))
        p.flush(30)
        assert errors and errors[0] is not None
        samples = scrape(url)
    finally:
        assert b.stop() == 0
    assert samples[("kcli_objectstore_errors_total", (("operation", "put"),))] >= 1
    text = b.log_text()
    failed = [ln for ln in text.splitlines() if "upload of WAL object" in ln]
    assert failed and all(" WARNING kcli.diskless" in ln for ln in failed), text[-2000:]
    assert "Traceback" not in text, text[-3000:]


def test_tiering_transitions_and_partition_deletion_are_logged(tmp_path, cli_env):  # noqa: F811
    """KIP-950 DISABLING -> DISABLED and a KIP-694 partition deletion, each with INFO lines."""
    from tests.test_tiered import alter

    b = BrokerProcess(tmp_path / "steps", {"remote.log.storage.system.enable": "true",
                                           "delete.topic.partition.enable": "true",
                                           "remote.log.manager.task.interval.ms": "500"},
                      extra_args=["--metrics-listen", "127.0.0.1:0"]).start()
    try:
        create_topic(b.bootstrap, "tiered-t", 1, {"remote.storage.enable": "true"})
        lag = scrape(metrics_url(b))  # tiering lag is exported per tiered topic (nothing rolled yet: 0)
        assert lag[("kafka_server_brokertopicmetrics_remotecopylagbytes", (("topic", "tiered-t"),))] == 0
        assert lag[("kafka_server_brokertopicmetrics_remotecopylagsegments", (("topic", "tiered-t"),))] == 0
        alter(b.bootstrap, "tiered-t", {"remote.storage.enable": "false", "remote.log.delete.on.disable": "true"})
        wait_until(lambda: "tiered storage of tiered-t: DISABLING -> DISABLED" in b.log_text(), timeout=60,
                   what="DISABLED line")
        create_topic(b.bootstrap, "shrunk", 3)
        proc = run_kcli(cli_env, "-b", b.bootstrap, "topics", "alter", "--topic", "shrunk", "--partitions", "2",
                        "--delete-partitions-delay", "3600000")
        assert proc.returncode == 0, proc.stderr
    finally:
        assert b.stop() == 0
    text = b.log_text()
    assert re.search(r" INFO kcli.tiered: tiered storage of tiered-t: DISABLING \(policy delete, tiered epoch 1\)", text)
    assert re.search(r" INFO kcli.broker.audit: Incrementally altered configs of topic tiered-t: "
                     r"\{remote.log.delete.on.disable=true, remote.storage.enable=false\} \(principal User:ANONYMOUS", text)
    assert re.search(r" INFO kcli.broker.audit: Requested deletion of partitions \[2\] of topic shrunk "
                     r"\(KIP-694, delay 3600000 ms\) \(principal User:ANONYMOUS from 127.0.0.1\)", text), text[-3000:]
    assert re.search(r" INFO kcli.broker.partition_reducer: partitions \[2\] of shrunk are read-only", text)
