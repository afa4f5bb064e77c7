"""A fifth backend's skeleton: the one module a new backend adds (tests/test_backend_plugin.py puts this
directory on the backends package's path, as if the file were hpcrl/planning/backends/toy.py)."""

from __future__ import annotations

from typing import Any

from hpcrl.errors import UnknownNameError
from hpcrl.models import resolve_model
from hpcrl.planning.backends.base import Backend, Planned, Word, cli_pins_into
from hpcrl.planning.backends.facts import DiskFacts, MemoryFacts
from hpcrl.planning.backends.log_facts import CommandFacts, DiagnoseFacts, LogFormat, SmokeFacts, TimingFacts
from hpcrl.planning.layout_advice import plan_layouts
from hpcrl.planning.disk_budget import Budget, DiskInputs, Item, cache_items, saves, trainable
from hpcrl.planning.layout import Workload

KEYS = {"model": "the policy model", "steps": "training steps", "save_every": "steps between checkpoints"}


def budget(s: DiskInputs) -> Budget:
    """One bf16 copy of the trained weights per save, all kept (the toy's own rule)."""
    n = saves(s.ckpt_every, s.total_steps)
    item = Item("state", "toy checkpoint", 2.0 * trainable(s), n, n or 1, "the toy's rule")
    extra, notes = cache_items(s, s.total_steps is not None, None)
    return Budget("toy", s, trainable(s), {"save_every": s.ckpt_every}, (item, *extra), tuple(notes))


def run_inputs(rp, value, base: DiskInputs) -> DiskInputs:
    return DiskInputs(**{**base.__dict__, "ckpt_every": int(value("save_every") or 100),
                         "total_steps": int(value("steps") or 1000), "keep": None})


class ToyBackend(Backend):
    name = "toy"
    label = "the toy trainer"
    default_entry_point = "toy.train"
    default_workdir = "$HOME"
    model_key = "model"
    layout_keys = ()
    run_dir_keys = ()
    flag_table = "tests (KEYS)"
    checkpoint_key = "save_every"
    checkpoint_marker = "checkpoints/latest"
    disk = DiskFacts(keys={"ckpt_every": "save_every"}, budget=budget, fixes=lambda b: [], run_inputs=run_inputs)
    # What every backend declares for itself (docs/backends.md, "Adding a backend").
    uses_ray = True
    entry_is_module = True
    memory = MemoryFacts()  # a DeepSpeed ZeRO learner, as the memory model's defaults describe
    layout_fixes = {"learners": "--pin learners={k}"}
    command_facts = CommandFacts(entry=r"toy\.train", package="toy")
    diagnose_facts = DiagnoseFacts(keys={"model": "model"})
    smoke_facts = SmokeFacts(placement="learner-spread", comment="place learners and engines apart")
    timing_facts = TimingFacts()  # the toy prints no timers
    log_format = LogFormat()  # nor step lines of its own

    def plan(self, cfg, profile, nodes, w, pins, variants) -> Planned:
        """Learners beside vLLM engines, as the shared planner lays them out."""
        return Planned(plan_layouts(profile, nodes, w, pins, variants, self.layout_fixes))

    def arg_table(self, section=None) -> dict[str, dict[str, Any]]:
        return {k: {"help": v} for k, v in KEYS.items()}

    def check_args(self, args: dict[str, Any], section) -> None:
        for key in args:
            if key not in KEYS:
                raise UnknownNameError("toy key", key, KEYS)

    def workload_from_config(self, cfg, model: str | None = None) -> Workload:
        return Workload(model=resolve_model(model or cfg.model_name), pack_length=4096, response_length=2048,
                        max_prompt_token_length=512)

    def pins_from(self, cfg, cli_pins=None):
        return cli_pins_into({}, cli_pins)

    def layout_args(self, rp) -> dict[str, Any]:
        lay = rp.layout
        return {"learners": lay.learner_gpus, "engines": lay.engines, "tp": lay.tp}

    def driver_command(self, rp):
        words = {**rp.config.args, **self.layout_args(rp)}
        return [(Word(f"--{k}"), Word(str(v))) for k, v in words.items()]

    def summary(self, rp) -> str:
        lay = rp.layout
        return f"{lay.learner_gpus} learners, {lay.engines} engines x TP {lay.tp}"


BACKEND = ToyBackend
