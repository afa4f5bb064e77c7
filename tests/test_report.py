"""`hpcrl report RUN`: fixture run directories (tests/data/runs/) and a real local Slurm smoke run.

Fixtures (written for these tests, see tests/data/runs/README.md):
- chain: job 101 timed out, its continuation 102 completed; job 90 in jobs.tsv (and one GPU
  row) belong to an earlier run of the same name; learner GPUs on n1, engine GPUs on n2;
  plan.json with the planner's memory; one HF save and one DeepSpeed state checkpoint.
- breaker: job 201 stopped by the watchdog on zero reward; a machine without GPUs (the
  monitor's no_gpu_found marker); plan.json of a run submitted as a bare script.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import NODE
from hpcrl.cli import main
from hpcrl.jobs.registry import Registry
from hpcrl.logs import report as rp

DATA = Path(__file__).parent / "data" / "runs"
CHAIN, BREAKER = DATA / "chain", DATA / "breaker"
PNG = b"\x89PNG\r\n\x1a\n"


def hpcrl(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 120):
    e = {k: v for k, v in os.environ.items() if not k.startswith("HPCRL_")}
    e.update(NO_COLOR="1", COLUMNS="200", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, env=e, cwd=cwd, timeout=timeout
    )


def user_error(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcrl: error: "), proc.stderr
    return lines[0]


# --------------------------------------------------------------------------- fixture run directories


def test_chain_jobs_durations_nodes_and_reason():
    r = rp.build_report(CHAIN)
    assert (r["state"], r["reason"], r["breaker"], r["cluster"]) == ("ended", "completed", None, "berzelius")
    jobs = [
        (
            j["job_id"],
            j["head_node"],
            j["started"],
            j["ended"],
            j["queued_s"],
            j["duration_s"],
            j["end_reason"],
            j["exit_code"],
            j["next_job"],
            j["log"],
        )
        for j in r["jobs"]
    ]
    assert jobs == [
        (
            "101",
            "n1",
            "2026-03-02T09:00:30Z",
            "2026-03-02T10:59:30Z",
            30.0,
            7140.0,
            "timeout",
            0,
            "102",
            "logs/job-101.log",
        ),
        (
            "102",
            "n2",
            "2026-03-02T11:05:01Z",
            "2026-03-02T11:45:01Z",
            330.0,
            2400.0,
            "completed",
            0,
            None,
            "logs/job-102.log",
        ),
    ]
    assert r["jobs"][1]["submitted"] == "2026-03-02T10:59:31Z"  # the `continue` line of job 101
    assert (r["run_time_s"], r["elapsed_s"]) == (9540.0, 9871.0)
    assert r["other_jobs_in_run_dir"] == ["90"]  # an earlier run in the same directory
    assert r["nodes"] == [
        {"node": "n1", "head_of_jobs": ["101"], "roles": ["learner"], "gpus": 2, "no_gpu": False},
        {"node": "n2", "head_of_jobs": ["102"], "roles": ["engine"], "gpus": 2, "no_gpu": False},
    ]


def test_chain_checkpoints_with_sizes():
    r = rp.build_report(CHAIN)
    assert r["checkpoints"] == [
        {"path": "checkpoints/global_step6", "kind": "state", "step": 6, "bytes": 4000, "complete": True},
        {"path": "output_checkpoints/step_6", "kind": "hf", "step": 6, "bytes": 4096, "complete": True},
    ]
    assert r["checkpoint_bytes"] == 8096


def test_last_metrics_come_from_the_newest_job_log():
    m = rp.build_report(CHAIN)["metrics"]
    assert (m["log"], m["step"], m["steps_in_log"], m["reward_key"]) == ("logs/job-102.log", 7, 2, "scores")
    assert m["values"]["scores"] == 0.75 and m["values"]["loss/policy_avg"] == -0.03
    assert m["values"]["val/stop_rate"] == 0.85 and m["text"]["loss/kl_avg"] == "0.00e+00"
    # The step, its reward and its loss first (loss/total_avg is open-instruct's first loss key).
    assert rp.headline(m)[:4] == [
        ("training_step", "7"),
        ("scores", "0.75"),
        ("loss/total_avg", "-0.02"),
        ("objective/verifiable_reward", "0.75"),
    ]


@pytest.mark.parametrize(
    "fixture, reward, loss, grad",
    [
        ("openrlhf_zero_variance.log", ("reward", "1.0"), ("policy_loss", "0.0"), ("actor_grad_norm", "0.0031")),
        (
            "verl_grad_norm_zero.log",
            ("critic/score/mean", "0.4140625"),
            ("actor/pg_loss", "-0.0095"),
            ("actor/grad_norm", "0.0"),
        ),
    ],
)
def test_every_backends_reward_and_loss_head_the_table(tmp_path, fixture, reward, loss, grad):
    """`hpcrl report` on an OpenRLHF or verl run: the last step's reward, loss and gradient norm in the table."""
    (tmp_path / "hpcrl").mkdir()
    shutil.copy(Path(__file__).parent / "data" / "logs" / fixture, tmp_path / "hpcrl" / "driver.log")
    proc = hpcrl("report", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout[proc.stdout.index("Last metrics") :]
    rows = [line.strip("│┃ ").split("│") for line in table.splitlines() if "│" in line]
    assert [tuple(c.strip() for c in r) for r in rows[:3]] == [reward, loss, grad]


def test_report_reads_the_runs_own_reward_keys(tmp_path):
    """A plan.json naming the watchdog's reward keys (hpcrl.reward_keys): the report reads the reward by them."""
    (tmp_path / "hpcrl").mkdir()
    shutil.copy(
        Path(__file__).parent / "data" / "logs" / "areal_json_zero_reward.log", tmp_path / "hpcrl" / "driver.log"
    )
    assert rp.build_report(tmp_path)["metrics"]["reward_key"] == "grpo_actor/task_reward/avg"  # a known key
    (tmp_path / "hpcrl" / "plan.json").write_text(json.dumps({"reward_keys": ["grpo_actor/task_reward/max"]}))
    m = rp.build_report(tmp_path)["metrics"]
    assert (m["step"], m["reward_key"], m["grad_norm_key"]) == (
        28,
        "grpo_actor/task_reward/max",
        "grpo_actor/update/grad_norm",
    )


def test_report_says_a_reward_key_was_never_seen(tmp_path):
    """`hpcrl report` on an AReaL run whose hpcrl.reward_keys names a key AReaL never logs: a warning line."""
    (tmp_path / "hpcrl").mkdir()
    shutil.copy(
        Path(__file__).parent / "data" / "logs" / "areal_console_zero_reward.log", tmp_path / "hpcrl" / "driver.log"
    )
    (tmp_path / "hpcrl" / "plan.json").write_text(json.dumps({"reward_keys": ["task_reward"]}))
    proc = hpcrl("report", str(tmp_path))
    assert "warning: 28 training steps and the reward key task_reward in none of them" in proc.stdout, proc.stdout


def test_gpu_peaks_per_role_next_to_the_plan():
    r = rp.build_report(CHAIN)
    assert r["plan"] == {
        "model": "Qwen/Qwen2.5-7B",
        "gpu_total_gib": 80.0,
        "learner_peak_gib": 61.3,
        "engine_weights_gib": 14.2,
        "engine_kv_cache_gib": 51.1,
        "gpu_memory_utilization": 0.85,
        "engine_reserved_gib": 68.0,
    }
    # 58000.5 MiB on n1 GPU 0 (the 79000 MiB row is from the earlier run; an unreadable row and a torn
    # line are skipped); 70656 MiB = 69 GiB on n2 GPU 1.
    assert r["gpu"]["samples"] == 9 and r["gpu"]["earlier_run_samples"] == 1 and r["gpu"]["note"] is None
    learner, engine = r["memory"]
    assert learner == {
        "role": "learner",
        "measured_peak_gib": 56.641,
        "predicted_gib": 61.3,
        "predicted_as": "learner device total",
        "ratio": 0.924,
        "node": "n1",
        "gpu": 0,
        "time": "2026-03-02T09:30:00+00:00",
        "gpus": 2,
        "samples": 5,
    }
    assert (engine["measured_peak_gib"], engine["predicted_gib"], engine["ratio"], engine["node"], engine["gpu"]) == (
        69.0,
        68.0,
        1.015,
        "n2",
        1,
    )
    assert [(g["node"], g["gpu"], g["peak_mib"]) for g in r["gpu"]["per_gpu"]] == [
        ("n1", 0, 58000.5),
        ("n1", 1, 57000.0),
        ("n2", 0, 69632.0),
        ("n2", 1, 70656.0),
    ]


def test_idle_gpus_get_no_prediction(tmp_path):
    """A node whose monitor labelled GPUs by their processes (--detect-roles): the idle GPU is
    listed with its own peak and no prediction, the learner GPU against the learner's."""
    run = tmp_path / "run"
    shutil.copytree(CHAIN, run)
    (run / "hpcrl" / "gpu-n3.csv").write_text(
        "timestamp,node,role,gpu,memory_used_mib,memory_total_mib,utilization_pct,power_w,mean_power_w,flag\n"
        "2026-03-02T11:10:00+00:00,n3,idle,0,512.0,81920.0,0.0,60.0,60.0,\n"
        "2026-03-02T11:10:00+00:00,n3,idle,1,600.0,81920.0,0.0,61.0,61.0,\n"
        "2026-03-02T11:10:05+00:00,n3,learner,0,61440.0,81920.0,90.0,400.0,230.0,\n"
    )
    mem = {m["role"]: m for m in rp.build_report(run)["memory"]}
    assert list(mem) == ["learner", "engine", "idle"]
    assert (mem["idle"]["measured_peak_gib"], mem["idle"]["predicted_gib"], mem["idle"]["ratio"]) == (0.586, None, None)
    assert (mem["learner"]["measured_peak_gib"], mem["learner"]["node"], mem["learner"]["ratio"]) == (60.0, "n3", 0.979)


def test_breaker_run_without_gpus_or_plan():
    r = rp.build_report(BREAKER)
    assert (r["state"], r["reason"]) == ("ended", "breaker-zero-reward")
    assert r["breaker"] == {
        "reason": "zero_reward",
        "exit_code": 90,
        "step": 14,
        "message": "mean reward (scores) exactly 0 for 10 consecutive steps (5-14)",
        "time": "2026-04-10T12:25:31+00:00",
    }
    assert [(j["job_id"], j["duration_s"], j["end_reason"], j["exit_code"]) for j in r["jobs"]] == [
        ("201", 1530.0, "breaker-zero-reward", 90)
    ]
    assert r["gpu"]["note"] == "no GPU samples (the monitor found no NVIDIA GPU on n3)"
    assert r["gpu"]["no_gpu_nodes"] == ["n3"] and r["gpu"]["samples"] == 0
    assert r["nodes"] == [{"node": "n3", "head_of_jobs": ["201"], "roles": ["head"], "gpus": 0, "no_gpu": True}]
    assert r["plan"] is None and r["memory"] == [] and r["checkpoints"] == []
    assert r["metrics"]["step"] == 14 and r["metrics"]["text"]["scores"] == "0.00e+00"


def test_breaker_names_the_reason_when_the_job_died_before_its_end_line(tmp_path):
    run = tmp_path / "breaker"
    shutil.copytree(BREAKER, run)
    tsv = run / "hpcrl" / "jobs.tsv"
    tsv.write_text("".join(ln for ln in tsv.read_text().splitlines(True) if "\tend\t" not in ln))
    r = rp.build_report(run)
    assert (r["state"], r["reason"]) == ("unknown", "breaker-zero-reward")
    assert r["jobs"][0]["duration_s"] is None


def test_breaker_of_an_earlier_run_is_ignored(tmp_path):
    run = tmp_path / "breaker"
    shutil.copytree(BREAKER, run)
    data = json.loads((run / "hpcrl" / "breaker.json").read_text())
    (run / "hpcrl" / "breaker.json").write_text(json.dumps({**data, "time": "2026-04-09T12:00:00+00:00"}))
    assert rp.build_report(run)["breaker"] is None


def test_pending_run_does_not_take_an_earlier_runs_files():
    """A new run in the chain fixture's directory, submitted (job 300) but not started yet."""
    row = {
        "run_id": "chain-000001",
        "name": "chain",
        "cluster": "berzelius",
        "state": "pending",
        "reason": "Priority",
        "created": "2026-03-05T10:00:00Z",
        "jobs": [
            {
                "job_id": "300",
                "state": "PENDING",
                "reason": "Priority",
                "exit_code": None,
                "submitted": "2026-03-05T10:00:01Z",
                "ended": None,
            }
        ],
    }
    r = rp.build_report(CHAIN, row)
    assert [(j["job_id"], j["slurm_state"], j["end_reason"], j["started"]) for j in r["jobs"]] == [
        ("300", "PENDING", None, None)
    ]
    assert (r["state"], r["reason"]) == ("pending", "Priority")
    assert r["other_jobs_in_run_dir"] == ["90", "101", "102"]
    # Every row of both CSVs (12, the torn one included: its time still reads) is from before the run.
    assert r["gpu"]["samples"] == 0 and r["gpu"]["earlier_run_samples"] == 12 and r["nodes"] == []
    assert [m["measured_peak_gib"] for m in r["memory"]] == [None, None]


def test_mixed_nodes_compare_with_the_larger_prediction(tmp_path):
    run = tmp_path / "mixed"
    shutil.copytree(CHAIN, run)
    for csv in (run / "hpcrl").glob("gpu-*.csv"):
        csv.write_text(csv.read_text().replace(",learner,", ",mixed,").replace(",engine,", ",head,"))
    rows = {m["role"]: m for m in rp.build_report(run)["memory"]}
    assert list(rows) == ["learner", "engine", "mixed", "head"]
    assert rows["learner"]["measured_peak_gib"] is None and rows["learner"]["predicted_gib"] == 61.3
    assert (rows["mixed"]["measured_peak_gib"], rows["mixed"]["predicted_gib"]) == (56.641, 68.0)
    assert (rows["head"]["measured_peak_gib"], rows["head"]["ratio"]) == (69.0, 1.015)


def test_directory_without_events_or_monitor(tmp_path):
    (tmp_path / "bare" / "hpcrl").mkdir(parents=True)
    r = rp.build_report(tmp_path / "bare")
    assert r["jobs"] == [] and r["state"] == "unknown" and r["reason"] is None and r["metrics"] is None
    assert r["gpu"]["note"] == "no GPU samples (no hpcrl/gpu-*.csv in the run directory)"


def test_formatting_helpers():
    assert [rp.fmt_duration(s) for s in (None, 9, 330, 7140, 9871)] == ["-", "9s", "5m 30s", "1h 59m 00s", "2h 44m 31s"]
    assert [rp.fmt_bytes(n) for n in (512, 4096, 8096, 3 * 2**30)] == ["512 B", "4.00 KiB", "7.91 KiB", "3.00 GiB"]


# --------------------------------------------------------------------------- the command


def test_json_schema_is_stable():
    proc = hpcrl("report", str(CHAIN), "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert sorted(r) == [
        "breaker",
        "checkpoint_bytes",
        "checkpoints",
        "cluster",
        "elapsed_s",
        "gpu",
        "jobs",
        "memory",
        "metrics",
        "name",
        "nodes",
        "other_jobs_in_run_dir",
        "plan",
        "reason",
        "run_dir",
        "run_id",
        "run_time_s",
        "schema_version",
        "state",
        "timing",
    ]
    assert sorted(r["timing"]) == ["file", "interval", "last_stop", "note", "records", "rows", "warnings"]
    assert r["schema_version"] == 1 and r["run_dir"] == str(CHAIN.resolve()) and r["run_id"] is None
    assert sorted(r["jobs"][0]) == [
        "duration_s",
        "end_reason",
        "ended",
        "exit_code",
        "failure",
        "head_node",
        "job_id",
        "log",
        "next_job",
        "queued_s",
        "ray_logs",
        "ray_logs_lost",
        "ray_logs_missing",
        "ray_logs_recovered",
        "seq",
        "slurm_state",
        "stack_check",
        "started",
        "submitted",
    ]
    assert sorted(r["memory"][0]) == [
        "gpu",
        "gpus",
        "measured_peak_gib",
        "node",
        "predicted_as",
        "predicted_gib",
        "ratio",
        "role",
        "samples",
        "time",
    ]
    assert sorted(r["gpu"]) == ["earlier_run_samples", "files", "no_gpu_nodes", "note", "per_gpu", "samples"]


def test_terminal_summary():
    proc = hpcrl("report", str(CHAIN))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "chain ended (completed)" in out and "cluster berzelius" in out
    assert "run time 2h 39m 00s in 2 job(s); first start to last end 2h 44m 31s" in out
    assert "nodes: n1 (head of 101): learner, 2 GPUs; n2 (head of 102): engine, 2 GPUs" in out
    assert "Checkpoints (7.91 KiB)" in out and "output_checkpoints/step_6" in out
    assert "Last metrics: step 7 (logs/job-102.log)" in out
    for cells in (
        ["101", "n1", "1h 59m 00s", "timeout:0", "102"],
        ["102", "n2", "5m 30s", "40m 00s", "completed:0"],
        ["learner", "56.64", "n1 GPU 0", "61.30", "92.4%"],
        ["engine", "69.00", "n2 GPU 1", "68.00", "101.5%"],
    ):
        assert any(all(c in line for c in cells) for line in out.splitlines()), (cells, out)
    proc = hpcrl("report", str(BREAKER))
    assert proc.returncode == 0, proc.stderr
    assert "circuit breaker: zero_reward (exit 90, step 14): mean reward (scores) exactly 0" in proc.stdout
    assert "no GPU samples (the monitor found no NVIDIA GPU on n3)" in proc.stdout
    assert "nodes: n3 (head of 201): head, no GPU found" in proc.stdout
    assert rp.NO_PLAN in proc.stdout and "checkpoints: none" in proc.stdout


def test_markdown_file(tmp_path):
    md = tmp_path / "chain.md"
    proc = hpcrl("report", str(CHAIN), "--markdown", str(md))
    assert proc.returncode == 0, proc.stderr
    text = md.read_text()
    assert text.startswith("# Run chain\n")
    for line in (
        "- state: **ended**, reason **completed**",
        "- run time: 2h 39m 00s in 2 job(s); first start to last end 2h 44m 31s",
        "| 0 | 101 | n1 | 2026-03-02T09:00:00Z | 2026-03-02T09:00:30Z | 2026-03-02T10:59:30Z | 30s | 1h 59m 00s "
        "| timeout:0 | 102 |",
        "| state | 6 | 3.91 KiB | yes | `checkpoints/global_step6` |",
        "Step 7 from `logs/job-102.log` (2 steps in that log).",
        "| scores | 0.75 |",
        "| learner | 56.64 | n1 GPU 0 (2 GPUs, 5 samples) | 61.30 | learner device total | 92.4% |",
        "| engine | 69.00 | n2 GPU 1 (2 GPUs, 4 samples) | 68.00 | vLLM reservation (utilization x total) | 101.5% |",
    ):
        assert line in text.splitlines(), line
    md2 = tmp_path / "breaker.md"
    assert hpcrl("report", str(BREAKER), "--markdown", str(md2)).returncode == 0
    text = md2.read_text()
    assert (
        "- circuit breaker: zero_reward (exit 90, step 14): mean reward (scores) exactly 0 for 10 "
        "consecutive steps (5-14)" in text
    )
    assert "no GPU samples (the monitor found no NVIDIA GPU on n3)." in text and "No checkpoints." in text


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    for run in (CHAIN, BREAKER):  # with samples, and with only the no-GPU marker
        png = tmp_path / f"{run.name}.png"
        proc = hpcrl("report", str(run), "--plot", str(png), "--json")
        assert proc.returncode == 0, proc.stderr
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 10_000
        assert json.loads(proc.stdout)["run_dir"] == str(run.resolve())  # stdout stays JSON
        assert f"plot: {png}" in proc.stderr


def test_plot_without_matplotlib_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    png = tmp_path / "x.png"
    assert main(["report", str(CHAIN), "--plot", str(png)]) == 2
    err = capsys.readouterr().err
    assert err == "hpcrl: error: --plot needs matplotlib: pip install 'hpcrl[plot]'\n"
    assert not png.exists()


def test_bad_runs_are_one_line(tmp_path):
    env = {"HPCRL_REGISTRY": str(tmp_path / "runs.db")}
    assert "unknown run 'nope'" in user_error(hpcrl("report", "nope", env=env, cwd=tmp_path))
    assert "no such run directory" in user_error(hpcrl("report", str(tmp_path / "gone"), env=env))
    (tmp_path / "plain").mkdir()
    assert "not an hpcrl run directory" in user_error(hpcrl("report", str(tmp_path / "plain"), env=env))
    line = user_error(hpcrl("report", str(CHAIN), "--markdown", str(tmp_path / "no" / "x.md"), env=env))
    assert "/no does not exist" in line


def _registered(tmp_path: Path) -> tuple[Path, str]:
    """A copy of the chain fixture recorded in a fresh registry as an ended run."""
    run_dir = tmp_path / "runs" / "chain"
    shutil.copytree(CHAIN, run_dir)
    reg = Registry(tmp_path / "runs.db")
    run_id = reg.create_run(
        name="chain",
        cluster="berzelius",
        config_hash="abc",
        script_path=str(run_dir / "x"),
        run_dir=str(run_dir),
        state="ended",
        max_restarts=2,
        reason="completed",
    )
    for jid in ("101", "102"):
        reg.add_job(run_id, jid, submitted="2026-03-02T09:00:00Z")
    reg.update_jobs(
        [
            j._replace(state="COMPLETED" if j.job_id == "102" else "TIMEOUT", ended="2026-03-02T12:00:00Z")
            for j in reg.get(run_id).jobs
        ]
    )
    reg.create_run(
        name="other",
        cluster="x",
        config_hash="d",
        script_path="s",
        run_dir=str(tmp_path / "o"),
        state="dry-run",
        max_restarts=0,
    )
    reg.close()
    return run_dir, run_id


def test_run_id_from_the_registry(tmp_path):
    run_dir, run_id = _registered(tmp_path)
    env = {"HPCRL_REGISTRY": str(tmp_path / "runs.db")}
    for ref in (run_id, run_id[:9], "102", str(run_dir)):  # id, prefix, a job id, the directory
        proc = hpcrl("report", ref, "--json", env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        r = json.loads(proc.stdout)
        assert (r["run_id"], r["state"], r["reason"], r["run_dir"]) == (run_id, "ended", "completed", str(run_dir))
        assert [(j["job_id"], j["slurm_state"]) for j in r["jobs"]] == [("101", "TIMEOUT"), ("102", "COMPLETED")]
        assert r["jobs"][1]["ended"] == "2026-03-02T11:45:01Z"  # jobs.tsv, not the registry's later note
        assert r["other_jobs_in_run_dir"] == ["90"]
    line = user_error(hpcrl("report", "nope", env=env, cwd=tmp_path))
    assert line.startswith("hpcrl: error: unknown run 'nope'") and "recent runs: other-" in line and run_id in line
    dry = [r.run_id for r in Registry(tmp_path / "runs.db").list_runs() if r.state == "dry-run"][0]
    assert "is a dry run" in user_error(hpcrl("report", dry, env=env, cwd=tmp_path))
    shutil.rmtree(run_dir)
    assert "does not exist" in user_error(hpcrl("report", run_id, env=env, cwd=tmp_path))


# --------------------------------------------------------------------------- the real local Slurm

# local-dev as scripts/dev-slurm runs it, with host RAM declared for the planner (the emulated
# nodes share this machine's RAM), as tests/test_render_e2e.py does.
PROFILE = "name: report-e2e\nextends: local-dev\nnode: {ram_gib: 512}\n"


def test_report_on_a_local_slurm_smoke_run(slurm, tmp_path):
    for module, why in (
        ("ray", "the smoke job needs ray (pip install 'ray[default]')"),
        ("hpcrl.rendering.render", "the renderer (hpcrl/rendering/render.py) is not in this tree"),
    ):
        if importlib.util.find_spec(module) is None:  # CI (HPCRL_REQUIRE_SLURM=1) must run this, never skip it
            (pytest.fail if os.environ.get("HPCRL_REQUIRE_SLURM") == "1" else pytest.skip)(why)
    (tmp_path / "clusters").mkdir()
    (tmp_path / "clusters" / "report-e2e.yaml").write_text(PROFILE)
    env = {"HPCRL_REGISTRY": str(tmp_path / "runs.db"), "HPCRL_CLUSTERS_DIR": str(tmp_path / "clusters")}
    proc = hpcrl(
        "submit",
        "--json",
        "--cluster",
        "report-e2e",
        "--nodes",
        "3",
        "--smoke",
        "--config",
        "grpo-olmo3-7b",
        "--set",
        "model_name_or_path=Qwen/Qwen2.5-0.5B",
        "--pin",
        "learners=1",
        "--pin",
        "learner_nodes=3",
        "--pin",
        "tp=1",
        "--set",
        f"hpcrl.run_root={tmp_path / 'runs'}",
        "--set",
        "hpcrl.run_name=rpt",
        "--set",
        'hpcrl.time="00:05:00"',
        "--set",
        "hpcrl.env_setup=[]",
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    sub = json.loads(proc.stdout)
    run_id, job = sub["run_id"], sub["job_id"]
    deadline = time.monotonic() + 600
    while True:
        st = hpcrl("status", run_id, "--json", env=env, cwd=tmp_path)
        assert st.returncode == 0, st.stderr
        run = json.loads(st.stdout)["runs"][0]
        if run["state"] in ("ended", "failed"):
            break
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job], check=False)
            pytest.fail(f"run {run_id} did not end in 600 s: {run}")
        time.sleep(2)
    log = Path(sub["log"]).read_text(errors="replace") if Path(sub["log"]).exists() else ""
    assert (run["state"], run["reason"]) == ("ended", "completed"), log

    proc = hpcrl("report", run_id[:8], "--json", "--markdown", str(tmp_path / "r.md"), env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert (r["run_id"], r["state"], r["reason"], r["breaker"]) == (run_id, "ended", "completed", None)
    (j,) = r["jobs"]
    assert (j["job_id"], j["end_reason"], j["exit_code"], j["slurm_state"]) == (job, "completed", 0, "COMPLETED")
    assert j["head_node"] in slurm.nodes and j["log"] == f"logs/job-{job}.log"
    assert j["started"] and j["ended"] and j["duration_s"] is not None and j["duration_s"] >= 0
    # Three nodes, each with the monitor's no-GPU marker: the head (role head) and two workers (mixed).
    assert len(r["nodes"]) == 3 and all(n["no_gpu"] for n in r["nodes"])
    assert {n["node"] for n in r["nodes"] if n["head_of_jobs"] == [job]} == {j["head_node"]}
    assert sorted(role for n in r["nodes"] for role in n["roles"]) == ["head", "mixed", "mixed"]
    assert r["gpu"]["samples"] == 0 and len(r["gpu"]["no_gpu_nodes"]) == 3
    assert re.match(rf"no GPU samples \(the monitor found no NVIDIA GPU on {NODE}", r["gpu"]["note"]), r["gpu"]["note"]
    # The prediction from plan.json is still shown, with nothing measured beside it.
    assert r["plan"]["model"] == "Qwen/Qwen2.5-0.5B" and r["plan"]["gpu_total_gib"] == 139.8
    assert [(m["role"], m["measured_peak_gib"]) for m in r["memory"]] == [("learner", None), ("engine", None)]
    assert r["memory"][1]["predicted_gib"] == pytest.approx(139.8 * r["plan"]["gpu_memory_utilization"], abs=1e-3)
    assert r["checkpoints"] == [] and r["metrics"] is None  # the smoke driver trains nothing
    assert "no GPU samples" in (tmp_path / "r.md").read_text()
    text = hpcrl("report", run_id, env=env, cwd=tmp_path)
    assert text.returncode == 0 and "no GPU samples" in text.stdout and "completed" in text.stdout, text.stderr


def _failed_chain(tmp_path: Path) -> Path:
    """A job on n1 (head) and n2 (worker) that died worker-died, recorded its failure continuation,
    and then wrote no `continue` line (its sbatch failed); only n1's Ray logs were kept."""
    run = tmp_path / "failed"
    (run / "hpcrl").mkdir(parents=True)
    (run / "logs" / "ray" / "301" / "n1").mkdir(parents=True)
    (run / "logs" / "worker-n2-301.log").write_text("hpcrl: ray on n2 ...\n")
    (run / "hpcrl" / "jobs.tsv").write_text(
        "301\tstart\t2026-03-02T09:00:00Z\tn1\n"
        "301\tfailure\t2026-03-02T09:10:00Z\tworker-died n2\n"
        "301\tend\t2026-03-02T09:10:00Z\tworker-died:95\n"
    )
    return run


def test_a_continuation_whose_sbatch_failed_is_not_called_continued(tmp_path):
    job = rp.build_report(_failed_chain(tmp_path))["jobs"][0]
    assert rp.end_text(job) == "worker-died:95 (the continuation's sbatch failed: resubmit by hand)"


def test_the_node_that_kept_no_ray_logs_is_named(tmp_path):
    proc = hpcrl("report", str(_failed_chain(tmp_path)))
    assert "job 301: no Ray logs kept from n2 (the node was lost" in proc.stdout, proc.stdout
    assert "still missing: the next job of yours on that node recovers them" in proc.stdout, proc.stdout


def test_ray_logs_a_later_job_recovered_are_named_with_that_job(tmp_path):
    """n2's Ray logs of job 301, copied by job 305's sweep of n2 (its mark, as the job script writes
    it: "<job> <UTC time>"): the report names the recovery, and n2 no longer as missing."""
    run = _failed_chain(tmp_path)
    (run / "logs" / "ray" / "301" / "n2").mkdir()
    (run / "logs" / "ray" / "301" / "n2" / "hpcrl-recovered").write_text("305 2026-03-02T10:00:04Z\n")
    proc = hpcrl("report", str(run))
    assert "job 301: Ray logs of n2 recovered later, by job 305 at 2026-03-02T10:00:04Z" in proc.stdout, proc.stdout
    assert "no Ray logs kept" not in proc.stdout, proc.stdout


def test_an_unreadable_jobs_tsv_is_one_line(tmp_path):
    """A stand-in for EIO without root: jobs.tsv is a directory (reading it fails with an OSError
    other than 'not found'); the report is one line naming run-dir-unwritable, exit 2."""
    run = _failed_chain(tmp_path)
    (run / "hpcrl" / "jobs.tsv").unlink()
    (run / "hpcrl" / "jobs.tsv").mkdir()
    proc = hpcrl("report", str(run))
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and "run-dir-unwritable" in proc.stderr, (
        proc.stderr
    )
