"""How one vLLM version sizes its KV pool (pure arithmetic over data/vllm_accounting.json).

vLLM charges `ceil(total * gpu_memory_utilization)` with the weights, the torch peak of one
profiling run, the non-torch memory (V1: its growth over a snapshot taken after NCCL starts;
V0: everything outside torch) and, from 0.21 on, an estimate of the CUDA-graph pool; what is
left, cut to whole blocks, is the KV pool. Every rule here is cited per version in the data
file; the few figures no source gives are read from start-up logs and labelled "measured".
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
    non_torch_baseline: str  # "snapshot" (growth since worker start) or "process" (all non-torch)
    block_size: int
    default_max_num_seqs: int
    default_max_num_batched_tokens: int = 2048
    chunked_prefill_default_above_len: int | None = None
    chunked_prefill_batched_tokens: int | None = None
    sampler_bytes_per_logit: float | None = None  # derived from this version's sampler; None: the fitted figure
    sampler_buffer_rows: int = 0

    def batched_tokens(self, max_model_len: int) -> int:
        """vLLM's default tokens in the profiling forward: V0 without chunked prefill profiles a whole
        max_model_len; V1 built as the RL frameworks build it (AsyncLLMEngine.from_engine_args) 2048."""
        if self.engine == "v0":
            long = self.chunked_prefill_default_above_len and max_model_len > self.chunked_prefill_default_above_len
            return self.chunked_prefill_batched_tokens if long else max(max_model_len, 2048)
        return self.default_max_num_batched_tokens

    def non_torch(self, tp: int) -> float:
        """Non-torch bytes vLLM charges (measured from start-up logs, not derived)."""
        m = measured("non_torch_growth_gib")[self.non_torch_baseline]
        return (m["tp1"] if tp == 1 else m["tp_gt1"]) * C.GIB


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
                      sampler_buffer_rows=v.get("sampler_warmup", {}).get("buffer_rows", 0))


def forward_peak(m: ModelSpec, tp: int, tokens: int) -> float:
    """Torch peak of the profiling forward (derived): at the MLP, three hidden-size bf16 tensors
    (layer input, residual, normed input) beside the gate/up output and its activated half (3 x the
    intermediate size, sharded over TP)."""
    f = m.moe_intermediate_size * m.num_experts_per_tok if m.is_moe else m.intermediate_size
    return tokens * 2 * (3 * m.hidden_size + 3 * f / tp)


def sampler_peak(m: ModelSpec, rows: int, acc: Accounting, batched_tokens: int) -> float:
    """Torch peak of the sampler warm-up over `rows` x the full vocabulary (gathered on every TP rank).

    Where the version's sampler was read (data file 'sampler_warmup'), derived: the bf16 logits, their
    fp32 copy, the softmax probabilities and the exponential noise per logit, the top-k/top-p kernel's
    cached fp32 buffer of up to `buffer_rows` rows, and the forward's hidden states still held (all
    tokens, plus the sampled rows and their random stand-in). Elsewhere rows x vocab x the bytes per
    logit fitted by benchmarks/vllm_engine_check.py."""
    if acc.sampler_bytes_per_logit is None:
        return rows * m.vocab_size * measured("sampler_bytes_per_logit")["value"]
    logits = rows * m.vocab_size * acc.sampler_bytes_per_logit
    kernel_buffer = min(rows, acc.sampler_buffer_rows) * m.vocab_size * 4
    hidden = 2 * m.hidden_size * (batched_tokens + 2 * rows)
    return logits + kernel_buffer + hidden


def cuda_graph_pool() -> float:
    """The graph pool a captured engine keeps (measured from start-up logs, not derived)."""
    return measured("cuda_graph_pool_gib")["typical"] * C.GIB


def requested_bytes(total: float, util: float) -> float:
    return float(math.ceil(total * util))


def kv_blocks(kv_bytes: float, per_token: int, block_size: int) -> int:
    """Whole blocks of `block_size` tokens the pool holds (vLLM floors available // page // layers)."""
    return max(0, int(kv_bytes // (per_token * block_size)))


def concurrency(blocks: int, max_model_len: int, block_size: int) -> float:
    """vLLM's 'Maximum concurrency': blocks over the blocks one max_model_len request needs."""
    return blocks / -(-max_model_len // block_size)


def edge_spread() -> float:
    """How close to the one-sequence edge a pool may be before the verdict is a warning (measured)."""
    return measured("edge_spread_gib")["value"] * C.GIB
