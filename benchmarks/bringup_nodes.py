"""Bring-up time of the local-dev smoke job at 4, 8 and 16 nodes (issue 28): start -> "Ray is up" and the whole job.

    python benchmarks/bringup_nodes.py                 # 4, 8, 16 nodes on private dev-slurm instance 1
    python benchmarks/bringup_nodes.py --nodes 4 8     # other node counts
    python benchmarks/bringup_nodes.py --conf FILE     # a dev cluster already up (its slurm.conf)

Each node count runs the script `hpcrl render --cluster local-dev --nodes N --smoke` writes (the
default run's layout), once, with sbatch. Times come from one clock, this process's, polling the
job's log every 0.2 s: the job's start is when its log first appears (the batch script's first
act), "Ray is up" is that line of the readiness phase, the end is the script's last line
(`hpcrl: job <id> ends: ...`). Slurm's own StartTime/EndTime (whole seconds) are printed beside.

Without --conf it uses scripts/dev-slurm's private instance 1 (HPCRL_DEVSLURM_INSTANCE=1) with
as many nodes as the largest count, bringing it up (as root) when it does not answer and stopping
it at the end if it started it. The machine's cores and its 1-minute load average at each job's
start and end, and the profile's ray.start_stagger_s, are recorded: on the dev cluster every
node shares the cores. One JSON row per job is appended
to --out (default benchmarks/results/bringup_nodes.jsonl); a table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEV_SLURM = REPO / "scripts" / "dev-slurm"
INSTANCE = "1"
POLL_S = 0.2
sys.path.insert(0, str(REPO))
from hpcrl.profiles import load_profile  # noqa: E402 - this checkout's hpcrl

STAGGER_S = load_profile("local-dev").ray.start_stagger_s


def run(args: list[str], env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout, check=False)


def instance_env(nodes: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "HPCRL_DEVSLURM_DIR"}
    env.update(HPCRL_DEVSLURM_INSTANCE=INSTANCE, HPCRL_DEVSLURM_NODES=str(nodes))
    return env


def ensure_cluster(nodes: int) -> tuple[str, bool]:
    """SLURM_CONF of private instance 1 with `nodes` nodes, and whether this call started it."""
    env = instance_env(nodes)
    conf = run([str(DEV_SLURM), "env"], env).stdout.strip().rpartition("SLURM_CONF=")[2]
    answers = run(["sinfo", "-h", "-N", "-o", "%N %T"], {**os.environ, "SLURM_CONF": conf}, 30)
    if answers.returncode == 0 and len(set(answers.stdout.split()[0::2])) >= nodes:
        return conf, False
    up = run([str(DEV_SLURM), "up"], env, 600)
    if up.returncode != 0:
        sys.exit(f"bringup_nodes: scripts/dev-slurm up (instance {INSTANCE}, {nodes} nodes) failed:\n{up.stderr}")
    return conf, True


def render(nodes: int, root: Path) -> Path:
    script = root / f"bench{nodes}.sbatch"
    args = [
        sys.executable,
        "-m",
        "hpcrl",
        "render",
        "--cluster",
        "local-dev",
        "--nodes",
        str(nodes),
        "--smoke",
        *(["--allow-over-limit"] if nodes > 4 else []),
        "--set",
        f"hpcrl.run_root={root / 'runs'}",
        "--set",
        f"hpcrl.run_name=bench{nodes}",
        "--set",
        'hpcrl.time="00:10:00"',
        "-o",
        str(script),
    ]
    res = run(args, {**os.environ, "PYTHONPATH": str(REPO)})
    if res.returncode != 0:
        sys.exit(f"bringup_nodes: hpcrl render --nodes {nodes} failed:\n{res.stderr}")
    (root / "runs" / f"bench{nodes}" / "logs").mkdir(parents=True, exist_ok=True)
    return script


def scontrol_fields(job: str, env: dict) -> dict[str, str]:
    out = run(["scontrol", "-o", "show", "job", job], env, 30).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def slurm_seconds(fields: dict[str, str]) -> float | None:
    try:
        start, end = (datetime.fromisoformat(fields[k]) for k in ("StartTime", "EndTime"))
    except (KeyError, ValueError):
        return None
    return (end - start).total_seconds()


def one_job(nodes: int, root: Path, env: dict, timeout_s: float) -> dict:
    script = render(nodes, root)
    sub = run(["sbatch", "--parsable", str(script)], env, 60)
    if sub.returncode != 0:
        sys.exit(f"bringup_nodes: sbatch failed: {sub.stderr}")
    job = sub.stdout.strip().split(";")[0]
    log = root / "runs" / f"bench{nodes}" / "logs" / f"job-{job}.log"
    t_start = t_ray = t_end = None
    load = None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and t_end is None:
        now = time.monotonic()
        text = log.read_text(errors="replace") if log.exists() else None
        if text is not None and t_start is None:
            t_start, load = now, os.getloadavg()[0]
        if text and t_ray is None and "hpcrl: Ray is up:" in text:
            t_ray = now
        if text and re.search(rf"^hpcrl: job {job} ends: ", text, re.M):
            t_end = now
        time.sleep(POLL_S)
    if t_end is None:
        run(["scancel", job], env, 30)
    for _ in range(100):  # the job's state turns terminal once its processes are gone
        fields = scontrol_fields(job, env)
        if fields.get("JobState") not in ("RUNNING", "COMPLETING", "PENDING", None):
            break
        time.sleep(POLL_S)
    text = log.read_text(errors="replace") if log.exists() else ""
    ends = re.findall(rf"^hpcrl: job {job} ends: (\S+)", text, re.M)
    if not ends or not ends[-1].startswith("completed"):  # why, before the temp dir goes
        sys.stderr.write(
            "".join(ln + "\n" for ln in text.splitlines() if re.search(r"Ray has|error|attempt \d|timed out", ln))[
                -4000:
            ]
        )
    return {
        "nodes": nodes,
        "job": job,
        "end": ends[-1] if ends else None,
        "slurm_state": fields.get("JobState"),
        "start_to_ray_up_s": round(t_ray - t_start, 1) if t_ray and t_start else None,
        "whole_job_s": round(t_end - t_start, 1) if t_end and t_start else None,
        "slurm_start_to_end_s": slurm_seconds(fields),
        "cores": os.cpu_count(),
        "load_1min_at_start": round(load, 2) if load is not None else None,
        "load_1min_at_end": round(os.getloadavg()[0], 2),
        "start_stagger_s": STAGGER_S,
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def ratio(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}" if value and base else "-"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--conf", help="slurm.conf of a dev cluster already up (default: private instance 1)")
    p.add_argument("--timeout", type=float, default=900, help="per job, seconds")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "bringup_nodes.jsonl")
    a = p.parse_args()
    conf, started = (a.conf, False) if a.conf else ensure_cluster(max(a.nodes))
    env = {**os.environ, "SLURM_CONF": conf, "PYTHONPATH": str(REPO)}
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="hpcrl-bringup-") as tmp:
            for n in a.nodes:
                rows.append(one_job(n, Path(tmp), env, a.timeout))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        if started:
            run([str(DEV_SLURM), "down"], instance_env(max(a.nodes)), 600)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with a.out.open("a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    base = rows[0]
    print(
        f"\n{'nodes':>5}  {'start->Ray up s':>15}  {'ratio':>5}  {'whole job s':>11}  {'ratio':>5}  "
        f"{'load (1 min)':>12}  end"
    )
    for r in rows:
        print(
            f"{r['nodes']:>5}  {r['start_to_ray_up_s'] or '-':>15}  {ratio(r['start_to_ray_up_s'], base['start_to_ray_up_s']):>5}  "
            f"{r['whole_job_s'] or '-':>11}  {ratio(r['whole_job_s'], base['whole_job_s']):>5}  "
            f"{r['load_1min_at_start'] or '-':>12}  {r['end']}"
        )
    print(f"(ratios to the {base['nodes']}-node job; {base['cores']} cores shared by every node)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
