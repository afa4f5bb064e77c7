"""Per-GPU memory of a vLLM generation engine at tensor-parallel size tp (pure arithmetic).

vLLM sizes its KV cache from what is left of `ceil(gpu_memory_utilization * total)` after the
weights, the torch peak of its profiling run and memory outside PyTorch, as the version in
use accounts them (hpcrl/memory/vllm_accounting.py, cited per version). Checked against
public vLLM start-up logs (benchmarks/vllm_engine_check.py); no GPU here runs vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpcrl.errors import HpcrlError
from hpcrl.memory import constants as C
from hpcrl.memory import vllm_accounting as va
from hpcrl.models.spec import ModelSpec

DEFAULT_VLLM_VERSION = va.default_engine().version


@dataclass(frozen=True)
class EngineSetup:
    model: ModelSpec
    tp: int = 1
    gpu_memory_utilization: float = 0.9
    gpu_total_bytes: float = 80 * C.GIB
    max_seq_len: int = 8192  # prompt + response of one sequence
    max_num_batched_tokens: int | None = None  # None: the version's default
    max_num_seqs: int | None = None  # None: the version's default
    enforce_eager: bool = False
    vllm_version: str = DEFAULT_VLLM_VERSION
    kv_cache_dtype: str = "auto"
    logprobs_mode: str = "raw_logprobs"  # the framework's (its VllmEngineFacts); vLLM's own default otherwise

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
            raise HpcrlError(f"vllm_gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_seq_len < 1:
            raise HpcrlError(f"sequence length must be positive, got {self.max_seq_len}")
        for flag, value in (
            ("--vllm-max-num-seqs", self.max_num_seqs),
            ("--vllm-max-num-batched-tokens", self.max_num_batched_tokens),
        ):
            if value is not None and value < 1:
                raise HpcrlError(f"{flag} must be a positive integer, got {value}")
        if self.logprobs_mode not in va.LOGPROBS_MODES:
            raise HpcrlError(f"vLLM logprobs_mode {self.logprobs_mode!r}; valid: {', '.join(va.LOGPROBS_MODES)}")
        if self.kv_cache_dtype not in va.KV_DTYPE_BYTES:
            raise HpcrlError(f"--kv-cache-dtype {self.kv_cache_dtype!r}; valid: {', '.join(va.KV_DTYPE_BYTES)}")
        va.accounting(self.vllm_version)
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
    concurrency: float = 0.0  # as vLLM prints it: blocks / blocks one max_model_len request needs
    graphs_in_budget: bool = False
    footprint: float = 0.0  # the budget plus what lives outside it (the graph pool before 0.21)
    warning: str | None = None
    vllm_version: str = DEFAULT_VLLM_VERSION
    batched_tokens: int = 0
    max_num_seqs: int = 0
    process_non_torch: float = 0.0  # the CUDA context and NCCL set-up vLLM's snapshot leaves out (derived)


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
    """KV pool, concurrency and verdict for one engine GPU, as vLLM `e.vllm_version` accounts them."""
    m, tp, acc = e.model, e.tp, va.accounting(e.vllm_version)
    weights = engine_weights_bytes(m, tp) + va.rope_cache_bytes(m)
    tokens = acc.batched_tokens(e.max_seq_len) if e.max_num_batched_tokens is None else e.max_num_batched_tokens
    seqs = acc.default_max_num_seqs if e.max_num_seqs is None else e.max_num_seqs
    # The forward's activations are freed before the sampler warm-up runs: the peak is the larger.
    act = max(va.forward_peak(m, tp, tokens), va.sampler_peak(m, min(tokens, seqs), acc, tokens, e.logprobs_mode))
    act += va.cublas_workspace(acc)
    graphs = 0.0 if e.enforce_eager else va.cuda_graph_pool()
    non_torch = acc.non_torch(tp)
    budget = va.requested_bytes(e.gpu_total_bytes, e.gpu_memory_utilization)
    kv = budget - weights - act - non_torch - (graphs if acc.graphs_in_budget else 0.0)
    per_token = m.kv_bytes_per_token(tp, va.KV_DTYPE_BYTES[e.kv_cache_dtype])
    blocks = va.kv_blocks(kv, per_token, acc.block_size)
    kv_tokens = blocks * acc.block_size
    conc = va.concurrency(blocks, e.max_seq_len, acc.block_size, acc.concurrency_rule)
    footprint = budget + (0.0 if acc.graphs_in_budget else graphs)
    one_seq = -(-e.max_seq_len // acc.block_size) * acc.block_size * per_token
    warning = None
    if kv <= 0:
        fits, reason = False, "weights and the profiling peak exceed the vLLM memory budget (vLLM refuses to start)"
    elif kv_tokens < e.max_seq_len:
        fits, reason = (
            False,
            (
                f"vLLM refuses to start: its KV pool holds {kv_tokens:,} tokens, fewer than one "
                f"{e.max_seq_len:,}-token sequence"
            ),
        )
    elif footprint > e.gpu_total_bytes:
        fits, reason = (
            False,
            (
                f"the engine's real footprint, {footprint / C.GIB:.2f} GiB (budget + CUDA graphs "
                f"outside it), exceeds the GPU's {e.gpu_total_bytes / C.GIB:.2f} GiB"
            ),
        )
    else:
        fits, reason = True, f"{conc:.2f}x sequences of {e.max_seq_len} tokens fit at once"
        if kv - one_seq < va.edge_spread():
            warning = (
                f"KV pool {kv / C.GIB:.2f} GiB is within the measured spread "
                f"({va.edge_spread() / C.GIB:.2f} GiB) of one {e.max_seq_len}-token sequence: vLLM may refuse"
            )
    return EngineMemory(
        weights=weights,
        activation_peak=act,
        cuda_graphs=graphs,
        non_torch=non_torch,
        budget=budget,
        kv_cache=max(kv, 0.0),
        kv_bytes_per_token=per_token,
        kv_tokens=kv_tokens,
        concurrent_seqs=int(conc),
        fits=fits,
        reason=reason,
        concurrency=conc,
        graphs_in_budget=acc.graphs_in_budget,
        footprint=footprint,
        warning=warning,
        vllm_version=acc.version,
        batched_tokens=tokens,
        max_num_seqs=seqs,
        process_non_torch=(C.CUDA_CONTEXT_GIB + (C.NCCL_BUFFERS_GIB if tp > 1 else 0.0)) * C.GIB,
    )


def kv_by_version(e: EngineSetup) -> dict[str, float]:
    """The KV pool (bytes) this engine gets under each vLLM version hpcrl has read, with the same scheduler
    sizes: how much the answer rests on the version."""
    return {v: engine_memory(replace(e, vllm_version=v)).kv_cache for v in va.known_versions()}
