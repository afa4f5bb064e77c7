"""Generation time of a vLLM engine (pure): decode steps bound by HBM reads, plus prefill FLOPs.

One engine (a TP group) generates `seqs` sequences of `response_len` tokens after `prompt_len`
prompt tokens. At most `concurrent` run at once (the KV pool or max_num_seqs limits it), so the
sequences go in waves. Each decode step reads one GPU's share of the weights and of the batch's KV
cache (at the mean context, prompt + half the response) and pays a fixed per-step cost (kernel
launches, sampling, scheduling), plus two all-reduces per layer under TP. Prefill is the forward
FLOPs of the prompts, the attention T^2 term included.

The three efficiencies are fitted by benchmarks/vllm_throughput/fit.py on published vLLM rows
(benchmarks/vllm_throughput/cases.jsonl); it prints the error on the rows the fit left out, and
the band the planner uses (GENERATION_LOW/HIGH) is the range of those held-out errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Fitted by benchmarks/vllm_throughput/fit.py (its output, rounded); see docs/plan.md.
DECODE_BW_EFFICIENCY = 0.69  # fraction of HBM peak a decode step's reads sustain
DECODE_STEP_OVERHEAD_S = 3.87e-3  # fixed cost of one decode step (launches, sampling, scheduler)
PREFILL_MFU = 0.37  # fraction of bf16 peak the prefill sustains
# Band on the generation time: published / predicted on the held-out rows (fit.py prints them).
GENERATION_LOW = 0.81
GENERATION_HIGH = 2.00
GENERATION_BASIS = "fitted on 12 published vLLM rows (batch 1, A100), 6 held out: time off by median 17%, max 2x (benchmarks/vllm_throughput)"
TP_ALLREDUCE_S = 10e-6  # latency of one intra-node all-reduce; two per layer per step (assumed)


@dataclass(frozen=True)
class EngineWork:
    """What one engine does in one RL step, in the units the model needs (bytes per GPU of the TP group)."""

    weights_bytes: float  # one GPU's weights
    kv_bytes_per_token: float  # one GPU's KV cache per token
    layers: int
    active_params: float  # the whole model's, for prefill FLOPs
    q_dim: int
    tp: int
    seqs: int
    concurrent: int
    prompt_len: int
    response_len: int
    hbm_tbs: float
    bf16_tflops: float

    @property
    def waves(self) -> int:
        return math.ceil(self.seqs / max(1, self.concurrent))


def terms(e: EngineWork) -> tuple[float, float, float, float]:
    """(HBM-read seconds at peak, decode steps, prefill seconds at peak, all-reduce seconds): the
    generation time is a/efficiency + b*overhead + c/mfu + d."""
    batch = min(e.seqs, max(1, e.concurrent))
    ctx = e.prompt_len + e.response_len / 2
    steps = e.waves * e.response_len
    read = steps * (e.weights_bytes + batch * ctx * e.kv_bytes_per_token) / (e.hbm_tbs * 1e12)
    flops = e.seqs * (2.0 * e.active_params * e.prompt_len + 2.0 * e.layers * e.q_dim * e.prompt_len**2)
    prefill = flops / (e.tp * e.bf16_tflops * 1e12)
    allreduce = steps * 2 * e.layers * TP_ALLREDUCE_S if e.tp > 1 else 0.0
    return read, float(steps), prefill, allreduce


def generation_seconds(e: EngineWork, efficiency: float = DECODE_BW_EFFICIENCY,
                       overhead_s: float = DECODE_STEP_OVERHEAD_S, mfu: float = PREFILL_MFU) -> float:
    """Seconds for one engine to generate its sequences."""
    read, steps, prefill, allreduce = terms(e)
    return read / efficiency + steps * overhead_s + prefill / mfu + allreduce


__all__ = ["DECODE_BW_EFFICIENCY", "DECODE_STEP_OVERHEAD_S", "EngineWork", "GENERATION_BASIS", "GENERATION_HIGH",
           "GENERATION_LOW", "PREFILL_MFU", "generation_seconds", "terms"]
