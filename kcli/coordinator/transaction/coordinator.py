"""Kafka's transaction coordinator (KIP-98) for the transactional ids this broker coordinates.

Each transactional id has a :class:`TransactionMetadata` that moves through Kafka's states
(Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort, PrepareEpochFence,
Dead). Every transition is written to the transaction state log before it is answered, as
Kafka appends to ``__transaction_state``; here that log is
``<data_dir>/__transaction_state/transactions.log`` (one CRC-checked JSON line per transition,
the format of the committed-offsets log). After a restart, transactions found in PrepareCommit
or PrepareAbort get their markers written again (a second marker for a closed transaction is
harmless), and Ongoing ones are aborted when their timeout passes.

Ending a transaction: PrepareCommit/PrepareAbort is made durable, then a COMMIT/ABORT control
batch is appended to every partition of the transaction (fsynced), the offsets of
TxnOffsetCommit are committed to their groups (commit only), and CompleteCommit/CompleteAbort
is written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.coordinator.group.coordinator import coordinator_node, offsets_partition
from kcli.protocol.interbroker import InterBrokerError, request as inter_broker_request
from kcli.coordinator.transaction.state import (
    COMPLETE_ABORT, COMPLETE_COMMIT, DEAD, EMPTY, MAX_EPOCH, NO_PRODUCER_EPOCH, ONGOING, PREPARE_ABORT,
    PREPARE_COMMIT, PREPARE_EPOCH_FENCE, PendingOffset, TopicPartition, TransactionFencedError,
    TransactionMetadata, TransactionStateError, _now_ms, now_ms, offset_topics, state_error_code,
)
from kcli.records.control import marker_batch
from kcli.storage.log import AppendOrigin

log = logging.getLogger("kcli.coordinator.transaction.coordinator")

OWNERSHIP_CHECK_S = 1.0  # how often a cluster coordinator looks for ids that moved or were left open
GROUP_MARKER_TOPIC = "__consumer_offsets"  # a WriteTxnMarkers for it ends a transaction's offsets at a group
MARKER_ATTEMPTS = 3  # markers/offsets sent again this often within one completion, then by the timeout round



# Bounds the wait for a diskless marker's WAL object (upload + commit); the appender answers
# sooner with its own error when the object store or the batch coordinator fails.
DISKLESS_MARKER_TIMEOUT_S = 30.0


def _append_marker(b: Any, topic: str, partition: int, batch: bytes, now: int) -> Any:
    """Append a marker batch to a classic partition hosted here; None when the topic is gone
    (nothing left to mark), or the future of its Produce answer for a diskless partition (a
    WAL object committed through the batch coordinator). Raises LogError/BrokerError with a
    Kafka code."""
    t = b.topic(topic)
    if t is None or partition not in t.partitions:
        return None
    if b.is_diskless(t):
        return b.diskless.append_marker(t, partition, batch)
    lg = b.log_for(t, partition)
    lg.append(batch, now_ms=now, leader_epoch=t.partitions[partition].leader_epoch, origin=AppendOrigin.COORDINATOR)
    b.notifier.notify(topic, partition)
    return lg


async def write_marker(b: Any, topic: str, partition: int, commit: bool, producer_id: int, producer_epoch: int,
                       coordinator_epoch: int) -> int:
    """WriteTxnMarkers for one partition: append and fsync the marker; the Kafka error code."""
    now = now_ms()
    try:
        lg = _append_marker(b, topic, partition, marker_batch(commit, producer_id, producer_epoch,
                                                                coordinator_epoch, now), now)
        if isinstance(lg, asyncio.Future):  # diskless: committed when its WAL object is
            answer = await asyncio.wait_for(lg, DISKLESS_MARKER_TIMEOUT_S)
            return int(answer["error_code"])
        if lg is not None:
            await b.flusher.flush({lg})
    except asyncio.TimeoutError:
        log.warning("the marker for %s-%d was not committed within %.0f s", topic, partition,
                    DISKLESS_MARKER_TIMEOUT_S)
        return int(ErrorCode.request_timed_out)
    except Exception as err:
        code = getattr(err, "code", None)
        if code is None:
            log.exception("writing a marker to %s-%d failed", topic, partition)
            return int(ErrorCode.kafka_storage_error)
        return int(code)
    return ErrorCode.none


class TransactionCoordinator:
    """The transaction APIs' logic over :class:`TransactionMetadata` (see module docstring).

    ``broker`` provides what the coordinator acts on: ``allocate_producer_id()``, ``topic()``,
    ``log_for()``, ``is_diskless()``, ``notifier``, ``flusher``, ``groups`` and ``config``.
    Every method returns Kafka error codes; none raises for a client's mistake.

    In a cluster (a ``shared`` store, kcli/cluster/pg_transactions.py) each transactional id has
    one coordinator among the live brokers, placed exactly as consumer groups are (Kafka's
    partitionFor over ``transaction.state.log.num.partitions``, then rendezvous hashing over the
    live brokers): :meth:`route` answers NOT_COORDINATOR elsewhere, and loads (claims) the id's
    state from the store on first use. The ownership loop releases ids that moved away and takes
    over ids left open by a broker that died: it completes their PrepareCommit/PrepareAbort and
    the timeout round aborts their Ongoing transactions. Markers for a classic partition hosted
    by another broker go there as WriteTxnMarkers; a group's offsets are committed at the group's
    coordinator (:mod:`kcli.protocol.interbroker`).
    """

    def __init__(self, store: Any, broker: Any) -> None:
        self.store = store  # TransactionLog, or the cluster's PgTransactionStore
        self.broker = broker
        self.shared = bool(getattr(store, "shared", False))
        self.txns: dict[str, TransactionMetadata] = {}
        self._loaded: set[str] = set()  # ids claimed from a shared store
        # group → {partition: (producer id, expiry)}: offsets this broker, as the group's
        # coordinator, passed on to the coordinator of an open transaction on another broker
        self._passed_on: dict[str, dict[TopicPartition, tuple[int, float]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._task: asyncio.Task[None] | None = None
        self._ownership_task: asyncio.Task[None] | None = None
        self.active = False

    def _cfg(self, name: str) -> int:
        return int(self.broker.config.get_int(name))

    # -- lifecycle
    async def start(self) -> None:
        self.txns = await asyncio.to_thread(self.store.open)
        self.active = True
        for md in list(self.txns.values()):
            if md.state in (PREPARE_COMMIT, PREPARE_ABORT):
                log.info("completing %s of transactional id %s found at start", md.state, md.transactional_id)
                async with self._lock(md.transactional_id):
                    await self._complete(md)
        self._task = asyncio.get_running_loop().create_task(self._cleanup_loop(), name="txn-timeouts")
        if self.shared:
            self._ownership_task = asyncio.get_running_loop().create_task(self._ownership_loop(), name="txn-ownership")

    async def close(self) -> None:
        self.active = False
        for task in (self._task, self._ownership_task):
            if task is None:
                continue
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self.store.close()

    # -- which broker coordinates a transactional id (cluster)
    def coordinator_of(self, tid: str) -> int:
        """Node id of the live broker that coordinates ``tid`` (this one on a single broker)."""
        me = self.broker.node_id
        if not self.shared:
            return me
        nodes = frozenset([*(r.node_id for r in self.broker.live_brokers()), me])
        if len(nodes) == 1:
            return me
        return coordinator_node(offsets_partition(tid, self._cfg("transaction.state.log.num.partitions")), nodes)

    async def route(self, tid: str) -> int:
        """NONE when this broker coordinates ``tid`` and has its state loaded (claiming it from
        the shared store first: after a failover that is the store's state now, and Prepare
        states found there are completed), else NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE.
        Call it outside the id's lock."""
        if not self.active:
            return ErrorCode.coordinator_not_available
        if not self.shared or not tid:
            return ErrorCode.none
        if self.coordinator_of(tid) != self.broker.node_id:
            if tid in self._loaded:
                self._release(tid, f"it moved to node {self.coordinator_of(tid)}")
            return ErrorCode.not_coordinator
        if tid in self._loaded:
            return ErrorCode.none
        async with self._lock(tid):
            if tid not in self._loaded:
                try:
                    md = await self.store.claim(tid)
                except TransactionStateError as err:
                    log.warning("transactional id %s: cannot load its state: %s", tid, err)
                    return ErrorCode.coordinator_not_available
                if md is None:
                    self.txns.pop(tid, None)
                else:
                    self.txns[tid] = md
                self._loaded.add(tid)
                log.info("transactional id %s: now coordinated by node %d (%s)", tid, self.broker.node_id,
                         md.state if md is not None else "new")
                if md is not None and md.state in (PREPARE_COMMIT, PREPARE_ABORT):
                    await self._complete(md)
        return ErrorCode.none if tid in self._loaded else ErrorCode.not_coordinator

    def _release(self, tid: str, why: str) -> None:
        self._loaded.discard(tid)
        self.txns.pop(tid, None)
        self.store.release(tid)
        log.info("transactional id %s: no longer coordinated by node %d: %s", tid, self.broker.node_id, why)

    async def check_ownership(self) -> None:
        """Release ids that moved to another live broker; take over ids with an open or ending
        transaction whose coordinator is gone (or that another broker claimed meanwhile)."""
        me = self.broker.node_id
        for tid in sorted(self._loaded):
            if self.coordinator_of(tid) != me:
                async with self._lock(tid):
                    if tid in self._loaded:
                        self._release(tid, f"it moved to node {self.coordinator_of(tid)}")
        for tid in await self.store.orphans():
            if self.coordinator_of(tid) != me:
                continue
            try:  # one id that cannot be taken over does not hold back the others
                if tid in self._loaded:
                    async with self._lock(tid):
                        self._release(tid, "another broker claimed it")
                await self.route(tid)
            except Exception as err:  # noqa: BLE001 - retried at the next check
                log.warning("transactional id %s: taking it over failed (next check retries): %s", tid, err)

    async def _ownership_loop(self) -> None:
        while self.active:
            await asyncio.sleep(OWNERSHIP_CHECK_S)
            try:
                await self.check_ownership()
            except TransactionStateError as err:
                log.debug("transaction ownership check: %s", err)
            except Exception:
                log.exception("transaction ownership check failed")

    def _lock(self, tid: str) -> asyncio.Lock:
        lock = self._locks.get(tid)
        if lock is None:
            lock = self._locks[tid] = asyncio.Lock()
        return lock

    async def _persist(self, md: TransactionMetadata) -> None:
        md.update_ms = _now_ms()
        try:
            await self.store.write([md.to_record()], self.txns)
        except TransactionFencedError:
            if md.transactional_id in self._loaded:
                self._release(md.transactional_id, "another broker claimed it")
            raise
        self.txns[md.transactional_id] = md

    # -- InitProducerId
    async def init_producer_id(self, tid: str, timeout_ms: int, expected_pid: int = -1,
                               expected_epoch: int = -1) -> tuple[int, int, int]:
        """(error, producer id, epoch) for a transactional producer (Kafka's handleInitProducerId)."""
        if not tid:
            return ErrorCode.invalid_request, -1, -1
        if timeout_ms <= 0 or timeout_ms > self._cfg("transaction.max.timeout.ms"):
            return ErrorCode.invalid_transaction_timeout, -1, -1
        routed = await self.route(tid)
        if routed:
            return routed, -1, -1
        async with self._lock(tid):
            try:
                return await self._init_locked(tid, timeout_ms, expected_pid, expected_epoch)
            except TransactionStateError as err:
                log.error("InitProducerId %s: %s", tid, err)
                return state_error_code(err), -1, -1

    async def _init_locked(self, tid: str, timeout_ms: int, expected_pid: int,
                           expected_epoch: int) -> tuple[int, int, int]:
        md = self.txns.get(tid)
        if md is None:
            md = TransactionMetadata(tid, self.broker.allocate_producer_id(), 0, timeout_ms)
            await self._persist(md)
            return ErrorCode.none, md.producer_id, md.producer_epoch
        if expected_pid >= 0 and not (expected_pid == md.producer_id and
                                      expected_epoch in (md.producer_epoch, md.last_producer_epoch)):
            return ErrorCode.producer_fenced, -1, -1
        if md.state in (PREPARE_COMMIT, PREPARE_ABORT, PREPARE_EPOCH_FENCE):
            return ErrorCode.concurrent_transactions, -1, -1
        if md.state == ONGOING:
            # A new instance took over the id: fence the old one by aborting its transaction with
            # a bumped epoch; the client retries and then gets the next epoch (as Kafka answers).
            await self._fence_and_abort(md, recoverable=False)
            return ErrorCode.concurrent_transactions, -1, -1
        if expected_pid >= 0 and expected_epoch == md.last_producer_epoch and md.last_producer_epoch >= 0 \
                and expected_epoch != md.producer_epoch:
            return ErrorCode.none, md.producer_id, md.producer_epoch  # a retry of a bump already made
        if md.producer_epoch >= MAX_EPOCH:
            new = replace(md, producer_id=self.broker.allocate_producer_id(), producer_epoch=0,
                          last_producer_epoch=NO_PRODUCER_EPOCH)
        else:
            new = replace(md, producer_epoch=md.producer_epoch + 1, last_producer_epoch=md.producer_epoch)
        new = replace(new, timeout_ms=timeout_ms, state=EMPTY, partitions=frozenset(), pending_offsets={}, start_ms=-1)
        await self._persist(new)
        return ErrorCode.none, new.producer_id, new.producer_epoch

    # -- checks shared by the in-transaction APIs
    def _check(self, tid: str, pid: int, epoch: int) -> tuple[int, TransactionMetadata | None]:
        if not self.active:
            return ErrorCode.coordinator_not_available, None
        md = self.txns.get(tid)
        if md is None:
            return ErrorCode.invalid_producer_id_mapping, None
        if md.producer_id != pid:
            return ErrorCode.invalid_producer_id_mapping, None
        if md.producer_epoch != epoch:
            return ErrorCode.producer_fenced, None
        if md.state in (PREPARE_COMMIT, PREPARE_ABORT):
            return ErrorCode.concurrent_transactions, None
        if md.state in (PREPARE_EPOCH_FENCE, DEAD):
            return ErrorCode.invalid_txn_state, None
        return ErrorCode.none, md

    def _begin(self, md: TransactionMetadata) -> TransactionMetadata:
        """The metadata with the transaction started (Ongoing) if it was not yet."""
        if md.state == ONGOING:
            return replace(md)
        return replace(md, state=ONGOING, partitions=frozenset(), pending_offsets={}, start_ms=_now_ms(), tv2=False)

    async def add_partitions(self, tid: str, pid: int, epoch: int,
                             partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """AddPartitionsToTxn: an error per partition (OPERATION_NOT_ATTEMPTED for the rest
        when one fails, as Kafka answers)."""
        routed = await self.route(tid)
        if routed:
            return {tp: routed for tp in partitions}
        async with self._lock(tid):
            err, md = self._check(tid, pid, epoch)
            if md is None:
                return {tp: err for tp in partitions}
            bad = {tp: self._partition_error(tp) for tp in partitions}
            if any(bad.values()):
                return {tp: (code or ErrorCode.operation_not_attempted) for tp, code in bad.items()}
            if md.state == ONGOING and set(partitions) <= md.partitions:
                return {tp: ErrorCode.none for tp in partitions}
            new = self._begin(md)
            new.partitions = new.partitions | frozenset(partitions)
            try:
                await self._persist(new)
            except TransactionStateError as err_:
                log.error("AddPartitionsToTxn %s: %s", tid, err_)
                return {tp: state_error_code(err_) for tp in partitions}
            return {tp: ErrorCode.none for tp in partitions}

    def _partition_error(self, tp: TopicPartition) -> int:
        b = self.broker
        t = b.topic(tp[0])
        if t is None or tp[1] not in t.partitions:
            return ErrorCode.unknown_topic_or_partition
        return ErrorCode.none

    async def add_offsets(self, tid: str, pid: int, epoch: int, group_id: str) -> int:
        """AddOffsetsToTxn: the group's offsets will be committed with the transaction."""
        routed = await self.route(tid)
        if routed:
            return routed
        async with self._lock(tid):
            err, md = self._check(tid, pid, epoch)
            if md is None:
                return err
            if md.state == ONGOING and group_id in md.pending_offsets:
                return ErrorCode.none
            new = self._begin(md)
            new.pending_offsets = {**new.pending_offsets, group_id: dict(new.pending_offsets.get(group_id, {}))}
            try:
                await self._persist(new)
            except TransactionStateError as err_:
                log.error("AddOffsetsToTxn %s: %s", tid, err_)
                return state_error_code(err_)
            return ErrorCode.none

    async def txn_offset_commit(self, tid: str, group_id: str, pid: int, epoch: int,
                                offsets: dict[TopicPartition, PendingOffset]) -> dict[TopicPartition, int]:
        """TxnOffsetCommit: keep the offsets with the transaction until it ends (the group's
        coordinator checked the membership; in a cluster it passes the request on to here)."""
        routed = await self.route(tid)
        if routed:
            return {tp: routed for tp in offsets}
        async with self._lock(tid):
            err, md = self._check(tid, pid, epoch)
            if md is None:
                return {tp: err for tp in offsets}
            if md.state != ONGOING or group_id not in md.pending_offsets:
                return {tp: ErrorCode.invalid_txn_state for tp in offsets}
            new = replace(md, pending_offsets={**md.pending_offsets,
                                               group_id: {**md.pending_offsets[group_id], **offsets}})
            try:
                await self._persist(new)
            except TransactionStateError as err_:
                log.error("TxnOffsetCommit %s: %s", tid, err_)
                return {tp: state_error_code(err_) for tp in offsets}
            return {tp: ErrorCode.none for tp in offsets}

    # -- EndTxn
    async def end_txn(self, tid: str, pid: int, epoch: int, commit: bool) -> int:
        """EndTxn (Kafka's handleEndTransaction), answered once the markers are written."""
        routed = await self.route(tid)
        if routed:
            return routed
        async with self._lock(tid):
            if not self.active:
                return ErrorCode.coordinator_not_available
            md = self.txns.get(tid)
            if md is None or md.producer_id != pid:
                return ErrorCode.invalid_producer_id_mapping
            if md.producer_epoch != epoch:
                return ErrorCode.producer_fenced
            if md.state == ONGOING:
                new = replace(md, state=PREPARE_COMMIT if commit else PREPARE_ABORT)
                try:
                    await self._persist(new)
                except TransactionStateError as err:
                    log.error("EndTxn %s: %s", tid, err)
                    return state_error_code(err)
                await self._complete(new)
                return ErrorCode.none
            if md.state == COMPLETE_COMMIT:
                return ErrorCode.none if commit else ErrorCode.invalid_txn_state
            if md.state == COMPLETE_ABORT:
                return ErrorCode.none if not commit else ErrorCode.invalid_txn_state
            if md.state == PREPARE_COMMIT:
                return ErrorCode.concurrent_transactions if commit else ErrorCode.invalid_txn_state
            if md.state == PREPARE_ABORT:
                return ErrorCode.concurrent_transactions if not commit else ErrorCode.invalid_txn_state
            return ErrorCode.invalid_txn_state

    async def end_txn_v2(self, tid: str, pid: int, epoch: int, commit: bool) -> tuple[int, int, int]:
        """EndTxn v5 (KIP-890 transactions v2): (error, producer id, epoch the producer uses next).
        Every transaction ends with an epoch bump: the markers carry the new epoch, which fences
        the producer's late writes of the ended transaction; at the last epoch the next
        transaction gets a new producer id. A retry of an EndTxn already applied (the ended
        transaction's id and epoch) is answered as the first one was; an abort with nothing
        open (a TV2 client cannot know whether its first Produce added a partition) bumps too."""
        routed = await self.route(tid)
        if routed:
            return routed, -1, -1
        async with self._lock(tid):
            if not self.active:
                return ErrorCode.coordinator_not_available, -1, -1
            md = self.txns.get(tid)
            if md is None:
                return ErrorCode.invalid_producer_id_mapping, -1, -1
            ended = PREPARE_COMMIT if commit else PREPARE_ABORT
            done = COMPLETE_COMMIT if commit else COMPLETE_ABORT
            if (pid, epoch) == (md.prev_producer_id, md.last_producer_epoch) and md.tv2 and (pid, epoch) != \
                    (md.producer_id, md.producer_epoch) and md.state in (PREPARE_COMMIT, PREPARE_ABORT,
                                                                         COMPLETE_COMMIT, COMPLETE_ABORT):
                if md.state == done:  # a retry of the EndTxn that ended it
                    return ErrorCode.none, md.producer_id, md.producer_epoch
                if md.state == ended:
                    return ErrorCode.concurrent_transactions, -1, -1
                return ErrorCode.invalid_txn_state, -1, -1
            if md.producer_id != pid:
                return ErrorCode.invalid_producer_id_mapping, -1, -1
            if md.producer_epoch != epoch:
                return ErrorCode.producer_fenced, -1, -1
            if md.state in (PREPARE_COMMIT, PREPARE_ABORT):
                return (ErrorCode.concurrent_transactions if md.state == ended else ErrorCode.invalid_txn_state), -1, -1
            if md.state == ONGOING or (not commit and md.state in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT)):
                if md.state != ONGOING:
                    md = replace(md, partitions=frozenset(), pending_offsets={}, start_ms=_now_ms())
                new = replace(md, state=ended, producer_epoch=epoch + 1, last_producer_epoch=epoch,
                              prev_producer_id=pid, tv2=True)
                try:
                    await self._persist(new)
                    await self._complete(new)
                    cur = self.txns.get(tid, new)
                    if cur.state == done and epoch >= MAX_EPOCH:  # epochs exhausted (the marker had 32767): a new id
                        cur = replace(cur, producer_id=self.broker.allocate_producer_id(), producer_epoch=0)
                        await self._persist(cur)
                except TransactionStateError as err:
                    log.error("EndTxn %s: %s", tid, err)
                    return state_error_code(err), -1, -1
                return ErrorCode.none, cur.producer_id, cur.producer_epoch
            return ErrorCode.invalid_txn_state, -1, -1

    async def add_partitions_implicit(self, tid: str, pid: int, epoch: int,
                                      partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """KIP-890 part 2: the first Produce v12 to a partition adds it to the producer's
        transaction (beginning one when none is open), as the partition leader's
        AddPartitionsToTxn v5 does in Kafka."""
        routed = await self.route(tid)
        if routed:
            return {tp: routed for tp in partitions}
        async with self._lock(tid):
            md = self.txns.get(tid)
            if not self.active:
                return {tp: ErrorCode.coordinator_not_available for tp in partitions}
            if md is None or md.producer_id != pid:
                return {tp: ErrorCode.invalid_producer_id_mapping for tp in partitions}
            if epoch != md.producer_epoch:
                return {tp: ErrorCode.producer_fenced if epoch < md.producer_epoch else ErrorCode.invalid_producer_epoch
                        for tp in partitions}
            if md.state in (PREPARE_COMMIT, PREPARE_ABORT):
                return {tp: ErrorCode.concurrent_transactions for tp in partitions}
            if md.state in (PREPARE_EPOCH_FENCE, DEAD):
                return {tp: ErrorCode.invalid_txn_state for tp in partitions}
            bad = {tp: self._partition_error(tp) for tp in partitions}
            if any(bad.values()):
                return {tp: (code or ErrorCode.operation_not_attempted) for tp, code in bad.items()}
            if md.state == ONGOING and set(partitions) <= md.partitions:
                return {tp: ErrorCode.none for tp in partitions}
            new = self._begin(md)
            new.partitions = new.partitions | frozenset(partitions)
            new.tv2 = True
            try:
                await self._persist(new)
            except TransactionStateError as err_:
                log.error("implicit AddPartitionsToTxn %s: %s", tid, err_)
                return {tp: state_error_code(err_) for tp in partitions}
            return {tp: ErrorCode.none for tp in partitions}

    def verify_partitions(self, tid: str, pid: int, epoch: int, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """AddPartitionsToTxn v4+ with verify_only (KIP-890 part 1): is each partition already in
        the producer's open transaction? (INVALID_TXN_STATE for one that is not)."""
        md = self.txns.get(tid)
        if md is None or md.producer_id != pid:
            return {tp: ErrorCode.invalid_producer_id_mapping for tp in partitions}
        if epoch != md.producer_epoch:
            return {tp: ErrorCode.producer_fenced for tp in partitions}
        return {tp: ErrorCode.none if md.state == ONGOING and tp in md.partitions else ErrorCode.invalid_txn_state
                for tp in partitions}

    async def _fence_and_abort(self, md: TransactionMetadata, *, recoverable: bool) -> None:
        """Abort ``md``'s open transaction with a bumped epoch (Kafka's prepareFenceProducerEpoch):
        the markers carry the new epoch, so the old producer's writes are refused from then on.
        ``recoverable`` keeps the old epoch as the last one (KIP-588: a producer whose
        transaction timed out may re-initialise with it); a new instance fences it for good."""
        epoch = md.producer_epoch if md.producer_epoch >= MAX_EPOCH else md.producer_epoch + 1
        new = replace(md, producer_epoch=epoch, state=PREPARE_ABORT,
                      last_producer_epoch=md.producer_epoch if recoverable else NO_PRODUCER_EPOCH)
        await self._persist(new)
        await self._complete(new)

    async def _complete(self, md: TransactionMetadata) -> None:
        """Write the markers (and commit the offsets), then CompleteCommit/CompleteAbort. A failure
        is tried again a few times, then leaves PrepareCommit/PrepareAbort in the state; the
        timeout round (or the broker that takes the id over) retries it."""
        commit = md.state == PREPARE_COMMIT
        for attempt in range(1, MARKER_ATTEMPTS + 1):
            try:
                await self._write_markers(md, commit)
                for group_id, offsets in md.pending_offsets.items():
                    if commit and offsets:
                        await self._commit_group_offsets(group_id, offsets)
                    if self.shared:
                        await self._group_marker(group_id, md.producer_id, commit)
                done = replace(md, state=COMPLETE_COMMIT if commit else COMPLETE_ABORT,
                               partitions=frozenset(), pending_offsets={})
                await self._persist(done)
                return
            except TransactionFencedError as err:
                log.warning("transactional id %s: %s", md.transactional_id, err)
                return  # the broker that claimed it completes it
            except Exception as err:  # retried; the client's answer stands
                if attempt == MARKER_ATTEMPTS or not self.active:
                    log.error("transactional id %s: completing %s failed (will retry): %s",
                              md.transactional_id, md.state, err)
                    return
                await asyncio.sleep(0.5 * attempt)  # a dead broker leaves the live set within ~1 s

    async def _write_markers(self, md: TransactionMetadata, commit: bool) -> None:
        """A COMMIT/ABORT marker on every partition of the transaction: through
        :func:`write_marker` for a partition hosted here or a diskless one (any broker writes
        those), as WriteTxnMarkers to the host of a classic partition on another broker.
        Raises TransactionStateError naming the partitions not marked."""
        b = self.broker
        local: list[TopicPartition] = []
        remote: dict[int, list[TopicPartition]] = {}
        for topic, partition in sorted(md.partitions):
            t = b.topic(topic)
            if t is None or partition not in t.partitions:
                continue  # the topic is gone: nothing left to mark
            p = t.partitions[partition]
            if b.is_diskless(t) or b.leads(p):  # a replicated partition's markers go to its leader
                local.append((topic, partition))
            else:
                remote.setdefault(b.metadata.partition_host(p.leader), []).append((topic, partition))
        jobs = [self._local_marker(tp, commit, md) for tp in local]
        jobs += [self._remote_markers(node, tps, commit, md) for node, tps in sorted(remote.items())]
        failed = [f for fs in await asyncio.gather(*jobs) for f in fs]
        if failed:
            raise TransactionStateError(f"markers not written: {'; '.join(failed)}")

    async def _local_marker(self, tp: TopicPartition, commit: bool, md: TransactionMetadata) -> list[str]:
        code = await write_marker(self.broker, tp[0], tp[1], commit, md.producer_id, md.producer_epoch, 0)
        return [f"{tp[0]}-{tp[1]}: error {code}"] if code else []

    async def _remote_markers(self, node: int, tps: list[TopicPartition], commit: bool,
                              md: TransactionMetadata) -> list[str]:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in tps:
            by_topic.setdefault(topic, []).append(partition)
        body = {"markers": [{"producer_id": md.producer_id, "producer_epoch": md.producer_epoch,
                             "transaction_result": commit, "coordinator_epoch": 0,
                             "topics": [{"name": t, "partition_indexes": ps} for t, ps in by_topic.items()]}]}
        try:
            resp = await inter_broker_request(self.broker, node, 27, 1, body)
        except InterBrokerError as err:
            return [f"{', '.join(f'{t}-{p}' for t, p in tps)}: {err}"]
        return [f"{mt.name}-{int(mp.partition_index)} on node {node}: error {int(mp.error_code)}"
                for m in resp.markers for mt in m.topics for mp in mt.partitions if int(mp.error_code)]

    async def _group_marker(self, group_id: str, producer_id: int, commit: bool) -> None:
        """Tell the group's coordinator that the transaction ended, so that it forgets the
        offsets it passed on (OffsetFetch require_stable stops answering UNSTABLE_OFFSET_COMMIT):
        Kafka's marker on the group's ``__consumer_offsets`` partition, here a WriteTxnMarkers for
        that partition number."""
        partition = offsets_partition(group_id, self._cfg("offsets.topic.num.partitions"))
        node = self.broker.groups.coordinator_of(group_id)
        if node == self.broker.node_id:
            self.resolve_passed_on(partition, producer_id)
            return
        body = {"markers": [{"producer_id": producer_id, "producer_epoch": -1, "transaction_result": commit,
                             "coordinator_epoch": 0,
                             "topics": [{"name": GROUP_MARKER_TOPIC, "partition_indexes": [partition]}]}]}
        try:
            resp = await inter_broker_request(self.broker, node, 27, 1, body)
        except InterBrokerError as err:
            raise TransactionStateError(f"group {group_id}: {err}") from None
        bad = [int(p.error_code) for m in resp.markers for t in m.topics for p in t.partitions if int(p.error_code)]
        if bad:
            raise TransactionStateError(f"group {group_id}: node {node} answered error {bad[0]} to the marker")

    # -- offsets a group coordinator passed on to a transaction's coordinator elsewhere
    def note_passed_on(self, group_id: str, tps: Iterable[TopicPartition], producer_id: int) -> None:
        """Remember offsets of ``group_id`` held by another broker's open transaction until its
        marker comes (bounded by transaction.max.timeout.ms, should the marker never come)."""
        until = time.monotonic() + self._cfg("transaction.max.timeout.ms") / 1000
        held = self._passed_on.setdefault(group_id, {})
        for tp in tps:
            held[tp] = (producer_id, until)

    def resolve_passed_on(self, partition: int, producer_id: int) -> None:
        """A transaction of ``producer_id`` ended: forget what it held of the groups of
        ``__consumer_offsets`` partition ``partition``."""
        num = self._cfg("offsets.topic.num.partitions")
        for gid in [gid for gid in self._passed_on if offsets_partition(gid, num) == partition]:
            held = self._passed_on[gid]
            for tp in [tp for tp, (pid, _) in held.items() if pid == producer_id]:
                del held[tp]
            if not held:
                del self._passed_on[gid]

    async def _commit_group_offsets(self, group_id: str, offsets: dict[TopicPartition, PendingOffset]) -> None:
        """Commit a committed transaction's offsets at the group's coordinator: here, or by an
        OffsetCommit from this broker (which that coordinator takes without a membership check,
        as it checked the membership when TxnOffsetCommit arrived)."""
        groups = self.broker.groups
        routed = await groups.route(group_id)
        if routed == ErrorCode.none:
            await groups.commit_transactional_offsets(group_id, offsets)
            return
        if routed != ErrorCode.not_coordinator:
            raise TransactionStateError(f"group {group_id}: coordinator error {routed}")
        node = groups.coordinator_of(group_id)
        body = {"group_id": group_id, "generation_id_or_member_epoch": -1, "member_id": "",
                "group_instance_id": None, "topics": offset_topics(offsets)}
        try:
            resp = await inter_broker_request(self.broker, node, 8, 8, body)
        except InterBrokerError as err:
            raise TransactionStateError(f"group {group_id}: {err}") from None
        bad = [int(p.error_code) for t in resp.topics for p in t.partitions if int(p.error_code)]
        if bad:
            raise TransactionStateError(f"group {group_id}: node {node} answered error {bad[0]} to the offsets")

    # -- what other APIs ask
    def verify_produce(self, tid: str, pid: int, epoch: int, tp: TopicPartition) -> int:
        """A transactional Produce for ``tp``: the producer must be current and have added ``tp``.
        In a cluster, where the id is coordinated by another broker, the Produce is accepted and
        the partition's producer state refuses an older epoch (as Kafka before KIP-890 does)."""
        if self.shared and tid not in self._loaded:
            return ErrorCode.none
        md = self.txns.get(tid)
        if md is None or md.producer_id != pid:
            return ErrorCode.invalid_producer_id_mapping
        if epoch < md.producer_epoch:
            return ErrorCode.invalid_producer_epoch
        if md.state != ONGOING or tp not in md.partitions:
            return ErrorCode.invalid_txn_state
        return ErrorCode.none

    def has_pending_offsets(self, group_id: str, tp: TopicPartition) -> bool:
        """Whether an open transaction holds an offset for ``tp`` of the group (OffsetFetch with
        require_stable answers UNSTABLE_OFFSET_COMMIT then)."""
        held = self._passed_on.get(group_id, {}).get(tp)
        if held is not None and held[1] > time.monotonic():
            return True
        return any(tp in md.pending_offsets.get(group_id, {}) for md in self.txns.values()
                   if md.state in (ONGOING, PREPARE_COMMIT, PREPARE_ABORT))

    # -- background: timeouts, retries, expiration
    async def _cleanup_loop(self) -> None:
        while self.active:
            await asyncio.sleep(self._cfg("transaction.abort.timed.out.transaction.cleanup.interval.ms") / 1000)
            try:
                await self.abort_timed_out()
            except Exception:
                log.exception("transaction timeout round failed")

    async def abort_timed_out(self, now_ms: int | None = None) -> list[str]:
        """Abort transactions open past their timeout, finish stuck Prepare states, forget ids
        idle past transactional.id.expiration.ms; returns the ids aborted."""
        now = _now_ms() if now_ms is None else now_ms
        aborted = []
        expiry = self._cfg("transactional.id.expiration.ms")
        for tid, md in list(self.txns.items()):
            async with self._lock(tid):
                md = self.txns.get(tid)
                if md is None:
                    continue
                try:
                    if md.state == ONGOING and md.start_ms + md.timeout_ms < now:
                        log.info("aborting transaction of %s: open longer than its timeout of %d ms",
                                 tid, md.timeout_ms)
                        await self._fence_and_abort(md, recoverable=True)
                        aborted.append(tid)
                    elif md.state in (PREPARE_COMMIT, PREPARE_ABORT):
                        await self._complete(md)
                    elif md.state in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT) and md.update_ms + expiry < now:
                        await self.store.write([{"type": "txn_delete", "transactional_id": tid}], self.txns)
                        self.txns.pop(tid, None)
                        if tid in self._loaded:  # the row is gone: the next use claims the id anew
                            self._loaded.discard(tid)
                            self.store.release(tid)
                except Exception as err:  # noqa: BLE001 - one transaction's failure must not stop the others
                    log.error("transactional id %s: %s (retried next round)", tid, err)
        return aborted

    async def abort(self, tid: str) -> int:
        """Abort the open transaction of ``tid`` now (kcli transactions abort)."""
        routed = await self.route(tid)
        if routed:
            return routed
        async with self._lock(tid):
            md = self.txns.get(tid)
            if md is None:
                return ErrorCode.transactional_id_not_found
            if md.state != ONGOING:
                return ErrorCode.invalid_txn_state
            try:
                await self._fence_and_abort(md, recoverable=True)
            except TransactionStateError as err:
                return state_error_code(err)
            return ErrorCode.none
