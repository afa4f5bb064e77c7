"""What `hpcrl diagnose` knows about the run behind a log, and where each fact came from (pure).

In order: a value given on the command line (--model, --learner-gpus, ...); the run's own driver
command (job.sbatch of a run directory, else the command line in the log, read per backend by
hpcrl.logs.driver_cmdline); the framework's logged arguments; the framework's default. What each
framework logs and which keys the fixes change are the backend's (DiagnoseFacts,
hpcrl/planning/backends/log_facts.py). A model is
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
from hpcrl.planning.backends import get_backend
from hpcrl.planning.backends.log_facts import DiagnoseFacts, default_backend
from hpcrl.profiles import ClusterProfile

# The backend a log is read as when nothing says which framework ran: the run config's default.
DEFAULT_BACKEND = default_backend()
ASK = {
    "model": "--model",
    "learner_gpus": "--learner-gpus",
    "tokens_per_gpu": "--tokens-per-gpu",
    "backend": "--backend",
}


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
            c, b = self.command, get_backend(self.command.backend)
            # The names diagnose reads first, then the rest as a count.
            wanted = set(b.diagnose_facts.keys.values())
            names = [r for r in c.renamed if r.split(" -> ")[-1].split()[0] in wanted]
            more = f"; {len(c.renamed) - len(names)} more" if len(c.renamed) > len(names) else ""
            self.assumptions.append(
                f"{c.backend} driver command read from {c.where}"
                + (
                    f" (older {b.command_facts.framework} names read as their new ones: {'; '.join(names)}{more})"
                    if c.renamed
                    else ""
                )
            )

    @property
    def backend(self) -> str | None:
        """The framework: --backend, else the driver command's, else plan.json's; None when nothing says."""
        if self.given.get("backend"):
            return self.given["backend"]
        if self.command:
            return self.command.backend
        if self.plan is not None:
            return self.plan.get("backend") or DEFAULT_BACKEND
        return None

    @property
    def log_backend(self) -> str | None:
        """The framework whose log format the log is read in: --backend, else the driver command's, else the one
        plan.json names; None when nothing names one (then every backend's format is read)."""
        if self.given.get("backend"):
            return str(self.given["backend"])
        if self.command:
            return self.command.backend
        return str(self.plan["backend"]) if self.plan and self.plan.get("backend") else None

    @property
    def fix_backend(self) -> str:
        """The backend whose keys the fixes use (the default backend when nothing says, stated once)."""
        if self.backend is None and "backend" not in self._values:
            self._values["backend"] = DEFAULT_BACKEND
            self.assumptions.append(f"backend {DEFAULT_BACKEND}: no driver command in the log (give --backend)")
        return self.backend or DEFAULT_BACKEND

    @property
    def facts(self) -> DiagnoseFacts:
        """What the fixes' backend logs and which of its keys the fixes change."""
        return get_backend(self.fix_backend).diagnose_facts

    def key(self, what: str) -> str:
        return self.facts.keys.get(what, what)

    @property
    def args(self) -> dict:
        return dict(self.command.args) if self.command and self.command.backend == self.backend else {}

    # ------------------------------------------------------------------ values
    def get(self, name: str):  # noqa: ANN201 - int, float or str by name
        """A planner input by name (model, tokens_per_gpu, zero_stage, vllm_tp, vllm_util, learner_gpus)."""
        if name in self._values:
            return self._values[name]
        value = self.given.get(name)
        if value is None:  # the default backend's logged arguments also when nothing says which framework ran
            reads = get_backend(self.backend).diagnose_facts.values_from if self.backend else "logged"
            value = self._from_run(name) if reads == "command" else self._from_logged(name)
        self._values[name] = value
        return value

    def note(self, text: str) -> None:
        if text not in self.assumptions:
            self.assumptions.append(text)

    def _from_logged(self, name: str) -> Any:
        logged = (
            get_backend(self.backend or DEFAULT_BACKEND).diagnose_facts.logged
            or get_backend(DEFAULT_BACKEND).diagnose_facts.logged
        )
        if name == "model" and (model := self.args.get(logged["model"][0]) or (self.plan or {}).get("model")):
            self.note(f"{self.key('model')}={model} (from the {'run' if self.plan else 'log'})")
            return model
        key, default = logged[name]
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
        """A value from the driver command, else the framework's default."""
        keys = self.facts.keys
        if name == "model":
            model = self.args.get(keys["model"]) or (self.plan or {}).get("model")
            self.note(
                f"{keys['model']}={model} (from the {'driver command' if self.args else 'run'})"
                if model
                else f"model unknown: no {keys['model']} in the log (give --model)"
            )
            return model
        w = self.workload()
        if name == "tokens_per_gpu":
            return w.pack_length if w else None
        if name == "learner_gpus":
            return self.arg("nodes") * self.arg("gpus")
        if name == "zero_stage":
            fixed = self.facts.fixed_zero_stage
            return fixed if fixed is not None else int(self.arg("zero"))
        return self.arg("tp" if name == "vllm_tp" else "util")

    def arg(self, what: str) -> Any:
        """A backend key's value from the driver command, else the framework's default (stated)."""
        key = self.facts.keys[what]
        if key in self.args:
            self.note(f"{key}={self.args[key]} (from the driver command)")
            return self.args[key]
        value = get_backend(self.fix_backend).arg(self.config(), key)  # type: ignore[attr-defined]
        self.note(f"{key}={value} ({self.fix_backend}'s default; not in the log)")
        return value

    def config_value(self, key: str) -> Any:
        """Any of the backend's keys: the driver command's value, else the framework's default."""
        if key in self.args:
            return self.args[key]
        return get_backend(self.fix_backend).arg(self.config(), key)  # type: ignore[attr-defined]

    def spec(self) -> ModelSpec | None:
        """The model, or None when it is unknown or not one hpcrl can size (said in the assumptions)."""
        name = self.get("model")
        if not name:
            return None
        try:
            return resolve_model(str(name))
        except HpcrlError:
            self.note(
                f"model {name!r} is not in hpcrl's catalog nor a readable config.json (give --model with a "
                "catalog name or the model's config.json)"
            )
            return None

    def config(self):  # noqa: ANN201 - RunConfig
        """The run as a run config of its backend (for the backend's own reading and planner)."""
        if self._config is None:
            from hpcrl.planning.config import HpcrlSection, RunConfig

            args, f = self.args, self.facts
            # hpcrl plans critic-free runs (GRPO); the frameworks' own default estimator is PPO's gae.
            if f.critic_free and (est := f.critic_free[0]) not in args:
                args[est] = f.critic_free[1]
                self.note(f"{est}={f.critic_free[1]} (not in the log; a critic-free run assumed)")
            if f.reward_stand_in and not any(args.get(k) for k in f.reward_sources):
                args[f.reward_stand_in[0]] = f.reward_stand_in[1]  # a reward function: no reward-model GPUs to plan
            version = next((v for path, v in f.version_marks if path in self.text), None)
            if version is not None:
                self.note(
                    f"{self.fix_backend} {version}: the log's traceback runs through a file only that version has"
                )
            self._config = RunConfig(hpcrl=HpcrlSection(backend=self.fix_backend, framework_version=version), args=args)
        return self._config

    def workload(self):  # noqa: ANN201 - Workload | None
        """The backend's reading of the run (its defaults where the log says nothing); None when it cannot."""
        if "workload" not in self._values:
            spec = self.spec()
            w = None
            if spec is not None:
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
        if self.backend and get_backend(self.backend).diagnose_facts.learner_fixes == "planned":  # from plan.json
            return ASK["model"]
        want = ["model"] + (["backend"] if self.backend is None else []) + ["learner_gpus", "tokens_per_gpu"]
        return ", ".join(ASK[k] for k in want if not self.given.get(k))


__all__ = ["DEFAULT_BACKEND", "Context"]
