"""A run's checkpoints: find them with their sizes, and prune old ones without touching live ones.

What open-instruct's grpo_fast.py writes (allenai/open-instruct e6c3044a):
* HF saves `{output_dir}_checkpoints/step_N/`; rank 0 touches `.checkpoint_complete` inside
  once the weights and tokenizer are written (CHECKPOINT_COMPLETE_MARKER, grpo_fast.py:159).
  Older versions wrote no marker, so their saves are listed as incomplete and never pruned.
* DeepSpeed state `checkpoint_state_dir/global_stepN/`; DeepSpeed writes the `latest` file
  (holding the tag, e.g. "global_step600") beside them after every rank's files are saved, so
  a global_step directory newer than `latest` names is still being written.

What AReaL writes (inclusionAI/AReaL 4aef98d8; 9af34d2b the same), under
`{fileroot}/checkpoints/{user}/{experiment}/{trial}/`:
* HF saves `default/epoch{E}epochstep{S}globalstep{G}/` (utils/saver.py:73), G the 0-based global
  step, so the step its console prints is G + 1 (utils/stats_logger.py:141). No completion mark:
  listed as incomplete, never pruned.
* The recovery state `default/recover_checkpoint/`, rewritten in place (utils/recover.py:342-359),
  then `recover_info/step_info.json` beside `default/` (recover.py:71,168-176, 256-270): the state
  is complete when that file is newer than everything in it; its step is global_step + 1.

What transformers' Trainer writes (5.17.0 trainer.py:3215-3275), for the trainers built on it: each save is
`{output_dir}/checkpoint-N/` (PREFIX_CHECKPOINT_DIR, N the global step): the model, then the optimizer (under
DeepSpeed its `global_stepN/` state inside), scheduler and RNG state, and `trainer_state.json` last
(TRAINER_STATE_NAME, trainer.py:245), which `train(resume_from_checkpoint=...)` reads first (:1509): the
checkpoint is complete once that file exists. `save_total_limit` rotates the older ones (:3270-3275).

A prune never deletes: the newest checkpoint of each series, one without its completion
mark, one modified within the last `recent_s` seconds, or anything but `step_N`,
`global_stepN` and `checkpoint-N` directories.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hpcrl.errors import HpcrlError

HF_MARKER = ".checkpoint_complete"
TRAINER_STATE = "trainer_state.json"
# (kind, directory name, what is added to its number to make the step the console shows)
SERIES = (
    ("hf", re.compile(r"^step_(\d+)$"), 0),
    ("state", re.compile(r"^global_step(\d+)$"), 0),
    ("hf", re.compile(r"^epoch\d+epochstep\d+globalstep(\d+)$"), 1),
    ("state", re.compile(r"^recover_checkpoint$"), 1),
    ("trainer", re.compile(r"^checkpoint-(\d+)$"), 0),
)
RECOVER_INFO = Path("..", "..", "recover_info", "step_info.json")  # from AReaL's recover_checkpoint
RECENT_S = 600.0
MAX_DEPTH = 6  # AReaL's saves lie six levels down when its fileroot is the run directory


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    kind: str  # "hf" or "state"
    step: int
    bytes: int
    modified: float  # newest mtime of the directory and everything in it
    complete: bool
    why_incomplete: str = ""

    @property
    def series(self) -> tuple[Path, str]:
        return (self.path.parent, self.kind)


def _size_and_mtime(path: Path) -> tuple[int, float]:
    total, newest = 0, path.lstat().st_mtime
    for root, dirs, files in os.walk(path):
        for name in files + dirs:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:  # removed while we looked
                continue
            newest = max(newest, st.st_mtime)
            if name in files:
                total += st.st_size
    return total, newest


def _latest_state_step(parent: Path) -> int | None:
    try:
        m = re.search(r"(\d+)", (parent / "latest").read_text())
    except OSError:
        return None
    return int(m.group(1)) if m else None


def _checkpoint(path: Path, kind: str, step: int) -> Checkpoint:
    size, modified = _size_and_mtime(path)
    if kind == "trainer":
        complete = (path / TRAINER_STATE).is_file()
        why = "" if complete else f"no {TRAINER_STATE} (being written, or the save failed)"
    elif kind == "hf":
        complete = (path / HF_MARKER).exists()
        why = "" if complete else f"no {HF_MARKER} (being written, failed, or written by a version without the marker)"
    elif path.name == "recover_checkpoint":
        info = path / RECOVER_INFO
        complete = info.is_file() and info.stat().st_mtime >= modified
        why = (
            ""
            if complete
            else (f"no {info.resolve()}" if not info.is_file() else "rewritten after its step_info.json: being written")
        )
    else:
        latest = _latest_state_step(path.parent)
        complete = latest is not None and step <= latest
        why = (
            ""
            if complete
            else (
                "no `latest` file beside it"
                if latest is None
                else f"newer than `latest` (global_step{latest}): being written"
            )
        )
    return Checkpoint(path, kind, step, size, modified, complete, why)


def _step(path: Path, m: re.Match) -> int:
    if m.groups():
        return int(m.group(1))
    try:  # AReaL's recovery state: its step is in step_info.json
        return int(json.loads((path / RECOVER_INFO).read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return -1


def find_checkpoints(run_dir: Path, max_depth: int = MAX_DEPTH) -> list[Checkpoint]:
    """Every step_N / global_stepN / checkpoint-N directory under run_dir (not inside one another), oldest first."""
    found: list[Checkpoint] = []

    def walk(d: Path, depth: int) -> None:
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            return
        for e in entries:
            if not e.is_dir(follow_symlinks=False):
                continue
            for kind, pattern, add in SERIES:
                if m := pattern.match(e.name):
                    found.append(_checkpoint(Path(e.path), kind, _step(Path(e.path), m) + add))
                    break
            else:
                if depth < max_depth:
                    walk(Path(e.path), depth + 1)

    walk(run_dir, 1)
    return sorted(found, key=lambda c: (str(c.path.parent), c.kind, c.step))


@dataclass
class PrunePlan:
    delete: list[Checkpoint] = field(default_factory=list)
    keep: list[tuple[Checkpoint, str]] = field(default_factory=list)

    @property
    def freed_bytes(self) -> int:
        return sum(c.bytes for c in self.delete)


def plan_prune(checkpoints: list[Checkpoint], keep: int, now: float, recent_s: float = RECENT_S) -> PrunePlan:
    """Keep the `keep` newest complete checkpoints of each series; delete the other complete, settled ones."""
    if keep < 1:
        raise HpcrlError(f"--keep {keep} would delete every checkpoint of the run; keep at least 1")
    plan = PrunePlan()
    series: dict[tuple[Path, str], list[Checkpoint]] = {}
    for c in checkpoints:
        series.setdefault(c.series, []).append(c)
    for members in series.values():
        members = sorted(members, key=lambda c: c.step, reverse=True)
        kept_complete = 0
        for i, c in enumerate(members):
            age = now - c.modified
            if i == 0:
                plan.keep.append((c, "newest"))
            elif not c.complete:
                plan.keep.append((c, f"incomplete: {c.why_incomplete}"))
                continue
            elif age < recent_s:
                plan.keep.append((c, f"modified {age:.0f} s ago"))
            elif kept_complete < keep:
                plan.keep.append((c, f"one of the {keep} newest complete"))
            else:
                plan.delete.append(c)
                continue
            kept_complete += c.complete
        if all(c in plan.delete for c in members):  # a guard: the newest is always kept above
            raise HpcrlError(f"pruning would delete every checkpoint in {members[0].path.parent}; nothing deleted")
    return plan


def apply_prune(plan: PrunePlan, now_fn: Callable[[], float], recent_s: float = RECENT_S) -> list[Path]:
    """Delete what the plan says, re-checking each directory just before; returns what was deleted."""
    deleted: list[Path] = []
    for c in plan.delete:
        fresh = _checkpoint(c.path, c.kind, c.step) if c.path.is_dir() else None
        if fresh is None or not fresh.complete or now_fn() - fresh.modified < recent_s:
            continue  # changed since the plan was made: leave it
        try:
            shutil.rmtree(c.path)
        except OSError as exc:  # a read-only or failing file system: say what was and was not deleted
            done = f"deleted before it: {', '.join(p.name for p in deleted)}" if deleted else "nothing was deleted"
            raise HpcrlError(f"cannot delete {c.path}: {exc.strerror or exc}; {done}") from None
        deleted.append(c.path)
    return deleted
