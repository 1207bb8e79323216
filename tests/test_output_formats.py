"""`-o table|json|yaml` for every kcli command that shows data, checked against docs/json-output.md.

One real broker serves the whole module; commands run in this process through kcli's own entry
point (`kcli.cli.app.main`: argument parsing, option hoisting, error boundary, exit code), since
an interpreter start-up per call would dominate. Each case runs its command in all three
formats: table must not be JSON, JSON and YAML must parse and hold the same content, and both
must match the shape the doc documents for that command: every field in the output is in the
doc's field table with a matching type, every documented non-optional field is present, and
(at the end) every documented field was seen in some real output. The doc's own JSON examples
are checked against its tables too, so doc, examples and code cannot drift apart.

A command added to the CLI fails test_every_command_is_classified until it is listed in
DATA_COMMANDS (then it needs a case and a doc section) or NOT_DATA (with the reason).

`KCLI_JSON_SAMPLES=DIR python3 -m pytest tests/test_output_formats.py` writes every JSON output
to DIR, for refreshing the doc's examples.
"""

from __future__ import annotations

import io
import json
import os
import re
import struct
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml

from tests.brokerproc import BrokerProcess

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "json-output.md"
FORMATS = ("table", "json", "yaml")

# Commands that print a result. Each needs at least one Case below and a section in the doc.
DATA_COMMANDS = {
    "produce", "consume", "dump-log",
    "context list", "context show", "context use", "context set", "context delete",
    "topics create", "topics list", "topics describe", "topics alter", "topics delete",
    "groups list", "groups describe", "groups delete", "groups reset-offsets", "groups delete-offsets",
    "broker metrics", "broker status", "broker stop", "broker users add", "broker users list", "broker users delete",
    "users list", "users set", "users delete",
    "diskless describe", "diskless objects", "diskless verify", "diskless gc",
    "runbook validate", "runbook run",
    "transactions list", "transactions describe", "transactions describe-producers", "transactions abort",
}
# Commands with nothing to render as data, and why.
NOT_DATA = {
    "broker start": "runs the broker in the foreground; its only output is the listening line",
    "completion": "prints a shell script",
}
# Data commands whose documents need a broker of another kind (a PostgreSQL server and a cluster of
# brokers; an authorizer and SASL users): their `-o json` documents are checked in that test file,
# against the same doc sections (tests/test_cluster_cli.py assert_documented).
ELSEWHERE = {
    "cluster start": "tests/test_cluster_cli.py",
    "cluster status": "tests/test_cluster_cli.py",
    "cluster stop": "tests/test_cluster_cli.py",
    "acls list": "tests/test_acls.py",
    "acls create": "tests/test_acls.py",
    "acls delete": "tests/test_acls.py",
    # a cluster of three brokers with replicated topics
    "topics elect-leaders": "tests/test_replication_admin.py",
    "partitions reassign plan": "tests/test_replication_admin.py",
    "partitions reassign execute": "tests/test_replication_admin.py",
    "partitions reassign verify": "tests/test_replication_admin.py",
    "partitions reassign cancel": "tests/test_replication_admin.py",
    # a share group (KIP-932) with a member needs a ShareConsumer
    "share-groups list": "tests/test_share_groups.py",
    "share-groups describe": "tests/test_share_groups.py",
    "share-groups reset-offsets": "tests/test_share_groups.py",
    "share-groups delete-offsets": "tests/test_share_groups.py",
    "share-groups delete": "tests/test_share_groups.py",
    "partitions reassign list": "tests/test_replication_admin.py",
}
# Documented fields no case can produce against kcli's broker, with the reason.
NOT_EXERCISED: dict[tuple[str, str], str] = {}


# ---- the doc: sections, field tables, types ------------------------------------------------------

BASE_TYPES = {"string", "int", "number", "bool", "object", "array", "map", "any"}


@dataclass(frozen=True)
class FieldDoc:
    """One row of a field table: ``| `path` | type | meaning |``."""

    path: str
    type: str
    base: str  # the type, or the element type of an array/map
    container: str | None  # "array" | "map" | None
    nullable: bool  # the value (or, for containers, each element) may be null
    optional: bool  # the key may be absent

    @classmethod
    def parse(cls, path: str, text: str) -> "FieldDoc":
        t = text.strip()
        optional = t.endswith("(optional)")
        t = t.removesuffix("(optional)").strip()
        container = None
        for prefix in ("array of ", "map of "):
            if t.startswith(prefix):
                container, t = prefix.split()[0], t[len(prefix):]
        parts = [p.strip() for p in t.split(" or ")]
        nullable = "null" in parts
        parts = [p for p in parts if p != "null"]
        if len(parts) != 1 or parts[0] not in BASE_TYPES:
            raise ValueError(f"field {path}: cannot read type {text!r}")
        return cls(path, text.strip(), parts[0], container, nullable, optional)

    def descends(self) -> str | None:
        """How the checker goes below this field: "keys" (documented object), "*" (map of
        documented objects), "[]" (array of documented objects), or None (a leaf)."""
        if self.base != "object":
            return None
        return {None: "keys", "map": "*", "array": "[]"}[self.container]


@dataclass
class Section:
    title: str  # the heading without "## "
    stream: bool  # JSON Lines: one object per line
    examples: list[Any]  # parsed example documents (one per line for streams)
    fields: dict[str, FieldDoc] = field(default_factory=dict)  # apply to every line
    variants: dict[str, dict[str, FieldDoc]] = field(default_factory=dict)  # by the line's "type"

    def documented(self) -> set[str]:
        """Every documented field; a variant's fields as ``TYPE:path``."""
        return set(self.fields) | {f"{v}:{p}" for v, table in self.variants.items() for p in table}

    def check(self, document: Any) -> tuple[list[str], set[str]]:
        """check_shape against this section's table (the variant's, for a line with a "type"),
        with seen paths named as in :meth:`documented`."""
        if not self.variants:
            return check_shape(document, self.fields)
        kind = document.get("type") if isinstance(document, dict) else None
        if kind not in self.variants:
            return [f"line type {kind!r} is not documented"], set()
        problems, seen = check_shape(document, {**self.fields, **self.variants[kind]})
        return problems, {p if p in self.fields else f"{kind}:{p}" for p in seen}


_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|([^|]*)\|")
_VARIANT = re.compile(r"^### .*type `(\w+)`")


def load_doc(text: str | None = None) -> dict[str, Section]:
    """Sections of docs/json-output.md whose heading starts with ``kcli``."""
    text = DOC.read_text() if text is None else text
    sections: dict[str, Section] = {}
    current: Section | None = None
    table: dict[str, FieldDoc] | None = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            title = line[3:].strip().replace("`", "")
            current = Section(title, False, []) if title.startswith("kcli ") else None
            if current is not None:
                assert title not in sections, f"duplicate section {title}"
                sections[title] = current
                table = current.fields
        elif current is not None and line.startswith("### "):
            m = _VARIANT.match(line)
            table = current.variants.setdefault(m.group(1), {}) if m else current.fields
        elif current is not None and line.startswith("```json"):
            body = []
            i += 1
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            if line.strip() == "```jsonl":
                current.stream = True
                current.examples += [json.loads(b) for b in body if b.strip()]
            else:
                current.examples.append(json.loads("\n".join(body)))
        elif current is not None and table is not None:
            m = _ROW.match(line)
            if m and m.group(1) != "field":
                path = m.group(1)
                assert path not in table, f"{current.title}: field {path} documented twice"
                table[path] = FieldDoc.parse(path, m.group(2).replace("\\|", "|"))
        i += 1
    return sections


def assert_documented(title: str, document: Any) -> None:
    """For the ELSEWHERE commands: the document matches its field table, as test_output_formats checks
    every other command, and every documented field was printed."""
    section = load_doc()[title]
    problems, seen = section.check(document)
    assert not problems, f"{title}: {problems}"
    assert not section.documented() - seen, f"{title}: documented but never printed: {section.documented() - seen}"


def _parent(path: str) -> str:
    if path.endswith("[]"):
        return path[:-2]
    i = path.rfind(".")
    return path[:i] if i >= 0 else ""


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


_PY_TYPES: dict[str, Any] = {"string": str, "int": int, "number": (int, float), "bool": bool, "object": dict,
                             "map": dict, "array": list}


def _type_ok(base: str, value: Any) -> bool:
    if base == "any":
        return True
    if isinstance(value, bool):  # bool is an int to Python, not to JSON
        return base == "bool"
    return isinstance(value, _PY_TYPES[base])


def check_shape(document: Any, fields: dict[str, FieldDoc]) -> tuple[list[str], set[str]]:
    """Problems of ``document`` against the field table, and the documented paths it showed."""
    problems: list[str] = []
    seen: set[str] = set()

    def value(v: Any, f: FieldDoc) -> None:
        seen.add(f.path)
        if f.container is None:
            if v is None:
                if not f.nullable:
                    problems.append(f"{f.path}: null, documented as {f.type}")
                return
            if not _type_ok(f.base, v):
                problems.append(f"{f.path}: {type(v).__name__} {v!r:.60}, documented as {f.type}")
                return
            if f.descends() == "keys":
                obj(v, f.path)
            return
        expected = list if f.container == "array" else dict
        if not isinstance(v, expected):
            problems.append(f"{f.path}: {type(v).__name__}, documented as {f.type}")
            return
        for item in (v if isinstance(v, list) else v.values()):
            if item is None and f.nullable:
                continue
            if not _type_ok(f.base, item):
                problems.append(f"{f.path}: element {item!r:.60} is not {f.base}")
            elif f.descends() == "[]":
                obj(item, f.path + "[]")
            elif f.descends() == "*":
                obj(item, f.path + ".*")

    def obj(d: dict[str, Any], path: str) -> None:
        for key, v in d.items():
            child = _join(path, key)
            f = fields.get(child)
            if f is None:
                problems.append(f"{child}: not documented")
            else:
                value(v, f)
        for p, f in fields.items():
            if _parent(p) == path and not f.optional and p.rsplit(".", 1)[-1] not in d:
                problems.append(f"{p}: documented, missing")

    if isinstance(document, list):
        for item in document:
            if isinstance(item, dict):
                obj(item, "[]")
            else:
                problems.append(f"[]: element {item!r:.60} is not an object")
    elif isinstance(document, dict):
        obj(document, "")
    else:
        problems.append(f"document is {type(document).__name__}, not an object or array")
    return problems, seen


def _tokens(path: str) -> list[str]:
    return re.findall(r"\[\]|\*|[^.\[\]*]+", path)


def drop(data: Any, path: str) -> Any:
    """``data`` without the values at ``path`` (volatile fields: times, counters)."""
    def walk(d: Any, toks: list[str]) -> None:
        if not toks:
            return
        head, rest = toks[0], toks[1:]
        if head == "[]" and isinstance(d, list):
            for item in d:
                walk(item, rest)
        elif head == "*" and isinstance(d, dict):
            for item in d.values():
                walk(item, rest)
        elif isinstance(d, dict) and head in d:
            if rest:
                walk(d[head], rest)
            else:
                del d[head]

    data = json.loads(json.dumps(data))
    walk(data, _tokens(path))
    return data


# ---- running kcli in this process ------------------------------------------------------------------


def kcli(*argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run kcli's console entry point here; stdout/stdin have byte buffers, as consume and
    produce need."""
    from kcli.cli.app import main

    out, err = io.BytesIO(), io.StringIO()
    saved = sys.argv, sys.stdin, sys.stdout, sys.stderr
    sys.argv = ["kcli", *argv]
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode()), encoding="utf-8")
    wrapper = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    sys.stdout, sys.stderr = wrapper, err
    code = 0
    try:
        main()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        wrapper.flush()
        text = out.getvalue().decode("utf-8", errors="replace")
        wrapper.detach()
        sys.argv, sys.stdin, sys.stdout, sys.stderr = saved
    return subprocess.CompletedProcess(list(argv), code, text, err.getvalue())


def ok(*argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    proc = kcli(*argv, stdin=stdin)
    assert proc.returncode == 0, (argv, proc.stdout[-2000:], proc.stderr[-2000:])
    return proc


@dataclass
class World:
    """What the cases run against: one broker with tiering, partition reduction and diskless on."""

    tmp: Path
    broker: BrokerProcess
    users_file: Path
    files: dict[str, Path] = field(default_factory=dict)
    spares: dict[str, BrokerProcess] = field(default_factory=dict)
    member: Any = None  # LiveMember of group "live"
    producers: list[Any] = field(default_factory=list)  # transactional producers kept open

    def spare(self, name: str) -> Path:
        """The data dir of a broker of its own (started on first use), for `broker stop` to stop."""
        if name not in self.spares:
            self.spares[name] = BrokerProcess(self.tmp / f"spare-{name}").start()
        return self.spares[name].data_dir

    @property
    def b(self) -> str:
        return self.broker.bootstrap

    @property
    def data(self) -> Path:
        return self.broker.data_dir

    @property
    def coordinator(self) -> str:
        return f"sqlite:///{self.data / 'diskless' / 'coordinator.db'}"


def _wal_key(w: World, topic: str) -> str:
    """The (first) WAL object holding ``topic``'s records."""
    objects = json.loads(ok("diskless", "objects", "--topic", topic, "-b", w.b, "-o", "json").stdout)["objects"]
    assert objects, f"no WAL object for {topic}"
    return objects[0]["object_key"]


def _build(w: World) -> None:
    b = w.b
    # classic: index entries for every batch after the first (index.interval.bytes=0), headers
    ok("topics", "create", "--topic", "orders", "--partitions", "3", "--config", "index.interval.bytes=0", "-b", b)
    for lines in ("k1:v1\nk2:v2\n", "k3:v3\n"):
        ok("produce", "--topic", "orders", "--partition", "0", "--key-separator", ":", "-b", b, stdin=lines)
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": b})
    producer.produce("orders", b'{"amount": 12}', b"k4", partition=0, headers=[("source", b"docs")])
    assert producer.flush(30) == 0
    ok("topics", "create", "--topic", "tiered", "--config", "remote.storage.enable=true", "-b", b)
    for user in ("carol", "old-table", "old-json", "old-yaml"):  # SCRAM users for the `users` cases
        ok("users", "set", user, "--mechanism", "SCRAM-SHA-256", "--password-stdin", "-b", b, stdin="pw\n")
    ok("topics", "create", "--topic", "shrunk", "--partitions", "3", "-b", b)
    ok("topics", "alter", "--topic", "shrunk", "--partitions", "2", "--delete-partitions-delay", "3600000", "-b", b)
    ok("topics", "create", "--topic", "sink", "-b", b)
    for fmt in FORMATS:
        ok("topics", "create", "--topic", f"gone-{fmt}", "-b", b)
    # diskless: a healthy topic, one whose object gets damaged, one deleted (its object waits for gc)
    for topic, parts in (("dl", "2"), ("dl-bad", "1"), ("dl-gone", "1")):
        ok("topics", "create", "--topic", topic, "--partitions", parts, "--diskless", "-b", b)
        ok("produce", "--topic", topic, "--partition", "0", "-b", b, stdin="a\nb\nc\n")
    w.files["wal"] = w.data / "objects" / _wal_key(w, "dl")
    w.files["wal-gone"] = w.data / "objects" / _wal_key(w, "dl-gone")
    bad = w.data / "objects" / _wal_key(w, "dl-bad")
    raw = bytearray(bad.read_bytes())
    raw[-1] ^= 0xFF  # a record byte: the batch CRC no longer holds
    bad.write_bytes(bytes(raw))
    ok("topics", "delete", "--topic", "dl-gone", "-b", b)
    orphan = w.data / "objects" / "wal" / str(uuid.uuid4())
    orphan.write_bytes(b"\x00not committed")
    old = time.time() - 86400  # older than the cleaner's grace period
    os.utime(orphan, (old, old))
    # an orphan has an upload intent (kcli/diskless/cleaner.py); an object without one is unknown
    from tests.diskless_helpers import record_upload_intent

    record_upload_intent(w.data, f"wal/{orphan.name}", at_ms=int(old * 1000))
    unknown = w.data / "objects" / "wal" / str(uuid.uuid4())
    unknown.write_bytes(b"\x00no record")
    os.utime(unknown, (old, old))
    # files for dump-log: a damaged copy of a segment, a transaction index
    segment = w.data / "orders-0" / "00000000000000000000.log"
    damaged = w.tmp / "damaged" / "00000000000000000000.log"
    damaged.parent.mkdir()
    damaged.write_bytes(segment.read_bytes() + b"\x00\x01\x02")
    txn = w.tmp / "txn" / "00000000000000000000.txnindex"
    txn.parent.mkdir()
    txn.write_bytes(struct.pack(">hqqqq", 0, 4000, 10, 12, 10))  # Kafka's AbortedTxn entry
    kcli_log = w.tmp / "kcli-log" / "metadata.log"  # a still copy of kcli's own metadata log
    kcli_log.parent.mkdir()
    live = (w.data / "__cluster_metadata" / "metadata.log").read_bytes()
    kcli_log.write_bytes(live[:live.rindex(b"\n") + 1])
    w.files["kcli_log"] = kcli_log
    w.files["checkpoint"] = w.tmp / "kcli-log" / "cleaner-offset-checkpoint"  # Kafka's OffsetCheckpointFile
    w.files["checkpoint"].write_text("0\n1\norders 0 5\n")
    w.files.update(segment=segment, damaged=damaged, txn=txn,
                   empty_index=w.data / "shrunk-0" / "00000000000000000000.index")
    # transactions: one committed; one left open on the three partitions of "hanging", one per
    # format for `transactions abort` (its timeout outlasts the module)
    ok("topics", "create", "--topic", "txns", "-b", b)
    ok("topics", "create", "--topic", "hanging", "--partitions", "3", "-b", b)
    for tid in ("docs-committed", "docs-hanging"):
        p = Producer({"bootstrap.servers": b, "transactional.id": tid, "transaction.timeout.ms": 900000})
        p.init_transactions(30)
        p.begin_transaction()
        if tid == "docs-committed":
            p.produce("txns", b"paid", b"k1", partition=0)
            p.commit_transaction(30)
        else:
            for partition in range(3):
                p.produce("hanging", b"stuck", partition=partition)
            assert p.flush(30) == 0
        w.producers.append(p)
    # contexts, users, runbooks
    # consumer groups: offsets only (billing, retired, gone-*) and one with a live member
    from confluent_kafka import Consumer, TopicPartition

    for group, offsets in [("billing", [("orders", 0, 2), ("sink", 0, 0)]), ("retired", [("sink", 0, 0)])] + \
            [(f"gone-{fmt}", [("orders", 0, 1)]) for fmt in FORMATS]:
        committer = Consumer({"bootstrap.servers": b, "group.id": group})
        committer.commit(offsets=[TopicPartition(t, p, o) for t, p, o in offsets], asynchronous=False)
        committer.close()
    w.member = LiveMember(b, "live", "orders")
    ok("context", "set", "base", "-b", b, "--property", "client.id=kcli-docs")
    for fmt in FORMATS:
        ok("context", "set", f"old-{fmt}", "-b", b)
        ok("broker", "users", "add", f"old-{fmt}", "--users-file", str(w.users_file), "--password-stdin",
           stdin="pw\n")
    w.files["checkpoint"] = w.tmp / "cleaner-offset-checkpoint"  # Kafka's format: version, count, entries
    w.files["checkpoint"].write_text("0\n2\norders 0 3\nshrunk 1 0\n")
    w.files["runbook"] = w.tmp / "check.yaml"
    w.files["runbook"].write_text(
        "description: check the orders topic\n"
        "steps:\n"
        "  - topics.describe: {topic: orders}\n"
        "    expect: {path: partition_count, equals: 3}\n"
        "    wait_for: {describe: topics, topic: orders, path: kind, equals: classic, timeout: 10s}\n"
        "  - diskless.describe: {topic: dl}\n")
    w.files["plan-runbook"] = w.tmp / "plan.yaml"  # a dry run: a topic created, then a live one changed
    w.files["plan-runbook"].write_text(
        "steps:\n"
        "  - topics.create: {topic: planned-only, partitions: 2}\n"
        "    wait_for: {describe: topics, topic: planned-only, path: partition_count, equals: 2, timeout: 10s}\n"
        "  - topics.alter: {topic: orders, configs: {retention.ms: '3600000'}}\n"
        "    expect: {path: changed, equals: true}\n")
    w.files["bad-runbook"] = w.tmp / "bad.yaml"
    w.files["bad-runbook"].write_text("steps:\n  - topics.create: {topic: x, partitions: three}\n  - bogus: 1\n")


class LiveMember:
    """A confluent-kafka consumer in a group, polling in a thread until closed."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        import threading

        from confluent_kafka import Consumer

        self.stop = threading.Event()
        assigned = threading.Event()
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": "docs-app",
                                  "enable.auto.commit": False})
        self.consumer.subscribe([topic], on_assign=lambda c, parts: assigned.set())
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert assigned.wait(60), "the live member was never assigned"

    def _run(self) -> None:
        while not self.stop.is_set():
            self.consumer.poll(0.2)
        self.consumer.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("output-formats")
    mp = pytest.MonkeyPatch()
    for key in [k for k in os.environ if k.startswith("KCLI_") and k != "KCLI_JSON_SAMPLES"]:
        mp.delenv(key)
    mp.setenv("KCLI_CONFIG", str(tmp / "kcli-config.yaml"))
    mp.setenv("KCLI_DATA_DIR", str(tmp / "default-data"))
    broker = BrokerProcess(tmp / "data", {
        "remote.log.storage.system.enable": "true",
        "delete.topic.partition.enable": "true",
        "diskless.file.cleaner.interval.ms": "3600000",  # gc runs only when a case asks
        "diskless.append.commit.interval.ms": "20",
    })
    started = time.monotonic()
    broker.start()
    w = None
    try:
        w = World(tmp, broker, tmp / "users")
        up = time.monotonic()
        _build(w)
        sys.stderr.write(f"broker start {up - started:.1f}s, setup {time.monotonic() - up:.1f}s\n")
        yield w
    finally:
        if w is not None and w.member is not None:
            w.member.close()
        broker.stop()
        for spare in w.spares.values():
            spare.stop()
        mp.undo()


# ---- the cases ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    command: str  # as iter_commands names it
    section: str  # heading in docs/json-output.md, without "## "
    argv: Callable[[World, str], list[str]]  # (world, format) -> arguments; -o is appended
    stdin: str = ""
    code: int = 0  # expected exit status
    volatile: tuple[str, ...] = ()  # paths that may differ between the JSON and YAML runs
    table_silent: bool = False  # nothing on stdout in table mode, by design
    yaml_refused: bool = False


CASES = [
    Case("produce", "produce", "kcli produce",
         lambda w, f: ["produce", "--topic", "sink", "--partition", "0", "-b", w.b], stdin="one\ntwo\n",
         table_silent=True),
    Case("consume", "consume", "kcli consume",
         lambda w, f: ["consume", "--topic", "orders", "--partition", "0", "--offset", "earliest",
                       "--max-messages", "4", "--timeout-ms", "10000", "-b", w.b]),
    Case("dump-log-segment", "dump-log", "kcli dump-log",
         lambda w, f: ["dump-log", str(w.files["segment"]), "--print-data-log"], yaml_refused=True),
    Case("dump-log-decoders", "dump-log", "kcli dump-log",
         lambda w, f: ["dump-log", str(w.files["segment"]), "--key-decoder", "json", "--value-decoder", "json"],
         yaml_refused=True),
    Case("dump-log-indexes", "dump-log", "kcli dump-log",
         lambda w, f: ["dump-log", str(w.files["segment"].parent), str(w.files["empty_index"])], yaml_refused=True),
    Case("dump-log-sanity", "dump-log", "kcli dump-log",
         lambda w, f: ["dump-log", str(w.files["segment"].with_suffix(".index")),
                       str(w.files["segment"].with_suffix(".timeindex")), "--index-sanity-check"],
         yaml_refused=True),
    Case("dump-log-checkpoint", "dump-log", "kcli dump-log",
         lambda w, f: ["dump-log", str(w.files["checkpoint"])], yaml_refused=True),
    Case("dump-log-transaction", "dump-log", "kcli dump-log",  # a transactional batch and its COMMIT marker
         lambda w, f: ["dump-log", str(w.data / "txns-0" / "00000000000000000000.log"), "--print-data-log"],
         yaml_refused=True),
    Case("dump-log-wal", "dump-log", "kcli dump-log",
         lambda w, f: ["dump-log", str(w.files["wal"]), str(w.files["wal-gone"]), "--deep-iteration",
                       "--coordinator", w.coordinator], yaml_refused=True),
    Case("dump-log-damaged", "dump-log", "kcli dump-log",
         lambda w, f: ["dump-log", str(w.files["damaged"]), str(w.files["txn"])], code=1, yaml_refused=True),
    Case("dump-log-kcli-log", "dump-log", "kcli dump-log",
         lambda w, f: ["dump-log", str(w.files["kcli_log"]), str(w.files["checkpoint"])], yaml_refused=True),
    Case("context-list", "context list", "kcli context list", lambda w, f: ["context", "list"]),
    Case("context-show", "context show", "kcli context show", lambda w, f: ["context", "show", "base"]),
    Case("context-use", "context use", "kcli context use", lambda w, f: ["context", "use", "base"]),
    Case("context-set", "context set", "kcli context set",
         lambda w, f: ["context", "set", f"new-{f}", "-b", w.b, "--property", "client.id=kcli-docs"]),
    Case("context-delete", "context delete", "kcli context delete", lambda w, f: ["context", "delete", f"old-{f}"]),
    Case("topics-create", "topics create", "kcli topics create",
         lambda w, f: ["topics", "create", "--topic", f"new-{f}", "--partitions", "2", "-b", w.b]),
    Case("topics-list", "topics list", "kcli topics list", lambda w, f: ["topics", "list", "-b", w.b]),
    Case("topics-describe", "topics describe", "kcli topics describe",
         lambda w, f: ["topics", "describe", "--topic", "orders", "--topic", "tiered", "--topic", "shrunk",
                       "-b", w.b],
         volatile=("[].partitions[].delete_at_ms",)),
    Case("topics-alter-configs", "topics alter", "kcli topics alter",
         lambda w, f: ["topics", "alter", "--topic", "orders", "--config", "retention.ms=3600000",
                       "--delete-config", "cleanup.policy", "--dry-run", "-b", w.b]),
    Case("topics-alter-shrink", "topics alter", "kcli topics alter",
         lambda w, f: ["topics", "alter", "--topic", "orders", "--partitions", "2", "--delete-partitions-delay",
                       "60000", "--dry-run", "-b", w.b],
         volatile=("partition_deletion.delete_at_ms", "partition_deletion.delete_at",
                   "partition_deletion.partitions[].delete_at_ms", "partition_deletion.partitions[].delete_at")),
    Case("topics-alter-disable-tiering", "topics alter", "kcli topics alter --disable-tiering, --enable-tiering",
         lambda w, f: ["topics", "alter", "--topic", "tiered", "--disable-tiering", "--policy", "delete",
                       "--dry-run", "-b", w.b]),
    Case("topics-alter-enable-tiering", "topics alter", "kcli topics alter --disable-tiering, --enable-tiering",
         lambda w, f: ["topics", "alter", "--topic", "tiered", "--enable-tiering", "-b", w.b]),
    Case("topics-delete", "topics delete", "kcli topics delete",
         lambda w, f: ["topics", "delete", "--topic", f"gone-{f}", "-b", w.b]),
    Case("groups-list", "groups list", "kcli groups list", lambda w, f: ["groups", "list", "-b", w.b]),
    Case("groups-describe", "groups describe", "kcli groups describe",
         lambda w, f: ["groups", "describe", "--group", "billing", "--group", "live", "-b", w.b]),
    Case("groups-delete", "groups delete", "kcli groups delete",
         lambda w, f: ["groups", "delete", "--group", f"gone-{f}", "-b", w.b]),
    Case("groups-reset-offsets", "groups reset-offsets", "kcli groups reset-offsets",
         lambda w, f: ["groups", "reset-offsets", "--group", "billing", "--all-topics", "--to-earliest", "-b", w.b]),
    Case("groups-delete-offsets", "groups delete-offsets", "kcli groups delete-offsets",
         lambda w, f: ["groups", "delete-offsets", "--group", "retired", "--topic", "sink", "-b", w.b]),
    Case("broker-metrics", "broker metrics", "kcli broker metrics", lambda w, f: ["broker", "metrics", "-b", w.b],
         volatile=("uptime_ms", "process_cpu_s", "counters", "summaries", "gauges")),
    Case("broker-status", "broker status", "kcli broker status", lambda w, f: ["broker", "status", "--data-dir", str(w.data)],
         volatile=("uptime_s",)),
    Case("broker-stop", "broker stop", "kcli broker stop",
         lambda w, f: ["broker", "stop", "--data-dir", str(w.spare(f))], volatile=("pid", "seconds")),
    Case("users-add", "broker users add", "kcli broker users add",
         lambda w, f: ["broker", "users", "add", f"new-{f}", "--users-file", str(w.users_file), "--password-stdin"],
         stdin="secret\n"),
    Case("users-list", "broker users list", "kcli broker users list",
         lambda w, f: ["broker", "users", "list", "--users-file", str(w.users_file)]),
    Case("users-delete", "broker users delete", "kcli broker users delete",
         lambda w, f: ["broker", "users", "delete", f"old-{f}", "--users-file", str(w.users_file)]),
    Case("scram-users-set", "users set", "kcli users set",
         lambda w, f: ["users", "set", f"new-{f}", "--iterations", "4096", "--password-stdin", "-b", w.b], stdin="secret\n"),
    Case("scram-users-list", "users list", "kcli users list", lambda w, f: ["users", "list", "carol", "-b", w.b]),
    Case("scram-users-delete", "users delete", "kcli users delete",
         lambda w, f: ["users", "delete", f"old-{f}", "-b", w.b]),
    Case("diskless-describe", "diskless describe", "kcli diskless describe",
         lambda w, f: ["diskless", "describe", "-b", w.b]),
    Case("diskless-describe-replicas", "diskless describe", "kcli diskless describe",
         lambda w, f: ["diskless", "describe", "--replicas", "-b", w.b]),
    Case("diskless-objects", "diskless objects", "kcli diskless objects",
         lambda w, f: ["diskless", "objects", "--batches", "-b", w.b]),
    Case("diskless-verify", "diskless verify", "kcli diskless verify",
         lambda w, f: ["diskless", "verify", "-b", w.b], code=1,
         volatile=("orphans[].age_ms", "unknown_objects[].age_ms")),
    Case("diskless-gc", "diskless gc", "kcli diskless gc", lambda w, f: ["diskless", "gc", "--dry-run", "-b", w.b]),
    Case("runbook-validate", "runbook validate", "kcli runbook validate",
         lambda w, f: ["runbook", "validate", str(w.files["runbook"])]),
    Case("runbook-validate-invalid", "runbook validate", "kcli runbook validate",
         lambda w, f: ["runbook", "validate", str(w.files["bad-runbook"])], code=2, table_silent=True),
    Case("runbook-run", "runbook run", "kcli runbook run",
         lambda w, f: ["runbook", "run", str(w.files["runbook"]), "--restart", "-b", w.b],
         volatile=("started_at", "duration_ms", "steps[].duration_ms", "steps[].wait.polls",
                   "steps[].wait.waited_ms")),
    Case("runbook-run-dry", "runbook run", "kcli runbook run",
         lambda w, f: ["runbook", "run", str(w.files["plan-runbook"]), "--dry-run", "-b", w.b],
         volatile=("started_at", "duration_ms", "steps[].duration_ms")),
    Case("transactions-list", "transactions list", "kcli transactions list",
         lambda w, f: ["transactions", "list", "-b", w.b]),
    Case("transactions-describe", "transactions describe", "kcli transactions describe",
         lambda w, f: ["transactions", "describe", "--transactional-id", "docs-hanging", "-b", w.b]),
    Case("transactions-describe-producers", "transactions describe-producers", "kcli transactions describe-producers",
         lambda w, f: ["transactions", "describe-producers", "--topic", "hanging", "--partition", "0", "-b", w.b]),
    Case("transactions-abort", "transactions abort", "kcli transactions abort",
         lambda w, f: ["transactions", "abort", "--topic", "hanging", "--partition", str(FORMATS.index(f)),
                       "--start-offset", "0", "-b", w.b],
         volatile=("partition",)),  # one partition per format
]

SEEN: dict[str, set[str]] = {}
RAN: set[str] = set()


def _same(data: Any, fmt: str) -> Any:
    """Per-format names (new-json, new-yaml) made equal, for comparing the two runs."""
    if isinstance(data, dict):
        return {k: _same(v, fmt) for k, v in data.items()}
    if isinstance(data, list):
        return [_same(v, fmt) for v in data]
    if isinstance(data, str):
        return data.replace(f"-{fmt}", "-FMT")
    return data


def _parse(text: str, fmt: str, stream: bool) -> Any:
    if fmt == "json":
        return [json.loads(line) for line in text.splitlines() if line.strip()] if stream else json.loads(text)
    return list(yaml.safe_load_all(text)) if stream else yaml.safe_load(text)


def _save_sample(case: Case, text: str) -> None:
    target = os.environ.get("KCLI_JSON_SAMPLES")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        (Path(target) / f"{case.id}.json").write_text(text)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_output_formats(world: World, case: Case) -> None:
    section = load_doc().get(case.section)
    assert section is not None, f"docs/json-output.md has no section '## {case.section}'"
    parsed: dict[str, Any] = {}
    for fmt in FORMATS:
        proc = kcli(*case.argv(world, fmt), "-o", fmt, stdin=case.stdin)
        where = f"{case.id} -o {fmt}: exit {proc.returncode}\nstdout: {proc.stdout[-1500:]}\nstderr: {proc.stderr[-1500:]}"
        assert "Traceback" not in proc.stderr, where
        if fmt == "yaml" and case.yaml_refused:
            assert proc.returncode == 2 and proc.stdout == "", where
            assert proc.stderr.startswith("kcli: error: ") and "-o yaml" in proc.stderr, where
            continue
        assert proc.returncode == case.code, where
        if fmt == "table":
            if case.table_silent:
                assert proc.stdout == "", where
            else:
                assert proc.stdout.strip(), where
                with pytest.raises(ValueError):
                    json.loads(proc.stdout)
            continue
        try:
            parsed[fmt] = _parse(proc.stdout, fmt, section.stream)
        except (ValueError, yaml.YAMLError) as err:
            pytest.fail(f"{where}\ndoes not parse: {err}")
        if fmt == "json":
            _save_sample(case, proc.stdout)
    documents = parsed["json"] if section.stream else [parsed["json"]]
    assert documents, f"{case.id}: no output to check"
    for document in documents:
        problems, seen = section.check(document)
        assert not problems, f"{case.id} against docs/json-output.md '{case.section}':\n" + "\n".join(problems)
        SEEN.setdefault(case.section, set()).update(seen)
    if "yaml" in parsed:
        a, b = parsed["json"], parsed["yaml"]
        if case.argv(world, "json") != case.argv(world, "yaml"):  # per-format names: new-json, new-yaml
            a, b = _same(a, "json"), _same(b, "yaml")
        for path in case.volatile:
            a, b = drop(a, path), drop(b, path)
        assert a == b, f"{case.id}: YAML differs from JSON"
    RAN.add(case.id)


# ---- static checks: the command list, the doc ---------------------------------------------------------


def test_every_command_is_classified() -> None:
    from kcli.cli.docgen import iter_commands

    commands = {" ".join(path) for path, _ in iter_commands()}
    assert not DATA_COMMANDS & set(NOT_DATA) and not (DATA_COMMANDS | set(NOT_DATA)) & set(ELSEWHERE)
    assert commands - set(NOT_DATA) - DATA_COMMANDS - set(ELSEWHERE) == set(), \
        "new command: add it to DATA_COMMANDS (with a case and a doc section) or NOT_DATA"
    assert (DATA_COMMANDS | set(NOT_DATA) | set(ELSEWHERE)) - commands == set(), "listed command no longer exists"
    assert {c.command for c in CASES} == DATA_COMMANDS, "every data command needs a case"


def test_doc_has_one_section_per_data_command_and_nothing_stale() -> None:
    sections = load_doc()
    used = {c.section for c in CASES} | {f"kcli {command}" for command in ELSEWHERE}
    assert set(sections) == used, (f"sections without a case: {set(sections) - used}; "
                                    f"cases without a section: {used - set(sections)}")
    for command in DATA_COMMANDS:
        assert any(t == f"kcli {command}" or t.startswith(f"kcli {command} ") for t in sections), command
    text = DOC.read_text()
    for command, _reason in NOT_DATA.items():
        assert f"kcli {command}" in text, f"docs/json-output.md should say why `kcli {command}` has no JSON"


@pytest.mark.parametrize("title", sorted(load_doc()) if DOC.exists() else [])
def test_doc_examples_match_their_field_tables(title: str) -> None:
    section = load_doc()[title]
    assert section.examples, f"{title}: no ```json example"
    assert section.fields or section.variants, f"{title}: no field table"
    shown: set[str] = set()
    for example in section.examples:
        problems, seen = section.check(example)
        assert not problems, f"{title} example:\n" + "\n".join(problems)
        shown |= seen
    if not section.variants:  # a single-shape command's example shows every field
        missing = section.documented() - shown
        assert not missing, f"{title}: the example lacks {sorted(missing)}"


def test_field_checker_catches_drift() -> None:
    """The shape check itself: renamed, removed, retyped and undocumented fields all fail."""
    fields = {f.path: f for f in (FieldDoc.parse("topic", "string"), FieldDoc.parse("partitions", "array of object"),
                                  FieldDoc.parse("partitions[].id", "int"),
                                  FieldDoc.parse("partitions[].leader", "int or null"),
                                  FieldDoc.parse("note", "string (optional)"),
                                  FieldDoc.parse("sums", "map of object"), FieldDoc.parse("sums.*.n", "int"))}
    good = {"topic": "t", "partitions": [{"id": 0, "leader": None}], "sums": {"a": {"n": 1}}}
    assert check_shape(good, fields) == ([], {"topic", "partitions", "partitions[].id", "partitions[].leader",
                                              "sums", "sums.*.n"})
    assert check_shape({**good, "extra": 1}, fields)[0] == ["extra: not documented"]
    assert check_shape({"topic": "t", "sums": {}}, fields)[0] == ["partitions: documented, missing"]
    assert check_shape({**good, "partitions": [{"id": "0", "leader": 1}]}, fields)[0] == [
        "partitions[].id: str '0', documented as int"]
    assert check_shape({**good, "sums": {"a": {"m": 1}}}, fields)[0] == ["sums.*.m: not documented",
                                                                         "sums.*.n: documented, missing"]
    assert check_shape({**good, "topic": True}, fields)[0] == ["topic: bool True, documented as string"]
    with pytest.raises(ValueError):
        FieldDoc.parse("x", "strnig")


def test_every_documented_field_was_seen_in_real_output() -> None:
    """Runs last: a documented field no command printed is stale (or needs a case)."""
    if RAN != {c.id for c in CASES}:
        pytest.skip("only meaningful after every case ran and passed")
    for title, section in load_doc().items():
        if title.removeprefix("kcli ") in ELSEWHERE:
            continue  # checked field by field where those commands run
        missing = {p for p in section.documented() - SEEN.get(title, set()) if (title, p) not in NOT_EXERCISED}
        assert not missing, f"{title}: documented but never printed: {sorted(missing)}"
