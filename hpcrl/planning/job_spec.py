"""The job description: everything a planned job will do, as one immutable, JSON-serialisable record.

Planning ends here (hpcrl/planning/describe.py builds it from a checked RunPlan); the renderer
(hpcrl/rendering/render.py) formats it into the sbatch script and asks nothing else, the submitter
reads the run directory and the plan from it, and `hpcrl render --json` / `plan --json` / the API
show it under `job`. A test can build one by hand and render it.

Values are the job's own, not shell: paths as the user wrote them (the renderer quotes them, `$VAR`
expanding on the node), commands as words. A word the shell must expand (the run directory, the
checkpoint interval a continuation resets) is a `ShellWord` with `expand`; it was checked to hold
only characters a double-quoted word can carry when the description was built.

A backend that needs no Ray has `ray` None; its nodes' roles and the phases the script runs are
listed in `roles` and `phases`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION = 1


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ShellWord(_Record):
    """One word of a command: a literal (the renderer quotes it), or text with `$VAR` references the
    shell expands at run time (`expand`: written double-quoted)."""

    text: str
    expand: bool = False


class Header(_Record):
    """The script's comment header: where it came from and what the plan assumed or warns about."""

    hpcrl_version: str
    cluster: str  # profile name, name:variant for a node type
    config_name: str  # the config file's name, "-" for none
    config_digest: str
    framework: str | None  # "verl 0.9.1": the framework version the run targets (None: not versioned)
    summary: tuple[str, ...]  # the plan in a few lines: layout, memory, step
    assumptions: tuple[str, ...]
    warnings: tuple[str, ...]
    user_exclude: tuple[str, ...] = ()  # from the user's per-cluster exclude list
    user_exclude_file: str | None = None
    smoke: bool = False  # the driver is hpcrl's smoke test, not training


class SlurmRequest(_Record):
    """What the job asks of Slurm (#SBATCH), each value already checked as Slurm reads it."""

    job_name: str
    nodes: int
    gpu_request: str  # "--gpus-per-node=4" in the site's style
    share: tuple[str, ...]  # --exclusive, or the cores/memory of part of a node
    mem: str | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclude: tuple[str, ...] = ()
    output: str  # Slurm's --output: in the run directory when its path is known at submit time
    signal_lead_s: int  # USR1 this long before the time limit

    def options(self) -> list[str]:
        """The #SBATCH options in the order the script writes them."""
        opts = [
            f"--job-name={self.job_name}",
            f"--nodes={self.nodes}",
            "--ntasks-per-node=1",
            self.gpu_request,
            *self.share,
        ]
        named = (
            ("mem", self.mem),
            ("time", self.time),
            ("partition", self.partition),
            ("account", self.account),
            ("qos", self.qos),
            ("constraint", self.constraint),
        )
        opts += [f"--{name}={value}" for name, value in named if value]
        if self.exclude:
            opts.append(f"--exclude={','.join(self.exclude)}")
        # The script chains its own continuation; a Slurm requeue would run a second copy.
        return [
            *opts,
            f"--output={self.output}",
            "--open-mode=append",
            f"--signal=B:USR1@{self.signal_lead_s}",
            "--no-requeue",
        ]


class NodeRole(_Record):
    """Nodes of the job that do one thing."""

    role: str  # head, worker, server, learner
    count: int
    does: str


class Phase(_Record):
    """One phase of the script's main, in order: `phase_<name>` logs "hpcrl: phase <name>"."""

    name: str
    does: str


class Container(_Record):
    """The image the job's commands run in."""

    runtime: str  # apptainer, singularity
    flags: tuple[str, ...]
    image: str
    binds: tuple[str, ...]  # variables naming host paths bound into the container


class Environment(_Record):
    """What the script sets up before anything runs: the profile's and the config's environment."""

    modules: tuple[str, ...] = ()
    profile_env: tuple[tuple[str, str], ...] = ()
    profile_setup: tuple[str, ...] = ()  # shell written by the profile's author, verbatim
    env_setup: tuple[str, ...] = ()  # hpcrl.env_setup: shell lines from the run config, verbatim
    hf_home: str
    umask: str  # 077, or 027 when the group shares runs
    shared_with_group: bool = False
    container: Container | None = None


class RunDirectory(_Record):
    """Where the run lives: run root (as written; `$VAR` expands on the node) and run name, and the
    node-local base for the job's private directories."""

    root: str
    name: str
    node_local: str
    ray_log_keep_mib: int  # Ray logs a later job's sweep keeps of a job that died on a node (MiB per node)
    shared_root: bool = False  # the site's run root is a shared project directory (profile storage.run_root_shared)


class RaySpec(_Record):
    """The Ray cluster across the job's nodes (None for a backend that needs no Ray)."""

    cpus_per_node: int | None  # None: Slurm's CPUs of the node
    object_store_bytes: int | None
    join_timeout_s: int  # the last node's wait included
    start_stagger_s: int
    stagger_free_slots: int
    metrics: bool
    start_attempts: int
    temp_max: int  # Ray's temp dir path length before the /tmp fallback
    min_version: tuple[int, int]  # the first Ray that honours token authentication
    worker_gpu_request: str  # the worker step's GPU option ("" for one node)


class Service(_Record):
    """A server the script starts on every node (on 127.0.0.1) before the driver."""

    name: str
    command: tuple[str, ...]  # "{port}" in a word is the service's port
    health_path: str
    port: int | None  # fixed, else from the job's port block
    env: tuple[tuple[str, str], ...] = ()  # for the driver; "{port}" likewise
    why: str = ""
    timeout_s: int


class Health(_Record):
    """An HTTP GET on the process's first node that answers 200 once it is up."""

    path: str
    port: str  # the name of one of the step's drawn ports
    timeout_s: int


class Resume(_Record):
    """What a continuation adds to a step's command: `flag <run dir>/directory/<newest match of pattern that
    holds complete_file>`, nothing when there is none yet."""

    flag: str
    directory: str  # under the run directory
    pattern: str
    complete_file: str


class Step(_Record):
    """A process on some of the job's nodes, one task per node in an srun step of its own (a job without Ray).
    The driver step runs under the watchdog; the others start first, in order, each answering its health check
    before the next starts."""

    role: str
    nodes: tuple[int, ...]  # indices into the job's nodes (0: the first of the allocation)
    gpus_per_node: int
    command: tuple[ShellWord, ...]  # `{node_rank}` in a word is filled on each node with its rank in the step
    ports: tuple[str, ...] = ()  # drawn on the step's first node before it starts: $HPCRL_<NAME>_PORT
    health: Health | None = None
    waits_for: tuple[str, ...] = ()
    resume: Resume | None = None
    driver: bool = False


class RunFile(_Record):
    """A file the job writes under the run directory before its steps start (mode 0600)."""

    path: str
    text: str  # `{run_dir}` in it is the run directory's path, filled when the job writes it


class Driver(_Record):
    """The training process on the head node, under the watchdog."""

    backend: str
    label: str  # "open-instruct's grpo_fast.py"
    workdir: str
    python: str
    entry_point: str
    entry_module: bool  # python -m <entry point>
    module_owner: str  # who provides the module (for the error when it is missing)
    launcher: tuple[str, ...] = ()  # words between the Python and the entry point (torchrun's module)
    launcher_module: str = ""  # a launcher module the script checks is importable
    args: tuple[tuple[ShellWord, ...], ...] = ()  # the framework's arguments, one flag or override per line
    env: tuple[tuple[str, ShellWord], ...] = ()  # exported just before it starts
    override_style: str = "flags"  # flags, or hydra key=value overrides


class Smoke(_Record):
    """hpcrl's smoke test in place of the driver: the plan's layout, placed as the framework does."""

    backend: str
    placement: str  # in the script's comment
    words: tuple[str, ...] = ()  # the smoke command's placement words
    learners: str  # learners per node, one number per learner node
    engines: int
    tp: int


class Watchdog(_Record):
    """The in-job watchdog's circuit breakers and what it reads of the driver's output."""

    zero_reward_steps: int
    hang_minutes: float
    grad_norm_steps: int
    zero_variance_steps: int
    reward_keys: tuple[str, ...] = ()
    loss_keys: tuple[str, ...] = ()
    timing_words: tuple[str, ...] = ()  # step and checkpoint times in the framework's output
    marker_after_step: bool = False


class Checkpoints(_Record):
    """How the framework's resume state is written and watched."""

    key: str  # the framework's interval key
    marker: str  # the file (under the run dir) rewritten once a checkpoint is complete
    every: int | None  # the planned interval a continuation may reset (None: pinned or not planned)
    variable: str  # the shell variable carrying it
    signal_lead_s: int  # the time-limit warning's lead


class Chain(_Record):
    """Continuations: how many, after what, and why a run cannot resume."""

    max_restarts: int
    max_failure_restarts: int
    failure_backoff_s: int
    no_resume: str = ""


class GpuMonitor(_Record):
    """The GPU monitor's idle rule (the cluster's, None where it has none)."""

    min_mean_power_w: float | None = None
    grace_minutes: float | None = None


class JobSpec(_Record):
    """Everything the job will do; the renderer formats it and nothing else."""

    schema_version: int = SCHEMA_VERSION
    header: Header
    slurm: SlurmRequest
    gpus_per_node: int
    cpus_per_node: int
    roles: tuple[NodeRole, ...]
    phases: tuple[Phase, ...]
    environment: Environment
    run_dir: RunDirectory
    ray: RaySpec | None
    services: tuple[Service, ...] = ()
    steps: tuple[Step, ...] = ()  # a job's processes when they are not one driver on the head (and Ray)
    files: tuple[RunFile, ...] = ()
    port_range: tuple[int, int]  # ports drawn for the job (Ray's, the steps') come from here (profile ray.ports)
    driver: Driver | None  # None for a smoke test
    smoke: Smoke | None = None
    watchdog: Watchdog
    checkpoints: Checkpoints
    chain: Chain
    stack: dict[str, Any] | None = None  # the stack check's expectation (None: no check)
    gpu_monitor: GpuMonitor
    kill_wait_s: int  # the profile's slurm.kill_wait_s, used when scontrol does not say
    signal_before_end_s: int
    grace_s: int
    plan: dict[str, Any]  # hpcrl/plan.json: what the script was rendered from

    @property
    def nodes(self) -> int:
        return self.slurm.nodes

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_json(cls, data: dict[str, Any] | str) -> JobSpec:
        return cls.model_validate_json(data) if isinstance(data, str) else cls.model_validate(data)


__all__ = [
    "Chain",
    "Checkpoints",
    "Container",
    "Driver",
    "Environment",
    "GpuMonitor",
    "Header",
    "Health",
    "JobSpec",
    "NodeRole",
    "Phase",
    "RaySpec",
    "Resume",
    "RunDirectory",
    "RunFile",
    "SCHEMA_VERSION",
    "Service",
    "ShellWord",
    "SlurmRequest",
    "Smoke",
    "Step",
    "Watchdog",
]
