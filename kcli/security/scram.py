"""SASL/SCRAM-SHA-256 and -512 (RFC 5802, RFC 7677): credentials and the server side of the exchange.

Kafka keeps SCRAM credentials in the cluster metadata (KRaft's ``UserScramCredentialRecord``), never
the password: a salt, the iteration count, ``StoredKey = H(HMAC(SaltedPassword, "Client Key"))`` and
``ServerKey = HMAC(SaltedPassword, "Server Key")``. The client computes ``SaltedPassword`` itself
(AlterUserScramCredentials carries it, not the password), so the broker never sees a password and
never runs PBKDF2: checking a proof costs two HMACs and a hash.

Names, limits and messages follow Kafka's ScramMechanism / ScramFormatter / ScramSaslServer /
ScramControlManager: mechanism types 1 and 2, 4096..16384 iterations, and one generic message for
every failure a client must not learn details of (unknown user, bad proof, bad nonce).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kcli.security.sasl import SaslAuthenticationFailed

log = logging.getLogger("kcli.security.scram")

MAX_ITERATIONS = 16384  # Kafka's ScramControlManager.MAX_ITERATIONS
DEFAULT_ITERATIONS = 4096  # kafka-configs.sh's default


@dataclass(frozen=True)
class ScramMechanism:
    """One SCRAM variant: its SASL name, Kafka's wire type (admin ScramMechanism) and hash."""

    name: str
    type: int
    hash_name: str
    min_iterations: int = 4096

    @property
    def digest_size(self) -> int:
        return hashlib.new(self.hash_name).digest_size

    def hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self.hash_name).digest()

    def hash(self, data: bytes) -> bytes:
        return hashlib.new(self.hash_name, data).digest()

    def salted_password(self, password: str, salt: bytes, iterations: int) -> bytes:
        """RFC 5802 Hi(): PBKDF2 with this hash. Like Kafka, the password is UTF-8 as is (no SASLprep)."""
        return hashlib.pbkdf2_hmac(self.hash_name, password.encode("utf-8"), salt, iterations)

    def client_key(self, salted_password: bytes) -> bytes:
        return self.hmac(salted_password, b"Client Key")

    def server_key(self, salted_password: bytes) -> bytes:
        return self.hmac(salted_password, b"Server Key")


SCRAM_SHA_256 = ScramMechanism("SCRAM-SHA-256", 1, "sha256")
SCRAM_SHA_512 = ScramMechanism("SCRAM-SHA-512", 2, "sha512")
MECHANISMS: dict[str, ScramMechanism] = {m.name: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}
BY_TYPE: dict[int, ScramMechanism] = {m.type: m for m in MECHANISMS.values()}


@dataclass(frozen=True)
class ScramCredential:
    """What the broker stores per user and mechanism (Kafka's ScramCredential)."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    @classmethod
    def from_salted_password(cls, mechanism: ScramMechanism, salt: bytes, salted_password: bytes,
                             iterations: int) -> ScramCredential:
        """As ScramControlManager.finishUpsertion: the salted password is reduced to the two keys."""
        return cls(salt, mechanism.hash(mechanism.client_key(salted_password)),
                   mechanism.server_key(salted_password), iterations)

    @classmethod
    def from_password(cls, mechanism: ScramMechanism, password: str, iterations: int = DEFAULT_ITERATIONS,
                      salt: bytes | None = None) -> ScramCredential:
        salt = salt if salt is not None else secrets.token_bytes(24)
        return cls.from_salted_password(mechanism, salt, mechanism.salted_password(password, salt, iterations), iterations)

    def record_data(self, name: str, mechanism: ScramMechanism) -> dict[str, Any]:
        """The fields of a UserScramCredentialRecord (bytes as base64: the metadata log is JSON)."""
        return {"name": name, "mechanism": mechanism.type, "salt": _b64encode(self.salt),
                "storedKey": _b64encode(self.stored_key), "serverKey": _b64encode(self.server_key),
                "iterations": self.iterations}

    @classmethod
    def from_record_data(cls, d: dict[str, Any]) -> ScramCredential:
        return cls(_b64(d["salt"]), _b64(d["storedKey"]), _b64(d["serverKey"]), d["iterations"])


def _b64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


def _b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def iterations_error(mechanism: ScramMechanism, iterations: int) -> str | None:
    """Kafka's reason for refusing an iteration count, or None when it is acceptable."""
    if iterations < mechanism.min_iterations:
        return "Too few iterations"
    if iterations > MAX_ITERATIONS:
        return "Too many iterations"
    return None


def check_credential_record(kind: str, d: dict[str, Any]) -> None:
    """ValueError unless a (Remove)UserScramCredentialRecord can be replayed and used: a user name,
    a known mechanism, and for an upsert base64 keys of the hash's size and Kafka's iteration range."""
    if not d["name"]:
        raise ValueError(f"{kind} has an empty user name")
    mechanism = BY_TYPE.get(d["mechanism"])
    if mechanism is None:
        raise ValueError(f"{kind} has an unknown SCRAM mechanism type {d['mechanism']}")
    if kind != "UserScramCredentialRecord":
        return
    reason = iterations_error(mechanism, d["iterations"])
    if reason is not None:
        raise ValueError(f"{kind} of {d['name']!r}: {reason} ({d['iterations']}, allowed "
                         f"{mechanism.min_iterations}..{MAX_ITERATIONS})")
    try:
        cred = ScramCredential.from_record_data(d)
    except (binascii.Error, ValueError):
        raise ValueError(f"{kind} of {d['name']!r}: salt and keys must be base64") from None
    if not cred.salt:
        raise ValueError(f"{kind} of {d['name']!r}: the salt is empty")
    if len(cred.stored_key) != mechanism.digest_size or len(cred.server_key) != mechanism.digest_size:
        raise ValueError(f"{kind} of {d['name']!r}: keys must be {mechanism.digest_size} bytes for {mechanism.name}")


# --- the server side of the exchange ------------------------------------------------------------

GENERIC_FAILURE = "Authentication failed during authentication due to invalid credentials with SASL mechanism {}"
AUTHZID_MISMATCH = "Authentication failed: Client requested an authorization id that is different from username"
_NONCE = re.compile(r"[\x21-\x2b\x2d-\x7e]+")  # printable ASCII but ','
_EXT_KEY = re.compile(r"[A-Za-z]+")


class ScramAuthenticationFailed(SaslAuthenticationFailed):
    """``str(err)`` is what the client is told; ``reason`` (never sent) is what the broker logs."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def sasl_name_to_username(name: str) -> str:
    """RFC 5802 saslname: ',' and '=' travel as '=2C' and '=3D'; any other '=' is malformed."""
    if re.search(r"=(?!2C|3D)", name):
        raise ValueError("bad '=' escape in the user name")
    return name.replace("=2C", ",").replace("=3D", "=")


CredentialLookup = Callable[[str, ScramMechanism], "ScramCredential | None"]


class ScramServer:
    """One connection's SCRAM exchange: client-first → server-first, client-final → server-final.

    ``evaluate`` returns the next server message; after the second it sets ``username``. Every
    refusal raises :class:`ScramAuthenticationFailed`; the caller ends the connection."""

    def __init__(self, mechanism: ScramMechanism, lookup: CredentialLookup,
                 server_nonce: Callable[[], str] = lambda: secrets.token_urlsafe(24)) -> None:
        """``server_nonce`` is replaceable only so RFC test vectors can be replayed."""
        self.mechanism = mechanism
        self._lookup = lookup
        self._server_nonce = server_nonce
        self._step = 0
        self.username: str | None = None
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._client_nonce = ""
        self._credential: ScramCredential | None = None

    @property
    def complete(self) -> bool:
        return self._step == 2

    def _fail(self, reason: str) -> ScramAuthenticationFailed:
        self._credential = None
        return ScramAuthenticationFailed(GENERIC_FAILURE.format(self.mechanism.name), reason)

    def evaluate(self, token: bytes) -> bytes:
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise self._fail("the SCRAM message is not UTF-8") from None
        if self._step == 0:
            return self._client_first(text)
        if self._step == 1:
            return self._client_final(text)
        raise self._fail("SCRAM exchange already complete")

    def _client_first(self, message: str) -> bytes:
        # gs2-header: only "n" (no channel binding), as Kafka; then an optional a=authzid.
        parts = message.split(",", 2)
        if len(parts) != 3 or parts[0] != "n":
            raise self._fail(f"Invalid SCRAM client first message format (gs2 header {parts[0]!r})")
        authzid_field, bare = parts[1], parts[2]
        if authzid_field and not authzid_field.startswith("a="):
            raise self._fail("Invalid SCRAM client first message format (authzid)")
        attrs = bare.split(",")
        if attrs[0].startswith("m="):
            raise self._fail("mandatory SCRAM extension (m=) not supported")
        if len(attrs) < 2 or not attrs[0].startswith("n=") or not attrs[1].startswith("r="):
            raise self._fail("Invalid SCRAM client first message format")
        try:
            username = sasl_name_to_username(attrs[0][2:])
            authzid = sasl_name_to_username(authzid_field[2:]) if authzid_field else ""
        except ValueError as err:
            raise self._fail(f"Invalid SCRAM client first message format: {err}") from None
        nonce = attrs[1][2:]
        if not username or not _NONCE.fullmatch(nonce):
            raise self._fail("Invalid SCRAM client first message format (empty user name or bad nonce)")
        extensions: dict[str, str] = {}
        for ext in attrs[2:]:
            key, sep, value = ext.partition("=")
            if not sep or not _EXT_KEY.fullmatch(key):
                raise self._fail(f"Invalid SCRAM client first message format (extension {key!r})")
            extensions[key] = value
        if extensions.get("tokenauth", "").lower() == "true":
            # Kafka looks the name up as a delegation token id; kcli has no delegation tokens.
            raise self._fail(f"Token Authentication failed: Invalid tokenId : {username}")
        credential = self._lookup(username, self.mechanism)
        if credential is None:
            raise self._fail(f"Authentication failed: Invalid user credentials (no {self.mechanism.name} credential for {username!r})")
        if authzid and authzid != username:
            raise ScramAuthenticationFailed(AUTHZID_MISMATCH, f"authzid {authzid!r} differs from {username!r}")
        if credential.iterations < self.mechanism.min_iterations:
            raise self._fail(f"Iterations {credential.iterations} is less than the minimum "
                             f"{self.mechanism.min_iterations} for {self.mechanism.name}")
        self._gs2_header = f"n,{authzid_field},"
        self._client_first_bare = bare
        self._client_nonce = nonce
        self._nonce = nonce + self._server_nonce()
        salt = base64.b64encode(credential.salt).decode("ascii")
        self._server_first = f"r={self._nonce},s={salt},i={credential.iterations}"
        self._credential = credential
        self.username = username
        self._step = 1
        return self._server_first.encode("ascii")

    def _client_final(self, message: str) -> bytes:
        credential = self._credential
        assert credential is not None
        without_proof, sep, proof_b64 = message.rpartition(",p=")
        attrs = without_proof.split(",")
        if not sep or len(attrs) < 2 or not attrs[0].startswith("c=") or not attrs[1].startswith("r="):
            raise self._fail("Invalid SCRAM client final message format")
        try:
            channel = base64.b64decode(attrs[0][2:], validate=True)
            proof = base64.b64decode(proof_b64, validate=True)
        except (binascii.Error, ValueError):
            raise self._fail("Invalid SCRAM client final message format (base64)") from None
        if channel != self._gs2_header.encode():
            raise self._fail("channel binding does not repeat the gs2 header")
        # RFC 5802: the client repeats the server's nonce. librdkafka < 2.6.1 sends the client nonce
        # once more in front of it (librdkafka#4895); Kafka 3.8.1-3.9 accept that (endsWith), and so
        # does kcli, so kcat and older confluent-kafka builds can log in. Nothing else is accepted.
        nonce = attrs[1][2:]
        if nonce != self._nonce and nonce != self._client_nonce + self._nonce:
            raise self._fail("Invalid client nonce in the final client message.")
        m = self.mechanism
        if len(proof) != m.digest_size:
            raise self._fail("Invalid client credentials (proof length)")
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        client_signature = m.hmac(credential.stored_key, auth_message)
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature))
        if not hmac.compare_digest(m.hash(client_key), credential.stored_key):
            raise self._fail("Invalid client credentials")
        server_signature = m.hmac(credential.server_key, auth_message)
        self._credential = None
        self._step = 2
        return b"v=" + base64.b64encode(server_signature)
