"""The capability table: each fact against the data file, the behaviour that follows from it,
and the drift script on a real git history."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.errors import ConfigError
from hpcrl.planning.backends.capabilities import BACKENDS, commit, feature, services, setting, supporters
from hpcrl.planning.config import load_run_config

ROOT = Path(__file__).resolve().parents[1]
TABLE = json.loads((ROOT / "hpcrl" / "planning" / "backends" / "data" / "capabilities.json").read_text())
CITE = re.compile(r"^[\w./-]+\.(py|yaml|sh|json|toml):\d+$")


def test_every_fact_cites_a_file_and_line_at_the_pinned_commit():
    flags = {
        "open-instruct": "open_instruct_args_current.json",
        "verl": "verl_args.json",
        "openrlhf": "openrlhf_args.json",
        "trl": "trl/1.16.0/grpo_args.json",
    }
    for b in BACKENDS:
        meta = json.loads((ROOT / "hpcrl" / "planning" / "backends" / "data" / flags[b]).read_text())["_meta"]
        assert commit(b) == meta["commit"], f"{b}: capabilities and flag table read at different commits"
        for section in ("features", "vllm"):
            for name, fact in TABLE[b][section].items():
                assert CITE.match(fact["source"]), (b, section, name, fact["source"])
        for s in services(b):
            assert CITE.match(s["source"]), (b, s)


# What each fact says, written out here (not computed from the table) so that a changed table fails.
@pytest.mark.parametrize(
    "backend,name,supported,source",
    [
        ("open-instruct", "lora", False, "open_instruct/grpo_fast.py:353"),
        ("open-instruct", "load_in_4bit", False, "open_instruct/model_utils.py:212"),
        ("open-instruct", "ref_policy", True, "open_instruct/model_utils.py:302"),
        ("open-instruct", "save_on_signal", False, "open_instruct/grpo_fast.py:2214"),
        ("open-instruct", "gradient_checkpointing", True, "open_instruct/grpo_fast.py:370"),
        ("verl", "lora", True, "verl/workers/fsdp_workers.py:442"),
        ("verl", "load_in_4bit", False, "verl/workers/fsdp_workers.py:406"),
        ("verl", "save_on_signal", False, "verl/trainer/ppo/ray_trainer.py:1634"),
        ("openrlhf", "lora", True, "openrlhf/models/actor.py:177"),
        ("openrlhf", "load_in_4bit", True, "openrlhf/models/actor.py:115"),
        ("openrlhf", "offload_params", False, "openrlhf/utils/deepspeed/deepspeed.py:438"),
        ("openrlhf", "save_on_signal", False, "openrlhf/utils/math_utils.py:298"),
        ("trl", "lora", True, "trl/trainer/model_config.py:103"),
        ("trl", "ref_policy", True, "trl/trainer/grpo_trainer.py:983"),
        ("trl", "sequence_parallel", False, "trl/trainer/grpo_config.py:1068"),
        ("trl", "save_on_signal", False, "transformers/trainer.py:3215"),
        ("trl", "resume", True, "trl/scripts/grpo.py:150"),
    ],
)
def test_feature_facts(backend, name, supported, source):
    f = feature(backend, name)
    assert f.supported is supported and f.source == source


@pytest.mark.parametrize(
    "backend,section,name,value",
    [
        ("open-instruct", "deepspeed", "grad_accum_dtype", "fp32"),
        ("open-instruct", "deepspeed", "zero_hpz_partition_size", 8),
        ("open-instruct", "vllm", "gpu_memory_utilization", 0.9),
        ("verl", "vllm", "gpu_memory_utilization", 0.5),
        ("openrlhf", "deepspeed", "grad_accum_dtype", None),
        ("openrlhf", "deepspeed", "zero_hpz_partition_size", 1),
        ("openrlhf", "vllm", "gpu_memory_utilization", 0.95),
    ],
)
def test_setting_facts(backend, section, name, value):
    assert setting(backend, section, name).value == value


def test_code_server_fact():
    (code, *_) = services("open-instruct")
    assert (
        code["default"] == "http://localhost:1234/test_program" and code["source"] == "open_instruct/data_loader.py:467"
    )
    assert "uvicorn open_instruct.code_utils.api:app" in code["start_command"] and "/health" in code["health"]


def test_lora_supporters_and_refusal():
    assert supporters("lora") == ["verl", "openrlhf", "trl"] and supporters("load_in_4bit") == ["openrlhf", "trl"]
    with pytest.raises(
        ConfigError,
        match=r"use_peft=true: open-instruct does not implement LoRA "
        r"\(open_instruct/grpo_fast.py:353 at e6c3044a\); backends that do: "
        r"verl \(actor_rollout_ref.model.lora_rank\), openrlhf \(--ds.lora.rank\), "
        r"trl \(use_peft\)",
    ):
        load_run_config("grpo-olmo3-7b", ["use_peft=true", "lora_r=16"])
    with pytest.raises(ConfigError, match="load_in_8bit=true: open-instruct does not implement 4-bit"):
        load_run_config("grpo-olmo3-7b", ["load_in_8bit=true"])
    load_run_config("grpo-olmo3-7b", ["use_peft=false"])  # off is fine


@pytest.mark.parametrize(
    "sets,needle",
    [
        (["--set", "use_peft=true"], "open-instruct does not implement LoRA"),
        (["--set", "load_in_4bit=true"], "open-instruct does not implement 4-bit"),
        (["--set", "total_episodes=-5"], "total_episodes -5: valid: a positive number of episodes"),
        (["--set", "learning_rate=-1"], "learning_rate -1: valid: a positive learning rate"),
        (["--set", "checkpoint_state_freq=0"], "checkpoint_state_freq 0: valid: a positive number of steps"),
        (["--set", "keep_last_n_checkpoints=-5"], "keep_last_n_checkpoints -5: valid: -1 (keep all), 0 or more"),
        (["--set", 'hpcrl.time="48:00:00"'], "hpcrl.time 48:00:00 exceeds partition workq's limit of 24:00:00"),
    ],
)
def test_render_refuses_with_one_line(sets, needle, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", "render", "--nodes", "16", *sets, "-o", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and not (tmp_path / "x").exists()
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], out.stderr


def test_over_the_time_limit_with_allow_over_limit_warns(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcrl",
            "render",
            "--nodes",
            "16",
            "--set",
            'hpcrl.time="48:00:00"',
            "--allow-over-limit",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "#SBATCH --time=48:00:00" in out.stdout
    assert "exceeds partition workq's limit of 24:00:00 (--allow-over-limit)" in out.stderr


def test_plan_never_suggests_lora_for_open_instruct():
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", "plan", "--nodes", "2"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2 and "would fit:" in out.stderr
    assert "peft" not in out.stderr.lower() and "lora" not in out.stderr.lower()


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        check=True,
        env={
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
            "PATH": "/usr/bin:/bin",
        },
    ).stdout.strip()


def test_drift_script_names_the_fact_whose_line_changed(tmp_path):
    """A framework repository where one cited line changes after the pinned commit: the script
    names that fact, and only that one."""
    repo = tmp_path / "fw"
    (repo / "pkg").mkdir(parents=True)
    _git(tmp_path, "init", "-q", str(repo))
    (repo / "pkg" / "train.py").write_text("a = 1\nmodel = load_bf16()\nc = 3\nsave = None\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "pinned")
    pinned = _git(repo, "rev-parse", "HEAD")
    table = {
        "_meta": {},
        "fw": {
            "repo": "x/fw",
            "commit": pinned,
            "features": {
                "lora": {"supported": False, "source": "pkg/train.py:2", "note": ""},
                "save_on_signal": {"supported": False, "source": "pkg/train.py:4", "note": "see pkg/train.py:1"},
            },
        },
    }
    (tmp_path / "table.json").write_text(json.dumps(table))
    run = [
        sys.executable,
        str(ROOT / "scripts" / "capabilities-drift"),
        "--repo",
        f"fw={repo}",
        "--table",
        str(tmp_path / "table.json"),
        "--to",
        "HEAD",
        "--json",
    ]
    same = subprocess.run(run, capture_output=True, text=True)
    assert same.returncode == 0 and not any(r["changed_by"] for r in json.loads(same.stdout)["citations"])
    (repo / "pkg" / "train.py").write_text("a = 1\nmodel = get_peft_model(load_bf16())\nc = 3\nsave = None\n")
    _git(repo, "commit", "-qam", "apply LoRA")
    out = subprocess.run(run, capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    rows = json.loads(out.stdout)["citations"]
    changed = {r["fact"]: r["changed_by"] for r in rows}
    assert changed["features.lora"] and "apply LoRA" in changed["features.lora"][0]
    assert changed["features.save_on_signal"] == []
    assert {r["cite"] for r in rows} == {"pkg/train.py:2", "pkg/train.py:4", "pkg/train.py:1"}
