"""`hpcrl diagnose` on a custom-backend run (a user's own HF/TRL-style script, seed 003): the run
directory's plan.json describes the script's learner, and the fixes are re-planned in the run
config's keys. The run directory is made the way a job makes it: job.sbatch is `hpcrl render`'s
script and plan.json the text that script writes. The OOM lines are shaped after PyTorch's real
message (no GPU here).

Expected values: the halvings and the GPU come from the log and the config by hand; that a fix
fits is checked with a different command, `hpcrl plan-memory`, on the GPU the log reports
(berzelius:thin's A100-40GB), never with diagnose's own arithmetic.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "custom-ppo-qwen2.5-3b-qlora.yaml"
# An A100-40GB (berzelius thin) ran out in training: 35.10 GiB allocated + 3.20 GiB asked for.
OOM_40GB = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.20 GiB. GPU 0 has a total capacity of "
    "39.39 GiB of which 1.95 GiB is free. Of the allocated memory 35.10 GiB is allocated by PyTorch\n"
)


def hpcrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpcrl", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={"COLUMNS": "250", "NO_COLOR": "1", "PATH": "/usr/bin:/bin"},
    )


def run_dir(tmp_path: Path, log: str, *sets: str) -> Path:
    """A custom run rendered for a Berzelius fat GPU, its driver log holding `log`."""
    proc = hpcrl(
        "render",
        "--config",
        str(CONFIG),
        "--cluster",
        "berzelius:fat",
        "--gpus",
        "1",
        *[w for s in sets for w in ("--set", s)],
    )
    assert proc.returncode == 0, proc.stderr
    meta = tmp_path / "run" / "hpcrl"
    meta.mkdir(parents=True)
    (meta / "job.sbatch").write_text(proc.stdout)
    plan = re.search(r"<<'HPCRL_PLAN_JSON'\n(.*?)\nHPCRL_PLAN_JSON\n", proc.stdout, re.S)
    assert plan, "the rendered script writes no plan.json"
    (meta / "plan.json").write_text(plan.group(1))
    (meta / "driver.log").write_text('{"step": 1, "avg_reward": 0.1, "loss": 0.5}\n' + log)
    return meta.parent


def test_a_custom_run_that_ran_out_on_a_40gb_gpu_gets_fixes_in_its_config_keys(tmp_path):
    rd = run_dir(tmp_path, OOM_40GB, "mini_batch_size=48", "rollout_batch_size=48")
    proc = hpcrl("diagnose", str(rd), "--json")
    assert proc.returncode == 0, proc.stderr
    f = json.loads(proc.stdout)["findings"][0]
    assert f["kind"] == "cuda_oom" and f["details"]["capacity_gib"] == 39.39
    assert f["details"]["model"] == "Qwen/Qwen2.5-3B" and f["details"]["scale_transient"] == 1.0
    # 48 halves to 24 first (by hand); no open-instruct/verl/OpenRLHF key is proposed.
    assert f["fix"].startswith("mini_batch_size 48 -> 24 ")
    assert not re.search(r"pack_length|num_learners|deepspeed|actor_rollout_ref|train\.micro", f["fix"])
    # Each proposed setting fits a 40 GB GPU by plan-memory; the run as rendered does not.
    fixes = dict(re.findall(r"(mini_batch_size|max_response_length) \d+ -> (\d+)", f["fix"]))
    assert set(fixes) == {"mini_batch_size", "max_response_length"}, f["fix"]
    common = [
        "plan-memory",
        "--config",
        str(CONFIG),
        "--cluster",
        "berzelius:thin",
        "--learner-gpus",
        "1",
        "--json",
        "--set",
        "rollout_batch_size=48",
    ]
    before = json.loads(hpcrl(*common, "--set", "mini_batch_size=48").stdout)
    assert before["learner"]["fits"] is False
    for key, value in fixes.items():
        sets = ["--set", f"{key}={value}"] + (["--set", "mini_batch_size=48"] if key != "mini_batch_size" else [])
        after = json.loads(hpcrl(*common, *sets).stdout)
        assert after["learner"]["fits"] is True, (key, value, after["verdict"])


def test_a_log_that_shows_more_than_the_plan_scales_the_batch_terms_and_says_far_off(tmp_path):
    """The shipped config plans ~9 GiB on the GPU; a log showing 78 GiB means the config does not
    describe the script (the users' first settings were 16x the batch): said, not hidden."""
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 12.00 GiB. GPU 0 has a total capacity of "
        "79.15 GiB of which 10.50 GiB is free. Of the allocated memory 66.20 GiB is allocated by PyTorch\n"
    )
    proc = hpcrl("diagnose", str(run_dir(tmp_path, oom)), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    f = data["findings"][0]
    assert "far off: check that the run config's batch and lengths are the script's" in f["cause"]
    assert f["fix"].startswith("mini_batch_size 4 -> 2 ") and f["details"]["scale_transient"] > 1.5
    assert any(
        "the plan matches the log's 78.2 GiB (resident terms as derived)" in a for a in data["assumptions"]
    )  # 66.20 + 12.00


def test_a_run_the_plan_says_fits_is_not_given_a_made_up_fix(tmp_path):
    """Figures within what the plan predicts for the run's own GPU: nothing to re-plan."""
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 0.50 GiB. GPU 0 has a total capacity of "
        "79.15 GiB of which 0.40 GiB is free. Of the allocated memory 5.00 GiB is allocated by PyTorch\n"
    )
    proc = hpcrl("diagnose", str(run_dir(tmp_path, oom)), "--json")
    assert proc.returncode == 0, proc.stderr
    f = json.loads(proc.stdout)["findings"][0]
    assert f["fix"].startswith("the planner predicts that the run as read fits") and f["details"]["planner_fits"]


def test_backend_custom_needs_the_run_directory(tmp_path):
    log = tmp_path / "oom.log"
    log.write_text(OOM_40GB)
    proc = hpcrl("diagnose", str(log), "--backend", "custom")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"hpcrl: error: --backend custom: give the run directory, not {log}: its hpcrl/plan.json describes the "
        "script's learner"
    ]


def test_grpo_scoring_oom_halves_the_prompts_and_is_not_read_as_a_vllm_engine(tmp_path):
    """GRPO, 16 prompts x 8 samples per generate call: the scoring pass peaks. The traceback
    names the script's own load_model (a word diagnose also looks for in vLLM tracebacks): a
    custom run has no vLLM engine, so it is a training-process OOM, re-planned in its keys."""
    oom = (
        'Traceback (most recent call last):\n  File "train.py", line 88, in <module>\n    model = load_model(args)\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.50 GiB. GPU 0 has a total capacity of "
        "39.39 GiB of which 2.10 GiB is free. Of the allocated memory 33.90 GiB is allocated by PyTorch\n"
    )
    grpo = ["algorithm=grpo", "critic=none", "samples_per_prompt=8"]
    rd = run_dir(tmp_path, oom, *grpo, "rollout_batch_size=16")
    f = json.loads(hpcrl("diagnose", str(rd), "--json").stdout)["findings"][0]
    assert f["kind"] == "cuda_oom" and f["details"]["peak_phase"] == "scoring"
    m = re.search(r"rollout_batch_size 16 -> (\d+) \((\d+) sequences per generate call\)", f["fix"])
    assert m and int(m.group(2)) == 8 * int(m.group(1)), f["fix"]  # the group size kept
    common = [
        "plan-memory",
        "--config",
        str(CONFIG),
        "--cluster",
        "berzelius:thin",
        "--learner-gpus",
        "1",
        "--json",
        *[w for s in grpo for w in ("--set", s)],
    ]
    assert json.loads(hpcrl(*common, "--set", "rollout_batch_size=16").stdout)["learner"]["fits"] is False
    assert json.loads(hpcrl(*common, "--set", f"rollout_batch_size={m.group(1)}").stdout)["learner"]["fits"] is True


def test_a_plan_json_without_the_learner_says_it_cannot_replan(tmp_path):
    rd = run_dir(tmp_path, OOM_40GB)
    plan = json.loads((rd / "hpcrl" / "plan.json").read_text())
    del plan["memory"]["learner"]["prompt_len"]  # as hpcrl wrote it before diagnose read custom runs
    (rd / "hpcrl" / "plan.json").write_text(json.dumps(plan))
    f = json.loads(hpcrl("diagnose", str(rd), "--json").stdout)["findings"][0]
    assert f["fix"].startswith("cannot re-plan the script's learner: the run's plan.json does not describe it")


def test_planner_flags_of_the_ray_backends_are_refused_for_a_custom_run(tmp_path):
    proc = hpcrl("diagnose", str(run_dir(tmp_path, OOM_40GB)), "--learner-gpus", "2")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "hpcrl: error: --learner-gpus and --tokens-per-gpu do not apply to a custom run: its learner comes from the "
        "run's hpcrl/plan.json (re-render the run to change it)"
    ]
