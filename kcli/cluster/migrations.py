"""Versioned schema of the shared cluster state in PostgreSQL, applied by every broker at start.

Each step runs in one transaction that first takes a transaction-level advisory lock (so two
brokers starting together migrate once) and sets ``lock_timeout``: a step that would wait for a
table lock held by live traffic gives up after a few seconds (the broker start fails with a clear
line and can be retried) instead of queueing every produce behind it. Steps only add things
(CREATE TABLE / ADD COLUMN without a rewriting default); an index on a big table belongs in a
``CREATE INDEX CONCURRENTLY`` step run outside a transaction.
"""

from __future__ import annotations

from typing import Any

MIGRATION_LOCK_ID = 0x6B636C6901  # "kcli" 01: pg_advisory_xact_lock key for schema changes
LOCK_TIMEOUT = "5s"

# (version, statements). Never edit a released step; append a new one.
STEPS: list[tuple[int, list[str]]] = [
    (1, [
        """CREATE TABLE IF NOT EXISTS metadata_records (
               "offset" bigserial PRIMARY KEY,
               record jsonb NOT NULL,
               node_id integer NOT NULL,
               appended_at timestamptz NOT NULL DEFAULT now())""",
        """CREATE TABLE IF NOT EXISTS brokers (
               node_id integer PRIMARY KEY,
               rack text,
               listeners jsonb NOT NULL,
               incarnation uuid NOT NULL,
               registered_at timestamptz NOT NULL DEFAULT now(),
               lease_expires_at timestamptz NOT NULL)""",
    ]),
    # Consumer-group offsets (kcli/cluster/pg_offsets.py): new tables, so no lock on live ones.
    (2, [
        """CREATE TABLE IF NOT EXISTS consumer_groups (
               group_id text PRIMARY KEY,
               protocol_type text,
               coordinator_node integer NOT NULL,
               claim uuid NOT NULL,
               claimed_at timestamptz NOT NULL DEFAULT now())""",
        """CREATE TABLE IF NOT EXISTS consumer_offsets (
               group_id text NOT NULL,
               topic text NOT NULL,
               partition integer NOT NULL,
               committed_offset bigint NOT NULL,
               leader_epoch integer NOT NULL DEFAULT -1,
               metadata text NOT NULL DEFAULT '',
               commit_timestamp_ms bigint NOT NULL,
               expire_timestamp_ms bigint,
               PRIMARY KEY (group_id, topic, partition))""",
        "CREATE INDEX IF NOT EXISTS consumer_offsets_by_topic ON consumer_offsets (topic)",
        """CREATE TABLE IF NOT EXISTS consumer_offsets_topic_deletions (
               topic_id uuid PRIMARY KEY,
               topic text NOT NULL,
               deleted_at timestamptz NOT NULL DEFAULT now())""",
    ]),
    # Remote log segment metadata of tiered topics (kcli/cluster/pg_remote_log.py): new tables.
    (3, [
        "CREATE SEQUENCE IF NOT EXISTS remote_log_segments_version",
        """CREATE TABLE IF NOT EXISTS remote_log_segments (
               segment_id uuid PRIMARY KEY,
               topic_id uuid NOT NULL,
               partition integer NOT NULL,
               start_offset bigint NOT NULL,
               end_offset bigint NOT NULL,
               state text NOT NULL,
               broker_id integer NOT NULL,
               metadata jsonb NOT NULL,
               version bigint NOT NULL,
               updated_at timestamptz NOT NULL DEFAULT now())""",
        "CREATE INDEX IF NOT EXISTS remote_log_segments_by_version ON remote_log_segments (version)",
        """CREATE TABLE IF NOT EXISTS remote_log_partition_stops (
               topic_id uuid NOT NULL,
               partition integer NOT NULL,
               tiered_epoch integer NOT NULL,
               stopped_at timestamptz NOT NULL DEFAULT now(),
               PRIMARY KEY (topic_id, partition, tiered_epoch))""",
    ]),
    # Transaction coordinator state (kcli/cluster/pg_transactions.py): a new table. ``claim`` is
    # the coordinating broker's, checked by every write (a stale coordinator is fenced).
    (4, [
        """CREATE TABLE IF NOT EXISTS transactions (
               transactional_id text PRIMARY KEY,
               record jsonb,
               state text,
               coordinator_node integer NOT NULL,
               claim uuid NOT NULL,
               claimed_at timestamptz NOT NULL DEFAULT now(),
               updated_at timestamptz NOT NULL DEFAULT now())""",
        # what every broker's takeover scan reads each second: the few ids not yet complete
        """CREATE INDEX IF NOT EXISTS transactions_open ON transactions (state)
               WHERE state IN ('Ongoing', 'PrepareCommit', 'PrepareAbort', 'PrepareEpochFence')""",
    ]),
    # KIP-932 share-partition state (Kafka's __share_group_state; kcli/coordinator/share/persister.py):
    # a new table. Written by each share partition's leader, fenced by ``state_epoch``.
    (5, [
        """CREATE TABLE IF NOT EXISTS share_group_state (
               group_id text NOT NULL,
               topic text NOT NULL,
               partition integer NOT NULL,
               state_epoch integer NOT NULL,
               start_offset bigint NOT NULL,
               batches jsonb NOT NULL,
               writer_node integer NOT NULL,
               updated_at timestamptz NOT NULL DEFAULT now(),
               PRIMARY KEY (group_id, topic, partition))""",
    ]),
]
LATEST = STEPS[-1][0]


def migrate(conn: Any) -> int:
    """Bring the schema to :data:`LATEST`; returns the version found before. ``conn`` is a
    psycopg connection in autocommit mode."""
    with conn.transaction():
        conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_ID,))
        conn.execute("""CREATE TABLE IF NOT EXISTS kcli_cluster_schema_version (
                            version integer PRIMARY KEY,
                            applied_at timestamptz NOT NULL DEFAULT now())""")
        row = conn.execute("SELECT coalesce(max(version), 0) FROM kcli_cluster_schema_version").fetchone()
        before = int(row[0])
    if before > LATEST:
        raise RuntimeError(f"the cluster database has schema version {before}, newer than this kcli knows ({LATEST})")
    for version, statements in STEPS:
        if version <= before:
            continue
        with conn.transaction():
            conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_ID,))
            done = conn.execute("SELECT 1 FROM kcli_cluster_schema_version WHERE version = %s", (version,)).fetchone()
            if done:
                continue  # another broker applied it while we waited for the lock
            for sql in statements:
                conn.execute(sql)
            conn.execute("INSERT INTO kcli_cluster_schema_version (version) VALUES (%s)", (version,))
    return before
