"""Imports every command module so each registers its commands on the app."""

from __future__ import annotations

import importlib

# One module per command group; a module that is not written yet is simply absent.
_MODULES = ["clusters", "plan", "memory", "disk", "render", "runs", "safety", "report"]

for _name in _MODULES:
    try:
        importlib.import_module(f"hpcrl.cli.cmd_{_name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"hpcrl.cli.cmd_{_name}":
            raise
