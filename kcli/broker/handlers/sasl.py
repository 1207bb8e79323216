"""SaslHandshake (17) and SaslAuthenticate (36): the SASL/PLAIN and SASL/SCRAM exchanges on the listener.

Kafka's flow: the client asks for a mechanism with SaslHandshake; with handshake v1 the token
travels in SaslAuthenticate requests, with v0 the next frame on the socket is the bare token and
the broker answers with a bare size-prefixed (empty, for PLAIN) challenge. Any failure is
answered once and the connection is closed (the server reads ``conn.extra["close"]``).
SCRAM takes two rounds (client-first → server-first, client-final → server-final); the
connection's :class:`~kcli.security.scram.ScramServer` sits in ``conn.extra`` between them.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any

from kio.schema.errors import ErrorCode

from kcli.broker.dispatch import ConnectionState, RequestContext, handler
from kcli.security.sasl import SaslAuthenticationFailed, enabled_mechanisms
from kcli.security.scram import MECHANISMS as SCRAM_MECHANISMS
from kcli.security.scram import ScramAuthenticationFailed, ScramServer

log = logging.getLogger("kcli.security.sasl")


RAW_TOKEN = "sasl_raw_token"  # conn.extra flag: the next frame is a v0 (unframed) token
CLOSE = "close"  # conn.extra flag: close the connection after this response
SCRAM = "sasl_scram"  # conn.extra: the ScramServer of an exchange in progress


@handler(17, "SaslHandshake", 0, 1)
async def sasl_handshake(ctx: RequestContext, req: Any) -> dict[str, Any]:
    conn = ctx.connection
    broker = ctx.broker
    if not conn.sasl_listener:
        return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": []}
    mechanisms = enabled_mechanisms(broker.config)
    if conn.authenticated:
        # kcli grants sessions without a lifetime, so there is no re-authentication to start.
        return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": mechanisms}
    if conn.sasl_mechanism is not None:
        conn.extra[CLOSE] = True
        return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": mechanisms}
    if req.mechanism not in mechanisms:
        conn.extra[CLOSE] = True
        return {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": mechanisms}
    conn.sasl_mechanism = req.mechanism
    if ctx.api_version == 0:
        conn.extra[RAW_TOKEN] = True
    return {"error_code": 0, "mechanisms": mechanisms}


@handler(36, "SaslAuthenticate", 0, 2)
async def sasl_authenticate(ctx: RequestContext, req: Any) -> dict[str, Any]:
    conn = ctx.connection
    if not conn.sasl_listener or conn.authenticated:
        return {"error_code": ErrorCode.illegal_sasl_state,
                "error_message": "SaslAuthenticate request received after successful authentication"
                if conn.authenticated and conn.sasl_listener else "SASL is not enabled on this listener"}
    if conn.sasl_mechanism is None or conn.extra.get(RAW_TOKEN):
        conn.extra[CLOSE] = True
        return {"error_code": ErrorCode.illegal_sasl_state,
                "error_message": "Unexpected SaslAuthenticate request: send SaslHandshake v1 first"}
    try:
        challenge = await _authenticate(ctx.broker, conn, bytes(req.auth_bytes))
    except SaslAuthenticationFailed as err:
        conn.extra[CLOSE] = True
        return {"error_code": ErrorCode.sasl_authentication_failed, "error_message": str(err)}
    return {"error_code": 0, "error_message": None, "auth_bytes": challenge, "session_lifetime": 0}


async def raw_token(broker: Any, conn: ConnectionState, token: bytes) -> bytes | None:
    """A v0 handshake's bare token: answer a size-prefixed challenge (empty for PLAIN), or nothing and close."""
    conn.extra.pop(RAW_TOKEN, None)
    try:
        challenge = await _authenticate(broker, conn, token)
    except SaslAuthenticationFailed:
        conn.extra[CLOSE] = True
        return None
    if not conn.authenticated:
        conn.extra[RAW_TOKEN] = True  # a multi-round mechanism (SCRAM): the next frame is bare too
    return struct.pack(">i", len(challenge)) + challenge


async def _authenticate(broker: Any, conn: ConnectionState, token: bytes) -> bytes:
    """One round of the exchange: the challenge to send back. Sets ``conn.authenticated`` (and
    the principal) when the mechanism is done; PLAIN is done after one round, SCRAM after two."""
    loop = asyncio.get_running_loop()
    try:
        if conn.sasl_mechanism in SCRAM_MECHANISMS:
            server = conn.extra.get(SCRAM)
            if server is None:
                # Credentials are read at each lookup, so a change (or a removal) is seen at once.
                server = conn.extra[SCRAM] = ScramServer(SCRAM_MECHANISMS[conn.sasl_mechanism],
                                                         lambda name, mech: broker.state.scram_credential(name, mech.type))
            challenge = server.evaluate(token)  # HMACs only (the client did PBKDF2): no executor
            if not server.complete:
                return challenge
            conn.extra.pop(SCRAM, None)
            user = server.username
        else:
            user = await loop.run_in_executor(None, broker.sasl.authenticate, token)
            challenge = b""
    except SaslAuthenticationFailed as err:
        if isinstance(err, ScramAuthenticationFailed):
            log.info("SASL/%s authentication from %s failed: %s", conn.sasl_mechanism, conn.peer, err.reason)
        # Kafka's connection.failed.authentication.delay.ms: slow down password guessing.
        await asyncio.sleep(broker.config.get_int("connection.failed.authentication.delay.ms") / 1000)
        raise
    conn.authenticated = True
    conn.principal = f"User:{user}"
    return challenge
