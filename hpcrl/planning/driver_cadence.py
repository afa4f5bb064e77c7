"""The checkpoint interval as the job script carries it: a shell variable each job may reset (pure).

The frameworks read their checkpoint interval from the driver's command line (a flag, a Hydra
override, or the custom backend's environment), and a continuation runs the same script, so the
interval word becomes "$CKPT_EVERY": the plan's value, replaced at the job's start by what the
chain's earlier jobs measured (hpcrl/runtime/step_cadence.py). plan.json's `cadence` holds what
that needs to call plan_cadence again: the plan's interval and every input but the step.
"""

from __future__ import annotations

from typing import Any

from dataclasses import asdict

from hpcrl.planning.backends.base import DriverLine, Word
from hpcrl.planning.cadence import ASSUMED_WRITE_GIB_S
from hpcrl.planning.job_spec import ShellWord
from hpcrl.planning.run_types import RunPlan

VAR = "CKPT_EVERY"


def adjustable_every(rp: RunPlan) -> int | None:
    """The planned interval a later job may replace; None when the config pins it or nothing was planned."""
    c = rp.cadence
    return c.every_steps if c is not None and not c.pinned else None


def shell_word(word: Word) -> ShellWord:
    """A driver word as the job description holds it, checked to be one the script can carry."""
    word.shell()  # raises on a run-dir word with characters a double-quoted word cannot carry
    return ShellWord(text=word.text, expand=word.run_dir)


def interval_words(rp: RunPlan, lines: list[DriverLine]) -> tuple[tuple[tuple[ShellWord, ...], ...], bool]:
    """The driver's lines with the planned interval as "$CKPT_EVERY", and whether one was."""
    every, key, found = adjustable_every(rp), rp.backend.checkpoint_key, False
    hydra = rp.backend.command_facts.style == "hydra"
    out = []
    for line in lines:
        words = [shell_word(w) for w in line]
        texts = [w.text for w in line]
        if every is not None and not found:
            if not hydra and texts == [f"--{key}", str(every)]:
                words[1], found = ShellWord(text=f"${VAR}", expand=True), True
            elif hydra and texts == [f"{key}={every}"]:
                words[0], found = ShellWord(text=f"{key}=${VAR}", expand=True), True
        out.append(tuple(words))
    return tuple(out), found


def env_words(rp: RunPlan) -> tuple[tuple[tuple[str, ShellWord], ...], bool]:
    """The driver's environment, the interval's variable as "$CKPT_EVERY"; and whether it was."""
    every, name = adjustable_every(rp), rp.backend.checkpoint_env
    out, found = [], False
    for k, v in sorted(rp.backend.env(rp).items()):
        if every is not None and k == name and v == str(every):
            out.append((k, ShellWord(text=f"${VAR}", expand=True)))
            found = True
        else:
            out.append((k, ShellWord(text=v)))
    return tuple(out), found


def cadence_record(rp: RunPlan) -> dict[str, Any] | None:
    """plan.json's `cadence`: the planned interval, the step it rests on, and plan_cadence's other inputs."""
    c = rp.cadence
    if c is None:
        return None
    model = {k: v for k, v in asdict(rp.workload.model).items() if k != "sources"}
    return {
        "key": rp.backend.checkpoint_key,
        "every_steps": c.every_steps,
        "step_s": round(c.step_s, 3),
        "write_s": round(c.write_s, 3),
        "write_basis": "derived",
        "lead_s": c.lead_s,
        "pinned": c.pinned,
        "max_lost_minutes": rp.config.hpcrl.max_lost_minutes,
        "write_gib_s": rp.profile.storage.run_root.write_gib_s or ASSUMED_WRITE_GIB_S,
        "signal_floor_s": rp.profile.slurm.signal_before_end_s,
        "lora_rank": rp.workload.lora_rank,
        "model": model,
    }


__all__ = ["VAR", "adjustable_every", "cadence_record", "env_words", "interval_words", "shell_word"]
