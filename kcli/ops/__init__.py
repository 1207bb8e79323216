"""The operations layer between the CLI and a cluster: one function per operator action (create a
topic, disable tiering, shrink partitions, verify objects ...), speaking the Kafka protocol through
confluent-kafka's admin client or kcli's own wire client, returning plain results to render."""
