"""What kind of file is this? Kafka decides by suffix; WAL segment objects have none, so we sniff.

Rule (documented in docs/dump-log.md):

1. ``.log`` / ``.index`` / ``.timeindex`` / ``.txnindex`` decide by suffix, like Kafka. The base
   offset is the leading digits of the name, so classic ``00000000000000000042.log`` and
   tiered copies ``00000000000000000042-<uuid>.log`` both work. ``<base>.log.truncated-<ms>``
   (what broker start-up recovery moved aside) is a ``.log`` too, and so are the log cleaner's
   ``<base>.log.cleaned`` / ``<base>.log.swap`` (a cleaning interrupted before its swap ended).
   Kafka's offset checkpoint files (``cleaner-offset-checkpoint``, ...) are recognised by name.
2. Any other name is sniffed. A WAL segment object is a 1-byte version header and then v2 record
   batches, so:

   * first byte 0 → WAL segment version 0 (whatever follows is dumped; garbage is reported as
     invalid bytes, exactly as for a damaged ``.log``);
   * first byte N != 0 *and* bytes 1.. look like a v2 batch header (magic byte 2 at offset 17,
     batchLength >= 49 at offset 9) → "unsupported WAL segment version N" (exit 1): it is a WAL
     object from a newer writer, and guessing its layout would print wrong offsets;
   * anything else → unknown (Kafka's "Ignoring unknown file").
3. kcli's own small logs (the cluster metadata log ``__cluster_metadata/metadata.log``, the
   committed-offsets log ``__consumer_offsets/offsets.log``, the remote log metadata log
   ``__remote_log_metadata/metadata.log``) are ``.log`` files of ``<crc32c hex> <json>`` lines
   (kcli/crcjson.py), not record batches: a ``.log`` that starts like one is dumped as such.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from enum import Enum

from kcli.dumplog.sources import Source, SourceError

WAL_VERSION = 0
_MIN_BATCH_LENGTH = 49  # v2 batch header (61) minus baseOffset and batchLength
_BASE_OFFSET = re.compile(r"^(\d+)")
# kcli.storage.segment.TRUNCATED_MARK, and the log cleaner's CLEANED_SUFFIX / SWAP_SUFFIX files
_TRUNCATED_LOG = re.compile(r"\.log\.(truncated-\d+|cleaned|swap)$")


class Kind(str, Enum):
    LOG = "log"
    INDEX = "index"
    TIMEINDEX = "timeindex"
    TXNINDEX = "txnindex"
    CHECKPOINT = "checkpoint"  # Kafka's offset checkpoint files, e.g. the log cleaner's
    KCLI_LOG = "kcli-log"  # kcli's metadata / offsets / remote log metadata logs (crcjson lines)
    WAL = "wal"
    UNKNOWN = "unknown"


class UnsupportedWalVersion(Exception):
    def __init__(self, version: int, name: str) -> None:
        self.version = version
        super().__init__(f"unsupported WAL segment version {version} in {name}")


@dataclass(frozen=True)
class Detection:
    kind: Kind
    base_offset: int | None = None  # from the file name (segment files)
    wal_version: int | None = None


_SUFFIX_KINDS = {".log": Kind.LOG, ".index": Kind.INDEX, ".timeindex": Kind.TIMEINDEX, ".txnindex": Kind.TXNINDEX}


def base_offset_from_name(basename: str) -> int | None:
    """Kafka's ``offsetFromFile``: the digits before the first dot (or dash, for tiered copies)."""
    m = _BASE_OFFSET.match(basename)
    return int(m.group(1)) if m else None


# Kafka's OffsetCheckpointFile names (``0`` / count / ``<topic> <partition> <offset>`` lines)
CHECKPOINT_NAMES = ("cleaner-offset-checkpoint", "recovery-point-offset-checkpoint",
                    "log-start-offset-checkpoint", "replication-offset-checkpoint")


def by_name(basename: str) -> Kind | None:
    if basename in CHECKPOINT_NAMES:
        return Kind.CHECKPOINT
    if _TRUNCATED_LOG.search(basename):
        return Kind.LOG  # bytes start-up recovery moved aside: batches as in the segment they came from
    dot = basename.rfind(".")
    return _SUFFIX_KINDS.get(basename[dot:]) if dot >= 0 else None


_CRCJSON_HEAD = re.compile(rb"^[0-9a-f]{8} \{")


def is_crcjson(head: bytes) -> bool:
    """A kcli ``<crc32c hex> <json>`` line starts here (a segment's base offset and batch
    length are binary: 8 hex digits, a space and a brace are no batch header)."""
    return bool(_CRCJSON_HEAD.match(head))


def _starts_like_crcjson(source: Source) -> bool:
    if source.size < 10:
        return False
    try:
        return is_crcjson(bytes(source.view(0, 10)))
    except SourceError:  # e.g. shrank since its size was taken: the segment dump reports it
        return False


def looks_like_batch(head: bytes | memoryview, at: int) -> bool:
    """True when a v2 batch header plausibly starts at ``at`` (magic and length fields only)."""
    if len(head) < at + 17:
        return False
    length = struct.unpack_from(">i", head, at + 8)[0]
    return head[at + 16] == 2 and length >= _MIN_BATCH_LENGTH


def detect(source: Source) -> Detection:
    """Classify ``source``; raises UnsupportedWalVersion for a WAL object from a newer format."""
    kind = by_name(source.basename)
    if kind is Kind.LOG and _starts_like_crcjson(source):
        return Detection(Kind.KCLI_LOG)
    if kind is not None:
        return Detection(kind, base_offset_from_name(source.basename))
    if source.size == 0:
        return Detection(Kind.UNKNOWN)
    head = bytes(source.view(0, 18))
    version = head[0]
    if version == WAL_VERSION:
        return Detection(Kind.WAL, wal_version=WAL_VERSION)
    if looks_like_batch(head, 1):
        raise UnsupportedWalVersion(version, source.name)
    return Detection(Kind.UNKNOWN)


def detect_listed(source: Source, explicit: bool) -> tuple[Detection | None, bool]:
    """``(detection, skip)`` before dumping ``source``. A file named explicitly is left to
    dump_file (which detects it and reports what it cannot dump), as is an unsupported WAL
    version; a file listed from a directory, prefix or glob that is not a Kafka file is skipped
    quietly. SourceError propagates."""
    if explicit:
        return None, False
    try:
        detection = detect(source)
    except UnsupportedWalVersion:
        return None, False
    return detection, detection.kind is Kind.UNKNOWN
