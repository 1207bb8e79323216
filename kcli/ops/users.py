"""SCRAM users of a running cluster: DescribeUserScramCredentials / AlterUserScramCredentials.

As with Kafka's admin client, the password never leaves this process: the client (librdkafka,
under confluent-kafka's admin API) draws a salt and sends ``SaltedPassword = Hi(password, salt,
iterations)``; the broker keeps only the keys derived from it (kcli/security/scram.py). The
credentials are part of the cluster metadata, so every broker of a cluster knows them at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka.admin import (
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from kcli.errors import KafkaApiError, UsageError
from kcli.ops.connection import Connection, admin

MECHANISMS = {"SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256, "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512}
DEFAULT_ITERATIONS = 4096  # kafka-configs.sh's default; the broker accepts 4096..16384


@dataclass
class ScramUserCredential:
    mechanism: str
    iterations: int


@dataclass
class ScramUser:
    """A user and the mechanisms it has a credential for (never a secret)."""

    user: str
    credentials: list[ScramUserCredential] = field(default_factory=list)


@dataclass
class UserChange:
    user: str
    action: str  # "set" | "deleted"
    mechanisms: list[str]
    iterations: int | None = None


def parse_mechanism(name: str) -> str:
    """Kafka's mechanism name, case-insensitively; a UsageError names the choices."""
    upper = name.strip().upper()
    if upper not in MECHANISMS:
        raise UsageError(f"--mechanism must be one of: {', '.join(MECHANISMS)}, got {name!r}")
    return upper


def _mechanism_name(mechanism: Any) -> str:
    for name, value in MECHANISMS.items():
        if value == mechanism:
            return name
    return str(getattr(mechanism, "name", mechanism))


def _to_user(description: Any) -> ScramUser:
    creds = [ScramUserCredential(_mechanism_name(i.mechanism), int(i.iterations))
             for i in description.scram_credential_infos]
    return ScramUser(description.user, sorted(creds, key=lambda c: c.mechanism))


def list_users(conn: Connection, users: Sequence[str] | None = None) -> list[ScramUser]:
    """Every user with a SCRAM credential, or the named ones (RESOURCE_NOT_FOUND if one has none)."""
    client = admin(conn)
    names = list(dict.fromkeys(users or []))
    if not names:
        described = client.wait(client.describe_user_scram_credentials(request_timeout=conn.timeout_s), "SCRAM users")
        return sorted((_to_user(d) for d in described.values()), key=lambda u: u.user)
    futures = client.describe_user_scram_credentials(names, request_timeout=conn.timeout_s)
    return [_to_user(client.wait(futures[name], f"user {name!r}")) for name in names]


def set_user(conn: Connection, user: str, mechanism: str, password: str,
             iterations: int = DEFAULT_ITERATIONS) -> UserChange:
    """Create or replace ``user``'s credential for ``mechanism``; other mechanisms stay."""
    mechanism = parse_mechanism(mechanism)
    if not user:
        raise UsageError("the user name must not be empty")
    if not password:
        raise UsageError("the password must not be empty")
    client = admin(conn)
    upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(MECHANISMS[mechanism], iterations),
                                          password.encode("utf-8"))
    futures = client.alter_user_scram_credentials([upsert], request_timeout=conn.timeout_s)
    client.wait(futures[user], f"user {user!r}")
    return UserChange(user, "set", [mechanism], iterations)


def delete_user(conn: Connection, user: str, mechanism: str | None = None) -> UserChange:
    """Remove ``user``'s credential for ``mechanism``, or (None) for every mechanism it has.

    Kafka refuses one user twice in a request (DUPLICATE_RESOURCE), so each mechanism is its
    own request; a failure part-way names what was already removed."""
    client = admin(conn)
    if mechanism is not None:
        mechanisms = [parse_mechanism(mechanism)]
    else:
        mechanisms = [c.mechanism for c in list_users(conn, [user])[0].credentials]
    removed: list[str] = []
    for name in mechanisms:
        futures = client.alter_user_scram_credentials([UserScramCredentialDeletion(user, MECHANISMS[name])],
                                                      request_timeout=conn.timeout_s)
        try:
            client.wait(futures[user], f"user {user!r} ({name})")
        except KafkaApiError as err:
            if not removed:
                raise
            raise KafkaApiError(err.name, f"{err.message} (already removed: {', '.join(removed)})", err.code) from err
        removed.append(name)
    return UserChange(user, "deleted", removed)
