"""Layout planner: learners per node, vLLM engines, TP and memory utilisation for N nodes.

Pure: a profile, a node count and a workload in; ranked layouts out. A layout is kept when
it satisfies open-instruct's placement rules and fits in memory; layouts are ranked by the
estimated time of one RL step (planning/layout_rank.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from collections.abc import Iterator
from typing import Any, Protocol, cast

from hpcrl.errors import HpcrlError, PlanError
from hpcrl.memory import constants as C
from hpcrl.memory.engine import EngineSetup
from hpcrl.memory.learner import LearnerSetup, sync_modes
from hpcrl.memory.plan import MemoryPlan, learner_fits, plan_memory
from hpcrl.memory.sharding import ZERO, Sharding
from hpcrl.memory.vllm_accounting import VllmEngineFacts, default_engine
from hpcrl.models.spec import ModelSpec
from hpcrl.planning.engine_time import engine_work
from hpcrl.planning.generation import generation_seconds
from hpcrl.planning.layout_rank import rank as rank  # re-exported: layout_colocated and trl_plan rank by it
from hpcrl.planning.step_time import Band, StepEstimate, combine, generation_band, training_band
from hpcrl.profiles import ClusterProfile


class PhasedMemory(Protocol):
    """A colocated layout's memory plan (memory.colocated.ColocatedPlan, memory.hf_plan.HfPlan): each GPU
    trains and generates, checked phase by phase."""

    @property
    def training_total(self) -> float: ...
    @property
    def rollout_total(self) -> float: ...
    @property
    def peak_device(self) -> float: ...
    def colocated_summary(self) -> str: ...


# Stated efficiencies of the throughput model (not measured by hpcrl; see docs/plan.md).
UTILISATIONS = (0.9, 0.85, 0.8, 0.7, 0.6)


# FSDP micro-batches per optimizer step when nothing says (an assumption plan-memory prints).
DEFAULT_MICRO_BATCHES = 2


@dataclass(frozen=True)
class Workload:
    """What one RL step does, from the run config."""

    model: ModelSpec
    pack_length: int = 10240
    response_length: int = 8192
    max_prompt_token_length: int = 2048
    unique_prompts: int = 32
    samples_per_prompt: int = 8
    beta: float = 0.0
    load_ref_policy: bool = False
    gradient_checkpointing: bool = True
    offload: str = "none"
    lora_rank: int = 0
    load_in_4bit: bool = False
    logprob_impl: str = "compiled"
    grad_accum_dtype: str = "fp32"  # open-instruct's DeepSpeed config sets fp32
    hpz_partition_size: int = 8  # open-instruct's --deepspeed_zpg
    logits_copy: bool = True  # open-instruct divides the logits by the temperature out of place
    # The learner -> vLLM weight sync: "auto" (whole model at once where it fits, else one
    # parameter at a time: the framework's choice left to the planner), a pinned
    # "whole_model" or "per_param", or "none" (not modelled).
    weight_sync: str = "none"
    # The learner's sharding as the framework runs it (its backend hands the strategy over: ZERO or FSDP),
    # FSDP's micro-batches per optimizer step on one GPU (None: the assumed 2) and version.
    sharding: Sharding = ZERO
    micro_batches: int | None = None
    fsdp_version: int = 1
    # The vLLM the framework installs and its scheduler sizes (the backend's MemoryFacts.vllm).
    vllm: VllmEngineFacts = field(default_factory=default_engine)
    # LearnerSetup fields the framework's learner fixes (its backend's MemoryFacts.learner), as pairs.
    learner_fixed: tuple[tuple[str, Any], ...] = ()

    @property
    def seqs(self) -> int:
        return self.unique_prompts * self.samples_per_prompt

    @property
    def seq_len(self) -> int:
        return self.max_prompt_token_length + self.response_length

    def check(self) -> None:
        """open-instruct's own constraints on these settings."""
        for name in (
            "pack_length",
            "response_length",
            "max_prompt_token_length",
            "unique_prompts",
            "samples_per_prompt",
        ):
            if getattr(self, name) <= 0:
                raise HpcrlError(f"{name} must be positive, got {getattr(self, name)}")
        if self.pack_length < self.seq_len:
            raise HpcrlError(
                f"pack_length {self.pack_length} is shorter than max_prompt_token_length "
                f"{self.max_prompt_token_length} + response_length {self.response_length} = {self.seq_len}; "
                f"set pack_length >= {self.seq_len}"
            )
        if self.beta != 0 and not self.load_ref_policy:
            raise HpcrlError(
                f"beta {self.beta} needs a reference policy but load_ref_policy is false; "
                "set beta=0.0 or load_ref_policy=true"
            )


@dataclass(frozen=True)
class Pins:
    """Choices the user fixed (`--pin learners=1 --pin tp=2`, or values in the config)."""

    learners_per_node: int | None = None
    learner_nodes: int | None = None
    tp: int | None = None
    engines: int | None = None
    gpu_memory_utilization: float | None = None
    # The framework's config key of each choice (field -> key), so that a refusal names what the user wrote.
    keys: tuple[tuple[str, str], ...] = ()

    def key(self, choice: str, words: str) -> str:
        """The framework's key for `choice` (a field above), else `words`."""
        return dict(self.keys).get(choice, words)


@dataclass(frozen=True)
class Layout:
    nodes: int
    gpus_per_node: int
    learners_per_node: int
    learner_nodes: int
    tp: int
    engines: int
    gpu_memory_utilization: float
    memory: MemoryPlan
    gen_time_s: float
    train_band: Band  # the learners' seconds per RL step (step_time.training_band)
    notes: tuple[str, ...] = field(default=())
    weight_sync: str = "none"  # the learner's weight-sync mode the plan chose (LearnerSetup.weight_sync)
    # Every GPU trains and generates in turn (memory is a ColocatedPlan): no GPU is idle and
    # generation and training add up instead of overlapping.
    colocated: bool = False
    gen_basis: str = ""  # what the generation time rests on, where not the vLLM model (a custom generate)

    @property
    def train_time_s(self) -> float:
        return self.train_band.mid_s

    @property
    def generation(self) -> Band:
        """The engines' seconds per step with the vLLM model's held-out band (planning/generation.py)."""
        return generation_band(self.gen_time_s, self.gen_basis)

    @property
    def step(self) -> StepEstimate:
        return combine(self.generation, self.train_band, self.colocated)

    @property
    def learner_gpus(self) -> int:
        return self.learners_per_node * self.learner_nodes

    @property
    def idle_gpus(self) -> int:
        if self.colocated:
            return 0
        return self.nodes * self.gpus_per_node - self.learner_gpus - self.engines * self.tp

    @property
    def step_time_s(self) -> float:
        return self.step.mid_s

    @property
    def bottleneck(self) -> str:
        return "generation" if self.step.generation_s >= self.step.training_s else "training"

    @property
    def inside_margin(self) -> bool:
        """Chosen without the allocator margin (nothing fit with it): a warning, not a plan that fits."""
        return self.memory.margin == 0 and self.memory.inside_margin

    @property
    def phased(self) -> PhasedMemory:
        """The memory plan of a colocated layout, by phase."""
        return cast(PhasedMemory, self.memory)

    @property
    def learner_headroom(self) -> float:
        peak = self.phased.peak_device if self.colocated else self.memory.learner.device_total
        return 1 - peak / self.memory.usable

    @property
    def learners(self) -> list[int]:
        """Learners on each learner node."""
        return [self.learners_per_node] * self.learner_nodes

    @property
    def zero_stage(self) -> int:
        return self.memory.learner_setup.zero_stage

    @property
    def whole_model_sync(self) -> bool | None:
        """Whether the weight sync gathers the whole model at once (None: the sync is not modelled)."""
        return self.weight_sync == "whole_model" if self.weight_sync in ("whole_model", "per_param") else None

    def reason(self) -> str:
        st = self.step
        if self.colocated:
            return (
                f"colocated: every GPU trains and generates; step ~{self.step_time_s:.0f}s = generation "
                f"{st.generation_s:.0f}s + training {st.training_s:.0f}s (range {st.low_s:.0f}-{st.high_s:.0f}s)"
            )
        idle = "no idle GPU" if self.idle_gpus == 0 else f"{self.idle_gpus} idle GPUs"
        return (
            f"{idle}; step ~{self.step_time_s:.0f}s (range {st.low_s:.0f}-{st.high_s:.0f}s) set by {self.bottleneck} "
            f"(generation {st.generation_s:.0f}s, training {st.training_s:.0f}s)"
        )

    def to_dict(self) -> dict[str, Any]:
        g, mem, st = C.GIB, self.memory, self.step
        # The layout's first fields (`plan --json`, plan.json; docs/plan.md): named after open-instruct's arguments
        # when it was the only backend, and kept so for every backend, a schema of hpcrl's own. What a framework
        # is passed is its backend's (layout_args).
        sync = self.whole_model_sync
        return (
            {
                "num_learners_per_node": self.learners,
                "vllm_num_engines": self.engines,
                "vllm_tensor_parallel_size": self.tp,
                "vllm_gpu_memory_utilization": self.gpu_memory_utilization,
                "deepspeed_stage": self.zero_stage,
            }
            | ({"gather_whole_model": sync} if sync is not None else {})
            | {
                "nodes": self.nodes,
                "learner_gpus": self.learner_gpus,
                "engine_gpus": self.engines * self.tp,
                "idle_gpus": self.idle_gpus,
                "learner_peak_gib": round(mem.learner.device_total / g, 2),
                "engine_kv_cache_gib": round(mem.engine.kv_cache / g, 2),
                "engine_concurrent_seqs": mem.engine.concurrent_seqs,
                "engine_vllm": {
                    "version": mem.engine.vllm_version,
                    "max_num_seqs": mem.engine.max_num_seqs,
                    "max_num_batched_tokens": mem.engine.batched_tokens,
                },
                "host_peak_gib": round(mem.host.peak / g, 1),
                "gpu_usable_gib": round(mem.usable / g, 2),
                "generation_time_s": round(st.generation_s, 1),
                "generation_time_low_s": round(self.generation.low_s, 1),
                "generation_time_high_s": round(self.generation.high_s, 1),
                "generation_time_basis": self.generation.basis,
                "training_time_s": round(st.training_s, 1),
                "step_time_s": round(st.mid_s, 1),
                "step_time_low_s": round(st.low_s, 1),
                "step_time_high_s": round(st.high_s, 1),
                "step_time_basis": st.basis,
                "bottleneck": self.bottleneck,
                "reason": self.reason(),
            }
            | (self._colocated_dict() if self.colocated else {})
        )

    def _colocated_dict(self) -> dict[str, Any]:
        # Only on colocated layouts, so the other layouts' schema is unchanged.
        g = C.GIB
        return {
            "colocated": True,
            "training_peak_gib": round(self.phased.training_total / g, 2),
            "rollout_peak_gib": round(self.phased.rollout_total / g, 2),
        }


def engine_setup(w: Workload, tp: int, util: float) -> EngineSetup:
    """One engine of the run as its framework's vLLM builds it (version and scheduler sizes from the backend)."""
    return EngineSetup(
        model=w.model,
        tp=tp,
        gpu_memory_utilization=util,
        max_seq_len=w.seq_len,
        max_num_batched_tokens=w.vllm.max_num_batched_tokens,
        max_num_seqs=w.vllm.max_num_seqs,
        enforce_eager=w.vllm.enforce_eager,
        vllm_version=w.vllm.version,
        logprobs_mode=w.vllm.logprobs_mode,
    )


def _learner_setup(w: Workload, n: int, weight_sync: str = "none") -> LearnerSetup:
    return LearnerSetup(
        model=w.model,
        n_gpus=n,
        tokens_per_gpu=w.pack_length,
        zero_stage=3,
        offload=w.offload,  # type: ignore[arg-type]
        gradient_checkpointing=w.gradient_checkpointing,
        lora_rank=w.lora_rank,
        load_in_4bit=w.load_in_4bit,
        logprob_impl=w.logprob_impl,  # type: ignore[arg-type]
        grad_accum_dtype=w.grad_accum_dtype,  # type: ignore[arg-type]
        reference_policy=w.load_ref_policy,
        hpz_partition_size=w.hpz_partition_size,
        logits_copy=w.logits_copy,
        weight_sync=weight_sync,  # type: ignore[arg-type]
        sharding=w.sharding,
        micro_batches=w.micro_batches or DEFAULT_MICRO_BATCHES,
        fsdp_version=w.fsdp_version,  # type: ignore[arg-type]
        **dict(w.learner_fixed),
    )


def generation_time(w: Workload, plan: MemoryPlan, profile: ClusterProfile, engines: int) -> float:
    """Seconds to generate one step's responses on the busiest engine (planning/generation.py), its
    concurrency from the engine's own limits: its vLLM's max_num_seqs and its KV pool."""
    return generation_seconds(
        engine_work(
            plan.engine,
            w.model,
            plan.engine_setup.tp,
            math.ceil(w.seqs / engines),
            w.max_prompt_token_length,
            w.response_length,
            profile.gpu.hbm_bandwidth_tbs,
            profile.gpu.bf16_tflops,
        )
    )


def learner_band(
    w: Workload, plan: MemoryPlan, profile: ClusterProfile, learners_per_node: int, passes: int = 1
) -> Band:
    """The learners' seconds per RL step: `passes` times the step's tokens through training_band."""
    return training_band(plan.learner_setup, profile, w.seqs * w.seq_len * passes, learners_per_node)


# What a search has planned, shared by the searches of one request (planning/layout_advice.py's suggest
# makes dozens): whole memory plans by everything plan_memory reads, each learner's and engine's memory
# (plan_memory's `parts`), whether a learner fits, and the learners' time. A profile is held beside
# what was planned on it, so that its id stays its own while the memo lives.
PlanMemo = dict[Any, Any]


def _memo(memo: PlanMemo, key: tuple[Any, ...], profile: ClusterProfile, make: Any) -> Any:
    if key not in memo:
        memo[key] = (profile, make())
    return memo[key][1]


def _memory(
    memo: PlanMemo,
    profile: ClusterProfile,
    learner: LearnerSetup,
    engine: EngineSetup,
    k: int,
    engine_gpus: int,
    margin: bool,
) -> MemoryPlan:
    parts = memo.setdefault("parts", {})
    plan: MemoryPlan = _memo(
        memo,
        (id(profile), learner, engine, k, engine_gpus, margin),
        profile,
        lambda: plan_memory(
            profile, learner, engine, learners_per_node=k, engine_gpus_per_node=engine_gpus, margin=margin, parts=parts
        ),
    )
    return plan


def _fitting_learner(memo: PlanMemo, profile: ClusterProfile, w: Workload, n: int, margin: bool) -> LearnerSetup | None:
    """The learner of n GPUs in the first weight-sync mode that fits, or None. Whether a learner fits
    depends on it alone (and the GPU), not on the engine or the node: asked once per learner count,
    not once per (learners per node, TP, utilisation) that gives the same count."""
    parts = memo.setdefault("parts", {})
    for sync in sync_modes(w.weight_sync):
        learner = _learner_setup(w, n, sync)
        if _memo(
            memo, ("fits", id(profile), learner, margin), profile, lambda: learner_fits(profile, learner, margin, parts)
        ):
            return learner
    return None


def search_size(profile: ClusterProfile, nodes: int, w: Workload, pins: Pins = Pins()) -> int:
    """Candidate layouts (learners per node x learner nodes x TP) enumerate_layouts weighs for this
    request: the work of one search, each candidate up to len(UTILISATIONS) memory plans."""
    g = profile.gpu.count_per_node
    ks = 1 if pins.learners_per_node else min(g, profile.planning.max_learners_per_node or g)
    ms = 1 if pins.learner_nodes else nodes
    tps = 1 if pins.tp is not None else len(w.model.tp_sizes(g))
    return ks * ms * tps


def enumerate_layouts(
    profile: ClusterProfile,
    nodes: int,
    w: Workload,
    pins: Pins = Pins(),
    margin: bool = True,
    memo: PlanMemo | None = None,
) -> tuple[list[Layout], dict[str, int]]:
    """Every layout that satisfies the rules and fits, ranked best first; and rejection counts.
    Without margin, a learner may use the allocator margin (plan_layouts' last resort). A search
    over node counts passes one `memo`: a layout's memory does not depend on the job's node count,
    so each (learners, learner nodes, TP, utilisation) is planned once, not once per count."""
    rejected: dict[str, int] = {}
    layouts = list(_layouts(profile, nodes, w, pins, margin, {} if memo is None else memo, rejected))
    return rank(layouts, exclusive=profile.job_gpus is None), rejected


def any_layout(
    profile: ClusterProfile,
    nodes: int,
    w: Workload,
    pins: Pins = Pins(),
    margin: bool = True,
    memo: PlanMemo | None = None,
) -> bool:
    """Whether some layout fits: enumerate_layouts' answer is non-empty, found without planning the rest.
    The most learner nodes are tried first, where a learner's shard is smallest."""
    found = _layouts(profile, nodes, w, pins, margin, {} if memo is None else memo, {}, most_learners_first=True)
    return next(found, None) is not None


def _layouts(
    profile: ClusterProfile,
    nodes: int,
    w: Workload,
    pins: Pins,
    margin: bool,
    memo: PlanMemo,
    rejected: dict[str, int],
    most_learners_first: bool = False,
) -> Iterator[Layout]:
    """The layouts that fit, in search order, counting each rejection's reason in `rejected`."""
    w.check()
    g = profile.gpu.count_per_node

    def reject(why: str) -> None:
        rejected[why] = rejected.get(why, 0) + 1

    tps = w.model.tp_sizes(g)
    if pins.tp is not None:
        if pins.tp not in tps:
            why = w.model.tp_problem(pins.tp) or f"an engine must fit in one node of {g} GPUs"
            raise PlanError(f"{pins.key('tp', 'tensor-parallel size')} {pins.tp} cannot work: {why}; valid: {tps}")
        tps = [pins.tp]
    cap = profile.planning.max_learners_per_node or g
    ks = [pins.learners_per_node] if pins.learners_per_node else list(range(1, min(g, cap) + 1))
    if any(k < 1 or k > g for k in ks):
        raise PlanError(f"learners per node {ks[0]} must be between 1 and {g} (GPUs per node)")
    ms = [pins.learner_nodes] if pins.learner_nodes else list(range(1, nodes + 1))
    if any(m < 1 or m > nodes for m in ms):
        raise PlanError(
            f"{ms[0]} learner nodes ({pins.key('learner_nodes', 'pinned')}) but the job has {nodes} nodes; "
            "the learners take one node each (a STRICT_SPREAD placement group)"
        )
    utils = [pins.gpu_memory_utilization] if pins.gpu_memory_utilization else list(UTILISATIONS)
    tokens = w.seqs * w.seq_len
    for k in ks:
        for m in reversed(ms) if most_learners_first else ms:
            learner = _fitting_learner(memo, profile, w, k * m, margin)
            for tp in tps:
                engines = m * ((g - k) // tp) + (nodes - m) * (g // tp)
                if pins.engines is not None:
                    if pins.engines > engines:
                        reject("pinned engine count does not fit the free GPUs")
                        continue
                    engines = pins.engines
                if engines < 1:
                    reject("no GPU left for a vLLM engine")
                    continue
                if learner is None:
                    reject("learner does not fit in GPU memory")
                    continue
                chosen = None
                for util in utils:
                    plan = _memory(memo, profile, learner, engine_setup(w, tp, util), k, ((g - k) // tp) * tp, margin)
                    if not plan.host.fits:
                        reject("host RAM over Ray's kill threshold")
                        break
                    if plan.engine.fits:
                        chosen = (util, plan)
                        break
                if chosen is None:
                    if plan.host.fits:
                        reject("vLLM engine does not fit (weights + KV for one sequence)")
                    continue
                util, plan = chosen
                band = _memo(
                    memo,
                    ("band", id(profile), learner, k, tokens),
                    profile,
                    lambda: training_band(learner, profile, tokens, k),
                )
                yield Layout(
                    nodes=nodes,
                    gpus_per_node=g,
                    learners_per_node=k,
                    learner_nodes=m,
                    tp=tp,
                    engines=engines,
                    gpu_memory_utilization=util,
                    memory=plan,
                    gen_time_s=generation_time(w, plan, profile, engines),
                    train_band=band,
                    weight_sync=learner.weight_sync,
                )
