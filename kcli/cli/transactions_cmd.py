"""`kcli transactions list|describe|describe-producers|abort`: kafka-transactions.sh for a kcli broker.

Parsing and rendering only; the work is in :mod:`kcli.ops.transactions`.
"""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from kcli.cli.common import options
from kcli.cli.render import print_table, render
from kcli.ops.connection import connect

transactions_app = typer.Typer(help="Transactions (KIP-98): list, describe, and abort hanging ones, as "
                                    "kafka-transactions.sh does.", no_args_is_help=True)


@transactions_app.command("list")
def list_(
    ctx: typer.Context,
    state: Optional[List[str]] = typer.Option(None, "--state", help="Only this state (repeatable): Empty, Ongoing, ..."),
    producer_id: Optional[List[int]] = typer.Option(None, "--producer-id", help="Only this producer id (repeatable)."),
    duration_filter: Optional[int] = typer.Option(None, "--duration-filter", help="Only transactions open longer than this many ms."),
) -> None:
    """List transactional ids with their producer id and state.

    Example: kcli transactions list --state Ongoing --duration-filter 60000
    """
    from kcli.ops.transactions import list_transactions

    opts = options(ctx)
    with connect(opts) as conn:
        result = list_transactions(conn, state, producer_id, duration_filter)

    def table() -> None:
        if not result:
            sys.stdout.write("No transactional ids.\n")
            return
        print_table([vars(r) for r in result], [("TRANSACTIONAL ID", "transactional_id"),
                                                ("PRODUCER ID", "producer_id"), ("STATE", "state")])

    render(result, opts.output, table)


@transactions_app.command("describe")
def describe(
    ctx: typer.Context,
    transactional_id: str = typer.Option(..., "--transactional-id", help="The producer's transactional.id."),
) -> None:
    """Show one transactional id: state, producer id and epoch, timeout, open partitions.

    Example: kcli transactions describe --transactional-id orders-app-1
    """
    from kcli.ops.transactions import describe_transaction

    opts = options(ctx)
    with connect(opts) as conn:
        d = describe_transaction(conn, transactional_id)
    row = {**vars(d), "partitions": ",".join(d.partitions)}
    render(d, opts.output, lambda: print_table([row], [
        ("TRANSACTIONAL ID", "transactional_id"), ("STATE", "state"), ("PRODUCER ID", "producer_id"),
        ("EPOCH", "producer_epoch"), ("TIMEOUT MS", "timeout_ms"), ("START MS", "start_time_ms"),
        ("PARTITIONS", "partitions")]))


@transactions_app.command("describe-producers")
def describe_producers_(
    ctx: typer.Context,
    topic: str = typer.Option(..., "--topic", help="Topic of the partition."),
    partition: int = typer.Option(..., "--partition", help="Partition index."),
) -> None:
    """Show the producers a partition knows, with the start offset of their open transaction.

    Example: kcli transactions describe-producers --topic orders --partition 0
    """
    from kcli.ops.transactions import describe_producers

    opts = options(ctx)
    with connect(opts) as conn:
        result = describe_producers(conn, topic, partition)

    def table() -> None:
        if not result:
            sys.stdout.write(f"No active producers on {topic}-{partition}.\n")
            return
        print_table([vars(r) for r in result], [
            ("PRODUCER ID", "producer_id"), ("EPOCH", "producer_epoch"), ("LAST SEQUENCE", "last_sequence"),
            ("LAST TIMESTAMP", "last_timestamp"), ("COORDINATOR EPOCH", "coordinator_epoch"),
            ("TXN START OFFSET", "current_txn_start_offset")])

    render(result, opts.output, table)


@transactions_app.command("abort")
def abort(
    ctx: typer.Context,
    topic: str = typer.Option(..., "--topic", help="Topic of the partition with the hanging transaction."),
    partition: int = typer.Option(..., "--partition", help="Partition index."),
    start_offset: Optional[int] = typer.Option(None, "--start-offset", help="First offset of the hanging transaction."),
    producer_id: Optional[int] = typer.Option(None, "--producer-id", help="Producer id (with --producer-epoch, --coordinator-epoch)."),
    producer_epoch: Optional[int] = typer.Option(None, "--producer-epoch", help="Producer epoch."),
    coordinator_epoch: Optional[int] = typer.Option(None, "--coordinator-epoch", help="Coordinator epoch."),
) -> None:
    """Abort a hanging transaction of one partition by writing an ABORT marker to it.

    Example: kcli transactions abort --topic orders --partition 0 --start-offset 1234
    """
    from kcli.ops.transactions import abort_transaction

    opts = options(ctx)
    with connect(opts) as conn:
        r = abort_transaction(conn, topic, partition, start_offset=start_offset, producer_id=producer_id,
                              producer_epoch=producer_epoch, coordinator_epoch=coordinator_epoch)
    render(r, opts.output, lambda: sys.stdout.write(
        f"Aborted the transaction of producer {r.producer_id} (epoch {r.producer_epoch}) on {topic}-{partition}.\n"))


def register(app: typer.Typer) -> None:
    app.add_typer(transactions_app, name="transactions")
