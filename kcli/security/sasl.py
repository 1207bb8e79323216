"""SASL/PLAIN for the broker listener: the users file of hashed secrets and the PLAIN check.

PLAIN sends the password itself, so the broker only ever stores a slow salted hash of it
(scrypt by default, PBKDF2-SHA256 where hashlib lacks scrypt) and compares in constant time.
The users file is one ``name:secret`` line per user (``#`` comments allowed)::

    alice:scrypt$16384$8$1$<salt, base64>$<hash, base64>
    bob:pbkdf2-sha256$600000$<salt, base64>$<hash, base64>

Operators create lines with ``kcli broker users add``; the broker re-reads the file when it
changes, so adding or removing a user needs no restart. SCRAM (kcli/security/scram.py) keeps its
credentials in the cluster metadata instead; :class:`ListenerSasl` says which mechanisms are on.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kcli.fsutil import atomic_write_text
from kcli.config.definitions import ConfigError

log = logging.getLogger("kcli.security.sasl")

SUPPORTED_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")  # SCRAM: kcli/security/scram.py
SCRYPT_DEFAULTS = (2**14, 8, 1)  # N, r, p: ~16 MiB and ~0.1 s per check on a small VM
PBKDF2_DEFAULT_ITERATIONS = 600_000
SCHEMES = ("scrypt", "pbkdf2-sha256")
_SALT_BYTES = 16
_HASH_BYTES = 32

# Kafka's PlainSaslServer wording: the client sees these messages.
INVALID_CREDENTIALS = "Authentication failed: Invalid username or password"


class UsersFileError(ConfigError):
    """The users file is missing, unreadable or malformed (a start-up error, exit 2)."""


class SaslAuthenticationFailed(Exception):
    """A PLAIN token was refused; ``str(err)`` is what the client is told."""


@dataclass(frozen=True)
class Credential:
    """One user's stored secret: scheme, cost parameters, salt and derived hash."""

    scheme: str
    params: tuple[int, ...]
    salt: bytes
    digest: bytes

    def derive(self, password: bytes) -> bytes:
        if self.scheme == "scrypt":
            n, r, p = self.params
            return hashlib.scrypt(password, salt=self.salt, n=n, r=r, p=p, dklen=len(self.digest),
                                  maxmem=256 * n * r * p + (1 << 20))
        return hashlib.pbkdf2_hmac("sha256", password, self.salt, self.params[0], dklen=len(self.digest))

    def verify(self, password: bytes) -> bool:
        return hmac.compare_digest(self.derive(password), self.digest)

    def encode(self) -> str:
        b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
        return "$".join([self.scheme, *map(str, self.params), b64(self.salt), b64(self.digest)])


def hash_password(password: str, scheme: str = "scrypt") -> Credential:
    """A fresh credential for ``password`` with a random salt and the default cost."""
    if scheme not in SCHEMES:
        raise ConfigError(f"unknown password scheme {scheme!r} (use one of: {', '.join(SCHEMES)})")
    params = SCRYPT_DEFAULTS if scheme == "scrypt" else (PBKDF2_DEFAULT_ITERATIONS,)
    blank = Credential(scheme, params, secrets.token_bytes(_SALT_BYTES), b"\0" * _HASH_BYTES)
    return Credential(scheme, params, blank.salt, blank.derive(password.encode("utf-8")))


def parse_secret(text: str) -> Credential:
    """Parse ``scheme$params...$salt$hash``; ValueError names what is wrong (never the secret)."""
    parts = text.strip().split("$")
    scheme = parts[0]
    if scheme == "scrypt":
        if len(parts) != 6:
            raise ValueError("scrypt secret must be scrypt$N$r$p$salt$hash")
        params = _ints(parts[1:4])
        n, r, p = params
        if n < 2 or n & (n - 1) or n > 2**20 or not 1 <= r <= 32 or not 1 <= p <= 16:
            raise ValueError(f"scrypt parameters N={n} r={r} p={p} are out of range")
    elif scheme == "pbkdf2-sha256":
        if len(parts) != 4:
            raise ValueError("pbkdf2-sha256 secret must be pbkdf2-sha256$iterations$salt$hash")
        params = _ints(parts[1:2])
        if not 1000 <= params[0] <= 10_000_000:
            raise ValueError(f"pbkdf2-sha256 iterations {params[0]} out of range 1000..10000000")
    else:
        raise ValueError(f"unknown secret scheme {scheme!r} (expected one of: {', '.join(SCHEMES)})")
    try:
        salt = base64.b64decode(parts[-2], validate=True)
        digest = base64.b64decode(parts[-1], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("salt and hash must be base64") from None
    if len(salt) < 8 or not 16 <= len(digest) <= 64:
        raise ValueError("salt must be at least 8 bytes and the hash 16..64 bytes")
    return Credential(scheme, params, salt, digest)


def _ints(values: list[str]) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in values)
    except ValueError:
        raise ValueError("cost parameters must be integers") from None


def check_username(name: str) -> str:
    """Names are written one per line before a ':' — refuse what would break that."""
    if not name or name != name.strip():
        raise ConfigError(f"invalid user name {name!r}: empty or surrounded by spaces")
    if name.startswith("#") or any(c in name for c in ":\0\r\n"):
        raise ConfigError(f"invalid user name {name!r}: must not start with '#' or contain ':' or control characters")
    return name


# --- the users file --------------------------------------------------------------------------


@dataclass
class UsersFile:
    """The file as lines (comments kept), so edits by the CLI leave the operator's notes alone."""

    path: Path
    lines: list[str]
    users: dict[str, Credential]

    @classmethod
    def read(cls, path: Path, missing_ok: bool = False) -> "UsersFile":
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            if missing_ok:
                return cls(Path(path), [], {})
            raise UsersFileError(f"SASL users file {path} does not exist (create it with `kcli broker users add`)") from None
        except (OSError, UnicodeDecodeError) as err:
            reason = getattr(err, "strerror", None) or str(err)
            raise UsersFileError(f"cannot read SASL users file {path}: {reason}") from None
        lines = text.splitlines()
        users: dict[str, Credential] = {}
        for n, line in enumerate(lines, 1):
            entry = _entry(line)
            if entry is None:
                continue
            name, secret = entry
            if not secret:
                raise UsersFileError(f"SASL users file {path} line {n}: expected NAME:SECRET (see `kcli broker users add`)")
            if name in users:
                raise UsersFileError(f"SASL users file {path} line {n}: user {name!r} is listed twice")
            try:
                check_username(name)
                users[name] = parse_secret(secret)
            except (ValueError, ConfigError) as err:
                raise UsersFileError(f"SASL users file {path} line {n}: {err}") from None
        return cls(Path(path), lines, users)

    def set(self, name: str, credential: Credential) -> bool:
        """Add or replace ``name``; True when it replaced an existing user."""
        check_username(name)
        line = f"{name}:{credential.encode()}"
        for i, existing in enumerate(self.lines):
            entry = _entry(existing)
            if entry is not None and entry[0] == name:
                self.lines[i] = line
                self.users[name] = credential
                return True
        self.lines.append(line)
        self.users[name] = credential
        return False

    def delete(self, name: str) -> bool:
        if name not in self.users:
            return False
        self.lines = [ln for ln in self.lines if (_entry(ln) or ("",))[0] != name]
        del self.users[name]
        return True

    def write(self) -> None:
        """Atomically, mode 0600: the hashes are offline-guessable, so keep them private."""
        path = self.path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, "".join(f"{ln}\n" for ln in self.lines))
        except OSError as err:
            raise UsersFileError(f"cannot write SASL users file {path}: {err.strerror or err}") from None


def _entry(line: str) -> tuple[str, str] | None:
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return None
    name, sep, secret = stripped.partition(":")
    if not sep:
        return stripped, ""  # no ':': read() reports the line
    return name, secret


# --- the PLAIN check -------------------------------------------------------------------------


class PlainAuthenticator:
    """Checks PLAIN tokens against the users file, re-reading it when it changes.

    A successful check is remembered as an HMAC of the password under a per-process key, so a
    client that opens many connections pays the slow hash once; unknown users still cost one
    hash so response time does not reveal which names exist."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: Any = None
        self._users: dict[str, Credential] = {}
        self._key = secrets.token_bytes(32)
        self._verified: dict[str, tuple[Credential, bytes]] = {}
        self._dummy = hash_password(secrets.token_urlsafe(16))
        self._load(strict=True)

    def _file_stamp(self) -> Any:
        st = os.stat(self.path)
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _load(self, strict: bool) -> None:
        try:
            stamp = self._file_stamp()
            if stamp == self._stamp:
                return
            users = UsersFile.read(self.path).users
        except (OSError, UsersFileError) as err:
            if strict:
                if isinstance(err, UsersFileError):
                    raise
                UsersFile.read(self.path)  # raises the precise reason (missing, unreadable)
                raise UsersFileError(f"cannot read SASL users file {self.path}: {err.strerror}") from None
            log.warning("keeping the previous SASL users: %s", err)
            return
        self._users, self._stamp = users, stamp
        log.info("loaded %d SASL user(s) from %s", len(users), self.path)

    @property
    def usernames(self) -> list[str]:
        return sorted(self._users)

    def authenticate(self, token: bytes) -> str:
        """Return the user name for a valid ``authzid NUL user NUL password`` token.

        Blocking (a slow hash): run it off the event loop."""
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise SaslAuthenticationFailed(f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(parts)}")
        authzid_b, user_b, password = parts
        try:
            authzid, user = authzid_b.decode("utf-8"), user_b.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslAuthenticationFailed("Invalid SASL/PLAIN response: not UTF-8") from None
        if not user:
            raise SaslAuthenticationFailed("Authentication failed: username not specified")
        if not password:
            raise SaslAuthenticationFailed("Authentication failed: password not specified")
        with self._lock:
            self._load(strict=False)
            cred = self._users.get(user)
            cached = self._verified.get(user)
        tag = hmac.new(self._key, password, hashlib.sha256).digest()
        if cred is not None and cached is not None and cached[0] == cred and hmac.compare_digest(cached[1], tag):
            ok = True
        elif cred is None:
            self._dummy.verify(password)
            ok = False
        else:
            ok = cred.verify(password)
            if ok:
                with self._lock:
                    self._verified[user] = (cred, tag)
        if not ok:
            raise SaslAuthenticationFailed(INVALID_CREDENTIALS)
        if authzid and authzid != user:
            raise SaslAuthenticationFailed("Authentication failed: Client requested an authorization id that is different from username")
        return user


def enabled_mechanisms(config: Any) -> list[str]:
    return [m.strip().upper() for m in config.get("sasl.enabled.mechanisms") if m.strip()]


@dataclass
class ListenerSasl:
    """The listener's SASL setup: the enabled mechanisms, and the PLAIN users file check when PLAIN
    is one of them. SCRAM needs nothing here: its credentials live in the cluster metadata."""

    mechanisms: list[str]
    plain: PlainAuthenticator | None

    def authenticate(self, token: bytes) -> str:
        """A PLAIN token's user name (see :meth:`PlainAuthenticator.authenticate`)."""
        if self.plain is None:
            raise SaslAuthenticationFailed("Authentication failed: PLAIN is not enabled")
        return self.plain.authenticate(token)


def authenticator_from_config(config: Any) -> ListenerSasl | None:
    """The listener's SASL setup, or None when SASL is off; bad settings raise ConfigError."""
    mechanisms = enabled_mechanisms(config)
    users_file = config.get_str("sasl.plain.users.file")
    unknown = [m for m in mechanisms if m not in SUPPORTED_MECHANISMS]
    if unknown:
        raise ConfigError(f"Invalid value {','.join(unknown)} for configuration sasl.enabled.mechanisms: "
                          f"kcli supports {', '.join(SUPPORTED_MECHANISMS)}")
    if not mechanisms:
        if users_file:
            raise ConfigError("sasl.plain.users.file is set but sasl.enabled.mechanisms is empty: "
                              "set sasl.enabled.mechanisms=PLAIN to require authentication")
        return None
    if "PLAIN" not in mechanisms:
        if users_file:
            raise ConfigError("sasl.plain.users.file is set but PLAIN is not in sasl.enabled.mechanisms "
                              f"({','.join(mechanisms)}): add PLAIN or drop the users file")
        return ListenerSasl(mechanisms, None)
    if not users_file:
        raise ConfigError("sasl.enabled.mechanisms=PLAIN needs sasl.plain.users.file (create it with `kcli broker users add`)")
    auth = PlainAuthenticator(Path(users_file).expanduser())
    if not auth.usernames:
        raise UsersFileError(f"SASL users file {users_file} has no users: no client could connect")
    return ListenerSasl(mechanisms, auth)
