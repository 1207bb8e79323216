"""The cluster metadata log: KRaft-named records in an append-only file, replayed at start.

File ``<data_dir>/__cluster_metadata/metadata.log``; one record per line as
``<crc32c hex> <json>``. Every append is fsynced before the change is visible to clients,
so a metadata change that was answered survives a crash. A torn or corrupt last line (the
crash happened mid-write) is cut off on replay; damage before the last line stops start-up
with a clear error instead of guessing.

Every record is checked by :func:`check_record` before it is written, so no request can store
a record the broker cannot replay. A record that is whole (good CRC) but unusable — written by an
older kcli, or edited by hand — is skipped on replay with one log line: one topic's bad config
never keeps the broker down (the topic keeps its previous value, or the default).
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from kio.schema.errors import ErrorCode

from kcli.security.acl import AclBinding, check_acl_record
from kcli.config.definitions import (ALTERABLE_BROKER_CONFIGS, BROKER_CONFIGS, TOPIC_CONFIGS, ConfigError,
                                     broker_config_def, parse_value)
from kcli.security.scram import ScramCredential, check_credential_record
from kcli.crcjson import decode_line, encode_line
from kcli.protocol.errors import BrokerError

log = logging.getLogger("kcli.broker.metadata")

# Partition modes (KIP-694).
MODE_READ_WRITE = 0
MODE_READ_ONLY = 1
MODE_NONE = -1
MODE_NAMES = {MODE_READ_WRITE: "ReadWrite", MODE_READ_ONLY: "ReadOnly", MODE_NONE: "None"}


class MetadataLogError(Exception):
    """The metadata log cannot be read or written."""


class InvalidRecordError(BrokerError):
    """A metadata record the broker could not replay; refused before it is written."""


TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")

# Fields each record type must carry, with their JSON types; _apply reads exactly these.
_INT, _STR, _LIST = (int,), (str,), (list,)
_REQUIRED: dict[str, dict[str, tuple[type, ...]]] = {
    "ClusterIdRecord": {"clusterId": _STR},
    "TopicRecord": {"name": _STR, "topicId": _STR},
    "PartitionRecord": {"topicId": _STR, "partitionId": _INT, "leader": _INT, "replicas": _LIST, "isr": _LIST},
    "PartitionChangeRecord": {"topicId": _STR, "partitionId": _INT},
    "DeleteTopicPartitionsRecord": {"topicId": _STR, "partitions": _LIST, "deleteAtMs": _INT},
    "ConfigRecord": {"resourceType": _INT, "resourceName": _STR, "name": _STR},
    "TopicTieredStateRecord": {"topicId": _STR, "tieredEpoch": _INT, "tieredState": _STR},
    "RemoveTopicRecord": {"topicId": _STR},
    "ProducerIdsRecord": {"nextProducerId": _INT},
    # KRaft's SCRAM records; salt and keys as base64 (kcli/security/scram.py)
    "UserScramCredentialRecord": {"name": _STR, "mechanism": _INT, "salt": _STR, "storedKey": _STR,
                                  "serverKey": _STR, "iterations": _INT},
    "RemoveUserScramCredentialRecord": {"name": _STR, "mechanism": _INT},
    # KRaft's ACL records (kcli/security/acl.py)
    "AccessControlEntryRecord": {"id": _STR, "resourceType": _INT, "resourceName": _STR, "patternType": _INT,
                                 "principal": _STR, "host": _STR, "operation": _INT, "permissionType": _INT},
    "RemoveAccessControlEntryRecord": {"id": _STR},
}


def check_record(rec: Any) -> None:
    """Raise InvalidRecordError unless ``rec`` can be replayed: a known type, its fields present
    with the right types, ids that parse, a legal topic name, and config values that pass the
    same validation a request gets (so start-up never meets a value it refuses)."""
    if not isinstance(rec, dict) or not isinstance(rec.get("data"), dict):
        raise InvalidRecordError(ErrorCode.unknown_server_error, "metadata record is not {type, data}")
    kind, d = rec.get("type"), rec["data"]
    fields = _REQUIRED.get(kind) if isinstance(kind, str) else None
    if fields is None:
        raise InvalidRecordError(ErrorCode.unknown_server_error, f"unknown metadata record type {kind}")
    for name, types in fields.items():
        v = d.get(name)
        if not isinstance(v, types) or isinstance(v, bool):
            raise InvalidRecordError(ErrorCode.unknown_server_error, f"{kind} field {name} is missing or not {types[0].__name__}")
    try:
        if "topicId" in d:
            uuid.UUID(d["topicId"])
    except ValueError:
        raise InvalidRecordError(ErrorCode.unknown_server_error, f"{kind} has a bad topicId {d['topicId']!r}") from None
    if kind == "TopicRecord" and (not _LEGAL_TOPIC.match(d["name"]) or d["name"] in (".", "..")):
        raise InvalidRecordError(ErrorCode.unknown_server_error, f"TopicRecord has an illegal topic name {d['name']!r}")
    if kind == "ConfigRecord":
        _check_config(d)
    if kind == "PartitionChangeRecord":
        _check_partition_change(d)
    if kind in ("UserScramCredentialRecord", "RemoveUserScramCredentialRecord"):
        try:
            check_credential_record(kind, d)
        except ValueError as err:
            raise InvalidRecordError(ErrorCode.unknown_server_error, str(err)) from None
    if kind in ("AccessControlEntryRecord", "RemoveAccessControlEntryRecord"):
        try:
            check_acl_record(kind, d)
        except ValueError as err:
            raise InvalidRecordError(ErrorCode.unknown_server_error, f"{kind}: {err}") from None


def _ints(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)


def _check_partition_change(d: dict[str, Any]) -> None:
    """Kafka's PartitionChangeRecord fields (leader, isr, leaderEpoch, replicas, addingReplicas,
    removingReplicas) plus kcli's fencing fields
    (``expectedPartitionEpoch``, ``expectedLeaderEpoch``: the partition state the change was
    computed from; kcli/cluster/conflicts.py refuses it against any other)."""
    for name in ("leader", "leaderEpoch", "mode", "expectedPartitionEpoch", "expectedLeaderEpoch"):
        if name in d and (not isinstance(d[name], int) or isinstance(d[name], bool)):
            raise InvalidRecordError(ErrorCode.unknown_server_error, f"PartitionChangeRecord field {name} is not int")
    if "isr" in d:
        if not _ints(d["isr"]) or len(set(d["isr"])) != len(d["isr"]) or not d["isr"]:
            raise InvalidRecordError(ErrorCode.unknown_server_error, "PartitionChangeRecord isr is not a list of distinct broker ids")
        if d.get("leader", -1) >= 0 and d["leader"] not in d["isr"]:
            raise InvalidRecordError(ErrorCode.unknown_server_error,
                                     f"PartitionChangeRecord leader {d['leader']} is not in its isr {d['isr']}")
    if d.get("leader", 0) < -1:
        raise InvalidRecordError(ErrorCode.unknown_server_error, f"PartitionChangeRecord leader {d['leader']} is not a broker id or -1")
    # Kafka's reassignment fields: the replica set (adding replicas included, removing ones not yet
    # dropped) and, while a reassignment runs, the replicas it adds and removes
    for name in ("replicas", "addingReplicas", "removingReplicas"):
        if name in d and (not _ints(d[name]) or len(set(d[name])) != len(d[name]) or any(r < 0 for r in d[name])):
            raise InvalidRecordError(ErrorCode.unknown_server_error, f"PartitionChangeRecord {name} is not a list of distinct broker ids")
    if "replicas" in d:
        reps = d["replicas"]
        if not reps:
            raise InvalidRecordError(ErrorCode.unknown_server_error, "PartitionChangeRecord replicas is empty")
        for name in ("addingReplicas", "removingReplicas", "isr"):
            if any(r not in reps for r in d.get(name, [])):
                raise InvalidRecordError(ErrorCode.unknown_server_error,
                                         f"PartitionChangeRecord {name} {d[name]} are not all in its replicas {reps}")
        if d.get("leader", -1) >= 0 and d["leader"] not in reps:
            raise InvalidRecordError(ErrorCode.unknown_server_error,
                                     f"PartitionChangeRecord leader {d['leader']} is not in its replicas {reps}")
    if set(d.get("addingReplicas", [])) & set(d.get("removingReplicas", [])):
        raise InvalidRecordError(ErrorCode.unknown_server_error, "PartitionChangeRecord adds and removes the same replica")


def _check_config(d: dict[str, Any]) -> None:
    if "value" not in d:  # null deletes the config; absent is a malformed record
        raise InvalidRecordError(ErrorCode.unknown_server_error, f"ConfigRecord of {d['name']} has no value field")
    value = d["value"]
    if value is not None and not isinstance(value, str):
        raise InvalidRecordError(ErrorCode.invalid_config, f"ConfigRecord value of {d['name']} is not a string")
    if d["resourceType"] == TOPIC_RESOURCE:
        defs = TOPIC_CONFIGS
    elif d["resourceType"] == BROKER_RESOURCE:
        defs = BROKER_CONFIGS
    else:
        raise InvalidRecordError(ErrorCode.unknown_server_error, f"ConfigRecord has an unknown resource type {d['resourceType']}")
    cd = defs.get(d["name"]) if defs is TOPIC_CONFIGS else broker_config_def(d["name"])
    if cd is None:
        raise InvalidRecordError(ErrorCode.invalid_config, f"Unknown {'topic' if defs is TOPIC_CONFIGS else 'broker'} config name: {d['name']}")
    if defs is BROKER_CONFIGS:
        # resource name "" is the cluster-wide default, else a broker's node id (Kafka's BROKER resource)
        if d["resourceName"] and not d["resourceName"].isdigit():
            raise InvalidRecordError(ErrorCode.invalid_request, f"Unable to parse broker name {d['resourceName']!r} as a base 10 number.")
        if d["name"] not in ALTERABLE_BROKER_CONFIGS:  # kcli's dynamic configs, Kafka's that kcli stores only
            raise InvalidRecordError(ErrorCode.invalid_request, f"Cannot update these configs dynamically: Set({d['name']})")
    if value is None:
        return
    try:
        parse_value(cd, value)
    except ConfigError as err:
        raise InvalidRecordError(ErrorCode.invalid_config, str(err)) from None


@dataclass
class PartitionState:
    partition: int
    leader: int
    replicas: list[int]
    isr: list[int]
    leader_epoch: int = 0
    partition_epoch: int = 0
    mode: int = MODE_READ_WRITE
    delete_at_ms: int | None = None  # set while a KIP-694 deletion is pending
    # a reassignment in progress (Kafka's addingReplicas / removingReplicas; both within replicas)
    adding_replicas: list[int] = field(default_factory=list)
    removing_replicas: list[int] = field(default_factory=list)


@dataclass
class TopicState:
    name: str
    topic_id: uuid.UUID
    partitions: dict[int, PartitionState] = field(default_factory=dict)
    configs: dict[str, str] = field(default_factory=dict)
    # KIP-950
    tiered_epoch: int = 0
    tiered_state: str = "NONE"  # NONE | ENABLED | DISABLING | DISABLED

    def live_partitions(self) -> list[PartitionState]:
        return [p for _, p in sorted(self.partitions.items()) if p.mode != MODE_NONE]


@dataclass
class ClusterState:
    cluster_id: str = ""
    topics: dict[str, TopicState] = field(default_factory=dict)
    # Dynamic broker configs (ConfigRecords of resource type BROKER): resource name ("" = the
    # cluster-wide default, else a node id) -> config name -> value
    broker_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    next_producer_id: int = 1000
    # SCRAM credentials: user name -> mechanism type (1 SHA-256, 2 SHA-512) -> credential
    scram_credentials: dict[str, dict[int, ScramCredential]] = field(default_factory=dict)
    # ACLs by record id (AccessControlEntryRecord); the authorizer reads them (kcli/security/acl.py)
    acls: dict[str, AclBinding] = field(default_factory=dict)
    acls_version: int = 0  # bumped by every ACL record: the authorizer re-indexes then

    def scram_credential(self, user: str, mechanism_type: int) -> ScramCredential | None:
        return self.scram_credentials.get(user, {}).get(mechanism_type)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicState | None:
        for t in self.topics.values():
            if t.topic_id == topic_id:
                return t
        return None


def _apply(state: ClusterState, rec: dict[str, Any]) -> None:
    kind = rec["type"]
    d = rec["data"]
    if kind == "ClusterIdRecord":
        state.cluster_id = d["clusterId"]
    elif kind == "TopicRecord":
        state.topics[d["name"]] = TopicState(d["name"], uuid.UUID(d["topicId"]))
    elif kind == "PartitionRecord":
        t = state.topic_by_id(uuid.UUID(d["topicId"]))
        if t is not None:
            t.partitions[d["partitionId"]] = PartitionState(
                d["partitionId"], d["leader"], d["replicas"], d["isr"], d.get("leaderEpoch", 0),
                d.get("partitionEpoch", 0), d.get("mode", MODE_READ_WRITE), d.get("deleteAtMs"),
                list(d.get("addingReplicas") or []), list(d.get("removingReplicas") or []),
            )
    elif kind == "PartitionChangeRecord":
        t = state.topic_by_id(uuid.UUID(d["topicId"]))
        if t is not None and d["partitionId"] in t.partitions:
            p = t.partitions[d["partitionId"]]
            if "mode" in d:
                p.mode = d["mode"]
            if "deleteAtMs" in d:
                p.delete_at_ms = d["deleteAtMs"]
            if "leaderEpoch" in d:
                p.leader_epoch = d["leaderEpoch"]
            if "leader" in d:
                p.leader = d["leader"]
            if "isr" in d:
                p.isr = list(d["isr"])
            if "replicas" in d:
                p.replicas = list(d["replicas"])
            if "addingReplicas" in d:
                p.adding_replicas = list(d["addingReplicas"])
            if "removingReplicas" in d:
                p.removing_replicas = list(d["removingReplicas"])
            p.partition_epoch += 1
            if p.mode == MODE_NONE:
                del t.partitions[d["partitionId"]]
    elif kind == "DeleteTopicPartitionsRecord":
        t = state.topic_by_id(uuid.UUID(d["topicId"]))
        if t is not None:
            for pid in d["partitions"]:
                if pid in t.partitions:
                    t.partitions[pid].mode = MODE_READ_ONLY
                    t.partitions[pid].delete_at_ms = d["deleteAtMs"]
    elif kind == "ConfigRecord":
        if d["resourceType"] == 2:
            t = state.topics.get(d["resourceName"])
            target = t.configs if t is not None else None
        else:
            target = state.broker_configs.setdefault(d["resourceName"], {})
        if target is not None:
            if d["value"] is None:
                target.pop(d["name"], None)
            else:
                target[d["name"]] = d["value"]
        if d["resourceType"] == BROKER_RESOURCE and not state.broker_configs.get(d["resourceName"], True):
            del state.broker_configs[d["resourceName"]]
    elif kind == "TopicTieredStateRecord":
        t = state.topic_by_id(uuid.UUID(d["topicId"]))
        if t is not None:
            t.tiered_epoch = d["tieredEpoch"]
            t.tiered_state = d["tieredState"]
    elif kind == "RemoveTopicRecord":
        t = state.topic_by_id(uuid.UUID(d["topicId"]))
        if t is not None:
            del state.topics[t.name]
    elif kind == "ProducerIdsRecord":
        state.next_producer_id = d["nextProducerId"]
    elif kind == "UserScramCredentialRecord":
        state.scram_credentials.setdefault(d["name"], {})[d["mechanism"]] = ScramCredential.from_record_data(d)
    elif kind == "RemoveUserScramCredentialRecord":
        # Tolerant of a credential already gone: two brokers of a cluster may remove it concurrently.
        creds = state.scram_credentials.get(d["name"], {})
        creds.pop(d["mechanism"], None)
        if not creds:
            state.scram_credentials.pop(d["name"], None)
    elif kind == "AccessControlEntryRecord":
        state.acls[d["id"]] = AclBinding.from_record_data(d)
        state.acls_version += 1
    elif kind == "RemoveAccessControlEntryRecord":
        state.acls.pop(d["id"], None)  # tolerant: two brokers of a cluster may remove it concurrently
        state.acls_version += 1
    else:
        raise MetadataLogError(f"unknown metadata record type {kind}")


def apply_record(state: ClusterState, rec: dict[str, Any]) -> None:
    """Apply one checked record to ``state`` (shared by every cluster-state store, kcli/cluster/)."""
    _apply(state, rec)


def record(kind: str, **data: Any) -> dict[str, Any]:
    """A metadata record ``{"type": kind, "data": {...}}`` with UUIDs as strings."""
    clean = {k: (str(v) if isinstance(v, uuid.UUID) else v) for k, v in data.items()}
    return {"type": kind, "data": clean}


class MetadataLog:
    """Append-only, fsynced metadata log with replay into a :class:`ClusterState`."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir / "__cluster_metadata"
        self.path = self.dir / "metadata.log"
        self.state = ClusterState()
        self._fd: int | None = None

    def open(self) -> ClusterState:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            self._replay()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return self.state

    def _replay(self) -> None:
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        good_end = 0
        pos = 0
        for i, line in enumerate(lines):
            end = pos + len(line) + 1
            if not line:
                pos = end
                continue
            rec = self._decode(line)
            is_last = i >= len(lines) - 2  # the last line, or the last before a trailing newline
            if rec is None or (i == len(lines) - 1 and not data.endswith(b"\n")):
                if is_last:
                    break  # torn tail from a crash: drop it
                raise MetadataLogError(f"corrupt record at byte {pos} of {self.path}")
            try:
                check_record(rec)
                _apply(self.state, rec)
            except (InvalidRecordError, KeyError, TypeError, ValueError) as err:
                # Whole but unusable: skip it, keep the broker (and the topic) up.
                kind = rec.get("type") if isinstance(rec, dict) else None
                log.error("ignoring metadata record %s at byte %d of %s: %s", kind, pos, self.path,
                          getattr(err, "message", None) or err)
            good_end = min(end, len(data))
            pos = end
        if good_end < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(good_end)
                os.fsync(f.fileno())

    _decode = staticmethod(decode_line)

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        """Write and fsync ``records`` as one unit, then apply them to the state."""
        records = list(records)
        if not records:
            return
        for rec in records:  # the one gate every metadata change passes (raises InvalidRecordError)
            check_record(rec)
        if self._fd is None:
            raise MetadataLogError("metadata log is not open")
        chunk = bytearray()
        for rec in records:
            chunk += encode_line(rec)
        start = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            view = memoryview(bytes(chunk))
            while view:  # a full disk or a file size limit can make a write short
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        except OSError as err:
            if self.state.cluster_id:  # before it, only a first start appends, and reports its own error line
                log.error("%s: append of %d metadata record(s) failed: %s", self.path, len(records), err)
            # A torn record left here would sit before the next append and make the log unreadable.
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                pass
            raise
        for rec in records:
            _apply(self.state, rec)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def partition_record(topic_id: uuid.UUID, p: PartitionState) -> dict[str, Any]:
    d = asdict(p)
    extra = {}
    if d["adding_replicas"] or d["removing_replicas"]:
        extra = {"addingReplicas": d["adding_replicas"], "removingReplicas": d["removing_replicas"]}
    return record(
        "PartitionRecord", topicId=topic_id, partitionId=d["partition"], leader=d["leader"],
        replicas=d["replicas"], isr=d["isr"], leaderEpoch=d["leader_epoch"],
        partitionEpoch=d["partition_epoch"], mode=d["mode"], deleteAtMs=d["delete_at_ms"], **extra,
    )
