"""What hpcrl reads in a framework's logs and runs inside its job, as records a backend fills (pure).

Each backend (hpcrl/planning/backends/base.py) holds one of each record; hpcrl/logs (the driver
command line, its step lines and metric keys, diagnose) and hpcrl/rendering (the smoke command, the
driver's override check) read them, so no module outside this package names a framework. The in-job
modules (hpcrl/runtime) cannot import a backend: what they need is rendered onto their command line,
or (the union of every backend's LogFormat the watchdog reads) shipped as a file generated from the
registry (hpcrl/logs/log_format.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class CommandFacts:
    """How the framework's driver command is written, and how a log's copy of it is found and read."""

    # A regex that finds the entry point in a log line (None: a user's script, nothing to recognise).
    entry: str | None = None
    # "flags": `--name value` words (argparse, HfArgumentParser); "hydra": `key=value` overrides, which
    # the shell hands over unquoted, so the run directory inside them must hold no Hydra syntax.
    style: Literal["flags", "hydra"] = "flags"
    framework: str = ""  # the framework in messages ("older OpenRLHF names")
    package: str | None = None  # what the training Python must import (preflight checks it on every node)


@dataclass(frozen=True)
class DiagnoseFacts:
    """What `hpcrl diagnose` reads of a run of this framework and which fixes it proposes."""

    # diagnose's names -> the framework's keys (model, tokens, learners, zero, tp, util, offload, ...).
    keys: dict[str, str]
    # "logged": values from the framework's logged arguments (`logged`) with their defaults;
    # "command": from the driver command, else the framework's own defaults (the backend's table).
    values_from: Literal["logged", "command"] = "logged"
    # The logged arguments: diagnose's name -> (key, default). Empty: the default backend's, as for
    # a log that does not say which framework ran.
    logged: dict[str, tuple[str, Any]] = field(default_factory=dict)
    fixed_zero_stage: int | None = None  # the sharding when the framework has no stage key (FSDP: 3)
    seq_len: tuple[str, ...] = ()  # the keys summed for one sequence; (): the tokens per GPU
    # A planner that needs a critic-free run: (estimator key, critic-free value) assumed when unset.
    critic_free: tuple[str, str] | None = None
    # Keys that name a reward source; when none is set, `reward_stand_in` (key, value) is assumed
    # so that no reward model's GPUs are planned.
    reward_sources: tuple[str, ...] = ()
    reward_stand_in: tuple[str, str] | None = None
    # How an out-of-memory learner is re-planned: "deepspeed" (hpcrl/memory/learner.py),
    # "colocated" (the backend's own planner) or "planned" (the run's plan.json, a user's script).
    learner_fixes: Literal["deepspeed", "colocated", "planned"] = "deepspeed"
    # What a DeepSpeed fix shrinks: "tokens" per GPU (multiples of 256), or the "micro_batch" of
    # whole sequences (keys "micro", "max_len"), learner GPUs then growing by whole nodes (key "gpus").
    learner_batch: Literal["tokens", "micro_batch"] = "tokens"
    switch_on: str = ""  # what follows a switch key turned on in a fix (" true" for `--key true`)
    engines: bool = True  # vLLM engines run beside the learners (an OOM may be theirs)
    offload_fix: str = "{offload} off"  # turning host-RAM offload off, keys in braces
    timeout_raise: bool = False  # the collective timeout (key "timeout") is worth raising for slow ranks
    timeout_note: str = ""  # said of the collective timeout otherwise
    broadcast_fix: str = ""  # for a timed-out broadcast to the engines (the weight sync), keys in braces
    # (a source path a traceback may show, the framework version it proves): files only older versions have.
    version_marks: tuple[tuple[str, str], ...] = ()
    # DiskInputs fields read from the run's keys (lora_rank, keep, save_hf, disable_ds).
    disk_reads: tuple[str, ...] = ()
    disk_bound: str = ""  # which settings bound the checkpoints on disk, in words
    death_note: str = ""  # why one dead actor stops the run, in the framework's terms
    # The step metric that is the fraction of responses that ended before the length limit (key "response"): 0 with
    # a zero reward says every response ran to the limit.
    stop_rate: str = ""
    # For a Ray placement group that can never be placed: what the layout must keep to, keys in braces and {per}
    # the node's GPUs.
    placement_fix: str = (
        "the learner and engine GPUs asked of one node must not exceed its {per} GPUs; an "
        "engine's TP GPUs must be free on one node"
    )


Placement = Literal["learner-spread", "node-pools", "pack-groups"]


@dataclass(frozen=True)
class SmokeFacts:
    """How the smoke test (hpcrl/runtime/smoke.py) places bundles as the framework would."""

    # "learner-spread": a STRICT_SPREAD group of one {GPU: k} bundle per learner node and a PACK
    # group of {GPU: tp} engine bundles; "node-pools": a STRICT_PACK group of one-GPU bundles per
    # node; "pack-groups": PACK groups of one-GPU bundles, the engines' first.
    placement: Placement = "learner-spread"
    comment: str = "place learners and engines as the framework does"  # the script's comment
    actor_env: bool = False  # the driver hands its whole environment to every Ray actor


@dataclass(frozen=True)
class TimingFacts:
    """Where the framework's output says how long a step and a checkpoint write took (the watchdog
    records them in the run dir, hpcrl/logs/step_times.py). Metric keys are read from the step's
    metrics; an empty tuple means the framework logs no such time."""

    step: tuple[str, ...] = ()  # the step's own time in seconds (without a checkpoint write)
    generation: tuple[str, ...] = ()  # rollout generation within the step
    training: tuple[str, ...] = ()  # the learners' update within the step
    checkpoint: tuple[str, ...] = ()  # a checkpoint write, as a metric of the step that wrote it
    # A regex on a log line whose group "s" is a checkpoint write's seconds (a framework's timer line).
    checkpoint_line: str | None = None
    # The framework writes its checkpoint right after printing the step's metrics, so a rewrite of the
    # checkpoint marker times the write (marker's time minus the step line's).
    marker_after_step: bool = False

    def words(self) -> list[str]:
        """The watchdog's options that carry these facts (the in-job runtime cannot import a backend)."""
        out: list[str] = []
        for flag, keys in (
            ("--step-time-key", self.step),
            ("--generation-time-key", self.generation),
            ("--training-time-key", self.training),
            ("--checkpoint-time-key", self.checkpoint),
        ):
            for key in keys:
                out += [flag, key]
        if self.checkpoint_line:
            out += ["--checkpoint-line", self.checkpoint_line]
        return out


@dataclass(frozen=True)
class LogFormat:
    """How the framework's driver prints a training step, and the keys of the step's metrics the watchdog's
    breakers read (hpcrl/runtime/watchdog.py), each in order of preference. hpcrl/logs/driver_log.py reads a log
    with one (as its StepFormat, field for field); a log whose framework is not known (a user's script, a plan.json
    that names no backend) with the union of every backend's and the formats no backend owns (JSON and Python-dict
    lines, AReaL's tables): hpcrl/logs/log_format.py."""

    # Regexes of a line that carries one step's `key: value` (or key=value) pairs after the match; the first group
    # is the step's number.
    step_lines: tuple[str, ...] = ()
    # Words that make a line with no step line one step's `key: value` pairs (a fork's own print of the metrics).
    pair_words: tuple[str, ...] = ()
    panel_titles: tuple[str, ...] = ()  # the titles of the Rich panels a step's metrics are printed in
    step_keys: tuple[str, ...] = ()  # metrics that carry the step's number
    reward: tuple[str, ...] = ()  # the step's mean reward: exactly 0 for K steps trips zero_reward
    loss: tuple[str, ...] = ()  # losses whose NaN or infinity trips nan_loss (any `loss/*` key does too)
    grad_norm: tuple[str, ...] = ()  # the gradient norm (any key ending in `/grad_norm` too)
    reward_std: tuple[str, ...] = ()  # exactly 0: every group's rewards agree (zero_variance)
    zero_std_fraction: tuple[str, ...] = ()  # the fraction of groups whose rewards agree: exactly 1 trips
    advantage_ranges: tuple[tuple[str, str], ...] = ()  # (min, max) of the advantages: both exactly 0 trips


@dataclass(frozen=True)
class MetricFacts:
    """The step metrics `hpcrl watch` and `hpcrl report --html` show, under the framework's own keys, each in
    order of preference (the first a step logs is shown). An empty reward or loss means the keys of the run's
    LogFormat (what the watchdog reads); the run's hpcrl.reward_keys and hpcrl.loss_keys come first either way."""

    reward: tuple[str, ...] = ()
    reward_std: tuple[str, ...] = ()  # the spread of the step's rewards
    kl: tuple[str, ...] = ()  # the policy's distance from its reference (a KL term or estimate)
    loss: tuple[str, ...] = ()
    grad_norm: tuple[str, ...] = ()
    # The further metrics `hpcrl report`'s summary shows after the step's number, reward, loss and gradient norm.
    summary: tuple[str, ...] = ()


@dataclass(frozen=True)
class CpuAsk:
    """The CPUs the framework itself would ask of Ray for a layout (the smoke's note)."""

    who: str  # "grpo_fast.py"
    total: int
    per_node: int
    where: str = "node"  # the node that asks per_node: "learner node"

    def words(self) -> list[str]:
        return ["--cpu-ask", self.who, str(self.total), str(self.per_node), self.where]


def default_backend() -> str:
    """The backend of a run config that names none: what a log is read as when nothing says."""
    from hpcrl.planning.run_types import HpcrlSection  # the config's types sit above the backends

    return str(HpcrlSection.model_fields["backend"].default)


__all__ = [
    "CommandFacts",
    "CpuAsk",
    "DiagnoseFacts",
    "LogFormat",
    "MetricFacts",
    "Placement",
    "SmokeFacts",
    "TimingFacts",
    "default_backend",
]
