"""The run config and the run plan as plain types: what the planner makes and the backends are handed.

They sit below both. The backends (hpcrl/planning/backends/) read them; config.py loads a RunConfig and
run_plan.py makes a RunPlan. What depends on the framework (a section's defaults, the model key,
a plan's backend) they ask the backend registry by name (hpcrl/planning/backends/__init__.py), so nothing
here imports a backend, and no backend imports the loader or the planner.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from hpcrl.contract import ZERO_REWARD_STEPS
from hpcrl.planning.backends import DEFAULT_BACKEND, get_backend
from hpcrl.planning.backends.oi_args import ArgLayout
from hpcrl.shell import path_problem

if TYPE_CHECKING:
    from hpcrl.planning.cadence import Cadence
    from hpcrl.planning.layout import Layout, Pins, Workload
    from hpcrl.profiles import ClusterProfile

# hpcrl-section fields added after configs were first hashed, with their unset values.
# hpcrl.run_name's longest, in bytes: it names the run dir and the dry run's `<name>-<6 hex>.sbatch`, which must
# stay inside a file name's 255 bytes (NAME_MAX); the Slurm job name is cut to 64 characters anyway.
RUN_NAME_MAX = 240
NEWER_FIELDS: dict[str, Any] = {
    "gpus": None,
    "loss_keys": [],
    "framework_version": None,
    "stack_check": "on",
    "quota_gib": None,
    "deepspeed_offload": "none",
}


_NUMBERS = (int, float, int | None, float | None)


class HpcrlSection(BaseModel):
    """The `hpcrl:` section: where and how to run."""

    model_config = ConfigDict(extra="forbid")

    cluster: str = "isambard-ai"
    nodes: int | None = Field(default=None, gt=0)
    gpus: int | None = Field(default=None, gt=0, description="GPUs of one node, for a job smaller than a node")
    model: str | None = Field(default=None, description="Planner model; default from model_name_or_path")
    backend: str = Field(default=DEFAULT_BACKEND, description="The training framework (hpcrl/planning/backends/)")
    arg_layout: ArgLayout = Field(
        default="current", description="The default backend's argument layout (current|legacy)"
    )
    framework_version: str | None = Field(
        default=None,
        description="The framework version the run targets (name, release or commit); default the newest "
        "hpcrl knows (backends/data/versions.json), printed as an assumption",
    )
    # The job's stack check (hpcrl.runtime.stack) before Ray starts; off for an environment the version's
    # install facts do not describe (a fork without package metadata, a test stand-in).
    stack_check: Literal["on", "off"] = "on"
    # These four default to the backend's own (see _backend_defaults).
    entry_point: str = Field(default="", description="Script path or Python module, as the backend runs it")
    workdir: str = Field(default="", description="Directory the driver starts in")
    python: str = ""
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
    max_lost_minutes: float = Field(
        default=30.0, gt=0, description="Training a job may lose: sets the checkpoint cadence"
    )
    logprob_impl: Literal["eager", "compiled", "fused_head"] = (
        "compiled"  # the backend's default (see _backend_defaults)
    )
    # Offload in the DeepSpeed config hpcrl writes itself (a backend whose framework takes its DeepSpeed
    # config from a file: Backend.writes_deepspeed_config); the others have a key of their own.
    deepspeed_offload: Literal["none", "optimizer", "params"] = "none"
    zero_reward_steps: int = Field(default=ZERO_REWARD_STEPS, gt=0)
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
    quota_gib: float | None = Field(default=None, gt=0, description="The run root's quota; default the profile's")
    force_disk: bool = False
    # Services the framework's verifiers call on localhost (a code-execution API, capabilities.json "services"):
    # auto starts them when the config needs them, on starts them always, off never.
    code_server: Literal["auto", "on", "off"] = "auto"
    code_server_command: list[str] | None = Field(
        default=None, description="Words of the command; {port} is the port. Default: the backend's (capabilities.json)"
    )
    code_server_timeout_s: int = Field(default=180, gt=0)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # Pydantic reads true as 1: `nodes: true` planned one node and blamed memory.
        if isinstance(value, bool) and cls.model_fields[str(info.field_name)].annotation in _NUMBERS:
            raise ValueError(f"{str(value).lower()} is not a number")
        return value

    @model_validator(mode="before")
    @classmethod
    def _backend_defaults(cls, data: Any) -> Any:
        # The backend's own entry point, checkout, python and log-prob path unless given (the
        # values the default backend's configs had as field defaults, so they hash as before).
        if isinstance(data, dict):
            data = {**get_backend(str(data.get("backend", DEFAULT_BACKEND))).section_defaults(), **data}
        return data

    @field_validator("run_root", "workdir", "container")
    @classmethod
    def _paths(cls, value: Any) -> Any:
        if value is not None and (problem := path_problem(value)):
            raise ValueError(f"{value!r}: {problem}")
        return value

    @field_validator("run_name")
    @classmethod
    def _run_name(cls, value: str) -> str:
        # It names the run directory, the run id (<name>-<6 hex>) and the Slurm job: a file name with room.
        if not value or value in (".", "..") or "/" in value or "\0" in value:
            raise ValueError(f"{value!r}: must be a directory name (no '/', not '.' or '..')")
        if len(value.encode()) > RUN_NAME_MAX:
            raise ValueError(
                f"{len(value.encode())} bytes ({value[:20]}...); valid: a directory name of 1 to {RUN_NAME_MAX} bytes"
            )
        return value

    @field_validator("code_server", "stack_check", mode="before")
    @classmethod
    def _on_off(cls, value: Any) -> Any:
        # YAML 1.1 reads unquoted on/off as booleans.
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("framework_version", mode="before")
    @classmethod
    def _version_text(cls, value: Any) -> Any:
        # YAML reads an unquoted 0.9 or 1e5 as a number: the version is text.
        return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value

    @field_validator("time", mode="before")
    @classmethod
    def _sexagesimal(cls, value: Any) -> Any:
        # YAML 1.1 reads an unquoted 24:00:00 as the base-60 integer 86400: turn it back.
        if isinstance(value, int) and not isinstance(value, bool):
            h, rest = divmod(value, 3600)
            return f"{h}:{rest // 60:02d}:{rest % 60:02d}"
        return value  # its format (what sbatch refuses: 12:61:00) is checked as every plan starts (walltime.seconds)


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


@dataclass(frozen=True)
class RunPlan:
    config: RunConfig
    profile: ClusterProfile
    nodes: int
    workload: Workload
    pins: Pins
    layouts: list[Layout]
    warnings: tuple[str, ...] = ()
    # Values the backend planned beyond the layout (framework key -> value).
    choices: tuple[tuple[str, Any], ...] = ()
    cadence: Cadence | None = None  # checkpoint interval and time-limit warning (hpcrl/planning/cadence.py)
    # Why a continuation could not resume ("" when it can): the chain then stops at a time limit (planning/resume.py).
    no_resume: str = ""
    # The user's per-cluster exclude list (hpcrl/jobs/node_excludes.py), added by render/submit, not by planning.
    user_exclude: tuple[str, ...] = ()
    user_exclude_file: str | None = None
    # What the plan assumed that the config did not say (e.g. the framework version), printed as such.
    assumptions: tuple[str, ...] = ()
    # The framework version the run targets, as resolved once with the request's inputs ("verl 0.9.1").
    framework: str | None = None

    @property
    def layout(self) -> Layout:
        return self.layouts[0]

    @property
    def backend(self) -> Any:
        """The Backend of the config's `hpcrl.backend` (from the registry, by name)."""
        return get_backend(self.config.hpcrl.backend)
