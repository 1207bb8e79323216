"""Which cluster owns a diskless coordinator and an object-store prefix, checked at start.

Diskless data is only as safe as the pairing of three things: the metadata log (which topics
exist), the batch coordinator (what their offsets and objects are) and the object store (the
bytes). If any of them is swapped — a deleted ``coordinator.db`` recreated empty, a second
cluster pointed at the same bucket prefix — the broker would serve offsets from 0 again and the
garbage collector would delete the other side's objects. So:

- the coordinator records the metadata log's cluster id (ClusterIdRecord) on first use; another
  id is refused, and so is a coordinator without one (new or emptied) while the metadata log
  holds diskless partitions it does not know and diskless was used here before;
- the store prefix holds a small marker object, ``kcli-cluster.json`` (outside the ``wal/``
  prefix, so no listing, verify, gc or dump tool ever sees it as a WAL object), naming the
  cluster that owns it; a start on a prefix owned by another cluster is refused.

Every refusal is one line (:class:`DisklessIdentityError`, exit 1 from ``kcli broker start``)
that names the problem; nothing is reset or deleted to make the start succeed.

A store that fails while the marker is read or written (after a few quick retries) does not
stop the start — the store probe already showed it is usable, and refusing on a blip would
break "a broker always starts on a data dir it once accepted". The claim is then retried by the
file cleaner before each orphan scan, and nothing is collected until it succeeds
(:class:`PrefixClaim`); upload intents keep another cluster's objects safe meanwhile anyway.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterable, TypeVar

from kcli.errors import OperationError

if TYPE_CHECKING:
    from pathlib import Path

    from kcli.config.broker_config import BrokerConfig
    from plugins.coordinator.base import BatchCoordinator
    from plugins.objectstore.base import ObjectStorage

PREFIX_MARKER_KEY = "kcli-cluster.json"
ATTEMPTS = 3  # store calls on the marker; a transient failure is retried this often
RETRY_DELAY_S = 0.2

log = logging.getLogger("kcli.diskless.identity")
T = TypeVar("T")


class DisklessIdentityError(OperationError):
    """The coordinator or the object store belongs to another cluster, or lost its state."""


def read_prefix_owner(storage: "ObjectStorage", own_writes: Iterable[bytes] = ()) -> str | None:
    """The cluster id in the prefix marker; None when there is no marker. ``own_writes``: the
    markers this process tried to write: a marker that is a strict prefix of one of them is
    this process's own torn upload (a store that is not atomic, cut mid-write) and counts as none,
    so it is written again instead of blocking the claim forever."""
    from plugins.objectstore.base import ObjectNotFound

    try:
        data = storage.fetch(PREFIX_MARKER_KEY)
    except ObjectNotFound:
        return None
    try:
        owner = json.loads(data)["cluster_id"]
        if not isinstance(owner, str) or not owner:
            raise ValueError(owner)
    except (ValueError, KeyError, TypeError):
        if any(len(data) < len(doc) and doc.startswith(data) for doc in own_writes):
            log.warning("object store %s: %s is a torn copy of the marker this broker was writing; writing it again",
                        storage.describe(), PREFIX_MARKER_KEY)
            return None
        raise DisklessIdentityError(
            f"object store {storage.describe()}: {PREFIX_MARKER_KEY} is not a kcli prefix marker;"
            " refusing to use a prefix whose owner is unknown") from None
    return owner


def _refuse_foreign_prefix(storage: "ObjectStorage", owner: str, cluster_id: str) -> None:
    raise DisklessIdentityError(
        f"object store {storage.describe()} belongs to cluster {owner} ({PREFIX_MARKER_KEY}), not to this"
        f" broker's cluster {cluster_id}: two clusters must not share a prefix (each would delete the"
        " other's objects); give this broker its own prefix")


def claim_prefix(storage: "ObjectStorage", cluster_id: str, owner: str | None = None,
                 own_writes: list[bytes] | None = None) -> None:
    """Write the marker if there is none (``owner`` as already read), then check it names us.
    Read back after writing: of two clusters racing for a new prefix, the loser sees the winner.
    ``own_writes`` collects the markers written (see :func:`read_prefix_owner`)."""
    own_writes = [] if own_writes is None else own_writes
    if owner is None:
        owner = read_prefix_owner(storage, own_writes)
    if owner is None:
        doc = json.dumps({"cluster_id": cluster_id, "created_at_ms": int(time.time() * 1000),
                          "note": "kcli diskless prefix owner; do not delete"}).encode()
        own_writes.append(doc)
        storage.upload(PREFIX_MARKER_KEY, doc, len(doc))
        owner = read_prefix_owner(storage, own_writes)
    if owner != cluster_id:
        _refuse_foreign_prefix(storage, owner or "?", cluster_id)


def retrying(fn: Callable[[], T], what: str) -> tuple[bool, T | None]:
    """(True, result), or (False, None) when the store failed ATTEMPTS times. An identity
    refusal is never retried: it propagates."""
    for attempt in range(ATTEMPTS):
        try:
            return True, fn()
        except DisklessIdentityError:
            raise
        except Exception as err:  # noqa: BLE001 - a store failure: retried, then reported
            if attempt == ATTEMPTS - 1:
                log.warning("%s failed %d times (%s): the prefix owner is checked again before the next"
                            " orphan scan", what, ATTEMPTS, err)
            else:
                time.sleep(RETRY_DELAY_S)
    return False, None


class PrefixClaim:
    """Whether this broker has verified (or written) the prefix marker; ``ensure`` claims it
    once, for the cleaner to call before every orphan scan (it raises until it succeeds)."""

    def __init__(self, storage: "ObjectStorage", cluster_id: str) -> None:
        self.storage = storage
        self.cluster_id = cluster_id
        self.verified = False
        self.own_writes: list[bytes] = []  # markers this process tried to write
        self._lock = threading.Lock()

    def ensure(self) -> None:
        with self._lock:
            if not self.verified:
                claim_prefix(self.storage, self.cluster_id, own_writes=self.own_writes)
                self.verified = True


def claim_prefix_at_start(config: "BrokerConfig", data_dir: "Path", cluster_id: str) -> None:
    """For a broker with an explicitly configured store and no diskless data yet: claim (or
    refuse) the prefix now, so a second cluster on the same prefix stops at start, not later."""
    from kcli.diskless.storage_setup import open_object_storage

    storage = open_object_storage(config, data_dir)
    try:
        retrying(lambda: claim_prefix(storage, cluster_id), f"claiming object store {storage.describe()}")
    finally:
        storage.close()


def check_coordinator(coordinator: "BatchCoordinator", cluster_id: str, unknown_partitions: Iterable[str],
                      *, used_before: bool, prefix_owner: str | None) -> None:
    """Refuse a coordinator of another cluster, or one that lost its state (see the module
    docstring); otherwise record ``cluster_id`` in it. ``unknown_partitions`` are the metadata
    log's live diskless partitions the coordinator has no log for; ``used_before`` says diskless
    was opened in this data dir before; ``prefix_owner`` is the store marker's cluster id."""
    where = getattr(coordinator, "path", type(coordinator).__name__)
    stored = coordinator.cluster_id()
    if stored is not None and stored != cluster_id:
        raise DisklessIdentityError(
            f"diskless coordinator {where} belongs to cluster {stored}, not to this broker's cluster {cluster_id}")
    missing = sorted(unknown_partitions)
    if stored is None and missing and (used_before or prefix_owner == cluster_id):
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise DisklessIdentityError(
            f"diskless coordinator {where} has no record of this cluster and does not know {len(missing)}"
            f" diskless partition(s) of the metadata log ({shown}): its state was lost or replaced (a deleted"
            " coordinator.db?); restore it from a backup — starting would reset these partitions to offset 0"
            " and leave their objects unreadable")
    if stored is None:
        coordinator.claim_cluster_id(cluster_id)
