"""Seconds of one learner micro-batch and one optimizer step (pure arithmetic, no torch).

Each term is a count hpcrl derives from the setup (FLOPs, bytes, hooks) divided by a rate of the
GPU or link (the profile's bf16 peak, HBM, NVLink, host link), times an efficiency constant in FIT
fitted on measured steps by benchmarks/fit_time.py (rows in benchmarks/results/; held-out error
printed there and in docs/plan.md). Per micro-batch of T tokens on one learner GPU:

* matmul: forward 2P FLOPs per token over the active matmul weights (lm_head included); backward
  2P for the input gradients, 2P more for trained weights (LoRA/frozen bases: input gradients and
  the adapters only); gradient checkpointing adds the decoder's forward again.
* attention: the causal T^2 term of one packed sequence (an upper bound for several documents):
  2 T^2 q_dim FLOPs per layer forward, twice that backward, once more with recompute.
* LoRA adapter path (peft's Linear.forward): per wrapped linear and token the rank-r matmuls (2 r (in + out)
  FLOPs a pass, at the fp32 peak for fp32 adapters, peft's default that OpenRLHF keeps) and the
  elementwise traffic around them (input cast to the adapters' dtype, scaling, add, cast back) over HBM;
  passes as attention's. The frozen base's matmuls stay in "matmul".
* log-prob path: T x V elements through the framework's path (eager fp32 or compiled), as bytes
  over HBM bandwidth.
* ZeRO-3's fixed cost: DeepSpeed's hooks fetch and release every parameter tensor in each pass
  (forward, recompute, backward); FSDP's per wrapped layer. Seconds per tensor (or layer) per pass:
  CPU-side work, taken as the same on every GPU (derived where not measured).
* collectives: ZeRO-3 all-gathers bf16 weights in each pass and reduce-scatters the gradients, FSDP
  (verl) gathers forward and backward and reduce-scatters fp32: bytes x (N-1)/N over the intra-node
  link, or the network when the learners span nodes.
* offload: gradients down and weights up over the host link; parameter offload fetches the weights
  from the host in each pass.
* 4-bit bases (QLoRA): each pass dequantizes the NF4 weights to bf16 (DERIVED, not measured).
* reference forward (a KL term's frozen copy): a forward pass of the same model (DERIVED).

The optimizer step: GPU Adam as bytes per trained parameter over HBM (DeepSpeed's fused AdamW and
FSDP's foreach AdamW fitted apart), DeepSpeed ZeRO-3's per-tensor step overhead, and with optimizer
offload the CPU Adam rate of the measuring host (DERIVED for any other CPU) plus the bf16 weights
copied back over the host link.

The sharding's own terms (hooks or units, collectives, parameter-offload fetches, the optimizer state's
partitioning and the step's extra terms) are counted by the setup's strategy (hpcrl/memory/sharding.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpcrl.memory.gpu_rates import Rates, fp32_tflops, rates_for
from hpcrl.memory.hf_learner import quantized_params
from hpcrl.memory.learner import LearnerSetup
from hpcrl.memory.sharding import fetched_tensors, param_tensors
from hpcrl.models.spec import MLP_MODULES, ModelSpec
from hpcrl.profiles import ClusterProfile

# Fitted by benchmarks/fit_time.py from the rows it names (FIT_ROWS); `python benchmarks/fit_time.py
# --check` fails when these differ from a fresh fit. Units: each term's count times its constant is
# seconds (see time_terms).
FIT: dict[str, float] = {
    "matmul": 2.0,  # 1 / fraction of bf16 peak sustained by the matmuls
    "attention": 1.0,  # 1 / fraction of bf16 peak sustained by SDPA's causal attention
    "logprob_eager": 620.0,  # effective bytes per T x V element, forward and backward, eager fp32 path
    "logprob_compiled": 320.0,  # the same, compiled (or fused) log_softmax + gather
    "zero3_hooks": 0.001,  # seconds per parameter tensor per pass (DeepSpeed ZeRO-3 fetch/release)
    "zero3_grad_tensors": 0.00056,  # seconds per trained tensor per micro-batch (ZeRO-3 gradient partitioning)
    "lora_path": 1.2,  # 1 / fraction of the fp32 (or bf16) peak and HBM the adapter path sustains
    "lora_modules": 0.00058,  # seconds per LoRA-wrapped linear per pass (PEFT's small kernels)
    "fsdp_units": 0.0052,  # seconds per FSDP unit (decoder layer) per pass
    "moe_experts": 6.5e-05,  # seconds per expert per layer per pass (eager expert loop)
    "collectives": 2.5,  # 1 / fraction of link bandwidth the gathers and reduce-scatters get
    "collective_calls": 0.00074,  # seconds per gather or reduce-scatter call (latency, N > 1)
    "host_copies": 1.9,  # 1 / fraction of host-link bandwidth the offload copies get
    "adam_zero": 100.0,  # bytes per trained parameter (per rank) of DeepSpeed's step over HBM
    "adam_fsdp": 150.0,  # the same, verl FSDP (foreach AdamW, grad-norm clipping)
    "zero3_step_tensors": 8.1e-05,  # seconds per parameter tensor of a DeepSpeed ZeRO-3 step
    "cpu_adam": 8.6e-10,  # seconds per trained parameter (per rank) of Adam on the host CPU
}
# Band: measured / predicted step on the held-out rows of the fit (min and max, rounded outward).
BAND = {"low": 0.75, "high": 1.25}
# Where no row measured a setup's kind (derived terms or GPU), the band widens by this factor on both
# sides: an assumption, not fitted.
DERIVED_WIDENING = 1.25
FIT_ROWS = "40 measured rows (fsdp_measured, openrlhf_measured, zero3_timing; H100/H200)"
# CPU-side terms: Python hooks and kernel launches run while the GPU works, so a micro-batch takes the
# larger of their sum and the GPU's terms (measured: a 1.5B ZeRO-3 micro-batch takes about as long at
# 16k tokens as at 4k, the hooks' time hiding the matmuls).
CPU_TERMS = ("zero3_hooks", "zero3_grad_tensors", "lora_modules", "fsdp_units", "moe_experts", "collective_calls")
# What the fit rows measured (written by the fit): a setup with anything else is marked derived.
COVERED = ("fsdp", "lora", "moe", "optimizer_offload", "reference", "zero3")
# GPUs the fit rows ran on: other GPUs are scaled by peak FLOP/s and bandwidths (derived).
MEASURED_GPUS = ("H100", "H200")
# Bytes moved per NF4 weight element per pass when bitsandbytes dequantizes it: read 0.5 + absmax,
# write bf16 2, read bf16 2 in the matmul. Derived, not measured.
DEQUANT_BYTES = 0.5 + 4 / 64 + 2.0 + 2.0


@dataclass(frozen=True)
class LearnerTime:
    """One learner GPU's micro-batch and optimizer step; low/high are factors on the step."""

    micro_batch_s: float
    optimizer_step_s: float
    low: float
    high: float
    basis: str
    micro_terms: dict[str, float] = field(default_factory=dict)
    step_terms: dict[str, float] = field(default_factory=dict)

    def step_s(self, micro_batches: int) -> float:
        """Seconds of one optimizer step's training: K micro-batches then the step."""
        return micro_batches * self.micro_batch_s + self.optimizer_step_s

    def to_dict(self) -> dict:
        return {
            "micro_batch_s": round(self.micro_batch_s, 3),
            "optimizer_step_s": round(self.optimizer_step_s, 3),
            "low": self.low,
            "high": self.high,
            "basis": self.basis,
        }


def lora_path_per_token(m: ModelSpec, rank: int, targets: tuple[str, ...], adapter_bytes: float) -> tuple[float, float]:
    """(FLOPs, HBM bytes) per token of one forward through the adapters, from peft's Linear.forward
    (peft v0.20.0 src/peft/tuners/lora/layer.py:1030-1071, a5526d27): x cast to the adapters' dtype, lora_A
    reads it, lora_B writes `out` values, times scaling (read, write), added to the bf16 base output (the sum
    in the wider dtype), cast back to bf16. Casts are free when the adapters are bf16 (2 bytes)."""
    b = adapter_bytes
    cast_in, cast_out = (2 + b, b + 2) if b != 2 else (0.0, 0.0)
    flops = traffic = 0.0
    for name in targets:
        fan_in, fan_out = m.linear_shapes()[name]
        copies = m.num_experts_per_tok if (m.is_moe and name in MLP_MODULES) else 1
        flops += copies * 2 * rank * (fan_in + fan_out)
        traffic += copies * (fan_in * (cast_in + b) + fan_out * (b + 2 * b + 2 + 2 * b + cast_out))
    return m.num_layers * flops, m.num_layers * traffic


def _matmul_params(m: ModelSpec) -> tuple[float, float]:
    """(decoder-layer active matmul weights, lm_head weights)."""
    decoder = m.active_params - m.embedding_params - m.lm_head_params - m.hidden_size
    return float(decoder), float(m.vocab_size * m.hidden_size)


def time_terms(s: LearnerSetup, r: Rates) -> tuple[dict[str, float], dict[str, float]]:
    """(micro-batch, step) terms before FIT: each is seconds at a constant of 1 (a count for the CPU-side
    terms). Keys are FIT's; a term absent from FIT ("dequant_4bit") is derived and counts as is."""
    m, n, t = s.model, s.n_gpus, float(s.tokens_per_gpu)
    peak, hbm = r.bf16_tflops * 1e12, r.hbm_tbs * 1e12
    link, host = r.link_gbs * 1e9, r.host_gbs * 1e9
    lora = s.lora_rank > 0
    decoder, head = _matmul_params(m)
    adapters = float(m.lora_params(s.lora_rank, s.lora_targets)) if lora else 0.0
    trainable = adapters if lora else float(m.total_params)
    gc = s.gradient_checkpointing

    flops = 2 * (decoder + head) * t  # forward
    flops += 2 * (decoder + head) * t  # input gradients
    flops += 0.0 if lora else 2 * (decoder + head) * t  # weight gradients
    flops += 2 * decoder * t if gc else 0.0
    attn_passes = 1 + 2 + (1 if gc else 0)
    attention = 2 * t * t * m.q_dim * m.num_layers * attn_passes
    passes = 2 + (1 if gc else 0)
    micro: dict[str, float] = {"matmul": flops / peak, "attention": attention / peak}
    if lora:
        # Backward about twice a forward's work (input and weight gradients), as attention's passes.
        lf, lb = lora_path_per_token(m, s.lora_rank, s.lora_targets, s.adapter_bytes)
        rate = fp32_tflops(r) * 1e12 if s.adapter_bytes == 4 else peak
        micro["lora_path"] = attn_passes * t * (lf / rate + lb / hbm)
    if s.logprob_impl == "fused_head":
        # The head's projection runs once more in the backward, over the scored positions only (derived).
        micro["logprob_fused_head"] = 2 * m.vocab_size * m.hidden_size * (s.logprob_tokens or t) / peak
    else:
        micro[f"logprob_{s.logprob_impl}"] = t * m.vocab_size / hbm

    sharding = s.sharding
    micro.update(sharding.hook_terms(s, passes))
    if m.is_moe:
        micro["moe_experts"] = m.num_layers * m.num_experts * passes
    micro.update(sharding.comm_terms(s, passes, trainable, link))

    off_opt = s.offload in ("optimizer", "params")
    copies = 0.0
    if off_opt:
        copies += 2.0 * trainable / n  # the gradient partition down, every micro-batch
    if s.offload == "params":
        # Parameter offload fetches each pass's weights from the host (ZeRO-3) or the fp32 shards (FSDP2).
        copies += sharding.param_fetch_bytes(s, passes)
    micro["host_copies"] = copies / host
    if s.load_in_4bit:
        micro["dequant_4bit"] = quantized_params(m) * DEQUANT_BYTES * passes / hbm

    step: dict[str, float] = {}
    per_rank = trainable / sharding.optimizer_shards(s)
    if off_opt:
        step["cpu_adam"] = per_rank
        step["host_copies"] = 2.0 * per_rank / host  # the updated bf16 weights back up
    else:
        step[sharding.adam_term] = per_rank / hbm
    step.update(sharding.step_terms(s, trainable, link))
    return micro, step


def reference_terms(s: LearnerSetup, r: Rates) -> dict[str, float]:
    """One micro-batch's reference forward (a frozen copy of the base, no LoRA), as time_terms counts."""
    m, t = s.model, float(s.tokens_per_gpu)
    peak, hbm = r.bf16_tflops * 1e12, r.hbm_tbs * 1e12
    decoder, head = _matmul_params(m)
    terms = {
        "matmul": 2 * (decoder + head) * t / peak,
        "attention": 2 * t * t * m.q_dim * m.num_layers / peak,
        f"logprob_{s.logprob_impl}": t * m.vocab_size / hbm / 3,
    }  # a forward: about a third of fwd + bwd
    terms.update(s.sharding.reference_terms(s, r.link_gbs * 1e9))
    if m.is_moe:
        terms["moe_experts"] = float(m.num_layers * m.num_experts)
    if s.load_in_4bit:
        terms["dequant_4bit"] = quantized_params(m) * DEQUANT_BYTES / hbm
    return terms


def overlapped(seconds: dict[str, float]) -> float:
    """A pass's time: the larger of its CPU-side terms and the rest (the GPU's and the links')."""
    cpu = sum(v for k, v in seconds.items() if k in CPU_TERMS)
    return max(cpu, sum(seconds.values()) - cpu)


def apply_fit(terms: dict[str, float], fit: dict[str, float] | None = None) -> dict[str, float]:
    """Seconds per term: each count times its fitted constant (derived terms as they are)."""
    fit = FIT if fit is None else fit
    return {k: v * fit.get(k, 1.0) for k, v in terms.items() if v}


def _derived(s: LearnerSetup, r: Rates) -> list[str]:
    """What in this setup no measured row covers (the basis names it and the band widens)."""
    why = []
    # "GH200" contains "H200": match the measured names as whole words.
    if not any(g in r.gpu.replace("-", " ").split() or r.gpu == g for g in MEASURED_GPUS):
        why.append(f"{r.gpu or 'this GPU'} scaled from H100/H200 by peak FLOP/s and bandwidths")
    if s.load_in_4bit:
        why.append("4-bit dequantization")  # no row: always derived
    unmeasured = [what for kind, what in coverage(s) if kind not in COVERED] + s.sharding.unmeasured(s)
    if s.lora_rank and s.adapter_bytes != 4:
        unmeasured.append("bf16 LoRA adapters (the rows' are peft's fp32)")
    return why + unmeasured


def coverage(s: LearnerSetup) -> list[tuple[str, str]]:
    """The kinds of measurement a setup rests on, each with its words for the basis."""
    kinds = [s.sharding.coverage]
    for on, kind, what in (
        (s.reference_policy, "reference", "reference forward"),
        (s.offload == "optimizer", "optimizer_offload", "optimizer offload"),
        (s.offload == "params", "param_offload", "parameter offload"),
        (s.lora_rank > 0, "lora", "LoRA"),
        (s.model.is_moe, "moe", "MoE experts"),
        (s.logprob_impl == "fused_head", "fused_head", "a fused LM head (no timed row)"),
    ):
        if on:
            kinds.append((kind, what))
    return kinds


def learner_time(s: LearnerSetup, profile: ClusterProfile, learners_per_node: int | None = None) -> LearnerTime:
    """The micro-batch and optimizer step of setup `s` on the profile's GPUs, with its band and basis."""
    s.sharding.check(s)
    r = rates_for(profile, s.n_gpus, learners_per_node)
    micro, step = time_terms(s, r)
    mt, st = apply_fit(micro), apply_fit(step)
    micro_s = overlapped(mt)
    if s.reference_policy:
        rt = apply_fit(reference_terms(s, r))
        micro_s += overlapped(rt)
        mt.update({f"reference {k}": v for k, v in rt.items()})
    derived = _derived(s, r)
    widen = DERIVED_WIDENING if derived else 1.0
    low, high = round(BAND["low"] / widen, 2), round(BAND["high"] * widen, 2)
    basis = f"fitted on {FIT_ROWS}"
    if derived:
        basis += "; derived: " + ", ".join(derived)
    return LearnerTime(micro_s, sum(st.values()), low, high, basis, mt, st)


__all__ = [
    "BAND",
    "FIT",
    "LearnerTime",
    "Rates",
    "apply_fit",
    "fetched_tensors",
    "learner_time",
    "lora_path_per_token",
    "overlapped",
    "param_tensors",
    "rates_for",
    "reference_terms",
    "time_terms",
]
