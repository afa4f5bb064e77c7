"""The run measures itself, on the real local Slurm with the rendered script (Ray included):
a continuation whose first job's metric lines show steps 3x slower than planned gets a shorter
checkpoint interval, and `hpcrl report` of the finished run shows plan vs real step time.

The driver is a fake grpo_fast.py (no GPU, no vLLM here): it prints open-instruct's step metrics
as JSON lines, with time/total three times the plan's step estimate read from plan.json, and the
line open-instruct's checkpoint-state timer logs.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

from lifecycle_harness import config, hpcrl, ok_json, wait_status

FAKE = r"""
import json, os, sys, time
argv = sys.argv[1:]
def opt(name):
    return argv[argv.index(name) + 1]
ckpt, job = opt("--checkpoint_state_dir"), os.environ["SLURM_JOB_ID"]
run_dir = os.path.dirname(ckpt)
os.makedirs(ckpt, exist_ok=True)
first = not any(f.startswith("freq-") for f in os.listdir(run_dir))
open(os.path.join(run_dir, f"freq-{job}"), "w").write(opt("--checkpoint_state_freq"))
plan = json.load(open(os.path.join(run_dir, "hpcrl", "plan.json")))
slow = 3 * plan["layout"]["step_time_s"]
start = 1 if first else 5
for step in range(start, start + 4):
    print(json.dumps({"training_step": step, "time/total": slow, "time/training": 0.6 * slow,
                      "time/group_generation_max": 0.4 * slow, "scores": 0.5, "loss/policy_avg": 0.1}), flush=True)
    if step == 2:
        print("[Main Thread] Saving checkpoint state: 2.500 seconds", flush=True)
        open(os.path.join(ckpt, "latest"), "w").write("global_step2")
    time.sleep(0.2)
if first:
    time.sleep(300)  # until the test preempts the job
"""

SLOWER = 3  # the fake's steps against the plan's estimate
FACTOR = 1.25  # the measured step's margin (docs/plan.md "Checkpoint cadence")


def _records(run_dir: Path) -> list[dict]:
    try:
        return [json.loads(ln) for ln in (run_dir / "hpcrl" / "step-times.jsonl").read_text().splitlines()]
    except OSError:
        return []


def test_continuation_after_slow_steps_checkpoints_more_often_and_report_shows_plan_vs_real(slurm, env):
    (env["workdir"] / "open_instruct" / "grpo_fast.py").write_text(FAKE)
    path = config(env, "slow", max_restarts=1)
    # Long sequences: a step the plan estimates at tens of seconds (the interval rests on it).
    path.write_text(
        path.read_text()
        .replace("response_length: 256", "response_length: 8192")
        .replace("pack_length: 1024", "pack_length: 16384")
        .replace("num_unique_prompts_rollout: 2", "num_unique_prompts_rollout: 64")
        .replace("num_samples_per_prompt_rollout: 2", "num_samples_per_prompt_rollout: 8")
    )
    run_id = ok_json(hpcrl(env, "submit", "--json", "--config", str(path)))["run_id"]
    run_dir = env["root"] / "slow"
    try:
        _check(env, run_id, run_dir)
    finally:
        hpcrl(env, "cancel", run_id)  # nothing left running when a check failed (an ended run: a no-op)


def _check(env, run_id: str, run_dir: Path) -> None:
    wait_status(
        env,
        run_id,
        lambda r: sum(x["kind"] == "step" for x in _records(run_dir)) >= 4,
        "the first job's four steps in step-times.jsonl",
        deadline_s=600,
    )
    # The job that printed them (a loaded machine may have continued the first job for a slow Ray start).
    first = _records(run_dir)[0]["job"]
    subprocess.run(["scancel", "--signal=TERM", "--full", first], check=True, timeout=30)
    final = wait_status(env, run_id, lambda r: r["state"] == "ended", "the chain to end", deadline_s=600)
    ids = [j["job_id"] for j in final["jobs"]]
    at = ids.index(first)
    assert [j["reason"] for j in final["jobs"][at:]] == ["preempted", "completed"], final
    second = ids[at + 1]

    plan = json.loads((run_dir / "hpcrl" / "plan.json").read_text())
    step, high = plan["layout"]["step_time_s"], plan["layout"]["step_time_high_s"]
    minutes = plan["cadence"]["max_lost_minutes"]
    # By hand (docs/plan.md "Checkpoint cadence"): the plan's interval rests on the upper step estimate,
    # floor(max_lost_minutes x 60 / upper step), the step at least 1 s; the continuation's on the
    # measured step (3 x the middle estimate, the fake's), x 1.25.
    planned = max(1, math.floor(minutes * 60 / max(high, 1.0)))
    measured = max(1, math.floor(minutes * 60 / max(SLOWER * step * FACTOR, 1.0)))
    got = (int((run_dir / f"freq-{first}").read_text()), int((run_dir / f"freq-{second}").read_text()))
    assert got == (planned, measured) and measured < planned, (got, planned, measured, step)

    report = hpcrl(env, "report", run_id)
    assert report.returncode == 0, report.stderr
    print(report.stdout)  # docs/report.md's example (pytest -s)
    row = next(ln for ln in report.stdout.splitlines() if ln.strip("│ ").startswith("step "))
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert cells[:2] + cells[3:5] + cells[6:7] == [
        "step",
        f"{step:,.1f}",
        f"{SLOWER * step:,.1f}",
        f"{SLOWER * step:,.1f}-{SLOWER * step:,.1f}",
        "3.00x",
    ], row
