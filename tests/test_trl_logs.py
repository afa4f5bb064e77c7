"""TRL's console output read by the watchdog, `hpcrl diagnose` and `checkpoints list`.

tests/data/trl/console_zero_reward.log and console_mixed_reward.log are real runs of TRL 1.16.0's GRPOTrainer
(tests/data/trl/make_console_log.py: a tiny random Qwen2 on the CPU, transformers' generate, a reward of 0, or
by completion length), stdout and stderr together as a job log has them: tqdm's bar redrawn with carriage
returns shares each line with the metrics dict. Counts and values below were read off those files by hand.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from hpcrl.logs.checkpoints import find_checkpoints, plan_prune
from hpcrl.logs.driver_log import parse_steps
from hpcrl.logs.log_format import run_format

DATA = Path(__file__).resolve().parent / "data" / "trl"
ZERO, MIXED = DATA / "console_zero_reward.log", DATA / "console_mixed_reward.log"
TRL = run_format("trl")  # the TRL backend's log format
ZERO_REWARD_EXIT = 90  # docs/safety.md: zero_reward


def _lines(path: Path) -> list[str]:
    with open(path, newline="") as f:  # the carriage returns as the log file has them
        return f.read().split("\n")


def test_every_logged_step_of_a_real_trl_log_is_read():
    steps = parse_steps(_lines(MIXED), TRL)
    # 12 steps (max_steps 12, logging_steps 1); rewards as printed, read off the file
    assert [s.text["reward"] for s in steps] == [
        "0.5",
        "0.25",
        "0.75",
        "0.75",
        "0.75",
        "0.75",
        "1",
        "0.5",
        "0.25",
        "0.25",
        "1",
        "0.75",
    ]


def test_a_zero_reward_trl_log_reads_as_exact_zeros_with_zero_spread():
    steps = parse_steps(_lines(ZERO), TRL)
    assert len(steps) == 12 and all(s.reward_is_exactly_zero() for s in steps)
    assert all(s.zero_variance() == (True, "frac_reward_zero_std=1") for s in steps)
    assert steps[0].grad_norm() == ("grad_norm", 0.0) and steps[0].loss_key == "loss"


def test_the_mixed_log_has_spread_in_its_groups():
    # step 12 printed frac_reward_zero_std '0' (no group without spread)
    assert parse_steps(_lines(MIXED), TRL)[-1].zero_variance() == (False, "frac_reward_zero_std=0")


def _watch(tmp_path: Path, log: Path) -> subprocess.CompletedProcess:
    driver = tmp_path / "driver.sh"
    driver.write_text(f"#!/bin/bash\ncat {log}\nsleep 20\n")
    driver.chmod(0o755)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcrl.runtime.watchdog",
            "--run-dir",
            str(tmp_path / "run"),
            "--kill-grace-seconds",
            "2",
            "--",
            str(driver),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_watchdog_trips_on_ten_zero_reward_steps_of_a_real_trl_log(tmp_path):
    out = _watch(tmp_path, ZERO)
    breaker = json.loads((tmp_path / "run" / "hpcrl" / "breaker.json").read_text())
    assert out.returncode == ZERO_REWARD_EXIT and breaker["reason"] == "zero_reward"
    assert breaker["details"]["reward_key"] == "reward" and breaker["step"] == 10


def test_the_watchdog_lets_a_rewarded_trl_run_finish(tmp_path):
    out = _watch(tmp_path, MIXED)
    assert out.returncode == 0 and not (tmp_path / "run" / "hpcrl" / "breaker.json").exists()


def test_diagnose_names_zero_reward_in_a_trl_log():
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", "diagnose", str(ZERO), "--backend", "trl"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.startswith("Cause: zero_reward")
    assert "exactly 0 for 12 consecutive steps" in out.stdout


def _checkpoint(root: Path, step: int, complete: bool) -> Path:
    d = root / f"checkpoint-{step}"
    (d / f"global_step{step}").mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"\0" * 128)
    if complete:
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


def test_checkpoints_list_finds_trainer_checkpoints_complete_once_trainer_state_is_written(tmp_path):
    root = tmp_path / "checkpoints"
    for step, complete in ((10, True), (20, True), (30, False)):
        _checkpoint(root, step, complete)
    found = find_checkpoints(tmp_path)
    assert [(c.path.name, c.kind, c.step, c.complete) for c in found] == [
        ("checkpoint-10", "trainer", 10, True),
        ("checkpoint-20", "trainer", 20, True),
        ("checkpoint-30", "trainer", 30, False),
    ]


def test_prune_keeps_the_newest_complete_trainer_checkpoint(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (10, 20, 30):
        _checkpoint(root, step, True)
    plan = plan_prune(find_checkpoints(tmp_path), keep=2, now=time.time() + 3600)
    assert [c.path.name for c in plan.delete] == ["checkpoint-10"]
