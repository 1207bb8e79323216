"""kafka-dump-log.sh (Kafka's DumpLogSegments) over kcli.dumplog: log segments, indexes, tiered
copies and, as KIP-1163 asks, diskless WAL segment objects (detected by content), with Kafka's
``Dumping FILE`` / ``baseOffset: ...`` lines."""

from __future__ import annotations

import sys

from kcli.kafka_tools import common
from kcli.kafka_tools.common import ToolError, ToolParser, jopt_int

PROG = "kafka-dump-log.sh"
_DECODERS = {"kafka.serializer.StringDecoder": "string", "org.apache.kafka.tools.api.StringDecoder": "string",
             "kafka.serializer.DefaultDecoder": "hex", "org.apache.kafka.tools.api.DefaultDecoder": "hex"}


def parser() -> ToolParser:
    p = ToolParser(PROG, "This tool helps to parse a log file and dump its contents to the console, useful for "
                         "debugging a seemingly corrupt log segment.")
    p.flag("print-data-log", "If set, printing the messages content when dumping data logs. Automatically set if "
                             "any decoder option is specified.")
    p.flag("verify-index-only", "If set, just verify the index log without printing its content.")
    p.flag("index-sanity-check", "If set, just checks the index sanity without printing its content.")
    p.value("files", "REQUIRED: The comma separated list of data and index log files to be dumped (WAL segment "
                     "objects too).", metavar="file1, file2, ...")
    p.value("max-message-size", "Size of largest message (accepted; kcli reads any size).", metavar="size",
            type=jopt_int("max-message-size"))
    p.value("max-bytes", "Limit the amount of total batches read in bytes avoiding reading the whole .log file(s).",
            metavar="size", type=jopt_int("max-bytes"))
    p.flag("deep-iteration", "If set, uses deep instead of shallow iteration. Automatically set if print-data-log "
                             "is enabled.")
    p.value("value-decoder-class", "StringDecoder (default) or DefaultDecoder (kcli prints it as hex).",
            metavar="class")
    p.value("key-decoder-class", "StringDecoder (default) or DefaultDecoder (kcli prints it as hex).",
            metavar="class")
    p.flag("skip-record-metadata", "Whether to skip printing metadata for each record.")
    for name in ("offsets-decoder", "transaction-log-decoder", "cluster-metadata-decoder",
                 "remote-log-metadata-decoder", "share-group-state-decoder"):
        p.flag(name, "Not supported by kcli: it fails naming the option.")
    return p


def _decoder(option: str, value: str | None) -> str | None:
    if value is None:
        return None
    if value in _DECODERS:
        return _DECODERS[value]
    raise ToolError(f"{option}: {value} is not supported (kcli knows StringDecoder and DefaultDecoder)")


def main(argv: list[str]) -> int:
    ns = parser().parse(argv)
    for name in ("offsets_decoder", "transaction_log_decoder", "cluster_metadata_decoder",
                 "remote_log_metadata_decoder", "share_group_state_decoder"):
        if getattr(ns, name):
            raise ToolError(f"{name.replace('_', '-')} is not supported by kcli's kafka-dump-log")
    if ns.files is None:
        raise common.missing("files")
    from kcli.dumplog import DumpOptions
    from kcli.dumplog.listed import dump_listed
    from kcli.dumplog.dump import default_jobs
    from kcli.dumplog.sources import expand

    key_decoder = _decoder("--key-decoder-class", ns.key_decoder_class)
    value_decoder = _decoder("--value-decoder-class", ns.value_decoder_class)
    opts = DumpOptions(
        deep_iteration=ns.deep_iteration,
        print_data_log=ns.print_data_log or key_decoder is not None or value_decoder is not None,
        skip_record_metadata=ns.skip_record_metadata,
        max_bytes=ns.max_bytes,
        key_decoder=key_decoder or "string",
        value_decoder=value_decoder or "string",
        index_sanity_check=ns.index_sanity_check,
        verify_index_only=ns.verify_index_only,
        jobs=default_jobs(),
    )
    run = dump_listed(expand([f.strip() for f in ns.files.split(",") if f.strip()]), opts, sys.stdout.write,
                      lambda message: sys.stderr.write(f"{message}\n"))
    sys.stdout.flush()
    for block in run.reports:
        sys.stderr.write(block + "\n")
    return 1 if run.failed else 0


def entry() -> None:
    common.run(main)
