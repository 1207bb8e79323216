"""Figures every bench script records, so bench/run_all can write docs/performance.md.

A script calls :func:`record` for each figure it prints; when ``KCLI_BENCH_OUT`` names a file,
the figure is appended there as one JSON line. Run alone, a script just prints its own table.
"""

from __future__ import annotations

import json
import os
from typing import Any


def record(figure: str, kcli: float | None, *, peer: float | None = None, peer_name: str = "",
           unit: str = "", target: str = "", better: str = "higher") -> None:
    """Append one figure (``better`` says whether higher or lower values are better)."""
    path = os.environ.get("KCLI_BENCH_OUT")
    if not path:
        return
    row: dict[str, Any] = {"figure": figure, "kcli": kcli, "peer": peer, "peer_name": peer_name, "unit": unit,
                           "target": target, "better": better, "script": os.path.basename(os.environ.get("KCLI_BENCH_SCRIPT", ""))}
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
