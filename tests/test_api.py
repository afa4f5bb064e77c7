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


def api_json(call: str) -> dict:
    """What `hpcrl.api.<call>` returns, as the dict its --json would print."""
    return json.loads(python(f"import json, hpcrl.api as h; print(json.dumps(h.{call}.to_dict()))"))


def test_plan_memory_prints_what_plan_memory_json_prints():
    """The issue's must-show, with a learner flag on top."""
    api = python(
        "import hpcrl.api as h; print(h.plan_memory(model='32b', tokens_per_gpu=4096).learner.peak_allocated_gib)"
    )
    assert (
        float(api)
        == json.loads(cli("plan-memory", "--model", "32b", "--tokens-per-gpu", "4096", "--json"))["learner"][
            "peak_allocated_gib"
        ]
    )


def test_plan_is_plan_json():
    assert api_json("plan(config='verl-grpo-qwen2.5-7b', nodes=4, top=2)") == json.loads(
        cli("plan", "--config", "verl-grpo-qwen2.5-7b", "--nodes", "4", "--top", "2", "--json")
    )


def test_render_is_the_script_render_prints():
    api = python(
        "import sys, hpcrl.api as h; sys.stdout.write(h.render(config='grpo-olmo3-7b', nodes=3, "
        "sets=['hpcrl.run_name=api']))"
    )
    assert api == cli("render", "--config", "grpo-olmo3-7b", "--nodes", "3", "--set", "hpcrl.run_name=api")


def test_a_misspelt_argument_is_one_line():
    from hpcrl.api import plan_memory
    from hpcrl.errors import HpcrlError

    with pytest.raises(HpcrlError, match="unknown argument 'tokens_per_gpus'"):
        plan_memory(model="32b", tokens_per_gpus=4096)


def test_render_json_carries_the_script_render_prints():
    d = json.loads(cli("render", "--config", "grpo-olmo3-7b", "--nodes", "3", "--json"))
    assert d["script"] == cli("render", "--config", "grpo-olmo3-7b", "--nodes", "3")


def test_plan_disk_is_plan_disk_json():
    assert api_json("plan_disk(model='32b', learners=16, checkpoint_state_freq=50, quota_gib=1500)") == json.loads(
        cli(
            "plan-disk",
            "--model",
            "32b",
            "--learners",
            "16",
            "--checkpoint-state-freq",
            "50",
            "--quota-gib",
            "1500",
            "--json",
        )
    )


def test_plan_disk_of_a_config_is_plan_disk_json():
    assert api_json(
        "plan_disk(config='openrlhf-grpo-qwen2.5-7b', sets=['ckpt.save_hf=true'], quota_gib=900)"
    ) == json.loads(
        cli(
            "plan-disk",
            "--config",
            "openrlhf-grpo-qwen2.5-7b",
            "--set",
            "ckpt.save_hf=true",
            "--quota-gib",
            "900",
            "--json",
        )
    )


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A user with a project dir (the shipped configs' run root) and a registry of their own."""
    monkeypatch.setenv("PROJECTDIR", str(tmp_path))
    monkeypatch.setenv("HPCRL_REGISTRY", str(tmp_path / "runs.db"))
    return tmp_path


def test_submit_dry_run_is_submit_json(home):
    """Two dry runs of one request: the same record but for the run id each draws."""
    api = api_json("submit(config='grpo-olmo3-7b', nodes=3, dry_run=True)")
    shown = json.loads(cli("submit", "--config", "grpo-olmo3-7b", "--nodes", "3", "--dry-run", "--json"))
    assert json.loads(json.dumps(api).replace(api["run_id"], "RUN")) == json.loads(
        json.dumps(shown).replace(shown["run_id"], "RUN")
    )


def _ended_chain(home) -> str:
    """A run of two jobs that Slurm has forgotten: job 101 hit its time limit and continued as 102, which
    completed; written as the job script writes jobs.tsv and the logs (docs/run-dir.md)."""
    from hpcrl.jobs.registry import Registry

    run_dir = home / "hpcrl-runs" / "chain"
    (run_dir / "hpcrl").mkdir(parents=True)
    (run_dir / "logs").mkdir()
    (run_dir / "hpcrl" / "jobs.tsv").write_text(
        "101\tstart\t2026-11-27T01:00:00Z\tn1\n101\tend\t2026-11-27T02:00:00Z\ttimeout:0\n"
        "101\tcontinue\t2026-11-27T02:00:01Z\t102\n102\tstart\t2026-11-27T02:01:00Z\tn2\n"
        "102\tend\t2026-11-27T02:30:00Z\tcompleted:0\n"
    )
    (run_dir / "hpcrl" / "restarts").write_text("1\n")
    (run_dir / "logs" / "job-101.log").write_text("step 1\nstep 2\n")
    (run_dir / "logs" / "job-102.log").write_text("resumed at step 2\nstep 3\n")
    reg = Registry(home / "runs.db")
    rid = reg.create_run(
        name="chain",
        cluster="local-dev",
        config_hash="0",
        script_path=str(run_dir / "hpcrl/job.sbatch"),
        run_dir=str(run_dir),
        state="pending",
        max_restarts=2,
    )
    reg.add_job(rid, "101", state="TIMEOUT", submitted="2026-11-27T00:59:00Z")
    reg.add_job(rid, "102", state="COMPLETED", submitted="2026-11-27T02:00:01Z")
    reg.set_run(rid, state="ended", reason="completed")
    return rid


def test_status_is_status_json(home):
    rid = _ended_chain(home)
    assert api_json(f"status({rid!r})") == json.loads(cli("status", rid, "--json"))


def test_status_reads_the_chain(home):
    rid = _ended_chain(home)
    api = python(f"import hpcrl.api as h; r = h.status({rid!r}).runs[0]; print(r.restarts, [j.job_id for j in r.jobs])")
    assert api.split(None, 1) == ["1", "['101', '102']\n"]


def test_logs_json_holds_what_logs_prints(home):
    rid = _ended_chain(home)
    d = json.loads(cli("logs", rid, "--json"))
    assert "".join(j["text"] for j in d["jobs"]) == cli("logs", rid)


def test_logs_is_logs_json(home):
    rid = _ended_chain(home)
    assert api_json(f"logs({rid!r})") == json.loads(cli("logs", rid, "--json"))


def test_cancel_of_an_ended_run_is_the_commands_error(home):
    from hpcrl.api import cancel
    from hpcrl.errors import HpcrlError

    rid = _ended_chain(home)
    proc = subprocess.run([sys.executable, "-m", "hpcrl", "cancel", rid], capture_output=True, text=True, timeout=120)
    with pytest.raises(HpcrlError) as raised:
        cancel(rid)
    assert proc.stderr == f"hpcrl: error: {raised.value}\n"


def test_runs_is_runs_json(home):
    _ended_chain(home)
    assert api_json("runs()") == json.loads(cli("runs", "--json"))


def test_logs_json_does_not_follow(home):
    from helpers import assert_user_error, run_hpcrl

    rid = _ended_chain(home)
    assert_user_error(run_hpcrl("logs", rid, "--json", "--follow"), "--follow")


def test_repair_runs_is_runs_repair_json(tmp_path):
    """Two copies of one registry with a page of noise: the API's repair and the command's keep the same
    runs and jobs (the damaged copy each moves aside is named by its own time stamp)."""
    from hpcrl.jobs.registry import Registry

    reg = Registry(tmp_path / "a" / "runs.db")
    for i in range(300):
        rid = reg.create_run(
            name=f"old{i}",
            cluster="local-dev",
            config_hash="h" * 12,
            script_path=f"/x/old{i}/job",
            run_dir=f"/x/old{i}",
            state="ended",
            max_restarts=2,
        )
        reg.add_job(rid, str(900000 + i))
    reg.close()
    data = bytearray((tmp_path / "a" / "runs.db").read_bytes())
    page = int.from_bytes(data[16:18], "big")
    victim = data.index(b"/x/old150/job") // page
    data[victim * page : (victim + 1) * page] = b"\xff" * page
    (tmp_path / "b").mkdir()
    for d in "ab":
        (tmp_path / d / "runs.db").write_bytes(bytes(data))
    api = api_json(f"repair_runs(registry={str(tmp_path / 'a' / 'runs.db')!r})")
    cmd = json.loads(cli("runs", "--repair", "--json", "--registry", str(tmp_path / "b" / "runs.db")))
    for d, got in (("a", api), ("b", cmd)):
        assert got.pop("moved_to").startswith(str(tmp_path / d / "runs.db.damaged-"))
        assert got.pop("registry") == str(tmp_path / d / "runs.db")
    assert api == cmd and 0 < api["runs"] < 300
