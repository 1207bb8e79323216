"""Kafka's own command-line tools, by name and flags, over kcli's operations layer.

Scripts, runbooks and test harnesses written for ``kafka-topics.sh``, ``kafka-configs.sh``,
``kafka-consumer-groups.sh``, ``kafka-dump-log.sh`` and friends run against kcli unchanged: each
module here is one tool (installed as ``kafka-<tool>`` and ``kafka-<tool>.sh`` console scripts),
parsing Kafka 4's flags the way joptsimple does (long options, ``--opt value`` and
``--opt=value``, unique prefixes) and printing the lines Kafka's tool prints, so output parsers
keep working. The work is done by ``kcli.ops`` and ``kcli.dumplog``, exactly as for ``kcli``.
:mod:`kcli.kafka_tools.common` holds what every tool shares: the parser, ``--bootstrap-server``
and ``--command-config``, and the one-line error boundary. docs/kafka-tools.md lists each tool's
flags and what differs from Kafka's.
"""
