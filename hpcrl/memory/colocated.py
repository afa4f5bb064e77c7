"""Per-GPU memory when training and generation share every GPU (pure arithmetic).

verl's hybrid engine, and OpenRLHF with `--train.colocate_all`, run a learner and a vLLM
engine on every GPU and take turns. Nothing here is new arithmetic: the learner is
`learner_memory` (ZeRO-3 sharded over all the job's GPUs) and the engine is
`engine_memory`; this module says which of their terms are on the GPU in each phase.

* **training**: the learner's whole peak (`learner_memory`), while vLLM sleeps. A sleeping
  vLLM has dropped its KV cache and either moved its weights to host RAM (sleep level 1:
  OpenRLHF) or discarded them (level 2: verl's hybrid engine, restored by the next weight sync);
  its CUDA context and captured CUDA graphs stay. A vLLM that does
  not sleep keeps its whole budget (`gpu_memory_utilization` x GPU).
* **rollout**: vLLM asks for `gpu_memory_utilization` x GPU (vLLM refuses to start when less
  is free) next to what the training side leaves resident: its sharded parameters, optimizer
  state and gradients unless offloaded between phases, the reference copy unless offloaded,
  and its CUDA context and NCCL buffers. Activations, the log-prob path and the reduce
  bucket are gone between steps.

Assumptions (docs/backends.md): the learner and vLLM are separate processes, each with a
CUDA context (one process would save one context); the transient weight gather of the
weight sync at the start of a rollout is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hpcrl.memory import constants as C
from hpcrl.memory.engine import EngineSetup, engine_memory
from hpcrl.memory.host import host_memory
from hpcrl.memory.learner import LearnerSetup, learner_memory
from hpcrl.memory.plan import LEARNER_HEADROOM, MemoryPlan, allocator_margin
from hpcrl.profiles import ClusterProfile

# learner_memory's term names, grouped by what a framework can move off the GPU between phases.
PARAMETER_TERMS = ("parameters (bf16)", "fp32 master weights", "fp32 parameter shards")
OPTIMIZER_TERMS = ("Adam moments (fp32)",)
GRADIENT_TERMS = ("gradients",)
REFERENCE_TERMS = ("reference policy (bf16)",)
# FSDP1's reference keeps its gathered root unit on the GPU despite CPU offload (measured in the
# update, fsdp_learner.py); assumed to stay there through the rollout as well (derived).
KEPT_TERMS = ("reference root unit (bf16)",)


@dataclass(frozen=True)
class Colocation:
    """What moves off the GPU while the other side works."""

    param_offload: bool = False  # training parameters to host RAM during rollout
    optimizer_offload: bool = False  # optimizer state to host RAM during rollout
    grads_resident: bool = False  # gradient partitions kept between steps (DeepSpeed), freed (FSDP)
    reference_offload: bool = False  # reference copy in host RAM outside its own forward pass
    vllm_sleeps: bool = True  # vLLM sleeps during training
    # vLLM's sleep level: 1 moves its weights to host RAM, 2 discards them (the next weight sync
    # restores them from the learner), so level 2 costs no host RAM. The framework's fact, per version.
    sleep_level: int = 1


@dataclass(frozen=True)
class ColocatedPlan(MemoryPlan):
    """A MemoryPlan whose learner and engine share each GPU, checked phase by phase."""

    colocation: Colocation = Colocation()
    training_terms: dict[str, float] = field(default_factory=dict)
    rollout_terms: dict[str, float] = field(default_factory=dict)

    @property
    def training_total(self) -> float:
        return sum(self.training_terms.values())

    @property
    def rollout_total(self) -> float:
        return sum(self.rollout_terms.values())

    @property
    def peak_device(self) -> float:
        return max(self.training_total, self.rollout_total)

    @property
    def learner_peak(self) -> float:
        return self.training_total

    @property
    def rollout_fits(self) -> bool:
        # The same headroom as training: the training process's allocator keeps some slack.
        return self.rollout_total <= self.usable * (1 - LEARNER_HEADROOM)

    @property
    def fits(self) -> bool:
        return self.learner_fits and self.rollout_fits and self.engine.fits and self.host.fits

    def verdict(self) -> str:
        g = C.GIB
        parts = []
        parts.append(self.learner_verdict("training"))
        if self.rollout_fits:
            parts.append(f"rollout fits with {(self.usable - self.rollout_total) / g:.1f} GiB to spare")
        else:
            parts.append(
                f"rollout does NOT fit: resident training state and vLLM's "
                f"{self.engine_setup.gpu_memory_utilization:g} x GPU need {self.rollout_total / g:.1f} GiB "
                f"of the {self.usable / g:.1f} GiB GPU less {LEARNER_HEADROOM:.0%} headroom (vLLM refuses to start)"
            )
        return "; ".join(parts + self.engine_and_host_verdicts())

    def colocated_summary(self) -> str:
        """One line for a script header."""
        g = C.GIB
        return (
            f"colocated peak {self.training_total / g:.1f} GiB/GPU training, {self.rollout_total / g:.1f} GiB/GPU "
            f"rollout of {self.usable / g:.1f} usable; KV cache {self.engine.kv_cache / g:.1f} GiB per GPU; "
            f"host peak {self.host.peak / g:.0f} GiB/node"
        )

    def to_dict(self) -> dict:
        g = C.GIB
        data = super().to_dict()
        c = self.colocation
        data["colocated"] = {
            "param_offload": c.param_offload,
            "optimizer_offload": c.optimizer_offload,
            "grads_resident": c.grads_resident,
            "reference_offload": c.reference_offload,
            "vllm_sleeps": c.vllm_sleeps,
            "vllm_sleep_level": c.sleep_level,
            "training_gib": round(self.training_total / g, 3),
            "training_breakdown": {k: round(v / g, 3) for k, v in self.training_terms.items()},
            "training_fits": self.learner_fits,
            "rollout_gib": round(self.rollout_total / g, 3),
            "rollout_breakdown": {k: round(v / g, 3) for k, v in self.rollout_terms.items()},
            "rollout_fits": self.rollout_fits,
        }
        data["fits"] = self.fits
        data["verdict"] = self.verdict()
        return data


def _sum(terms: dict[str, float], names: tuple[str, ...]) -> float:
    # "parameters (...)" names the weights' dtype, which depends on the setup (4-bit or bf16).
    return sum(
        v for k, v in terms.items() if k in names or ("parameters (bf16)" in names and k.startswith("parameters ("))
    )


def plan_colocated(
    profile: ClusterProfile,
    learner: LearnerSetup,
    engine: EngineSetup,
    colocation: Colocation = Colocation(),
    margin: bool = True,
    ray: bool = True,
) -> ColocatedPlan:
    """Training and rollout memory of one GPU that does both, and host RAM per node.

    `learner.n_gpus` is every GPU of the job (the learner is sharded over all of them);
    `learner.offload` is what stays off the GPU during training itself.
    """
    g = profile.gpu.count_per_node
    engine.check(g)
    engine = EngineSetup(**{**engine.__dict__, "gpu_total_bytes": profile.gpu_bytes})
    lm = learner_memory(learner)
    em = engine_memory(engine)
    # What a sleeping engine keeps: its process's CUDA context and NCCL set-up (outside vLLM's
    # snapshot, so not em.non_torch) and the graph pool.
    asleep = em.process_non_torch + em.cuda_graphs
    training = {
        "learner (training peak)": lm.device_total,
        (
            "vLLM asleep (CUDA context, CUDA graphs)"
            if colocation.vllm_sleeps
            else "vLLM awake (gpu_memory_utilization x GPU)"
        ): asleep if colocation.vllm_sleeps else em.budget,
    }
    t = lm.terms
    rollout = {
        "training parameters": 0.0 if colocation.param_offload else _sum(t, PARAMETER_TERMS),
        "optimizer state": 0.0 if colocation.optimizer_offload else _sum(t, OPTIMIZER_TERMS),
        "gradients": _sum(t, GRADIENT_TERMS) if colocation.grads_resident else 0.0,
        "reference policy": 0.0 if colocation.reference_offload else _sum(t, REFERENCE_TERMS),
        **({"reference root unit kept gathered (derived)": _sum(t, KEPT_TERMS)} if _sum(t, KEPT_TERMS) else {}),
        "learner CUDA context + NCCL": lm.non_torch,
        "vLLM (gpu_memory_utilization x GPU)": em.budget,
    }
    # Host RAM: what training offloads itself, what moves out between phases, and vLLM's
    # weights while it sleeps at level 1 (level 2 discards them).
    between = 0.0
    if colocation.param_offload:
        between += _sum(t, PARAMETER_TERMS)
    if colocation.optimizer_offload:
        between += _sum(t, OPTIMIZER_TERMS)
    if colocation.reference_offload:
        between += _sum(t, REFERENCE_TERMS)
    between += lm.reference_host_bytes
    hm = host_memory(profile.node.ram_gib * C.GIB, g, lm.host_offload_bytes, g, profile.ray.memory_kill_threshold, ray)
    extra = {
        "training state offloaded during rollout": g * between,
        "vLLM weights while asleep (sleep level 1)": g * em.weights
        if colocation.vllm_sleeps and colocation.sleep_level == 1
        else 0.0,
    }
    terms = {**hm.terms, **{k: v for k, v in extra.items() if v}}
    hm = replace(hm, peak=sum(terms.values()), terms=terms)
    return ColocatedPlan(
        profile,
        learner,
        engine,
        lm,
        em,
        hm,
        allocator_margin(learner, lm.peak_reserved) if margin else 0.0,
        colocation=colocation,
        training_terms=training,
        rollout_terms=rollout,
    )


__all__ = ["Colocation", "ColocatedPlan", "plan_colocated"]
