"""The local dev cluster (scripts/dev-slurm) behaves like the multi-node Slurm hpcrl targets."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import time
from pathlib import Path

import pytest

from helpers import scontrol_job, submit, wait_for_state

REPO = Path(__file__).resolve().parent.parent


def _script(tmp_path: Path, name: str, *lines: str) -> Path:
    path = tmp_path / f"{name}.sh"
    path.write_text(
        "\n".join(
            [
                "#!/bin/bash",
                f"#SBATCH --job-name=hpcrl-test-{name}",
                f"#SBATCH --output={tmp_path}/{name}-%j.out",
                *lines,
            ]
        )
        + "\n"
    )
    return path


def _fields(output: str, prefix: str) -> list[dict[str, str]]:
    """Lines `prefix k=v k=v` of a job's output as dicts."""
    rows = []
    for line in output.splitlines():
        if line.startswith(prefix + " "):
            rows.append(dict(kv.split("=", 1) for kv in line.split()[1:]))
    return rows


def test_three_nodes_are_three_hosts(slurm, run_sbatch_and_wait, tmp_path):
    script = _script(
        tmp_path,
        "nodes",
        "#SBATCH --nodes=3",
        "#SBATCH --time=00:02:00",
        "echo batch node=$SLURMD_NODENAME nnodes=$SLURM_JOB_NUM_NODES",
        # Each task says who it is and what its node name resolves to (Ray needs the address).
        "srun --ntasks-per-node=1 bash -c "
        "'echo task node=$SLURMD_NODENAME addr=$(getent hosts $SLURMD_NODENAME | cut -d\" \" -f1)'",
    )
    job_id, state, output = run_sbatch_and_wait(script, 120)
    assert state == "COMPLETED", output
    (batch,) = _fields(output, "batch")
    tasks = _fields(output, "task")
    assert batch["nnodes"] == "3"
    names = [t["node"] for t in tasks]
    assert len(names) == 3 and len(set(names)) == 3, output
    assert set(names) <= set(slurm.nodes) and batch["node"] in names
    addrs = {t["node"]: t["addr"] for t in tasks}
    assert len(set(addrs.values())) == 3, addrs
    for name, addr in addrs.items():
        ip = ipaddress.ip_address(addr)
        assert ip.is_loopback and ip != ipaddress.ip_address("127.0.0.1"), (name, addr)
        assert scontrol_node(name)["NodeAddr"] == addr


def scontrol_node(name: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "node", "-o", name], capture_output=True, text=True, check=True).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def test_gpus_per_node_is_accepted_and_bound(run_sbatch_and_wait, tmp_path):
    script = _script(
        tmp_path,
        "gpus",
        "#SBATCH --nodes=2",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --time=00:02:00",
        "srun --ntasks-per-node=1 bash -c 'echo task node=$SLURMD_NODENAME cvd=$CUDA_VISIBLE_DEVICES'",
    )
    job_id, state, output = run_sbatch_and_wait(script, 120)
    assert state == "COMPLETED", output
    tasks = _fields(output, "task")
    assert len({t["node"] for t in tasks}) == 2
    assert all(t["cvd"] == "0,1,2,3" for t in tasks), output
    assert scontrol_job(job_id)["TresPerNode"] == "gres:gpu:4"


def test_more_gpus_than_a_node_has_is_refused(slurm, tmp_path):
    script = _script(tmp_path, "toomany", "#SBATCH --gpus-per-node=5", "true")
    res = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0, f"sbatch accepted 5 GPUs per node: job {res.stdout.strip()}"
    assert "node configuration is not available" in res.stderr


def test_partitions_and_time_limits(slurm, tmp_path):
    out = subprocess.run(["scontrol", "show", "partition", "-o"], capture_output=True, text=True, check=True).stdout
    parts = {}
    for line in out.splitlines():
        fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        parts[fields["PartitionName"]] = fields
    assert parts["debug"]["Default"] == "YES" and parts["debug"]["MaxTime"] == "01:00:00"
    assert parts["short"]["MaxTime"] == "00:02:00"
    # EnforcePartLimits=ALL: an over-long request is refused at submission, not left pending.
    script = _script(tmp_path, "toolong", "#SBATCH --partition=short", "#SBATCH --time=00:05:00", "true")
    res = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0, f"sbatch accepted 5 min in short: job {res.stdout.strip()}"
    assert "time limit" in res.stderr.lower()


def _wait_for_line(path: Path, text: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = path.read_text() if path.exists() else ""
        if text in content:
            return content
        time.sleep(0.3)
    pytest.fail(f"{path} never said {text!r}")


def test_signal_reaches_the_batch_shell(slurm, tmp_path):
    script = _script(
        tmp_path,
        "signal",
        "#SBATCH --time=00:02:00",
        "trap 'echo got USR1; exit 0' USR1",
        "echo ready",
        "for _ in $(seq 120); do sleep 0.5; done",
        "echo no signal; exit 3",
    )
    job_id = submit(script)
    out = tmp_path / f"signal-{job_id}.out"
    wait_for_state(job_id, {"RUNNING"}, 60)
    _wait_for_line(out, "ready")
    subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], check=True, timeout=30)
    fields = wait_for_state(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, 60)
    assert fields["JobState"] == "COMPLETED", out.read_text()
    assert "got USR1" in out.read_text()


def test_requeue_runs_the_job_again(slurm, tmp_path):
    """JobRequeue=1; AuthInfo=cred_expire=20 makes a requeued job eligible after ~21 s, not 121."""
    script = _script(
        tmp_path,
        "requeue",
        "#SBATCH --time=00:02:00",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        "echo run restarts=${SLURM_RESTART_COUNT:-0}",
        'if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then sleep 120; fi',
    )
    job_id = submit(script)
    out = tmp_path / f"requeue-{job_id}.out"
    wait_for_state(job_id, {"RUNNING"}, 60)
    _wait_for_line(out, "restarts=0")
    subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=30)
    fields = wait_for_state(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, 90)
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", out.read_text()
    assert [r["restarts"] for r in _fields(out.read_text(), "run")] == ["0", "1"]


def test_dev_slurm_script_is_shellcheck_clean(shellcheck):
    res = subprocess.run(
        [shellcheck, str(REPO / "scripts" / "dev-slurm"), str(REPO / ".ci" / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_status_reports_the_running_cluster(slurm):
    res = subprocess.run([str(REPO / "scripts" / "dev-slurm"), "status"], capture_output=True, text=True, timeout=60)
    if res.returncode != 0 and "slurmctld stopped" in res.stdout:
        pytest.skip("the running Slurm was not started by scripts/dev-slurm with this state dir")
    assert res.returncode == 0, res.stdout + res.stderr
    assert all(f"slurmd n{k} running" in res.stdout for k in range(1, 5))


def free_instance() -> str:
    """A private instance number no scripts/dev-slurm cluster runs as: 7 unless it is taken (.ci/run's second
    cluster, or another test run's), never 8 (the 16-node test's)."""
    for k in "763459":
        pid = Path(f"/tmp/hpcrl-devslurm-{k}/run/slurmctld.pid")
        try:
            os.kill(int(pid.read_text().strip()), 0)
        except (OSError, ValueError):
            return k
    pytest.fail("every private dev-slurm instance but 8 is running")


def test_a_private_instance_runs_beside_the_machines_cluster(slurm, tmp_path):
    """HPCRL_DEVSLURM_INSTANCE=K (7 when free) with 2 nodes: its own controller (SLURM_CONF from `env`)
    runs a job on cKn1/cKn2 at 127.0.K.11/12 while the machine's cluster still answers with its own
    nodes; `down` stops it and removes its /etc/hosts lines, and the machine's cluster is still up."""
    if os.geteuid() != 0:
        pytest.skip("scripts/dev-slurm up needs root")
    inst = free_instance()
    env = {k: v for k, v in os.environ.items() if k not in ("HPCRL_DEVSLURM_DIR", "SLURM_CONF")}
    env.update(HPCRL_DEVSLURM_INSTANCE=inst, HPCRL_DEVSLURM_NODES="2")
    dev = [str(REPO / "scripts" / "dev-slurm")]
    try:
        up = subprocess.run([*dev, "up"], env=env, capture_output=True, text=True, timeout=300)
        assert up.returncode == 0, up.stderr
        conf = subprocess.run([*dev, "env"], env=env, capture_output=True, text=True).stdout.split("=", 1)[1].strip()
        script = _script(
            tmp_path,
            "private",
            "#SBATCH --nodes=2",
            "#SBATCH --time=00:02:00",
            "srun --ntasks-per-node=1 bash -c 'echo task node=$SLURMD_NODENAME "
            'addr=$(getent hosts $SLURMD_NODENAME | cut -d" " -f1)\'',
        )
        private = {**env, "SLURM_CONF": conf}
        job = subprocess.run(
            ["sbatch", "--parsable", "--wait", str(script)], env=private, capture_output=True, text=True, timeout=120
        ).stdout.strip()
        tasks = _fields((tmp_path / f"private-{job}.out").read_text(), "task")
        assert sorted((t["node"], t["addr"]) for t in tasks) == [
            (f"c{inst}n1", f"127.0.{inst}.11"),
            (f"c{inst}n2", f"127.0.{inst}.12"),
        ]
        assert {"n1", "n2", "n3", "n4"} <= set(slurm_node_names())
    finally:
        subprocess.run([*dev, "down"], env=env, capture_output=True, timeout=300)
    assert f"c{inst}n1" not in Path("/etc/hosts").read_text()
    assert {"n1", "n2", "n3", "n4"} <= set(slurm_node_names())


def slurm_node_names() -> list[str]:
    """The machine's cluster's nodes (its default config, whatever SLURM_CONF says here)."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    return subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N"], env=env, capture_output=True, text=True, timeout=30
    ).stdout.split()
