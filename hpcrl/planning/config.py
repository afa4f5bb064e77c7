"""Run configs: the training framework's own arguments plus an `hpcrl:` section, and `--set` overrides.

A run config is the YAML file users already pass to their framework (grpo_fast.py's YAML for
open-instruct; verl's Hydra keys; OpenRLHF's flags without `--`), with one extra mapping:

    hpcrl:
      cluster: isambard-ai
      nodes: 16
      ...
    model_name_or_path: allenai/Olmo-3-1125-32B
    pack_length: 10240
    ...

Layout fields (the backend's `layout_keys`) come from the layout planner unless the user
sets them: then they are pins, checked and never silently changed. `hpcrl.backend` picks
the framework (hpcrl/planning/backends/); its flag table checks every other key.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from hpcrl.errors import ConfigError, HpcrlError, UnknownNameError, closest
from hpcrl.planning.backends import DEFAULT_BACKEND, get_backend
from hpcrl.planning.backends.base import refuse_run_dir_keys
from hpcrl.planning.run_types import HpcrlSection, RunConfig
from hpcrl.resources import data_dir
from hpcrl.yamlfile import read_mapping

DEFAULT_CONFIG = "grpo-olmo3-32b"

# The types live in hpcrl/planning/run_types.py (below the backends); loading them is this module's.
__all__ = ["HpcrlSection", "RunConfig", "load_run_config"]


def config_path(name_or_path: str | None) -> Path:
    """A config file path, or the name of a shipped config (`grpo-olmo3-32b`)."""
    name = name_or_path or DEFAULT_CONFIG
    path = Path(name).expanduser()
    if path.suffix in (".yaml", ".yml") or path.exists():
        if path.exists() and not path.is_file():
            kind = "a directory" if path.is_dir() else "not a regular file"
            raise ConfigError(f"{path}: {kind}; a run config is a YAML file")
        if not path.is_file():
            shipped = data_dir("configs") / path.name
            hint = (
                f"; the shipped config of that name is --config {path.stem}"
                if shipped.is_file() and path.parent == Path(".")
                else ""
            )
            raise ConfigError(f"{path}: no such config file{hint}")
        return path
    shipped = data_dir("configs") / f"{name}.yaml"
    if shipped.is_file():
        return shipped
    names = sorted(p.stem for p in data_dir("configs").glob("*.yaml"))
    raise ConfigError(f"{name}: no such config file or shipped config; shipped: {', '.join(names)}")


def parse_override(item: str) -> tuple[str, Any]:
    """`key=value` with a YAML value (`beta=0.0`, `num_learners_per_node=[1,1]`)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set beta=0.0 or --set hpcrl.nodes=4")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise ConfigError(
            f"--set {key}: {raw!r} is not a YAML value ({problem}); quote it for a string: --set '{key}=\"...\"'"
        ) from None
    if isinstance(value, str):
        # YAML 1.1 reads `2e-6` as a string; a command line means the number.
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            pass
    return key, value


class _Invalid(ConfigError):
    """A problem of the config as overridden, before it is known whether the file or a --set caused it."""


def load_run_config(name_or_path: str | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load, apply `--set` overrides, and validate a run config.

    An error names what caused it as the user gave it: the config file (its path as given, or the
    shipped config's name, never its place inside the package), or the `--set KEY` that did."""
    path = config_path(name_or_path)
    raw = read_mapping(path, ConfigError, "settings")
    overrides = list(overrides or [])
    parsed = [parse_override(item) for item in overrides]
    given: dict[str, Any] = {}
    for key, value in parsed:  # YAML would keep the last: refused, as a key given twice in a file is
        if key in given:
            raise ConfigError(f"--set {key} given twice ({given[key]!r}, {value!r}); give it once")
        given[key] = value
    try:
        return _validated(path, raw, parsed)
    except _Invalid as exc:
        problem = str(exc)
    # The first prefix of the overrides that gives the same error names its cause.
    culprit = _shown(name_or_path, path)
    for i in range(len(parsed) + 1):
        try:
            _validated(path, raw, parsed[:i])
        except _Invalid as exc:
            if str(exc) == problem:
                if i:
                    key = parsed[i - 1][0]
                    if problem.startswith(f"{key} "):  # "KEY VALUE: valid: ...": one mention of the key
                        raise ConfigError(f"--set {problem}") from None
                    culprit, problem = f"--set {key}", problem.removeprefix(f"{key}: ")
                break
    raise ConfigError(f"{culprit}: {problem}")


def _shown(name_or_path: str | None, path: Path) -> str:
    if name_or_path and Path(name_or_path).expanduser() == path:
        return str(name_or_path)
    return f"config {path.stem} (shipped)"


def _kind(value: Any) -> str:
    """What a YAML value is, in words."""
    return {list: "a list", str: "a string", bool: "true/false", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__
    ) + f" ({str(value)[:40]!r})"


def _validated(path: Path, raw: dict[str, Any], overrides: list[tuple[str, Any]]) -> RunConfig:
    raw = copy.deepcopy(raw)
    section = raw.pop("hpcrl", None)
    if section is None:
        section = {}
    if not isinstance(section, dict):
        raise _Invalid(
            f"hpcrl: {_kind(section)}, expected a mapping of hpcrl settings (one `key: value` per line under hpcrl:)"
        )
    args = raw
    for key, value in overrides:
        if key == "hpcrl":
            raise _Invalid("hpcrl: the hpcrl section is set key by key: --set hpcrl.KEY=VALUE (e.g. hpcrl.nodes=4)")
        if key.startswith("hpcrl."):
            section[key.split(".", 1)[1]] = value
        else:
            args[key] = value
    name = section.get("backend", DEFAULT_BACKEND)
    try:
        backend = get_backend(str(name))
    except UnknownNameError as exc:
        raise _Invalid(f"hpcrl.backend: {exc}") from None
    try:
        hp = HpcrlSection.model_validate(section)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        problem = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            close = closest(loc, HpcrlSection.model_fields)
            problem = "unknown key" + (f"; closest: {', '.join('hpcrl.' + c for c in close)}" if close else "")
        raise _Invalid(f"hpcrl.{loc}: {problem}") from None
    try:
        backend.check_section(hp)
        args = backend.normalize_args(args, hp)
        refuse_run_dir_keys(backend, args, "")
        backend.check_args(args, hp)
        backend.check_features(args)
    except HpcrlError as exc:
        raise _Invalid(str(exc)) from None
    pinned = {k for k in backend.layout_keys if k in args}
    return RunConfig(hpcrl=hp, args=args, source=str(path), pinned=tuple(sorted(pinned)))
