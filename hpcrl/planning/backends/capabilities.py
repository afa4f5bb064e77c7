"""What each framework really does, read from its source at the commit hpcrl pins.

Pure. The facts live in `data/capabilities.json` (each with the file and line it was read
at); this module only looks them up. A plan or a script that relies on something the
framework does not implement is refused here, naming the frameworks that do implement it,
and the planner takes the framework's own DeepSpeed/FSDP and vLLM settings from here
instead of assuming them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from hpcrl.errors import ConfigError

_DATA = Path(__file__).with_name("data") / "capabilities.json"
# What a feature is called in an error message.
FEATURE_WORDS = {
    "lora": "LoRA",
    "load_in_4bit": "4-bit (QLoRA) base weights",
    "ref_policy": "a reference policy",
    "critic": "a critic (value model)",
    "sequence_parallel": "sequence parallelism",
    "offload_optimizer": "optimizer offload",
    "offload_params": "parameter offload of the trained model",
    "save_on_signal": "a checkpoint on SIGUSR1/SIGTERM",
    "resume": "resuming from its checkpoint directory",
    "gradient_checkpointing": "gradient checkpointing",
}


@dataclass(frozen=True)
class Fact:
    """One fact about one framework: a feature, or a setting it passes to DeepSpeed/FSDP/vLLM."""

    backend: str
    name: str
    commit: str
    source: str  # path:line in the framework's repository at `commit`
    supported: bool | None = None  # features only
    keys: tuple[str, ...] = ()  # the framework's keys (flags, Hydra paths) for it
    value: Any = None  # the framework's default, or the value it passes
    key: str | None = None  # settings: the key that changes the value, if any
    note: str = ""
    where: str = ""  # a release read from its wheel: `in verl 0.9.1's wheel` (else `at <commit>`)
    raw: tuple[tuple[str, Any], ...] = ()  # the fact's other fields as the table holds them

    def cite(self) -> str:
        """`path:line at <commit>` (or `in <release>'s wheel`): where a reader can check the fact."""
        return f"{self.source} {self.where or 'at ' + self.commit[:8]}"


@lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    table: dict[str, Any] = json.loads(_DATA.read_text())
    return table


# The frameworks the table describes, in its order (a new backend with code to read adds its entry).
BACKENDS = tuple(name for name in _table() if not name.startswith("_"))


def commit(backend: str) -> str:
    return str(_table()[backend]["commit"])


def _read_at(backend: str, section: str, name: str, version: str | None) -> tuple[str, str, dict[str, Any]]:
    """(commit, where, entry) of one fact: as read at `version` (hpcrl.framework_version) where that version's
    table holds it, else as read at the table's own commit. None: the table's commit. `where` names a release
    read from its wheel (no commit), else is empty."""
    if version is not None:
        from hpcrl.planning.backends import versions

        at = versions.capabilities(backend, version)
        if name in at.get(section, {}):
            v = versions.resolve(backend, version)
            sha = str(at.get("commit") or v.commit)
            return sha, "" if sha else v.at(), at[section][name]
    return commit(backend), "", _table()[backend][section][name]


def feature(backend: str, name: str, version: str | None = None) -> Fact:
    """A feature of `backend` (lora, load_in_4bit, ref_policy, save_on_signal, ...)."""
    at, where, raw = _read_at(backend, "features", name, version)
    return Fact(
        backend,
        name,
        at,
        raw["source"],
        supported=raw.get("supported"),
        keys=tuple(raw.get("keys") or ()),
        value=raw.get("default"),
        note=raw.get("note", ""),
        where=where,
        raw=tuple(raw.items()),
    )


def setting(backend: str, section: str, name: str, version: str | None = None) -> Fact:
    """A setting the backend passes on: section is deepspeed, fsdp or vllm."""
    at, where, raw = _read_at(backend, section, name, version)
    return Fact(
        backend,
        name,
        at,
        raw["source"],
        value=raw.get("value", raw.get("default")),
        key=raw.get("key"),
        note=raw.get("note", ""),
        where=where,
        raw=tuple(raw.items()),
    )


def services(backend: str) -> list[dict[str, Any]]:
    """External services the backend's default path may call (name, key, default URL, start command)."""
    return list(_table()[backend].get("services", []))


def checkpoint_kinds(backend: str) -> dict[str, dict[str, Any]]:
    return dict(_table()[backend].get("checkpoints", {}))


def supporters(name: str) -> list[str]:
    """The backends that implement feature `name`."""
    return [b for b in BACKENDS if _table()[b]["features"].get(name, {}).get("supported")]


def unsupported(backend: str, name: str, trigger: str) -> ConfigError:
    """The one-line error for asking `backend` for a feature its code does not implement."""
    fact = feature(backend, name)
    others = [
        f"{b} ({feature(b, name).keys[0]})" if feature(b, name).keys else b for b in supporters(name) if b != backend
    ]
    where = f"; backends that do: {', '.join(others)}" if others else "; no backend hpcrl drives does"
    return ConfigError(
        f"{trigger}: {backend} does not implement {FEATURE_WORDS.get(name, name)} ({fact.cite()}){where}"
    )


def refuse_unsupported(backend: str, triggers: dict[str, tuple[str, ...]], args: dict[str, Any]) -> None:
    """Raise for the first config key that turns on a feature the backend's code lacks."""
    for name, keys in triggers.items():
        if feature(backend, name).supported:
            continue
        for key in keys:
            value = args.get(key)
            if value not in (None, False, 0, "", "none", "None", [], {}):
                raise unsupported(backend, name, f"{key}={json.dumps(value) if isinstance(value, bool) else value}")


__all__ = [
    "BACKENDS",
    "Fact",
    "checkpoint_kinds",
    "commit",
    "feature",
    "refuse_unsupported",
    "services",
    "setting",
    "supporters",
    "unsupported",
]
