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
the framework (hpcrl/backends/); its flag table checks every other key.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hpcrl.backends import BACKENDS, get_backend
from hpcrl.backends.base import refuse_run_dir_keys
from hpcrl.backends.oi_args import ArgLayout
from hpcrl.backends.open_instruct import LAYOUT_FIELDS, RUN_DIR_FIELDS
from hpcrl.errors import ConfigError, HpcrlError, UnknownNameError, closest
from hpcrl.resources import data_dir
from hpcrl.shell import path_problem
from hpcrl.yamlfile import read_mapping

DEFAULT_CONFIG = "grpo-olmo3-32b"
# hpcrl-section fields added after configs were first hashed, with their unset values.
NEWER_FIELDS = {"gpus": None, "loss_keys": []}

# open-instruct's layout and run-directory fields, re-exported (other backends: layout_keys, run_dir_keys).
__all__ = ["LAYOUT_FIELDS", "RUN_DIR_FIELDS", "HpcrlSection", "RunConfig", "load_run_config"]


class HpcrlSection(BaseModel):
    """The `hpcrl:` section: where and how to run."""

    model_config = ConfigDict(extra="forbid")

    cluster: str = "isambard-ai"
    nodes: int | None = Field(default=None, gt=0)
    gpus: int | None = Field(default=None, gt=0, description="GPUs of one node, for a job smaller than a node")
    model: str | None = Field(default=None, description="Planner model; default from model_name_or_path")
    backend: Literal["open-instruct", "verl", "openrlhf", "custom"] = "open-instruct"
    arg_layout: ArgLayout = Field(default="current", description="open-instruct's argument layout (current|legacy)")
    # Defaults follow the backend (see _backend_defaults): open-instruct's are given here.
    entry_point: str = Field(default="open_instruct/grpo_fast.py",
                             description="Script path (open-instruct) or Python module (verl, openrlhf)")
    workdir: str = Field(default="$HOME/open-instruct", description="Directory the driver starts in")
    python: str = "python"
    env_setup: list[str] = Field(default_factory=list, description="Shell lines run on every node first")
    container: str | None = Field(default=None, description="Image to run in (profile's runtime)")
    run_name: str = "grpo"
    run_root: str | None = Field(default=None, description="Parent of run dirs; default the profile's")
    time: str | None = Field(default=None, description="Wall time; default the partition limit")
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    exclude_nodes: list[str] = Field(default_factory=list)
    max_restarts: int = Field(default=10, ge=0)
    max_failure_restarts: int = Field(default=3, ge=0, description="Continuations after failures not the run's fault")
    failure_backoff_s: int = Field(default=60, ge=0, description="Wait before a failure continuation (x its number)")
    max_lost_minutes: float = Field(default=30.0, gt=0, description="Training a job may lose: sets the checkpoint cadence")
    logprob_impl: Literal["eager", "compiled"] = "compiled"
    zero_reward_steps: int = Field(default=10, gt=0)
    hang_minutes: float = Field(default=60.0, gt=0)
    # The watchdog's other breakers (docs/safety.md): 0 turns one off.
    grad_norm_steps: int = Field(default=20, ge=0, description="Steps of a ~0 gradient norm that stop the run (96)")
    zero_variance_steps: int = Field(default=20, ge=0, description="Steps of zero reward variance that stop it (97)")
    reward_keys: list[str] = Field(default_factory=list, description="The reward's metric keys, when not a known one")
    loss_keys: list[str] = Field(default_factory=list, description="Loss metric keys the NaN breaker also watches")
    # OpenRLHF's HF saves under LoRA: the adapter only (the pinned commit), or the full model (OpenRLHF
    # before 2d0b9854, and the 203 GB saves of the users' notes). Only the disk plan reads it.
    lora_hf_save: Literal["adapter", "full"] = "adapter"
    allow_over_limit: bool = False
    force_disk: bool = False
    # Services the framework's verifiers call on localhost (open-instruct's code-execution API):
    # auto starts them when the config needs them, on starts them always, off never.
    code_server: Literal["auto", "on", "off"] = "auto"
    code_server_command: list[str] | None = Field(
        default=None, description="Words of the command; {port} is the port. Default: uvicorn open_instruct.code_utils.api:app")
    code_server_timeout_s: int = Field(default=180, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _backend_defaults(cls, data):
        # The backend's own entry point and checkout unless given; open-instruct's are the
        # field defaults, so its configs validate (and hash) exactly as before.
        if isinstance(data, dict) and data.get("backend", "open-instruct") != "open-instruct":
            backend = get_backend(str(data["backend"]))
            data = {"entry_point": backend.default_entry_point, "workdir": backend.default_workdir,
                    "python": backend.default_python, "logprob_impl": backend.default_logprob_impl, **data}
        return data

    @field_validator("run_root", "workdir", "container")
    @classmethod
    def _paths(cls, value):
        if value is not None and (problem := path_problem(value)):
            raise ValueError(f"{value!r}: {problem}")
        return value

    @field_validator("code_server", mode="before")
    @classmethod
    def _on_off(cls, value):
        # YAML 1.1 reads unquoted on/off as booleans.
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("time", mode="before")
    @classmethod
    def _sexagesimal(cls, value):
        # YAML 1.1 reads an unquoted 24:00:00 as the base-60 integer 86400: turn it back.
        if isinstance(value, int) and not isinstance(value, bool):
            h, rest = divmod(value, 3600)
            return f"{h}:{rest // 60:02d}:{rest % 60:02d}"
        return value


class RunConfig(BaseModel):
    """A validated run config: the hpcrl section and the framework's arguments."""

    model_config = ConfigDict(extra="forbid")

    hpcrl: HpcrlSection
    args: dict[str, Any]
    source: str = ""
    pinned: tuple[str, ...] = ()

    @property
    def model_name(self) -> str:
        return self.hpcrl.model or get_backend(self.hpcrl.backend).model_name(self.args)

    def digest(self) -> str:
        """Short hash of the effective config (same inputs, same hash)."""
        section = self.hpcrl.model_dump()
        for key, unset in NEWER_FIELDS.items():  # unset, they leave the digest of older configs as it was
            if section.get(key) == unset:
                section.pop(key)
        blob = json.dumps({"hpcrl": section, "args": self.args}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def config_path(name_or_path: str | None) -> Path:
    """A config file path, or the name of a shipped config (`grpo-olmo3-32b`)."""
    name = name_or_path or DEFAULT_CONFIG
    path = Path(name).expanduser()
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"{path}: no such config file")
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
    except yaml.YAMLError:
        value = raw
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
                    culprit, problem = f"--set {key}", problem.removeprefix(f"{key}: ")
                break
    raise ConfigError(f"{culprit}: {problem}")


def _shown(name_or_path: str | None, path: Path) -> str:
    if name_or_path and Path(name_or_path).expanduser() == path:
        return str(name_or_path)
    return f"config {path.stem} (shipped)"


def _validated(path: Path, raw: dict, overrides: list[tuple[str, Any]]) -> RunConfig:
    raw = copy.deepcopy(raw)
    section = raw.pop("hpcrl", None) or {}
    args = raw
    for key, value in overrides:
        if key.startswith("hpcrl."):
            section[key.split(".", 1)[1]] = value
        else:
            args[key] = value
    name = section.get("backend", "open-instruct")
    if name not in BACKENDS:
        raise _Invalid(f"hpcrl.backend: {UnknownNameError('backend', str(name), BACKENDS)}")
    backend = get_backend(name)
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
