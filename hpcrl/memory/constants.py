"""Constants of the memory model, each with where it comes from.

Those marked *fitted* are least-squares fits against the committed calibration rows
(`benchmarks/results/*.jsonl`, `hpcrl/memory/calibration_given.jsonl`); `benchmarks/fit.py`
recomputes them. Everything else is DeepSpeed's or PyTorch's own definition.
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
# kernel only produces the bf16 gradient of its input (2 bytes).  *fitted*
LOGITS_HELD_BYTES = 2.0
LOGITS_COPY_BYTES = 2.0
LOGITS_BYTES_PER_ELEMENT = {"eager": 10.0, "compiled": 2.0}

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
# least-squares fit over the committed rows (residuals up to ~7 GiB: reserved memory is
# noisy by nature, allocated is what the planner is held to).  *fitted*
RESERVE_FRACTION = 0.055
RESERVE_FIXED_GIB = 2.35
RESERVE_LOGITS = 0.39

# Allocator margin: reserved memory (what actually runs out) scatters around the fit above, by
# more in larger runs. A plan "fits" only with max(floor, fraction x its peak reserved) left
# free, per log-prob path: the fraction is the largest (measured - fitted) / fitted reserved
# among the committed rows whose fitted reserved is 24 GiB or more, the floor the largest
# absolute excess among the smaller ones (benchmarks/results/*.jsonl: compiled 22 + 4 rows,
# 6.44% and 3.17 GiB; eager 46 + 7 rows, 10.57% and 1.09 GiB; both largest at Qwen2.5-7B on
# 2 GPUs x 16k tokens), rounded up. So every committed row lies inside it (tests/test_memory.py).
# *measured spread*, not a model of fragmentation: 6.2 GiB on a 95 GiB compiled peak.
ALLOCATOR_MARGIN = {"compiled": (0.065, 3.2), "eager": (0.106, 1.1)}  # (fraction, floor GiB)

# Fixed allocations not proportional to model size (RNG state, cuBLAS workspaces, small
# persistent parameters, communication scratch).  *fitted*
FIXED_ALLOC_GIB = 0.25

# Memory outside PyTorch's allocator on every GPU process: CUDA context and kernels
# (~0.5 GiB on Hopper with torch 2.x), NCCL communicator buffers.  Measured as
# nvidia-smi used minus torch reserved on an idle initialised process.
CUDA_CONTEXT_GIB = 0.6
NCCL_BUFFERS_GIB = 0.4

# Host side: resident memory of one learner process (Python, torch, DeepSpeed, Ray actor)
# before any offloaded state.
HOST_PROCESS_GIB = 6.0

# vLLM defaults (V1 engine) used by the engine model.
VLLM_MAX_NUM_BATCHED_TOKENS = 8192
VLLM_MAX_NUM_SEQS = 256
VLLM_CUDA_GRAPH_GIB = 1.0  # captured graphs' private pool, typical for 7B-70B at TP 1-4
