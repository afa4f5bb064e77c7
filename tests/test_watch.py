"""`hpcrl watch RUN --once | --json`: run directories made by real jobs on the local Slurm (a running job, an
ended chain, a job that died at start) and the report fixtures; what it must never do (write, ask Slurm
more than once per refresh, traceback on a bad run directory).

The jobs run the rendered script (Ray, the watchdog, the GPU monitor) around a stand-in for open-instruct's
grpo_fast.py that prints its step panels (tests/watch_harness.py). Expected values come from what the
stand-in printed and from plan.json, never from hpcrl's reading of them.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from helpers import assert_user_error
from lifecycle_harness import config, hpcrl, ok_json, wait_status
from watch_harness import (
    FETCHES,
    Page,
    counting_slurm,
    dead_slurm,
    fake_open_instruct,
    frame_step,
    registry_rows,
    reward_text,
    tree,
)

DATA = Path(__file__).parent / "data" / "runs"
CHAIN, BREAKER = DATA / "chain", DATA / "breaker"


def _records(run_dir: Path, kind: str = "step") -> list[dict]:
    try:
        lines = (run_dir / "hpcrl" / "step-times.jsonl").read_text().splitlines()
    except OSError:
        return []
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _wait_for(check, what: str, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > end:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(1)


def _watch_json(env, *args: str, path: str | None = None) -> dict:
    return ok_json(hpcrl(env, "watch", *args, "--json", path=path))


# --------------------------------------------------------------------------- a running job, then its end


def test_watch_follows_a_running_job_and_says_when_it_ended(slurm, env):
    fake_open_instruct(env, steps=8, pause=3, slower=1.5)
    run_id = ok_json(hpcrl(env, "submit", "--json", "--config", str(config(env, "live"))))["run_id"]
    run_dir = env["root"] / "live"
    try:
        # Files only (no `hpcrl status`): the registry still holds the run as submit left it, pending.
        _wait_for(lambda: len(_records(run_dir)) >= 2, "two steps in step-times.jsonl", 600)
        plan = json.loads((run_dir / "hpcrl" / "plan.json").read_text())
        rows = registry_rows(env["env"]["HPCRL_REGISTRY"])
        # One refresh: one squeue for the running job, nothing else asked of Slurm, nothing written.
        path, calls = counting_slurm(env["tmp"])
        snap = _watch_json(env, run_id, path=path)
        assert calls.read_text().split() == ["squeue"]
        assert registry_rows(env["env"]["HPCRL_REGISTRY"]) == rows
        job = snap["job"]
        assert snap["state"] == "running" and not snap["ended"], snap
        assert job["state"] == "RUNNING" and job["time_left_s"] > 0 and job["node_count"] == 1, job
        step = snap["progress"]["step"]
        assert step >= 2
        assert snap["metrics"]["step"] == step
        reward = snap["metrics"]["values"]["reward"]
        assert (reward["key"], reward["text"]) == ("scores", reward_text(step))
        assert snap["metrics"]["values"]["kl"]["key"] == "loss/kl_avg"
        t = snap["step_time"]
        assert (t["source"], t["plan_s"]) == ("framework", plan["layout"]["step_time_s"])
        assert t["median_s"] == pytest.approx(1.5 * plan["layout"]["step_time_s"], rel=1e-3)
        assert snap["progress"]["total_steps"] == plan["disk"]["total_steps"]
        assert snap["checkpoint"]["every_steps"] == plan["cadence"]["every_steps"]
        assert snap["disk"]["used_bytes"] > 0 and snap["disk"]["run_dir_peak_gib"] == plan["disk"]["run_dir_peak_gib"]
        assert snap["gpu"]["nodes"] == [] and "no NVIDIA GPU" in snap["gpu"]["note"]

        once = hpcrl(env, "watch", run_id, "--once")
        assert once.returncode == 0, once.stderr
        shown = frame_step(once.stdout)
        assert shown is not None and shown >= step, once.stdout
        assert f"reward (scores) {reward_text(shown)}" in once.stdout, once.stdout

        wait_status(env, run_id, lambda r: r["state"] == "ended", "the run to end", 600)
        snap = _watch_json(env, run_id)
        assert (snap["state"], snap["reason"], snap["ended"]) == ("ended", "completed", True), snap
        assert snap["progress"]["step"] == 8 and snap["metrics"]["values"]["reward"]["text"] == reward_text(8)
        once = hpcrl(env, "watch", run_id, "--once")
        assert f"run {run_id} ended: completed" in once.stdout, once.stdout
    finally:
        hpcrl(env, "cancel", run_id)


# --------------------------------------------------------------------------- an ended chain


def test_watch_and_report_html_of_an_ended_chain_change_nothing(slurm, env):
    """Job 1 prints steps 1-4 (a checkpoint after step 2) and is preempted; its continuation resumes at 3."""
    fake_open_instruct(env, steps=4, pause=0.5, hold=600, ckpt_at=2)
    run_id = ok_json(hpcrl(env, "submit", "--json", "--config", str(config(env, "chain", max_restarts=1))))["run_id"]
    run_dir = env["root"] / "chain"
    try:
        wait_status(env, run_id, lambda r: len(_records(run_dir)) >= 4, "the first job's four steps", 600)
        first = _records(run_dir)[0]["job"]
        subprocess.run(["scancel", "--signal=TERM", "--full", first], check=True, timeout=30)
        final = wait_status(env, run_id, lambda r: r["state"] == "ended", "the chain to end", 600)
    finally:
        hpcrl(env, "cancel", run_id)
    ids = [j["job_id"] for j in final["jobs"]]
    at = ids.index(first)
    assert [j["reason"] for j in final["jobs"][at:]] == ["preempted", "completed"], final

    before, rows = tree(run_dir), registry_rows(env["env"]["HPCRL_REGISTRY"])
    snap = _watch_json(env, run_id)
    once = hpcrl(env, "watch", run_id, "--once")
    by_dir = _watch_json(env, str(run_dir))
    assert tree(run_dir) == before and registry_rows(env["env"]["HPCRL_REGISTRY"]) == rows

    assert (snap["state"], snap["reason"], snap["ended"]) == ("ended", "completed", True)
    assert [(j["job_id"], j["end_reason"]) for j in snap["jobs"][at:]] == [
        (first, "preempted"),
        (ids[at + 1], "completed"),
    ]
    # The continuation resumed after the checkpoint at step 2: steps 3-6, so the last is 6.
    assert snap["progress"]["step"] == 6 and snap["metrics"]["values"]["reward"]["text"] == reward_text(6)
    assert [s for s, _ in snap["metrics"]["recent"]["reward"]] == [1, 2, 3, 4, 3, 4, 5, 6]
    assert snap["checkpoint"]["last_step"] == 2
    assert f"run {run_id} ended: completed" in once.stdout
    assert by_dir["jobs"] == snap["jobs"] and by_dir["progress"] == snap["progress"]

    # Its page: reward over steps 1-6 (a step the continuation repeated shows once, its later value); each job's
    # step times (its four steps each: eight), against the plan.
    page_file = env["tmp"] / "chain.html"
    proc = hpcrl(env, "report", run_id, "--html", str(page_file))
    assert proc.returncode == 0, proc.stderr
    text = page_file.read_text()
    assert FETCHES.search(text) is None
    page = Page()
    page.feed(text)
    assert page.drawn(page.chart("Reward over steps")) == {"reward (scores)": 6}
    times = page.chart("Step times over steps")
    assert page.drawn(times) == {"step": 8, "generation": 8, "training": 8}
    plan = json.loads((run_dir / "hpcrl" / "plan.json").read_text())
    assert f"plan {plan['layout']['step_time_s']:,.1f} s" in text
    assert tree(run_dir) == before  # the report wrote nothing there either


# --------------------------------------------------------------------------- a job that died at start


def test_watch_a_job_that_died_at_start(slurm, env):
    """A script that fails before it writes anything: no start line, no log, only Slurm knows."""
    script = env["tmp"] / "dies.sbatch"
    run_dir = env["root"] / "dies"
    script.write_text(
        "#!/bin/bash\n#SBATCH --job-name=hpcrl-test-dies\n#SBATCH --time=00:02:00\n"
        f"#SBATCH --output={env['tmp']}/slurm-%j.out\n# hpcrl-cluster: local-dev\n"
        f"RUN_DIR={run_dir}\nexit 3\n"
    )
    run_id = ok_json(hpcrl(env, "submit", "--json", str(script)))["run_id"]
    wait_status(env, run_id, lambda r: r["state"] == "ended", "the job to fail", 300)
    snap = _watch_json(env, run_id)
    job = snap["jobs"][-1]
    assert (snap["state"], snap["ended"], job["started"], job["slurm_state"]) == ("ended", True, None, "FAILED")
    assert snap["reason"] == "crashed" and job["end_reason"] == "crashed"
    assert any(m.startswith(f"logs/job-{job['job_id']}.log: not written") for m in snap["missing"]), snap["missing"]
    assert snap["metrics"]["step"] is None and snap["progress"]["step"] is None
    once = hpcrl(env, "watch", run_id, "--once")
    assert once.returncode == 0 and "Traceback" not in once.stderr
    assert f"run {run_id} ended: crashed" in once.stdout and "no training step in the job logs yet" in once.stdout


# --------------------------------------------------------------------------- fixture run directories


def test_chain_fixture_snapshot_is_what_its_files_say(env):
    """Slurm does not answer (a dead controller): states come from jobs.tsv, and the snapshot says so."""
    snap = _watch_json(env, str(CHAIN), path=dead_slurm(env["tmp"]))
    assert (snap["state"], snap["reason"], snap["ended"]) == ("ended", "completed", True)
    assert any(m.startswith("Slurm: ") for m in snap["missing"])
    assert [(j["job_id"], j["end_reason"], j["next_job"]) for j in snap["jobs"]] == [
        ("101", "timeout", "102"),
        ("102", "completed", None),
    ]
    # tests/data/runs/README.md: steps 5 (job 101), 6 and 7 (job 102); the job logs' panels print scores
    # 0.52, 0.61, 0.75; learner GPUs on n1 (peak 58000 MiB), engines on n2 (peak 70656 MiB); job 90's row is older.
    assert snap["metrics"]["recent"]["reward"] == [[5, 0.52], [6, 0.61], [7, 0.75]]
    assert snap["metrics"]["values"]["reward"] == {"key": "scores", "value": 0.75, "text": "0.75"}
    nodes = {n["node"]: (n["roles"], n["gpus"], n["peak_gib"], n["plan_gib"]) for n in snap["gpu"]["nodes"]}
    assert nodes == {
        "n1": (["learner"], 2, round(58000 / 1024, 2), 61.3),
        "n2": (["engine"], 2, round(70656 / 1024, 2), 68.0),
    }


# Each backend's step line (tests/data/logs/README.md), the run's plan.json naming the backend: the keys watch
# and report --html show are that backend's (its MetricFacts), the values those of the log's last step.
BACKEND_LOGS = {
    "verl": (
        "verl_grad_norm_zero.log",
        26,
        {
            "reward": ("critic/score/mean", "0.4140625"),
            "loss": ("actor/pg_loss", "-0.0095"),
            "grad_norm": ("actor/grad_norm", "0.0"),
            "kl": None,
            "reward_std": None,
        },
    ),
    "openrlhf": (
        "openrlhf_zero_variance.log",
        27,
        {
            "reward": ("reward", "1.0"),
            "loss": ("policy_loss", "0.0"),
            "grad_norm": ("actor_grad_norm", "0.0031"),
            "kl": ("kl", "0.0004"),
            "reward_std": ("group_reward_std", "0.0"),
        },
    ),
}


@pytest.mark.parametrize("backend", sorted(BACKEND_LOGS))
def test_each_backend_shows_its_own_metric_keys(env, tmp_path, backend):
    log, last, want = BACKEND_LOGS[backend]
    run_dir = tmp_path / backend
    (run_dir / "hpcrl").mkdir(parents=True)
    (run_dir / "logs").mkdir()
    (run_dir / "hpcrl" / "plan.json").write_text(json.dumps({"backend": backend}))
    (run_dir / "hpcrl" / "jobs.tsv").write_text(
        "7\tstart\t2026-03-02T11:00:00Z\tn1\n7\tend\t2026-03-02T11:30:00Z\tcompleted:0\n"
    )
    (run_dir / "logs" / "job-7.log").write_text((DATA.parent / "logs" / log).read_text())
    snap = _watch_json(env, str(run_dir), path=dead_slurm(env["tmp"]))
    assert (snap["backend"], snap["metrics"]["step"]) == (backend, last)
    got = {role: (v["key"], v["text"]) if v else None for role, v in snap["metrics"]["values"].items()}
    assert got == want
    page = Page()
    out = tmp_path / "page.html"
    proc = hpcrl(env, "report", str(run_dir), "--html", str(out))
    assert proc.returncode == 0, proc.stderr
    page.feed(out.read_text())
    assert set(page.drawn(page.chart("Reward over steps"))) == {
        f"{name} ({want[role][0]})"
        for role, name in (("reward", "reward"), ("reward_std", "reward spread"))
        if want[role]
    }


def test_a_run_directory_that_never_started_says_what_is_missing(env, tmp_path):
    run_dir = tmp_path / "never"
    (run_dir / "hpcrl").mkdir(parents=True)
    snap = _watch_json(env, str(run_dir), path=dead_slurm(env["tmp"]))
    assert (snap["state"], snap["ended"], snap["jobs"]) == ("not-started", True, [])
    assert "hpcrl/jobs.tsv: no job recorded yet" in snap["missing"]
    assert any(m.startswith("hpcrl/plan.json: missing") for m in snap["missing"])
    out = hpcrl(env, "watch", str(run_dir), "--once", path=dead_slurm(env["tmp"]))
    assert out.returncode == 0 and "Traceback" not in out.stderr
    assert "ended: no job recorded in hpcrl/jobs.tsv" in out.stdout


@pytest.mark.parametrize(
    "args, says",
    [
        (["/nonexistent/run"], "/nonexistent/run: no such run directory"),
        (["{tmp}"], "not an hpcrl run directory (no hpcrl/ inside"),
        (["no-such-run"], "unknown run 'no-such-run'"),
        ([], "no registry at "),
        (["{chain}", "--every", "0.5"], "--every 0.5: give at least 1 second"),
    ],
)
def test_bad_input_is_one_line(env, args, says):
    args = [a.format(tmp=env["tmp"], chain=CHAIN) for a in args]
    assert_user_error(hpcrl(env, "watch", *args, "--once"), says)


def test_no_live_run_is_one_line(slurm, env):
    fake_open_instruct(env, steps=1, pause=0)
    script = env["tmp"] / "ok.sbatch"
    script.write_text(
        f"#!/bin/bash\n#SBATCH --time=00:01:00\n#SBATCH --output={env['tmp']}/slurm-%j.out\n"
        f"# hpcrl-cluster: local-dev\nRUN_DIR={env['root'] / 'ok'}\nexit 0\n"
    )
    run_id = ok_json(hpcrl(env, "submit", "--json", str(script)))["run_id"]
    wait_status(env, run_id, lambda r: r["state"] == "ended", "the job to end", 300)
    assert_user_error(hpcrl(env, "watch", "--once"), "no live run in ")


# --------------------------------------------------------------------------- reading files that grow


def test_tail_reads_each_appended_line_once_and_whole(tmp_path):
    from hpcrl.logs.tail import Tail

    path = tmp_path / "grows.log"
    tail = Tail(path)
    assert tail.lines() == []  # not there yet
    path.write_text("one\ntw")
    assert tail.lines() == ["one"]  # the torn line waits
    with open(path, "a") as f:
        f.write("o\nthree\n")
    assert tail.lines() == ["two", "three"]
    assert tail.lines() == []
    big = tmp_path / "big.log"
    big.write_text("".join(f"line {i}\n" for i in range(1000)))  # 'line 999\n' is 9 bytes
    late = Tail(big, start_bytes=20)
    assert late.lines() == ["line 998", "line 999"]  # the fragment before them is skipped
