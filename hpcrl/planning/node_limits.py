"""The node count a job may ask for: the machine, the partition's and the QOS's limits (pure)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcrl.errors import HpcrlError, PlanError

if TYPE_CHECKING:
    from hpcrl.profiles import ClusterProfile


def check_nodes(
    profile: ClusterProfile, nodes: int, partition: str | None = None, allow_over_limit: bool = False
) -> list[str]:
    """Errors (or warnings with allow_over_limit) for nodes beyond partition/QOS limits."""
    if nodes < 1:
        raise HpcrlError(f"--nodes must be at least 1, got {nodes}")
    machine = profile.slurm.system_nodes
    if machine and nodes > machine:
        # No allocation is larger than the machine: refused before any layout is planned.
        raise PlanError(f"--nodes {nodes}: {profile.name} has {machine:,} nodes in all; valid: 1 to {machine:,}")
    problems = []
    name = partition or profile.slurm.default_partition
    part = profile.slurm.partitions.get(name) if name else None
    gpus = nodes * profile.gpu.count_per_node
    if part and part.max_nodes and nodes > part.max_nodes:
        problems.append(f"{nodes} nodes exceed partition {name}'s limit of {part.max_nodes} nodes")
    if part and part.max_gpus and gpus > part.max_gpus:
        problems.append(f"{gpus} GPUs exceed partition {name}'s limit of {part.max_gpus} GPUs")
    if problems and not allow_over_limit:
        raise PlanError(problems[0] + " (pass --allow-over-limit if your allocation is larger)")
    qos = profile.slurm.qos
    if qos and qos.max_gpus and gpus > qos.max_gpus:
        # A per-project QOS cap is routinely raised for large projects, so it warns:
        # sbatch itself will hold the job (QOSMaxGRESPerAccount) if the cap is real.
        problems.append(
            f"{nodes} nodes = {gpus} GPUs exceed QOS {qos.name}'s default cap of {qos.max_gpus} GPUs "
            f"({qos.max_gpus // profile.gpu.count_per_node} nodes); fine if your project's limit was raised"
        )
    return problems
