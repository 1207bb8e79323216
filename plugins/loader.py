"""Resolve plugin classes by dotted name, the way Kafka's ``*.class.name`` configs do.

Operators name a class in a config file (``diskless.coordinator.class.name=
plugins.coordinator.sqlite.SqliteBatchCoordinator``); a typo or a class of the wrong kind must
surface as one readable line at startup, not as an ImportError traceback mid-request.
"""

from __future__ import annotations

import importlib
from typing import TypeVar

from kcli.errors import UsageError

T = TypeVar("T")


class PluginError(UsageError):
    """A configured plugin class cannot be loaded or is not the expected kind (a config error)."""


def load_class(name: str, base: type[T]) -> type[T]:
    """Return the class named ``package.module.ClassName``, checked to be a subclass of ``base``."""
    if not isinstance(name, str) or not name.strip():
        raise PluginError(f"plugin class name is empty (expected package.module.ClassName for {base.__name__})")
    name = name.strip()
    module_name, dot, class_name = name.rpartition(".")
    if not dot or not module_name or not class_name:
        raise PluginError(f"plugin class name {name!r} is not of the form package.module.ClassName")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        # Only "the named module is missing" is a plain not-found; a missing dependency of the
        # module is reported with its own name so the operator knows what to install.
        if err.name and (module_name == err.name or module_name.startswith(err.name + ".")):
            raise PluginError(f"plugin class {name!r} not found: no module named {module_name!r}") from None
        raise PluginError(f"plugin class {name!r}: importing {module_name!r} failed: {err}") from None
    except Exception as err:  # noqa: BLE001 - any import-time failure is a config problem
        raise PluginError(
            f"plugin class {name!r}: importing {module_name!r} failed: {type(err).__name__}: {err}"
        ) from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise PluginError(f"plugin class {name!r} not found: module {module_name!r} has no {class_name!r}")
    if not isinstance(cls, type):
        raise PluginError(f"plugin {name!r} is not a class")
    if not issubclass(cls, base):
        raise PluginError(f"plugin class {name!r} is not a {base.__module__}.{base.__qualname__}")
    return cls
