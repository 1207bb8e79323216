"""The broker: cluster metadata, partition logs, groups, and the tasks that keep them tidy.

One process is one broker (node id from ``node.id``) and also the controller of its metadata
log; nothing here is global, so several brokers can run in one process (tests, embedding).
Request handlers call the methods below; each raises :class:`BrokerError` with a Kafka code.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from kcli.config.broker_config import BrokerConfig
from kcli.config.definitions import (BROKER_CONFIGS, DISKLESS_SYSTEM_DISABLED, TIERED_SYSTEM_DISABLED, TOPIC_CONFIGS,
                                    ConfigError, format_value, normalise_topic_configs, parse_value)
from kcli.broker.listeners import Endpoint, Listener, advertised_endpoints, check_security
from kcli.metadata.metadata_log import (
    BROKER_RESOURCE,
    PartitionState,
    TopicState,
    partition_record,
    record,
)
from kcli.protocol.errors import BrokerError
from kcli.storage.errors import LogError
from kio.schema.errors import ErrorCode

log = logging.getLogger("kcli.broker")

# Kafka error codes used here
CLASSIC_REPLICATION_REFUSED = (
    "kcli replicates classic partitions only in a cluster (--cluster): use replication factor 1 on a single broker, "
    "or a diskless topic (diskless.enable=true), whose data is in the object store and whose replicas are metadata-only")

_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
# Names no client may create (Kafka's ControllerApis refuses __cluster_metadata with INVALID_REQUEST
# "Creation of internal topic ... is prohibited."); kcli keeps its own state in data-dir entries
# with these names, and the group coordinator and transaction log own the first two.
RESERVED_TOPICS = INTERNAL_TOPICS | frozenset({"__share_group_state", "__cluster_metadata", "__remote_log_metadata"})


MAX_FILE_NAME_BYTES = 255  # NAME_MAX of every file system Kafka supports


def log_delete_dir_name(topic: str, partition: int) -> str:
    """``<topic>-<p>.<uuid hex>-delete`` with the topic cut so the name fits 255 bytes, as Kafka's
    LocalLog.logDirNameWithSuffixCappedLength does: a legal 249-character topic name plus the
    suffix would otherwise overflow the file name limit and the rename would fail."""
    suffix = f"-{partition}.{uuid.uuid4().hex}-delete"
    return topic[:max(0, MAX_FILE_NAME_BYTES - len(suffix))] + suffix


class DataDirError(Exception):
    """The data directory cannot be used (locked by another broker, unwritable, ...)."""


def now_ms() -> int:
    return int(time.time() * 1000)


def validate_topic_name(name: str) -> None:
    if not name:
        raise BrokerError(ErrorCode.invalid_topic_exception, "Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise BrokerError(ErrorCode.invalid_topic_exception, "Topic name cannot be \".\" or \"..\"")
    if len(name) > MAX_TOPIC_NAME:
        raise BrokerError(ErrorCode.invalid_topic_exception, f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME} characters, topic name: {name}")
    if not _TOPIC_NAME.match(name):
        raise BrokerError(ErrorCode.invalid_topic_exception, f"Topic name \"{name}\" is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'")


class AppendNotifier:
    """Wakes long-polling fetches when data arrives on a partition they wait for."""

    def __init__(self) -> None:
        self._waiters: dict[tuple[str, int], set[asyncio.Future[None]]] = {}

    def notify(self, topic: str, partition: int) -> None:
        for fut in self._waiters.pop((topic, partition), ()):
            if not fut.done():
                fut.set_result(None)

    async def wait(self, keys: list[tuple[str, int]], timeout_s: float) -> None:
        if timeout_s <= 0:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for k in keys:
            self._waiters.setdefault(k, set()).add(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
        except asyncio.TimeoutError:
            pass
        finally:
            for k in keys:
                s = self._waiters.get(k)
                if s is not None:
                    s.discard(fut)
                    if not s:
                        self._waiters.pop(k, None)

    def wake_all(self) -> None:
        for key in list(self._waiters):
            self.notify(*key)


class FlushScheduler:
    """Group commit for acks=all: concurrent produces share one fsync per log.

    A caller adds its logs and awaits the next flush round; a round starts as soon as the
    previous one ends, so fsync cost is amortised over everything that arrived meanwhile."""

    def __init__(self) -> None:
        self._pending: set[Any] = set()
        self._round: asyncio.Future[None] | None = None
        self._running = False

    async def flush(self, logs: set[Any]) -> None:
        loop = asyncio.get_running_loop()
        self._pending |= logs
        if self._round is None:
            self._round = loop.create_future()
        fut = self._round
        if not self._running:
            asyncio.ensure_future(self._run())
        await asyncio.shield(fut)

    async def _run(self) -> None:
        self._running = True
        try:
            while self._pending:
                logs, self._pending = self._pending, set()
                fut, self._round = self._round, None
                try:
                    await asyncio.get_running_loop().run_in_executor(None, _flush_all, logs)
                except Exception as err:  # pragma: no cover - disk failure
                    if fut is not None and not fut.done():
                        fut.set_exception(err)
                    continue
                if fut is not None and not fut.done():
                    fut.set_result(None)
        finally:
            self._running = False


def _flush_all(logs: set[Any]) -> None:
    for lg in logs:
        lg.flush()


class Broker:
    """Owns the data dir; start() opens everything, close() flushes and releases it."""

    def __init__(self, data_dir: Path, config: BrokerConfig, host: str = "127.0.0.1", port: int = 9092, *,
                 server_factory: Callable[["Broker", list[Listener]], Any],
                 listeners: list[Listener] | None = None) -> None:
        """``server_factory(broker, listeners)`` builds the socket side (kcli.broker.server's
        KafkaServer); the caller passes it so that imports flow runner → server → broker only.
        Without ``listeners``, one listener on host:port: SASL_PLAINTEXT when SASL is configured,
        else PLAINTEXT."""
        self.data_dir = Path(data_dir)
        self._server_factory = server_factory
        self.config = config
        self.listen_host = host
        self.listen_port = port
        self.node_id = config.get_int("node.id")
        self.rack: str | None = config.get_str("broker.rack") or None
        from kcli.cluster.factory import open_store

        # Shared cluster state (metadata records, registrations, controller) behind one interface:
        # the local metadata log, or PostgreSQL with `--cluster URL` (kcli/cluster/).
        self.metadata = open_store(config, self.data_dir)
        self._known: dict[str, tuple[TopicState, set[int], dict[str, str]]] = {}
        self._known_broker_configs: dict[str, dict[str, str]] = {}  # dynamic broker configs last applied
        self.logs: dict[tuple[str, int], Any] = {}
        self.notifier = AppendNotifier()
        self.flusher = FlushScheduler()
        self.groups: Any = None
        self.share: Any = None  # kcli/coordinator/share/manager.py: KIP-932 share groups and partitions
        self.transactions: Any = None  # kcli/coordinator/transaction/coordinator.py
        self.diskless: Any = None
        self.tiered: Any = None
        self.partition_reducer: Any = None
        self.log_cleaner: Any = None  # kcli/broker/log_cleaner.py: compaction of classic logs
        self.replicas: Any = None  # kcli/broker/replica/: replication of classic partitions (clusters only)
        self.server: Any = None
        self.stopping = False
        from kcli.security.sasl import authenticator_from_config

        self.sasl = authenticator_from_config(config)  # ConfigError on a bad users file
        from kcli import faults

        faults.configure(config.prefixed("kcli.fault."))  # crash-test pause points; ConfigError if bad
        self.sasl_enabled = self.sasl is not None
        if listeners is None:
            proto = "SASL_PLAINTEXT" if self.sasl_enabled else "PLAINTEXT"
            listeners = [Listener(proto, proto, host, port)]
        check_security(config, listeners)  # ConfigError: a SASL listener without SASL, a TLS one without a key
        self.listeners = listeners
        self.endpoints: list[Endpoint] = []  # what clients of each listener are told (after start)
        self.bound: list[tuple[Listener, str, int]] = []  # each listener's bound address (after start)
        from kcli.security.acl import authorizer_from_config

        # None: every request allowed, as without authorizer.class.name in Kafka (kcli/broker/authz.py)
        self.authorizer = authorizer_from_config(config, lambda: self.state.acls, lambda: self.state.acls_version)
        self.advertised_host = host
        self.advertised_port = port
        self._lock_fd: int | None = None
        self._logs_loaded = False  # every classic log opened at start (close may then mark clean)
        self._tasks: list[asyncio.Task[Any]] = []
        self.started_ms = now_ms()
        from kcli.broker.metrics import Metrics

        self.metrics = Metrics()

    # ---- lifecycle -------------------------------------------------------------------------
    @property
    def state(self):  # noqa: ANN201 - ClusterState
        return self.metadata.state

    @property
    def cluster_id(self) -> str:
        return self.state.cluster_id

    def _lock_data_dir(self) -> None:
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.data_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except (FileExistsError, NotADirectoryError):  # the path, or a parent of it, is a file
            raise DataDirError(f"cannot use data dir {self.data_dir}: not a directory") from None
        except OSError as err:
            raise DataDirError(f"cannot use data dir {self.data_dir}: {err.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise DataDirError(f"data dir {self.data_dir} is in use by another broker") from None
        probe = self.data_dir / ".write-probe"
        try:
            probe.write_bytes(b"x")
            probe.unlink()
        except OSError as err:
            probe.unlink(missing_ok=True)
            os.close(fd)
            raise DataDirError(f"data dir {self.data_dir} is not writable: {err.strerror}") from None
        self._lock_fd = fd

    async def start(self) -> tuple[str, int]:
        self._lock_data_dir()
        from kcli.cluster.state import ClusterStoreError

        try:
            self.metadata.open()
        except ClusterStoreError as err:
            self._release_lock()
            raise DataDirError(str(err)) from None
        except Exception as err:
            self._release_lock()
            raise DataDirError(f"cannot read cluster metadata in {self.data_dir}: {err}") from None
        try:
            if not self.state.cluster_id:
                cid = self.config.get_str("cluster.id") or _kafka_uuid_str(uuid.uuid4())
                try:
                    self.metadata.append([record("ClusterIdRecord", clusterId=cid)])
                except BrokerError:
                    if not self.state.cluster_id:  # not "another broker of the cluster set it first"
                        raise
            self._attach_extensions()
            if not self.metadata.single_broker:
                from kcli.broker.replica.manager import ReplicaManager

                self.replicas = ReplicaManager(self)
            await self._open_storage()
            self._known = {n: (t, set(t.partitions), dict(t.configs)) for n, t in self.state.topics.items()}
            self._known_broker_configs = {k: dict(v) for k, v in self.state.broker_configs.items()}
            self.metadata.set_listener(self._metadata_applied)
            if self.replicas is not None:
                self.replicas.metadata_changed()  # lead or follow the replicated partitions opened above
                from kcli.broker.replica import reassignment

                reassignment.drop_removed_replicas(self)  # notes the replica sets that later changes compare with
        except OSError as err:  # disk full, file size limit, I/O error: not a listener problem
            await self.close()
            raise DataDirError(f"cannot write to data dir {self.data_dir}: {err.strerror or err}") from None
        self.server = self._server_factory(self, self.listeners)
        bound = await self.server.start()
        self.bound = bound
        self.endpoints = advertised_endpoints(self.config, bound)
        self.advertised_host, self.advertised_port = self.endpoints[0].host, self.endpoints[0].port
        _li, host, port = bound[0]
        try:  # in a cluster: refused while another live process holds this node id
            await asyncio.get_running_loop().run_in_executor(
                None, self.metadata.register_broker, self.node_id, self.rack, self.advertised_host, self.advertised_port,
                [e.to_json() for e in self.endpoints])
        except ClusterStoreError as err:
            await self.close()
            raise DataDirError(str(err)) from None
        self._spawn(self.metadata.run(lambda: self.stopping), "cluster-state")
        if not self.metadata.single_broker:
            self._spawn(self._watch_live_brokers(), "live-brokers")
        try:
            self._write_runtime_file()
        except OSError as err:
            await self.close()
            raise DataDirError(f"cannot write to data dir {self.data_dir}: {err.strerror or err}") from None
        self._spawn(self._retention_loop(), "retention")
        return host, port

    # (attribute, "module:Class", broker config that enables it or None for always)
    EXTENSIONS = (
        ("diskless", "kcli.diskless.engine:DisklessEngine", "diskless.system.enable"),
        ("tiered", "kcli.tiered.manager:RemoteLogManager", "remote.log.storage.system.enable"),
        ("partition_reducer", "kcli.broker.partition_reducer:PartitionReducer", None),
        ("log_cleaner", "kcli.broker.log_cleaner:LogCleanerExtension", None),  # log.cleaner.enable gates its passes
    )

    def _attach_extensions(self) -> None:
        import importlib

        for attr, target, flag in self.EXTENSIONS:
            if flag is not None and not self.config.get_bool(flag):
                continue
            module_name, cls_name = target.split(":")
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as err:
                if err.name == module_name:
                    continue  # feature not built into this kcli
                raise
            setattr(self, attr, getattr(module, cls_name)(self))

    async def _open_storage(self) -> None:
        from kcli.coordinator.group.coordinator import GroupCoordinator

        from kcli.storage.log import CLEAN_SHUTDOWN_FILE, remove_clean_shutdown_marker

        # Kafka's LogManager: after a clean shutdown logs load without recovery; the marker goes
        # before anything is written, so a crash from here on is unclean again.
        clean = (self.data_dir / CLEAN_SHUTDOWN_FILE).exists()
        all_opened = True
        for t in list(self.state.topics.values()):
            if self.is_diskless(t):
                continue
            for p in t.partitions.values():
                if not self.hosts(p):
                    continue  # another broker of the cluster holds this log
                try:
                    self._open_log(t, p.partition, clean_shutdown=clean)
                except (OSError, ValueError, LogError) as err:
                    all_opened = False
                    # One unusable partition dir must not keep every other topic offline;
                    # the partition stays unavailable until the operator fixes the dir.
                    log.error("partition %s-%d is offline: cannot open %s: %s", t.name, p.partition,
                              self.partition_dir(t.name, p.partition), getattr(err, "strerror", None) or err)
        remove_clean_shutdown_marker(self.data_dir)
        self._logs_loaded = all_opened  # a partition never recovered must not be called clean at close
        # Offsets in the shared state (data dir or cluster database); each group coordinated by
        # one live broker (kcli/coordinator/group/coordinator.py).
        self.groups = GroupCoordinator(self.data_dir, self.config.get_int, self.metadata.offset_store(self.data_dir),
                                       node_id=self.node_id, live_nodes=lambda: [b.node_id for b in self.live_brokers()])
        await self.groups.start()
        from kcli.coordinator.share.manager import ShareCoordinator

        self.share = ShareCoordinator(self)
        self.groups.share = self.share
        await self.share.start()
        from kcli.coordinator.transaction.coordinator import TransactionCoordinator

        self.transactions = TransactionCoordinator(self.metadata.transaction_store(self.data_dir), self)
        await self.transactions.start()
        for hook in self.extensions:
            await hook.start()

    @property
    def extensions(self) -> list[Any]:
        return [x for x in (self.diskless, self.tiered, self.partition_reducer, self.log_cleaner) if x is not None]

    def _spawn(self, coro: Any, name: str) -> None:
        self._tasks.append(asyncio.create_task(coro, name=name))

    def _write_runtime_file(self) -> None:
        # host/port: the first PLAINTEXT listener if any (local tools speak plaintext), else the first.
        local = next((e for e in self.endpoints if e.protocol == "PLAINTEXT"), self.endpoints[0])
        info = {"host": local.host, "port": local.port, "pid": os.getpid(),
                "node_id": self.node_id, "cluster_id": self.cluster_id,
                "listeners": [f"{e.name}://{e.host}:{e.port}" for e in self.endpoints]}
        tmp = self.data_dir / "broker.json.tmp"
        try:
            tmp.write_text(json.dumps(info))
            os.replace(tmp, self.data_dir / "broker.json")
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    async def close(self) -> None:
        """Answer in-flight requests, stop tasks, flush every log, release the data dir."""
        self.stopping = True
        self.notifier.wake_all()
        if self.groups is not None:
            if self.share is not None:
                await self.share.close()
            await self.groups.close()  # answers parked JoinGroup/SyncGroup at once
        if self.transactions is not None:
            await self.transactions.close()
        if self.replicas is not None:  # fetchers stop, acks=all waiters are answered at once
            await self.replicas.close()
        if self.server is not None:
            await self.server.stop()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for hook in reversed(self.extensions):
            try:
                await hook.close()
            except Exception:  # pragma: no cover
                log.exception("closing %s failed", hook)
        clean = self._logs_loaded
        for lg in self.logs.values():
            try:
                lg.flush()
                lg.close()
            except Exception:  # pragma: no cover
                clean = False
                log.exception("closing log failed")
        self.logs.clear()
        if clean:  # every log flushed and closed: the next start may skip recovery (Kafka's rule)
            from kcli.storage.log import write_clean_shutdown_marker

            try:
                write_clean_shutdown_marker(self.data_dir)
            except Exception as err:  # the next start simply recovers
                log.error("cannot write the clean-shutdown marker: %s", err)
        self.metadata.close()
        try:
            (self.data_dir / "broker.json").unlink()
        except OSError:
            pass
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # ---- topics ----------------------------------------------------------------------------
    def topic(self, name: str) -> TopicState | None:
        return self.state.topics.get(name)

    def topic_exists(self, name: str) -> bool:
        return name in self.state.topics

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicState | None:
        return self.state.topic_by_id(topic_id)

    def is_diskless(self, t: TopicState) -> bool:
        return t.configs.get("diskless.enable", "false").lower() == "true"

    def diskless_engine(self) -> Any:
        """The diskless engine, for a diskless topic's data; INVALID_CONFIG (not a server error)
        on a broker started with diskless.system.enable=false."""
        if self.diskless is None:
            raise BrokerError(ErrorCode.invalid_config, DISKLESS_SYSTEM_DISABLED)
        return self.diskless

    def is_tiered(self, t: TopicState) -> bool:
        return t.configs.get("remote.storage.enable", "false").lower() == "true"

    def topic_kind(self, t: TopicState) -> str:
        if self.is_diskless(t):
            return "diskless"
        if self.is_tiered(t) or t.tiered_state in ("DISABLING",):
            return "tiered"
        return "classic"

    def default_topic_configs(self) -> dict[str, Any]:
        """Each topic config's default, taken from its broker synonym where set (dynamic or static)."""
        out = {}
        for name, d in TOPIC_CONFIGS.items():
            if d.broker_synonym and d.broker_synonym in self.config.values:
                out[name] = parse_value(BROKER_CONFIGS[d.broker_synonym], self.broker_config_levels(d.broker_synonym)[0][0])
            else:
                out[name] = d.default
        return out

    def broker_config_levels(self, name: str) -> list[tuple[str | None, str]]:
        """(value, source) of broker config ``name`` at each level that sets it, the one in effect
        first (Kafka's order): this broker's dynamic config, the cluster-wide dynamic default,
        the static config (--config / properties file), the default. Never empty."""
        out: list[tuple[str | None, str]] = []
        for resource, source in ((str(self.node_id), "DYNAMIC_BROKER_CONFIG"), ("", "DYNAMIC_DEFAULT_BROKER_CONFIG")):
            value = self.state.broker_configs.get(resource, {}).get(name)
            if value is not None:
                out.append((value, source))
        if name in self.config.explicit:
            out.append((self.config.formatted(name), "STATIC_BROKER_CONFIG"))
        out.append((format_value(BROKER_CONFIGS[name], BROKER_CONFIGS[name].default), "DEFAULT_CONFIG"))
        return out

    def topic_config_levels(self, t: TopicState, name: str) -> list[tuple[str, str | None, str]]:
        """(config name, value, source) of topic config ``name`` at each level, the one in effect
        first: the topic's own override, then its broker synonym's levels (DescribeConfigs synonyms)."""
        d = TOPIC_CONFIGS[name]
        out: list[tuple[str, str | None, str]] = []
        if name in t.configs:
            out.append((name, t.configs[name], "DYNAMIC_TOPIC_CONFIG"))
        if d.broker_synonym and d.broker_synonym in BROKER_CONFIGS:
            levels = self.broker_config_levels(d.broker_synonym)
            out += [(d.broker_synonym, v, s) for v, s in levels if s != "DEFAULT_CONFIG"]
        out.append((name, format_value(d, d.default), "DEFAULT_CONFIG"))
        return out

    def effective_topic_configs(self, t: TopicState) -> dict[str, tuple[str | None, str]]:
        """name → (value, source) with source one of DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG,
        DYNAMIC_DEFAULT_BROKER_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG — what DescribeConfigs reports."""
        out: dict[str, tuple[str | None, str]] = {}
        for name in TOPIC_CONFIGS:
            _, value, source = self.topic_config_levels(t, name)[0]
            out[name] = (value, source)
        return out

    def topic_config_value(self, t: TopicState, name: str) -> Any:
        d = TOPIC_CONFIGS[name]
        raw = self.topic_config_levels(t, name)[0][1]  # only this config's levels: produce asks per request
        return parse_value(d, raw)

    def validate_topic_configs(self, configs: dict[str, str | None], *, creating: bool, topic: TopicState | None = None) -> dict[str, str]:
        """Parse and normalise topic configs; raise BrokerError(INVALID_CONFIG) naming the config."""
        try:
            out = normalise_topic_configs(configs)
        except ConfigError as err:
            raise BrokerError(ErrorCode.invalid_config, str(err)) from None
        if not creating and "diskless.enable" in out:
            raise BrokerError(ErrorCode.invalid_config, "diskless.enable can only be set when a topic is created")
        diskless = out.get("diskless.enable") == "true" if creating else (topic is not None and self.is_diskless(topic))
        if diskless and (not self.config.get_bool("diskless.system.enable") or self.diskless is None):
            # on alter too: Kafka checks a tiered topic's merged configs against remote.log.storage.system.enable
            raise BrokerError(ErrorCode.invalid_config, DISKLESS_SYSTEM_DISABLED)
        if out.get("remote.storage.enable") == "true":
            # a diskless topic may tier too (kcli/diskless/tiering.py, docs/diskless-tiering.md)
            if not self.config.get_bool("remote.log.storage.system.enable"):
                raise BrokerError(ErrorCode.invalid_config, TIERED_SYSTEM_DISABLED)
        self._check_compaction(out, topic)
        return out

    def _check_compaction(self, out: dict[str, str], topic: TopicState | None) -> None:
        """cleanup.policy=compact (kcli/storage/cleaner.py, kcli/diskless/compaction.py): refused
        with remote storage, as Kafka refuses it."""
        old = topic.configs if topic is not None else {}
        policy = out.get("cleanup.policy", old.get("cleanup.policy"))
        if policy is None:
            policy = self.broker_config_levels("log.cleanup.policy")[0][0] or ""
        if "compact" not in policy.split(","):
            return
        if out.get("remote.storage.enable", old.get("remote.storage.enable")) == "true":
            raise BrokerError(ErrorCode.invalid_config, "Remote log storage is unsupported for the compacted topics")

    def create_topic(self, name: str, num_partitions: int, replication_factor: int,
                     configs: dict[str, str | None], *, validate_only: bool = False,
                     assignments: dict[int, list[int]] | None = None) -> TopicState | None:
        validate_topic_name(name)
        if name in RESERVED_TOPICS:
            raise BrokerError(ErrorCode.invalid_request, f"Creation of internal topic {name} is prohibited.")
        if name in self.state.topics:
            raise BrokerError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
        if assignments:
            num_partitions = len(assignments)
            replication_factor = len(next(iter(assignments.values())))
        if num_partitions == -1:
            num_partitions = self.config.get_int("num.partitions")
        if replication_factor == -1:
            replication_factor = self.config.get_int("default.replication.factor")
        if num_partitions <= 0:
            raise BrokerError(ErrorCode.invalid_partitions, "Number of partitions was set to an invalid non-positive value.")
        if replication_factor <= 0:
            raise BrokerError(ErrorCode.invalid_replication_factor, "Replication factor must be larger than 0.")
        clean = self.validate_topic_configs(configs, creating=True)
        diskless = clean.get("diskless.enable") == "true"
        topic_id = uuid.uuid4()
        # Replicas over the live brokers, rack-aware (kcli/cluster/placement.py); Kafka's message
        # when the factor exceeds them. Diskless replicas are metadata-only, classic ones hold data.
        if assignments:
            placement = self._check_assignments(assignments)
        else:
            placement = self._place(topic_id, range(num_partitions), replication_factor)
        if replication_factor > 1 and not diskless:
            if self.metadata.single_broker:
                raise BrokerError(ErrorCode.invalid_replication_factor, CLASSIC_REPLICATION_REFUSED)
        if validate_only:
            return None
        if diskless:
            self.diskless.check_writable()  # before the records: no topic over a store we cannot write
        recs = [record("TopicRecord", name=name, topicId=topic_id)]
        for p, replicas in sorted(placement.items()):
            recs.append(partition_record(topic_id, PartitionState(p, replicas[0], list(replicas), list(replicas))))
        for k, v in clean.items():
            recs.append(record("ConfigRecord", resourceType=2, resourceName=name, name=k, value=v))
        if clean.get("remote.storage.enable") == "true":
            recs.append(record("TopicTieredStateRecord", topicId=topic_id, tieredEpoch=0, tieredState="ENABLED"))
        self.metadata.append(recs)  # logs / diskless partitions: _metadata_applied
        return self.state.topics[name]

    def live_brokers(self) -> list[Any]:
        """Registered brokers with a live lease (this one at least: it is answering)."""
        live = self.metadata.live_brokers()
        if not any(b.node_id == self.node_id for b in live):
            from kcli.cluster.state import BrokerRegistration

            me = BrokerRegistration(self.node_id, self.advertised_host, self.advertised_port, self.rack,
                                    listeners=tuple((e.name, e.host, e.port) for e in self.endpoints))
            live = sorted([*live, me],
                          key=lambda b: b.node_id)
        return live

    LIVE_WATCH_S = 0.5  # how often the live set (refreshed by the cluster state store each second) is compared

    async def _watch_live_brokers(self) -> None:
        """In a cluster: one INFO line when another broker joins or leaves, as the live set of the
        cluster state store shows it (kcli/cluster/postgres.py refreshes it each second). A peer
        seen again under a new incarnation between two looks was restarted: it left and joined."""
        known = {b.node_id: b for b in self.live_brokers() if b.node_id != self.node_id}
        while not self.stopping:
            await asyncio.sleep(self.LIVE_WATCH_S)
            now = {b.node_id: b for b in self.live_brokers() if b.node_id != self.node_id}
            live = sorted({*now, self.node_id})
            for node, b in sorted(known.items()):
                if node not in now or now[node].incarnation != b.incarnation:
                    self._log_peer("left", b, live)
            for node, b in sorted(now.items()):
                if node not in known or known[node].incarnation != b.incarnation:
                    self._log_peer("joined", b, live)
            known = now

    def _log_peer(self, change: str, b: Any, live: list[int]) -> None:
        endpoints = [f"{name}://{host}:{port}" for name, host, port in b.listeners] or [f"{b.host}:{b.port}"]
        rack = f" (rack {b.rack})" if b.rack else ""
        log.info("[KafkaServer id=%d] Broker %d at %s%s %s the cluster; live brokers: %s", self.node_id, b.node_id,
                 ",".join(endpoints), rack, change, ",".join(map(str, live)),
                 extra={"event": f"cluster.broker.{change}", "node_id": self.node_id, "broker_id": b.node_id,
                        "endpoints": endpoints, "rack": b.rack, "live_brokers": live})

    def _place(self, topic_id: uuid.UUID, partitions: range, replication_factor: int) -> dict[int, list[int]]:
        from kcli.cluster.placement import PlacementError, assign_replicas

        try:
            return assign_replicas(topic_id, partitions, replication_factor, self.live_brokers())
        except PlacementError as err:
            raise BrokerError(ErrorCode.invalid_replication_factor, str(err)) from None

    def _check_assignments(self, assignments: dict[int, list[int]]) -> dict[int, list[int]]:
        """A manual replica assignment, checked as Kafka's ReplicationControlManager does."""
        if sorted(assignments) != list(range(len(assignments))):
            raise BrokerError(ErrorCode.invalid_replica_assignment, "Partitions should be a consecutive 0-based integer sequence")
        sizes = {len(r) for r in assignments.values()}
        if len(sizes) != 1 or 0 in sizes:
            raise BrokerError(ErrorCode.invalid_replica_assignment, "All partitions should have the same number of replicas")
        live = {b.node_id for b in self.live_brokers()}
        for p, replicas in sorted(assignments.items()):
            if len(set(replicas)) != len(replicas):
                raise BrokerError(ErrorCode.invalid_replica_assignment, f"Duplicate brokers not allowed in replica assignment: {replicas} for partition id {p}.")
            unknown = [r for r in replicas if r not in live]
            if unknown:
                raise BrokerError(ErrorCode.invalid_replica_assignment, f"The manual partition assignment includes broker(s) {unknown} that are not registered for partition {p}.")
        return {p: list(r) for p, r in assignments.items()}

    def hosts(self, p: PartitionState) -> bool:
        """Whether this broker holds a log of classic partition ``p``: its one replica, or, for a
        replicated partition in a cluster, one of its replicas (leader or follower)."""
        if len(p.replicas) > 1 and not self.metadata.single_broker:
            return self.node_id in p.replicas
        return self.metadata.partition_host(p.leader) == self.node_id

    def leads(self, p: PartitionState) -> bool:
        """Whether this broker is the leader of classic partition ``p`` (takes its produce and fetch)."""
        if len(p.replicas) > 1 and not self.metadata.single_broker:
            return p.leader == self.node_id
        return self.hosts(p)

    def log_for(self, t: TopicState, partition: int) -> Any:
        """The local log of a classic partition, or the error a client gets: hosted by another
        broker (NOT_LEADER_OR_FOLLOWER, it refreshes Metadata), unknown, or offline here."""
        p = t.partitions.get(partition)
        if p is None:
            raise BrokerError(ErrorCode.unknown_topic_or_partition, "This server does not host this topic-partition.")
        lg = self.logs.get((t.name, partition))
        if lg is not None:
            if len(p.replicas) > 1 and not self.leads(p):  # a follower's copy: clients go to the leader
                raise BrokerError(ErrorCode.not_leader_or_follower, f"Broker {self.node_id} is not the leader of "
                                  f"{t.name}-{partition} (leader: {p.leader})")
            return lg
        if not self.hosts(p):
            raise BrokerError(ErrorCode.not_leader_or_follower, f"Broker {self.node_id} is not the leader of {t.name}-{partition}")
        raise BrokerError(ErrorCode.kafka_storage_error, f"{t.name}-{partition} is offline on this broker (see its log)")

    def delete_topic(self, name: str) -> None:
        if not self.config.get_bool("delete.topic.enable"):
            raise BrokerError(ErrorCode.topic_deletion_disabled, "Topic deletion is disabled.")
        t = self.state.topics.get(name)
        if t is None:
            raise BrokerError(ErrorCode.unknown_topic_or_partition, "This server does not host this topic-partition.")
        self.metadata.append([record("RemoveTopicRecord", topicId=t.topic_id)])  # data: _metadata_applied

    def _drop_topic_data(self, t: TopicState) -> None:
        for (topic, p) in [k for k in self.logs if k[0] == t.name]:
            lg = self.logs.pop((topic, p))
            lg.delete()
            self.notifier.notify(topic, p)
        for hook in self.extensions:
            hook.topic_deleted(t)
        if self.groups is not None:
            self.groups.delete_topic_offsets(t.name, t.topic_id)
            if self.share is not None:
                self.share.forget_topic(t.name)
        self.metrics.forget_label("topic", t.name)  # its per-topic series leave the metrics endpoint

    def create_partitions(self, name: str, count: int, *, validate_only: bool = False) -> None:
        t = self.state.topics.get(name)
        if t is None:
            raise BrokerError(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")
        current = len(t.partitions)
        if count < current:
            raise BrokerError(ErrorCode.invalid_partitions,
                              f"Topic currently has {current} partitions, which is higher than the requested {count}.")
        if count == current:
            raise BrokerError(ErrorCode.invalid_partitions, f"Topic already has {current} partitions.")
        for hook in self.extensions:  # e.g. refused while a KIP-694 partition deletion is pending
            if hasattr(hook, "validate_create_partitions"):
                hook.validate_create_partitions(t, count)
        if self.is_diskless(t):
            self.diskless_engine()  # INVALID_CONFIG on a broker without the diskless system
        if validate_only:
            return
        if self.is_diskless(t):
            self.diskless.check_writable()  # before the records, as in create_topic
        start = max(t.partitions) + 1 if t.partitions else 0
        new = range(start, start + (count - current))
        first = t.partitions.get(min(t.partitions)) if t.partitions else None
        placement = self._place(t.topic_id, new, len(first.replicas) if first is not None else 1)
        recs = [partition_record(t.topic_id, PartitionState(p, r[0], list(r), list(r))) for p, r in placement.items()]
        self.metadata.append(recs)  # logs / diskless partitions: _metadata_applied

    def alter_topic_configs(self, name: str, changes: dict[str, str | None], *, incremental: bool,
                            validate_only: bool = False) -> None:
        """Apply config changes; ``None`` deletes (reverts to default). Non-incremental replaces all."""
        t = self.state.topics.get(name)
        if t is None:
            raise BrokerError(ErrorCode.unknown_topic_or_partition, f"Topic {name} does not exist")
        for hook in self.extensions:
            hook.validate_config_request(t, changes)
        sets = {k: v for k, v in changes.items() if v is not None}
        deletes = [k for k, v in changes.items() if v is None]
        for k in deletes:
            if k not in TOPIC_CONFIGS:
                raise BrokerError(ErrorCode.invalid_config, f"Unknown topic config name: {k}")
            if k == "diskless.enable":
                raise BrokerError(ErrorCode.invalid_config, "diskless.enable can only be set when a topic is created")
        if not incremental and self.is_diskless(t) and "diskless.enable" not in sets:
            # AlterConfigs replaces the whole set: dropping diskless.enable would be a kind change.
            sets_check = dict(sets)
        else:
            sets_check = sets
        if "diskless.enable" in sets and t.configs.get("diskless.enable") == sets["diskless.enable"] and not incremental:
            sets_check = {k: v for k, v in sets.items() if k != "diskless.enable"}
        clean = self.validate_topic_configs(sets_check, creating=False, topic=t)
        if not incremental and self.is_diskless(t):
            clean["diskless.enable"] = "true"
        new_configs = dict(t.configs) if incremental else {}
        new_configs.update(clean)
        for k in deletes:
            new_configs.pop(k, None)
        old = dict(t.configs)
        for hook in self.extensions:
            hook.validate_config_change(t, old, new_configs)
        if self.tiered is None:  # no tiered-storage system here: nothing could run a KIP-950 disablement
            from kcli.tiered.disable import check_without_tiered_system

            check_without_tiered_system(t, old, new_configs)
        if validate_only:
            return
        recs = []
        for k in sorted(set(old) | set(new_configs)):
            if old.get(k) != new_configs.get(k):
                recs.append(record("ConfigRecord", resourceType=2, resourceName=name, name=k, value=new_configs.get(k)))
        extra: list[dict[str, Any]] = []
        for hook in self.extensions:
            extra += hook.config_change_records(t, old, new_configs)
        self.metadata.append(recs + extra)  # logs and features hear of it in _metadata_applied

    def alter_broker_configs(self, resource_name: str, changes: dict[str, str | None], *, incremental: bool,
                             validate_only: bool = False) -> None:
        """Dynamic broker configs (resource name "" = cluster-wide default, else this broker's id):
        validated, then written as ConfigRecords of resource type BROKER; ``None`` deletes.
        AlterConfigs (not incremental) replaces the resource's whole dynamic set, as in Kafka."""
        if resource_name not in ("", str(self.node_id)):
            raise BrokerError(ErrorCode.invalid_request, f"Unexpected broker id, expected {self.node_id} or empty string, "
                                               f"but received {resource_name}")
        label = f"ConfigResource(type=BROKER, name='{resource_name}')"
        from kcli.config.definitions import broker_config_change_error, broker_config_def

        # Kafka's own names that kcli does not implement are accepted as Kafka accepts them
        # (stored, no effect); a name Kafka does not know either is refused (kcli/config/kafka_broker_configs.py)
        unknown = sorted(k for k in changes if broker_config_def(k) is None)
        if unknown:
            raise BrokerError(ErrorCode.invalid_config, f"Unknown broker config name: {unknown[0]}")
        refusal = broker_config_change_error(resource_name, changes)
        if refusal:  # Kafka's DynamicBrokerConfig, as its admin manager answers it
            raise BrokerError(ErrorCode.invalid_request, f"Invalid config value for resource {label}: {refusal}")
        clean: dict[str, str | None] = {}
        for k, raw in changes.items():
            if raw is None:
                clean[k] = None
                continue
            d = broker_config_def(k)
            try:
                clean[k] = format_value(d, parse_value(d, raw))
            except ConfigError as err:
                raise BrokerError(ErrorCode.invalid_request, f"Invalid config value for resource {label}: {err}") from None
        old = dict(self.state.broker_configs.get(resource_name, {}))
        new = dict(old) if incremental else {}
        for k, v in clean.items():
            if v is None:
                new.pop(k, None)
            else:
                new[k] = v
        self._check_broker_defaults(resource_name, new, label)
        if validate_only:
            return
        self.metadata.append([record("ConfigRecord", resourceType=BROKER_RESOURCE, resourceName=resource_name,
                                     name=k, value=new.get(k))
                              for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)])

    def _check_broker_defaults(self, resource_name: str, new: dict[str, str], label: str) -> None:
        """The checks Kafka's DynamicLogConfig makes of a new set (local retention within total
        retention), and Kafka's rule that compacted topics have no remote storage: a compact
        default must not reach a tiered topic that has no cleanup.policy of its own (classic and
        diskless topics compact)."""
        own = new if resource_name == str(self.node_id) else self.state.broker_configs.get(str(self.node_id), {})
        default = new if resource_name == "" else self.state.broker_configs.get("", {})

        def after(name: str) -> str:
            for level in (own, default):
                if name in level:
                    return level[name]
            return self.config.formatted(name) or ""

        for local, total in (("log.local.retention.ms", "log.retention.ms"), ("log.local.retention.bytes", "log.retention.bytes")):
            lv, tv = int(after(local)), int(after(total))
            if tv != -1 and lv != -2 and (lv == -1 or lv > tv):
                why = f"Value must not be -1 as {total} value is set as {tv}." if lv == -1 else \
                    f"Value must not be more than {total} property value: {tv}"
                raise BrokerError(ErrorCode.invalid_request, f"Invalid config value for resource {label}: "
                                                   f"Invalid value {lv} for configuration {local}: {why}")
        if "compact" in after("log.cleanup.policy").split(","):
            for t in self.state.topics.values():
                if "cleanup.policy" not in t.configs and self.topic_kind(t) == "tiered":
                    raise BrokerError(ErrorCode.invalid_request, f"Invalid config value for resource {label}: log.cleanup.policy=compact "
                                                       f"would reach tiered topic {t.name}, which has no cleanup.policy of "
                                                       "its own (remote log storage is unsupported for compacted topics)")

    def _metadata_applied(self, records: list[dict[str, Any]]) -> None:
        """The one path for acting on applied metadata records, whether this broker appended them
        or learned them from the cluster store: open the logs (or diskless partitions) of new
        partitions, drop the data of removed topics, pass config changes to logs and features.
        It compares the state with what it saw last, so a batch from any source is handled alike;
        a failure for one topic is raised after the others were handled."""
        first_error: BaseException | None = None
        broker_changed = self._known_broker_configs != self.state.broker_configs
        self._known_broker_configs = {k: dict(v) for k, v in self.state.broker_configs.items()}
        for name, (old_t, _parts, _cfg) in list(self._known.items()):
            if self.state.topics.get(name) is not old_t:
                del self._known[name]
                try:
                    self._drop_topic_data(old_t)
                except Exception as err:  # noqa: BLE001 - raised below
                    first_error = first_error or err
        for name, t in list(self.state.topics.items()):
            known = self._known.get(name)
            parts = set(t.partitions)
            new_parts = parts if known is None else parts - known[1]
            old_cfg = None if known is None else known[2]
            self._known[name] = (t, parts, dict(t.configs))
            try:
                if new_parts:
                    if not self.is_diskless(t):
                        for p in sorted(new_parts):
                            if self.hosts(t.partitions[p]):
                                self._open_log(t, p)
                    elif self.diskless is not None:
                        self.diskless.create_partitions(t, range(min(new_parts), max(new_parts) + 1))
                    else:
                        log.error("diskless topic %s: diskless.system.enable is off on this broker", name)
                if old_cfg is not None and old_cfg == t.configs and broker_changed:
                    # a dynamic broker default changed: effective at once where the topic has no override
                    for (topic, p), lg in self.logs.items():
                        if topic == name:
                            lg.update_config(self.log_config(t))
                if old_cfg is not None and old_cfg != t.configs:
                    for (topic, p), lg in self.logs.items():
                        if topic == name:
                            lg.update_config(self.log_config(t))
                    for hook in self.extensions:
                        hook.config_changed(t, old_cfg, dict(t.configs))
            except Exception as err:  # noqa: BLE001 - raised below
                first_error = first_error or err
        if self.replicas is not None:
            from kcli.broker.replica import reassignment

            try:
                reassignment.open_new_replicas(self)  # a reassignment added this broker
                self.replicas.metadata_changed()  # leader and ISR changes, new replicas
                reassignment.drop_removed_replicas(self)  # ... or removed it: its log goes
            except Exception as err:  # noqa: BLE001 - raised below
                first_error = first_error or err
        if first_error is not None:
            raise first_error

    # ---- logs ------------------------------------------------------------------------------
    def log_config(self, t: TopicState) -> Any:
        from kcli.storage.log_config import LogConfig

        eff = {k: v for k, (v, _src) in self.effective_topic_configs(t).items() if v is not None}
        return LogConfig.from_dict(eff)

    def partition_dir(self, topic: str, partition: int) -> Path:
        return self.data_dir / f"{topic}-{partition}"

    def partition_delete_dir(self, topic: str, partition: int) -> Path:
        """Where a partition dir is renamed before its recursive delete (Kafka's LocalLog.logDeleteDirName)."""
        return self.data_dir / log_delete_dir_name(topic, partition)

    def _open_log(self, t: TopicState, partition: int, *, clean_shutdown: bool = False) -> Any:
        from kcli.storage.log import PartitionLog, write_partition_metadata

        d = self.partition_dir(t.name, partition)
        fresh = not d.exists()
        d.mkdir(parents=True, exist_ok=True)
        if fresh:
            write_partition_metadata(d, t.topic_id)
        lg = PartitionLog.open(d, self.log_config(t), clean_shutdown=clean_shutdown)
        self.logs[(t.name, partition)] = lg
        return lg

    def get_log(self, topic: str, partition: int) -> Any:
        return self.logs.get((topic, partition))

    def partition_state(self, topic: str, partition: int) -> PartitionState | None:
        t = self.state.topics.get(topic)
        if t is None:
            return None
        return t.partitions.get(partition)

    def visible_partitions(self, t: TopicState) -> list[PartitionState]:
        """Partitions clients see in Metadata: ReadWrite and ReadOnly (draining) ones."""
        return t.live_partitions()

    def extension_topic_state(self, t: TopicState) -> dict[str, str]:
        """Read-only state that features add to DescribeConfigs (tiered state, partition modes)."""
        out: dict[str, str] = {}
        for hook in self.extensions:
            out.update(hook.topic_state(t))
        return out

    async def read_partition(self, t: TopicState, partition: int, offset: int, max_bytes: int, *, min_one: bool,
                             upper_bound: int | None = None, read_committed: bool = False) -> Any:
        """Batches from ``offset`` (classic, remote tier or diskless); raises errors with ``.code``.
        ``upper_bound`` (exclusive; a read_committed fetch's last stable offset) caps local reads;
        a diskless partition's coordinator applies its own for ``read_committed``."""
        if self.is_diskless(t):
            return await self.diskless_engine().read(t, partition, offset, max_bytes, min_one=min_one,
                                            read_committed=read_committed)
        lg = self.log_for(t, partition)
        if self.tiered is not None and offset < lg.local_log_start_offset and self.tiered.has_remote(t, partition):
            return await self.tiered.read(t, partition, offset, max_bytes, min_one=min_one)
        return lg.read(offset, max_bytes, min_one_batch=min_one, upper_bound=upper_bound)

    def partition_offsets(self, t: TopicState, partition: int) -> tuple[int, int]:
        """(high watermark, log start offset)."""
        if self.is_diskless(t):
            if self.diskless is None:
                return -1, -1
            hw, start = self.diskless.offsets(t, partition)
            if self.diskless.tiering is not None:  # the remote tier's start below the coordinator's
                start = self.diskless.tiering.log_start_offset(t, partition, start)
            return hw, start
        lg = self.get_log(t.name, partition)
        if lg is None:
            return -1, -1
        return lg.high_watermark, lg.log_start_offset

    async def list_offset(self, t: TopicState, partition: int, timestamp: int) -> tuple[int, int]:
        """ListOffsets for one partition: (offset, timestamp); -1 = latest, -2 = earliest,
        -3 = max timestamp, -4 = earliest local, -5 = latest tiered."""
        if self.is_diskless(t):
            return await self.diskless_engine().list_offset(t, partition, timestamp)
        lg = self.log_for(t, partition)
        if timestamp == -1:
            return lg.high_watermark, -1
        if timestamp == -2:
            return lg.log_start_offset, -1
        if timestamp == -4:
            return lg.local_log_start_offset, -1
        if timestamp == -5:
            if self.tiered is not None:
                return self.tiered.latest_tiered_offset(t, partition), -1
            return -1, -1
        if timestamp == -3:  # KIP-734: the record with the largest timestamp, remote data included
            found = lg.offset_for_timestamp(timestamp)
            if self.tiered is not None and self.tiered.has_remote(t, partition):
                found = await self.tiered.max_timestamp_offset(t, partition, found)
            return found if found is not None else (-1, -1)
        if self.tiered is not None and self.tiered.has_remote(t, partition):
            found = await self.tiered.offset_for_timestamp(t, partition, timestamp)
            if found is not None:
                return found
        found = lg.offset_for_timestamp(timestamp)
        return found if found is not None else (-1, -1)

    async def delete_records(self, t: TopicState, partition: int, offset: int) -> int:
        """DeleteRecords: move the log start offset; -1 means the high watermark."""
        if self.is_diskless(t):
            return await self.diskless_engine().delete_records(t, partition, offset)
        lg = self.log_for(t, partition)
        hw = lg.high_watermark
        target = hw if offset == -1 else offset
        if target < 0 or target > hw:
            raise BrokerError(1, f"Cannot increment the log start offset to {offset} of partition {t.name}-{partition} since it is larger than the high watermark {hw}")
        low = lg.delete_records_before(target)
        if self.tiered is not None:
            await self.tiered.log_start_moved(t, partition, low)
        return low

    def allocate_producer_id(self) -> int:
        for attempt in range(3):
            pid = self.state.next_producer_id
            try:
                self.metadata.append([record("ProducerIdsRecord", nextProducerId=pid + 1)])
                return pid
            except BrokerError as err:
                # In a cluster another broker may have taken this id first; the refused append
                # caught the state up (kcli/cluster/conflicts.py), so the next id is free.
                if err.code != ErrorCode.not_controller or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    # ---- background ------------------------------------------------------------------------
    async def _retention_loop(self) -> None:
        from kcli.broker.background import TaskGuard

        interval = self.config.get_int("log.retention.check.interval.ms") / 1000
        # one partition whose retention fails is logged once and backed off; the others proceed
        guard = TaskGuard("log-retention", self.metrics, log)

        async def one_round() -> int:
            return self.run_retention(guard)

        while not self.stopping:
            await asyncio.sleep(interval)
            await guard.round(one_round, "retention round")

    def run_retention(self, guard: Any = None) -> int:
        """Classic retention of every local log (each partition through ``guard``, a
        :class:`kcli.broker.background.TaskGuard`, when given); returns segments deleted."""
        deleted = 0
        now = now_ms()
        for (topic, p), lg in list(self.logs.items()):
            t = self.topic(topic)
            if t is not None and self.tiered is not None and self.tiered.manages(t):
                continue  # the remote log manager applies local and total retention itself
            if guard is None:
                deleted += lg.delete_retention(now)
            else:
                deleted += guard.step_sync((topic, p), f"{topic}-{p}", lambda: lg.delete_retention(now)) or 0
        return deleted


def _kafka_uuid_str(u: uuid.UUID) -> str:
    """Kafka prints UUIDs as URL-safe base64 without padding (22 chars)."""
    import base64

    return base64.urlsafe_b64encode(u.bytes).decode().rstrip("=")
