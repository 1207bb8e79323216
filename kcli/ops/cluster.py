"""`kcli cluster start|status|stop`: a local cluster for trying things out, in one directory.

Layout of the cluster directory ``D``::

    D/cluster.json         what was started: PostgreSQL (port, url), brokers (node id, rack, port,
                           metrics port, pid), object store; read by status/stop, and by start to
                           restart a stopped cluster
    D/postgres/            the PostgreSQL server kcli runs itself (kcli/cluster/pgserver.py)
    D/broker-N/            broker N's data dir; its output in D/broker-N/broker.log
    D/objects/             the shared object store (file:// default)
    D/.cluster.lock        held while start or stop works on D (two at once would race)

A restart reuses the node ids, ports (the brokers', their Prometheus endpoints', PostgreSQL's),
database and data dirs recorded in cluster.json: a broker
always starts on the data dir it once accepted. A process is only signalled after checking that
it is the broker of that data dir (its command line names the dir), never on a recorded pid alone:
pids are reused.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kcli.errors import OperationError, UsageError
from kcli.ports import free_ports, port_free

CLUSTER_FILE = "cluster.json"
LOCK_FILE = ".cluster.lock"
FORMAT_VERSION = 1
DATABASE = "kcli"
HOST = "127.0.0.1"
DEFAULT_BROKERS = 3
DEFAULT_RACKS = ("a", "b", "c")
# Each broker keeps up to 12 PostgreSQL sessions (metadata pool 4, coordinator pool 4, offsets
# pool 2, LISTEN, controller lock); the server allows 200.
MAX_BROKERS = 16
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
KILL_WAIT_S = 10.0
PROBE_TIMEOUT_S = 5.0
POLL_S = 0.3
CLUSTER_DIR_ENV = "KCLI_CLUSTER_DIR"
_RACK_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

Progress = Callable[[str], None]


def default_cluster_dir() -> Path:
    """$KCLI_CLUSTER_DIR, else $XDG_DATA_HOME/kcli/cluster, else ~/.local/share/kcli/cluster
    (next to the embedded broker's default data dir, ``.../kcli/data``)."""
    env = os.environ.get(CLUSTER_DIR_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "kcli" / "cluster"


# --- records ------------------------------------------------------------------------------------


@dataclass
class BrokerEntry:
    """One broker of the cluster as launched (``pid`` is the last launch's)."""

    node_id: int
    rack: str
    host: str
    port: int
    data_dir: str
    log: str
    pid: int | None = None
    # Port of its Prometheus endpoint (--metrics-listen HOST:PORT), chosen at the first start and
    # kept; None only for a cluster.json written before kcli recorded one (a restart picks one).
    metrics_port: int | None = None

    @property
    def listener(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def metrics_listener(self) -> str | None:
        return f"{self.host}:{self.metrics_port}" if self.metrics_port else None

    @property
    def metrics_url(self) -> str | None:
        return f"http://{self.metrics_listener}/metrics" if self.metrics_port else None


@dataclass
class PostgresEntry:
    host: str
    port: int
    user: str
    database: str
    data_dir: str  # the server's pgdata

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.database}"


@dataclass
class ClusterFile:
    """The content of ``D/cluster.json``."""

    data_dir: str
    postgresql: PostgresEntry
    object_store: str
    brokers: list[BrokerEntry] = field(default_factory=list)
    configs: dict[str, str] = field(default_factory=dict)  # --config given to every broker

    @property
    def bootstrap(self) -> str:
        return ",".join(b.listener for b in self.brokers)

    def to_dict(self) -> dict[str, Any]:
        return {"version": FORMAT_VERSION, "data_dir": self.data_dir, "bootstrap": self.bootstrap,
                "postgresql": {**asdict(self.postgresql), "url": self.postgresql.url},
                "object_store": self.object_store,
                "brokers": [{**asdict(b), "listener": b.listener, "metrics_url": b.metrics_url} for b in self.brokers],
                "configs": dict(self.configs)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterFile:
        if int(data.get("version", 0)) > FORMAT_VERSION:
            raise ValueError(f"written by a newer kcli (format {data['version']}, this kcli reads {FORMAT_VERSION})")
        pg = data["postgresql"]
        return cls(data_dir=str(data["data_dir"]),
                   postgresql=PostgresEntry(str(pg["host"]), int(pg["port"]), str(pg["user"]), str(pg["database"]),
                                            str(pg["data_dir"])),
                   object_store=str(data["object_store"]),
                   brokers=[BrokerEntry(int(b["node_id"]), str(b["rack"]), str(b["host"]), int(b["port"]),
                                        str(b["data_dir"]), str(b["log"]), int(b["pid"]) if b.get("pid") else None,
                                        int(b["metrics_port"]) if b.get("metrics_port") else None)
                            for b in data["brokers"]],
                   configs={str(k): str(v) for k, v in (data.get("configs") or {}).items()})


@dataclass
class StartRequest:
    """What `kcli cluster start` was asked for; None means "the default" (or "as recorded" on a restart)."""

    brokers: int | None = None
    racks: list[str] | None = None
    object_store: str | None = None
    base_port: int | None = None
    timeout_s: float = START_TIMEOUT_S
    configs: dict[str, str] | None = None  # broker configs for every broker (--config KEY=VALUE)


@dataclass
class StartResult:
    cluster: ClusterFile
    restarted: bool
    started_brokers: list[int] = field(default_factory=list)  # node ids this call started
    started_postgresql: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {**self.cluster.to_dict(), "restarted": self.restarted, "started_brokers": self.started_brokers,
                "started_postgresql": self.started_postgresql}


@dataclass
class BrokerStatus:
    node_id: int
    rack: str
    listener: str
    pid: int | None
    alive: bool
    registered: bool
    log: str
    metrics_url: str | None  # its Prometheus endpoint (None: not recorded)


@dataclass
class ClusterStatus:
    data_dir: str
    postgresql_url: str
    postgresql_up: bool
    bootstrap: str
    brokers: list[BrokerStatus]

    @property
    def up(self) -> bool:
        return self.postgresql_up and all(b.alive and b.registered for b in self.brokers)

    def problems(self) -> list[str]:
        out = [] if self.postgresql_up else ["PostgreSQL is down"]
        for b in self.brokers:
            if not b.alive:
                out.append(f"broker {b.node_id} is not running")
            elif not b.registered:
                out.append(f"broker {b.node_id} is not registered")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"data_dir": self.data_dir, "up": self.up, "bootstrap": self.bootstrap,
                "postgresql": {"url": self.postgresql_url, "up": self.postgresql_up},
                "brokers": [asdict(b) for b in self.brokers]}


@dataclass
class StopResult:
    data_dir: str
    stopped_brokers: list[int]
    killed_brokers: list[int]
    postgresql_stopped: bool

    @property
    def already_stopped(self) -> bool:
        return not self.stopped_brokers and not self.postgresql_stopped

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "already_stopped": self.already_stopped}


# --- input --------------------------------------------------------------------------------------


def parse_racks(text: str) -> list[str]:
    """``a,b,c`` → ``["a", "b", "c"]``; anything else is a UsageError (exit 2)."""
    racks = [r.strip() for r in text.split(",")]
    if not racks or not all(_RACK_RE.match(r) for r in racks):
        raise UsageError(f"--racks expects comma-separated rack names (letters, digits, '.', '_', '-'), "
                         f"e.g. a,b,c; got {text!r}")
    return racks


# Broker configs the launcher sets itself, per broker or for the whole cluster.
OWNED_CONFIGS = frozenset({"node.id", "broker.id", "broker.rack", "listeners", "advertised.listeners", "metrics.listen",
                           "listener.security.protocol.map", "log.dir", "log.dirs", "kcli.cluster.url",
                           "diskless.storage.uri", "diskless.coordinator.class.name", "diskless.coordinator.url"})


def check_configs(configs: dict[str, str]) -> dict[str, str]:
    """The ``--config`` settings for every broker of the cluster, checked as `kcli broker start`
    checks them (an unknown name or a bad value is a UsageError, exit 2); the settings the
    launcher gives each broker itself are refused rather than silently overridden."""
    from kcli.broker.runner import load_settings

    owned = sorted(set(configs) & OWNED_CONFIGS)
    if owned:
        raise UsageError(f"--config {owned[0]}: kcli cluster start sets it for each broker (node ids, racks, ports, "
                         "data dirs, the database and object store come from its own options)")
    load_settings(configs, None, source="--config")
    return configs


def check_request(req: StartRequest) -> None:
    """Refuse bad values before anything is created or started (exit 2)."""
    if req.brokers is not None and not 1 <= req.brokers <= MAX_BROKERS:
        raise UsageError(f"--brokers expects 1..{MAX_BROKERS}, got {req.brokers}")
    n = req.brokers or DEFAULT_BROKERS
    if req.base_port is not None and not 1 <= req.base_port <= 65536 - n:
        raise UsageError(f"--base-port expects 1..{65536 - n} (the brokers take ports P..P+{n - 1}), got {req.base_port}")
    if req.timeout_s <= 0:
        raise UsageError(f"--timeout expects a positive number of seconds, got {req.timeout_s:g}")
    if req.object_store is not None:
        from plugins.objectstore import StorageBackendException, from_uri

        try:
            from_uri(req.object_store).close()
        except StorageBackendException as err:
            raise UsageError(f"--object-store: {err}") from None


# --- start --------------------------------------------------------------------------------------


def start(data_dir: Path, req: StartRequest, progress: Progress | None = None) -> StartResult:
    """Start a new cluster in ``data_dir``, or restart the one recorded there: all of it when it
    was stopped, or only its parts that are down (a broker killed, PostgreSQL stopped), the
    running ones left as they are, as an operator restarts a failed broker.

    Refused (OperationError, nothing touched) when every part of the cluster there runs or the
    directory holds something else. On any failure everything started by this call is stopped
    again, and a new cluster's files are removed, before the error is raised.
    """
    check_request(req)
    say = progress or (lambda _m: None)
    data_dir = Path(data_dir).expanduser().absolute()
    created_dir = not data_dir.exists()
    new_cluster_failed = False
    try:
        with _exclusive(data_dir):
            existing = load_cluster_file(data_dir) if (data_dir / CLUSTER_FILE).exists() else None
            if existing is not None:
                running, pg_up = _running_parts(existing)
                _refuse_changes(existing, req)
                launched = _launch(existing, req.timeout_s, say, fresh=False, running=running, pg_up=pg_up)
                return StartResult(launched, restarted=True,
                                   started_brokers=[b.node_id for b in existing.brokers if b.node_id not in running],
                                   started_postgresql=not pg_up)
            leftovers = sorted(p.name for p in data_dir.iterdir() if p.name != LOCK_FILE)
            if leftovers:
                raise OperationError(f"{data_dir} is not empty and holds no {CLUSTER_FILE} "
                                     f"({', '.join(leftovers[:5])}): give an empty or new --data-dir")
            cluster = _plan(data_dir, req)
            try:
                return StartResult(_launch(cluster, req.timeout_s, say, fresh=True), restarted=False,
                                   started_brokers=[b.node_id for b in cluster.brokers])
            except BaseException:
                new_cluster_failed = True
                _remove_new_cluster(data_dir)
                raise
    except BaseException:
        if created_dir and (new_cluster_failed or not any(p.name != LOCK_FILE for p in _children(data_dir))):
            shutil.rmtree(data_dir, ignore_errors=True)  # made by this call, holds nothing else
        raise


def _children(directory: Path) -> list[Path]:
    try:
        return list(directory.iterdir())
    except OSError:
        return []


def _plan(data_dir: Path, req: StartRequest) -> ClusterFile:
    """Node ids, racks, ports and paths of a new cluster (nothing started yet)."""
    from kcli.cluster.pgserver import (
        DB_USER,
        check_reachable,
        require_bin_dir,
        server_os_user,
    )

    require_bin_dir()  # "install postgresql" before anything is created
    as_user = server_os_user()
    if as_user is not None:
        check_reachable(data_dir, as_user)  # data_dir itself gets o+x (_open_for_postgres)
    n = req.brokers or DEFAULT_BROKERS
    racks = req.racks or list(DEFAULT_RACKS)
    if req.base_port is not None:
        ports = list(range(req.base_port, req.base_port + n))
        busy = [p for p in ports if not port_free(p, HOST)]
        if busy:
            raise OperationError(f"port{'s' if len(busy) > 1 else ''} {', '.join(map(str, busy))} on {HOST} "
                                 f"{'are' if len(busy) > 1 else 'is'} in use: choose another --base-port")
    else:
        ports = free_ports(n, HOST)
    pg_port = free_ports(1, HOST, avoid=ports)[0]
    metrics_ports = free_ports(n, HOST, avoid=[*ports, pg_port])  # kept across restarts, like the others
    object_store = req.object_store or (data_dir / "objects").as_uri()
    brokers = [BrokerEntry(node_id=i, rack=racks[(i - 1) % len(racks)], host=HOST, port=ports[i - 1],
                           data_dir=str(data_dir / f"broker-{i}"), log=str(data_dir / f"broker-{i}" / "broker.log"),
                           metrics_port=metrics_ports[i - 1])
               for i in range(1, n + 1)]
    return ClusterFile(str(data_dir), PostgresEntry(HOST, pg_port, DB_USER, DATABASE, str(data_dir / "postgres" / "pgdata")),
                       object_store, brokers, dict(req.configs or {}))


def _launch(cluster: ClusterFile, timeout_s: float, say: Progress, fresh: bool,
            running: dict[int, int] | None = None, pg_up: bool = False) -> ClusterFile:
    """Start PostgreSQL (unless ``pg_up``) and the brokers (but those ``running``: node id → pid),
    wait until every broker of the cluster lists them all, record the pids. On failure (or
    Ctrl-C) stop what this call started, then raise."""
    from kcli.cluster.pgserver import PgServer, init_server

    data_dir = Path(cluster.data_dir)
    deadline = time.monotonic() + timeout_s
    pg_entry = cluster.postgresql
    running = running or {}
    procs: list[tuple[BrokerEntry, subprocess.Popen[bytes]]] = []
    server: PgServer | None = None
    try:
        if fresh:
            _open_for_postgres(data_dir)
            say(f"initialising PostgreSQL in {Path(pg_entry.data_dir).parent}")
            server = init_server(Path(pg_entry.data_dir).parent, pg_entry.port, pg_entry.host)
        elif not pg_up:
            server = PgServer(pg_entry.host, pg_entry.port, pg_entry.user, Path(pg_entry.data_dir))
        if server is not None:  # None: it runs already, and a failure here leaves it running
            say(f"starting PostgreSQL on {pg_entry.host}:{pg_entry.port}")
            server.start(timeout=max(5.0, deadline - time.monotonic()))
        if fresh:
            server.create_database(pg_entry.database)
            if cluster.object_store.startswith("file:"):
                from plugins.objectstore import from_uri

                Path(from_uri(cluster.object_store).root).mkdir(parents=True, exist_ok=True)  # type: ignore[attr-defined]
        _assign_metrics_ports(cluster, running)
        for b in cluster.brokers:
            if b.node_id in running:
                b.pid = running[b.node_id]
                continue
            Path(b.data_dir).mkdir(parents=True, exist_ok=True)
            say(f"starting broker {b.node_id} (rack {b.rack}) on {b.listener}")
            procs.append((b, _spawn_broker(b, cluster)))
            b.pid = procs[-1][1].pid
        write_cluster_file(cluster)
        say("waiting for every broker to register")
        _wait_registered(cluster.brokers, procs, deadline, timeout_s)
        return cluster
    except BaseException:
        terminate([(b.node_id, proc.pid) for b, proc in procs if proc.poll() is None], STOP_TIMEOUT_S)
        for _, proc in procs:
            proc.poll()  # reap
        if server is not None:
            try:
                server.stop("fast")
            except OperationError:
                pass
        raise


def _assign_metrics_ports(cluster: ClusterFile, running: dict[int, int]) -> None:
    """A broker about to start that has no recorded metrics port (a cluster.json written before
    kcli recorded them) gets a free one, recorded from then on; recorded ones are kept."""
    missing = [b for b in cluster.brokers if b.metrics_port is None and b.node_id not in running]
    if missing:
        taken = [cluster.postgresql.port, *(b.port for b in cluster.brokers),
                 *(b.metrics_port for b in cluster.brokers if b.metrics_port)]
        for b, port in zip(missing, free_ports(len(missing), HOST, avoid=taken)):
            b.metrics_port = port


def _spawn_broker(b: BrokerEntry, cluster: ClusterFile) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "kcli", "broker", "start", "--cluster", cluster.postgresql.url,
            "--node-id", str(b.node_id), "--rack", b.rack, "--data-dir", b.data_dir, "--listen", b.listener,
            "--object-store", cluster.object_store, "--config", "diskless.system.enable=true"]
    if b.metrics_listener:
        args += ["--metrics-listen", b.metrics_listener]
    for key, value in cluster.configs.items():  # after the default above: a --config may override it
        args += ["--config", f"{key}={value}"]
    return spawn_detached(args, Path(b.log))


def spawn_detached(args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start ``args`` with stdout and stderr appended to ``log_path``, in its own session: the
    process outlives this command and no terminal's Ctrl-C reaches it."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)


def _wait_registered(brokers: list[BrokerEntry], procs: list[tuple[BrokerEntry, subprocess.Popen[bytes]]],
                     deadline: float, timeout_s: float) -> None:
    """Until every broker's Metadata lists every node id; a broker started here (``procs``) that
    exits fails at once."""
    expected = {b.node_id for b in brokers}
    pending = set(expected)
    while True:
        for b, proc in procs:
            rc = proc.poll()
            if rc is not None:
                raise OperationError(f"broker {b.node_id} exited (code {rc}) before it joined: "
                                     f"{log_cause(Path(b.log))} (log {b.log})")
        for b in brokers:
            if b.node_id in pending:
                listed = metadata_brokers(b.listener, min(PROBE_TIMEOUT_S, max(0.5, deadline - time.monotonic())))
                if listed is not None and expected <= set(listed):
                    pending.discard(b.node_id)
        if not pending:
            return
        if time.monotonic() >= deadline:
            ids = ", ".join(map(str, sorted(pending)))
            raise OperationError(f"broker{'s' if len(pending) > 1 else ''} {ids} did not see every broker "
                                 f"registered within {timeout_s:g} s (logs: {Path(brokers[0].log).parent.parent}/"
                                 f"broker-N/broker.log)")
        time.sleep(POLL_S)


def metadata_brokers(listener: str, timeout_s: float = PROBE_TIMEOUT_S) -> dict[int, str] | None:
    """node id → host:port of the live brokers the broker at ``listener`` lists, None if it does not answer."""
    from kcli.protocol.client import WireClient

    try:
        with WireClient(listener, timeout=timeout_s) as client:
            response = client.request(3, 12, {"topics": [], "allow_auto_topic_creation": False,
                                              "include_topic_authorized_operations": False})
    except Exception:  # noqa: BLE001 - refused, closed, timed out, not Kafka: all "does not answer"
        return None
    return {int(b.node_id): f"{b.host}:{b.port}" for b in response.brokers}


def log_cause(log: Path) -> str:
    """The broker's own error line from its log, else its last line."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    errors = [ln for ln in lines if ln.startswith("kcli: error:")]
    return (errors or lines or ["no output"])[-1][:400]


def _running_parts(cluster: ClusterFile) -> tuple[dict[int, int], bool]:
    """The brokers that run (node id → pid) and whether PostgreSQL does; refused when all do."""
    from kcli.cluster.pgserver import PgServer

    running = {b.node_id: pid for b in cluster.brokers if (pid := broker_pid(b)) is not None}
    pg = cluster.postgresql
    pg_up = PgServer(pg.host, pg.port, pg.user, Path(pg.data_dir)).running()
    if pg_up and len(running) == len(cluster.brokers):
        live = ", ".join(map(str, sorted(running)))
        raise OperationError(f"a cluster is already running in {cluster.data_dir} (broker{'s' if len(running) > 1 else ''}"
                             f" {live} and PostgreSQL): see `kcli cluster status --data-dir {cluster.data_dir}`,"
                             " or stop it first")
    return running, pg_up


def _refuse_changes(cluster: ClusterFile, req: StartRequest) -> None:
    """A restart (whole or of the parts that are down) keeps what was recorded; asking for
    something else is refused, not silently ignored."""
    changes = []
    if req.brokers is not None and req.brokers != len(cluster.brokers):
        changes.append(f"--brokers {req.brokers} (it has {len(cluster.brokers)})")
    if req.racks is not None and [b.rack for b in cluster.brokers] != [req.racks[i % len(req.racks)] for i in range(len(cluster.brokers))]:
        changes.append(f"--racks {','.join(req.racks)} (it has {','.join(b.rack for b in cluster.brokers)})")
    if req.object_store is not None and req.object_store.rstrip("/") != cluster.object_store.rstrip("/"):
        changes.append(f"--object-store {req.object_store} (it has {cluster.object_store})")
    if req.base_port is not None and req.base_port != cluster.brokers[0].port:
        changes.append(f"--base-port {req.base_port} (it has {cluster.brokers[0].port})")
    if req.configs is not None and req.configs != cluster.configs:
        given = " ".join(f"--config {k}={v}" for k, v in req.configs.items())
        has = " ".join(f"{k}={v}" for k, v in cluster.configs.items()) or "no --config"
        changes.append(f"{given} (it has {has})")
    if changes:
        raise OperationError(f"{cluster.data_dir} holds a cluster started differently: {'; '.join(changes)}; "
                             "start it as it was (leave those options out) or use another --data-dir")


def _open_for_postgres(data_dir: Path) -> None:
    """As root the server runs as the postgres OS user, which must pass through ``data_dir``: grant
    search (x) on it, nothing more (its files stay unreadable to that user)."""
    if os.geteuid() == 0:
        mode = data_dir.stat().st_mode
        if not mode & 0o001:
            os.chmod(data_dir, (mode & 0o7777) | 0o001)


def _remove_new_cluster(data_dir: Path) -> None:
    """After a failed first start: everything in ``data_dir`` was made by this call (it was empty)."""
    for child in data_dir.iterdir():
        if child.name == LOCK_FILE:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


# --- status -------------------------------------------------------------------------------------


def status(data_dir: Path) -> ClusterStatus:
    """PostgreSQL up/down; per broker: process alive, registered (listed in live Metadata)."""
    from kcli.cluster.pgserver import PgServer

    cluster = load_cluster_file(Path(data_dir).expanduser().absolute())
    pg = cluster.postgresql
    pg_up = PgServer(pg.host, pg.port, pg.user, Path(pg.data_dir)).accepts_connections()
    pids = {b.node_id: broker_pid(b) for b in cluster.brokers}
    registered: set[int] = set()
    for b in cluster.brokers:
        if pids[b.node_id] is not None:
            listed = metadata_brokers(b.listener)
            registered |= set(listed or {})
    rows = [BrokerStatus(b.node_id, b.rack, b.listener, pids[b.node_id], pids[b.node_id] is not None,
                         b.node_id in registered, b.log, b.metrics_url) for b in cluster.brokers]
    return ClusterStatus(cluster.data_dir, pg.url, pg_up, cluster.bootstrap, rows)


# --- stop ---------------------------------------------------------------------------------------


def stop(data_dir: Path, timeout_s: float = STOP_TIMEOUT_S, progress: Progress | None = None) -> StopResult:
    """SIGTERM every running broker (SIGKILL after ``timeout_s``), then stop PostgreSQL (fast).
    Stopping a stopped cluster changes nothing and is not an error."""
    from kcli.cluster.pgserver import PgServer

    if timeout_s <= 0:
        raise UsageError(f"--timeout expects a positive number of seconds, got {timeout_s:g}")
    say = progress or (lambda _m: None)
    data_dir = Path(data_dir).expanduser().absolute()
    cluster = load_cluster_file(data_dir)
    with _exclusive(data_dir):
        running = [(b.node_id, pid) for b in cluster.brokers if (pid := broker_pid(b)) is not None]
        if running:
            say(f"stopping broker{'s' if len(running) > 1 else ''} {', '.join(str(n) for n, _ in running)}")
        killed = terminate(running, timeout_s)
        pg = cluster.postgresql
        say("stopping PostgreSQL")
        pg_stopped = PgServer(pg.host, pg.port, pg.user, Path(pg.data_dir)).stop("fast")
    return StopResult(str(data_dir), [n for n, _ in running], killed, pg_stopped)


def terminate(procs: list[tuple[int, int]], timeout_s: float) -> list[int]:
    """SIGTERM each (node id, pid), wait up to ``timeout_s`` for all, then SIGKILL the rest.
    Returns the node ids that had to be killed."""
    from kcli.ops.connection import process_alive

    for _, pid in procs:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(process_alive(pid) for _, pid in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    killed = [n for n, pid in procs if process_alive(pid)]
    for n, pid in procs:
        if n in killed:
            _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while any(process_alive(pid) for _, pid in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    return killed


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def broker_pid(b: BrokerEntry) -> int | None:
    """The pid of the process running broker ``b`` (recorded, or from its broker.json), if one runs.

    A pid counts only when that process's command line is a broker on ``b``'s data dir (pids are
    reused); without /proc, when the data dir's lock is held.
    """
    from kcli.ops.connection import process_alive

    candidates = [b.pid]
    try:
        candidates.append(int(json.loads((Path(b.data_dir) / "broker.json").read_text())["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for pid in candidates:
        if pid and process_alive(pid) and _is_broker_of(pid, Path(b.data_dir)):
            return pid
    return None


def _is_broker_of(pid: int, data_dir: Path) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        from kcli.broker.embedded import data_dir_lock_held

        return data_dir_lock_held(data_dir)
    return b"broker" in argv and os.fsencode(str(data_dir)) in argv


# --- files and helpers --------------------------------------------------------------------------


def load_cluster_file(data_dir: Path) -> ClusterFile:
    path = Path(data_dir) / CLUSTER_FILE
    try:
        return ClusterFile.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        raise OperationError(f"no cluster in {data_dir} (no {CLUSTER_FILE}); start one with "
                             f"`kcli cluster start --data-dir {data_dir}`") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise OperationError(f"{path} is unreadable or damaged ({type(err).__name__}: {err})") from None


def write_cluster_file(cluster: ClusterFile) -> None:
    from kcli.fsutil import atomic_write_text

    atomic_write_text(Path(cluster.data_dir) / CLUSTER_FILE, json.dumps(cluster.to_dict(), indent=2) + "\n", 0o644)


@contextmanager
def _exclusive(data_dir: Path) -> Iterator[None]:
    """Hold ``D/.cluster.lock`` (flock): one start or stop at a time works on a directory."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise OperationError(f"cannot use {data_dir}: {err.strerror or err}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise OperationError(f"another `kcli cluster` command is working on {data_dir}; retry when it is done") from None
        yield
    finally:
        os.close(fd)
