"""The custom backend's planning facts: its checkpoints on disk and plan-memory's answer.

Pure. The script is the user's, so both are assumptions from what its config says: an HF
Trainer-style LoRA checkpoint, and the HF/TRL-style learner of hpcrl/memory/hf_plan.py.
"""

from __future__ import annotations

from dataclasses import replace
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpcrl.errors import HpcrlError
from hpcrl.memory.hf_plan import hf_memory_plan
from hpcrl.planning.backends.facts import DiskFacts
from hpcrl.planning.disk import HF_OVERHEAD_BYTES
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
    from hpcrl.planning.run_types import RunConfig, RunPlan
    from hpcrl.profiles import ClusterProfile

KEYS = {
    "ckpt_every": "save_steps",
    "keep": "keep_checkpoints",
    "hf_every": None,
    "save_hf": None,
    "disable_ds": None,
    "zero_stage": None,
    "lora_rank": "lora_rank",
}


def budget(s: DiskInputs) -> Budget:
    """A user's script: an HF Trainer-style checkpoint (LoRA: the adapter in fp32 and the optimizer's two fp32
    moments; full fine-tuning: the bf16 weights and two bf16 moments) every save_steps; how many it keeps is the script's (keep_checkpoints, HF save_total_limit).
    An assumption about the script, derived from what HF Trainer and PEFT write, not read from it."""
    t = trainable(s)
    if s.lora_rank:
        terms = {"adapter (fp32)": 4.0 * t, "optimizer state (AdamW moments, fp32)": 8.0 * t}
    else:  # full fine-tuning of a bf16 model: the weights, and AdamW's moments in the weights' dtype
        terms = {"model weights (bf16)": 2.0 * t, "optimizer state (AdamW moments, bf16)": 4.0 * t}
    terms["config, tokenizer, trainer state"] = float(HF_OVERHEAD_BYTES)
    n = saves(s.ckpt_every, s.total_steps)
    keep = None if s.keep is None or s.keep <= 0 else s.keep
    at_peak = (keep or 1) if n is None else n if keep is None else min(n, keep + 1)
    notes = [
        f"the custom backend's checkpoint is assumed to be an HF Trainer-style "
        f"{'LoRA' if s.lora_rank else 'full-model'} checkpoint (derived)"
    ]
    items = [
        Item(
            "adapter_checkpoint",
            f"script checkpoint (every {s.ckpt_every}, keep {keep or 'all'})",
            sum(terms.values()),
            n,
            at_peak,
            f"assumed: HF Trainer{'/PEFT LoRA' if s.lora_rank else ' full-model'} checkpoint (derived)",
            terms,
        )
    ]
    extra, more = cache_items(s, s.total_steps is not None, None)
    settings = {
        "save_steps": s.ckpt_every,
        "keep_checkpoints": keep,
        "lora_rank": s.lora_rank,
        "total_steps": s.total_steps,
    }
    return Budget("custom", s, t, settings, tuple(items + extra), tuple(notes + more))


def fixes(b: Budget) -> list[Fix | None]:
    s = b.inputs
    return [
        search(budget, s, "keep", range((s.keep or b.items[0].written or 2) - 1, 0, -1), KEYS["keep"]),
        search(budget, s, "ckpt_every", interval_values(s.ckpt_every, s.total_steps, 1), KEYS["ckpt_every"]),
    ]


def run_inputs(rp: RunPlan, get: Callable[[str], Any], base: DiskInputs) -> DiskInputs:
    """One learner's checkpoint every save_steps (as planned when unset), kept as the config says."""
    return DiskInputs(
        **{
            **base.__dict__,
            "learners": 1,
            "ckpt_every": int(get("save_steps") or 0),
            "keep": get("keep_checkpoints"),
            "total_steps": get("total_steps"),
        }
    )


# plan-disk without a config is not offered: the script's checkpoint needs the config's keys.
DISK = DiskFacts(keys=KEYS, budget=budget, fixes=fixes, run_inputs=run_inputs)


def memory_answer(
    backend: Any, cfg: RunConfig, profile: ClusterProfile, given: Any, learner_gpus: int | None
) -> dict[str, Any]:
    """plan-memory for the custom backend: the script's HF/TRL-style learner on one GPU of `profile`
    (hpcrl/memory/hf_plan.py), as `plan` and `render` plan it; `learner_gpus` training processes (DDP).
    `backend`: the CustomBackend (its processes and learner setup); `given`: plan-memory's flags (hpcrl.planning.memory_question.Overrides)."""
    flags = {
        "--tokens-per-gpu": given.tokens_per_gpu,
        "--ref-policy/--no-ref-policy": given.ref_policy,
        "--zpg": given.zpg,
        "--offload": given.offload,
        "--logprob-impl": given.logprob_impl,
        "--grad-accum-dtype": given.grad_accum_dtype,
        "--vllm-gpu-memory-utilization": given.util,
        "--weight-sync": given.weight_sync,
    }
    bad = [f for f, v in flags.items() if v is not None]
    if bad:
        raise HpcrlError(
            f"{bad[0]} does not apply to the custom backend (no DeepSpeed, no vLLM); set the config's "
            "keys instead (mini_batch_size, reference, ...; docs/backends.md)"
        )
    w = replace(
        backend.workload_from_config(cfg, given.model),
        **{
            k: v
            for k, v in given.workload_changes().items()
            if k in ("lora_rank", "load_in_4bit", "gradient_checkpointing")
        },
    )
    g = profile.gpu.count_per_node
    n = learner_gpus if learner_gpus is not None else backend.processes(cfg, g)
    if n < 1 or n > g:
        raise HpcrlError(f"--learner-gpus {n}: the custom backend trains on one node of {g} GPUs; valid: 1 to {g}")
    plan = hf_memory_plan(profile, backend.learner_setup(cfg, w, n))
    data = plan.to_dict()
    data["notes"] = [
        f"{n} training process{'es' if n > 1 else ''} ({'DDP, ' if n > 1 else ''}each GPU holds "
        "everything); every term is derived from what the libraries allocate or fitted, none measured "
        "on this run"
    ]
    data["assumptions"] = [
        f"{k} {backend.arg(cfg, k)}: {'the config' if k in cfg.args else 'hpcrl default'}"
        for k in ("algorithm", "critic", "reference", "lora_targets", "lora_dropout", "double_quant")
    ]
    data["backend"] = backend.name
    data["config"] = cfg.source
    return data


__all__ = ["DISK", "memory_answer"]
