"""Framework releases as names (issue 35 items 1 and 4): verl 0.9.1 and OpenRLHF 0.11.1/0.11.2, read from their
PyPI wheels. Expected values are the wheels' own facts, typed here from the files cited (METADATA lines, config
files), or hand counts from them; none comes from the code under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.errors import HpcrlError
from hpcrl.planning.backends import get_backend, versions
from hpcrl.planning.config import load_run_config

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
P_7B, V_7B = 7_615_616_512, 152_064  # Qwen2.5-7B parameters and vocabulary (its config.json; untied)


def hpcrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpcrl", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )


def test_versions_lists_the_releases_with_what_they_were_read_from_and_their_pins():
    out = hpcrl("versions", "--json")
    rows = {(r["backend"], r["version"]): r for r in json.loads(out.stdout)["frameworks"]}
    verl, orl = rows[("verl", "0.9.1")], rows[("openrlhf", "0.11.2")]
    assert (
        out.returncode,
        verl["commit"],
        verl["date"],
        verl["source"].split(",")[0],
        orl["date"],
        [p for p in orl["pins"] if p.split("=")[0] in ("vllm", "deepspeed", "ray")],
    ) == (
        0,
        None,
        "2026-09-20",
        "verl-0.9.1-py3-none-any.whl",
        "2026-09-14",
        ["ray==2.55.0", "vllm==0.29.0", "deepspeed==0.19.6"],
    )  # METADATA:33, :49, :19 of the 0.11.2 wheel


def test_versions_names_who_pins_each_vllm_it_has_read():
    vllm = {r["version"]: r["pinned_by"] for r in json.loads(hpcrl("versions", "--json").stdout)["vllm"]}
    assert vllm["0.29.0"] == ["openrlhf 0.11.1", "openrlhf 0.11.2"]


@pytest.mark.parametrize(
    "config,version",
    [("verl-grpo-qwen2.5-7b", "0.9.1"), ("openrlhf-grpo-qwen2.5-7b", "0.11.2"), ("openrlhf-grpo-qwen2.5-7b", "0.11.1")],
)
def test_render_targets_each_release(config, version, tmp_path):
    out = hpcrl(
        "render", "--config", config, "--set", f"hpcrl.framework_version={version}", "-o", str(tmp_path / "job.sbatch")
    )
    text = (tmp_path / "job.sbatch").read_text() if out.returncode == 0 else ""
    assert (out.returncode, f"# Framework: {config.split('-')[0]} {version}" in text) == (0, True), out.stderr


def test_a_version_is_named_by_its_release_or_its_commit():
    assert versions.resolve("openrlhf", "0.11.0") == versions.resolve("openrlhf", "3c3be62")


def test_a_flag_0_11_2_removed_is_refused_naming_the_releases_that_have_it():
    """0.11.2 replaced --algo.advantage.is_correction_enable by --algo.advantage.is_correction_level."""
    with pytest.raises(
        HpcrlError,
        match=r"openrlhf 0\.11\.2 has no such key; it exists in 0\.11\.0 \(3c3be623\), "
        r"0\.11\.1",
    ):
        load_run_config(
            "openrlhf-grpo-qwen2.5-7b", ["hpcrl.framework_version=0.11.2", "algo.advantage.is_correction_enable=true"]
        )


@pytest.mark.parametrize(
    "version,overrides,mode",
    [
        ("0.11.2", [], "raw_logprobs"),  # is_correction_level off by default (cli/train_ppo_ray.py:261-264)
        ("0.11.2", ["algo.advantage.is_correction_level=token"], "processed_logprobs"),  # :78 in the 0.11.2 wheel
        ("0.11.2", ["algo.advantage.is_correction_level=seq"], "processed_logprobs"),
        ("0.11.1", ["algo.advantage.is_correction_enable=true"], "processed_logprobs"),  # :78 in the 0.11.1 wheel
    ],
)
def test_openrlhf_is_correction_reaches_vllm_in_each_release_s_words(version, overrides, mode):
    cfg = load_run_config("openrlhf-grpo-qwen2.5-7b", [f"hpcrl.framework_version={version}", *overrides])
    assert get_backend("openrlhf").workload_from_config(cfg).vllm.logprobs_mode == mode


@pytest.mark.parametrize("version,vllm", [("0.11.0", "0.27.1"), ("0.11.1", "0.29.0"), ("0.11.2", "0.29.0")])
def test_each_openrlhf_release_plans_with_the_vllm_it_pins(version, vllm):
    """setup.py:77 at 3c3be623; METADATA:49 in the 0.11.1 and 0.11.2 wheels."""
    assert get_backend("openrlhf").engine_facts(version).version == vllm


def _learner(version: str, *sets: str) -> dict:
    out = hpcrl(
        "plan-memory",
        "--json",
        "--config",
        "verl-grpo-qwen2.5-7b",
        "--set",
        f"hpcrl.framework_version={version}",
        "--set",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=12",
        *(w for s in sets for w in ("--set", s)),
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["learner"]["breakdown"]


def test_verl_0_9_1_s_learner_is_the_hand_count_of_its_config():
    """The shipped 7B config on 16 GPUs, micro-batch 12 (2 x 61,440 tokens): 0.9.1 reduce-scatters each
    micro-batch (use_no_sync_for_gradient_accumulation false, engine/fsdp.yaml:61), so the first micro-batch's
    gradients are fp32 shards, 4 B x P / 16; at temperature 1 (rollout.temperature's default) no divide, so the
    log-prob path holds the logits and their in-place gradient, 2 B x T x V."""
    terms = _learner("0.9.1")
    assert (terms["gradients of earlier micro-batches"], terms["log-prob path (2 B x T x V, derived)"]) == (
        pytest.approx(4 * P_7B / 16 / GIB, abs=0.01),
        pytest.approx(2 * 61_440 * V_7B / GIB, abs=0.01),
    )


def test_verl_0_9_1_with_no_sync_on_holds_the_unsharded_bf16_gradients_again():
    terms = _learner("0.9.1", "actor_rollout_ref.actor.fsdp_config.use_no_sync_for_gradient_accumulation=true")
    assert terms["unsharded bf16 gradients of earlier micro-batches (no_sync)"] == pytest.approx(
        2 * P_7B / GIB, abs=0.01
    )


def test_verl_0_9_1_divides_by_a_temperature_other_than_1_out_of_place():
    terms = _learner("0.9.1", "actor_rollout_ref.rollout.temperature=0.7")
    assert terms["log-prob path (4 B x T x V)"] == pytest.approx(4 * 61_440 * V_7B / GIB, abs=0.01)


def test_plan_memory_says_why_0_9_1_holds_less():
    out = hpcrl("plan-memory", "--config", "verl-grpo-qwen2.5-7b", "--set", "hpcrl.framework_version=0.9.1")
    assert (
        "gradients reduce-scattered into the fp32 shards after every micro-batch (no no_sync): verl 0.9.1, "
        "actor_rollout_ref.actor.fsdp_config.use_no_sync_for_gradient_accumulation false, its default "
        "(verl/trainer/config/engine/fsdp.yaml:61 in verl 0.9.1's wheel)"
    ) in out.stdout
