"""kcli's own progress bar for long scans: rich, on stderr, only when stderr is a terminal.

Spark's console progress is switched off (it would interleave with kcli's output and means
nothing to an operator); both engines advance this bar instead, per object done.
"""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    """``with Progress("verify", total) as p: p.advance(n)``; a no-op when not on a terminal."""

    def __init__(self, description: str, total: int, *, enabled: bool | None = None) -> None:
        self.description = description
        self.total = total
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> "Progress":
        if self.enabled and self.total > 0:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._progress = RichProgress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=Console(file=sys.stderr), transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=self.total)
        return self

    def advance(self, n: int = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def set_completed(self, n: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=min(n, self.total))

    def status(self, text: str) -> None:
        """Change the label (e.g. "starting Spark…" while the JVM boots)."""
        if self._progress is not None:
            self._progress.update(self._task, description=text)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


class NoProgress(Progress):
    def __init__(self) -> None:
        super().__init__("", 0, enabled=False)
