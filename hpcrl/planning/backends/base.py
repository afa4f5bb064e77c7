"""What a training framework must tell hpcrl: its flags, its planner inputs, its driver command.

Pure. One subclass per framework (open_instruct.py, verl.py, openrlhf.py, and custom.py for
the users' own scripts); `get_backend` in hpcrl/planning/backends/__init__.py picks one by the run
config's `hpcrl.backend`. The Ray bring-up (for backends with `uses_ray`), the run directory
and the job chain are the same for every backend; only the driver command (and the smoke
test's placement) differ.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from hpcrl.errors import ConfigError, HpcrlError, PlanError
from hpcrl.planning.backends.facts import DiskFacts, MemoryFacts
from hpcrl.planning.layout import Layout, Pins, Workload
from hpcrl.planning.backends.log_facts import (
    CommandFacts,
    CpuAsk,
    DiagnoseFacts,
    LogFormat,
    MetricFacts,
    SmokeFacts,
    TimingFacts,
)
from hpcrl.planning.backends.processes import Process, RunFile
from hpcrl.planning.layout_advice import plan_layouts
from hpcrl.shell import shq

if TYPE_CHECKING:
    from hpcrl.planning.run_types import HpcrlSection, RunConfig, RunPlan
    from hpcrl.memory.vllm_accounting import VllmEngineFacts
    from hpcrl.profiles import ClusterProfile

# The largest number (in size) a config value may hold: integers above it are not exact in JSON or a float,
# and no count, step or size of a run comes near it (a step count of 1e20 once allocated until MemoryError).
NUMBER_MAX = 2**53
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
# What may follow $RUN_DIR in a word the shell expands (a fixed sub-directory of the run).
_RUN_DIR_WORD = re.compile(r"^[A-Za-z0-9_.=/@+:-]*\$RUN_DIR(/[A-Za-z0-9_.-]+)*$")


@dataclass(frozen=True)
class Word:
    """One word of the driver command: a literal (quoted when rendered), or text around
    `$RUN_DIR` that the shell expands at run time (double-quoted)."""

    text: str
    run_dir: bool = False

    def shell(self) -> str:
        if not self.run_dir:
            return shq(self.text)
        if not _RUN_DIR_WORD.match(self.text):
            raise ValueError(f"run-dir word {self.text!r} has characters the script cannot carry")
        return f'"{self.text}"'


DriverLine = tuple[Word, ...]


@dataclass(frozen=True)
class Service:
    """A server the framework's code calls on localhost, started by the script on every node."""

    name: str  # file names and messages: code-server
    command: tuple[str, ...]  # the words; "{port}" is replaced by the port at run time
    health_path: str  # an HTTP GET that answers 200 once it is up
    port: int | None = None  # fixed (the config names it), else one of the job's port block
    env: tuple[tuple[str, str], ...] = ()  # exported for the driver; "{port}" likewise
    why: str = ""  # the script's comment: why it runs, with its source


@dataclass(frozen=True)
class Planned:
    """What a backend's planner returns: ranked layouts, values it chose beyond the layout
    (framework key -> value, e.g. a micro-batch size) and warnings for the user."""

    layouts: list[Layout]
    choices: dict[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    workload: Workload | None = None  # the workload the layouts were planned for, where the plan changed it
    # Why the layout has more learners per node than the profile's cap, where the backend tried the cap
    # (the cap warning's second half; else the backend's fills_learner_nodes).
    cap_note: str = ""
    # The backend's own warnings already say why the chosen layout leaves GPUs idle (its placement's, not the
    # separate-engine planner's reasons): the generic idle-GPU warning is left out.
    idle_explained: bool = False


# What every backend declares for itself, in its own class (or a helper base of its own): the Backend
# defaults of these would make a new framework behave like the default backend without a word (DeepSpeed
# ZeRO learners beside vLLM engines, open-instruct's Ray placement and log reading). The registry refuses
# a backend class that leaves one to them (Backend.undeclared; docs/backends.md "Adding a backend").
MUST_DECLARE = (
    "uses_ray",
    "entry_is_module",
    "plan",
    "memory",
    "disk",
    "layout_fixes",
    "command_facts",
    "diagnose_facts",
    "smoke_facts",
    "timing_facts",
    "log_format",
)


class Backend(ABC):
    """A training framework driven on hpcrl's Ray cluster."""

    name: ClassVar[str]
    label: ClassVar[str]  # in the script's comments: "open-instruct's grpo_fast.py"
    default_entry_point: ClassVar[str]
    default_workdir: ClassVar[str]
    default_python: ClassVar[str] = "python"
    default_logprob_impl: ClassVar[str] = "compiled"  # how the framework computes log-probs (memory model)
    model_key: ClassVar[str]  # the framework's key naming the policy model
    layout_keys: ClassVar[tuple[str, ...]]  # decided by the planner; set in a config, they are pins
    run_dir_keys: ClassVar[tuple[str, ...]]  # set by hpcrl from the run directory; refused in a config
    flag_table: ClassVar[str]  # the data file the flags are checked against
    entry_is_module: ClassVar[bool] = True  # `python -m <entry point>` (else a script path)
    uses_ray: ClassVar[bool] = True  # the script brings up Ray across the job's nodes first
    # hpcrl writes the framework's DeepSpeed config (so hpcrl.deepspeed_offload means something for it).
    writes_deepspeed_config: ClassVar[bool] = False
    # The key that sets how often the resume state is written, and the file (relative to the run
    # directory) the framework rewrites once a checkpoint is complete: the job script watches it
    # after the time-limit warning.
    checkpoint_key: ClassVar[str]
    checkpoint_marker: ClassVar[str]
    checkpoint_env: ClassVar[str | None] = None  # the driver's environment variable carrying the interval, if so
    # Config keys that turn on a feature (data/capabilities.json names): a feature the
    # framework's code does not implement is refused when one of its keys is set.
    feature_triggers: ClassVar[dict[str, tuple[str, ...]]] = {}
    # Keys whose values must lie in a range the framework accepts: key -> (test, what is valid,
    # in words). A number that fails the test is refused before anything is planned.
    value_ranges: ClassVar[dict[str, tuple[Callable[[float], bool], str]]] = {}

    @classmethod
    def undeclared(cls) -> list[str]:
        """The MUST_DECLARE members this class takes from Backend itself."""
        own = [c for c in cls.__mro__ if c is not Backend and isinstance(c, type) and issubclass(c, Backend)]
        return [m for m in MUST_DECLARE if not any(m in c.__dict__ for c in own)]

    @classmethod
    def section_defaults(cls) -> dict[str, str]:
        """The `hpcrl:` fields whose defaults are this framework's own (the run config asks for them)."""
        return {
            "entry_point": cls.default_entry_point,
            "workdir": cls.default_workdir,
            "python": cls.default_python,
            "logprob_impl": cls.default_logprob_impl,
        }

    # ------------------------------------------------------------------ flags
    @abstractmethod
    def arg_table(self, section: HpcrlSection | None = None) -> dict[str, dict[str, Any]]:
        """Every flag or key the framework accepts: name -> {default, type, ...}."""

    def normalize_args(self, args: dict[str, Any], section: HpcrlSection) -> dict[str, Any]:
        """The config's arguments in the table's spelling (e.g. nested YAML flattened)."""
        return args

    @abstractmethod
    def check_args(self, args: dict[str, Any], section: HpcrlSection) -> None:
        """Raise UnknownNameError (closest names) or ConfigError for a key or value the framework lacks."""

    def check_features(self, args: dict[str, Any]) -> None:
        """Refuse a feature the framework's code lacks and a value outside what it accepts."""
        from hpcrl.planning.backends.capabilities import refuse_unsupported

        refuse_unsupported(self.name, self.feature_triggers, args)
        for key, value in args.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not abs(value) <= NUMBER_MAX:
                raise ConfigError(
                    f"{key} {value!r}: not a number a run can use; valid: a finite number of at most "
                    f"2**53 ({NUMBER_MAX:,}) in size"
                )
        for key, (ok, valid) in self.value_ranges.items():
            value = args.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not (value == value and ok(value)):
                raise ConfigError(f"{key} {value!r}: valid: {valid}")

    def check_section(self, section: HpcrlSection) -> None:
        """Refuse hpcrl settings that mean nothing for this framework."""
        if section.arg_layout != "current":
            raise ConfigError(f"hpcrl.arg_layout is open-instruct's; remove it for backend {self.name}")
        self.check_version(section)
        if section.deepspeed_offload != "none" and not self.writes_deepspeed_config:
            raise ConfigError(
                f"hpcrl.deepspeed_offload is for a DeepSpeed config hpcrl writes; backend {self.name} "
                "sets offload with a key of its own (hpcrl plan suggests it); remove it"
            )
        if section.lora_hf_save != "adapter" and self.name != "openrlhf":
            raise ConfigError(f"hpcrl.lora_hf_save is OpenRLHF's; remove it for backend {self.name}")
        if self.entry_is_module and (not _MODULE.match(section.entry_point) or section.entry_point.endswith(".py")):
            raise ConfigError(
                f"hpcrl.entry_point {section.entry_point!r}: backend {self.name} runs a module "
                f"(python -m), e.g. {self.default_entry_point}"
            )

    def check_version(self, section: HpcrlSection) -> None:
        """Refuse a framework version hpcrl has no table for (UnknownVersionError lists the known)."""
        from hpcrl.planning.backends import versions

        if section.framework_version is None:
            return
        if not versions.known(self.name):
            raise ConfigError(f"hpcrl.framework_version: hpcrl keeps no versions of backend {self.name}; remove it")
        versions.resolve(self.name, section.framework_version)

    def target_version(self, section: HpcrlSection) -> tuple[str | None, str | None]:
        """(the label of the framework version a run targets, the assumption to print when the config
        names none); (None, None) for a backend hpcrl keeps no versions of."""
        from hpcrl.planning.backends import versions

        if not versions.known(self.name):
            return None, None
        v, assumed = versions.targeted(self.name, section.framework_version)
        return f"{self.name} {v.label()}", assumed

    # ------------------------------------------------------------------ planning
    def colocated(self, cfg: RunConfig) -> bool:
        """Whether training and generation share every GPU (one colocated layout)."""
        return False

    def model_name(self, args: dict[str, Any]) -> str:
        return str(args.get(self.model_key) or "")

    @abstractmethod
    def workload_from_config(self, cfg: RunConfig, model: str | None = None) -> Workload:
        """The planner's view of the config (framework defaults where unset)."""

    @abstractmethod
    def pins_from(self, cfg: RunConfig, cli_pins: list[str] | None = None) -> Pins:
        """Pins from pinned config keys and `--pin key=value`."""

    def plan(
        self,
        cfg: RunConfig,
        profile: ClusterProfile,
        nodes: int,
        w: Workload,
        pins: Pins,
        variants: list[ClusterProfile],
    ) -> Planned:
        """Ranked layouts (and any other planned values) for this framework."""
        return Planned(plan_layouts(profile, nodes, w, pins, variants, self.layout_fixes))

    # ------------------------------------------------------------------ rendering
    def runs_module(self, section: HpcrlSection) -> bool:
        """`python -m <entry point>` (else `python <entry point>`, a script path)."""
        return self.entry_is_module

    def declared_resume(self, cfg: RunConfig) -> str | None:
        """Why a new job cannot resume this run, as its config declares ("" when it can); None: the
        framework's checkpoint settings decide (hpcrl/planning/resume.py)."""
        return None

    @abstractmethod
    def layout_args(self, rp: RunPlan) -> dict[str, Any]:
        """The plan as the framework's own layout flags or keys (name -> value)."""

    @abstractmethod
    def driver_command(self, rp: RunPlan) -> list[DriverLine]:
        """The words after `python <entry point>`, one flag (or override) per line."""

    def env(self, rp: RunPlan) -> dict[str, str]:
        """Extra environment for the driver (exported just before it starts)."""
        return {}

    def launcher_words(self, rp: RunPlan) -> list[str]:
        """Words between "$PYTHON" and the entry point (a launcher module such as torchrun's)."""
        return []

    def job_processes(self, rp: RunPlan) -> tuple[Process, ...]:
        """The job's processes when it is not one driver on the head (and Ray's nodes): each in an srun step of
        its own on its nodes, one of them the driver (backends/processes.py). (): the driver alone."""
        return ()

    def run_files(self, rp: RunPlan) -> tuple[RunFile, ...]:
        """Files the job writes under the run directory before its processes start (configs hpcrl writes)."""
        return ()

    def services(self, cfg: RunConfig) -> list[Service]:
        """Servers the script starts on every node for this run (none unless the framework calls one)."""
        if cfg.hpcrl.code_server == "on":
            raise ConfigError(
                f"hpcrl.code_server on: {self.name}'s default path calls no code-execution server "
                "(backends/data/capabilities.json); remove it"
            )
        return []

    @abstractmethod
    def summary(self, rp: RunPlan) -> str:
        """The layout in one line of the script's header, in the framework's names."""

    def tokens_text(self, rp: RunPlan) -> str:
        """How many tokens one learner GPU holds in a micro-batch, in the framework's words."""
        return f"{rp.workload.pack_length} tokens per GPU micro-batch"

    # ------------------------------------------------------------------ planning facts
    def sleep_level(self, version: str | None = None) -> int:
        """The vLLM sleep level of a colocated engine (1: weights kept in host RAM; 2: discarded)."""
        return 1

    # Whether the memory model's learner terms depend on the framework version (plan-memory then says which).
    memory_by_version: ClassVar[bool] = False

    def learner_fixed(self, version: str | None = None) -> tuple[tuple[str, Any], ...]:
        """LearnerSetup fields the framework at `version` fixes whatever the config (Workload.learner_fixed)."""
        return tuple(self.memory.learner.items())

    def engine_facts(self, version: str | None = None) -> VllmEngineFacts:
        """The vLLM the framework at `version` installs, with its default scheduler sizes (Workload.vllm)."""
        return self.memory.vllm

    # (disk budget kinds, memory-model choice, plan-memory questions)
    list_order: ClassVar[int] = 100  # where lists of backends show it (the default backend first)
    disk: ClassVar[DiskFacts]  # its checkpoints and dumps against the run root's quota (facts.py)
    memory: ClassVar[MemoryFacts] = MemoryFacts()  # how the memory model sees its learner (facts.py)
    # `plan --json` and plan.json carry the backend's name and its layout keys (the first backend's
    # output predates other backends and stays as it was).
    plan_shows_layout_args: ClassVar[bool] = True
    # The layout planner's single-setting fixes in the framework's words (hpcrl/planning/layout_advice.py):
    # no_hpz, offload_optimizer, offload_params, tokens ({tokens}, or {micro} sequences of the run's length),
    # learners ({k}), lora, per_param_sync. Each printed fix is re-planned as typed first (planning/request.py).
    layout_fixes: ClassVar[Mapping[str, str | None]] = {}
    # A run's learner is read back from its plan.json (a user's script: no framework command line).
    learner_from_plan: ClassVar[bool] = False
    # The framework's config key of each layout choice (Pins' fields: learners_per_node, learner_nodes, tp, engines,
    # gpu_memory_utilization), named in the layout planner's refusals and warnings; a choice without one in words.
    pin_keys: ClassVar[Mapping[str, str]] = {}

    def arg(self, cfg: RunConfig, key: str) -> Any:
        """A key's value: the config's, else the framework's default (None where hpcrl knows none)."""
        return cfg.args.get(key)

    def memory_answer(
        self, cfg: RunConfig, profile: ClusterProfile, given: Any, learner_gpus: int | None
    ) -> dict[str, Any] | None:
        """plan-memory's answer from the backend's own memory model (None: the shared learner + vLLM question)."""
        return None

    def learner_workload(self, cfg: RunConfig, w: Workload, world: int, micro: int) -> Workload:
        """The workload of one micro-batch choice (`micro` sequences per GPU; 0: tokens fixed already)."""
        return replace(w, pack_length=micro * w.seq_len) if micro else w

    # ------------------------------------------------------------------ log, diagnose and in-job facts
    # (log line formats and metric keys, diagnose fixes, smoke placement, driver command-line reading)
    command_facts: ClassVar[CommandFacts] = CommandFacts()
    diagnose_facts: ClassVar[DiagnoseFacts] = DiagnoseFacts(keys={})
    smoke_facts: ClassVar[SmokeFacts] = SmokeFacts()
    timing_facts: ClassVar[TimingFacts] = TimingFacts()  # step and checkpoint times in its output
    metric_facts: ClassVar[MetricFacts] = MetricFacts()  # the metrics watch and report --html show
    # How its driver prints a step and the metric keys the breakers read; None: not known (a user's script), the
    # union of every backend's is read.
    log_format: ClassVar[LogFormat | None] = None
    # plan.json names the backend (a plan.json without the name is the default backend's run).
    names_itself_in_plan: ClassVar[bool] = True
    # Why the framework's own placement puts every GPU of a learner node to training, so a profile's cap on
    # learners per node cannot be planned ("": the layout search keeps to the cap).
    fills_learner_nodes: ClassVar[str] = ""

    def read_renamed(self, args: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
        """A logged command's arguments under the framework's current names, and what was renamed."""
        return args, ()

    def smoke_cpu_ask(self, rp: RunPlan) -> CpuAsk | None:
        """The CPUs the framework would ask of Ray for the plan's layout (None: not known)."""
        return None

    def smoke_words(self, rp: RunPlan) -> list[str]:
        """The smoke command's words that make it place bundles as this framework does."""
        s = self.smoke_facts
        ask = self.smoke_cpu_ask(rp)
        return (
            ["--framework", self.name]
            + (["--colocated"] if rp.layout.colocated else [])
            + (["--actor-env"] if s.actor_env else [])
            + ["--placement", s.placement]
            + (ask.words() if ask else [])
        )


def positive(v: float) -> bool:
    return v > 0


def never_or_positive(v: float) -> bool:
    """-1 (the framework's "never") or a positive count."""
    return v == -1 or v > 0


def flatten(args: dict[str, Any], table: dict[str, Any]) -> dict[str, Any]:
    """Nested YAML mappings as dotted keys, down to the table's leaves (`a: {b: 1}` -> `a.b: 1`)."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if prefix.lstrip("+") in table or not isinstance(value, dict) or not value:
            out[prefix] = value
            return
        for k, v in value.items():
            walk(f"{prefix}.{k}", v)

    for key, value in args.items():
        walk(str(key), value)
    return out


def is_number(text: str) -> bool:
    """Whether a command-line word reads as a number (so a leading '-' is a sign, not a flag)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_number(raw: str) -> Any:
    """An int or float where the text reads as one; else the text."""
    try:
        return int(raw)
    except ValueError:
        try:
            return float(raw)
        except ValueError:
            return raw


def merge_planned(user: dict[str, Any], planned: dict[str, Any]) -> dict[str, Any]:
    """The user's arguments in their order with the plan's values for planned keys, then
    the planned keys the user did not set (pinned values were already checked by the plan)."""
    rest = dict(planned)
    merged = {key: rest.pop(key, value) for key, value in user.items()}
    merged.update(rest)
    return merged


def require_job_match(key: str, pinned: Any, actual: int) -> None:
    """A pinned node or GPU count that differs from the job is an error, not a silent change."""
    if pinned is not None and int(pinned) != actual:
        raise PlanError(f"{key} {pinned} is pinned in the config but the job has {actual}; remove it or match it")


def refuse_run_dir_keys(backend: Backend, args: dict[str, Any], where: str) -> None:
    for key in backend.run_dir_keys:
        if key in args:
            raise ConfigError(
                f"{where}{key} is set by hpcrl from the run directory so restarts resume; "
                "remove it (set hpcrl.run_root to move runs)"
            )


# `--pin` names -> Pins fields, shared by every backend.
PIN_NAMES = {
    "learners": "learners_per_node",
    "learner_nodes": "learner_nodes",
    "tp": "tp",
    "engines": "engines",
    "util": "gpu_memory_utilization",
}


def cli_pins_into(
    values: dict[str, Any],
    cli_pins: list[str] | None,
    allowed: tuple[str, ...] = tuple(PIN_NAMES),
    keys: Mapping[str, str] | None = None,
) -> Pins:
    """`--pin key=value` on top of the config's pins; each choice once, each a count of 1 or more (util in (0, 1]);
    `keys` are the framework's names of the choices (Backend.pin_keys)."""
    given: dict[str, str] = {}
    for item in cli_pins or []:
        key, sep, raw = item.partition("=")
        if not sep or key not in PIN_NAMES:
            raise HpcrlError(f"--pin {item!r}: expected one of {', '.join(k + '=N' for k in PIN_NAMES)}")
        if key not in allowed:
            raise HpcrlError(
                f"--pin {item!r}: not a choice of this backend's layout; valid: {', '.join(k + '=N' for k in allowed)}"
            )
        if key in given:
            raise HpcrlError(f"--pin {key} given twice ({given[key]}, {raw}); give it once")
        given[key] = raw
        try:
            value = float(raw) if key == "util" else int(raw)
        except ValueError:
            raise HpcrlError(f"--pin {item!r}: {raw!r} is not a number") from None
        if not (0 < value <= 1 if key == "util" else value >= 1):
            raise HpcrlError(f"--pin {item!r}: valid: " + ("a fraction in (0, 1]" if key == "util" else "1 or more"))
        values[PIN_NAMES[key]] = value
    return Pins(**values, keys=tuple((keys or {}).items()))
