"""A small blocking Kafka protocol client for kcli's own APIs and for probing brokers.

confluent-kafka covers the standard admin and data APIs; this client sends what it cannot
(kcli's DeletePartitions and diskless admin APIs) and lets tests send exact frames.
"""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

from kcli.errors import OperationError
from kcli.protocol import codec
from kcli.protocol.codec import build, request_class, response_class


class WireClient:
    def __init__(self, bootstrap: str, timeout: float = 30.0, client_id: str = "kcli") -> None:
        host, _, port = bootstrap.rpartition(":")
        self.address = (host.strip("[]") or "127.0.0.1", int(port))
        self.timeout = timeout
        self.client_id = client_id
        self._sock: socket.socket | None = None
        self._correlation = 0

    def __enter__(self) -> "WireClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> socket.socket:
        if self._sock is None:
            try:
                self._sock = socket.create_connection(self.address, timeout=self.timeout)
            except OSError as err:
                raise OperationError(f"cannot connect to {self.address[0]}:{self.address[1]}: {err.strerror or err}") from None
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def send_raw(self, payload: bytes) -> None:
        self.connect().sendall(payload)

    def encode_request(self, api_key: int, version: int, body: dict[str, Any] | Any) -> tuple[int, bytes]:
        cls = request_class(api_key, version)
        entity = build(cls, body) if isinstance(body, dict) else body
        self._correlation += 1
        out = io.BytesIO()
        out.write(struct.pack(">hhi", api_key, version, self._correlation))
        cid = self.client_id.encode()
        out.write(struct.pack(">h", len(cid)) + cid)
        if cls.__flexible__:
            out.write(b"\0")
        codec._writer(cls)(out, entity)
        data = out.getvalue()
        return self._correlation, struct.pack(">i", len(data)) + data

    def recv_frame(self) -> bytes:
        sock = self.connect()
        head = self._recv_exact(sock, 4)
        (size,) = struct.unpack(">i", head)
        return self._recv_exact(sock, size)

    @staticmethod
    def _recv_exact(sock: socket.socket, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise OperationError("connection closed by the broker")
            buf += chunk
        return bytes(buf)

    def request(self, api_key: int, version: int, body: dict[str, Any] | Any) -> Any:
        """Send one request and return the decoded kio response entity."""
        correlation, frame = self.encode_request(api_key, version, body)
        try:
            self.send_raw(frame)
            data = self.recv_frame()
        except OSError as err:
            self.close()
            raise OperationError(f"request to {self.address[0]}:{self.address[1]} failed: {err}") from None
        (cid,) = struct.unpack_from(">i", data, 0)
        if cid != correlation:
            raise OperationError(f"correlation id mismatch: sent {correlation}, got {cid}")
        cls = response_class(api_key, version)
        pos = 4
        if cls.__header_schema__.__flexible__:
            pos = codec._skip_tagged_fields(data, pos)
        entity, _ = codec._reader(cls)(data, pos)
        return entity
