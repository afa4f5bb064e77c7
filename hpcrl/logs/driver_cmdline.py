"""The driver command line in a log or a rendered job script, read into the backend's own keys (pure).

A log usually shows how its driver was started: hpcrl's script prints `hpcrl: driver: ...`, a
hand-written one under `set -x` prints `+ python3 -m ...`, open-instruct logs its arguments.
This module finds that line and reads its words as the framework's parser would. Each backend's
CommandFacts (hpcrl/planning/backends/log_facts.py) say how its entry point shows in a log and
which style its words take:

* "flags": `--name value ...` (lists as several words, as HfArgumentParser reads them), switches bare;
* "hydra": overrides `key=value` (`+key=value` adds a key).

A backend whose flags were renamed reads older names under their new ones (Backend.read_renamed).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import yaml

from hpcrl.logs.driver_log import ANSI
from hpcrl.planning.backends import BACKENDS, get_backend

_DRIVER_BLOCK = re.compile(r"^ *DRIVER=\(\n(.*?)^ *\)$", re.S | re.M)  # indented inside phase_driver


@dataclass(frozen=True)
class DriverCommand:
    """A driver's arguments in its backend's spelling, and where they were found."""

    backend: str
    args: dict[str, Any]
    where: str  # "line 12 of the log", "job.sbatch"
    renamed: tuple[str, ...] = field(default_factory=tuple)  # "lora_rank -> ds.lora.rank"


def _value(text: str) -> Any:
    """A word as YAML reads it (numbers, true/false, lists), else the text itself."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str) and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if isinstance(value, str):  # YAML 1.1 reads 1e-06 as text; a command line means the number
        try:
            return float(value)
        except ValueError:
            return value
    return text if value is None and text not in ("null", "~", "None") else value


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote in a wrapped log line
        return text.split()


def _is_flag(word: str) -> bool:
    return word.startswith("--") and len(word) > 2 and not re.fullmatch(r"--?\d[\d.e+-]*", word)


def _flags(words: list[str]) -> dict[str, Any]:
    """`--name v`, `--name v1 v2`, `--name=v`, bare switches (True)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if not _is_flag(word):
            i += 1
            continue
        name, eq, inline = word[2:].partition("=")
        values = [inline] if eq else []
        i += 1
        while not eq and i < len(words) and not _is_flag(words[i]):
            values.append(words[i])
            i += 1
        parsed = [_value(v) for v in values]
        out[name] = True if not parsed else parsed[0] if len(parsed) == 1 else parsed
    return out


def _overrides(words: list[str]) -> dict[str, Any]:
    out = {}
    for word in words:
        key, eq, raw = word.partition("=")
        if eq and re.fullmatch(r"\+{0,2}~?[A-Za-z_][\w.@/-]*", key):
            out[key.lstrip("+~")] = _value(raw)
    return out


def read_words(backend: str, words: list[str], where: str) -> DriverCommand | None:
    """The arguments after a driver's entry point."""
    b = get_backend(backend)
    args, notes = b.read_renamed(_overrides(words) if b.command_facts.style == "hydra" else _flags(words))
    return DriverCommand(backend, args, where, notes) if args else None


@lru_cache(maxsize=1)
def _entry_points() -> tuple[tuple[str, re.Pattern[str]], ...]:
    """Each backend's entry point as a log shows it (a backend without one is never recognised)."""
    return tuple((name, re.compile(e)) for name in BACKENDS if (e := get_backend(name).command_facts.entry))


def find_command(text: str) -> DriverCommand | None:
    """The last driver command line in a log that names an entry point and gives arguments."""
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        line = ANSI.sub("", lines[i])
        for backend, entry in _entry_points():
            if (m := entry.search(line)) and (cmd := read_words(backend, _words(line[m.end() :]), f"line {i + 1}")):
                return cmd
    return None


def from_script(text: str, backend: str) -> DriverCommand | None:
    """The driver's arguments in a script hpcrl rendered (its DRIVER=( ... ) array); None for a
    backend whose command hpcrl cannot read (a user's own script)."""
    block = _DRIVER_BLOCK.search(text)
    if not block or get_backend(backend).command_facts.entry is None:
        return None
    words = _words(block.group(1))
    start = next((i + 1 for i, w in enumerate(words) if w == "$ENTRY_POINT"), None)
    return read_words(backend, words[start:], "job.sbatch") if start is not None else None


__all__ = ["DriverCommand", "find_command", "from_script", "read_words"]
