"""Host RAM per node: learner processes, offloaded optimizer state, engines, Ray (for a job that runs it)."""

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
    # Ray's memory monitor kills workers at kill_threshold of the node's RAM; a job without Ray (TRL's
    # processes) meets the kernel's OOM killer or Slurm's cgroup limit at the node's RAM (threshold 1).
    ray: bool = True

    @property
    def limit(self) -> float:
        return self.ram_per_node * self.kill_threshold

    @property
    def killer(self) -> str:
        """What ends the job when host RAM passes the limit."""
        return (
            "Ray kills workers there"
            if self.ray
            else "no Ray here: the kernel's OOM killer or Slurm's cgroup limit ends a process there"
        )

    @property
    def fits(self) -> bool:
        return self.peak <= self.limit


def host_memory(
    ram_per_node_bytes: float,
    learners_per_node: int,
    offload_bytes_per_learner: float,
    engine_gpus_per_node: int,
    kill_threshold: float = 0.95,
    ray: bool = True,
) -> HostMemory:
    """Peak host RAM on the busiest node against Ray's memory-monitor kill threshold (with `ray`), else
    against the node's RAM: a job without Ray has no GCS or raylet and no memory monitor."""
    terms = {
        "learner processes": learners_per_node * C.HOST_PROCESS_GIB * C.GIB,
        "offloaded optimizer state (pinned)": learners_per_node * offload_bytes_per_learner,
        "vLLM workers": engine_gpus_per_node * VLLM_HOST_GIB_PER_GPU * C.GIB,
    } | ({"Ray (GCS, raylet)": RAY_HEAD_GIB * C.GIB} if ray else {})
    return HostMemory(
        ram_per_node=ram_per_node_bytes,
        kill_threshold=kill_threshold if ray else 1.0,
        peak=sum(terms.values()),
        terms=terms,
        ray=ray,
    )
