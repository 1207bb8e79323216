"""Durable share-partition state (Kafka's __share_group_state and its Persister).

Each share partition's leader writes, after every change a client is answered about (an
acknowledgement, a release, an expired lock that archived or freed a record), the partition's
snapshot: its state epoch, its start offset (SPSO) and the runs of records that are not plain
"available, never delivered" (acknowledged, archived, or available with a delivery count).
Acquired records are written as available: acquisition locks do not survive the broker, so after
a restart they are delivered again (Kafka's at-least-once), while acknowledged ones never are.

The state lives where the group offsets live, in the store the group coordinator already uses
(kcli/coordinator/group/offsets.py): on one broker as records of ``__consumer_offsets/offsets.log``
(fsynced before the answer, compacted with the offsets); in a cluster in the PostgreSQL table
``share_group_state`` (kcli/cluster/pg_offsets.py), where a write with an older state epoch than
the stored one is refused: the writer has been replaced (a new leader loaded the partition) or the
offsets were reset, and drops its copy.
"""

from __future__ import annotations

import logging
from typing import Any

from kcli.coordinator.group.offsets import OffsetStoreError

log = logging.getLogger("kcli.coordinator.share.persister")

CONFIGS_KEY = ("", -1)  # (topic, partition) under which a group's configs are stored


class SharePersister:
    def __init__(self, store: Any) -> None:
        self.store = store

    @property
    def supported(self) -> bool:
        return hasattr(self.store, "share_state_write")

    async def read(self, group_id: str, topic: str, partition: int) -> dict[str, Any] | None:
        if not self.supported:
            return None
        return await self.store.share_state_read(group_id, topic, partition)

    async def write(self, group_id: str, topic: str, partition: int, state: dict[str, Any]) -> bool:
        """Durable before it returns; False when this writer is fenced (a newer state epoch)."""
        if not self.supported:
            return True
        return bool(await self.store.share_state_write(group_id, topic, partition, state))

    async def states(self, group_id: str | None = None) -> dict[tuple[str, str, int], dict[str, Any]]:
        if not self.supported:
            return {}
        return {k: v for k, v in (await self.store.share_states(group_id)).items() if k[1] != CONFIGS_KEY[0]}

    # A share group's configs (Kafka's group configs: share.auto.offset.reset, ...) are kept beside
    # its partitions' states, under the pseudo partition ("", -1), so both stores hold them as is.
    async def group_configs(self, group_id: str) -> dict[str, str]:
        if not self.supported:
            return {}
        state = await self.store.share_state_read(group_id, *CONFIGS_KEY)
        return dict((state or {}).get("configs") or {})

    async def write_group_configs(self, group_id: str, configs: dict[str, str]) -> None:
        if self.supported:
            await self.store.share_state_write(group_id, *CONFIGS_KEY, {"state_epoch": 0, "start_offset": 0,
                                                                       "batches": [], "configs": dict(configs)})

    async def delete(self, group_id: str, topic: str | None = None) -> None:
        if self.supported:
            await self.store.share_state_delete(group_id, topic)


__all__ = ["SharePersister", "OffsetStoreError"]
