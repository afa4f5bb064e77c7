"""Per-GPU memory of an HF-Trainer/TRL-style PPO or GRPO learner: LoRA, QLoRA or full fine-tuning (pure arithmetic).

The users' own training scripts (hpcrl backend `custom`) run one process per GPU (python, or
torchrun with DDP), each holding the whole policy: it generates its rollouts with HF `generate`
(a KV cache on the same GPU, no vLLM), scores them with a forward pass, and trains the LoRA
adapters. Three moments can peak; the model evaluates each and takes the largest:

* **generation**: the resident state, the KV cache of one `generate` call (every sequence at
  its full length) and the fp32 logits of the last position.
* **scoring**: a no-grad forward over the rollout batch: bf16 logits and their fp32 log-softmax.
* **training**: one micro-batch's forward and backward: stored activations (a layer's rebuilt
  ones under gradient checkpointing) and the eager fp32 log-prob path.

Resident at all three: the policy's base weights (4-bit NF4 linears with their quantization
constants and bf16 embeddings and norms, or all bf16), the adapters, their gradients and AdamW
moments (trainable parameters only), the value head or critic, the reference (none: the shared
base with the adapters switched off), and DDP's gradient buckets on more than one GPU.

Every term is DERIVED from what the libraries allocate (sources beside each), not measured by
hpcrl on a GPU; BASIS names each term's kind and the output and docs carry the label. The
log-prob path and the allocator slack use constants fitted on DeepSpeed rows (memory/constants.py),
applied here unchanged: an assumption, said so too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hpcrl.errors import HpcrlError
from hpcrl.memory import constants as C
from hpcrl.models.spec import ALL_LINEAR, MLP_MODULES, ModelSpec

# bitsandbytes functional.quantize_4bit: blocksize=64, compress_statistics=False (no double
# quantization unless bnb_4bit_use_double_quant), quant_storage=uint8 (two 4-bit codes a byte);
# one fp32 absmax per block. Double quantization (QLoRA paper, Dettmers et al. 2023,
# arXiv:2305.14314, section 3) stores the absmax in 8 bits per block of 64 with one fp32
# constant per 256 of them: 8/64 + 32/(64*256) = 0.127 bits a weight instead of 32/64 = 0.5.
NF4_BYTES = 0.5
NF4_BLOCK = 64
ABSMAX_BYTES = 4.0 / NF4_BLOCK
DOUBLE_QUANT_BYTES = 1.0 / NF4_BLOCK + 4.0 / (NF4_BLOCK * 256)
# PEFT leaves the adapters of a 4-bit (uint8) base layer in fp32 (it casts them only to a float
# base weight's dtype); hpcrl assumes fp32 adapters whatever the base. TRL's value head is an
# nn.Linear(hidden, 1) made in the default dtype, fp32.
ADAPTER_BYTES = 4.0
# Bytes per trainable parameter: fp32 weight + fp32 gradient + AdamW's two fp32 moments.
TRAINABLE_BYTES = 16.0
# The log-prob path of the training loss: bf16 logits held + the eager fp32 log_softmax, its
# gradient and result (constants.LOGITS_*: *fitted* on DeepSpeed rows, applied here unchanged).
TRAIN_LOGITS_BYTES = C.LOGITS_HELD_BYTES + C.LOGITS_BYTES_PER_ELEMENT["eager"]
# Scoring (no grad): bf16 logits and their fp32 log-softmax.
SCORE_LOGITS_BYTES = 2.0 + 4.0
# Each kind of term: "derived" (arithmetic from what the code allocates), "fitted" (a constant fitted
# on hpcrl's DeepSpeed calibration rows), "measured" (an idle process's CUDA context).
DERIVED, FITTED, MEASURED = "derived", "fitted", "measured"

Critic = Literal["value_head", "model", "none"]
Reference = Literal["shared", "copy", "none"]


@dataclass(frozen=True)
class HfLearnerSetup:
    """What decides one GPU's memory in a user's HF/TRL-style PPO or GRPO script."""

    model: ModelSpec
    n_gpus: int = 1  # DDP world size; every GPU holds everything
    algorithm: Literal["ppo", "grpo"] = "ppo"
    lora_rank: int = 8
    lora_targets: tuple[str, ...] = ALL_LINEAR
    lora_dropout: float = 0.0
    load_in_4bit: bool = True
    double_quant: bool = False
    critic: Critic = "value_head"
    reference: Reference = "shared"
    rollout_seqs: int = 4  # sequences in one generate call (and one scoring forward)
    micro_seqs: int = 4  # sequences in one training forward/backward
    prompt_len: int = 128
    response_len: int = 256
    gradient_checkpointing: bool = True

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    @property
    def full(self) -> bool:
        """Full fine-tuning (lora_rank 0): every weight trains."""
        return self.lora_rank == 0

    @property
    def train_tokens(self) -> int:
        return self.micro_seqs * self.seq_len

    def check(self) -> None:
        for name in ("n_gpus", "rollout_seqs", "micro_seqs", "prompt_len", "response_len"):
            if getattr(self, name) < 1:
                raise HpcrlError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.lora_rank < 0:
            raise HpcrlError(f"lora_rank {self.lora_rank}: valid: a positive LoRA rank, or 0 for full fine-tuning")
        if self.full and self.load_in_4bit:
            raise HpcrlError(
                "lora_rank 0 (full fine-tuning) trains the base weights, which a 4-bit base cannot: "
                "set load_in_4bit false, or give a LoRA rank"
            )
        if self.full and self.reference == "shared":
            raise HpcrlError(
                "reference shared is the base with the adapters off, and lora_rank 0 (full fine-tuning) "
                "has none: valid: copy or none"
            )
        if not 0 <= self.lora_dropout < 1:
            raise HpcrlError(f"lora_dropout {self.lora_dropout}: valid: 0 <= p < 1")
        if self.algorithm == "ppo" and self.critic == "none":
            raise HpcrlError("algorithm ppo needs a value estimate: critic value_head or model (grpo needs none)")
        unknown = [t for t in self.lora_targets if t not in ALL_LINEAR]
        if unknown:
            raise HpcrlError(f"lora_targets {unknown}: valid: {', '.join(ALL_LINEAR)}")


@dataclass(frozen=True)
class Term:
    name: str
    bytes: float
    basis: str  # DERIVED, FITTED or MEASURED

    @property
    def label(self) -> str:
        return f"{self.name} ({self.basis})"


@dataclass(frozen=True)
class HfLearnerMemory:
    resident: tuple[Term, ...]
    phases: dict[str, tuple[Term, ...]]  # transient terms of each moment
    trainable_params: int
    largest_logits: dict[str, float]  # each moment's largest fp32 [tokens x vocab] tensor (allocator slack)

    @property
    def resident_bytes(self) -> float:
        return sum(t.bytes for t in self.resident)

    def phase_allocated(self, phase: str, scale: float = 1.0) -> float:
        """Allocated at `phase`; `scale` multiplies its transient terms (diagnose matches a log with it)."""
        return self.resident_bytes + scale * sum(t.bytes for t in self.phases[phase])

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phase_allocated)

    @property
    def peak_allocated(self) -> float:
        return self.phase_allocated(self.peak_phase)

    def reserved(self, phase: str, scale: float = 1.0) -> float:
        """The caching allocator's reserve at `phase`: constants.RESERVE_* (fitted on DeepSpeed rows)."""
        return (
            self.phase_allocated(phase, scale) * (1 + C.RESERVE_FRACTION)
            + C.RESERVE_FIXED_GIB * C.GIB
            + C.RESERVE_LOGITS * scale * self.largest_logits[phase]
        )

    @property
    def peak_reserved(self) -> float:
        return max(self.reserved(p) for p in self.phases)

    def non_torch(self, n_gpus: int) -> float:
        return (C.CUDA_CONTEXT_GIB + (C.NCCL_BUFFERS_GIB if n_gpus > 1 else 0.0)) * C.GIB


def quantized_params(m: ModelSpec) -> int:
    """Weights bitsandbytes stores in 4 bits: the decoder layers' linear projections (not the
    embeddings, lm_head, norms or biases, which stay in the compute dtype, bf16)."""
    shapes = m.linear_shapes()
    experts = m.num_experts if m.is_moe else 1
    attn = sum(shapes[k][0] * shapes[k][1] for k in ("q_proj", "k_proj", "v_proj", "o_proj"))
    mlp = experts * sum(shapes[k][0] * shapes[k][1] for k in MLP_MODULES)
    return m.num_layers * (attn + mlp)


def base_terms(s: HfLearnerSetup, what: str) -> list[Term]:
    """One copy of the frozen base model (`what` names it): 4-bit NF4 with its constants, or bf16."""
    m = s.model
    if not s.load_in_4bit:
        return [Term(f"{what} base weights, bf16", 2.0 * m.total_params, DERIVED)]
    q = quantized_params(m)
    consts = (DOUBLE_QUANT_BYTES if s.double_quant else ABSMAX_BYTES) * q
    how = "8-bit absmax per 64 weights (double quantization)" if s.double_quant else "fp32 absmax per 64 weights"
    return [
        Term(
            f"{what} base weights, 4-bit NF4 linears + bf16 embeddings and norms",
            NF4_BYTES * q + 2.0 * (m.total_params - q),
            DERIVED,
        ),
        Term(f"{what} 4-bit quantization constants, {how}", consts, DERIVED),
    ]


def full_terms(params: int, what: str) -> list[Term]:
    """Full fine-tuning of a bf16 base (its weights are in base_terms): gradients in the weights' dtype, and
    torch.optim.AdamW's two moments, which it allocates like the parameter (torch/optim/adamw.py, zeros_like)."""
    return [
        Term(f"{what} gradients, bf16 (full fine-tuning)", 2.0 * params, DERIVED),
        Term(f"{what} AdamW moments, bf16 like the weights (full fine-tuning)", 4.0 * params, DERIVED),
    ]


def _layer_activation_bytes(s: HfLearnerSetup) -> float:
    """Bytes one token leaves in one decoder layer for backward (constants.ACT_COEFF), plus the LoRA
    branches' dropout copies of their inputs (bf16 + a bool mask) when lora_dropout > 0."""
    m = s.model
    per = (
        C.ACT_COEFF["h"] * m.hidden_size
        + C.ACT_COEFF["f"] * m.intermediate_size
        + C.ACT_COEFF["q"] * m.q_dim
        + C.ACT_COEFF["kv"] * m.kv_dim
    )
    if s.lora_dropout > 0:
        shapes = m.linear_shapes()
        per += sum(3.0 * shapes[t][0] for t in s.lora_targets)
    return per


def hf_learner_memory(s: HfLearnerSetup) -> HfLearnerMemory:
    """Resident and per-moment transient bytes of one GPU of setup `s`."""
    s.check()
    m = s.model
    value_head = m.hidden_size + 1
    resident = base_terms(s, "policy")
    if s.full:
        lora = m.total_params  # what "adapters" stands for below: the trained weights
        resident += full_terms(lora, "policy")
    else:
        lora = m.lora_params(s.lora_rank, s.lora_targets)
        resident += [
            Term("LoRA adapters, fp32", ADAPTER_BYTES * lora, DERIVED),
            Term("adapter gradients, fp32", 4.0 * lora, DERIVED),
            Term("AdamW moments, fp32, trainable parameters only", 8.0 * lora, DERIVED),
        ]
    trainable = lora
    if s.critic == "value_head":
        resident.append(
            Term("value head, fp32 with its gradient and AdamW moments", TRAINABLE_BYTES * value_head, DERIVED)
        )
        trainable += value_head
    elif s.critic == "model" and s.full:
        resident += base_terms(s, "critic") + full_terms(lora, "critic")
        resident.append(
            Term("critic value head, fp32 with its gradient and AdamW moments", TRAINABLE_BYTES * value_head, DERIVED)
        )
        trainable += lora + value_head
    elif s.critic == "model":
        resident += base_terms(s, "critic")
        resident.append(
            Term(
                "critic adapters and value head, fp32 with gradients and AdamW moments",
                TRAINABLE_BYTES * (lora + value_head),
                DERIVED,
            )
        )
        trainable += lora + value_head
    if s.reference == "shared":
        resident.append(Term("reference: the policy's base with the adapters off (no copy)", 0.0, DERIVED))
    elif s.reference == "copy":
        resident += base_terms(s, "reference copy:")
    if s.n_gpus > 1:
        # DDP's buckets hold the gradients in their dtype: fp32 adapters, bf16 weights under full fine-tuning.
        width, dtype = (2.0, "bf16") if s.full else (4.0, "fp32")
        resident.append(
            Term(f"DDP gradient buckets, a {dtype} copy of the trainable gradients", width * trainable, DERIVED)
        )

    # A 4-bit layer dequantizes its weight to bf16 for each matmul: the largest one at a time.
    shapes = m.linear_shapes()
    dequant = (
        [Term("one dequantized 4-bit weight, bf16", 2.0 * max(a * b for a, b in shapes.values()), DERIVED)]
        if s.load_in_4bit
        else []
    )
    h, layers = m.hidden_size, m.num_layers
    gen_tokens = s.rollout_seqs * s.seq_len
    generation = [
        Term(
            "HF generate KV cache, bf16, every sequence at full length", gen_tokens * m.kv_bytes_per_token(1), DERIVED
        ),
        Term("generate logits, fp32, last position", 4.0 * s.rollout_seqs * m.vocab_size, DERIVED),
        # The prefill's widest live tensors: one layer's MLP activations over the prompts (no grad).
        Term(
            "prefill activations, one layer, no grad",
            2.0 * s.rollout_seqs * s.prompt_len * (2 * m.intermediate_size + 2 * h),
            DERIVED,
        ),
    ] + dequant
    scoring = [
        Term(
            "scoring logits, bf16 + fp32 log-softmax, no grad", SCORE_LOGITS_BYTES * gen_tokens * m.vocab_size, DERIVED
        ),
    ] + dequant
    t = s.train_tokens
    per_layer = _layer_activation_bytes(s)
    models = 2 if s.critic == "model" else 1  # TRL's policy-and-value wrapper backs both through at once
    if s.gradient_checkpointing:
        stored = Term(
            "stored activations, bf16 layer inputs (gradient checkpointing)", models * layers * t * 2.0 * h, DERIVED
        )
        rebuilt = [Term("one layer's activations rebuilt in backward", t * per_layer, DERIVED)]
    else:
        stored = Term(
            "stored activations, every layer (no gradient checkpointing)", models * layers * t * per_layer, DERIVED
        )
        rebuilt = []
    training = [
        stored,
        *rebuilt,
        Term("log-prob path logits, bf16 + eager fp32 log_softmax", TRAIN_LOGITS_BYTES * t * m.vocab_size, FITTED),
    ] + dequant
    fixed = Term("fixed allocations (workspaces, RNG)", C.FIXED_ALLOC_GIB * C.GIB, FITTED)
    return HfLearnerMemory(
        tuple(resident + [fixed]),
        {"generation": tuple(generation), "scoring": tuple(scoring), "training": tuple(training)},
        trainable,
        {
            "generation": 4.0 * s.rollout_seqs * m.vocab_size,
            "scoring": 4.0 * gen_tokens * m.vocab_size,
            "training": 4.0 * t * m.vocab_size,
        },
    )


__all__ = [
    "DERIVED",
    "FITTED",
    "MEASURED",
    "HfLearnerMemory",
    "HfLearnerSetup",
    "Term",
    "base_terms",
    "hf_learner_memory",
    "quantized_params",
]
