"""Named pause points for crash tests: broker configs ``kcli.fault.<point>.pause.ms``.

Killing a broker at a random moment rarely lands inside a short window such as a coordinator
commit or a segment roll. A pause point stretches one window on demand: with
``kcli.fault.<point>.pause.ms=N`` the code passing ``<point>`` writes one line
``kcli fault point <point>: pausing N ms until T`` (T: the wall-clock end of the pause, Unix seconds)
to stderr and sleeps N ms, so a test that tails the
broker's stderr can SIGKILL it inside the window (tests/test_crash.py, bench/crash_soak.py).
Unset — always, outside those tests — a point costs one dict lookup.

Points (docs/reliability.md):

- ``log.roll``: classic log roll, after the old segment is closed, before the new one exists
  (blocks the event loop, like the roll itself);
- ``diskless.commit``: inside the batch coordinator's commit transaction, before COMMIT;
- ``log.cleaner.cleaned``: the log cleaner wrote and fsynced ``<base>.log.cleaned``, before the
  swap (in the cleaner's worker thread); ``log.cleaner.swap``: the cleaned segment was renamed to
  ``.swap`` (the commit point), before the old segments are deleted (holds the log's lock);
- ``diskless.log.cleaner.uploaded``: the diskless log cleaner uploaded a compacted WAL object, before
  its replace_batches commit; ``diskless.log.cleaner.committed``: after that commit, before the old
  objects are deleted (in a worker thread; kcli/diskless/compaction.py);
- ``tiered.copy.uploaded``: the RemoteStorageManager stored a segment's copy, before its
  COPY_SEGMENT_FINISHED (kcli/tiered/manager.py; classic and diskless topics);
  ``diskless.tiering.trim``: finished copies cover a diskless partition's WAL range past local
  retention, before the coordinator's DeleteRecords (kcli/diskless/tiering.py);
  ``diskless.delete.records``: inside the SQLite batch coordinator's DeleteRecords transaction,
  before COMMIT (tests/test_diskless_tiering_faults.py);
- ``objectstore.upload.<first key component>`` (``.wal``, ``.tiered``): halfway through an
  upload's bytes; passed by :class:`plugins.objectstore.faulty.FaultyObjectStorage` only.

``kcli.fault.switch.file=PATH`` arms the points only while PATH exists, so a test can let the
broker run at full speed (recovery, checks) and arm the windows just before it kills; a PATH
holding point names (whitespace-separated) arms only those, so one broker configured with several
points can be killed in each window in turn without a restart.

The settings are process-wide (set when a Broker is built): a test runs one faulted broker per
process, in a child process.
"""

from __future__ import annotations

import re
import sys
import time

from kcli.config.definitions import ConfigError

POINTS = ("log.roll", "diskless.commit", "log.cleaner.cleaned", "log.cleaner.swap", "diskless.log.cleaner.uploaded",
          "diskless.log.cleaner.committed", "tiered.copy.uploaded", "diskless.tiering.trim", "diskless.delete.records")
PREFIXED_POINTS = ("objectstore.upload.",)
_SETTING = re.compile(r"^(?P<point>[a-z0-9._-]+)\.pause\.ms$")

_pauses: dict[str, int] = {}
_switch: list[str] = []  # the switch file, if one is configured


def configure(settings: dict[str, str]) -> None:
    """Apply the ``kcli.fault.`` settings (prefix stripped): ``<point>.pause.ms`` naming an unknown
    point, or a bad value, is a ConfigError (the broker refuses to start), never a silently inert
    test; keys not ending in ``.pause.ms`` belong to other hooks and are left to them."""
    pauses: dict[str, int] = {}
    switch = settings.get("switch.file", "")
    for name, raw in settings.items():
        if name == "switch.file" or not name.endswith(".pause.ms"):
            continue  # other features' hooks share the prefix (kcli.fault.remote.log.disable.delay.ms)
        m = _SETTING.match(name)
        point = m.group("point") if m else ""
        if not m or not (point in POINTS or point.startswith(PREFIXED_POINTS)):
            raise ConfigError(
                f"Unknown fault setting kcli.fault.{name} (expected kcli.fault.<point>.pause.ms with point one of "
                f"{', '.join(POINTS)}, objectstore.upload.<key prefix>)")
        try:
            ms = int(raw)
        except ValueError:
            ms = -1
        if ms < 0:
            raise ConfigError(f"Invalid value {raw} for configuration kcli.fault.{name}: Value must be at least 0")
        pauses[point] = ms
    _pauses.clear()
    _pauses.update(pauses)
    _switch[:] = [switch] if switch else []


def pause(point: str) -> None:
    """Announce and sleep when ``point`` is configured; otherwise return at once."""
    ms = _pauses.get(point)
    if ms and (not _switch or _armed(point)):
        until = time.time() + ms / 1000  # a reader that notices the line late still knows the window
        sys.stderr.write(f"kcli fault point {point}: pausing {ms} ms until {until:.3f}\n")
        sys.stderr.flush()
        time.sleep(ms / 1000)


def _armed(point: str) -> bool:
    """The switch file exists and is empty or names ``point``."""
    try:
        with open(_switch[0]) as f:
            names = f.read().split()
    except OSError:
        return False
    return not names or point in names


def is_set(point: str) -> bool:
    return bool(_pauses.get(point))


def active() -> dict[str, int]:
    """The configured points (for tests and logs)."""
    return dict(_pauses)
