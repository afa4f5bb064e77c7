"""Shared nodes on the real local Slurm: another user's node-local parent, ports and metrics.

A second Unix user (created as tests/test_hardening.py does) pre-creates the job's node-local
parent, binds ports, and asks every port a running job listens on for Ray's `/metrics`. Runs use
test_lifecycle's environment (private registry, run root, profile and fake open-instruct).
"""

from __future__ import annotations

import pwd
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from lifecycle_harness import (
    as_other,
    behave,
    config,
    driver_started,
    hpcrl,
    job_processes,
    ok_json,
    other_user,
    wait_status,
)
from hpcrl.jobs.run_dir import RunDir, read_chain


def profile_with_node_local(env, base: Path) -> None:
    """The test profile with its node-local directories under base/<node>."""
    path = env["tmp"] / "clusters" / "lc-test.yaml"
    path.write_text(
        path.read_text() + "storage:\n  node_local:\n    path: " + str(base) + "/$SLURMD_NODENAME\n"
        "    description: per node, under a directory this test controls\n"
    )


def submit_to_the_end(env, cfg: Path, reason: str) -> tuple[dict, RunDir, str]:
    """Submit the config, wait for the run to end with `reason`; (submit's answer, run dir, job log)."""
    out = ok_json(hpcrl(env, "submit", "--json", "--config", str(cfg)))
    final = wait_status(env, out["run_id"], lambda r: r["state"] == "ended", "the run to end", deadline_s=400)
    rd = RunDir(env["root"] / cfg.stem)
    log = rd.log(out["job_id"]).read_text()
    assert final["reason"] == reason, log
    return out, rd, log


@pytest.mark.parametrize("mode,node", [(0o755, "n2"), (0o777, "n2"), (0o777, "n1")])
def test_a_node_local_parent_of_another_user_is_refused_without_blaming_the_node(slurm, env, mode, node):
    """Another user made the node-local parent of `node` (n1, the cluster's first node, runs the head;
    n2 the worker): the job ends node-local-unsafe naming that directory and its owner, no node is
    blamed or excluded, no continuation is submitted and nothing was created in it."""
    first, second, *others = slurm.usable
    node = {"n1": first, "n2": second}[node]  # this cluster's names (cKnN on a private instance)
    user = other_user()
    base = Path(f"/tmp/hpcrl-nl-{uuid.uuid4().hex[:8]}")
    base.mkdir()
    base.chmod(0o1777)  # as /tmp: root's, sticky; the other user can make its own entry
    try:
        foreign = base / node
        as_other("mkdir", str(foreign))
        as_other("chmod", f"{mode:o}", str(foreign))
        assert foreign.stat().st_uid == pwd.getpwnam(user).pw_uid
        profile_with_node_local(env, base)
        behave(env, sleep=30)
        cfg = config(
            env, "foreign", nodes=2, hpcrl_extra=f"  exclude_nodes: [{', '.join(others)}]\n  failure_backoff_s: 2\n"
        )
        out, rd, log = submit_to_the_end(env, cfg, "node-local-unsafe")
        assert f"{foreign} (in the node-local path {foreign}) belongs to {user}, not to root" in log, log
        chain = read_chain(rd)
        assert list(chain) == [out["job_id"]] and chain[out["job_id"]].next_job is None
        assert not (rd.meta / "excluded-nodes").exists() and "\tfailure\t" not in rd.jobs_tsv.read_text()
        assert list(foreign.iterdir()) == []
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


# Another user's process: listens on every even port of the range, on every address.
HOLDER = """
import socket, sys, time
held = []
for port in range(int(sys.argv[1]), int(sys.argv[2]) + 1, 2):
    s = socket.socket()
    try:  # a job elsewhere on this machine may have drawn one: hold the rest
        s.bind(("0.0.0.0", port))
    except OSError:
        continue
    s.listen()
    held.append(s)
print(len(held), flush=True)
time.sleep(900)
"""
PORTS = (30000, 30539)  # past the job-id port blocks (10000-29999) other runs use, below the ephemeral range


def hold_even_ports(low: int, high: int) -> subprocess.Popen:
    user = other_user()
    proc = subprocess.Popen(
        ["/usr/bin/python3", "-c", HOLDER, str(low), str(high)],
        user=user,
        group=pwd.getpwnam(user).pw_gid,
        extra_groups=[],
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    held = int(proc.stdout.readline() or 0)
    assert held > 0.9 * ((high - low) // 2 + 1), held
    return proc


def test_ports_another_user_holds_are_drawn_again_without_blaming_a_node(slurm, env):
    """Another user's process listens on half the ports of the job's range (ray.ports 30000-30539,
    every even one): the job meets taken ports (the GCS's own draw included, half the time),
    draws again, its Ray comes up on free ones and the run completes; no node is blamed."""
    holder = hold_even_ports(*PORTS)
    try:
        path = env["tmp"] / "clusters" / "lc-test.yaml"
        path.write_text(path.read_text() + f"ray: {{ports: [{PORTS[0]}, {PORTS[1]}]}}\n")
        behave(env, sleep=0)
        cfg = config(env, "squat", nodes=2, time_="00:10:00")
        _out, rd, log = submit_to_the_end(env, cfg, "completed")
        assert "is taken (another process has it); drawing another" in log, log
        gcs = int(re.search(r"Ray is up: .*\(GCS 127\.[\d.]+:(\d+)\)", log).group(1))
        assert PORTS[0] <= gcs <= PORTS[1] and gcs % 2 == 1, gcs  # an even one was held (or briefly taken)
        assert not list(rd.meta.glob("blame-*")), log
    finally:
        holder.kill()
        holder.wait()


def listening_ports(job: str) -> dict[tuple[str, int], str]:
    """(address, port) -> process name of every TCP socket listening in a process of this job:
    its `ray start` processes (their arguments name the job's node-local dirs) and all their
    descendants (GCS, raylets, dashboard, agents, workers), from `ss -ltnp` as root."""
    table = [
        line.split(None, 2)
        for line in subprocess.run(
            ["ps", "-ewwo", "pid=,ppid=,args="], capture_output=True, text=True
        ).stdout.splitlines()
    ]
    pids = {pid for pid, _pp, args in table if f"hpcrl-{job}." in args and " start --block" in args}
    grew = True
    while grew:
        more = {pid for pid, ppid, _a in table if ppid in pids} - pids
        pids |= more
        grew = bool(more)
    found = {}
    for line in subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout.splitlines():
        owners = re.findall(r'\("([^"]+)",pid=(\d+),', line)
        names = [name for name, pid in owners if pid in pids]
        if names:
            addr, _, port = line.split()[3].rpartition(":")
            found[(addr.strip("[]"), int(port))] = names[0]
    return found


def test_no_metrics_answer_from_any_port_of_a_running_job(slurm, env):
    """As another user, `GET /metrics` on every port a running 2-node job listens on (each
    wildcard listener asked at both node addresses): none answers 200."""
    other_user()
    behave(env, sleep=300)
    cfg = config(env, "metrics", nodes=2, time_="00:10:00")
    out = ok_json(hpcrl(env, "submit", "--json", "--config", str(cfg)))
    job = out["job_id"]
    rd = RunDir(env["root"] / "metrics")
    try:
        wait_status(env, out["run_id"], driver_started(rd, job), "the driver to start on 2 nodes")
        ports = listening_ports(job)
        starts = " ".join(a for _p, a in job_processes(f"hpcrl-{job}.") if " start --block" in a)
        ips = sorted(set(re.findall(r"--node-ip-address=(127\.\d+\.\d+\.\d+)", starts)))
        gcs = int(re.search(r"Ray is up: .*\(GCS 127\.[\d.]+:(\d+)\)", rd.log(job).read_text()).group(1))
        assert len(ips) == 2 and gcs in {port for _a, port in ports}, (ips, ports)
        asked = {}
        for (addr, port), name in sorted(ports.items()):
            for ip in ips if addr in ("0.0.0.0", "*", "::") else [addr]:
                res = as_other(
                    "curl", "-s", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}", f"http://{ip}:{port}/metrics"
                )
                asked[f"{ip}:{port} {name}"] = res.stdout
        print("listening, as another user's GET /metrics saw it:", *sorted(asked.items()), sep="\n  ")
        assert [k for k, code in asked.items() if code == "200"] == [], asked
    finally:
        hpcrl(env, "cancel", out["run_id"])
        wait_status(env, out["run_id"], lambda r: r["state"] == "ended", "the cancel")
