"""The verl backend: `python3 -m verl.trainer.main_ppo key=value ...` (Hydra overrides).

Pure. verl's hybrid engine colocates rollout (vLLM) and FSDP training on every GPU, so its plan is one
colocated layout (hpcrl/planning/layout_colocated.py) whose only choices are the rollout TP size and
gpu_memory_utilization; hpcrl also picks the per-GPU micro-batch and, only when nothing fits without,
FSDP parameter/optimizer offload. Every key is checked against verl's composed PPO trainer config.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

from hpcrl.planning.backends.base import (
    Backend,
    DriverLine,
    Planned,
    Word,
    cli_pins_into,
    flatten,
    merge_planned,
    never_or_positive,
    parse_number,
    positive,
    require_job_match,
)
from hpcrl.errors import would_fit, ConfigError, HpcrlError, PlanError, UnknownNameError
from hpcrl.memory.colocated import Colocation
from hpcrl.memory.constants import GIB
from hpcrl.memory.fsdp_learner import FsdpOffload, FsdpSetup, earlier_grads
from hpcrl.memory.sharding import FSDP
from hpcrl.memory.vllm_accounting import VllmEngineFacts
from hpcrl.models import resolve_model
from hpcrl.planning.backends import versions
from hpcrl.planning.backends.verl_memory import (
    FILLS_NODES,
    fsdp_update,
    grad_sync_key,
    memory_facts,
    sleep_level,
    vllm_facts,
)
from hpcrl.planning.backends.log_facts import CommandFacts, CpuAsk, DiagnoseFacts, LogFormat, MetricFacts, SmokeFacts
from hpcrl.planning.backends.verl_disk import DISK, TIMING
from hpcrl.planning.backends.verl_hydra import expected_kind, hydra_value, is_interpolation, type_ok
from hpcrl.planning.layout import DEFAULT_MICRO_BATCHES, Pins, Workload
from hpcrl.planning.layout_colocated import enumerate_colocated, plan_colocated_layouts

if TYPE_CHECKING:
    from hpcrl.planning.run_types import HpcrlSection, RunConfig, RunPlan
    from hpcrl.profiles import ClusterProfile

A, R, REF, T = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "actor_rollout_ref.ref.", "trainer."
TP_KEY = R + "tensor_model_parallel_size"
UTIL_KEY = R + "gpu_memory_utilization"
MICRO_KEY = A + "ppo_micro_batch_size_per_gpu"
LOGPROB_MICRO_KEYS = (R + "log_prob_micro_batch_size_per_gpu", REF + "log_prob_micro_batch_size_per_gpu")
PARAM_OFFLOAD_KEY = A + "fsdp_config.param_offload"
OPT_OFFLOAD_KEY = A + "fsdp_config.optimizer_offload"
# Offload choices in the order hpcrl tries them: none, optimizer, both (each moves state to
# host RAM between phases and back, so it is used only when nothing fits without).
OFFLOAD_OPTIONS = ((False, False), (False, True), (True, True))
# Checkpoints kept unless the config says (verl's default, null, keeps all). verl b178a3cd
# (checkpoint_manager.py) removes the oldest before a save when keeping 2 or more, and keeps
# the old one until the new one is complete when keeping 1: two exist at the peak either way.
KEEP_CHECKPOINTS = 2
REQUIRED = ("actor_rollout_ref.model.path", "data.train_files", "data.val_files")


# A GPU reward model, under its key at each version: reward_model.enable at b178a3cd; reward.reward_model.enable
# at 1dda039b, where reward_model.* is a null placeholder main_ppo does not read (capabilities there, reward_model).
REWARD_MODEL_KEYS = ("reward.reward_model.enable", "reward_model.enable")
LORA_KEYS = ("actor_rollout_ref.model.lora.rank", "actor_rollout_ref.model.lora_rank")


@lru_cache(maxsize=None)
def verl_table(version: str | None = None) -> dict[str, dict[str, Any]]:
    """verl's keys at `version` (hpcrl.framework_version; None: the newest hpcrl knows)."""
    return versions.table("verl", version)


class VerlBackend(Backend):
    """verl's PPO trainer with FSDP workers and a colocated vLLM rollout."""

    name = "verl"
    label = "verl's main_ppo (Hydra overrides)"
    default_entry_point = "verl.trainer.main_ppo"
    default_workdir = "$HOME"
    default_python = "python3"
    model_key = "actor_rollout_ref.model.path"
    layout_keys = (T + "nnodes", T + "n_gpus_per_node", TP_KEY, UTIL_KEY, MICRO_KEY, PARAM_OFFLOAD_KEY, OPT_OFFLOAD_KEY)
    run_dir_keys = (T + "default_local_dir", T + "resume_mode")
    flag_table = "hpcrl/planning/backends/data/verl_args.json"
    # verl's plan is its own colocated planner: the separate-engine planner's fixes never apply.
    layout_fixes = {}
    entry_is_module = True  # python -m <entry point>
    uses_ray = True  # main_ppo runs its workers on the job's Ray cluster (ray.init in trainer/main_ppo.py)
    command_facts = CommandFacts(
        entry=r"verl\.trainer\.main_ppo|verl/trainer/main_ppo\.py", style="hydra", framework="verl", package="verl"
    )
    diagnose_facts = DiagnoseFacts(
        # the legacy workers, gone at 1dda039b (its engine workers run the update): a b178a3cd-era run
        version_marks=(("verl/workers/actor/dp_actor.py", "0.8.0.dev"), ("verl/workers/fsdp_workers.py", "0.8.0.dev")),
        keys={
            "model": "actor_rollout_ref.model.path",
            "micro": MICRO_KEY,
            "mini": A + "ppo_mini_batch_size",
            "samples": R + "n",
            "nodes": T + "nnodes",
            "gpus": T + "n_gpus_per_node",
            "tp": TP_KEY,
            "util": UTIL_KEY,
            "offload": OPT_OFFLOAD_KEY,
            "param_offload": PARAM_OFFLOAD_KEY,
            "timeout": "actor_rollout_ref.nccl_timeout",
            "lora": "actor_rollout_ref.model.lora_rank",
            "prompt": "data.max_prompt_length",
            "response": "data.max_response_length",
        },
        values_from="command",
        fixed_zero_stage=3,
        seq_len=("prompt", "response"),
        critic_free=("algorithm.adv_estimator", "grpo"),
        learner_fixes="colocated",
        offload_fix="{param_offload} and {offload} false",
        timeout_raise=True,
        disk_reads=("lora_rank", "keep"),
        disk_bound="trainer.max_actor_ckpt_to_keep bounds them",
        death_note="verl's WorkerDict holds the actor, rollout and reference of its GPU: one death stops the step",
    )
    smoke_facts = SmokeFacts(
        "node-pools", "place one STRICT_PACK group of per-GPU bundles per node as verl's resource pool does"
    )
    timing_facts = TIMING  # the step's and the checkpoint save's timers (verl_disk.py)
    # b178a3cd: `critic/score/mean` (trainer/ppo/metric_utils.py:162), `actor/pg_loss`, `actor/grad_norm`
    # (workers/actor/dp_actor.py:666), the KL loss `actor/kl_loss` (with actor.use_kl_loss) and the PPO KL
    # estimate `actor/ppo_kl` (dp_actor.py); the scores' spread is not logged (their min and max are).
    metric_facts = MetricFacts(
        reward=("critic/score/mean",),
        kl=("actor/kl_loss", "actor/ppo_kl"),
        loss=("actor/pg_loss",),
        grad_norm=("actor/grad_norm",),
    )
    # b178a3cd prints one console line per step, `step:N - key:value - ...` (utils/logger/aggregate_logger.py).
    # 1dda039b needs numpy>=2 (setup.py:32), whose repr is "np.float64(0.5)", and prints np.mean results through
    # pprint.pformat (aggregate_logger.py:26-31): the reader takes the number inside.
    log_format = LogFormat(
        step_lines=(r"(?:^|\s)step:(\d+) - ",),
        reward=("critic/score/mean",),  # trainer/ppo/metric_utils.py:162
        loss=("actor/pg_loss",),
        grad_norm=("actor/grad_norm",),  # workers/actor/dp_actor.py:666
        # GRPO advantages are the reward minus its group mean: all exactly 0 when every group has zero variance
        # (trainer/ppo/metric_utils.py:170-172).
        advantage_ranges=(("critic/advantages/min", "critic/advantages/max"),),
    )
    # verl's trainer writes <default_local_dir>/latest_checkpointed_iteration.txt after each save.
    checkpoint_key = T + "save_freq"
    checkpoint_marker = "checkpoints/latest_checkpointed_iteration.txt"
    list_order, fills_learner_nodes = 1, FILLS_NODES
    disk = DISK
    memory = memory_facts(A, R, MICRO_KEY, flag_table)
    value_ranges = {
        A + "optim.lr": (positive, "a positive learning rate"),
        T + "total_epochs": (positive, "a positive number of epochs"),
        T + "save_freq": (never_or_positive, "-1 (never) or a positive number of steps"),
        "data.train_batch_size": (positive, "a positive count"),
        R + "n": (positive, "a positive count"),
    }

    def arg_table(self, section: HpcrlSection | None = None) -> dict[str, dict[str, Any]]:
        return verl_table(section.framework_version if section else None)

    def normalize_args(self, args: dict[str, Any], section: HpcrlSection) -> dict[str, Any]:
        """Nested YAML mappings become dotted keys, down to the table's leaves."""
        return flatten(args, self.arg_table(section))

    def check_args(self, args: dict[str, Any], section: HpcrlSection) -> None:
        table = self.arg_table(section)
        for key, value in args.items():
            if key.startswith("+"):
                parent = key[1:].rsplit(".", 1)[0]
                if key[1:] in table or table.get(parent, {}).get("type") != "dict":
                    raise ConfigError(
                        f"verl key {key!r}: '+' adds a key under an empty mapping of verl's config "
                        f"(e.g. +{R}engine_kwargs.vllm.NAME); {parent!r} is not one"
                    )
                continue
            if key not in table:
                versions.check_key(self.name, section.framework_version, key)  # only other versions have it
                raise UnknownNameError("verl key", key, table)
            kind = expected_kind(table[key])
            if not type_ok(kind, value):
                raise ConfigError(f"verl key {key}: expected {kind}, got {value!r}")
        name = args.get(R + "name")
        if name not in (None, "vllm"):
            raise ConfigError(f"{R}name {name!r}: hpcrl plans vLLM rollouts; valid: vllm")
        missing = [k for k in REQUIRED if k not in args]
        if missing:
            raise ConfigError(f"verl needs {', '.join(missing)} (its defaults are placeholders)")

    # ------------------------------------------------------------------ planning
    def colocated(self, cfg: RunConfig) -> bool:
        return True

    def arg(self, cfg: RunConfig, key: str) -> Any:
        """A key's value: the config's, else verl's default (interpolations resolved as stock)."""
        meta = self.arg_table(cfg.hpcrl)[key]
        if key in cfg.args:
            value = cfg.args[key]
            if isinstance(value, str) and is_interpolation(value) and expected_kind(meta) in ("int", "float", "bool"):
                raise ConfigError(f"verl key {key}: hpcrl plans with its value, so give a literal here, not {value!r}")
            return value
        if "resolved" in meta:
            return meta["resolved"]
        raw = meta["default"]
        return {"true": True, "false": False, "null": None}.get(raw, parse_number(raw))

    def uses_reference(self, cfg: RunConfig) -> bool:
        return bool(self.arg(cfg, A + "use_kl_loss") or self.arg(cfg, "algorithm.use_kl_in_reward"))

    def dynamic_bsz(self, cfg: RunConfig) -> bool:
        return bool(self.arg(cfg, A + "use_dynamic_bsz"))

    def workload_from_config(self, cfg: RunConfig, model: str | None = None) -> Workload:
        name = model or cfg.model_name
        if not name:
            raise HpcrlError(f"no model: set {self.model_key} in the config or pass --model")
        if self.arg(cfg, "algorithm.adv_estimator") == "gae":
            raise PlanError(
                "algorithm.adv_estimator gae (verl's default) trains a critic, which hpcrl does not plan; "
                "set a critic-free estimator, e.g. grpo"
            )
        table = self.arg_table(cfg.hpcrl)
        for key in REWARD_MODEL_KEYS:
            if table.get(key, {}).get("type") == "bool" and self.arg(cfg, key):
                raise PlanError(
                    f"{key}: hpcrl plans no reward-model GPUs; use a reward function "
                    "(custom_reward_function.path) or verl's rule-based scores"
                )
        prompt, response = int(self.arg(cfg, "data.max_prompt_length")), int(self.arg(cfg, "data.max_response_length"))
        seq_len = prompt + response
        if self.dynamic_bsz(cfg):
            tokens = int(self.arg(cfg, A + "ppo_max_token_len_per_gpu"))
            if tokens < seq_len:
                raise PlanError(
                    f"{A}ppo_max_token_len_per_gpu {tokens} is shorter than one sequence "
                    f"(data.max_prompt_length + data.max_response_length = {seq_len}); set it >= {seq_len}"
                )
        else:
            micro = cfg.args.get(MICRO_KEY)
            tokens = int(micro) * seq_len if micro else seq_len  # unpinned: the plan picks the micro-batch
        lora = max(int(self.arg(cfg, key) or 0) for key in LORA_KEYS if key in table)
        return Workload(
            model=resolve_model(name),
            pack_length=tokens,
            response_length=response,
            max_prompt_token_length=prompt,
            unique_prompts=int(self.arg(cfg, "data.train_batch_size")),
            samples_per_prompt=int(self.arg(cfg, R + "n")),
            beta=0.0,
            load_ref_policy=self.uses_reference(cfg),
            gradient_checkpointing=bool(self.arg(cfg, "actor_rollout_ref.model.enable_gradient_checkpointing")),
            # FSDP2's CPUOffloadPolicy streams parameters, gradients and the optimizer step
            # through host memory during training itself.
            offload="params" if self.arg(cfg, A + "fsdp_config.offload_policy") else "none",
            lora_rank=lora,
            logprob_impl=cfg.hpcrl.logprob_impl,
            grad_accum_dtype="fp32",  # verl's FSDP mixed precision reduces gradients in fp32
            hpz_partition_size=1,
            logits_copy=False,  # the ZeRO model's field; the FSDP model's log-prob path is per version (VerlUpdate)
            sharding=FSDP,
            fsdp_version=self.fsdp_version(cfg),
            vllm=vllm_facts(
                cfg.hpcrl.framework_version,
                max_num_seqs=int(self.arg(cfg, R + "max_num_seqs")),
                max_num_batched_tokens=int(self.arg(cfg, R + "max_num_batched_tokens")),
                enforce_eager=bool(self.arg(cfg, R + "enforce_eager")),
                logprobs_mode=str(self.arg(cfg, R + "logprobs_mode") or "raw_logprobs"),
            ),
            learner_fixed=self.learner_fixed(
                cfg.hpcrl.framework_version, self.no_sync(cfg), float(self.arg(cfg, R + "temperature"))
            ),
        )

    def pins_from(self, cfg: RunConfig, cli_pins: list[str] | None = None) -> Pins:
        values: dict[str, Any] = {}
        if TP_KEY in cfg.args:
            values["tp"] = int(cfg.args[TP_KEY])
        if UTIL_KEY in cfg.args:
            values["gpu_memory_utilization"] = float(cfg.args[UTIL_KEY])
        return cli_pins_into(values, cli_pins, allowed=("tp", "util"))

    def colocation(self, cfg: RunConfig, param_offload: bool, optimizer_offload: bool) -> Colocation:
        return Colocation(
            param_offload=param_offload,
            optimizer_offload=optimizer_offload,
            grads_resident=False,
            reference_offload=bool(self.arg(cfg, REF + "fsdp_config.param_offload")),
            vllm_sleeps=bool(self.arg(cfg, R + "free_cache_engine")),
            sleep_level=self.sleep_level(cfg.hpcrl.framework_version),
        )

    def sleep_level(self, version: str | None = None) -> int:
        return sleep_level(self.name, version)

    memory_by_version = True  # the actor update moved to the engine workers (fsdp_learner.VerlUpdate)

    def learner_fixed(
        self, version: str | None = None, no_sync: bool | None = None, temperature: float = 1.0
    ) -> tuple[tuple[str, Any], ...]:
        return (*super().learner_fixed(version), ("fsdp_update", fsdp_update(self.name, version, no_sync, temperature)))

    def no_sync(self, cfg: RunConfig) -> bool | None:
        """The run's value of the key that switches its version's gradient sync (0.9.1's
        fsdp_config.use_no_sync_for_gradient_accumulation); None: not set, or no such key at that version."""
        key = grad_sync_key(self.name, cfg.hpcrl.framework_version)
        if key is None or key not in cfg.args:
            return None
        value = cfg.args[key]
        return value if isinstance(value, bool) else str(value).strip().lower() == "true"

    def engine_facts(self, version: str | None = None) -> VllmEngineFacts:
        return vllm_facts(version)  # b178a3cd installs vLLM 0.11.0, 1dda039b 0.24.0

    def plan(
        self,
        cfg: RunConfig,
        profile: ClusterProfile,
        nodes: int,
        w: Workload,
        pins: Pins,
        variants: list[ClusterProfile],
    ) -> Planned:
        g = profile.gpu.count_per_node
        require_job_match(T + "nnodes", cfg.args.get(T + "nnodes"), nodes)
        require_job_match(T + "n_gpus_per_node", cfg.args.get(T + "n_gpus_per_node"), g)
        micros = self._micro_batches(cfg, nodes * g)
        offloads = (
            [(bool(self.arg(cfg, PARAM_OFFLOAD_KEY)), bool(self.arg(cfg, OPT_OFFLOAD_KEY)))]
            if {PARAM_OFFLOAD_KEY, OPT_OFFLOAD_KEY} & set(cfg.args)
            else list(OFFLOAD_OPTIONS)
        )
        for po, oo in offloads:
            for micro in micros:
                wm = self.learner_workload(cfg, w, nodes * g, micro)
                layouts, _ = enumerate_colocated(profile, nodes, wm, pins, self.colocation(cfg, po, oo))
                if layouts:
                    choices: dict[str, Any] = {PARAM_OFFLOAD_KEY: po, OPT_OFFLOAD_KEY: oo}
                    if micro:
                        choices[MICRO_KEY] = micro
                    return Planned(layouts, choices, workload=wm)
        # Nothing fits: the error, with suggestions, for the smallest micro-batch and the offload tried last.
        po, oo = offloads[-1]
        wm = self.learner_workload(cfg, w, nodes * g, micros[-1])
        hint = None if offloads[-1] == (True, True) else f"--set {PARAM_OFFLOAD_KEY}=true --set {OPT_OFFLOAD_KEY}=true"
        # Raises with suggestions, or returns layouts that fit only inside the allocator margin (with a note).
        try:
            layouts = plan_colocated_layouts(profile, nodes, wm, pins, self.colocation(cfg, po, oo), hint)
        except PlanError as err:
            # The user's own micro-batch, smaller, comes first (seed 004: 32 -> 16 fits on one A100 node).
            smaller = self._smaller_micro_batch(cfg, profile, nodes, w, pins, offloads)
            raise would_fit(
                err.head or str(err), (*smaller, *err.fixes), self._unsharded_grads_note(cfg, wm, nodes * g), err.none
            ) from None
        choices = {PARAM_OFFLOAD_KEY: po, OPT_OFFLOAD_KEY: oo} | ({MICRO_KEY: micros[-1]} if micros[-1] else {})
        return Planned(layouts, choices, workload=wm)

    def _unsharded_grads_note(self, cfg: RunConfig, w: Workload, world: int) -> str:
        """Why no node count helps where the verl version keeps unsharded gradients across micro-batches."""
        setup = self.fsdp_setup(cfg, w, world, w.micro_batches)
        grads = earlier_grads(setup, 0.0)[1]
        if setup.update.grad_sync != "last_micro_batch" or not grads:
            return ""
        dtype = "bf16" if setup.fsdp_version == 1 else "fp32"  # as earlier_grads counts them
        return (
            f"; verl {setup.update.version} keeps the whole model's unsharded {dtype} gradients "
            f"through the {setup.micro_batches} micro-batches of a step ({grads / GIB:.0f} GiB per GPU at any GPU "
            f"count: engine/fsdp/transformer_impl.py:672-698 at 1dda039b): one micro-batch per step "
            f"({MICRO_KEY} = {A}ppo_mini_batch_size x {R}n / GPUs) or hpcrl.framework_version=b178a3cd avoids it"
        )

    def _smaller_micro_batch(
        self,
        cfg: RunConfig,
        profile: ClusterProfile,
        nodes: int,
        w: Workload,
        pins: Pins,
        offloads: list[tuple[bool, bool]],
    ) -> tuple[str, ...]:
        """The largest micro-batch below the config's own that fits (one --set), where the config sets one."""
        pinned, world = cfg.args.get(MICRO_KEY), nodes * profile.gpu.count_per_node
        if not pinned or self.dynamic_bsz(cfg):
            return ()
        per_gpu = int(self.arg(cfg, A + "ppo_mini_batch_size")) * int(self.arg(cfg, R + "n")) // world
        for micro in (d for d in range(int(pinned) - 1, 0, -1) if per_gpu % d == 0):
            wm = self.learner_workload(cfg, w, world, micro)
            if any(
                enumerate_colocated(profile, nodes, wm, pins, self.colocation(cfg, po, oo))[0] for po, oo in offloads
            ):
                return (f"--set {MICRO_KEY}={micro}",)
        return ()

    def _micro_batches(self, cfg: RunConfig, world: int) -> list[int]:
        """Sequences per GPU micro-batch to try, largest first ([0]: tokens are fixed already)."""
        n = int(self.arg(cfg, R + "n"))
        train, mini = int(self.arg(cfg, "data.train_batch_size")), int(self.arg(cfg, A + "ppo_mini_batch_size"))
        if train * n % world:
            raise PlanError(
                f"data.train_batch_size {train} x {R}n {n} = {train * n} sequences must divide over "
                f"the job's {world} GPUs (verl checks this)"
            )
        if mini > train:
            raise PlanError(f"{A}ppo_mini_batch_size {mini} exceeds data.train_batch_size {train}")
        per_gpu = mini * n // world
        if per_gpu < 1:
            raise PlanError(
                f"{A}ppo_mini_batch_size {mini} x {R}n {n} gives less than one sequence per GPU "
                f"on {world} GPUs; raise it to at least {math.ceil(world / n)}"
            )
        if self.dynamic_bsz(cfg):
            return [0]
        pinned = cfg.args.get(MICRO_KEY)
        if pinned:
            if per_gpu % int(pinned):
                raise PlanError(
                    f"{MICRO_KEY} {pinned} must divide the {per_gpu} sequences of a mini-batch per GPU "
                    f"({A}ppo_mini_batch_size x {R}n / GPUs)"
                )
            return [int(pinned)]
        return [d for d in range(per_gpu, 0, -1) if per_gpu % d == 0]

    # ------------------------------------------------------------------ rendering
    def layout_args(self, rp: RunPlan) -> dict[str, Any]:
        lay, cfg, choices = rp.layout, rp.config, dict(rp.choices)
        out: dict[str, Any] = {
            T + "nnodes": rp.nodes,
            T + "n_gpus_per_node": rp.profile.gpu.count_per_node,
            R + "name": "vllm",
            TP_KEY: lay.tp,
            UTIL_KEY: lay.gpu_memory_utilization,
            PARAM_OFFLOAD_KEY: choices.get(PARAM_OFFLOAD_KEY, False),
            OPT_OFFLOAD_KEY: choices.get(OPT_OFFLOAD_KEY, False),
        }
        micro = choices.get(MICRO_KEY)
        if micro:
            out[MICRO_KEY] = micro
            for key in LOGPROB_MICRO_KEYS:
                if key not in cfg.args and (key.startswith(R) or self.uses_reference(cfg)):
                    out[key] = micro  # forward-only: a training micro-batch that fits fits here too
        if T + "save_freq" in choices:
            out[T + "save_freq"] = choices[T + "save_freq"]
        if T + "max_actor_ckpt_to_keep" not in cfg.args:
            out[T + "max_actor_ckpt_to_keep"] = KEEP_CHECKPOINTS
        return out

    def driver_command(self, rp: RunPlan) -> list[DriverLine]:
        planned = self.layout_args(rp)
        merged = merge_planned(rp.config.args, planned)
        table = self.arg_table(rp.config.hpcrl)
        lines: list[DriverLine] = []
        for key, value in merged.items():
            if key.lstrip("+") not in table and not key.startswith("+"):
                raise ConfigError(f"{key} is not a key of verl's PPO trainer config ({self.flag_table})")
            lines.append((Word(f"{key}={hydra_value(value)}"),))
        lines.append((Word(f"{T}default_local_dir=$RUN_DIR/checkpoints", run_dir=True),))
        lines.append((Word(f"{T}resume_mode=auto"),))
        return lines

    def env(self, rp: RunPlan) -> dict[str, str]:
        return {"HYDRA_FULL_ERROR": "1"}  # a failing override shows verl's whole traceback

    def tokens_text(self, rp: RunPlan) -> str:
        micro = dict(rp.choices).get(MICRO_KEY)
        if micro:
            return f"ppo_micro_batch_size_per_gpu {micro} ({rp.workload.pack_length} tokens)"
        return f"ppo_max_token_len_per_gpu {rp.workload.pack_length}"

    def smoke_cpu_ask(self, rp: RunPlan) -> CpuAsk:
        # b178a3cd ResourcePoolManager: max_colocate_count=3 CPUs in each one-GPU bundle.
        g = rp.profile.gpu.count_per_node
        return CpuAsk("verl", 3 * g * rp.nodes + 1, 3 * g)

    def summary(self, rp: RunPlan) -> str:
        lay, c = rp.layout, dict(rp.choices)
        return (
            f"trainer.nnodes {rp.nodes}, n_gpus_per_node {lay.gpus_per_node}, rollout tensor_model_parallel_size "
            f"{lay.tp} ({lay.engines} engines), gpu_memory_utilization {lay.gpu_memory_utilization:g}, "
            f"fsdp param_offload {str(c.get(PARAM_OFFLOAD_KEY, False)).lower()}, "
            f"optimizer_offload {str(c.get(OPT_OFFLOAD_KEY, False)).lower()}"
        )

    # ------------------------------------------------------------------ learner memory (issue 24)
    def fsdp_version(self, cfg: RunConfig) -> Literal[1, 2]:
        """1 or 2 from actor.strategy (fsdp / fsdp2)."""
        strategy = str(self.arg(cfg, A + "strategy"))
        if strategy not in ("fsdp", "fsdp2"):
            raise PlanError(f"{A}strategy {strategy!r}: hpcrl models verl's fsdp and fsdp2 actors only")
        return 1 if strategy == "fsdp" else 2

    def learner_workload(self, cfg: RunConfig, w: Workload, world: int, micro: int) -> Workload:
        """One micro-batch choice, with its micro-batches per optimizer step (unless the command line gave them)."""
        wm = super().learner_workload(cfg, w, world, micro)
        if w.micro_batches is not None:
            return wm
        return replace(wm, micro_batches=self.micro_batch_count(cfg, world, w.seq_len, micro or None))

    def fsdp_setup(
        self,
        cfg: RunConfig,
        w: Workload,
        n_gpus: int,
        micro_batches: int | None = None,
        fsdp_version: Literal[1, 2] | None = None,
    ) -> FsdpSetup:
        """The actor update as verl runs it, for hpcrl.memory.fsdp_learner; given values win over the config."""
        if fsdp_version is None:
            fsdp_version = self.fsdp_version(cfg)
        if micro_batches is None:
            micro_batches = self.micro_batch_count(cfg, n_gpus, w.seq_len)
        offload: FsdpOffload
        if self.arg(cfg, A + "fsdp_config.offload_policy"):
            offload = "cpu_policy"
        elif self.arg(cfg, PARAM_OFFLOAD_KEY) or self.arg(cfg, OPT_OFFLOAD_KEY):
            offload = "param_optimizer"
        else:
            offload = "none"
        return FsdpSetup(
            w.model,
            n_gpus,
            w.pack_length,
            micro_batches,
            fsdp_version,
            w.load_ref_policy,
            offload,
            update=fsdp_update(
                self.name, cfg.hpcrl.framework_version, self.no_sync(cfg), float(self.arg(cfg, R + "temperature"))
            ),
        )

    def micro_batch_count(self, cfg: RunConfig, world: int, seq_len: int, micro: int | None = None) -> int:
        """Micro-batches per optimizer step on one GPU (dp_actor.py:551-559 at b178a3cd): the mini-batch's
        sequences per GPU over `micro` (else the pinned micro-batch); unpinned: 2 (assumed)."""
        per_gpu = int(self.arg(cfg, A + "ppo_mini_batch_size")) * int(self.arg(cfg, R + "n")) // world
        if self.dynamic_bsz(cfg):
            return max(1, math.ceil(per_gpu * seq_len / int(self.arg(cfg, A + "ppo_max_token_len_per_gpu"))))
        micro = micro or cfg.args.get(MICRO_KEY)
        return max(1, per_gpu // int(micro)) if micro else DEFAULT_MICRO_BATCHES


BACKEND = VerlBackend

__all__ = ["BACKEND", "VerlBackend", "hydra_value", "verl_table"]
