"""vLLM releases hpcrl has not read (issue 35 item 4): a patch release gets the nearest read release of its minor,
said in a note; an unread minor is refused naming the read ones. 0.29.0 (OpenRLHF 0.11.x's pin) was read from
its sdist. Expected values are the release numbers as vLLM publishes them and 0.29.0's own source (cited)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.errors import HpcrlError
from hpcrl.memory import vllm_accounting as va
from hpcrl.models import resolve_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "asked,read",
    [
        ("0.19.0", "0.19.1"),
        ("0.19.2", "0.19.1"),
        ("0.24.1", "0.24.0"),
        ("0.27.0", "0.27.1"),
        ("0.29.1", "0.29.0"),
        ("0.11.2", "0.11.0"),
        ("0.10.1", "0.10.1.1"),
        ("0.10.2", "0.10.1.1"),
        ("0.8.5", "0.8.5.post1"),
        ("0.8.4", "0.8.5.post1"),
        ("0.6.4", "0.6.4.post1"),
    ],
)
def test_a_patch_release_is_read_as_the_nearest_read_release_of_its_minor(asked, read):
    got, note = va.read_release(asked)
    assert (got, note.startswith(f"vLLM {asked}: hpcrl read {read} of the same minor release")) == (read, True)


@pytest.mark.parametrize("read", ["0.19.1", "0.24.0", "0.27.1", "0.29.0", "0.10.1.1"])
def test_a_read_release_is_its_own_without_a_note(read):
    assert va.read_release(read) == (read, None)


@pytest.mark.parametrize("asked", ["0.28.0", "0.30.1", "1.0.0"])
def test_a_minor_hpcrl_has_not_read_is_refused_naming_the_read_ones(asked):
    with pytest.raises(HpcrlError, match=rf"--vllm-version '{asked}': hpcrl has not read .*valid: 0\.6\.4\.post1, "):
        va.read_release(asked)


def test_plan_memory_answers_0_19_0_with_0_19_1_s_accounting_and_says_so():
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", "plan-memory", "--model", "7b", "--vllm-version", "0.19.0"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert (
        out.returncode,
        "note: vLLM 0.19.0: hpcrl read 0.19.1 of the same minor release" in out.stdout,
        "Engine GPU: vLLM 0.19.1" in out.stdout,
    ) == (0, True, True), out.stdout + out.stderr


def test_vllm_0_29_runs_every_model_on_the_v2_runner_moe_too():
    """0.29.0 vllm/config/vllm.py:645-676: use_v2_model_runner is true unless a feature V2 lacks is asked for;
    0.27.1 defaulted only dense models and a list of MoE architectures (config/vllm.py:69-79 there)."""
    moe = resolve_model("Qwen/Qwen3-30B-A3B")
    new, old = va.accounting("0.29.0"), va.accounting("0.27.1")
    assert (new.warmup(moe, "raw_logprobs") == new.sampler_v2, old.warmup(moe, "raw_logprobs") == old.sampler) == (
        True,
        True,
    )


def test_vllm_0_29_s_engine_context_scheduler_defaults():
    """AsyncLLMEngine.from_engine_args falls back to SchedulerConfig: 2048 tokens, 128 sequences
    (vllm/config/scheduler.py:42,44 and engine/arg_utils.py:2899 in 0.29.0)."""
    acc = va.accounting("0.29.0")
    assert (acc.default_max_num_batched_tokens, acc.default_max_num_seqs, acc.block_size) == (2048, 128, 16)
