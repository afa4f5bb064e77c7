"""Reading commands (report, runs, status, diagnose, plan, plan-memory, plan-disk, watch) create nothing:
no registry database, no data, cache or config directories, no file in the working directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

READ_ONLY = [
    ["runs"],
    ["runs", "--json"],
    ["status"],
    ["report", "some-run"],
    ["report", "{run_dir}"],
    ["diagnose", "{log}"],
    ["diagnose", "{run_dir}"],
    ["plan", "--nodes", "16"],
    ["plan", "--nodes", "16", "--json"],
    ["plan-memory"],
    ["plan-memory", "--config", "grpo-olmo3-7b"],
    ["plan-disk"],
    ["plan-disk", "--config", "grpo-olmo3-7b"],
    ["clusters", "list"],
    ["watch", "{run_dir}", "--once"],
    ["watch", "{run_dir}", "--json"],
    ["watch", "--once"],
]
# The reading commands that end in a user error (exit 2, one line) here, and the words of that line; every
# other one succeeds (exit 0).
USER_ERRORS = {
    ("report", "some-run"): "no registry",  # no run recorded yet
    ("watch", "--once"): "no registry",  # no run to default to
}


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def empty_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("HPCRL_REGISTRY", "HPCRL_CACHE_DIR")}
    env.update(
        HOME=str(home),
        XDG_DATA_HOME=str(home / ".local/share"),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_STATE_HOME=str(home / ".local/state"),
    )
    run_dir = tmp_path / "outside" / "run"
    (run_dir / "hpcrl").mkdir(parents=True)
    (run_dir / "logs").mkdir()
    log = run_dir / "logs" / "job-1.log"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return env, home, cwd, {"run_dir": str(run_dir), "log": str(log)}


@pytest.mark.parametrize("args", READ_ONLY, ids=[" ".join(a) for a in READ_ONLY])
def test_reading_command_creates_nothing(empty_home, args):
    env, home, cwd, paths = empty_home
    before = _files(cwd.parent)
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", *(a.format(**paths) for a in args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    error = USER_ERRORS.get(tuple(args))
    assert out.returncode == (2 if error else 0), out.stderr
    if error:
        assert len(out.stderr.splitlines()) == 1 and error in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert _files(cwd.parent) == before, f"hpcrl {' '.join(args)} created {set(_files(cwd.parent)) - set(before)}"


def test_the_check_sees_a_created_registry(empty_home):
    """submit --dry-run records the run, so it does create the registry: the check above can fail."""
    env, home, cwd, _ = empty_home
    script = cwd.parent / "outside" / "job.sbatch"
    script.write_text(f"#!/bin/bash\nRUN_DIR={cwd.parent / 'outside' / 'dry'}\necho hi\n")
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", "submit", "--dry-run", str(script)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert any(p.name == "runs.db" for p in home.rglob("*"))


def test_unknown_run_without_a_registry_says_so(empty_home):
    env, home, cwd, _ = empty_home
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", "report", "some-run"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "unknown run 'some-run': no registry at " in out.stderr
    assert out.stderr.count("\n") == 1
