"""Tiered storage (KIP-405) and its disablement (KIP-950): the remote log manager that copies,
reads and expires remote segments (:mod:`manager`), remote log metadata (:mod:`metadata`), and
turning tiering off with the retain or delete policy (:mod:`disable`)."""
