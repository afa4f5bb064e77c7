"""An engine's generation time for N sequences, from the engine the memory planner sized (pure).

The bridge between hpcrl/memory/engine.py (weights, KV pool, the vLLM version's scheduler sizes) and
hpcrl/planning/generation.py (the time model): the layout planner's step estimate and plan-memory's
`--sequences` both ask it, so the two cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from hpcrl.memory.engine import EngineMemory
from hpcrl.models.spec import ModelSpec
from hpcrl.planning.generation import GENERATION_BASIS, GENERATION_HIGH, GENERATION_LOW, EngineWork, GenerationTime


def matmul_flops_per_token(m: ModelSpec) -> float:
    """2 x the parameters a token multiplies through (the embedding is a lookup, not a matmul)."""
    return 2.0 * (m.active_params - m.embedding_params)


def engine_work(
    eng: EngineMemory,
    m: ModelSpec,
    tp: int,
    seqs: int,
    prompt_len: int,
    response_len: int,
    hbm_tbs: float,
    bf16_tflops: float,
) -> EngineWork:
    """The work of one engine sized as `eng` (its KV pool and the vLLM version's scheduler sizes)."""
    return EngineWork(
        weights_bytes=eng.weights,
        kv_bytes_per_token=eng.kv_bytes_per_token,
        kv_tokens=eng.kv_tokens,
        max_num_seqs=eng.max_num_seqs,
        max_num_batched_tokens=eng.batched_tokens,
        matmul_flops_per_token=matmul_flops_per_token(m),
        layers=m.num_layers,
        q_dim=m.q_dim,
        tp=tp,
        seqs=seqs,
        prompt_len=prompt_len,
        response_len=response_len,
        hbm_tbs=hbm_tbs,
        bf16_tflops=bf16_tflops,
    )


def time_dict(t: GenerationTime, e: EngineWork) -> dict[str, Any]:
    """plan-memory's `engine.time`: the mid estimate, its band and basis, and the parts it adds up."""
    return {
        "sequences": e.seqs,
        "prompt_len": e.prompt_len,
        "response_len": e.response_len,
        "generation_s": round(t.total_s, 1),
        "generation_low_s": round(t.total_s * GENERATION_LOW, 1),
        "generation_high_s": round(t.total_s * GENERATION_HIGH, 1),
        "band": [GENERATION_LOW, GENERATION_HIGH],
        "basis": GENERATION_BASIS,
        "concurrency": t.concurrency,
        "concurrency_limited_by": t.limited_by,
        "kv_concurrency": e.kv_concurrency,
        "max_num_seqs": e.max_num_seqs,
        "decode_s": round(t.decode_s, 1),
        "decode_steps": t.decode_steps,
        "decode_bound": t.decode_bound,
        "prefill_s": round(t.prefill_s, 1),
        "prefill_passes": t.prefill_passes,
        "max_num_batched_tokens": e.max_num_batched_tokens,
        "output_tokens_per_s": round(e.seqs * e.response_len / t.total_s, 1) if t.total_s else None,
    }


__all__ = ["engine_work", "matmul_flops_per_token", "time_dict"]
