"""Errors a user can cause. The CLI prints their one-line message and exits 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class HpcrlError(Exception):
    """Base of every user-caused error: one line naming the bad value and what is valid."""

    exit_code = 2


class UnknownNameError(HpcrlError):
    """A name (cluster, model, run id, ...) that is not known."""

    def __init__(self, kind: str, name: str, valid: Iterable[str], detail: str = ""):
        valid = sorted(set(valid))
        close = difflib.get_close_matches(name, valid, n=3, cutoff=0.5)
        hint = f"closest: {', '.join(close)}" if close else f"valid: {', '.join(valid[:12])}"
        super().__init__(f"unknown {kind} {name!r}{f' ({detail})' if detail else ''}; {hint}")
        self.name = name
        self.valid = valid


class ProfileError(HpcrlError):
    """A cluster profile file that does not validate (`file: field: problem`)."""


class ConfigError(HpcrlError):
    """A run config or override that does not validate."""


class ModelSpecError(HpcrlError):
    """A model config.json that lacks a needed field or has an impossible value."""


class PlanError(HpcrlError):
    """A layout or memory plan that cannot work, with what would make it work."""


class SlurmError(HpcrlError):
    """Slurm refused or is missing; the message is Slurm's own where it has one."""


class RegistryError(HpcrlError):
    """An unknown run or a registry problem."""


def positive(name: str, value: float) -> float:
    """Return value if it is > 0, else raise an HpcrlError naming it."""
    if value is None or value <= 0:
        raise HpcrlError(f"{name} must be a positive number, got {value!r}")
    return value
