"""`kcli produce` and `kcli consume`: console producer/consumer over confluent-kafka."""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any, Iterator, List, Optional

import typer

from kcli.cli.common import OutputFormat, deferred_signals, interrupt_exit_code, options, parse_key_values
from kcli.cli.render import render, yaml_document
from kcli.errors import UsageError
from kcli.ops import clients as ops
from kcli.ops.connection import connect
from kcli.cli.completion_cmd import complete_topic

_ESCAPES = {"\\t": "\t", "\\n": "\n", "\\r": "\r", "\\\\": "\\"}


def _separator(value: str | None) -> bytes | None:
    """Separator text with \\t, \\n, \\r, \\\\ understood, so `--key-separator '\\t'` works unquoted."""
    if value is None:
        return None
    out, i = [], 0
    while i < len(value):
        pair = value[i:i + 2]
        if pair in _ESCAPES:
            out.append(_ESCAPES[pair])
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out).encode()


def produce(
    ctx: typer.Context,
    topic: str = typer.Option(..., "--topic", "-t", autocompletion=complete_topic, help="Topic to write to."),
    key_separator: Optional[str] = typer.Option(None, "--key-separator", help="Split each line into KEY SEP VALUE at the first SEP."),
    acks: str = typer.Option("all", "--acks", help="0, 1 or all."),
    partition: Optional[int] = typer.Option(None, "--partition", min=0, help="Write every record to this partition."),
    compression: str = typer.Option("none", "--compression", help="none, gzip, snappy, lz4 or zstd."),
    property: List[str] = typer.Option([], "--property", help="Producer property KEY=VALUE for librdkafka (repeatable)."),
    header: List[str] = typer.Option([], "--header", "-H", help="Header NAME=VALUE added to every record (repeatable, as kcat -H)."),
    timestamp: Optional[int] = typer.Option(None, "--timestamp", metavar="MS", help="Every record's timestamp, ms since the epoch (default: now)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", metavar="SECONDS",
                                            help=f"Give up on records not acknowledged within this long and exit 1, naming offline partitions (default {ops.PRODUCE_TIMEOUT_S:g})."),
) -> None:
    """Write stdin to a topic, one record per line.

    Example: printf 'k1:v1\\nk2:v2\\n' | kcli produce --topic orders --key-separator :

    Example: echo v1 | kcli produce --topic orders -H source=docs -H trace=42 --timestamp 1700000000000
    """
    opts = options(ctx)
    request = ops.ProduceRequest(topic=topic, key_separator=_separator(key_separator), acks=acks.lower(),
                                 partition=partition, compression=compression.lower(),
                                 properties=parse_key_values(property, "--property"),
                                 headers=_headers(header), timestamp_ms=timestamp, timeout_s=timeout)
    stop = threading.Event()
    reading = False

    def lines() -> Iterator[bytes]:
        """stdin lines; Ctrl-C while blocked on a read ends the input (see deferred_signals)."""
        nonlocal reading
        stream = sys.stdin.buffer
        while not stop.is_set():
            try:
                try:
                    reading = True
                    line = stream.readline()
                finally:
                    reading = False
            except KeyboardInterrupt:  # caught out here too if it lands on `reading = False`
                return
            if not line:
                return
            yield line

    try:
        with deferred_signals(stop, lambda: reading), connect(opts) as conn:
            result = ops.produce(conn, request, lines(), stop)
    except ops.ProduceInterrupted as err:
        # Kafka's console producer also ends on Ctrl-C with 130; say what made it to the topic
        unconfirmed = f", {err.unconfirmed} unconfirmed" if err.unconfirmed else ""
        sys.stderr.write(f"kcli: interrupted: {err.result.records} of {err.sent} records delivered "
                         f"to {err.result.topic}{unconfirmed}\n")
        raise SystemExit(interrupt_exit_code()) from None
    if opts.verbose:
        sys.stderr.write(f"kcli: {result.records} records produced to {result.topic}\n")
    if opts.output != OutputFormat.table:
        render(result, opts.output)


def _headers(items: list[str]) -> list[tuple[str, bytes]]:
    """kcat's ``-H name=value``, in order; a name may repeat, the value may contain '='."""
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--header expects NAME=VALUE, got {item!r}")
        out.append((name, value.encode()))
    return out


_OFFSET_HELP = "a number, earliest (beginning), latest (end), -N (N before the end) or s@MS / @MS (first record at or after a time)"


def _parse_offset(value: str | None) -> dict[str, Any]:
    """``--offset`` as kcat's ``-o`` reads it → ConsumeRequest fields."""
    if value is None:
        return {}
    v = value.strip().lower()
    if v in ("earliest", "latest"):
        return {"offset": v}
    if v in ("beginning", "end"):  # kcat's names
        return {"offset": "earliest" if v == "beginning" else "latest"}
    try:
        if v.startswith(("s@", "@")):
            return {"offset_timestamp_ms": int(v.partition("@")[2])}
        number = int(v)
    except ValueError:
        raise UsageError(f"--offset expects {_OFFSET_HELP}; got {value!r}") from None
    if number < 0:
        return {"offset_tail": -number}
    return {"offset": number}


def consume(
    ctx: typer.Context,
    topic: str = typer.Option(..., "--topic", "-t", autocompletion=complete_topic, help="Topic to read."),
    group: Optional[str] = typer.Option(None, "--group", "-g", help="Consumer group: subscribe and commit. Without it, read every partition and commit nothing."),
    from_beginning: bool = typer.Option(False, "--from-beginning", help="Start at the earliest offset (with --group: only when the group has no committed offset)."),
    max_messages: Optional[int] = typer.Option(None, "--max-messages", min=1, help="Stop after this many records."),
    timeout_ms: Optional[int] = typer.Option(None, "--timeout-ms", min=0, help="Stop after this long without a record."),
    partition: Optional[int] = typer.Option(None, "--partition", min=0, help="Read only this partition."),
    offset: Optional[str] = typer.Option(None, "--offset", help="Start offset: " + _OFFSET_HELP + "; a plain number needs --partition."),
    print_key: bool = typer.Option(False, "--print-key", help="Print KEY SEP VALUE (table output)."),
    print_timestamp: bool = typer.Option(False, "--print-timestamp", help="Start each line with CreateTime:MS (or LogAppendTime:MS) SEP (table output)."),
    print_headers: bool = typer.Option(False, "--print-headers", help="Print the headers as NAME:VALUE,... (NO_HEADERS when none) SEP before the key/value (table output)."),
    format: Optional[str] = typer.Option(None, "--format", "-f", help="kcat output format: %t topic, %p partition, %o offset, %k key, %K key size, %s value, %S value size, %R value size as 4 bytes, %T timestamp, %h headers; \\n \\t \\r \\xNN."),
    key_separator: str = typer.Option("\\t", "--key-separator", help="Separator for --print-key (default: tab)."),
    property: List[str] = typer.Option([], "--property", help="Consumer property KEY=VALUE for librdkafka (repeatable)."),
) -> None:
    """Print records from a topic: values one per line, or one JSON object per line with -o json.

    Runs until Ctrl-C unless --max-messages or --timeout-ms is given.
    Example: kcli consume --topic orders --from-beginning --max-messages 10 --print-key

    Example: kcli consume --topic orders --offset s@1700000000000 -f '%t [%p] %o %T: %k=%s %h\\n'
    """
    opts = options(ctx)
    request = ops.ConsumeRequest(topic=topic, group=group, from_beginning=from_beginning, max_messages=max_messages,
                                 timeout_ms=timeout_ms, partition=partition, **_parse_offset(offset),
                                 properties=parse_key_values(property, "--property"))
    ops.validate_consume(request)
    record_format = None
    if format is not None:
        if opts.output != OutputFormat.table:
            raise UsageError(f"--format replaces the table output; it cannot be used with -o {opts.output.value}")
        from kcli.cli.record_format import RecordFormat

        record_format = RecordFormat(format)
    separator = _separator(key_separator) or b""
    out = sys.stdout.buffer
    stop = threading.Event()
    broken_pipe = False

    def write(record: ops.ConsumedRecord) -> None:
        nonlocal broken_pipe
        if opts.output == OutputFormat.json:  # to_dict is already plain data: skip render's walk
            data = (json.dumps(record.to_dict(), separators=(",", ":"), ensure_ascii=False) + "\n").encode()
        elif opts.output == OutputFormat.yaml:
            data = yaml_document(record).encode()
        elif record_format is not None:
            data = record_format.render(record)
        else:
            value = b"null" if record.value is None else record.value
            if print_key:
                key = b"null" if record.key is None else record.key
                value = key + separator + value
            if print_headers:  # Kafka's console consumer (print.headers=true)
                shown = b",".join(k.encode() + b":" + (b"null" if v is None else v) for k, v in record.headers)
                value = (shown or b"NO_HEADERS") + separator + value
            if print_timestamp:  # Kafka's console consumer (print.timestamp=true)
                if record.timestamp is None:
                    stamp = b"NO_TIMESTAMP"
                else:
                    stamp = f"{record.timestamp_type or 'CreateTime'}:{record.timestamp}".encode()
                value = stamp + separator + value
            data = value + b"\n"
        try:
            out.write(data)
            out.flush()
        except BrokenPipeError:  # `kcli consume ... | head`: the reader left, stop quietly
            broken_pipe = True
            stop.set()

    def warn(message: str) -> None:
        sys.stderr.write(f"kcli: warning: {message}\n")

    with deferred_signals(stop), connect(opts) as conn:
        result = ops.consume(conn, request, write, stop, warn)
    if broken_pipe:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    elif result.stopped_by == "stop":  # SIGINT/SIGTERM: closed cleanly, but say so, as a shell would
        sys.stderr.write(f"kcli: interrupted: {result.records} records consumed\n")
        raise SystemExit(interrupt_exit_code())
    if opts.verbose:
        sys.stderr.write(f"kcli: {result.records} records consumed (stopped by {result.stopped_by})\n")


def register(app: Any) -> None:
    app.command("produce")(produce)
    app.command("consume")(consume)
