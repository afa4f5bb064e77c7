"""The format a run's log is read in: its backend's (LogFormat, hpcrl/planning/backends/log_facts.py), or the union
of every backend's and the formats no backend owns (hpcrl/logs/driver_log.py GENERIC) where the log's framework is
not known: a backend without a format of its own (custom: a user's script), a plan.json that names no backend (every
open-instruct run's, and every run's before there were other backends), a name this hpcrl does not have (pure).

The in-job watchdog cannot import a backend: it reads the backends' union from hpcrl/runtime/known_log_formats.json,
which `write_known_formats` generates from the registry (tests/test_log_format.py fails when the two differ).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from hpcrl.errors import HpcrlError
from hpcrl.logs.driver_log import GENERIC, StepFormat
from hpcrl.planning.backends import backend_names, get_backend
from hpcrl.planning.backends.log_facts import LogFormat

# The watchdog's copy of backends_union() (hpcrl/runtime/watchdog.py reads it; the path is the runtime's).
KNOWN_FORMATS = Path(__file__).resolve().parents[1] / "runtime" / "known_log_formats.json"


def step_format(fmt: LogFormat) -> StepFormat:
    """A backend's LogFormat as the reader's StepFormat."""
    return StepFormat(**dataclasses.asdict(fmt))


def backend_format(name: str | None) -> StepFormat | None:
    """The format of backend `name`'s logs; None when it has none of its own, or no such backend is known."""
    if not name:
        return None
    try:
        fmt = get_backend(name).log_format
    except HpcrlError:  # a plan.json naming a backend this hpcrl does not have
        return None
    return step_format(fmt) if fmt is not None else None


def backends_union() -> StepFormat:
    """Every backend's format, in the registry's order (its first backend's keys preferred)."""
    return StepFormat.union(*(f for name in backend_names() if (f := backend_format(name)) is not None))


def union_format() -> StepFormat:
    """The format of a log whose framework is not known: every backend's, then the ones no backend owns."""
    return StepFormat.union(backends_union(), GENERIC)


def run_format(backend: str | None) -> StepFormat:
    """The format of a run of `backend` (None: not known): the backend's own, else the union."""
    return backend_format(backend) or union_format()


def plan_format(plan: dict | None) -> StepFormat:
    """The format of the run a plan.json describes: the backend it names, else the union."""
    name = (plan or {}).get("backend")
    return run_format(str(name) if name else None)


def known_formats_text() -> str:
    """known_log_formats.json as write_known_formats writes it."""
    return json.dumps(backends_union().to_json(), indent=1) + "\n"


def write_known_formats(path: Path = KNOWN_FORMATS) -> None:
    """Regenerate the watchdog's copy of the backends' union (after a backend's LogFormat changed)."""
    path.write_text(known_formats_text())


__all__ = [
    "KNOWN_FORMATS",
    "backend_format",
    "backends_union",
    "known_formats_text",
    "plan_format",
    "run_format",
    "step_format",
    "union_format",
    "write_known_formats",
]
