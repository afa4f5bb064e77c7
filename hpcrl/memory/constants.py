"""Constants of the memory model, each with where it comes from.

Those marked *fitted* are least-squares fits against the fit split of the committed calibration
rows (`benchmarks/results/*.jsonl`, split in `benchmarks/fit_split.txt`); `python benchmarks/fit.py`
recomputes them and reports the error on the held-out rows, `--check` fails where they differ.
Everything else is DeepSpeed's or PyTorch's own definition.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class ZeroDefaults:
    """DeepSpeed ZeRO settings the planner assumes (DeepSpeed's own defaults)."""

    reduce_bucket_size: int = 500_000_000  # elements; stage 3 keeps one bf16 bucket of this size
    prefetch_bucket_size: int = 50_000_000  # elements gathered ahead of use
    max_live_parameters: int = 1_000_000_000
    param_persistence_threshold: int = 100_000  # params smaller than this stay whole on every rank
    sub_group_size: int = 1_000_000_000  # elements the optimizer steps at once


# Bytes per element of the [tokens x vocab] logits at the moment the log-prob path peaks
# (start of backward): the bf16 logits kept by the model output, the fp32 log_softmax
# output saved for backward, its incoming fp32 gradient and the fp32 result.  *fitted*
# 2 of them are the bf16 logits the model output keeps; open-instruct's out-of-place
# `logits / temperature` adds LOGITS_COPY_BYTES more. The rest is the path: eager keeps
# the fp32 log_softmax output and its fp32 gradient and result (10 bytes); the compiled
# kernel only produces the bf16 gradient of its input (2 bytes).  *fitted* (whole bytes), except
# LOGITS_HELD_BYTES: it always adds to the path's bytes, so only the sum is fitted.
LOGITS_HELD_BYTES = 2.0
LOGITS_COPY_BYTES = 2.0
LOGITS_BYTES_PER_ELEMENT = {"eager": 10.0, "compiled": 2.0}

# A log-prob path that casts the logits to fp32 in place of the bf16 ones (the bf16 tensor is freed)
# and takes log-probs with flash-attn's Triton cross-entropy: at the start of backward it holds the
# fp32 logits (4), the kernel's new fp32 gradient (4, cross_entropy.py:262 at flash-attn v2.8.3) and
# the bf16 gradient of the cast (2).  *derived* from OpenRLHF 3c3be623 models/actor.py:267 and
# models/utils.py:143-150; checked against benchmarks/results/openrlhf_measured.jsonl.
# FP32_LOGITS_BYTES: the fp32 logits the step's output object keeps until the step returns
# (trainer/ray/ppo_actor.py:294, 354-359), so they are alive at the optimizer step.  *derived*
FP32_LOGITS_PATH_BYTES = 10.0
FP32_LOGITS_BYTES = 4.0

# TRL's fused LM head projects [TOKEN_CHUNK_SIZE x chunk_size] bf16 tiles: 4096 tokens
# (kernels/chunked_logprob.py:30 at TRL 1.16.0) by 32768 vocabulary columns (_CHUNKED_LOGPROB_CHUNK_SIZE,
# trl/trainer/utils.py:1506).  *derived*
FUSED_TILE_BYTES = 2.0 * 4096 * 32768

# TRL's batches are padded sequences with an attention mask (no packing): at the logits and recompute
# moments a [rows x heads x seq x seq] term appears, PADDED_ATTENTION_BYTES per element; with tied
# embeddings gathered at N > 1 the fused head holds FUSED_TIED_COPIES more bf16 copies of the shared
# [vocab x hidden] matrix. Both *fitted* (benchmarks/fit_trl.py, the fit rows of
# benchmarks/results/trl_measured.jsonl; the tied term rests on two fit rows and no held-out one). Not traced
# to a tensor: the masked SDPA path (transformers falls back from GQA kernels with a mask,
# integrations/sdpa_attention.py:27-36) is the likely owner of the first.
PADDED_ATTENTION_BYTES = 0.8
FUSED_TIED_COPIES = 3.5

# Activation bytes one token leaves per decoder layer without checkpointing, as
#   a_h * hidden + a_f * intermediate + a_q * q_dim + a_kv * kv_dim
# Derived from what HF's RMSNorm (fp32 upcast), rotary, SDPA and SwiGLU save for
# backward in bf16: 12h + 8F + 10q + 8kv.  *checked* against the gc on/off rows.
ACT_COEFF = {"h": 12.0, "f": 8.0, "q": 10.0, "kv": 8.0}

# Optimizer step: bytes per element of one sub-group held on top of the states.  *fitted*
STEP_BYTES_PER_ELEMENT = 6.0

# Allocator: reserved = allocated * (1 + RESERVE_FRACTION) + RESERVE_FIXED_GIB
#   + RESERVE_LOGITS * (largest logits tensor: fp32 on the eager path, bf16 compiled).
# The caching allocator's slack grows with the size of the blocks it had to split; a
# least-squares fit over the fit rows (residuals up to ~10.6 GiB: reserved memory is
# noisy by nature, allocated is what the planner is held to).  *fitted*
RESERVE_FRACTION = 0.065
RESERVE_FIXED_GIB = 2.55
RESERVE_LOGITS = 0.31

# Allocator margin: reserved memory (what actually runs out) scatters around the fit above, by
# more in larger runs. A plan "fits" only with max(floor, fraction x its peak reserved) left
# free, per log-prob path: the fraction is the largest (measured - fitted) / fitted reserved
# among the committed rows whose fitted reserved is 24 GiB or more, the floor the largest
# absolute excess among the smaller ones (the fit rows: compiled 19 + 4 rows, 6.09% at
# Qwen2.5-7B on 4 GPUs x 16k and 3.05 GiB; eager 36 + 5 rows, 10.34% at Qwen2.5-7B on 2 GPUs x 16k
# and 0.16 GiB), rounded up. tests/test_memory.py checks the held-out rows lie inside it.
# *measured spread*, not a model of fragmentation: 5.8 GiB on a 95 GiB compiled peak.
ALLOCATOR_MARGIN = {"compiled": (0.061, 3.1), "eager": (0.104, 0.2)}  # (fraction, floor GiB)
# TRL's fused head, from the fit rows of trl_measured.jsonl (benchmarks/fit_trl.py, which checks it): 13.5% at
# Qwen2.5-3B on 2 GPUs; no smaller fit row reserved more than its fit.  *measured spread*
FUSED_HEAD_MARGIN = (0.14, 0.2)

# Fixed allocations not proportional to model size (RNG state, cuBLAS workspaces, small
# persistent parameters, communication scratch).  *fitted* (to 0.05 GiB)
FIXED_ALLOC_GIB = 0.1

# Memory outside PyTorch's allocator on every GPU process: CUDA context and kernels
# (~0.5 GiB on Hopper with torch 2.x), NCCL communicator buffers.  Measured as
# nvidia-smi used minus torch reserved on an idle initialised process.
CUDA_CONTEXT_GIB = 0.6
NCCL_BUFFERS_GIB = 0.4

# Host side: resident memory of one learner process (Python, torch, DeepSpeed, Ray actor)
# before any offloaded state.
HOST_PROCESS_GIB = 6.0

# vLLM's scheduler sizes (max_num_seqs, max_num_batched_tokens) are per version and framework: each
# backend's VllmEngineFacts and hpcrl/memory/data/vllm_accounting.json carry them, with sources.
VLLM_CUDA_GRAPH_GIB = 1.0  # captured graphs' private pool, typical for 7B-70B at TP 1-4
