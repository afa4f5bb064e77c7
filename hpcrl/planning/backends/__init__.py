"""Training-framework backends, and the registry that finds one by name.

`get_backend(name)` returns the backend (a `Backend`, hpcrl/planning/backends/base.py) of a run config's
`hpcrl.backend`; docs/backends.md describes the interface and each implementation. The registry
names each implementation's module rather than importing it: the run-config types
(hpcrl/planning/run_types.py) ask it for a backend's own section defaults, and the backends are handed
those types, so the types sit below the backends with no import going back up; and a command
imports only the backend its config names.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

from hpcrl.errors import UnknownNameError

BACKENDS = ("open-instruct", "verl", "openrlhf", "custom")
# name -> (module in this package, class)
_IMPLEMENTATIONS = {
    "open-instruct": ("open_instruct", "OpenInstructBackend"),
    "verl": ("verl", "VerlBackend"),
    "openrlhf": ("openrlhf", "OpenRLHFBackend"),
    "custom": ("custom", "CustomBackend"),
}


@lru_cache(maxsize=None)
def get_backend(name: str):
    """The Backend called `name` (one of BACKENDS)."""
    if name not in _IMPLEMENTATIONS:
        raise UnknownNameError("backend", str(name), BACKENDS)
    module, cls = _IMPLEMENTATIONS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)()


__all__ = ["BACKENDS", "get_backend"]
