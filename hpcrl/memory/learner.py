"""Per-GPU memory of a DeepSpeed learner during one training step (pure arithmetic).

The step has three moments where memory can peak; the planner evaluates each and takes
the largest:

* **logits**: start of backward. Every stored activation is alive, the lm_head weight
  is gathered (ZeRO-3) and the [tokens x vocab] log-prob path holds its largest set of
  tensors (LOGITS_BYTES_PER_ELEMENT: eager fp32 log_softmax vs the compiled kernel).
* **recompute**: backward through one checkpointed layer: its full activations are
  rebuilt next to the stored checkpoints, with the layer's gathered weights and grads.
* **optimizer**: the step converts one sub-group of bf16 gradient partitions to fp32.
* **weight sync** (when modelled): after the step, open-instruct sends the new weights to
  the vLLM engines (vllm_utils.broadcast_weights_to_vllm at e6c3044a): under ZeRO-3 it
  gathers every parameter at once (`gather_whole_model`, its default) or one at a time, and
  rank 0 clones what it sends into contiguous tensors. Derived from that code, not measured.

Model states (bf16 parameters and gradients, fp32 master weights, Adam moments) are
alive at all three, sharded by N under ZeRO-3, on the CPU when offloaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from hpcrl.errors import HpcrlError
from hpcrl.memory import constants as C
from hpcrl.memory.learner_result import LearnerMemory, non_torch_bytes
from hpcrl.memory.sharding import ZERO, Sharding, sharding_named
from hpcrl.models.spec import ALL_LINEAR, MLP_MODULES, ModelSpec

Offload = Literal["none", "optimizer", "params"]
LogprobImpl = Literal["eager", "compiled", "fused_head"]


@dataclass(frozen=True)
class LearnerSetup:
    """What decides a learner GPU's memory."""

    model: ModelSpec
    n_gpus: int = 1
    tokens_per_gpu: int = 8192
    zero_stage: Literal[0, 2, 3] = 3
    precision: Literal["bf16", "fp16"] = "bf16"
    offload: Offload = "none"
    gradient_checkpointing: bool = True
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ALL_LINEAR
    load_in_4bit: bool = False
    logprob_impl: LogprobImpl = "compiled"
    # Positions the log-prob path scores ("fused_head": only the completion tokens; 0: every token).
    logprob_tokens: int = 0
    # Sequences of a micro-batch padded to one length, each with its attention mask (TRL's batches); 0: one
    # packed sequence (no mask).
    padded_rows: int = 0
    # DeepSpeed keeps ZeRO gradient partitions in the model dtype unless the config's
    # data_types.grad_accum_dtype says otherwise; open-instruct sets it to fp32.
    grad_accum_dtype: Literal["bf16", "fp32"] = "bf16"
    # open-instruct divides the logits by the sampling temperature out of place before
    # the log-prob path: one more bf16 [tokens x vocab] tensor at the peak.
    logits_copy: bool = True
    reference_policy: bool = False  # a frozen bf16 copy for the KL term (ZeRO-3 sharded)
    # The reference policy runs in a process of its own on the same GPU: none of it is in this
    # process's allocator; its weights, context and NCCL buffers count outside it (non_torch).
    reference_process: bool = False
    # The model output's bf16 logits are replaced by an fp32 copy that the output keeps alive through
    # backward and the optimizer step (the log-prob path then holds FP32_LOGITS_PATH_BYTES).
    logits_fp32: bool = False
    adapter_bytes: float = 2.0  # bytes per LoRA adapter weight (bf16 2; peft's fp32 default 4)
    # With optimizer offload the full bf16 lm_head gradient is still on the GPU at the logits moment
    # (N > 1). Measured in the adam-offload rows at N=2 of benchmarks/results/openrlhf_measured.jsonl;
    # the open-instruct model keeps its earlier assumption (no rows there at N > 1 with offload).
    offload_lm_grad: bool = False
    # ZeRO++ hierarchical partitioning (zero_hpz_partition_size): a secondary bf16 copy of
    # the weights sharded over groups of this many ranks. DeepSpeed's default 1 is off;
    # open-instruct passes --deepspeed_zpg (default 8). Derived, not measured.
    hpz_partition_size: int = 1
    # The weight sync after each step: "none" (not modelled), "whole_model" or "per_param".
    weight_sync: Literal["none", "whole_model", "per_param"] = "none"
    # Which sharded learner (hpcrl/memory/sharding.py): DeepSpeed ZeRO (this module's model) or FSDP as
    # verl runs it (hpcrl/memory/fsdp_learner.py, which reads micro_batches and fsdp_version; the ZeRO
    # fields above do not apply to it). A stored name ("zero", "fsdp") is read as its strategy.
    sharding: Sharding = ZERO
    micro_batches: int = 2  # per optimizer step on one GPU
    fsdp_version: Literal[1, 2] = 1
    # What the framework version's FSDP update does (fsdp_learner.VerlUpdate, from its capabilities);
    # None: b178a3cd's, on which the FSDP model was fitted.
    fsdp_update: Any = None
    zero: C.ZeroDefaults = field(default_factory=C.ZeroDefaults)

    def __post_init__(self) -> None:
        if isinstance(self.sharding, str):
            object.__setattr__(self, "sharding", sharding_named(self.sharding))

    def check(self) -> None:
        if self.n_gpus < 1:
            raise HpcrlError(f"learner GPUs must be at least 1, got {self.n_gpus}")
        if self.tokens_per_gpu < 1:
            raise HpcrlError(f"tokens per GPU must be positive, got {self.tokens_per_gpu}")
        if self.zero_stage not in (0, 2, 3):
            raise HpcrlError(f"ZeRO stage {self.zero_stage} is not supported; valid: 0, 2, 3")
        if self.offload == "params" and self.zero_stage != 3:
            raise HpcrlError(f"parameter offload needs ZeRO stage 3, got stage {self.zero_stage}")
        if self.lora_rank < 0:
            raise HpcrlError(f"LoRA rank must be 0 (off) or positive, got {self.lora_rank}")
        if self.load_in_4bit and not self.lora_rank:
            raise HpcrlError("--load-in-4bit trains adapters only: give --lora-rank R as well (QLoRA)")
        if self.grad_accum_dtype not in ("bf16", "fp32"):
            raise HpcrlError(f"gradient dtype {self.grad_accum_dtype!r} is not known; valid: bf16, fp32")
        if self.logprob_impl not in ("eager", "compiled", "fused_head"):
            raise HpcrlError(f"log-prob path {self.logprob_impl!r} is not known; valid: eager, compiled, fused_head")
        if self.weight_sync not in ("none", "whole_model", "per_param"):
            raise HpcrlError(f"weight sync {self.weight_sync!r} is not known; valid: none, whole_model, per_param")


def sync_modes(weight_sync: str) -> list[str]:
    """The LearnerSetup.weight_sync values to try, preferred first: "auto" is the whole model at
    once where it fits, else one parameter at a time (open-instruct's gather_whole_model)."""
    return ["whole_model", "per_param"] if weight_sync == "auto" else [weight_sync]


def _weights_bytes(s: LearnerSetup) -> float:
    """Bytes of the (frozen or trained) base weights, unsharded."""
    m = s.model
    if not s.load_in_4bit:
        return 2.0 * m.total_params
    # QLoRA: nf4 weights (0.5 B) with one fp32 absmax per 64-element block on the decoder
    # linears; embeddings, lm_head and norms stay bf16.
    shapes = m.linear_shapes()
    experts = m.num_experts if m.is_moe else 1
    attn = sum(shapes[k][0] * shapes[k][1] for k in ("q_proj", "k_proj", "v_proj", "o_proj"))
    mlp = experts * sum(shapes[k][0] * shapes[k][1] for k in MLP_MODULES)
    quantized = m.num_layers * (attn + mlp)
    return quantized * (0.5 + 4 / 64) + 2.0 * (m.total_params - quantized)


def parameter_term(s: LearnerSetup) -> str:
    """The weights' row label, with their dtype as this setup stores them (table, JSON and plot)."""
    if s.load_in_4bit:
        return "parameters (4-bit NF4 base linears, bf16 rest" + (" and adapters)" if s.lora_rank else ")")
    return "parameters (bf16)"


def learner_memory(s: LearnerSetup) -> LearnerMemory:
    """Peak per-GPU memory of one learner for setup `s`, by its sharding's model."""
    return s.sharding.learner_memory(s, zero_learner_memory)


def zero_learner_memory(s: LearnerSetup) -> LearnerMemory:
    """Peak per-GPU memory of one DeepSpeed ZeRO learner (ZeroSharding's model)."""
    s.check()
    m, n, t = s.model, s.n_gpus, s.tokens_per_gpu
    stage3 = s.zero_stage == 3
    shard = n if stage3 else 1
    opt_shard = n if s.zero_stage in (2, 3) else 1
    lora = s.lora_rank > 0
    trainable = m.lora_params(s.lora_rank, s.lora_targets) if lora else m.total_params
    off_opt = s.offload in ("optimizer", "params")
    off_par = s.offload == "params"

    terms: dict[str, float] = {}
    weights = _weights_bytes(s) + (s.adapter_bytes * trainable if lora else 0.0)
    terms[parameter_term(s)] = 0.0 if off_par else weights / shard
    if s.zero_stage == 0:
        # DeepSpeed's bf16 optimizer without ZeRO keeps bf16 grads and an fp32 accumulator.
        grads = 6.0 * trainable
    else:
        grads = (4.0 if s.grad_accum_dtype == "fp32" else 2.0) * trainable / opt_shard
    terms["gradients"] = 0.0 if off_opt else grads
    terms["fp32 master weights"] = 0.0 if off_opt else 4.0 * trainable / opt_shard
    terms["Adam moments (fp32)"] = 0.0 if off_opt else 8.0 * trainable / opt_shard
    if stage3 and s.hpz_partition_size > 1 and n > 1:
        group = min(s.hpz_partition_size, n)
        terms["ZeRO++ secondary weights (hpZ)"] = 0.0 if off_par else weights / group
    reference = 0.0 if off_par else 2.0 * m.total_params / shard
    if s.reference_policy and not s.reference_process:
        terms["reference policy (bf16)"] = reference
    # The bucket is allocated at its configured size whatever the trainable count (LoRA too).
    bucket = 2.0 * s.zero.reduce_bucket_size if s.zero_stage in (2, 3) else 0.0
    terms["reduce bucket"] = bucket
    states = sum(terms.values())

    # ---- activations
    h, f = m.hidden_size, (m.moe_intermediate_size * m.num_experts_per_tok if m.is_moe else m.intermediate_size)
    per_token_layer = (
        C.ACT_COEFF["h"] * h + C.ACT_COEFF["f"] * f + C.ACT_COEFF["q"] * m.q_dim + C.ACT_COEFF["kv"] * m.kv_dim
    )
    if s.gradient_checkpointing:
        stored = m.num_layers * t * 2.0 * h
    else:
        stored = m.num_layers * t * per_token_layer
    final_norm = 6.0 * h * t

    # ---- ZeRO-3 working set: gathered full weights (and their full grads before reduce)
    lm_head = m.vocab_size * h
    lm_head_trainable = not lora
    # With one rank a ZeRO-3 partition is the whole tensor: gathering allocates nothing.
    gathers = stage3 and n > 1
    gathered_lm = 2.0 * lm_head if gathers else 0.0
    if gathers and m.tie_word_embeddings:
        # A tied matrix serves the first and the last module: it stays gathered from the
        # embedding lookup while the lm_head holds its own gathered copy (measured at N=2).
        gathered_lm += 2.0 * lm_head
    lm_grad = 2.0 * lm_head if (gathers and lm_head_trainable and (s.offload_lm_grad or not off_opt)) else 0.0
    layer_params = m.per_layer_params
    prefetch = 2.0 * s.zero.prefetch_bucket_size if stage3 else 0.0

    fused = s.logprob_impl == "fused_head"
    if fused:
        # No [tokens x vocab] logits: the head's backward holds its own weight gradient (it replaces lm_grad).
        lm_grad = 0.0
        per_element = 0.0
    elif s.logits_fp32:
        per_element = C.FP32_LOGITS_PATH_BYTES
    else:
        per_element = (
            C.LOGITS_HELD_BYTES
            + (C.LOGITS_COPY_BYTES if s.logits_copy else 0.0)
            + C.LOGITS_BYTES_PER_ELEMENT[s.logprob_impl]
        )
    logits = fused_head_bytes(m, s.logprob_tokens or t) if fused else per_element * t * m.vocab_size
    # what the optimizer-step moment still holds of the log-prob path (the output's fp32 logits)
    step_logits = C.FP32_LOGITS_BYTES * t * m.vocab_size if s.logits_fp32 else 0.0
    # A padded batch's masked attention and, for tied embeddings gathered at N > 1, the fused head's extra
    # copies of the shared matrix (both *fitted* on benchmarks/results/trl_measured.jsonl).
    padded = 0.0
    if s.padded_rows:
        seq = t / s.padded_rows
        padded = C.PADDED_ATTENTION_BYTES * s.padded_rows * m.num_heads * seq * seq
    if fused and gathers and m.tie_word_embeddings:
        padded += C.FUSED_TIED_COPIES * 2.0 * lm_head
    phases = {
        "logits": stored + final_norm + gathered_lm + lm_grad + logits + padded,
        "recompute": stored
        + padded
        + t * per_token_layer
        + (4.0 * layer_params + prefetch if gathers else 0.0)
        + 4.0 * t * h,
        # fp32 copy of a sub-group's gradients plus the fused AdamW's working buffer
        "optimizer": (0.0 if off_opt else C.STEP_BYTES_PER_ELEMENT * min(trainable / opt_shard, s.zero.sub_group_size))
        + step_logits,
    }
    sync_gathered = sync_copy = 0.0
    if s.weight_sync != "none":
        # bf16 weights as vLLM receives them (LoRA: the merged base); one tensor at a time or all.
        unit = 2.0 * (m.total_params if s.weight_sync == "whole_model" else m.largest_param_tensor)
        sync_gathered = unit if (gathers or off_par) else 0.0  # one unsharded rank holds them already
        sync_copy = unit
        phases["weight sync"] = sync_gathered + sync_copy
    phase = max(phases, key=lambda k: phases[k])
    transient = phases[phase]
    if phase == "logits":
        terms["activations (stored)"] = stored + final_norm
        terms["ZeRO-3 gathered lm_head + grad"] = gathered_lm + lm_grad
        terms[
            "log-prob path (fp32 logits)"
            if s.logits_fp32
            else "fused LM head backward (derived)"
            if fused
            else f"log-prob path ({s.logprob_impl})"
        ] = logits
        if padded:
            terms["padded-batch attention (fitted)"] = padded
    elif phase == "recompute":
        terms["activations (stored)"] = stored
        if padded:
            terms["padded-batch attention (fitted)"] = padded
        terms["recomputed layer + gathered weights"] = transient - stored - padded
    elif phase == "weight sync":
        terms["weight sync: gathered weights"] = sync_gathered
        terms["weight sync: rank 0's copy to send"] = sync_copy
    else:
        terms["optimizer step (fp32 grad sub-group)"] = transient - step_logits
        if step_logits:
            terms["fp32 logits the step output still holds"] = step_logits
    terms["fixed (workspaces, RNG, persistent params)"] = C.FIXED_ALLOC_GIB * C.GIB
    peak_alloc = states + transient + C.FIXED_ALLOC_GIB * C.GIB
    largest_logits = C.FUSED_TILE_BYTES if fused else (4.0 if s.logprob_impl == "eager" else 2.0) * t * m.vocab_size
    peak_reserved = (
        peak_alloc * (1 + C.RESERVE_FRACTION) + C.RESERVE_FIXED_GIB * C.GIB + C.RESERVE_LOGITS * largest_logits
    )
    non_torch = non_torch_bytes(n)
    if s.reference_policy and s.reference_process:
        # the reference's own process: its weights (reserved after its empty_cache) and its context
        non_torch += reference + non_torch_bytes(n)

    host = 0.0
    if off_opt:
        # fp32 master, both moments and fp32 grads live in pinned host memory.
        host += 16.0 * trainable / opt_shard
    if off_par:
        host += weights / shard
    return LearnerMemory(
        terms=terms,
        phase=phase,
        phases={k: v + states + C.FIXED_ALLOC_GIB * C.GIB for k, v in phases.items()},
        peak_allocated=peak_alloc,
        peak_reserved=peak_reserved,
        non_torch=non_torch,
        trainable_params=trainable,
        host_offload_bytes=host,
        reference_process_bytes=(reference + non_torch_bytes(n)) if s.reference_policy and s.reference_process else 0.0,
    )


def fused_head_bytes(m: ModelSpec, scored: int) -> float:
    """The fused LM head's backward at its largest (TRL 1.16 kernels/chunked_logprob.py:398-463, *derived*): the
    weight gradient accumulated in fp32 and its bf16 copy at return (6 x vocab x hidden), the hidden-state
    gradient in fp32 and bf16 (6 per scored position x hidden), the scored positions' hidden states saved by the
    forward (2 x hidden each: `hidden_states[mask]`, trl/trainer/utils.py:1645) and one bf16 projection tile."""
    h = m.hidden_size
    return 6.0 * m.vocab_size * h + 8.0 * scored * h + C.FUSED_TILE_BYTES


def deepspeed_estimate(model: ModelSpec, n_gpus: int) -> float:
    """DeepSpeed's own ZeRO-3 estimate (`largest_layer + 18 P / N`, bytes), for comparison."""
    largest_layer = 4.0 * model.largest_param_tensor
    return largest_layer + 18.0 * model.total_params / n_gpus


# Keep the MLP module names importable for LoRA docs/tests without a second definition.
__all__ = [
    "LearnerMemory",
    "LearnerSetup",
    "MLP_MODULES",
    "deepspeed_estimate",
    "fused_head_bytes",
    "learner_memory",
    "sync_modes",
    "zero_learner_memory",
]
