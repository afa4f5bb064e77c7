"""Training-framework backends: what the driver command looks like and which flags exist.

`get_backend(name)` returns the backend of a run config's `hpcrl.backend`; docs/backends.md
describes the interface (hpcrl/backends/base.py) and each implementation.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from hpcrl.errors import UnknownNameError

if TYPE_CHECKING:
    from hpcrl.backends.base import Backend

BACKENDS = ("open-instruct", "verl", "openrlhf", "custom")


@lru_cache(maxsize=None)
def get_backend(name: str) -> Backend:
    """The backend called `name` (one of BACKENDS)."""
    if name == "open-instruct":
        from hpcrl.backends.open_instruct import OpenInstructBackend

        return OpenInstructBackend()
    if name == "verl":
        from hpcrl.backends.verl import VerlBackend

        return VerlBackend()
    if name == "openrlhf":
        from hpcrl.backends.openrlhf import OpenRLHFBackend

        return OpenRLHFBackend()
    if name == "custom":
        from hpcrl.backends.custom import CustomBackend

        return CustomBackend()
    raise UnknownNameError("backend", str(name), BACKENDS)


__all__ = ["BACKENDS", "get_backend"]
