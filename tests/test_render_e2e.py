"""The rendered script on the real local Slurm (scripts/dev-slurm) with a real Ray cluster.

`hpcrl render --cluster local-dev --nodes 3 --smoke` is submitted with sbatch: Ray comes up
across three Slurm nodes (three raylets on this machine, addressed 127.0.0.x), the smoke
program places learners and engines as open-instruct does, and the job records its chain
events. The fault test breaks `ray start` on the worker nodes only and checks that the job
fails with `ray-start-failed` instead of waiting for its wall time. The same bring-up runs
for the verl and OpenRLHF backends, whose smoke programs place bundles as those frameworks do.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import NODE, events, fault_bin, job_nodes, render, run_sbatch_and_wait as sbatch_and_wait, wait_for_job

pytestmark = pytest.mark.ray  # every job here runs a real Ray on the local Slurm


@pytest.fixture(autouse=True)
def _ray_installed():
    """The job runs `ray` from this environment: skip without it, or fail where CI demands Slurm."""
    if shutil.which("ray") is None:
        why = "the smoke job needs ray (pip install 'ray[default]')"
        if os.environ.get("HPCRL_REQUIRE_SLURM") == "1":
            pytest.fail(f"HPCRL_REQUIRE_SLURM=1 but {why}", pytrace=False)
        pytest.skip(why)


def planned(script: Path) -> tuple[str, str, str]:
    """The smoke test's --learners, --engines and --tp as rendered."""
    m = re.search(r"--learners '?([\d ]+)'? --engines (\d+) --tp (\d+)", script.read_text())
    assert m, "no smoke command in the script"
    return m.group(1), m.group(2), m.group(3)


def ray_fails_in_step(node: str = "", once_dir: Path | None = None) -> str:
    """A `ray` whose `ray start` fails inside a Slurm step (the worker nodes; only on `node` when
    given; only the first time per node with `once_dir`) and is the real one elsewhere. It still
    answers --version, as a ray that cannot start does."""
    real_ray = shutil.which("ray")
    assert real_ray
    only = f" && $SLURMD_NODENAME == {node}" if node else ""
    first = f' && mkdir "{once_dir}/$SLURMD_NODENAME" 2>/dev/null' if once_dir else ""  # true the first time only
    once = f'mkdir -p "{once_dir}"\n' if once_dir else ""
    return (
        "#!/bin/bash\n" + once + f"if [[ $1 == start && -n ${{SLURM_STEP_ID:-}}{only} ]]{first}; then\n"
        '    echo "fault injected: ray cannot start on $SLURMD_NODENAME" >&2\n'
        "    exit 1\n"
        "fi\n"
        f'exec {real_ray} "$@"\n'
    )


# The job's phases in order, as issue 22 names them.
PHASES = ["environment", "stack_check", "head", "workers", "readiness", "services", "driver", "stop"]


def test_smoke_job_three_nodes(tmp_path, run_sbatch_and_wait, leftovers):
    script, run_dir = render(tmp_path)
    job = run_sbatch_and_wait(script, 600)
    log = (run_dir / "logs" / f"job-{job.job_id}.log").read_text()
    assert job.state == "COMPLETED", log
    # main lists the phases; each logs its marker once (Slurm's output has them all: the job log
    # begins with the run directory, inside the first phase).
    main = re.search(r"^main\(\) \{\n(.*?)^\}", script.read_text(), re.S | re.M)
    assert main and re.findall(r"^    phase_(\w+)", main.group(1), re.M) == PHASES
    assert re.findall(r"^hpcrl: phase (\w+)$", job.output, re.M) == PHASES
    assert re.findall(r"^hpcrl: phase (\w+)$", log, re.M) == PHASES[1:]
    assert "hpcrl-smoke: ok nodes=3 gpus=12 " in log
    learners, engines, tp = planned(script)
    entries = [int(k) for k in learners.split()]
    assert f"learners={entries} learner_nodes={len(entries)} engines={engines} tp={tp} " in log
    assert "hpcrl: Ray has 3/3 nodes, 12/12 GPUs" in log
    assert (
        len(re.findall(rf"hpcrl: ray on {NODE}", log)) == 2 and "exited with code" not in log
    )  # workers stopped cleanly
    ev = events(run_dir)
    assert [e[1] for e in ev] == ["start", "end"] and ev[-1][3] == "completed:0"
    assert all(e[0] == job.job_id for e in ev)
    assert (run_dir / "hpcrl" / "job.sbatch").read_text() == script.read_text()
    token = run_dir / "hpcrl" / f"ray-token-{job.job_id}"
    assert token.stat().st_mode & 0o777 == 0o600
    assert "hpcrl-smoke: ok" in job.output  # Slurm's own --output in the run directory
    assert leftovers(job.job_id) == []


def test_smoke_job_sixteen_nodes(tmp_path, slurm16, leftovers):
    """The default run's script at 16 nodes (`hpcrl render --nodes 16`, learners spread one group per
    node, engines on the rest) on a 16-node dev cluster: Ray has every node and declared GPU."""
    script, run_dir = render(tmp_path, 'hpcrl.time="00:10:00"', nodes=16)
    job = sbatch_and_wait(script, 900)
    log = (run_dir / "logs" / f"job-{job.job_id}.log").read_text()
    assert job.state == "COMPLETED", log[-3000:]
    assert "hpcrl: Ray is up: 16 nodes, 64 GPUs " in log
    learners, engines, tp = planned(script)
    entries = [int(k) for k in learners.split()]
    # 4 declared GPUs per node (scripts/dev-slurm): 16 x 4 = 64.
    assert (
        f"hpcrl-smoke: ok nodes=16 gpus=64 cpus=32 learners={entries} learner_nodes={len(entries)} "
        f"engines={engines} tp={tp} " in log
    )
    assert leftovers(job.job_id) == []


# What each backend's smoke line must report for its local-dev plan (3 nodes x 4 GPUs).
BACKEND_SMOKE = {
    "verl-grpo-qwen2.5-7b": r"framework=verl colocated=true workers=12 pools=3 engines=(\d+) tp=(\d+) ",
    "openrlhf-grpo-qwen2.5-7b": r"framework=openrlhf actor_gpus=(\d+) actor_nodes=\d engines=(\d+) tp=(\d+) "
    r"engine_nodes=\d",
}


@pytest.mark.parametrize("config", list(BACKEND_SMOKE))
def test_smoke_job_per_backend(tmp_path, run_sbatch_and_wait, config, leftovers):
    """The shared Ray bring-up under the verl and OpenRLHF backends; their placements on it."""
    script, run_dir = render(tmp_path, config=config)
    job = run_sbatch_and_wait(script, 600)
    log = (run_dir / "logs" / f"job-{job.job_id}.log").read_text()
    assert job.state == "COMPLETED", log
    assert "hpcrl: Ray has 3/3 nodes, 12/12 GPUs" in log
    m = re.search(r"hpcrl-smoke: ok nodes=3 gpus=12 \S+ " + BACKEND_SMOKE[config], log)
    assert m, log
    learners, engines, tp = planned(script)
    assert m.groups()[-2:] == (engines, tp)
    if "openrlhf" in config:
        assert int(m.group(1)) == sum(int(k) for k in learners.split())
        assert int(m.group(1)) + int(engines) * int(tp) == 12
    else:
        assert int(engines) * int(tp) == 12
    ev = events(run_dir)
    assert [e[1] for e in ev] == ["start", "end"] and ev[-1][3] == "completed:0"
    assert leftovers(job.job_id) == []


def test_worker_that_cannot_start_fails_the_job_at_once(tmp_path, run_sbatch_and_wait, leftovers):
    """`ray start` fails on the two worker nodes only (inside the srun step); the head is fine.
    Each worker retries (3 attempts), then the job fails (continuations off here)."""
    fault = fault_bin(tmp_path, ray=ray_fails_in_step())
    script, run_dir = render(tmp_path, f'hpcrl.env_setup=["export PATH={fault}:$PATH"]', "hpcrl.max_failure_restarts=0")
    job = run_sbatch_and_wait(script, 600)
    log = (run_dir / "logs" / f"job-{job.job_id}.log").read_text()
    assert job.state == "FAILED", log
    assert re.search(rf"fault injected: ray cannot start on {NODE}", log)
    assert re.search(
        r"the worker step \(srun \.\.\. ray start on the other nodes\) exited with code \d+ "
        r"before all nodes joined",
        log,
    )
    ev = events(run_dir)
    assert [e[1] for e in ev] == ["start", "end"] and ev[-1][3] == "ray-start-failed:1"
    assert "hpcrl-smoke" not in log  # the driver never started
    assert re.search(
        rf"\[{NODE}\] hpcrl: ray start on {NODE} exited with code 1 \(attempt 1 of 3\); retrying in 2 s", log
    )
    assert "not continuing after ray-start-failed: 0 continuations of this kind submitted already" in log
    worker_logs = sorted(p.name for p in (run_dir / "logs").glob(f"worker-*-{job.job_id}.log"))
    assert len(worker_logs) == 2 and all("fault injected" in (run_dir / "logs" / n).read_text() for n in worker_logs)
    assert leftovers(job.job_id) == []


def test_worker_stopped_while_it_sets_up_leaves_nothing_behind(tmp_path, run_sbatch_and_wait, leftovers):
    """One worker is slow right after creating its node-local directories (inside the srun step, the
    `mkdir` of Ray's dir under them, or where that path is too long for Ray's sockets the `cp` into
    its /tmp dir, sleeps); `ray start` fails on the other. srun's --kill-on-bad-exit then signals the
    slow worker before it has started Ray: its directories must still go."""
    real_mkdir, real_cp = shutil.which("mkdir"), shutil.which("cp")
    assert real_mkdir and real_cp
    claim = tmp_path / "slow-node"

    def slow(real: str, after: str) -> str:
        return (
            "#!/bin/bash\n"
            f'{real} "$@" || exit\n'
            f'if [[ -n ${{SLURM_STEP_ID:-}} && "$*" == *{after}* ]] && {real_mkdir} {claim} 2>/dev/null; then\n'
            '    echo "fault injected: $SLURMD_NODENAME is slow after creating its directories" >&2\n'
            "    sleep 4\n"
            "fi\n"
        )

    fault = fault_bin(
        tmp_path, ray=ray_fails_in_step(), mkdir=slow(real_mkdir, "hpcrl-local"), cp=slow(real_cp, "hpcrl-owner")
    )
    script, run_dir = render(tmp_path, f'hpcrl.env_setup=["export PATH={fault}:$PATH"]', "hpcrl.max_failure_restarts=0")
    job = run_sbatch_and_wait(script, 600)
    log = (run_dir / "logs" / f"job-{job.job_id}.log").read_text()
    assert job.state == "FAILED", log
    assert "is slow after creating its directories" in log and re.search(
        rf"fault injected: ray cannot start on {NODE}", log
    )
    assert events(run_dir)[-1][3] == "ray-start-failed:1"
    assert leftovers(job.job_id) == [], log


# A stand-in for open-instruct's code-execution API (open_instruct/code_utils/api.py): answers
# GET /health with 200 on the port it is given, as uvicorn would.
STUB_CODE_SERVER = r"""
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

port = int(sys.argv[sys.argv.index("--port") + 1])


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b'{"status": "healthy"}')


print(f"stub code server on 127.0.0.1:{port}", flush=True)
HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_code_verifier_config_starts_the_code_server_on_every_node(tmp_path, run_sbatch_and_wait, leftovers):
    """A config whose datasets are code verifiers: the script starts the configured server on
    each of the three nodes, waits until it answers, the smoke asks it from every node, its log
    is kept per node in the run dir, and nothing of it outlives the job."""
    server = tmp_path / "stub_code_server.py"
    server.write_text(STUB_CODE_SERVER)
    script, run_dir = render(
        tmp_path,
        'dataset_mixer_list=["my-org/rlvr_code_stdio", "1.0"]',
        f"hpcrl.workdir={tmp_path}",
        f'hpcrl.code_server_command=["{sys.executable}", "{server}", "--port", "{{port}}"]',
    )
    text = script.read_text()
    assert "start_code_server" in text and "--service code-server" in text.replace('"code-server"', "code-server")
    job = run_sbatch_and_wait(script, 600)
    log = (run_dir / "logs" / f"job-{job.job_id}.log").read_text()
    assert job.state == "COMPLETED", log
    assert re.search(r"hpcrl-smoke: ok .* services=code-server=3/3", log), log
    server_logs = sorted(p.name for p in (run_dir / "logs").glob(f"code-server-*-{job.job_id}.log"))
    assert len(server_logs) == 3, server_logs
    for name in server_logs:
        assert "stub code server on 127.0.0.1:" in (run_dir / "logs" / name).read_text()
    assert leftovers(job.job_id) == []
    procs = subprocess.run(["ps", "-eww", "-o", "args="], capture_output=True, text=True).stdout
    assert str(server) not in procs


def test_code_server_that_never_answers_fails_the_job(tmp_path, run_sbatch_and_wait, leftovers):
    """A server command that exits at once: the job ends service-failed, naming it, before the driver."""
    script, run_dir = render(
        tmp_path,
        'dataset_mixer_list=["my-org/rlvr_code", "1.0"]',
        f"hpcrl.workdir={tmp_path}",
        """hpcrl.code_server_command=["bash", "-c", "echo cannot bind port {port} >&2; exit 3"]""",
    )
    job = run_sbatch_and_wait(script, 600)
    log = (run_dir / "logs" / f"job-{job.job_id}.log").read_text()
    assert job.state == "FAILED", log
    assert re.search(rf"code-server on {NODE}", log) and "exited before it answered" in log
    ends = [e for e in events(run_dir) if e[1] == "end"]
    assert ends[-1][3].startswith("service-failed:"), ends  # on the head, or a worker's blame seen at readiness
    assert "hpcrl-smoke" not in log
    assert leftovers(job.job_id) == []


def test_a_worker_whose_ray_start_fails_once_is_retried(tmp_path, run_sbatch_and_wait, leftovers):
    """`ray start` fails the first time on each worker node: the retry (clean temp dir, back-off)
    brings it up and the smoke passes, in one job."""
    fault = fault_bin(tmp_path, ray=ray_fails_in_step(once_dir=tmp_path / "failed-once"))
    script, run_dir = render(tmp_path, f'hpcrl.env_setup=["export PATH={fault}:$PATH"]')
    job = run_sbatch_and_wait(script, 600)
    log = (run_dir / "logs" / f"job-{job.job_id}.log").read_text()
    assert job.state == "COMPLETED", log
    assert len(re.findall(rf"fault injected: ray cannot start on {NODE}", log)) == 2
    assert len(re.findall(rf"ray start on {NODE} exited with code 1 \(attempt 1 of 3\); retrying", log)) == 2
    assert "hpcrl-smoke: ok nodes=3 gpus=12 " in log
    assert [e[1] for e in events(run_dir)] == ["start", "end"]
    assert sorted(p.name for p in (run_dir / "logs" / "ray" / job.job_id).iterdir()) == sorted(job_nodes(job.job_id))
    assert leftovers(job.job_id) == []


def test_a_node_whose_ray_start_always_fails_is_left_out_of_the_continuation(
    tmp_path, slurm, run_sbatch_and_wait, leftovers
):
    """`ray start` always fails on the second node (n2): the job ends ray-start-failed blaming it, one
    failure continuation runs on three other nodes (local-dev has four) and its smoke passes; the Ray
    session logs of every node of it are kept in logs/ray/<job>/."""
    n1, n2, n3 = slurm.usable[:3]
    fault = fault_bin(tmp_path, ray=ray_fails_in_step(node=n2))
    script, run_dir = render(tmp_path, f'hpcrl.env_setup=["export PATH={fault}:$PATH"]', "hpcrl.failure_backoff_s=2")
    first = run_sbatch_and_wait(script, 600, f"--nodelist={n1},{n2},{n3}")
    log = (run_dir / "logs" / f"job-{first.job_id}.log").read_text()
    assert first.state == "FAILED", log
    ev = [e for e in events(run_dir) if e[0] == first.job_id]  # the continuation may have started already
    kinds = [e[1] for e in ev]
    assert kinds == ["start", "end", "failure", "continue"], ev
    assert ev[1][3] == "ray-start-failed:1" and ev[2][3] == f"ray-start-failed {n2}"
    nxt = ev[3][3]
    assert (run_dir / "hpcrl" / "excluded-nodes").read_text().split() == [n2]
    fields = wait_for_job(nxt)
    log2 = (run_dir / "logs" / f"job-{nxt}.log").read_text()
    assert fields["JobState"] == "COMPLETED", log2
    assert "hpcrl-smoke: ok nodes=3 gpus=12 " in log2
    nodes = subprocess.run(
        ["scontrol", "show", "hostnames", fields["NodeList"]], capture_output=True, text=True
    ).stdout.split()
    assert n2 not in nodes and len(nodes) == 3
    kept = sorted(p.name for p in (run_dir / "logs" / "ray" / nxt).iterdir())
    assert kept == sorted(nodes), kept
    for node in kept:
        assert (run_dir / "logs" / "ray" / nxt / node / "raylet.out").is_file()
    assert [e[3] for e in events(run_dir) if e[0] == nxt and e[1] == "end"] == ["completed:0"]
    left = leftovers(first.job_id) + leftovers(nxt)
    assert left == [], (left, log2[-3000:])


def test_a_large_job_environment_does_not_stop_the_actors(tmp_path, run_sbatch_and_wait, leftovers):
    """1.2 MiB of module-system variables in the job's environment (as three modules' worth of
    Lmod bookkeeping can be): open-instruct hands its whole environment to every actor; past
    128 KiB Ray's worker start fails (E2BIG, Ray issue 47432), past 1 MiB its agent refuses it.
    The lean environment keeps them from Ray and the driver; the smoke's actor starts."""
    big = (
        'for i in $(seq 300); do printf -v v %02000d 0; export "_ModuleTable${i}_=$v" "__LMOD_REF_COUNT_X${i}=$v"; done'
    )
    script, run_dir = render(tmp_path, f"hpcrl.env_setup=[{json.dumps(big)}]")
    job = run_sbatch_and_wait(script, 600)
    log = (run_dir / "logs" / f"job-{job.job_id}.log").read_text()
    assert job.state == "COMPLETED", log
    m = re.search(r"hpcrl-smoke: ok .* actor_env=(\d+)KiB", log)
    assert m and int(m.group(1)) < 128, log
    assert "warning: the driver's environment is still" not in log
    assert leftovers(job.job_id) == []
