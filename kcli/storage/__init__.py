"""The log (Kafka's ``storage``/``log`` modules): a partition's segments and indexes
(:mod:`segment`, :mod:`index`, :mod:`log`), producer state for idempotence (:mod:`producer_state`),
transaction index (:mod:`txn_state`), the log cleaner's compaction (:mod:`cleaner`) and log configs."""
