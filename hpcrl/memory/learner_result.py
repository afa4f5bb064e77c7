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
    # The reserve the step needs where the card is smaller than peak_reserved: PyTorch's allocator gives
    # cached blocks of every stream back when an allocation fails and retries (FSDP: peak_reserved is a sum
    # of per-stream high-waters reached at different moments). None: peak_reserved itself.
    reserved_floor: float | None = None

    @property
    def reserved_need(self) -> float:
        """Reserved bytes the step needs on the GPU (peak_reserved, or its floor where that is lower)."""
        return self.peak_reserved if self.reserved_floor is None else min(self.peak_reserved, self.reserved_floor)

    @property
    def device_total(self) -> float:
        """What the step needs on the GPU: reserved (at most the floor the allocator can give cache back to)
        plus CUDA context and NCCL buffers; on a card with room nvidia-smi shows peak_reserved + non_torch."""
        return self.reserved_need + self.non_torch


def non_torch_bytes(n_gpus: int) -> float:
    """Outside PyTorch's allocator: the CUDA context, and NCCL buffers where ranks communicate."""
    return (C.CUDA_CONTEXT_GIB + (C.NCCL_BUFFERS_GIB if n_gpus > 1 else 0.0)) * C.GIB


__all__ = ["LearnerMemory", "non_torch_bytes"]
