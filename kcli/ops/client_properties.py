"""Kafka's Java client properties (a ``--command-config`` file) as kcli's connection settings.

Kafka's tools read a ``java.util.Properties`` file for their admin client; kcli's clients are
librdkafka's (confluent-kafka) and kcli's own protocol client, which both read librdkafka's names
(docs/security.md). :func:`connection_from_java` maps the Java names onto a
:class:`~kcli.ops.connection.Connection`:

* ``security.protocol``, ``sasl.mechanism``, ``ssl.key.password``, ``client.id`` — same names;
* ``sasl.jaas.config`` of PlainLoginModule / ScramLoginModule → ``sasl.username`` / ``sasl.password``;
* ``ssl.truststore.location`` (type PEM) → ``ssl.ca.location``, ``ssl.truststore.certificates`` →
  ``ssl.ca.pem``; a PEM keystore (``ssl.keystore.location`` of type PEM, or
  ``ssl.keystore.certificate.chain`` + ``ssl.keystore.key``) → ``ssl.certificate.*`` / ``ssl.key.*``;
* ``ssl.endpoint.identification.algorithm`` empty (Java's "off") → ``none``;
* ``request.timeout.ms`` / ``default.api.timeout.ms`` → the connection's timeout.

JKS and PKCS12 stores, GSSAPI and OAUTHBEARER cannot be mapped (librdkafka has no JKS reader and
kcli's protocol client speaks PLAIN and SCRAM only): they are a :class:`UsageError` naming the
property. Other Java client properties (retries, metadata.max.age.ms ...) are tuning the Java
client only and are ignored, as they change nothing the tools print.
"""

from __future__ import annotations

import re
from pathlib import Path

from kcli.contexts import validate_bootstrap
from kcli.errors import UsageError
from kcli.ops.connection import DEFAULT_TIMEOUT_S, Connection

_SAME_NAME = ("security.protocol", "sasl.mechanism", "ssl.key.password", "client.id")
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s;]+))')


def load_properties(path: str) -> dict[str, str]:
    """A ``java.util.Properties`` file: ``key=value``, ``key: value`` or ``key value``; ``#``/``!``
    comments; a trailing backslash continues the line; ``\\t \\n \\uXXXX`` escapes."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise UsageError(f"{path} ({err.strerror or err})") from None
    out: dict[str, str] = {}
    logical: list[str] = []
    for raw in text.splitlines():
        line = raw.lstrip()
        if not logical and (not line or line[0] in "#!"):
            continue
        if _continues(line):
            logical.append(line[:-1])
            continue
        logical.append(line)
        whole, logical = "".join(logical), []
        key, value = _split_property(whole)
        out[_unescape(key)] = _unescape(value)
    if logical:
        key, value = _split_property("".join(logical))
        out[_unescape(key)] = _unescape(value)
    return out


def _continues(line: str) -> bool:
    backslashes = len(line) - len(line.rstrip("\\"))
    return backslashes % 2 == 1


def _split_property(line: str) -> tuple[str, str]:
    """Java's rule: the key ends at the first unescaped ``=``, ``:`` or blank; blanks, then one
    ``=`` or ``:``, then blanks separate it from the value."""
    i, n = 0, len(line)
    while i < n and line[i] not in "=: \t\f":
        i += 2 if line[i] == "\\" else 1
    key, rest = line[:i], line[i:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:]
    return key, rest.lstrip(" \t\f")


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2:i + 6] or ""):
                out.append(chr(int(text[i + 2:i + 6], 16)))
                i += 6
                continue
            out.append({"t": "\t", "n": "\n", "r": "\r", "f": "\f"}.get(nxt, nxt))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def parse_jaas(value: str) -> dict[str, str]:
    """``org.apache.kafka...LoginModule required username="u" password="p";`` → its options."""
    head, _, options = value.strip().partition(" ")
    module = head.rsplit(".", 1)[-1]
    if module not in ("PlainLoginModule", "ScramLoginModule"):
        raise UsageError(f"sasl.jaas.config: {head} is not supported (PlainLoginModule or ScramLoginModule)")
    found = {}
    for m in _JAAS_OPTION.finditer(options):
        raw = m.group(2) if m.group(2) is not None else m.group(3)
        found[m.group(1)] = re.sub(r"\\(.)", r"\1", raw)
    return found


def librdkafka_properties(java: dict[str, str]) -> tuple[dict[str, str], float | None]:
    """The librdkafka properties and timeout (seconds, or None) the Java properties ask for."""
    props: dict[str, str] = {}
    for key in _SAME_NAME:
        if java.get(key, "").strip():
            props[key] = java[key].strip()
    protocol = props.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in _PROTOCOLS:
        raise UsageError(f"security.protocol: {props['security.protocol']!r} is not one of {', '.join(_PROTOCOLS)}")
    props.pop("security.protocol", None)
    if protocol != "PLAINTEXT":
        props["security.protocol"] = protocol
    if protocol.startswith("SASL_"):
        mechanism = props.get("sasl.mechanism", "GSSAPI").upper()  # Java's default mechanism
        if mechanism not in _MECHANISMS:
            raise UsageError(f"sasl.mechanism: {mechanism} is not supported (one of {', '.join(_MECHANISMS)})")
        props["sasl.mechanism"] = mechanism
        jaas = java.get("sasl.jaas.config", "")
        if not jaas.strip():
            raise UsageError("sasl.jaas.config is required with security.protocol=" + protocol)
        options = parse_jaas(jaas)
        for name in ("username", "password"):
            if name not in options:
                raise UsageError(f"sasl.jaas.config has no {name}=\"...\"")
            props[f"sasl.{name}"] = options[name]
    else:
        props.pop("sasl.mechanism", None)
    if protocol.endswith("SSL"):
        props.update(_ssl_properties(java))
    timeout = None
    for key in ("default.api.timeout.ms", "request.timeout.ms"):
        if java.get(key, "").strip():
            try:
                timeout = int(java[key]) / 1000.0
            except ValueError:
                raise UsageError(f"{key}: expected milliseconds, got {java[key]!r}") from None
            if timeout <= 0:
                raise UsageError(f"{key} must be positive, got {java[key]!r}")
            break
    return props, timeout


def _ssl_properties(java: dict[str, str]) -> dict[str, str]:
    props: dict[str, str] = {}
    trust_type = java.get("ssl.truststore.type", "JKS").strip().upper()
    if java.get("ssl.truststore.certificates", "").strip():
        props["ssl.ca.pem"] = java["ssl.truststore.certificates"]
    elif java.get("ssl.truststore.location", "").strip():
        if trust_type != "PEM":
            raise UsageError(f"ssl.truststore.type={trust_type} is not supported: give the CA as a PEM file "
                             "(ssl.truststore.type=PEM)")
        props["ssl.ca.location"] = java["ssl.truststore.location"].strip()
    key_type = java.get("ssl.keystore.type", "JKS").strip().upper()
    if java.get("ssl.keystore.certificate.chain", "").strip() or java.get("ssl.keystore.key", "").strip():
        props["ssl.certificate.pem"] = java.get("ssl.keystore.certificate.chain", "")
        props["ssl.key.pem"] = java.get("ssl.keystore.key", "")
    elif java.get("ssl.keystore.location", "").strip():
        if key_type != "PEM":
            raise UsageError(f"ssl.keystore.type={key_type} is not supported: give the client certificate and key "
                             "as one PEM file (ssl.keystore.type=PEM)")
        location = java["ssl.keystore.location"].strip()
        props["ssl.certificate.location"] = location
        props["ssl.key.location"] = location
    if "ssl.keystore.password" in java and "ssl.key.password" not in java and java["ssl.keystore.password"]:
        props["ssl.key.password"] = java["ssl.keystore.password"]
    if "ssl.key.password" in java and java["ssl.key.password"]:
        props["ssl.key.password"] = java["ssl.key.password"]
    algorithm = java.get("ssl.endpoint.identification.algorithm")
    if algorithm is not None:
        props["ssl.endpoint.identification.algorithm"] = algorithm.strip().lower() or "none"
    return props


def connection_from_java(bootstrap: str, properties: dict[str, str] | None = None,
                         origin: str = "--bootstrap-server") -> Connection:
    """A :class:`Connection` to ``bootstrap`` with the Java client ``properties`` mapped."""
    props, timeout = librdkafka_properties(dict(properties or {}))
    return Connection(validate_bootstrap(bootstrap, origin), props, origin,
                      timeout_s=timeout if timeout is not None else DEFAULT_TIMEOUT_S)
