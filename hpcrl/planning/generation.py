"""Generation time of a vLLM engine (pure): N sequences through the engine's own scheduler limits.

One engine (a TP group) generates `seqs` sequences of `response_len` tokens after `prompt_len` prompt
tokens. Its terms, each with its reason:

- **Concurrency**: at most min(max_num_seqs, the KV pool / the mean context P + R/2, seqs) sequences run
  at once. vLLM admits a request while its blocks fit and preempts the newest when the pool runs out,
  so the pool holds as many sequences as fit at their mean context (derived, not measured). They go
  C at a time, the remainder last (identical lengths finish together).
- **Decode step** at batch b and mean context c: a forward pass is bound by the slower of reading one
  GPU's weights and the batch's KV cache (b x c x KV bytes/token) from HBM, and its matmul FLOPs
  (2 x matmul params + attention's 4 x layers x q_dim x c per sequence, over TP): a roofline,
  max(bytes / (efficiency x HBM peak), FLOPs / (MFU x bf16 peak)); plus a fixed cost per step, a cost per
  sequence in the step (the engine's CPU work per request per step: scheduling, inputs, outputs; added to the
  GPU's time, not overlapped with it: assumed; its size fitted, it is what the runs at hundreds of concurrent
  sequences show beyond the roofline) and, under TP, two all-reduces per layer.
- **Prefill** in chunks of max_num_batched_tokens: each chunk is one more forward pass, bound the same
  way (the weights read once, the chunk's FLOPs with attention's T^2 term).

The constants are fitted by benchmarks/vllm_throughput/fit.py on published vLLM rows
(benchmarks/vllm_throughput/*.jsonl, each with its source); it prints the error on the rows the fit
left out, and the band the planner uses (GENERATION_LOW/HIGH) is the range of those held-out errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Fitted by benchmarks/vllm_throughput/fit.py (its output, rounded); see docs/plan.md.
DECODE_BW_EFFICIENCY = 0.75  # fraction of HBM peak a forward pass's weight and KV reads sustain
MATMUL_MFU = 0.45  # fraction of bf16 peak the matmuls sustain (prefill chunks and large decode batches)
STEP_OVERHEAD_S = 0.78e-3  # fixed cost of one forward pass on the V1 engine (scheduling, launches, sampling)
SEQ_STEP_S = 47.1e-6  # cost per sequence per decode step on the V1 engine (its CPU work for each running request)
# Band on the generation time: published / predicted on the held-out rows (fit.py prints them).
GENERATION_LOW = 0.60
GENERATION_HIGH = 1.75
GENERATION_BASIS = (
    "fitted on 28 of 43 published vLLM rows (18 batch-1 A100 vLLM 0.4.2, 25 large-batch on A100, "
    "H100, H200 and GB200, vLLM 0.8.2-0.11.0, TP 1-2); 15 held out: time off by median 23%, max 54%; "
    "the 9 large-batch ones median 23%, max 45% (benchmarks/vllm_throughput)"
)
TP_ALLREDUCE_S = 10e-6  # latency of one intra-node all-reduce; two per layer per forward pass (assumed)


@dataclass(frozen=True)
class Constants:
    """The model's fitted constants (fit.py passes candidates; the planner the committed ones)."""

    bw_efficiency: float = DECODE_BW_EFFICIENCY
    mfu: float = MATMUL_MFU
    step_overhead_s: float = STEP_OVERHEAD_S
    seq_step_s: float = SEQ_STEP_S


@dataclass(frozen=True)
class EngineWork:
    """What one engine does for one batch of requests (bytes per GPU of the TP group)."""

    weights_bytes: float  # one GPU's weights
    kv_bytes_per_token: float  # one GPU's KV cache per token
    kv_tokens: int  # the engine's KV pool, in tokens (whole blocks)
    max_num_seqs: int
    max_num_batched_tokens: int
    matmul_flops_per_token: float  # the whole model's: 2 x its matmul parameters
    layers: int
    q_dim: int
    tp: int
    seqs: int
    prompt_len: int
    response_len: int
    hbm_tbs: float
    bf16_tflops: float
    client_cap: int | None = None  # a client's own limit on requests in flight (a benchmark's max-concurrency)

    @property
    def mean_context(self) -> float:
        return self.prompt_len + self.response_len / 2

    @property
    def kv_concurrency(self) -> int:
        """Sequences the KV pool holds at their mean context (at least one: vLLM refuses to start otherwise)."""
        return max(1, int(self.kv_tokens // self.mean_context))

    @property
    def concurrency(self) -> int:
        limits = [self.seqs, self.max_num_seqs, self.kv_concurrency] + ([self.client_cap] if self.client_cap else [])
        return max(1, min(limits))

    @property
    def limited_by(self) -> str:
        c = self.concurrency
        for name, value in (
            ("sequences", self.seqs),
            ("max_num_seqs", self.max_num_seqs),
            ("KV pool", self.kv_concurrency),
            ("client", self.client_cap or c + 1),
        ):
            if value == c:
                return name
        return "sequences"

    @property
    def batches(self) -> list[tuple[int, int]]:
        """(batch size, how many such batches): C at a time, the remainder last."""
        c = self.concurrency
        full, rest = divmod(self.seqs, c)
        return [(c, full)] + ([(rest, 1)] if rest else [])

    @property
    def prefill_passes(self) -> int:
        return math.ceil(self.seqs * self.prompt_len / max(1, self.max_num_batched_tokens))


@dataclass(frozen=True)
class GenerationTime:
    """The generation time and its parts (seconds), as the model computes them."""

    total_s: float
    decode_s: float
    prefill_s: float
    decode_steps: int
    prefill_passes: int
    concurrency: int
    limited_by: str
    decode_bound: str  # "memory" or "compute": what bounds the full batch's decode step


def _pass_s(read_bytes: float, flops: float, e: EngineWork, k: Constants) -> tuple[float, str]:
    """One forward pass on one GPU: the slower of its HBM reads and its FLOPs, plus the fixed costs."""
    memory = read_bytes / (k.bw_efficiency * e.hbm_tbs * 1e12)
    compute = flops / (k.mfu * e.bf16_tflops * 1e12)
    allreduce = 2 * e.layers * TP_ALLREDUCE_S if e.tp > 1 else 0.0
    return max(memory, compute) + k.step_overhead_s + allreduce, "memory" if memory >= compute else "compute"


def decode_step_s(e: EngineWork, batch: int, k: Constants = Constants()) -> tuple[float, str]:
    """One decode step of `batch` sequences at the mean context: (seconds, what bounds it)."""
    ctx = e.mean_context
    read = e.weights_bytes + batch * ctx * e.kv_bytes_per_token
    flops = batch * (e.matmul_flops_per_token + 4.0 * e.layers * e.q_dim * ctx) / e.tp
    seconds, bound = _pass_s(read, flops, e, k)
    return seconds + batch * k.seq_step_s, bound


def generation_time(e: EngineWork, k: Constants = Constants()) -> GenerationTime:
    """Seconds for one engine to generate its sequences, with the parts."""
    decode, steps, bound = 0.0, 0, "memory"
    for i, (batch, count) in enumerate(e.batches):
        step, b = decode_step_s(e, batch, k)
        bound = b if i == 0 else bound
        decode += count * e.response_len * step
        steps += count * e.response_len
    n = e.prefill_passes
    flops = e.seqs * (e.prompt_len * e.matmul_flops_per_token + 2.0 * e.layers * e.q_dim * e.prompt_len**2) / e.tp
    prefill = n * _pass_s(e.weights_bytes, flops / max(1, n), e, k)[0] if e.prompt_len else 0.0
    return GenerationTime(decode + prefill, decode, prefill, steps, n, e.concurrency, e.limited_by, bound)


def generation_seconds(e: EngineWork, k: Constants = Constants()) -> float:
    """Seconds for one engine to generate its sequences."""
    return generation_time(e, k).total_s


__all__ = [
    "Constants",
    "DECODE_BW_EFFICIENCY",
    "EngineWork",
    "GENERATION_BASIS",
    "GENERATION_HIGH",
    "GENERATION_LOW",
    "GenerationTime",
    "MATMUL_MFU",
    "SEQ_STEP_S",
    "STEP_OVERHEAD_S",
    "decode_step_s",
    "generation_seconds",
    "generation_time",
]
