"""The open-instruct backend: grpo_fast.py's flags from a run config and a layout.

Pure. Every flag is checked against the argument table of the config's layout
(`current` or `legacy`), so a rendered script never passes a flag grpo_fast.py lacks.
Flag syntax is HfArgumentParser's: `--name value`, booleans `--name True|False`,
lists `--name v1 v2 ...`.
"""

from __future__ import annotations

import json
import math
from urllib.parse import urlsplit
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from hpcrl.planning.backends.base import (
    Backend,
    DriverLine,
    Planned,
    Service,
    Word,
    cli_pins_into,
    is_number,
    merge_planned,
    positive,
)
from hpcrl.errors import ConfigError, HpcrlError, PlanError
from hpcrl.models import resolve_model
from hpcrl.planning.backends.log_facts import (
    CommandFacts,
    CpuAsk,
    DiagnoseFacts,
    LogFormat,
    MetricFacts,
    SmokeFacts,
    TimingFacts,
)
from hpcrl.memory.vllm_accounting import VllmEngineFacts
from hpcrl.planning.backends.facts import MemoryDefault, MemoryFacts
from hpcrl.planning.backends.open_instruct_disk import DISK
from hpcrl.planning.backends.capabilities import commit, feature, services, setting
from hpcrl.planning.backends.oi_args import _kind, arg_table, check_args, default, layout_version, version_layout
from hpcrl.planning.layout import Layout, Pins, Workload

if TYPE_CHECKING:
    from hpcrl.planning.run_types import HpcrlSection, RunConfig, RunPlan
    from hpcrl.profiles import ClusterProfile

# Fields the layout planner decides; present in a config file or --set, they are pins.
LAYOUT_FIELDS = (
    "num_learners_per_node",
    "vllm_num_engines",
    "vllm_tensor_parallel_size",
    "vllm_gpu_memory_utilization",
    "deepspeed_stage",
    "num_nodes",
    "gather_whole_model",
)
# Run-directory fields: name -> sub-directory of RUN_DIR (docs/run-dir.md). hpcrl owns them
# so that restarts find their state.
RUN_DIR_SUBDIRS = {"output_dir": "output", "checkpoint_state_dir": "checkpoints"}
RUN_DIR_FIELDS = tuple(RUN_DIR_SUBDIRS)


EPISODES_MAX = 10**12  # far past any run (a billion steps of 1,000 episodes): the disk plan counts the steps


@dataclass(frozen=True)
class DriverArg:
    """One flag: literal values (quoted when rendered), or a sub-directory of $RUN_DIR."""

    name: str
    values: tuple[str, ...] = ()
    run_dir_subdir: str | None = None


def _number(value: float) -> str:
    if not math.isfinite(value):
        raise ConfigError(f"{value!r} is not a finite number")
    return repr(float(value))


def _scalar(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True)
    text = str(value)
    if text.startswith("-") and not is_number(text):
        raise ConfigError(f"{name}: value {text!r} starts with '-', which grpo_fast.py's parser would read as a flag")
    return text


def format_values(name: str, value: Any, type_text: str) -> tuple[str, ...] | None:
    """The command-line words of one field's value; None to leave the flag out."""
    kind = _kind(type_text)
    if kind == "list":
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        return tuple(_scalar(name, v) for v in items) if items else None
    if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return (_number(value),)
    return (_scalar(name, value),)


def layout_fields(layout: Layout) -> dict[str, Any]:
    """The layout as grpo_fast's arguments: a learner count per learner node (one STRICT_SPREAD bundle each), the
    engines, their TP and memory share, the ZeRO stage, and whether the weight sync gathers the whole model at once
    (where the plan models the sync)."""
    sync = layout.whole_model_sync
    return {
        "num_learners_per_node": layout.learners,
        "vllm_num_engines": layout.engines,
        "vllm_tensor_parallel_size": layout.tp,
        "vllm_gpu_memory_utilization": layout.gpu_memory_utilization,
        "deepspeed_stage": layout.zero_stage,
    } | ({"gather_whole_model": sync} if sync is not None else {})


def layout_args(layout: Layout, nodes: int, table: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The planner's fields as open-instruct arguments (num_nodes where the layout has it)."""
    fields = layout_fields(layout)
    if "num_nodes" in table:
        fields["num_nodes"] = nodes
    for name in fields:
        if name not in table:
            raise ConfigError(f"layout field {name} is not an argument of this open-instruct layout")
    return fields


def code_datasets(args: dict[str, Any]) -> list[str]:
    """Dataset names in the mixer lists that look like code data (open-instruct routes rows whose
    verifier source is 'code' or 'code_stdio' to its code API; a name is the only sign a config has)."""
    names = []
    for key in ("dataset_mixer_list", "dataset_mixer_eval_list"):
        for item in args.get(key) or []:
            if isinstance(item, str) and not is_number(item) and "code" in item.lower() and item not in names:
                names.append(item)
    return names


def driver_args(cfg: RunConfig, layout: Layout, nodes: int, choices: dict[str, Any] | None = None) -> list[DriverArg]:
    """grpo_fast.py's flags, in config order, then the planner's fields (and its other choices,
    e.g. checkpoint_state_freq), then the run directory."""
    arg_layout = cfg.hpcrl.arg_layout
    table = arg_table(arg_layout)
    planned = layout_args(layout, nodes, table) | dict(choices or {})
    pinned_nodes = cfg.args.get("num_nodes")
    if pinned_nodes is not None and "num_nodes" in table and int(pinned_nodes) != nodes:
        raise PlanError(
            f"num_nodes {pinned_nodes} is pinned in the config but the job has {nodes} nodes; "
            f"remove it or pass --nodes {pinned_nodes}"
        )
    merged = merge_planned(cfg.args, planned)
    out: list[DriverArg] = []
    for key, value in merged.items():
        if key not in table:
            raise ConfigError(
                f"{key} is not a grpo_fast.py argument in open-instruct's {arg_layout} layout "
                f"(hpcrl.arg_layout); see hpcrl/planning/backends/data/open_instruct_args_{arg_layout}.json"
            )
        if key in RUN_DIR_SUBDIRS:
            continue
        if value is None:
            if default(key, arg_layout) is not None:
                raise ConfigError(f"{key}: null cannot be passed on grpo_fast.py's command line; remove it")
            continue
        words = format_values(key, value, table[key]["type"])
        if words is None:
            if default(key, arg_layout) not in (None, []):
                raise ConfigError(f"{key}: an empty list cannot be passed on grpo_fast.py's command line")
            continue
        out.append(DriverArg(key, words))
    for key, sub in RUN_DIR_SUBDIRS.items():
        if key not in table:
            raise ConfigError(f"{key} is not an argument of open-instruct's {arg_layout} layout")
        out.append(DriverArg(key, run_dir_subdir=sub))
    return out


class OpenInstructBackend(Backend):
    """open-instruct's grpo_fast.py: learners and vLLM engines on separate GPUs."""

    name = "open-instruct"
    label = "open-instruct's grpo_fast.py"
    default_entry_point = "open_instruct/grpo_fast.py"
    default_workdir = "$HOME/open-instruct"
    model_key = "model_name_or_path"
    layout_keys = LAYOUT_FIELDS
    run_dir_keys = RUN_DIR_FIELDS
    flag_table = "hpcrl/planning/backends/data/open_instruct_args_{layout}.json"
    entry_is_module = False
    uses_ray = True  # grpo_fast.py places learners and vLLM engines on the job's Ray cluster
    command_facts = CommandFacts(
        entry=r"grpo_fast\.py|open_instruct\.grpo_fast|grpo_vllm_thread_ray_gtrl\.py",
        framework="open-instruct",
        package="open_instruct",
    )
    diagnose_facts = DiagnoseFacts(
        keys={
            "model": "model_name_or_path",
            "tokens": "pack_length",
            "learners": "num_learners_per_node",
            "zero": "deepspeed_stage",
            "tp": "vllm_tensor_parallel_size",
            "util": "vllm_gpu_memory_utilization",
            "offload": "deepspeed_offload_optimizer",
            "timeout": "backend_timeout",
            "response": "response_length",
        },
        # grpo_fast logs its arguments (`Args: name=value ...`): diagnose's name -> (key, default).
        logged={
            "model": ("model_name_or_path", None),
            "tokens_per_gpu": ("pack_length", 10240),
            "zero_stage": ("deepspeed_stage", 3),
            "vllm_tp": ("vllm_tensor_parallel_size", 1),
            "vllm_util": ("vllm_gpu_memory_utilization", 0.9),
            "learner_gpus": ("num_learners_per_node", 8),
        },
        offload_fix="{offload} off (or fewer learners per node)",
        stop_rate="val/stop_rate",  # the step panel's val/stop_rate (e6c3044a grpo_fast.py)
        # grpo_fast's learners are one STRICT_SPREAD bundle per num_learners_per_node entry.
        placement_fix="{learners} needs one entry per node, each <= {per} minus that node's engine GPUs, no more "
        "entries than nodes; {tp} <= GPUs free on one node",
        disk_bound="keep_last_n_checkpoints bounds the states; HF saves are never deleted",
    )
    # grpo_fast passes its whole environment to every Ray actor (e6c3044a grpo_fast.py:2214-2219).
    smoke_facts = SmokeFacts("learner-spread", "place learners and engines as open-instruct does", actor_env=True)
    # e6c3044a grpo_fast.py: the step's panel holds time/total (:1626, the step without the state save that
    # follows it), time/training (:1627) and time/group_generation_max (:1599); the state save at :2000 is a
    # Timer, which logs "<description>: <s> seconds" (rl_utils.py:180).
    timing_facts = TimingFacts(
        step=("time/total",),
        generation=("time/group_generation_max",),
        training=("time/training",),
        checkpoint_line=r"Saving checkpoint state: (?P<s>\d+(?:\.\d+)?) seconds",
    )
    # The step's metrics (e6c3044a): `scores` (data_loader.py:1547; the older `objective/verifiable_reward`), the KL
    # term `loss/kl_avg` and the estimators `objective/kl0_avg` (`objective/kl_avg` before), logged with a reference
    # policy (load_ref_policy), the losses `loss/total_avg` and `loss/policy_avg`, `optim/grad_norm` (:754). It logs
    # no spread of the rewards.
    metric_facts = MetricFacts(
        reward=("scores", "objective/verifiable_reward"),
        kl=("loss/kl_avg", "objective/kl0_avg", "objective/kl_avg"),
        loss=("loss/total_avg", "loss/policy_avg"),
        grad_norm=("optim/grad_norm",),
        summary=(
            "scores",
            "objective/scores",
            "objective/verifiable_reward",
            "objective/verifiable_correct_rate",
            "loss/policy_avg",
            "loss/total_avg",
            "loss/kl_avg",
            "val/stop_rate",
            "val/sequence_lengths",
            "learner_tokens_per_second_overall",
            "time/total",
            "lr",
        ),
    )
    # grpo_fast prints each step as a Rich panel titled "Metrics" (e6c3044a model_utils.py
    # print_rich_single_line_metrics): a row per key prefix ("other" for keys without "/"), "name: value" items
    # joined by " | ", wrapped; floats as .2e when |v| < 1e-5 else .2f, so an exact 0.0 is "0.00e+00" and a tiny
    # non-zero mean "0.00". Forks print the step as a dict or `key=value` line with `training_step`, its number.
    log_format = LogFormat(
        panel_titles=("Metrics",),
        pair_words=("training_step",),
        step_keys=("training_step",),
        # `scores` (data_loader.py:1547); `objective/scores` the older *_vllm_thread_ray_gtrl.py's (last at 745bf58d,
        # deleted in bac93931); `objective/verifiable_reward` grpo_fast's before `scores`.
        reward=("scores", "objective/scores", "objective/verifiable_reward"),
        loss=("loss/total_avg", "loss/policy_avg"),
        grad_norm=("optim/grad_norm",),  # grpo_fast.py:754
        # GRPO advantages are the reward minus its group mean: all exactly 0 when every group has zero variance
        # (data_loader.py:1566-1567).
        advantage_ranges=(("val/advantages_min", "val/advantages_max"),),
    )
    names_itself_in_plan = False  # plan.json stays as it was before the other backends came
    feature_triggers = {"lora": ("use_peft",), "load_in_4bit": ("load_in_4bit", "load_in_8bit")}
    # DeepSpeed's save_checkpoint writes <dir>/latest last (checkpoint_state_dir = RUN_DIR/checkpoints).
    checkpoint_key = "checkpoint_state_freq"
    checkpoint_marker = "checkpoints/latest"
    list_order = 0
    disk = DISK
    memory = MemoryFacts(
        defaults=(
            MemoryDefault("grad_accum_dtype", None, ("deepspeed", "grad_accum_dtype")),
            MemoryDefault("hpz_partition_size", "deepspeed_zpg", ("deepspeed", "zero_hpz_partition_size")),
            MemoryDefault("load_ref_policy", "load_ref_policy", ("features", "ref_policy")),
            MemoryDefault("gradient_checkpointing", None, ("features", "gradient_checkpointing")),
            MemoryDefault("util", "vllm_gpu_memory_utilization", ("vllm", "gpu_memory_utilization")),
        ),
        logits_copy=True,
        weight_sync="auto",  # logits / temperature out of place; whole-model or per-param sync
        weight_sync_key="gather_whole_model",
        vllm=VllmEngineFacts(
            "0.19.1",
            max_num_batched_tokens=2048,
            max_num_seqs=128,
            logprobs_mode="processed_logprobs",
            source="open-instruct e6c3044 requires vllm>=0.19.1 (pyproject.toml:36; hpcrl models the lowest it allows) and builds each engine with vllm.AsyncLLMEngine.from_engine_args (open_instruct/vllm_utils.py:701), passing no max_num_seqs / max_num_batched_tokens (vllm_utils.py:1270-1285): vLLM's engine-context defaults; it passes logprobs_mode processed_logprobs (vllm_utils.py:1284)",
        ),
    )
    plan_shows_layout_args = False
    pin_keys = {
        "learners_per_node": "num_learners_per_node",
        "learner_nodes": "num_learners_per_node",
        "tp": "vllm_tensor_parallel_size",
        "engines": "vllm_num_engines",
        "gpu_memory_utilization": "vllm_gpu_memory_utilization",
    }
    # grpo_fast.py applies no LoRA (data/capabilities.json): never offered.
    layout_fixes = {
        "no_hpz": "--set deepspeed_zpg=1 (no ZeRO++ secondary weight copy)",
        "offload_optimizer": "--set deepspeed_offload_optimizer=true (optimizer state in host RAM)",
        "offload_params": "--set deepspeed_offload_param=true (parameters in host RAM too)",
        "tokens": "--set pack_length={tokens}",
        "learners": "--pin learners={k} (learners per node)",
        "lora": None,
        "per_param_sync": "--set gather_whole_model=false (weight sync one parameter at a time)",
    }
    value_ranges = {
        "learning_rate": (positive, "a positive learning rate"),
        # grpo_fast.py writes its resume state only when checkpoint_state_freq > 0 (grpo_fast.py:1995):
        # 0 would make every job of the chain start from scratch. (save_freq <= 0 is its own
        # "never save the model", grpo_fast.py:1664, and allowed.)
        "checkpoint_state_freq": (
            positive,
            "a positive number of steps (0 or less never writes the state a continuation resumes from)",
        ),
        "keep_last_n_checkpoints": (lambda v: v >= -1, "-1 (keep all), 0 or more"),
        "num_unique_prompts_rollout": (positive, "a positive count"),
        "num_samples_per_prompt_rollout": (positive, "a positive count"),
        "per_device_train_batch_size": (positive, "a positive count"),
        "num_epochs": (positive, "a positive count"),
        # Training divides the logits by it (grpo_utils.py:560 at e6c3044), and vLLM refuses a negative one.
        "temperature": (positive, "a positive temperature (training divides the logits by it)"),
        # grpo_fast.py saves the model only when save_freq > 0 (grpo_fast.py:1664 at e6c3044, :2462 at 1611e3df):
        # -1 or 0 says "never"; another negative is a typo that never saves.
        "save_freq": (lambda v: v > 0 or v in (0, -1), "-1 or 0 (never save the model) or a positive number of steps"),
        "total_episodes": (lambda v: 0 < v <= EPISODES_MAX, f"a positive number of episodes, at most {EPISODES_MAX:,}"),
    }

    def arg(self, cfg: RunConfig, key: str) -> Any:
        """A key's value: the config's, else grpo_fast's default in the config's argument layout."""
        return cfg.args[key] if key in cfg.args else default(key, cfg.hpcrl.arg_layout)

    def arg_table(self, section: HpcrlSection | None = None) -> dict[str, dict[str, Any]]:
        return arg_table(section.arg_layout if section else "current")

    def check_section(self, section: HpcrlSection) -> None:
        # Both argument layouts; the entry point is a script path in the checkout.
        if section.lora_hf_save != "adapter":
            raise ConfigError("hpcrl.lora_hf_save is OpenRLHF's; remove it for backend open-instruct")
        self.check_version(section)
        named = section.framework_version
        if named and version_layout(named) != section.arg_layout:
            raise ConfigError(
                f"hpcrl.framework_version={named}: open-instruct's {version_layout(named)} argument "
                f"layout; set hpcrl.arg_layout={version_layout(named)} with it"
            )

    def check_args(self, args: dict[str, Any], section: HpcrlSection) -> None:
        check_args(args, section.arg_layout, section.framework_version)

    def target_version(self, section: HpcrlSection) -> tuple[str | None, str | None]:
        named = layout_version(section.arg_layout, section.framework_version)
        if named == section.framework_version:
            return super().target_version(section)
        return super().target_version(section.model_copy(update={"framework_version": named}))[0], None

    def workload_from_config(self, cfg: RunConfig, model: str | None = None) -> Workload:
        layout = cfg.hpcrl.arg_layout

        def arg(name: str) -> Any:
            return cfg.args[name] if name in cfg.args else default(name, layout)

        name = model or cfg.model_name
        if not name:
            raise HpcrlError("no model: set model_name_or_path in the config or pass --model")
        offload = (
            "params"
            if arg("deepspeed_offload_param")
            else ("optimizer" if arg("deepspeed_offload_optimizer") else "none")
        )
        return Workload(
            model=resolve_model(name),
            pack_length=int(arg("pack_length")),
            response_length=int(arg("response_length")),
            max_prompt_token_length=int(arg("max_prompt_token_length")),
            unique_prompts=int(arg("num_unique_prompts_rollout")),
            samples_per_prompt=int(arg("num_samples_per_prompt_rollout")),
            beta=float(arg("beta")),
            load_ref_policy=bool(arg("load_ref_policy")),
            # grpo_fast.py enables it unconditionally; its gradient_checkpointing field is never read
            # (capabilities.json, grpo_fast.py:370), so the plan does not follow the flag.
            gradient_checkpointing=bool(feature(self.name, "gradient_checkpointing").value),
            grad_accum_dtype=str(setting(self.name, "deepspeed", "grad_accum_dtype").value),
            offload=offload,
            lora_rank=int(arg("lora_r") or 0) if arg("use_peft") else 0,
            load_in_4bit=bool(arg("load_in_4bit")),
            logprob_impl=cfg.hpcrl.logprob_impl,
            hpz_partition_size=int(arg("deepspeed_zpg")),
            # gather_whole_model (default True) is the planner's unless the config sets it
            weight_sync=(
                "auto"
                if "gather_whole_model" not in cfg.args
                else "whole_model"
                if arg("gather_whole_model")
                else "per_param"
            ),
            # passed to vLLM's engine arguments (open_instruct/vllm_utils.py:1277 at e6c3044a)
            vllm=replace(self.memory.vllm, enforce_eager=bool(arg("vllm_enforce_eager"))),
        )

    def pins_from(self, cfg: RunConfig, cli_pins: list[str] | None = None) -> Pins:
        values: dict[str, Any] = {}
        a = cfg.args
        if "num_learners_per_node" in cfg.pinned:
            entries = a["num_learners_per_node"]
            entries = entries if isinstance(entries, list) else [entries]
            nonzero = [int(e) for e in entries if int(e) > 0]
            if not nonzero or len(set(nonzero)) != 1:
                raise PlanError(
                    f"num_learners_per_node {entries}: hpcrl plans equal learner counts per node; "
                    "give the same non-zero count for each learner node, e.g. [1, 1, 1, 1]"
                )
            values["learners_per_node"], values["learner_nodes"] = nonzero[0], len(nonzero)
        if "vllm_tensor_parallel_size" in cfg.pinned:
            values["tp"] = int(a["vllm_tensor_parallel_size"])
        if "vllm_num_engines" in cfg.pinned:
            values["engines"] = int(a["vllm_num_engines"])
        if "vllm_gpu_memory_utilization" in cfg.pinned:
            values["gpu_memory_utilization"] = float(a["vllm_gpu_memory_utilization"])
        if "deepspeed_stage" in cfg.pinned and int(a["deepspeed_stage"]) != 3:
            raise PlanError(f"deepspeed_stage {a['deepspeed_stage']}: hpcrl plans ZeRO-3 learners; valid: 3")
        return cli_pins_into(values, cli_pins, keys=self.pin_keys)

    def plan(
        self,
        cfg: RunConfig,
        profile: ClusterProfile,
        nodes: int,
        w: Workload,
        pins: Pins,
        variants: list[ClusterProfile],
    ) -> Planned:
        planned = super().plan(cfg, profile, nodes, w, pins, variants)
        if cfg.args.get("gradient_checkpointing") is False:
            fact = feature(self.name, "gradient_checkpointing")
            planned = replace(
                planned,
                warnings=planned.warnings
                + (
                    f"gradient_checkpointing false has no effect: grpo_fast.py always enables it ({fact.cite()}); "
                    "the plan assumes it on",
                ),
            )
        # grpo_fast.py sends each prompt, with all its samples, to one engine, and keeps async_steps steps of
        # prompts in flight (data_loader.py:1390 at e6c3044; grpo_fast.py:2734 at 1611e3df): more engines than
        # that idle. The planner picks no such layout itself; a pinned count is the user's, and warned about.
        steps = int(self.arg(cfg, "async_steps") or 1) if "async_steps" in arg_table(cfg.hpcrl.arg_layout) else 1
        in_flight = w.unique_prompts * max(1, steps)
        layouts = planned.layouts
        if layouts[0].engines > in_flight and pins.engines is None:
            layouts = [lay for lay in layouts if lay.engines <= in_flight] or layouts
            planned = replace(planned, layouts=layouts)
        best = layouts[0]
        if best.engines > in_flight:
            warning = (
                f"vllm_num_engines {best.engines} is more than the {in_flight} prompts in flight "
                f"(num_unique_prompts_rollout {w.unique_prompts} x async_steps {steps}): each prompt goes to "
                f"one engine, so {best.engines - in_flight} engines idle; raise num_unique_prompts_rollout "
                f"or async_steps, or use at most {in_flight} engines (--pin engines={in_flight})"
            )
            return replace(planned, warnings=planned.warnings + (warning,))
        return planned

    def layout_args(self, rp: RunPlan) -> dict[str, Any]:
        return layout_args(rp.layout, rp.nodes, arg_table(rp.config.hpcrl.arg_layout)) | dict(rp.choices)

    def services(self, cfg: RunConfig) -> list[Service]:
        """open-instruct's code-execution API, where the config's verifiers need it on localhost."""
        hp = cfg.hpcrl
        if hp.code_server == "off":
            return []
        url = cfg.args.get("code_api_url")
        parsed = urlsplit(str(url)) if url else None
        if parsed is not None and parsed.hostname not in ("localhost", "127.0.0.1"):
            if hp.code_server == "on":
                raise ConfigError(
                    f"hpcrl.code_server on, but code_api_url {url} is not on localhost: the run calls "
                    "that server, not one hpcrl starts; set hpcrl.code_server: off or auto"
                )
            return []
        code_data = code_datasets(cfg.args)
        if hp.code_server == "auto" and not code_data and url is None:
            return []
        fact = services(self.name)[0]
        port = None
        if parsed is not None:
            port = parsed.port or (443 if parsed.scheme == "https" else 80)
        why = (
            f"the datasets {', '.join(code_data)} look like code verifiers"
            if code_data
            else "hpcrl.code_server: on"
            if hp.code_server == "on"
            else f"code_api_url {url} is on localhost"
        )
        command = tuple(
            hp.code_server_command
            or (
                hp.python,
                "-m",
                "uvicorn",
                "open_instruct.code_utils.api:app",
                "--host",
                "127.0.0.1",
                "--port",
                "{port}",
            )
        )
        env = () if url else (("CODE_API_URL", "http://127.0.0.1:{port}"),)
        return [
            Service(
                "code-server",
                command,
                "/health",
                port,
                env,
                f"open-instruct's code-execution API ({fact['start_source']} at {commit(self.name)[:8]}): "
                f"{why}; its verifiers post each 'code'/'code_stdio' sample to it "
                f"({fact['source']}); hpcrl.code_server: off skips it",
            )
        ]

    def driver_command(self, rp: RunPlan) -> list[DriverLine]:
        lines: list[DriverLine] = []
        for a in driver_args(rp.config, rp.layout, rp.nodes, dict(rp.choices)):
            if a.run_dir_subdir:
                lines.append((Word(f"--{a.name}"), Word(f"$RUN_DIR/{a.run_dir_subdir}", run_dir=True)))
            else:
                lines.append((Word(f"--{a.name}"), *(Word(v) for v in a.values)))
        return lines

    def tokens_text(self, rp: RunPlan) -> str:
        return f"pack_length {rp.workload.pack_length}"

    def summary(self, rp: RunPlan) -> str:
        lay = rp.layout
        return (
            f"num_learners_per_node [{lay.learners_per_node}] x {lay.learner_nodes}, vllm_num_engines {lay.engines}, "
            f"vllm_tensor_parallel_size {lay.tp}, vllm_gpu_memory_utilization {lay.gpu_memory_utilization:g}, "
            f"deepspeed_stage {lay.memory.learner_setup.zero_stage}"
        )

    def smoke_cpu_ask(self, rp: RunPlan) -> CpuAsk:
        # 10 CPUs per learner GPU (grpo_fast_resource_plan.LEARNER_PLACEMENT_GROUP_CPU_PER_GPU), tp per
        # engine, and 3 for DataPreparationActor (2) and ActorManager (1).
        lay = rp.layout
        learners = lay.learners_per_node * lay.learner_nodes
        return CpuAsk(
            "grpo_fast.py", learners * 10 + lay.engines * lay.tp + 3, lay.learners_per_node * 10, "learner node"
        )


BACKEND = OpenInstructBackend
