"""Reassignment of diskless replicas (issue #27 item 5, seed 004 "Replicas"): metadata only, immediate.

A diskless replica holds no data the partition needs (its local segments are a cache of the batch
coordinator and the object store, kcli/diskless/replica_cache.py), so moving it copies nothing:
the PartitionChangeRecord sets the target replicas at once, with no adding/removing phase. A new
replica's broker sees itself in ``replicas`` and starts its cache by the start policy
(``diskless.replica.cache.start.bytes`` before the log end, or the log start); a removed one drops
its cache. The ISR reported to clients stays the cache-based one (DisklessEngine.isr).
"""

from __future__ import annotations

from typing import Any

from kcli.broker.replica import controller as ctl


def change_record(t: Any, p: Any, target: list[int], live: set[int]) -> dict[str, Any] | None:
    """The PartitionChangeRecord moving diskless partition ``p`` to ``target`` at once (None: no
    change). The record's ISR is the target: every replica can serve (from the store meanwhile), and
    the leader stays unless it was removed, else it is the first live target replica."""
    return ctl.build_change(t.topic_id, p, live, replicas=list(target), isr=list(target), adding=[], removing=[])
