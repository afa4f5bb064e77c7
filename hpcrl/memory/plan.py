"""One memory plan: a learner GPU, an engine GPU and the host, against a cluster profile."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpcrl.memory import constants as C
from hpcrl.memory.engine import EngineMemory, EngineSetup, engine_memory
from hpcrl.memory.host import HostMemory, host_memory
from hpcrl.memory.learner import LearnerMemory, LearnerSetup, deepspeed_estimate, learner_memory
from hpcrl.memory.learner_time import learner_time
from hpcrl.profiles import ClusterProfile

# Headroom kept free on a GPU for spikes no model sees (used where no measured margin applies:
# a colocated GPU's rollout phase, diagnose's fixes).
LEARNER_HEADROOM = 0.03


def allocator_margin(setup: LearnerSetup, peak_reserved: float) -> float:
    """Bytes a learner keeps free for the allocator's measured spread (constants.ALLOCATOR_MARGIN from
    the DeepSpeed rows; an FSDP learner's from the FSDP rows): its sharding's."""
    return setup.sharding.allocator_margin(setup, peak_reserved)


@dataclass(frozen=True)
class MemoryPlan:
    profile: ClusterProfile
    learner_setup: LearnerSetup
    engine_setup: EngineSetup
    learner: LearnerMemory
    engine: EngineMemory
    host: HostMemory
    # The allocator margin this plan is held to (allocator_margin); 0 where a caller accepts a
    # plan inside it (the layout planner's fallback, which then warns).
    margin: float = 0.0

    @property
    def usable(self) -> float:
        return self.profile.gpu_bytes

    @property
    def learner_peak(self) -> float:
        """The learner side's device peak (a colocated plan's training phase)."""
        return self.learner.device_total

    @property
    def learner_fits(self) -> bool:
        return self.learner_peak + self.margin <= self.usable

    @property
    def inside_margin(self) -> bool:
        """Fits the GPU, but not with the full measured allocator margin left over."""
        full = allocator_margin(self.learner_setup, self.learner.peak_reserved)
        return self.learner_peak <= self.usable < self.learner_peak + full

    @property
    def fits(self) -> bool:
        return self.learner_fits and self.engine.fits and self.host.fits

    def learner_verdict(self, what: str = "learner") -> str:
        """Fits with room to spare after the margin, only inside it, or not at all."""
        g, full = C.GIB, allocator_margin(self.learner_setup, self.learner.peak_reserved)
        spare = self.usable - self.learner_peak
        if spare >= full:
            return f"{what} fits with {(spare - full) / g:.1f} GiB to spare after a {full / g:.1f} GiB allocator margin"
        if spare >= 0:
            return (
                f"{what} fits only inside the {full / g:.1f} GiB allocator margin ({spare / g:.1f} GiB left; "
                "reserved memory varied that much in the calibration): it may run out of memory"
            )
        return f"{what} does NOT fit: {-spare / g:.1f} GiB over the {self.usable / g:.1f} GiB GPU"

    def verdict(self) -> str:
        """The plan in words."""
        return "; ".join([self.learner_verdict()] + self.engine_and_host_verdicts())

    def engine_and_host_verdicts(self) -> list[str]:
        """The engine's verdict, and the host's when it does not fit."""
        g = C.GIB
        parts = [("engine fits: " if self.engine.fits else "engine does NOT fit: ") + self.engine.reason]
        if self.engine.warning:
            parts.append(f"WARNING: {self.engine.warning}")
        if not self.host.fits:
            parts.append(
                f"host RAM does NOT fit: {self.host.peak / g:.0f} GiB > {self.host.kill_threshold:.0%} "
                f"of {self.host.ram_per_node / g:.0f} GiB ({self.host.killer})"
            )
        return parts

    def to_dict(self) -> dict:
        """The stable --json schema of `hpcrl plan-memory`."""
        g = C.GIB
        ls, es = self.learner_setup, self.engine_setup
        return {
            "model": {
                "name": ls.model.name,
                "total_params": ls.model.total_params,
                "active_params": ls.model.active_params,
                "trainable_params": self.learner.trainable_params,
            },
            "gpu": {
                "name": self.profile.gpu.model,
                "usable_gib": round(self.usable / g, 3),
                "cluster": self.profile.name,
            },
            "learner": {
                "gpus": ls.n_gpus,
                "tokens_per_gpu": ls.tokens_per_gpu,
                "zero_stage": ls.sharding.stage(ls),
                # only where the framework's learner has them (the other backends' JSON is unchanged)
                **({"logits_fp32": True} if ls.logits_fp32 else {}),
                **(
                    {"reference_process_gib": round(self.learner.reference_process_bytes / g, 3)}
                    if self.learner.reference_process_bytes
                    else {}
                ),
                **ls.sharding.plan_fields(ls),  # hpcrl.memory.sharding.from_plan reads them back
                "offload": ls.offload,
                "gradient_checkpointing": ls.gradient_checkpointing,
                "lora_rank": ls.lora_rank,
                "load_in_4bit": ls.load_in_4bit,
                "logprob_impl": ls.logprob_impl,
                "grad_accum_dtype": ls.grad_accum_dtype,
                "weight_sync": ls.weight_sync,
                "phases_gib": {k: round(v / g, 3) for k, v in self.learner.phases.items()},
                "peak_allocated_gib": round(self.learner.peak_allocated / g, 3),
                "peak_reserved_gib": round(self.learner.peak_reserved / g, 3),
                "reserved_need_gib": round(self.learner.reserved_need / g, 3),
                "non_torch_gib": round(self.learner.non_torch / g, 3),
                "device_total_gib": round(self.learner.device_total / g, 3),
                "peak_phase": self.learner.phase,
                "breakdown": {k: round(v / g, 3) for k, v in self.learner.terms.items()},
                "deepspeed_estimate_gib": round(deepspeed_estimate(ls.model, ls.n_gpus) / g, 3),
                "allocator_margin_gib": round(allocator_margin(ls, self.learner.peak_reserved) / g, 3),
                "fits": self.learner_peak + allocator_margin(ls, self.learner.peak_reserved) <= self.usable,
                "inside_margin": self.inside_margin,
                # One micro-batch of tokens_per_gpu on one learner GPU and the optimizer step (issue 26).
                "time": learner_time(ls, self.profile).to_dict(),
            },
            "engine": {
                "tp": es.tp,
                "gpu_memory_utilization": es.gpu_memory_utilization,
                "weights_gib": round(self.engine.weights / g, 3),
                "activation_peak_gib": round(self.engine.activation_peak / g, 3),
                "cuda_graphs_gib": round(self.engine.cuda_graphs / g, 3),
                "non_torch_gib": round(self.engine.non_torch / g, 3),
                "kv_cache_gib": round(self.engine.kv_cache / g, 3),
                "kv_bytes_per_token": self.engine.kv_bytes_per_token,
                "kv_tokens": self.engine.kv_tokens,
                "max_seq_len": es.max_seq_len,
                "concurrent_seqs": self.engine.concurrent_seqs,
                "concurrency": round(self.engine.concurrency, 2),
                "vllm_version": self.engine.vllm_version,
                "max_num_batched_tokens": self.engine.batched_tokens,
                "max_num_seqs": self.engine.max_num_seqs,
                "enforce_eager": es.enforce_eager,
                "kv_cache_dtype": es.kv_cache_dtype,
                "cuda_graphs_in_budget": self.engine.graphs_in_budget,
                "footprint_gib": round(self.engine.footprint / g, 3),
                "warning": self.engine.warning,
                "fits": self.engine.fits,
            },
            "host": {
                "ram_per_node_gib": round(self.host.ram_per_node / g, 1),
                "kill_threshold": self.host.kill_threshold,
                "peak_gib": round(self.host.peak / g, 1),
                "breakdown": {k: round(v / g, 2) for k, v in self.host.terms.items()},
                "fits": self.host.fits,
                **({} if self.host.ray else {"ray": False}),  # said only of a job without Ray
            },
            "fits": self.fits,
            "verdict": self.verdict(),
        }


def plan_memory(
    profile: ClusterProfile,
    learner: LearnerSetup,
    engine: EngineSetup,
    learners_per_node: int = 1,
    engine_gpus_per_node: int | None = None,
    margin: bool = True,
    parts: dict | None = None,
    ray: bool = True,
) -> MemoryPlan:
    """Evaluate learner, engine and host memory for one layout on `profile`; with margin, the
    learner must leave the allocator margin free to fit. `parts` keeps each learner's and engine's
    memory across calls (a layout search meets the same learner and engine in many layouts)."""
    engine.check(profile.gpu.count_per_node)
    engine = EngineSetup(**{**engine.__dict__, "gpu_total_bytes": profile.gpu_bytes})
    lm = _part(parts, learner, learner_memory)
    em = _part(parts, engine, engine_memory)
    if engine_gpus_per_node is None:
        engine_gpus_per_node = profile.gpu.count_per_node - learners_per_node
    hm = host_memory(
        profile.node.ram_gib * C.GIB,
        learners_per_node,
        lm.host_offload_bytes,
        max(0, engine_gpus_per_node),
        profile.ray.memory_kill_threshold,
        ray,
    )
    return MemoryPlan(
        profile, learner, engine, lm, em, hm, allocator_margin(learner, lm.peak_reserved) if margin else 0.0
    )


def learner_fits(
    profile: ClusterProfile, learner: LearnerSetup, margin: bool = True, parts: dict | None = None
) -> bool:
    """What MemoryPlan.learner_fits says of every plan of this learner on `profile`, whatever its engine."""
    lm = _part(parts, learner, learner_memory)
    return lm.device_total + (allocator_margin(learner, lm.peak_reserved) if margin else 0.0) <= profile.gpu_bytes


def _part(parts: dict | None, setup: Any, model: Callable[[Any], Any]) -> Any:
    # Setups are frozen and hold all their model reads (the engine its GPU's bytes), so the setup is the key.
    if parts is None:
        return model(setup)
    if setup not in parts:
        parts[setup] = model(setup)
    return parts[setup]
