"""Feature levels (KIP-584) this broker supports and has finalized, as ApiVersions v3+ reports
them, and which clients may be sent them.

Kafka 4 brokers announce ``transaction.version`` (KIP-890: 2 turns on transactions v2),
``group.version`` (KIP-848: 1 = the consumer group protocol) and, from 4.1, ``share.version``
(KIP-932). kcli announces a feature only when it serves the APIs behind it, so a client never
picks a protocol the broker cannot speak. ``metadata.version`` and ``kraft.version`` describe a
KRaft quorum, which kcli does not run: they are not announced.

The features travel in tagged fields, which librdkafka before 2.2 mis-parses: they are written
only to a client whose ApiVersions v3+ request names software known to read them
(:func:`reads_tagged_fields`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

TRANSACTION_VERSION = "transaction.version"
GROUP_VERSION = "group.version"
SHARE_VERSION = "share.version"

CONSUMER_GROUP_HEARTBEAT_KEY = 68
SHARE_GROUP_HEARTBEAT_KEY = 76

# librdkafka 2.2 is the first release that reads tagged fields in every response.
LIBRDKAFKA_TAGGED_FIELDS = (2, 2)
_RDKAFKA_VERSION = re.compile(r"rdkafka[-_ /]?v?(\d+)\.(\d+)", re.IGNORECASE)
_VERSION = re.compile(r"^v?(\d+)\.(\d+)")


@dataclass(frozen=True)
class Feature:
    name: str
    min_version: int
    max_version: int  # supported range
    level: int  # finalized level; 0 = not finalized (Kafka leaves such features out)


def transaction_version(broker: Any) -> int:
    """The finalized transaction.version: the broker config of that name (2 by default, as a new
    Kafka 4.0 cluster; 0 or 1 keep every client on transactions v1)."""
    return int(broker.config.get_int(TRANSACTION_VERSION))


def features(broker: Any, api_keys: set[int]) -> list[Feature]:
    """The features of a broker serving ``api_keys``: supported ranges and finalized levels."""
    out = [Feature(TRANSACTION_VERSION, 0, 2, transaction_version(broker))]
    if CONSUMER_GROUP_HEARTBEAT_KEY in api_keys:
        out.append(Feature(GROUP_VERSION, 0, 1, 1))
    if SHARE_GROUP_HEARTBEAT_KEY in api_keys:
        out.append(Feature(SHARE_VERSION, 0, 1, 1))
    return out


def finalized_epoch(feats: list[Feature]) -> int:
    """A finalized-features epoch that grows when a level is raised (Java clients keep the
    features of the highest epoch they saw; -1 would mean none)."""
    return 1 + sum(f.level for f in feats)


def reads_tagged_fields(software_name: str | None, software_version: str | None) -> bool:
    """Whether a client (ApiVersions v3+'s client_software_name/version) reads tagged fields:
    librdkafka (its own name, or a wrapper's version such as ``2.16.1-rdkafka-2.16.0``) from 2.2
    on, any other client. A librdkafka client whose version cannot be read gets none."""
    name = software_name or ""
    version = software_version or ""
    m = _RDKAFKA_VERSION.search(version)
    if m is None and "rdkafka" in name.lower():
        m = _VERSION.match(version)
        if m is None:
            return False
    if m is None:
        return True
    return (int(m.group(1)), int(m.group(2))) >= LIBRDKAFKA_TAGGED_FIELDS
