"""Apache Kafka's own broker config names, with Kafka's dynamic update mode: the one list of them.

Generated from Kafka 3.9's broker config reference (``generated/kafka_config.html``: name, type and
"Update Mode" of every broker config), plus the names Kafka 4's sample ``config/server.properties``
adds (``share.coordinator.state.topic.*``). kcli uses it to tell a Kafka name it does not implement
(accepted, stored, no effect) from a name Kafka does not know either (refused), in dynamic broker
configs (IncrementalAlterConfigs / AlterConfigs, docs/broker.md "Dynamic broker configs").

* ``read-only``: set at start only; Kafka answers a dynamic change with INVALID_REQUEST "Cannot
  update these configs dynamically".
* ``cluster-wide``: dynamic, as the cluster-wide default (resource ``""``) or per broker.
* ``per-broker``: dynamic for one broker only (resource ``<node id>``); at the cluster-wide
  default Kafka answers "Cannot update these configs at default cluster level, broker id must be
  specified".
"""

from __future__ import annotations

KAFKA_READ_ONLY: frozenset[str] = frozenset({
    "alter.config.policy.class.name", "alter.log.dirs.replication.quota.window.num",
    "alter.log.dirs.replication.quota.window.size.seconds", "authorizer.class.name", "auto.create.topics.enable",
    "auto.include.jmx.reporter", "auto.leader.rebalance.enable", "broker.heartbeat.interval.ms", "broker.id",
    "broker.id.generation.enable", "broker.rack", "broker.session.timeout.ms", "client.quota.callback.class",
    "connection.failed.authentication.delay.ms", "connections.max.idle.ms", "connections.max.reauth.ms",
    "control.plane.listener.name", "controlled.shutdown.enable", "controlled.shutdown.max.retries",
    "controlled.shutdown.retry.backoff.ms", "controller.listener.names", "controller.quorum.append.linger.ms",
    "controller.quorum.bootstrap.servers", "controller.quorum.election.backoff.max.ms",
    "controller.quorum.election.timeout.ms", "controller.quorum.fetch.timeout.ms",
    "controller.quorum.request.timeout.ms", "controller.quorum.retry.backoff.ms", "controller.quorum.voters",
    "controller.quota.window.num", "controller.quota.window.size.seconds", "controller.socket.timeout.ms",
    "create.topic.policy.class.name", "default.replication.factor", "delegation.token.expiry.check.interval.ms",
    "delegation.token.expiry.time.ms", "delegation.token.master.key", "delegation.token.max.lifetime.ms",
    "delegation.token.secret.key", "delete.records.purgatory.purge.interval.requests", "delete.topic.enable",
    "early.start.listeners", "eligible.leader.replicas.enable", "fetch.max.bytes",
    "fetch.purgatory.purge.interval.requests", "group.consumer.assignors", "group.consumer.heartbeat.interval.ms",
    "group.consumer.max.heartbeat.interval.ms", "group.consumer.max.session.timeout.ms", "group.consumer.max.size",
    "group.consumer.min.heartbeat.interval.ms", "group.consumer.min.session.timeout.ms",
    "group.consumer.session.timeout.ms", "group.coordinator.append.linger.ms",
    "group.coordinator.rebalance.protocols", "group.coordinator.threads", "group.initial.rebalance.delay.ms",
    "group.max.session.timeout.ms", "group.max.size", "group.min.session.timeout.ms",
    "group.share.delivery.count.limit", "group.share.heartbeat.interval.ms", "group.share.max.groups",
    "group.share.max.heartbeat.interval.ms", "group.share.max.record.lock.duration.ms",
    "group.share.max.session.timeout.ms", "group.share.max.size", "group.share.min.heartbeat.interval.ms",
    "group.share.min.record.lock.duration.ms", "group.share.min.session.timeout.ms",
    "group.share.partition.max.record.locks", "group.share.record.lock.duration.ms",
    "group.share.session.timeout.ms", "initial.broker.registration.timeout.ms", "inter.broker.listener.name",
    "inter.broker.protocol.version", "kafka.metrics.polling.interval.secs", "kafka.metrics.reporters",
    "leader.imbalance.check.interval.seconds", "leader.imbalance.per.broker.percentage", "log.cleaner.enable",
    "log.dir", "log.dir.failure.timeout.ms", "log.dirs", "log.flush.offset.checkpoint.interval.ms",
    "log.flush.scheduler.interval.ms", "log.flush.start.offset.checkpoint.interval.ms",
    "log.message.format.version", "log.retention.check.interval.ms", "log.retention.hours", "log.retention.minutes",
    "log.roll.hours", "log.roll.jitter.hours", "max.incremental.fetch.session.cache.slots",
    "max.request.partition.size.limit", "metadata.log.dir", "metadata.log.max.record.bytes.between.snapshots",
    "metadata.log.max.snapshot.interval.ms", "metadata.log.segment.bytes", "metadata.log.segment.ms",
    "metadata.max.idle.interval.ms", "metadata.max.retention.bytes", "metadata.max.retention.ms",
    "metrics.num.samples", "metrics.recording.level", "metrics.sample.window.ms", "node.id", "num.partitions",
    "num.replica.alter.log.dirs.threads", "offset.metadata.max.bytes", "offsets.commit.required.acks",
    "offsets.commit.timeout.ms", "offsets.load.buffer.size", "offsets.retention.check.interval.ms",
    "offsets.retention.minutes", "offsets.topic.compression.codec", "offsets.topic.num.partitions",
    "offsets.topic.replication.factor", "offsets.topic.segment.bytes", "password.encoder.cipher.algorithm",
    "password.encoder.iterations", "password.encoder.key.length", "password.encoder.keyfactory.algorithm",
    "password.encoder.old.secret", "password.encoder.secret", "process.roles",
    "producer.purgatory.purge.interval.requests", "queued.max.request.bytes", "queued.max.requests",
    "quota.window.num", "quota.window.size.seconds", "remote.log.manager.copier.thread.pool.size",
    "remote.log.manager.copy.quota.window.num", "remote.log.manager.copy.quota.window.size.seconds",
    "remote.log.manager.expiration.thread.pool.size", "remote.log.manager.fetch.quota.window.num",
    "remote.log.manager.fetch.quota.window.size.seconds", "remote.log.manager.task.interval.ms",
    "remote.log.manager.thread.pool.size", "remote.log.metadata.custom.metadata.max.bytes",
    "remote.log.metadata.manager.class.name", "remote.log.metadata.manager.class.path",
    "remote.log.metadata.manager.impl.prefix", "remote.log.metadata.manager.listener.name",
    "remote.log.reader.max.pending.tasks", "remote.log.reader.threads", "remote.log.storage.manager.class.name",
    "remote.log.storage.manager.class.path", "remote.log.storage.manager.impl.prefix",
    "remote.log.storage.system.enable", "replica.fetch.backoff.ms", "replica.fetch.max.bytes",
    "replica.fetch.min.bytes", "replica.fetch.response.max.bytes", "replica.fetch.wait.max.ms",
    "replica.high.watermark.checkpoint.interval.ms", "replica.lag.time.max.ms", "replica.selector.class",
    "replica.socket.receive.buffer.bytes", "replica.socket.timeout.ms", "replication.quota.window.num",
    "replication.quota.window.size.seconds", "request.timeout.ms", "reserved.broker.max.id",
    "sasl.client.callback.handler.class", "sasl.login.callback.handler.class", "sasl.login.class",
    "sasl.login.connect.timeout.ms", "sasl.login.read.timeout.ms", "sasl.login.retry.backoff.max.ms",
    "sasl.login.retry.backoff.ms", "sasl.mechanism.controller.protocol", "sasl.oauthbearer.clock.skew.seconds",
    "sasl.oauthbearer.expected.audience", "sasl.oauthbearer.expected.issuer",
    "sasl.oauthbearer.jwks.endpoint.refresh.ms", "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms",
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms", "sasl.oauthbearer.jwks.endpoint.url",
    "sasl.oauthbearer.scope.claim.name", "sasl.oauthbearer.sub.claim.name", "sasl.oauthbearer.token.endpoint.url",
    "sasl.server.callback.handler.class", "sasl.server.max.receive.size", "security.inter.broker.protocol",
    "security.providers", "share.coordinator.state.topic.min.isr",
    "share.coordinator.state.topic.replication.factor", "socket.connection.setup.timeout.max.ms",
    "socket.connection.setup.timeout.ms", "socket.listen.backlog.size", "socket.receive.buffer.bytes",
    "socket.request.max.bytes", "socket.send.buffer.bytes", "ssl.allow.dn.changes", "ssl.allow.san.changes",
    "ssl.principal.mapping.rules", "telemetry.max.bytes",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms", "transaction.max.timeout.ms",
    "transaction.remove.expired.transaction.cleanup.interval.ms", "transaction.state.log.load.buffer.size",
    "transaction.state.log.min.isr", "transaction.state.log.num.partitions",
    "transaction.state.log.replication.factor", "transaction.state.log.segment.bytes",
    "transactional.id.expiration.ms", "zookeeper.clientCnxnSocket", "zookeeper.connect",
    "zookeeper.connection.timeout.ms", "zookeeper.max.in.flight.requests", "zookeeper.metadata.migration.enable",
    "zookeeper.session.timeout.ms", "zookeeper.set.acl", "zookeeper.ssl.cipher.suites",
    "zookeeper.ssl.client.enable", "zookeeper.ssl.crl.enable", "zookeeper.ssl.enabled.protocols",
    "zookeeper.ssl.endpoint.identification.algorithm", "zookeeper.ssl.keystore.location",
    "zookeeper.ssl.keystore.password", "zookeeper.ssl.keystore.type", "zookeeper.ssl.ocsp.enable",
    "zookeeper.ssl.protocol", "zookeeper.ssl.truststore.location", "zookeeper.ssl.truststore.password",
    "zookeeper.ssl.truststore.type",
})

# name -> Kafka's type (boolean, int, short, long, double, string, list, class, password)
KAFKA_CLUSTER_WIDE: dict[str, str] = {
    "background.threads": "int", "compression.gzip.level": "int", "compression.lz4.level": "int",
    "compression.type": "string", "compression.zstd.level": "int", "log.cleaner.backoff.ms": "long",
    "log.cleaner.dedupe.buffer.size": "long", "log.cleaner.delete.retention.ms": "long",
    "log.cleaner.io.buffer.load.factor": "double", "log.cleaner.io.buffer.size": "int",
    "log.cleaner.io.max.bytes.per.second": "double", "log.cleaner.max.compaction.lag.ms": "long",
    "log.cleaner.min.cleanable.ratio": "double", "log.cleaner.min.compaction.lag.ms": "long", "log.cleaner.threads":
    "int", "log.cleanup.policy": "list", "log.flush.interval.messages": "long", "log.flush.interval.ms": "long",
    "log.index.interval.bytes": "int", "log.index.size.max.bytes": "int", "log.local.retention.bytes": "long",
    "log.local.retention.ms": "long", "log.message.downconversion.enable": "boolean",
    "log.message.timestamp.after.max.ms": "long", "log.message.timestamp.before.max.ms": "long",
    "log.message.timestamp.difference.max.ms": "long", "log.message.timestamp.type": "string", "log.preallocate":
    "boolean", "log.retention.bytes": "long", "log.retention.ms": "long", "log.roll.jitter.ms": "long",
    "log.roll.ms": "long", "log.segment.bytes": "int", "log.segment.delete.delay.ms": "long",
    "max.connection.creation.rate": "int", "max.connections": "int", "max.connections.per.ip": "int",
    "max.connections.per.ip.overrides": "string", "message.max.bytes": "int", "metric.reporters": "list",
    "min.insync.replicas": "int", "num.io.threads": "int", "num.network.threads": "int",
    "num.recovery.threads.per.data.dir": "int", "num.replica.fetchers": "int", "producer.id.expiration.ms": "int",
    "remote.fetch.max.wait.ms": "int", "remote.log.index.file.cache.total.size.bytes": "long",
    "remote.log.manager.copy.max.bytes.per.second": "long", "remote.log.manager.fetch.max.bytes.per.second": "long",
    "transaction.partition.verification.enable": "boolean", "unclean.leader.election.enable": "boolean",
}

KAFKA_PER_BROKER: dict[str, str] = {
    "advertised.listeners": "string", "listener.security.protocol.map": "string", "listeners": "string",
    "principal.builder.class": "class", "sasl.enabled.mechanisms": "list", "sasl.jaas.config": "password",
    "sasl.kerberos.kinit.cmd": "string", "sasl.kerberos.min.time.before.relogin": "long",
    "sasl.kerberos.principal.to.local.rules": "list", "sasl.kerberos.service.name": "string",
    "sasl.kerberos.ticket.renew.jitter": "double", "sasl.kerberos.ticket.renew.window.factor": "double",
    "sasl.login.refresh.buffer.seconds": "short", "sasl.login.refresh.min.period.seconds": "short",
    "sasl.login.refresh.window.factor": "double", "sasl.login.refresh.window.jitter": "double",
    "sasl.mechanism.inter.broker.protocol": "string", "ssl.cipher.suites": "list", "ssl.client.auth": "string",
    "ssl.enabled.protocols": "list", "ssl.endpoint.identification.algorithm": "string", "ssl.engine.factory.class":
    "class", "ssl.key.password": "password", "ssl.keymanager.algorithm": "string", "ssl.keystore.certificate.chain":
    "password", "ssl.keystore.key": "password", "ssl.keystore.location": "string", "ssl.keystore.password":
    "password", "ssl.keystore.type": "string", "ssl.protocol": "string", "ssl.provider": "string",
    "ssl.secure.random.implementation": "string", "ssl.trustmanager.algorithm": "string",
    "ssl.truststore.certificates": "password", "ssl.truststore.location": "string", "ssl.truststore.password":
    "password", "ssl.truststore.type": "string",
}

# Kafka's SslConfigs.RECONFIGURABLE_CONFIGS: dynamic only under a listener prefix
# (listener.name.<listener>.<config>); without one Kafka answers INVALID_REQUEST "These security
# configs can be dynamically updated only per-listener using the listener prefix".
KAFKA_LISTENER_ONLY: frozenset[str] = frozenset({
    "ssl.keystore.type", "ssl.keystore.location", "ssl.keystore.password", "ssl.key.password",
    "ssl.truststore.type", "ssl.truststore.location", "ssl.truststore.password", "ssl.keystore.key",
    "ssl.keystore.certificate.chain", "ssl.truststore.certificates",
})

KAFKA_BROKER_CONFIG_NAMES: frozenset[str] = KAFKA_READ_ONLY | frozenset(KAFKA_CLUSTER_WIDE) | frozenset(KAFKA_PER_BROKER)
