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
