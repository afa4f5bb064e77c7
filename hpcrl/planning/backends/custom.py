"""The custom backend: the user's own training script, with everything hpcrl adds around a run.

Pure. `python <entry point> <script_args>` or `python -m torch.distributed.run --standalone
--nproc-per-node=N <entry point> <script_args>` on one node (all its GPUs, or part of it with
`--gpus N`), without Ray: the run directory, the job chain on the time limit, the watchdog
(reward and loss keys from hpcrl.reward_keys / hpcrl.loss_keys), the GPU monitor and the report
are the same as for the frameworks. The script is the user's, so hpcrl knows only what the config
says about it: the keys below describe its learner for the memory plan, an HF-Trainer/TRL-style
PPO or GRPO learner with LoRA or QLoRA that generates with HF `generate` (hpcrl/memory/hf_learner.py).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from hpcrl.errors import ConfigError, PlanError, UnknownNameError
from hpcrl.memory.hf_learner import HfLearnerSetup
from hpcrl.memory.hf_plan import HfPlan, hf_memory_plan
from hpcrl.models import resolve_model
from hpcrl.models.spec import ALL_LINEAR
from hpcrl.planning.backends.base import _MODULE as MODULE_NAME
from hpcrl.planning.backends.base import Backend, DriverLine, Planned, Word, cli_pins_into, positive
from hpcrl.planning.backends.facts import MemoryFacts
from hpcrl.planning.backends.log_facts import CommandFacts, DiagnoseFacts, SmokeFacts, TimingFacts
from hpcrl.planning.backends.custom_facts import DISK, memory_answer
from hpcrl.planning.layout import Layout, Pins, Workload, learner_band

if TYPE_CHECKING:
    from hpcrl.planning.run_types import HpcrlSection, RunConfig, RunPlan
    from hpcrl.profiles import ClusterProfile

# The custom backend's keys: name -> (type, default, what it says). No framework to read them from:
# they describe the user's script to hpcrl (docs/backends.md). None: required.
KEYS: dict[str, tuple[str, Any, str]] = {
    "launcher": ("str", "python", "python (one process) or torchrun (one process per GPU, DDP)"),
    "script_args": ("list", [], "the script's own arguments; {run_dir} becomes the run directory"),
    "model": ("str", None, "the policy model (catalog name, HF repo id or config.json)"),
    "algorithm": ("str", "ppo", "ppo or grpo"),
    "lora_rank": ("int", None, "LoRA rank; 0: full fine-tuning (every weight trains; a bf16 base)"),
    "lora_alpha": ("int", None, "LoRA alpha (recorded; no effect on memory)"),
    "lora_dropout": ("float", 0.0, "LoRA dropout (above 0 the adapters keep dropout copies of their inputs)"),
    "lora_targets": ("list", list(ALL_LINEAR), "modules with adapters"),
    "load_in_4bit": ("bool", False, "4-bit NF4 base via bitsandbytes (QLoRA)"),
    "double_quant": ("bool", False, "bnb_4bit_use_double_quant"),
    "critic": (
        "str",
        None,
        "value_head (TRL's), model (a separate critic with its own adapters) or none; "
        "default value_head for ppo, none for grpo",
    ),
    "reference": ("str", "shared", "shared (the base with adapters off), copy (a second base) or none"),
    "generation": ("str", "hf", "hf: HF generate on the learner GPU (vLLM is not planned here)"),
    "rollout_batch_size": ("int", None, "sequences in one generate call"),
    "samples_per_prompt": ("int", 1, "GRPO's group size"),
    "rollout_batches": ("int", 1, "generate calls per training step"),
    "mini_batch_size": ("int", None, "sequences in one training forward/backward"),
    "gradient_accumulation_steps": ("int", 1, "micro-batches per optimizer step"),
    "ppo_epochs": ("int", 1, "passes over a step's rollouts"),
    "max_prompt_length": ("int", None, "prompt tokens"),
    "max_response_length": ("int", None, "generated tokens"),
    "gradient_checkpointing": ("bool", True, "gradient checkpointing"),
    "learning_rate": ("float", None, "recorded"),
    "total_steps": ("int", None, "training steps of the whole run (disk plan)"),
    "save_steps": ("int", None, "steps between checkpoints (exported as HPCRL_SAVE_STEPS; planned when unset)"),
    "keep_checkpoints": ("int", None, "checkpoints the script keeps (HF save_total_limit; unset: all)"),
    "resume": (
        "str",
        "none",
        "how a new job of the chain resumes the script: none (it cannot: no continuation at "
        "the time limit), marker (it resumes from its newest checkpoint and writes "
        "$HPCRL_RUN_DIR/checkpoints/latest once one is complete) or own (it finds its own "
        "state when started again, e.g. AReaL's recover.mode=auto)",
    ),
}
REQUIRED = ("model", "lora_rank", "rollout_batch_size", "mini_batch_size", "max_prompt_length", "max_response_length")
CHOICES = {
    "launcher": ("python", "torchrun"),
    "algorithm": ("ppo", "grpo"),
    "critic": ("value_head", "model", "none"),
    "reference": ("shared", "copy", "none"),
    "generation": ("hf",),
    "resume": ("none", "marker", "own"),
}
_TYPES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "list": (list,)}
# HF generate runs one Python step per token: an assumed per-token overhead on top of the
# bandwidth-bound decode (an estimate for the step time only; not measured by hpcrl).
HF_GENERATE_TOKEN_OVERHEAD_S = 0.03
DECODE_BW_EFFICIENCY = 0.5
# Why this estimate can miss by more than its band: users measured a 3B QLoRA PPO step at 26.6 s on
# one A100 (seeds/003), about 2.4x this model's mid estimate.
HF_GENERATE_BASIS = (
    f"derived (uncalibrated): HF generate, bf16 weight + KV reads at {DECODE_BW_EFFICIENCY:.0%} of "
    f"HBM peak + {HF_GENERATE_TOKEN_OVERHEAD_S * 1e3:.0f} ms per token; not checked against a "
    "measured HF-generate step (4-bit dequantization per token, PPO's extra forwards and Python "
    "overheads are not modelled), a real step may take 2-3x the estimate"
)
RUN_DIR_PLACEHOLDER = "{run_dir}"


class CustomBackend(Backend):
    """The user's own script (python or torchrun) on one node, no Ray, no vLLM."""

    name = "custom"
    label = "the user's training script"
    default_entry_point = "train.py"
    default_workdir = "$HOME"
    default_python = "python"
    default_logprob_impl = "eager"
    model_key = "model"
    layout_keys = ()
    run_dir_keys = ()
    flag_table = "hpcrl/planning/backends/custom.py (KEYS)"
    entry_is_module = False
    uses_ray = False
    # No command line to read back: diagnose reads the run's plan.json (hpcrl/logs/diagnose_custom.py).
    diagnose_facts = DiagnoseFacts(
        keys={"model": "model"},
        learner_fixes="planned",
        engines=False,
        disk_reads=("lora_rank", "keep"),
        disk_bound="keep_checkpoints bounds them",
    )
    smoke_facts = SmokeFacts(comment="check the job's GPUs and cores without Ray")
    command_facts = CommandFacts()  # a user's script: no entry point a log shows to recognise, no package
    timing_facts = TimingFacts()  # no step or checkpoint timer hpcrl knows of in a user's output
    # A user's script may print any framework's step lines or none: its log is read with every backend's format
    # (and the ones no backend owns: JSON lines, AReaL's tables), hpcrl/logs/log_format.py.
    log_format = None
    # plan-memory answers from this backend's own HF learner model (memory_answer below), never the shared
    # DeepSpeed learner + vLLM question these facts feed.
    memory = MemoryFacts()
    layout_fixes = {}  # one node, planned by its own HF planner (plan below)
    # The script should write $HPCRL_RUN_DIR/checkpoints/latest once a checkpoint is complete: after the
    # time-limit warning the job waits for it (else it stops the script when only time to stop is left).
    checkpoint_key = "save_steps"
    checkpoint_marker = "checkpoints/latest"
    checkpoint_env = "HPCRL_SAVE_STEPS"
    value_ranges = {"lora_rank": (lambda v: v >= 0, "a positive LoRA rank, or 0 for full fine-tuning")} | {
        k: (positive, "a positive count")
        for k in (
            "rollout_batch_size",
            "mini_batch_size",
            "max_prompt_length",
            "max_response_length",
            "samples_per_prompt",
            "rollout_batches",
            "gradient_accumulation_steps",
            "ppo_epochs",
            "total_steps",
            "save_steps",
            "keep_checkpoints",
        )
    }
    list_order = 3
    disk = DISK
    learner_from_plan = True

    def memory_answer(
        self, cfg: RunConfig, profile: ClusterProfile, given: Any, learner_gpus: int | None
    ) -> dict[str, Any]:
        return memory_answer(self, cfg, profile, given, learner_gpus)

    # ------------------------------------------------------------------ keys
    def arg_table(self, section: HpcrlSection | None = None) -> dict[str, dict[str, Any]]:
        return {k: {"type": t, "default": d, "help": h} for k, (t, d, h) in KEYS.items()}

    def check_args(self, args: dict[str, Any], section: HpcrlSection) -> None:
        for key, value in args.items():
            if key not in KEYS:
                raise UnknownNameError("custom key", key, KEYS)
            kind = KEYS[key][0]
            ok = value is None or (isinstance(value, _TYPES[kind]) and (kind == "bool" or not isinstance(value, bool)))
            if not ok:
                raise ConfigError(f"{key}: expected {kind}, got {value!r}")
            if key in CHOICES and value not in CHOICES[key]:
                raise ConfigError(f"{key} {value!r}: valid: {', '.join(CHOICES[key])}")
        if not all(isinstance(w, (str, int, float)) and not isinstance(w, bool) for w in args.get("script_args", [])):
            raise ConfigError("script_args: a list of words (strings or numbers)")
        missing = [k for k in REQUIRED if args.get(k) is None]
        if missing:
            raise ConfigError(
                f"the custom backend needs {', '.join(missing)} (they describe the script's learner "
                "to the memory plan; docs/backends.md)"
            )

    def check_section(self, section: HpcrlSection) -> None:
        super().check_section(section)
        if not section.entry_point.endswith(".py") and not self.runs_module(section):
            raise ConfigError(
                f"hpcrl.entry_point {section.entry_point!r}: the custom backend runs a script path "
                "(relative to hpcrl.workdir, e.g. train.py) or a module (python -m, e.g. mypkg.train)"
            )

    def runs_module(self, section: HpcrlSection) -> bool:
        return not section.entry_point.endswith(".py") and bool(MODULE_NAME.match(section.entry_point))

    def arg(self, cfg: RunConfig, key: str) -> Any:
        value = cfg.args.get(key, KEYS[key][1])
        if key == "critic" and value is None:
            return "value_head" if self.arg(cfg, "algorithm") == "ppo" else "none"
        return value

    def declared_resume(self, cfg: RunConfig) -> str:
        if self.arg(cfg, "resume") != "none":
            return ""
        return "resume none: the script declares no way to resume (set resume: marker or own if it does)"

    # ------------------------------------------------------------------ planning
    def colocated(self, cfg: RunConfig) -> bool:
        return True  # every GPU generates (HF generate) and trains in turn

    def workload_from_config(self, cfg: RunConfig, model: str | None = None) -> Workload:
        name = model or cfg.model_name
        prompt, response = int(self.arg(cfg, "max_prompt_length")), int(self.arg(cfg, "max_response_length"))
        return Workload(
            model=resolve_model(name),
            pack_length=int(self.arg(cfg, "mini_batch_size")) * (prompt + response),
            response_length=response,
            max_prompt_token_length=prompt,
            unique_prompts=int(self.arg(cfg, "rollout_batch_size")) * int(self.arg(cfg, "rollout_batches")),
            samples_per_prompt=int(self.arg(cfg, "samples_per_prompt")),
            load_ref_policy=self.arg(cfg, "reference") != "none",
            gradient_checkpointing=bool(self.arg(cfg, "gradient_checkpointing")),
            lora_rank=int(self.arg(cfg, "lora_rank")),
            load_in_4bit=bool(self.arg(cfg, "load_in_4bit")),
            logprob_impl="eager",
            hpz_partition_size=1,
            logits_copy=False,
            vllm=self.memory.vllm,
        )

    def pins_from(self, cfg: RunConfig, cli_pins: list[str] | None = None) -> Pins:
        # learners: torchrun's processes on the node, past the profile's cap (flags override the profile).
        return cli_pins_into({}, cli_pins, allowed=("learners",))

    def processes(self, cfg: RunConfig, gpus: int) -> int:
        """Training processes on the node: one per GPU under torchrun, one with python."""
        return gpus if self.arg(cfg, "launcher") == "torchrun" else 1

    def placed_processes(self, cfg: RunConfig, profile: ClusterProfile, pins: Pins) -> tuple[int, str]:
        """Training processes on the node: pinned, else the launcher's, at most the profile's learners per
        node; and why some GPUs stay idle under that cap ("" where it took none)."""
        g, cap = profile.gpu.count_per_node, profile.planning.max_learners_per_node
        if pins.learners_per_node is not None:
            if self.arg(cfg, "launcher") != "torchrun" and pins.learners_per_node != 1:
                raise PlanError(
                    f"--pin learners={pins.learners_per_node}: launcher python runs one process; "
                    "valid: learners=1, or launcher torchrun"
                )
            if pins.learners_per_node > g:
                raise PlanError(
                    f"--pin learners={pins.learners_per_node}: the job has {g} GPU{'s' if g > 1 else ''}; "
                    f"valid: 1 to {g}"
                )
            return pins.learners_per_node, ""
        procs = self.processes(cfg, g)
        if not cap or procs <= cap:
            return procs, ""
        return cap, (
            f"torchrun runs {cap} process{'es' if cap > 1 else ''}, not one per GPU: {profile.name} plans "
            f"at most {cap} learner{'s' if cap > 1 else ''} per node ({profile.planning.why or 'see the profile'}); "
            f"{g - cap} of the job's {g} GPUs stay idle; --pin learners={g} runs one per GPU"
        )

    def learner_setup(self, cfg: RunConfig, w: Workload, n_gpus: int) -> HfLearnerSetup:
        """The script's learner as the memory model sees it."""
        return HfLearnerSetup(
            model=w.model,
            n_gpus=n_gpus,
            algorithm=self.arg(cfg, "algorithm"),
            lora_rank=w.lora_rank,
            lora_targets=tuple(self.arg(cfg, "lora_targets")),
            lora_dropout=float(self.arg(cfg, "lora_dropout")),
            load_in_4bit=w.load_in_4bit,
            double_quant=bool(self.arg(cfg, "double_quant")),
            critic=self.arg(cfg, "critic"),
            reference=self.arg(cfg, "reference"),
            rollout_seqs=int(self.arg(cfg, "rollout_batch_size")) * w.samples_per_prompt,
            micro_seqs=int(self.arg(cfg, "mini_batch_size")),
            prompt_len=w.max_prompt_token_length,
            response_len=w.response_length,
            gradient_checkpointing=w.gradient_checkpointing,
        )

    def plan(
        self,
        cfg: RunConfig,
        profile: ClusterProfile,
        nodes: int,
        w: Workload,
        pins: Pins,
        variants: list[ClusterProfile],
    ) -> Planned:
        if nodes != 1:
            raise PlanError(
                f"the custom backend runs one node (torchrun --standalone), got {nodes} nodes; "
                "use --nodes 1 (and --gpus N for part of a node)"
            )
        g = profile.gpu.count_per_node
        procs, capped = self.placed_processes(cfg, profile, pins)
        plan = hf_memory_plan(profile, self.learner_setup(cfg, w, procs))
        if not plan.fits:
            four_bit = "" if w.load_in_4bit else ", or load_in_4bit"  # never offered to a config that has it
            raise PlanError(
                f"{plan.verdict()} (custom learner, {g} GPU{'s' if g > 1 else ''} of {profile.name}; "
                f"smaller mini_batch_size, max_response_length or rollout_batch_size{four_bit})"
            )
        warnings = []
        if capped:
            warnings.append(capped)
        elif procs < g:
            warnings.append(
                f"launcher python runs one process: {g - procs} of the job's {g} GPUs stay idle "
                "(launcher torchrun runs one per GPU, or ask --gpus 1)"
            )
        lay = Layout(
            nodes=1,
            gpus_per_node=g,
            learners_per_node=procs,
            learner_nodes=1,
            tp=1,
            engines=procs,
            gpu_memory_utilization=0.0,
            memory=plan,
            gen_time_s=generation_time(cfg, self, w, plan, profile),
            train_band=learner_band(w, plan, profile, procs, int(self.arg(cfg, "ppo_epochs"))),
            colocated=True,
            gen_basis=HF_GENERATE_BASIS,
        )
        return Planned([lay], warnings=tuple(warnings))

    # ------------------------------------------------------------------ rendering
    def launcher_words(self, rp: RunPlan) -> list[str]:
        """Words between "$PYTHON" and the entry point."""
        if self.arg(rp.config, "launcher") != "torchrun":
            return []
        return [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes=1",
            f"--nproc-per-node={rp.layout.learners_per_node}",
        ]

    def save_steps(self, rp: RunPlan) -> int:
        return int(rp.config.args.get("save_steps") or dict(rp.choices).get("save_steps") or 0)

    def layout_args(self, rp: RunPlan) -> dict[str, Any]:
        # rollout_batch_size and samples_per_prompt: plan.json's memory gives only their product
        # (sequences per generate call); diagnose proposes a rollout_batch_size from them.
        return {
            "launcher": self.arg(rp.config, "launcher"),
            "processes": rp.layout.learners_per_node,
            "gpus": rp.profile.gpu.count_per_node,
            "save_steps": self.save_steps(rp),
            "rollout_batch_size": int(self.arg(rp.config, "rollout_batch_size")),
            "samples_per_prompt": int(self.arg(rp.config, "samples_per_prompt")),
        }

    def driver_command(self, rp: RunPlan) -> list[DriverLine]:
        words = [_word(a) for a in self.arg(rp.config, "script_args")]
        lines: list[DriverLine] = []
        i = 0
        while i < len(words):  # a flag and its value on one line
            if words[i].text.startswith("-") and i + 1 < len(words) and not words[i + 1].text.startswith("--"):
                lines.append((words[i], words[i + 1]))
                i += 2
            else:
                lines.append((words[i],))
                i += 1
        return lines

    def env(self, rp: RunPlan) -> dict[str, str]:
        return {self.checkpoint_env: str(self.save_steps(rp))}

    def tokens_text(self, rp: RunPlan) -> str:
        return (
            f"mini_batch_size {self.arg(rp.config, 'mini_batch_size')} ({rp.workload.pack_length} tokens), "
            f"generate {self.arg(rp.config, 'rollout_batch_size')} sequences at once"
        )

    def summary(self, rp: RunPlan) -> str:
        cfg, g = rp.config, rp.profile.gpu.count_per_node
        base = "a 4-bit NF4 base" if rp.workload.load_in_4bit else "a bf16 base"
        tuning = f"LoRA r{rp.workload.lora_rank}" if rp.workload.lora_rank else "full fine-tuning"
        return (
            f"custom: {self.arg(cfg, 'launcher')} {cfg.hpcrl.entry_point}, {rp.layout.learners_per_node} "
            f"process(es) on {g} GPU(s); {self.arg(cfg, 'algorithm')} with {tuning} on {base}, "
            f"critic {self.arg(cfg, 'critic')}, reference {self.arg(cfg, 'reference')}; HF generate, no vLLM, no Ray"
        )


def _word(arg: Any) -> Word:
    text = str(arg)
    if RUN_DIR_PLACEHOLDER in text:
        return Word(text.replace(RUN_DIR_PLACEHOLDER, "$RUN_DIR"), run_dir=True)
    return Word(text)


def generation_time(
    cfg: RunConfig, backend: CustomBackend, w: Workload, plan: HfPlan, profile: ClusterProfile
) -> float:
    """Seconds of a step's generate calls: each decode step reads the weights as bf16 (a 4-bit layer is
    dequantized for each matmul) and the KV cache at HBM bandwidth, plus HF's per-token overhead (assumed)."""
    setup = plan.hf_setup
    assert setup is not None  # a custom backend's plan is an HfPlan with its setup
    ctx = setup.prompt_len + setup.response_len / 2
    per_token = (2.0 * w.model.total_params + setup.rollout_seqs * ctx * w.model.kv_bytes_per_token(1)) / (
        profile.gpu.hbm_bandwidth_tbs * 1e12 * DECODE_BW_EFFICIENCY
    ) + HF_GENERATE_TOKEN_OVERHEAD_S
    calls = math.ceil(int(backend.arg(cfg, "rollout_batches")) / max(1, setup.n_gpus))
    return calls * setup.response_len * per_token


BACKEND = CustomBackend

__all__ = ["BACKEND", "CustomBackend", "KEYS"]
