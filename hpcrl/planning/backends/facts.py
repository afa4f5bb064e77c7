"""The planning facts a backend supplies as records: its checkpoints on disk and its memory model.

Pure. Each backend module sets `disk` and `memory` on its class (hpcrl/planning/backends/base.py
lists them under "planning facts"); the planners in hpcrl/planning read only these records, so
no planner names a framework. docs/backends.md "What a backend provides" lists every field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from hpcrl.memory.sharding import ZERO, Sharding
from hpcrl.memory.vllm_accounting import VllmEngineFacts, default_engine

if TYPE_CHECKING:
    from hpcrl.planning.disk_budget import Budget, DiskInputs, Fix
    from hpcrl.planning.run_types import RunPlan

# The neutral disk settings (DiskInputs fields) a backend names in its own keys.
DISK_SETTINGS = ("ckpt_every", "keep", "hf_every", "save_hf", "disable_ds", "zero_stage", "lora_rank")


@dataclass(frozen=True)
class DiskFacts:
    """What the framework writes under the run root, at its pinned commit (hpcrl/planning/disk_budget.py)."""

    # Neutral setting (DISK_SETTINGS) -> the framework's key; None: it has no such setting.
    keys: Mapping[str, str | None]
    # The run's checkpoint items (and caches) from neutral inputs, each with its source.
    budget: Callable[[DiskInputs], Budget]
    # Single settings that would fit, in the framework's keys, for a budget that does not.
    fixes: Callable[[Budget], list[Fix | None]]
    # A planned run's settings on top of `base` (model, learners, quota): (plan, value, base), where
    # value(key) is what the script passes for a key (the plan's, the config's, else the framework's default).
    run_inputs: Callable[[RunPlan, Callable[[str], Any], DiskInputs], DiskInputs]
    # `plan-disk` without a config: the framework's default for the checkpoints kept (None: that
    # command needs a config for this backend).
    keep_default: int | None = None
    # The `--keep-last-n-checkpoints` value that means "keep every one" (None in the inputs); None: none does.
    keep_all: int | None = None


@dataclass(frozen=True)
class MemoryDefault:
    """One workload field plan-memory takes from the framework when no config or flag sets it."""

    name: str  # a Workload field, or "util" (vLLM's gpu_memory_utilization)
    key: str | None  # the config key that sets it; None: the framework's code decides
    fact: tuple[str, str]  # (section, name) in data/capabilities.json: the default and its source


@dataclass(frozen=True)
class MemoryFacts:
    """How the memory model sees the framework's learner (`plan-memory`, hpcrl/planning/memory_question.py)."""

    # Without a config: the fields plan-memory takes from the framework (empty: it needs a config).
    defaults: tuple[MemoryDefault, ...] = ()
    colocated: bool = False  # training and generation share every GPU (no config: the default shape)
    logits_copy: bool = False  # the logits divided by the temperature out of place
    weight_sync: Literal["auto", "none"] = "none"  # learner -> engine weight sync the model counts
    weight_sync_key: str = ""  # with "auto": the framework's switch for gathering the whole model (plan-memory's note)
    grads_resident: bool = True  # colocated: gradients stay on the GPU between steps (DeepSpeed yes, FSDP no)
    # What sets the gradient partitions' dtype where no key does (an assumption's origin), and
    # that dtype when the framework fixes it regardless of the capability table.
    grad_dtype_origin: str = "DeepSpeed config"
    grad_dtype: str | None = None
    # The learner's sharding strategy (hpcrl/memory/sharding.py): ZERO (hpcrl/memory/learner.py) or FSDP
    # (fsdp_learner.py), and for FSDP the version the framework uses unless the config says.
    sharding: Sharding = ZERO
    fsdp_version: int = 1
    fsdp_version_origin: str = ""
    fsdp_version_key: str | None = None  # the config key that sets the version
    micro_batches_origin: str = ""  # what sets the micro-batches per optimizer step in a config
    # LearnerSetup fields (hpcrl/memory/learner.py) the framework's learner fixes whatever the config:
    # where the reference runs, the log-prob path's dtype, the adapters' dtype.
    learner: Mapping[str, Any] = field(default_factory=dict)
    # plan-memory flags the framework has no setting for: flag -> why (refused with exit 2).
    refused_flags: Mapping[str, str] = field(default_factory=dict)
    # The vLLM the framework installs and the scheduler sizes it gives each engine (plan, render and
    # plan-memory size engines with these unless the command line says otherwise).
    vllm: VllmEngineFacts = field(default_factory=default_engine)


__all__ = ["DISK_SETTINGS", "DiskFacts", "MemoryDefault", "MemoryFacts"]
