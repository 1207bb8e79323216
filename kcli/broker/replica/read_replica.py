"""KIP-392 follower fetching for replicated classic (and tiered) partitions: which replica the
leader points a consumer at (``replica.selector.class``, Kafka's RackAwareReplicaSelector), and how
a follower answers a consumer's Fetch (up to its own high watermark).

The leader picks, for a consumer Fetch (v11+) carrying ``rack_id`` (librdkafka's ``client.rack``):
itself when it is in the client's rack, else the live replica of that rack that has the fetch
offset (its log end, as the leader last saw it, is at or past it; its log start at or below it)
with the highest log end — Kafka's RackAwareReplicaSelector over ReplicaManager's candidate set —
and nothing (-1, the leader serves) when no replica of the rack qualifies. Kafka's default
(no selector) keeps every read on the leader; so does kcli's.

A follower serves a consumer whose fetch carries no stale leader epoch: records up to its high
watermark (the leader's, capped at its log end; a read_committed fetch up to its last stable
offset); an offset above its high watermark but within its log waits like a fetch at the log end.
A follower behind the consumer answers as Kafka's clients expect: OFFSET_NOT_AVAILABLE when the
leader has the offset (this replica has not fetched it yet: the client retries, then goes back
to the leader), OFFSET_OUT_OF_RANGE past the leader's high watermark too; FENCED_LEADER_EPOCH /
UNKNOWN_LEADER_EPOCH when the consumer's leader epoch is older / newer than this replica's.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from kcli.broker.replica.controller import is_replicated
from kcli.protocol.errors import BrokerError

SELECTOR_CONFIG = "replica.selector.class"
RACK_AWARE = "org.apache.kafka.common.replica.RackAwareReplicaSelector"
LEADER_ONLY = "org.apache.kafka.common.replica.LeaderSelector"
SELECTORS = ("", LEADER_ONLY, RACK_AWARE)  # "" (null): Kafka's default, the leader only


def rack_aware(b: Any) -> bool:
    try:
        return b.config.get_str(SELECTOR_CONFIG) == RACK_AWARE
    except Exception:  # noqa: BLE001 - a config without it: the leader only
        return False


def preferred_read_replica(m: Any, t: Any, idx: int, rack: str, fetch_offset: int) -> int:
    """On the leader: the broker a consumer of ``rack`` should fetch ``t``-``idx`` from, or -1
    (this leader serves it)."""
    b = m.b
    if not rack or not rack_aware(b):
        return -1
    lp = m.leaders.get((t.name, idx))
    p = t.partitions.get(idx)
    if lp is None or p is None or not is_replicated(p):
        return -1
    racks = {r.node_id: r.rack for r in b.live_brokers()}
    if racks.get(m.node_id) == rack:
        return -1  # the leader is in the client's rack
    best, best_leo = -1, -1
    for r in p.replicas:
        f = lp.followers.get(r)
        if r == m.node_id or f is None or racks.get(r) != rack:
            continue
        if f.log_end_offset < fetch_offset or f.log_start_offset > fetch_offset:
            continue  # it does not have the offset (yet, or any more)
        if f.log_end_offset > best_leo:
            best, best_leo = r, f.log_end_offset
    return best


def serves_as_follower(m: Any, t: Any, idx: int) -> bool:
    """This broker follows ``t``-``idx`` with a log here: it may answer a consumer's Fetch."""
    p = t.partitions.get(idx)
    return (p is not None and is_replicated(p) and p.leader != m.node_id and (t.name, idx) in m.following
            and m.b.logs.get((t.name, idx)) is not None)


async def read_as_follower(m: Any, t: Any, idx: int, fp: Any, max_bytes: int, *, min_one: bool,
                           read_committed: bool) -> Any:
    """A consumer's fetch of a partition this broker follows; raises BrokerError with Kafka's code."""
    b = m.b
    p = t.partitions[idx]
    lg = b.logs[(t.name, idx)]
    f = m.following.get((t.name, idx))
    epoch = int(getattr(fp, "current_leader_epoch", -1))
    if 0 <= epoch < p.leader_epoch:
        raise BrokerError(ErrorCode.fenced_leader_epoch, f"The leader epoch {epoch} of the request is older than "
                                                         f"{p.leader_epoch}, this replica's for {t.name}-{idx}")
    if epoch > p.leader_epoch:
        raise BrokerError(ErrorCode.unknown_leader_epoch, f"The leader epoch {epoch} of the request is newer than "
                                                          f"{p.leader_epoch}, this replica's for {t.name}-{idx}")
    offset = int(fp.fetch_offset)
    if offset > lg.log_end_offset:
        leader_hw = f.leader_high_watermark if f is not None else -1
        if offset <= leader_hw:
            raise BrokerError(ErrorCode.offset_not_available,
                              f"Broker {m.node_id} follows {t.name}-{idx} and has not fetched offset {offset} yet "
                              f"(its log end is {lg.log_end_offset}); the leader {p.leader} has it")
    rlm = getattr(b, "tiered", None)
    if rlm is not None and lg.log_start_offset <= offset < lg.local_log_start_offset and rlm.has_remote(t, idx):
        res = await rlm.read(t, idx, offset, max_bytes, min_one=min_one)
    else:
        upper = lg.last_stable_offset if read_committed else lg.high_watermark
        res = lg.read(offset, max_bytes, min_one_batch=min_one, upper_bound=upper)
    return res
