"""`hpcrl watch`'s snapshot: one typed record that the live view draws and `--json` prints (pure).

Every field is documented in docs/watch.md (schema version 1); `to_dict` is the JSON. Durations are
seconds, sizes bytes or GiB as named, times ISO 8601 UTC; `None` (null) where unknown.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class SlurmView:
    """What the one Slurm query of a refresh said of a job (hpcrl/jobs/watch.py fills it)."""

    job_id: str
    state: str  # Slurm's state word (RUNNING, PENDING, COMPLETED, ...), or UNKNOWN
    phase: str  # pending | running | completing | ended
    reason: str = ""  # Slurm's pending or exit reason
    time_left_s: float | None = None
    time_limit_s: float | None = None
    nodes: str | None = None  # Slurm's node list as it prints it (c2n[1-2])
    node_count: int | None = None
    started: str | None = None
    comment_end: str | None = None  # "<reason>:<code>" the job left in its comment when the run dir refused it


@dataclass
class JobRow:
    seq: int
    job_id: str
    slurm_state: str | None
    head_node: str | None
    started: str | None
    ended: str | None
    end_reason: str | None
    exit_code: int | None
    next_job: str | None


@dataclass
class Allocation:
    """The chain's newest job as Slurm sees it."""

    job_id: str
    seq: int
    state: str | None  # Slurm's state; None when Slurm was not asked or did not answer
    reason: str | None
    nodes: str | None
    node_count: int | None
    time_left_s: float | None
    time_limit_s: float | None
    started: str | None


@dataclass
class Progress:
    step: int | None
    total_steps: int | None  # plan.json disk.total_steps: the run's training steps, where the config says
    steps_per_hour: float | None
    rate_basis: str | None  # how steps_per_hour was measured
    to_go_s: float | None  # (total - step) at that rate
    last_step_at: str | None  # when the watchdog saw the last step line
    steps_recorded: int  # step records of this chain in step-times.jsonl


@dataclass
class StepTime:
    last_s: float | None
    median_s: float | None
    n: int
    source: str | None  # framework (its step timer) | watchdog (its clock between step lines)
    plan_s: float | None
    plan_low_s: float | None
    plan_high_s: float | None
    ratio: float | None  # median / plan
    in_band: bool | None


@dataclass
class Metric:
    key: str
    value: float
    text: str  # as the log printed it


@dataclass
class Metrics:
    step: int | None
    log: str | None  # the log the step was read from, relative to the run directory
    values: dict[str, Metric | None]  # role (reward, reward_std, kl, loss, grad_norm) -> the step's metric
    recent: dict[str, list[list[float]]]  # role -> [[step, value], ...] over the last steps read (reward, loss)


@dataclass
class NodeGpu:
    node: str
    roles: list[str]
    gpus: int
    now_gib: float | None  # the node's fullest GPU at its newest sample
    peak_gib: float | None  # the node's fullest GPU at any sample read
    total_gib: float | None
    util_pct: float | None  # the mean utilisation of its GPUs at the newest sample
    plan_gib: float | None  # the plan's per-GPU figure for the node's roles
    plan_as: str
    sampled: str | None  # the newest sample's time
    age_s: float | None  # how old that sample is


@dataclass
class Gpu:
    nodes: list[NodeGpu]
    note: str | None  # why no node is shown (no CSV yet, no GPU found)
    since: str | None  # rows older than this belong to an earlier run (the chain's first start, less 2 min)


@dataclass
class Disk:
    used_bytes: int | None  # the run directory's size on disk
    measured: str | None  # when (the walk is repeated at most every minute)
    run_dir_peak_gib: float | None  # plan.json disk: the run directory's planned peak
    peak_gib: float | None  # plan.json disk: the whole plan's peak (with the HF caches on the same quota)
    quota_gib: float | None
    fs_free_bytes: int | None  # free on the run directory's file system (statvfs, for this user)
    fs_total_bytes: int | None


@dataclass
class CheckpointTime:
    key: str | None  # the framework's interval setting (checkpoint_state_freq, trainer.save_freq, ...)
    every_steps: int | None
    every_from: str | None  # "job N" (its step-times interval record) or "plan"
    last_step: int | None  # the last checkpoint write the watchdog recorded
    last_at: str | None
    next_step: int | None  # the next multiple of the interval after the current step
    eta_s: float | None  # steps to it x the median step
    warning_in_s: float | None  # until Slurm's time-limit warning: time left less plan.json cadence.lead_s
    lead_s: float | None
    verdict: str | None


@dataclass
class Breaker:
    tripped: bool
    reason: str | None
    exit_code: int | None
    step: int | None
    message: str | None


@dataclass
class Snapshot:
    schema_version: int
    time: str
    run_id: str | None
    name: str
    run_dir: str
    cluster: str | None
    backend: str
    state: str  # not-started | pending | running | ended | unknown
    reason: str | None  # the end reason once ended; Slurm's pending reason while pending
    ended: bool
    job: Allocation | None
    jobs: list[JobRow]
    progress: Progress
    step_time: StepTime
    metrics: Metrics
    gpu: Gpu
    disk: Disk
    checkpoint: CheckpointTime
    breaker: Breaker
    watchdog: list[str]  # the last lines the watchdog wrote (warnings, a trip)
    missing: list[str] = field(default_factory=list)  # what could not be read, and why

    def to_dict(self) -> dict:
        return asdict(self)


__all__ = [
    "SCHEMA_VERSION",
    "Allocation",
    "Breaker",
    "CheckpointTime",
    "Disk",
    "Gpu",
    "JobRow",
    "Metric",
    "Metrics",
    "NodeGpu",
    "Progress",
    "SlurmView",
    "Snapshot",
    "StepTime",
]
