"""The TRL backend: `trl grpo` (GRPOTrainer) under `accelerate launch` with DeepSpeed ZeRO-3, no Ray.

Pure. Keys outside `hpcrl:` are `trl grpo`'s own (GRPOScriptArguments, GRPOConfig with transformers'
TrainingArguments, ModelConfig, DatasetMixtureConfig), checked against data/trl/<release>/grpo_args.json,
read from the release by scripts/trl-table; a `vllm_serve:` mapping holds `trl vllm-serve`'s own keys
(data/trl/<release>/vllm_serve_args.json). Two modes, as GRPOConfig's `vllm_mode` says (TRL 1.16.0 defaults
to colocate, trl/trainer/grpo_config.py:594):

* server: one node runs `trl vllm-serve` (TP x DP of its GPUs), the others `accelerate launch` the trainer,
  which starts once the server answers GET /health (trl_launch.py; trl_plan.py plans the split);
* colocate: every GPU runs a trainer process with vLLM inside it (vllm_gpu_memory_utilization,
  vllm_enable_sleep_mode), no server.

The learner is DeepSpeed ZeRO-3 as TRL computes its loss: the fused LM head over the completion positions
only (trl/trainer/utils.py:1548; no logits), batches padded per micro-batch, not packed
(hpcrl/memory/learner.py "fused_head", measured: benchmarks/results/trl_measured.jsonl). The job's
processes are plain data (`job`, trl_launch.py) for the job description; the script is not rendered yet.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hpcrl.errors import HpcrlError, PlanError
from hpcrl.memory.vllm_accounting import VllmEngineFacts
from hpcrl.models import resolve_model
from hpcrl.planning.backends import versions
from hpcrl.planning.backends.base import Backend, DriverLine, Planned, Word, cli_pins_into, never_or_positive, positive
from hpcrl.planning.backends.facts import MemoryDefault, MemoryFacts
from hpcrl.planning.backends.log_facts import CommandFacts, DiagnoseFacts, LogFormat, SmokeFacts, TimingFacts
from hpcrl.planning.backends.trl_disk import DISK, KEEP_DEFAULT
from hpcrl.planning.backends.trl_keys import MODES, SERVE_SECTION, check_args, default_of, flag_words, normalize, tables
from hpcrl.planning.backends.processes import HealthCheck, Process, ResumeRule, RunFile
from hpcrl.planning.backends.trl_launch import (
    ACCELERATE_CONFIG,
    DEEPSPEED_CONFIG,
    GROUP_PORT,
    HEALTH_PATH,
    MAIN_PROCESS_PORT,
    SERVER_PORT,
    TrlJob,
    accelerate_config,
    config_files,
    deepspeed_config,
)
from hpcrl.planning.backends.trl_plan import plan_colocate, plan_server_layouts
from hpcrl.planning.layout import Layout, Pins, Workload

if TYPE_CHECKING:
    from hpcrl.planning.run_types import HpcrlSection, RunConfig, RunPlan
    from hpcrl.profiles import ClusterProfile

# Prompt tokens assumed when nothing bounds them: TRL 1.16 truncates no prompt (max_prompt_length is gone from
# GRPOConfig), so only vllm_max_model_length / vllm_serve.max_model_len bound prompt + completion.
ASSUMED_PROMPT_TOKENS = 512
# How long the job waits for the server's /health before it gives up (a 32B model's load and CUDA-graph
# capture take minutes; TRL's own trainer waits vllm_server_timeout, 240 s, grpo_config.py:640).
SERVER_START_S = 1800.0
FIXES = {
    "no_hpz": None,
    "offload_optimizer": "--set hpcrl.deepspeed_offload=optimizer (optimizer state in host RAM, in the ZeRO-3 JSON)",
    "offload_params": "--set hpcrl.deepspeed_offload=params (parameters in host RAM too)",
    "tokens": "{tokens} tokens per GPU (per_device_train_batch_size x (prompt + max_completion_length))",
    "learners": "--pin learners={k} (learners per node)",
    "lora": "--set use_peft=true (LoRA)",
    "per_param_sync": None,
}
VLLM_VERSION = "0.24.0"


class TrlBackend(Backend):
    """TRL's GRPOTrainer: accelerate-launched DeepSpeed ZeRO-3 learners, vLLM as a server or colocated."""

    name = "trl"
    label = "TRL's GRPOTrainer (trl grpo)"
    default_entry_point = "trl.scripts.grpo"
    default_workdir = "$HOME"
    default_python = "python3"
    default_logprob_impl = "fused_head"
    model_key = "model_name_or_path"
    layout_keys = ("vllm_tensor_parallel_size", "vllm_gpu_memory_utilization")
    run_dir_keys = ("output_dir", "resume_from_checkpoint")
    flag_table = "hpcrl/planning/backends/data/trl/1.16.0/grpo_args.json"
    uses_ray = False
    entry_is_module = True  # trl.scripts.grpo; a user's script path (.py) is run as a file (runs_module)
    layout_fixes = FIXES
    writes_deepspeed_config = True
    # transformers' Trainer writes trainer_state.json last in each checkpoint-N (trainer.py:3265 at 5.17.0).
    checkpoint_key = "save_steps"
    checkpoint_marker = "checkpoints/checkpoint-*/trainer_state.json"
    list_order = 4
    disk = DISK
    command_facts = CommandFacts(entry=r"trl[./]scripts[./]grpo|\btrl grpo\b", framework="TRL", package="trl")
    diagnose_facts = DiagnoseFacts(
        keys={
            "model": "model_name_or_path",
            "micro": "per_device_train_batch_size",
            "max_len": "max_completion_length",
            "util": "vllm_gpu_memory_utilization",
            "tp": "vllm_tensor_parallel_size",
            "lora": "lora_r",
            "keep": "save_total_limit",
            "disable_ds": "save_only_model",
        },
        values_from="command",
        seq_len=("max_len",),
        learner_batch="micro_batch",
        switch_on=" true",
        timeout_note="; TRL sets no collective timeout of its own (transformers' ddp_timeout, 1800 s)",
        disk_reads=("lora_rank", "keep", "disable_ds"),
        disk_bound="save_total_limit bounds the checkpoint-N directories; save_only_model drops the DeepSpeed state "
        "(a restart then cannot resume)",
        death_note="the trainer's NCCL group and its vLLM server cannot lose a member",
    )
    smoke_facts = SmokeFacts(comment="check the job's GPUs on every node without Ray")
    # grpo_trainer.py:1510-1520: step_time sums one optimizer step's training_step calls (generation included).
    timing_facts = TimingFacts(step=("step_time",))
    # transformers' Trainer prints each logged step as a Python dict on a line of its own (after tqdm's bar), every
    # float formatted ".4g" as a string (5.17.0 trainer_callback.py:673-690 ProgressCallback, :703-708
    # PrinterCallback): `{'loss': '0.01', 'reward': '0', ...}`; ".4g" prints an exact 0.0 as "0" and any other value
    # with its digits ("1e-09"), so "0" is an exact zero. The reader reads such dict lines for every framework.
    log_format = LogFormat(
        reward=("reward",),  # TRL 1.16.0 grpo_trainer.py:2828
        # The Trainer's own `loss` and `grad_norm` (transformers 5.17.0 trainer.py, _maybe_log_save_evaluate; the
        # lines not checked: the keys are those of tests/data/trl/console_*.log, TRL's own output).
        loss=("loss",),
        grad_norm=("grad_norm",),
        # The fraction of prompt groups whose rewards all agree: exactly 1 when every group has zero variance
        # (grpo_trainer.py:2830).
        zero_std_fraction=("frac_reward_zero_std",),
    )
    memory = MemoryFacts(
        defaults=(
            MemoryDefault("load_ref_policy", "beta", ("features", "ref_policy")),
            MemoryDefault("gradient_checkpointing", "gradient_checkpointing", ("features", "gradient_checkpointing")),
            MemoryDefault("grad_accum_dtype", None, ("deepspeed", "grad_accum_dtype")),
            MemoryDefault("hpz_partition_size", None, ("deepspeed", "zero_hpz_partition_size")),
            MemoryDefault("util", "vllm_serve.gpu_memory_utilization", ("vllm", "gpu_memory_utilization")),
        ),
        grad_dtype_origin="DeepSpeed config (hpcrl's ZeRO-3 JSON sets no grad_accum_dtype)",
        logits_copy=False,
        vllm=VllmEngineFacts(
            VLLM_VERSION,
            max_num_batched_tokens=8192,
            max_num_seqs=1024,
            logprobs_mode="processed_logprobs",
            source="TRL 1.16.0 allows vllm>=0.22.0,<=0.31.0 (METADATA:61); hpcrl sizes with 0.24.0, the oldest in that "
            "range it has read. trl vllm-serve runs `vllm serve` (trl/scripts/vllm_serve.py:226-293) with "
            "--logprobs-mode processed_logprobs (:271-272) and no scheduler sizes: vLLM's OpenAI-server "
            "defaults on a GPU of 70 GiB or more (not an A100): 8192 batched tokens, 1024 sequences "
            "(vllm/engine/arg_utils.py get_batch_defaults; 2048 and 256 on smaller GPUs and A100s)",
        ),
    )
    value_ranges = {
        "per_device_train_batch_size": (positive, "a positive count"),
        "gradient_accumulation_steps": (positive, "a positive count"),
        "num_generations": (lambda v: v >= 2, "2 or more (GRPO needs a group, grpo_config.py:1131-1135)"),
        "max_completion_length": (positive, "a positive number of tokens"),
        "num_iterations": (positive, "a positive count"),
        "save_steps": (positive, "a positive number of steps"),
        "max_steps": (never_or_positive, "-1 (train for num_train_epochs) or a positive count"),
        "learning_rate": (positive, "a positive learning rate"),
    }

    # ------------------------------------------------------------------ keys
    def release(self, section: HpcrlSection | None) -> str:
        return versions.resolve(self.name, section.framework_version if section else None).name

    def arg_table(self, section: HpcrlSection | None = None) -> dict[str, dict[str, Any]]:
        return tables(self.release(section))[0]

    def serve_table(self, section: HpcrlSection | None = None) -> dict[str, dict[str, Any]]:
        return tables(self.release(section))[1]

    def check_section(self, section: HpcrlSection) -> None:
        super().check_section(section)

    def runs_module(self, section: HpcrlSection) -> bool:
        return not section.entry_point.endswith(".py")

    def normalize_args(self, args: dict[str, Any], section: HpcrlSection) -> dict[str, Any]:
        return normalize(args)

    def check_args(self, args: dict[str, Any], section: HpcrlSection) -> None:
        check_args(args, self.arg_table(section), self.serve_table(section), self.release(section))

    def arg(self, cfg: RunConfig, key: str) -> Any:
        if key in cfg.args:
            return cfg.args[key]
        table = self.arg_table(cfg.hpcrl)
        return default_of(table[key]) if key in table else None

    def serve_arg(self, cfg: RunConfig, key: str) -> Any:
        given = cfg.args.get(SERVE_SECTION) or {}
        return given[key] if key in given else default_of(self.serve_table(cfg.hpcrl)[key])

    def mode(self, cfg: RunConfig) -> str:
        return str(self.arg(cfg, "vllm_mode"))

    # ------------------------------------------------------------------ planning
    def colocated(self, cfg: RunConfig) -> bool:
        return self.mode(cfg) == "colocate"

    def steps_per_generation(self, cfg: RunConfig) -> int:
        """Optimizer... micro-steps one generation serves: steps_per_generation, else gradient_accumulation_steps."""
        given = self.arg(cfg, "steps_per_generation")
        return int(given) if given else int(self.arg(cfg, "gradient_accumulation_steps"))

    def lengths(self, cfg: RunConfig) -> tuple[int, int, str]:
        """(prompt tokens, completion tokens, where the prompt length came from)."""
        completion = int(self.arg(cfg, "max_completion_length"))
        # Either bounds prompt + completion: vLLM refuses a longer request (server: max_model_len, colocate:
        # vllm_max_model_length, grpo_trainer.py:1123); hpcrl passes the planned length to the mode's engine.
        bound = self.arg(cfg, "vllm_max_model_length") or (cfg.args.get(SERVE_SECTION) or {}).get("max_model_len")
        if bound:
            if int(bound) <= completion:
                raise PlanError(
                    f"max model length {bound} leaves no room for a prompt beside max_completion_length {completion}"
                )
            return int(bound) - completion, completion, "the max model length"
        return ASSUMED_PROMPT_TOKENS, completion, "assumed"

    def workload_from_config(self, cfg: RunConfig, model: str | None = None) -> Workload:
        name = model or cfg.model_name
        if not name:
            raise HpcrlError(f"no model: set {self.model_key} in the config or pass --model")
        batch = int(self.arg(cfg, "per_device_train_batch_size"))
        prompt, completion, _ = self.lengths(cfg)
        peft = bool(self.arg(cfg, "use_peft"))
        beta = float(self.arg(cfg, "beta"))
        generations = int(self.arg(cfg, "num_generations"))
        serve = not self.colocated(cfg)
        vllm = replace(self.memory.vllm, enforce_eager=bool(self.serve_arg(cfg, "enforce_eager")) if serve else False)
        return Workload(
            model=resolve_model(name),
            pack_length=batch * (prompt + completion),
            response_length=completion,
            max_prompt_token_length=prompt,
            unique_prompts=max(1, batch // generations),
            samples_per_prompt=generations,
            beta=beta if not peft else 0.0,
            # TRL builds a reference model only for beta != 0 without PEFT (grpo_trainer.py:983-1003).
            load_ref_policy=beta != 0.0 and not peft,
            gradient_checkpointing=bool(self.arg(cfg, "gradient_checkpointing")),
            lora_rank=int(self.arg(cfg, "lora_r")) if peft else 0,
            load_in_4bit=bool(self.arg(cfg, "load_in_4bit")),
            offload=cfg.hpcrl.deepspeed_offload,
            logprob_impl="fused_head",
            grad_accum_dtype="bf16",
            hpz_partition_size=1,
            logits_copy=False,
            micro_batches=int(self.arg(cfg, "gradient_accumulation_steps")),
            vllm=vllm,
            learner_fixed=(("logprob_tokens", batch * completion), ("padded_rows", batch)),
        )

    def pins_from(self, cfg: RunConfig, cli_pins: list[str] | None = None) -> Pins:
        values: dict[str, Any] = {}
        if self.colocated(cfg):
            if "vllm_tensor_parallel_size" in cfg.args:
                values["tp"] = int(cfg.args["vllm_tensor_parallel_size"])
            if "vllm_gpu_memory_utilization" in cfg.args:
                values["gpu_memory_utilization"] = float(cfg.args["vllm_gpu_memory_utilization"])
            return cli_pins_into(values, cli_pins, allowed=("tp", "util"))
        for key in ("vllm_tensor_parallel_size", "vllm_gpu_memory_utilization"):
            if key in cfg.args:
                raise PlanError(
                    f"{key} is colocate mode's; in server mode give {SERVE_SECTION}.tensor_parallel_size "
                    f"/ {SERVE_SECTION}.gpu_memory_utilization (trl vllm-serve's own keys)"
                )
        serve = cfg.args.get(SERVE_SECTION) or {}
        if "tensor_parallel_size" in serve:
            values["tp"] = int(serve["tensor_parallel_size"])
        if "gpu_memory_utilization" in serve:
            values["gpu_memory_utilization"] = float(serve["gpu_memory_utilization"])
        return cli_pins_into(values, cli_pins, allowed=("learners", "tp", "util"))

    def plan(
        self,
        cfg: RunConfig,
        profile: ClusterProfile,
        nodes: int,
        w: Workload,
        pins: Pins,
        variants: list[ClusterProfile],
    ) -> Planned:
        batch, generations = int(self.arg(cfg, "per_device_train_batch_size")), int(self.arg(cfg, "num_generations"))
        per_gen = self.steps_per_generation(cfg)
        warnings: list[str] = []
        prompt, _, origin = self.lengths(cfg)
        if origin == "assumed":
            bound = "vllm_max_model_length" if self.colocated(cfg) else f"{SERVE_SECTION}.max_model_len"
            warnings.append(
                f"TRL 1.16 truncates no prompt: the plan assumes prompts of at most {prompt} tokens; set "
                f"{bound} (prompt + completion) to bound them"
            )
        if SERVE_SECTION in cfg.args and self.colocated(cfg):
            warnings.append(
                f"{SERVE_SECTION} is server mode's: vllm_mode colocate runs no trl vllm-serve and ignores it"
            )
        if "vllm_mode" not in cfg.args:
            warnings.append(
                "vllm_mode is unset: TRL 1.16.0 defaults to colocate (trl/trainer/grpo_config.py:594), so "
                "the plan is colocated; set vllm_mode: server for trl vllm-serve on a node of its own"
            )
        layouts = self._layouts(cfg, profile, nodes, w, pins, batch, per_gen, generations)
        lay = layouts[0]
        g = profile.gpu.count_per_node
        if not lay.colocated and not profile.slurm.exclusive:
            # vllm_serve.py:226-276 starts `vllm serve` with no API key and TRL's weight-transfer endpoints.
            warnings.append(
                f"trl vllm-serve answers whoever reaches its node (no key: trl/scripts/vllm_serve.py:"
                f"226-276, TRL 1.16.0), and {profile.name}'s jobs are not exclusive: another user on a "
                "shared node could send it requests or weights; ask for whole nodes, or use vllm_mode "
                "colocate (no server)"
            )
        if not lay.colocated and lay.nodes > 1 and lay.learners_per_node < g:
            cap = profile.planning.max_learners_per_node
            why = (
                f"{profile.name} plans at most {cap} learner{'s' if cap != 1 else ''} per node "
                f"({profile.planning.why or 'its profile'})"
                if cap and lay.learners_per_node == cap
                else "more learners per node did not shorten the estimated step"
            )
            warnings.append(
                f"trl vllm-serve takes node 0 whole; each learner node runs {lay.learners_per_node} of "
                f"its {g} GPUs because {why}; --pin learners={g} runs one learner per GPU"
            )
        if not lay.colocated and lay.nodes > 1 and lay.tp * lay.engines < g:
            warnings.append(
                f"trl vllm-serve uses {lay.tp * lay.engines} of node 0's {g} GPUs (TP {lay.tp} x DP "
                f"{lay.engines}): one server, as TRL runs it, and TP must divide the model's heads; the "
                f"other {g - lay.tp * lay.engines} stay idle"
            )
        choices: dict[str, Any] = {}
        if "logging_steps" not in cfg.args:
            choices["logging_steps"] = 1  # the watchdog reads every step (TRL's default logs every 10th)
        if "save_total_limit" not in cfg.args:
            choices["save_total_limit"] = KEEP_DEFAULT
        ws = replace(w, unique_prompts=batch * lay.learner_gpus * per_gen // generations)
        # The warnings above say why GPUs stay idle in server mode (one server node, the learner cap).
        return Planned(layouts, choices, tuple(warnings), workload=ws, idle_explained=not lay.colocated)

    def _layouts(
        self,
        cfg: RunConfig,
        profile: ClusterProfile,
        nodes: int,
        w: Workload,
        pins: Pins,
        batch: int,
        per_gen: int,
        generations: int,
    ) -> list[Layout]:
        passes = int(self.arg(cfg, "num_iterations"))
        if self.colocated(cfg):
            sleeps = bool(self.arg(cfg, "vllm_enable_sleep_mode"))
            hint = None if sleeps else "--set vllm_enable_sleep_mode=true"
            return plan_colocate(profile, nodes, w, pins, batch, per_gen, generations, sleeps, hint)
        dp = int(self.serve_arg(cfg, "data_parallel_size"))
        if dp > 1 and not w.model.is_moe:
            raise PlanError(
                f"{SERVE_SECTION}.data_parallel_size {dp}: vLLM refuses data parallelism for a dense model "
                "(trl/scripts/vllm_serve.py:39-40); valid: 1"
            )
        return plan_server_layouts(profile, nodes, w, pins, batch, per_gen, generations, dp, passes, FIXES)

    # ------------------------------------------------------------------ the job (plain data)
    def layout_args(self, rp: RunPlan) -> dict[str, Any]:
        lay, cfg = rp.layout, rp.config
        out: dict[str, Any] = {"use_vllm": True, "vllm_mode": self.mode(cfg)}
        if lay.colocated:
            out.update(
                {
                    "vllm_tensor_parallel_size": lay.tp,
                    "vllm_gpu_memory_utilization": lay.gpu_memory_utilization,
                    "vllm_max_model_length": int(self.arg(cfg, "vllm_max_model_length") or rp.workload.seq_len),
                }
            )
        else:
            out.update(
                {
                    "vllm_server_host": "{host:vllm-server}",
                    "vllm_server_port": SERVER_PORT,
                    "vllm_group_port": GROUP_PORT,
                }
            )
        out.update(dict(rp.choices))
        return out

    def serve_args(self, rp: RunPlan) -> dict[str, Any]:
        """`trl vllm-serve`'s keys for the plan: the config's, then the planned TP, DP, utilisation, length."""
        lay, cfg = rp.layout, rp.config
        out = dict(cfg.args.get(SERVE_SECTION) or {})
        out.update(
            {
                "model": cfg.args[self.model_key],
                "tensor_parallel_size": lay.tp,
                "data_parallel_size": lay.engines,
                "host": "0.0.0.0",
                "port": SERVER_PORT,
                "gpu_memory_utilization": lay.gpu_memory_utilization,
            }
        )
        out.setdefault("max_model_len", rp.workload.seq_len)
        return out

    def driver_command(self, rp: RunPlan) -> list[DriverLine]:
        """The trainer's words after the entry point: the config's keys with the plan's, then the run directory."""
        planned = self.layout_args(rp)
        merged = {k: v for k, v in rp.config.args.items() if k != SERVE_SECTION}
        merged.update({k: v for k, v in planned.items()})
        lines: list[DriverLine] = [tuple(Word(w) for w in flag_words(k, v)) for k, v in merged.items()]
        lines.append((Word("--output_dir"), Word("$RUN_DIR/checkpoints", run_dir=True)))
        return lines

    def job(self, rp: RunPlan) -> TrlJob:
        """Which node runs what, each process's words and environment, the configs it needs: plain data for the job
        description (placeholders: processes.py)."""
        lay, cfg = rp.layout, rp.config
        g = rp.profile.gpu.count_per_node
        entry = cfg.hpcrl.entry_point
        run = ["--module", entry] if self.runs_module(cfg.hpcrl) else [entry]
        trainer_words = tuple(w.text for line in self.driver_command(rp) for w in line)
        ds = deepspeed_config(rp.workload.offload)
        resume = ResumeRule(
            flag="--resume_from_checkpoint",
            directory="checkpoints",
            pattern="checkpoint-*",
            complete_file="trainer_state.json",
            source="trl/scripts/grpo.py:150; transformers 5.17.0 trainer.py:1509 (reads trainer_state.json)",
        )
        if lay.colocated:
            machines, per = lay.nodes, g
            files = config_files(ds, accelerate_config(machines, machines * per, f"{{run_dir}}/{DEEPSPEED_CONFIG}"))
            trainer = Process(
                "trainer",
                self._launch(machines, per, run, trainer_words),
                tuple(range(lay.nodes)),
                g,
                ports=("main",),
                resume=resume,
                driver=True,
            )
            return TrlJob("colocate", lay.nodes, tuple((i, "trainer") for i in range(lay.nodes)), (trainer,), files)
        serve = self.serve_args(rp)
        serve_words = (
            "{python}",
            "-m",
            "trl.cli.main",
            "vllm-serve",
            *(w for k, v in serve.items() for w in flag_words(k, v)),
        )
        gpus = lay.tp * lay.engines
        single = lay.nodes == 1
        health = HealthCheck(
            HEALTH_PATH,
            "server",
            int(SERVER_START_S),
            "trl/generation/vllm_client.py:278 (TRL 1.16.0): GET {base_url}/health",
        )
        server_env = (("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(gpus)))),) if single else ()
        server = Process("vllm-server", serve_words, (0,), gpus, server_env, ports=("server", "group"), health=health)
        trainer_nodes = (0,) if single else tuple(range(1, lay.nodes))
        k = lay.learners_per_node
        files = config_files(
            ds, accelerate_config(len(trainer_nodes), len(trainer_nodes) * k, f"{{run_dir}}/{DEEPSPEED_CONFIG}")
        )
        trainer_env = (
            (("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(gpus, gpus + k)))),)
            if single
            else ((("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(k)))),) if k < g else ())
        )
        trainer = Process(
            "trainer",
            self._launch(len(trainer_nodes), k, run, trainer_words),
            trainer_nodes,
            k,
            trainer_env,
            ports=("main",),
            waits_for=("vllm-server",),
            resume=resume,
            driver=True,
        )
        roles = (
            ((0, "vllm-server+trainer"),) if single else ((0, "vllm-server"), *((i, "trainer") for i in trainer_nodes))
        )
        return TrlJob("server", lay.nodes, roles, (server, trainer), files)

    def job_processes(self, rp: RunPlan) -> tuple[Process, ...]:
        return self.job(rp).processes

    def run_files(self, rp: RunPlan) -> tuple[RunFile, ...]:
        return self.job(rp).files

    @staticmethod
    def _launch(machines: int, per_node: int, run: list[str], words: tuple[str, ...]) -> tuple[str, ...]:
        return (
            "{python}",
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            f"$RUN_DIR/{ACCELERATE_CONFIG}",
            "--num_machines",
            str(machines),
            "--num_processes",
            str(machines * per_node),
            "--machine_rank",
            "{node_rank}",
            "--main_process_ip",
            "{host:trainer}",
            "--main_process_port",
            MAIN_PROCESS_PORT,
            *run,
            *words,
        )

    def summary(self, rp: RunPlan) -> str:
        lay = rp.layout
        if lay.colocated:
            return (
                f"colocate: {lay.nodes} x {lay.learners_per_node} GPUs each train and generate, "
                f"vllm_tensor_parallel_size {lay.tp}, vllm_gpu_memory_utilization {lay.gpu_memory_utilization:g}"
            )
        where = "beside the learners on one node" if lay.nodes == 1 else "on a node of its own"
        return (
            f"server: trl vllm-serve TP {lay.tp} x DP {lay.engines} {where} (gpu_memory_utilization "
            f"{lay.gpu_memory_utilization:g}); accelerate launch of {lay.learner_gpus} ZeRO-3 learners "
            f"({lay.learners_per_node} per node on {lay.learner_nodes} node{'s' if lay.learner_nodes > 1 else ''})"
        )

    def tokens_text(self, rp: RunPlan) -> str:
        b = int(self.arg(rp.config, "per_device_train_batch_size"))
        return (
            f"per_device_train_batch_size {b} padded sequences of up to {rp.workload.seq_len} tokens "
            f"({rp.workload.pack_length} per GPU micro-batch)"
        )


BACKEND = TrlBackend

__all__ = ["BACKEND", "MODES", "SERVE_SECTION", "TrlBackend"]
