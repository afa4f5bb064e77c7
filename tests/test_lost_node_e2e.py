"""A node lost with its slurmd, on the real local Slurm with a real Ray: what its job left there.

A 2-node smoke job holds in its driver while Ray runs on both nodes; then the worker node dies
as a node does: its slurmd and every process of the job on it are SIGKILLed, so nothing there
cleans up. Slurm marks the node down (here `scontrol update state=down` does at once what
slurmctld does after SlurmdTimeout, 300 s on the dev cluster) and ends the job NODE_FAIL. The node comes
back (slurmd restarted, `state=resume`), and the user's next job on it sweeps what the dead job
left in the node's node-local directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from helpers import TERMINAL_JOB_STATES, run_hpcrl, scontrol_job, slurm_nodes, submit, wait_for_state

pytestmark = pytest.mark.ray  # the jobs run a real Ray on the local Slurm

NODE_LOCAL = Path("/tmp/hpcrl-local")  # local-dev's storage.node_local: /tmp/hpcrl-local/$SLURMD_NODENAME


@pytest.fixture(autouse=True)
def _needs_ray_and_root():
    """The jobs run `ray` from this environment; killing and restarting a slurmd needs root."""
    why = (
        "the smoke job needs ray (pip install 'ray[default]')"
        if shutil.which("ray") is None
        else "killing a node's slurmd needs root"
        if os.geteuid() != 0
        else ""
    )
    if why and os.environ.get("HPCRL_REQUIRE_SLURM") == "1":
        pytest.fail(f"HPCRL_REQUIRE_SLURM=1 but {why}", pytrace=False)
    if why:
        pytest.skip(why)


def smoke_script(tmp_path: Path, name: str, hold: str) -> tuple[Path, Path]:
    """`hpcrl render --cluster local-dev --nodes 2 --smoke` into tmp_path/name, whose driver first
    runs `hold` (bash; a `python3` put first on the job's PATH runs it before the smoke module); the
    script and the run dir."""
    real = shutil.which("python3")
    assert real
    fault = tmp_path / name / "bin"
    fault.mkdir(parents=True)
    (fault / "python3").write_text(
        f'#!/bin/bash\nif [[ " $* " == *" -m hpcrl.runtime.smoke "* ]]; then\n{hold}\nfi\nexec {real} "$@"\n'
    )
    (fault / "python3").chmod(0o755)
    root, script = tmp_path / name / "runs", tmp_path / name / "job.sbatch"
    out = run_hpcrl(
        "render",
        "--cluster",
        "local-dev",
        "--nodes",
        "2",
        "--smoke",
        "--set",
        f"hpcrl.run_root={root}",
        "--set",
        f"hpcrl.run_name={name}",
        "--set",
        'hpcrl.time="00:10:00"',
        "--set",
        "hpcrl.max_restarts=0",
        "--set",
        "hpcrl.max_failure_restarts=0",
        "--set",
        f'hpcrl.env_setup=["export PATH={fault}:$PATH"]',
        "-o",
        str(script),
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "HPCRL_CLUSTERS_DIR"},
    )
    assert out.returncode == 0, out.stderr
    (root / name / "logs").mkdir(parents=True)  # as hpcrl submit does: Slurm opens --output there
    return script, root / name


def dirs_of(job: str, node: str) -> list[Path]:
    """The node-local directories job made for node: in its node-local path, and Ray's short-path
    fallback in /tmp (shared by every node of this machine: told apart by their hpcrl-owner file)."""
    found = list((NODE_LOCAL / node).glob(f"hpcrl-{job}.*"))
    for d in Path("/tmp").glob(f"hpcrl-{job}.*"):
        try:
            if (d / "hpcrl-owner").read_text().split("\n")[0] == node:
                found.append(d)
        except OSError:
            pass
    return found


def slurmd_pid(node: str) -> int | None:
    """The pid of node's slurmd, from the cluster's SlurmdPidFile (%n: the node's name)."""
    conf = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=60).stdout
    pattern = next(ln.split("=", 1)[1].strip() for ln in conf.splitlines() if ln.startswith("SlurmdPidFile"))
    try:
        pid = int(Path(pattern.replace("%n", node)).read_text().split()[0])
        alive = f"-N\0{node}\0" in Path(f"/proc/{pid}/cmdline").read_text()
    except (OSError, ValueError, IndexError):
        return None
    return pid if alive else None


def job_processes(job: str, node: str) -> set[int]:
    """Every process of job on node (its environment says so), and the slurmstepd above them."""
    want = (f"SLURM_JOB_ID={job}".encode(), f"SLURMD_NODENAME={node}".encode())
    pids: set[int] = set()
    for proc in Path("/proc").iterdir():
        try:
            env = set((proc / "environ").read_bytes().split(b"\0"))
        except (OSError, ValueError):
            continue
        if proc.name.isdigit() and int(proc.name) != os.getpid() and all(w in env for w in want):
            pids.add(int(proc.name))
            parent = int((proc / "stat").read_text().rpartition(")")[2].split()[1])
            try:
                if Path(f"/proc/{parent}/comm").read_text().startswith("slurmstepd"):
                    pids.add(parent)
            except OSError:
                pass
    return pids


def lose_node(job: str, node: str) -> None:
    """node dies under job: its slurmd, then every process of job on it, SIGKILLed (until none is
    left: Ray starts workers), and Slurm marks it down."""
    pid = slurmd_pid(node)
    assert pid, f"no slurmd of {node} running"
    os.kill(pid, 9)
    deadline = time.monotonic() + 60
    while (left := job_processes(job, node)) and time.monotonic() < deadline:
        for p in left:
            try:
                os.kill(p, 9)
            except ProcessLookupError:
                pass
        time.sleep(0.5)
    assert not left, f"processes of job {job} on {node} survived SIGKILL: {left}"
    subprocess.run(
        ["scontrol", "update", f"nodename={node}", "state=down", "reason=hpcrl test: node lost"], check=True, timeout=60
    )


def bring_back(node: str) -> None:
    """node's slurmd started again and the node resumed, until Slurm has it usable."""
    if slurmd_pid(node) is None:
        subprocess.run(
            ["slurmd", "-N", node],
            check=True,
            timeout=120,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    deadline = time.monotonic() + 300
    while (slurm_nodes() or {}).get(node) not in ("idle", "mixed", "allocated") and time.monotonic() < deadline:
        # ReturnToService=2 may have resumed it already: then this is refused, and harmless.
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True, timeout=60)
        time.sleep(2)
    assert (slurm_nodes() or {}).get(node) in ("idle", "mixed", "allocated"), slurm_nodes()


def test_the_next_job_on_a_lost_node_keeps_its_ray_logs_and_removes_its_dirs(tmp_path, slurm):
    head, node = slurm.usable[:2]  # node names from sinfo: the machine's cluster, or SLURM_CONF's
    lost_script, lost_run = smoke_script(tmp_path, "lost", "exec sleep 900")
    running, made = None, []
    try:
        lost = submit(lost_script, f"--nodelist={head},{node}")
        deadline = time.monotonic() + 600
        # Ray is up on the worker node and the job is past its readiness wait: a node lost before the
        # driver starts is a failed start (ray-start-failed), not a worker that died under a run.
        job_log = lost_run / "logs" / f"job-{lost}.log"
        while not (
            any(
                (d / "session_latest" / "logs" / "raylet.out").exists()
                or (d / "ray" / "session_latest" / "logs" / "raylet.out").exists()
                for d in dirs_of(lost, node)
            )
            and job_log.exists()
            and "hpcrl: phase driver\n" in job_log.read_text()
        ):
            assert time.monotonic() < deadline, "Ray never started on the worker node, or the driver never did"
            assert scontrol_job(lost).get("JobState") not in TERMINAL_JOB_STATES, (lost_run / "logs").iterdir()
            time.sleep(1)
        lose_node(lost, node)
        assert wait_for_state(lost, TERMINAL_JOB_STATES, 600)["JobState"] == "NODE_FAIL"
        # The head's TERM came from the lost node, not a preemption: worker-died, blamed on that node
        # (the continuation, off here, would exclude it). The script may still be writing its end.
        deadline, ends = time.monotonic() + 120, []
        while not ends and time.monotonic() < deadline:
            rows = [ln.split("\t") for ln in (lost_run / "hpcrl" / "jobs.tsv").read_text().splitlines()]
            ends = [r[3] for r in rows if r[:2] == [lost, "end"]]
            time.sleep(1)
        assert ends and ends[0].startswith("worker-died:"), ends
        assert f"{node} slurm-node-down" in (lost_run / "hpcrl" / f"blame-{lost}").read_text().splitlines()
        left = dirs_of(lost, node)
        assert left, "the lost node kept no directory of its job"
        report = run_hpcrl("report", "--json", str(lost_run))
        assert node in json.loads(report.stdout)["jobs"][0]["ray_logs_missing"], report.stdout
        bring_back(node)

        # A running job's directory on that node, and another user's of the dead job: neither is touched.
        running = subprocess.run(
            [
                "sbatch",
                "--parsable",
                f"--nodelist={node}",
                "--ntasks=1",
                "--cpus-per-task=1",
                "--output=/dev/null",
                "--wrap=sleep 900",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
        wait_for_state(running, {"RUNNING"}, 600)
        live = NODE_LOCAL / node / f"hpcrl-{running}.0.liv"
        foreign = NODE_LOCAL / node / f"hpcrl-{lost}.5.oth"
        made = [live, foreign]
        for d in made:
            (d / "ray" / "session_latest" / "logs").mkdir(parents=True, mode=0o700)
            (d / "hpcrl-owner").write_text(f"{node}\n{lost_run}\n")
        os.chown(foreign, 65534, 65534)

        listed = tmp_path / "left-dirs"
        listed.write_text("".join(f"{d}\n" for d in left))
        # Its driver waits (at most 300 s) until the sweep has run, so that the job does not end first.
        next_script, _ = smoke_script(
            tmp_path, "next", f'for _ in $(seq 300); do ls -d $(cat "{listed}") >/dev/null 2>&1 || break; sleep 1; done'
        )
        nxt = submit(next_script, f"--nodelist={head},{node}")
        state = wait_for_state(nxt, TERMINAL_JOB_STATES, 900)["JobState"]
        log = (tmp_path / "next" / "runs" / "next" / "logs" / f"job-{nxt}.log").read_text()
        assert state == "COMPLETED", log[-3000:]
        kept = lost_run / "logs" / "ray" / lost / node
        assert [d for d in left if d.exists()] == [], log[-3000:]
        assert (
            f"[{node}] hpcrl: removed " in log
            and f"left by job {lost} (NODE_FAIL), which ended without its cleanup: its Ray logs kept in {kept}/" in log
        ), log[-3000:]
        assert (kept / "raylet.out").is_file() and (kept / "hpcrl-recovered").read_text().split()[0] == nxt
        assert live.is_dir() and foreign.is_dir()
        report = run_hpcrl("report", str(lost_run))
        assert f"job {lost}: Ray logs of {node} recovered later, by job {nxt} at " in report.stdout, report.stdout
    finally:
        if running:
            subprocess.run(["scancel", running], timeout=60)
        for d in made:
            shutil.rmtree(d, ignore_errors=True)
        bring_back(node)  # the cluster as this test found it, whatever failed


def user_processes(job: str, node: str) -> set[int]:
    """The job's own processes on node (the worker's shell, Ray, the monitor), not Slurm's slurmstepd;
    processes that exit while they are looked at are not counted."""
    want = (f"SLURM_JOB_ID={job}".encode(), f"SLURMD_NODENAME={node}".encode())
    left = set()
    for proc in Path("/proc").iterdir():
        try:
            if (
                proc.name.isdigit()
                and all(w in (proc / "environ").read_bytes().split(b"\0") for w in want)
                and not (proc / "comm").read_text().startswith("slurmstepd")
            ):
                left.add(int(proc.name))
        except OSError:
            pass
    return left


def test_a_lost_node_that_still_runs_ends_the_job_there_too_and_keeps_its_ray_logs(tmp_path, slurm):
    """Only the worker node's slurmd dies (the node itself runs on, as after a network partition):
    Slurm ends the job NODE_FAIL (worker-died:95 on the head), but nothing signals the job's processes
    on that node. They must end by themselves once the head's GCS is gone and Slurm no longer runs the
    job, keeping that node's Ray logs, those of the session that ran (never emptied by a retry)."""
    head, node = slurm.usable[:2]
    script, run = smoke_script(tmp_path, "alive", "exec sleep 900")
    try:
        job = submit(script, f"--nodelist={head},{node}")
        deadline, first = time.monotonic() + 600, ""
        job_log = run / "logs" / f"job-{job}.log"
        # As above: past the readiness wait, so that the lost node ends a run, not a start.
        while not (first and job_log.exists() and "hpcrl: phase driver\n" in job_log.read_text()):
            assert time.monotonic() < deadline, "Ray never started on the worker node, or the driver never did"
            assert scontrol_job(job).get("JobState") not in TERMINAL_JOB_STATES, list((run / "logs").iterdir())
            for d in dirs_of(job, node):
                for raylet in (
                    d / "session_latest" / "logs" / "raylet.out",
                    d / "ray" / "session_latest" / "logs" / "raylet.out",
                ):
                    try:
                        first = raylet.read_text().splitlines()[0]
                    except (OSError, IndexError):
                        pass
            time.sleep(1)
        os.kill(slurmd_pid(node), 9)  # the node's slurmd only: the job's processes there run on
        subprocess.run(
            ["scontrol", "update", f"nodename={node}", "state=down", "reason=hpcrl test: node lost"],
            check=True,
            timeout=60,
        )
        assert wait_for_state(job, TERMINAL_JOB_STATES, 600)["JobState"] == "NODE_FAIL"
        deadline, ends = time.monotonic() + 120, []
        while not ends and time.monotonic() < deadline:
            rows = [ln.split("\t") for ln in (run / "hpcrl" / "jobs.tsv").read_text().splitlines()]
            ends = [r[3] for r in rows if r[:2] == [job, "end"]]
            time.sleep(1)
        assert ends == ["worker-died:95"], ends
        # The head's GCS is gone with the head's end: the worker asks every 10 s, then Slurm, then stops.
        deadline = time.monotonic() + 120
        while (left := user_processes(job, node)) and time.monotonic() < deadline:
            time.sleep(1)
        worker_log = (run / "logs" / f"worker-{node}-{job}.log").read_text()
        assert not left, worker_log[-3000:]
        assert dirs_of(job, node) == [], worker_log[-3000:]
        kept = run / "logs" / "ray" / job / node / "raylet.out"
        assert kept.is_file() and kept.read_text().splitlines()[0] == first, worker_log[-3000:]
        report = json.loads(run_hpcrl("report", "--json", str(run)).stdout)["jobs"][0]
        assert node in report["ray_logs"] and node not in report["ray_logs_missing"], report
    finally:
        bring_back(node)
