"""The broker's log output: level and format (`kcli broker start --log-level/--log-format`).

``text`` is one human line per event; ``json`` is one JSON object per line (time, level, logger,
message, and the structured fields a call passed in ``extra=``) for log shippers that must not
parse free text. Both go to stderr, which `kcli broker start --daemon` points at DATA_DIR/broker.log.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Libraries that are chatty at INFO (credential lookups, connection pools): an operator's INFO
# log is the broker's own events; they speak from WARNING on unless DEBUG is asked for.
QUIET_LIBRARIES = ("botocore", "boto3", "urllib3", "s3transfer", "psycopg", "psycopg.pool", "asyncio")
# LogRecord's own attributes: everything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601 with ms), level, logger, message, extras."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


_configured_format = "text"


def configured_format() -> str:
    """The format :func:`configure` last set (``text`` before it ran): what else the broker writes
    for its log's readers (the listening announcement) follows it."""
    return _configured_format


def configure(level: str = "INFO", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Route every logger to ``stream`` (stderr) at ``level`` in ``fmt``; replaces earlier setup."""
    global _configured_format
    _configured_format = "json" if fmt == "json" else "text"
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    numeric = logging.getLevelName(level)
    root.setLevel(numeric)
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(numeric if numeric <= logging.DEBUG else max(numeric, logging.WARNING))
