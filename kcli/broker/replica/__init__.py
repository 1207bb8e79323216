"""Replication of classic partitions: Kafka's ISR protocol (ReplicaManager, Partition, ReplicaFetcherThread).

A classic partition with more than one replica keeps a full log on every replica broker. The leader
takes produce and consumer fetches; each follower copies it with Fetch requests that carry its
replica id (``fetcher``: one asyncio task and one connection per source broker), appending the
leader's batches with their offsets and epochs (``AppendOrigin.REPLICATION``). The leader
(``partition``) tracks each follower's log end and last caught-up time, keeps the in-sync replica
set by ``replica.lag.time.max.ms`` and moves the high watermark to the ISR's lowest log end;
consumers read up to it and ``acks=all`` produces wait for it (``min.insync.replicas``).

ISR changes (by the leader) and leader elections (by the controller, ``controller``) are
PartitionChangeRecords in the shared metadata, fenced at append time by the partition epoch they
were computed from (kcli/cluster/conflicts.py), so a stale or cut-off leader cannot commit one.
A follower that meets a new leader epoch truncates its log to the new leader with
OffsetForLeaderEpoch before it fetches. Partitions with one replica never reach this package:
their path is the one they had before replication existed (no tasks, high watermark = log end).
Consumers may read followers (``read_replica``, KIP-392), catching-up replicas are throttled by
Kafka's replication throttle configs (``throttle``, KIP-73), and a tiered partition's new replica
starts at the remote tier's end (``fetcher``, KIP-405/KIP-1023).
docs/replication.md describes it for operators.
"""
