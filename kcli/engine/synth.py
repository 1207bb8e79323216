"""Synthetic diskless datasets: WAL objects on disk plus a real SQLite coordinator that knows them.

The crossover bench and the engine tests need stores of any size without running a broker for
minutes: objects are laid out as the broker's WalBuilder does (version byte, then batches grouped
by partition) and committed through SqliteBatchCoordinator.commit_file, so offsets, batch
coordinates and per-topic accounting are the coordinator's own. The directory layout is a
broker data dir's: ``<root>/diskless/coordinator.db`` and ``<root>/objects/wal/<uuid>``, so the
offline tools find the store by default.
"""

from __future__ import annotations

import os
import random
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from plugins.coordinator.base import CommitBatchRequest, CreateTopicAndPartitionsRequest, TopicIdPartition


@dataclass
class Dataset:
    root: Path
    keys: list[str] = field(default_factory=list)
    total_bytes: int = 0
    batches: int = 0
    records: int = 0
    topics: list[TopicIdPartition] = field(default_factory=list)

    @property
    def coordinator_uri(self) -> str:
        return f"sqlite://{self.root / 'diskless' / 'coordinator.db'}"

    @property
    def objects_dir(self) -> Path:
        return self.root / "objects"

    @property
    def store_uri(self) -> str:
        return self.objects_dir.absolute().as_uri()

    def path(self, key: str) -> Path:
        return self.objects_dir / key


def _templates(count: int, records: int, value_size: int, seed: int) -> list[bytes]:
    """Distinct valid v2 batches (random values, so compression or dedup cannot cheat)."""
    from kcli.dumplog.synth import build_batch

    rng = random.Random(seed)
    out = []
    for t in range(count):
        recs = [(b"k%d" % i, rng.randbytes(value_size), []) for i in range(records)]
        out.append(build_batch(recs, 0, [1_700_000_000_000 + t * 1000 + i for i in range(records)]))
    return out


def make_dataset(root: str | os.PathLike[str], *, objects: int, object_bytes: int = 4 << 20,
                 batch_records: int = 200, value_size: int = 300, topics: int = 2, partitions: int = 4,
                 seed: int = 7, name_prefix: str = "bench") -> Dataset:
    """Write ``objects`` WAL objects of about ``object_bytes`` each and commit them (to an
    existing dataset too: use another ``seed`` so the new object keys differ)."""
    from plugins.coordinator.sqlite import SqliteBatchCoordinator

    root = Path(root)
    (root / "objects" / "wal").mkdir(parents=True, exist_ok=True)
    (root / "diskless").mkdir(parents=True, exist_ok=True)
    ds = Dataset(root)
    rng = random.Random(seed)
    templates = _templates(16, batch_records, value_size, seed)
    # Topic ids from the names: calling again with another seed appends objects to the same topics.
    topic_ids = [uuid.uuid5(uuid.NAMESPACE_URL, f"kcli-synth:{name_prefix}-{t}") for t in range(topics)]
    tips = [TopicIdPartition(topic_ids[t], f"{name_prefix}-{t}", p) for t in range(topics) for p in range(partitions)]
    ds.topics = tips
    with SqliteBatchCoordinator(root / "diskless" / "coordinator.db") as coordinator:
        coordinator.create_topic_and_partitions(
            [CreateTopicAndPartitionsRequest(tips[t * partitions].topic_id, tips[t * partitions].topic, partitions)
             for t in range(topics)])
        for _ in range(objects):
            key = f"wal/{uuid.UUID(int=rng.getrandbits(128), version=4)}"
            chunks = [b"\x00"]
            requests: list[CommitBatchRequest] = []
            position = 1
            n = 0
            # contiguous runs per partition, as WalBuilder lays them out
            per_tip = max(1, object_bytes // len(templates[0]) // len(tips))
            for tip in tips:
                for _ in range(per_tip):
                    batch = templates[rng.randrange(len(templates))]
                    chunks.append(batch)
                    requests.append(CommitBatchRequest(n, tip, position, len(batch), 0, batch_records - 1,
                                                       1_700_000_000_000, 0))
                    position += len(batch)
                    n += 1
                    if position >= object_bytes:
                        break
                if position >= object_bytes:
                    break
            data = b"".join(chunks)
            with open(root / "objects" / key, "wb") as f:
                f.write(data)
            failed = [r for r in coordinator.commit_file(key, 0, len(data), requests) if r.errors]
            if failed:
                raise RuntimeError(f"commit of {key} failed: error {failed[0].errors}")
            ds.keys.append(key)
            ds.total_bytes += len(data)
            ds.batches += len(requests)
            ds.records += len(requests) * batch_records
    return ds
