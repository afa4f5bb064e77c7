"""`hpcrl checkpoints list|prune` on a run directory laid out as open-instruct writes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcrl.errors import HpcrlError
from hpcrl.jobs.run_lookup import find_run_dir
from hpcrl.logs.checkpoints import apply_prune, find_checkpoints, plan_prune

OLD = time.time() - 3 * 3600  # settled three hours ago


def _file(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)


def _age(path: Path, when: float = OLD) -> None:
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files + dirs:
            os.utime(os.path.join(root, name), (when, when))
    os.utime(path, (when, when))


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """HF saves at steps 200-600 (complete) and 800 (being written: no marker); DeepSpeed state at
    50-100 (complete, `latest` = global_step100) and 150 (being written)."""
    run = tmp_path / "run"
    hf = run / "output_checkpoints"
    for step in (200, 400, 600):
        _file(hf / f"step_{step}" / "model-00001-of-00002.safetensors", 3000)
        _file(hf / f"step_{step}" / "model-00002-of-00002.safetensors", 1000)
        _file(hf / f"step_{step}" / ".checkpoint_complete", 0)
    _file(hf / "step_800" / "model-00001-of-00002.safetensors", 3000)
    st = run / "checkpoint_state"
    for step in (50, 100, 150):
        for rank in range(2):
            _file(st / f"global_step{step}" / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", 600)
            _file(st / f"global_step{step}" / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt", 100)
    (st / "latest").write_text("global_step100")
    _file(run / "output" / "model.safetensors", 4000)  # the final save: not a step_N, never listed or pruned
    _age(run)
    return run


def test_list_finds_both_series_with_sizes_and_completeness(run_dir):
    cps = find_checkpoints(run_dir)
    got = {(c.kind, c.step): (c.bytes, c.complete) for c in cps}
    assert got == {
        ("hf", 200): (4000, True),
        ("hf", 400): (4000, True),
        ("hf", 600): (4000, True),
        ("hf", 800): (3000, False),
        ("state", 50): (1400, True),
        ("state", 100): (1400, True),
        ("state", 150): (1400, False),
    }
    why = {(c.kind, c.step): c.why_incomplete for c in cps}
    assert ".checkpoint_complete" in why[("hf", 800)] and "latest" in why[("state", 150)]


def test_prune_keeps_newest_incomplete_and_n_newest_complete(run_dir):
    plan = plan_prune(find_checkpoints(run_dir), keep=1, now=time.time())
    assert sorted((c.kind, c.step) for c in plan.delete) == [("hf", 200), ("hf", 400), ("state", 50)]
    kept = {(c.kind, c.step): why for c, why in plan.keep}
    assert kept[("hf", 800)] == "newest" and kept[("state", 150)] == "newest"  # being written: untouched
    assert "newest complete" in kept[("hf", 600)] and "newest complete" in kept[("state", 100)]
    assert plan.freed_bytes == 4000 + 4000 + 1400


def test_recently_modified_checkpoints_are_kept(run_dir):
    _age(run_dir / "output_checkpoints" / "step_200", time.time())
    plan = plan_prune(find_checkpoints(run_dir), keep=1, now=time.time(), recent_s=600)
    assert ("hf", 200) not in {(c.kind, c.step) for c in plan.delete}
    assert any("modified" in why for c, why in plan.keep if c.step == 200)


def test_apply_deletes_only_what_was_planned_and_rechecks(run_dir):
    plan = plan_prune(find_checkpoints(run_dir), keep=1, now=time.time())
    # Between planning and deleting, step_400 is written to again: it must be left alone.
    _age(run_dir / "output_checkpoints" / "step_400", time.time())
    deleted = apply_prune(plan, time.time)
    assert sorted(p.name for p in deleted) == ["global_step50", "step_200"]
    assert (run_dir / "output_checkpoints" / "step_400").is_dir()
    left = {(c.kind, c.step) for c in find_checkpoints(run_dir)}
    assert left == {("hf", 400), ("hf", 600), ("hf", 800), ("state", 100), ("state", 150)}
    assert (run_dir / "checkpoint_state" / "latest").is_file() and (run_dir / "output").is_dir()


def test_keep_zero_and_bad_paths_are_user_errors(run_dir, tmp_path):
    with pytest.raises(HpcrlError, match="would delete every checkpoint"):
        plan_prune(find_checkpoints(run_dir), keep=0, now=time.time())
    with pytest.raises(HpcrlError, match="no such run directory"):
        find_run_dir(str(tmp_path / "nope"), require_hpcrl=False)


def hpcrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpcrl", "checkpoints", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "250", "NO_COLOR": "1", "PATH": "/usr/bin:/bin"},
    )


def test_cli_list_json(run_dir):
    proc = hpcrl("list", str(run_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["total_bytes"] == 3 * 4000 + 3000 + 3 * 1400
    assert [r["path"] for r in data["checkpoints"]][:2] == [
        "checkpoint_state/global_step50",
        "checkpoint_state/global_step100",
    ]


def test_cli_prune_is_a_dry_run_by_default(run_dir):
    proc = hpcrl("prune", str(run_dir), "--keep", "1")
    assert proc.returncode == 0, proc.stderr
    assert "would delete  output_checkpoints/step_200" in proc.stdout and "add --yes" in proc.stdout
    assert len(find_checkpoints(run_dir)) == 7


def test_cli_prune_yes_deletes(run_dir):
    proc = hpcrl("prune", str(run_dir), "--keep", "2", "--yes", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["deleted"] == ["output_checkpoints/step_200"]  # keep 2: 600, 400 (and 800, being written)
    assert not (run_dir / "output_checkpoints" / "step_200").exists()


def test_cli_errors_are_one_line(run_dir, tmp_path):
    for args in (["prune", str(run_dir), "--keep", "0"], ["list", str(tmp_path / "missing")]):
        proc = hpcrl(*args)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = hpcrl("prune", str(empty), "--keep", "1")
    assert proc.returncode == 0 and "nothing to prune" in proc.stdout


def test_cli_lists_areals_saves_and_recovery_state(tmp_path):
    """`hpcrl checkpoints list` on an AReaL run whose fileroot is the run directory (seed 002's layout):
    HF saves epoch0epochstep{S}globalstep{G} at console steps G+1 (no completion mark), and the recovery
    state, complete once recover_info/step_info.json is written after it (global_step 9: step 10)."""
    trial = tmp_path / "run" / "checkpoints" / "root" / "gsm8k-grpo" / "trial0"
    for g in (4, 9):
        _file(trial / "default" / f"epoch0epochstep{g}globalstep{g}" / "model.safetensors", 100)
    _file(trial / "default" / "recover_checkpoint" / "__0_0.distcp", 300)
    _age(tmp_path / "run")
    (trial / "recover_info").mkdir()
    (trial / "recover_info" / "step_info.json").write_text(
        json.dumps({"epoch": 0, "epoch_step": 9, "global_step": 9, "steps_per_epoch": 100})
    )
    proc = hpcrl("list", str(tmp_path / "run"), "--json")
    assert [(r["kind"], r["step"], r["complete"]) for r in json.loads(proc.stdout)["checkpoints"]] == [
        ("hf", 5, False),
        ("hf", 10, False),
        ("state", 10, True),
    ], proc.stderr
