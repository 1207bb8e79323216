"""A Kafka ``server.properties`` read as Kafka reads it, turned into kcli's broker settings.

Kafka spells some settings several ways (``log.retention.hours|minutes|ms``, ``log.dir`` and
``log.dirs``, ``node.id`` and ``broker.id``) and puts the listen address and the data dir among
the configs. This module resolves those the way Kafka does, so that a file means what it says,
and sorts the rest into settings kcli implements and settings it does not (listed as ignored
at start, or refused with ``--strict``): a real Kafka file names many KRaft and thread-pool
settings that a single kcli process has no use for.

One PLAINTEXT / SASL_PLAINTEXT broker listener becomes the listen address; several listeners, or
TLS ones, pass through as the ``listeners`` config (kcli/broker/listeners.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kcli.config.broker_config import LISTENER_PREFIX, PLUGIN_PREFIXES
from kcli.config.definitions import BROKER_CONFIGS, ConfigError

# Kafka's millisecond settings that also come in coarser units: ms over minutes over hours.
_TIME_UNITS = {
    "log.retention.ms": (("log.retention.minutes", 60_000), ("log.retention.hours", 3_600_000)),
    "log.roll.ms": (("log.roll.hours", 3_600_000),),
    "log.roll.jitter.ms": (("log.roll.jitter.hours", 3_600_000),),
}
# Kafka's default listener.security.protocol.map: a listener name maps to itself.
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SERVED_PROTOCOLS = ("PLAINTEXT", "SASL_PLAINTEXT")
# Kafka's default prefixes under which plugin settings are passed to the RSM / RLMM.
_RSM_PREFIX = ("remote.log.storage.manager.impl.prefix", "rsm.config.", "remote.log.storage.manager.impl.")
_RLMM_PREFIX = ("remote.log.metadata.manager.impl.prefix", "rlmm.config.", "remote.log.metadata.manager.impl.")
# Consumed here (their meaning is carried by other settings), so neither passed on nor "ignored".
_CONSUMED = {"log.dir", "log.dirs", "listeners", "listener.security.protocol.map", _RSM_PREFIX[0], _RLMM_PREFIX[0]}


@dataclass
class ServerProperties:
    """What one source of Kafka settings (a file, or the --config pairs) says."""

    configs: dict[str, str] = field(default_factory=dict)  # kcli broker configs, as strings
    data_dir: Path | None = None  # from log.dirs (or log.dir)
    listen: str | None = None  # "PROTOCOL://host:port" from listeners
    ignored: list[str] = field(default_factory=list)  # what kcli does not implement: names, listener entries
    unknown: list[str] = field(default_factory=list)  # the names among them (not kcli configs)


def _int(name: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigError(f"Invalid value {raw} for configuration {name}: Not a number") from None


def _resolve_time_units(props: dict[str, str], out: ServerProperties) -> None:
    """Kafka's precedence (ms over minutes over hours); a negative value means unlimited (-1)."""
    for ms_name, coarser in _TIME_UNITS.items():
        chosen: tuple[str, int] | None = None
        if ms_name in props:
            chosen = (ms_name, _int(ms_name, props[ms_name]))
        for name, factor in coarser:
            if name in props:
                value = _int(name, props[name])  # checked even when a finer unit wins, as Kafka does
                if chosen is None:
                    chosen = (name, -1 if value < 0 else value * factor)
        if chosen is not None:
            out.configs[ms_name] = str(-1 if chosen[1] < 0 and ms_name == "log.retention.ms" else chosen[1])


def _data_dir(props: dict[str, str]) -> Path | None:
    """log.dirs over log.dir; kcli keeps one data dir, so several are refused."""
    name = "log.dirs" if props.get("log.dirs", "").strip() else "log.dir"
    dirs = [d.strip() for d in props.get(name, "").split(",") if d.strip()]
    if len(dirs) > 1:
        raise ConfigError(f"{name} names {len(dirs)} directories ({', '.join(dirs)}): kcli keeps one data dir per "
                          "broker; give one directory (or --data-dir DIR)")
    return Path(dirs[0]).expanduser() if dirs else None


def _protocol_map(props: dict[str, str]) -> dict[str, str]:
    raw = props.get("listener.security.protocol.map", "")
    out = {p: p for p in _PROTOCOLS}
    for entry in (e.strip() for e in raw.split(",") if e.strip()):
        name, sep, proto = entry.partition(":")
        if not sep or proto.strip().upper() not in _PROTOCOLS:
            raise ConfigError(f"Invalid value {raw} for configuration listener.security.protocol.map: "
                              f"expected NAME:PROTOCOL pairs, got {entry!r}")
        out[name.strip().upper()] = proto.strip().upper()
    return out


def _listener_name(entry: str) -> str:
    return entry.split("://", 1)[0].strip().upper() if "://" in entry else ""


def _advertised(props: dict[str, str], served: set[str], controllers: set[str], out: ServerProperties) -> list[str]:
    """The advertised.listeners entries of served listeners; a controller listener's entry is
    KRaft's (listed as ignored); any other name is refused, as Kafka refuses it."""
    adv = [e.strip() for e in props.get("advertised.listeners", "").split(",") if e.strip()]
    stray = [e for e in adv if _listener_name(e) not in served and _listener_name(e) not in controllers]
    if stray:
        raise ConfigError(f"advertised.listeners listener names must be equal to or a subset of the ones defined "
                          f"in listeners; not served: {', '.join(stray)}")
    out.ignored += [f"advertised.listeners {e} (controller listener)" for e in adv if _listener_name(e) in controllers]
    return [e for e in adv if _listener_name(e) in served]


def _listeners(props: dict[str, str], out: ServerProperties) -> None:
    """One PLAINTEXT or SASL_PLAINTEXT broker listener becomes the listen address; several, or TLS
    ones, become the ``listeners`` config; controller listeners are KRaft's (listed as ignored)."""
    entries = [e.strip() for e in props.get("listeners", "").split(",") if e.strip()]
    if not entries:
        return
    controllers = {n.strip().upper() for n in props.get("controller.listener.names", "").split(",") if n.strip()}
    protocols = _protocol_map(props)
    served = []
    for entry in entries:
        name = _listener_name(entry)
        if not name:
            raise ConfigError(f"Invalid value {props['listeners']} for configuration listeners: "
                              f"expected NAME://HOST:PORT entries, got {entry!r}")
        if name in controllers:
            out.ignored.append(f"listeners {entry} (controller listener: kcli has no KRaft quorum)")
        else:
            served.append((name, entry))
    if not served:
        return
    name, entry = served[0]
    protocol = protocols.get(name)
    if len(served) > 1 or protocol not in SERVED_PROTOCOLS:
        # Several listeners, or a TLS one: Kafka's form, served as the broker's `listeners`
        # config (kcli/broker/listeners.py checks names, protocols and key material).
        out.configs["listeners"] = ",".join(e for _, e in served)
        if "listener.security.protocol.map" in props:
            out.configs["listener.security.protocol.map"] = props["listener.security.protocol.map"]
        adv = _advertised(props, {n for n, _ in served}, controllers, out)
        if adv:
            out.configs["advertised.listeners"] = ",".join(adv)
        return
    address = entry.split("://", 1)[1]
    if address.startswith(":"):  # Kafka: an empty host binds every interface
        address = "0.0.0.0" + address
    out.listen = f"{protocol}://{address}"
    adv = _advertised(props, {name, ""}, controllers, out)
    if adv:  # the broker advertises its served listener; a CONTROLLER entry is KRaft's
        out.configs["advertised.listeners"] = ",".join(adv)


def _node_id(props: dict[str, str]) -> None:
    """Kafka refuses node.id and broker.id that disagree."""
    if "node.id" in props and "broker.id" in props and _int("node.id", props["node.id"]) != _int("broker.id", props["broker.id"]):
        raise ConfigError(f"node.id ({props['node.id']}) and broker.id ({props['broker.id']}) must be the same")


def translate(props: dict[str, str]) -> ServerProperties:
    """Kafka settings → kcli's; ConfigError (one line, naming the setting) on what cannot be served."""
    out = ServerProperties()
    _node_id(props)
    _resolve_time_units(props, out)
    out.data_dir = _data_dir(props)
    _listeners(props, out)
    timed = {n for n, _ in sum(_TIME_UNITS.values(), ())}
    prefixes = {p[0]: props.get(p[0], p[1]) for p in (_RSM_PREFIX, _RLMM_PREFIX)}
    for name, raw in props.items():
        if name in _CONSUMED or name in timed or name in _TIME_UNITS or name == "advertised.listeners" and props.get("listeners"):
            continue
        mapped = next((target + name[len(prefixes[key]):] for key, _, target in (_RSM_PREFIX, _RLMM_PREFIX)
                       if prefixes[key] and name.startswith(prefixes[key])), None)
        if mapped is not None:
            out.configs[mapped] = raw
        elif name in BROKER_CONFIGS or name.startswith(PLUGIN_PREFIXES) or name.startswith(LISTENER_PREFIX):
            out.configs[name] = raw
        else:
            out.unknown.append(name)
            out.ignored.append(name)
    return out


def ignored_line(ignored: list[str], source: str) -> str:
    return f"{source}: ignoring settings kcli does not implement: {', '.join(ignored)}"
