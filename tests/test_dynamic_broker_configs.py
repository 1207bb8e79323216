"""Dynamic broker configs (IncrementalAlterConfigs/AlterConfigs on the BROKER resource) with real
clients against real broker processes: the cluster-wide default (resource "") and this broker's own
(its node id), persisted as ConfigRecords, effective at once for topics without an override, and
described with Kafka's sources and synonyms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, ResourceType
from kio.schema.errors import ErrorCode

from kcli.protocol.client import WireClient
from tests.fixtures_cli import cli_env, run_kcli  # noqa: F401 - fixture
from tests.fixtures_pg import pg_database, pg_server  # noqa: F401 - fixtures
from tests.kafka_helpers import admin, create_topic, produce

DYNAMIC_DEFAULT, DYNAMIC_BROKER = "DYNAMIC_DEFAULT_BROKER_CONFIG", "DYNAMIC_BROKER_CONFIG"
STATIC, DEFAULT, TOPIC = "STATIC_BROKER_CONFIG", "DEFAULT_CONFIG", "DYNAMIC_TOPIC_CONFIG"


SOURCES = {1: TOPIC, 2: DYNAMIC_BROKER, 3: DYNAMIC_DEFAULT, 4: STATIC, 5: DEFAULT}


class AlterError(Exception):
    pass


def set_broker(bootstrap: str, name: str, configs: dict[str, str | None], *, validate_only: bool = False) -> None:
    """IncrementalAlterConfigs on a BROKER resource. Neither librdkafka (ConfigResource(4,) is
    invalid) nor kafka-python (broker names must be integers) sends the empty name of the
    cluster-wide default, as Java's kafka-configs.sh --entity-default does: that goes as a raw
    request; a node id goes through confluent-kafka."""
    if name == "":
        body = {"resources": [{"resource_type": 4, "resource_name": "", "configs": [
            {"name": k, "config_operation": 0 if v is not None else 1, "value": v} for k, v in configs.items()]}],
            "validate_only": validate_only}
        with WireClient(bootstrap) as client:
            r = client.request(44, 1, body).responses[0]
        if r.error_code != 0:
            raise AlterError(f"{ErrorCode(r.error_code).name}: {r.error_message}")
        return
    ops = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET if v is not None else AlterConfigOpType.DELETE)
           for k, v in configs.items()]
    res = ConfigResource(ResourceType.BROKER, name, incremental_configs=ops)
    a = admin(bootstrap)
    for fut in a.incremental_alter_configs([res], validate_only=validate_only).values():
        fut.result(20)


def describe(bootstrap: str, rtype: ResourceType, name: str, synonyms: bool = False) -> dict:
    """DescribeConfigs: {name: (value, source, [(synonym name, value, source)], read_only)} with
    source names. kafka-python when synonyms are asked (confluent-kafka keys synonyms by name, so a
    config set at two levels shows once), raw for the "" broker resource, else confluent-kafka."""
    if rtype == ResourceType.BROKER and name == "":
        with WireClient(bootstrap) as client:
            r = client.request(32, 4, {"resources": [{"resource_type": 4, "resource_name": "", "configuration_keys": None}],
                                       "include_synonyms": synonyms, "include_documentation": False}).results[0]
        assert r.error_code == 0, r.error_message
        return {c.name: (c.value, SOURCES[c.config_source], [(x.name, x.value, SOURCES[x.source]) for x in c.synonyms],
                         c.read_only) for c in r.configs}
    if synonyms:
        from kafka import KafkaAdminClient
        from kafka.admin import ConfigResource as KpResource

        a = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            out = a.describe_configs([KpResource(rtype.name, name)], include_synonyms=True, config_filter="all")
        finally:
            a.close()
        return {k: (c["value"], c["config_source"], [(s["name"], s["value"], s["source"]) for s in c.get("synonyms", [])],
                    c["read_only"]) for k, c in out[rtype.name.lower()][name].items()}
    a = admin(bootstrap)  # alive until the future resolves
    fs = a.describe_configs([ConfigResource(rtype, name)], request_timeout=20)
    entries = next(iter(fs.values())).result(20)
    return {k: (e.value, ConfigSource(e.source).name, [], e.is_read_only) for k, e in entries.items()}


def metadata_records(data_dir: Path) -> list[dict]:
    lines = (data_dir / "__cluster_metadata" / "metadata.log").read_text().splitlines()
    return [json.loads(line.split(" ", 1)[1]) for line in lines if line]


def vs(entry: tuple) -> tuple:
    return entry[0], entry[1]


def test_cluster_default_and_per_broker_configs(broker_factory) -> None:  # noqa: ANN001
    b = broker_factory({"log.retention.bytes": "5000000"})
    bs = b.bootstrap
    create_topic(bs, "plain")
    create_topic(bs, "own", config={"retention.ms": "1234"})

    set_broker(bs, "", {"log.retention.ms": "3600000", "log.cleanup.policy": "compact"})
    # Kafka's default broker resource lists only the cluster-wide dynamic defaults
    d = describe(bs, ResourceType.BROKER, "")
    assert {k: vs(e) for k, e in d.items()} == {
        "log.cleanup.policy": ("compact", DYNAMIC_DEFAULT), "log.retention.ms": ("3600000", DYNAMIC_DEFAULT)}

    t = describe(bs, ResourceType.TOPIC, "plain")
    assert vs(t["retention.ms"]) == ("3600000", DYNAMIC_DEFAULT)
    assert vs(t["cleanup.policy"]) == ("compact", DYNAMIC_DEFAULT)
    assert vs(t["retention.bytes"]) == ("5000000", STATIC)
    assert t["segment.bytes"][1] == DEFAULT
    t = describe(bs, ResourceType.TOPIC, "plain", synonyms=True)
    assert t["retention.ms"][2] == [("log.retention.ms", "3600000", DYNAMIC_DEFAULT), ("retention.ms", "604800000", DEFAULT)]
    own = describe(bs, ResourceType.TOPIC, "own", synonyms=True)
    assert vs(own["retention.ms"]) == ("1234", TOPIC)
    assert [x[2] for x in own["retention.ms"][2]] == [TOPIC, DYNAMIC_DEFAULT, DEFAULT]

    # this broker's own config (resource = its node id) overrides the cluster-wide default
    set_broker(bs, "1", {"log.retention.ms": "7200000"})
    assert vs(describe(bs, ResourceType.TOPIC, "plain")["retention.ms"]) == ("7200000", DYNAMIC_BROKER)
    br = describe(bs, ResourceType.BROKER, "1", synonyms=True)
    assert vs(br["log.retention.ms"]) == ("7200000", DYNAMIC_BROKER)
    assert br["log.retention.ms"][2] == [("log.retention.ms", "7200000", DYNAMIC_BROKER),
                                         ("log.retention.ms", "3600000", DYNAMIC_DEFAULT),
                                         ("log.retention.ms", "604800000", DEFAULT)]
    assert vs(br["log.retention.bytes"]) == ("5000000", STATIC)
    assert br["log.retention.ms"][3] is False and br["num.partitions"][3] is True
    assert vs(describe(bs, ResourceType.BROKER, "1")["log.retention.ms"]) == ("7200000", DYNAMIC_BROKER)

    # persisted as ConfigRecords of resource type BROKER, and kept across a restart
    recs = [r["data"] for r in metadata_records(b.data_dir) if r["type"] == "ConfigRecord" and r["data"]["resourceType"] == 4]
    assert {(r["resourceName"], r["name"], r["value"]) for r in recs} >= {
        ("", "log.retention.ms", "3600000"), ("1", "log.retention.ms", "7200000"), ("", "log.cleanup.policy", "compact")}
    b.restart()
    assert vs(describe(bs, ResourceType.TOPIC, "plain")["retention.ms"]) == ("7200000", DYNAMIC_BROKER)

    # deleting falls back level by level
    set_broker(bs, "1", {"log.retention.ms": None})
    assert describe(bs, ResourceType.TOPIC, "plain")["retention.ms"][1] == DYNAMIC_DEFAULT
    set_broker(bs, "", {"log.retention.ms": None, "log.cleanup.policy": None})
    assert vs(describe(bs, ResourceType.TOPIC, "plain")["retention.ms"]) == ("604800000", DEFAULT)
    assert describe(bs, ResourceType.BROKER, "") == {}


def test_read_only_bad_value_and_unknown_refused(broker) -> None:  # noqa: ANN001
    bs = broker.bootstrap
    with pytest.raises(KafkaException) as err:
        set_broker(bs, "1", {"num.partitions": "3"})
    assert err.value.args[0].name() == "INVALID_REQUEST"
    assert "Cannot update these configs dynamically: Set(num.partitions)" in err.value.args[0].str()
    with pytest.raises(AlterError, match="invalid_request: .*Cannot update these configs dynamically: Set.num.partitions"):
        set_broker(bs, "", {"num.partitions": "3"})
    with pytest.raises(KafkaException) as err:
        set_broker(bs, "1", {"log.retention.ms": "soon"})
    assert err.value.args[0].name() == "INVALID_REQUEST" and "log.retention.ms" in err.value.args[0].str()
    with pytest.raises(KafkaException) as err:
        set_broker(bs, "1", {"no.such.config": "1"})
    assert err.value.args[0].name() == "INVALID_CONFIG"
    # a validate-only change writes nothing
    set_broker(bs, "", {"log.retention.ms": "1000"}, validate_only=True)
    set_broker(bs, "1", {"log.retention.ms": "1000"}, validate_only=True)
    assert describe(bs, ResourceType.BROKER, "") == {}
    assert not [r for r in metadata_records(broker.data_dir) if r["type"] == "ConfigRecord"]


def test_alter_configs_replaces_the_broker_set(broker) -> None:  # noqa: ANN001
    bs = broker.bootstrap
    set_broker(bs, "1", {"log.retention.ms": "3600000", "log.segment.bytes": "2000000"})
    res = ConfigResource(ResourceType.BROKER, "1", set_config={"log.retention.bytes": "99999"})
    a = admin(bs)
    for fut in a.alter_configs([res]).values():
        fut.result(20)
    d = describe(bs, ResourceType.BROKER, "1")
    assert {k: e[0] for k, e in d.items() if e[1] == DYNAMIC_BROKER} == {"log.retention.bytes": "99999"}


def test_dynamic_default_is_effective_at_once(broker) -> None:  # noqa: ANN001
    """A smaller cluster-wide log.segment.bytes rolls the segments of a topic without its own
    override at once, not only after a restart."""
    bs = broker.bootstrap
    create_topic(bs, "rolls")
    produce(bs, "rolls", [b"x" * 200] * 5)
    segs = lambda: sorted((broker.data_dir / "rolls-0").glob("*.log"))  # noqa: E731
    assert len(segs()) == 1
    set_broker(bs, "", {"log.segment.bytes": "2048"})
    produce(bs, "rolls", [b"y" * 300] * 30, **{"batch.num.messages": 1})
    assert len(segs()) > 3


def test_every_broker_of_a_cluster_applies_them(broker_factory, pg_database, tmp_path) -> None:  # noqa: ANN001, F811
    """In a cluster the BROKER ConfigRecords go through PostgreSQL like every other record: the
    cluster-wide default set on broker 1 is in effect on broker 2 at once, and a per-broker config
    of broker 2 stays broker 2's."""
    from tests.test_cluster_topics import start
    from tests.test_cluster_state import wait_for

    b1 = start(broker_factory, pg_database, 1, "rack-a", tmp_path / "objects")
    b2 = start(broker_factory, pg_database, 2, "rack-b", tmp_path / "objects")
    wait_for(lambda: len(admin(b1.bootstrap).list_topics(timeout=10).brokers) == 2, 10, "both brokers registered")
    create_topic(b1.bootstrap, "shared", partitions=2)
    set_broker(b1.bootstrap, "", {"log.retention.ms": "3600000"})
    wait_for(lambda: vs(describe(b2.bootstrap, ResourceType.TOPIC, "shared")["retention.ms"]) == ("3600000", DYNAMIC_DEFAULT),
             10, "broker 2 applied the cluster-wide default")
    assert vs(describe(b2.bootstrap, ResourceType.BROKER, "")["log.retention.ms"]) == ("3600000", DYNAMIC_DEFAULT)
    set_broker(b2.bootstrap, "2", {"log.retention.ms": "7200000"})
    assert vs(describe(b2.bootstrap, ResourceType.BROKER, "2")["log.retention.ms"]) == ("7200000", DYNAMIC_BROKER)
    wait_for(lambda: describe(b1.bootstrap, ResourceType.BROKER, "1")["log.retention.ms"][1] == DYNAMIC_DEFAULT, 10,
             "broker 1 keeps the cluster-wide default")
    assert vs(describe(b1.bootstrap, ResourceType.TOPIC, "shared")["retention.ms"]) == ("3600000", DYNAMIC_DEFAULT)
    # each broker refuses a per-broker resource of another node id, as Kafka's brokers do
    with WireClient(b1.bootstrap) as client:  # librdkafka sends a node id's resource to that node only
        r = client.request(44, 1, {"resources": [{"resource_type": 4, "resource_name": "2", "configs": [
            {"name": "log.retention.ms", "config_operation": 0, "value": "1"}]}], "validate_only": False}).responses[0]
    assert (r.error_code, r.error_message) == (ErrorCode.invalid_request,
                                               "Unexpected broker id, expected 1 or empty string, but received 2")
    # effective at once on broker 2's own logs: a smaller segment size rolls them
    set_broker(b1.bootstrap, "", {"log.segment.bytes": "2048"})
    wait_for(lambda: describe(b2.bootstrap, ResourceType.TOPIC, "shared")["segment.bytes"][0] == "2048", 10, "broker 2 has it")
    for _ in range(2):
        for p in (0, 1):
            produce(b1.bootstrap, "shared", [b"z" * 300] * 15, partition=p, **{"batch.num.messages": 1})
    for node in (b1, b2):
        counts = {d.name: len(list(d.glob("*.log"))) for d in node.data_dir.glob("shared-*")}
        assert counts and all(n > 2 for n in counts.values()), (node.data_dir.name, counts)


def test_kcli_topics_describe_shows_the_source(broker, cli_env) -> None:  # noqa: ANN001, F811
    """`kcli topics describe -o json` names where each non-default config comes from."""
    create_topic(broker.bootstrap, "src", config={"retention.bytes": "123456"})
    set_broker(broker.bootstrap, "", {"log.retention.ms": "3600000"})
    set_broker(broker.bootstrap, "1", {"log.segment.bytes": "2000000"})
    out = run_kcli(cli_env, "--bootstrap-server", broker.bootstrap, "-o", "json", "topics", "describe", "--topic", "src")
    assert out.returncode == 0, out.stderr
    [desc] = json.loads(out.stdout)
    assert desc["configs"] == {"retention.bytes": "123456", "retention.ms": "3600000", "segment.bytes": "2000000"}
    assert desc["config_sources"] == {"retention.bytes": "DYNAMIC_TOPIC_CONFIG", "retention.ms": "DYNAMIC_DEFAULT_BROKER_CONFIG",
                                      "segment.bytes": "DYNAMIC_BROKER_CONFIG"}


def test_defaults_checked_against_each_other_and_the_topics(broker_factory) -> None:  # noqa: ANN001
    """Kafka's DynamicLogConfig checks: local retention within total retention; and a compact
    default must not reach a tiered topic (remote storage is unsupported for compacted topics);
    classic and diskless topics compact."""
    b = broker_factory({"log.retention.ms": "100000", "remote.log.storage.system.enable": "true"})
    bs = b.bootstrap
    with pytest.raises(KafkaException) as err:
        set_broker(bs, "1", {"log.local.retention.ms": "200000"})
    assert err.value.args[0].name() == "INVALID_REQUEST"
    assert "Invalid value 200000 for configuration log.local.retention.ms: Value must not be more than log.retention.ms property value: 100000" in err.value.args[0].str()
    set_broker(bs, "1", {"log.local.retention.ms": "50000"})
    with pytest.raises(AlterError, match="log.local.retention.ms"):
        set_broker(bs, "", {"log.retention.ms": "10000"})  # below this broker's local retention
    create_topic(bs, "dl", config={"diskless.enable": "true"})
    create_topic(bs, "tt", config={"remote.storage.enable": "true"})
    with pytest.raises(AlterError, match="tiered topic tt"):
        set_broker(bs, "", {"log.cleanup.policy": "compact"})
    a = admin(bs)
    a.delete_topics(["tt"])["tt"].result(20)
    set_broker(bs, "", {"log.cleanup.policy": "compact"})  # classic and diskless topics left: both compact
    # a new tiered topic is checked against the dynamic default, not only the static one
    with pytest.raises(KafkaException) as err:
        create_topic(bs, "tt2", config={"remote.storage.enable": "true"})
    assert err.value.args[0].name() == "INVALID_CONFIG" and "Remote log storage" in err.value.args[0].str()
    create_topic(bs, "tt3", config={"remote.storage.enable": "true", "cleanup.policy": "delete"})


def describe_raw(bootstrap: str, name: str, keys: list[str] | None = None) -> dict:
    """DescribeConfigs v4 of a BROKER resource with synonyms and documentation: {name: entry}."""
    with WireClient(bootstrap) as client:
        r = client.request(32, 4, {"resources": [{"resource_type": 4, "resource_name": name, "configuration_keys": keys}],
                                   "include_synonyms": True, "include_documentation": True}).results[0]
    assert r.error_code == 0, r.error_message
    return {c.name: c for c in r.configs}


def test_kafka_broker_configs_kcli_does_not_implement(broker) -> None:  # noqa: ANN001
    """A broker config Kafka knows but kcli does not implement is accepted as Kafka accepts it:
    stored when Kafka can change it at run time (per broker, or cluster-wide), described with a
    note that it has no effect in kcli, kept across a restart; Kafka's read-only ones get Kafka's
    INVALID_REQUEST; only a name Kafka does not know either is INVALID_CONFIG."""
    bs = broker.bootstrap
    relogin = "sasl.kerberos.min.time.before.relogin"  # Kafka: per-broker
    set_broker(bs, "1", {relogin: "30000"})
    set_broker(bs, "", {"background.threads": "4"})  # Kafka: cluster-wide
    d = describe(bs, ResourceType.BROKER, "1")
    assert vs(d[relogin]) == ("30000", DYNAMIC_BROKER) and d[relogin][3] is False
    assert vs(d["background.threads"]) == ("4", DYNAMIC_DEFAULT)
    assert vs(describe(bs, ResourceType.BROKER, "")["background.threads"]) == ("4", DYNAMIC_DEFAULT)
    raw = describe_raw(bs, "1", [relogin, "background.threads", "num.partitions"])
    assert set(raw) == {relogin, "background.threads", "num.partitions"}
    assert "no effect in kcli" in raw[relogin].documentation
    assert "no effect in kcli" not in (raw["num.partitions"].documentation or "")
    assert [(s.name, s.value, SOURCES[s.source]) for s in raw[relogin].synonyms] == [(relogin, "30000", DYNAMIC_BROKER)]
    recs = [r["data"] for r in metadata_records(broker.data_dir) if r["type"] == "ConfigRecord"]
    assert {(r["resourceName"], r["name"], r["value"]) for r in recs} == {("1", relogin, "30000"), ("", "background.threads", "4")}
    broker.restart()
    assert vs(describe(bs, ResourceType.BROKER, "1")[relogin]) == ("30000", DYNAMIC_BROKER)

    # Kafka's answers: a per-broker config at the cluster-wide default, a read-only config, a bad value
    with pytest.raises(AlterError, match=f"invalid_request: .*Cannot update these configs at default cluster level, "
                                         f"broker id must be specified: Set.{relogin}."):
        set_broker(bs, "", {relogin: "30000"})
    with pytest.raises(KafkaException) as err:
        set_broker(bs, "1", {"auto.leader.rebalance.enable": "false"})
    assert err.value.args[0].name() == "INVALID_REQUEST"
    assert "Cannot update these configs dynamically: Set(auto.leader.rebalance.enable)" in err.value.args[0].str()
    with pytest.raises(KafkaException) as err:
        set_broker(bs, "1", {relogin: "soon"})
    assert err.value.args[0].name() == "INVALID_REQUEST" and relogin in err.value.args[0].str()
    with pytest.raises(KafkaException) as err:
        set_broker(bs, "1", {"sasl.kerberos.min.time.before.relogon": "1"})  # a typo: not Kafka's either
    assert err.value.args[0].name() == "INVALID_CONFIG" and "sasl.kerberos.min.time.before.relogon" in err.value.args[0].str()

    # deleted like any dynamic config; then no longer described
    set_broker(bs, "1", {relogin: None})
    set_broker(bs, "", {"background.threads": None})
    assert relogin not in describe(bs, ResourceType.BROKER, "1") and describe(bs, ResourceType.BROKER, "") == {}
