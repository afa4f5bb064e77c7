"""How one vLLM version sizes its KV pool (pure arithmetic over data/vllm_accounting.json).

vLLM charges `total * gpu_memory_utilization` (0.19 on: its ceiling) with the weights, the torch peak
of one profiling run, the non-torch memory (from 0.11: its growth over a snapshot taken after NCCL
starts; 0.9-0.10: a snapshot taken before NCCL starts; V0 and V1 0.8.5: everything outside torch)
and, from 0.21 on, an estimate of the CUDA-graph pool; what is left, cut to whole blocks, is the KV
pool. Every rule here is cited per version in the data file; the few figures no source gives are
read from start-up logs and labelled "measured".
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from hpcrl.errors import HpcrlError
from hpcrl.memory import constants as C
from hpcrl.models.spec import ModelSpec

_DATA = Path(__file__).with_name("data") / "vllm_accounting.json"
KV_DTYPE_BYTES = {"auto": 2, "fp8": 1}


@lru_cache(maxsize=1)
def _data() -> dict:
    return json.loads(_DATA.read_text())


def known_versions() -> list[str]:
    return sorted(_data()["versions"], key=lambda v: tuple(int(x) for x in v.split(".")[:3]))


@dataclass(frozen=True)
class VllmEngineFacts:
    """The vLLM a framework installs and the scheduler sizes it gives its engines, with the source
    (each backend's MemoryFacts.vllm; planning/backends/facts.py)."""

    version: str
    max_num_batched_tokens: int
    max_num_seqs: int
    source: str
    enforce_eager: bool = False  # the run's own setting, where its framework passes one to vLLM


def default_engine() -> VllmEngineFacts:
    """The engine facts a run gets when no backend gives its own (data/vllm_accounting.json default_engine)."""
    return VllmEngineFacts(**_data()["default_engine"])


def measured(key: str) -> dict:
    return _data()["measured"][key]


@dataclass(frozen=True)
class Accounting:
    """The rules of one vLLM version (cited in data/vllm_accounting.json)."""

    version: str
    engine: str  # "v0" or "v1"
    graphs_in_budget: bool
    non_torch_baseline: str  # "snapshot" (growth since worker start, after NCCL), "snapshot_before_nccl", "process"
    block_size: int
    default_max_num_seqs: int
    default_max_num_batched_tokens: int = 2048
    chunked_prefill_default_above_len: int | None = None
    chunked_prefill_batched_tokens: int | None = None
    sampler_bytes_per_logit: float | None = None  # derived from this version's sampler; None: the fitted figure
    sampler_buffer_rows: int = 0
    sampler_holds_forward: bool = True  # profile_run keeps the forward's hidden states through the warm-up
    concurrency_rule: str = "blocks"  # "blocks": blocks / blocks per request; "tokens": tokens / max_model_len

    def batched_tokens(self, max_model_len: int) -> int:
        """vLLM's default tokens in the profiling forward: V0 without chunked prefill profiles a whole
        max_model_len; V1 built as the RL frameworks build it (AsyncLLMEngine.from_engine_args) 2048."""
        if self.engine == "v0":
            long = self.chunked_prefill_default_above_len and max_model_len > self.chunked_prefill_default_above_len
            return self.chunked_prefill_batched_tokens if long else max(max_model_len, 2048)
        return self.default_max_num_batched_tokens

    def non_torch(self, tp: int) -> float:
        """Non-torch bytes vLLM charges (measured from start-up logs per TP, not derived; a TP with no log takes
        the largest logged TP below it). A snapshot taken before NCCL starts also charges NCCL's set-up at
        TP > 1 (hpcrl's NCCL figure, not measured at that version)."""
        before_nccl = self.non_torch_baseline == "snapshot_before_nccl"
        by_tp = measured("non_torch_growth_gib")["snapshot" if before_nccl else self.non_torch_baseline]["by_tp"]
        gib = by_tp[str(max(t for t in map(int, by_tp) if t <= tp))]
        return (gib + (C.NCCL_BUFFERS_GIB if before_nccl and tp > 1 else 0.0)) * C.GIB


def accounting(version: str) -> Accounting:
    """The accounting of `version`; a version not read from source is refused, naming those that were."""
    v = _data()["versions"].get(version)
    if v is None:
        raise HpcrlError(f"--vllm-version {version!r}: hpcrl has not read that vLLM's memory accounting; "
                         f"valid: {', '.join(known_versions())}")
    return Accounting(version=version, engine=v["engine"], graphs_in_budget=v["graphs_in_budget"],
                      non_torch_baseline=v["non_torch_baseline"], block_size=v["block_size"],
                      default_max_num_seqs=v["default_max_num_seqs"],
                      default_max_num_batched_tokens=v.get("default_max_num_batched_tokens", 2048),
                      chunked_prefill_default_above_len=v.get("chunked_prefill_default_above_len"),
                      chunked_prefill_batched_tokens=v.get("chunked_prefill_batched_tokens"),
                      sampler_bytes_per_logit=v.get("sampler_warmup", {}).get("bytes_per_logit"),
                      sampler_buffer_rows=v.get("sampler_warmup", {}).get("buffer_rows", 0),
                      sampler_holds_forward=v.get("sampler_warmup", {}).get("holds_forward_hidden_states", True),
                      concurrency_rule=v.get("concurrency_rule", "blocks"))


def forward_peak(m: ModelSpec, tp: int, tokens: int) -> float:
    """Torch peak of the profiling forward (derived): at the MLP, three hidden-size bf16 tensors
    (layer input, residual, normed input) beside the gate/up output and its activated half (3 x the
    intermediate size, sharded over TP)."""
    f = m.moe_intermediate_size * m.num_experts_per_tok if m.is_moe else m.intermediate_size
    return tokens * 2 * (3 * m.hidden_size + 3 * f / tp)


def sampler_peak(m: ModelSpec, rows: int, acc: Accounting, batched_tokens: int) -> float:
    """Torch peak of the sampler warm-up over `rows` x the full vocabulary (gathered on every TP rank).

    Where the version's sampler was read (data file 'sampler_warmup'), derived: the bytes per logit
    live at the warm-up's peak (0.19.1, Triton top-k/top-p: bf16 logits, fp32 copy, probabilities and
    noise; 0.8.5-0.11, top-k/top-p by sorting the vocabulary: the sort's values, indices and scratch
    beside the logits), the Triton kernel's cached fp32 buffer of up to `buffer_rows` rows, and the
    hidden states still held (from 0.9 all the forward's tokens plus the sampled rows and their
    random stand-in; 0.8.5 the sampled rows only). Elsewhere rows x vocab x the bytes per logit
    fitted by benchmarks/vllm_engine_check.py."""
    if acc.sampler_bytes_per_logit is None:
        return rows * m.vocab_size * measured("sampler_bytes_per_logit")["value"]
    logits = rows * m.vocab_size * acc.sampler_bytes_per_logit
    kernel_buffer = min(rows, acc.sampler_buffer_rows) * m.vocab_size * 4
    hidden = 2 * m.hidden_size * ((batched_tokens + 2 * rows) if acc.sampler_holds_forward else rows)
    return logits + kernel_buffer + hidden


def cublas_workspace(acc: Accounting) -> float:
    """PyTorch's cuBLAS (32 MiB on Hopper) and cuBLASLt (1 MiB) workspaces, taken from the caching allocator
    at the first GEMM on the profiling stream, so inside V1's torch peak increase (derived; data file 'torch')."""
    return float(_data()["torch"]["cublas_workspace_bytes"]) if acc.engine == "v1" else 0.0


def rope_cache_bytes(m: ModelSpec) -> float:
    """The rotary cos/sin cache vLLM builds while loading (derived): one buffer of max_position_embeddings x
    head_dim in the model dtype (bf16), shared by every layer, inside 'Model loading took'."""
    return m.max_position_embeddings * m.head_dim * 2.0


def cuda_graph_pool() -> float:
    """The graph pool a captured engine keeps (measured from start-up logs, not derived)."""
    return measured("cuda_graph_pool_gib")["typical"] * C.GIB


def requested_bytes(total: float, util: float) -> float:
    return float(math.ceil(total * util))


def kv_blocks(kv_bytes: float, per_token: int, block_size: int) -> int:
    """Whole blocks of `block_size` tokens the pool holds (vLLM floors available // page // layers)."""
    return max(0, int(kv_bytes // (per_token * block_size)))


def concurrency(blocks: int, max_model_len: int, block_size: int, rule: str = "blocks") -> float:
    """vLLM's 'Maximum concurrency': blocks over the blocks one max_model_len request needs (0.8.5: the
    pool's tokens over max_model_len)."""
    if rule == "tokens":
        return blocks * block_size / max_model_len
    return blocks / -(-max_model_len // block_size)


def edge_spread() -> float:
    """How close to the one-sequence edge a pool may be before the verdict is a warning (measured)."""
    return measured("edge_spread_gib")["value"] * C.GIB
