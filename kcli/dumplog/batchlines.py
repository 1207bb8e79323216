"""Batch-level text dump (the default ``kcli dump-log FILE``): header walk, CRC and Kafka's line
in one loop.

Why a loop of its own: on files of Kafka's default 16 KiB batches this is bound by Python work
per batch, not by bytes. Everything that is not the CRC itself is kept to the bare minimum per
batch: one ``struct.unpack_from`` for the whole header, one crc32c call on a memoryview (no copy),
one f-string, no objects. The stretches of the line that only depend on the producer and the
attributes are cached per (producerId, producerEpoch, attributes, partitionLeaderEpoch); record counts
come from a small cache. Anything unusual (a header that is not a batch, a batch running
past the mapped window or the scan end) drops to a slow step that follows
:func:`kcli.dumplog.readers.iter_batches` exactly, so stop reasons and positions are identical.

Where kcli was installed with its compiled module (kcli/dumplog/_fastlines.pyx, built by
``pip install``), that module runs the fast loop and this one only takes the batches it hands
back (numbers near the 64-bit limits); without it, this loop does all of them.

The output is byte-for-byte :func:`kcli.dumplog.format.batch_text`; tests compare the two.
"""

from __future__ import annotations

from typing import Callable

from crc32c import crc32c

from kcli.dumplog.format import HEADER, HEADER_SIZE, INT_MAX, codec_name, delete_horizon
from kcli.dumplog.readers import LOG_OVERHEAD, ScanState, locate_batch, window_size
from kcli.dumplog.sources import LocalSource, ReadWindow

try:
    from kcli.dumplog._fastlines import batch_lines as compiled_batch_lines
except ImportError:  # not built (no compiler at install time, or a Spark executor without it)
    compiled_batch_lines = None

CHUNK_BYTES = 2 << 20  # bytes of log between two hand-overs of text to the output
CACHE_LIMIT = 1 << 16  # entries per cache; a damaged or odd file must not grow them without bound
_MIN_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # batchLength of a header-only batch (49)
_VALID = " isvalid: true\n"
_INVALID = " isvalid: false\n"


class _Count(dict):
    """``count -> " count: <count>"``: record counts repeat, so most batches skip an int->str."""

    def __missing__(self, count: int) -> str:
        if len(self) >= CACHE_LIMIT:
            self.clear()
        text = self[count] = f" count: {count}"
        return text


def _group(pid: int, epoch: int, attrs: int, ple: int, magic: int, base_ts: int) -> tuple[str, str, str]:
    """The constant stretches for one producer/attributes combination: the text between
    lastSequence and position, the timestamp label, and the text between size and crc."""
    return (
        f" producerId: {pid} producerEpoch: {epoch} partitionLeaderEpoch: {ple} "
        f"isTransactional: {'true' if attrs & 0x10 else 'false'} isControl: {'true' if attrs & 0x20 else 'false'} "
        f"deleteHorizonMs: {delete_horizon(attrs, base_ts)} position: ",
        " LogAppendTime: " if attrs & 0x08 else " CreateTime: ",
        f" magic: {magic} compresscodec: {codec_name(attrs)} crc: ",
    )


def scan_batch_lines(
    source, start: int, end: int, state: ScanState, out: list[str], flush: Callable[[], None]  # noqa: ANN001
) -> tuple[int, int]:
    """Append one Kafka batch line per complete batch in [start, end) to ``out``.

    ``flush`` is called every CHUNK_BYTES of log (it empties ``out``). Returns (batches,
    position of the first batch failing its CRC or -1); ``state`` gets the end position and the
    stop reason, as :func:`iter_batches` sets them.
    """
    unpack = HEADER.unpack_from
    append = out.append
    compiled = compiled_batch_lines
    if isinstance(source, LocalSource):
        source = ReadWindow(source)  # no view outlives the next window: text is copied out
    wsize = window_size(source)
    groups: dict[tuple[int, int, int, int], tuple[str, str, str]] = {}
    g = ("", "", "")  # the last batch's group, and the fields it was made for (none yet)
    g_pid = g_epoch = g_attrs = g_ple = None
    counts = _Count()
    batches = 0
    first_bad = -1
    pos = start
    win = memoryview(b"")
    wstart = wend = pos
    try:
        while True:
            # ---- slow step: the checks iter_batches makes, for the batch at ``pos``
            found = locate_batch(source, pos, end, (win, wstart, wend), wsize, state)
            if found is None:
                break
            (win, wstart, wend), rel, _size = found
            # ---- fast loop: the batch at ``rel`` is known good; go on while batches are plain
            wlen = wend - wstart
            lim = min(wlen - HEADER_SIZE, rel + CHUNK_BYTES)  # the batch at rel always fits
            while rel <= lim:
                if compiled is not None:
                    rel, n, bad, text = compiled(win, rel, lim, wlen, wstart, crc32c)
                    append(text)
                    batches += n
                    if first_bad < 0:
                        first_bad = bad
                    if rel > lim:
                        break
                base, length, ple, magic, crc, attrs, lod, base_ts, max_ts, pid, epoch, bseq, count = unpack(win, rel)
                size = length + 12
                if length < _MIN_LENGTH or magic != 2 or rel + size > wlen:
                    break
                # Consecutive batches mostly come from one producer: compare with the last
                # batch's fields before paying for a tuple key and its hash.
                if pid != g_pid or epoch != g_epoch or attrs != g_attrs or ple != g_ple or attrs & 0x40:
                    g = groups.get((pid, epoch, attrs, ple))
                    if g is None or attrs & 0x40:
                        if len(groups) >= CACHE_LIMIT:
                            groups.clear()
                        g = groups[(pid, epoch, attrs, ple)] = _group(pid, epoch, attrs, ple, magic, base_ts)
                    g_pid, g_epoch, g_attrs, g_ple = pid, epoch, attrs, ple
                if crc32c(win[rel + 21 : rel + size]) == crc:
                    valid = _VALID
                else:
                    valid = _INVALID
                    if first_bad < 0:
                        first_bad = wstart + rel
                if bseq == -1:
                    append(
                        f"baseOffset: {base} lastOffset: {base + lod}{counts[count]} baseSequence: -1 "
                        f"lastSequence: -1{g[0]}{wstart + rel}{g[1]}{max_ts} size: {size}{g[2]}{crc}{valid}"
                    )
                else:
                    lseq = bseq + lod if bseq <= INT_MAX - lod else lod - (INT_MAX - bseq) - 1
                    append(
                        f"baseOffset: {base} lastOffset: {base + lod}{counts[count]} baseSequence: {bseq} "
                        f"lastSequence: {lseq}{g[0]}{wstart + rel}{g[1]}{max_ts} size: {size}{g[2]}{crc}{valid}"
                    )
                batches += 1
                rel += size
            pos = wstart + rel
            flush()
    finally:
        state.position = pos
    return batches, first_bad
