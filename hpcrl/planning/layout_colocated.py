"""Colocated layouts: every GPU trains and generates in turn (verl's hybrid engine, OpenRLHF
`--train.colocate_all`).

Pure. There is one placement, so the only choices are the engines' tensor-parallel size
(dividing the attention heads and the GPUs of a node, so that engines tile every GPU) and
vLLM's `gpu_memory_utilization`: the highest that fits next to what the training side leaves
resident (hpcrl/memory/colocated.py), since a larger KV cache generates faster and costs
the training phase nothing while vLLM sleeps. Generation and training take turns, so a step
takes their sum.
"""

from __future__ import annotations

from dataclasses import replace

from hpcrl.errors import PlanError, would_fit
from hpcrl.planning.layout import (
    Layout,
    Pins,
    Workload,
    _learner_setup,
    engine_setup,
    generation_time,
    learner_band,
    rank,
)
from hpcrl.memory.colocated import Colocation, ColocatedPlan, plan_colocated
from hpcrl.planning.layout_advice import with_margin_note
from hpcrl.profiles import ClusterProfile

# vLLM shares the GPU with resident training state, so lower fractions than the dedicated
# engines' are worth trying.
COLOCATED_UTILISATIONS = (0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)


def colocated_tps(w: Workload, gpus_per_node: int) -> list[int]:
    """TP sizes vLLM accepts for the model that divide the node's GPUs (engines tile every GPU)."""
    return [d for d in w.model.tp_sizes(gpus_per_node) if gpus_per_node % d == 0]


def colocated_memory(
    profile: ClusterProfile,
    nodes: int,
    w: Workload,
    tp: int,
    util: float,
    colocation: Colocation,
    margin: bool = True,
    ray: bool = True,
) -> ColocatedPlan:
    """The memory plan of one colocated choice (`ray`: the job runs Ray on its nodes)."""
    n = nodes * profile.gpu.count_per_node
    engine = engine_setup(w, tp, util)
    return plan_colocated(profile, _learner_setup(w, n), engine, colocation, margin, ray)


def enumerate_colocated(
    profile: ClusterProfile,
    nodes: int,
    w: Workload,
    pins: Pins = Pins(),
    colocation: Colocation = Colocation(),
    margin: bool = True,
    ray: bool = True,
) -> tuple[list[Layout], dict[str, int]]:
    """Every colocated TP and utilisation that fits, ranked best first; and rejection counts."""
    w.check()
    g = profile.gpu.count_per_node
    if pins.learners_per_node or pins.learner_nodes or pins.engines:
        raise PlanError(
            "this layout is colocated (every GPU trains and generates): learners and engines "
            "follow from the GPUs; pin tp=N and util=F only"
        )
    tps = colocated_tps(w, g)
    if pins.tp is not None:
        if pins.tp not in tps:
            why: str | None = (
                w.model.tp_problem(pins.tp) or f"it must divide the {g} GPUs of a node (engines tile every GPU)"
            )
            raise PlanError(f"tensor-parallel size {pins.tp} cannot work: {why}; valid: {tps}")
        tps = [pins.tp]
    utils = [pins.gpu_memory_utilization] if pins.gpu_memory_utilization else list(COLOCATED_UTILISATIONS)
    rejected: dict[str, int] = {}
    layouts: list[Layout] = []
    for tp in tps:
        why = None
        for util in utils:
            plan = colocated_memory(profile, nodes, w, tp, util, colocation, margin, ray)
            if not plan.learner_fits:
                why = "training does not fit in GPU memory"
            elif not plan.host.fits:
                why = "host RAM over Ray's kill threshold" if ray else "host RAM over the node's RAM"
            elif not plan.rollout_fits:
                why = "resident training state leaves vLLM too little of the GPU"
            elif not plan.engine.fits:
                why = "vLLM engine does not fit (weights + KV for one sequence)"
            else:
                engines = nodes * g // tp
                layouts.append(
                    Layout(
                        nodes=nodes,
                        gpus_per_node=g,
                        learners_per_node=g,
                        learner_nodes=nodes,
                        tp=tp,
                        engines=engines,
                        gpu_memory_utilization=util,
                        memory=plan,
                        gen_time_s=generation_time(w, plan, profile, engines),
                        train_band=learner_band(w, plan, profile, g),
                        colocated=True,
                    )
                )
                why = None
                break
        if why:
            rejected[why] = rejected.get(why, 0) + 1
    return rank(layouts, exclusive=profile.job_gpus is None), rejected


def plan_colocated_layouts(
    profile: ClusterProfile,
    nodes: int,
    w: Workload,
    pins: Pins = Pins(),
    colocation: Colocation = Colocation(),
    offload_hint: str | None = None,
    ray: bool = True,
) -> list[Layout]:
    """Ranked colocated layouts; PlanError with computed suggestions when none fits (`ray`: the job runs
    Ray on its nodes, whose head needs host RAM of its own)."""
    layouts, rejected = enumerate_colocated(profile, nodes, w, pins, colocation, ray=ray)
    if layouts:
        return layouts
    why = max(rejected, key=lambda k: rejected[k]) if rejected else "no candidate layout"
    where = f"{nodes} {profile.name}{':' + profile.variant if profile.variant else ''} node{'s' if nodes > 1 else ''}"
    fixes = []
    for n in range(nodes + 1, max(nodes * 2, 64) + 1):
        if enumerate_colocated(profile, n, w, pins, colocation, ray=ray)[0]:
            # The same words as the separate layouts' fixes (layout_advice.suggest) for a job past the limits.
            over = profile.max_nodes is not None and n > profile.max_nodes
            fixes.append(f"--nodes {n}" + (" (over the partition/QOS node limit)" if over else ""))
            break
    offloaded = replace(colocation, param_offload=True, optimizer_offload=True)
    if offload_hint and offloaded != colocation and enumerate_colocated(profile, nodes, w, pins, offloaded, ray=ray)[0]:
        fixes.append(offload_hint)
    tight, _ = enumerate_colocated(profile, nodes, w, pins, colocation, margin=False, ray=ray)
    if tight:
        return with_margin_note(tight, fixes)
    raise would_fit(
        f"no colocated layout of {w.model.name} fits on {where} ({why})",
        tuple(fixes),
        none="nothing hpcrl tried fits (more nodes, offload)",
    )


__all__ = ["COLOCATED_UTILISATIONS", "colocated_tps", "enumerate_colocated", "plan_colocated_layouts"]
