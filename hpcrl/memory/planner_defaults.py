"""Fill in what the user left out of a memory question (learner GPUs, engine TP)."""

from __future__ import annotations

from hpcrl.errors import HpcrlError
from hpcrl.memory.colocated import Colocation, plan_colocated
from hpcrl.memory.engine import EngineSetup, engine_memory
from hpcrl.memory.learner import LearnerSetup, sync_modes
from hpcrl.memory.plan import MemoryPlan, plan_memory
from hpcrl.models import resolve_model
from hpcrl.profiles import ClusterProfile

MAX_LEARNER_GPUS = 1024


def smallest_fitting_tp(profile: ClusterProfile, engine: EngineSetup) -> int | None:
    """Smallest TP vLLM accepts for the model (within a node) whose engine fits, or None."""
    for tp in engine.model.tp_sizes(profile.gpu.count_per_node):
        candidate = EngineSetup(**{**engine.__dict__, "tp": tp, "gpu_total_bytes": profile.gpu_bytes})
        if engine_memory(candidate).fits:
            return tp
    return None


def choose_memory_plan(
    profile: ClusterProfile,
    *,
    model: str,
    learner_gpus: int | None,
    tokens_per_gpu: int,
    gradient_checkpointing: bool,
    offload: str,
    zero_stage: int,
    lora_rank: int,
    load_in_4bit: bool,
    logprob_impl: str,
    grad_accum_dtype: str,
    vllm_tp: int | None,
    vllm_gpu_memory_utilization: float,
    max_seq_len: int | None,
    colocation: Colocation | None = None,
    logits_copy: bool = True,
    weight_sync: str = "none",
) -> tuple[MemoryPlan, list[str]]:
    """The plan for the question asked, choosing learner GPUs and TP where not given.

    With `colocation`, every learner GPU also runs a vLLM engine (hpcrl/memory/colocated.py):
    the learner GPUs are all the GPUs, and both phases must fit."""
    spec = resolve_model(model)
    for name, value in (("--tokens-per-gpu", tokens_per_gpu), ("--learner-gpus", learner_gpus),
                        ("--vllm-tp", vllm_tp), ("--max-seq-len", max_seq_len)):
        if value is not None and value <= 0:
            raise HpcrlError(f"{name} must be a positive integer, got {value}")
    notes: list[str] = []
    engine = EngineSetup(
        model=spec,
        tp=vllm_tp or 1,
        gpu_memory_utilization=vllm_gpu_memory_utilization,
        gpu_total_bytes=profile.gpu_bytes,
        max_seq_len=max_seq_len or tokens_per_gpu,
    )
    if vllm_tp is None:
        tp = smallest_fitting_tp(profile, engine)
        if tp is None:
            tp = max(spec.tp_sizes(profile.gpu.count_per_node))
            notes.append(f"no TP within one node fits an engine; showing TP={tp}")
        else:
            notes.append(f"vLLM TP={tp}: the smallest that fits (set --vllm-tp to choose)")
        engine = EngineSetup(**{**engine.__dict__, "tp": tp})

    def setup(n: int, sync: str) -> LearnerSetup:
        return LearnerSetup(
            model=spec,
            n_gpus=n,
            tokens_per_gpu=tokens_per_gpu,
            zero_stage=zero_stage,  # type: ignore[arg-type]
            offload=offload,  # type: ignore[arg-type]
            gradient_checkpointing=gradient_checkpointing,
            lora_rank=lora_rank,
            load_in_4bit=load_in_4bit,
            logprob_impl=logprob_impl,  # type: ignore[arg-type]
            grad_accum_dtype=grad_accum_dtype,  # type: ignore[arg-type]
            logits_copy=logits_copy,
            weight_sync=sync,  # type: ignore[arg-type]
        )

    def fits(plan: MemoryPlan) -> bool:
        return plan.learner_fits and (colocation is None or plan.rollout_fits)  # type: ignore[attr-defined]

    def plan_for(n: int) -> MemoryPlan:
        for sync in sync_modes(weight_sync):
            if colocation is None:
                plan = plan_memory(profile, setup(n, sync), engine)
            else:
                plan = plan_colocated(profile, setup(n, sync), engine, colocation)
            if fits(plan):
                break
        return plan

    what = "GPUs (each trains and generates)" if colocation else "learner GPUs"

    def sync_note(plan: MemoryPlan) -> list[str]:
        if weight_sync != "auto":
            return []
        whole = plan.learner_setup.weight_sync == "whole_model"
        return [f"gather_whole_model {whole}: " + ("the whole model gathered for the weight sync fits" if whole else
                "gathering the whole model for the weight sync would not fit; one parameter at a time")]

    if learner_gpus is not None:
        plan = plan_for(learner_gpus)
        return plan, notes + sync_note(plan)
    n = 1
    while True:
        plan = plan_for(n)
        if fits(plan) or n >= MAX_LEARNER_GPUS or zero_stage != 3:
            break
        n *= 2
    if fits(plan):
        notes.append(f"{n} {what}: the fewest (power of two) that fit (set --learner-gpus to choose)")
    else:
        notes.append(f"no count of {what} up to {n} fits; showing {n}")
    return plan, notes + sync_note(plan)
