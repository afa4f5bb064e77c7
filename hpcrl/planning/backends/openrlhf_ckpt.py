"""OpenRLHF's checkpoints on disk at 3c3be623 (its `disk` facts), and the checkpoint flags hpcrl renders.

Every `ckpt.save_steps`, unless `ckpt.disable_ds`, DeepSpeed's state in `ckpt.path/_actor` after
evicting down to `ckpt.max_num - 1` (utils/deepspeed/deepspeed.py:706-752;
trainer/ray/ppo_actor.py:660-672); under LoRA it holds the frozen base weights too, a
full-model-sized part (exclude_frozen_parameters is not passed: DeepSpeed edaa7221
runtime/engine.py:4749). With `ckpt.save_hf`, an HF save in `ckpt.path/global_stepN_hf`
(ppo_actor.py:674-680), never deleted; at the end one in `ckpt.output_dir` (:607-615). Under
LoRA that save is the adapter only (deepspeed.py:565-574). OpenRLHF before 2d0b9854 (2024-01-11)
merged the adapter into the base and wrote the full model (utils/deepspeed.py:258-273 at
3efc5f82), the size of the users' 203 GB save (seed 000): `lora_hf_save: full` plans that behaviour.

When the config sets none of the checkpoint flags and the DeepSpeed state does not fit the run
root's quota (with the HF model cache when it lives there), hpcrl renders `--ckpt.disable_ds
--ckpt.save_hf --ckpt.max_num N`, as the users did by hand (`--disable_ds_ckpt --save_hf_ckpt
--max_ckpt_num 2` before the renames), and says what it costs: a restart cannot resume, and
the HF saves accumulate. Flags the config sets are the user's: render checks them against the
quota and refuses, naming settings that fit (hpcrl/planning/disk_check.py).
"""

from __future__ import annotations

import math
from dataclasses import replace
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpcrl.planning.backends.facts import DiskFacts
from hpcrl.planning.cadence import run_cadence, steps_over_run
from hpcrl.planning.disk import GIB, HF_OVERHEAD_BYTES, DiskSetup, state_checkpoint_terms
from hpcrl.planning.walltime import chain_seconds
from hpcrl.planning.disk_budget import (
    Budget,
    DiskInputs,
    Fix,
    Item,
    cache_items,
    interval_values,
    saves,
    search,
    shares_quota,
    trainable,
)

if TYPE_CHECKING:
    from hpcrl.planning.layout import Layout, Workload
    from hpcrl.planning.run_types import HpcrlSection, RunPlan
    from hpcrl.profiles import ClusterProfile

ORL_DS = (
    "OpenRLHF 3c3be623: utils/deepspeed/deepspeed.py:679-752, trainer/ray/ppo_actor.py:660-672; frozen base: "
    "DeepSpeed edaa7221 runtime/engine.py:4749"
)
ORL_HF = "OpenRLHF 3c3be623: utils/deepspeed/deepspeed.py:533-590 (LoRA: 565-574)"
ORL_FULL = "OpenRLHF before 2d0b9854: utils/deepspeed.py:258-273 at 3efc5f82 (merge_and_unload); seed 000's 203 GB"
KEYS = {
    "ckpt_every": "ckpt.save_steps",
    "keep": "ckpt.max_num",
    "hf_every": None,
    "save_hf": "ckpt.save_hf",
    "disable_ds": "ckpt.disable_ds",
    "zero_stage": "ds.zero_stage",
    "lora_rank": "ds.lora.rank",
}
DEFAULT_MAX_NUM = 3  # OpenRLHF's --ckpt.max_num default
USER_KEYS = ("ckpt.disable_ds", "ckpt.save_hf", "ckpt.max_num")


def budget(s: DiskInputs) -> Budget:
    p, t = s.model.total_params, trainable(s)
    full = not s.lora_rank or s.lora_hf_save == "full"
    hf_one = 2.0 * (p if full else t) + HF_OVERHEAD_BYTES
    if not s.lora_rank:
        hf_what, hf_src = "full weights (bf16)", ORL_HF
    elif full:
        hf_what, hf_src = "full model under LoRA (lora_hf_save full)", ORL_FULL
    else:
        hf_what, hf_src = "LoRA adapter only", ORL_HF
    n = saves(s.ckpt_every, s.total_steps)
    # Step count unknown (it depends on the dataset): the run's time limits bound it (steps_bound); without
    # one, the DeepSpeed states reach their retention limit and the HF saves beside them grow without bound.
    bound = n if n is not None else saves(s.ckpt_every, s.steps_bound)
    keep = max(0, s.keep or 0)
    items, notes = [], []
    if not s.disable_ds:
        terms = state_checkpoint_terms(DiskSetup(s.model, s.zero_stage, s.learners, s.lora_rank), t)
        at_peak = keep if bound is None else min(bound, keep)
        if n is None and s.ckpt_every > 0:
            notes.append(
                f"DeepSpeed state: ckpt.max_num {s.keep} counted, the retention limit (the run's step count "
                "depends on its dataset)"
            )
        items.append(
            Item(
                "deepspeed_state",
                f"DeepSpeed state (ckpt.path/_actor/global_stepN, every {s.ckpt_every}, ckpt.max_num {s.keep})",
                sum(terms.values()),
                n,
                at_peak,
                ORL_DS,
                terms,
            )
        )
    if s.save_hf and s.ckpt_every > 0:
        # Never deleted (ckpt.max_num prunes only _actor): counted until the run ends, never to a retention limit.
        if n is None and bound is not None:
            notes.append(
                f"HF saves are never deleted: {bound:,} counted, one every {s.ckpt_every} steps over the "
                f"{s.steps_bound:,} steps the run's time limits allow (each job's wall time x the jobs of its "
                f"chain, at the fastest step estimate); give the step count (data.max_samples) for the exact "
                f"count; each save is {hf_one / 1024**3:,.1f} GiB"
            )
        elif n is None:
            notes.append(
                f"HF saves are never deleted and nothing bounds how many the run makes: each adds "
                f"{hf_one / 1024**3:,.1f} GiB (give --total-steps, or data.max_samples in the config)"
            )
        items.append(
            Item(
                "hf_save",
                f"HF save: {hf_what} (ckpt.path/global_stepN_hf, every {s.ckpt_every})",
                hf_one,
                n,
                bound if bound is not None else max(1, keep),
                hf_src + "; trainer/ray/ppo_actor.py:674-680",
                unbounded=bound is None,
            )
        )
    items.append(
        Item(
            "final_save",
            f"final save: {hf_what} (ckpt.output_dir)",
            hf_one,
            1,
            1,
            hf_src + "; trainer/ray/ppo_actor.py:607-615",
        )
    )
    if s.lora_rank and not full:
        notes.append(
            "LoRA HF saves hold the adapter only at OpenRLHF 3c3be623 (rank 0 still gathers the whole bf16 "
            "model in host RAM to write it); --lora-hf-save full plans a full-model save instead"
        )
    extra, more = cache_items(s, s.total_steps is not None, None)
    settings = {
        "ckpt.save_steps": s.ckpt_every,
        "ckpt.max_num": s.keep,
        "ckpt.save_hf": s.save_hf,
        "ckpt.disable_ds": s.disable_ds,
        "ds.zero_stage": s.zero_stage,
        "ds.lora.rank": s.lora_rank,
        "lora_hf_save": s.lora_hf_save,
        "total_steps": s.total_steps,
    }
    return Budget("openrlhf", s, t, settings, tuple(items + extra), tuple(notes + more))


def fixes(b: Budget) -> list[Fix | None]:
    s, out = b.inputs, []
    if not s.disable_ds:
        out.append(search(budget, s, "keep", range((s.keep or 1) - 1, 0, -1), KEYS["keep"]))
        out.append(search(budget, s, "disable_ds", [True], KEYS["disable_ds"]))
    if s.save_hf:
        out.append(search(budget, s, "save_hf", [False], KEYS["save_hf"]))
        if s.lora_rank and s.lora_hf_save == "full":
            out.append(search(budget, s, "lora_hf_save", ["adapter"], "hpcrl.lora_hf_save"))
        out.append(
            search(
                budget,
                s,
                "ckpt_every",
                interval_values(s.ckpt_every, s.total_steps or s.steps_bound),
                KEYS["ckpt_every"],
            )
        )
    return out


def run_steps(args: dict[str, Any], get: Callable[[str], Any]) -> int | None:
    """A global step per rollout.batch_size prompts: the step count is known only when data.max_samples caps
    the dataset."""
    if "data.max_samples" not in args:
        return None
    return math.ceil(int(args["data.max_samples"]) / int(get("rollout.batch_size"))) * int(get("train.num_episodes"))


def run_inputs(rp: RunPlan, get: Callable[[str], Any], base: DiskInputs) -> DiskInputs:
    """The checkpoint flags as the script passes them."""
    cfg = rp.config
    return DiskInputs(
        **{
            **base.__dict__,
            "zero_stage": int(get("ds.zero_stage")),
            "ckpt_every": int(get("ckpt.save_steps")),
            "keep": int(get("ckpt.max_num")),
            "save_hf": bool(get("ckpt.save_hf")),
            "disable_ds": bool(get("ckpt.disable_ds")),
            "lora_hf_save": cfg.hpcrl.lora_hf_save,
            "total_steps": run_steps(cfg.args, get),
        }
    )


def checkpoint_flags(
    args: dict[str, Any], w: Workload, lay: Layout, profile: ClusterProfile, section: HpcrlSection, steps: int | None
) -> tuple[dict[str, Any], list[str]]:
    """Flags to render (name -> value) and warnings, from the disk budget and the run root's quota: hpcrl switches
    to HF saves only when every save the run writes (they are never deleted) fits; else nothing is switched
    and the disk check refuses the run, naming settings that fit."""
    max_num = int(args.get("ckpt.max_num", DEFAULT_MAX_NUM))
    keep = {} if "ckpt.max_num" in args else {"ckpt.max_num": max_num}
    quota_gib = section.quota_gib if section.quota_gib is not None else profile.storage.run_root.quota_gib
    if any(k in args for k in USER_KEYS) or quota_gib is None:
        return keep, []
    root = section.run_root or profile.storage.run_root.path
    pinned = args.get("ckpt.save_steps")
    every = run_cadence(
        lay.step,
        section.max_lost_minutes,
        profile,
        w.model,
        w.lora_rank,
        pinned if isinstance(pinned, int) and pinned > 0 else None,
    ).every_steps
    s = DiskInputs(
        w.model,
        learners=lay.learner_gpus,
        lora_rank=w.lora_rank,
        total_steps=steps,
        steps_bound=steps_over_run(chain_seconds(section, profile), lay.step),
        ckpt_every=every,
        keep=max_num,
        model_cache=shares_quota(root, profile.storage.hf_home),
        quota_bytes=quota_gib * GIB,
        lora_hf_save=section.lora_hf_save,
    )
    now = budget(s)
    if now.fits:
        return keep, []
    state, final = now.item("deepspeed_state"), now.item("final_save")
    assert state is not None and final is not None
    cache = now.item("model_cache")
    room = quota_gib * GIB - (cache.one_bytes if cache else 0.0)
    n = max(1, min(max_num, int(room // final.one_bytes) - 1))
    after = budget(replace(s, disable_ds=True, save_hf=True, keep=n))
    if not after.fits:  # the HF saves of the whole run would fill the quota: the disk check refuses the run
        return keep, []
    hf = after.item("hf_save")
    assert hf is not None
    what = (
        f"DeepSpeed state checkpoints do not fit the run root's {quota_gib:,.0f} GiB quota: ckpt.max_num "
        f"{max_num} x {state.one_bytes / GIB:,.0f} GiB + the final {final.one_bytes / GIB:,.1f} GiB save"
        + (f" + the {cache.one_bytes / GIB:,.0f} GiB model cache" if cache else "")
    )
    counted = f"{hf.at_peak:,} over the run's {steps:,} steps" if steps else f"{hf.at_peak:,} over its time limits"
    return {"ckpt.disable_ds": True, "ckpt.save_hf": True, "ckpt.max_num": n}, [
        f"{what}; rendering --ckpt.disable_ds --ckpt.save_hf --ckpt.max_num {n}: a restart cannot resume (no "
        f"DeepSpeed state) and starts training over, and OpenRLHF never deletes HF saves "
        f"({hf.one_bytes / GIB:,.1f} GiB each, {counted}: {after.peak_bytes / GIB:,.0f} GiB at peak, inside the quota)"
    ]


# keep_default: OpenRLHF's ckpt.max_num default.
DISK = DiskFacts(keys=KEYS, budget=budget, fixes=fixes, run_inputs=run_inputs, keep_default=DEFAULT_MAX_NUM)

__all__ = ["DISK", "checkpoint_flags", "run_steps"]
