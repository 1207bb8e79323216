"""kcli: operator toolkit for Kafka's newer storage features, with an embedded broker."""

__version__ = "0.1.0"
