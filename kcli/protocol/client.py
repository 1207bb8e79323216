"""A small blocking Kafka protocol client for kcli's own APIs and for probing brokers.

confluent-kafka covers the standard admin and data APIs; this client sends what it cannot
(kcli's DeletePartitions and diskless admin APIs) and lets tests send exact frames. It speaks
what the broker's listener speaks, from the librdkafka properties of the command's context
(kcli/protocol/security.py): TLS, and SASL PLAIN or SCRAM before the first request.
"""

from __future__ import annotations

import io
import socket
import ssl
import struct
from collections.abc import Mapping
from typing import Any

from kcli.errors import KafkaApiError, OperationError
from kcli.protocol import codec, security
from kcli.protocol.codec import build, request_class


class WireClient:
    def __init__(self, bootstrap: str, timeout: float = 30.0, client_id: str = "kcli",
                 properties: Mapping[str, str] | None = None) -> None:
        """``properties``: the librdkafka client properties (security.protocol, ssl.*, sasl.*)."""
        host, _, port = bootstrap.split("://", 1)[-1].rpartition(":")
        self.address = (host.strip("[]") or "127.0.0.1", int(port))
        self.timeout = timeout
        self.client_id = client_id
        self.properties = dict(properties or {})
        self.protocol = security.security_protocol(self.properties)
        self._sock: socket.socket | None = None
        self._correlation = 0

    def __enter__(self) -> "WireClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> socket.socket:
        if self._sock is None:
            where = f"{self.address[0]}:{self.address[1]}"
            tls = security.client_ssl_context(self.properties) if self.protocol.endswith("SSL") else None
            sasl = security.sasl_settings(self.properties) if self.protocol.startswith("SASL_") else None
            try:
                sock = socket.create_connection(self.address, timeout=self.timeout)
            except OSError as err:
                raise OperationError(f"cannot connect to {where}: {err.strerror or err}") from None
            if tls is not None:
                ctx, check_hostname = tls
                try:
                    sock = ctx.wrap_socket(sock, server_hostname=self.address[0] if check_hostname else None)
                except ssl.SSLError as err:
                    sock.close()
                    raise security.tls_failure(where, err) from None
                except OSError as err:
                    sock.close()
                    raise OperationError(f"TLS handshake with {where} failed: {err.strerror or err or 'connection closed'} "
                                         f"(is it a {self.protocol} listener?)") from None
            self._sock = sock
            if sasl is not None:
                try:
                    self._authenticate(*sasl)
                except BaseException:
                    self.close()
                    raise
        return self._sock

    def _authenticate(self, mechanism: str, username: str, password: str) -> None:
        """Kafka's SaslHandshake v1, then SaslAuthenticate rounds (one for PLAIN, two for SCRAM)."""
        from kcli.protocol.errors import error_name

        handshake = self.request(17, 1, {"mechanism": mechanism})
        if handshake.error_code:
            offered = ", ".join(handshake.mechanisms) or "none"
            raise KafkaApiError(error_name(int(handshake.error_code)),
                                f"the broker does not offer SASL mechanism {mechanism} (it offers: {offered})")

        def round_trip(token: bytes) -> bytes:
            resp = self.request(36, 1, {"auth_bytes": token})
            if resp.error_code:
                raise KafkaApiError(error_name(int(resp.error_code)), resp.error_message or "")
            return bytes(resp.auth_bytes)

        if mechanism == "PLAIN":
            round_trip(b"\0" + username.encode() + b"\0" + password.encode())
            return
        scram = security.ScramClient(mechanism, username, password)
        server_first = round_trip(scram.first())
        scram.check(round_trip(scram.final(server_first)))

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
        try:
            return codec.decode_response(api_key, version, data, correlation)
        except ValueError as err:
            raise OperationError(str(err)) from None
