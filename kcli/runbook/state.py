"""Progress of a runbook between runs: which steps finished, so a re-run resumes.

The state file sits next to the runbook (``orders.yaml`` → ``orders.kcli-runbook-state.json``,
matching the repository's .gitignore). Each finished step is recorded with its digest (the
resolved step plus the target cluster, see :meth:`Step.digest`); a step is skipped only when
its digest at the same position still matches, so an edited step runs again. The file is
replaced atomically after every finished step, so a crash loses at most the running step.

Two runs of one runbook at once would race on that file and on the cluster, so a run holds an
exclusive advisory lock (flock) on the runbook file itself while it works.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from kcli.errors import OperationError, UsageError

STATE_SUFFIX = ".kcli-runbook-state.json"
STATE_VERSION = 1


def state_path(runbook: Path) -> Path:
    """``dir/name.yaml`` → ``dir/name.kcli-runbook-state.json``."""
    runbook = Path(runbook)
    stem = runbook.name[: -len(runbook.suffix)] if runbook.suffix.lower() in (".yaml", ".yml") else runbook.name
    return runbook.with_name(stem + STATE_SUFFIX)


@dataclass
class FinishedStep:
    index: int
    name: str
    op: str
    digest: str
    finished_at: str  # ISO-8601 UTC
    duration_ms: int


@dataclass
class RunState:
    path: Path
    steps: dict[int, FinishedStep] = field(default_factory=dict)

    def finished(self, index: int, digest: str) -> FinishedStep | None:
        rec = self.steps.get(index)
        return rec if rec is not None and rec.digest == digest else None

    def mark(self, index: int, name: str, op: str, digest: str, duration_ms: int) -> None:
        finished_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.steps[index] = FinishedStep(index, name, op, digest, finished_at, duration_ms)
        self.save()

    def forget(self, index: int) -> None:
        """A step that ran again and failed is no longer finished."""
        if self.steps.pop(index, None) is not None:
            self.save()

    def to_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "steps": [asdict(s) for s in sorted(self.steps.values(), key=lambda s: s.index)]}

    def save(self) -> None:
        directory = self.path.parent
        try:
            fd, tmp = tempfile.mkstemp(prefix=".kcli-runbook-state.", suffix=".tmp", dir=directory)
            try:
                with os.fdopen(fd, "w") as fh:
                    json.dump(self.to_dict(), fh, indent=2)
                    fh.write("\n")
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as err:
            raise OperationError(f"cannot write runbook state {self.path}: {err.strerror or err}") from None

    def delete(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
        except OSError as err:
            raise OperationError(f"cannot remove runbook state {self.path}: {err.strerror or err}") from None


def load_state(path: Path) -> RunState:
    """The recorded progress; a missing file is a fresh start, a damaged one a usage error."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return RunState(path)
    except (OSError, ValueError) as err:
        raise UsageError(f"runbook state {path} is unreadable ({err}); remove it or run with --restart") from None
    try:
        if raw.get("version") != STATE_VERSION:
            raise ValueError(f"version {raw.get('version')!r}")
        steps = {int(s["index"]): FinishedStep(int(s["index"]), str(s["name"]), str(s["op"]), str(s["digest"]),
                                               str(s["finished_at"]), int(s["duration_ms"]))
                 for s in raw["steps"]}
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        raise UsageError(f"runbook state {path} is not a kcli runbook state ({err}); "
                         "remove it or run with --restart") from None
    return RunState(path, steps)


@contextmanager
def exclusive(runbook: Path) -> Iterator[None]:
    """Hold an exclusive flock on the runbook file for the duration of a run."""
    try:
        fd = os.open(runbook, os.O_RDONLY)
    except OSError as err:
        raise UsageError(f"cannot open runbook {runbook}: {err.strerror or err}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OperationError(f"another `kcli runbook run` is running {runbook}; wait for it to finish") from None
        yield
    finally:
        os.close(fd)
