"""What a learner memory model returns (the ZeRO model in learner.py, the FSDP one in fsdp_learner.py)."""

from __future__ import annotations

from dataclasses import dataclass

from hpcrl.memory import constants as C


@dataclass(frozen=True)
class LearnerMemory:
    """Result: the terms of the peak (bytes) and which moment of the step it is."""

    terms: dict[str, float]
    phase: str
    phases: dict[str, float]  # allocated bytes at each moment of the step; the largest is the peak
    peak_allocated: float
    peak_reserved: float
    non_torch: float
    trainable_params: int
    host_offload_bytes: float
    reference_host_bytes: float = 0.0  # a reference copy the framework always keeps in host RAM
    # a reference policy in its own process on this GPU (already inside non_torch): weights + context
    reference_process_bytes: float = 0.0

    @property
    def device_total(self) -> float:
        """What nvidia-smi would show: reserved plus CUDA context and NCCL buffers."""
        return self.peak_reserved + self.non_torch


def non_torch_bytes(n_gpus: int) -> float:
    """Outside PyTorch's allocator: the CUDA context, and NCCL buffers where ranks communicate."""
    return (C.CUDA_CONTEXT_GIB + (C.NCCL_BUFFERS_GIB if n_gpus > 1 else 0.0)) * C.GIB


__all__ = ["LearnerMemory", "non_torch_bytes"]
