"""Broker and topic configuration definitions, defaults and validation, named as Kafka names them.

Validation failures raise :class:`ConfigError` whose message names the config, in the words
Kafka's ConfigDef uses ("Invalid value X for configuration Y: ..."), and map to INVALID_CONFIG.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode
from dataclasses import dataclass
from typing import Any, Callable, Iterable



# What a broker started with diskless.system.enable=false answers for any diskless topic (and the
# runbook simulator predicts): one sentence, so scripts can match it.
DISKLESS_SYSTEM_DISABLED = "diskless.enable=true needs diskless.system.enable=true on the broker"
# Kafka's words, then which setting: a diskless topic tiers as a classic one does
TIERED_SYSTEM_DISABLED = ("Tiered Storage functionality is disabled in the broker. Topic cannot be configured with "
                          "remote log storage (remote.storage.enable=true needs remote.log.storage.system.enable=true).")


class ConfigError(ValueError):
    """An unknown config name or a bad value (Kafka INVALID_CONFIG)."""

    code = ErrorCode.invalid_config


Validator = Callable[[str, Any], None]


@dataclass(frozen=True)
class ConfigDef:
    name: str
    type: str  # int | long | boolean | string | list | double | class | password
    default: Any
    doc: str = ""
    validator: Validator | None = None
    # For topic configs: the broker config that supplies the default (Kafka's synonym).
    broker_synonym: str | None = None
    read_only: bool = False
    sensitive: bool = False


def at_least(minimum: int | float) -> Validator:
    def check(name: str, value: Any) -> None:
        if value < minimum:
            raise ConfigError(f"Invalid value {value} for configuration {name}: Value must be at least {minimum}")

    return check


def one_of(*choices: str, case_insensitive: bool = False) -> Validator:
    def check(name: str, value: Any) -> None:
        values = value if isinstance(value, list) else [value]
        for v in values:
            ok = (v.lower() in [c.lower() for c in choices]) if case_insensitive else v in choices
            if not ok:
                raise ConfigError(
                    f"Invalid value {v} for configuration {name}: String must be one of: {', '.join(choices)}"
                )

    return check


def _level(low: int, high: int) -> Validator:
    """A feature level between ``low`` and ``high`` (kafka-features.sh's bounds)."""

    def check(name: str, value: Any) -> None:
        if not low <= value <= high:
            raise ConfigError(f"Invalid value {value} for configuration {name}: Value must be between {low} and {high}")

    return check


def parse_value(d: ConfigDef, raw: Any) -> Any:
    """Parse a string (or already-typed) value per ``d.type``; raise ConfigError naming ``d.name``."""
    name = d.name
    if raw is None:
        return None
    try:
        if d.type in ("int", "long", "short"):
            if isinstance(raw, bool):
                raise ValueError
            v: Any = int(str(raw).strip())
            limit = 2**31 if d.type == "int" else 2**63
            if not -limit <= v < limit:
                raise ValueError
        elif d.type == "double":
            v = float(str(raw).strip())
        elif d.type == "boolean":
            s = str(raw).strip().lower()
            if s not in ("true", "false"):
                raise ConfigError(f"Invalid value {raw} for configuration {name}: Expected value to be either true or false")
            v = s == "true"
        elif d.type == "list":
            s = str(raw).strip()
            v = [x.strip() for x in s.split(",") if x.strip()] if s else []
        else:
            v = str(raw)
    except ConfigError:
        raise
    except (TypeError, ValueError):
        expected = {"int": "32-bit integer", "long": "64-bit integer", "short": "16-bit integer",
                    "double": "number"}.get(d.type, d.type)
        raise ConfigError(f"Invalid value {raw} for configuration {name}: Not a {expected}") from None
    if d.validator is not None:
        d.validator(name, v)
    return v


def format_value(d: ConfigDef, value: Any) -> str | None:
    if value is None:
        return None
    if d.type == "boolean":
        return "true" if value else "false"
    if d.type == "list":
        return ",".join(value)
    return str(value)


def _defs(*defs: ConfigDef) -> dict[str, ConfigDef]:
    return {d.name: d for d in defs}


def non_empty(inner: Validator) -> Validator:
    """A list config that must name at least one value. kcli's logs have no "neither delete nor
    compact" mode, so an empty cleanup.policy is refused up front instead of at the next start."""

    def check(name: str, value: Any) -> None:
        if isinstance(value, list) and not value:
            raise ConfigError(f"Invalid empty value for configuration {name}: the list must name at least one value")
        inner(name, value)

    return check


_CLEANUP = non_empty(one_of("delete", "compact"))


def _ratio(name: str, value: Any) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"Invalid value {value} for configuration {name}: Value must be between 0 and 1")
_TS_TYPE = one_of("CreateTime", "LogAppendTime")
_COMPRESSION = one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
_DISABLE_POLICY = one_of("retain", "delete")

TOPIC_CONFIGS: dict[str, ConfigDef] = _defs(
    ConfigDef("cleanup.policy", "list", ["delete"], "Retention policy for old segments.", _CLEANUP, "log.cleanup.policy"),
    ConfigDef("compression.type", "string", "producer", "Final compression type.", _COMPRESSION, "compression.type"),
    ConfigDef("retention.ms", "long", 604800000, "Maximum time a log is kept (total, including remote).", at_least(-1), "log.retention.ms"),
    ConfigDef("retention.bytes", "long", -1, "Maximum partition size (total, including remote).", None, "log.retention.bytes"),
    ConfigDef("segment.bytes", "int", 1073741824, "Segment file size.", at_least(14), "log.segment.bytes"),
    ConfigDef("segment.ms", "long", 604800000, "Time after which a segment rolls.", at_least(1), "log.roll.ms"),
    ConfigDef("segment.index.bytes", "int", 10485760, "Offset index size.", at_least(8), "log.index.size.max.bytes"),
    ConfigDef("segment.jitter.ms", "long", 0, "Roll jitter.", at_least(0), "log.roll.jitter.ms"),
    ConfigDef("index.interval.bytes", "int", 4096, "Bytes between offset index entries.", at_least(0), "log.index.interval.bytes"),
    ConfigDef("max.message.bytes", "int", 1048588, "Largest record batch size allowed.", at_least(0), "message.max.bytes"),
    ConfigDef("message.timestamp.type", "string", "CreateTime", "CreateTime or LogAppendTime.", _TS_TYPE, "log.message.timestamp.type"),
    ConfigDef("message.timestamp.difference.max.ms", "long", 9223372036854775807, "", at_least(0), "log.message.timestamp.difference.max.ms"),
    ConfigDef("message.timestamp.before.max.ms", "long", 9223372036854775807, "", at_least(0), "log.message.timestamp.before.max.ms"),
    ConfigDef("message.timestamp.after.max.ms", "long", 9223372036854775807, "", at_least(0), "log.message.timestamp.after.max.ms"),
    ConfigDef("min.insync.replicas", "int", 1, "Minimum in-sync replicas for acks=all.", at_least(1), "min.insync.replicas"),
    ConfigDef("unclean.leader.election.enable", "boolean", False, "", None, "unclean.leader.election.enable"),
    ConfigDef("file.delete.delay.ms", "long", 60000, "", at_least(0), "log.segment.delete.delay.ms"),
    ConfigDef("flush.messages", "long", 9223372036854775807, "", at_least(1), "log.flush.interval.messages"),
    ConfigDef("flush.ms", "long", 9223372036854775807, "", at_least(0), "log.flush.interval.ms"),
    ConfigDef("delete.retention.ms", "long", 86400000, "", at_least(0), "log.cleaner.delete.retention.ms"),
    ConfigDef("min.compaction.lag.ms", "long", 0, "", at_least(0), "log.cleaner.min.compaction.lag.ms"),
    ConfigDef("max.compaction.lag.ms", "long", 9223372036854775807, "", at_least(1), "log.cleaner.max.compaction.lag.ms"),
    ConfigDef("min.cleanable.dirty.ratio", "double", 0.5, "Clean when dirty bytes / cleanable bytes reach this (compact).", _ratio, "log.cleaner.min.cleanable.ratio"),
    ConfigDef("preallocate", "boolean", False, "", None, "log.preallocate"),
    ConfigDef("message.downconversion.enable", "boolean", True, "", None, "log.message.downconversion.enable"),
    ConfigDef("follower.replication.throttled.replicas", "list", [], ""),
    ConfigDef("leader.replication.throttled.replicas", "list", [], ""),
    # KIP-405 tiered storage
    ConfigDef("remote.storage.enable", "boolean", False, "Tier rolled segments to remote storage."),
    ConfigDef("local.retention.ms", "long", -2, "Local retention; -2 means use retention.ms.", at_least(-2), "log.local.retention.ms"),
    ConfigDef("local.retention.bytes", "long", -2, "Local retention; -2 means use retention.bytes.", at_least(-2), "log.local.retention.bytes"),
    # KIP-950 disablement, and the configs Apache Kafka 3.9+ shipped for it
    ConfigDef("remote.log.disable.policy", "string", "retain", "What disabling tiering does to remote data: retain or delete.", _DISABLE_POLICY),
    ConfigDef("remote.log.copy.disable", "boolean", False, "Stop copying to remote storage; remote data stays readable."),
    ConfigDef("remote.log.delete.on.disable", "boolean", False, "Delete remote data when remote.storage.enable goes false."),
    # KIP-1163 diskless
    ConfigDef("diskless.enable", "boolean", False, "Store this topic's data as WAL objects in object storage (creation only)."),
)

BROKER_CONFIGS: dict[str, ConfigDef] = _defs(
    ConfigDef("node.id", "int", 1, "This broker's id.", at_least(0), read_only=True),
    ConfigDef("broker.id", "int", 1, "Synonym of node.id.", at_least(0), read_only=True),
    ConfigDef("cluster.id", "string", "", "Cluster id (generated at first start when empty).", read_only=True),
    ConfigDef("listeners", "list", ["PLAINTEXT://127.0.0.1:9092"], "Listener address.", read_only=True),
    ConfigDef("advertised.listeners", "list", [], "Address given to clients; defaults to the listener.", read_only=True),
    ConfigDef("log.dirs", "string", "", "Data directory.", read_only=True),
    ConfigDef("metrics.listen", "string", "", "HOST:PORT of the Prometheus metrics endpoint (kcli; empty: none).", read_only=True),
    ConfigDef("broker.rack", "string", "", "Rack of this broker.", read_only=True),
    # Cluster mode (kcli/cluster/): Kafka's KRaft broker lease settings
    ConfigDef("broker.heartbeat.interval.ms", "int", 2000, "How often a broker renews its registration lease.", at_least(100), read_only=True),
    ConfigDef("broker.session.timeout.ms", "int", 9000, "A broker whose lease is older leaves Metadata responses.", at_least(500), read_only=True),
    # Replication of classic partitions (kcli/broker/replica/), Kafka's names and defaults
    ConfigDef("replica.lag.time.max.ms", "long", 30000,
              "A follower that has not caught up with the leader's log end for this long leaves the ISR.", at_least(1), read_only=True),
    ConfigDef("replica.fetch.max.bytes", "int", 1048576, "Bytes a follower asks for per partition and fetch.", at_least(0), read_only=True),
    ConfigDef("replica.fetch.wait.max.ms", "int", 500, "Longest a follower's fetch waits at the leader for data.", at_least(0), read_only=True),
    ConfigDef("auto.leader.rebalance.enable", "boolean", True,
              "The controller moves leadership back to preferred replicas of imbalanced brokers.", read_only=True),
    ConfigDef("leader.imbalance.check.interval.seconds", "long", 300,
              "How often the controller checks for leader imbalance.", at_least(1), read_only=True),
    ConfigDef("leader.imbalance.per.broker.percentage", "int", 10,
              "Share of a broker's preferred partitions it may not lead before a rebalance.", at_least(0), read_only=True),
    ConfigDef("replica.fetch.backoff.ms", "int", 1000, "Pause of a follower after a failed fetch.", at_least(0), read_only=True),
    ConfigDef("replica.selector.class", "class", "",
              "KIP-392: org.apache.kafka.common.replica.RackAwareReplicaSelector points consumers with client.rack at "
              "a replica of their rack; empty (Kafka's null) or LeaderSelector: the leader serves every fetch.",
              one_of("", "org.apache.kafka.common.replica.LeaderSelector",
                     "org.apache.kafka.common.replica.RackAwareReplicaSelector"), read_only=True),
    ConfigDef("leader.replication.throttled.rate", "long", 9223372036854775807,
              "Bytes/s this broker sends, as leader, to the throttled followers of leader.replication.throttled.replicas.",
              at_least(0)),
    ConfigDef("follower.replication.throttled.rate", "long", 9223372036854775807,
              "Bytes/s this broker fetches, as follower, for the replicas of follower.replication.throttled.replicas.",
              at_least(0)),
    ConfigDef("replication.quota.window.num", "int", 11, "Samples the replication throttle's rate is measured over.",
              at_least(1), read_only=True),
    ConfigDef("replication.quota.window.size.seconds", "int", 1, "Length of one sample of the replication throttle.",
              at_least(1), read_only=True),
    ConfigDef("replica.high.watermark.checkpoint.interval.ms", "long", 5000,
              "How often each replica's high watermark is written to its replication-offset-checkpoint.", at_least(1), read_only=True),
    ConfigDef("num.partitions", "int", 1, "Default partition count for new topics.", at_least(1)),
    ConfigDef("default.replication.factor", "int", 1, "", at_least(1)),
    ConfigDef("auto.create.topics.enable", "boolean", True, "Create unknown topics on metadata requests."),
    ConfigDef("delete.topic.enable", "boolean", True, ""),
    ConfigDef("message.max.bytes", "int", 1048588, "Largest record batch size allowed.", at_least(0)),
    ConfigDef("socket.request.max.bytes", "int", 104857600, "Largest request size.", at_least(1)),
    # Kafka's default is -1 (unbounded); kcli bounds it (docs/reliability.md). <= 0 means unbounded, as in Kafka.
    ConfigDef("queued.max.request.bytes", "long", 104857600,
              "Bytes of large requests being read, broker-wide, before reading pauses.", read_only=True),
    ConfigDef("connections.max.idle.ms", "long", 600000,
              "Close a connection that read and wrote nothing for this long (< 0: never).", read_only=True),
    ConfigDef("log.segment.bytes", "int", 1073741824, "", at_least(14)),
    ConfigDef("log.roll.ms", "long", 604800000, "", at_least(1)),
    ConfigDef("log.retention.ms", "long", 604800000, "", at_least(-1)),
    ConfigDef("log.retention.bytes", "long", -1, ""),
    ConfigDef("log.retention.check.interval.ms", "long", 300000, "How often retention (local and remote) runs.", at_least(1)),
    ConfigDef("log.cleanup.policy", "list", ["delete"], "", _CLEANUP),
    ConfigDef("log.message.timestamp.type", "string", "CreateTime", "", _TS_TYPE),
    ConfigDef("log.index.interval.bytes", "int", 4096, "", at_least(0)),
    ConfigDef("log.index.size.max.bytes", "int", 10485760, "", at_least(8)),
    ConfigDef("log.roll.jitter.ms", "long", 0, "", at_least(0)),
    ConfigDef("log.segment.delete.delay.ms", "long", 60000, "", at_least(0)),
    ConfigDef("log.flush.interval.messages", "long", 9223372036854775807, "", at_least(1)),
    ConfigDef("log.flush.interval.ms", "long", 9223372036854775807, "", at_least(0)),
    ConfigDef("log.cleaner.delete.retention.ms", "long", 86400000, ""),
    ConfigDef("log.cleaner.min.compaction.lag.ms", "long", 0, ""),
    ConfigDef("log.cleaner.max.compaction.lag.ms", "long", 9223372036854775807, ""),
    ConfigDef("log.cleaner.min.cleanable.ratio", "double", 0.5, "", _ratio),
    ConfigDef("log.cleaner.enable", "boolean", True, "Run the log cleaner for topics with cleanup.policy=compact.", read_only=True),
    ConfigDef("log.cleaner.backoff.ms", "long", 15000, "How long the cleaner sleeps between rounds.", at_least(0), read_only=True),
    ConfigDef("log.cleaner.dedupe.buffer.size", "long", 134217728, "Memory for the cleaner's key -> offset map (a key costs its length + 120 bytes).", at_least(1024 * 1024), read_only=True),
    ConfigDef("log.preallocate", "boolean", False, ""),
    ConfigDef("log.message.downconversion.enable", "boolean", True, ""),
    ConfigDef("log.message.timestamp.difference.max.ms", "long", 9223372036854775807, ""),
    ConfigDef("log.message.timestamp.before.max.ms", "long", 9223372036854775807, ""),
    ConfigDef("log.message.timestamp.after.max.ms", "long", 9223372036854775807, ""),
    ConfigDef("log.local.retention.ms", "long", -2, "", at_least(-2)),
    ConfigDef("log.local.retention.bytes", "long", -2, "", at_least(-2)),
    ConfigDef("compression.type", "string", "producer", "", _COMPRESSION),
    ConfigDef("min.insync.replicas", "int", 1, "", at_least(1)),
    ConfigDef("unclean.leader.election.enable", "boolean", False, ""),
    ConfigDef("log.flush.fsync.acks.all", "boolean", True,
              "kcli: fsync before answering acks=all produces (one broker has no replicas to make acks=all durable)."),
    # Groups
    ConfigDef("group.initial.rebalance.delay.ms", "int", 3000, "Wait for more members before the first rebalance.", at_least(0)),
    ConfigDef("group.min.session.timeout.ms", "int", 6000, "", at_least(0)),
    ConfigDef("group.max.session.timeout.ms", "int", 1800000, "", at_least(0)),
    # KIP-848 consumer groups (group.protocol=consumer)
    ConfigDef("group.consumer.session.timeout.ms", "int", 45000,
              "A consumer-protocol member that sends no heartbeat for this long is fenced.", at_least(1)),
    ConfigDef("group.consumer.heartbeat.interval.ms", "int", 5000,
              "How often consumer-protocol members heartbeat (told to them in each response).", at_least(1)),
    ConfigDef("group.consumer.assignors", "list", ["uniform", "range"],
              "Server-side assignors of consumer groups; the first is the default (Kafka's class names work too).",
              non_empty(one_of("uniform", "range", "org.apache.kafka.coordinator.group.assignor.UniformAssignor",
                               "org.apache.kafka.coordinator.group.assignor.RangeAssignor"))),
    # KIP-932 share groups (kcli/coordinator/share/, docs/share-groups.md)
    ConfigDef("group.share.session.timeout.ms", "int", 45000,
              "A share-group member that sends no ShareGroupHeartbeat for this long is fenced and its records released.",
              at_least(1)),
    ConfigDef("group.share.heartbeat.interval.ms", "int", 5000,
              "How often share-group members heartbeat (told to them in each response).", at_least(1)),
    ConfigDef("group.share.record.lock.duration.ms", "int", 30000,
              "How long a share consumer holds the records it acquired before they are available again.", at_least(1)),
    ConfigDef("group.share.delivery.count.limit", "int", 5,
              "Deliveries of a record after which a release or lock timeout archives it instead (a poison record).",
              at_least(1)),
    ConfigDef("group.share.partition.max.record.locks", "int", 2000,
              "Most records of one share partition in flight (between its start offset and end offset).", at_least(1)),
    ConfigDef("group.share.max.size", "int", 200, "Most members of one share group.", at_least(1)),
    ConfigDef("group.share.max.share.sessions", "int", 2000,
              "Most share sessions (one per member and broker) this broker keeps.", at_least(1)),
    ConfigDef("offsets.retention.minutes", "int", 10080, "", at_least(1)),
    ConfigDef("offsets.topic.num.partitions", "int", 50, "", at_least(1)),
    # Transactions (KIP-98)
    ConfigDef("transaction.max.timeout.ms", "int", 900000, "Largest transaction.timeout.ms a producer may ask for.", at_least(1)),
    ConfigDef("transaction.state.log.num.partitions", "int", 50, "Partitions over which transactional ids are spread to place their coordinators in a cluster (as __transaction_state's).", at_least(1), read_only=True),
    ConfigDef("transaction.abort.timed.out.transaction.cleanup.interval.ms", "int", 10000,
              "How often transactions past their timeout are aborted.", at_least(1)),
    ConfigDef("transactional.id.expiration.ms", "int", 604800000,
              "How long an idle transactional id is kept after its last transaction.", at_least(1)),
    ConfigDef("transaction.version", "int", 2,
              "The finalized transaction.version feature level ApiVersions announces (KIP-890): 2 = transactions v2 "
              "(an epoch bump per transaction, partitions added by the first Produce), as a new Kafka 4.0 cluster; "
              "0 or 1 = transactions v1 only. Set it alike on every broker of a cluster.",
              _level(0, 2), read_only=True),
    # KIP-405
    ConfigDef("remote.log.storage.system.enable", "boolean", False, "Enable tiered storage on this broker."),
    ConfigDef("remote.log.storage.manager.class.name", "string", "plugins.rsm.object_store.ObjectStoreRemoteStorageManager",
              "RemoteStorageManager implementation."),
    ConfigDef("remote.log.manager.task.interval.ms", "long", 30000, "How often segments are copied to remote storage.", at_least(1)),
    # KIP-694
    ConfigDef("delete.topic.partition.enable", "boolean", False, "Allow reducing a topic's partition count."),
    ConfigDef("delete.topic.partition.interval.delay.ms", "long", 300000, "How often delayed partition deletions are checked.", at_least(1)),
    # KIP-1163 / KIP-1164
    ConfigDef("diskless.system.enable", "boolean", True, "Enable diskless topics on this broker."),
    ConfigDef("diskless.storage.class.name", "string", "plugins.objectstore.local.LocalObjectStorage", "Object storage class for diskless topics."),
    ConfigDef("diskless.storage.uri", "string", "", "kcli short form of the object store: file:///dir or s3://bucket/prefix."),
    ConfigDef("diskless.append.commit.interval.ms", "int", 250, "How long a WAL object collects batches before upload.", at_least(1)),
    ConfigDef("diskless.append.buffer.max.bytes", "int", 4194304, "Largest WAL object before it is closed early.", at_least(1)),
    ConfigDef("diskless.coordinator.class.name", "string", "plugins.coordinator.sqlite.SqliteBatchCoordinator", "Batch coordinator class."),
    ConfigDef("diskless.file.cleaner.retention.period.ms", "long", 60000, "Grace period before unused or orphan WAL objects are deleted.", at_least(0)),
    ConfigDef("diskless.file.cleaner.interval.ms", "long", 5000, "How often WAL objects are garbage collected.", at_least(1)),
    ConfigDef("diskless.fetch.cache.max.bytes", "long", 67108864, "Object-range cache for diskless fetches.", at_least(0)),
    ConfigDef("diskless.retention.check.interval.ms", "long", 60000, "How often diskless retention runs.", at_least(1)),
    # Local segments of diskless replicas (KIP-1163 "Replicas", kcli/diskless/replica_cache.py)
    ConfigDef("diskless.replica.cache.enable", "boolean", True,
              "Keep local segments of the diskless partitions this broker holds a replica of, as a fetch cache.", read_only=True),
    ConfigDef("diskless.replica.cache.start.bytes", "long", 104857600,
              "A new replica's cache starts this many bytes before the log end (or at the log start, whichever is later).",
              at_least(0), read_only=True),
    ConfigDef("diskless.replica.cache.max.concurrent.partitions", "int", 4,
              "Partitions whose cache is filled at the same time.", at_least(1), read_only=True),
    # Security
    ConfigDef("sasl.enabled.mechanisms", "list", [], "SASL mechanisms the listener offers: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512."),
    ConfigDef("sasl.plain.users.file", "string", "", "File of user:hashed-secret lines for SASL/PLAIN."),
    ConfigDef("sasl.server.max.receive.size", "int", 524288, "Largest frame accepted before authentication.", at_least(1)),
    ConfigDef("connection.failed.authentication.delay.ms", "int", 100, "Delay before answering a failed authentication.", at_least(0)),
    # Listeners and TLS (kcli/broker/listeners.py); ssl.* may be prefixed listener.name.<name>.
    ConfigDef("listener.security.protocol.map", "list",
              ["PLAINTEXT:PLAINTEXT", "SSL:SSL", "SASL_PLAINTEXT:SASL_PLAINTEXT", "SASL_SSL:SASL_SSL"],
              "Listener name → security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL).", read_only=True),
    ConfigDef("inter.broker.listener.name", "string", "",
              "Listener of the other brokers that transaction markers and offsets are sent to in a cluster (empty: their first).", read_only=True),
    ConfigDef("ssl.keystore.type", "string", "PEM", "Format of the key store: PEM only.", one_of("PEM", case_insensitive=True), read_only=True),
    ConfigDef("ssl.keystore.location", "string", "", "PEM file holding the private key and the certificate chain.", read_only=True),
    ConfigDef("ssl.keystore.certificate.chain", "password", None, "The certificate chain in PEM, inline.", read_only=True, sensitive=True),
    ConfigDef("ssl.keystore.key", "password", None, "The private key in PEM, inline.", read_only=True, sensitive=True),
    ConfigDef("ssl.key.password", "password", None, "Password of an encrypted private key.", read_only=True, sensitive=True),
    ConfigDef("ssl.truststore.type", "string", "PEM", "Format of the trust store: PEM only.", one_of("PEM", case_insensitive=True), read_only=True),
    ConfigDef("ssl.truststore.location", "string", "", "PEM file of the CA certificates that client certificates must chain to.", read_only=True),
    ConfigDef("ssl.truststore.certificates", "password", None, "The trusted CA certificates in PEM, inline.", read_only=True, sensitive=True),
    ConfigDef("ssl.client.auth", "string", "none", "Client certificates: required, requested or none.",
              one_of("required", "requested", "none"), read_only=True),
    ConfigDef("authorizer.class.name", "string", "", "The authorizer: empty (everything allowed) or "
              "org.apache.kafka.metadata.authorizer.StandardAuthorizer (ACLs in the cluster metadata).",
              one_of("", "org.apache.kafka.metadata.authorizer.StandardAuthorizer")),
    ConfigDef("super.users", "string", "", "Principals the authorizer always allows, e.g. User:admin;User:ops."),
    ConfigDef("allow.everyone.if.no.acl.found", "boolean", False,
              "With an authorizer: allow every principal on resources that no ACL names."),
)


def validate_topic_config(name: str, value: Any) -> Any:
    d = TOPIC_CONFIGS.get(name)
    if d is None:
        raise ConfigError(f"Unknown topic config name: {name}")
    return parse_value(d, value)


def normalise_topic_configs(configs: dict[str, Any]) -> dict[str, str]:
    """Topic configs as the broker stores them; raises ConfigError naming the first bad one
    (the broker's CreateTopics/AlterConfigs and a runbook's dry-run plan share this)."""
    out: dict[str, str] = {}
    for name, raw in configs.items():
        d = TOPIC_CONFIGS.get(name)
        if d is None:
            raise ConfigError(f"Unknown topic config name: {name}")
        if raw is None:
            raise ConfigError(f"Null value not supported for topic configs: {name}")
        out[name] = format_value(d, parse_value(d, raw)) or ""
    return out


# Broker configs that IncrementalAlterConfigs/AlterConfigs may change at run time (Kafka's
# DynamicBrokerConfig, its DynamicLogConfig part): the broker-side defaults of topic configs. Every
# other broker config is read-only ("Cannot update these configs dynamically"), num.partitions too.
DYNAMIC_BROKER_CONFIGS: frozenset[str] = frozenset(
    d.broker_synonym for d in TOPIC_CONFIGS.values() if d.broker_synonym and d.broker_synonym in BROKER_CONFIGS
)


# Apache Kafka's broker configs that kcli does not implement (kcli/config/kafka_broker_configs.py,
# the one list of Kafka's names). A dynamic change of one that Kafka can change at run time is
# accepted and stored as Kafka stores it, and has no effect in kcli; DescribeConfigs says so.
KAFKA_ONLY_NOTE = "Apache Kafka broker config that kcli does not implement: stored, described, no effect in kcli."


def _kafka_only_defs() -> dict[str, ConfigDef]:
    from kcli.config.kafka_broker_configs import KAFKA_CLUSTER_WIDE, KAFKA_PER_BROKER, KAFKA_READ_ONLY

    types = {"class": "string", **{t: t for t in ("boolean", "int", "short", "long", "double", "list", "password")}}
    out = {name: ConfigDef(name, "string", None, KAFKA_ONLY_NOTE, read_only=True) for name in KAFKA_READ_ONLY}
    for table in (KAFKA_CLUSTER_WIDE, KAFKA_PER_BROKER):
        for name, kafka_type in table.items():
            out[name] = ConfigDef(name, types.get(kafka_type, "string"), None, KAFKA_ONLY_NOTE,
                                  sensitive=kafka_type == "password")
    return {name: d for name, d in sorted(out.items()) if name not in BROKER_CONFIGS}


KAFKA_ONLY_BROKER_CONFIGS: dict[str, ConfigDef] = _kafka_only_defs()


def broker_config_def(name: str) -> ConfigDef | None:
    """The definition of broker config ``name``: kcli's own, else a Kafka config kcli does not
    implement (``KAFKA_ONLY_BROKER_CONFIGS``), else None (a name Kafka does not know either)."""
    return BROKER_CONFIGS.get(name) or KAFKA_ONLY_BROKER_CONFIGS.get(name)


# What a dynamic change (IncrementalAlterConfigs/AlterConfigs, a BROKER ConfigRecord) may set:
# kcli's dynamic configs, and Kafka's dynamic configs that kcli does not implement.
ALTERABLE_BROKER_CONFIGS: frozenset[str] = DYNAMIC_BROKER_CONFIGS | frozenset(
    name for name, d in KAFKA_ONLY_BROKER_CONFIGS.items() if not d.read_only) | frozenset(
    # KIP-73 replication throttles (kcli/broker/replica/throttle.py), dynamic as in Kafka
    ("leader.replication.throttled.rate", "follower.replication.throttled.rate"))


def broker_config_change_error(resource_name: str, names: Iterable[str]) -> str | None:
    """Why a dynamic change of broker configs ``names`` on resource ``resource_name`` ("": the
    cluster-wide default) is refused, in the words of Kafka's DynamicBrokerConfig.validateConfigs
    (the caller answers INVALID_REQUEST), or None. Unknown names are the caller's (INVALID_CONFIG)."""
    from kcli.config.kafka_broker_configs import KAFKA_LISTENER_ONLY, KAFKA_PER_BROKER

    names = sorted(set(names))
    static = [n for n in names if n not in ALTERABLE_BROKER_CONFIGS]
    if static:
        return f"Cannot update these configs dynamically: Set({', '.join(static)})"
    listener_only = [n for n in names if n in KAFKA_LISTENER_ONLY and n in KAFKA_ONLY_BROKER_CONFIGS]
    if listener_only:
        return ("These security configs can be dynamically updated only per-listener using the listener prefix: "
                f"Set({', '.join(listener_only)})")
    per_broker = [n for n in names if n in KAFKA_PER_BROKER and n in KAFKA_ONLY_BROKER_CONFIGS]
    if resource_name == "" and per_broker:
        return ("Cannot update these configs at default cluster level, broker id must be specified: "
                f"Set({', '.join(per_broker)})")
    return None
