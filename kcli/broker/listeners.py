"""The broker's listeners as Kafka configures them: names, security protocols, addresses, TLS.

``listeners=PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9093`` opens one socket per entry;
``listener.security.protocol.map`` says which security protocol a listener name speaks (by
default a name is its own protocol); ``advertised.listeners`` gives clients another address per
listener. A listener's TLS settings are the ``ssl.*`` configs, overridden per listener by
``listener.name.<name>.ssl.*``. Key material is PEM only (Kafka's ``ssl.keystore.type=PEM``):
a file holding the private key and the certificate chain, or both inline.

Kafka's rule for Metadata: a client is told the addresses of the listener it connected to, so a
client of the SASL_SSL listener never gets sent to the PLAINTEXT one.
"""

from __future__ import annotations

import os
import re
import ssl
import tempfile
from dataclasses import dataclass
from typing import Any

from kcli.config.definitions import ConfigError

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_LISTENER_RE = re.compile(r"^([A-Za-z0-9_]+)://(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]*):(\d{1,5})$")


@dataclass(frozen=True)
class Listener:
    """One socket the broker serves: its name, security protocol and bind address."""

    name: str
    protocol: str
    host: str
    port: int

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")


@dataclass(frozen=True)
class Endpoint:
    """Where clients of one listener reach a broker (what Metadata returns to them)."""

    name: str
    host: str
    port: int
    protocol: str = "PLAINTEXT"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "host": self.host, "port": self.port, "security_protocol": self.protocol}


def protocol_map(config: Any) -> dict[str, str]:
    """``listener.security.protocol.map`` as {NAME: PROTOCOL}; a bad entry is a ConfigError."""
    out: dict[str, str] = {}
    for entry in config.get("listener.security.protocol.map"):
        name, sep, proto = entry.partition(":")
        name, proto = name.strip().upper(), proto.strip().upper()
        if not sep or not name or proto not in SECURITY_PROTOCOLS:
            raise ConfigError(f"Invalid value {entry} for configuration listener.security.protocol.map: "
                              f"expected NAME:PROTOCOL with PROTOCOL one of {', '.join(SECURITY_PROTOCOLS)}")
        out[name] = proto
    return out


def _split(entry: str, what: str) -> tuple[str, str, int]:
    m = _LISTENER_RE.match(entry.strip())
    if not m or not 0 <= int(m.group(3)) <= 65535:
        raise ConfigError(f"Invalid value {entry} for configuration {what}: expected NAME://HOST:PORT")
    return m.group(1).upper(), m.group(2).strip("[]"), int(m.group(3))


def parse_listeners(config: Any) -> list[Listener]:
    """The ``listeners`` config: names unique and in the protocol map, ports unique (but 0)."""
    protocols = protocol_map(config)
    out: list[Listener] = []
    for entry in config.get("listeners"):
        name, host, port = _split(entry, "listeners")
        if name not in protocols:
            raise ConfigError(f"Invalid value {entry} for configuration listeners: listener name {name} is not "
                              f"in listener.security.protocol.map ({', '.join(sorted(protocols))})")
        if any(li.name == name for li in out):
            raise ConfigError(f"Invalid value {','.join(config.get('listeners'))} for configuration listeners: "
                              f"each listener must have a different name, {name} is repeated")
        if port and any(li.port == port for li in out):
            raise ConfigError(f"Invalid value {','.join(config.get('listeners'))} for configuration listeners: "
                              f"each listener must have a different port, {port} is repeated")
        out.append(Listener(name, protocols[name], host or "0.0.0.0", port))
    if not out:
        raise ConfigError("Invalid empty value for configuration listeners: name at least one NAME://HOST:PORT")
    return out


def check_security(config: Any, listeners: list[Listener]) -> None:
    """Refuse at start what would fail every client later: SASL listeners without a mechanism,
    TLS listeners without a key."""
    for li in listeners:
        if li.sasl and not config.get("sasl.enabled.mechanisms"):
            raise ConfigError(f"listener {li.name} is {li.protocol} but sasl.enabled.mechanisms is empty: "
                              "set sasl.enabled.mechanisms=PLAIN (with sasl.plain.users.file) or SCRAM-SHA-256/512")
        if li.tls:
            server_ssl_context(config, li.name)
    advertised_endpoints(config, [(li, li.host, li.port) for li in listeners])  # names the listeners


def advertised_endpoints(config: Any, bound: list[tuple[Listener, str, int]]) -> list[Endpoint]:
    """One endpoint per listener: its ``advertised.listeners`` entry, else where it is bound
    (a wildcard host advertises 127.0.0.1). A bare HOST:PORT entry advertises the first listener."""
    advertised: dict[str, tuple[str, int]] = {}
    names = [li.name for li, _h, _p in bound]
    for entry in config.get("advertised.listeners"):
        if "://" not in entry and bound:
            host, _, port = entry.rpartition(":")
            if not port.isdigit():
                raise ConfigError(f"Invalid value {entry} for configuration advertised.listeners: expected NAME://HOST:PORT")
            advertised[names[0]] = (host.strip("[]"), int(port))
            continue
        name, host, port = _split(entry, "advertised.listeners")
        if name not in names:
            raise ConfigError(f"Invalid value {entry} for configuration advertised.listeners: listener {name} "
                              f"is not one of the listeners ({', '.join(names)})")
        advertised[name] = (host, port)
    out = []
    for li, host, port in bound:
        if li.name in advertised:
            host, port = advertised[li.name]
        elif host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        out.append(Endpoint(li.name, host, port, li.protocol))
    return out


def server_ssl_context(config: Any, listener: str) -> ssl.SSLContext:
    """The TLS server context of ``listener`` from the (listener-prefixed) ssl.* configs."""
    get = lambda key: config.for_listener(listener, key)  # noqa: E731
    for key in ("ssl.keystore.type", "ssl.truststore.type"):
        if str(get(key)).upper() != "PEM":
            raise ConfigError(f"Invalid value {get(key)} for configuration {key}: kcli reads PEM only")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    location, chain, key = get("ssl.keystore.location"), get("ssl.keystore.certificate.chain"), get("ssl.keystore.key")
    password = get("ssl.key.password")
    if location and (chain or key):
        raise ConfigError(f"listener {listener}: set ssl.keystore.location or ssl.keystore.certificate.chain with "
                          "ssl.keystore.key, not both")
    if not location and not (chain and key):
        raise ConfigError(f"listener {listener} uses TLS: set ssl.keystore.location (a PEM file with the private key "
                          "and the certificate chain) or ssl.keystore.certificate.chain and ssl.keystore.key")
    try:
        if location:
            ctx.load_cert_chain(os.path.expanduser(location), password=password)
        else:
            _load_inline_chain(ctx, chain, key, password)
    except (OSError, ssl.SSLError, ValueError) as err:
        what = location or "ssl.keystore.certificate.chain/ssl.keystore.key"
        raise ConfigError(f"listener {listener}: cannot load the TLS key and certificate from {what}: "
                          f"{getattr(err, 'strerror', None) or err}") from None
    auth = str(get("ssl.client.auth")).lower()
    trust_file, trust_inline = get("ssl.truststore.location"), get("ssl.truststore.certificates")
    try:
        if trust_file:
            ctx.load_verify_locations(cafile=os.path.expanduser(trust_file))
        elif trust_inline:
            ctx.load_verify_locations(cadata=trust_inline)
    except (OSError, ssl.SSLError) as err:
        raise ConfigError(f"listener {listener}: cannot load the trust store {trust_file or 'ssl.truststore.certificates'}: "
                          f"{getattr(err, 'strerror', None) or err}") from None
    if auth != "none" and not (trust_file or trust_inline):
        raise ConfigError(f"ssl.client.auth={auth} on listener {listener} needs ssl.truststore.location "
                          "(the CA certificates client certificates must chain to)")
    ctx.verify_mode = {"required": ssl.CERT_REQUIRED, "requested": ssl.CERT_OPTIONAL}.get(auth, ssl.CERT_NONE)
    return ctx


def _load_inline_chain(ctx: ssl.SSLContext, chain: str, key: str, password: str | None) -> None:
    """ssl loads keys from files only: write the inline PEM to a private temp file, load, delete."""
    fd, path = tempfile.mkstemp(prefix="kcli-keystore-", suffix=".pem")
    try:
        with os.fdopen(fd, "w") as f:  # mkstemp: mode 0600
            f.write(key.strip() + "\n" + chain.strip() + "\n")
        ctx.load_cert_chain(path, password=password)
    finally:
        os.unlink(path)


def tls_principal(peercert: dict[str, Any] | None) -> str | None:
    """``User:CN=...,O=...`` from a verified client certificate (Kafka's default SSL principal)."""
    if not peercert:
        return None
    parts = [f"{k}={v}" for rdn in reversed(peercert.get("subject", ())) for k, v in rdn]
    names = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
             "localityName": "L", "stateOrProvinceName": "ST"}
    parts = [f"{names.get(p.split('=', 1)[0], p.split('=', 1)[0])}={p.split('=', 1)[1]}" for p in parts]
    return f"User:{','.join(parts)}" if parts else None
