"""TRL's checkpoints on disk (its `disk` facts, hpcrl/planning/backends/facts.py).

What `trl grpo` writes, through transformers' Trainer (5.17.0 trainer.py:3215-3275; capabilities.json trl
`checkpoints`): every `save_steps` a `{output_dir}/checkpoint-N/` holding the bf16 model gathered from ZeRO-3
(hpcrl's DeepSpeed JSON sets stage3_gather_16bit_weights_on_model_save; the LoRA adapter with use_peft), and
unless `save_only_model` the DeepSpeed state `global_stepN/` (ZeRO-3: 12 bytes per trainable parameter over all
ranks, hpcrl/planning/disk.py) with the scheduler and RNG states, then trainer_state.json. `save_total_limit`
rotates the older ones after the new one is complete, so limit + 1 exist at that moment. At the end the final
model goes into output_dir (trl/scripts/grpo.py:156).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpcrl.planning.backends.facts import DiskFacts
from hpcrl.planning.disk import HF_OVERHEAD_BYTES, DiskSetup, state_checkpoint_terms
from hpcrl.planning.disk_budget import (
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

SRC = "transformers 5.17.0 trainer.py:3215-3275 (TRL 1.16.0 trl grpo)"
KEYS = {
    "ckpt_every": "save_steps",
    "keep": "save_total_limit",
    "hf_every": None,
    "save_hf": None,
    "disable_ds": "save_only_model",
    "zero_stage": None,
    "lora_rank": "lora_r",
}


def budget(s: DiskInputs) -> Budget:
    """checkpoint-N directories every save_steps (keep save_total_limit) and the final model."""
    t = trainable(s)
    model = 2.0 * (s.model.total_params if not s.lora_rank else t)
    terms = {
        ("LoRA adapter (bf16)" if s.lora_rank else "model weights (bf16, gathered from ZeRO-3)"): model,
        "config, tokenizer, trainer state, scheduler": float(HF_OVERHEAD_BYTES),
    }
    if not s.disable_ds:
        setup = DiskSetup(s.model, zero_stage=3, n_learners=s.learners, lora_rank=s.lora_rank)
        state = state_checkpoint_terms(setup, t)
        terms.update({f"DeepSpeed state: {k}": v for k, v in state.items()})
    n = saves(s.ckpt_every, s.total_steps)
    keep = None if s.keep is None or s.keep <= 0 else s.keep
    at_peak = (keep + 1 if keep else 1) if n is None else (n if keep is None else min(n, keep + 1))
    what = "model only (save_only_model)" if s.disable_ds else "model + DeepSpeed state"
    items = [
        Item(
            "trainer_checkpoint",
            f"checkpoint-N ({what}; every {s.ckpt_every}, keep {keep or 'all'})",
            sum(terms.values()),
            n,
            at_peak,
            SRC,
            terms,
        ),
        Item(
            "final_model",
            "final model in output_dir",
            model + HF_OVERHEAD_BYTES,
            1,
            1,
            "trl/scripts/grpo.py:156 at 1.16.0",
        ),
    ]
    extra, notes = cache_items(s, s.total_steps is not None, None)
    settings = {
        "save_steps": s.ckpt_every,
        "save_total_limit": keep,
        "save_only_model": s.disable_ds,
        "lora_r": s.lora_rank,
        "max_steps": s.total_steps,
    }
    return Budget("trl", s, t, settings, tuple(items + extra), tuple(notes))


def fixes(b: Budget) -> list[Fix | None]:
    s, out = b.inputs, []
    out.append(search(budget, s, "keep", list(range((s.keep or b.items[0].written or 2) - 1, 0, -1)), KEYS["keep"]))
    out.append(search(budget, s, "ckpt_every", interval_values(s.ckpt_every, s.total_steps, 1), KEYS["ckpt_every"]))
    return out


def run_inputs(rp: RunPlan, arg: Callable[[str], Any], base: DiskInputs) -> DiskInputs:
    """The run's save settings as the trainer gets them (max_steps -1: the step count is not known here)."""
    steps = int(arg("max_steps") or -1)
    lora = int(arg("lora_r") or 0) if arg("use_peft") else 0
    keep = arg("save_total_limit")
    return DiskInputs(
        **{
            **base.__dict__,
            "zero_stage": 3,
            "lora_rank": lora,
            "ckpt_every": int(arg("save_steps") or 0),
            "keep": None if keep is None else int(keep),
            "disable_ds": bool(arg("save_only_model")),
            "total_steps": steps if steps > 0 else None,
        }
    )


# keep_default: the save_total_limit hpcrl plans when the config gives none (TRL's own None keeps every one);
# -1 on plan-disk's flag keeps all.
KEEP_DEFAULT = 2
DISK = DiskFacts(keys=KEYS, budget=budget, fixes=fixes, run_inputs=run_inputs, keep_default=KEEP_DEFAULT, keep_all=-1)

__all__ = ["DISK", "KEEP_DEFAULT", "KEYS"]
