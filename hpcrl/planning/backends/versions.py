"""The framework versions hpcrl has tables for, and which of them know a key.

Pure. `data/versions.json` lists, per backend and oldest first, each version's name (the release
users install, e.g. verl 0.9.1, else the version string its source declares at a commit), the
commit it was built from where one is known, its date, what its tables were read from and its
data files; the one marked default (else the newest) is what a run config gets when it names none
(hpcrl.framework_version), and the caller prints it as an assumption. A version is named by its
name, its release, its full commit or a commit prefix of at least 7 characters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from hpcrl.errors import ConfigError

_DATA = Path(__file__).with_name("data")
MIN_PREFIX = 7


@dataclass(frozen=True)
class Version:
    """One framework version hpcrl has read."""

    backend: str
    name: str
    commit: str  # "" for a release read from its wheel, with no commit known
    date: str
    release: str | None
    args_file: str  # under data/
    capabilities_file: str | None
    note: str = ""
    source: str = ""  # what the tables were read from, where not the commit (a wheel)
    stack_file: str | None = None  # its install facts, where not in stack.json (keyed by commit)
    is_default: bool = False

    @property
    def key(self) -> str:
        """What per-version data is keyed by: the commit, else the name."""
        return self.commit or self.name

    def label(self) -> str:
        """`name (short commit)`, as errors and assumptions print it (a release without a commit: its name)."""
        if not self.commit or self.name.startswith(self.commit[:8]):
            return self.name
        return f"{self.name} ({self.commit[:8]})"

    def at(self) -> str:
        """Where its facts were read, as citations name it: `at 1dda039b`, or `in verl 0.9.1's wheel`."""
        return f"at {self.commit[:8]}" if self.commit else f"in {self.backend} {self.name}'s wheel"


class UnknownVersionError(ConfigError):
    """A framework version hpcrl has no table for."""


class KeyNotInVersionError(ConfigError):
    """A key the named version lacks but another known version has."""


@lru_cache(maxsize=1)
def _index() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((_DATA / "versions.json").read_text())
    return data


def known(backend: str) -> list[Version]:
    """The versions of `backend` hpcrl has tables for, oldest first ([] for a backend with none)."""
    return [
        Version(
            backend,
            v["name"],
            v.get("commit") or "",
            v["date"],
            v.get("release"),
            v["files"]["args"],
            v["files"].get("capabilities"),
            v.get("note", ""),
            v.get("source", ""),
            v["files"].get("stack"),
            bool(v.get("default")),
        )
        for v in _index().get(backend, [])
    ]


def default(backend: str) -> Version:
    """The version marked default, else the newest: what a run config that names none targets (said as an
    assumption)."""
    versions = known(backend)
    return next((v for v in versions if v.is_default), versions[-1])


def resolve(backend: str, name: str | None) -> Version:
    """The version `name` names (name, release, commit or commit prefix); the default when None."""
    versions = known(backend)
    if name is None or name == "":
        return default(backend)
    text = str(name).strip().lower()
    for v in versions:
        if text in (v.name.lower(), (v.release or "").lower()) or (
            len(text) >= MIN_PREFIX and v.commit and v.commit.startswith(text)
        ):
            return v
    raise UnknownVersionError(
        f"hpcrl.framework_version: no {backend} table for {name!r}; "
        f"known: {', '.join(v.label() for v in versions)} (default: {default(backend).label()})"
    )


@lru_cache(maxsize=None)
def _load(filename: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((_DATA / filename).read_text())
    return data


def table(backend: str, name: str | None = None) -> dict[str, dict[str, Any]]:
    """Key or flag -> its facts (default, type, ...) at that version, without `_meta`."""
    return {k: v for k, v in _load(resolve(backend, name).args_file).items() if not k.startswith("_")}


def meta(backend: str, name: str | None = None) -> dict[str, Any]:
    """The version's key table `_meta` (repo, commit, entry point, ...)."""
    meta: dict[str, Any] = _load(resolve(backend, name).args_file)["_meta"]
    return meta


def capabilities(backend: str, name: str | None = None) -> dict[str, Any]:
    """The capability facts read at that version ({} where none were read)."""
    v = resolve(backend, name)
    return _load(v.capabilities_file).get(backend, {}) if v.capabilities_file else {}


def targeted(backend: str, name: str | None) -> tuple[Version, str | None]:
    """The version a run targets and, when the config names none, the assumption to print."""
    v = resolve(backend, name)
    if name:
        return v, None
    return v, (
        f"assumes {backend} {v.label()}, hpcrl's default; set hpcrl.framework_version to target another "
        f"(known: {', '.join(o.label() for o in known(backend))})"
    )


def versions_with_key(backend: str, key: str) -> list[Version]:
    """The known versions whose table has `key`, oldest first."""
    return [v for v in known(backend) if key in table(backend, v.key)]


def check_key(
    backend: str, name: str | None, key: str, how: str = "set hpcrl.framework_version to one of them"
) -> bool:
    """True when the version has `key`; False when no known version does (the caller's own
    unknown-key error applies); raises when only other versions have it (`how`: what the user sets)."""
    if key in table(backend, name):
        return True
    others = versions_with_key(backend, key)
    if not others:
        return False
    v = resolve(backend, name)
    raise KeyNotInVersionError(
        f"{key}: {backend} {v.label()} has no such key; it exists in {', '.join(o.label() for o in others)} ({how})"
    )


__all__ = [
    "KeyNotInVersionError",
    "UnknownVersionError",
    "Version",
    "capabilities",
    "check_key",
    "default",
    "known",
    "meta",
    "resolve",
    "table",
    "targeted",
    "versions_with_key",
]
