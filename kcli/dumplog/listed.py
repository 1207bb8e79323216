"""Dumping the files a command line lists, one after another, in this process.

The one loop behind ``kcli dump-log`` and ``kafka-dump-log``: open each listed source, skip what
detection says to skip, dump it through :func:`kcli.dumplog.dump.dump_file`, report errors as
they come and keep the end-of-run reports (Kafka prints them after every file). The callers only
choose how an error line looks and what exit code a failure gives.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kcli.dumplog.detect import detect_listed
from kcli.dumplog.dump import DumpOptions, dump_file
from kcli.dumplog.sources import SourceError


@dataclass
class ListedRun:
    """What dumping the listed files left: whether any failed, and the reports for the end."""

    failed: bool = False
    reports: list[str] = field(default_factory=list)


def dump_listed(inputs: Iterable[Any], opts: DumpOptions, emit: Callable[[str], Any],
                error: Callable[[str], None]) -> ListedRun:
    """Dump every input of :func:`kcli.dumplog.sources.expand` in order; ``error`` gets each
    error message (a source that cannot be opened, a damaged file). A closed stdout raises
    BrokenPipeError to the caller, who decides how to end."""
    run = ListedRun()
    for item in inputs:
        if isinstance(item, SourceError):
            error(str(item))
            run.failed = True
            continue
        try:
            source = item.open()
        except SourceError as err:
            error(str(err))
            run.failed = True
            continue
        try:
            try:
                detection, skip = detect_listed(source, item.explicit)
            except SourceError as err:
                error(str(err))
                run.failed = True
                continue
            if skip:
                continue
            result = dump_file(source, opts, emit=emit, detection=detection)
        finally:
            source.close()
        sys.stdout.flush()
        for message in result.errors:
            error(message)
        run.reports.extend(result.reports)
        run.failed = run.failed or result.invalid
    return run
