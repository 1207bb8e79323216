# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled loops for ``kcli dump-log``: the batch line of every batch, and the record metadata
lines of ``--deep-iteration``.

Why compiled: both are bound by interpreter work per item, not by bytes. On Kafka's default
16 KiB batches the Python batch loop spends ~3 us per batch next to ~0.7 us of CRC-32C, and deep
iteration through aiokafka's record objects costs ~1 us per record before any text is made.
Here each is a walk over the bytes writing text into one buffer. The CRC is still the ``crc32c``
package's (hardware CRC-32C), decompression still aiokafka's codecs, called from Python.

Both loops take only what is plain and hand the rest back, so the Python code (the reference,
and the fallback where this module is not built) decides everything unusual with the same
messages: a header that is not a plain v2 batch, a batch running past the window, numbers whose
sums could leave 64 bits (Python's ints would not overflow), and any record aiokafka's reader
would refuse or read differently. The text is byte-for-byte what the Python paths print; tests
compare them.
"""

from cpython.buffer cimport PyBUF_READ
from cpython.memoryview cimport PyMemoryView_FromMemory
from cpython.unicode cimport PyUnicode_DecodeLatin1, PyUnicode_DecodeUTF8
from libc.stdint cimport INT64_MAX, INT64_MIN, int8_t, int16_t, int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy

cdef enum:
    MIN_LENGTH = 49  # batchLength of a header-only batch
    LINE_MAX = 640  # longest batch line, with room to spare
    INT_MAX = 0x7FFFFFFF
    RECORD_LINE = 256  # a record line without its header keys (at most ~195 bytes)

cdef const char *CODECS[5]
CODECS[:] = [b"none", b"gzip", b"snappy", b"lz4", b"zstd"]


cdef inline int64_t be64(const unsigned char *p) noexcept nogil:
    return <int64_t>((<uint64_t>p[0] << 56) | (<uint64_t>p[1] << 48) | (<uint64_t>p[2] << 40)
                     | (<uint64_t>p[3] << 32) | (<uint64_t>p[4] << 24) | (<uint64_t>p[5] << 16)
                     | (<uint64_t>p[6] << 8) | <uint64_t>p[7])


cdef inline int32_t be32(const unsigned char *p) noexcept nogil:
    return <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3])


cdef inline int16_t be16(const unsigned char *p) noexcept nogil:
    return <int16_t>((p[0] << 8) | p[1])


cdef inline char *put(char *out, const char *text) noexcept nogil:
    while text[0]:
        out[0] = text[0]
        out += 1
        text += 1
    return out


cdef inline char *put_int(char *out, int64_t value) noexcept nogil:
    """Decimal text of any int64 (INT64_MIN included), as Python's str() prints it."""
    cdef char digits[24]
    cdef int n = 0
    cdef uint64_t u
    if value < 0:
        out[0] = 45  # '-'
        out += 1
        u = <uint64_t>0 - <uint64_t>value
    else:
        u = <uint64_t>value
    while True:
        digits[n] = <char>(48 + u % 10)
        n += 1
        u //= 10
        if u == 0:
            break
    while n:
        n -= 1
        out[0] = digits[n]
        out += 1
    return out


cdef inline char *put_uint(char *out, uint32_t value) noexcept nogil:
    return put_int(out, <int64_t>value)


cdef inline char *put_bool(char *out, bint value) noexcept nogil:
    return put(out, b"true" if value else b"false")


cdef struct Text:
    char *buf  # malloc'ed (NULL until the first reserve); the caller frees it
    Py_ssize_t cap
    Py_ssize_t used


cdef char *reserve(Text *text, Py_ssize_t need) except NULL:
    """Where to write the next ``need`` bytes of ``text``, growing its buffer when it is short."""
    cdef char *grown
    cdef Py_ssize_t cap
    if text.cap - text.used < need:
        cap = 2 * text.cap + need
        grown = <char *>realloc(text.buf, cap)
        if grown == NULL:
            raise MemoryError()
        text.buf, text.cap = grown, cap
    return text.buf + text.used


def batch_lines(const unsigned char[::1] win, Py_ssize_t rel, Py_ssize_t lim, Py_ssize_t wlen,
                long long wstart, crc32c):
    """Batch lines for the plain v2 batches from ``rel`` on, while ``rel <= lim``.

    Returns ``(rel, batches, first_bad, text)``: where it stopped, how many lines ``text`` holds,
    and the file position of the first batch failing its CRC (-1 if none).
    """
    cdef const unsigned char *base_ptr
    cdef const unsigned char *p
    cdef Text text = Text(NULL, 0, 0)
    cdef char *out
    cdef Py_ssize_t size
    cdef int64_t base, base_ts, max_ts, pid, lseq
    cdef int32_t length, ple, lod, bseq, count
    cdef int16_t attrs, epoch
    cdef int8_t magic
    cdef uint32_t crc
    cdef bint valid
    cdef int codec
    cdef long long first_bad = -1
    cdef Py_ssize_t batches = 0
    if wlen <= 0 or rel > lim:
        return rel, 0, -1, ""
    base_ptr = &win[0]
    try:
        while rel <= lim:
            p = base_ptr + rel
            base = be64(p)
            length = be32(p + 8)
            ple = be32(p + 12)
            magic = <int8_t>p[16]
            crc = <uint32_t>be32(p + 17)
            attrs = be16(p + 21)
            lod = be32(p + 23)
            base_ts = be64(p + 27)
            max_ts = be64(p + 35)
            pid = be64(p + 43)
            epoch = be16(p + 51)
            bseq = be32(p + 53)
            count = be32(p + 57)
            size = <Py_ssize_t>length + 12
            if length < MIN_LENGTH or magic != 2 or rel + size > wlen:
                break
            # base + lastOffsetDelta must not leave 64 bits: Python's loop prints what it sums
            if base > 0x7FFFFFFF00000000 or base < -0x7FFFFFFF00000000:
                break
            out = reserve(&text, LINE_MAX)
            valid = <uint32_t>crc32c(PyMemoryView_FromMemory(<char *>(p + 21), size - 21, PyBUF_READ)) == crc
            if not valid and first_bad < 0:
                first_bad = wstart + rel
            out = put_int(put(out, b"baseOffset: "), base)
            out = put_int(put(out, b" lastOffset: "), base + lod)
            out = put_int(put(out, b" count: "), count)
            out = put_int(put(out, b" baseSequence: "), bseq)
            if bseq == -1:
                lseq = -1
            elif <int64_t>bseq > INT_MAX - <int64_t>lod:
                lseq = <int64_t>lod - (INT_MAX - <int64_t>bseq) - 1
            else:
                lseq = <int64_t>bseq + lod
            out = put_int(put(out, b" lastSequence: "), lseq)
            out = put_int(put(out, b" producerId: "), pid)
            out = put_int(put(out, b" producerEpoch: "), epoch)
            out = put_int(put(out, b" partitionLeaderEpoch: "), ple)
            out = put_bool(put(out, b" isTransactional: "), attrs & 0x10)
            out = put_bool(put(out, b" isControl: "), attrs & 0x20)
            if attrs & 0x40:
                out = put(put_int(put(out, b" deleteHorizonMs: OptionalLong["), base_ts), b"]")
            else:
                out = put(out, b" deleteHorizonMs: OptionalLong.empty")
            out = put_int(put(out, b" position: "), wstart + rel)
            out = put(out, b" LogAppendTime: " if attrs & 0x08 else b" CreateTime: ")
            out = put_int(out, max_ts)
            out = put_int(put(out, b" size: "), size)
            out = put_int(put(out, b" magic: "), magic)
            codec = attrs & 7
            if codec < 5:
                out = put(put(out, b" compresscodec: "), CODECS[codec])
            else:
                out = put(put_int(put(out, b" compresscodec: unknown("), codec), b")")
            out = put_uint(put(out, b" crc: "), crc)
            out = put(out, b" isvalid: true\n" if valid else b" isvalid: false\n")
            text.used = out - text.buf
            batches += 1
            rel += size
        return rel, batches, first_bad, PyUnicode_DecodeLatin1(text.buf, text.used, NULL)
    finally:
        free(text.buf)


cdef inline bint read_varint(const unsigned char *data, Py_ssize_t *pos, Py_ssize_t end,
                             int64_t *value) noexcept nogil:
    """One zig-zag varint of at most 10 bytes, inside [pos, end); False if it is not one."""
    cdef uint64_t acc = 0
    cdef int shift = 0
    cdef unsigned char b
    cdef Py_ssize_t i = pos[0]
    while True:
        if i >= end or shift > 63:
            return False
        b = data[i]
        i += 1
        acc |= <uint64_t>(b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
    pos[0] = i
    value[0] = <int64_t>(acc >> 1) ^ -(<int64_t>(acc & 1))
    return True


cdef inline bint skip_nullable_bytes(const unsigned char *data, Py_ssize_t *pos, Py_ssize_t end,
                                    int64_t *length) noexcept nogil:
    """Kafka's NULLABLE_BYTES in a record: a varint length (negative: null) and that many bytes,
    all inside [pos, end); False if they are not."""
    if not read_varint(data, pos, end, length):
        return False
    if length[0] >= 0:
        if length[0] > end - pos[0]:
            return False
        pos[0] += length[0]
    return True


def record_lines(const unsigned char[::1] data, Py_ssize_t pos, long long base, long long first_ts,
                 long long max_ts, int attrs, long long bseq, long long count):
    """``| offset: ...`` metadata lines of the ``count`` records in ``data[pos:]`` (uncompressed).

    Returns ``(text, first offset, last offset, gaps)`` with ``gaps`` the (offset, next offset)
    pairs that are not consecutive, or None where the Python path must decide (see the module
    docstring): nothing is half done.
    """
    cdef const unsigned char *p
    cdef Py_ssize_t end = data.shape[0]
    cdef Py_ssize_t rec_end
    cdef int64_t length, ts_delta, delta, key_len, value_len, headers, hkey_len, hvalue_len
    cdef int64_t offset, prev = 0, first = 0, timestamp, seq
    cdef long long i
    cdef bint log_append = attrs & 0x08
    cdef Text text = Text(NULL, 0, 0)
    cdef char *out
    gaps = None
    if count <= 0 or pos > end or base > 0x7FFFFFFF00000000 or base < -0x7FFFFFFF00000000:
        return None
    p = &data[0] if end > 0 else NULL
    if p == NULL:
        return None
    try:
        for i in range(count):
            if not read_varint(p, &pos, end, &length) or length < 0 or length > end - pos:
                return None
            # Every read below stays inside the record: one that would not fails aiokafka's
            # length check anyway, and it bounds the header-key bytes copied into the line.
            rec_end = pos + length
            # attributes: one byte in every record Kafka writes (aiokafka reads a varint here)
            if pos >= rec_end or p[pos] & 0x80:
                return None
            pos += 1
            if not read_varint(p, &pos, rec_end, &ts_delta) or not read_varint(p, &pos, rec_end, &delta):
                return None
            if delta < -0x80000000 or delta > 0x7FFFFFFF:
                return None
            if log_append:
                timestamp = max_ts
            elif (ts_delta > 0 and first_ts > INT64_MAX - ts_delta) or \
                    (ts_delta < 0 and first_ts < INT64_MIN - ts_delta):
                return None
            else:
                timestamp = first_ts + ts_delta
            if not skip_nullable_bytes(p, &pos, rec_end, &key_len) or \
                    not skip_nullable_bytes(p, &pos, rec_end, &value_len):
                return None
            if not read_varint(p, &pos, rec_end, &headers) or headers < 0:
                return None
            # header keys and their commas take at most the record's own length
            out = reserve(&text, RECORD_LINE + length)
            offset = base + delta
            if i == 0:
                first = offset
            elif offset != prev + 1:
                if gaps is None:
                    gaps = []
                gaps.append((prev, offset))
            prev = offset
            out = put_int(put(out, b"| offset: "), offset)
            out = put(out, b" LogAppendTime: " if log_append else b" CreateTime: ")
            out = put_int(out, timestamp)
            out = put_int(put(out, b" keySize: "), key_len if key_len >= 0 else -1)
            out = put_int(put(out, b" valueSize: "), value_len if value_len >= 0 else -1)
            if bseq < 0:
                seq = -1
            elif bseq > INT_MAX - delta:
                seq = delta - (INT_MAX - bseq) - 1
            else:
                seq = bseq + delta
            out = put_int(put(out, b" sequence: "), seq)
            out = put(out, b" headerKeys: [")
            while headers > 0:
                if not read_varint(p, &pos, rec_end, &hkey_len) or hkey_len < 0 or hkey_len > rec_end - pos:
                    return None
                memcpy(out, p + pos, hkey_len)
                out += hkey_len
                pos += hkey_len
                if not skip_nullable_bytes(p, &pos, rec_end, &hvalue_len):
                    return None
                headers -= 1
                if headers:
                    out[0] = 44  # ','
                    out += 1
            out = put(out, b"]\n")
            if pos != rec_end:
                return None
            text.used = out - text.buf
        if pos != end:
            return None
        try:  # header keys are UTF-8 strings: a key that is not stays aiokafka's error to report
            lines = PyUnicode_DecodeUTF8(text.buf, text.used, NULL)
        except UnicodeDecodeError:
            return None
        return lines, first, prev, gaps
    finally:
        free(text.buf)
