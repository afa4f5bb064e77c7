"""Per-GPU memory of a vLLM generation engine at tensor-parallel size tp (pure arithmetic).

vLLM sizes its KV cache from what is left of `gpu_memory_utilization * total` after the
weights, the activation peak of its profiling forward pass and memory outside PyTorch.
This model follows that accounting. It is derived from vLLM's documented behaviour, not
calibrated on a GPU (vLLM cannot run in hpcrl's CI); the docs say so.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcrl.errors import HpcrlError
from hpcrl.memory import constants as C
from hpcrl.models.spec import ModelSpec


@dataclass(frozen=True)
class EngineSetup:
    model: ModelSpec
    tp: int = 1
    gpu_memory_utilization: float = 0.9
    gpu_total_bytes: float = 80 * C.GIB
    max_seq_len: int = 8192  # prompt + response of one sequence
    max_num_batched_tokens: int = C.VLLM_MAX_NUM_BATCHED_TOKENS
    max_num_seqs: int = C.VLLM_MAX_NUM_SEQS
    enforce_eager: bool = False

    def check(self, gpus_per_node: int | None = None) -> None:
        m = self.model
        if self.tp < 1:
            raise HpcrlError(f"vLLM tensor-parallel size must be at least 1, got {self.tp}")
        if gpus_per_node is not None and self.tp > gpus_per_node:
            raise HpcrlError(
                f"vLLM tensor-parallel size {self.tp} exceeds the {gpus_per_node} GPUs per node; "
                "an engine's GPUs must share a node"
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise HpcrlError(
                f"vllm_gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.max_seq_len < 1:
            raise HpcrlError(f"sequence length must be positive, got {self.max_seq_len}")
        if (why := m.tp_problem(self.tp)) is not None:
            raise HpcrlError(
                f"vLLM tensor-parallel size {self.tp} cannot shard {m.name}: {why}; "
                f"valid: {m.tp_sizes(max(self.tp, 8))}"
            )


@dataclass(frozen=True)
class EngineMemory:
    weights: float
    activation_peak: float
    cuda_graphs: float
    non_torch: float
    budget: float
    kv_cache: float
    kv_bytes_per_token: int
    kv_tokens: int
    concurrent_seqs: int
    fits: bool
    reason: str


def engine_weights_bytes(m: ModelSpec, tp: int) -> float:
    """bf16 weight bytes on one GPU of a TP group (KV projections replicate past kv heads)."""
    s = m.linear_shapes()
    experts = m.num_experts if m.is_moe else 1
    sharded = s["q_proj"][0] * s["q_proj"][1] + s["o_proj"][0] * s["o_proj"][1]
    sharded += experts * sum(s[k][0] * s[k][1] for k in ("gate_proj", "up_proj", "down_proj"))
    kv_heads_per_gpu = max(1, m.num_kv_heads // tp)
    kv = 2 * m.hidden_size * kv_heads_per_gpu * m.head_dim
    per_layer = sharded / tp + kv + 2 * m.hidden_size
    vocab = (m.embedding_params + m.lm_head_params) / tp
    return 2.0 * (m.num_layers * per_layer + vocab + m.hidden_size)


def engine_memory(e: EngineSetup) -> EngineMemory:
    """KV-cache capacity and verdict for one engine GPU."""
    m, tp = e.model, e.tp
    weights = engine_weights_bytes(m, tp)
    f = m.moe_intermediate_size * m.num_experts_per_tok if m.is_moe else m.intermediate_size
    # Profiling forward at max_num_batched_tokens: the widest live tensors are the
    # gate/up MLP output and the residual stream, plus sampler logits for max_num_seqs.
    act = e.max_num_batched_tokens * (2 * 2 * f / tp + 4 * 2 * m.hidden_size)
    act += e.max_num_seqs * m.vocab_size / tp * 4 * 2
    graphs = 0.0 if e.enforce_eager else C.VLLM_CUDA_GRAPH_GIB * C.GIB
    non_torch = (C.CUDA_CONTEXT_GIB + (C.NCCL_BUFFERS_GIB if tp > 1 else 0.0)) * C.GIB
    budget = e.gpu_memory_utilization * e.gpu_total_bytes
    kv = budget - weights - act - graphs - non_torch
    per_token = m.kv_bytes_per_token(tp)
    kv_tokens = max(0, int(kv // per_token))
    seqs = kv_tokens // e.max_seq_len
    if kv <= 0:
        fits, reason = False, "weights and activations exceed the vLLM memory budget"
    elif kv_tokens < e.max_seq_len:
        fits, reason = False, f"KV cache holds {kv_tokens} tokens, fewer than one {e.max_seq_len}-token sequence"
    else:
        fits, reason = True, f"{seqs} sequences of {e.max_seq_len} tokens fit at once"
    return EngineMemory(
        weights=weights,
        activation_peak=act,
        cuda_graphs=graphs,
        non_torch=non_torch,
        budget=budget,
        kv_cache=max(kv, 0.0),
        kv_bytes_per_token=per_token,
        kv_tokens=kv_tokens,
        concurrent_seqs=seqs,
        fits=fits,
        reason=reason,
    )
