"""Building requests by hand and watching a broker process, for protocol-level tests and benches."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

from aiokafka.record.default_records import DefaultRecordBatchBuilder


def batch(values: list[bytes], *, producer_id: int = -1, epoch: int = -1, base_sequence: int = -1,
          compression: int = 0, timestamp: int = 1_700_000_000_000) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=0,
                                  producer_id=producer_id, producer_epoch=epoch, base_sequence=base_sequence,
                                  batch_size=1 << 22)
    for i, v in enumerate(values):
        b.append(i, timestamp=timestamp + i, key=None, value=v, headers=[])
    return bytes(b.build())


def produce_body(topic: str, partition: int, records: bytes, acks: int = -1) -> dict:
    return {"transactional_id": None, "acks": acks, "timeout": 30000,
            "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": records}]}]}


def produce_result(resp) -> tuple[int, int]:  # noqa: ANN001
    pr = resp.responses[0].partition_responses[0]
    return int(pr.error_code), int(pr.base_offset)


def rss_bytes(pid: int) -> int:
    """The process's resident set size (VmRSS in /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def api_versions_request(correlation_id: int, client_id: bytes = b"kcli-test") -> bytes:
    """A whole ApiVersions v0 frame (size prefix, header v1, empty body)."""
    body = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    return struct.pack(">i", len(body)) + body


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed by the broker")
        out += chunk
    return bytes(out)


def read_response(sock: socket.socket) -> bytes:
    """One size-prefixed response frame's body."""
    (size,) = struct.unpack(">i", recv_exactly(sock, 4))
    return recv_exactly(sock, size)
