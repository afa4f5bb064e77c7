"""Refuse a run whose checkpoints cannot fit its run root's quota (render and submit)."""

from __future__ import annotations

from hpcrl.backends.oi_args import default
from hpcrl.disk import GIB, DiskPlan, plan_disk, suggest
from hpcrl.errors import PlanError
from hpcrl.run_plan import RunPlan


def check_run_disk(rp: RunPlan) -> DiskPlan | None:
    """The disk plan of an open-instruct run; PlanError naming settings that fit when it does not.

    `hpcrl.force_disk: true` (or `--set hpcrl.force_disk=true`) renders anyway. Other backends
    size their own checkpoints (OpenRLHF's flags come from the disk plan) or have no disk plan.
    """
    cfg = rp.config
    if cfg.hpcrl.backend != "open-instruct":
        return None
    quota = rp.profile.storage.run_root.quota_gib
    layout = cfg.hpcrl.arg_layout

    def arg(name: str) -> int:
        return int(cfg.args[name] if name in cfg.args else default(name, layout))

    w = rp.workload
    steps = max(1, arg("total_episodes") // max(1, w.unique_prompts * w.samples_per_prompt))
    plan = plan_disk(
        w.model,
        zero_stage=3,
        n_learners=rp.layout.learner_gpus,
        lora_rank=w.lora_rank,
        save_freq=arg("save_freq"),
        checkpoint_state_freq=arg("checkpoint_state_freq"),
        keep_last_n_checkpoints=arg("keep_last_n_checkpoints"),
        total_steps=steps,
        quota_bytes=None if quota is None else quota * GIB,
    )
    if plan.fits is False and not cfg.hpcrl.force_disk:
        fixes = " | ".join(f"--set {s.text}" for s in suggest(plan)) or "a larger run root (hpcrl.run_root)"
        raise PlanError(
            f"checkpoints need {plan.peak_bytes / GIB:,.0f} GiB at peak over {steps} steps but the run root's "
            f"quota is {quota:,.0f} GiB; would fit: {fixes} (or --set hpcrl.force_disk=true)"
        )
    return plan
