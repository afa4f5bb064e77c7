"""verl's hybrid vLLM sleeps at level 2 (weights discarded: vllm_async_server.py:569 at b178a3cd,
:1131-1143 at 1dda039b), so a colocated verl run keeps no vLLM weights in host RAM; level 1
(OpenRLHF's default, vllm_engine.py:138-139 at 3c3be623) moves them there."""

from __future__ import annotations

import json

from helpers import run_hpcrl as hpcrl

ASLEEP = "vLLM weights while asleep (sleep level 1)"


def _host(*args: str) -> dict:
    out = hpcrl("plan-memory", *args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["host"]["breakdown"]


def test_verl_colocated_keeps_no_vllm_weights_in_host_ram_at_either_version():
    for version in ("b178a3cd", "1dda039b"):
        assert ASLEEP not in _host(
            "--config", "configs/verl-grpo-qwen2.5-7b.yaml", "--set", f"hpcrl.framework_version={version}"
        )
    assert ASLEEP not in _host("--backend", "verl", "--model", "Qwen/Qwen2.5-7B", "--colocated")


def test_a_level_1_sleeper_keeps_its_weights_in_host_ram():
    # Qwen2.5-7B's bf16 weights on one engine GPU per learner GPU: 7.62e9 x 2 B = 14.2 GiB each.
    host = _host("--backend", "openrlhf", "--model", "Qwen/Qwen2.5-7B", "--colocated")
    assert host[ASLEEP] > 14.0
