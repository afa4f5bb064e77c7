"""Fill in what the user left out of a memory question: the engine's TP."""

from __future__ import annotations

from hpcrl.memory.engine import EngineSetup, engine_memory
from hpcrl.profiles import ClusterProfile


def smallest_fitting_tp(profile: ClusterProfile, engine: EngineSetup) -> int | None:
    """Smallest TP vLLM accepts for the model (within a node) whose engine fits, or None."""
    for tp in engine.model.tp_sizes(profile.gpu.count_per_node):
        candidate = EngineSetup(**{**engine.__dict__, "tp": tp, "gpu_total_bytes": profile.gpu_bytes})
        if engine_memory(candidate).fits:
            return tp
    return None
