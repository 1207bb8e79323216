"""The broker (Kafka's ``server`` module): the process that owns a data dir, serves the Kafka
protocol and runs the storage features' background tasks.

:mod:`broker` holds the partition logs, topics and the extensions; :mod:`server` and
:mod:`connection` the sockets and framing; :mod:`dispatch` and ``handlers/`` one thin handler per
API (parse, call the owning component, answer); :mod:`authz` the per-API authorization;
:mod:`partition_reducer` and :mod:`log_cleaner` broker-side tasks of KIP-694 and compaction;
:mod:`metrics` and :mod:`prometheus` what it exposes; ``replica/`` the replication of classic
partitions (Kafka's ReplicaManager, Partition and ReplicaFetcherThread). Coordinators, security, configs and the
metadata image live below it (kcli.coordinator, kcli.security, kcli.config, kcli.metadata) and
never import it.
"""
