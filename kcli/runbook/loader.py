"""Load a runbook's YAML safely, keeping where every key and value came from.

Runbooks are data, so loading never builds Python objects from tags: the file is only
*composed* (yaml.compose with SafeLoader, which yields nodes with their marks), and this
module turns the nodes into plain dicts/lists/scalars itself. Any tag outside YAML's core
schema (``!!python/object``, ``!!binary``, local ``!tags``) is a problem to report, not
something to construct. Positions are kept per path (``("steps", 0, "topics.alter",
"topic")``) so validation can name ``FILE:LINE:COL`` for each mistake.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import SafeConstructor

PathKey = tuple[Any, ...]

_CORE = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_CORE + t for t in ("str", "int", "float", "bool", "null")}
_TIMESTAMP = _CORE + "timestamp"  # kept as its text: a runbook never needs a datetime object


@dataclass(frozen=True, order=True)
class Pos:
    """1-based line and column, as editors show them."""

    line: int
    column: int


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a runbook file."""

    file: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "column": self.column, "message": self.message}


@dataclass
class Document:
    """Plain data plus positions: ``values[path]`` where a value starts, ``keys[path]`` where
    the mapping key naming it starts."""

    file: str
    data: Any
    values: dict[PathKey, Pos] = field(default_factory=dict)
    keys: dict[PathKey, Pos] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)  # found while loading; validation adds its own
    refused: set[PathKey] = field(default_factory=set)  # values dropped (bad tag): not to be re-reported

    def pos(self, path: PathKey, key: bool = False) -> Pos:
        """Position of ``path`` (its key when ``key``), else of its nearest known ancestor."""
        table = self.keys if key else self.values
        p = tuple(path)
        while p:
            if p in table:
                return table[p]
            if p in self.values:
                return self.values[p]
            p = p[:-1]
        return self.values.get((), Pos(1, 1))

    def problem(self, path: PathKey, message: str, key: bool = False) -> Problem:
        at = self.pos(path, key)
        return Problem(self.file, at.line, at.column, message)


class LoadError(Exception):
    """The file cannot be read as a runbook document at all; ``problems`` says where."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


# A runbook is a few hundred nodes; aliases may repeat a block, but a document that expands past
# this many nodes is an alias bomb ("billion laughs": 410 bytes → 10^9 nodes), not a runbook.
MAX_EXPANDED_NODES = 10_000
# Nesting deeper than this is no runbook either, and would exhaust Python's recursion limit.
MAX_DEPTH = 100


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer refuses what would make turning nodes into values blow up:
    an alias used inside its own anchor (a cycle), more than :data:`MAX_EXPANDED_NODES` nodes
    once aliases are expanded, nesting deeper than :data:`MAX_DEPTH`. Each refusal is a
    ComposerError at the offending mark, so it is reported as FILE:LINE:COL at once."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._expanded = 0  # nodes so far, each alias counting as the whole subtree it repeats
        self._sizes: dict[int, int] = {}  # id(anchored node) -> its expanded size
        self._open: set[str] = set()  # anchors whose node is still being composed
        self._depth = 0

    def _count(self, n: int, mark: Any) -> None:
        self._expanded += n
        if self._expanded > MAX_EXPANDED_NODES:
            raise ComposerError(
                None, None, f"aliases expand the document past {MAX_EXPANDED_NODES:,} nodes "
                "(an alias bomb?); write the repeated parts out", mark)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            if event.anchor in self._open:
                raise ComposerError(
                    None, None, f"alias *{event.anchor} refers to the node that contains it (a cycle)",
                    event.start_mark)
            node = super().compose_node(parent, index)  # raises for an undefined alias
            self._count(self._sizes.get(id(node), 1), event.start_mark)
            return node
        event = self.peek_event()
        if self._depth >= MAX_DEPTH:
            raise ComposerError(None, None, f"nesting deeper than {MAX_DEPTH} levels",
                                              event.start_mark)
        self._count(1, event.start_mark)
        anchor = event.anchor
        before = self._expanded - 1
        if anchor is not None:
            self._open.add(anchor)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if anchor is not None:
                self._open.discard(anchor)
        if anchor is not None:
            self._sizes[id(node)] = self._expanded - before
        return node


def _pos(node: yaml.Node) -> Pos:
    return Pos(node.start_mark.line + 1, node.start_mark.column + 1)


def _show_tag(tag: str) -> str:
    return "!!" + tag[len(_CORE):] if tag.startswith(_CORE) else tag


class _Builder:
    def __init__(self, file: str) -> None:
        self.doc = Document(file, None)
        self.problems: list[Problem] = []
        self._constructor = SafeConstructor()

    def fail(self, node: yaml.Node, message: str) -> None:
        at = _pos(node)
        self.problems.append(Problem(self.doc.file, at.line, at.column, message))

    def refuse_tag(self, node: yaml.Node, path: PathKey) -> None:
        self.doc.refused.add(path)
        self.fail(node, f"YAML tag {_show_tag(node.tag)} is not allowed: a runbook holds only strings, "
                        "numbers, booleans, null, lists and mappings")

    def build(self, node: yaml.Node, path: PathKey) -> Any:
        self.doc.values[path] = _pos(node)
        if isinstance(node, yaml.MappingNode):
            if node.tag != _CORE + "map":
                self.refuse_tag(node, path)
                return None
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                if key_node.tag == _CORE + "merge":
                    self.fail(key_node, "merge keys (<<) are not supported in runbooks; write the fields out")
                    continue
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag not in _SCALAR_TAGS:
                    self.fail(key_node, "mapping keys must be plain strings")
                    continue
                key = str(key_node.value)
                if key in out:
                    first = self.doc.keys[path + (key,)]
                    self.fail(key_node, f"duplicate key {key!r} (first at line {first.line}, column {first.column})")
                    continue
                self.doc.keys[path + (key,)] = _pos(key_node)
                out[key] = self.build(value_node, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            if node.tag != _CORE + "seq":
                self.refuse_tag(node, path)
                return None
            return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
        if node.tag == _TIMESTAMP:
            return str(node.value)
        if node.tag not in _SCALAR_TAGS:
            self.refuse_tag(node, path)
            return None
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.YAMLError as err:  # e.g. !!int "abc"
            self.doc.refused.add(path)
            self.fail(node, f"bad {_show_tag(node.tag)} value {node.value!r}: {getattr(err, 'problem', err)}")
            return None


def loads(text: str, file: str) -> Document:
    """Parse ``text`` (named ``file`` in messages). A syntax error raises :class:`LoadError`;
    refused tags and duplicate keys land in ``Document.problems`` so validation can go on and
    report everything else too."""
    try:
        root = yaml.compose(text, Loader=_BoundedLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        what = err.problem or err.context or "YAML syntax error"
        raise LoadError([Problem(file, line, column, f"invalid YAML: {what}")]) from None
    except yaml.YAMLError as err:
        raise LoadError([Problem(file, 1, 1, f"invalid YAML: {err}")]) from None
    if root is None:
        raise LoadError([Problem(file, 1, 1, "the runbook is empty")])
    builder = _Builder(file)
    builder.doc.data = builder.build(root, ())
    builder.doc.problems = builder.problems
    return builder.doc


def load(path: Path, display: str | None = None) -> Document:
    """Read and parse ``path``; ``display`` is how messages name it (default: as given)."""
    name = display or str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LoadError([Problem(name, 1, 1, "no such file")]) from None
    except UnicodeDecodeError as err:
        raise LoadError([Problem(name, 1, 1, f"not UTF-8 text: {err.reason} at byte {err.start}")]) from None
    except OSError as err:
        raise LoadError([Problem(name, 1, 1, f"cannot read: {err.strerror or err}")]) from None
    return loads(text, name)
