"""Kafka's record batch format (magic 2): batch headers, CRC-32C, control (marker) batches."""
