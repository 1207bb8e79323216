"""Transaction coordinator state in the cluster's PostgreSQL database (the cluster's
transaction store beside :class:`kcli.coordinator.transaction.coordinator.TransactionLog`), so that a
transaction survives the death of the broker that coordinated it.

Table ``transactions`` (migration step 4, :mod:`kcli.cluster.migrations`): one row per
transactional id — its latest :class:`~kcli.coordinator.transaction.coordinator.TransactionMetadata` record
(NULL while a broker has claimed the id but stored nothing yet), its state, and the ``claim`` of
the broker that coordinates it now.

Why a claim (as for consumer groups, :mod:`kcli.cluster.pg_offsets`): when the live brokers
change, two brokers may for a moment both think they coordinate an id. Loading an id writes a
fresh claim and reads the record in one statement; every later write goes through only while the
row still holds that claim, so a stale coordinator's write is refused (fenced) and its client is
told NOT_COORDINATOR — two brokers never both drive one transactional id.

Every wait is bounded: the pool's timeout, ``connect_timeout`` and ``statement_timeout`` (which
also bounds row-lock waits). An unreachable database is COORDINATOR_NOT_AVAILABLE to clients.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from kcli.coordinator.transaction.state import TransactionFencedError, TransactionMetadata, TransactionStateError
from kcli.cluster.pgconn import check_connection

log = logging.getLogger("kcli.cluster.transactions")

DB_ERRORS = (psycopg.Error, PoolTimeout, OSError)


class PgTransactionStore:
    """The transactional ids this broker coordinates, loaded from and written to PostgreSQL.

    Unlike the data dir's log it loads nothing at :meth:`open`: the coordinator claims an id
    (:meth:`claim`) when it first serves it or takes it over (:meth:`orphans`)."""

    shared = True

    def __init__(self, url: str, node_id: int, *, label: str, connect_kwargs: dict[str, Any],
                 timeout_s: float) -> None:
        self.url = url
        self.node_id = node_id
        self.label = label
        self._kwargs = connect_kwargs
        self._timeout = timeout_s
        self._pool: ConnectionPool | None = None
        self.claims: dict[str, uuid.UUID] = {}

    @property
    def location(self) -> str:
        return f"transaction state in the cluster database {self.label}"

    def open(self) -> dict[str, TransactionMetadata]:
        if self._pool is None:
            self._pool = ConnectionPool(self.url, kwargs=self._kwargs, min_size=1, max_size=2, timeout=self._timeout,
                                        open=False, check=check_connection, name="kcli-transactions",
                                        reconnect_timeout=max(60.0, self._timeout * 4))
            self._pool.open(wait=False)
        return {}

    def _conn(self) -> Any:
        if self._pool is None:
            raise TransactionStateError(f"{self.location} is closed")
        return self._pool.connection(timeout=self._timeout)

    # -- ownership
    async def claim(self, tid: str) -> TransactionMetadata | None:
        """Become the coordinator of ``tid`` (fencing the previous one) and read its state."""
        claim = uuid.uuid4()
        rec = await self._run(self._claim, tid, claim)
        self.claims[tid] = claim
        if rec is None:
            return None
        return TransactionMetadata.from_record(rec)

    def _claim(self, tid: str, claim: uuid.UUID) -> Any:
        with self._conn() as conn:
            row = conn.execute(
                """INSERT INTO transactions (transactional_id, coordinator_node, claim) VALUES (%s, %s, %s)
                   ON CONFLICT (transactional_id) DO UPDATE SET coordinator_node = EXCLUDED.coordinator_node,
                       claim = EXCLUDED.claim, claimed_at = now()
                   RETURNING record""", (tid, self.node_id, claim)).fetchone()
        return row[0] if row else None

    def release(self, tid: str) -> None:
        """Forget this broker's claim (the id moved away); the next write here is fenced."""
        self.claims.pop(tid, None)

    async def orphans(self) -> list[str]:
        """Ids with a transaction still open or being ended that this broker has not claimed."""
        rows = await self._run(self._open_rows)
        return [str(tid) for tid, claim in rows if self.claims.get(str(tid)) != claim]

    def _open_rows(self) -> list[tuple[Any, ...]]:
        with self._conn() as conn:
            return conn.execute("""SELECT transactional_id, claim FROM transactions
                                   WHERE state IN ('Ongoing', 'PrepareCommit', 'PrepareAbort', 'PrepareEpochFence')""").fetchall()

    # -- writing
    async def write(self, records: list[dict[str, Any]], live: dict[str, TransactionMetadata]) -> None:
        """Store ``records`` in one transaction, each only under this broker's claim of its id
        (TransactionFencedError when another broker claimed it since)."""
        claims = {}
        for rec in records:
            tid = rec["transactional_id"]
            if tid not in self.claims:
                raise TransactionFencedError(f"transactional id {tid} is not coordinated here")
            claims[tid] = self.claims[tid]
        fenced = await self._run(self._write, records, claims)
        if fenced:
            for tid in fenced:
                self.claims.pop(tid, None)
            raise TransactionFencedError(f"another broker coordinates transactional id(s) {', '.join(fenced)} now")

    def _write(self, records: list[dict[str, Any]], claims: dict[str, uuid.UUID]) -> list[str]:
        fenced: list[str] = []
        with self._conn() as conn, conn.transaction():
            for rec in records:
                tid = rec["transactional_id"]
                if rec.get("type") == "txn_delete":
                    cur = conn.execute("DELETE FROM transactions WHERE transactional_id = %s AND claim = %s",
                                       (tid, claims[tid]))
                else:
                    cur = conn.execute("""UPDATE transactions SET record = %s, state = %s, updated_at = now()
                                          WHERE transactional_id = %s AND claim = %s""",
                                       (Jsonb(rec), rec["state"], tid, claims[tid]))
                if cur.rowcount != 1:
                    fenced.append(tid)
            if fenced:
                raise _Fenced(fenced)
        return fenced

    async def _run(self, fn: Any, *args: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args)
        except _Fenced as err:
            return err.ids
        except DB_ERRORS as err:
            text = str(err).strip().splitlines()
            raise TransactionStateError(f"{self.location}: {text[0] if text else type(err).__name__}") from None

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                pool.close(timeout=self._timeout)
            except Exception:  # pragma: no cover
                pass


class _Fenced(Exception):
    """Rolls back a write that met another broker's claim (carries the ids)."""

    def __init__(self, ids: list[str]) -> None:
        super().__init__(", ".join(ids))
        self.ids = ids
