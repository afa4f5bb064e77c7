"""plan, render and submit take one request down one path: submit takes every option render takes,
plan refuses what render refuses with the same words, and `submit --dry-run` writes the script
render prints for the same options."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from hpcrl.cli.app import app
from hpcrl.cli.commands import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
# Only render's destination: submit writes its script into the run directory instead.
RENDER_OUTPUT = {"--output", "-o"}


def _options(command: str) -> set[str]:
    """Every option string `hpcrl COMMAND` accepts, as click parses them."""
    importlib.import_module(f"hpcrl.cli.cmd_{COMMANDS[command]}")
    cmd = typer.main.get_command(app).commands[command]
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}


def test_submit_takes_every_option_render_takes():
    assert _options("render") - RENDER_OUTPUT - _options("submit") == set()


def test_plan_takes_every_option_that_shapes_renders_plan():
    assert _options("render") - RENDER_OUTPUT - {"--smoke"} - _options("plan") == set()


@pytest.fixture
def hpcrl(tmp_path):
    """`hpcrl(*args)`: this checkout's CLI, shipped profiles only, run in an empty directory."""
    env = {k: v for k, v in os.environ.items() if k != "HPCRL_CLUSTERS_DIR"}
    env.update(PYTHONPATH=str(ROOT), XDG_CONFIG_HOME=str(tmp_path / "xdg"), COLUMNS="200")
    work = tmp_path / "work"
    work.mkdir()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, env=env, cwd=work, timeout=120
        )

    return run


def profile_file(tmp_path: Path, name: str, extra: str) -> Path:
    """A profile file that extends the shipped local-dev with its own run root and `extra` YAML."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nextends: local-dev\nstorage:\n  run_root:\n    path: /tmp/hpcrl-runs-{name}\n{extra}"
    )
    return path


# One refusal from each stage of the path, and words the refusal must carry.
REFUSALS = {
    # The backend refuses a key it cannot honour when the config is planned.
    "config": (
        ["--config", "grpo-olmo3-7b", "--cluster", "local-dev", "--nodes", "2", "--set", "use_peft=true"],
        "open-instruct does not implement LoRA",
    ),
    # The disk budget, against the quota of a profile file.
    "disk": (
        ["--config", "grpo-olmo3-7b", "--cluster-file", "{small}", "--nodes", "2"],
        "the run root's quota is 50 GiB",
    ),
    # The script's own check of a Slurm value.
    "script": (
        ["--config", "grpo-olmo3-7b", "--cluster", "local-dev", "--nodes", "2", "--set", "hpcrl.qos=a b"],
        "hpcrl.qos 'a b': not a valid Slurm value",
    ),
}


@pytest.mark.parametrize("stage", list(REFUSALS))
def test_plan_refuses_what_render_refuses_with_the_same_message(stage, hpcrl, tmp_path):
    # A 50 GiB run root: a 7B run's checkpoints cannot fit it.
    small = profile_file(tmp_path, "local-small", "    quota_gib: 50\n")
    args, words = REFUSALS[stage]
    args = [a.format(small=small) for a in args]
    render = hpcrl("render", *args)
    assert render.returncode == 2 and words in render.stderr, render.stderr  # the case is a refusal at all
    plan = hpcrl("plan", *args)
    assert (plan.returncode, plan.stderr) == (2, render.stderr)


SAME_SCRIPT = {
    "cluster": ["--config", "grpo-olmo3-7b", "--cluster", "local-dev", "--nodes", "3", "--pin", "tp=2"],
    "cluster-file": ["--config", "grpo-olmo3-7b", "--cluster-file", "{other}", "--nodes", "2"],
    "over-limit": ["--config", "grpo-olmo3-7b", "--cluster", "local-dev", "--nodes", "5", "--allow-over-limit"],
    "smoke-gpus": [
        "--config",
        "grpo-olmo3-7b",
        "--cluster",
        "local-dev",
        "--nodes",
        "1",
        "--gpus",
        "3",
        "--smoke",
        "--set",
        "hpcrl.run_name=part-node",
    ],
}


@pytest.mark.parametrize("case", list(SAME_SCRIPT))
def test_submit_dry_run_writes_the_script_render_prints(case, hpcrl, tmp_path):
    # Renders differently from the shipped local-dev: another run root and environment.
    other = profile_file(tmp_path, "local-other", "env:\n  HPCRL_TEST_MARK: from-the-profile-file\n")
    args = [a.format(other=other) for a in SAME_SCRIPT[case]]
    render = hpcrl("render", *args)
    assert render.returncode == 0, render.stderr
    sub = hpcrl("submit", "--dry-run", "--json", "--registry", str(tmp_path / "registry.db"), *args)
    assert sub.returncode == 0, sub.stderr
    assert Path(json.loads(sub.stdout)["script"]).read_text() == render.stdout
