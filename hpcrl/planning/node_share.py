"""Jobs with part of a node (`--gpus N`): the profile such a job sees, from how the site shares a node.

Pure. The profile's `slurm.node_sharing` says what a job gets with each GPU: "proportional" (the
site hands out cores and memory with the GPUs; the script asks only --cpus-per-gpu), "per-gpu"
(the script asks --cpus-per-gpu and --mem-per-gpu itself) or "whole-nodes" (refused). A profile
that says nothing gets the node's cores and RAM divided by its GPUs, asked per GPU.
"""

from __future__ import annotations

from hpcrl.errors import ProfileError
from hpcrl.profiles import ClusterProfile


def gpu_share(profile: ClusterProfile) -> tuple[int, float, str]:
    """Cores and host RAM (GiB) one GPU's share of a node brings, and what that rests on."""
    g, share = profile.gpu.count_per_node, profile.slurm.node_sharing
    cpus = (
        share.cpus_per_gpu
        if share and share.cpus_per_gpu
        else profile.slurm.cpus_per_gpu or profile.node.cpu_cores // g
    )
    mem = share.mem_per_gpu_gib if share and share.mem_per_gpu_gib else profile.node.ram_gib / g
    basis = (
        f"slurm.node_sharing {share.mode}"
        if share
        else "the node's cores and RAM divided by its GPUs (the profile has no slurm.node_sharing)"
    )
    return cpus, mem, basis


def for_gpus(profile: ClusterProfile, n: int) -> ClusterProfile:
    """The profile as one job with `n` of a node's GPUs sees it: a node of n GPUs with their share of
    cores and RAM, not exclusive. The whole node's profile when n is all of them."""
    g, share = profile.gpu.count_per_node, profile.slurm.node_sharing
    if n == g:
        return profile
    if share and share.mode == "whole-nodes":
        raise ProfileError(
            f"--gpus {n}: cluster {profile.name} gives whole nodes only "
            "(slurm.node_sharing.mode whole-nodes); drop --gpus"
        )
    cpus, mem, _ = gpu_share(profile)
    ray = profile.ray.model_copy(update={"num_cpus_per_node": min(profile.ray.num_cpus_per_node or n * cpus, n * cpus)})
    return profile.model_copy(
        update={
            "gpu": profile.gpu.model_copy(update={"count_per_node": n}),
            "node": profile.node.model_copy(update={"cpu_cores": n * cpus, "ram_gib": n * mem}),
            "slurm": profile.slurm.model_copy(update={"exclusive": False, "mem": None}),
            "ray": ray,
            "job_gpus": n,
        }
    )


def job_profile(profile: ClusterProfile, gpus: int | None, nodes: int | None = 1) -> ClusterProfile:
    """The profile one job sees with `--gpus N` (part of one node), validated; unchanged without it."""
    if gpus is None:
        return profile
    g, label = profile.gpu.count_per_node, f"{profile.name}:{profile.variant}" if profile.variant else profile.name
    if gpus < 1 or gpus > g:
        raise ProfileError(
            f"--gpus {gpus}: a {label} node has {g} GPUs; valid: 1 to {g} "
            "(more than one node: whole nodes with --nodes, without --gpus)"
        )
    if nodes is not None and nodes > 1:
        raise ProfileError(
            f"--gpus {gpus} asks for part of one node, but the job has {nodes} nodes; "
            "use --nodes 1 with --gpus, or whole nodes without --gpus"
        )
    return for_gpus(profile, gpus)


__all__ = ["for_gpus", "gpu_share", "job_profile"]
