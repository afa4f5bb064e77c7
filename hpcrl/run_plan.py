"""From a run config to a checked plan: profile, workload, pins and the chosen layout.

Shared by `plan`, `render` and `submit` so the three always agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcrl.config import RunConfig, load_run_config
from hpcrl.errors import HpcrlError, PlanError
from hpcrl.layout import Layout, Pins, Workload, check_nodes, enumerate_layouts, plan_layouts
from hpcrl.models import resolve_model
from hpcrl.profiles import ClusterProfile, resolve_profile


@dataclass(frozen=True)
class RunPlan:
    config: RunConfig
    profile: ClusterProfile
    nodes: int
    workload: Workload
    pins: Pins
    layouts: list[Layout]
    warnings: tuple[str, ...] = ()

    @property
    def layout(self) -> Layout:
        return self.layouts[0]


def workload_from_config(cfg: RunConfig, model: str | None = None) -> Workload:
    """The planner's view of a run config (open-instruct defaults where unset)."""
    from hpcrl.backends.oi_args import default

    layout = cfg.hpcrl.arg_layout

    def arg(name: str):
        return cfg.args[name] if name in cfg.args else default(name, layout)

    name = model or cfg.model_name
    if not name:
        raise HpcrlError("no model: set model_name_or_path in the config or pass --model")
    offload = "params" if arg("deepspeed_offload_param") else ("optimizer" if arg("deepspeed_offload_optimizer") else "none")
    return Workload(
        model=resolve_model(name),
        pack_length=int(arg("pack_length")),
        response_length=int(arg("response_length")),
        max_prompt_token_length=int(arg("max_prompt_token_length")),
        unique_prompts=int(arg("num_unique_prompts_rollout")),
        samples_per_prompt=int(arg("num_samples_per_prompt_rollout")),
        beta=float(arg("beta")),
        load_ref_policy=bool(arg("load_ref_policy")),
        gradient_checkpointing=bool(arg("gradient_checkpointing")),
        offload=offload,
        lora_rank=int(arg("lora_r") or 0) if arg("use_peft") else 0,
        load_in_4bit=bool(arg("load_in_4bit")),
        logprob_impl=cfg.hpcrl.logprob_impl,
        hpz_partition_size=int(arg("deepspeed_zpg")),
    )


def pins_from(cfg: RunConfig, cli_pins: list[str] | None = None) -> Pins:
    """Pins from pinned config fields and `--pin key=value` (learners, learner_nodes, tp, engines, util)."""
    values: dict = {}
    a = cfg.args
    if "num_learners_per_node" in cfg.pinned:
        entries = a["num_learners_per_node"]
        entries = entries if isinstance(entries, list) else [entries]
        nonzero = [int(e) for e in entries if int(e) > 0]
        if not nonzero or len(set(nonzero)) != 1:
            raise PlanError(
                f"num_learners_per_node {entries}: hpcrl plans equal learner counts per node; "
                "give the same non-zero count for each learner node, e.g. [1, 1, 1, 1]"
            )
        values["learners_per_node"], values["learner_nodes"] = nonzero[0], len(nonzero)
    if "vllm_tensor_parallel_size" in cfg.pinned:
        values["tp"] = int(a["vllm_tensor_parallel_size"])
    if "vllm_num_engines" in cfg.pinned:
        values["engines"] = int(a["vllm_num_engines"])
    if "vllm_gpu_memory_utilization" in cfg.pinned:
        values["gpu_memory_utilization"] = float(a["vllm_gpu_memory_utilization"])
    if "deepspeed_stage" in cfg.pinned and int(a["deepspeed_stage"]) != 3:
        raise PlanError(f"deepspeed_stage {a['deepspeed_stage']}: hpcrl plans ZeRO-3 learners; valid: 3")
    names = {"learners": "learners_per_node", "learner_nodes": "learner_nodes", "tp": "tp",
             "engines": "engines", "util": "gpu_memory_utilization"}
    for item in cli_pins or []:
        key, sep, raw = item.partition("=")
        if not sep or key not in names:
            raise HpcrlError(f"--pin {item!r}: expected one of {', '.join(k + '=N' for k in names)}")
        try:
            values[names[key]] = float(raw) if key == "util" else int(raw)
        except ValueError:
            raise HpcrlError(f"--pin {item!r}: {raw!r} is not a number") from None
    return Pins(**values)


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
) -> RunPlan:
    """Load the config, resolve the cluster and plan layouts, raising on anything that won't work."""
    cfg = load_run_config(config, sets)
    profile = resolve_profile(cluster or cfg.hpcrl.cluster, cluster_file)
    n = nodes or cfg.hpcrl.nodes
    if not n:
        raise HpcrlError("number of nodes not given: pass --nodes N or set hpcrl.nodes in the config")
    warnings = check_nodes(profile, n, cfg.hpcrl.partition, allow_over_limit or cfg.hpcrl.allow_over_limit)
    w = workload_from_config(cfg, model)
    p = pins_from(cfg, pins)
    variants = []
    if profile.variants:
        for v in profile.variants:
            if v != profile.variant:
                variants.append(resolve_profile(cluster or cfg.hpcrl.cluster, cluster_file, variant=v))
    layouts = plan_layouts(profile, n, w, p, variants)
    return RunPlan(cfg, profile, n, w, p, layouts, tuple(warnings))


__all__ = ["RunPlan", "enumerate_layouts", "make_run_plan", "pins_from", "workload_from_config"]
