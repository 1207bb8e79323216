"""kcli: operator toolkit for Kafka's newer storage features, with an embedded broker."""

import sys as _sys

__version__ = "0.1.0"


def _kio_without_hypothesis_hooks() -> None:
    """kio registers Hypothesis strategies for its types whenever Hypothesis is importable,
    which costs every kcli process (each CLI command, each broker start) ~0.45 s of imports it
    never uses. Hide Hypothesis while kio's phantom-type base loads; a process that already
    imported Hypothesis (the test runner) keeps kio's hooks."""
    if "hypothesis" in _sys.modules or "kio.static._phantom" in _sys.modules:
        return
    _sys.modules["hypothesis"] = None  # type: ignore[assignment]  # import -> ImportError
    try:
        import kio.static._phantom  # noqa: F401
    except ImportError:  # kio missing: its importers say so themselves
        pass
    finally:
        del _sys.modules["hypothesis"]


_kio_without_hypothesis_hooks()
