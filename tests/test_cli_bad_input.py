"""Bad input for every kcli command: one `kcli: error:` line, exit 2 (usage) or 1 (a failed
operation), never a traceback, and nothing changed on the cluster or in local files.

The command list comes from walking the Typer app, so a new command without cases here fails
test_every_command_has_bad_input_cases. Cases run through kcli's real entry point
(kcli.cli.app.main) in this process against a real broker; a sample also runs as real
processes, and `broker start` cases always do (a case that wrongly succeeded would serve forever).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.brokerproc import BrokerProcess

REPO = Path(__file__).resolve().parents[1]
CLASSIC, DISKLESS, TIERED = "matrix-classic", "matrix-diskless", "matrix-tiered"
MISSING = "no-such-topic-xyz"
PROBLEM_LINE = re.compile(r"^\S.*:\d+:\d+: ")  # a runbook problem, FILE:LINE:COL: message


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    code: int  # 2 usage, 1 failed operation
    needle: str = ""  # must appear in the error line
    stdin: str = ""
    online: bool = False  # gets -b <broker> in front
    process: bool = False  # run as a real process (always for broker start)
    problem_lines: bool = False  # a runbook: FILE:LINE:COL problem lines before the error line

    def argv(self, env: "Env") -> list[str]:
        args = [a.format(**env.subst) for a in self.args]
        return (["-b", env.bootstrap] if self.online else []) + args


def C(*args: str, code: int = 2, needle: str = "", **kw: Any) -> Case:
    return Case(tuple(args), code, needle, **kw)


def O(*args: str, code: int = 1, needle: str = "", **kw: Any) -> Case:  # noqa: E743 - online
    return Case(tuple(args), code, needle, online=True, **kw)


CASES: dict[str, list[Case]] = {
    "produce": [
        C("produce", needle="--topic"),
        O("produce", "-t", CLASSIC, "--acks", "7", code=2, needle="acks"),
        O("produce", "-t", CLASSIC, "--compression", "brotli", code=2, needle="compression"),
        O("produce", "-t", CLASSIC, "--partition", "-1", code=2, needle="--partition"),
        O("produce", "-t", CLASSIC, "--property", "novalue", code=2, needle="--property"),
        O("produce", "-t", MISSING, stdin="x\n", needle=MISSING),
        O("produce", "-t", CLASSIC, "--partition", "99", stdin="x\n"),
        O("produce", "-t", CLASSIC, "-H", "novalue", stdin="x\n", code=2, needle="--header"),
        O("produce", "-t", CLASSIC, "--header", "=v", stdin="x\n", code=2, needle="--header"),
        O("produce", "-t", CLASSIC, "--timestamp", "-5", stdin="x\n", code=2, needle="--timestamp"),
        O("produce", "-t", CLASSIC, "--timeout", "0", stdin="x\n", code=2, needle="--timeout must be > 0"),
        O("produce", "-t", CLASSIC, "--timeout", "soon", stdin="x\n", code=2, needle="--timeout"),
        O("produce", "-t", CLASSIC, "--timeout", "5", "--property", "message.timeout.ms=100", stdin="x\n", code=2,
          needle="--timeout and --property message.timeout.ms"),
    ],
    "consume": [
        C("consume", needle="--topic"),
        O("consume", "-t", CLASSIC, "--partition", "0", "--offset", "abc", code=2, needle="--offset"),
        O("consume", "-t", CLASSIC, "--max-messages", "0", code=2, needle="--max-messages"),
        O("consume", "-t", CLASSIC, "--offset", "5", code=2, needle="--offset"),
        O("consume", "-t", MISSING, "--timeout-ms", "300", needle=MISSING),
        O("consume", "-t", CLASSIC, "-f", "%x", code=2, needle="%x"),
        O("consume", "-t", CLASSIC, "-f", "%s", "-o", "json", code=2, needle="--format"),
        O("consume", "-t", CLASSIC, "--offset", "s@soon", code=2, needle="--offset"),
        O("consume", "-t", CLASSIC, "--partition", "0", "--offset", "999999", "--max-messages", "1",
          needle="OFFSET_OUT_OF_RANGE"),
    ],
    "groups list": [
        O("groups", "list", "--state", "Sleeping", code=2, needle="Sleeping"),
    ],
    "groups describe": [
        C("groups", "describe", needle="--group"),
        C("groups", "describe", "-g", "a", "--all-groups", needle="--all-groups"),
        O("groups", "describe", "-g", "no-such-group", needle="GROUP_ID_NOT_FOUND"),
        O("groups", "describe", "-g", " ", code=2, needle="--group"),
    ],
    "groups delete": [
        C("groups", "delete", needle="--group"),
        O("groups", "delete", "-g", "no-such-group", needle="GROUP_ID_NOT_FOUND"),
    ],
    "groups reset-offsets": [
        C("groups", "reset-offsets", needle="--group"),
        C("groups", "reset-offsets", "-g", "g", "--topic", CLASSIC, needle="exactly one"),
        C("groups", "reset-offsets", "-g", "g", "--topic", CLASSIC, "--to-earliest", "--to-latest", needle="exactly one"),
        C("groups", "reset-offsets", "-g", "g", "--to-earliest", needle="--all-topics"),
        C("groups", "reset-offsets", "-g", "g", "--topic", CLASSIC, "--to-earliest", "--execute", "--dry-run",
          needle="--dry-run"),
        C("groups", "reset-offsets", "-g", "g", "--topic", CLASSIC, "--to-offset", "-1", needle="--to-offset"),
        C("groups", "reset-offsets", "-g", "g", "--topic", CLASSIC, "--to-datetime", "yesterday", needle="--to-datetime"),
        C("groups", "reset-offsets", "-g", "g", "--topic", CLASSIC, "--by-duration", "1h", needle="--by-duration"),
        C("groups", "reset-offsets", "-g", "g", "--from-file", "{tmp}/no-such.csv", needle="no-such.csv"),
        C("groups", "reset-offsets", "-g", "g", "--from-file", "{tmp}/garbage-users", needle="garbage-users"),
        C("groups", "reset-offsets", "-g", "g", "--topic", f"{CLASSIC}:x", "--to-earliest", needle=f"{CLASSIC}:x"),
        O("groups", "reset-offsets", "-g", "g", "--topic", MISSING, "--to-earliest", needle=MISSING),
        O("groups", "reset-offsets", "-g", "g", "--topic", f"{CLASSIC}:99", "--to-earliest", needle="99"),
        O("groups", "reset-offsets", "-g", "g", "--all-topics", "--to-earliest", "--execute", needle="no committed offsets"),
    ],
    "groups delete-offsets": [
        C("groups", "delete-offsets", "-g", "g", needle="--topic"),
        O("groups", "delete-offsets", "-g", "no-such-group", "--topic", CLASSIC, needle="GROUP_ID_NOT_FOUND"),
        O("groups", "delete-offsets", "-g", "g", "--topic", MISSING, needle=MISSING),
    ],
    "share-groups list": [
        O("share-groups", "list", "--state", "Sleeping", code=2, needle="Sleeping"),
    ],
    "share-groups describe": [
        C("share-groups", "describe", needle="--group"),
        O("share-groups", "describe", "-g", "no-such-group", needle="GROUP_ID_NOT_FOUND"),
    ],
    "share-groups reset-offsets": [
        C("share-groups", "reset-offsets", "-g", "g", needle="exactly one"),
        C("share-groups", "reset-offsets", "-g", "g", "--topic", CLASSIC, "--to-earliest", "--to-latest",
          needle="exactly one"),
        C("share-groups", "reset-offsets", "-g", "g", "--topic", CLASSIC, "--to-offset", "-1", needle="--to-offset"),
        C("share-groups", "reset-offsets", "-g", "g", "--topic", CLASSIC, "--to-earliest", "--execute", "--dry-run",
          needle="--dry-run"),
        O("share-groups", "reset-offsets", "-g", "g", "--topic", MISSING, "--to-earliest", needle=MISSING),
    ],
    "share-groups delete-offsets": [
        C("share-groups", "delete-offsets", "-g", "g", needle="--topic"),
    ],
    "share-groups delete": [
        C("share-groups", "delete", needle="--group"),
        O("share-groups", "delete", "-g", "no-such-group", needle="GROUP_ID_NOT_FOUND"),
    ],
    "dump-log": [
        C("dump-log", needle="PATH"),
        C("dump-log", "{tmp}/does-not-exist.log", code=1, needle="does-not-exist.log"),
        C("dump-log", "{segment}", "--key-decoder", "rot13", needle="--key-decoder"),
        C("dump-log", "{segment}", "--max-bytes", "-1", needle="--max-bytes"),
        C("dump-log", "{segment}", "--object-key", "wal/x", needle="--coordinator"),
        C("dump-log", "{segment}", "--coordinator", "mysql://db/x", needle="mysql"),
        C("dump-log", "{segment}", "--coordinator", "{tmp}/no-such-coordinator.db", needle="no-such-coordinator.db"),
        # a port that is not a number, and a password that must not show
        C("dump-log", "{segment}", "--coordinator", "postgresql://u:s3cret@h:abc/db", needle="postgresql://u:***@h:abc/db"),
        C("dump-log", "{segment}", "-o", "yaml", needle="yaml"),
    ],
    "completion": [
        C("completion", needle="shell"),
        C("completion", "tcsh", needle="tcsh"),
    ],
    "context list": [
        C("context", "list", "extra", needle="extra"),
    ],
    "context show": [
        C("context", "show", "nope", needle="nope"),
    ],
    "context use": [
        C("context", "use", needle="NAME"),
        C("context", "use", "nope", needle="nope"),
    ],
    "context set": [
        C("context", "set", "fresh", needle="--bootstrap-server"),
        C("context", "set", "dev", "--property", "novalue", needle="--property"),
        C("context", "set", "dev", "--unset-property", "never.set", needle="never.set"),
        C("context", "set", "fresh", "-b", "no:port", needle="HOST:PORT"),
    ],
    "context delete": [
        C("context", "delete", "nope", needle="nope"),
    ],
    "topics create": [
        C("topics", "create", needle="--topic"),
        O("topics", "create", "-t", "fresh-x", "--partitions", "0", code=2, needle="--partitions"),
        O("topics", "create", "-t", CLASSIC, needle="TOPIC_ALREADY_EXISTS"),
        O("topics", "create", "-t", "bad name!", code=2, needle="illegal"),
        O("topics", "create", "-t", "fresh-x", "--config", "retention.ms=abc", needle="retention.ms"),
        O("topics", "create", "-t", "fresh-x", "--config", "no.such.config=1", needle="no.such.config"),
        O("topics", "create", "-t", "fresh-x", "--config", "novalue", code=2, needle="--config"),
        O("topics", "create", "-t", "fresh-x", "--replication-factor", "3", needle="INVALID_REPLICATION_FACTOR"),
        O("topics", "create", "-t", "fresh-x", "--diskless", "--config", "diskless.enable=false", code=2,
          needle="--diskless"),
        O("topics", "create", "-t", "fresh-x", "--diskless", "--config", "remote.storage.enable=maybe",
          needle="remote.storage.enable"),  # a diskless topic may tier (docs/diskless-tiering.md): a bad value
    ],
    "topics list": [
        O("topics", "list", "--diskless", "--classic", code=2, needle="at most one"),
        C("-o", "xml", "topics", "list", needle="xml"),
    ],
    "topics describe": [
        O("topics", "describe", "-t", MISSING, needle=MISSING),
    ],
    "topics alter": [
        C("topics", "alter", needle="--topic"),
        O("topics", "alter", "-t", CLASSIC, code=2),
        O("topics", "alter", "-t", MISSING, "--config", "retention.ms=1", needle=MISSING),
        O("topics", "alter", "-t", CLASSIC, "--config", "retention.ms=abc", needle="retention.ms"),
        O("topics", "alter", "-t", CLASSIC, "--partitions", "0", code=2, needle="--partitions"),
        O("topics", "alter", "-t", CLASSIC, "--delete-config", "a=b", code=2, needle="--delete-config"),
        O("topics", "alter", "-t", TIERED, "--disable-tiering", "--enable-tiering", code=2, needle="exclusive"),
        O("topics", "alter", "-t", TIERED, "--policy", "delete", code=2, needle="--policy"),
        # --policy is a choice (retain|delete): a usage error naming the choices, before the cluster is asked.
        O("topics", "alter", "-t", TIERED, "--disable-tiering", "--policy", "shred", code=2,
          needle="is not one of 'retain', 'delete'"),
        # a diskless topic may tier (docs/diskless-tiering.md): a bad value is still refused
        O("topics", "alter", "-t", DISKLESS, "--config", "remote.storage.enable=yes", needle="remote.storage.enable"),
        O("topics", "alter", "-t", DISKLESS, "--config", "diskless.enable=false", needle="diskless.enable"),
        O("topics", "alter", "-t", TIERED, "--wait", code=2, needle="--wait goes with"),
        O("topics", "alter", "-t", TIERED, "--disable-tiering", "--timeout", "5", code=2, needle="--timeout goes with --wait"),
        O("topics", "alter", "-t", TIERED, "--disable-tiering", "--wait", "--timeout", "-1", code=2, needle="--timeout"),
        O("topics", "alter", "-t", TIERED, "--disable-tiering", "--wait", "--dry-run", code=2, needle="mutually exclusive"),
    ],
    "topics delete": [
        C("topics", "delete", needle="--topic"),
        O("topics", "delete", "-t", MISSING, needle=MISSING),
    ],
    "topics elect-leaders": [
        C("topics", "elect-leaders", "--election-type", "sideways", needle="election-type"),
        C("topics", "elect-leaders", "--partition", "0", needle="--topic"),
        O("topics", "elect-leaders", "-t", MISSING, needle=MISSING),
    ],
    "partitions reassign plan": [
        C("partitions", "reassign", "plan", "-t", CLASSIC, needle="--broker-list"),
        C("partitions", "reassign", "plan", "-t", CLASSIC, "--broker-list", "1,x", needle="--broker-list"),
    ],
    "partitions reassign execute": [
        C("partitions", "reassign", "execute", needle="--reassignment-json-file"),
        C("partitions", "reassign", "execute", "-t", CLASSIC, "--partition", "0", "--replicas", "a,b",
          needle="--replicas"),
        C("partitions", "reassign", "execute", "--reassignment-json-file", "{tmp}/missing.json", needle="missing.json"),
        O("partitions", "reassign", "execute", "-t", CLASSIC, "--partition", "0", "--replicas", "1,99",
          code=2, needle="99"),
        C("partitions", "reassign", "execute", "-t", CLASSIC, "--partition", "0", "--replicas", "1",
          "--throttle", "0", needle="--throttle"),
        O("partitions", "reassign", "execute", "-t", CLASSIC, "--partition", "0", "--replicas", "1",
          "--throttle", "-5", code=2, needle="--throttle"),
        C("partitions", "reassign", "execute", "-t", CLASSIC, "--partition", "0", "--replicas", "1",
          "--throttle", "fast", needle="--throttle"),
    ],
    "partitions reassign verify": [
        C("partitions", "reassign", "verify", needle="--reassignment-json-file"),
    ],
    "partitions reassign cancel": [
        C("partitions", "reassign", "cancel", "-t", CLASSIC, needle="--partition"),
    ],
    "partitions reassign list": [
        C("partitions", "reassign", "list", "--bogus", needle="--bogus"),
    ],
    "broker start": [
        C("broker", "start", "--data-dir", "{tmp}/b1", "--listen", "nonsense", needle="--listen"),
        C("broker", "start", "--data-dir", "{tmp}/b2", "--listen", "127.0.0.1:0", "--config", "no.such.config=1",
          needle="no.such.config"),
        C("broker", "start", "--data-dir", "{tmp}/b3", "--listen", "127.0.0.1:0", "--config-file", "{tmp}/missing.properties",
          needle="missing.properties"),
        C("broker", "start", "--data-dir", "{tmp}/b4", "--listen", "127.0.0.1:0", "--object-store", "ftp://x/y",
          needle="ftp://x/y"),
        C("broker", "start", "--data-dir", "{tmp}/b5", "--listen", "127.0.0.1:0", "--config", "kcli.fault.nowhere.pause.ms=1",
          needle="kcli.fault.nowhere"),
        C("broker", "start", "--data-dir", "{data_dir}", "--listen", "127.0.0.1:0", code=1, needle="in use"),
        C("broker", "start", "--data-dir", "{tmp}/b6", "--listen", "127.0.0.1:0", "--cluster", "mysql://u@h/db",
          needle="--cluster"),
        C("broker", "start", "--data-dir", "{tmp}/b7", "--listen", "127.0.0.1:0", "--cluster", "postgresql://u@127.0.0.1:1/db",
          needle="--node-id"),
        C("broker", "start", "--data-dir", "{tmp}/b8", "--listen", "127.0.0.1:0", "--node-id", "-1", needle="--node-id"),
        C("broker", "start", "--data-dir", "{tmp}/b9", "--listen", "127.0.0.1:0", "--rack", "", needle="--rack"),
        # nothing listens on port 1: one line within the connect timeout, exit 1
        C("broker", "start", "--data-dir", "{tmp}/b10", "--listen", "127.0.0.1:0", "--cluster", "postgresql://u@127.0.0.1:1/db",
          "--node-id", "1", code=1, needle="127.0.0.1:1"),
        # a cluster shares diskless state through PostgreSQL: a per-broker SQLite coordinator is refused
        C("broker", "start", "--data-dir", "{tmp}/b11", "--listen", "127.0.0.1:0", "--cluster", "postgresql://u@127.0.0.1:1/db",
          "--node-id", "1", "--coordinator", "sqlite:///{tmp}/c.db", needle="--coordinator"),
        # observability (#18): logging flags, the metrics endpoint, --daemon
        C("broker", "start", "--data-dir", "{tmp}/b12", "--listen", "127.0.0.1:0", "--log-level", "LOUD", needle="--log-level"),
        C("broker", "start", "--data-dir", "{tmp}/b13", "--listen", "127.0.0.1:0", "--log-format", "xml", needle="--log-format"),
        C("broker", "start", "--data-dir", "{tmp}/b14", "--listen", "127.0.0.1:0", "--metrics-listen", "nonsense",
          needle="--metrics-listen"),
        C("broker", "start", "--data-dir", "{tmp}/b15", "--listen", "127.0.0.1:0", "--config", "metrics.listen=x:y",
          needle="metrics.listen"),
        C("broker", "start", "--data-dir", "{tmp}/b16", "--listen", "nonsense", "--daemon", needle="--listen"),
        C("broker", "start", "--data-dir", "{data_dir}", "--listen", "127.0.0.1:0", "--daemon", code=1,
          needle="already running"),
        # a Kafka server.properties (#18): --strict refuses what kcli would ignore; one data dir
        C("broker", "start", "--data-dir", "{tmp}/b17", "--listen", "127.0.0.1:0", "--config-file", "{kraft_props}",
          "--strict", needle="process.roles"),
        C("broker", "start", "--listen", "127.0.0.1:0", "--config-file", "{two_dirs_props}", needle="one data dir"),
        # several listeners in the file are Kafka's form: a SASL one needs its mechanisms
        C("broker", "start", "--data-dir", "{tmp}/b18", "--config-file", "{two_listeners_props}",
          needle="sasl.enabled.mechanisms"),
        C("broker", "start", "--data-dir", "{tmp}/b19", "--listen", "127.0.0.1:0", "--config",
          "log.retention.hours=forever", needle="log.retention.hours"),
        C("broker", "start", "--data-dir", "{tmp}/b20", "--listen", "127.0.0.1:0", "--config",
          "process.roles=broker", needle="Unknown broker config name: process.roles"),
        C("broker", "start", "--data-dir", "{users}", "--listen", "127.0.0.1:0", code=1, needle="not a directory"),
        C("broker", "start", "--data-dir", "{tmp}/b21", "--listen", "127.0.0.1:0", "--coordinator", "mysql://x/y",
          needle="--coordinator expects"),
        # listeners (docs/security.md): Kafka's form or --listen, a TLS listener needs a key
        C("broker", "start", "--data-dir", "{tmp}/b22", "--listen", "127.0.0.1:0", "--config",
          "listeners=PLAINTEXT://127.0.0.1:0", needle="either --listen"),
        C("broker", "start", "--data-dir", "{tmp}/b23", "--config", "listeners=SSL://127.0.0.1:0",
          needle="ssl.keystore.location"),
        C("broker", "start", "--data-dir", "{tmp}/b24", "--config", "listeners=WHAT://127.0.0.1:0",
          needle="listener.security.protocol.map"),
        C("broker", "start", "--data-dir", "{tmp}/b25", "--listen", "SASL_SSL://127.0.0.1:0", needle="sasl.enabled.mechanisms"),
    ],
    "broker status": [
        C("broker", "status", "--bogus", needle="--bogus"),
        C("broker", "status", "--data-dir", "{tmp}/no-broker-here", code=1, needle="no broker is running"),
    ],
    "broker stop": [
        C("broker", "stop", "--data-dir", "{tmp}/no-broker-here", "--timeout", "0", needle="--timeout"),
        C("broker", "stop", "--data-dir", "{tmp}/no-broker-here", "--timeout", "soon", needle="--timeout"),
        C("broker", "stop", "--data-dir", "{tmp}/no-broker-here", code=1, needle="no broker is running"),
    ],
    "broker metrics": [
        C("broker", "metrics", "--bogus", needle="--bogus"),
        C("-b", "127.0.0.1:1", "broker", "metrics", code=1, needle="127.0.0.1:1"),
    ],
    "broker users add": [
        C("broker", "users", "add", "alice", needle="--users-file"),
        C("broker", "users", "add", "bob", "--users-file", "{users}", "--scheme", "md5", "--password-stdin",
          stdin="pw\n", needle="md5"),
        C("broker", "users", "add", "alice", "--users-file", "{users}", "--password-stdin", stdin="pw\n",
          needle="already exists"),
        C("broker", "users", "add", "carol", "--users-file", "{users}", "--password-stdin", stdin="\n", needle="empty"),
        C("broker", "users", "add", "dave", "--users-file", "{users}", "--update", "--password-stdin", stdin="pw\n",
          needle="dave"),
    ],
    "broker users list": [
        C("broker", "users", "list", needle="--users-file"),
        C("broker", "users", "list", "--users-file", "{tmp}/garbage-users", needle="garbage-users"),
    ],
    "broker users delete": [
        C("broker", "users", "delete", "nobody", "--users-file", "{users}", needle="nobody"),
    ],
    "diskless describe": [
        O("diskless", "describe", "-t", MISSING, needle=MISSING),
        O("diskless", "describe", "-t", CLASSIC, needle="not a diskless topic"),
        C("diskless", "describe", "--coordinator", "mysql://x/y", needle="mysql"),
    ],
    "diskless objects": [
        O("diskless", "objects", "--state", "bogus", code=2, needle="bogus"),
        O("diskless", "objects", "--key", "wal/x", "--topic", DISKLESS, code=2, needle="--key"),
        C("diskless", "objects", "--coordinator", "sqlite://{tmp}/missing.db", needle="missing.db"),
    ],
    "diskless verify": [
        O("diskless", "verify", "--object-store", "file:///tmp", code=2, needle="--coordinator"),
        O("diskless", "verify", "--max-objects", "-1", code=2, needle="--max-objects"),
        C("diskless", "verify", "--coordinator", "sqlite://{tmp}/missing.db", needle="missing.db"),
        C("diskless", "verify", "--coordinator", "sqlite://{garbage_db}", "--object-store", "file://{tmp}",
          needle="not a usable coordinator database"),
        O("diskless", "verify", "--key", "wal/no-such-object", code=1, needle="no object 'wal/no-such-object'"),
        C("diskless", "verify", "--coordinator", "{data_dir}/diskless/coordinator.db", "--key", "wal/nope", code=1,
          needle="no object 'wal/nope'"),
        C("diskless", "verify", "--coordinator", "sqlite://", needle="--coordinator expects"),
    ],
    "diskless gc": [
        O("diskless", "gc", "--grace-ms", "10", code=2, needle="--grace-ms"),
        O("diskless", "gc", "--engine", "gpu", code=2, needle="gpu"),
        C("diskless", "gc", "--coordinator", "sqlite://{tmp}/missing.db", "--dry-run", needle="missing.db"),
    ],
    "cluster start": [
        C("cluster", "start", "--data-dir", "{tmp}/c1", "--brokers", "0", needle="--brokers"),
        C("cluster", "start", "--data-dir", "{tmp}/c1", "--racks", ",,", needle="--racks"),
        C("cluster", "start", "--data-dir", "{tmp}/c1", "--base-port", "70000", needle="--base-port"),
        C("cluster", "start", "--data-dir", "{tmp}/c1", "--timeout", "-1", needle="--timeout"),
        C("cluster", "start", "--data-dir", "{tmp}/c1", "--config", "nope=1", needle="nope"),
        C("cluster", "start", "--data-dir", "{tmp}/c1", "--config", "node.id=4", needle="node.id"),
        C("cluster", "start", "--data-dir", "{tmp}/c1", "--config", "noequals", needle="KEY=VALUE"),
    ],
    "cluster status": [
        C("cluster", "status", "--data-dir", "{tmp}/no-cluster", code=1, needle="no cluster"),
    ],
    "cluster stop": [
        C("cluster", "stop", "--data-dir", "{tmp}/no-cluster", code=1, needle="no cluster"),
        C("cluster", "stop", "--data-dir", "{tmp}/no-cluster", "--timeout", "-5", needle="--timeout"),
    ],
    "users list": [
        C("-b", "127.0.0.1:1", "users", "list", code=1, needle="127.0.0.1:1"),
    ],
    "users set": [
        C("users", "set", "--password-stdin", stdin="pw\n", needle="user"),
        O("users", "set", "alice", "--mechanism", "MD5", "--password-stdin", stdin="pw\n", code=2, needle="MD5"),
        O("users", "set", "alice", "--iterations", "10", "--password-stdin", stdin="pw\n",
          needle="UNACCEPTABLE_CREDENTIAL"),
    ],
    "users delete": [
        C("users", "delete", needle="user"),
        O("users", "delete", "nobody", "--mechanism", "SHA1", code=2, needle="SHA1"),
        O("users", "delete", "nobody"),
    ],
    "acls list": [
        O("acls", "list", needle="SECURITY_DISABLED"),  # the matrix broker has no authorizer
        O("acls", "list", "--principal", "alice", code=2, needle="TYPE:NAME"),
        O("acls", "list", "--topic", "t", "--resource-pattern-type", "regex", code=2, needle="regex"),
    ],
    "acls create": [
        O("acls", "create", "--topic", "t", code=2, needle="--allow-principal"),
        O("acls", "create", "--allow-principal", "User:a", code=2, needle="--topic"),
        O("acls", "create", "--allow-principal", "User:a", "--topic", "t", "--operation", "Fly", code=2, needle="Fly"),
        O("acls", "create", "--allow-principal", "User:a", "--topic", "t", "--resource-pattern-type", "match", code=2,
          needle="match"),
        O("acls", "create", "--allow-principal", "User:a", "--cluster", "--operation", "Read", code=2, needle="Read"),
        O("acls", "create", "--allow-principal", "User:a", "--topic", "t", needle="SECURITY_DISABLED"),
    ],
    "acls delete": [
        O("acls", "delete", code=2, needle="--topic"),
        O("acls", "delete", "--topic", "t", needle="SECURITY_DISABLED"),
    ],
    "runbook validate": [
        C("runbook", "validate", needle="FILE"),
        C("runbook", "validate", "{tmp}/missing.yaml", needle="missing.yaml", problem_lines=True),
        C("runbook", "validate", "{bad_runbook}", needle="invalid", problem_lines=True),
    ],
    "runbook run": [
        C("runbook", "run", "{bad_runbook}", needle="invalid", problem_lines=True),
        C("runbook", "run", "{good_runbook}", "--var", "novalue", needle="--var"),
    ],
    "transactions list": [
        O("transactions", "list", "--state", "Sleeping", code=2, needle="--state"),
        O("transactions", "list", "--duration-filter", "-5", code=2, needle="--duration-filter"),
        O("transactions", "list", "--producer-id", "abc", code=2, needle="--producer-id"),
    ],
    "transactions describe": [
        C("transactions", "describe", needle="--transactional-id"),
        O("transactions", "describe", "--transactional-id", "no-such-txn", needle="TRANSACTIONAL_ID_NOT_FOUND"),
    ],
    "transactions describe-producers": [
        O("transactions", "describe-producers", "--topic", MISSING, "--partition", "0", needle="UNKNOWN_TOPIC_OR_PARTITION"),
        O("transactions", "describe-producers", "--topic", CLASSIC, "--partition", "-1", code=2, needle="--partition"),
        O("transactions", "describe-producers", "--topic", CLASSIC, "--partition", "99", needle="UNKNOWN_TOPIC_OR_PARTITION"),
    ],
    "transactions abort": [
        O("transactions", "abort", "--topic", CLASSIC, "--partition", "0", code=2, needle="--start-offset"),
        O("transactions", "abort", "--topic", CLASSIC, "--partition", "0", "--start-offset", "1", "--producer-id", "5",
          code=2, needle="--start-offset"),
        O("transactions", "abort", "--topic", CLASSIC, "--partition", "0", "--start-offset", "1", needle="offset 1"),
    ],
}

# A sample that also runs as separate processes (the real entry point, real exit codes).
PROCESS_SAMPLE = [("produce", 1), ("consume", 4), ("dump-log", 1), ("topics create", 2), ("topics alter", 9),
                  ("diskless verify", 2), ("runbook validate", 2), ("broker users add", 1)]


def leaf_commands() -> list[str]:
    from typer.main import get_command

    from kcli.cli.app import app

    out: list[str] = []

    def walk(cmd: Any, path: list[str]) -> None:
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, path + [name])
        else:
            out.append(" ".join(path))

    walk(get_command(app), [])
    return sorted(out)


# ---- the environment: a broker, local files, and a snapshot of all of it ------------------------------


@dataclass
class Env:
    bootstrap: str
    tmp: Path
    data_dir: Path
    vars: dict[str, str] = field(default_factory=dict)

    @property
    def subst(self) -> dict[str, str]:
        return {"tmp": str(self.tmp), "data_dir": str(self.data_dir), **self.vars}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    from tests.kafka_helpers import create_topic, produce

    tmp = tmp_path_factory.mktemp("cli-bad-input")
    broker = BrokerProcess(tmp / "data", {"auto.create.topics.enable": "false",
                                          "remote.log.storage.system.enable": "true"}).start()
    saved = {k: os.environ.get(k) for k in ("KCLI_CONFIG", "KCLI_DATA_DIR", "KCLI_SASL_USERS_FILE")}
    os.environ["KCLI_CONFIG"] = str(tmp / "contexts.yaml")
    os.environ["KCLI_DATA_DIR"] = str(tmp / "default-data")
    os.environ.pop("KCLI_SASL_USERS_FILE", None)
    try:
        create_topic(broker.bootstrap, CLASSIC, 2, {"retention.ms": "3600000"})
        create_topic(broker.bootstrap, DISKLESS, 1, {"diskless.enable": "true"})
        create_topic(broker.bootstrap, TIERED, 1, {"remote.storage.enable": "true"})
        produce(broker.bootstrap, CLASSIC, [b"a", b"b", b"c"])
        e = Env(broker.bootstrap, tmp, broker.data_dir)
        assert run_inproc(["context", "set", "dev", "-b", broker.bootstrap, "--property", "client.id=matrix"]).code == 0
        users = tmp / "users.properties"
        assert run_inproc(["broker", "users", "add", "alice", "--users-file", str(users), "--password-stdin"],
                          "secret\n").code == 0
        (tmp / "garbage-users").write_text("this is = not\x00 a users file\n::::\n")
        (tmp / "garbage.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
        (tmp / "bad-runbook.yaml").write_text("description: x\nsteps:\n  - name: one\n    topics.frobnicate: {}\n")
        good = tmp / "good-runbook.yaml"
        good.write_text("description: ok\nbootstrap_server: ${bootstrap}\nvariables: {bootstrap: localhost:9092}\n"
                        "steps:\n  - name: list\n    topics.list: {}\n")
        for name, text in (("kraft_props", "process.roles=broker,controller\nnum.partitions=1\n"),
                           ("two_dirs_props", f"log.dirs={tmp}/d1,{tmp}/d2\n"),
                           ("two_listeners_props", "listeners=PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0\n")):
            (tmp / f"{name}.properties").write_text(text)
        e.vars = {"segment": str(next(broker.data_dir.glob(f"{CLASSIC}-0/*.log"))), "users": str(users),
                  **{n: str(tmp / f"{n}.properties") for n in ("kraft_props", "two_dirs_props", "two_listeners_props")},
                  "garbage_db": str(tmp / "garbage.db"), "bad_runbook": str(tmp / "bad-runbook.yaml"),
                  "good_runbook": str(good)}
        yield e
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        broker.stop()


def snapshot(e: Env) -> dict[str, Any]:
    """Topics with partitions, end offsets and explicitly set configs; the contexts and users files."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": e.bootstrap})
    md = admin.list_topics(timeout=20)
    topics = {name: sorted(t.partitions) for name, t in md.topics.items()}
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in topics]
    configs = {}
    for res, fut in admin.describe_configs(resources).items():
        entries = fut.result(20)
        configs[res.name] = {k: v.value for k, v in entries.items() if not v.is_default}
    c = Consumer({"bootstrap.servers": e.bootstrap, "group.id": "matrix-snapshot"})
    try:
        ends = {f"{t}-{p}": c.get_watermark_offsets(TopicPartition(t, p), timeout=20)
                for t, parts in topics.items() for p in parts}
    finally:
        c.close()
    files = {p.name: p.read_bytes() for p in (e.tmp / "contexts.yaml", e.tmp / "users.properties")}
    return {"topics": topics, "configs": configs, "offsets": ends, "files": files,
            "broker_dirs": sorted(p.name for p in e.tmp.iterdir() if p.is_dir())}


# ---- running a case ---------------------------------------------------------------------------------


@dataclass
class Result:
    code: int
    out: str
    err: str


def run_inproc(argv: list[str], stdin: str = "") -> Result:
    """kcli's console entry point in this process, with real byte streams for stdin/out/err."""
    from kcli.cli import app as app_module

    streams = {name: io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
               for name in ("stdout", "stderr")}
    fake_in = io.TextIOWrapper(io.BytesIO(stdin.encode()), encoding="utf-8")
    saved = sys.argv, sys.stdin, sys.stdout, sys.stderr
    sys.argv, sys.stdin, sys.stdout, sys.stderr = ["kcli", *argv], fake_in, streams["stdout"], streams["stderr"]
    code = 0
    try:
        app_module.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv, sys.stdin, sys.stdout, sys.stderr = saved
    text = {n: s.buffer.getvalue().decode(errors="replace") for n, s in streams.items()}  # type: ignore[attr-defined]
    return Result(code, text["stdout"], text["stderr"])


def run_process(argv: list[str], stdin: str = "", timeout: float = 90) -> Result:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    try:
        proc = subprocess.run([sys.executable, "-m", "kcli", *argv], input=stdin.encode(), capture_output=True,
                              env=env, cwd=REPO, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        raise AssertionError(f"kcli {' '.join(argv)} did not exit within {timeout} s (bad input accepted?)") from err
    return Result(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"))


def check(case: Case, argv: list[str], r: Result) -> str | None:
    """Why ``r`` is not a clean refusal (None when it is)."""
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("kcli: error: ")]
    others = [ln for ln in lines if not ln.startswith("kcli: error: ")]
    if "Traceback" in r.err or "kcli: error: unexpected " in r.err:
        return f"crashed: {r.err[-1500:]}"
    if r.code != case.code:
        return f"exit {r.code}, expected {case.code}; stderr: {r.err[-600:]!r}"
    if len(errors) != 1 or lines[-1] != errors[0]:
        return f"expected exactly one final `kcli: error:` line, got: {lines!r}"
    if others and not (case.problem_lines and all(PROBLEM_LINE.match(ln) for ln in others)):
        return f"extra stderr lines: {others!r}"
    if case.needle and case.needle.lower() not in errors[0].lower():
        return f"error line does not mention {case.needle!r}: {errors[0]!r}"
    return None


# ---- the tests ------------------------------------------------------------------------------------------


def test_every_command_has_bad_input_cases() -> None:
    commands = leaf_commands()
    missing = [c for c in commands if not CASES.get(c)]
    assert not missing, f"commands without bad-input cases in tests/test_cli_bad_input.py: {missing}"
    stale = sorted(set(CASES) - set(commands))
    assert not stale, f"cases for commands that no longer exist: {stale}"


def test_bad_input_matrix_refuses_cleanly_and_changes_nothing(env: Env) -> None:
    before = snapshot(env)
    failures: list[str] = []
    in_process = [(name, case) for name, cases in CASES.items() for case in cases
                  if not (case.process or name == "broker start")]
    for name, case in in_process:
        argv = case.argv(env)
        why = check(case, argv, run_inproc(argv, case.stdin))
        if why:
            failures.append(f"kcli {' '.join(argv)}: {why}")
    processes = [(name, case) for name, cases in CASES.items() for case in cases if case.process or name == "broker start"]
    processes += [(name, CASES[name][i]) for name, i in PROCESS_SAMPLE]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda nc: (nc, nc[1].argv(env), run_process(nc[1].argv(env), nc[1].stdin)), processes))
    for (name, case), argv, r in results:
        why = check(case, argv, r)
        if why:
            failures.append(f"[process] kcli {' '.join(argv)}: {why}")
    after = snapshot(env)
    assert not failures, f"{len(failures)} of {len(in_process) + len(processes)} bad inputs not refused cleanly:\n" + \
        "\n".join(failures)
    for key in before:
        assert after[key] == before[key], f"bad input changed {key}: {before[key]!r} -> {after[key]!r}"
    print(f"\n{len(in_process)} in-process and {len(processes)} process runs over {len(CASES)} commands: "
          f"all refused with one line, nothing changed")
