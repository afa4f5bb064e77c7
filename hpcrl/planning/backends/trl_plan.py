"""TRL's layouts: one `trl vllm-serve` beside `accelerate launch` learners (server mode), or every GPU a
learner with vLLM inside its process (colocate mode). Pure.

Server mode (TRL's multi-node recipe): the trainer talks to one server (`vllm_server_host`/`_port`, or
`vllm_server_base_url`; trl/generation/vllm_generation.py:300-309), so one node runs `trl vllm-serve` with
TP x DP of its GPUs (DP above 1 for MoE models only, trl/scripts/vllm_serve.py:39-40) and the other nodes run
the learners, k per node. On a single node the server takes TP GPUs and the learners the rest (TRL's
single-node example). The learners' batch sets the rollout: a step generates
per_device_train_batch_size x learners x steps_per_generation completions (GRPOConfig.__post_init__,
trl/trainer/grpo_config.py:1110-1128), num_generations per prompt.
"""

from __future__ import annotations

from collections.abc import Mapping

from dataclasses import replace

from hpcrl.errors import PlanError, would_fit
from hpcrl.memory.colocated import Colocation
from hpcrl.planning.layout import (
    UTILISATIONS,
    Layout,
    Pins,
    Workload,
    _learner_setup,
    engine_setup,
    generation_time,
    learner_band,
    rank,
)
from hpcrl.memory.plan import plan_memory
from hpcrl.planning.layout_advice import with_margin_note
from hpcrl.planning.layout_colocated import plan_colocated_layouts
from hpcrl.profiles import ClusterProfile


def step_workload(w: Workload, learners: int, batch: int, per_generation: int, generations: int) -> Workload:
    """One optimizer step's workload with `learners` processes: TRL's generation batch, checked as TRL checks it."""
    total = batch * learners * per_generation
    if total % generations:
        raise PlanError(
            f"per_device_train_batch_size {batch} x {learners} learner processes x steps_per_generation "
            f"{per_generation} = {total} completions per step, not divisible by num_generations "
            f"{generations} (GRPOConfig checks this, trl/trainer/grpo_config.py:1121-1125); change the "
            "batch or num_generations"
        )
    return replace(w, unique_prompts=total // generations, samples_per_prompt=generations)


def server_tps(w: Workload, g: int, pinned: int | None, dp: int) -> list[int]:
    """TP sizes vLLM accepts for the model with TP x DP GPUs of one node."""
    tps = [t for t in w.model.tp_sizes(g) if t * dp <= g]
    if pinned is not None:
        if pinned not in tps:
            why = (
                w.model.tp_problem(pinned) or f"tensor_parallel_size x data_parallel_size must fit one node of {g} GPUs"
            )
            raise PlanError(f"vllm_serve.tensor_parallel_size {pinned} cannot work: {why}; valid: {tps}")
        return [pinned]
    return tps


def plan_server(
    profile: ClusterProfile,
    nodes: int,
    w: Workload,
    pins: Pins,
    batch: int,
    per_generation: int,
    generations: int,
    dp: int,
    passes: int,
    margin: bool = True,
) -> tuple[list[Layout], dict[str, int]]:
    """Every server-mode layout that fits, ranked; and rejection counts."""
    g = profile.gpu.count_per_node
    cap = min(g, profile.planning.max_learners_per_node or g)
    single = nodes == 1
    m = 1 if single else nodes - 1
    if pins.learner_nodes is not None and pins.learner_nodes != m:
        raise PlanError(
            f"--pin learner_nodes={pins.learner_nodes}: in server mode one node runs trl vllm-serve and "
            f"the other {m} the learners; valid: {m}"
        )
    rejected: dict[str, int] = {}
    layouts: list[Layout] = []
    utils = [pins.gpu_memory_utilization] if pins.gpu_memory_utilization else list(UTILISATIONS)
    for tp in server_tps(w, g, pins.tp, dp):
        top = g - tp * dp if single else cap
        ks = [pins.learners_per_node] if pins.learners_per_node else list(range(1, min(top, cap) + 1))
        for k in ks:
            if k < 1 or k > (g - tp * dp if single else g):
                raise PlanError(
                    f"--pin learners={k}: valid: 1 to {g - tp * dp if single else g} on "
                    f"{'the node beside the server' if single else 'each learner node'}"
                )
            ws = step_workload(w, k * m, batch, per_generation, generations)
            learner = _learner_setup(ws, k * m)
            for util in utils:
                plan = plan_memory(
                    profile,
                    learner,
                    engine_setup(ws, tp, util),
                    learners_per_node=k,
                    engine_gpus_per_node=tp * dp if single else 0,
                    margin=margin,
                    ray=False,
                )
                if not plan.learner_fits:
                    why = "learner does not fit in GPU memory"
                    rejected[why] = rejected.get(why, 0) + 1
                    break
                if not plan.host.fits:
                    rejected["host RAM over the node's limit"] = rejected.get("host RAM over the node's limit", 0) + 1
                    break
                if plan.engine.fits:
                    layouts.append(
                        Layout(
                            nodes=nodes,
                            gpus_per_node=g,
                            learners_per_node=k,
                            learner_nodes=m,
                            tp=tp,
                            engines=dp,
                            gpu_memory_utilization=util,
                            memory=plan,
                            gen_time_s=generation_time(ws, plan, profile, dp),
                            train_band=learner_band(ws, plan, profile, k, passes),
                        )
                    )
                    break
            else:
                rejected["vLLM server does not fit (weights + KV for one sequence)"] = (
                    rejected.get("vLLM server does not fit (weights + KV for one sequence)", 0) + 1
                )
    return rank(layouts, exclusive=profile.job_gpus is None), rejected


def plan_server_layouts(
    profile: ClusterProfile,
    nodes: int,
    w: Workload,
    pins: Pins,
    batch: int,
    per_generation: int,
    generations: int,
    dp: int,
    passes: int,
    fixes: Mapping[str, str | None],
) -> list[Layout]:
    """Ranked server-mode layouts; PlanError naming what would fit when none does."""
    layouts, rejected = plan_server(profile, nodes, w, pins, batch, per_generation, generations, dp, passes)
    if layouts:
        return layouts
    why = max(rejected, key=lambda k: rejected[k]) if rejected else "no candidate layout"
    found = []
    for text, offload in ((fixes["offload_optimizer"], "optimizer"), (fixes["offload_params"], "params")):
        if text is None:
            continue
        more = w.offload == "none" or (offload == "params" and w.offload == "optimizer")
        if (
            more
            and plan_server(
                profile, nodes, replace(w, offload=offload), pins, batch, per_generation, generations, dp, passes
            )[0]
        ):
            found.append(text)
            break
    for n in range(nodes + 1, max(2 * nodes, nodes + 8) + 1):
        if plan_server(profile, n, w, pins, batch, per_generation, generations, dp, passes)[0]:
            found.append(f"--nodes {n}")
            break
    tight, _ = plan_server(profile, nodes, w, pins, batch, per_generation, generations, dp, passes, margin=False)
    if tight:
        return with_margin_note(tight, found)
    raise would_fit(
        f"no server-mode layout of {w.model.name} fits on {nodes} {profile.name} node"
        f"{'s' if nodes > 1 else ''} ({why})",
        tuple(found),
        none="nothing hpcrl tried fits (more nodes, offload)",
    )


def plan_colocate(
    profile: ClusterProfile,
    nodes: int,
    w: Workload,
    pins: Pins,
    batch: int,
    per_generation: int,
    generations: int,
    sleeps: bool,
    hint: str | None,
) -> list[Layout]:
    """Colocate mode: every GPU a learner process with its in-process vLLM (hpcrl/memory/colocated.py)."""
    n = nodes * profile.gpu.count_per_node
    ws = step_workload(w, n, batch, per_generation, generations)
    # TRL's colocated engine: max_num_seqs = batch x TP x steps_per_generation (grpo_trainer.py:1124-1126), 4096
    # batched tokens (vllm_generation.py:359); TP is planned, so the larger of the choices bounds the sequences.
    seqs = batch * profile.gpu.count_per_node * per_generation
    ws = replace(ws, vllm=replace(ws.vllm, max_num_seqs=max(1, seqs), max_num_batched_tokens=4096))
    colocation = Colocation(
        param_offload=False, optimizer_offload=False, grads_resident=True, vllm_sleeps=sleeps, sleep_level=2
    )
    return plan_colocated_layouts(profile, nodes, ws, pins, colocation, hint, ray=False)  # TRL runs no Ray


__all__ = ["plan_colocate", "plan_server", "plan_server_layouts", "server_tps", "step_workload"]
