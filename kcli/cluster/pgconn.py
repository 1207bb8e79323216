"""What every PostgreSQL connection pool of kcli shares: the checkout check and URL redaction.

The cluster state, group offsets, transactions and the batch coordinator each keep a psycopg
pool on the same database; they check connections and print URLs the same way.
"""

from __future__ import annotations

import select
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg_pool import ConnectionPool


def check_connection(conn: psycopg.Connection) -> None:
    """A pool's check at checkout, without a round trip while the connection looks healthy.

    An idle connection has nothing to read: a server that restarted or ended the session (a
    FATAL message, then EOF) makes its socket readable. Only then is the connection checked with
    a round trip (psycopg_pool's check, which raises for a broken one: the pool replaces it). A
    round trip on every checkout cost each call one more wake-up of this process and the server
    (a fetch is one statement): 0.13 ms of a 0.8 ms find_batches (docs/performance.md)."""
    try:
        poller = select.poll()  # not select.select: a broker's descriptors may pass FD_SETSIZE
        poller.register(conn.fileno(), select.POLLIN)
        idle = not conn.closed and not poller.poll(0)
    except (OSError, ValueError, psycopg.Error):
        idle = False
    if not idle:
        ConnectionPool.check_connection(conn)


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
    except ValueError:
        return "<bad url>"
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))
