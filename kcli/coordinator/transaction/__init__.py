"""Transactions (KIP-98): the transaction coordinator (coordinator) and the transaction state
it logs (state: TransactionMetadata, its states and the local TransactionLog), which the
shared cluster state also stores."""
