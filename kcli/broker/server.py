"""The socket side of the broker: Kafka framing, per-connection ordering, dispatch.

Requests on one connection run concurrently (so acks=all produces can share one fsync) but
their responses are written strictly in request order, which is what Kafka clients rely on.
A frame that cannot be parsed closes that connection only; the broker keeps serving others.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from kcli.broker.authz import guarded
from kcli.broker.connection import FrameSizeError, KafkaFrameProtocol
from kcli.broker.heap import release_free_memory
from kcli.broker.listeners import Listener, server_ssl_context, tls_principal
from kcli.broker.read_budget import ReadBudget
from kcli.broker.dispatch import HANDLERS, ConnectionState, RequestContext, load_all_handlers
from kcli.broker.handlers.sasl import CLOSE, RAW_TOKEN, raw_token
from kcli.protocol import codec
from kcli.protocol.codec import ProtocolError
from kcli.protocol.errors import BrokerError, error_name

if TYPE_CHECKING:
    from kcli.broker.broker import Broker

log = logging.getLogger("kcli.broker.server")

API_VERSIONS_KEY = 18
PRODUCE_KEY = 0
# Before authentication a SASL listener serves only these (ApiVersions, SaslHandshake, SaslAuthenticate).
PRE_AUTH_APIS = frozenset({18, 17, 36})
TLS_HANDSHAKE_TIMEOUT_S = 10.0  # a client that connects to a TLS listener and says nothing
REFUSED_LINGER_S = 1.0  # see KafkaServer._linger
IDLE_SWEEP_S = 2.0  # how often connections that received nothing give back their read buffer
TRIM_AFTER_CLOSED = 32  # connections closed since the last sweep that make it return freed heap to the OS
TRIM_AFTER_RELEASED = 1 << 20  # ... or bytes of idle read buffers it released


def handler_error_code(err: BaseException) -> tuple[int, str]:
    """The Kafka error code and message for an exception that escaped a request handler.

    BrokerError and the storage layer's LogError carry their code; an OSError is a disk
    problem (KAFKA_STORAGE_ERROR, as Kafka answers for a failed log dir); anything else is
    UNKNOWN_SERVER_ERROR."""
    code = getattr(err, "code", None)
    if isinstance(code, int) and not isinstance(code, bool) and -1 <= code < 2**15 and not isinstance(err, OSError):
        return code, str(getattr(err, "message", "") or err)
    if isinstance(err, OSError):
        return ErrorCode.kafka_storage_error, f"{err.strerror or err}"
    return ErrorCode.unknown_server_error, f"Unexpected server error: {type(err).__name__}"


class KafkaServer:
    """All of the broker's listeners (kcli/broker/listeners.py): one socket each, TLS where the
    listener's protocol says so; every connection knows its listener (SASL or not, Metadata's
    addresses)."""

    def __init__(self, broker: "Broker", listeners: "list[Listener]") -> None:
        self.broker = broker
        self.listeners = list(listeners)
        self.bound: list[tuple[Listener, str, int]] = []
        self._servers: list[asyncio.base_events.Server] = []
        self._connections: set[asyncio.Task[Any]] = set()
        self._readers: set[asyncio.Task[Any]] = set()
        self.max_request_size = broker.config.get_int("socket.request.max.bytes")
        self.max_pre_auth_size = broker.config.get_int("sasl.server.max.receive.size")
        self.read_budget = ReadBudget(broker.config.queued_max_request_bytes(), self.max_request_size)
        self._protocols: set[KafkaFrameProtocol] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._closed_since_sweep = 0
        self.max_idle_ms = broker.config.get_int("connections.max.idle.ms")
        load_all_handlers()
        self._fns: dict[int, Any] = {}  # each API's handler behind its authorization check (kcli/broker/authz.py)

    async def start(self) -> list[tuple[Listener, str, int]]:
        """Bind every listener; returns (listener, host, port) with the ports actually bound."""
        loop = asyncio.get_running_loop()
        try:
            for li in self.listeners:
                ssl_ctx = server_ssl_context(self.broker.config, li.name) if li.tls else None
                server = await loop.create_server(
                    lambda li=li: KafkaFrameProtocol(lambda proto: self._connected(proto, li),
                                                     self._initial_limit(li), self.read_budget),
                    li.host, li.port, reuse_address=True, ssl=ssl_ctx,
                    ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if ssl_ctx else None,
                )
                self._servers.append(server)
                host, port = server.sockets[0].getsockname()[:2]
                self.bound.append((li, host, port))
        except BaseException:
            for server in self._servers:
                server.close()
            raise
        self._sweeper = loop.create_task(self._release_idle_buffers())
        return list(self.bound)

    async def _release_idle_buffers(self) -> None:
        """Every IDLE_SWEEP_S, connections that received nothing since the last sweep drop their
        read buffer: an idle connection then holds only its socket and a few small objects.
        After many connections closed, freed heap goes back to the OS (kcli.broker.heap).
        A connection that read and wrote nothing for connections.max.idle.ms is closed, as Kafka
        does: that is also the timeout on a client that stalls inside a request holding budget."""
        while True:
            await asyncio.sleep(IDLE_SWEEP_S)
            if self.max_idle_ms >= 0:
                now = time.monotonic()
                for proto in list(self._protocols):
                    if (now - proto.last_activity) * 1000 > self.max_idle_ms and not proto.waiting_for_budget:
                        log.log(logging.WARNING if proto.mid_request else logging.INFO,
                                "closing %s: idle for more than connections.max.idle.ms=%d%s", proto.peer(),
                                self.max_idle_ms, " in the middle of a request" if proto.mid_request else "")
                        proto.close()
            released = sum(proto.release_if_idle() for proto in list(self._protocols))
            if self._closed_since_sweep >= TRIM_AFTER_CLOSED or released >= TRIM_AFTER_RELEASED:
                release_free_memory()
            self._closed_since_sweep = 0

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting and reading; answer requests already read (bounded), then close."""
        for server in self._servers:
            server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for reader_task in list(self._readers):
            reader_task.cancel()
        if self._connections:
            _done, pending = await asyncio.wait(self._connections, timeout=grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    def _initial_limit(self, listener: Listener) -> int:
        return self.max_pre_auth_size if listener.sasl else self.max_request_size

    def _connected(self, proto: KafkaFrameProtocol, listener: Listener) -> None:
        task = asyncio.get_running_loop().create_task(self._serve_connection(proto, listener))
        self._connections.add(task)
        self._protocols.add(proto)

    async def _serve_connection(self, proto: KafkaFrameProtocol, listener: Listener) -> None:
        task = asyncio.current_task()
        assert task is not None
        reader = writer = proto
        peer_info = writer.get_extra_info("peername")
        peer = f"{peer_info[0]}:{peer_info[1]}" if peer_info else "?"
        conn = ConnectionState(peer=peer, authenticated=not listener.sasl, listener=listener.name,
                               sasl_listener=listener.sasl)
        if listener.tls:
            conn.principal = tls_principal(writer.get_extra_info("peercert")) or conn.principal
        responses: asyncio.Queue[asyncio.Task[bytes | None] | None] = asyncio.Queue(maxsize=64)
        sender = asyncio.create_task(self._send_in_order(responses, writer, peer))
        reading = asyncio.create_task(self._read_requests(reader, conn, responses, peer))
        self._readers.add(reading)
        try:
            await asyncio.gather(reading, return_exceptions=True)
        finally:
            self._readers.discard(reading)
            await responses.put(None)
            try:
                await asyncio.wait_for(sender, timeout=30)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                sender.cancel()
            try:
                if conn.extra.get(CLOSE):
                    await self._linger(writer)
            finally:  # a shutdown may cancel the linger: the connection still closes
                writer.close()
            try:
                await writer.wait_closed()
            except Exception:
                pass
            self._connections.discard(task)
            self._protocols.discard(proto)
            self._closed_since_sweep += 1

    @staticmethod
    async def _linger(writer: KafkaFrameProtocol) -> None:
        """After refusing a client (failed SASL), let it close first, for up to REFUSED_LINGER_S.

        A FIN that arrives with the error response makes some clients drop the response and
        report a bare disconnect (kafka-python 3.0 does, on most attempts): the operator would
        then see a timeout instead of "Invalid username or password". No further request is served."""
        try:
            await asyncio.wait_for(writer.wait_closed(), timeout=REFUSED_LINGER_S)
        except asyncio.TimeoutError:
            pass

    async def _read_requests(self, reader: KafkaFrameProtocol, conn: ConnectionState,
                             responses: "asyncio.Queue[asyncio.Task[bytes | None] | None]", peer: str) -> None:
        """Read frames and start their handlers until EOF, a bad frame, or shutdown."""
        while not self.broker.stopping:
            limit = self.max_request_size if conn.authenticated else self.max_pre_auth_size
            try:
                frame = await reader.read_frame(limit)
            except FrameSizeError as err:
                log.warning("closing %s: request size %d outside 1..%d", peer, err.size, limit)
                return
            except ConnectionError:
                return
            if frame is None:
                return
            try:
                if conn.extra.get(RAW_TOKEN):  # after SaslHandshake v0 the next frame is a bare token
                    work = raw_token(self.broker, conn, bytes(frame))
                else:
                    work = self._prepare(frame, conn)
            except ProtocolError as err:
                log.warning("closing %s: malformed request: %s", peer, err)
                return
            pre_auth = not conn.authenticated
            job = asyncio.create_task(work)
            await responses.put(job)
            if pre_auth:
                # The SASL exchange is a strict sequence: finish each step before reading on.
                await asyncio.wait({job})
                if conn.extra.get(CLOSE):
                    return

    async def _send_in_order(self, responses: "asyncio.Queue[asyncio.Task[bytes | None] | None]", writer: KafkaFrameProtocol, peer: str) -> None:
        broken = False
        while True:
            task = await responses.get()
            if task is None:
                return
            try:
                data = await task
            except Exception as err:  # a handler bug must not kill the broker
                log.exception("request from %s failed: %s", peer, err)
                data = None
                broken = True
            if broken:
                # Answering later requests would break the client's ordering assumptions.
                writer.close()
                continue
            if data:
                try:
                    writer.write(data)
                    await writer.drain()
                except (ConnectionError, RuntimeError):
                    broken = True

    def _prepare(self, frame: bytes, conn: ConnectionState) -> Any:
        header, pos = codec.read_header(frame)
        h = HANDLERS.get(header.api_key)
        if h is None or not h.min_version <= header.api_version <= h.max_version:
            if header.api_key == API_VERSIONS_KEY:
                return self._unsupported_api_versions(header)
            if not conn.authenticated and header.api_key not in PRE_AUTH_APIS:
                raise ProtocolError(f"API key {header.api_key} before SASL authentication")
            return self._unsupported(frame, header, pos, h)
        if not conn.authenticated and header.api_key not in PRE_AUTH_APIS:
            raise ProtocolError(f"{h.name} before SASL authentication")
        request = codec.decode_request(frame, header, pos)
        conn.extra.setdefault("api_keys", set()).add(header.api_key)  # which APIs a connection used (KIP-694 views)
        ctx = RequestContext(self.broker, header, conn)
        fn = self._fns.get(h.api_key)
        if fn is None:
            fn = self._fns[h.api_key] = guarded(h, self.broker)
        return self._run(fn, ctx, request)

    async def _run(self, fn: Any, ctx: RequestContext, request: Any) -> bytes | None:
        """Run a handler; whatever it raises becomes that API's error response, never a dropped
        connection (Kafka's KafkaApis.handleError: the client can retry or report, and the
        requests pipelined behind this one are still answered)."""
        header = ctx.header
        started = time.monotonic()
        try:
            return await self._answer(fn, ctx, request)
        finally:  # Kafka's RequestMetrics: per API, counted and timed whatever the outcome
            labels = {"request": HANDLERS[header.api_key].name}
            self.broker.metrics.inc_labelled("requests", labels)
            self.broker.metrics.observe_labelled("request.total_time_ms", labels, (time.monotonic() - started) * 1000)

    async def _answer(self, fn: Any, ctx: RequestContext, request: Any) -> bytes | None:
        header = ctx.header
        try:
            body = await fn(ctx, request)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # every failure gets an answer
            code, message = handler_error_code(err)
            self.broker.metrics.inc_labelled("request.errors", {"request": HANDLERS[header.api_key].name,
                                                                "error": error_name(code)})
            if not isinstance(err, BrokerError):
                log.error("%s v%d from %s failed; answering %s", HANDLERS[header.api_key].name, header.api_version,
                          ctx.connection.peer, error_name(code), exc_info=err)
            if header.api_key == PRODUCE_KEY and int(getattr(request, "acks", -1)) == 0:
                return None  # an acks=0 producer reads no response: one would desync the connection
            body = codec.error_response_body(header.api_key, header.api_version, request, code, message)
            try:
                return codec.encode_response(header.api_key, header.api_version, header.correlation_id, body)
            except Exception:  # an entry echoed from the request that this version cannot carry
                log.exception("cannot encode the error response of %s v%d", HANDLERS[header.api_key].name,
                              header.api_version)
                body = {"error_code": code}
        if body is None:
            return None
        return codec.encode_response(header.api_key, header.api_version, header.correlation_id, body)

    def _unsupported(self, frame: bytes, header: codec.RequestHeader, pos: int, h: Any) -> Any:
        """A Kafka API, or a version of one, that this broker does not serve (ApiVersions does not
        list it): answered with UNSUPPORTED_VERSION in that API's own response, so the client
        reports the error and the connection stays usable. Only a request that is no Kafka API
        version kio knows (nothing to answer with) closes the connection, as in Kafka."""
        what = f"{h.name} v{header.api_version}" if h is not None else f"API key {header.api_key} v{header.api_version}"
        message = f"{what} is not supported by this broker" + (
            f" (versions {h.min_version}-{h.max_version})" if h is not None else "")
        try:
            request = codec.decode_request(frame, header, pos)
            if header.api_key == PRODUCE_KEY and int(getattr(request, "acks", -1)) == 0:
                data = None  # an acks=0 producer reads no response
            else:
                body = codec.error_response_body(header.api_key, header.api_version, request, ErrorCode.unsupported_version, message)
                data = codec.encode_response(header.api_key, header.api_version, header.correlation_id, body)
        except ProtocolError:
            raise
        except Exception as err:  # kio has no schema for it: not a Kafka API we can answer
            raise ProtocolError(f"{message}: {err}") from None

        async def answer() -> bytes | None:
            return data

        return answer()

    async def _unsupported_api_versions(self, header: codec.RequestHeader) -> bytes:
        # Kafka answers a too-new ApiVersions with a v0 body so the client can downgrade.
        from kcli.broker.handlers.api_versions import supported_api_keys

        body = {"error_code": ErrorCode.unsupported_version, "api_keys": supported_api_keys()}
        return codec.encode_response(API_VERSIONS_KEY, 0, header.correlation_id, body)
