"""Flags override configs in plan-memory, as docs/plan-memory.md says (issue 27 item 5): a colocated
config's vLLM utilisation comes from the flag, else the config, else hpcrl's layout planner, and the
'assumes' lines name the value the answer uses."""

from __future__ import annotations

import json
import subprocess
import sys


def plan_memory(*args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "hpcrl", "plan-memory", "--config", "verl-grpo-qwen2.5-7b", "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_flag_sets_the_engines_utilisation():
    d = plan_memory("--vllm-gpu-memory-utilization", "0.6")
    assert d["engine"]["gpu_memory_utilization"] == 0.6


def test_no_assumption_names_a_utilisation_the_answer_does_not_use():
    d = plan_memory()
    used = d["engine"]["gpu_memory_utilization"]
    named = [a for a in d["assumptions"] if a.startswith("vLLM gpu_memory_utilization")]
    assert named == [named[0]] and (f"utilization {used:g}:" in named[0] or "layout planner" in named[0]), named


def test_a_learner_cap_the_framework_cannot_keep_says_why():
    """Isambard-AI plans at most 1 learner per node; OpenRLHF packs its actor's one-GPU bundles (Ray PACK,
    cli/train_ppo_ray.py:48-49 at 3c3be623), so hpcrl cannot plan fewer, and the warning says so."""
    proc = subprocess.run(
        [sys.executable, "-m", "hpcrl", "plan", "--config", "openrlhf-grpo-qwen2.5-7b"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "OpenRLHF places its actor's one-GPU bundles with PACK" in proc.stderr, proc.stderr
