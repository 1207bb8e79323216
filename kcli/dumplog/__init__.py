"""dump-log: Kafka's DumpLogSegments for classic segments, indexes, tiered copies and WAL objects.

``dump_file(source, options) -> FileResult`` is the whole per-file job and a pure function, so a
process pool or a Spark job can map it over many objects; the CLI only expands arguments,
streams output and turns results into an exit code.
"""

from kcli.dumplog.dump import DumpOptions, FileResult, dump_file
from kcli.dumplog.sources import BytesSource, LocalSource, S3Source, Source, SourceError, expand

__all__ = [
    "BytesSource",
    "DumpOptions",
    "FileResult",
    "LocalSource",
    "S3Source",
    "Source",
    "SourceError",
    "dump_file",
    "expand",
]
