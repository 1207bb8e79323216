"""TLS and SASL for kcli's own protocol client, from the same properties librdkafka takes.

A context (kcli/contexts.py) holds librdkafka properties; kcli's own requests (DeletePartitions,
the admin API behind ``kcli diskless`` and ``kcli broker metrics``) read them here, so one
context works for every command:

* ``security.protocol``: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL;
* TLS: ``ssl.ca.location`` (file or directory; default: the system's CAs) or ``ssl.ca.pem``,
  ``ssl.certificate.location``/``ssl.key.location``/``ssl.key.password`` (or ``ssl.certificate.pem``
  /``ssl.key.pem``) for a client certificate, ``ssl.endpoint.identification.algorithm``
  (``https``, librdkafka's default, checks the host name; ``none`` does not) and
  ``enable.ssl.certificate.verification``;
* SASL: ``sasl.mechanism`` (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), ``sasl.username``,
  ``sasl.password``, exchanged as Kafka's SaslHandshake v1 then SaslAuthenticate.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import ssl
import tempfile
from collections.abc import Mapping

from kcli.errors import KafkaApiError, UsageError

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_SCRAM_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


def security_protocol(props: Mapping[str, str]) -> str:
    proto = str(props.get("security.protocol", "PLAINTEXT")).strip().upper()
    if proto not in SECURITY_PROTOCOLS:
        raise UsageError(f"security.protocol must be one of {', '.join(SECURITY_PROTOCOLS)}, got {proto!r}")
    return proto


def _flag(props: Mapping[str, str], key: str, default: bool) -> bool:
    value = str(props.get(key, "true" if default else "false")).strip().lower()
    if value not in ("true", "false"):
        raise UsageError(f"{key} must be true or false, got {value!r}")
    return value == "true"


def client_ssl_context(props: Mapping[str, str]) -> tuple[ssl.SSLContext, bool]:
    """The TLS context librdkafka would build from ``props``, and whether to check the host name."""
    algorithm = str(props.get("ssl.endpoint.identification.algorithm", "https")).strip().lower()
    if algorithm not in ("https", "none"):
        raise UsageError(f"ssl.endpoint.identification.algorithm must be https or none, got {algorithm!r}")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    verify = _flag(props, "enable.ssl.certificate.verification", True)
    ctx.check_hostname = verify and algorithm == "https"
    ctx.verify_mode = ssl.CERT_REQUIRED if verify else ssl.CERT_NONE
    ca_location, ca_pem = props.get("ssl.ca.location"), props.get("ssl.ca.pem")
    try:
        if ca_location:
            path = os.path.expanduser(ca_location)
            if os.path.isdir(path):
                ctx.load_verify_locations(capath=path)
            else:
                ctx.load_verify_locations(cafile=path)
        elif ca_pem:
            ctx.load_verify_locations(cadata=ca_pem)
        else:
            ctx.load_default_certs()
    except (OSError, ssl.SSLError) as err:
        raise UsageError(f"ssl.ca.location {ca_location or '(ssl.ca.pem)'}: cannot load CA certificates: "
                         f"{getattr(err, 'strerror', None) or err}") from None
    cert, key = props.get("ssl.certificate.location"), props.get("ssl.key.location")
    cert_pem, key_pem = props.get("ssl.certificate.pem"), props.get("ssl.key.pem")
    password = props.get("ssl.key.password")
    if bool(cert or cert_pem) != bool(key or key_pem):
        raise UsageError("a client certificate needs both ssl.certificate.location and ssl.key.location "
                         "(or ssl.certificate.pem and ssl.key.pem)")
    try:
        if cert and key:
            ctx.load_cert_chain(os.path.expanduser(cert), os.path.expanduser(key), password=password)
        elif cert_pem and key_pem:
            fd, path = tempfile.mkstemp(prefix="kcli-client-", suffix=".pem")  # mode 0600
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(key_pem.strip() + "\n" + cert_pem.strip() + "\n")
                ctx.load_cert_chain(path, password=password)
            finally:
                os.unlink(path)
    except (OSError, ssl.SSLError) as err:
        raise UsageError(f"ssl.certificate.location/ssl.key.location: cannot load the client certificate: "
                         f"{getattr(err, 'strerror', None) or err}") from None
    return ctx, ctx.check_hostname


def tls_failure(address: str, err: BaseException) -> KafkaApiError:
    """One line for a failed TLS handshake, named as librdkafka's commands name it."""
    if isinstance(err, ssl.SSLCertVerificationError):
        reason = f"certificate verify failed: {err.verify_message} (check ssl.ca.location)"
    else:
        reason = getattr(err, "reason", None) or str(err)
    return KafkaApiError("SSL_AUTHENTICATION_FAILED", f"TLS handshake with {address} failed: {reason}")


def sasl_settings(props: Mapping[str, str]) -> tuple[str, str, str]:
    """(mechanism, username, password); a missing or unsupported setting is a usage error."""
    mechanism = str(props.get("sasl.mechanism", "")).strip().upper() or "GSSAPI"  # librdkafka's default
    if mechanism not in SASL_MECHANISMS:
        raise UsageError(f"sasl.mechanism {mechanism} is not supported by kcli (use one of {', '.join(SASL_MECHANISMS)})")
    username, password = props.get("sasl.username"), props.get("sasl.password")
    if not username or password is None:
        raise UsageError(f"SASL ({mechanism}) needs sasl.username and sasl.password")
    return mechanism, str(username), str(password)


class ScramClient:
    """The client side of SCRAM (RFC 5802): first message, then the proof, then the server's check."""

    def __init__(self, mechanism: str, username: str, password: str) -> None:
        self.hash = _SCRAM_HASHES[mechanism]
        self.mechanism = mechanism
        self.password = password.encode("utf-8")
        name = username.replace("=", "=3D").replace(",", "=2C")
        self.nonce = base64.b64encode(secrets.token_bytes(24)).decode()
        self.first_bare = f"n={name},r={self.nonce}"
        self._server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self.first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode("utf-8", "replace")
        attrs = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
        nonce, salt, iterations = attrs.get("r", ""), attrs.get("s", ""), attrs.get("i", "")
        if not nonce.startswith(self.nonce) or not salt or not iterations.isdigit():
            raise KafkaApiError("SASL_AUTHENTICATION_FAILED", f"{self.mechanism}: malformed server-first message")
        salted = hashlib.pbkdf2_hmac(self.hash, self.password, base64.b64decode(salt), int(iterations))
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self.hash, client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self.first_bare},{text},{without_proof}".encode()
        signature = self._hmac(stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        self._server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def check(self, server_final: bytes) -> None:
        text = server_final.decode("utf-8", "replace")
        attrs = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
        if "e" in attrs:
            raise KafkaApiError("SASL_AUTHENTICATION_FAILED", f"{self.mechanism}: {attrs['e']}")
        try:
            verifier = base64.b64decode(attrs.get("v", ""), validate=True)
        except ValueError:
            verifier = b""
        if not hmac.compare_digest(verifier, self._server_signature):
            raise KafkaApiError("SASL_AUTHENTICATION_FAILED",
                                f"{self.mechanism}: the broker's signature is wrong (it does not know the credential)")

    def _hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self.hash).digest()
