"""Fixes for an out-of-memory run, re-planned by hpcrl's planners and given in the backend's own keys (pure).

Which re-planning a run gets is its backend's DiagnoseFacts.learner_fixes:

* "deepspeed" (open-instruct; OpenRLHF's actor): the largest tokens per GPU, the fewest
  learner GPUs, or optimizer offload that the learner planner fits. Where the log's own figures
  show more demand than the planner predicts, every prediction is scaled by that ratio; figures
  that contradict the GPU's capacity are not used.
* "colocated" (verl: training and rollout share every GPU): the backend's own planner re-plans the
  micro-batch, FSDP offload and vLLM's share (as `hpcrl plan` does), keeping the rollout's TP.
* vLLM engines: the TP, memory share or sequence length that gives the KV cache room.
* "planned" (a user's HF/TRL-style script): hpcrl/logs/diagnose_custom.py.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hpcrl.logs.diagnose_context import Context
from hpcrl.memory import constants as C
from hpcrl.memory.engine import EngineSetup, engine_memory
from hpcrl.memory.learner import LearnerSetup, learner_memory
from hpcrl.memory.plan import LEARNER_HEADROOM

GIB = C.GIB


def learner_fixes(ctx: Context, capacity_gib: float, demand_gib: float | None) -> tuple[list[str], dict]:
    """Single changes that fit the learner step, by the planner, in the backend's keys."""
    if ctx.facts.learner_fixes == "colocated":
        return colocated_fixes(ctx, capacity_gib)
    if ctx.facts.learner_fixes == "planned":
        from hpcrl.logs.diagnose_custom import planned_fixes

        return planned_fixes(ctx, capacity_gib, demand_gib)
    return deepspeed_fixes(ctx, capacity_gib, demand_gib)


def _base(ctx: Context) -> LearnerSetup | None:
    spec = ctx.spec()
    if spec is None:
        return None
    if ctx.facts.values_from == "logged":
        return LearnerSetup(
            model=spec,
            n_gpus=ctx.get("learner_gpus"),
            tokens_per_gpu=ctx.get("tokens_per_gpu"),
            zero_stage=ctx.get("zero_stage"),
            grad_accum_dtype="fp32",
        )
    from hpcrl.planning.layout import _learner_setup

    w = ctx.workload()
    if w is None:
        return None
    s = _learner_setup(w, int(ctx.get("learner_gpus")))
    return replace(s, zero_stage=int(ctx.get("zero_stage")))  # type: ignore[arg-type]


def deepspeed_fixes(ctx: Context, capacity_gib: float, demand_gib: float | None) -> tuple[list[str], dict]:
    base = _base(ctx)
    if base is None:
        return [], {}
    now, limit = learner_memory(base), capacity_gib * GIB * (1 - LEARNER_HEADROOM)
    # Where the log shows more demand than predicted, scale every prediction by that ratio.
    scale = max(1.0, demand_gib * GIB / now.peak_allocated) if demand_gib else 1.0
    peak = lambda s: learner_memory(s).device_total * scale  # noqa: E731
    details = {
        "capacity_gib": round(capacity_gib, 2),
        "predicted_gib": round(now.device_total / GIB, 2),
        "scale_from_log": round(scale, 3),
        "limit_gib": round(limit / GIB, 2),
    }
    if peak(base) <= limit:  # the planner cannot reproduce the OOM: no change it proposes would be checked
        return [], {**details, "planner_fits": True}
    by_micro = ctx.facts.learner_batch == "micro_batch"  # whole sequences per micro-batch, GPUs in whole nodes
    fixes = []
    if by_micro:
        max_len, micro = int(ctx.arg("max_len")), int(ctx.arg("micro"))
        fit = next(
            (m for m in range(micro - 1, 0, -1) if peak(replace(base, tokens_per_gpu=m * max_len)) <= limit), None
        )
        if fit:
            fixes.append(
                f"{ctx.key('micro')} {micro} -> {fit} ({fit * max_len} tokens per GPU): predicted peak "
                f"{peak(replace(base, tokens_per_gpu=fit * max_len)) / GIB:.1f} GiB of {capacity_gib:.1f}"
            )
    else:
        lo, hi = 1, base.tokens_per_gpu // 256 - 1  # largest multiple of 256 below today's that fits
        while lo <= hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if peak(replace(base, tokens_per_gpu=mid * 256)) <= limit else (lo, mid - 1)
        if hi >= 1:
            fixes.append(
                f"{ctx.key('tokens')} {base.tokens_per_gpu} -> {hi * 256} (tokens per learner GPU): predicted peak "
                f"{peak(replace(base, tokens_per_gpu=hi * 256)) / GIB:.1f} GiB of {capacity_gib:.1f}"
            )
    step = int(ctx.arg("gpus")) if by_micro else 1
    n = next((n for n in range(base.n_gpus + step, 1025, step) if peak(replace(base, n_gpus=n)) <= limit), None)
    if n and base.zero_stage == 3:
        what = (
            f"{ctx.key('nodes')} {base.n_gpus // step} -> {n // step} ({n} actor GPUs of {ctx.key('gpus')} {step})"
            if by_micro
            else f"learner GPUs {base.n_gpus} -> {n} ({ctx.key('learners')})"
        )
        fixes.append(f"{what}: predicted peak {peak(replace(base, n_gpus=n)) / GIB:.1f} GiB")
    if base.offload == "none" and peak(off := replace(base, offload="optimizer")) <= limit:
        fixes.append(
            f"{ctx.key('offload')}{ctx.facts.switch_on}: predicted peak {peak(off) / GIB:.1f} GiB (check "
            "host RAM with `hpcrl plan-memory --offload optimizer`)"
        )
    return fixes, details


def colocated_fixes(ctx: Context, capacity_gib: float) -> tuple[list[str], dict]:
    """A colocated run: the backend's planner on it, the GPU as the log reports it, TP as the run had it."""
    from hpcrl.errors import HpcrlError
    from hpcrl.planning.backends import get_backend
    from hpcrl.planning.layout import Pins
    from hpcrl.planning.layout_colocated import colocated_memory, enumerate_colocated

    w = ctx.workload()
    if w is None or ctx.facts.learner_fixes != "colocated":
        return [], {}
    # A colocated backend's own planner and colocation (verl's): not on the Backend interface.
    backend: Any = get_backend(ctx.fix_backend)
    cfg = ctx.config()
    nodes, gpus = int(ctx.arg("nodes")), int(ctx.arg("gpus"))
    tp, util = int(ctx.arg("tp")), float(ctx.arg("util"))
    micro, po, oo = ctx.arg("micro"), bool(ctx.arg("param_offload")), bool(ctx.arg("offload"))
    prof = ctx.profile.model_copy(
        update={"gpu": ctx.profile.gpu.model_copy(update={"count_per_node": gpus, "memory_gib": capacity_gib})}
    )
    # The backend's reading of the micro-batch: its tokens and, for an FSDP learner, the micro-batches per step.
    wm = backend.learner_workload(cfg, w, nodes * gpus, int(micro) if micro else 0)
    now = colocated_memory(prof, nodes, wm, tp, util, backend.colocation(cfg, po, oo))
    details = {
        "capacity_gib": round(capacity_gib, 2),
        "predicted_training_gib": round(now.training_total / GIB, 2),
        "predicted_rollout_gib": round(now.rollout_total / GIB, 2),
        "gpus_per_node": gpus,
        "nodes": nodes,
    }
    ctx.note(
        f"GPU from the log ({capacity_gib:.2f} GiB, {gpus} per node from {ctx.key('gpus')}); host RAM per node "
        f"from profile {ctx.profile.name} (give --cluster)"
    )
    if now.learner_fits and now.rollout_fits:  # the planner cannot reproduce the OOM
        return [], {**details, "planner_fits": True}
    planned = {ctx.key("micro"): micro, ctx.key("param_offload"): po, ctx.key("offload"): oo, ctx.key("util"): util}
    free = {k: v for k, v in cfg.args.items() if k not in planned and k not in (ctx.key("nodes"), ctx.key("gpus"))}
    fixes: list[str] = []
    for label, pins in (
        ("", Pins(tp=tp)),
        (f" (keeping {ctx.key('util')} {util:g})", Pins(tp=tp, gpu_memory_utilization=util)),
    ):
        try:
            p = backend.plan(cfg.model_copy(update={"args": free}), prof, nodes, w, pins, [])
        except HpcrlError:
            continue
        lay = p.layouts[0]
        after = {**dict(p.choices), ctx.key("util"): lay.gpu_memory_utilization}
        diff = [f"{k} {_v(planned.get(k))} -> {_v(v)}" for k, v in after.items() if planned.get(k) != v]
        text = (
            ", ".join(diff)
            + label
            + (
                f": planner peak {lay.phased.training_total / GIB:.1f} GiB training, "
                f"{lay.phased.rollout_total / GIB:.1f} GiB rollout of {capacity_gib:.1f}"
            )
        )
        smaller = lay.phased.training_total < now.training_total
        if diff and smaller and not lay.inside_margin and not any(f.startswith(", ".join(diff)) for f in fixes):
            fixes.append(text)
    # More GPUs at today's micro-batch, offload and share (the mini-batch must divide over them).
    mini_seqs = int(ctx.config_value(ctx.key("mini"))) * int(ctx.config_value(ctx.key("samples")))
    for n in range(nodes + 1, nodes + 9):
        if micro and mini_seqs % (n * gpus * int(micro)):
            continue
        if enumerate_colocated(prof, n, wm, Pins(tp=tp, gpu_memory_utilization=util), backend.colocation(cfg, po, oo))[
            0
        ]:
            fixes.append(
                f"{ctx.key('nodes')} {nodes} -> {n} ({n * gpus} GPUs) at today's micro-batch, offload and "
                f"{ctx.key('util')}"
            )
            break
    return fixes, details


def _v(value: Any) -> str:
    return (
        str(value).lower()
        if isinstance(value, bool)
        else "unset"
        if value is None
        else f"{value:g}"
        if isinstance(value, float)
        else str(value)
    )


def engine_fixes(
    ctx: Context, capacity_gib: float, max_seq_len: int, seen_kv_gib: float | None = None
) -> tuple[list[str], dict]:
    """TP, gpu_memory_utilization or sequence length that give an engine room (shifted by the planner's
    error where vLLM reported its KV memory), in the backend's keys."""
    m = ctx.spec()
    if m is None:
        return [], {}
    base = EngineSetup(
        model=m,
        tp=int(ctx.get("vllm_tp")),
        gpu_memory_utilization=float(ctx.get("vllm_util")),
        gpu_total_bytes=capacity_gib * GIB,
        max_seq_len=max_seq_len,
    )
    now = engine_memory(base)
    offset = now.kv_cache - seen_kv_gib * GIB if seen_kv_gib is not None else 0.0

    def tokens(e: EngineSetup) -> int:
        em = engine_memory(e)
        return int(max(0.0, em.kv_cache - offset) // em.kv_bytes_per_token)

    details = {
        "capacity_gib": round(capacity_gib, 2),
        "tp": base.tp,
        "util": base.gpu_memory_utilization,
        "kv_tokens_now": tokens(base),
        "planner_offset_gib": round(offset / GIB, 2),
        "max_seq_len": max_seq_len,
    }
    fixes = []
    tps = [t for t in m.tp_sizes(ctx.profile.gpu.count_per_node) if t > base.tp]
    if tp := next((t for t in tps if tokens(replace(base, tp=t)) >= max_seq_len), None):
        fixes.append(f"{ctx.key('tp')} {base.tp} -> {tp}: {tokens(replace(base, tp=tp)):,} KV tokens")
    utils = [p / 100 for p in range(round(base.gpu_memory_utilization * 100) + 1, 96)]
    if u := next((u for u in utils if tokens(replace(base, gpu_memory_utilization=u)) >= max_seq_len), None):
        fixes.append(
            f"{ctx.key('util')} {base.gpu_memory_utilization} -> {u} (only if nothing else "
            f"shares the GPU): {tokens(replace(base, gpu_memory_utilization=u)):,} KV tokens"
        )
    if 0 < tokens(base) < max_seq_len:
        fixes.append(f"sequences (prompt + response) of at most {tokens(base):,} tokens at TP={base.tp}")
    return fixes, details


__all__ = ["colocated_fixes", "deepspeed_fixes", "engine_fixes", "learner_fixes"]
