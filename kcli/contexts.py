"""The contexts file: named clusters an operator switches between (kafkactl/rpk style).

Layout (YAML), at ``$KCLI_CONFIG`` or ``~/.config/kcli/config.yaml``::

    current-context: prod
    contexts:
      prod:
        bootstrap-servers: "kafka-1:9092,kafka-2:9092"
        properties:            # passed verbatim to confluent-kafka clients
          security.protocol: SASL_SSL
          sasl.mechanism: PLAIN

A top-level ``embedded-broker:`` section configures the broker a command boots when no cluster
is given (kcli/broker/embedded.py), with the settings `kcli broker start` takes::

    embedded-broker:
      config-file: ~/kafka/server.properties   # a Kafka server.properties
      config:                                  # like --config; overrides the file
        remote.log.storage.system.enable: true
        delete.topic.partition.enable: true

The file may hold SASL passwords, so it is written with mode 0600 and atomically (a crash
never leaves half a file). Bad content is a :class:`UsageError`: the operator must fix it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kcli.fsutil import atomic_write_text
from kcli.errors import UsageError

CONFIG_ENV = "KCLI_CONFIG"

# Property names whose values are never printed (show/list mask them).
_SECRET_RE = re.compile(r"(password|secret|jaas\.config|token|private\.key|credentials)", re.IGNORECASE)
MASK = "******"

_CONTEXT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@/-]*$")
_HOSTPORT_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[^\s:,\[\]]+)(?::(\d{1,5}))?$")
DEFAULT_PORT = 9092  # a bootstrap host without a port, as kcat and librdkafka take it


@dataclass
class Context:
    """One named cluster: where to connect and which client properties to use."""

    name: str
    bootstrap_servers: str
    properties: dict[str, str] = field(default_factory=dict)

    def to_dict(self, reveal_secrets: bool = False) -> dict[str, Any]:
        props = self.properties if reveal_secrets else masked(self.properties)
        return {"name": self.name, "bootstrap_servers": self.bootstrap_servers, "properties": dict(props)}


@dataclass
class EmbeddedBrokerSection:
    """Settings of the embedded default broker: a properties file and ``--config``-style pairs."""

    config_file: Path | None = None
    config: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.config_file is not None:
            out["config-file"] = str(self.config_file)
        if self.config:
            out["config"] = dict(self.config)
        return out


@dataclass
class ContextsConfig:
    """The whole file. ``path`` is where it was read from and will be written to."""

    path: Path
    current_context: str | None = None
    contexts: dict[str, Context] = field(default_factory=dict)
    embedded_broker: EmbeddedBrokerSection = field(default_factory=EmbeddedBrokerSection)

    def get(self, name: str) -> Context:
        """The context called ``name``; an unknown name is a usage error (exit 2)."""
        try:
            return self.contexts[name]
        except KeyError:
            known = ", ".join(sorted(self.contexts)) or "none defined"
            raise UsageError(f"unknown context {name!r} (known: {known}; see `kcli context list`)") from None

    def current(self) -> Context | None:
        """The current context, or None when none is set. A dangling name is a usage error."""
        if not self.current_context:
            return None
        if self.current_context not in self.contexts:
            raise UsageError(
                f"current-context {self.current_context!r} in {self.path} names no context; "
                "run `kcli context use NAME`"
            )
        return self.contexts[self.current_context]


def config_path() -> Path:
    """``$KCLI_CONFIG`` if set, else ``~/.config/kcli/config.yaml`` (honouring XDG_CONFIG_HOME)."""
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "kcli" / "config.yaml"


def is_secret(key: str) -> bool:
    return bool(_SECRET_RE.search(key))


def masked(properties: dict[str, str]) -> dict[str, str]:
    return {k: (MASK if is_secret(k) else v) for k, v in properties.items()}


def validate_bootstrap(value: str, what: str = "--bootstrap-server") -> str:
    """``host[:port][,host[:port]...]``, normalised to host:port (port 9092 when left out, as
    kcat does); an optional ``PLAINTEXT://``-style scheme is kept."""
    servers = [s.strip() for s in value.split(",") if s.strip()]
    if not servers:
        raise UsageError(f"{what} expects HOST:PORT, got {value!r}")
    out = []
    for server in servers:
        scheme, _, bare = server.rpartition("://")
        m = _HOSTPORT_RE.match(bare)
        if not m or (m.group(2) is not None and not 0 < int(m.group(2)) <= 65535):
            raise UsageError(f"{what} expects HOST:PORT[,HOST:PORT...], got {value!r}")
        port = m.group(2) or str(DEFAULT_PORT)
        out.append(f"{scheme}://{m.group(1)}:{port}" if scheme else f"{m.group(1)}:{port}")
    return ",".join(out)


def validate_context_name(name: str) -> str:
    if not _CONTEXT_NAME_RE.match(name or ""):
        raise UsageError(f"invalid context name {name!r}: use letters, digits and . _ - @ /")
    return name


def _as_property_value(key: str, value: Any, path: Path) -> str:
    """YAML turns ``true``/``3`` into bool/int; librdkafka wants the strings back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise UsageError(f"{path}: property {key!r} must be a scalar, got {type(value).__name__}")


def load(path: Path | None = None) -> ContextsConfig:
    """Read the contexts file; a missing file is an empty configuration."""
    import yaml

    path = path or config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return ContextsConfig(path=path)
    except OSError as err:
        raise UsageError(f"cannot read contexts file {path}: {err.strerror or err}") from None
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        first = str(err).splitlines()[0] if str(err) else "parse error"
        raise UsageError(f"contexts file {path} is not valid YAML: {first}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"contexts file {path}: expected a mapping at the top level")
    current = raw.get("current-context")
    if current is not None and not isinstance(current, str):
        raise UsageError(f"contexts file {path}: current-context must be a string")
    contexts_raw = raw.get("contexts") or {}
    if not isinstance(contexts_raw, dict):
        raise UsageError(f"contexts file {path}: contexts must be a mapping of NAME to settings")
    contexts: dict[str, Context] = {}
    for name, body in contexts_raw.items():
        name = str(name)
        if not isinstance(body, dict):
            raise UsageError(f"contexts file {path}: context {name!r} must be a mapping")
        servers = body.get("bootstrap-servers")
        if not isinstance(servers, str) or not servers.strip():
            raise UsageError(f"contexts file {path}: context {name!r} needs bootstrap-servers: \"host:port\"")
        props_raw = body.get("properties") or {}
        if not isinstance(props_raw, dict):
            raise UsageError(f"contexts file {path}: properties of context {name!r} must be a mapping")
        props = {str(k): _as_property_value(str(k), v, path) for k, v in props_raw.items()}
        contexts[name] = Context(name=name, bootstrap_servers=servers.strip(), properties=props)
    return ContextsConfig(path=path, current_context=current or None, contexts=contexts,
                          embedded_broker=_embedded_section(raw.get("embedded-broker"), path))


def _embedded_section(raw: Any, path: Path) -> EmbeddedBrokerSection:
    if raw is None:
        return EmbeddedBrokerSection()
    if not isinstance(raw, dict) or set(raw) - {"config-file", "config"}:
        raise UsageError(f"contexts file {path}: embedded-broker takes config-file: PATH and config: a mapping")
    config_file = raw.get("config-file")
    if config_file is not None and (not isinstance(config_file, str) or not config_file.strip()):
        raise UsageError(f"contexts file {path}: embedded-broker config-file must be a path")
    config = raw.get("config") or {}
    if not isinstance(config, dict):
        raise UsageError(f"contexts file {path}: embedded-broker config must be a mapping of broker configs")
    return EmbeddedBrokerSection(Path(config_file).expanduser() if config_file else None,
                                 {str(k): _as_property_value(str(k), v, path) for k, v in config.items()})


def save(config: ContextsConfig) -> None:
    """Write atomically with mode 0600 (the file may hold credentials)."""
    import yaml

    body: dict[str, Any] = {}
    if config.current_context:
        body["current-context"] = config.current_context
    body["contexts"] = {
        c.name: ({"bootstrap-servers": c.bootstrap_servers, "properties": dict(c.properties)}
                 if c.properties else {"bootstrap-servers": c.bootstrap_servers})
        for c in config.contexts.values()
    }
    if config.embedded_broker.to_dict():
        body["embedded-broker"] = config.embedded_broker.to_dict()
    path = config.path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, yaml.safe_dump(body, sort_keys=False, default_flow_style=False))
    except OSError as err:
        raise UsageError(f"cannot write contexts file {path}: {err.strerror or err}") from None


def set_context(config: ContextsConfig, name: str, bootstrap_servers: str | None,
                properties: dict[str, str] | None = None, unset: list[str] | None = None) -> Context:
    """Create or update ``name``; new contexts need a bootstrap server. Becomes current if none is."""
    validate_context_name(name)
    existing = config.contexts.get(name)
    if existing is None and not bootstrap_servers:
        raise UsageError(f"context {name!r} does not exist yet: --bootstrap-server is required to create it")
    ctx = existing or Context(name=name, bootstrap_servers="")
    if bootstrap_servers:
        ctx.bootstrap_servers = validate_bootstrap(bootstrap_servers)
    ctx.properties.update(properties or {})
    for key in unset or []:
        if key not in ctx.properties:
            raise UsageError(f"context {name!r} has no property {key!r} to unset")
        del ctx.properties[key]
    config.contexts[name] = ctx
    if not config.current_context:
        config.current_context = name
    return ctx


def use_context(config: ContextsConfig, name: str) -> Context:
    ctx = config.get(name)
    config.current_context = name
    return ctx


def delete_context(config: ContextsConfig, name: str) -> Context:
    """Remove ``name``; deleting the current context leaves no current context."""
    ctx = config.get(name)
    del config.contexts[name]
    if config.current_context == name:
        config.current_context = None
    return ctx
