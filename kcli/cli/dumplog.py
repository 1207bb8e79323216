"""`kcli dump-log`: Kafka's kafka-dump-log.sh for segments, indexes and diskless WAL objects."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from kcli.cli.common import OutputFormat, coordinator_uri, options
from kcli.engine.select import Engine
from kcli.errors import UsageError

DECODER_HELP = "string (default, UTF-8), hex, base64 or json (compact; per-record error if not JSON)."


def dump_log(
    ctx: typer.Context,
    paths: Optional[List[str]] = typer.Argument(
        None,
        metavar="PATH_OR_URI...",
        help="Files, directories, globs, file:///dir/key, s3://bucket/key or s3://bucket/prefix/.",
        show_default=False,
    ),
    files: Optional[str] = typer.Option(None, "--files", help="Comma-separated list of files (Kafka's --files)."),
    deep_iteration: bool = typer.Option(False, "--deep-iteration", help="Print every record, not just batches."),
    print_data_log: bool = typer.Option(
        False, "--print-data-log", help="Print keys and values too (implies --deep-iteration)."
    ),
    skip_record_metadata: bool = typer.Option(False, "--skip-record-metadata", help="Omit per-record metadata."),
    max_bytes: Optional[int] = typer.Option(
        None, "--max-bytes", min=0, help="Read at most this many bytes of each log/WAL file (no trailing-bytes check)."
    ),
    key_decoder: Optional[str] = typer.Option(None, "--key-decoder", help="Key rendering: " + DECODER_HELP),
    value_decoder: Optional[str] = typer.Option(None, "--value-decoder", help="Value rendering: " + DECODER_HELP),
    index_sanity_check: bool = typer.Option(
        False, "--index-sanity-check", help="Only run the broker's startup sanity check on index files."
    ),
    verify_index_only: bool = typer.Option(
        False, "--verify-index-only", help="Check index entries against the log without printing them."
    ),
    coordinator: Optional[str] = typer.Option(
        None,
        "--coordinator",
        help="Annotate WAL batches from a batch coordinator: sqlite:///path/to/coordinator.db or postgresql://user@host:port/database.",
    ),
    object_key: Optional[str] = typer.Option(
        None, "--object-key", help="Object key to look up in the coordinator (default: derived from the path)."
    ),
    jobs: Optional[int] = typer.Option(
        None, "--jobs", min=1, help="Worker processes for deep iteration of one big local file (default: CPUs up to 8 if there are 4 or more, else 1)."
    ),
    engine: Engine = typer.Option(
        Engine.auto, "--engine", help="Dump many files here (local), on PySpark (spark), or pick by total size (auto; docs/spark-engine.md)."
    ),
    spark_master: Optional[str] = typer.Option(None, "--spark-master", help="Spark master URL (default local[*])."),
) -> None:
    """Dump log segments, indexes and WAL segment objects in kafka-dump-log's format.

    Exit status: 0 when everything was valid, 1 when a file was unreadable or had invalid data (bad CRC, truncated tail, index mismatch), 2 for usage errors, 141 when the reader of the output left (| head).

    A named file that is not a Kafka file is skipped with Kafka's "Ignoring unknown file FILE" (exit 0).

    Example: kcli dump-log /var/lib/kafka/orders-0/00000000000000000000.log --deep-iteration

    Example: kcli dump-log file:///shared/objects/wal/ --coordinator postgresql://kcli@db:5432/kcli
    """
    from kcli.dumplog import DumpOptions
    from kcli.dumplog.dump import default_jobs
    from kcli.dumplog.annotate import MetadataSourceError, open_metadata_source
    from kcli.dumplog.decoders import DECODERS
    from kcli.dumplog.sources import expand

    opts = options(ctx)
    if opts.output is OutputFormat.yaml:
        raise UsageError("dump-log writes text or JSON lines (-o json); -o yaml is not supported")
    args = list(paths or [])
    if files:
        args += [f.strip() for f in files.split(",") if f.strip()]
    args = [local_path(a) for a in args]
    if not args:
        raise UsageError("give at least one PATH_OR_URI (or --files a,b)")
    for flag, value in (("--key-decoder", key_decoder), ("--value-decoder", value_decoder)):
        if value is not None and value not in DECODERS:
            raise UsageError(f"{flag} must be one of {', '.join(DECODERS)}, got {value!r}")
    if object_key is not None and coordinator is None:
        raise UsageError("--object-key needs --coordinator")
    coordinator = coordinator_uri(coordinator)

    lookup = None
    close_lookup = None
    if coordinator:
        try:
            lookup, close_lookup = open_metadata_source(coordinator)
        except MetadataSourceError as err:
            raise UsageError(str(err)) from None

    dump_opts = DumpOptions(
        deep_iteration=deep_iteration,
        # Kafka: naming a decoder turns on --print-data-log.
        print_data_log=print_data_log or key_decoder is not None or value_decoder is not None,
        skip_record_metadata=skip_record_metadata,
        max_bytes=max_bytes,
        key_decoder=key_decoder or "string",
        value_decoder=value_decoder or "string",
        index_sanity_check=index_sanity_check,
        verify_index_only=verify_index_only,
        json=opts.output is OutputFormat.json,
        batch_lookup=lookup,
        object_key=object_key,
        jobs=jobs or default_jobs(),
    )
    emit = sys.stdout.write
    inputs = list(expand(args))
    from kcli.engine.dump import dump_on_engine

    code = dump_on_engine(inputs, dump_opts, coordinator, engine, spark_master, opts.verbose, emit)
    if code is not None:  # it ran on Spark
        if close_lookup is not None:
            close_lookup()
        raise SystemExit(code)
    from kcli.dumplog.listed import ListedRun, dump_listed

    run = ListedRun()
    try:
        run = dump_listed(inputs, dump_opts, emit, lambda message: _stderr(f"kcli: error: {message}"))
    except BrokenPipeError:
        _quiet_broken_pipe()
    finally:
        if close_lookup is not None:
            close_lookup()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_broken_pipe()
    for block in run.reports:
        _stderr(block)
    # SystemExit, not typer.Exit: app.main runs click with standalone_mode=False, which turns
    # typer.Exit into a return value that main() drops.
    raise SystemExit(1 if run.failed else 0)


def local_path(arg: str) -> str:
    """A ``file://`` URI (how ``--object-store`` names a shared store on a filesystem) as its
    path; anything else unchanged. Only local files: ``file://otherhost/...`` is refused."""
    if not arg.lower().startswith("file:"):
        return arg
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(arg)
    if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
        raise UsageError(f"{arg!r}: a file URI names a local absolute path (file:///dir/key)")
    return unquote(parts.path)


def _stderr(text: str) -> None:
    sys.stderr.write(text + "\n")


def _quiet_broken_pipe() -> None:
    """The reader went away (``| head``): stop quietly with 141, as cat does (killed by SIGPIPE)."""
    from kcli.cli.common import stdout_closed

    stdout_closed()


def register(app: typer.Typer) -> None:
    app.command("dump-log")(dump_log)
