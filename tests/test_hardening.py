"""Hardening on the real local Slurm: shared nodes, run-dir identity, a damaged registry, orphans.

Faults are injected as they happen on a cluster: a second Unix user on the node, a `ray` that
reports an old version, a registry file damaged on disk, a driver deaf to SIGTERM, a killed
raylet or GCS, a `scancel` that cannot reach the controller. Runs use test_lifecycle's
environment (private registry, run root, profile and fake open-instruct checkout).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import NODE, scontrol_job
from hpcrl import contract
from lifecycle_harness import (
    as_other,
    assert_user_error,
    behave,
    config,
    driver_started,
    hpcrl,
    job_processes,
    nothing_of_the_job_left,
    ok_json,
    other_user,
    rows,
    script,
    submit,
    wait_status,
)
from hpcrl.jobs.run_dir import RunDir, read_chain
from hpcrl.planning.describe import RAY_TEMP_MAX

# --------------------------------------------------------------------------- helpers


def ray_parent_of(node_dir: Path, job: str) -> Path:
    """The private (0700) directory Ray's temp dir `ray` is in, for a job's node-local dir: node_dir
    itself, or, where node_dir/ray is longer than Ray's socket paths allow (render.RAY_TEMP_MAX: a
    private cluster's cKnN names and 6-digit job ids do it), the job's private dir in /tmp for the
    same node slot (hpcrl-<job>.<slot>.XXX)."""
    if len(str(node_dir / "ray")) <= RAY_TEMP_MAX:
        return node_dir
    slot = node_dir.name.split(".")[1]
    (found,) = Path("/tmp").glob(f"hpcrl-{job}.{slot}.*")
    return found


def wait_until(predicate, what: str, deadline_s: float = 120, poll_s: float = 0.5):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if value := predicate():
            return value
        time.sleep(poll_s)
    pytest.fail(f"gave up waiting for {what}")


KILL_WAIT_S = 20  # scripts/dev-slurm's KillWait


# --------------------------------------------------------------------------- shared nodes


def test_another_user_cannot_touch_a_running_jobs_node_local_dirs_or_metrics(slurm, env):
    """As another user on the same nodes: list, rename inside and write into the job's node-local
    directories all fail; Ray's metrics port answers no one, from any address."""
    other_user()
    behave(env, sleep=300)
    out = submit(env, "config", "shared", nodes=2)
    run_id, job = out["run_id"], out["job_id"]
    rd = RunDir(env["root"] / "shared")
    wait_status(env, run_id, driver_started(rd, job), "the driver to start on 2 nodes")
    dirs = sorted(Path("/tmp/hpcrl-local").glob(f"*/hpcrl-{job}.*"))
    assert len(dirs) == 2, dirs
    for d in dirs:
        assert d.stat().st_mode & 0o777 == 0o700 and d.stat().st_uid == os.geteuid()
        assert d.parent.stat().st_mode & 0o005 == 0o005  # others may enter the parent: the 0700 is what stops them
        # Ray's temp dir (0777: Ray makes it so) sits in d, or, where the node-local path is too long for Ray's
        # sockets, in a private directory in /tmp: 0700 as d is
        private = d if (d / "ray").is_dir() else next(Path("/tmp").glob(d.name.rpartition(".")[0] + ".*"))
        assert private.stat().st_mode & 0o777 == 0o700 and private.stat().st_uid == os.geteuid()
        ray = private / "ray"
        sessions = list(ray.glob("session_2*"))
        assert sessions and (sessions[0] / "sockets" / "raylet").exists()
        sock = sessions[0] / "sockets" / "raylet"
        for cmd in (
            ["ls", str(d)],
            ["ls", str(private)],
            ["ls", str(sessions[0])],
            ["mv", str(sock), str(sock) + ".x"],
            ["touch", str(d / "intruder")],
            ["touch", str(sessions[0] / "logs" / "intruder")],
        ):
            res = as_other(*cmd)
            assert res.returncode != 0 and "Permission denied" in res.stderr, (cmd, res)
        assert sock.exists() and not (d / "intruder").exists()
    # Ports: drawn per node (docs/render.md). The GCS listens (so connecting works here); every
    # node's metrics export port (its `ray start --metrics-export-port`) does not, from any address.
    log = rd.log(job).read_text()
    head_ip, gcs = re.search(r"Ray is up: .*\(GCS (127\.\d+\.\d+\.\d+):(\d+)\)", log).groups()
    with socket.create_connection((head_ip, int(gcs)), timeout=5):
        pass
    starts = [a for _p, a in job_processes(f"hpcrl-{job}.") if " start --block" in a]
    node_ips = sorted(set(re.findall(r"--node-ip-address=(127\.\d+\.\d+\.\d+)", " ".join(starts))))
    metrics = sorted(set(int(p) for p in re.findall(r"--metrics-export-port=(\d+)", " ".join(starts))))
    assert head_ip in node_ips and len(node_ips) == 2 and len(metrics) == 2, starts
    for port in metrics:
        for ip in node_ips:
            s = socket.socket()
            s.settimeout(3)
            s.bind(("127.0.0.1", 0))  # another address than the node's
            assert s.connect_ex((ip, port)) != 0, (ip, port)
            s.close()
    assert hpcrl(env, "cancel", run_id).returncode == 0
    wait_status(env, run_id, lambda r: r["state"] == "ended", "the cancel")
    # The run directory and everything in it are the owner's alone.
    assert rd.path.stat().st_mode & 0o077 == 0 and rd.meta.stat().st_mode & 0o077 == 0
    assert rd.log(job).stat().st_mode & 0o077 == 0
    assert as_other("ls", str(rd.path)).returncode != 0


@pytest.mark.ray  # wraps the real `ray`
def test_old_ray_stops_the_job_before_anything_listens(slurm, env, tmp_path):
    """A `ray` that reports 2.49 (it would ignore the token): the job ends setup-failed with
    one line naming the version, and `ray start` never runs on any node."""
    real = shutil.which("ray")
    fault = tmp_path / "oldray"
    fault.mkdir()
    (fault / "ray").write_text(
        "#!/bin/bash\n"
        'if [[ $1 == --version ]]; then echo "ray, version 2.49.2"; exit 0; fi\n'
        f'echo "$SLURMD_NODENAME $*" >>{tmp_path}/ray-started\n'
        f'exec {real} "$@"\n'
    )
    (fault / "ray").chmod(0o755)
    behave(env, sleep=300)
    path = config(env, "oldray", nodes=2)
    text = path.read_text().replace("hpcrl:\n", f'hpcrl:\n  env_setup: ["export PATH={fault}:$PATH"]\n', 1)
    path.write_text(text)
    out = ok_json(hpcrl(env, "submit", "--json", "--config", str(path)))
    final = wait_status(env, out["run_id"], lambda r: r["state"] == "ended", "the refusal")
    rd = RunDir(env["root"] / "oldray")
    log = rd.log(out["job_id"]).read_text()
    assert final["reason"] == "setup-failed", log
    assert (
        re.search(rf"Ray 2\.49\.2 on {NODE}", log)
        and "ignores token authentication (needs Ray >= 2.52)" in log
        and "install ray>=2.52" in log
    ), log
    assert not (tmp_path / "ray-started").exists()
    assert read_chain(rd)[out["job_id"]].end_reason == "setup-failed"
    assert nothing_of_the_job_left(rd.path, out["job_id"], 10) == []


# --------------------------------------------------------------------------- run-dir identity


def test_concurrent_submits_through_a_symlink_and_dotdot_one_wins(slurm, env):
    """One run directory spelled three ways (plain, through a symlink, through `..`), submitted at
    the same moment: exactly one submit wins; the others name the run that holds it."""
    behave(env, sleep=0)
    env["root"].mkdir(parents=True, exist_ok=True)
    link = env["tmp"] / "runs-link"
    link.symlink_to(env["root"])
    plain = script(env, "same")
    spellings = [str(env["root"] / "same"), str(link / "same"), str(env["root"] / ".." / "runs" / "same")]
    paths = []
    for i, spelling in enumerate(spellings):
        p = env["tmp"] / f"same{i}.sbatch"
        p.write_text(plain.read_text().replace(f"RUN_DIR={env['root'] / 'same'}\n", f"RUN_DIR={spelling}\n"))
        paths.append(str(p))
    with ThreadPoolExecutor(3) as pool:
        procs = list(pool.map(lambda p: hpcrl(env, "submit", "--json", p, timeout=300), paths))
    ok = [p for p in procs if p.returncode == 0]
    refused = [p for p in procs if p.returncode != 0]
    assert len(ok) == 1 and len(refused) == 2, [(p.returncode, p.stderr) for p in procs]
    winner = ok_json(ok[0])
    for p in refused:
        assert_user_error(p, f"run {winner['run_id']} is still ")
    (run,) = rows(env, "runs")
    assert run["run_dir"] == os.path.realpath(env["root"] / "same") and len(rows(env, "jobs")) == 1
    wait_status(env, winner["run_id"], lambda r: r["state"] == "ended", "the run to finish")


# --------------------------------------------------------------------------- damaged registry


def _registry_with_runs(env, n: int = 300) -> Path:
    """A registry of n finished runs (several pages of rows), closed and checkpointed."""
    from hpcrl.jobs.registry import Registry

    reg = Registry(env["env"]["HPCRL_REGISTRY"])
    for i in range(n):
        rid = reg.create_run(
            name=f"old{i}",
            cluster="local-dev",
            config_hash="h" * 12,
            script_path=f"/x/old{i}/job",
            run_dir=f"/x/old{i}",
            state="ended",
            max_restarts=2,
            reason="completed",
        )
        reg.add_job(rid, str(900000 + i))
    reg.close()
    path = Path(env["env"]["HPCRL_REGISTRY"])
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0
    return path


def _damage(path: Path, how: str) -> int:
    """Damage the registry; return how many of its 300 runs SQLite can still read."""
    data = bytearray(path.read_bytes())
    readable = 0  # empty; and a file cut in half: SQLite reads no table of it (sqlite3: "no such table")
    page = int.from_bytes(data[16:18], "big") or 65536
    if how == "truncated":
        data = data[: len(data) // 2 + 100]
    elif how == "empty":
        data = bytearray()
    elif how == "bad-header":
        data[:16] = b"NOT A DATABASE!!"
        readable = 300  # every row is on a page the header does not touch
    elif how == "bad-page":
        # the runs-table leaf holding run old150 (its script path is stored nowhere else), as noise
        victim = data.index(b"/x/old150/job") // page
        with sqlite3.connect(path) as conn:  # SQLite's own page map: the rows on that leaf are lost
            lost = conn.execute("SELECT ncell FROM dbstat WHERE name = 'runs' AND pageno = ?", (victim + 1,)).fetchone()
        readable = 300 - lost[0]
        data[victim * page : (victim + 1) * page] = os.urandom(page)
    path.write_bytes(bytes(data))
    return readable


@pytest.mark.parametrize("how", ["truncated", "empty", "bad-header", "bad-page"])
def test_damaged_registry_is_one_line_and_nothing_is_submitted(slurm, env, how):
    path = _registry_with_runs(env)
    readable = _damage(path, how)
    name = f"dmg-{how}"
    sub = script(env, name)
    for args in (["runs"], ["status"], ["status", "--all"], ["submit", str(sub)], ["cancel", "old1"], ["logs", "old1"]):
        line = assert_user_error(hpcrl(env, *args), f"registry {path} ")
        assert "is damaged" in line and "hpcrl runs --repair" in line, line
    queued = subprocess.run(
        ["squeue", "-h", "-n", f"hpcrl-test-{name}", "-o", "%i"], capture_output=True, text=True
    ).stdout.split()
    assert queued == [] and not (env["root"] / name).exists()
    # The repair keeps what can be read and moves the damaged file aside.
    rep = ok_json(hpcrl(env, "runs", "--repair", "--json"))
    assert Path(rep["moved_to"]).exists() and rep["moved_to"].startswith(f"{path}.damaged-")
    kept = rep["runs"]
    assert (kept, rep["jobs"]) == (readable, readable)  # one job per run; the jobs' pages are intact
    listed = ok_json(hpcrl(env, "runs", "--json", "-n", "0"))["runs"]
    assert len(listed) == kept
    out = ok_json(hpcrl(env, "submit", "--json", str(sub)))  # a working registry again
    assert out["job_id"] and rows(env, "jobs")[-1]["job_id"] == out["job_id"]
    wait_status(env, out["run_id"], lambda r: r["state"] == "ended", "the submit after the repair")


# --------------------------------------------------------------------------- orphans and stops


def _ended_cleanly(env, rd: RunDir, job: str, reason: str) -> None:
    ev = read_chain(rd)[job]
    assert ev.end_reason == reason, rd.log(job).read_text()
    # A worker's Ray has contract.RAY_STOP_S to exit on its TERM, then the worker cleans up within KillWait.
    left = nothing_of_the_job_left(rd.path, job, KILL_WAIT_S + contract.RAY_STOP_S + 5)
    assert left == [], (left, rd.log(job).read_text())


def test_deaf_driver_is_gone_after_cancel(slurm, env):
    behave(env, sleep=600, ignore_term=True)
    out = submit(env, "config", "deaf-cancel", nodes=2)
    rd = RunDir(env["root"] / "deaf-cancel")
    wait_status(env, out["run_id"], driver_started(rd, out["job_id"]), "the driver to start")
    assert hpcrl(env, "cancel", out["run_id"]).returncode == 0
    wait_status(env, out["run_id"], lambda r: r["state"] == "ended", "the cancel")
    _ended_cleanly(env, rd, out["job_id"], "cancelled")


def test_a_setsid_grandchild_of_the_driver_is_gone_after_cancel(slurm, env):
    """The driver starts a daemon in a session of its own (`setsid -f`: orphaned at once, so Slurm's
    process tracking without cgroups loses it): cancel leaves nothing, that daemon included."""
    behave(env, sleep=300, setsid_child=True)
    out = submit(env, "config", "setsid", nodes=2)
    rd = RunDir(env["root"] / "setsid")
    pid_file = rd.path / "checkpoints" / f"setsid-{out['job_id']}"
    wait_status(env, out["run_id"], lambda _r: pid_file.exists() and pid_file.read_text(), "the grandchild")
    grandchild = int(pid_file.read_text())
    assert Path(f"/proc/{grandchild}").exists()
    assert hpcrl(env, "cancel", out["run_id"]).returncode == 0
    wait_status(env, out["run_id"], lambda r: r["state"] == "ended", "the cancel")
    wait_until(lambda: not Path(f"/proc/{grandchild}").exists(), "the setsid grandchild to be gone", KILL_WAIT_S + 5)


def _continued_without(env, run_id: str, rd: RunDir, job: str, reason: str, node: str) -> None:
    """Job `job` ended with `reason`, blamed `node`, and one failure continuation ran without it and resumed."""
    final = wait_status(env, run_id, lambda r: r["state"] == "ended", "the continuation to finish", deadline_s=300)
    chain = read_chain(rd)
    nxt = chain[job].next_job
    assert nxt and final["reason"] == "completed" and [j["job_id"] for j in final["jobs"]] == [job, nxt], final
    events = [ln.split("\t") for ln in rd.jobs_tsv.read_text().splitlines() if ln.startswith(f"{job}\t")]
    assert [e[3] for e in events if e[1] == "failure"] == [f"{reason} {node}"], events
    assert (rd.meta / "failure-restarts").read_text().strip() == "1" and (
        rd.meta / "excluded-nodes"
    ).read_text().split() == [node]
    assert node not in expand_nodelist(scontrol_job(nxt)["NodeList"])
    assert (rd.path / "checkpoints" / f"resumed-{nxt}").exists()  # the continuation resumed the first job's state


def expand_nodelist(nodelist: str) -> list[str]:
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
    return out.stdout.split()


def test_deaf_driver_is_gone_after_a_worker_dies_and_the_run_goes_on_without_that_node(slurm, env):
    """A worker's raylet is killed while the deaf driver runs: the job ends worker-died, leaves
    nothing behind, and one failure continuation runs without that node and resumes."""
    behave(env, sleep=600, ignore_term=True)
    cfg = config(env, "deaf-worker", nodes=2, hpcrl_extra="  failure_backoff_s: 2\n")
    out = ok_json(hpcrl(env, "submit", "--json", "--config", str(cfg)))
    job = out["job_id"]
    rd = RunDir(env["root"] / "deaf-worker")
    wait_status(env, out["run_id"], driver_started(rd, job), "the driver to start")
    head, head_ip = re.search(r"head (\S+) \((127\.\d+\.\d+\.\d+)\)", rd.log(job).read_text()).groups()
    raylets = [(pid, a) for pid, a in job_processes(f"hpcrl-{job}.") if "/raylet " in a or a.endswith("/raylet")]
    workers = [(pid, a) for pid, a in raylets if f"--node_ip_address={head_ip}" not in a]
    assert len(workers) == 1, raylets
    (worker_node,) = set(expand_nodelist(scontrol_job(job)["NodeList"])) - {head}  # the job's other node
    os.kill(workers[0][0], signal.SIGKILL)
    wait_until(lambda: read_chain(rd).get(job) and read_chain(rd)[job].end_reason, "the end line", 60)
    _ended_cleanly(env, rd, job, "worker-died")
    _continued_without(env, out["run_id"], rd, job, "worker-died", worker_node)


def test_deaf_driver_is_gone_after_the_time_limit(slurm, env):
    behave(env, sleep=600, ignore_term=True)
    out = submit(env, "config", "deaf-limit", partition="short", time_="00:01:00", max_restarts=0)
    rd = RunDir(env["root"] / "deaf-limit")
    final = wait_status(env, out["run_id"], lambda r: r["state"] == "ended", "the time limit", deadline_s=400)
    assert final["reason"] == "timeout" and final["restarts"] == 0
    _ended_cleanly(env, rd, out["job_id"], "timeout")


def test_killed_gcs_ends_the_job_as_a_head_failure(slurm, env):
    behave(env, sleep=600)
    cfg = config(env, "gcs", nodes=2, hpcrl_extra="  failure_backoff_s: 2\n")
    out = ok_json(hpcrl(env, "submit", "--json", "--config", str(cfg)))
    job = out["job_id"]
    rd = RunDir(env["root"] / "gcs")
    wait_status(env, out["run_id"], driver_started(rd, job), "the driver to start")
    (gcs,) = [pid for pid, a in job_processes(f"hpcrl-{job}.") if "gcs_server" in a.split()[0]]
    killed_at = time.monotonic()
    os.kill(gcs, signal.SIGKILL)
    wait_until(lambda: read_chain(rd).get(job) and read_chain(rd)[job].end_reason, "the end line", 30)
    took = time.monotonic() - killed_at
    assert read_chain(rd)[job].end_reason == "ray-head-died" and read_chain(rd)[job].exit_code == 94, rd.log(
        job
    ).read_text()
    assert "Ray's head on" in rd.log(job).read_text()
    print(f"killed GCS -> end line in {took:.1f} s")
    _ended_cleanly(env, rd, job, "ray-head-died")
    head = read_chain(rd)[job].start
    _continued_without(env, out["run_id"], rd, job, "ray-head-died", head)


# --------------------------------------------------------------------------- smaller items


def test_cancel_without_a_controller_says_nothing_was_cancelled(slurm, env, tmp_path):
    """scancel that cannot reach slurmctld (as Slurm prints it): exit 2, one line, the cancel
    marker is not left behind, the job runs on; a later cancel works."""
    behave(env, sleep=300)
    out = submit(env, "script", "nocancel")
    rd = RunDir(env["root"] / "nocancel")
    wait_status(env, out["run_id"], lambda r: r["state"] == "running", "the job to run")
    fake = tmp_path / "down"
    fake.mkdir()
    (fake / "scancel").write_text(
        "#!/bin/bash\n"
        'echo "scancel: error: Kill job error on job id $1: Unable to contact slurm controller (connect failure)" >&2\n'
        "exit 1\n"
    )
    (fake / "scancel").chmod(0o755)
    line = assert_user_error(
        hpcrl(env, "cancel", out["run_id"], path=f"{fake}:{os.environ['PATH']}"), "Unable to contact slurm controller"
    )
    assert "nothing was cancelled" in line and not rd.cancel.exists()
    assert ok_json(hpcrl(env, "status", out["run_id"], "--json"))["runs"][0]["state"] == "running"
    assert hpcrl(env, "cancel", out["run_id"]).returncode == 0
    final = wait_status(env, out["run_id"], lambda r: r["state"] == "ended", "the real cancel")
    assert final["reason"] == "cancelled"


def test_run_root_that_turned_read_only_is_named(slurm, env, tmp_path):
    """The run root is a file system that turns read-only between submit and start: status
    names it (not just "crashed") and `hpcrl logs` says why there is no log."""
    if os.geteuid() != 0:
        pytest.skip("mounting a file system needs root (CI runs as root)")
    mnt = tmp_path / "ro-root"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        env["root"] = mnt
        behave(env, sleep=0)
        path = script(env, "ro")
        path.write_text(path.read_text().replace("#SBATCH --nodes=1\n", "#SBATCH --nodes=1\n#SBATCH --begin=now+6\n"))
        out = ok_json(hpcrl(env, "submit", "--json", str(path)))
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        final = wait_status(env, out["run_id"], lambda r: r["state"] == "ended", "the job to fail", deadline_s=120)
        assert final["reason"] == "run-dir-unwritable", final
        logs = hpcrl(env, "logs", out["run_id"])
        assert logs.returncode == 0 and f"the run directory {mnt / 'ro'} is not writable" in logs.stderr, logs.stderr
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_registry_damage_unit_repair_keeps_readable_rows(tmp_path):
    """Without Slurm: a registry with one noisy page is refused on open and repaired."""
    from hpcrl.errors import RegistryError
    from hpcrl.jobs.registry import Registry
    from hpcrl.jobs.registry_repair import repair

    env = {"env": {"HPCRL_REGISTRY": str(tmp_path / "runs.db")}}
    path = _registry_with_runs(env, 400)
    _damage(path, "bad-page")
    with pytest.raises(RegistryError, match="is damaged"):
        Registry(path)
    done = repair(path)
    assert 0 < done.runs < 400 and done.moved_to and done.moved_to.exists()
    reg = Registry(path)
    assert len(reg.list_runs()) == done.runs and all(r.state == "ended" for r in reg.list_runs())
    assert json.dumps(reg.list_runs()[0].to_dict())


def test_registry_with_only_its_header_damaged_keeps_every_run(tmp_path):
    """Without Slurm: the whole 100-byte file header zeroed (the pages are intact): all 400 runs kept."""
    from hpcrl.jobs.registry import Registry
    from hpcrl.jobs.registry_repair import repair

    env = {"env": {"HPCRL_REGISTRY": str(tmp_path / "runs.db")}}
    path = _registry_with_runs(env, 400)
    data = bytearray(path.read_bytes())
    data[:100] = bytes(100)
    path.write_bytes(bytes(data))
    done = repair(path)
    assert (done.runs, done.jobs, len(Registry(path).list_runs())) == (400, 400, 400)
