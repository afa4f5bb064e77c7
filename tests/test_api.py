"""hpcrl.api (docs/api.md): each function returns what the command's --json prints, as objects; written as a
user's sweep script next to the same commands on the command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_plan_memory_prints_what_plan_memory_json_prints():
    """The issue's must-show, with a learner flag on top."""
    api = python("import hpcrl.api as h; print(h.plan_memory(model='32b', tokens_per_gpu=4096)"
                 ".learner.peak_allocated_gib)")
    assert float(api) == json.loads(cli("plan-memory", "--model", "32b", "--tokens-per-gpu", "4096", "--json"))[
        "learner"]["peak_allocated_gib"]


def test_plan_is_plan_json():
    api = python("import json, hpcrl.api as h; "
                 "print(json.dumps(h.plan(config='verl-grpo-qwen2.5-7b', nodes=4, top=2).to_dict()))")
    assert json.loads(api) == json.loads(cli("plan", "--config", "verl-grpo-qwen2.5-7b", "--nodes", "4", "--top", "2",
                                             "--json"))


def test_render_is_the_script_render_prints():
    api = python("import sys, hpcrl.api as h; sys.stdout.write(h.render(config='grpo-olmo3-7b', nodes=3, "
                 "sets=['hpcrl.run_name=api']))")
    assert api == cli("render", "--config", "grpo-olmo3-7b", "--nodes", "3", "--set", "hpcrl.run_name=api")


def test_a_misspelt_argument_is_one_line():
    from hpcrl.api import plan_memory
    from hpcrl.errors import HpcrlError

    with pytest.raises(HpcrlError, match="unknown argument 'tokens_per_gpus'"):
        plan_memory(model="32b", tokens_per_gpus=4096)


def test_render_json_carries_the_script_render_prints():
    d = json.loads(cli("render", "--config", "grpo-olmo3-7b", "--nodes", "3", "--json"))
    assert d["script"] == cli("render", "--config", "grpo-olmo3-7b", "--nodes", "3")
