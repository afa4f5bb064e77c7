"""What `hpcrl diagnose` knows about the run behind a log, and where each fact came from (pure).

In order: a value given on the command line (--model, --learner-gpus, ...); the run's own driver
command (job.sbatch of a run directory, else the command line in the log, read per backend by
hpcrl.logs.driver_cmdline); open-instruct's logged arguments; the framework's default. A model is
never assumed: without one the findings say so and ask for --model. Every value used is listed
in the diagnosis' assumptions with its source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from hpcrl.errors import HpcrlError
from hpcrl.logs.driver_cmdline import DriverCommand, find_command
from hpcrl.models import ModelSpec, resolve_model
from hpcrl.profiles import ClusterProfile

# Each backend's key for what diagnose reads and what its fixes change.
KEYS: dict[str, dict[str, str]] = {
    "open-instruct": {"model": "model_name_or_path", "tokens": "pack_length", "learners": "num_learners_per_node",
                      "zero": "deepspeed_stage", "tp": "vllm_tensor_parallel_size",
                      "util": "vllm_gpu_memory_utilization", "offload": "deepspeed_offload_optimizer",
                      "timeout": "backend_timeout"},
    "verl": {"model": "actor_rollout_ref.model.path", "micro": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
             "nodes": "trainer.nnodes", "gpus": "trainer.n_gpus_per_node",
             "tp": "actor_rollout_ref.rollout.tensor_model_parallel_size",
             "util": "actor_rollout_ref.rollout.gpu_memory_utilization",
             "offload": "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
             "param_offload": "actor_rollout_ref.actor.fsdp_config.param_offload",
             "timeout": "actor_rollout_ref.nccl_timeout", "lora": "actor_rollout_ref.model.lora_rank",
             "prompt": "data.max_prompt_length", "response": "data.max_response_length"},
    "openrlhf": {"model": "actor.model_name_or_path", "micro": "train.micro_batch_size", "max_len": "data.max_len",
                 "nodes": "actor.num_nodes", "gpus": "actor.num_gpus_per_node", "zero": "ds.zero_stage",
                 "tp": "vllm.tensor_parallel_size", "util": "vllm.gpu_memory_utilization", "offload": "ds.adam_offload",
                 "lora": "ds.lora.rank", "sync": "vllm.sync_with_ray"},
    # A user's own script: its model in hpcrl's run-config key (its own flags are unknown; the rest
    # comes from plan.json, hpcrl/logs/diagnose_custom.py).
    "custom": {"model": "model"},
}
# open-instruct's logged arguments (`Args: name=value ...`, a YAML config echoed): name -> (key, default).
OI_DEFAULTS = {"tokens_per_gpu": ("pack_length", 10240), "zero_stage": ("deepspeed_stage", 3),
               "vllm_tp": ("vllm_tensor_parallel_size", 1), "vllm_util": ("vllm_gpu_memory_utilization", 0.9),
               "learner_gpus": ("num_learners_per_node", 8)}
ASK = {"model": "--model", "learner_gpus": "--learner-gpus", "tokens_per_gpu": "--tokens-per-gpu", "backend": "--backend"}


@dataclass
class Context:
    """The planner's inputs: given values, else the run's own (command line, plan.json), else defaults."""

    profile: ClusterProfile
    given: dict = field(default_factory=dict)
    text: str = ""
    assumptions: list[str] = field(default_factory=list)
    command: DriverCommand | None = None  # found in the log unless a run directory's job.sbatch gave it
    plan: dict | None = None  # the run's plan.json
    _values: dict = field(default_factory=dict)
    _config: Any = None

    def learn(self, text: str) -> None:
        """Read the log: its driver command line, unless the run's own was given."""
        self.text = text
        if self.command is None:
            self.command = find_command(text)
        if self.command and self.backend == self.command.backend:
            c = self.command
            # The names the planner reads first, then the rest as a count.
            wanted = set(KEYS[c.backend].values()) | {"ckpt.save_hf", "ckpt.max_num", "ckpt.disable_ds"}
            names = [r for r in c.renamed if r.split(" -> ")[-1].split()[0] in wanted]
            more = f"; {len(c.renamed) - len(names)} more" if len(c.renamed) > len(names) else ""
            self.assumptions.append(f"{c.backend} driver command read from {c.where}" + (
                f" (older OpenRLHF names read as their new ones: {'; '.join(names)}{more})" if c.renamed else ""))

    @property
    def backend(self) -> str | None:
        """The framework: --backend, else the driver command's, else plan.json's; None when nothing says."""
        if self.given.get("backend"):
            return self.given["backend"]
        if self.command:
            return self.command.backend
        if self.plan is not None:
            return self.plan.get("backend") or "open-instruct"
        return None

    @property
    def fix_backend(self) -> str:
        """The backend whose keys the fixes use (open-instruct when nothing says, stated once)."""
        if self.backend is None and "backend" not in self._values:
            self._values["backend"] = "open-instruct"
            self.assumptions.append("backend open-instruct: no driver command in the log (give --backend)")
        return self.backend or "open-instruct"

    def key(self, what: str) -> str:
        return KEYS[self.fix_backend].get(what, what)

    @property
    def args(self) -> dict:
        return dict(self.command.args) if self.command and self.command.backend == self.backend else {}

    # ------------------------------------------------------------------ values
    def get(self, name: str):  # noqa: ANN201 - int, float or str by name
        """A planner input by name (model, tokens_per_gpu, zero_stage, vllm_tp, vllm_util, learner_gpus)."""
        if name in self._values:
            return self._values[name]
        value = self.given.get(name)
        if value is None:  # open-instruct's logged arguments also when nothing says which framework ran
            value = self._from_run(name) if self.backend in ("verl", "openrlhf") else self._from_oi(name)
        self._values[name] = value
        return value

    def note(self, text: str) -> None:
        if text not in self.assumptions:
            self.assumptions.append(text)

    def _from_oi(self, name: str) -> Any:
        if name == "model" and (model := self.args.get("model_name_or_path") or (self.plan or {}).get("model")):
            self.note(f"{self.key('model')}={model} (from the {'run' if self.plan else 'log'})")
            return model
        key, default = ("model_name_or_path", None) if name == "model" else OI_DEFAULTS[name]
        if key in self.args:
            raw = self.args[key]
            value = sum(raw) if isinstance(raw, list) else raw
            self.note(f"{key}={raw} (from the driver command)")
            return value if name in ("model", "vllm_util") else int(value)
        m = re.search(rf"(?:--|\b){key}['\"]?(?:\s*[:=]\s*|\s+)['\"]?(\[[^\]]*\]|[\w./\-]+)", self.text)
        nums = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", m.group(1))] if m else []
        if m and (nums or name == "model"):
            value = m.group(1) if name == "model" else sum(nums) if name == "learner_gpus" else nums[0]
            self.note(f"{key}={m.group(1)} (from the log)")
            return value if name in ("model", "vllm_util") else int(value)
        if name == "model":
            self.note("model unknown: the log does not name it (give --model)")
            return None
        self.note(f"{key}={default} (default; not in the log)")
        return default

    def _from_run(self, name: str) -> Any:
        """verl's or OpenRLHF's value: from the driver command, else the framework's default."""
        b, keys = self.fix_backend, KEYS[self.fix_backend]
        if name == "model":
            model = self.args.get(keys["model"]) or (self.plan or {}).get("model")
            self.note(f"{keys['model']}={model} (from the {'driver command' if self.args else 'run'})" if model else
                       f"model unknown: no {keys['model']} in the log (give --model)")
            return model
        w = self.workload()
        if name == "tokens_per_gpu":
            return w.pack_length if w else None
        if name == "learner_gpus":
            return self.arg("nodes") * self.arg("gpus")
        if name == "zero_stage":
            return 3 if b == "verl" else int(self.arg("zero"))
        return self.arg("tp" if name == "vllm_tp" else "util")

    def arg(self, what: str) -> Any:
        """A backend key's value from the driver command, else the framework's default (stated)."""
        key = KEYS[self.fix_backend][what]
        if key in self.args:
            self.note(f"{key}={self.args[key]} (from the driver command)")
            return self.args[key]
        from hpcrl.planning.backends import get_backend

        value = get_backend(self.fix_backend).arg(self.config(), key)  # type: ignore[attr-defined]
        self.note(f"{key}={value} ({self.fix_backend}'s default; not in the log)")
        return value

    def config_value(self, key: str) -> Any:
        """Any of the backend's keys: the driver command's value, else the framework's default."""
        if key in self.args:
            return self.args[key]
        from hpcrl.planning.backends import get_backend

        return get_backend(self.fix_backend).arg(self.config(), key)  # type: ignore[attr-defined]

    def spec(self) -> ModelSpec | None:
        """The model, or None when it is unknown or not one hpcrl can size (said in the assumptions)."""
        name = self.get("model")
        if not name:
            return None
        try:
            return resolve_model(str(name))
        except HpcrlError:
            self.note(f"model {name!r} is not in hpcrl's catalog nor a readable config.json (give --model with a "
                       "catalog name or the model's config.json)")
            return None

    def config(self):  # noqa: ANN201 - RunConfig
        """The run as a run config of its backend (for the backend's own reading and planner)."""
        if self._config is None:
            from hpcrl.planning.config import HpcrlSection, RunConfig

            args = self.args
            # hpcrl plans critic-free runs (GRPO); the frameworks' own default estimator is PPO's gae.
            est, grpo = {"verl": ("algorithm.adv_estimator", "grpo"),
                         "openrlhf": ("algo.advantage.estimator", "group_norm")}.get(self.fix_backend, (None, None))
            if est and est not in args:
                args[est] = grpo
                self.note(f"{est}={grpo} (not in the log; a critic-free run assumed)")
            if self.fix_backend == "openrlhf" and not (args.get("reward.remote_url") or args.get("train.agent_func_path")
                                                       or args.get("reward.model_name_or_path")):
                args["reward.remote_url"] = "reward_func.py"  # a reward function: no reward-model GPUs to plan
            self._config = RunConfig(hpcrl=HpcrlSection(backend=self.fix_backend), args=args)
        return self._config

    def workload(self):  # noqa: ANN201 - Workload | None
        """The backend's reading of the run (its defaults where the log says nothing); None when it cannot."""
        if "workload" not in self._values:
            spec = self.spec()
            w = None
            if spec is not None:
                from hpcrl.planning.backends import get_backend

                try:
                    w = get_backend(self.fix_backend).workload_from_config(self.config(), spec.name)
                except HpcrlError as exc:
                    self.note(f"cannot plan this run: {exc}")
                if w is not None and self.given.get("tokens_per_gpu"):
                    from dataclasses import replace

                    w = replace(w, pack_length=int(self.given["tokens_per_gpu"]))
            self._values["workload"] = w
        return self._values["workload"]

    def missing(self) -> str:
        """The flags to give for what the log does not say."""
        if self.backend == "custom":  # the rest comes from the run's plan.json
            return ASK["model"]
        want = ["model"] + (["backend"] if self.backend is None else []) + ["learner_gpus", "tokens_per_gpu"]
        return ", ".join(ASK[k] for k in want if not self.given.get(k))


__all__ = ["KEYS", "Context"]
