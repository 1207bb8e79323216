"""Running a broker: in the foreground (`kcli broker start`) or embedded in a thread."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kcli.broker.broker import Broker, DataDirError
from kcli.config.broker_config import BrokerConfig, read_properties
from kcli.config.definitions import ConfigError
from kcli.broker.listeners import Listener, parse_listeners
from kcli.config.server_properties import translate
from kcli.errors import OperationError, UsageError

if TYPE_CHECKING:
    from kcli.broker.prometheus import MetricsExporter

log = logging.getLogger("kcli.broker")


def default_data_dir() -> Path:
    """$KCLI_DATA_DIR, else $XDG_DATA_HOME/kcli/data, else ~/.local/share/kcli/data."""
    env = os.environ.get("KCLI_DATA_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "kcli" / "data"


LISTEN_SCHEMES = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
DEFAULT_LISTEN = "127.0.0.1:9092"


def parse_listen(value: str, flag: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` or ``[v6]:PORT``, optionally ``PROTOCOL://``; port 0 picks a free one."""
    v = value.strip()
    for scheme in LISTEN_SCHEMES:
        if v.upper().startswith(scheme + "://"):
            v = v[len(scheme) + 3:]
    if v.startswith("["):
        host, _, rest = v[1:].partition("]")
        port_s = rest.lstrip(":")
    else:
        host, sep, port_s = v.rpartition(":")
        if not sep:
            raise UsageError(f"{flag} expects HOST:PORT, got {value!r}")
    try:
        port = int(port_s)
    except ValueError:
        raise UsageError(f"{flag} expects HOST:PORT with a numeric port, got {value!r}") from None
    if not 0 <= port <= 65535:
        raise UsageError(f"{flag} port must be 0..65535, got {port}")
    return host or "127.0.0.1", port


DEFAULT_LISTEN = "127.0.0.1:9092"


@dataclass
class BrokerSettings:
    """Everything `kcli broker start` runs with, after the file, --config and the flags are merged."""

    config: BrokerConfig
    data_dir: Path | None  # None: the default data dir
    listen: str
    ignored: list[str]  # config-file settings kcli does not implement (warned about at start)


def load_settings(pairs: list[str] | dict[str, str], config_file: Path | None, extra: dict[str, str] | None = None,
                  *, data_dir: Path | None = None, listen: str | None = None, strict: bool = False,
                  source: str | None = None) -> BrokerSettings:
    """Precedence: the explicit flags (``extra``, ``data_dir``, ``listen``) over ``--config`` pairs
    over the properties file. Each source is read as Kafka reads it (``log.retention.hours``,
    ``log.dirs``, ``listeners``...); unknown names in ``--config`` are refused (a typo on the
    command line), in the file they are listed as ignored, or refused with ``strict``."""
    try:
        file_props = read_properties(config_file) if config_file is not None else {}
        if isinstance(pairs, dict):
            given = dict(pairs)
        else:
            given = {}
            for pair in pairs:
                if "=" not in pair:
                    raise UsageError(f"--config expects key=value, got {pair!r}")
                k, v = pair.split("=", 1)
                given[k.strip()] = v.strip()
        if listen is not None and "listeners" in given:
            raise ConfigError("give either --listen or --config listeners=NAME://HOST:PORT,..., not both")
        from_file = translate(file_props)
        from_flags = translate(given)
        if from_flags.unknown:
            prefix = f"{source}: " if source else ""
            raise ConfigError(f"{prefix}Unknown broker config name: {', '.join(from_flags.unknown)}")
        ignored = from_file.ignored + from_flags.ignored
        if strict and ignored:
            where = source or (str(config_file) if config_file is not None else "--config")
            raise ConfigError(f"{where}: settings kcli does not implement (--strict): {', '.join(ignored)}")
        if (listen or from_flags.listen) and from_file.listen and "advertised.listeners" not in given:
            # the file's advertised address belongs to the file's listener, which was replaced
            from_file.configs.pop("advertised.listeners", None)
        if listen or from_flags.listen or "listeners" in from_flags.configs:
            # flags over the file: the file's listeners (Kafka's several-listener form) go with it
            for key in ("listeners", "listener.security.protocol.map"):
                from_file.configs.pop(key, None)
            if "advertised.listeners" not in given:
                from_file.configs.pop("advertised.listeners", None)
        values = {**from_file.configs, **from_flags.configs, **(extra or {})}
        chosen = listen or from_flags.listen or (None if "listeners" in values else from_file.listen or DEFAULT_LISTEN)
        return BrokerSettings(BrokerConfig(values), data_dir or from_flags.data_dir or from_file.data_dir, chosen, ignored)
    except ConfigError as err:
        raise UsageError(str(err)) from None


def build_config(pairs: list[str], config_file: Path | None, extra: dict[str, str] | None = None) -> BrokerConfig:
    return load_settings(pairs, config_file, extra).config


def _is_loopback(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    import ipaddress

    return all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def _check_listener_protocol(listen: str, sasl: bool) -> None:
    """An explicit ``SASL_*://`` / ``PLAINTEXT://`` / ``SSL://`` must agree with the SASL configs."""
    scheme = listen.strip().split("://", 1)[0].upper() if "://" in listen else ""
    if scheme.startswith("SASL_") and not sasl:
        raise UsageError(f"--listen {scheme}://... needs sasl.enabled.mechanisms=PLAIN and sasl.plain.users.file")
    if scheme in ("PLAINTEXT", "SSL") and sasl:
        raise UsageError(f"--listen {scheme}://... but sasl.enabled.mechanisms is set: use SASL_{scheme}://HOST:PORT")


def resolve_listeners(listen: str | None, config: BrokerConfig) -> tuple[list[Listener], bool]:
    """The broker's listeners: ``--config listeners=...`` (Kafka's form, several at once) or the
    one ``--listen`` listener. Also returns whether they came from the ``listeners`` config."""
    if "listeners" in config.explicit:
        if listen is not None:
            raise UsageError("give either --listen or --config listeners=NAME://HOST:PORT,..., not both")
        try:
            return parse_listeners(config), True
        except ConfigError as err:
            raise UsageError(str(err)) from None
    listen = listen or DEFAULT_LISTEN
    host, port = parse_listen(listen)
    sasl = bool(config.get("sasl.enabled.mechanisms"))
    _check_listener_protocol(listen, sasl)
    scheme = listen.strip().split("://", 1)[0].upper() if "://" in listen else ""
    proto = scheme or ("SASL_PLAINTEXT" if sasl else "PLAINTEXT")
    return [Listener(proto, proto, host, port)], False


def run_foreground(data_dir: Path, listen: str | None, config: BrokerConfig, metrics_listen: str | None = None,
                   log_format: str | None = None) -> int:
    """Serve until SIGINT/SIGTERM; print the listening line(s) once connections are accepted:
    ``kcli broker listening on HOST:PORT`` for the ``--listen`` listener, one
    ``kcli broker listening on NAME://HOST:PORT`` per listener of ``--config listeners=...``
    (with ``log_format`` json, by default the format the log was configured with: one JSON log
    object each, :func:`announce_listening`)."""
    listeners, named = resolve_listeners(listen, config)
    metrics_at = metrics_address(metrics_listen, config)
    for li in listeners:
        if not li.sasl and not _is_loopback(li.host):
            sys.stderr.write(f"kcli: warning: listening on non-loopback address {li.host} without authentication\n")

    async def main() -> None:
        try:
            from kcli.broker.server import KafkaServer  # protocol stack: loaded only to serve

            broker = Broker(data_dir, config, server_factory=KafkaServer, listeners=listeners)
        except ConfigError as err:  # e.g. a missing or malformed SASL users file, a TLS key that does not load
            raise UsageError(str(err)) from None
        try:
            await broker.start()
        except DataDirError as err:
            raise OperationError(str(err)) from None
        except OSError as err:
            await broker.close()
            # asyncio's strerror repeats the address; a resolver error has a negative errno
            reason = os.strerror(err.errno) if err.errno and err.errno > 0 else (err.strerror or str(err))
            where = ", ".join(f"{li.host}:{li.port}" for li in listeners)
            raise OperationError(f"cannot listen on {where}: {reason}") from None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # before the line: a signal right after it stops cleanly
            loop.add_signal_handler(sig, lambda s=sig: (received.append(s), stop.set()))
        exporter = await start_exporter(broker, metrics_at)
        started_log(broker, exporter)
        announce_listening(broker, named, log_format)
        await stop.wait()
        log.info("[KafkaServer id=%d] shutting down", broker.node_id, extra={"event": "broker.stopping"})
        if exporter is not None:
            await exporter.close()
        await broker.close()
        log.info("[KafkaServer id=%d] shut down completed", broker.node_id, extra={"event": "broker.stopped"})

    received: list[int] = []
    asyncio.run(main())
    # Ctrl-C: 130, as a shell reports it; SIGTERM (a service manager's stop) is a clean exit.
    return 128 + signal.SIGINT if received[:1] == [signal.SIGINT] else 0


LISTENING_PREFIX = "kcli broker listening on "
LISTENING_EVENT = "broker.listening"


def announce_listening(broker: Broker, named: bool, log_format: str | None = None) -> None:
    """Tell whoever started the broker, on stdout, where it listens, one line per listener:
    ``kcli broker listening on HOST:PORT`` (``NAME://HOST:PORT`` with ``--config listeners=...``).
    With ``--log-format json`` each line is a JSON log object instead, like every other line of
    the log it may land in (``--daemon`` and `kcli cluster start` send stdout there too): the same
    words as ``message``, ``event`` ``broker.listening``, and ``listener``, ``host``, ``port``."""
    from kcli.broker.logsetup import JsonFormatter, configured_format

    log_format = log_format or configured_format()
    for li, h, p in broker.bound:
        address = f"{li.name}://{h}:{p}" if named else f"{h}:{p}"
        if log_format == "json":
            record = logging.LogRecord(log.name, logging.INFO, __file__, 0, LISTENING_PREFIX + address, None, None)
            record.__dict__.update(event=LISTENING_EVENT, node_id=broker.node_id, listener=li.name, host=h, port=p)
            sys.stdout.write(JsonFormatter().format(record) + "\n")
        else:
            sys.stdout.write(LISTENING_PREFIX + address + "\n")
    sys.stdout.flush()


def parse_listening(line: str) -> str | None:
    """The address a listening line announces (``HOST:PORT`` or ``NAME://HOST:PORT``), in the text
    or the JSON form of :func:`announce_listening`; None for any other line."""
    text = line.strip()
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError:
            return None
        if not isinstance(obj, dict) or obj.get("event") != LISTENING_EVENT:
            return None
        text = str(obj.get("message", ""))
    return text[len(LISTENING_PREFIX):].strip() if text.startswith(LISTENING_PREFIX) else None


def started_log(broker: Broker, exporter: "MetricsExporter | None") -> None:
    """Kafka's "[KafkaServer id=N] started" line, with what an operator checks first."""
    listeners = [f"{li.name}://{h}:{p}" for li, h, p in broker.bound]
    log.info("[KafkaServer id=%d] started: listeners %s, cluster id %s, data dir %s%s", broker.node_id, ",".join(listeners),
             broker.cluster_id, broker.data_dir, f", metrics http://{exporter.address}/metrics" if exporter else "",
             extra={"event": "broker.started", "node_id": broker.node_id, "listeners": listeners,
                    "cluster_id": broker.cluster_id, "data_dir": str(broker.data_dir),
                    "metrics_listen": exporter.address if exporter else None})


def metrics_address(metrics_listen: str | None, config: BrokerConfig) -> tuple[str, int] | None:
    """HOST, PORT of the Prometheus endpoint: --metrics-listen, else broker config metrics.listen."""
    if metrics_listen:
        return parse_listen(metrics_listen, "--metrics-listen")
    if config.get_str("metrics.listen"):
        return parse_listen(config.get_str("metrics.listen"), "metrics.listen")
    return None


async def start_exporter(broker: Broker, address: tuple[str, int] | None) -> "MetricsExporter | None":
    """Serve the Prometheus endpoint on ``address`` (None: no endpoint)."""
    if address is None:
        return None
    from kcli.broker.prometheus import MetricsExporter

    host, port = address
    exporter = MetricsExporter(broker, host, port)
    try:
        await exporter.start()
    except OSError as err:
        await broker.close()
        reason = os.strerror(err.errno) if err.errno and err.errno > 0 else (err.strerror or str(err))
        raise OperationError(f"cannot listen for metrics on {host}:{port}: {reason}") from None
    return exporter


class EmbeddedBroker:
    """A broker on its own event loop thread, for the duration of a ``with`` block."""

    def __init__(self, data_dir: Path, config: BrokerConfig | None = None, listen: str = "127.0.0.1:0") -> None:
        self.data_dir = Path(data_dir)
        self.config = config or BrokerConfig()
        self.host, self.port = parse_listen(listen)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._broker: Broker | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.bootstrap = ""

    def __enter__(self) -> str:
        self._thread = threading.Thread(target=self._run, name="kcli-embedded-broker", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            if isinstance(self._error, DataDirError):
                raise OperationError(str(self._error))
            raise self._error
        return self.bootstrap

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as err:  # surfaced to __enter__
            self._error = self._error or err
            self._ready.set()
        finally:
            loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        from kcli.broker.server import KafkaServer  # protocol stack: loaded only to serve

        self._broker = Broker(self.data_dir, self.config, self.host, self.port, server_factory=KafkaServer)
        try:
            h, p = await self._broker.start()
        except BaseException as err:
            self._error = err
            self._ready.set()
            return
        self.bootstrap = f"{h}:{p}"
        self._ready.set()
        await self._stop.wait()
        await self._broker.close()

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=30)


def running_broker_address(data_dir: Path) -> str | None:
    """host:port of a live broker serving ``data_dir``, from its runtime file, else None."""
    import json

    info_path = Path(data_dir) / "broker.json"
    try:
        info = json.loads(info_path.read_text())
        pid = int(info["pid"])
        os.kill(pid, 0)
        with socket.create_connection((info["host"], int(info["port"])), timeout=1):
            pass
        return f"{info['host']}:{info['port']}"
    except (OSError, ValueError, KeyError, TypeError):
        return None


def configure_logging(verbose: bool, level: str | None = None, fmt: str = "text") -> None:
    """The broker logs at INFO by default, as Kafka does (``--log-level`` changes it)."""
    from kcli.broker.logsetup import configure

    configure(level or "INFO", fmt)
