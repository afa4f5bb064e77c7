"""A node that never joins Ray is named and left out: a `ray start` that hangs on one node.

On the real local Slurm with a real Ray, as tests/test_render_e2e.py runs the smoke job: the
readiness check times out, the failure line names the node that did not join (from the job's
node table against Ray's node list), its hung `ray start` is killed with the job, and the
failure continuation runs without it.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from helpers import events, fault_bin, render, wait_for_job

pytestmark = pytest.mark.ray


def ray_hangs_on(node: str) -> str:
    """A `ray` whose `ray start` on `node` (inside a Slurm step) hangs without a word, as one stuck
    on a dead file system or a firewalled GCS does; the real one elsewhere."""
    real_ray = shutil.which("ray")
    assert real_ray
    return (
        "#!/bin/bash\n"
        f"if [[ $1 == start && -n ${{SLURM_STEP_ID:-}} && $SLURMD_NODENAME == {node} ]]; then\n"
        '    echo "fault injected: ray start hangs on $SLURMD_NODENAME" >&2\n'
        '    exec -a "hung ray $*" sleep 3600\n'  # its arguments name the job's dirs: leftovers sees it
        "fi\n"
        f'exec {real_ray} "$@"\n'
    )


def test_a_node_whose_ray_start_hangs_is_named_and_left_out(tmp_path, slurm, run_sbatch_and_wait, leftovers):
    n1, n2, n3 = slurm.usable[:3]  # n3: the third node of the cluster
    fault = fault_bin(tmp_path, ray=ray_hangs_on(n3))
    # The hung node is only found when Ray's readiness deadline passes: local-dev's 120 s, less here (60 s: the
    # healthy nodes of the continuation still have time to join on a loaded machine).
    script, run_dir = render(
        tmp_path,
        f'hpcrl.env_setup=["export PATH={fault}:$PATH"]',
        "hpcrl.failure_backoff_s=2",
        'hpcrl.time="00:10:00"',  # slow bring-ups under load
        profile="ray:\n  join_timeout_s: 60\n",
    )
    first = run_sbatch_and_wait(script, 600, f"--nodelist={n1},{n2},{n3}")
    log = (run_dir / "logs" / f"job-{first.job_id}.log").read_text()
    ev = [e for e in events(run_dir) if e[0] == first.job_id]
    assert [e[1] for e in ev] == ["start", "end", "failure", "continue"], log
    assert ev[2][3] == f"ray-start-failed {n3}", ev
    assert f"fault injected: ray start hangs on {n3}" in log
    assert f"not joined: {n3}" in log and f"not joined: {n3} (127." in log, log
    assert leftovers(first.job_id) == []  # the hung `ray start` (its sleep) went with the job
    nxt = ev[3][3]
    fields = wait_for_job(nxt)
    log2 = (run_dir / "logs" / f"job-{nxt}.log").read_text()
    assert fields["JobState"] == "COMPLETED", log2
    nodes = subprocess.run(
        ["scontrol", "show", "hostnames", fields["NodeList"]], capture_output=True, text=True
    ).stdout.split()
    assert n3 not in nodes and len(nodes) == 3, nodes
    assert "hpcrl-smoke: ok nodes=3 gpus=12 " in log2
    assert leftovers(nxt) == []
