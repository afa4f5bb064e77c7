"""Slurm wall times: parse `--time` values and check them against a partition's limit (pure)."""

from __future__ import annotations

import re

from hpcrl.errors import ConfigError, PlanError

# Slurm's formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d{1,2}))?(?::(\d{1,2}))?$")


def seconds(text: str, what: str = "hpcrl.time") -> int:
    """Seconds in a Slurm time value; ConfigError naming `what` when it is not one."""
    text = str(text).strip()
    m = _TIME.match(text)
    if not m or text in ("", "-"):
        raise ConfigError(f"{what} {text!r}: expected Slurm's format, e.g. 24:00:00 or 1-12:00:00 or 30")
    days, a, b, c = m.groups()
    if days is not None:  # D-H, D-H:M, D-H:M:S
        h, mi, s = int(a), int(b or 0), int(c or 0)
        return ((int(days) * 24 + h) * 60 + mi) * 60 + s
    if b is None:  # M
        return int(a) * 60
    if c is None:  # M:S
        return int(a) * 60 + int(b)
    return (int(a) * 60 + int(b)) * 60 + int(c)  # H:M:S


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
