"""Refuse a run whose checkpoints (and the caches beside them) cannot fit its run root's quota.

`render` and `submit` ask this for every backend; `plan-disk --config` shows the same budget.
`hpcrl.force_disk: true` (or `--set hpcrl.force_disk=true`) renders anyway.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hpcrl.planning.cadence import steps_over_run
from hpcrl.planning.disk import GIB
from hpcrl.planning.disk_backends import budget
from hpcrl.planning.disk_budget import Budget, DiskInputs, refusal, shares_quota
from hpcrl.planning.run_types import RunPlan
from hpcrl.planning.walltime import chain_seconds


def run_quota_gib(rp: RunPlan) -> float | None:
    """The run root's quota: hpcrl.quota_gib (--quota-gib) when given, else the profile's."""
    given = rp.config.hpcrl.quota_gib
    return given if given is not None else rp.profile.storage.run_root.quota_gib


def run_inputs(rp: RunPlan, quota_gib: float | None = None, hf_cache: bool | None = None) -> DiskInputs:
    """The disk plan's inputs for a planned run: its config, the plan's choices, the run root's quota."""
    cfg, w, lay, prof = rp.config, rp.workload, rp.layout, rp.profile
    args: dict[str, Any] = {**cfg.args, **rp.backend.layout_args(rp)}  # what the script passes
    quota = quota_gib if quota_gib is not None else run_quota_gib(rp)
    root = cfg.hpcrl.run_root or prof.storage.run_root.path
    base = DiskInputs(
        w.model,
        learners=lay.learner_gpus,
        lora_rank=w.lora_rank,
        model_cache=shares_quota(root, prof.storage.hf_home) if hf_cache is None else hf_cache,
        quota_bytes=None if quota is None else quota * GIB,
        steps_bound=steps_over_run(chain_seconds(cfg.hpcrl, prof), lay.step),
    )

    def value(key: str) -> Any:
        return args[key] if key in args else rp.backend.arg(cfg, key)

    inputs: DiskInputs = rp.backend.disk.run_inputs(rp, value, base)
    return inputs


def config_inputs(rp: RunPlan, quota_gib: float | None, hf_cache: bool | None, **extra: Any) -> tuple[DiskInputs, str]:
    """`plan-disk --config`: the run's inputs (the caches counted as the profile says unless --quota-gib or
    --hf-cache say otherwise), and where the quota is from."""
    s = run_inputs(rp, quota_gib, hf_cache if hf_cache is not None else None if quota_gib is None else False)
    s = replace(
        s,
        dataset_bytes=extra.get("dataset_bytes", 0.0),
        rollout_tokens_per_step=extra.get("rollout_tokens_per_step") or s.rollout_tokens_per_step,
    )
    root = rp.config.hpcrl.run_root or rp.profile.storage.run_root.path
    if quota_gib is not None:
        return s, "--quota-gib"
    if rp.config.hpcrl.quota_gib is not None:
        return s, "hpcrl.quota_gib"
    return s, f"{rp.profile.name} run_root ({root})"


def run_budget(rp: RunPlan, quota_gib: float | None = None, hf_cache: bool | None = None) -> Budget:
    return budget(rp.backend.name, run_inputs(rp, quota_gib, hf_cache))


def check_run_disk(rp: RunPlan) -> Budget:
    """The run's disk budget; PlanError naming settings that fit when it does not (unless forced)."""
    b = run_budget(rp)
    if b.fits is False and not rp.config.hpcrl.force_disk:
        steps = b.inputs.total_steps
        bound = b.inputs.steps_bound
        said = (
            f" over {steps} steps"
            if steps
            else f" (step count unknown: counted over the {bound:,} steps its time limits allow)"
            if bound
            else " (step count unknown: counted to the retention limit)"
        )
        raise refusal(b, [f.text for f in b.fixes], said)
    return b
