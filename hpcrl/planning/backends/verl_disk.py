"""verl's checkpoints on disk at b178a3cd (its `disk` facts, hpcrl/planning/backends/facts.py).

One FSDP checkpoint per `trainer.save_freq` steps and at the last step
(trainer/ppo/ray_trainer.py:1645-1647): per rank `model_world_size_W_rank_R.pt` (the actor's
parameters, fp32: workers/fsdp_workers.py:324-326, the frozen base too under LoRA), `optim_...`
(Adam's two fp32 moments of the trained parameters) and `extra_state_...`
(utils/checkpoint/fsdp_checkpoint_manager.py:220-245); `huggingface/` gets the config and
tokenizer, and the whole model gathered on rank 0 only when `checkpoint.save_contents` holds
`hf_model` (:300-348: the gathered state dict, in the parameters' fp32); under LoRA,
`lora_adapter/` (fsdp_workers.py:1088-1105, fp32 parameters). Rotation
(checkpoint_manager.py:144-172) keeps `trainer.max_actor_ckpt_to_keep`, and with 1 keeps the
old one until the new one is complete: two at the peak. Rollout dumps
(`trainer.rollout_data_dir`) are decoded text (trainer/ppo/ray_trainer.py:396-422).

How long a save took is in the step's metrics (TIMING): timing_s/<name> of every marked_timer
(trainer/ppo/metric_utils.py:262) - the step (ray_trainer.py:1388), generation (:1390), the actor
update (:1606) and the checkpoint save (:1650), which runs after the step's timer, before its line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpcrl.planning.backends.facts import DiskFacts
from hpcrl.planning.backends.log_facts import TimingFacts
from hpcrl.planning.disk import HF_OVERHEAD_BYTES, RANK_OVERHEAD_BYTES
from hpcrl.planning.disk_budget import (
    TEXT_BYTES_PER_TOKEN,
    Budget,
    DiskInputs,
    Fix,
    Item,
    cache_items,
    interval_values,
    saves,
    search,
    trainable,
)

if TYPE_CHECKING:
    from hpcrl.planning.run_types import RunPlan

SRC = "verl b178a3cd: utils/checkpoint/fsdp_checkpoint_manager.py:180-362, workers/fsdp_workers.py:324-326"
KEYS = {
    "ckpt_every": "trainer.save_freq",
    "keep": "trainer.max_actor_ckpt_to_keep",
    "hf_every": None,
    "save_hf": "actor_rollout_ref.actor.checkpoint.save_contents",
    "disable_ds": None,
    "zero_stage": None,
    "lora_rank": "actor_rollout_ref.model.lora_rank",
}


def budget(s: DiskInputs) -> Budget:
    p, t = s.model.total_params, trainable(s)
    terms = {
        "model shards (fp32 parameters" + (", the frozen base too)" if s.lora_rank else ")"): 4.0
        * (p + (t if s.lora_rank else 0)),
        "Adam moments (fp32)": 8.0 * t,
        "extra state, data.pt (per rank)": float(RANK_OVERHEAD_BYTES * s.learners),
        "huggingface/ config and tokenizer": float(HF_OVERHEAD_BYTES),
    }
    if s.save_hf:
        terms["huggingface/ whole model (hf_model; fp32 as gathered)"] = 4.0 * p
    if s.lora_rank:
        terms["lora_adapter/ (fp32)"] = 4.0 * t
    n = saves(s.ckpt_every, s.total_steps, at_end=True)
    keep = None if s.keep is None or s.keep <= 0 else s.keep
    bound = None if keep is None else max(keep, 2) if keep == 1 else keep
    notes = []
    # Step count unknown: the run's time limits bound it (steps_bound); checkpoints kept without limit are counted
    # over the whole run, never to a retention limit that does not apply to them.
    over_run = n if n is not None else saves(s.ckpt_every, s.steps_bound, at_end=True)
    if over_run is None:
        at_peak = bound or 1
        if bound is None:
            notes.append(
                "max_actor_ckpt_to_keep null keeps every checkpoint and nothing bounds how many the run "
                "writes; give --total-steps (trainer.total_training_steps)"
            )
    else:
        at_peak = over_run if bound is None else min(over_run, bound)
        if n is None and bound is None:
            notes.append(
                f"max_actor_ckpt_to_keep null keeps every checkpoint: {over_run:,} counted over the "
                f"{s.steps_bound:,} steps the run's time limits allow (give trainer.total_training_steps "
                "for the exact count)"
            )
    items = [
        Item(
            "fsdp_state",
            f"FSDP checkpoint (global_step_N/actor, every {s.ckpt_every} and at the end, keep "
            f"{keep if keep is not None else 'all'})",
            sum(terms.values()),
            n,
            at_peak,
            f"{SRC}; checkpoint_manager.py:144-172",
            terms,
            unbounded=over_run is None and bound is None,
        )
    ]
    extra, more = cache_items(
        s,
        s.total_steps is not None,
        "verl b178a3cd: trainer/ppo/ray_trainer.py:396-422 (trainer.rollout_data_dir)",
        TEXT_BYTES_PER_TOKEN,
    )
    contents = ["model", "optimizer", "extra"] + (["hf_model"] if s.save_hf else [])
    settings = {
        "trainer.save_freq": s.ckpt_every,
        "trainer.max_actor_ckpt_to_keep": keep,
        "actor_rollout_ref.actor.checkpoint.save_contents": contents,
        "actor_rollout_ref.model.lora_rank": s.lora_rank,
        "total_steps": s.total_steps,
    }
    return Budget("verl", s, t, settings, tuple(items + extra), tuple(notes + more))


def fixes(b: Budget) -> list[Fix | None]:
    s, out = b.inputs, []
    state = b.items[0]
    top = (
        s.keep
        if s.keep and s.keep > 0
        else max(state.written or 0, state.at_peak + 1 if state.unbounded else state.at_peak)
    ) - 1
    out.append(search(budget, s, "keep", range(top, 0, -1), KEYS["keep"]))
    if s.save_hf:
        out.append(search(budget, s, "save_hf", [False], KEYS["save_hf"], lambda _: '["model","optimizer","extra"]'))
    out.append(
        search(
            budget,
            s,
            "ckpt_every",
            interval_values(s.ckpt_every, s.total_steps or s.steps_bound, 1),
            KEYS["ckpt_every"],
        )
    )
    return out


def run_inputs(rp: RunPlan, get: Callable[[str], Any], base: DiskInputs) -> DiskInputs:
    """The trainer's save settings as the script passes them."""
    w, lay = rp.workload, rp.layout
    steps = get("trainer.total_training_steps")
    return DiskInputs(
        **{
            **base.__dict__,
            "learners": lay.nodes * lay.gpus_per_node,
            "ckpt_every": int(get("trainer.save_freq")),
            "keep": get("trainer.max_actor_ckpt_to_keep"),
            "save_hf": "hf_model" in (get("actor_rollout_ref.actor.checkpoint.save_contents") or []),
            "total_steps": steps if isinstance(steps, int) and steps > 0 else None,
            "rollout_tokens_per_step": (
                w.unique_prompts * w.samples_per_prompt * w.seq_len if get("trainer.rollout_data_dir") else 0
            ),
        }
    )


# keep_default: what hpcrl renders for trainer.max_actor_ckpt_to_keep; -1 on plan-disk's flag keeps all (null).
DISK = DiskFacts(keys=KEYS, budget=budget, fixes=fixes, run_inputs=run_inputs, keep_default=2, keep_all=-1)
TIMING = TimingFacts(
    step=("timing_s/step",),
    generation=("timing_s/gen",),
    training=("timing_s/update_actor",),
    checkpoint=("timing_s/save_checkpoint",),
)

__all__ = ["DISK", "TIMING"]
