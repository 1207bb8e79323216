"""Consumer groups: the classic group coordinator's state machine (coordinator) and the durable
committed-offsets store it writes through (offsets), local or shared in PostgreSQL."""
