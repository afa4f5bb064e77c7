"""One memory plan: a learner GPU, an engine GPU and the host, against a cluster profile."""

from __future__ import annotations

from dataclasses import dataclass

from hpcrl.memory import constants as C
from hpcrl.memory.engine import EngineMemory, EngineSetup, engine_memory
from hpcrl.memory.host import HostMemory, host_memory
from hpcrl.memory.learner import LearnerMemory, LearnerSetup, deepspeed_estimate, learner_memory
from hpcrl.profiles import ClusterProfile

# Headroom kept free on a learner GPU for allocator spikes the model does not see.
LEARNER_HEADROOM = 0.03


@dataclass(frozen=True)
class MemoryPlan:
    profile: ClusterProfile
    learner_setup: LearnerSetup
    engine_setup: EngineSetup
    learner: LearnerMemory
    engine: EngineMemory
    host: HostMemory

    @property
    def usable(self) -> float:
        return self.profile.gpu_bytes

    @property
    def learner_fits(self) -> bool:
        return self.learner.device_total <= self.usable * (1 - LEARNER_HEADROOM)

    @property
    def fits(self) -> bool:
        return self.learner_fits and self.engine.fits and self.host.fits

    def verdict(self) -> str:
        """The plan in words."""
        g = C.GIB
        parts = []
        if self.learner_fits:
            spare = self.usable - self.learner.device_total
            parts.append(f"learner fits with {spare / g:.1f} GiB to spare")
        else:
            over = self.learner.device_total - self.usable * (1 - LEARNER_HEADROOM)
            parts.append(f"learner does NOT fit: {over / g:.1f} GiB over the {self.usable / g:.1f} GiB GPU")
        return "; ".join(parts + self.engine_and_host_verdicts())

    def engine_and_host_verdicts(self) -> list[str]:
        """The engine's verdict, and the host's when it does not fit."""
        g = C.GIB
        parts = [("engine fits: " if self.engine.fits else "engine does NOT fit: ") + self.engine.reason]
        if not self.host.fits:
            parts.append(
                f"host RAM does NOT fit: {self.host.peak / g:.0f} GiB > {self.host.kill_threshold:.0%} "
                f"of {self.host.ram_per_node / g:.0f} GiB (Ray kills workers there)"
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
                "zero_stage": ls.zero_stage,
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
                "non_torch_gib": round(self.learner.non_torch / g, 3),
                "device_total_gib": round(self.learner.device_total / g, 3),
                "peak_phase": self.learner.phase,
                "breakdown": {k: round(v / g, 3) for k, v in self.learner.terms.items()},
                "deepspeed_estimate_gib": round(deepspeed_estimate(ls.model, ls.n_gpus) / g, 3),
                "fits": self.learner_fits,
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
                "fits": self.engine.fits,
            },
            "host": {
                "ram_per_node_gib": round(self.host.ram_per_node / g, 1),
                "kill_threshold": self.host.kill_threshold,
                "peak_gib": round(self.host.peak / g, 1),
                "breakdown": {k: round(v / g, 2) for k, v in self.host.terms.items()},
                "fits": self.host.fits,
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
) -> MemoryPlan:
    """Evaluate learner, engine and host memory for one layout on `profile`."""
    engine.check(profile.gpu.count_per_node)
    engine = EngineSetup(**{**engine.__dict__, "gpu_total_bytes": profile.gpu_bytes})
    lm = learner_memory(learner)
    em = engine_memory(engine)
    if engine_gpus_per_node is None:
        engine_gpus_per_node = profile.gpu.count_per_node - learners_per_node
    hm = host_memory(
        profile.node.ram_gib * C.GIB,
        learners_per_node,
        lm.host_offload_bytes,
        max(0, engine_gpus_per_node),
        profile.ray.memory_kill_threshold,
    )
    return MemoryPlan(profile, learner, engine, lm, em, hm)
