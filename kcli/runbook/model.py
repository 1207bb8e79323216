"""A validated runbook: steps with resolved arguments, conditions and error policy.

Everything here is already checked (types coerced, variables substituted), so the runner
never meets a malformed value. Conditions are the small expression form shared by
``expect`` and ``wait_for``: a ``path`` into an operation's JSON result plus one comparator.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kcli.runbook.loader import Pos

COMPARATORS = ("equals", "not_equals", "gt", "gte", "lt", "lte", "contains", "length", "exists")
ON_ERROR = ("stop", "continue")

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PATH_TOKEN = re.compile(r"""([^.\[\]"']+)|\[(-?\d+)\]|\["([^"]*)"\]|\['([^']*)'\]""")


def parse_duration(value: Any) -> float:
    """``"500ms"``, ``"30s"``, ``"5m"``, ``"1h"`` or ``0`` → seconds. A bare non-zero number is
    refused: ``60`` could mean seconds or milliseconds, and a runbook must not guess."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 500ms, 30s or 5m, got {value!r}")
    if isinstance(value, (int, float)) and value == 0:
        return 0.0
    if isinstance(value, str):
        if value.strip() == "0":
            return 0.0
        m = _DURATION_RE.match(value)
        if m:
            return float(m.group(1)) * _UNIT_S[m.group(2)]
    if isinstance(value, (int, float)):
        raise ValueError(f"{value!r} needs a unit: {value}ms, {value}s or {value}m")
    raise ValueError(f"expected a duration such as 500ms, 30s or 5m, got {value!r}")


def format_duration(seconds: float) -> str:
    if seconds and seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"


def split_path(path: str) -> list[str | int]:
    """``"partitions[0].leader"`` or ``"partitions.0.leader"`` → ``["partitions", 0, "leader"]``;
    ``configs["retention.ms"]`` names a key that contains dots (see also :func:`lookup`)."""
    tokens: list[str | int] = []
    pos = 0
    expect_name = True  # at the start or after a dot
    while pos < len(path):
        m = _PATH_TOKEN.match(path, pos)
        if m is None:
            raise ValueError(f"cannot parse path {path!r} at character {pos + 1}")
        word, index, quoted = m.group(1), m.group(2), m.group(3) if m.group(3) is not None else m.group(4)
        if word is not None:
            if not expect_name:
                raise ValueError(f"cannot parse path {path!r} at character {pos + 1}")
            tokens.append(int(word) if re.fullmatch(r"-?\d+", word) else word)
        elif index is not None:
            tokens.append(int(index))
        else:
            tokens.append(quoted)
        pos = m.end()
        expect_name = False
        if pos < len(path) and path[pos] == ".":
            pos += 1
            expect_name = True
            if pos == len(path):
                raise ValueError(f"path {path!r} ends with a dot")
    return tokens


class Missing:
    """The value a path leads nowhere: distinct from JSON null."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING = Missing()


def lookup(data: Any, path: str) -> Any:
    """Follow ``path`` through dicts (keys) and lists (indices); :data:`MISSING` if it ends.

    Config names contain dots, so when a dict has no key for the next segment the longest run
    of segments joined with dots that it does have is used: ``configs.retention.ms`` finds
    ``configs["retention.ms"]``."""
    tokens = split_path(path)
    value = data
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if isinstance(value, dict):
            for j in range(len(tokens), i, -1):
                key = ".".join(str(t) for t in tokens[i:j])
                if key in value:
                    value = value[key]
                    i = j
                    break
            else:
                return MISSING
            continue
        if isinstance(value, list) and isinstance(token, int) and -len(value) <= token < len(value):
            value = value[token]
            i += 1
            continue
        return MISSING
    return value


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


def loosely_equal(actual: Any, expected: Any) -> bool:
    """Equality that forgives str-vs-scalar: ``--var n=3`` gives "3", results hold 3."""
    if isinstance(actual, bool) != isinstance(expected, bool) and not (
            isinstance(actual, str) or isinstance(expected, str)):
        return False
    if actual == expected:
        return True
    if isinstance(actual, (dict, list)) or isinstance(expected, (dict, list)):
        return False
    if isinstance(actual, str) or isinstance(expected, str):
        return _text(actual) == _text(expected)
    return False


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


@dataclass
class Condition:
    """``path`` + one comparator (see :data:`COMPARATORS`); evaluated on plain JSON data."""

    path: str
    op: str
    expected: Any
    pos: Pos = Pos(1, 1)

    def describe(self) -> str:
        where = self.path or "result"
        if self.op == "exists":
            return f"{where} {'exists' if self.expected else 'is absent'}"
        return f"{where} {self.op.replace('_', ' ')} {json.dumps(self.expected, default=str)}"

    def evaluate(self, data: Any) -> tuple[bool, Any]:
        """(holds, actual value at path); ``actual`` is MISSING when the path leads nowhere."""
        actual = lookup(data, self.path)
        if self.op == "exists":
            return (actual is not MISSING) == bool(self.expected), actual
        if actual is MISSING:
            return False, actual
        if self.op == "equals":
            return loosely_equal(actual, self.expected), actual
        if self.op == "not_equals":
            return not loosely_equal(actual, self.expected), actual
        if self.op == "contains":
            if isinstance(actual, str):
                return _text(self.expected) in actual, actual
            if isinstance(actual, list):
                return any(loosely_equal(v, self.expected) for v in actual), actual
            if isinstance(actual, dict):
                return _text(self.expected) in actual, actual
            return False, actual
        if self.op == "length":
            if not isinstance(actual, (list, dict, str)):
                return False, actual
            return loosely_equal(len(actual), self.expected), len(actual)
        a, e = _number(actual), _number(self.expected)
        if a is None or e is None:
            return False, actual
        return {"gt": a > e, "gte": a >= e, "lt": a < e, "lte": a <= e}[self.op], actual

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, self.op: self.expected}


@dataclass
class WaitFor:
    """Poll a describe operation until ``condition`` holds on its result, or time out."""

    operation: str  # registry name, e.g. "topics.describe"
    args: dict[str, Any]
    condition: Condition
    timeout_s: float = 60.0
    interval_s: float = 0.5

    def to_dict(self) -> dict[str, Any]:
        return {"describe": self.operation, **self.args, **self.condition.to_dict(),
                "timeout": format_duration(self.timeout_s), "interval": format_duration(self.interval_s)}


@dataclass
class Step:
    index: int  # 1-based, as printed
    name: str
    op: str
    args: dict[str, Any]
    wait_for: WaitFor | None = None
    expect: list[Condition] = field(default_factory=list)
    on_error: str = "stop"
    pos: Pos = Pos(1, 1)

    def to_dict(self) -> dict[str, Any]:
        """The step as resolved (variables substituted, defaults applied)."""
        return {"name": self.name, "op": self.op, "args": self.args,
                "wait_for": self.wait_for.to_dict() if self.wait_for else None,
                "expect": [c.to_dict() for c in self.expect], "on_error": self.on_error}

    def digest(self, target: str, variables: dict[str, Any] | None = None) -> str:
        """Identity for resume: the resolved step, the cluster it runs against and the run's
        variables. Editing the step, another --var or another cluster changes it, so the step
        runs again (a step that does not use the changed variable too: it is another job)."""
        body = json.dumps({"step": self.to_dict(), "target": target, "variables": variables or {}},
                          sort_keys=True, default=str)
        return hashlib.sha256(body.encode()).hexdigest()[:16]


@dataclass
class Runbook:
    path: Path
    file: str  # as messages name it
    description: str | None
    context: str | None
    bootstrap_server: str | None
    variables: dict[str, Any]
    steps: list[Step]
