"""Kafka's configs as kcli knows them: definitions, defaults and validation of broker and topic
configs (definitions), a broker's parsed settings (broker_config) and server.properties."""
