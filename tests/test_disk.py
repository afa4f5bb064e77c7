"""Disk plan: checkpoint sizes against numbers computed here from literal parameter counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import assert_user_error

from hpcrl.errors import HpcrlError
from hpcrl.planning.disk import largest_fitting_keep, plan_disk, suggest

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
    plan = plan_disk(
        "olmo3-7b",
        total_steps=total,
        save_freq=save_freq,
        checkpoint_state_freq=state_freq,
        keep_last_n_checkpoints=keep,
    )
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
    return subprocess.run(
        [sys.executable, "-m", "hpcrl", "plan-disk", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "200", "NO_COLOR": "1", "PATH": "/usr/bin:/bin"},
    )


def test_cli_json_and_quota_from_profile():
    proc = _cli(
        "--model", "32b", "--learners", "16", "--checkpoint-state-freq", "50", "--cluster", "berzelius", "--json"
    )
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
    assert_user_error(proc, "unknown model 'no-such-model' (not a catalog name or alias, and no such path); valid (")


# ---------------------------------------------------------------------------- every backend (plan-disk --backend)

QWEN7B = 7_615_616_512
# LoRA r=32 on all seven projections of Qwen2.5-7B, by hand: 28 layers x 32 x [q (3584+3584) + k (3584+512)
# + v (3584+512) + o (3584+3584) + gate, up (3584+18944) + down (18944+3584)].
QWEN7B_LORA32 = 28 * 32 * (7168 + 4096 + 4096 + 7168 + 3 * 22528)
# The users' OpenRLHF LoRA run (seed 000), reconstructed: a 101.6B model (tests/data/models/seed000-100b),
# 80 layers of hidden 10240, MLP 32768, 8 KV heads, vocabulary 128256; LoRA r=64 on all projections.
SEED_MODEL = str(Path(__file__).parent / "data" / "models" / "seed000-100b" / "config.json")
SEED_P = 2 * 128256 * 10240 + 80 * (2 * 10240 * 10240 + 2 * 10240 * 1024 + 3 * 10240 * 32768 + 2 * 10240) + 10240
SEED_LORA64 = 80 * 64 * (20480 + 11264 + 11264 + 20480 + 3 * 43008)


def items(*args: str) -> dict:
    proc = _cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    return data, {i["kind"]: i for i in data["items"]}


def test_verl_fsdp_checkpoint_is_fp32_parameters_and_adam_moments():
    """verl b178a3cd: model shards in the actor's fp32, Adam's two fp32 moments, small per-rank files."""
    data, got = items(
        "--backend",
        "verl",
        "--model",
        "qwen2.5-7b",
        "--learners",
        "16",
        "--ckpt-every",
        "100",
        "--total-steps",
        "1000",
        "--no-hf-cache",
    )
    one = 4 * QWEN7B + 8 * QWEN7B + 16 * 4 * MIB + 20 * MIB
    assert got["fsdp_state"]["bytes"] == one
    # 10 saves (steps 100..1000); hpcrl renders trainer.max_actor_ckpt_to_keep 2: two at the peak.
    assert (got["fsdp_state"]["written"], got["fsdp_state"]["at_peak"]) == (10, 2)
    assert data["peak_bytes"] == 2 * one and set(got) == {"fsdp_state"}
    assert data["settings"]["trainer.max_actor_ckpt_to_keep"] == 2


@pytest.mark.parametrize(
    "keep, at_peak", [("1", 2), ("3", 3), ("-1", 11)]
)  # 1 keeps the old one until the new is whole
def test_verl_keep_and_the_last_step_save(keep, at_peak):
    # save_freq 100 over 1050 steps: 10 saves plus one at the last step.
    _, got = items(
        "--backend",
        "verl",
        "--model",
        "qwen2.5-7b",
        "--ckpt-every",
        "100",
        "--total-steps",
        "1050",
        "--keep",
        keep,
        "--no-hf-cache",
    )
    assert (got["fsdp_state"]["written"], got["fsdp_state"]["at_peak"]) == (11, at_peak)


def test_verl_lora_and_hf_model():
    _, got = items(
        "--backend",
        "verl",
        "--model",
        "qwen2.5-7b",
        "--learners",
        "8",
        "--lora-rank",
        "32",
        "--save-hf",
        "--no-hf-cache",
    )
    t = QWEN7B_LORA32
    # The frozen base is in the fp32 model shards; the optimizer holds the adapter only; lora_adapter/ in fp32;
    # hf_model in save_contents adds the whole model, gathered in fp32.
    assert got["fsdp_state"]["bytes"] == 4 * (QWEN7B + t) + 8 * t + 4 * t + 4 * QWEN7B + 8 * 4 * MIB + 20 * MIB


def test_openrlhf_full_finetune_and_the_model_cache():
    data, got = items(
        "--backend",
        "openrlhf",
        "--model",
        "qwen2.5-7b",
        "--learners",
        "16",
        "--ckpt-every",
        "100",
        "--total-steps",
        "1000",
        "--save-hf",
        "--cluster",
        "isambard-ai",
    )
    assert 12 * QWEN7B < got["deepspeed_state"]["bytes"] < 12 * QWEN7B * 1.001
    assert (got["deepspeed_state"]["written"], got["deepspeed_state"]["at_peak"]) == (10, 3)  # ckpt.max_num 3
    hf = 2 * QWEN7B + 20 * MIB
    assert got["hf_save"]["bytes"] == hf and got["hf_save"]["at_peak"] == 10  # never deleted
    assert got["final_save"]["bytes"] == hf
    # Isambard-AI keeps the HF cache ($PROJECTDIR/hf) beside the run root ($PROJECTDIR/hpcrl-runs): counted.
    assert got["model_cache"]["bytes"] == 2 * QWEN7B


def test_openrlhf_lora_counts_the_full_model_sized_parts():
    """The users' run: the DeepSpeed state holds the frozen base (their 219 GB); the HF save is the adapter at
    3c3be623, or the full model with --lora-hf-save full (their 203 GB)."""
    assert SEED_P == 101_613_905_920 and SEED_LORA64 == 985_661_440
    common = (
        "--backend",
        "openrlhf",
        "--model",
        SEED_MODEL,
        "--lora-rank",
        "64",
        "--learners",
        "16",
        "--save-hf",
        "--ckpt-every",
        "25",
        "--total-steps",
        "100",
        "--quota-gib",
        "931",
        "--hf-cache",
    )
    data, got = items(*common)
    state = got["deepspeed_state"]
    assert state["terms_gib"]["frozen base weights (bf16 partitions)"] == pytest.approx(2 * SEED_P / GIB, abs=1e-3)
    assert 2 * SEED_P + 12 * SEED_LORA64 < state["bytes"] < (2 * SEED_P + 12 * SEED_LORA64) * 1.001
    assert abs(state["bytes"] / 1e9 - 215.2) < 0.1  # the notes: "219 GB each"
    assert got["hf_save"]["bytes"] == 2 * SEED_LORA64 + 20 * MIB  # ~2.0 GB: "~2 GB per save"
    assert data["fits"] is True
    data, got = items(*common, "--lora-hf-save", "full")
    assert got["hf_save"]["bytes"] == got["final_save"]["bytes"] == 2 * SEED_P + 20 * MIB  # 203.2 GB
    assert "2d0b9854" in got["hf_save"]["source"]
    assert data["fits"] is False and data["peak_bytes"] == pytest.approx(
        3 * state["bytes"] + 4 * (2 * SEED_P + 20 * MIB) + (2 * SEED_P + 20 * MIB) + 2 * SEED_P, rel=1e-9
    )


def test_rollout_dumps_and_dataset_cache():
    _, got = items(
        "--backend",
        "verl",
        "--model",
        "qwen2.5-7b",
        "--total-steps",
        "50",
        "--rollout-tokens-per-step",
        "1000000",
        "--dataset-gib",
        "12",
        "--no-hf-cache",
    )
    assert got["rollouts"]["bytes"] == 4 * 1_000_000 and got["rollouts"]["at_peak"] == 50  # decoded text, 4 B/token
    assert got["dataset_cache"]["bytes"] == 12 * GIB


# Each bad combination and the one line that names what is wrong with it.
BAD_COMBINATIONS = {
    ("--backend", "megatron"): "hpcrl: error: --backend 'megatron': valid: open-instruct, verl, openrlhf, trl",
    (
        "--config",
        "grpo-olmo3-7b",
        "--learners",
        "4",
    ): "hpcrl: error: --learners: with --config the run's own settings count; change them with --set KEY=VALUE",
    (
        "--nodes",
        "4",
    ): "hpcrl: error: --nodes and --set go with --config",
    ("--lora-hf-save", "merged"): "hpcrl: error: --lora-hf-save 'merged': valid: adapter, full",
}


@pytest.mark.parametrize(
    "args",
    [
        ("--backend", "megatron"),
        ("--config", "grpo-olmo3-7b", "--learners", "4"),
        (
            "--nodes",
            "4",
        ),
        ("--lora-hf-save", "merged"),
    ],
)
def test_plan_disk_bad_combinations_are_one_line(args):
    proc = _cli(*args)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == BAD_COMBINATIONS[args]


def test_plan_disk_config_is_what_render_checks():
    """--config plans the run as render does: verl's checkpoint every trainer.save_freq hpcrl sets, keep 2."""
    data, got = items("--config", "verl-grpo-qwen2.5-7b")
    assert data["backend"] == "verl" and data["settings"]["trainer.max_actor_ckpt_to_keep"] == 2
    # 16 GPUs of Isambard-AI; no total_training_steps in the config: the count is unknown, the bound counted.
    assert got["fsdp_state"]["written"] is None and got["fsdp_state"]["at_peak"] == 2
    assert got["fsdp_state"]["bytes"] == 12 * QWEN7B + 16 * 4 * MIB + 20 * MIB
    assert got["model_cache"]["bytes"] == 2 * QWEN7B  # $PROJECTDIR/hf beside $PROJECTDIR/hpcrl-runs


def test_frequencies_of_zero_are_grpo_fasts_off_switches_and_say_so():
    """grpo_fast.py (e6c3044a) saves HF weights only `if args.save_freq > 0` (:1664) but always at
    the end (:2052), and writes DeepSpeed state only for a positive checkpoint_state_freq."""
    proc = _cli("--model", "32b", "--save-freq", "0", "--checkpoint-state-freq", "0", "--json")
    assert proc.returncode == 0, proc.stderr
    items = {i["kind"]: i for i in json.loads(proc.stdout)["items"]}
    assert items["hf_save"]["written"] == 1 and "final only: save_freq <= 0" in items["hf_save"]["what"]
    assert items["deepspeed_state"]["written"] == 0
    assert "none: checkpoint_state_freq <= 0" in items["deepspeed_state"]["what"]
