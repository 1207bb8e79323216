"""The embedded default cluster the CLI uses when no bootstrap server or context is given."""

from kcli.broker.runner import EmbeddedBroker, default_data_dir, running_broker_address

__all__ = ["EmbeddedBroker", "default_data_dir", "running_broker_address"]
