"""open-instruct's checkpoints on disk at e6c3044a (its `disk` facts, hpcrl/planning/backends/facts.py).

DeepSpeed state every `checkpoint_state_freq` steps (keep `keep_last_n_checkpoints`) and HF saves
every `save_freq` steps and at the end, sized and counted by hpcrl/planning/disk.py; rollout
traces with `save_traces` are token ids (rl_utils.py:100-128).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpcrl.planning.backends.facts import DiskFacts
from hpcrl.planning.disk import plan_disk
from hpcrl.planning.disk_budget import (
    TOKEN_ID_BYTES,
    Budget,
    DiskInputs,
    Fix,
    Item,
    cache_items,
    interval_values,
    search,
)

if TYPE_CHECKING:
    from hpcrl.planning.run_types import RunPlan

OI = "open-instruct e6c3044a"
KEYS = {
    "ckpt_every": "checkpoint_state_freq",
    "keep": "keep_last_n_checkpoints",
    "hf_every": "save_freq",
    "save_hf": None,
    "disable_ds": None,
    "zero_stage": "deepspeed_stage",
    "lora_rank": None,
}


def budget(s: DiskInputs) -> Budget:
    keep = -1 if s.keep is None else s.keep
    plan = plan_disk(
        s.model,
        zero_stage=s.zero_stage,
        n_learners=s.learners,
        lora_rank=s.lora_rank,
        save_freq=s.hf_every,
        checkpoint_state_freq=s.ckpt_every,
        keep_last_n_checkpoints=keep,
        total_steps=s.total_steps or 1,
    )
    # <= 0 turns each off in grpo_fast (`if args.save_freq > 0`, :1664); the final HF save is unconditional (:2052).
    state_when = f"every {s.ckpt_every}, keep {keep}" if s.ckpt_every > 0 else "none: checkpoint_state_freq <= 0"
    hf_when = f"every {s.hf_every} + final" if s.hf_every > 0 else "final only: save_freq <= 0"
    items = [
        Item(
            "deepspeed_state",
            f"DeepSpeed state (checkpoint_state_dir/global_stepN, {state_when})",
            plan.state_bytes,
            plan.n_state_saves,
            plan.state_at_peak,
            f"{OI}: open_instruct/grpo_fast.py:767, utils.py:838-857",
            plan.state_terms,
        ),
        Item(
            "hf_save",
            f"HF save: {plan.hf_kind} ({hf_when})",
            plan.hf_bytes,
            plan.n_hf_saves,
            plan.hf_at_peak,
            f"{OI}: open_instruct/grpo_fast.py:827, 1664-1669, 2052",
        ),
    ]
    extra, notes = cache_items(s, True, f"{OI}: open_instruct/rl_utils.py:100-128 (save_traces)", TOKEN_ID_BYTES)
    settings = {
        "checkpoint_state_freq": s.ckpt_every,
        "keep_last_n_checkpoints": keep,
        "save_freq": s.hf_every,
        "deepspeed_stage": s.zero_stage,
        "total_steps": s.total_steps,
    }
    return Budget("open-instruct", s, plan.trainable_params, settings, tuple(items + extra), tuple(plan.notes + notes))


def fixes(b: Budget) -> list[Fix | None]:
    s, out = b.inputs, []
    state = b.item("deepspeed_state")
    if state and state.written:
        out.append(search(budget, s, "keep", range(state.written, 0, -1), KEYS["keep"]))
    out.append(search(budget, s, "hf_every", interval_values(s.hf_every, s.total_steps), KEYS["hf_every"]))
    if state and state.written:
        out.append(search(budget, s, "ckpt_every", interval_values(s.ckpt_every, s.total_steps, 1), KEYS["ckpt_every"]))
    return out


def run_inputs(rp: RunPlan, arg: Callable[[str], Any], base: DiskInputs) -> DiskInputs:
    """grpo_fast's save settings as the script passes them."""
    w = rp.workload
    seqs = w.unique_prompts * w.samples_per_prompt
    return DiskInputs(
        **{
            **base.__dict__,
            "zero_stage": 3,
            "hf_every": int(arg("save_freq")),
            "ckpt_every": int(arg("checkpoint_state_freq")),
            "keep": int(arg("keep_last_n_checkpoints")),
            "total_steps": max(1, int(arg("total_episodes")) // max(1, seqs)),
            "rollout_tokens_per_step": seqs * w.seq_len if arg("save_traces") else 0,
        }
    )


DISK = DiskFacts(keys=KEYS, budget=budget, fixes=fixes, run_inputs=run_inputs, keep_default=3)

__all__ = ["DISK"]
