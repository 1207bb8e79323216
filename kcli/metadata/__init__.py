"""Cluster metadata: KRaft-named records (TopicRecord, PartitionRecord, ConfigRecord ...), the
image they build (ClusterState) and the local metadata log. Shared by the broker and the
cluster state stores; it imports neither."""
