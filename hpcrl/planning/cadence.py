"""How often a run checkpoints, and how early before its time limit it is warned (pure).

A multi-day run lives on 24-hour jobs. None of the three frameworks saves on a signal
(backends/data/capabilities.json: save_on_signal), so what a job loses at its end is what
it trained since its last checkpoint:

* **cadence**: a checkpoint every K steps, K = floor(max_lost_minutes x 60 / upper step), so at
  most `hpcrl.max_lost_minutes` of training is lost even when a step takes the upper end of
  its estimated band (planning/step_time.py);
* **lead time**: Slurm's `--signal=B:USR1@S` warning comes S seconds before the limit. On it
  the script lets the driver run on until its next checkpoint is complete (the framework
  rewrites a marker file), then stops it; S covers one step at the upper estimate plus one
  checkpoint write plus the stop itself, so a checkpoint that is due is written whole instead of cut off.

The write time is derived, not measured: the ZeRO/FSDP state bytes (12 per trained parameter,
2 per frozen one) over the run root's write bandwidth, which the profile states
(`storage.run_root.write_gib_s`, an assumption where nobody measured it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from typing import TYPE_CHECKING

from hpcrl.models import ModelSpec

if TYPE_CHECKING:
    from hpcrl.planning.step_time import StepEstimate
    from hpcrl.profiles import ClusterProfile

GIB = 1024**3
# Seconds the script needs after the checkpoint to stop the driver and Ray, beyond KillWait.
STOP_MARGIN_S = 60
# Write bandwidth of a shared run root when the profile states none (storage.run_root.write_gib_s):
# an assumption, about what one job gets from a busy Lustre/NFS; it only sizes the lead time.
ASSUMED_WRITE_GIB_S = 2.0


@dataclass(frozen=True)
class Cadence:
    every_steps: int  # checkpoint interval in steps
    step_s: float  # the plan's step estimate (mid)
    write_s: float  # one checkpoint write, derived
    lead_s: int  # --signal lead time
    pinned: bool  # the config set the interval
    step_high_s: float = 0.0  # the upper end of the step estimate, which the interval and lead rest on

    @property
    def upper_s(self) -> float:
        return max(self.step_high_s, self.step_s)

    @property
    def at_risk_min(self) -> float:
        """Training minutes a job can lose at the upper step estimate: one interval of steps."""
        return self.every_steps * self.upper_s / 60

    def summary(self, key: str, max_lost_min: float) -> str:
        how = "pinned in the config" if self.pinned else f"so that at most {max_lost_min:g} min is lost"
        return (
            f"{key} {self.every_steps}: a checkpoint every ~{self.at_risk_min:.0f} min of training at the upper "
            f"step estimate ~{self.upper_s:.0f} s ({how}); time-limit warning {self.lead_s} s before the end = "
            f"one upper step (~{self.upper_s:.0f} s) + one "
            f"checkpoint write (~{self.write_s:.0f} s, derived) + {STOP_MARGIN_S} s to stop"
        )


def checkpoint_bytes(model: ModelSpec, lora_rank: int = 0) -> float:
    """One checkpoint of the training state: fp32 master weights and two Adam moments (12 B) per
    trained parameter, bf16 (2 B) per frozen one. A derived size (hpcrl/planning/disk.py has the detailed one)."""
    trained = model.lora_params(lora_rank) if lora_rank else model.total_params
    frozen = model.total_params if lora_rank else 0  # the base stays whole beside the adapters
    return 12.0 * trained + 2.0 * frozen


def plan_cadence(
    step_s: float,
    max_lost_min: float,
    model: ModelSpec,
    write_gib_s: float,
    signal_floor_s: int,
    pinned_every: int | None = None,
    lora_rank: int = 0,
    step_high_s: float | None = None,
) -> Cadence:
    """The checkpoint interval and the --signal lead time for a run whose step takes step_s (mid)
    and at most step_high_s (the upper estimate, which both rest on; step_s where none)."""
    step_s = max(step_s, 1.0)
    high = max(step_high_s or step_s, step_s)
    every = pinned_every if pinned_every else max(1, math.floor(max_lost_min * 60 / high))
    write_s = checkpoint_bytes(model, lora_rank) / (write_gib_s * GIB)
    lead = max(signal_floor_s, math.ceil((high + write_s + STOP_MARGIN_S) / 60) * 60)
    return Cadence(every, step_s, write_s, lead, pinned_every is not None, high)


def risk_warning(c: Cadence, key: str, max_lost_min: float) -> list[str]:
    """A pinned interval that risks more than max_lost_min: say so, with the interval that would not."""
    if not c.pinned or c.at_risk_min <= max_lost_min:
        return []
    fit = max(1, math.floor(max_lost_min * 60 / c.upper_s))
    return [
        f"{key} {c.every_steps} (pinned) risks ~{c.at_risk_min:.0f} min of training at each job's end or fault, "
        f"over hpcrl.max_lost_minutes {max_lost_min:g}: remove it and hpcrl sets {fit}"
    ]


def run_cadence(
    step: StepEstimate,
    max_lost_min: float,
    profile: ClusterProfile,
    model: ModelSpec,
    lora_rank: int = 0,
    pinned_every: int | None = None,
) -> Cadence:
    """plan_cadence for a run on `profile` whose step the layout estimated: the run root's write bandwidth and
    the profile's signal floor (what `render` plans, and what a backend's own checkpoint choice must assume)."""
    bandwidth = profile.storage.run_root.write_gib_s or ASSUMED_WRITE_GIB_S
    return plan_cadence(
        step.mid_s,
        max_lost_min,
        model,
        bandwidth,
        profile.slurm.signal_before_end_s,
        pinned_every,
        lora_rank,
        step.high_s,
    )


def steps_over_run(chain_s: float | None, step: StepEstimate) -> int | None:
    """The most steps a run whose step count is unknown can take: its time limits over the fastest step estimate
    (None: no time limit known). Saves nobody deletes are counted to it, not to a retention limit."""
    return None if chain_s is None else max(1, int(chain_s / max(step.low_s, 1.0)))


__all__ = [
    "ASSUMED_WRITE_GIB_S",
    "Cadence",
    "checkpoint_bytes",
    "plan_cadence",
    "risk_warning",
    "run_cadence",
    "steps_over_run",
]
