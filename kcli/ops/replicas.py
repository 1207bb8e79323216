"""Leader elections and partition reassignments (kafka-leader-election.sh,
kafka-reassign-partitions.sh): ElectLeaders, AlterPartitionReassignments and
ListPartitionReassignments, sent as a Kafka admin client sends them — to the controller.

The reassignment JSON is Kafka's (``{"version":1,"partitions":[{"topic","partition","replicas",
"log_dirs"}]}``); ``generate`` proposes one with Kafka's AdminUtils.assignReplicasToBrokers
(rack-unaware: a random start, replicas shifted per round), as ``--generate --disable-rack-aware``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import TopicCollection

from kcli.errors import KafkaApiError, OperationError, UsageError
from kcli.ops.connection import Connection, admin
from kcli.ops.kafka_json import versioned_document
from kcli.protocol.errors import error_name

ELECTION_TYPES = {"preferred": 0, "unclean": 1}

# Kafka's exception class and default message for the errors these APIs answer (the Java tools
# print "<class>: <message>")
EXCEPTIONS = {
    "ELECTION_NOT_NEEDED": ("ElectionNotNeededException", "Leader election not needed for topic partition."),
    "PREFERRED_LEADER_NOT_AVAILABLE": ("PreferredLeaderNotAvailableException", "The preferred leader was not available."),
    "ELIGIBLE_LEADERS_NOT_AVAILABLE": ("EligibleLeadersNotAvailableException",
                                       "Eligible topic partition leaders are not available."),
    "UNKNOWN_TOPIC_OR_PARTITION": ("UnknownTopicOrPartitionException", "This server does not host this topic-partition."),
    "INVALID_REPLICA_ASSIGNMENT": ("InvalidReplicaAssignmentException", "Replica assignment is invalid."),
    "NO_REASSIGNMENT_IN_PROGRESS": ("NoReassignmentInProgressException", "No partition reassignment is in progress."),
    "CLUSTER_AUTHORIZATION_FAILED": ("ClusterAuthorizationException", "Cluster authorization failed."),
    "INVALID_REQUEST": ("InvalidRequestException", "This most likely occurs because of a request being malformed by the "
                                                   "client library or the message was sent to an incompatible broker. "
                                                   "See the broker logs for more details."),
}


def java_exception(name: str, message: str | None) -> str:
    cls, default = EXCEPTIONS.get(name, ("ApiException", name))
    return f"org.apache.kafka.common.errors.{cls}: {message or default}"


@dataclass
class PartitionResult:
    """One partition's answer: ``error`` None when it succeeded."""

    topic: str
    partition: int
    error: str | None = None  # Kafka's error name
    message: str | None = None

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "error": self.error, "message": self.message}


def _controller_request(conn: Connection, api_key: int, version: int, body: dict[str, Any]) -> Any:
    from kcli.ops.brokers import controller_address, wire_client

    with wire_client(conn, controller_address(conn)) as wire:
        resp = wire.request(api_key, version, body)
    code = int(getattr(resp, "error_code", 0) or 0)
    if code:
        name = error_name(code)
        raise KafkaApiError(name, getattr(resp, "error_message", None) or EXCEPTIONS.get(name, ("", name))[1], code)
    return resp


# ---- elections -----------------------------------------------------------------------------------
def elect_leaders(conn: Connection, election_type: str, partitions: list[tuple[str, int]] | None) -> list[PartitionResult]:
    """ElectLeaders for ``partitions`` (None: every partition; only those needing an election answer)."""
    kind = ELECTION_TYPES.get(election_type.lower())
    if kind is None:
        raise UsageError(f"election type must be preferred or unclean, got {election_type!r}")
    topics: dict[str, list[int]] = {}
    for topic, partition in partitions or []:
        if partition < 0:
            raise UsageError(f"partition must be >= 0, got {partition} for topic '{topic}'")
        topics.setdefault(topic, []).append(partition)
    body = {"election_type": kind, "timeout": int(conn.timeout_s * 1000),
            "topic_partitions": None if partitions is None else [{"topic": t, "partitions": ps} for t, ps in topics.items()]}
    resp = _controller_request(conn, 43, 2, body)
    out = []
    for tr in resp.replica_election_results:
        for pr in tr.partition_result:
            code = int(pr.error_code)
            out.append(PartitionResult(tr.topic, int(pr.partition_id), error_name(code) if code else None,
                                       pr.error_message or None))
    return sorted(out, key=lambda r: (r.topic, r.partition))


def election_lines(kind: str, results: list[PartitionResult]) -> list[str]:
    """LeaderElectionCommand's output."""
    done = [r.name for r in results if r.error is None]
    noop = [r.name for r in results if r.error == "ELECTION_NOT_NEEDED"]
    failed = [r for r in results if r.error and r.error != "ELECTION_NOT_NEEDED"]
    lines = []
    if done:
        lines.append(f"Successfully completed leader election ({kind}) for partitions {', '.join(done)}")
    if noop:
        lines.append(f"Valid replica already elected for partitions {', '.join(noop)}")
    for r in failed:
        lines.append(f"Error completing leader election ({kind}) for partition: {r.name}: "
                     f"{java_exception(r.error or '', r.message)}")
    return lines


# ---- reassignments -------------------------------------------------------------------------------
@dataclass
class Reassignment:
    """A running reassignment as ListPartitionReassignments answers it."""

    topic: str
    partition: int
    replicas: list[int]
    adding: list[int] = field(default_factory=list)
    removing: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "replicas": self.replicas,
                "adding_replicas": self.adding, "removing_replicas": self.removing}

    def line(self) -> str:
        """ReassignPartitionsCommand.curReassignmentsToString's line."""
        text = f"{self.topic}-{self.partition}: replicas: {','.join(map(str, self.replicas))}."
        if self.adding:
            text += f" adding: {','.join(map(str, self.adding))}."
        if self.removing:
            text += f" removing: {','.join(map(str, self.removing))}."
        return text


def list_reassignments(conn: Connection, partitions: list[tuple[str, int]] | None = None) -> list[Reassignment]:
    topics: dict[str, list[int]] = {}
    for t, p in partitions or []:
        topics.setdefault(t, []).append(p)
    body = {"timeout": int(conn.timeout_s * 1000),
            "topics": None if partitions is None else [{"name": t, "partition_indexes": ps} for t, ps in topics.items()]}
    resp = _controller_request(conn, 46, 0, body)
    out = [Reassignment(t.name, int(p.partition_index), [int(r) for r in p.replicas], [int(r) for r in p.adding_replicas],
                        [int(r) for r in p.removing_replicas]) for t in resp.topics for p in t.partitions]
    return sorted(out, key=lambda r: (r.topic, r.partition))


def alter_reassignments(conn: Connection, targets: dict[tuple[str, int], list[int] | None]) -> list[PartitionResult]:
    """AlterPartitionReassignments: each partition to its target replicas, or (None) cancelled."""
    topics: dict[str, list[dict[str, Any]]] = {}
    for (t, p), replicas in sorted(targets.items()):
        topics.setdefault(t, []).append({"partition_index": p, "replicas": replicas})
    resp = _controller_request(conn, 45, 0, {"timeout": int(conn.timeout_s * 1000),
                                             "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]})
    out = []
    for tr in resp.responses:
        for pr in tr.partitions:
            code = int(pr.error_code)
            out.append(PartitionResult(tr.name, int(pr.partition_index), error_name(code) if code else None,
                                       pr.error_message or None))
    return sorted(out, key=lambda r: (r.topic, r.partition))


def current_assignment(conn: Connection, topics: list[str]) -> dict[tuple[str, int], list[int]]:
    """Each partition's replicas (Metadata, through librdkafka); an unknown topic is an error."""
    client = admin(conn)
    futures = client.describe_topics(TopicCollection(sorted(set(topics))), request_timeout=conn.timeout_s)
    out: dict[tuple[str, int], list[int]] = {}
    for name, fut in futures.items():
        try:
            desc = client.wait(fut, f"topic '{name}'")
        except KafkaApiError as err:
            if err.name == "UNKNOWN_TOPIC_OR_PARTITION":
                raise KafkaApiError(err.name, f"Topic {name} not found.") from None
            raise
        for p in desc.partitions:
            out[(name, p.id)] = [r.id for r in p.replicas]
    return out


def live_broker_ids(conn: Connection) -> list[int]:
    from kcli.ops.brokers import cluster_view

    return [b.node_id for b in cluster_view(conn).brokers]


def check_brokers(conn: Connection, targets: dict[tuple[str, int], list[int] | None]) -> None:
    """Kafka's verifyBrokerIds: every target broker must be a live broker (UsageError: exit 2)."""
    live = set(live_broker_ids(conn))
    for (_t, _p), replicas in sorted(targets.items()):
        for r in replicas or []:
            if r not in live:
                raise UsageError(f"Unknown broker id {r}")


def generate(current: dict[tuple[str, int], list[int]], brokers: list[int],
             rng: random.Random | None = None) -> dict[tuple[str, int], list[int]]:
    """Kafka's calculateAssignment: per topic, AdminUtils.assignReplicasToBrokers over ``brokers``
    (rack-unaware) with the topic's partition count and first partition's replication factor."""
    rng = rng or random.Random()
    by_topic: dict[str, list[int]] = {}
    for (t, p) in current:
        by_topic.setdefault(t, []).append(p)
    out: dict[tuple[str, int], list[int]] = {}
    ids = sorted(brokers)
    for topic, parts in sorted(by_topic.items()):
        rf = len(current[(topic, min(parts))])
        if rf > len(ids):
            raise UsageError(f"Replication factor: {rf} larger than available brokers: {len(ids)}.")
        start = rng.randrange(len(ids))
        shift = rng.randrange(len(ids))
        for i, p in enumerate(sorted(parts)):
            if i > 0 and i % len(ids) == 0:
                shift += 1
            first = (i + start) % len(ids)
            replicas = [ids[first]]
            for j in range(rf - 1):
                replicas.append(ids[(first + 1 + (shift + j) % (len(ids) - 1)) % len(ids)])
            out[(topic, p)] = replicas
    return out


# ---- Kafka's reassignment JSON -------------------------------------------------------------------
def format_json(assignment: dict[tuple[str, int], list[int]]) -> str:
    """formatAsReassignmentJson: compact, sorted by topic and partition, log_dirs "any"."""
    parts = [{"topic": t, "partition": p, "replicas": r, "log_dirs": ["any"] * len(r)}
             for (t, p), r in sorted(assignment.items())]
    return json.dumps({"version": 1, "partitions": parts}, separators=(",", ":"))


def parse_reassignment_json(text: str) -> dict[tuple[str, int], list[int]]:
    """parsePartitionReassignmentData + parseExecuteAssignmentArgs' checks, with Kafka's messages."""
    doc = versioned_document(text)
    entries: list[tuple[tuple[str, int], list[int]]] = []
    for e in doc.get("partitions") or []:
        try:
            key = (str(e["topic"]), int(e["partition"]))
            replicas = [int(r) for r in e["replicas"]]
        except (KeyError, TypeError, ValueError) as err:
            raise UsageError(f"Invalid partition entry {json.dumps(e)}: {err}") from None
        dirs = e.get("log_dirs")
        if dirs is not None and len(dirs) != len(replicas):
            raise UsageError(f"Size of replicas list {replicas} is different from size of log dirs list {dirs} for "
                             f"partition {key[0]}-{key[1]}")
        if dirs is not None and any(d != "any" for d in dirs):
            raise UsageError("log_dirs other than \"any\": kcli brokers have one log directory (JBOD moves are not built)")
        entries.append((key, replicas))
    if not entries:
        raise UsageError("Partition reassignment list cannot be empty")
    if any(not r for _, r in entries):
        raise UsageError("Partition replica list cannot be empty")
    keys = [k for k, _ in entries]
    dups = sorted({k for k in keys if keys.count(k) > 1})
    if dups:
        raise UsageError("Partition reassignment contains duplicate topic partitions: "
                         + ",".join(f"{t}-{p}" for t, p in dups))
    multi = [f"{t}-{p} contains multiple entries for {','.join(str(x) for x in sorted({x for x in r if r.count(x) > 1}))}"
             for (t, p), r in entries if len(set(r)) != len(r)]
    if multi:
        raise UsageError("Partition replica lists may not contain duplicate entries: " + ". ".join(multi))
    return dict(entries)


def parse_topics_json(text: str) -> list[str]:
    """parseTopicsData: ``{"version":1,"topics":[{"topic":"t"}]}``."""
    doc = versioned_document(text)
    try:
        topics = [str(e["topic"]) for e in doc.get("topics") or []]
    except (KeyError, TypeError) as err:
        raise UsageError(f"Invalid topics entry: {err}") from None
    dups = sorted({t for t in topics if topics.count(t) > 1})
    if dups:
        raise UsageError(f"List of topics to reassign contains duplicate entries: {', '.join(dups)}")
    return topics


def parse_broker_list(text: str, option: str = "--broker-list") -> list[int]:
    """Comma-separated broker ids (``option`` names the flag they came from, for the message)."""
    try:
        ids = [int(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(f"{option} must be comma-separated broker ids, got {text!r}") from None
    dups = sorted({x for x in ids if ids.count(x) > 1})
    if dups:
        raise UsageError(f"Broker list contains duplicate entries: {', '.join(map(str, dups))}")
    return ids


@dataclass
class VerifyState:
    """findPartitionReassignmentStates: done, and the replicas now vs the target."""

    topic: str
    partition: int
    current: list[int]
    target: list[int]
    done: bool

    def line(self) -> str:
        name = f"{self.topic}-{self.partition}"
        if not self.done:
            return f"Reassignment of partition {name} is still in progress."
        if self.current == self.target:
            return f"Reassignment of partition {name} is completed."
        return (f"There is no active reassignment of partition {name}, but replica set is "
                f"{','.join(map(str, self.current))} rather than {','.join(map(str, self.target))}.")

    def to_dict(self) -> dict[str, Any]:
        state = "in_progress" if not self.done else ("completed" if self.current == self.target else "differs")
        return {"topic": self.topic, "partition": self.partition, "state": state, "replicas": self.current,
                "target_replicas": self.target}


def verify(conn: Connection, targets: dict[tuple[str, int], list[int]]) -> list[VerifyState]:
    running = {(r.topic, r.partition): r for r in list_reassignments(conn, sorted(targets))}
    current = current_assignment(conn, sorted({t for t, _ in targets}))
    out = []
    for key, target in sorted(targets.items()):
        if key not in current:
            raise KafkaApiError("UNKNOWN_TOPIC_OR_PARTITION", f"Unable to find partition: {key[0]}-{key[1]}")
        r = running.get(key)
        if r is not None:
            out.append(VerifyState(key[0], key[1], r.replicas, target, False))
        else:
            out.append(VerifyState(key[0], key[1], current[key], target, True))
    return out


def execute(conn: Connection, targets: dict[tuple[str, int], list[int]], *, additional: bool = False,
            throttle: int | None = None) -> tuple[dict[tuple[str, int], list[int]], list[PartitionResult]]:
    """Start the reassignments: (the current assignment of those partitions, each partition's
    answer). Refused (UsageError) while another runs without ``additional``, or when a target
    broker is not live. With ``throttle`` (bytes/s) the replication throttles are set first
    (kcli.ops.reassign_throttle); when every partition is already moving (a resubmission with
    ``additional``) only the brokers' rates change, as Kafka does."""
    from kcli.ops import reassign_throttle

    reassign_throttle.check_throttle(throttle)
    running = {(r.topic, r.partition): r for r in list_reassignments(conn)} if throttle or not additional else {}
    if not additional and running:
        raise UsageError("Cannot execute because there is an existing partition assignment.  Use --additional to "
                         "override this and create a new partition assignment in addition to the existing one. The "
                         "--additional flag can also be used to change the throttle by resubmitting the current "
                         "reassignment.")
    check_brokers(conn, targets)  # type: ignore[arg-type]
    current = current_assignment(conn, sorted({t for t, _ in targets}))
    missing = [f"{t}-{p}" for t, p in sorted(targets) if (t, p) not in current]
    if missing:
        raise KafkaApiError("UNKNOWN_TOPIC_OR_PARTITION", "Unable to find partition: " + ", ".join(missing))
    if throttle is not None:
        # a running move's own current replicas are its original ones (replicas less adding)
        before = {k: ([b for b in running[k].replicas if b not in running[k].adding] if k in running else current[k])
                  for k in targets}
        reassign_throttle.apply(conn, before, dict(targets), throttle, rates_only=all(k in running for k in targets))
    results = alter_reassignments(conn, dict(targets))
    return {k: current[k] for k in sorted(targets)}, results


def cancel(conn: Connection, partitions: list[tuple[str, int]]) -> list[PartitionResult]:
    """Cancel the running reassignments among ``partitions`` (the others are left out)."""
    running = [(r.topic, r.partition) for r in list_reassignments(conn, partitions)]
    if not running:
        return []
    return alter_reassignments(conn, {k: None for k in running})


def raise_if_failed(results: list[PartitionResult], what: str) -> None:
    """One failed partition: the error of it (exit 2 for an invalid assignment, 1 otherwise)."""
    failed = [r for r in results if r.error]
    if not failed:
        return
    text = "; ".join(f"{r.name}: {r.error}: {r.message or EXCEPTIONS.get(r.error, ('', ''))[1]}" for r in failed)
    if all(r.error == "INVALID_REPLICA_ASSIGNMENT" for r in failed):
        raise UsageError(f"{what}: {text}")
    raise OperationError(f"{what}: {text}")


def clear_throttles(conn: Connection, targets: dict[tuple[str, int], list[int]]) -> Any:
    """Kafka's clearAllThrottles after a completed --verify or a --cancel: the replica throttle
    lists of the plan's topics and the rates on every live broker (the old replicas of a finished
    move are no longer known). A kcli.ops.reassign_throttle.Cleared."""
    from kcli.ops import reassign_throttle

    return reassign_throttle.clear(conn, sorted({t for t, _ in targets}), live_broker_ids(conn))
