"""Training-framework backends, and the registry that finds one by name.

`get_backend(name)` returns the backend (a `Backend`, hpcrl/planning/backends/base.py) of a run config's
`hpcrl.backend`; docs/backends.md describes the interface and each implementation. A backend is
one module of this package, named for the backend (`-` written `_`), that sets `BACKEND` to its
class: adding one is adding that module, nothing here. The registry imports only the module a
name asks for: the run-config types (hpcrl/planning/run_types.py) ask it for a backend's own
section defaults, and the backends are handed those types, so the types sit below the backends
with no import going back up; and a command imports only the backend its config names. Only
`backend_names()` (a list in an error or a help text) imports them all.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache
from typing import Any

from hpcrl.errors import UnknownNameError

# The backend of a config that names none (its configs were written before there were others).
DEFAULT_BACKEND = "open-instruct"


def _module_of(name: str) -> str | None:
    """The module that would hold backend `name`, if this package has one of that name."""
    module = name.replace("-", "_")
    found = {m.name for m in pkgutil.iter_modules(__path__)}
    return module if module.isidentifier() and module in found else None


def _loaded(module: str) -> Any:
    """The backend class a module of this package declares (None: a helper module, not a backend); a
    class that leaves a member every backend must declare to the base class is refused (a bug in it)."""
    cls = getattr(importlib.import_module(f"{__name__}.{module}"), "BACKEND", None)
    if cls is not None and (missing := cls.undeclared()):
        raise TypeError(
            f"backend module {module}: {cls.__name__} does not declare {', '.join(missing)}; "
            "every backend says these for itself (docs/backends.md, 'Adding a backend')"
        )
    return cls


def backend_names() -> tuple[str, ...]:
    """Every backend's name, in the order lists show them (imports every backend module)."""
    classes = [c for m in pkgutil.iter_modules(__path__) if (c := _loaded(m.name)) is not None]
    return tuple(c.name for c in sorted(classes, key=lambda c: (c.list_order, c.name)))


@lru_cache(maxsize=None)
def get_backend(name: str) -> Any:
    # Any, not Backend: the registry finds backends by name and imports no backend type, so that the run-config
    # types the backends are handed sit below them with no import going back up (tests/test_architecture.py).
    """The Backend called `name` (one of backend_names())."""
    module = _module_of(str(name))
    cls = _loaded(module) if module else None
    if cls is None or cls.name != name:
        raise UnknownNameError("backend", str(name), backend_names())
    return cls()


def __getattr__(attr: str) -> tuple[str, ...]:
    # BACKENDS, as before the registry found its modules: computed when asked, not at import.
    if attr == "BACKENDS":
        return backend_names()
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


__all__ = ["BACKENDS", "DEFAULT_BACKEND", "backend_names", "get_backend"]
