"""The hooks a storage feature (diskless, tiered, partition reduction) plugs into the broker.

The broker core knows classic logs; each feature is one :class:`BrokerExtension` attached to
``broker.diskless``, ``broker.tiered`` or ``broker.partition_reducer``. The core calls these
hooks at fixed points (start/close, topic deletion, config changes, describe) so features live
in their own modules instead of special cases scattered through the handlers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kcli.broker.broker import Broker
    from kcli.metadata.metadata_log import TopicState


class BrokerExtension:
    """No-op defaults; override what the feature needs."""

    def __init__(self, broker: "Broker") -> None:
        self.broker = broker

    async def start(self) -> None:
        """Called after metadata replay and classic logs are open, before the listener starts."""

    async def close(self) -> None:
        """Called on shutdown after the listener stopped; flush and stop background tasks."""

    def topic_deleted(self, topic: "TopicState") -> None:
        """The topic's RemoveTopicRecord is durable: delete the feature's data for it."""

    def validate_config_request(self, topic: "TopicState", changes: dict[str, str | None]) -> None:
        """Raise BrokerError to refuse an alter as requested (``None`` = delete), before generic
        validation: for rules about the request itself, e.g. KIP-950's in-progress error."""

    def validate_config_change(self, topic: "TopicState", old: dict[str, str], new: dict[str, str]) -> None:
        """Raise BrokerError to refuse a config change (runs for validate_only too)."""

    def config_change_records(self, topic: "TopicState", old: dict[str, str], new: dict[str, str]) -> list[dict[str, Any]]:
        """Extra metadata records written atomically with the ConfigRecords of a change."""
        return []

    def config_changed(self, topic: "TopicState", old: dict[str, str], new: dict[str, str]) -> None:
        """The change is durable and applied to the metadata state: act on it."""

    def topic_state(self, topic: "TopicState") -> dict[str, str]:
        """Read-only facts shown by DescribeConfigs as kcli.* entries (e.g. tiered state)."""
        return {}
