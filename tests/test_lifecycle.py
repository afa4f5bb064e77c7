"""submit → status → logs → cancel, time-out continuation, crash, concurrency — on the real local Slurm.

Commands run as a user runs them (`python -m hpcrl ...`), each test with its own registry,
run root, cluster profile and fake open-instruct checkout (`hpcrl.workdir`). Runs are
submitted two ways:

- `config`: `hpcrl submit --config run.yaml`, rendered by hpcrl/rendering/render.py — the real script
  with Ray bring-up, the watchdog and the job-chain traps (skipped if the renderer is absent);
- `script`: `hpcrl submit SCRIPT` of a HAND-WRITTEN stand-in that implements only
  docs/run-dir.md (jobs.tsv events, USR1/TERM traps, requeue rules): it tests hpcrl's side of
  the contract (submit, registry, chain following, logs, cancel) without Ray.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hpcrl.jobs.lifecycle import JobEvents, RunDir, read_chain
from hpcrl.jobs.registry import Job
from lifecycle_harness import (
    KINDS,
    _has_renderer,
    NO_SBATCH,
    assert_user_error,
    behave,
    hpcrl,
    ok_json,
    rows,
    script,
    submit,
    submit_args,
    wait_status,
)

# --------------------------------------------------------------------------- no cluster needed


def test_read_chain_reasons_continuations_and_torn_lines(tmp_path):
    rd = RunDir(tmp_path)
    rd.meta.mkdir()
    rd.jobs_tsv.write_text(
        "7\tsubmitted\t2026-01-01T00:00:00Z\t-\n7\tstart\t2026-01-01T00:00:01Z\tn1\n"
        "7\tend\t2026-01-01T00:00:09Z\ttimeout:0\n7\tcontinue\t2026-01-01T00:00:09Z\t8\n"
        "8\tstart\t2026-01-01T00:00:10Z\tn2\n8\tend\t2026-01-01T00:00:11Z\tbreaker-nan-loss:91\n8\tcontin"
    )
    chain = read_chain(rd)
    assert chain["7"].end_reason == "timeout" and chain["7"].next_job == "8" and chain["7"].start == "n1"
    assert chain["8"].end_reason == "breaker-nan-loss" and chain["8"].exit_code == 91 and chain["8"].next_job is None


def test_script_without_run_dir_is_a_user_error(env):
    bad = env["tmp"] / "x.sbatch"
    bad.write_text("#!/bin/bash\necho hi\n")
    assert_user_error(hpcrl(env, "submit", str(bad)), "no RUN_DIR=... line in the script; pass --run-dir DIR")


def test_dry_run_into_a_live_runs_dir_is_refused_like_a_submit(env):
    """A run still pending in the run dir: the dry run says what the real submit would, and
    records nothing; a dry-run row itself holds no run dir."""
    from hpcrl.jobs.registry import Registry

    path = script(env, "held")
    reg = Registry(env["env"]["HPCRL_REGISTRY"])
    live = reg.create_run(
        name="held",
        cluster="local-dev",
        config_hash="h",
        script_path=str(path),
        run_dir=str(env["root"] / "held"),
        state="pending",
        max_restarts=2,
    )
    line = assert_user_error(hpcrl(env, "submit", "--dry-run", str(path)), f"run {live} is still pending in ")
    assert line.endswith(f"{env['root'] / 'held'}; hpcrl cancel {live}, or pick another hpcrl.run_name")
    assert [r["run_id"] for r in rows(env, "runs")] == [live]
    reg.set_run(live, state="ended")
    first = ok_json(hpcrl(env, "submit", "--dry-run", "--json", str(path)))["run_id"]
    second = ok_json(hpcrl(env, "submit", "--dry-run", "--json", str(path)))["run_id"]
    assert {r["state"] for r in rows(env, "runs") if r["run_id"] in (first, second)} == {"dry-run"}


def test_unknown_run_id_lists_recent_runs(env):
    assert_user_error(hpcrl(env, "status", "nope"), "the registry has no runs yet")
    ids = [ok_json(hpcrl(env, "submit", "--dry-run", "--json", str(script(env, f"d{i}"))))["run_id"] for i in range(2)]
    for cmd in ("status", "logs", "cancel"):
        line = assert_user_error(hpcrl(env, cmd, "nope"), "unknown run 'nope'")
        assert f"recent runs: {ids[1]}, {ids[0]}" in line


def test_no_sbatch_on_path_is_one_line(env):
    proc = hpcrl(env, "submit", str(script(env, "nosb")), path=str(env["tmp"] / "empty-bin"))
    assert proc.returncode == 2 and proc.stderr.strip() == f"hpcrl: error: {NO_SBATCH}"
    assert rows(env, "runs") == [] and not (env["root"] / "nosb").exists()  # nothing written


def test_unwritable_run_dir_fails_the_run_before_sbatch(env):
    """The run dir's parent is a file: one-line error, the run recorded as failed, sbatch (a
    fake that leaves a mark) never runs."""
    fake_bin = env["tmp"] / "fake-bin"
    fake_bin.mkdir()
    mark = env["tmp"] / "sbatch-ran"
    (fake_bin / "sbatch").write_text(f"#!/bin/sh\ntouch {mark}\necho 1\n")
    (fake_bin / "sbatch").chmod(0o755)
    blocker = env["tmp"] / "a-file"
    blocker.write_text("not a directory\n")
    proc = hpcrl(
        env,
        "submit",
        "--run-dir",
        str(blocker / "run"),
        str(script(env, "nodir")),
        path=f"{fake_bin}:{os.environ['PATH']}",
    )
    (run,) = rows(env, "runs")
    line = assert_user_error(proc, f"run dir {blocker / 'run'}: Not a directory")
    assert line.endswith(f"(run {run['run_id']} recorded as failed)")
    assert run["state"] == "failed" and run["reason"] == "run dir: Not a directory"
    assert not mark.exists() and rows(env, "jobs") == []


def test_every_file_submit_writes_is_0600(env):
    """Under the common umask 022, submit's files (script, plan, restart counter, jobs.tsv) are the
    owner's alone; sbatch is a fake that accepts the job and runs nothing."""
    fake_bin = env["tmp"] / "fake-bin"
    fake_bin.mkdir()
    (fake_bin / "sbatch").write_text("#!/bin/sh\necho 4242\n")
    (fake_bin / "sbatch").chmod(0o755)
    old = os.umask(0o022)
    try:
        out = ok_json(
            hpcrl(
                env, "submit", "--json", *submit_args(env, "config", "modes"), path=f"{fake_bin}:{os.environ['PATH']}"
            )
        )
    finally:
        os.umask(old)
    meta = Path(out["run_dir"]) / "hpcrl"
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in meta.iterdir() if p.is_file()}
    assert modes == {
        "job.sbatch": "0o600",
        "plan.json": "0o600",
        "restarts": "0o600",
        "jobs.tsv": "0o600",
        "failure-restarts": "0o600",
        "chain.lock": "0o600",
    }


@pytest.mark.parametrize(
    "events", [JobEvents(), JobEvents(end_reason="cancelled", exit_code=143, ended="2026-11-26T22:00:00Z")]
)
def test_a_completing_job_has_its_end_time(events):
    """COMPLETING (Slurm waits for the processes of a cancelled job): the job has ended, with or
    without its own end line; the line's time wins when it wrote one."""
    from hpcrl.jobs import lifecycle, slurm

    job = Job("r", 0, "7", "RUNNING", "", None, "2026-11-26T21:00:00Z", None)
    row = lifecycle._job_row(job, slurm.JobState("7", "COMPLETING", "", None, "squeue"), events)
    assert row.ended == events.ended if events.ended else row.ended is not None


def test_rendered_script_submitted_as_script(env):
    """A script from the renderer, given back as SCRIPT: RUN_DIR, cluster and max_restarts are read from it."""
    rendered = ok_json(
        hpcrl(env, "submit", "--dry-run", "--json", *submit_args(env, "config", "again", max_restarts=4))
    )
    out = ok_json(hpcrl(env, "submit", "--dry-run", "--json", rendered["script"]))
    assert out["run_dir"] == str(env["root"] / "again")
    new = [r for r in rows(env, "runs") if r["run_id"] == out["run_id"]][0]
    assert (new["cluster"], new["max_restarts"], new["name"]) == ("lc-test", 4, "again")


# --------------------------------------------------------------------------- the real local Slurm


@pytest.mark.parametrize("kind", KINDS)
def test_submit_status_logs_cancel(slurm, env, kind, leftovers):
    behave(env, sleep=300)
    out = submit(env, kind, "life")
    run_id, job = out["run_id"], out["job_id"]
    assert re.fullmatch(r"life-[0-9a-f]{6}", run_id) and job.isdigit()
    rd = RunDir(env["root"] / "life")
    assert out["log"] == str(rd.log(job)) and out["script"] == str(rd.script)
    if kind == "script":
        assert rd.script.read_text() == script(env, "life").read_text()  # the exact text
        assert json.loads(rd.plan.read_text())["script"] == str(script(env, "life"))
    else:
        assert json.loads(rd.plan.read_text())["cluster"] == "lc-test"
    assert job in read_chain(rd)  # the `submitted` line
    (run,) = rows(env, "runs")
    assert run["run_id"] == run_id and run["run_dir"] == str(rd.path) and run["max_restarts"] == 2
    assert run["cluster"] == ("lc-test" if kind == "config" else "local-dev")
    assert run["state"] in ("pending", "submitting")

    def driver_started(_run) -> bool:
        return rd.log(job).exists() and f"wrote marker-{job}" in rd.log(job).read_text()

    status = wait_status(env, run_id, driver_started, "the driver to start")
    assert status["state"] == "running" and status["jobs"][0]["state"] == "RUNNING"
    logs = hpcrl(env, "logs", run_id[:8])
    assert logs.returncode == 0 and f"fake grpo_fast: job {job} wrote marker-{job}" in logs.stdout
    assert ok_json(hpcrl(env, "runs", "--json"))["runs"][0]["run_id"] == run_id

    proc = hpcrl(env, "cancel", run_id)
    assert proc.returncode == 0, proc.stderr
    assert rd.cancel.exists()
    final = wait_status(env, run_id, lambda r: r["state"] == "ended", "the cancel to land")
    assert final["reason"] == "cancelled" and len(final["jobs"]) == 1
    assert final["jobs"][0]["state"] == "CANCELLED" and final["jobs"][0]["ended"]
    chain = read_chain(rd)[job]
    assert chain.next_job is None  # no continuation after a cancel
    assert chain.end_reason == "cancelled"  # the trap wrote it before Slurm's KillWait ran out
    assert rows(env, "runs")[0]["reason"] == "cancelled" and rows(env, "runs")[0]["state"] == "ended"
    assert [r["job_id"] for r in rows(env, "jobs")] == [job]
    assert_user_error(hpcrl(env, "cancel", run_id), "nothing to cancel")
    assert leftovers(job) == []  # the cancelled job's cleanup ran before Slurm's KillWait


def test_cancel_of_a_three_node_run_leaves_nothing_on_any_node(slurm, env, leftovers):
    """Cancel while the driver runs on a 3-node job: Slurm signals every node; each worker's
    step stops its Ray and removes its node-local directories, the head records the end."""
    behave(env, sleep=300)
    out = submit(env, "config", "wide", nodes=3)
    run_id, job = out["run_id"], out["job_id"]
    rd = RunDir(env["root"] / "wide")
    wait_status(
        env,
        run_id,
        lambda _r: rd.log(job).exists() and f"wrote marker-{job}" in rd.log(job).read_text(),
        "the driver to start on 3 nodes",
    )
    assert "Ray is up: 3 nodes, 12 GPUs" in rd.log(job).read_text()
    assert hpcrl(env, "cancel", run_id).returncode == 0
    final = wait_status(env, run_id, lambda r: r["state"] == "ended", "the cancel to land")
    assert final["reason"] == "cancelled" and read_chain(rd)[job].end_reason == "cancelled"
    assert leftovers(job) == [], rd.log(job).read_text()


@pytest.mark.parametrize("kind", KINDS)
def test_timeout_continues_in_new_job_that_resumes(slurm, env, kind):
    """A job on `short` gets USR1 30 s before its limit; a NEW job resumes from its marker.

    Slurm sends the warning up to its 30 s check period early, so the rendered script (which
    must bring Ray up before the driver writes its marker) runs with the partition's 2 min.
    """
    behave(env, sleep=300)
    time_ = "00:02:00" if kind == "config" else "00:01:00"
    out = submit(env, kind, "tmo", partition="short", time_=time_, max_restarts=1)
    run_id, first = out["run_id"], out["job_id"]
    rd = RunDir(env["root"] / "tmo")
    # `logs -f` follows across the continuation and returns when the run has ended.
    follow = hpcrl(env, "logs", run_id, "-f", "--poll", "0.5", timeout=600)
    assert follow.returncode == 0, follow.stderr
    final = wait_status(env, run_id, lambda r: r["state"] == "ended", "the chain to end")
    jobs = final["jobs"]
    assert len(jobs) == 2 and jobs[0]["job_id"] == first
    second = jobs[1]["job_id"]
    assert second != first
    assert (jobs[0]["reason"], jobs[1]["reason"]) == ("timeout", "completed")
    assert final["reason"] == "completed" and final["restarts"] == 1
    # the new job saw the first job's checkpoint marker in the same run dir
    assert (rd.path / "checkpoints" / f"resumed-{second}").read_text() == f"marker-{first}"
    assert read_chain(rd)[first].next_job == second
    assert f"wrote marker-{first}" in follow.stdout and f"job {second} resumed from marker-{first}" in follow.stdout
    assert follow.stdout.index(f"marker-{first}") < follow.stdout.index(f"job {second} resumed")
    assert f"==> job {second}" in follow.stderr
    assert [(r["seq"], r["job_id"]) for r in rows(env, "jobs")] == [(0, first), (1, second)]
    assert [r["reason"] for r in rows(env, "jobs")] == ["timeout", "completed"]


@pytest.mark.parametrize("kind", KINDS)
def test_crash_is_not_continued(slurm, env, kind):
    behave(env, sleep=0, exit_code=3)
    out = submit(env, kind, "crash")
    final = wait_status(env, out["run_id"], lambda r: r["state"] == "ended", "the crash")
    assert final["reason"] == "crashed" and len(final["jobs"]) == 1
    assert final["jobs"][0]["exit_code"] == 3 and final["restarts"] == 0
    rd = RunDir(env["root"] / "crash")
    assert read_chain(rd)[out["job_id"]].next_job is None
    assert rows(env, "runs")[0]["reason"] == "crashed"


# The end reasons of docs/run-dir.md ("Reasons"): exit 90 breaker-zero-reward, 93 breaker-dead-worker.
@pytest.mark.parametrize("code,reason", [(90, "breaker-zero-reward"), (93, "breaker-dead-worker")])
def test_driver_exit_code_names_the_end_on_real_slurm(slurm, env, code, reason):
    behave(env, sleep=0, exit_code=code)
    out = submit(env, "config", f"exit{code}")
    final = wait_status(env, out["run_id"], lambda r: r["state"] == "ended", f"the exit {code}")
    assert [(j["reason"], j["exit_code"]) for j in final["jobs"]] == [(reason, code)]
    assert final["reason"] == reason and final["restarts"] == 0


@pytest.mark.parametrize("max_restarts", [1, 0])
def test_preemption_on_real_slurm_continues_up_to_max_restarts(slurm, env, max_restarts):
    """Preemption as Slurm delivers it (SIGTERM to the batch shell and every step, no cancel marker):
    the rendered script ends the job `preempted` and continues it while max_restarts allows."""
    behave(env, sleep=300)
    name = f"pre{max_restarts}"
    out = submit(env, "config", name, max_restarts=max_restarts)
    run_id, first = out["run_id"], out["job_id"]
    rd = RunDir(env["root"] / name)
    marker = rd.path / "checkpoints" / f"marker-{first}"
    wait_status(env, run_id, lambda r: marker.exists(), "the driver's first checkpoint marker")
    subprocess.run(["scancel", "--signal=TERM", "--full", first], check=True, timeout=30)
    final = wait_status(env, run_id, lambda r: r["state"] == "ended", "the chain to end")
    reasons = [j["reason"] for j in final["jobs"]]
    if max_restarts:
        second = final["jobs"][1]["job_id"]
        assert reasons == ["preempted", "completed"] and final["restarts"] == 1
        assert (rd.path / "checkpoints" / f"resumed-{second}").read_text() == f"marker-{first}"
    else:
        assert reasons == ["preempted"] and final["reason"] == "preempted" and final["restarts"] == 0
        assert read_chain(rd)[first].next_job is None


def test_submit_asks_slurm_before_refusing_a_run_dir_its_ended_job_held(slurm, env):
    """The registry still says pending (no `hpcrl status` ran), Slurm has ended the job: submit
    refreshes the holder's state first and takes the run dir."""
    behave(env, sleep=0, exit_code=3)
    first = submit(env, "script", "held")
    end = time.monotonic() + 120
    while subprocess.run(["squeue", "-h", "-j", first["job_id"]], capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < end, "the crashing job did not end"
        time.sleep(0.5)
    assert rows(env, "runs")[0]["state"] in ("pending", "submitting")  # as recorded, never refreshed
    second = submit(env, "script", "held")
    states = {r["run_id"]: r["state"] for r in rows(env, "runs")}
    assert states[first["run_id"]] == "ended" and states[second["run_id"]] in ("pending", "running")
    hpcrl(env, "cancel", second["run_id"])


def test_sbatch_rejection_records_failed_run(slurm, env):
    path = script(env, "badpart", partition="no-such-partition")
    line = assert_user_error(hpcrl(env, "submit", str(path)), "sbatch: error: ")
    assert "invalid partition" in line.lower()
    (run,) = rows(env, "runs")
    assert run["state"] == "failed" and "invalid partition" in run["reason"].lower()
    assert rows(env, "jobs") == []


def test_twenty_concurrent_submits(slurm, env):
    """20 `submit --dry-run` and 3 real submits at once leave 23 well-formed registry rows."""
    behave(env, sleep=0)
    dry_kind = "config" if _has_renderer() else "script"
    dry = submit_args(env, dry_kind, "many")
    real = [str(script(env, f"real{i}")) for i in range(3)]
    cmds = [("submit", "--dry-run", "--json", *dry)] * 20 + [("submit", "--json", p) for p in real]
    with ThreadPoolExecutor(len(cmds)) as pool:
        procs = list(pool.map(lambda c: hpcrl(env, *c, timeout=300), cmds))
    outs = [ok_json(p) for p in procs]
    runs = rows(env, "runs")
    assert len(runs) == 23 and len({r["run_id"] for r in runs}) == 23
    assert {o["run_id"] for o in outs} == {r["run_id"] for r in runs}
    for r in runs:
        assert re.fullmatch(r"(many|real\d)-[0-9a-f]{6}", r["run_id"])
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r["created"])
        assert r["run_dir"] == str(env["root"] / r["name"]) and r["max_restarts"] == 2
    assert sorted(r["state"] for r in runs if r["name"] == "many") == ["dry-run"] * 20
    assert len({r["config_hash"] for r in runs if r["name"] == "many"}) == 1
    assert all(r["state"] == "pending" for r in runs if r["name"] != "many")
    jobs = rows(env, "jobs")
    assert len(jobs) == 3 and all(j["job_id"].isdigit() and j["seq"] == 0 for j in jobs)
    assert not (env["root"] / "many").exists()  # a dry run writes nothing into the run dir
    texts = {Path(o["script"]).read_text() for o in outs[:20]}
    assert len(texts) == 1 and texts.pop().startswith("#!/bin/bash")
    for o in outs[:20]:
        assert o["job_id"] is None
        assert o["command"] == ["sbatch", "--parsable", str(env["root"] / "many" / "hpcrl" / "job.sbatch")]
    for o in outs[20:]:
        wait_status(env, o["run_id"], lambda r: r["state"] == "ended", "a real submit to finish")


def test_two_submits_into_one_run_dir_at_once(slurm, env):
    """Two real submits of the same run name at the same moment: one is submitted, the other
    is refused (exit 2) naming it, and the run dir holds one chain. (The race itself, both
    checking before either writes, is forced in tests/test_registry.py with a barrier.)"""
    behave(env, sleep=0)
    path = str(script(env, "twice"))
    with ThreadPoolExecutor(2) as pool:
        procs = list(pool.map(lambda _: hpcrl(env, "submit", "--json", path, timeout=300), range(2)))
    ok = [p for p in procs if p.returncode == 0]
    refused = [p for p in procs if p.returncode != 0]
    assert len(ok) == 1 and len(refused) == 1, [(p.returncode, p.stderr) for p in procs]
    winner = ok_json(ok[0])["run_id"]
    line = assert_user_error(refused[0], f"run {winner} is still ")
    assert line.endswith(f"in {env['root'] / 'twice'}; hpcrl cancel {winner}, or pick another hpcrl.run_name")
    assert [r["run_id"] for r in rows(env, "runs")] == [winner] and len(rows(env, "jobs")) == 1
    chain = read_chain(RunDir(env["root"] / "twice"))
    assert list(chain) == [ok_json(ok[0])["job_id"]]
    wait_status(env, winner, lambda r: r["state"] == "ended", "the submitted run to finish")
