"""The embedded default cluster the CLI uses when no bootstrap server or context is given,
and the checks before trusting a broker that another process runs on the default data dir.

``DIR/broker.json`` only says that *some* broker once served DIR: its pid may since belong to
another process and its port to another broker (or cluster). So before kcli uses it, the data
dir's lock must be held (a broker really serves DIR) and the broker at that address must report
the cluster id that DIR's metadata log holds. Anything else is refused, never "fixed" by
booting a second broker on the same dir.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path

from kcli.config.broker_config import BrokerConfig
from kcli.broker.runner import EmbeddedBroker, default_data_dir, load_settings, running_broker_address
from kcli.config.server_properties import ignored_line
from kcli.contexts import ContextsConfig
from kcli.errors import OperationError

__all__ = ["EmbeddedBroker", "EmbeddedSettings", "RunningBroker", "data_dir_cluster_id", "default_data_dir",
           "embedded_settings", "running_broker", "running_broker_address"]

PROBE_TIMEOUT_S = 5.0  # for the cluster-id question to a broker that already accepted a connection


@dataclass(frozen=True)
class RunningBroker:
    """A broker another process runs on the data dir, checked to be that dir's cluster."""

    bootstrap: str
    pid: int
    cluster_id: str


@dataclass(frozen=True)
class EmbeddedSettings:
    config: BrokerConfig
    notes: list[str]  # what was not applied, for -v


def embedded_settings(contexts: ContextsConfig) -> EmbeddedSettings:
    """The embedded broker's configs from the contexts file's ``embedded-broker:`` section, read
    like `kcli broker start --config-file F --config k=v` (same names, same precedence). It keeps
    the default data dir and a free loopback port, so log.dirs and listeners there are not used."""
    section = contexts.embedded_broker
    where = f"embedded-broker in {contexts.path}"
    settings = load_settings(section.config, section.config_file, source=where)
    notes = [ignored_line(settings.ignored, where)] if settings.ignored else []
    if settings.data_dir is not None:
        notes.append(f"{where}: log.dirs not used: the embedded broker keeps {default_data_dir()} ($KCLI_DATA_DIR)")
    return EmbeddedSettings(settings.config, notes)


def data_dir_lock_held(data_dir: Path) -> bool:
    """True when some process holds the broker's lock on ``data_dir`` (``.lock``, flock).

    Probed with a shared, non-blocking lock that is released at once, so at worst a broker
    starting in that very instant sees the dir as busy and says so; it never loses data.
    """
    try:
        fd = os.open(Path(data_dir) / ".lock", os.O_RDONLY)
    except OSError:
        return False  # no lock file: no broker ever started here
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def data_dir_cluster_id(data_dir: Path) -> str | None:
    """The cluster id in ``data_dir``'s metadata log (its ClusterIdRecord), read without changing it."""
    from kcli.crcjson import decode_line

    path = Path(data_dir) / "__cluster_metadata" / "metadata.log"
    try:
        with open(path, "rb") as f:
            for line in f:
                rec = decode_line(line.rstrip(b"\n"))
                if rec is not None and rec.get("type") == "ClusterIdRecord":
                    return str(rec["data"]["clusterId"])
    except (OSError, KeyError, TypeError):
        return None
    return None


def reported_cluster_id(bootstrap: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """The cluster id the broker at ``bootstrap`` answers in a Metadata response (no topics)."""
    from kcli.protocol.client import WireClient

    with WireClient(bootstrap, timeout=timeout_s) as client:
        response = client.request(3, 12, {"topics": [], "allow_auto_topic_creation": False,
                                          "include_topic_authorized_operations": False})
    return response.cluster_id


def running_broker(data_dir: Path) -> RunningBroker | None:
    """The broker serving ``data_dir`` in another process, or None when no broker serves it.

    None also when broker.json names a live pid and an answering port but nothing holds the
    data dir's lock: the file is stale and the caller may start its own broker there. A held
    lock with a broker that reports another cluster id is an OperationError naming both ids.
    """
    data_dir = Path(data_dir)
    address = running_broker_address(data_dir)
    if address is None or not data_dir_lock_held(data_dir):
        return None
    try:
        pid = int(json.loads((data_dir / "broker.json").read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # replaced or removed since: the broker is stopping
    expected = data_dir_cluster_id(data_dir)
    try:
        reported = reported_cluster_id(address)
    except Exception as err:  # refused, closed, or not Kafka at all: all mean "not this broker"
        raise OperationError(f"{data_dir / 'broker.json'} names {address} (pid {pid}), which does not answer "
                             f"as a Kafka broker ({err}); stop the broker serving {data_dir} and retry") from None
    if expected is None or reported != expected:
        raise OperationError(
            f"the broker at {address} (pid {pid}, from {data_dir / 'broker.json'}) reports cluster id "
            f"{reported}, but {data_dir} holds cluster id {expected}: refusing to use another cluster's "
            f"broker; stop the broker serving {data_dir} or give --bootstrap-server")
    return RunningBroker(address, pid, reported)
