"""The run's measured step and checkpoint-write times, `hpcrl/step-times.jsonl` (pure).

The watchdog (hpcrl/runtime/watchdog.py) feeds a StepClock every step it parses and every line
the driver prints; the clock returns the records it appends to the file, one JSON object a line:

  {"kind": "step", "job": "812", "step": 7, "time": 1764190000.2, "wall_s": 31.0, "step_s": 30.2,
   "generation_s": 12.1, "training_s": 17.5}
  {"kind": "checkpoint", "job": "812", "step": 7, "time": 1764190012.6, "write_s": 12.3, "source": "line"}

and the job script's tool adds each job's checkpoint interval before its driver starts
(hpcrl/runtime/step_cadence.py): {"kind": "interval", "job": "813", "every_steps": 8, "planned": 33, "why": ...}.

`wall_s` is the watchdog's own clock between two step lines of one job (None for a job's first
step: it includes the start-up); `step_s`, `generation_s`, `training_s` are the framework's own
timers where its backend names the metric (TimingFacts in hpcrl/planning/backends/log_facts.py),
else None. A checkpoint write is timed by the framework's timer line (`line`), its metric
(`metric`), or the rewrite of its checkpoint marker after the step line (`marker`). `hpcrl report`
and the next job of the chain (hpcrl/runtime/step_cadence.py) read the file with `summarize`.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from hpcrl.logs.driver_log import Step


def _first(step: Step, keys: tuple[str, ...]) -> float | None:
    return next((step.values[k] for k in keys if k in step.values), None)


class StepClock:
    """Turns parsed steps and log lines into step-times.jsonl records (no files, no clock of its own)."""

    def __init__(
        self,
        job: str,
        *,
        step_keys: tuple[str, ...] = (),
        generation_keys: tuple[str, ...] = (),
        training_keys: tuple[str, ...] = (),
        checkpoint_keys: tuple[str, ...] = (),
        checkpoint_line: str | None = None,
    ) -> None:
        self.job = job
        self.step_keys, self.generation_keys, self.training_keys = step_keys, generation_keys, training_keys
        self.checkpoint_keys = checkpoint_keys
        self.checkpoint_line = re.compile(checkpoint_line) if checkpoint_line else None
        self.last_step: int | None = None
        self.last_time: float | None = None  # when the last step line arrived

    def step(self, step: Step, now: float) -> list[dict]:
        """The step's record, and a checkpoint record when the step's metrics time a write."""
        rec = {
            "kind": "step",
            "job": self.job,
            "step": step.number,
            "time": round(now, 3),
            "wall_s": None if self.last_time is None else round(now - self.last_time, 3),
            "step_s": _first(step, self.step_keys),
            "generation_s": _first(step, self.generation_keys),
            "training_s": _first(step, self.training_keys),
        }
        self.last_step, self.last_time = step.number, now
        out = [rec]
        write = _first(step, self.checkpoint_keys)
        if write:  # verl's timer key appears on the steps that saved
            out.append(self._checkpoint(write, now, "metric"))
        return out

    def line(self, text: str, now: float) -> dict | None:
        """A checkpoint record when `text` is the framework's checkpoint timer line."""
        m = self.checkpoint_line.search(text) if self.checkpoint_line else None
        return self._checkpoint(float(m.group("s")), now, "line") if m else None

    def marker(self, mtime: float) -> dict | None:
        """A checkpoint record for a marker rewritten at `mtime`, timed from the step line before it."""
        if self.last_time is None or mtime < self.last_time:
            return None
        return self._checkpoint(mtime - self.last_time, mtime, "marker")

    def _checkpoint(self, write_s: float, now: float, source: str) -> dict:
        return {
            "kind": "checkpoint",
            "job": self.job,
            "step": self.last_step,
            "time": round(now, 3),
            "write_s": round(write_s, 3),
            "source": source,
        }


def read_records(path: Path) -> list[dict]:
    """Every well-formed record of a step-times.jsonl; a torn or foreign line is skipped."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("kind") in ("step", "checkpoint", "interval"):
            out.append(rec)
    return out


def step_seconds(rec: dict) -> tuple[float | None, str]:
    """A step record's time and where it comes from: the framework's timer, else the watchdog's clock."""
    if rec.get("step_s") is not None:
        return float(rec["step_s"]), "framework"
    if rec.get("wall_s") is not None:
        return float(rec["wall_s"]), "watchdog"
    return None, ""


def _spread(values: list[float]) -> dict | None:
    if not values:
        return None
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "n": len(values),
    }


def summarize(records: list[dict], jobs: set[str] | None = None) -> dict:
    """Median, min and max of the step, generation, training and checkpoint-write times (of `jobs` only,
    when given). The step's source is the framework's timer when any step has one, else the watchdog's."""
    recs = [r for r in records if jobs is None or str(r.get("job")) in jobs]
    steps = [r for r in recs if r["kind"] == "step"]
    timed = [(s, src) for s, src in map(step_seconds, steps) if s is not None]
    source = "framework" if any(src == "framework" for _, src in timed) else ("watchdog" if timed else None)
    writes = [float(r["write_s"]) for r in recs if r["kind"] == "checkpoint" and r.get("write_s") is not None]
    return {
        "steps": len(steps),
        "step_s": _spread([s for s, src in timed if src == source]),
        "step_source": source,
        "generation_s": _spread([float(r["generation_s"]) for r in steps if r.get("generation_s") is not None]),
        "training_s": _spread([float(r["training_s"]) for r in steps if r.get("training_s") is not None]),
        "checkpoint_write_s": _spread(writes),
        "checkpoint_sources": sorted({r.get("source") for r in recs if r["kind"] == "checkpoint"} - {None}),
    }


def lost_at_stop(records: list[dict], job: str, stop: float) -> dict | None:
    """The training a job lost when it stopped at `stop` (epoch seconds): from its last checkpoint write
    (else its first step line) to the stop, and the steps completed after that checkpoint."""
    mine = [r for r in records if str(r.get("job")) == job]
    steps = [r for r in mine if r["kind"] == "step"]
    if not steps:
        return None
    ckpts = [r for r in mine if r["kind"] == "checkpoint"]
    last = steps[-1]["step"]
    if ckpts:
        since, ckpt_step = float(ckpts[-1]["time"]), ckpts[-1]["step"]
        lost_steps = last - ckpt_step if isinstance(last, int) and isinstance(ckpt_step, int) else None
    else:
        since, ckpt_step, lost_steps = float(steps[0]["time"]), None, len(steps)
    return {
        "job": job,
        "last_step": last,
        "checkpoint_step": ckpt_step,
        "steps_lost": lost_steps,
        "lost_s": round(max(stop - since, 0.0), 3),
        "since": "checkpoint" if ckpts else "first step line",
    }


__all__ = ["StepClock", "lost_at_stop", "read_records", "step_seconds", "summarize"]
