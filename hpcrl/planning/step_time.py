"""The step-time estimate as a band (pure): low, mid and high seconds per RL step with their basis.

Generation and training each carry a band; a layout whose roles overlap (open-instruct's
asynchronous loop) is paced by the slower side, a colocated one adds them. Everything that
decides by time takes the side of the band that keeps its promise: the checkpoint cadence and
the time-limit lead use `high_s`, the ranking `mid_s`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpcrl.memory.learner import LearnerSetup
from hpcrl.memory.learner_time import learner_time
from hpcrl.planning.generation import GENERATION_BASIS, GENERATION_HIGH, GENERATION_LOW
from hpcrl.profiles import ClusterProfile


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


def micro_batches(step_tokens: int, learner_gpus: int, tokens_per_micro: int) -> int:
    """Micro-batches each learner GPU runs for one RL step's tokens (packed to tokens_per_micro)."""
    return max(1, math.ceil(step_tokens / (max(1, learner_gpus) * max(1, tokens_per_micro))))


def training_band(setup: LearnerSetup, profile: ClusterProfile, step_tokens: int, learners_per_node: int) -> Band:
    """The learners' seconds per RL step: K micro-batches then one optimizer step, from the learner
    time model (hpcrl/memory/learner_time.py) and its band. One optimizer step per RL step is
    assumed (open-instruct's default num_mini_batches 1)."""
    lt = learner_time(setup, profile, learners_per_node)
    k = micro_batches(step_tokens, setup.n_gpus, setup.tokens_per_gpu)
    mid = lt.step_s(k)
    return Band(
        mid * lt.low,
        mid,
        mid * lt.high,
        f"learner {k} x {lt.micro_batch_s:.2f} s + optimizer step {lt.optimizer_step_s:.2f} s, {lt.basis}",
    )


def generation_band(model_s: float, basis: str = "") -> Band:
    """The engines' seconds per step: the fitted vLLM model and its held-out error range."""
    return Band(model_s * GENERATION_LOW, model_s, model_s * GENERATION_HIGH, basis or f"vLLM model {GENERATION_BASIS}")


def combine(gen: Band, train: Band, colocated: bool) -> StepEstimate:
    """One step: the slower side where generation and training overlap, their sum where they take turns."""

    def join(a: float, b: float) -> float:
        return a + b if colocated else max(a, b)

    basis = f"generation: {gen.basis}; training: {train.basis}"
    return StepEstimate(
        join(gen.low_s, train.low_s),
        join(gen.mid_s, train.mid_s),
        join(gen.high_s, train.high_s),
        basis,
        gen.mid_s,
        train.mid_s,
    )


__all__ = ["Band", "StepEstimate", "combine", "generation_band", "micro_batches", "training_band"]
