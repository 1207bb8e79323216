"""Ctrl-C before the CLI is ready: importing kcli's command modules takes a moment (more on a
loaded machine), and Python's own SIGINT handling would print a KeyboardInterrupt traceback
from somewhere inside an import. Until main() installs kcli's handler, SIGINT/SIGTERM exit at
once with kcli's one line and 128 + the signal (nothing has been done yet to clean up)."""

from __future__ import annotations

import os
import signal
from typing import Any


def _exit_now(signum: int, frame: Any) -> None:
    os.write(2, b"kcli: interrupted\n")
    os._exit(128 + signum)


def exit_on_early_interrupt() -> None:
    """Install the early handler, unless SIGINT is ignored (e.g. started in the background by a shell)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _exit_now)


def is_early_handler(handler: object) -> bool:
    return handler is _exit_now
