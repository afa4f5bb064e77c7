"""The step-time estimate as a band (pure): low, mid and high seconds per RL step with their basis.

Generation and training each carry a band; a layout whose roles overlap (open-instruct's
asynchronous loop) is paced by the slower side, a colocated one adds them. Everything that
decides by time takes the side of the band that keeps its promise: the checkpoint cadence and
the time-limit lead use `high_s`, the ranking `mid_s`.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcrl.planning.generation import GENERATION_BASIS, GENERATION_HIGH, GENERATION_LOW

# The training formula (6-10 x P x tokens at 40% of bf16 peak) against real ZeRO-3 steps as
# open-instruct configures them (issue 26: 1-2 H100, 1.5B-8B, 4k-16k tokens, offload on/off):
# the formula was too fast on every row, by 2.2x at the median and 5.3x at worst.
TRAIN_FORMULA_MEDIAN_SLOWDOWN = 2.2
TRAIN_FORMULA_MAX_SLOWDOWN = 5.3
TRAINING_BASIS = ("derived (uncalibrated): 6-10 x P x tokens at 40% of bf16 peak, x2.2 (x1.0-5.3) "
                  "from issue 26's ZeRO-3 steps")


@dataclass(frozen=True)
class Band:
    low_s: float
    mid_s: float
    high_s: float
    basis: str


@dataclass(frozen=True)
class StepEstimate:
    low_s: float
    mid_s: float
    high_s: float
    basis: str
    generation_s: float  # mid
    training_s: float  # mid

    def text(self) -> str:
        return f"~{self.low_s:.0f}-{self.high_s:.0f} s (mid ~{self.mid_s:.0f} s)"


def training_band(formula_s: float) -> Band:
    """The learner's seconds per step, from the FLOPs formula and its measured slowdown."""
    return Band(formula_s, formula_s * TRAIN_FORMULA_MEDIAN_SLOWDOWN, formula_s * TRAIN_FORMULA_MAX_SLOWDOWN,
                TRAINING_BASIS)


def generation_band(model_s: float, basis: str = "") -> Band:
    """The engines' seconds per step: the fitted vLLM model and its held-out error range."""
    return Band(model_s * GENERATION_LOW, model_s, model_s * GENERATION_HIGH, basis or f"vLLM model {GENERATION_BASIS}")


def combine(gen: Band, train: Band, colocated: bool) -> StepEstimate:
    """One step: the slower side where generation and training overlap, their sum where they take turns."""
    join = (lambda a, b: a + b) if colocated else max
    basis = f"generation: {gen.basis}; training: {train.basis}"
    return StepEstimate(join(gen.low_s, train.low_s), join(gen.mid_s, train.mid_s), join(gen.high_s, train.high_s),
                        basis, gen.mid_s, train.mid_s)


__all__ = ["Band", "StepEstimate", "combine", "generation_band", "training_band"]
