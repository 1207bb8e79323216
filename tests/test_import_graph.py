"""Imports flow one way: no two modules of kcli, plugins or spark_tasks import each other.

Read from the source (every import statement, also those inside functions), so a cycle that only
a lazy import closes is caught too. A package importing its own submodule counts as an import of
that submodule, not of the package."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    files = [p for top in ("kcli", "plugins", "spark_tasks") for p in (ROOT / top).rglob("*.py")]
    names = {_module_name(p): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = {f"{node.module}.{a.name}" for a in node.names}
                known = subs & names.keys()
                deps.update(known or {node.module})
        graph[name] = {d for d in deps if d in names and d != name}
    return graph


def test_no_two_modules_import_each_other() -> None:
    graph = import_graph()
    assert len(graph) > 100, "the modules were not found"
    mutual = sorted({tuple(sorted((a, b))) for a, deps in graph.items() for b in deps if a in graph[b]})
    assert mutual == [], f"modules importing each other: {mutual}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan): every import cycle,
    whatever its length, lies inside one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for d in graph[todo.pop()]:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def test_no_import_cycle_of_any_length() -> None:
    assert _cycles(import_graph()) == []


def test_the_cycle_check_finds_a_long_cycle() -> None:
    """The check itself: a three-module ring is one component."""
    ring = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(ring) == [["a", "b", "c"]]


# Shared cluster state and the parts below it never reach the broker, not even through another
# module: the broker builds on them, never the reverse.
BELOW_THE_BROKER = ("kcli.cluster", "kcli.metadata", "kcli.coordinator", "kcli.security", "kcli.config",
                    "kcli.storage", "kcli.records", "kcli.protocol", "plugins")


def test_shared_state_never_imports_the_broker() -> None:
    graph = import_graph()
    offenders = {m: sorted(d for d in _reachable(graph, m) if d.startswith("kcli.broker"))
                 for m in graph if m.startswith(BELOW_THE_BROKER)}
    assert {m: ds for m, ds in offenders.items() if ds} == {}


def test_every_package_says_what_it_owns() -> None:
    """A newcomer finds a behaviour by package: each package's docstring says what it holds."""
    missing = []
    for init in sorted((ROOT / "kcli").rglob("__init__.py")):
        if init.parent == ROOT / "kcli":
            continue
        tree = ast.parse(init.read_text())
        if not (ast.get_docstring(tree) or "").strip():
            missing.append(str(init.relative_to(ROOT)))
    assert missing == []
