"""Authorization (ACLs): the StandardAuthorizer rules, the KRaft ACL records, the per-API checks
with real clients logged in as different principals (confluent-kafka, kafka-python, kcat),
CreateAcls/DescribeAcls/DeleteAcls, `kcli acls`, a restart and a two-broker cluster over PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from kcli.security.acl import AclBinding as KAcl
from kcli.security.acl import AclOperation as Op
from kcli.security.acl import Authorizer, PatternType, PermissionType
from kcli.security.acl import ResourceType as RT
from kcli.metadata.metadata_log import InvalidRecordError, MetadataLog, check_record, record
from kcli.security.sasl import UsersFile, hash_password
from kcli.protocol.client import WireClient
from tests.brokerproc import BrokerProcess
from tests.diskless_helpers import wait_until
from tests.fixtures_cli import assert_one_line_error, cli_env, run_kcli  # noqa: F401 - fixture
from tests.test_output_formats import assert_documented
from tests.fixtures_pg import pg_database, pg_server  # noqa: F401 - fixtures

USERS = ("admin", "alice", "bob", "carol", "tina", "ted")
AUTHZ = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
         "super.users": "User:admin", "group.initial.rebalance.delay.ms": "0"}
TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED, TXN_DENIED = 29, 30, 31, 53
UNKNOWN_PARTITION, NOT_ATTEMPTED = 3, 55


# --- the rules, without a broker ---------------------------------------------------------------


def acl(name: str, op: int, perm: int = PermissionType.ALLOW, principal: str = "User:alice", *,
        rtype: int = RT.TOPIC, pattern: int = PatternType.LITERAL, host: str = "*") -> KAcl:
    return KAcl(rtype, name, pattern, principal, host, op, perm)


def authorizer(*acls: KAcl, allow_if_none: bool = False, supers: tuple[str, ...] = ()) -> Authorizer:
    table = {str(i): a for i, a in enumerate(acls)}
    return Authorizer(lambda: table, supers, allow_if_none)


def test_deny_wins_and_wildcards_and_prefixes():
    az = authorizer(acl("*", Op.READ), acl("secret", Op.READ, PermissionType.DENY),
                    acl("logs-", Op.WRITE, pattern=PatternType.PREFIXED),
                    acl("logs-private", Op.WRITE, PermissionType.DENY, "User:*"))
    ok = lambda op, name, who="User:alice", host="10.0.0.1": az.authorize(who, host, op, RT.TOPIC, name)  # noqa: E731
    assert ok(Op.READ, "orders") and not ok(Op.READ, "secret")  # deny wins over the wildcard allow
    assert ok(Op.WRITE, "logs-app") and not ok(Op.WRITE, "logs") and not ok(Op.WRITE, "orders")
    assert not ok(Op.WRITE, "logs-private")  # a deny for User:* covers alice
    assert not ok(Op.READ, "orders", "User:bob")
    # implied: READ and WRITE allow DESCRIBE; a DENY of READ does not deny DESCRIBE
    assert ok(Op.DESCRIBE, "orders") and ok(Op.DESCRIBE, "logs-x") and ok(Op.DESCRIBE, "secret")
    assert not ok(Op.DELETE, "orders") and not ok(Op.DESCRIBE_CONFIGS, "orders")


def test_implied_operations_hosts_super_users_and_the_no_acl_default():
    az = authorizer(acl("t", Op.ALTER_CONFIGS), acl("g", Op.DELETE, rtype=RT.GROUP),
                    acl("h", Op.ALL, host="10.0.0.9"), supers=("User:root",))
    assert az.authorize("User:alice", "1.1.1.1", Op.DESCRIBE_CONFIGS, RT.TOPIC, "t")
    assert not az.authorize("User:alice", "1.1.1.1", Op.DESCRIBE, RT.TOPIC, "t")  # ALTER_CONFIGS implies only configs
    assert az.authorize("User:alice", "1.1.1.1", Op.DESCRIBE, RT.GROUP, "g")
    assert az.authorize("User:alice", "10.0.0.9", Op.WRITE, RT.TOPIC, "h")
    assert not az.authorize("User:alice", "10.0.0.8", Op.WRITE, RT.TOPIC, "h")
    assert az.authorize("User:root", "1.1.1.1", Op.DELETE, RT.CLUSTER, "kafka-cluster")
    # a resource no ACL names: the default decides; one named by any ACL (even bob's): denied
    assert not az.authorize("User:alice", "1.1.1.1", Op.READ, RT.TOPIC, "free")
    open_az = authorizer(acl("t", Op.READ, principal="User:bob"), allow_if_none=True)
    assert open_az.authorize("User:alice", "1.1.1.1", Op.READ, RT.TOPIC, "free")
    assert not open_az.authorize("User:alice", "1.1.1.1", Op.READ, RT.TOPIC, "t")
    assert az.authorized_operations("User:alice", "1.1.1.1", RT.TOPIC, "t") == (1 << Op.DESCRIBE_CONFIGS) | (1 << Op.ALTER_CONFIGS)
    assert az.authorize_many("User:alice", "1.1.1.1", [(Op.DESCRIBE, RT.GROUP, "g"), (Op.READ, RT.GROUP, "g")]) == [True, False]


def test_acl_records_are_checked_before_they_are_written(tmp_path):
    good = acl("orders", Op.READ).record_data(uuid.uuid4())
    check_record(record("AccessControlEntryRecord", **good))
    bad = [dict(good, resourceType=1), dict(good, patternType=2), dict(good, operation=1), dict(good, permissionType=1),
           dict(good, principal="alice"), dict(good, resourceName=""), dict(good, id="not-a-uuid"),
           dict(good, resourceType=int(RT.CLUSTER), resourceName="other")]
    log = MetadataLog(tmp_path)
    log.open()
    for d in bad:
        with pytest.raises(InvalidRecordError):
            log.append([record("AccessControlEntryRecord", **d)])
    log.append([record("AccessControlEntryRecord", **good)])
    log.close()
    replayed = MetadataLog(tmp_path)
    assert list(replayed.open().acls.values()) == [acl("orders", Op.READ)]
    replayed.append([record("RemoveAccessControlEntryRecord", id=good["id"])])
    replayed.close()
    assert MetadataLog(tmp_path).open().acls == {}


# --- real brokers and clients ------------------------------------------------------------------


def users_file(root: Path) -> Path:
    path = root / "plain-users"
    f = UsersFile.read(path, missing_ok=True)
    for u in USERS:
        f.set(u, hash_password(f"{u}-pw", "pbkdf2-sha256"))
    f.write()
    return path


def broker_configs(root: Path, **extra: str) -> dict[str, str]:
    return {"sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256", "sasl.plain.users.file": str(users_file(root)), **AUTHZ,
            **extra}


def conf(bootstrap: str, user: str) -> dict[str, str]:
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": user, "sasl.password": f"{user}-pw"}


_ADMINS: dict[tuple[str, str], AdminClient] = {}


def admin_of(bootstrap: str, user: str = "admin") -> AdminClient:
    """One client per broker and user, kept alive: a future of a collected client never resolves."""
    key = (bootstrap, user)
    if key not in _ADMINS:
        _ADMINS[key] = AdminClient(conf(bootstrap, user))
    return _ADMINS[key]


def allow(bootstrap: str, principal: str, op: AclOperation, rtype: ResourceType, name: str,
          pattern: ResourcePatternType = ResourcePatternType.LITERAL,
          perm: AclPermissionType = AclPermissionType.ALLOW) -> AclBinding:
    b = AclBinding(rtype, name, pattern, principal, "*", op, perm)
    admin_of(bootstrap).create_acls([b])[b].result(15)
    return b


def produce_errors(bootstrap: str, user: str, topic: str, **extra: Any) -> list[Any]:
    p = Producer({**conf(bootstrap, user), "enable.idempotence": False, "message.timeout.ms": 15000, **extra})
    out: list[Any] = []
    p.produce(topic, b"v", on_delivery=lambda err, _m: out.append(err))
    p.flush(20)
    assert out, "no delivery report"
    return out


def code_of(fut: Any) -> int:
    try:
        fut.result(15)
    except KafkaException as err:
        return err.args[0].code()
    return 0


def login(c: WireClient, user: str) -> WireClient:
    assert int(c.request(17, 1, {"mechanism": "PLAIN"}).error_code) == 0
    auth = c.request(36, 2, {"auth_bytes": f"\0{user}\0{user}-pw".encode()})
    assert int(auth.error_code) == 0, auth.error_message
    return c


@pytest.fixture(scope="module", autouse=True)
def _close_admin_clients() -> Iterator[None]:
    yield
    _ADMINS.clear()  # their brokers are gone: stop them reconnecting for the rest of the session


@pytest.fixture(scope="module")
def authz_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("acls")
    b = BrokerProcess(root / "data", broker_configs(root)).start()
    a = admin_of(b.bootstrap)
    for fut in a.create_topics([NewTopic(t, 1, 1) for t in ("orders", "secret", "logs-app", "other")]).values():
        fut.result(20)
    yield b
    b.stop()


def test_produce_needs_write_and_deny_wins(authz_broker):
    bs = authz_broker.bootstrap
    allow(bs, "User:alice", AclOperation.WRITE, ResourceType.TOPIC, "*")
    allow(bs, "User:alice", AclOperation.WRITE, ResourceType.TOPIC, "secret", perm=AclPermissionType.DENY)
    assert produce_errors(bs, "alice", "orders") == [None]
    [err] = produce_errors(bs, "alice", "secret")
    assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    [err] = produce_errors(bs, "bob", "orders")
    assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert produce_errors(bs, "admin", "secret") == [None]  # super user: no ACL needed
    # Kafka's authorizer logger: each denial is one INFO line naming who, what and where.
    # (bob, who may not even describe "orders", is refused by the producer's Metadata request.)
    log = wait_until(lambda: (t := authz_broker.log_text()) and "User:bob is Denied operation = DESCRIBE" in t and t,
                     20, what="the denial in the broker log")
    assert "Principal = User:alice is Denied operation = WRITE from host = 127.0.0.1 on resource = " \
        "Topic:LITERAL:secret for request = Produce" in log
    assert "on resource = Topic:LITERAL:orders for request = Metadata" in log


def test_prefixed_acls_and_metadata_hides_topics(authz_broker):
    bs = authz_broker.bootstrap
    allow(bs, "User:bob", AclOperation.WRITE, ResourceType.TOPIC, "logs-", ResourcePatternType.PREFIXED)
    assert produce_errors(bs, "bob", "logs-app") == [None]
    md = admin_of(bs, "bob").list_topics(timeout=15)
    assert sorted(md.topics) == ["logs-app"]  # WRITE implies DESCRIBE; the others are not even listed
    # Hidden from an all-topics answer without a denial line (Kafka: logIfDenied off there).
    assert "User:bob is Denied operation = DESCRIBE from host = 127.0.0.1 on resource = Topic:LITERAL:secret" \
        not in authz_broker.log_text()
    assert admin_of(bs, "bob").list_topics("other", timeout=15).topics["other"].error.code() == \
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    # with the authorized operations asked for (Metadata v8+/v10+): what bob may do on logs-app
    described = admin_of(bs, "bob").describe_topics(TopicCollection(["logs-app"]), include_authorized_operations=True)
    ops = set(described["logs-app"].result(15).authorized_operations)
    assert ops == {AclOperation.WRITE, AclOperation.DESCRIBE}


def test_fetch_and_list_offsets_per_topic(authz_broker):
    bs = authz_broker.bootstrap
    produce_errors(bs, "admin", "other")
    allow(bs, "User:bob", AclOperation.DESCRIBE, ResourceType.TOPIC, "other")  # ListOffsets yes, Fetch no
    allow(bs, "User:bob", AclOperation.READ, ResourceType.TOPIC, "logs-app")

    def fetch(c: WireClient) -> dict[str, int]:
        r = c.request(1, 11, {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                              "isolation_level": 0, "session_id": 0, "session_epoch": -1, "rack_id": "",
                              "topics": [{"topic": t, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                                                      "fetch_offset": 0, "log_start_offset": -1,
                                                                      "partition_max_bytes": 1 << 20}]}
                                         for t in ("other", "logs-app")], "forgotten_topics_data": []})
        return {t.topic: int(t.partitions[0].error_code) for t in r.responses}

    with WireClient(bs) as c:
        login(c, "bob")
        assert fetch(c) == {"other": TOPIC_DENIED, "logs-app": 0}
        r = c.request(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": t, "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1}]}
            for t in ("other", "secret")]})
        assert {t.name: int(t.partitions[0].error_code) for t in r.topics} == {"other": 0, "secret": TOPIC_DENIED}
    c2 = Consumer({**conf(bs, "bob"), "group.id": "unused"})  # librdkafka: the same answer for ListOffsets
    try:
        assert c2.get_watermark_offsets(TopicPartition("other", 0), timeout=15)[1] >= 1
    finally:
        c2.close()


def test_share_fetch_needs_read_on_the_group_and_on_each_topic(authz_broker):
    """KIP-932's ShareFetch and ShareAcknowledge: READ on the share group, then READ per topic; a
    denied topic's partitions answer TOPIC_AUTHORIZATION_FAILED, the allowed one reaches the handler."""
    bs = authz_broker.bootstrap
    produce_errors(bs, "admin", "other")
    produce_errors(bs, "admin", "logs-app")
    allow(bs, "User:bob", AclOperation.READ, ResourceType.TOPIC, "logs-app")
    allow(bs, "User:bob", AclOperation.READ, ResourceType.GROUP, "sg-authz")
    with WireClient(bs) as a:
        md = login(a, "admin").request(3, 12, {"topics": [{"name": t, "topic_id": None} for t in ("other", "logs-app")],
                                               "allow_auto_topic_creation": False,
                                               "include_topic_authorized_operations": False})
    ids = {t.name: t.topic_id for t in md.topics}
    with WireClient(bs) as c:
        login(c, "bob")
        topics = [{"topic_id": ids[t], "partitions": [{"partition_index": 0, "acknowledgement_batches": []}]}
                  for t in ("other", "logs-app")]

        def codes(resp: Any) -> dict[str, int]:
            names = {v: k for k, v in ids.items()}
            return {names[t.topic_id]: int(t.partitions[0].error_code) for t in resp.responses}

        fetch = {"member_id": str(uuid.uuid4()), "share_session_epoch": 0, "max_wait": 0, "min_bytes": 0,
                 "max_bytes": 1 << 20, "max_records": 100, "batch_size": 100, "topics": topics,
                 "forgotten_topics_data": []}
        r = c.request(78, 1, {"group_id": "sg-authz", **fetch})
        assert codes(r).get("other") == TOPIC_DENIED and codes(r).get("logs-app") != TOPIC_DENIED, r
        r = c.request(78, 1, {"group_id": "sg-other", **fetch})
        assert int(r.error_code) == GROUP_DENIED
        r = c.request(79, 1, {"group_id": "sg-authz", "member_id": fetch["member_id"], "share_session_epoch": 1,
                              "topics": topics})
        assert codes(r).get("other") == TOPIC_DENIED, r


def test_admin_apis_answer_per_entry(authz_broker):
    bs = authz_broker.bootstrap
    alice = admin_of(bs, "alice")
    allow(bs, "User:alice", AclOperation.CREATE, ResourceType.TOPIC, "alice-", ResourcePatternType.PREFIXED)
    fs = alice.create_topics([NewTopic("alice-1", 1, 1), NewTopic("nope-1", 1, 1)])
    assert code_of(fs["alice-1"]) == 0 and code_of(fs["nope-1"]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    for user, shown in (("alice", False), ("admin", True)):  # the new topic's configs only with DESCRIBE_CONFIGS
        with WireClient(bs) as c:
            r = login(c, user).request(19, 7, {"topics": [{"name": f"alice-by-{user}", "num_partitions": 1,
                                                           "replication_factor": 1, "assignments": [], "configs": []}],
                                               "timeout": 10000, "validate_only": False})
            assert (int(r.topics[0].error_code), r.topics[0].configs is not None) == (0, shown)
    assert code_of(alice.delete_topics(["orders"], operation_timeout=10)["orders"]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert code_of(alice.create_partitions([NewPartitions("orders", 2)])["orders"]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    res = alice.describe_configs([ConfigResource("topic", "orders"), ConfigResource("broker", "1")])
    codes = {r.name: code_of(f) for r, f in res.items()}
    assert codes == {"orders": KafkaError.TOPIC_AUTHORIZATION_FAILED, "1": KafkaError.CLUSTER_AUTHORIZATION_FAILED}
    allow(bs, "User:alice", AclOperation.ALTER_CONFIGS, ResourceType.TOPIC, "orders")
    res = alice.describe_configs([ConfigResource("topic", "orders")])  # ALTER_CONFIGS implies DESCRIBE_CONFIGS
    assert [code_of(f) for f in res.values()] == [0]
    with WireClient(bs) as c:  # DeleteRecords: DELETE on the topic
        r = login(c, "alice").request(21, 2, {"topics": [{"name": "orders", "partitions": [{"partition_index": 0, "offset": 0}]}],
                                              "timeout": 5000})
        assert int(r.topics[0].partitions[0].error_code) == TOPIC_DENIED
        # ACL APIs and SCRAM APIs need the cluster: alice has no ACL there
        assert int(c.request(29, 1, {"resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 1,
                                     "principal_filter": None, "host_filter": None, "operation": 1,
                                     "permission_type": 1}).error_code) == CLUSTER_DENIED
        assert int(c.request(60, 0, {"include_cluster_authorized_operations": True}).error_code) == CLUSTER_DENIED
    idempotent = {"transactional_id": None, "transaction_timeout": 60000, "producer_id": -1, "producer_epoch": -1}
    with WireClient(bs) as c:  # an idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE on some topic
        login(c, "carol")  # carol may write nowhere
        assert int(c.request(22, 4, idempotent).error_code) == CLUSTER_DENIED
        allow(bs, "User:carol", AclOperation.IDEMPOTENT_WRITE, ResourceType.BROKER, "kafka-cluster")
        assert int(c.request(22, 4, idempotent).error_code) == 0
    with WireClient(bs) as c:
        login(c, "bob")
        allow(bs, "User:bob", AclOperation.WRITE, ResourceType.TOPIC, "logs-", ResourcePatternType.PREFIXED)
        assert int(c.request(22, 4, idempotent).error_code) == 0
        # transactional ids: DESCRIBE to find the coordinator, WRITE to init
        assert int(c.request(10, 3, {"key": "tx-1", "key_type": 1}).error_code) == TXN_DENIED
        assert int(c.request(22, 4, {"transactional_id": "tx-1", "transaction_timeout": 60000, "producer_id": -1,
                                     "producer_epoch": -1}).error_code) == TXN_DENIED
        allow(bs, "User:bob", AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, "tx-1")
        assert int(c.request(10, 3, {"key": "tx-1", "key_type": 1}).error_code) != TXN_DENIED


def test_groups_need_group_acls(authz_broker):
    bs = authz_broker.bootstrap
    allow(bs, "User:bob", AclOperation.READ, ResourceType.TOPIC, "orders")
    produce_errors(bs, "admin", "orders")

    def consume(group: str) -> Any:
        c = Consumer({**conf(bs, "bob"), "group.id": group, "auto.offset.reset": "earliest"})
        try:
            c.subscribe(["orders"])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                msg = c.poll(0.5)
                if msg is not None:
                    if msg.error() is None:
                        c.commit(msg, asynchronous=False)
                    return msg.error()
            raise AssertionError("no message and no error")
        finally:
            c.close()

    err = consume("bob-group")
    assert err is not None and err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    allow(bs, "User:bob", AclOperation.READ, ResourceType.GROUP, "bob-", ResourcePatternType.PREFIXED)
    assert consume("bob-group") is None  # joined, read and committed
    bob, admin = admin_of(bs, "bob"), admin_of(bs)
    assert [g.group_id for g in bob.list_consumer_groups().result(15).valid] == ["bob-group"]
    assert {g.group_id for g in admin.list_consumer_groups().result(15).valid} >= {"bob-group"}
    desc = bob.describe_consumer_groups(["bob-group"], include_authorized_operations=True)["bob-group"].result(15)
    assert set(desc.authorized_operations) == {AclOperation.READ, AclOperation.DESCRIBE}
    assert code_of(bob.delete_consumer_groups(["bob-group"])["bob-group"]) == KafkaError.GROUP_AUTHORIZATION_FAILED
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("bob-group")])["bob-group"].result(15)
    assert offsets.topic_partitions[0].offset >= 1  # bob's commit went through


def test_scram_users_are_principals_too(authz_broker):
    bs = authz_broker.bootstrap
    upsert = UserScramCredentialUpsertion("erin", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"erin-pw")
    admin_of(bs).alter_user_scram_credentials([upsert])["erin"].result(15)  # ALTER on the cluster: a super user
    erin = {"sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "erin", "sasl.password": "erin-pw"}
    [err] = produce_errors(bs, "erin", "orders", **erin)
    assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    allow(bs, "User:erin", AclOperation.WRITE, ResourceType.TOPIC, "orders")
    assert produce_errors(bs, "erin", "orders", **erin) == [None]
    # and bob, no super user, may not manage SCRAM credentials
    bob_upsert = UserScramCredentialUpsertion("bob2", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"x")
    assert code_of(admin_of(bs, "bob").alter_user_scram_credentials([bob_upsert])["bob2"]) == \
        KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_kafka_python_and_kcat(authz_broker):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import TopicAuthorizationFailedError

    bs = authz_broker.bootstrap
    kp = dict(bootstrap_servers=bs, security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
              sasl_plain_username="alice", sasl_plain_password="alice-pw")
    allow(bs, "User:alice", AclOperation.READ, ResourceType.TOPIC, "orders")
    allow(bs, "User:alice", AclOperation.WRITE, ResourceType.TOPIC, "orders")  # also lets it be idempotent
    prod = KafkaProducer(**kp)
    try:
        prod.send("orders", b"from-kafka-python").get(timeout=20)
        with pytest.raises(TopicAuthorizationFailedError):
            prod.send("secret", b"x").get(timeout=20)
    finally:
        prod.close()
    cons = KafkaConsumer("orders", **kp, auto_offset_reset="earliest", consumer_timeout_ms=10000)
    try:
        assert b"from-kafka-python" in [m.value for m in cons]
    finally:
        cons.close()
    # kafka-python's admin client speaks CreateAcls / DescribeAcls / DeleteAcls too
    from kafka.admin import (ACL, ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType, KafkaAdminClient,
                             ResourcePattern, ResourcePatternFilter)
    from kafka.admin import ResourceType as KpResourceType

    kadmin = KafkaAdminClient(**{**kp, "sasl_plain_username": "admin", "sasl_plain_password": "admin-pw"})
    try:
        kacl = ACL("User:frank", "*", ACLOperation.READ, ACLPermissionType.ALLOW,
                   ResourcePattern(KpResourceType.TOPIC, "kp-", ACLResourcePatternType.PREFIXED))
        assert kadmin.create_acls([kacl])["failed"] == []
        flt = ACLFilter("User:frank", None, ACLOperation.ANY, ACLPermissionType.ANY,
                        ResourcePatternFilter(KpResourceType.ANY, None, ACLResourcePatternType.ANY))
        described, error = kadmin.describe_acls(flt)
        assert error.errno == 0 and [(a.resource_pattern.resource_name, a.operation) for a in described] == \
            [("kp-", ACLOperation.READ)]
        [(_, deleted, error)] = kadmin.delete_acls([flt])
        assert error.errno == 0 and len(deleted) == 1
    finally:
        kadmin.close()
    kcat = ["kcat", "-b", bs, "-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanism=PLAIN",
            "-X", "sasl.username=bob", "-X", "sasl.password=bob-pw", "-L", "-J"]
    listed = json.loads(subprocess.run(kcat, capture_output=True, text=True, timeout=30, check=True).stdout)
    assert "secret" not in {t["topic"] for t in listed["topics"]}


def test_acl_apis_filters_and_cli(authz_broker, cli_env):  # noqa: F811
    bs = authz_broker.bootstrap
    ctx = ["context", "set", "adm", "--bootstrap-server", bs]
    for k, v in conf(bs, "admin").items():
        if k != "bootstrap.servers":
            ctx += ["--property", f"{k}={v}"]
    assert run_kcli(cli_env, *ctx).returncode == 0

    def kcli(*args: str) -> Any:
        return run_kcli(cli_env, "--context", "adm", "acls", *args)

    out = kcli("create", "--allow-principal", "User:dave", "--operation", "Read", "--operation", "Describe",
               "--topic", "cli-", "--resource-pattern-type", "prefixed", "-o", "json")
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)) == 2
    assert_documented("kcli acls create", json.loads(out.stdout))
    assert kcli("create", "--allow-principal", "User:dave", "--operation", "Read", "--group", "cli-group").returncode == 0
    allow(bs, "User:dave", AclOperation.DESCRIBE_CONFIGS, ResourceType.TOPIC, "*")
    # match: every ACL that applies to the name: the prefix, and the literal "*"
    listed = json.loads(kcli("list", "--topic", "cli-x", "--resource-pattern-type", "match", "--principal", "User:dave",
                             "-o", "json").stdout)
    assert_documented("kcli acls list", listed)
    assert {(a["resource_name"], a["operation"]) for a in listed} == {("cli-", "READ"), ("cli-", "DESCRIBE"),
                                                                     ("*", "DESCRIBE_CONFIGS")}
    table = kcli("list", "--principal", "User:dave").stdout
    assert "cli-group" in table and "PRINCIPAL" in table
    assert_one_line_error(kcli("create", "--allow-principal", "carol", "--topic", "x"), 2, "TYPE:NAME")
    assert_one_line_error(kcli("create", "--allow-principal", "User:c", "--group", "g", "--operation", "Write"), 2, "Write")
    gone = json.loads(kcli("delete", "--topic", "cli-", "--resource-pattern-type", "prefixed", "--operation", "Read",
                           "-o", "json").stdout)
    assert_documented("kcli acls delete", gone)
    assert [(a["resource_name"], a["operation"]) for a in gone] == [("cli-", "READ")]
    left = admin_of(bs).describe_acls(AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:dave",
                                                       None, AclOperation.ANY, AclPermissionType.ANY)).result(15)
    assert {(b.name, b.operation) for b in left} == {("cli-", AclOperation.DESCRIBE), ("cli-group", AclOperation.READ),
                                                     ("*", AclOperation.DESCRIBE_CONFIGS)}
    # bob may not change ACLs: CLUSTER_AUTHORIZATION_FAILED per creation, nothing written
    b = AclBinding(ResourceType.TOPIC, "x", ResourcePatternType.LITERAL, "User:bob", "*", AclOperation.ALL,
                   AclPermissionType.ALLOW)
    assert code_of(admin_of(bs, "bob").create_acls([b])[b]) == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_invalid_acls_are_refused_per_creation(authz_broker):
    with WireClient(authz_broker.bootstrap) as c:
        login(c, "admin")
        base = {"resource_type": 2, "resource_name": "t", "resource_pattern_type": 3, "principal": "User:x",
                "host": "*", "operation": 3, "permission_type": 3}
        r = c.request(30, 1, {"creations": [base, {**base, "principal": "x"}, {**base, "resource_pattern_type": 2},
                                            {**base, "resource_type": 4, "resource_name": "c"}]})
        assert [int(x.error_code) for x in r.results] == [0, 42, 42, 42]
        r = c.request(31, 1, {"filters": [{"resource_type_filter": 2, "resource_name_filter": "t",
                                           "pattern_type_filter": 3, "principal_filter": "User:x",
                                           "host_filter": None, "operation": 1, "permission_type": 1},
                                          {"resource_type_filter": 0, "resource_name_filter": None,
                                           "pattern_type_filter": 1, "principal_filter": None,
                                           "host_filter": None, "operation": 1, "permission_type": 1}]})
        assert [int(x.error_code) for x in r.filter_results] == [0, 42]
        assert [m.resource_name for m in r.filter_results[0].matching_acls] == ["t"]


def test_without_an_authorizer_everything_is_allowed_and_acl_apis_are_disabled(broker_factory, tmp_path):
    b = broker_factory({"sasl.enabled.mechanisms": "PLAIN", "sasl.plain.users.file": str(users_file(tmp_path))})
    assert produce_errors(b.bootstrap, "bob", "anything") == [None]  # auto-created, written
    with WireClient(b.bootstrap) as c:
        r = login(c, "bob").request(29, 1, {"resource_type_filter": 1, "resource_name_filter": None,
                                            "pattern_type_filter": 1, "principal_filter": None, "host_filter": None,
                                            "operation": 1, "permission_type": 1})
        assert int(r.error_code) == 54 and r.error_message == "No Authorizer is configured."
        md = c.request(3, 10, {"topics": None, "allow_auto_topic_creation": False,
                               "include_cluster_authorized_operations": True,
                               "include_topic_authorized_operations": True})
        assert md.cluster_authorized_operations > 0 and all(t.topic_authorized_operations > 0 for t in md.topics)


def test_allow_everyone_if_no_acl_found_and_acls_survive_a_restart(tmp_path):
    b = BrokerProcess(tmp_path / "data", broker_configs(tmp_path, **{"allow.everyone.if.no.acl.found": "true"})).start()
    try:
        assert produce_errors(b.bootstrap, "bob", "free") == [None]  # no ACL names "free": allowed
        allow(b.bootstrap, "User:alice", AclOperation.WRITE, ResourceType.TOPIC, "free")
        [err] = produce_errors(b.bootstrap, "bob", "free")  # now an ACL names it: bob is not in it
        assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        b.stop()
        b.start()
        [err] = produce_errors(b.bootstrap, "bob", "free")
        assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert produce_errors(b.bootstrap, "alice", "free") == [None]
        acls = admin_of(b.bootstrap).describe_acls(AclBindingFilter(
            ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY)).result(15)
        assert [(a.principal, a.name) for a in acls] == [("User:alice", "free")]
    finally:
        b.stop()


def test_acls_apply_on_every_broker_of_a_cluster(broker_factory, tmp_path, pg_database):  # noqa: F811
    configs = {**broker_configs(tmp_path), "broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500"}
    b1 = broker_factory(configs, name="node1", extra_args=["--cluster", pg_database, "--node-id", "1"])
    b2 = broker_factory(configs, name="node2", extra_args=["--cluster", pg_database, "--node-id", "2"])
    admin_of(b1.bootstrap).create_topics([NewTopic("shared", 1, 1)])["shared"].result(20)
    with WireClient(b2.bootstrap) as c:
        login(c, "alice")

        def alice_describes() -> bool:
            md = c.request(3, 12, {"topics": [{"name": "shared", "topic_id": None}], "allow_auto_topic_creation": False,
                                   "include_topic_authorized_operations": False})
            return int(md.topics[0].error_code) != TOPIC_DENIED

        assert not alice_describes()
        allow(b1.bootstrap, "User:alice", AclOperation.DESCRIBE, ResourceType.TOPIC, "shared")  # through broker 1
        deadline = time.monotonic() + 20
        while not alice_describes():  # broker 2 learns the record from PostgreSQL (NOTIFY, else its poll)
            assert time.monotonic() < deadline
            time.sleep(0.3)
        admin_of(b2.bootstrap).delete_acls([AclBindingFilter(ResourceType.TOPIC, "shared", ResourcePatternType.ANY,
                                                             None, None, AclOperation.ANY, AclPermissionType.ANY)])
        deadline = time.monotonic() + 20
        while True:
            with WireClient(b1.bootstrap) as c1:
                md = login(c1, "alice").request(3, 12, {"topics": [{"name": "shared", "topic_id": None}],
                                                        "allow_auto_topic_creation": False,
                                                        "include_topic_authorized_operations": False})
            if int(md.topics[0].error_code) == TOPIC_DENIED:
                break
            assert time.monotonic() < deadline
            time.sleep(0.3)


def txn_producer(bootstrap: str, user: str, tid: str) -> Producer:
    return Producer({**conf(bootstrap, user), "transactional.id": tid, "linger.ms": 5, "message.timeout.ms": 15000})


def txn_error(fn: Any, *args: Any) -> Any:
    """The KafkaError a transactional producer call fails with."""
    with pytest.raises(KafkaException) as raised:
        fn(*args)
    return raised.value.args[0]


def test_transactional_producer_needs_write_on_its_id_and_topics(authz_broker):
    bs = authz_broker.bootstrap
    for fut in admin_of(bs).create_topics([NewTopic(t, 1, 1) for t in ("txa", "txb")]).values():
        fut.result(20)
    allow(bs, "User:tina", AclOperation.WRITE, ResourceType.TOPIC, "txa")
    err = txn_error(txn_producer(bs, "tina", "tina-tx").init_transactions, 20)
    assert err.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED and err.fatal()
    allow(bs, "User:tina", AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, "tina-", ResourcePatternType.PREFIXED)
    p = txn_producer(bs, "tina", "tina-tx")
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("txa", b"committed")
    p.commit_transaction(30)  # AddPartitionsToTxn, Produce, EndTxn: all allowed
    # a topic without WRITE: AddPartitionsToTxn refuses it, the transaction can only be aborted
    p.begin_transaction()
    reports: dict[str, Any] = {}
    p.produce("txa", b"aborted", on_delivery=lambda e, m: reports.setdefault(m.topic(), e))
    p.produce("txb", b"refused", on_delivery=lambda e, m: reports.setdefault(m.topic(), e))
    assert txn_error(p.commit_transaction, 30).txn_requires_abort()
    assert reports["txb"].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, reports
    p.abort_transaction(30)
    # offsets in a transaction: READ on the group (AddOffsetsToTxn), READ on the topic (TxnOffsetCommit)
    c = Consumer({**conf(bs, "tina"), "group.id": "tina-group"})
    meta = c.consumer_group_metadata()
    for grant in ((AclOperation.READ, ResourceType.GROUP, "tina-group"), (AclOperation.READ, ResourceType.TOPIC, "txa"),
                  None):
        p.begin_transaction()
        p.produce("txa", b"with-offsets")
        try:
            p.send_offsets_to_transaction([TopicPartition("txa", 0, 1)], meta, 30)
            p.commit_transaction(30)
            assert grant is None, f"committed without {grant}"
        except KafkaException as raised:
            assert grant is not None, raised
            want = KafkaError.GROUP_AUTHORIZATION_FAILED if grant[1] == ResourceType.GROUP else \
                KafkaError.TOPIC_AUTHORIZATION_FAILED
            assert raised.args[0].code() == want, raised
            p.abort_transaction(30)
            allow(bs, "User:tina", *grant)
    c.close()
    offsets = admin_of(bs).list_consumer_group_offsets([ConsumerGroupTopicPartitions("tina-group")])
    assert [tp.offset for tp in offsets["tina-group"].result(15).topic_partitions] == [1]
    reader = Consumer({**conf(bs, "admin"), "group.id": "tina-check", "isolation.level": "read_committed",
                       "auto.offset.reset": "earliest"})
    reader.assign([TopicPartition("txa", 0, 0)])
    seen: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(seen) < 2 and time.monotonic() < deadline:
        m = reader.poll(0.5)
        if m is not None and m.error() is None:
            seen.append(m.value())
    reader.close()
    assert seen == [b"committed", b"with-offsets"]
    # another principal may not touch tina's transactional id, nor even find its coordinator
    err = txn_error(txn_producer(bs, "ted", "tina-tx").init_transactions, 20)
    assert err.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_transaction_apis_answer_per_entry(authz_broker):
    """The wire answers: per partition for AddPartitionsToTxn, TxnOffsetCommit, DescribeProducers
    and WriteTxnMarkers; per id for DescribeTransactions; ListTransactions lists what may be described."""
    bs = authz_broker.bootstrap
    admin_of(bs).create_topics([NewTopic("txc", 2, 1)])["txc"].result(20)
    allow(bs, "User:tina", AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, "tina-", ResourcePatternType.PREFIXED)
    allow(bs, "User:tina", AclOperation.WRITE, ResourceType.TOPIC, "txc")

    def add_partitions(c: WireClient, tid: str, pid: int, epoch: int, topics: dict[str, list[int]]) -> dict[str, int]:
        r = c.request(24, 3, {"v3_and_below_transactional_id": tid, "v3_and_below_producer_id": pid,
                              "v3_and_below_producer_epoch": epoch,
                              "v3_and_below_topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]})
        return {f"{t.name}-{p.partition_index}": int(p.partition_error_code)
                for t in r.results_by_topic_v3_and_below for p in t.results_by_partition}

    with WireClient(bs) as tina, WireClient(bs) as ted:
        login(tina, "tina")
        login(ted, "ted")
        init = tina.request(22, 4, {"transactional_id": "tina-raw", "transaction_timeout": 60000, "producer_id": -1,
                                    "producer_epoch": -1})
        assert int(init.error_code) == 0
        pid, epoch = int(init.producer_id), int(init.producer_epoch)
        # one refused topic fails the whole request: the allowed partitions were not attempted
        assert add_partitions(tina, "tina-raw", pid, epoch, {"txc": [0, 1, 7], "secret": [0]}) == {
            "txc-0": NOT_ATTEMPTED, "txc-1": NOT_ATTEMPTED, "txc-7": UNKNOWN_PARTITION, "secret-0": TOPIC_DENIED}
        assert add_partitions(ted, "tina-raw", pid, epoch, {"txc": [0]}) == {"txc-0": TXN_DENIED}
        assert add_partitions(tina, "tina-raw", pid, epoch, {"txc": [0, 1]}) == {"txc-0": 0, "txc-1": 0}
        for who, code in ((ted, TXN_DENIED),):  # AddOffsetsToTxn, EndTxn: WRITE on the id
            assert int(who.request(25, 3, {"transactional_id": "tina-raw", "producer_id": pid, "producer_epoch": epoch,
                                           "group_id": "tina-g"}).error_code) == code
            assert int(who.request(26, 3, {"transactional_id": "tina-raw", "producer_id": pid, "producer_epoch": epoch,
                                           "committed": False}).error_code) == code
        assert int(tina.request(25, 3, {"transactional_id": "tina-raw", "producer_id": pid, "producer_epoch": epoch,
                                        "group_id": "not-tinas"}).error_code) == GROUP_DENIED
        allow(bs, "User:tina", AclOperation.READ, ResourceType.GROUP, "tina-g")
        assert int(tina.request(25, 3, {"transactional_id": "tina-raw", "producer_id": pid, "producer_epoch": epoch,
                                        "group_id": "tina-g"}).error_code) == 0
        commit = {"transactional_id": "tina-raw", "group_id": "tina-g", "producer_id": pid, "producer_epoch": epoch,
                  "generation_id": -1, "member_id": "", "group_instance_id": None,
                  "topics": [{"name": t, "partitions": [{"partition_index": 0, "committed_offset": 0,
                                                          "committed_leader_epoch": -1, "committed_metadata": ""}]}
                             for t in ("txc", "txa")]}
        r = tina.request(28, 3, commit)  # READ on txa (earlier test) but not on txc: per partition
        assert {t.name: int(t.partitions[0].error_code) for t in r.topics} == {"txc": TOPIC_DENIED, "txa": 0}
        r = ted.request(28, 3, commit)
        assert {t.name: int(t.partitions[0].error_code) for t in r.topics} == {"txc": TXN_DENIED, "txa": TXN_DENIED}
        # DescribeProducers: READ on the topic
        r = tina.request(61, 0, {"topics": [{"name": t, "partition_indexes": [0]} for t in ("txa", "txc")]})
        by_topic = {t.name: t.partitions[0] for t in r.topics}
        assert int(by_topic["txa"].error_code) == 0 and by_topic["txa"].active_producers
        assert (int(by_topic["txc"].error_code), by_topic["txc"].error_message) == (TOPIC_DENIED,
                                                                                    "Topic authorization failed.")
        # WriteTxnMarkers (kcli transactions abort): CLUSTER_ACTION on the cluster
        r = tina.request(27, 1, {"markers": [{"producer_id": pid, "producer_epoch": epoch, "transaction_result": False,
                                              "coordinator_epoch": 0,
                                              "topics": [{"name": "txc", "partition_indexes": [0, 1]}]}]})
        assert [int(p.error_code) for p in r.markers[0].topics[0].partitions] == [CLUSTER_DENIED, CLUSTER_DENIED]

        def listed(c: WireClient) -> set[str]:
            r = c.request(66, 1, {"state_filters": [], "producer_id_filters": [], "duration_filter": -1})
            assert int(r.error_code) == 0
            return {s.transactional_id for s in r.transaction_states}

        def described(c: WireClient, tid: str) -> tuple[int, str, list[str]]:
            s = c.request(65, 0, {"transactional_ids": [tid]}).transaction_states[0]
            return int(s.error_code), s.transaction_state, [f"{t.topic}-{p}" for t in s.topics for p in t.partitions]

        with WireClient(bs) as adm:
            assert listed(login(adm, "admin")) >= {"tina-tx", "tina-raw"}
            assert described(adm, "tina-raw") == (0, "Ongoing", ["txc-0", "txc-1"])
        assert listed(tina) == {"tina-tx", "tina-raw"}  # WRITE implies DESCRIBE
        assert listed(ted) == set() and described(ted, "tina-raw")[0] == TXN_DENIED
        allow(bs, "User:ted", AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, "tina-raw")
        assert listed(ted) == {"tina-raw"}
        assert described(ted, "tina-raw") == (0, "Ongoing", [])  # ted may not describe txc: its partitions are hidden
        allow(bs, "User:ted", AclOperation.DESCRIBE, ResourceType.TOPIC, "txc")
        assert described(ted, "tina-raw") == (0, "Ongoing", ["txc-0", "txc-1"])
        assert int(tina.request(26, 3, {"transactional_id": "tina-raw", "producer_id": pid, "producer_epoch": epoch,
                                        "committed": False}).error_code) == 0


def test_gates_of_apis_whose_handlers_come_later():
    """OffsetForLeaderEpoch (23) and DescribeLogDirs (35) have no handler yet; their gates run here
    in front of a handler that echoes what reached it, with the real Authorizer, and their
    refusals must encode as the API's response."""
    import asyncio
    import types

    from kcli.broker.authz import guarded
    from kcli.broker.dispatch import ApiHandler, ConnectionState, RequestContext
    from kcli.protocol import codec

    az = authorizer(acl("seen", Op.DESCRIBE), acl("kafka-cluster", Op.CLUSTER_ACTION, principal="User:follower",
                                                    rtype=RT.CLUSTER))
    broker = types.SimpleNamespace(authorizer=az, topic_by_id=lambda _id: None)
    reached: list[Any] = []

    async def handler(_ctx: Any, req: Any) -> dict[str, Any]:
        reached.append(req)
        return {"throttle_time": 0, "error_code": 0, "results": [], "topics": []}

    def run(key: int, version: int, body: dict[str, Any], principal: str = "User:alice") -> Any:
        reached.clear()
        fn = guarded(ApiHandler(key, "later", 0, version, handler), broker)
        req = codec.build(codec.request_class(key, version), body)
        ctx = RequestContext(broker, codec.RequestHeader(key, version, 1, "t"), ConnectionState("127.0.0.1:1", True, principal))
        answer = asyncio.run(fn(ctx, req))
        return codec.build(codec.response_class(key, version), answer)

    epochs = {"replica_id": -1, "topics": [{"topic": t, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                                                         "leader_epoch": 3}]} for t in ("seen", "hidden")]}
    r = run(23, 4, epochs)
    assert [t.topic for t in reached[0].topics] == ["seen"]
    [denied] = [t for t in r.topics if t.topic == "hidden"]
    p = denied.partitions[0]
    assert (int(p.error_code), p.leader_epoch, p.end_offset) == (TOPIC_DENIED, -1, -1)
    run(23, 4, epochs, "User:follower")  # a follower: CLUSTER_ACTION covers every topic
    assert [t.topic for t in reached[0].topics] == ["seen", "hidden"]
    for version in (1, 4):
        r = run(35, version, {"topics": None})
        assert not reached and r.results == ()
        assert version < 3 or int(r.error_code) == CLUSTER_DENIED


def test_every_api_has_an_authorization_check():
    """An API without a gate is refused to all but super users; a new API needs its check in
    kcli/broker/authz.py (register_gate), mirroring the operation Kafka's KafkaApis checks."""
    from kcli.broker.authz import GATES, OPEN_APIS
    from kcli.broker.dispatch import load_all_handlers

    unchecked = sorted(h.name for k, h in load_all_handlers().items() if k not in GATES and k not in OPEN_APIS)
    assert not unchecked, f"APIs without an authorization check (kcli/broker/authz.py register_gate): {unchecked}"


def test_the_inter_broker_client_id_alone_grants_no_shortcut(authz_broker):
    """A broker passes on a committed transaction's offsets with an OffsetCommit that skips the
    membership check; a client naming itself like a broker gets that only with ClusterAction."""
    from kcli.protocol.interbroker import INTER_BROKER_CLIENT_ID

    bs = authz_broker.bootstrap
    allow(bs, "User:carol", AclOperation.READ, ResourceType.TOPIC, "orders")
    allow(bs, "User:carol", AclOperation.READ, ResourceType.GROUP, "live-group")
    produce_errors(bs, "admin", "orders")
    member = Consumer({**conf(bs, "admin"), "group.id": "live-group", "auto.offset.reset": "earliest"})
    member.subscribe(["orders"])
    wait_until(lambda: member.poll(0.5) is not None or member.assignment(), 30, what="a member in the group")

    def commit_as(user: str) -> int:
        with WireClient(bs, client_id=INTER_BROKER_CLIENT_ID) as c:
            login(c, user)
            r = c.request(8, 8, {"group_id": "live-group", "generation_id_or_member_epoch": -1, "member_id": "",
                                 "group_instance_id": None,
                                 "topics": [{"name": "orders", "partitions": [
                                     {"partition_index": 0, "committed_offset": 0, "committed_leader_epoch": -1,
                                      "committed_metadata": ""}]}]})
        return int(r.topics[0].partitions[0].error_code)

    try:
        assert commit_as("carol") != 0, "a client without ClusterAction skipped the membership check"
        assert commit_as("admin") == 0  # a super user holds ClusterAction: the broker path
    finally:
        member.close()
