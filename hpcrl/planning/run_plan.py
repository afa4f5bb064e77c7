"""From a run config to a checked plan: profile, workload, pins and the chosen layout.

Shared by `plan`, `render` and `submit` so the three always agree.
"""

from __future__ import annotations

from dataclasses import replace

from hpcrl.planning import walltime
from hpcrl.planning.backends import get_backend
from hpcrl.planning.backends.base import Backend
from hpcrl.planning.cadence import Cadence, risk_warning, run_cadence
from hpcrl.planning.layout import Layout, Pins, Workload, enumerate_layouts
from hpcrl.planning.inputs import RunInputs, resolve_inputs
from hpcrl.planning.layout_advice import idle_gpus_warning
from hpcrl.planning.resume import no_resume_reason, no_resume_warning
from hpcrl.planning.run_types import HpcrlSection, RunConfig, RunPlan
from hpcrl.profiles import ClusterProfile


def workload_from_config(cfg: RunConfig, model: str | None = None) -> Workload:
    """The planner's view of a run config (the backend's defaults where unset)."""
    w: Workload = get_backend(cfg.hpcrl.backend).workload_from_config(cfg, model)
    return w


def pins_from(cfg: RunConfig, cli_pins: list[str] | None = None) -> Pins:
    """Pins from pinned config fields and `--pin key=value` (learners, learner_nodes, tp, engines, util)."""
    pins: Pins = get_backend(cfg.hpcrl.backend).pins_from(cfg, cli_pins)
    return pins


# A GPU that computes a fraction f of the time averages about idle + f x (busy - idle) watts.
# With an A100's ~60 W idle and ~350 W busy (assumed, not measured here), a 100 W rule needs
# f >= ~0.15; warn under 0.25 to leave room for the step-time estimate's own error.
IDLE_RISK_BUSY_FRACTION = 0.25


def idle_rule_risk(profile: ClusterProfile, lay: Layout) -> list[str]:
    """A warning when, by the step estimate, learner or engine GPUs mostly wait on a cluster
    that cancels jobs whose GPUs average too little power."""
    rule = profile.idle_gpu_policy
    if rule is None or lay.colocated or lay.step_time_s <= 0:
        return []
    busy = {"learner": (lay.step.training_s, "training"), "engine": (lay.step.generation_s, "generation")}
    low = [(role, t, what) for role, (t, what) in busy.items() if t / lay.step_time_s < IDLE_RISK_BUSY_FRACTION]
    if not low:
        return []
    role, t, what = low[0]
    return [
        f"{profile.name} cancels jobs whose GPUs average under {rule.min_mean_power_w:g} W after "
        f"{rule.grace_minutes:g} min: by the step estimate the {role} GPUs work {t / lay.step_time_s:.0%} of "
        f"each step ({what} {t:.0f} s of {lay.step_time_s:.0f} s) and may average under it; balance the roles "
        f"(--pin learners=N, --pin engines=N) and watch the GPU monitor's idle_risk warning"
    ]


def unconfirmed_in_script(profile: ClusterProfile, hp: HpcrlSection) -> list[str]:
    """One warning naming the unconfirmed profile facts a rendered script would use as they are."""
    slurm = profile.slurm
    partition = hp.partition or slurm.default_partition
    used = []
    if not hp.partition and slurm.default_partition and profile.is_unconfirmed("slurm.default_partition"):
        used.append(f"--partition={slurm.default_partition} (hpcrl.partition)")
    if not hp.time and partition and profile.is_unconfirmed(f"slurm.partitions.{partition}.max_time"):
        used.append("--time from the partition's limit (hpcrl.time)")
    if profile.is_unconfirmed("slurm.gpu_request"):
        used.append(f"the GPU request style {slurm.gpu_request} (a user profile's slurm.gpu_request)")
    if slurm.constraint and profile.is_unconfirmed("slurm.constraint"):
        used.append(f"--constraint={slurm.constraint} (slurm.constraint)")
    if not hp.run_root and profile.is_unconfirmed("storage.run_root.path"):
        used.append(f"the run root {profile.storage.run_root.path} (hpcrl.run_root)")
    if not used:
        return []
    return [
        f"{profile.name}: the script uses unconfirmed profile facts: {'; '.join(used)}; check them "
        f"(hpcrl clusters show {profile.name}) or set what is in brackets"
    ]


def make_run_plan(
    config: str | None = None,
    *,
    nodes: int | None = None,
    cluster: str | None = None,
    cluster_file: str | None = None,
    model: str | None = None,
    sets: list[str] | None = None,
    pins: list[str] | None = None,
    allow_over_limit: bool = False,
    gpus: int | None = None,
) -> RunPlan:
    """Load the config, resolve the cluster and plan layouts, raising on anything that won't work."""
    inputs = resolve_inputs(
        config,
        nodes=nodes,
        cluster=cluster,
        cluster_file=cluster_file,
        sets=sets,
        gpus=gpus,
        allow_over_limit=allow_over_limit,
    )
    return plan_run(inputs, model=model, pins=pins)


def plan_run(inputs: RunInputs, *, model: str | None = None, pins: list[str] | None = None) -> RunPlan:
    """The checked plan of resolved inputs (`model`: a what-if on another model than the config's)."""
    cfg, profile, backend, n = inputs.config, inputs.profile, inputs.backend, inputs.nodes
    warnings = list(inputs.warnings)
    w = backend.workload_from_config(cfg, model)
    p = backend.pins_from(cfg, pins)
    planned = backend.plan(cfg, profile, n, w, p, list(inputs.other_node_types))
    warnings += unconfirmed_in_script(profile, cfg.hpcrl)
    if planned.layouts:
        warnings += list(planned.layouts[0].notes)
        warnings += (
            []
            if planned.idle_explained
            else idle_gpus_warning(planned.layouts, backend.pin_keys.get("engines", "engines"))
        )
        warnings += idle_rule_risk(profile, planned.layouts[0])
    services = backend.services(cfg)  # refuses a service the config asks for but cannot have
    if not profile.slurm.exclusive:
        for service in services:
            warnings.append(
                f"{service.name} runs code for whoever reaches 127.0.0.1 on its node, and {profile.name}'s "
                "jobs are not exclusive: another user on a shared node could use it; ask for whole "
                "nodes, or set hpcrl.code_server: off and point code_api_url at a server of your own"
            )
    if cfg.hpcrl.container and n > 1 and profile.container.multi_node_note:
        warnings.append(f"{profile.name}: {profile.container.multi_node_note}")
    cap = profile.planning.max_learners_per_node
    if cap and planned.layouts and planned.layouts[0].learners_per_node > cap:
        placed = (
            f"; {planned.cap_note}"
            if planned.cap_note
            else f"; {backend.fills_learner_nodes}: hpcrl cannot plan fewer"
            if backend.fills_learner_nodes
            else ""
        )
        warnings.append(
            f"{planned.layouts[0].learners_per_node} learners per node on {profile.name}, where the profile "
            f"plans at most {cap}: {profile.planning.why or 'see the profile'}{placed}"
        )
    choices = dict(planned.choices)
    cad, cad_warnings = checkpoint_cadence(
        backend, cfg, profile, planned.workload or w, planned.layouts[0], inputs.wall_time
    )
    if not cad.pinned:
        choices[backend.checkpoint_key] = cad.every_steps
    rp = RunPlan(
        cfg,
        profile,
        n,
        planned.workload or w,
        p,
        planned.layouts,
        tuple(warnings) + planned.warnings + tuple(cad_warnings),
        tuple(choices.items()),
        cad,
        assumptions=(inputs.assumed,) if inputs.assumed else (),
        framework=inputs.framework,
    )
    reason = no_resume_reason(rp)
    return replace(rp, warnings=rp.warnings + (no_resume_warning(reason),), no_resume=reason) if reason else rp


def checkpoint_cadence(
    backend: Backend, cfg: RunConfig, profile: ClusterProfile, w: Workload, lay: Layout, wall: str | None
) -> tuple[Cadence, list[str]]:
    """The checkpoint interval (hpcrl.max_lost_minutes of the step estimate, unless pinned) and the
    time-limit warning's lead time within the job's wall time; warnings for a pinned interval
    that risks more, or none."""
    key, hp = backend.checkpoint_key, cfg.hpcrl
    pinned = cfg.args.get(key)
    cad = run_cadence(
        lay.step,
        hp.max_lost_minutes,
        profile,
        w.model,
        w.lora_rank,
        int(pinned) if isinstance(pinned, int) and pinned > 0 else None,
    )
    warnings = risk_warning(cad, key, hp.max_lost_minutes)
    # The warning may take at most half the job (a 5-minute test job would be warned at its start).
    half = walltime.seconds(wall) // 2 if wall else None
    if half is not None and cad.lead_s > half:
        capped = max(half, 30)
        warnings.append(
            f"a wall time of {wall} leaves no room for a step (~{cad.upper_s:.0f} s, upper estimate) and a checkpoint "
            f"write (~{cad.write_s:.0f} s) before its end: the time-limit warning comes {capped} s "
            f"before it, not {cad.lead_s}; a longer hpcrl.time saves the last checkpoint"
        )
        cad = replace(cad, lead_s=capped)
    return cad, warnings


__all__ = ["RunPlan", "enumerate_layouts", "make_run_plan", "pins_from", "plan_run", "workload_from_config"]
