"""The memory plan of an HF/TRL-style learner that also generates (hpcrl/memory/hf_learner.py), on a profile.

A MemoryPlan in shape, so that the layout, the script header and plan.json read it as they read
the colocated plans: each GPU trains and generates in turn; its "engine" is HF `generate` on the
learner GPU (a KV cache, no vLLM). Its own `to_dict` is `hpcrl plan-memory`'s schema for the
custom backend (docs/plan-memory.md), with the kind of each term (derived, fitted, measured).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcrl.memory import constants as C
from hpcrl.memory.engine import EngineMemory, EngineSetup
from hpcrl.memory.hf_learner import DERIVED, MEASURED, HfLearnerMemory, HfLearnerSetup, Term, hf_learner_memory
from hpcrl.memory.host import HostMemory
from hpcrl.memory.learner import LearnerMemory, LearnerSetup
from hpcrl.memory.learner_time import learner_time
from hpcrl.memory.plan import MemoryPlan, allocator_margin
from hpcrl.profiles import ClusterProfile


@dataclass(frozen=True)
class HfPlan(MemoryPlan):
    hf_setup: HfLearnerSetup | None = None
    hf: HfLearnerMemory | None = None

    def _device(self, phase: str) -> float:
        assert self.hf is not None
        return self.hf.reserved(phase) + self.learner.non_torch

    @property
    def training_total(self) -> float:
        return self._device("training")

    @property
    def rollout_total(self) -> float:
        return max(self._device("generation"), self._device("scoring"))

    @property
    def peak_device(self) -> float:
        return self.learner.device_total

    @property
    def learner_peak(self) -> float:
        return self.learner.device_total

    @property
    def fits(self) -> bool:
        return self.learner_fits and self.host.fits

    def verdict(self) -> str:
        assert self.hf is not None
        parts = [self.learner_verdict(f"the learner GPU (peak at {self.hf.peak_phase})")]
        if not self.host.fits:
            parts.append(
                f"host RAM does NOT fit: {self.host.peak / C.GIB:.0f} GiB > the job's "
                f"{self.host.ram_per_node / C.GIB:.0f} GiB"
            )
        return "; ".join(parts)

    def colocated_summary(self) -> str:
        """One line for a script header."""
        g = C.GIB
        return (
            f"one GPU generates (HF generate, KV cache {self.engine.kv_cache / g:.2f} GiB) and trains: peak "
            f"{self.learner.device_total / g:.1f} GiB of {self.usable / g:.1f} usable at "
            f"{self.hf.peak_phase if self.hf else '?'} (derived); host {self.host.peak / g:.0f} GiB of "
            f"{self.host.ram_per_node / g:.0f} GiB"
        )

    def to_dict(self) -> dict:
        """`hpcrl plan-memory --json` for the custom backend (stable keys; docs/plan-memory.md)."""
        assert self.hf is not None and self.hf_setup is not None
        g, s, hf = C.GIB, self.hf_setup, self.hf

        def terms(ts: tuple[Term, ...]) -> dict[str, float]:
            return {t.label: round(t.bytes / g, 3) for t in ts}

        non_torch = Term("CUDA context" + (" + NCCL" if s.n_gpus > 1 else ""), self.learner.non_torch, MEASURED)
        margin = allocator_margin(self.learner_setup, self.learner.peak_reserved)
        return {
            "model": {
                "name": s.model.name,
                "total_params": s.model.total_params,
                "trainable_params": hf.trainable_params,
            },
            "gpu": {
                "name": self.profile.gpu.model,
                "usable_gib": round(self.usable / g, 3),
                "cluster": f"{self.profile.name}:{self.profile.variant}" if self.profile.variant else self.profile.name,
                "job_gpus": self.profile.gpu.count_per_node,
            },
            "learner": {
                "kind": "hf-trl",
                "algorithm": s.algorithm,
                "processes": s.n_gpus,
                "weights": "4-bit NF4" if s.load_in_4bit else "bf16",
                "double_quant": s.double_quant,
                "lora_rank": s.lora_rank,
                "lora_targets": list(s.lora_targets),
                "critic": s.critic,
                "reference": s.reference,
                "gradient_checkpointing": s.gradient_checkpointing,
                "rollout_seqs": s.rollout_seqs,
                "micro_seqs": s.micro_seqs,
                "seq_len": s.seq_len,
                "prompt_len": s.prompt_len,
                "response_len": s.response_len,
                "lora_dropout": s.lora_dropout,
                "tokens_per_micro_batch": s.train_tokens,
                "resident": terms(hf.resident),
                "phases": {
                    p: {
                        "transient": terms(ts),
                        "allocated_gib": round(hf.phase_allocated(p) / g, 3),
                        "reserved_gib": round(hf.reserved(p) / g, 3),
                    }
                    for p, ts in hf.phases.items()
                },
                "peak_phase": hf.peak_phase,
                "peak_allocated_gib": round(hf.peak_allocated / g, 3),
                "peak_reserved_gib": round(self.learner.peak_reserved / g, 3),
                "non_torch": terms((non_torch,)),
                "device_total_gib": round(self.learner.device_total / g, 3),
                "allocator_margin_gib": round(margin / g, 3),
                "fits": self.learner.device_total + margin <= self.usable,
                "inside_margin": self.inside_margin,
                # One training micro-batch of tokens_per_micro_batch and the optimizer step (issue 26).
                "time": learner_time(self.learner_setup, self.profile).to_dict(),
            },
            "generation": {
                "kind": "hf-generate",
                "kv_cache_gib": round(self.engine.kv_cache / g, 3),
                "kv_bytes_per_token": self.engine.kv_bytes_per_token,
                "kv_tokens": self.engine.kv_tokens,
                "concurrent_seqs": self.engine.concurrent_seqs,
            },
            "host": {
                "ram_gib": round(self.host.ram_per_node / g, 1),
                "peak_gib": round(self.host.peak / g, 1),
                "breakdown": {k: round(v / g, 2) for k, v in self.host.terms.items()},
                "fits": self.host.fits,
            },
            "basis": {
                "derived": "arithmetic from what the libraries allocate (sources in hpcrl/memory/hf_learner.py), "
                "not measured by hpcrl",
                "fitted": "a constant fitted on hpcrl's DeepSpeed calibration rows, applied here unchanged",
                "measured": "an idle process's CUDA context, measured",
            },
            "fits": self.fits,
            "verdict": self.verdict(),
        }


def hf_memory_plan(profile: ClusterProfile, setup: HfLearnerSetup, margin: bool = True) -> HfPlan:
    """One GPU of `setup` on `profile` (a whole node's GPU or a partial job's), and the job's host RAM."""
    hf = hf_learner_memory(setup)
    peak = hf.peak_phase
    ls = LearnerSetup(
        model=setup.model,
        n_gpus=setup.n_gpus,
        tokens_per_gpu=setup.train_tokens,
        zero_stage=0,
        gradient_checkpointing=setup.gradient_checkpointing,
        lora_rank=setup.lora_rank,
        load_in_4bit=setup.load_in_4bit,
        logprob_impl="eager",
        logits_copy=False,
    )
    non_torch = hf.non_torch(setup.n_gpus)
    lm = LearnerMemory(
        terms={t.label: t.bytes for t in (*hf.resident, *hf.phases[peak])},
        phase=peak,
        phases={p: hf.phase_allocated(p) for p in hf.phases},
        peak_allocated=hf.peak_allocated,
        peak_reserved=hf.peak_reserved,
        non_torch=non_torch,
        trainable_params=hf.trainable_params,
        host_offload_bytes=0.0,
    )
    kv = next(t.bytes for t in hf.phases["generation"] if t.name.startswith("HF generate KV cache"))
    kv_per_token = setup.model.kv_bytes_per_token(1)
    em = EngineMemory(
        weights=0.0,
        activation_peak=0.0,
        cuda_graphs=0.0,
        non_torch=0.0,
        budget=0.0,
        kv_cache=kv,
        kv_bytes_per_token=kv_per_token,
        kv_tokens=int(kv // kv_per_token),
        concurrent_seqs=setup.rollout_seqs,
        fits=True,
        reason=f"HF generate on the learner GPU: {setup.rollout_seqs} sequences of {setup.seq_len} tokens",
    )
    es = EngineSetup(
        model=setup.model,
        tp=1,
        gpu_memory_utilization=1.0,
        gpu_total_bytes=profile.gpu_bytes,
        max_seq_len=setup.seq_len,
    )
    # No Ray and no vLLM: the training processes alone, against what Slurm gives the job (no kill threshold).
    host_terms = {
        f"training processes ({setup.n_gpus} x {C.HOST_PROCESS_GIB:g} GiB, assumed: constants.HOST_PROCESS_GIB)": setup.n_gpus
        * C.HOST_PROCESS_GIB
        * C.GIB
    }
    hm = HostMemory(profile.node.ram_gib * C.GIB, 1.0, sum(host_terms.values()), host_terms)
    return HfPlan(
        profile, ls, es, lm, em, hm, allocator_margin(ls, lm.peak_reserved) if margin else 0.0, hf_setup=setup, hf=hf
    )


__all__ = ["DERIVED", "HfPlan", "hf_memory_plan"]
