"""The Kafka wire protocol: request/response codec over kio's schemas (:mod:`codec`), Kafka's
error table (:mod:`errors`), kcli's own admin schemas, a small blocking client, and the
inter-broker channel one broker uses to call another."""
