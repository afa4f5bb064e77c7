"""The TRL learner's planned memory against the GPU rows: TRL 1.16.0's own GRPOTrainer loss path under DeepSpeed
0.19.8 ZeRO-3 on NVIDIA H200s (benchmarks/trl_memory.py; rows in benchmarks/results/trl_measured.jsonl, the
fit/held split fixed before the run in benchmarks/trl_split.txt).

Each row is asked as the shipped config with the row's settings through --set-style overrides (model,
per-device batch, completion length, the model length that bounds the prompt, beta, accumulation), exactly as
`hpcrl plan-memory --config trl-grpo-qwen2.5-7b --learner-gpus N` asks it; the expected value is the measured
peak (torch.cuda.max_memory_allocated of the step), never the model's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.planning import memory_question as mq
from hpcrl.planning.config import load_run_config
from hpcrl.profiles import resolve_profile

ROOT = Path(__file__).resolve().parents[1]
ROWS = [
    r
    for r in map(json.loads, (ROOT / "benchmarks/results/trl_measured.jsonl").read_text().splitlines())
    if r["status"] == "ok"
]
HELD = {
    p[0]
    for p in (
        line.split()
        for line in (ROOT / "benchmarks/trl_split.txt").read_text().splitlines()
        if not line.startswith("#")
    )
    if len(p) == 2 and p[1] == "held"
}
MODELS = {
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B",
    "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B",
    "qwen2.5-3b": "Qwen/Qwen2.5-3B",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B",
}
BOUND = 0.05


def planned_gib(row: dict) -> float:
    sets = [
        f"model_name_or_path={MODELS[row['model']]}",
        f"per_device_train_batch_size={row['batch']}",
        f"gradient_accumulation_steps={row['ga']}",
        f"max_completion_length={row['completion']}",
        f"vllm_max_model_length={row['seq']}",
        f"beta={row['beta']}",
        "num_generations=2",
        f"gradient_checkpointing={'true' if row['gc'] else 'false'}",
    ]
    q = mq.from_config(load_run_config("trl-grpo-qwen2.5-7b", sets))
    plan, _ = mq.answer(q, resolve_profile("isambard-ai"), learner_gpus=row["world"], vllm_tp=1)
    return plan.learner.peak_allocated / 2**30


def test_the_rows_name_the_versions_and_the_gpu():
    assert {(r["trl"], r["deepspeed"], r["torch"], r["gpu"]) for r in ROWS} == {
        ("1.16.0", "0.19.8", "2.11.0+cu130", "NVIDIA H200")
    }
    assert len(ROWS) == 16 and len(HELD) == 5 and all(r["zero_init"] for r in ROWS)


@pytest.mark.parametrize("row", [r for r in ROWS if r["shape_tag"] in HELD], ids=lambda r: r["shape_tag"])
def test_held_out_rows_within_5_percent(row):
    assert abs(planned_gib(row) / row["peak_alloc_gib"] - 1) <= BOUND


@pytest.mark.parametrize("row", [r for r in ROWS if r["shape_tag"] not in HELD], ids=lambda r: r["shape_tag"])
def test_fit_rows_within_5_percent(row):
    assert abs(planned_gib(row) / row["peak_alloc_gib"] - 1) <= BOUND


def test_the_fitted_constants_are_the_fit_of_the_fit_rows():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/fit_trl.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stdout[-800:] + out.stderr[-800:]


@pytest.mark.parametrize(
    "cmd",
    [
        ["plan-memory", "--backend", "trl", "--model", "32b"],
        ["render", "--config", "trl-grpo-qwen2.5-7b", "--nodes", "5"],
        ["render", "--config", "trl-grpo-qwen2.5-7b", "--nodes", "4", "--set", "vllm_mode=colocate"],
    ],
)
def test_a_job_without_ray_plans_no_ray_head_and_the_nodes_whole_ram(cmd):
    """TRL runs no Ray: no GCS or raylet in host RAM, and no memory monitor killing at 95% (the node's RAM is the
    limit); open-instruct's plan keeps both (2 GiB, 0.95: local-dev and Isambard-AI's ray.memory_kill_threshold)."""

    def host(args: list[str]) -> dict:
        out = subprocess.run(
            [sys.executable, "-m", "hpcrl", *args, "--cluster", "isambard-ai", "--json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        d = json.loads(out)
        return (d["job"]["plan"]["memory"] if "job" in d else d)["host"]  # render: the job's plan

    trl, oi = host(cmd), host(["plan-memory", "--model", "32b"])
    assert "Ray (GCS, raylet)" not in trl["breakdown"] and trl["kill_threshold"] == 1.0 and trl["ray"] is False
    assert trl["peak_gib"] == pytest.approx(sum(trl["breakdown"].values()), abs=0.1)
    assert oi["breakdown"]["Ray (GCS, raylet)"] == 2.0 and oi["kill_threshold"] == 0.95 and "ray" not in oi
