"""A worker's stop when its Ray does not exit on TERM (templates/ray.sh.j2 worker_wait), in bash alone: a raylet
whose head died can hang in its own shutdown, and the worker waited for it until the head's stop budget ran out
and KILLed the worker step before its cleanup (a fresh-clone CI run: the worker's directories swept, its logs
not kept). The worker gives Ray contract.RAY_STOP_S after its TERM, then KILLs Ray's session and goes on.

The `Ray` here is a process in a session of its own that ignores TERM, as `ray start` is run (setsid)."""

from __future__ import annotations

import os
import subprocess

from helpers import bash_functions, rendered_script
from hpcrl import contract

FUNCTIONS = bash_functions(rendered_script(), "worker_wait", "kill_session", "gcs_answers", "job_gone")


def run_stop(ray_body: str) -> tuple[subprocess.CompletedProcess, int]:
    """worker_wait after the stop signal (stopping=1) with RAY_PID a setsid process running ray_body."""
    script = (
        FUNCTIONS
        + f"setsid bash -c {ray_body!r} &\nRAY_PID=$!\necho pid=$RAY_PID\nsleep 0.5\n"
        + "stopping=1 CLUSTER_UP=1\nkill -TERM $RAY_PID\nworker_wait\n"
        + "echo rc=$RAY_RC; kill -0 $RAY_PID 2>/dev/null && echo alive || echo gone\n"
    )
    env = {**os.environ, "SLURMD_NODENAME": "n9", "HPCRL_RUN_DIR": "/nonexistent"}
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=120)
    pid = int(next(ln for ln in out.stdout.splitlines() if ln.startswith("pid=")).split("=")[1])
    return out, pid


def test_a_ray_that_ignores_its_term_is_killed_after_the_stop_budget():
    out, pid = run_stop("trap '' TERM; sleep 300 & wait; sleep 300")
    assert f"hpcrl: ray on n9 did not stop within {contract.RAY_STOP_S} s of its TERM: killed" in out.stdout, out
    assert out.stdout.rstrip().endswith("gone"), out.stdout
    assert not os.path.exists(f"/proc/{pid}"), "Ray's session outlived the worker's stop"


def test_a_ray_that_exits_on_its_term_is_not_killed():
    out, _pid = run_stop("sleep 300")
    assert "did not stop" not in out.stdout and "rc=143" in out.stdout, out
