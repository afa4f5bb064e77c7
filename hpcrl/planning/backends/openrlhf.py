"""The OpenRLHF backend: `python3 -m openrlhf.cli.train_ppo_ray --flag value ...`.

Pure. Flags are OpenRLHF's dotted names (renamed on 2026-04-19: `--actor.num_nodes`,
`--vllm.num_engines`, `--ds.zero_stage`, `--ckpt.disable_ds`, ...), checked against
hpcrl/planning/backends/data/openrlhf_args.json; a config key under an old flat name is refused
with its new name. Two placements:

* separate (default): the actor (DeepSpeed ZeRO-3, the reference model colocated with it
  when a KL term needs one) on whole nodes and vLLM engines on the rest. OpenRLHF places
  both with Ray PACK placement groups of one-GPU bundles, vLLM first, so the actor fills
  whole nodes: hpcrl plans `actor.num_gpus_per_node` = the node's GPUs unless pinned.
* colocated (`train.colocate_all: true` in the config): every GPU trains and generates,
  planned like verl (hpcrl/planning/layout_colocated.py); `ds.enable_sleep` / `vllm.enable_sleep`
  say what leaves the GPU between phases.

Checkpoint flags come from the disk plan (hpcrl/planning/backends/openrlhf_ckpt.py).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from hpcrl.planning.backends.base import (
    Backend,
    DriverLine,
    Planned,
    Word,
    cli_pins_into,
    flatten,
    is_number,
    parse_number,
    merge_planned,
    never_or_positive,
    positive,
)
from hpcrl.errors import ConfigError, HpcrlError, PlanError, UnknownNameError
from hpcrl.memory.colocated import Colocation
from hpcrl.models import resolve_model
from hpcrl.memory.vllm_accounting import VllmEngineFacts
from hpcrl.planning.backends.facts import MemoryDefault, MemoryFacts
from hpcrl.planning.backends import versions
from hpcrl.planning.backends.flagdata import load_meta, load_table
from hpcrl.planning.backends.log_facts import (
    CommandFacts,
    CpuAsk,
    DiagnoseFacts,
    LogFormat,
    MetricFacts,
    SmokeFacts,
    TimingFacts,
)
from hpcrl.planning.backends.openrlhf_ckpt import DISK, checkpoint_flags, run_steps
from hpcrl.planning.layout import Pins, Workload
from hpcrl.planning.layout_advice import plan_layouts
from hpcrl.planning.learner_cap import cap_note, within_cap
from hpcrl.planning.layout_colocated import plan_colocated_layouts

if TYPE_CHECKING:
    from hpcrl.planning.run_types import HpcrlSection, RunConfig, RunPlan
    from hpcrl.profiles import ClusterProfile

TABLE = "openrlhf_args.json"
CRITIC_FREE = ("group_norm", "reinforce", "rloo", "reinforce_baseline", "dr_grpo")
LAYOUT_KEYS = (
    "actor.num_nodes",
    "actor.num_gpus_per_node",
    "ref.num_nodes",
    "ref.num_gpus_per_node",
    "vllm.num_engines",
    "vllm.tensor_parallel_size",
    "vllm.gpu_memory_utilization",
    "ds.zero_stage",
    "train.colocate_actor_ref",
)
RUN_DIR_KEYS = {"ckpt.path": "checkpoints", "ckpt.output_dir": "output"}
# With vLLM importance-sampling correction OpenRLHF asks vLLM for processed logprobs (cli/train_ppo_ray.py:78 at
# 3c3be623); without it, it passes no logprobs_mode (vllm_engine.py:295-296) and vLLM's raw_logprobs applies.
IS_CORRECTION, IS_CORRECTION_LOGPROBS = "algo.advantage.is_correction_enable", "processed_logprobs"
# 0.11.2 replaced the switch by a level (off, token, seq); any level but off asks for processed logprobs
# (cli/train_ppo_ray.py:78 and :261-267 in 0.11.2's wheel).
IS_CORRECTION_LEVEL = "algo.advantage.is_correction_level"
BACKEND_NAME = "openrlhf"
# offload_params, learners and per_param_sync keep the words the planner offered OpenRLHF runs
# when this table extended open-instruct's (its flags, not OpenRLHF's: unchanged here, issue 22).
FIXES = {
    "no_hpz": "--set ds.zpg=1 (no ZeRO++ secondary weight copy)",
    "offload_optimizer": "--set ds.adam_offload=true (optimizer state in host RAM)",
    "offload_params": None,  # the actor has no parameter offload flag at 3c3be623 (only ref.offload)
    "tokens": "--set train.micro_batch_size={micro} (sequences of data.max_len per GPU micro-batch)",
    "learners": "--pin learners={k} (learners per node)",
    "lora": "--set ds.lora.rank=16 (LoRA: far less optimizer state)",
    "per_param_sync": None,
}  # gather_whole_model is open-instruct's; OpenRLHF has no such flag


@lru_cache(maxsize=None)
def openrlhf_table(version: str | None = None) -> dict[str, dict[str, Any]]:
    """The flag table of OpenRLHF `version` (hpcrl.framework_version; None: hpcrl's default, openrlhf_args.json)."""
    return versions.table(BACKEND_NAME, version) if version else load_table(TABLE)


@lru_cache(maxsize=1)
def renamed() -> dict[str, str]:
    return {k: v for k, v in load_meta(TABLE)["renamed_from"].items() if k != "note"}


def _default(meta: dict[str, Any]) -> Any:
    raw = meta["default"]
    if raw in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[raw]
    value = parse_number(raw)
    return value.strip('"') if isinstance(value, str) else value


def format_flag(name: str, value: Any, meta: dict[str, Any]) -> tuple[str, ...] | None:
    """The words of `--name value` for argparse; None to leave the flag out (its default)."""
    action, kind = meta.get("action", "store"), meta["type"]
    if action in ("store_true", "store_false"):
        if not isinstance(value, bool):
            raise ConfigError(f"OpenRLHF flag {name} is a switch: give true or false, got {value!r}")
        if value:  # true passes the switch (a store_false switch such as *.no_nesterov is named for its effect)
            return (f"--{name}",)
        if _default(meta) is True and action == "store_true":
            raise ConfigError(f"OpenRLHF flag {name} is on by default and cannot be switched off on the command line")
        return None
    if value is None:
        if _default(meta) is not None:
            raise ConfigError(f"{name}: null cannot be passed on OpenRLHF's command line; remove it")
        return None
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if kind == "list":
        nargs = meta.get("nargs")
        if isinstance(nargs, int) and len(items) != nargs:
            raise ConfigError(f"OpenRLHF flag {name} takes {nargs} values, got {len(items)}")
    elif len(items) != 1:
        raise ConfigError(f"OpenRLHF flag {name} takes one value, got {value!r}")
    words = []
    elem = meta.get("element_type", kind)
    for item in items:
        numeric = isinstance(item, (int, float)) and not isinstance(item, bool)
        if isinstance(item, bool) or (elem == "int" and not isinstance(item, int)) or (elem == "float" and not numeric):
            raise ConfigError(f"OpenRLHF flag {name}: expected {elem}, got {item!r}")
        text = repr(float(item)) if elem == "float" else str(item)
        if text.startswith("-") and not is_number(text):
            raise ConfigError(f"{name}: value {text!r} starts with '-', which argparse would read as a flag")
        if meta.get("choices") and text not in meta["choices"]:
            raise ConfigError(f"OpenRLHF flag {name}: {text!r} is not one of {', '.join(meta['choices'])}")
        words.append(text)
    return (f"--{name}", *words)


class OpenRLHFBackend(Backend):
    """OpenRLHF's Ray PPO trainer (DeepSpeed actor, vLLM engines)."""

    fills_learner_nodes = (
        "OpenRLHF places its actor's one-GPU bundles with PACK (cli/train_ppo_ray.py:48-49 at "
        "3c3be623), so Ray fills each node's GPUs before the next"
    )

    name = "openrlhf"
    label = "OpenRLHF's train_ppo_ray"
    default_entry_point = "openrlhf.cli.train_ppo_ray"
    default_workdir = "$HOME"
    default_python = "python3"
    # OpenRLHF upcasts the logits to fp32 before its log-prob kernel (openrlhf/models/actor.py).
    default_logprob_impl = "eager"
    model_key = "actor.model_name_or_path"
    layout_keys = LAYOUT_KEYS
    run_dir_keys = (*RUN_DIR_KEYS, "ckpt.load_enable")
    flag_table = "hpcrl/planning/backends/data/openrlhf_args.json"
    layout_fixes = FIXES  # the separate-engine planner's fixes, in OpenRLHF's flags
    entry_is_module = True  # python -m <entry point>
    uses_ray = True  # train_ppo_ray places actor, reference and vLLM engines on the job's Ray cluster
    command_facts = CommandFacts(
        entry=r"openrlhf\.cli\.train_ppo_ray|openrlhf/cli/train_ppo_ray\.py", framework="OpenRLHF", package="openrlhf"
    )
    diagnose_facts = DiagnoseFacts(
        keys={
            "model": "actor.model_name_or_path",
            "micro": "train.micro_batch_size",
            "max_len": "data.max_len",
            "nodes": "actor.num_nodes",
            "gpus": "actor.num_gpus_per_node",
            "zero": "ds.zero_stage",
            "tp": "vllm.tensor_parallel_size",
            "util": "vllm.gpu_memory_utilization",
            "offload": "ds.adam_offload",
            "lora": "ds.lora.rank",
            "sync": "vllm.sync_with_ray",
            "save_hf": "ckpt.save_hf",
            "keep": "ckpt.max_num",
            "disable_ds": "ckpt.disable_ds",
        },
        values_from="command",
        seq_len=("max_len",),
        critic_free=("algo.advantage.estimator", "group_norm"),
        reward_sources=("reward.remote_url", "train.agent_func_path", "reward.model_name_or_path"),
        reward_stand_in=("reward.remote_url", "reward_func.py"),
        learner_batch="micro_batch",
        switch_on=" true",
        timeout_note="; OpenRLHF has no flag for the limit (60 min, utils/deepspeed/deepspeed.py:82 at 3c3be623)",
        broadcast_fix="; a broadcast to the vLLM engines (the weight sync) can go through Ray's object store "
        "instead: --{sync} (the users' attempt 23 did this)",
        disk_reads=("lora_rank", "keep", "save_hf", "disable_ds"),
        disk_bound="ckpt.max_num bounds the DeepSpeed states and ckpt.disable_ds skips them (a restart then cannot "
        "resume); HF saves are never deleted",
        death_note="an OpenRLHF actor, reference or vLLM engine group cannot lose a member",
    )
    smoke_facts = SmokeFacts("pack-groups", "place vLLM then actor bundles in PACK groups as OpenRLHF does")
    # 3c3be623 ppo_trainer.py: timing/ppo_train (:257), timing/generation (:540) and their sum timing/step_total
    # (:541) in the "Global step N" line (:547); the checkpoint is written right after it (:556 -> :393) and
    # logs no time, so the marker's rewrite times it.
    timing_facts = TimingFacts(
        step=("timing/step_total",),
        generation=("timing/generation",),
        training=("timing/ppo_train",),
        marker_after_step=True,
    )
    # 3c3be623: `reward` (trainer/ray/ppo_actor.py:384-388), `rollout/reward_mean` (trainer/ppo_trainer.py:421),
    # `group_reward_std` (trainer/ppo_utils/experience_maker.py:255-262), `policy_loss` and `actor_grad_norm`
    # (trainer/ray/ppo_actor.py:380); `kl` and `rollout/reward_std` as the step line of
    # tests/data/logs/openrlhf_zero_variance.log carries them (their source lines not checked).
    metric_facts = MetricFacts(
        reward=("reward", "rollout/reward_mean"),
        reward_std=("group_reward_std", "rollout/reward_std"),
        kl=("kl",),
        loss=("policy_loss",),
        grad_norm=("actor_grad_norm",),
    )
    # 3c3be623 prints one line per step, `✨ Global step N: {'key': value, ...}` (trainer/ppo_trainer.py:547).
    log_format = LogFormat(
        step_lines=(r"Global step (\d+): \{",),
        reward=("reward", "rollout/reward_mean"),  # trainer/ray/ppo_actor.py:384-388, trainer/ppo_trainer.py:421
        loss=("policy_loss",),
        grad_norm=("actor_grad_norm",),  # trainer/ray/ppo_actor.py:380
        # The mean over samples of their group's reward std: exactly 0 when every prompt's group of samples got
        # the same reward (trainer/ppo_utils/experience_maker.py:255-262).
        reward_std=("group_reward_std",),
    )
    # DeepSpeed's save_checkpoint writes <ckpt.path>/_actor/latest last.
    checkpoint_key = "ckpt.save_steps"
    checkpoint_marker = "checkpoints/_actor/latest"
    list_order = 2
    pin_keys = {
        "learners_per_node": "actor.num_gpus_per_node",
        "learner_nodes": "actor.num_nodes",
        "tp": "vllm.tensor_parallel_size",
        "engines": "vllm.num_engines",
        "gpu_memory_utilization": "vllm.gpu_memory_utilization",
    }
    disk = DISK
    memory = MemoryFacts(
        defaults=(
            MemoryDefault("grad_accum_dtype", "ds.grad_accum_dtype", ("deepspeed", "grad_accum_dtype")),
            MemoryDefault("hpz_partition_size", "ds.zpg", ("deepspeed", "zero_hpz_partition_size")),
            MemoryDefault("load_ref_policy", "algo.kl.init_coef", ("features", "ref_policy")),
            MemoryDefault(
                "gradient_checkpointing", "actor.gradient_checkpointing_enable", ("features", "gradient_checkpointing")
            ),
            MemoryDefault("util", "vllm.gpu_memory_utilization", ("vllm", "gpu_memory_utilization")),
        ),
        vllm=VllmEngineFacts(
            "0.27.1",
            max_num_batched_tokens=2048,
            max_num_seqs=128,
            source="OpenRLHF 3c3be623 pins vllm==0.27.1 (setup.py:77) and builds engines with vllm.AsyncLLMEngine.from_engine_args (openrlhf/trainer/ray/vllm_engine.py:64) passing no scheduler sizes (vllm_engine.py:266-281): vLLM's engine-context defaults; logprobs_mode only with algo.advantage.is_correction_enable (processed_logprobs: cli/train_ppo_ray.py:78, vllm_engine.py:295-296), else vLLM's raw_logprobs",
        ),
        # OpenRLHF 3c3be623: the reference is its own Ray actor on the GPU (cli/train_ppo_ray.py:41-50,
        # 89-101); models/actor.py:267 replaces the logits by an fp32 copy that the output keeps until
        # training_step returns (trainer/ray/ppo_actor.py:294, 354-359); get_peft_model without
        # autocast_adapter_dtype=False keeps adapters fp32 (models/actor.py:188).
        # The lm_head gradient is on the GPU with adam offload too (measured, openrlhf_measured.jsonl).
        learner={"reference_process": True, "logits_fp32": True, "adapter_bytes": 4.0, "offload_lm_grad": True},
    )
    value_ranges = {
        "actor.adam.lr": (positive, "a positive learning rate"),
        "ckpt.save_steps": (never_or_positive, "-1 (never) or a positive number of steps"),
        "ckpt.max_num": (positive, "a positive count"),
        "train.num_episodes": (positive, "a positive count"),
        "rollout.batch_size": (positive, "a positive count"),
        "rollout.n_samples_per_prompt": (positive, "a positive count"),
    }

    def arg_table(self, section: HpcrlSection | None = None) -> dict[str, dict[str, Any]]:
        return openrlhf_table(section.framework_version if section else None)

    def normalize_args(self, args: dict[str, Any], section: HpcrlSection) -> dict[str, Any]:
        return flatten({k.removeprefix("--"): v for k, v in args.items()}, openrlhf_table(section.framework_version))

    def check_args(self, args: dict[str, Any], section: HpcrlSection) -> None:
        table = openrlhf_table(section.framework_version)
        old = [key for key in args if key not in table and key in renamed()]
        if len(old) > 1:  # every one at once: a 2025 config was converted one rename per run
            raise ConfigError(
                f"{len(old)} OpenRLHF flags were renamed: " + "; ".join(f"{key} -> {renamed()[key]}" for key in old)
            )
        for key, value in args.items():
            if key not in table:
                if key in renamed():
                    raise ConfigError(f"unknown OpenRLHF flag {key!r}: renamed to {renamed()[key]}")
                versions.check_key(self.name, section.framework_version, key)  # only other versions have it
                raise UnknownNameError("OpenRLHF flag", key, table)
            format_flag(key, value, table[key])  # raises on a value argparse would refuse
        if "actor.model_name_or_path" not in args:
            raise ConfigError("OpenRLHF needs actor.model_name_or_path (was --pretrain)")
        if "data.prompt_dataset" not in args:
            raise ConfigError("OpenRLHF needs data.prompt_dataset (was --prompt_data)")

    # ------------------------------------------------------------------ planning
    def arg(self, cfg: RunConfig, key: str) -> Any:
        """A flag's value: the config's, else the default of the run's OpenRLHF version (None: no such flag there)."""
        table = openrlhf_table(cfg.hpcrl.framework_version)
        return cfg.args[key] if key in cfg.args else _default(table[key]) if key in table else None

    def is_correction(self, cfg: RunConfig) -> bool:
        """Whether the run turns on vLLM importance-sampling correction, in its version's words: the switch
        (0.11.0, 0.11.1) or any level but off (0.11.2)."""
        if IS_CORRECTION_LEVEL in openrlhf_table(cfg.hpcrl.framework_version):
            return str(self.arg(cfg, IS_CORRECTION_LEVEL)) != "off"
        return bool(self.arg(cfg, IS_CORRECTION))

    def engine_facts(self, version: str | None = None) -> VllmEngineFacts:
        """The vLLM the run's OpenRLHF version installs: the pin of its install facts (data/stack.json, or the
        release's own), with the engine-context scheduler defaults OpenRLHF leaves to vLLM."""
        from hpcrl.planning.backends.stack_expect import facts_of

        v = versions.resolve(self.name, version)
        pkg = next(p for p in (facts_of(v) or {}).get("packages", []) if p["name"] == "vllm")
        pin = pkg["spec"].removeprefix("==")
        where = f"{pkg['source']} {v.at()}"
        return replace(
            self.memory.vllm,
            version=pin,
            source=(
                f"OpenRLHF {v.label()} pins vllm=={pin} ({where}) and builds engines with "
                "vllm.AsyncLLMEngine.from_engine_args (openrlhf/trainer/ray/vllm_engine.py:64) passing no scheduler sizes "
                "(vllm_engine.py:266-281 at 3c3be623; :268-280 in 0.11.1's and 0.11.2's wheels): vLLM's engine-context "
                "defaults; logprobs_mode processed_logprobs only with IS correction (algo.advantage.is_correction_enable "
                "at 0.11.0/0.11.1, an is_correction_level other than off at 0.11.2: cli/train_ppo_ray.py:78), else vLLM's "
                "raw_logprobs"
            ),
        )

    def colocated(self, cfg: RunConfig) -> bool:
        return bool(self.arg(cfg, "train.colocate_all"))

    def uses_reference(self, cfg: RunConfig) -> bool:
        # train_ppo_ray.py creates the reference group only when the KL coefficient is positive.
        return float(self.arg(cfg, "algo.kl.init_coef")) > 0

    def workload_from_config(self, cfg: RunConfig, model: str | None = None) -> Workload:
        name = model or cfg.model_name
        if not name:
            raise HpcrlError(f"no model: set {self.model_key} in the config or pass --model")
        estimator = self.arg(cfg, "algo.advantage.estimator")
        if estimator not in CRITIC_FREE:
            raise PlanError(
                f"algo.advantage.estimator {estimator}: needs a critic model, which hpcrl does not plan; "
                f"valid: {', '.join(CRITIC_FREE)} (group_norm is GRPO)"
            )
        if not (self.arg(cfg, "reward.remote_url") or self.arg(cfg, "train.agent_func_path")):
            raise PlanError(
                "hpcrl plans no reward-model GPUs: give reward.remote_url (an HTTP endpoint or a .py "
                "reward function) or train.agent_func_path"
            )
        max_len, new = int(self.arg(cfg, "data.max_len")), self.arg(cfg, "rollout.max_new_tokens")
        response = int(new) if new else max_len // 2  # unset: OpenRLHF fills up to max_len per sample
        if response >= max_len:
            raise PlanError(f"rollout.max_new_tokens {response} leaves no room for a prompt in data.max_len {max_len}")
        tokens = (
            int(self.arg(cfg, "train.max_tokens_per_gpu"))
            if self.arg(cfg, "train.dynamic_batch_enable")
            else int(self.arg(cfg, "train.micro_batch_size")) * max_len
        )
        if tokens < max_len:
            raise PlanError(f"train.max_tokens_per_gpu {tokens} is shorter than data.max_len {max_len}")
        lora = int(self.arg(cfg, "ds.lora.rank") or 0)
        return Workload(
            model=resolve_model(name),
            pack_length=tokens,
            response_length=response,
            max_prompt_token_length=max_len - response,
            unique_prompts=int(self.arg(cfg, "rollout.batch_size")),
            samples_per_prompt=int(self.arg(cfg, "rollout.n_samples_per_prompt")),
            beta=0.0,
            load_ref_policy=self.uses_reference(cfg),
            gradient_checkpointing=bool(self.arg(cfg, "actor.gradient_checkpointing_enable")),
            offload="optimizer" if self.arg(cfg, "ds.adam_offload") else "none",
            lora_rank=lora,
            load_in_4bit=bool(self.arg(cfg, "ds.load_in_4bit")),
            logprob_impl=cfg.hpcrl.logprob_impl,
            # DeepSpeed keeps gradient partitions in the model dtype unless ds.grad_accum_dtype says otherwise.
            grad_accum_dtype="fp32" if self.arg(cfg, "ds.grad_accum_dtype") == "fp32" else "bf16",
            hpz_partition_size=int(self.arg(cfg, "ds.zpg")),
            logits_copy=False,  # temperature division is in place
            # passed to vLLM's engine arguments (openrlhf/trainer/ray/vllm_engine.py:268 at 3c3be623)
            vllm=replace(
                self.engine_facts(cfg.hpcrl.framework_version),
                enforce_eager=bool(self.arg(cfg, "vllm.enforce_eager")),
                logprobs_mode=IS_CORRECTION_LOGPROBS if self.is_correction(cfg) else "raw_logprobs",
            ),
            learner_fixed=tuple(self.memory.learner.items()),
        )

    def pins_from(self, cfg: RunConfig, cli_pins: list[str] | None = None) -> Pins:
        a, values = cfg.args, {}  # type: dict[str, Any], dict[str, float]
        if "ds.zero_stage" in a and int(a["ds.zero_stage"]) != 3:
            raise PlanError(f"ds.zero_stage {a['ds.zero_stage']}: hpcrl plans ZeRO-3 actors; valid: 3")
        if "vllm.tensor_parallel_size" in a:
            values["tp"] = int(a["vllm.tensor_parallel_size"])
        if "vllm.gpu_memory_utilization" in a:
            values["gpu_memory_utilization"] = float(a["vllm.gpu_memory_utilization"])
        if self.colocated(cfg):
            return cli_pins_into(values, cli_pins, allowed=("tp", "util"), keys=self.pin_keys)
        if "actor.num_gpus_per_node" in a:
            values["learners_per_node"] = int(a["actor.num_gpus_per_node"])
        if "actor.num_nodes" in a:
            values["learner_nodes"] = int(a["actor.num_nodes"])
        if "vllm.num_engines" in a:
            values["engines"] = int(a["vllm.num_engines"])
        if a.get("train.colocate_actor_ref") is False and self.uses_reference(cfg):
            raise PlanError(
                "train.colocate_actor_ref false: hpcrl plans the reference model on the actor's GPUs; "
                "remove it (or set algo.kl.init_coef 0 for no reference model)"
            )
        return cli_pins_into(values, cli_pins, keys=self.pin_keys)

    def colocation(self, cfg: RunConfig) -> Colocation:
        sleep = bool(self.arg(cfg, "ds.enable_sleep"))
        return Colocation(
            param_offload=sleep,
            optimizer_offload=sleep,
            grads_resident=not sleep,
            reference_offload=bool(self.arg(cfg, "ref.offload")),
            vllm_sleeps=bool(self.arg(cfg, "vllm.enable_sleep")),
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
        capped = ""
        if self.colocated(cfg):
            hint = (
                None if self.arg(cfg, "ds.enable_sleep") else "--set ds.enable_sleep=true --set vllm.enable_sleep=true"
            )
            layouts = plan_colocated_layouts(profile, nodes, w, pins, self.colocation(cfg), hint)
        else:
            layouts = within_cap(profile, nodes, w, pins)
            if not layouts:
                capped = cap_note(profile, nodes, w, pins, FIXES, self.fills_learner_nodes)
                if pins.learners_per_node is None:
                    # Ray PACK fills whole nodes with the actor's one-GPU bundles: plan it that way.
                    pins = Pins(**{**pins.__dict__, "learners_per_node": profile.gpu.count_per_node})
                layouts = plan_layouts(profile, nodes, w, pins, variants, FIXES)
        lay = layouts[0]
        samples = int(self.arg(cfg, "rollout.batch_size")) * int(self.arg(cfg, "rollout.n_samples_per_prompt"))
        if samples // int(self.arg(cfg, "rollout.micro_batch_size")) < lay.learner_gpus:
            raise PlanError(
                f"rollout.batch_size x rollout.n_samples_per_prompt / rollout.micro_batch_size = "
                f"{samples // int(self.arg(cfg, 'rollout.micro_batch_size'))} batches, fewer than the "
                f"{lay.learner_gpus} actor GPUs (OpenRLHF checks this)"
            )
        flags, warnings = checkpoint_flags(
            cfg.args, w, lay, profile, cfg.hpcrl, run_steps(cfg.args, lambda key: self.arg(cfg, key))
        )
        if not self.arg(cfg, "rollout.max_new_tokens"):
            warnings.append(
                f"rollout.max_new_tokens is unset: the plan assumes responses of {w.response_length} "
                f"tokens (half of data.max_len); set it for a better generation estimate"
            )
        return Planned(layouts, dict(flags), tuple(warnings), cap_note=capped)

    # ------------------------------------------------------------------ rendering
    def layout_args(self, rp: RunPlan) -> dict[str, Any]:
        lay, cfg = rp.layout, rp.config
        out: dict[str, Any] = {
            "actor.num_nodes": lay.learner_nodes,
            "actor.num_gpus_per_node": lay.learners_per_node,
            "vllm.num_engines": lay.engines,
            "vllm.tensor_parallel_size": lay.tp,
            "vllm.gpu_memory_utilization": lay.gpu_memory_utilization,
            "ds.zero_stage": 3,
        }
        if self.uses_reference(cfg):
            out.update({"ref.num_nodes": lay.learner_nodes, "ref.num_gpus_per_node": lay.learners_per_node})
            if not lay.colocated:
                out["train.colocate_actor_ref"] = True
        out.update(dict(rp.choices))
        return out

    def driver_command(self, rp: RunPlan) -> list[DriverLine]:
        planned = self.layout_args(rp)
        merged = merge_planned(rp.config.args, planned)
        table = openrlhf_table(rp.config.hpcrl.framework_version)
        lines: list[DriverLine] = []
        for key, value in merged.items():
            if key not in table:
                raise ConfigError(f"{key} is not a flag of OpenRLHF's train_ppo_ray ({self.flag_table})")
            words = format_flag(key, value, table[key])
            if words:
                lines.append(tuple(Word(w) for w in words))
        for key, sub in RUN_DIR_KEYS.items():
            lines.append((Word(f"--{key}"), Word(f"$RUN_DIR/{sub}", run_dir=True)))
        lines.append((Word("--ckpt.load_enable"),))  # resumes from ckpt.path/_actor when it exists
        return lines

    def tokens_text(self, rp: RunPlan) -> str:
        return f"{rp.workload.pack_length} tokens per actor GPU micro-batch"

    def read_renamed(self, args: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
        """Flags renamed on 2026-04-19 (openrlhf_args.json `_meta.renamed_from`) under their new names;
        the removed --prompt_max_len/--generate_max_len pair as data.max_len and rollout.max_new_tokens."""
        table, old = openrlhf_table(), renamed()
        out, notes = {}, []
        for key, value in args.items():
            if key in table or key not in old:
                out[key] = value
                continue
            words = old[key].split()
            # "ds.param_dtype bf16 (...)": a switch that became a value; only a plain rename maps.
            if words[0] in table and (len(words) == 1 or words[1].startswith("(")):
                out.setdefault(words[0], value)
                notes.append(f"{key} -> {words[0]}")
        if "prompt_max_len" in args or "generate_max_len" in args:
            prompt, gen = int(args.get("prompt_max_len", 1024)), int(args.get("generate_max_len", 1024))
            out.setdefault("data.max_len", prompt + gen)
            out.setdefault("rollout.max_new_tokens", gen)
            notes.append(
                f"prompt_max_len + generate_max_len -> data.max_len {prompt + gen}, rollout.max_new_tokens {gen}"
            )
        return out, tuple(notes)

    def smoke_cpu_ask(self, rp: RunPlan) -> CpuAsk:
        # One CPU per GPU bundle, the actor's and (unless colocated) the engines'.
        lay = rp.layout
        gpus = lay.learners_per_node * lay.learner_nodes + (0 if lay.colocated else lay.engines * lay.tp)
        return CpuAsk("OpenRLHF", gpus, rp.profile.gpu.count_per_node)

    def summary(self, rp: RunPlan) -> str:
        lay = rp.layout
        if lay.colocated:
            where = f"train.colocate_all on {lay.learner_nodes} x {lay.learners_per_node} GPUs"
        else:
            where = f"actor.num_nodes {lay.learner_nodes}, actor.num_gpus_per_node {lay.learners_per_node}"
        return (
            f"{where}, vllm.num_engines {lay.engines}, vllm.tensor_parallel_size {lay.tp}, "
            f"vllm.gpu_memory_utilization {lay.gpu_memory_utilization:g}, ds.zero_stage 3"
        )


BACKEND = OpenRLHFBackend

__all__ = ["BACKEND", "OpenRLHFBackend", "format_flag", "openrlhf_table", "renamed"]
