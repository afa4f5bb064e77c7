"""A run with nothing to resume from does not chain on a time limit (issue 27): render warns, and the
script's continue_chain stops with the reason. The chain logic is run as rendered, with Slurm stubbed."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


def hpcrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, timeout=120)


ORL = ("render", "--config", "openrlhf-grpo-qwen2.5-7b", "--cluster", "local-dev", "--nodes", "2")
# The functions continue_chain calls, stubbed: sbatch is what is watched.
STUBS = """log() { echo "log: $*"; }
record() { :; }
count_file() { echo 0; }
bump_file() { :; }
blamed_nodes() { :; }
submit_continuation() { echo "sbatch called"; echo 4242; }
HPCRL_DIR=$(mktemp -d) MAX_RESTARTS=10 MAX_FAILURE_RESTARTS=3 FAILURE_BACKOFF_S=0 CONTINUED=
"""


def chain(script: str, reason: str) -> str:
    fn = re.search(r"^continue_chain\(\) \{\n.*?^\}\n", script, re.S | re.M).group(0)
    return subprocess.run(
        ["bash", "-c", STUBS + fn + f"continue_chain {reason}"], capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture(scope="module")
def no_ds() -> subprocess.CompletedProcess:
    return hpcrl(*ORL, "--set", "ckpt.disable_ds=true")


def test_render_warns_that_a_run_without_deepspeed_state_does_not_chain(no_ds):
    assert no_ds.returncode == 0
    assert (
        "hpcrl: warning: ckpt.disable_ds is true: no DeepSpeed state is saved, so a job that reaches its time "
        "limit does not continue the chain"
    ) in no_ds.stderr


def test_the_script_stops_the_chain_at_a_time_limit_with_the_reason(no_ds):
    out = chain(no_ds.stdout, "timeout")
    assert "sbatch called" not in out
    assert "log: not continuing after timeout: ckpt.disable_ds is true: no DeepSpeed state is saved" in out


def test_a_failure_not_the_runs_fault_still_continues(no_ds):
    """A lost node is not a time limit: the only way to finish is to start again."""
    assert "sbatch called" in chain(no_ds.stdout, "worker-died")


def test_a_resumable_run_continues_at_a_time_limit():
    out = hpcrl(*ORL)
    assert out.returncode == 0 and "does not continue the chain" not in out.stderr
    assert "sbatch called" in chain(out.stdout, "timeout")


def test_hpcrl_turning_deepspeed_state_off_to_fit_a_quota_stops_the_chain_too():
    """72B LoRA: a 145 GiB DeepSpeed state does not fit a 500 GiB quota beside the 135 GiB final save and cache."""
    out = hpcrl(
        *ORL[:-2],
        "--set",
        "actor.model_name_or_path=Qwen/Qwen2.5-72B",
        "--set",
        "ds.lora.rank=64",
        "--quota-gib",
        "500",
        "--nodes",
        "4",
    )
    assert out.returncode == 0, out.stderr
    assert "--ckpt.disable_ds" in out.stdout and "does not continue the chain" in out.stderr
    assert "sbatch called" not in chain(out.stdout, "timeout")


# A user's script (seed 003) on one GPU of local-dev: it chains at a time limit only when its config says how it resumes.
CUSTOM = (
    "render",
    "--config",
    "custom-ppo-qwen2.5-3b-qlora",
    "--cluster",
    "local-dev",
    "--gpus",
    "1",
    "--set",
    "hpcrl.partition=short",
    "--set",
    'hpcrl.time="00:02:00"',
)


def test_a_custom_script_without_a_declared_resume_does_not_chain():
    out = hpcrl(*CUSTOM)
    assert out.returncode == 0, out.stderr
    assert "log: not continuing after timeout: resume none: the script declares no way to resume" in chain(
        out.stdout, "timeout"
    )


@pytest.mark.parametrize("how", ["marker", "own"])
def test_a_custom_script_that_declares_its_resume_chains(how):
    out = hpcrl(*CUSTOM, "--set", f"resume={how}")
    assert out.returncode == 0 and "does not continue the chain" not in out.stderr
    assert "sbatch called" in chain(out.stdout, "timeout")
