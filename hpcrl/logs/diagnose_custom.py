"""Fixes for a run of a user's own script (the custom backend) that ran out of GPU memory (pure).

A user's own HF/TRL-style script has no command line hpcrl can read; its learner is known from the
run directory's hpcrl/plan.json (`memory.learner`, what `hpcrl plan-memory` planned). The fixes are
single changes of the run config's keys (mini_batch_size, max_response_length, rollout_batch_size,
gradient_checkpointing, load_in_4bit, reference), each re-planned with hpcrl/memory/hf_learner.py.

When the log's own figures (allocated by PyTorch + the failed request) show more than the plan
predicted, the terms that grow with the batch and the sequence length (each moment's transient
terms: activations, logits, KV cache) are scaled by the ratio that reproduces the log, and the
resident terms (weights, adapters, optimizer) are kept as derived: the batch and the lengths are
what a user changes, and what the model has the least certainty about. Said in the assumptions.
"""

from __future__ import annotations

from dataclasses import replace

from hpcrl.logs.diagnose_context import Context
from hpcrl.memory import constants as C
from hpcrl.memory.hf_learner import HfLearnerMemory, HfLearnerSetup, hf_learner_memory
from hpcrl.memory.sharding import margin_bytes

GIB = C.GIB
# plan.json's memory.learner field -> HfLearnerSetup field (the run as hpcrl planned it).
FIELDS = {
    "processes": "n_gpus",
    "algorithm": "algorithm",
    "lora_rank": "lora_rank",
    "lora_targets": "lora_targets",
    "lora_dropout": "lora_dropout",
    "double_quant": "double_quant",
    "critic": "critic",
    "reference": "reference",
    "rollout_seqs": "rollout_seqs",
    "micro_seqs": "micro_seqs",
    "prompt_len": "prompt_len",
    "response_len": "response_len",
    "gradient_checkpointing": "gradient_checkpointing",
}


def planned_setup(ctx: Context) -> HfLearnerSetup | None:
    """The script's learner from the run's plan.json; None (said) when the plan does not describe it."""
    spec = ctx.spec()
    learner = ((ctx.plan or {}).get("memory") or {}).get("learner") or {}
    if spec is None:
        return None
    try:
        kw = {f: learner[k] for k, f in FIELDS.items()}
        kw["lora_targets"] = tuple(kw["lora_targets"])
        return HfLearnerSetup(model=spec, load_in_4bit=learner["weights"] == "4-bit NF4", **kw)
    except (KeyError, TypeError, ValueError):
        return None


def _device(s: HfLearnerSetup, scale: float) -> tuple[float, float]:
    """Bytes on the GPU at the step's peak, with each moment's transient terms times `scale`, and
    the allocator margin kept free on top of it (the eager path's, as hf_memory_plan plans it)."""
    hf = hf_learner_memory(s)
    reserved = max(hf.reserved(p, scale) for p in hf.phases)
    return reserved + hf.non_torch(s.n_gpus), margin_bytes("eager", reserved)


def _scale(hf: HfLearnerMemory, demand_gib: float | None) -> float:
    """How much the log's demand exceeds the plan's, applied to the transient terms (>= 1)."""
    transient = hf.peak_allocated - hf.resident_bytes
    if not demand_gib or transient <= 0:
        return 1.0
    return max(1.0, (demand_gib * GIB - hf.resident_bytes) / transient)


def _halvings(value: int) -> list[int]:
    out = []
    while value > 1:
        value //= 2
        out.append(value)
    return out


def planned_fixes(ctx: Context, capacity_gib: float, demand_gib: float | None) -> tuple[list[str], dict]:
    """Single changes of the run config that fit the script's learner on this GPU, planned."""
    base = planned_setup(ctx)
    if base is None:
        return [], {
            "cannot_plan": "cannot re-plan the script's learner: the run's plan.json does not describe it "
            "(rendered by an older hpcrl, or not a run of a user's own script): re-render the run, or see "
            "`hpcrl plan-memory --config`"
        }
    prof = ctx.profile.model_copy(update={"gpu": ctx.profile.gpu.model_copy(update={"memory_gib": capacity_gib})})
    cap = prof.gpu_bytes
    hf = hf_learner_memory(base)
    scale = _scale(hf, demand_gib)
    now, margin = _device(base, scale)
    details = {
        "capacity_gib": round(capacity_gib, 2),
        "predicted_gib": round(now / GIB, 3),
        "peak_phase": hf.peak_phase,
        "scale_transient": round(scale, 2),
    }
    ctx.note(
        f"the script's learner from the run's plan.json ({base.micro_seqs} sequences per training micro-batch, "
        f"{base.prompt_len}+{base.response_len} tokens, {base.rollout_seqs} per generate call)"
    )
    if scale > 1:
        ctx.note(
            f"batch- and length-dependent terms x{scale:.2f} so that the plan matches the log's "
            f"{demand_gib:.1f} GiB (resident terms as derived)"
        )
    if now + margin <= cap:
        return [], {**details, "planner_fits": True}

    def fits(s: HfLearnerSetup) -> float | None:
        dev, m = _device(s, scale)
        return dev if dev + m <= cap else None

    fixes: list[str] = []

    def first(key: str, values: list, field: str, note: str = "") -> None:
        for v in values:
            if (dev := fits(replace(base, **{field: v}))) is not None:
                fixes.append(
                    f"{key} {_text(getattr(base, field))} -> {_text(v)}{note}: planner peak {dev / GIB:.1f} "
                    f"GiB of {capacity_gib:.1f}"
                )
                return

    first(
        "mini_batch_size",
        _halvings(base.micro_seqs),
        "micro_seqs",
        " (raise gradient_accumulation_steps as much to keep the batch)",
    )
    if not base.gradient_checkpointing:
        first("gradient_checkpointing", [True], "gradient_checkpointing")
    first("max_response_length", [n for n in range(base.response_len - 64, 15, -64)], "response_len")
    group = (ctx.plan or {}).get("backend_args") or {}
    spp, batch = group.get("samples_per_prompt"), group.get("rollout_batch_size")
    if isinstance(spp, int) and isinstance(batch, int) and spp > 0 and batch * spp == base.rollout_seqs:
        for b in _halvings(batch):  # fewer prompts per generate call, the group size kept
            if (dev := fits(replace(base, rollout_seqs=b * spp))) is not None:
                fixes.append(
                    f"rollout_batch_size {batch} -> {b} ({b * spp} sequences per generate call): planner "
                    f"peak {dev / GIB:.1f} GiB of {capacity_gib:.1f}"
                )
                break
    else:  # a plan.json without them: the product only
        first(
            "sequences per generate call (rollout_batch_size x samples_per_prompt)",
            _halvings(base.rollout_seqs),
            "rollout_seqs",
        )
    if not base.load_in_4bit:
        first("load_in_4bit", [True], "load_in_4bit")
    if base.reference == "copy":
        first("reference", ["shared"], "reference", " (the reference pass with the adapters off)")
    return fixes, details


def _text(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


__all__ = ["planned_fixes", "planned_setup"]
