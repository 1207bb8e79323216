"""``kcli dump-log --engine``: dump-log's pure per-file function over many files, on Spark.

The local engine is dump-log's own loop (kcli/cli/dumplog.py: streaming, and a process pool
for one big file). With Spark, each input travels as its name (a local path or
``s3://bucket/key``); an executor reopens it (S3 through the storage plugin, boto3), runs
:func:`kcli.dumplog.dump_file` exactly as the CLI loop would (same detection and skipping of
listed files that are not logs) and sends back the text, errors and end-of-run reports, which
the driver prints in argument order. The output is byte-for-byte the local engine's.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

from kcli.engine.run import ChunkTask
from kcli.engine.select import Choice, Engine, Workload, choose

if TYPE_CHECKING:
    from kcli.dumplog import DumpOptions

SIZE_SAMPLE = 8  # S3 objects whose size is asked for (HEAD) to estimate a listing's bytes


@dataclass(frozen=True, slots=True)
class DumpItem:
    name: str  # as the operator will see it: a path, or s3://bucket/key
    explicit: bool  # named on the command line (not found by listing): never skipped


@dataclass(slots=True)
class DumpOutcome:
    text: str = ""
    errors: list[str] = field(default_factory=list)
    reports: list[str] = field(default_factory=list)
    invalid: bool = False


@dataclass(frozen=True)
class DumpTask(ChunkTask):
    """One file's dump, as the CLI loop does it. ``options`` has no batch_lookup (a SQLite
    connection does not pickle): each worker opens ``coordinator_uri`` itself."""

    options: "DumpOptions"
    coordinator_uri: str | None = None
    job: ClassVar[str] = "dump_log"
    spark_wave_per_core: ClassVar[int] = 2  # dump text is as big as the input: few partitions at a time

    def open(self) -> dict[str, Any]:
        resource: dict[str, Any] = {"stores": {}, "lookup": None, "close": None, "error": None}
        if self.coordinator_uri:
            from kcli.dumplog.annotate import MetadataSourceError, open_metadata_source

            try:
                resource["lookup"], resource["close"] = open_metadata_source(self.coordinator_uri)
            except MetadataSourceError as err:
                resource["error"] = str(err)
        return resource

    def close(self, resource: dict[str, Any]) -> None:
        if resource["close"] is not None:
            resource["close"]()
        for store in resource["stores"].values():
            store.close()

    def run(self, resource: dict[str, Any], item: DumpItem) -> DumpOutcome:
        from kcli.dumplog import dump_file
        from kcli.dumplog.detect import detect_listed
        from kcli.dumplog.sources import SourceError

        if resource["error"]:
            return DumpOutcome(errors=[resource["error"]], invalid=True)
        try:
            source = _open(item.name, resource["stores"])
        except SourceError as err:
            return DumpOutcome(errors=[str(err)], invalid=True)
        try:
            try:
                detection, skip = detect_listed(source, item.explicit)
            except SourceError as err:
                return DumpOutcome(errors=[str(err)], invalid=True)
            if skip:
                return DumpOutcome()
            options = dataclasses.replace(self.options, batch_lookup=resource["lookup"], jobs=1)
            result = dump_file(source, options, emit=None, detection=detection)
        finally:
            source.close()
        return DumpOutcome("".join(result.output), list(result.errors), list(result.reports), result.invalid)


def _open(name: str, stores: dict[str, Any]) -> Any:
    from kcli.dumplog.sources import LocalSource, S3Source, SourceError

    if name.startswith("s3://"):
        bucket, _, key = name[len("s3://"):].partition("/")
        store = stores.get(bucket)
        if store is None:
            try:
                from plugins.objectstore import from_uri

                store = stores[bucket] = from_uri(f"s3://{bucket}")
            except Exception as err:  # noqa: BLE001
                raise SourceError(f"cannot open s3://{bucket}: {err}") from None
        return S3Source(bucket, key, store=store)
    return LocalSource(name)


def workload(items: Sequence[DumpItem], kind: str = "dump-log") -> tuple[Workload, list[int]]:
    """Bytes to dump: local files from stat; S3 objects from a few HEADs (mean × count)."""
    sizes: list[int] = []
    remote: list[int] = []
    for i, item in enumerate(items):
        if item.name.startswith("s3://"):
            sizes.append(0)
            remote.append(i)
        else:
            try:
                sizes.append(os.path.getsize(item.name))
            except OSError:
                sizes.append(0)
    estimated = False
    if remote:
        sampled = []
        for i in remote[:SIZE_SAMPLE]:
            bucket, _, key = items[i].name[len("s3://"):].partition("/")
            try:
                from plugins.objectstore import from_uri

                with from_uri(f"s3://{bucket}") as store:
                    sampled.append(store.size(key))
            except Exception:  # noqa: BLE001 - an estimate; the dump reports real errors
                continue
        mean = sum(sampled) // len(sampled) if sampled else 0
        for i in remote:
            sizes[i] = mean
        estimated = len(sampled) < len(remote)
    return Workload(kind, len(items), sum(sizes), estimated), sizes


def dump_on_engine(inputs: Sequence[Any], options: "DumpOptions", coordinator_uri: str | None,
                   engine: Engine | str, spark_master: str | None, verbose: bool,
                   emit: Callable[[str], None]) -> int | None:
    """Run the dump on Spark when chosen and return the exit code; None: the caller's local loop
    runs it (and ``-v`` has already said so)."""
    from kcli.dumplog.sources import SourceError

    requested = Engine(engine)
    if requested is Engine.local and not verbose:
        return None
    items = [DumpItem(i.name, i.explicit) for i in inputs if not isinstance(i, SourceError)]
    work, sizes = workload(items, "dump-log-deep" if options.deep else "dump-log")
    choice = choose(requested, work, spark_master)
    if verbose:
        sys.stderr.write(f"kcli: dump-log: {choice.describe()}\n")
    if choice.engine is not Engine.spark:
        return None
    return run_spark(inputs, items, sizes, options, coordinator_uri, choice, verbose, emit)


def run_spark(inputs: Sequence[Any], items: Sequence[DumpItem], sizes: Sequence[int], options: "DumpOptions",
              coordinator_uri: str | None, choice: Choice, verbose: bool, emit: Callable[[str], None]) -> int:
    from kcli.dumplog.sources import SourceError
    from kcli.engine.progress import Progress
    from kcli.engine.run import run_task

    failed = False
    for entry in inputs:
        if isinstance(entry, SourceError):
            sys.stderr.write(f"kcli: error: {entry}\n")
            failed = True
    task = DumpTask(dataclasses.replace(options, batch_lookup=None, jobs=1), coordinator_uri)
    reports: list[str] = []
    try:
        with Progress("dump-log", len(items)) as progress:
            for outcome in run_task(task, items, sizes, choice, progress, verbose=verbose):
                if outcome.text:
                    emit(outcome.text)
                sys.stdout.flush()
                for message in outcome.errors:
                    sys.stderr.write(f"kcli: error: {message}\n")
                reports.extend(outcome.reports)
                failed = failed or outcome.invalid
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    for block in reports:
        sys.stderr.write(block + "\n")
    return 1 if failed else 0
