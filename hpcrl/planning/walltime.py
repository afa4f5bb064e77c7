"""Slurm wall times: parse `--time` values and check them against a partition's limit (pure)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcrl.errors import ConfigError, PlanError
from hpcrl.shell import slurm_seconds

if TYPE_CHECKING:
    from hpcrl.planning.run_types import HpcrlSection
    from hpcrl.profiles import ClusterProfile


def seconds(text: str, what: str = "hpcrl.time") -> int:
    """Seconds in a Slurm time value; ConfigError naming `what` when it is not one."""
    try:
        return slurm_seconds(text)
    except ValueError as exc:
        raise ConfigError(f"{what} {exc}") from None


def text(total: int) -> str:
    """Seconds as Slurm's D-HH:MM:SS (or HH:MM:SS under a day)."""
    d, rest = divmod(int(total), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"


def check_time(asked: str | None, partition: str | None, max_time: str | None, allow_over_limit: bool) -> list[str]:
    """A wall time over the partition's limit: PlanError (sbatch would refuse it, or it would
    pend forever), or a warning with --allow-over-limit; a zero time, which Slurm reads as no limit: ConfigError."""
    if asked and seconds(asked) == 0:
        raise ConfigError(
            f"hpcrl.time {asked!r}: Slurm reads a zero time as no limit; valid: a positive wall time, "
            "e.g. 24:00:00 (leave hpcrl.time unset for the partition's limit)"
        )
    if not asked or not max_time:
        return []
    if seconds(asked) <= seconds(max_time, f"partition {partition}'s max_time"):
        return []
    problem = f"hpcrl.time {asked} exceeds partition {partition}'s limit of {max_time}"
    if not allow_over_limit:
        raise PlanError(
            f"{problem}; valid: up to {max_time} (set hpcrl.time, or pass --allow-over-limit if your "
            "site allows longer jobs)"
        )
    return [f"{problem} (--allow-over-limit): sbatch may refuse the job or leave it pending"]


def job_time(hp: HpcrlSection, profile: ClusterProfile) -> str | None:
    """The wall time each job of the run asks for: hpcrl.time, else its partition's limit (None: unknown)."""
    part_name = hp.partition or profile.slurm.default_partition
    part = profile.slurm.partitions.get(part_name) if part_name else None
    return hp.time or (part.max_time if part else None)


def chain_seconds(hp: HpcrlSection, profile: ClusterProfile) -> int | None:
    """The longest the run can train: each job's wall time x the jobs of its chain (the first and
    hpcrl.max_restarts continuations); None when no time limit is known."""
    wall = job_time(hp, profile)
    return None if wall is None else seconds(wall) * (1 + hp.max_restarts)


__all__ = ["chain_seconds", "check_time", "job_time", "seconds", "text"]
