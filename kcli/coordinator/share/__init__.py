"""KIP-932 share groups ("queues"): membership and assignment (group.py, assignor.py), the
share partitions' record states (share_partition.py), share sessions (session.py), durable state
(persister.py) and the broker-side manager that ties them together (manager.py).
See docs/share-groups.md."""
