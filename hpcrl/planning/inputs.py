"""A request's inputs, resolved once: the run config, the cluster profile the job sees (its node type and
GPU share), the profile's other node types, the backend at the version the run targets, and the node
count, checked against the cluster's limits (pure).

`plan`, `render`, `submit` (hpcrl/planning/run_plan.py), `plan-memory --config`, `plan-disk --config`
and `preflight --config` start from one `RunInputs`; nothing below them loads the config or resolves
the profile again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcrl.errors import HpcrlError
from hpcrl.planning.backends import get_backend
from hpcrl.planning.config import load_run_config
from hpcrl.planning.node_limits import check_nodes
from hpcrl.planning.node_share import job_profile
from hpcrl.planning.walltime import check_time
from hpcrl.profiles import ClusterProfile, resolve_profile

if TYPE_CHECKING:
    from hpcrl.planning.run_types import RunConfig
    from hpcrl.profiles import Partition


@dataclass(frozen=True)
class RunInputs:
    """What one request plans from, each resolved once."""

    config: RunConfig
    profile: ClusterProfile  # the job's node type, with its share of a node (--gpus) applied
    other_node_types: tuple[ClusterProfile, ...]  # the profile's other variants, with the same share
    nodes: int
    backend: Any  # the config's Backend (hpcrl/planning/backends/base.py)
    framework: str | None  # the framework version the run targets ("verl 0.9.1"); None: not versioned
    assumed: str | None  # what the plan assumed about that version where the config names none
    partition: str | None
    partition_limits: Partition | None
    allow_over_limit: bool
    warnings: tuple[str, ...]  # node and time limits passed over by --allow-over-limit, QOS caps

    @property
    def wall_time(self) -> str | None:
        """The job's wall time: hpcrl.time, else the partition's limit."""
        return self.config.hpcrl.time or (self.partition_limits.max_time if self.partition_limits else None)


def resolve_config_profile(
    config: str | None,
    sets: list[str] | None,
    cluster: str | None,
    cluster_file: str | Path | None,
    gpus: int | None,
    nodes: int | None = 1,
) -> tuple[RunConfig, ClusterProfile]:
    """The config and the profile its job sees (the cluster flag over the config's, --gpus over hpcrl.gpus)."""
    cfg = load_run_config(config, sets)
    job_gpus = gpus if gpus is not None else cfg.hpcrl.gpus
    return cfg, job_profile(resolve_profile(cluster or cfg.hpcrl.cluster, cluster_file), job_gpus, nodes)


def resolve_inputs(
    config: str | None = None,
    *,
    nodes: int | None = None,
    cluster: str | None = None,
    cluster_file: str | None = None,
    sets: list[str] | None = None,
    gpus: int | None = None,
    allow_over_limit: bool = False,
) -> RunInputs:
    """Load the config, resolve the cluster (node type, GPU share, other node types) and the backend, and
    check the node count and wall time against the cluster's limits."""
    cfg = load_run_config(config, sets)
    hp = cfg.hpcrl
    whole = resolve_profile(cluster or hp.cluster, cluster_file)
    job_gpus = gpus if gpus is not None else hp.gpus
    n = nodes if nodes is not None else hp.nodes if hp.nodes is not None or job_gpus is None else 1
    if n is None:
        raise HpcrlError("number of nodes not given: pass --nodes N or set hpcrl.nodes in the config")
    if n < 1:
        raise HpcrlError(f"--nodes must be at least 1, got {n}")  # the config's own is checked on load
    allow = allow_over_limit or hp.allow_over_limit
    warnings = check_nodes(whole, n, hp.partition, allow)
    profile = job_profile(whole, job_gpus, n)
    part_name = hp.partition or profile.slurm.default_partition
    part = profile.slurm.partitions.get(part_name) if part_name else None
    warnings += check_time(hp.time, part_name, part.max_time if part else None, allow)
    others = tuple(
        job_profile(resolve_profile(cluster or hp.cluster, cluster_file, variant=v), job_gpus, n)
        for v in profile.variants
        if v != profile.variant
    )
    backend = get_backend(hp.backend)
    framework, assumed = backend.target_version(hp)
    return RunInputs(cfg, profile, others, n, backend, framework, assumed, part_name, part, allow, tuple(warnings))


__all__ = ["RunInputs", "resolve_config_profile", "resolve_inputs"]
