"""The tolerant stack check (issue 35 item 2) and a check that only decides what it can know (issue 38 item 4).

Stand-in environments made here: a folder on PYTHONPATH with each distribution's metadata (the release versions
the test names) and an empty package per module that raises if imported (the check imports none of them); verl's
parser is a Hydra config stand-in holding the keys the test's overrides touch. The training Python is a shell
wrapper around this interpreter where the test needs one that is slow, chatty, leaves a helper behind, or lives
under a path with a space or a quote. Expected lines come from the release facts (data/verl/0.9.1/stack.json,
read from the wheel's METADATA) and the cases made here, not from the check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcrl.planning.backends import stack_expect
from hpcrl.runtime.stack import STACK_MISMATCH_EXIT, STACK_UNCHECKED_EXIT, pick_table

ROOT = Path(__file__).resolve().parents[1]
MODULES = {
    "verl": "verl",
    "TransferQueue": "transfer_queue",
    "ray": "ray",
    "vllm": "vllm",
    "torch": "torch",
    "transformers": "transformers",
}
# What `pip install "verl[vllm]==0.9.1"` leaves (its METADATA: vllm==0.24.0 :81, torch==2.11.0 :78,
# transformers==5.9.0 :83, TransferQueue>=0.1.10 :41), with a Ray above hpcrl's 2.52 floor.
VERL_091 = {
    "verl": "0.9.1",
    "TransferQueue": "0.1.10",
    "ray": "2.55.0",
    "vllm": "0.24.0",
    "torch": "2.11.0",
    "transformers": "5.9.0",
}
PPO_TRAINER = "trainer:\n  use_v1: true\n  nnodes: 1\n"


def site(tmp_path: Path, dists: dict[str, str]) -> Path:
    root = tmp_path / "site"
    for name, version in dists.items():
        info = root / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (root / MODULES[name]).mkdir(exist_ok=True)
        (root / MODULES[name] / "__init__.py").write_text("raise ImportError('the stack check must not import me')\n")
    if "verl" in dists:
        (root / "verl" / "trainer" / "config").mkdir(parents=True)
        (root / "verl" / "trainer" / "config" / "ppo_trainer.yaml").write_text(PPO_TRAINER)
    return root


def wrapper(path: Path, body: str) -> str:
    """A 'training Python' at `path`: a shell script that runs this interpreter as `body` says."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def check(
    site_dir: Path, expect: dict, *argv: str, python: str = sys.executable, probe_timeout: float | None = None
) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=f"{site_dir}{os.pathsep}{ROOT}")
    extra = ["--probe-timeout", str(probe_timeout)] if probe_timeout else []
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcrl.runtime.stack",
            "--expect",
            json.dumps(expect),
            "--python",
            python,
            *extra,
            "--",
            *argv,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=site_dir.parent,
        timeout=120,
    )


def expect(version: str | None = "0.9.1") -> dict:
    return stack_expect.expectation("verl", version, ray_min="2.52", ray_min_why="hpcrl: token authentication")


def warnings(out: subprocess.CompletedProcess) -> list[str]:
    return [ln.removeprefix("stack: warning: ") for ln in out.stdout.splitlines() if ln.startswith("stack: warning: ")]


# ---- which table a release is read with ----------------------------------------------------------------

TABLES = [
    {"label": "0.8.0.dev (b178a3cd)", "version": "0.8.0.dev"},
    {"label": "0.9.1", "version": "0.9.1"},
    {"label": "0.10.0.dev (1dda039b)", "version": "0.10.0.dev"},
]


@pytest.mark.parametrize(
    "installed,label,how",
    [
        ("0.9.1", "0.9.1", "exact"),
        ("0.10.0.dev0", "0.10.0.dev (1dda039b)", "exact"),  # a dev build of the commit's declared version
        ("0.9.0", "0.9.1", "same-minor"),
        ("0.9.7", "0.9.1", "same-minor"),
        ("0.10.0", "0.10.0.dev (1dda039b)", "same-minor"),  # the final release of a dev table hpcrl read
        ("0.12.3", "0.10.0.dev (1dda039b)", "older"),
        ("0.8.5", "0.8.0.dev (b178a3cd)", "same-minor"),
        ("0.7.1", "0.8.0.dev (b178a3cd)", "oldest"),
    ],
)
def test_a_release_is_read_with_its_own_table_else_the_nearest(installed, label, how):
    table, got = pick_table(TABLES, installed)
    assert (table["label"], got) == (label, how)


def test_the_release_the_plan_targets_passes_without_a_word(tmp_path):
    out = check(site(tmp_path, VERL_091), expect(), "trainer.nnodes=1")
    assert (out.returncode, warnings(out)) == (0, []), out.stdout + out.stderr


def test_a_patch_release_hpcrl_has_not_read_is_one_warning_naming_the_table(tmp_path):
    out = check(site(tmp_path, dict(VERL_091, verl="0.9.2")), expect())
    assert (out.returncode, warnings(out)) == (
        0,
        [
            "verl 0.9.2 installed, a patch release hpcrl has not read: checked against 0.9.1, the nearest of the same "
            "minor release"
        ],
    )


def test_a_release_newer_than_any_read_is_checked_against_the_nearest_older_one(tmp_path):
    out = check(site(tmp_path, dict(VERL_091, verl="0.12.0")), expect())
    assert (out.returncode, warnings(out)[0]) == (
        0,
        (
            "verl 0.12.0 installed, a release hpcrl has not read: checked against 0.10.0.dev (1dda039b), the nearest "
            "older one it has; the plan targets verl 0.9.1: render with hpcrl.framework_version=0.10.0.dev to plan for "
            "0.10.0.dev (1dda039b)"
        ),
    )


def test_a_framework_pin_the_environment_misses_is_a_warning_with_the_package(tmp_path):
    """verl 0.9.1 asks transformers>=5.5.3,<5.11,!=5.6.0 (METADATA:26 in its wheel); 5.15.0 is installed."""
    out = check(site(tmp_path, dict(VERL_091, transformers="5.15.0")), expect())
    assert (out.returncode, warnings(out)) == (
        0,
        [
            "transformers 5.15.0 installed; verl 0.9.1 pins transformers<5.11,>=5.5.3,!=5.6.0 (METADATA:26 in verl "
            "0.9.1's wheel)"
        ],
    )


def test_a_package_the_release_imports_missing_still_stops_the_job(tmp_path):
    out = check(site(tmp_path, {k: v for k, v in VERL_091.items() if k != "TransferQueue"}), expect())
    assert (out.returncode, out.stdout.splitlines()[0]) == (
        STACK_MISMATCH_EXIT,
        (
            "stack: transfer_queue not installed; verl 0.9.1 runs trainer.use_v1=true, which imports it "
            "(verl/trainer/main_ppo.py:137)"
        ),
    )


# ---- a check that decides only what it can know (issue 38 item 4) ----------------------------------------


def test_a_training_python_slower_than_the_probe_timeout_is_unchecked_not_a_mismatch(tmp_path):
    """A cold shared file system: the Python answers after 5 s; the timeout is set to 1 s (default 60 s)."""
    slow = wrapper(tmp_path / "env" / "python", f'sleep 5; exec "{sys.executable}" "$@"')
    t0 = time.monotonic()
    out = check(site(tmp_path, VERL_091), expect(), python=slow, probe_timeout=1)
    assert (out.returncode, out.stdout.splitlines()[0], time.monotonic() - t0 < 4.5) == (
        STACK_UNCHECKED_EXIT,
        (
            f"stack: unchecked: the training Python {slow} could not be probed (no answer within 1 s); the check could "
            "not run, the job goes on without it"
        ),
        True,
    )


@pytest.mark.parametrize("folder", ["my env", "it's here"], ids=["space", "quote"])
def test_a_training_python_under_a_path_with_a_space_or_a_quote_is_checked(tmp_path, folder):
    python = wrapper(tmp_path / folder / "bin" / "python", f'exec "{sys.executable}" "$@"')
    out = check(site(tmp_path, VERL_091), expect(), python=python)
    assert (out.returncode, out.stdout.splitlines()[0].startswith("stack: ok: ")) == (0, True), out.stdout + out.stderr


def test_a_chatty_training_python_does_not_hide_the_probe_s_answer(tmp_path):
    """It prints a banner before the probe's JSON and a line after it."""
    chatty = wrapper(
        tmp_path / "env" / "python",
        f'echo "module: loaded cuda/12.7"; "{sys.executable}" "$@"; rc=$?; echo "bye from sitecustomize"; exit $rc',
    )
    out = check(site(tmp_path, VERL_091), expect(), python=chatty)
    assert (out.returncode, out.stdout.splitlines()[0].startswith("stack: ok: ")) == (0, True), out.stdout + out.stderr


def test_a_helper_left_holding_the_probe_s_output_does_not_hold_the_check(tmp_path):
    """The Python starts a helper that keeps the probe's stdout open for 20 s; the check ends with the Python."""
    leaky = wrapper(tmp_path / "env" / "python", f'sleep 20 & "{sys.executable}" "$@"')
    t0 = time.monotonic()
    out = check(site(tmp_path, VERL_091), expect(), python=leaky, probe_timeout=20)
    assert (out.returncode, time.monotonic() - t0 < 15) == (0, True), out.stdout + out.stderr
