"""The generation model for RL batches (hpcrl/planning/generation.py): expected values by hand."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.planning.generation import Constants, EngineWork, generation_seconds

ROOT = Path(__file__).parents[1]


def small(**changes) -> EngineWork:
    """10 GB of weights, 100 kB of KV per token, a 10,000-token pool, max_num_seqs 4, 256-token chunks;
    10 sequences of 100 + 50 tokens; 2e9 matmul FLOPs per token, 2 layers of q_dim 64; 1 TB/s, 100 TFLOP/s."""
    base = dict(
        weights_bytes=10e9,
        kv_bytes_per_token=100e3,
        kv_tokens=10_000,
        max_num_seqs=4,
        max_num_batched_tokens=256,
        matmul_flops_per_token=2e9,
        layers=2,
        q_dim=64,
        tp=1,
        seqs=10,
        prompt_len=100,
        response_len=50,
        hbm_tbs=1.0,
        bf16_tflops=100.0,
    )
    return EngineWork(**{**base, **changes})


K = Constants(bw_efficiency=0.5, mfu=0.5, step_overhead_s=1e-3, seq_step_s=0.0)


def test_generation_time_by_hand_for_a_small_case():
    """Mean context 100 + 50/2 = 125; the pool holds 10,000 // 125 = 80, max_num_seqs 4: 4 at a time, so
    batches of 4, 4 and 2. A step of 4 reads 10e9 + 4 x 125 x 100e3 = 10.05e9 B / (0.5 x 1e12) = 20.1 ms
    (its FLOPs, 4 x (2e9 + 4 x 2 x 64 x 125) / (0.5 x 1e14), take 0.16 ms) + 1 ms; a step of 2 reads
    10.025e9 B: 20.05 ms + 1 ms. Decode: 2 x 50 x 21.1 + 50 x 21.05 = 3162.5 ms. Prefill: 1,000 prompt
    tokens in ceil(1000 / 256) = 4 chunks, each max(10e9 / 0.5e12 = 20 ms, (10 x (100 x 2e9 + 2 x 2 x 64 x
    100^2) / 4) / 0.5e14 = 10.0 ms) + 1 ms = 21 ms: 84 ms. Total 3246.5 ms."""
    assert generation_seconds(small(), K) == pytest.approx(3.2465, rel=1e-6)


def test_a_large_batch_step_is_bound_by_its_matmuls():
    """1,000 sequences at once with 10 kB of KV per token: a step reads (10e9 + 1000 x 125 x 10e3) / 0.5e12
    = 22.5 ms but multiplies 1000 x (2e9 + 4 x 2 x 64 x 125) / 0.5e14 = 40.00128 ms: the roofline takes
    the matmuls, + 1 ms, 50 steps = 2.050064 s. Prefill: 100,000 tokens in ceil(100000 / 256) = 391 chunks,
    each max(20 ms, 1000 x (100 x 2e9 + 2 x 2 x 64 x 100^2) / 391 / 0.5e14 = 10.23 ms) + 1 ms = 8.211 s."""
    e = small(seqs=1000, max_num_seqs=1000, kv_tokens=10**7, kv_bytes_per_token=10e3)
    assert generation_seconds(e, K) == pytest.approx(50 * 0.04100128 + 391 * 0.021, rel=1e-6)


def test_each_running_sequence_adds_its_cost_to_every_decode_step():
    """The small case with 10 us per sequence per decode step: steps of 4 cost 4 x 10 us = 40 us more and
    steps of 2 cost 20 us more; 100 steps of 4 and 50 of 2 add 4 ms + 1 ms = 5 ms to the 3246.5 ms. Prefill
    passes carry no per-sequence cost."""
    k = Constants(bw_efficiency=0.5, mfu=0.5, step_overhead_s=1e-3, seq_step_s=10e-6)
    assert generation_seconds(small(), k) == pytest.approx(3.2515, rel=1e-6)


def test_concurrency_comes_from_the_engines_own_limits_not_a_fixed_cap():
    """max_num_seqs 1024 and a pool of 1e7 tokens: all 1,000 sequences run at once (a fixed cap of 256
    would run them in four batches); max_num_seqs 128 (open-instruct's vLLM) runs 128; a pool of 12,500
    tokens holds 12,500 // 125 = 100."""
    assert small(seqs=1000, max_num_seqs=1024, kv_tokens=10**7).concurrency == 1000
    assert small(seqs=1000, max_num_seqs=128, kv_tokens=10**7).concurrency == 128
    assert small(seqs=1000, max_num_seqs=1024, kv_tokens=12_500).concurrency == 100


def hpcrl(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, env=env, cwd=ROOT)


def test_plan_memory_gives_the_engines_generation_time_with_a_band():
    """The issue's case: open-instruct's engine (vLLM 0.19.1, max_num_seqs 128) for Qwen3-8B on a GH200
    runs 128 of the 1,000 sequences at once; the band is the fit's held-out range around the estimate."""
    out = hpcrl(
        "plan-memory",
        "--model",
        "qwen3-8b",
        "--vllm-tp",
        "1",
        "--sequences",
        "1000",
        "--prompt-len",
        "1024",
        "--response-len",
        "2048",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    t = json.loads(out.stdout)["engine"]["time"]
    assert (t["concurrency"], t["concurrency_limited_by"], t["max_num_seqs"]) == (128, "max_num_seqs", 128)
    assert t["generation_low_s"] < t["generation_s"] < t["generation_high_s"] and "held out" in t["basis"]


def test_plan_memory_concurrency_follows_max_num_seqs_past_256():
    """--vllm-max-num-seqs 512 on a 0.5B model (a pool of hundreds of thousands of tokens): 512 at once."""
    out = hpcrl(
        "plan-memory",
        "--model",
        "qwen2.5-0.5b",
        "--vllm-tp",
        "1",
        "--vllm-max-num-seqs",
        "512",
        "--sequences",
        "512",
        "--prompt-len",
        "256",
        "--response-len",
        "256",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["engine"]["time"]["concurrency"] == 512


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ("--sequences", "10"),
            "hpcrl: error: --prompt-len, --response-len missing: the generation time needs "
            "--sequences N --prompt-len P --response-len R together\n",
        ),
        (
            ("--sequences", "0", "--prompt-len", "1", "--response-len", "2"),
            "hpcrl: error: --sequences 0: valid: a positive whole number\n",
        ),
    ],
)
def test_plan_memory_refuses_an_incomplete_or_bad_batch(args, message):
    out = hpcrl("plan-memory", "--model", "qwen3-8b", *args)
    assert (out.returncode, out.stderr) == (2, message)


def test_plan_memory_refuses_a_batch_longer_than_the_configs_engine_or_a_custom_script():
    """grpo-olmo3-32b's engine holds 2048 + 8192 = 10240 tokens per sequence; the custom backend has no vLLM."""
    out = hpcrl(
        "plan-memory",
        "--config",
        "grpo-olmo3-32b",
        "--learner-gpus",
        "16",
        "--sequences",
        "256",
        "--prompt-len",
        "2048",
        "--response-len",
        "9000",
    )
    assert (out.returncode, out.stderr) == (
        2,
        "hpcrl: error: --prompt-len 2048 + --response-len 9000 exceed the "
        "engine's max_model_len 10240; valid: at most that, or a larger "
        "--max-seq-len\n",
    )
    out = hpcrl(
        "plan-memory",
        "--config",
        "custom-ppo-qwen2.5-3b-qlora",
        "--cluster",
        "berzelius:fat",
        "--gpus",
        "1",
        "--sequences",
        "4",
        "--prompt-len",
        "10",
        "--response-len",
        "10",
    )
    assert out.returncode == 2 and out.stderr.startswith("hpcrl: error: --sequences: the custom config generates")


def test_docs_report_the_held_out_error_the_fit_prints():
    """docs/plan.md states the held-out median and max error that fit.py prints, all together, for the large-batch
    rows and for the batch-1 rows."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "vllm_throughput" / "fit.py")],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    held = out.stdout.split("held-out rows:")[1]
    median, worst = re.search(r"all \(\d+\): median \|error\| (\d+%), max (\d+%)", held).groups()
    v1 = re.search(r"v1 rows \(\d+\): median \|error\| (\d+%), max (\d+%)", held).groups()
    doc = (ROOT / "docs" / "plan.md").read_text()
    v0 = re.search(r"v0 rows \(\d+\): median \|error\| (\d+%), max (\d+%)", held).groups()
    assert f"held out: median {median}, max {worst}" in doc
    assert f"large-batch held out: median {v1[0]}, max {v1[1]}" in doc
    assert f"batch-1 held out: median {v0[0]}, max {v0[1]}" in doc
