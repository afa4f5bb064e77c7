"""Host RAM per node: learner processes, offloaded optimizer state, engines, Ray."""

from __future__ import annotations

from dataclasses import dataclass

from hpcrl.memory import constants as C

VLLM_HOST_GIB_PER_GPU = 4.0  # vLLM worker process resident memory (Python, torch, tokenizer)
RAY_HEAD_GIB = 2.0  # GCS, dashboard and raylet on the head node


@dataclass(frozen=True)
class HostMemory:
    ram_per_node: float
    kill_threshold: float
    peak: float
    terms: dict[str, float]

    @property
    def limit(self) -> float:
        return self.ram_per_node * self.kill_threshold

    @property
    def fits(self) -> bool:
        return self.peak <= self.limit


def host_memory(
    ram_per_node_bytes: float,
    learners_per_node: int,
    offload_bytes_per_learner: float,
    engine_gpus_per_node: int,
    kill_threshold: float = 0.95,
) -> HostMemory:
    """Peak host RAM on the busiest node against Ray's memory-monitor kill threshold."""
    terms = {
        "learner processes": learners_per_node * C.HOST_PROCESS_GIB * C.GIB,
        "offloaded optimizer state (pinned)": learners_per_node * offload_bytes_per_learner,
        "vLLM workers": engine_gpus_per_node * VLLM_HOST_GIB_PER_GPU * C.GIB,
        "Ray (GCS, raylet)": RAY_HEAD_GIB * C.GIB,
    }
    return HostMemory(
        ram_per_node=ram_per_node_bytes,
        kill_threshold=kill_threshold,
        peak=sum(terms.values()),
        terms=terms,
    )
