"""What a run plan asks of Slurm (the job description's SlurmRequest), each value checked as Slurm reads it (pure)."""

from __future__ import annotations

import math
import re

from hpcrl import contract
from hpcrl.errors import ConfigError
from hpcrl.planning import walltime
from hpcrl.planning.job_spec import SlurmRequest
from hpcrl.planning.run_types import RunPlan
from hpcrl.profiles import ClusterProfile
from hpcrl.shell import has_vars, sanitize_name, sbatch_safe

_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.,:@&|*()\[\]!-]+$")
_OUTPUT_PATH = re.compile(r"^[A-Za-z0-9_.,:@+=/-]+$")


def cluster_label(rp: RunPlan) -> str:
    p = rp.profile
    return f"{p.name}:{p.variant}" if p.variant else p.name


def run_root(rp: RunPlan) -> str:
    """The run root as written (config hpcrl.run_root, else the profile's)."""
    return rp.config.hpcrl.run_root or rp.profile.storage.run_root.path


def check_run_name(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ConfigError(f"hpcrl.run_name {name!r}: must be a directory name (no '/', not '.' or '..')")
    return name


def _sbatch_value(field: str, value: str, pattern: re.Pattern[str] | None = None) -> str:
    ok = pattern.match(value) if pattern else sbatch_safe(value)
    if not ok:
        raise ConfigError(f"{field} {value!r}: not a valid Slurm value (letters, digits and _ . , : @ - [ ] only)")
    return value


def _wall_time(rp: RunPlan, partition: str | None) -> str | None:
    cfg_time = rp.config.hpcrl.time
    if cfg_time is not None:
        walltime.seconds(str(cfg_time))  # one line naming the value when it is not Slurm's format
        return str(cfg_time)
    part = rp.profile.slurm.partitions.get(partition) if partition else None
    return part.max_time if part else None


def _account(rp: RunPlan) -> str | None:
    slurm = rp.profile.slurm
    account = rp.config.hpcrl.account
    if account is None:
        if slurm.account_required:
            example = f", e.g. --set hpcrl.account={slurm.account_example}" if slurm.account_example else ""
            raise ConfigError(f"cluster {rp.profile.name} needs a Slurm account: set hpcrl.account{example}")
        return None
    _sbatch_value("hpcrl.account", account)
    if slurm.account_pattern and not re.match(slurm.account_pattern, account):
        example = f" (e.g. {slurm.account_example})" if slurm.account_example else ""
        raise ConfigError(
            f"hpcrl.account {account!r} does not match {rp.profile.name}'s account pattern "
            f"{slurm.account_pattern}{example}"
        )
    return account


def output_path(rp: RunPlan) -> str:
    """Slurm's --output: in the run directory when its path is known at submit time."""
    root, name = run_root(rp), rp.config.hpcrl.run_name
    path = f"{root.rstrip('/')}/{name}/{contract.LOGS}/{contract.SLURM_LOG.format(job='%j')}"
    if has_vars(root) or not _OUTPUT_PATH.match(f"{root}/{name}"):
        return f"hpcrl-{sanitize_name(name)}-%j.out"
    return path


def exclude_nodes(rp: RunPlan) -> list[str]:
    """The profile's, the config's and the user's exclude list's nodes, validated, in order, once each."""
    exclude: list[str] = []
    for node in [*rp.profile.slurm.exclude_nodes, *rp.config.hpcrl.exclude_nodes, *rp.user_exclude]:
        if node not in exclude:
            exclude.append(_sbatch_value("exclude node", str(node)))
    return exclude


def partial_node_options(profile: ClusterProfile) -> list[str]:
    """Cores and memory of a job with part of a node, as the profile says the site shares one
    (slurm.node_sharing): a proportional site gives both with the GPUs, so only the cores are asked."""
    share = profile.slurm.node_sharing
    cpus = profile.node.cpu_cores // profile.gpu.count_per_node
    opts = [f"--cpus-per-gpu={cpus}"]
    if share is None or share.mode == "per-gpu":
        opts.append(f"--mem-per-gpu={math.floor(profile.node.ram_gib / profile.gpu.count_per_node)}G")
    return opts


def slurm_request(rp: RunPlan) -> SlurmRequest:
    """The job's Slurm request, validated."""
    hp, slurm, g = rp.config.hpcrl, rp.profile.slurm, rp.profile.gpu.count_per_node
    share: list[str] = []
    if rp.profile.job_gpus:
        share = partial_node_options(rp.profile)
    elif slurm.exclusive:
        share = ["--exclusive"]
    elif slurm.cpus_per_gpu:
        share = [f"--cpus-per-gpu={slurm.cpus_per_gpu}"]
    partition = hp.partition or slurm.default_partition
    return SlurmRequest(
        job_name=f"hpcrl-{sanitize_name(hp.run_name)}",
        nodes=rp.nodes,
        gpu_request=contract.gpu_request_option(slurm.gpu_request, g, rp.nodes),
        share=tuple(share),
        mem=_sbatch_value("slurm.mem", slurm.mem) if slurm.mem is not None else None,
        time=_wall_time(rp, partition),
        partition=_sbatch_value("partition", partition) if partition else None,
        account=_account(rp),
        qos=_sbatch_value("hpcrl.qos", hp.qos) if hp.qos else None,
        constraint=_sbatch_value("slurm.constraint", slurm.constraint, _CONSTRAINT) if slurm.constraint else None,
        exclude=tuple(exclude_nodes(rp)),
        output=output_path(rp),
        signal_lead_s=rp.cadence.lead_s if rp.cadence else slurm.signal_before_end_s,
    )
