"""The ``kcli`` command line (Typer): each command parses its options, calls one function of
kcli.ops, and renders the result as a table, JSON or YAML. No Kafka logic lives here."""
