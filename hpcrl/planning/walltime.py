"""Slurm wall times: parse `--time` values and check them against a partition's limit (pure)."""

from __future__ import annotations

from hpcrl.errors import ConfigError, PlanError
from hpcrl.shell import slurm_seconds


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
        raise ConfigError(f"hpcrl.time {asked!r}: Slurm reads a zero time as no limit; valid: a positive wall time, "
                          "e.g. 24:00:00 (leave hpcrl.time unset for the partition's limit)")
    if not asked or not max_time:
        return []
    if seconds(asked) <= seconds(max_time, f"partition {partition}'s max_time"):
        return []
    problem = f"hpcrl.time {asked} exceeds partition {partition}'s limit of {max_time}"
    if not allow_over_limit:
        raise PlanError(f"{problem}; valid: up to {max_time} (set hpcrl.time, or pass --allow-over-limit if your "
                        "site allows longer jobs)")
    return [f"{problem} (--allow-over-limit): sbatch may refuse the job or leave it pending"]


__all__ = ["check_time", "seconds", "text"]
