"""kafka-delete-records.sh (Kafka's DeleteRecordsCommand) over kcli.ops.records: move each listed
partition's log start offset (``--offset-json-file``, version 1; offset -1 is the high watermark)."""

from __future__ import annotations

import json

from kcli.errors import KcliError
from kcli.kafka_tools import common
from kcli.kafka_tools.common import ToolError, ToolParser
from kcli.ops.kafka_json import versioned_document

PROG = "kafka-delete-records.sh"


def parser() -> ToolParser:
    p = ToolParser(PROG, "This tool helps to delete records of the given partitions down to the specified offset.")
    common.add_connection_options(p, required_text="REQUIRED: The server to connect to.",
                                  config_help="A property file containing configs to be passed to Admin Client.")
    p.value("offset-json-file", "REQUIRED: The JSON file with offset per partition. The format to use is:\n"
                                '{"partitions":\n  [{"topic": "foo", "partition": 1, "offset": 1}],\n "version":1\n}',
            metavar="Offset json file path")
    return p


def parse_offsets(text: str) -> list[tuple[str, int, int]]:
    """DeleteRecordsCommand.parseOffsetJsonStringWithoutDedup, with its messages."""
    doc = versioned_document(text, ToolError)
    if "partitions" not in doc:
        raise ToolError("Missing partitions field")
    out: list[tuple[str, int, int]] = []
    for entry in doc["partitions"] or []:
        try:
            out.append((str(entry["topic"]), int(entry["partition"]), int(entry["offset"])))
        except (KeyError, TypeError, ValueError) as err:
            raise ToolError(f"Invalid partition entry {json.dumps(entry)}: {err}") from None
    seen: dict[tuple[str, int], int] = {}
    for t, p, _ in out:
        seen[(t, p)] = seen.get((t, p), 0) + 1
    dups = [f"{t}-{p}" for (t, p), n in seen.items() if n > 1]
    if dups:
        raise ToolError("Offset json file contains duplicate topic partitions: " + ",".join(dups))
    return out


def main(argv: list[str]) -> int:
    ns = parser().parse(argv)
    if ns.bootstrap_server is None:
        raise common.missing("bootstrap-server")
    if ns.offset_json_file is None:
        raise common.missing("offset-json-file")
    conn = common.connection(ns)
    try:
        with open(ns.offset_json_file, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise ToolError(f"{ns.offset_json_file} ({err.strerror or err})") from None
    wanted = parse_offsets(text)
    from kcli.ops import records as ops

    print("Executing records delete operation")
    try:
        results = ops.delete_records(conn, wanted)
    except KcliError as err:
        raise ToolError(common.kafka_message(err)) from None
    print("Records delete operation completed:")
    for r in results:
        if r.error is None:
            print(f"partition: {r.topic}-{r.partition}\tlow_watermark: {r.low_watermark}")
        else:
            print(f"partition: {r.topic}-{r.partition}\terror: {r.error}")
    return 0


def entry() -> None:
    common.run(main)
