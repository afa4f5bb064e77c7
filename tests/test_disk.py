"""Disk plan: checkpoint sizes against numbers computed here from literal parameter counts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpcrl.disk import largest_fitting_keep, plan_disk, suggest
from hpcrl.errors import HpcrlError

GIB = 1024**3
MIB = 1024**2
# Exact parameter counts (embedding + layers + final norm) of the models' HF configs.
OLMO3_32B = 32_233_522_176
OLMO3_7B = 7_298_011_136
LLAMA_70B = 70_553_706_496
# LoRA r=16 on all seven projections of Llama-3.1-70B, by hand: 80 layers x 16 x
# [q (8192+8192) + k (8192+1024) + v (8192+1024) + o (8192+8192) + 3 MLP (8192+28672)].
LLAMA_70B_LORA16 = 80 * 16 * (16384 + 9216 + 9216 + 16384 + 3 * 36864)


def test_full_finetune_zero3_state_is_12_bytes_per_param():
    """fp32 master (4 B) + two Adam moments (8 B), partitioned; bf16 weights are not in it."""
    plan = plan_disk("olmo3-32b", n_learners=16)
    assert plan.trainable_params == OLMO3_32B
    assert plan.state_terms["fp32 master weights"] == 4 * OLMO3_32B
    assert plan.state_terms["Adam moments (fp32)"] == 8 * OLMO3_32B
    # Everything else (norms on every rank, metadata) is small: under 0.1% here.
    assert 12 * OLMO3_32B < plan.state_bytes < 12 * OLMO3_32B * 1.001
    assert abs(plan.state_bytes / 1e9 - 386.8) < 0.5  # ~387 GB, not the 219 GB the seeds report
    # One HF save: full bf16 weights plus tokenizer/config files.
    assert plan.hf_bytes == 2 * OLMO3_32B + 20 * MIB
    assert plan.state_per_rank_bytes == pytest.approx(plan.state_bytes / 16)


def test_seven_b_matches_the_seeds_training_state_figure():
    """The 32B guide's "7B training state 84 GB" is the same 12 B/param."""
    plan = plan_disk("olmo3-7b", n_learners=2)
    assert abs(plan.state_bytes / 1e9 - 12 * OLMO3_7B / 1e9) < 0.1
    assert round(12 * OLMO3_7B / 1e9) == 88  # 7.3B params; the guide rounds the model to 7B -> 84


def test_lora_state_holds_the_frozen_base_and_the_adapter_optimizer():
    plan = plan_disk("llama3.1-70b", lora_rank=16, n_learners=8)
    assert plan.trainable_params == LLAMA_70B_LORA16 == 207_093_760
    assert plan.state_terms["frozen base weights (bf16 partitions)"] == 2 * LLAMA_70B
    assert plan.state_terms["fp32 master weights"] + plan.state_terms["Adam moments (fp32)"] == 12 * LLAMA_70B_LORA16
    assert plan.hf_kind.startswith("LoRA adapter")
    assert plan.hf_bytes == 2 * LLAMA_70B_LORA16 + 20 * MIB


def test_zero2_adds_the_bf16_module_on_rank_0():
    plan = plan_disk("olmo3-7b", zero_stage=2, n_learners=4)
    assert plan.state_terms["bf16 module weights (rank 0)"] == 2 * OLMO3_7B
    assert 14 * OLMO3_7B < plan.state_bytes < 14 * OLMO3_7B * 1.001


@pytest.mark.parametrize(
    "total, save_freq, state_freq, keep, hf, saves, peak",
    [
        (1000, 200, 50, 3, 6, 20, 4),  # 5 step saves + final; keep 3 + the one just written
        (1000, 200, 50, -1, 6, 20, 20),  # -1 keeps every state checkpoint
        (1000, 200, 50, 0, 6, 20, 1),  # 0: each is deleted right after it is written
        (1000, 200, 0, 3, 6, 0, 0),  # no state checkpoints
        (10, 1, 5, 3, 10, 2, 2),  # save_freq 1 saves steps 2..10, not step 1
        (100, 0, 200, 3, 1, 0, 0),  # only the final HF save; run shorter than the state interval
    ],
)
def test_counts_follow_open_instruct(total, save_freq, state_freq, keep, hf, saves, peak):
    plan = plan_disk("olmo3-7b", total_steps=total, save_freq=save_freq, checkpoint_state_freq=state_freq,
                     keep_last_n_checkpoints=keep)
    assert (plan.n_hf_saves, plan.n_state_saves, plan.state_at_peak) == (hf, saves, peak)
    assert plan.peak_bytes == peak * plan.state_bytes + hf * plan.hf_bytes


def test_keep_zero_is_flagged():
    plan = plan_disk("olmo3-7b", keep_last_n_checkpoints=0)
    assert any("keep_last_n_checkpoints=0" in n for n in plan.notes)


def test_suggestions_name_the_setting_that_fits():
    # 32B, state every 50 steps, keep 3: 4 x 360.3 + 6 x 60.1 GiB = 1,802 GiB at peak.
    state = 12 * OLMO3_32B / GIB
    hf = 2 * OLMO3_32B / GIB
    plan = plan_disk("olmo3-32b", n_learners=16, checkpoint_state_freq=50, quota_bytes=1500 * GIB)
    assert plan.fits is False
    assert plan.peak_bytes / GIB == pytest.approx(4 * state + 6 * hf, rel=1e-3)
    # keep 2 -> 3 alive: 3 x 360.3 + 6 x 60.1 = 1,441 GiB <= 1,500; keep 3 does not fit.
    assert largest_fitting_keep(plan) == 2
    found = {s.setting: s for s in suggest(plan)}
    assert found["keep_last_n_checkpoints"].value == 2
    assert found["keep_last_n_checkpoints"].peak_bytes / GIB == pytest.approx(3 * state + 6 * hf, rel=1e-3)
    # State every 251 steps -> 3 saves (251, 502, 753): 3 alive, same 1,441 GiB. 250 would give 4.
    assert found["checkpoint_state_freq"].value == 251
    # Only the final HF save: 4 x 360.3 + 60.1 = 1,501 GiB, still over: no save_freq suggestion.
    assert "save_freq" not in found
    assert "Would fit: keep_last_n_checkpoints=2" in plan.verdict()


def test_fits_and_unknown_quota():
    assert plan_disk("olmo3-7b", quota_bytes=2000 * GIB).fits is True
    plan = plan_disk("olmo3-7b")
    assert plan.fits is None and "no quota known" in plan.verdict()


@pytest.mark.parametrize("kw", [{"n_learners": 0}, {"lora_rank": -1}, {"total_steps": 0}, {"zero_stage": 4}])
def test_bad_settings_are_user_errors(kw):
    with pytest.raises(HpcrlError):
        plan_disk("olmo3-7b", **kw)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcrl", "plan-disk", *args], capture_output=True, text=True,
                          timeout=120, env={"COLUMNS": "200", "NO_COLOR": "1", "PATH": "/usr/bin:/bin"})


def test_cli_json_and_quota_from_profile():
    proc = _cli("--model", "32b", "--learners", "16", "--checkpoint-state-freq", "50", "--cluster", "berzelius",
                "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["quota_gib"] == 2000.0  # Berzelius project storage
    assert data["state_checkpoint"]["bytes"] > 12 * OLMO3_32B
    assert data["state_checkpoint"]["at_peak"] == 4 and data["hf_save"]["saves"] == 6
    assert data["fits"] is True


def test_cli_says_when_it_does_not_fit_but_exits_0():
    proc = _cli("--model", "32b", "--learners", "16", "--checkpoint-state-freq", "50", "--quota-gib", "1500")
    assert proc.returncode == 0, proc.stderr
    assert "does NOT fit" in proc.stdout and "keep_last_n_checkpoints=2" in proc.stdout


def test_cli_bad_model_is_one_line():
    proc = _cli("--model", "no-such-model")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
