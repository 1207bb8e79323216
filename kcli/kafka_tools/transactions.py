"""kafka-transactions.sh (Kafka's TransactionsCommand) over kcli.ops.transactions: list,
describe, describe-producers and abort, printed with Kafka's tab-padded tables."""

from __future__ import annotations

import argparse
import time
from typing import Any

from kcli.errors import KcliError
from kcli.kafka_tools import common
from kcli.kafka_tools.common import ToolError, ToolParser

PROG = "kafka-transactions.sh"


class _Sub(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise ToolError(f"{self.prog}: error: {message}")


def parser() -> ToolParser:
    p = ToolParser(PROG, "This tool is used to analyze the transactional state of producers in the cluster. It can "
                         "be used to detect and recover from hanging transactions.")
    p.value("command-config", "property file containing configs to be passed to admin client", metavar="FILE")
    p.value("bootstrap-server", "hostname and port for the broker to connect to, in the form `host:port`",
            metavar="host:port")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Sub)
    lst = sub.add_parser("list", help="list transactions")
    lst.add_argument("--duration-filter", type=int, help="Duration (in millis) to filter by")
    desc = sub.add_parser("describe", help="describe the state of an active transactional-id")
    desc.add_argument("--transactional-id", required=True, help="transactional id")
    prod = sub.add_parser("describe-producers", help="describe the states of active producers for a topic partition")
    prod.add_argument("--broker-id", type=int, help="optional broker id to describe the producer state on a "
                                                    "specific replica")
    prod.add_argument("--topic", required=True, help="topic name")
    prod.add_argument("--partition", type=int, required=True, help="partition number")
    abort = sub.add_parser("abort", help="abort a hanging transaction (requires administrative privileges)")
    abort.add_argument("--topic", required=True, help="topic name")
    abort.add_argument("--partition", type=int, required=True, help="partition number")
    abort.add_argument("--start-offset", type=int, help="start offset of the transaction to abort")
    abort.add_argument("--producer-id", type=int, help="producer id")
    abort.add_argument("--producer-epoch", type=int, help="producer epoch")
    abort.add_argument("--coordinator-epoch", type=int, help="coordinator epoch")
    hang = sub.add_parser("find-hanging", help="find hanging transactions (kcli: not supported)")
    hang.add_argument("--broker-id", type=int)
    hang.add_argument("--topic")
    hang.add_argument("--partition", type=int)
    hang.add_argument("--max-transaction-timeout", type=int)
    return p


def _fail(message: str, err: BaseException) -> ToolError:
    return ToolError(f"{message}: {common.kafka_message(err)}. Enable debug logging for additional detail.")


def main(argv: list[str]) -> int:
    p = parser()
    ns = p.parse(argv)
    if ns.bootstrap_server is None:
        raise ToolError(f"{PROG}: error: argument --bootstrap-server is required")
    if ns.command is None:
        raise ToolError(f"{PROG}: error: too few arguments")
    if ns.command == "find-hanging":
        raise ToolError("find-hanging is not supported by kcli's kafka-transactions (use describe-producers)")
    conn = common.connection(ns)
    from kcli.ops import transactions as ops

    if ns.command == "list":
        try:
            rows = ops.list_transactions(conn, duration_ms=ns.duration_filter
                                         if ns.duration_filter is not None and ns.duration_filter >= 0 else None)
        except KcliError as err:
            raise _fail("Failed to list transactions", err) from None
        common.print_table(["TransactionalId", "Coordinator", "ProducerId", "TransactionState"],
                           [[t.transactional_id, "1", str(t.producer_id), t.state] for t in rows])
    elif ns.command == "describe":
        try:
            d = ops.describe_transaction(conn, ns.transactional_id)
        except KcliError as err:
            raise _fail(f"Failed to describe transaction state of transactional-id `{ns.transactional_id}`",
                        err) from None
        start = str(d.start_time_ms) if d.start_time_ms >= 0 else "None"
        duration = str(int(time.time() * 1000) - d.start_time_ms) if d.start_time_ms >= 0 else "None"
        common.print_table(["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
                            "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs",
                            "TopicPartitions"],
                           [["1", d.transactional_id, str(d.producer_id), str(d.producer_epoch), d.state,
                             str(d.timeout_ms), start, duration, ",".join(d.partitions)]])
    elif ns.command == "describe-producers":
        try:
            producers = ops.describe_producers(conn, ns.topic, ns.partition)
        except KcliError as err:
            raise _fail(f"Failed to describe producers for partition {ns.topic}-{ns.partition} on broker leader",
                        err) from None
        common.print_table(["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence", "LastTimestamp",
                            "CurrentTransactionStartOffset"],
                           [[str(x.producer_id), str(x.producer_epoch), str(x.coordinator_epoch), str(x.last_sequence),
                             str(x.last_timestamp),
                             str(x.current_txn_start_offset) if x.current_txn_start_offset >= 0 else "None"]
                            for x in producers])
    else:
        try:
            ops.abort_transaction(conn, ns.topic, ns.partition, start_offset=ns.start_offset,
                                  producer_id=ns.producer_id, producer_epoch=ns.producer_epoch,
                                  coordinator_epoch=ns.coordinator_epoch)
        except KcliError as err:
            raise _fail("Failed to abort transaction", err) from None
    return 0


def entry() -> None:
    common.run(main)
