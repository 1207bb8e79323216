"""Consumer groups: the classic group coordinator's state machine (coordinator), KIP-848
consumer groups (consumer_group) with their server-side assignors (assignors), and the durable
committed-offsets store both write through (offsets), local or shared in PostgreSQL."""
