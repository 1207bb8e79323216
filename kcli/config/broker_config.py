"""Parsed broker configuration: --config pairs, a properties file, and Kafka's defaults."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from kcli.config.definitions import BROKER_CONFIGS, ConfigError, format_value, parse_value

# Plugins take their own settings under these prefixes (Kafka style: "<prefix>.<key>").
PLUGIN_PREFIXES = (
    "diskless.storage.",
    "diskless.coordinator.",
    "remote.log.storage.manager.impl.",
    "remote.log.metadata.manager.impl.",
    "kcli.fault.",
    "kcli.cluster.",  # kcli.cluster.url from `kcli broker start --cluster URL`
)

LISTENER_PREFIX = "listener.name."


def read_properties(path: Path) -> dict[str, str]:
    """Read a Java properties file as ``java.util.Properties`` does: ``key=value``, ``key: value``
    or ``key value``; ``#``/``!`` comments; a trailing backslash continues the line."""
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror}") from None
    out: dict[str, str] = {}
    lines = text.splitlines()
    n = 0
    while n < len(lines):
        start = n + 1
        line = lines[n].strip()
        n += 1
        if not line or line.startswith(("#", "!")):
            continue
        while line.endswith("\\") and not line.endswith("\\\\") and n < len(lines):
            line = line[:-1] + lines[n].strip()
            n += 1
        m = re.match(r"^((?:[^=:\s\\]|\\.)+)\s*(?:[=:]\s*|\s+|$)(.*)$", line)
        if m is None or not m.group(2) and not re.search(r"[=:\s]", line):
            raise ConfigError(f"{path}:{start}: expected key=value, got {line!r}")
        out[re.sub(r"\\(.)", r"\1", m.group(1))] = m.group(2).strip()
    return out


class BrokerConfig:
    """Effective broker configs; unknown names are refused so typos never pass silently."""

    def __init__(self, overrides: dict[str, str] | None = None) -> None:
        self.values: dict[str, Any] = {name: d.default for name, d in BROKER_CONFIGS.items()}
        self.explicit: set[str] = set()
        self.plugin: dict[str, str] = {}
        self.listener_overrides: dict[tuple[str, str], Any] = {}  # (listener name, config) → value
        for name, raw in (overrides or {}).items():
            self.set(name, raw)
        self._check_request_bytes()

    def _check_request_bytes(self) -> None:
        """Kafka's rule: a bounded queued.max.request.bytes must hold one whole request."""
        queued = self.get_int("queued.max.request.bytes")
        if "queued.max.request.bytes" in self.explicit and 0 < queued < self.get_int("socket.request.max.bytes"):
            raise ConfigError("queued.max.request.bytes must be larger or equal to socket.request.max.bytes")

    def queued_max_request_bytes(self) -> int:
        """The effective budget (<= 0: unbounded). Left at kcli's default, it grows with
        socket.request.max.bytes rather than refusing a larger request size."""
        queued = self.get_int("queued.max.request.bytes")
        if queued <= 0 or "queued.max.request.bytes" in self.explicit:
            return queued
        return max(queued, self.get_int("socket.request.max.bytes"))

    def set(self, name: str, raw: str) -> None:
        if name.startswith(LISTENER_PREFIX):
            self._set_listener_override(name, raw)
            return
        if name.startswith(PLUGIN_PREFIXES) and name not in BROKER_CONFIGS:
            self.plugin[name] = raw
            return
        d = BROKER_CONFIGS.get(name)
        if d is None:
            raise ConfigError(f"Unknown broker config name: {name}")
        self.values[name] = parse_value(d, raw)
        self.explicit.add(name)
        if name in ("node.id", "broker.id"):
            self.values["node.id"] = self.values["broker.id"] = self.values[name]

    def _set_listener_override(self, name: str, raw: str) -> None:
        """Kafka's ``listener.name.<listener>.<config>``: an ssl.* setting for one listener."""
        listener, _, key = name[len(LISTENER_PREFIX):].partition(".")
        d = BROKER_CONFIGS.get(key)
        if not listener or d is None or not key.startswith("ssl."):
            raise ConfigError(f"Unknown broker config name: {name} (listener.name.<listener>. prefixes ssl.* configs)")
        self.listener_overrides[(listener.lower(), key)] = parse_value(d, raw)

    def for_listener(self, listener: str, name: str) -> Any:
        """``name`` for one listener: its ``listener.name.<listener>.`` override, else the global value."""
        return self.listener_overrides.get((listener.lower(), name), self.values[name])

    def get(self, name: str) -> Any:
        return self.values[name]

    def get_int(self, name: str) -> int:
        return int(self.values[name])

    def get_bool(self, name: str) -> bool:
        return bool(self.values[name])

    def get_str(self, name: str) -> str:
        v = self.values[name]
        return "" if v is None else str(v)

    def formatted(self, name: str) -> str | None:
        return format_value(BROKER_CONFIGS[name], self.values[name])

    def prefixed(self, prefix: str) -> dict[str, str]:
        """Plugin settings under ``prefix`` with the prefix stripped."""
        return {k[len(prefix):]: v for k, v in self.plugin.items() if k.startswith(prefix)}
