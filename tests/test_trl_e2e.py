"""A TRL job on the real local Slurm: no Ray, `trl vllm-serve` on a node of its own, `accelerate launch` of the
trainer on the others, started only once the server answers GET /health.

STAND-INS (nothing real can run here: no GPU, no TRL, no vLLM): tests/data/trl/fakepkgs puts `trl.cli.main
vllm-serve` (an HTTP server answering TRL's paths), `trl.scripts.grpo` (a trainer that polls /health, asks the
server each step, prints TRL's per-step dict and writes checkpoint-N as transformers does) and
`accelerate.commands.launch` (reads the config files hpcrl wrote; the ranks meet on the drawn main port) first on
the job's PYTHONPATH. Everything else is the rendered script as users get it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT, TERMINAL_JOB_STATES, submit, wait_for_state

FAKE = ROOT / "tests" / "data" / "trl" / "fakepkgs"
CONFIG = """\
hpcrl:
  backend: trl
  cluster: local-dev
  nodes: {nodes}
  run_name: {name}
  run_root: {root}
  stack_check: off
  time: "{time}"
  partition: {partition}
  max_restarts: {restarts}
  max_failure_restarts: {failure_restarts}
  python: {python}
  env_setup:
    - export PYTHONPATH={fake}:{pythonpath}
    - export HPCRL_TEST_SERVE_EXTRA="{serve}" HPCRL_TEST_TRAINER_EXTRA="{trainer}"
model_name_or_path: Qwen/Qwen2.5-0.5B
dataset_name: trl-lib/DeepMath-103K
reward_funcs: [accuracy_reward]
vllm_mode: {mode}
per_device_train_batch_size: 2
num_generations: 4
max_completion_length: 256
max_steps: {steps}
save_steps: {save}
"""
SERVE = """\
vllm_serve:
  max_model_len: 1024
"""


def job_script(
    tmp_path: Path,
    name: str,
    *,
    serve: str = "",
    trainer: str = "",
    steps: int = 30,
    save: int = 10,
    time_: str = "00:10:00",
    partition: str = "debug",
    failure_restarts: int = 0,
    restarts: int = 1,
    mode: str = "server",
    nodes: int = 3,
) -> tuple[Path, Path]:
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(
        CONFIG.format(
            name=name,
            root=tmp_path / "runs",
            time=time_,
            partition=partition,
            python=sys.executable,
            fake=FAKE,
            pythonpath=os.environ.get("PYTHONPATH", ROOT),
            serve=serve,
            trainer=trainer,
            steps=steps,
            save=save,
            failure_restarts=failure_restarts,
            restarts=restarts,
            mode=mode,
            nodes=nodes,
        )
        + (SERVE if mode == "server" else "")
    )
    script = tmp_path / f"{name}.sbatch"
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", "render", "--config", str(cfg), "-o", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    run_dir = tmp_path / "runs" / name
    (run_dir / "logs").mkdir(parents=True)  # as hpcrl submit does: Slurm opens --output there
    return script, run_dir


def chain(run_dir: Path) -> list[list[str]]:
    path = run_dir / "hpcrl" / "jobs.tsv"
    return [ln.split("\t") for ln in path.read_text().splitlines()] if path.exists() else []


def nodes_of(job_id: str) -> list[str]:
    out = subprocess.run(
        ["scontrol", "show", "hostnames", wait_for_state(job_id, TERMINAL_JOB_STATES, 5)["NodeList"]],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return out.stdout.split()


def test_server_mode_trainer_waits_for_the_server_and_completes(tmp_path, run_sbatch_and_wait, leftovers):
    # The server takes 4 s to listen (a model load); the trainer must not race it.
    script, run_dir = job_script(tmp_path, "trlok", serve="--startup-s 4")
    text = script.read_text()
    assert not re.search(r"^[^#\n]*\bray start\b", text, re.M)
    job = run_sbatch_and_wait(script, 300)
    log = (run_dir / "logs" / f"job-{job.job_id}.log").read_text()
    assert job.state == "COMPLETED", log
    assert re.findall(r"^hpcrl: phase (\w+)$", log, re.M) == [
        "stack_check",
        "head",
        "files",
        "vllm_server",
        "services",
        "driver",
        "stop",
    ]
    server_node, *trainer_nodes = nodes_of(job.job_id)
    port = re.search(r"hpcrl: vllm-server: ports server (\d+) group (\d+) on (\S+)", log)
    assert port and port.group(3) == server_node and port.group(1) != "8000"  # drawn, not TRL's fixed default
    # The trainer connected to the drawn port of the server's node, after it answered.
    driver_log = (run_dir / "hpcrl" / "driver.log").read_text()
    assert f":{port.group(1)}" in driver_log and "connected to the vLLM server at http://" in driver_log
    assert log.index("vllm-server answers at") < log.index("hpcrl: phase driver")
    # Both trainer nodes ran: rank 0 ran TRL's script, rank 1 met it on the drawn main port.
    assert "accelerate stand-in: 1 other rank(s) joined" in driver_log
    assert re.search(r"accelerate stand-in: rank 1 joined \S+:\d+", driver_log)
    assert {f"trainer-{n}-{job.job_id}.log" for n in trainer_nodes} <= {p.name for p in (run_dir / "logs").iterdir()}
    # The configs hpcrl wrote, read by the launcher; every save kept as save_total_limit says (2).
    assert (run_dir / "trl" / "accelerate.yaml").exists() and (run_dir / "trl" / "ds_zero3.json").exists()
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("checkpoint-*")) == ["checkpoint-20", "checkpoint-30"]
    assert chain(run_dir)[-1][3] == "completed:0"
    # Every task cleaned up after itself: the sweep, for tasks KILLed before their cleanup, found nothing.
    assert "[sweep]" not in log, log
    assert leftovers(job.job_id) == []


@pytest.mark.parametrize(
    "linger,seen",
    [
        # It exits at once: the watch loop sees its step end while the driver still runs, and stops the driver.
        (0, "the vllm-server step exited while the driver was running (on {node})"),
        # It stops answering and exits 4 s later (an API server shutting down): the trainer fails and the driver
        # ends first; the server's step, ending within the grace after, still takes the blame.
        (4, "the vllm-server step exited (on {node}) as the driver crashed"),
    ],
    ids=["exits", "lingers"],
)
def test_a_server_that_dies_ends_the_job_as_its_nodes_failure(tmp_path, run_sbatch_and_wait, leftovers, linger, seen):
    # The trainer takes 0.5 s a step for 200 steps: the server dies 6 s after it listens, under it.
    script, run_dir = job_script(
        tmp_path, "trldie", serve=f"--die-after-s 6 --linger-s {linger}", trainer="--step-s 0.5", steps=200, save=1000
    )
    job = run_sbatch_and_wait(script, 300)
    log = (run_dir / "logs" / f"job-{job.job_id}.log").read_text()
    server_node = nodes_of(job.job_id)[0]
    end = [e for e in chain(run_dir) if e[1] == "end"]
    assert [e[3] for e in end] == ["worker-died:95"], log
    assert seen.format(node=server_node) in log, log
    # The server shares its node with the batch script: its task's cleanup ends its own processes, not the
    # driver's (the loop stops the driver with TERM; bash reports a SIGKILLed driver as "Killed").
    assert not re.search(r"Killed\s.*DRIVER", log), log
    blame = (run_dir / "hpcrl" / f"blame-{job.job_id}").read_text().split("\n")
    assert f"{server_node} worker-died" in blame, log
    assert leftovers(job.job_id) == []


def test_colocate_mode_runs_on_every_node_and_completes(tmp_path, run_sbatch_and_wait, leftovers):
    # No server: the trainer's step holds both nodes, the batch script's first node among them. Its task there
    # ends before the driver does; ending it must not end the driver with it.
    script, run_dir = job_script(tmp_path, "trlco", mode="colocate", nodes=2, steps=20, save=10)
    assert "vllm-serve" not in script.read_text()
    job = run_sbatch_and_wait(script, 300)
    log = (run_dir / "logs" / f"job-{job.job_id}.log").read_text()
    assert job.state == "COMPLETED", log
    assert re.findall(r"^hpcrl: phase (\w+)$", log, re.M) == [
        "stack_check",
        "head",
        "files",
        "services",
        "driver",
        "stop",
    ]
    assert not re.search(r"Killed\s.*DRIVER", log), log
    nodes = nodes_of(job.job_id)
    assert {f"trainer-{n}-{job.job_id}.log" for n in nodes} <= {p.name for p in (run_dir / "logs").iterdir()}
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("checkpoint-*")) == ["checkpoint-10", "checkpoint-20"]
    assert chain(run_dir)[-1][3] == "completed:0", log
    assert "[sweep]" not in log, log
    assert leftovers(job.job_id) == []


def test_a_time_limit_stop_continues_and_resumes_from_the_newest_checkpoint(tmp_path, leftovers):
    """The time-limit warning as Slurm gives it (USR1 to the batch shell, `--signal=B:USR1@...`), sent once the
    first checkpoint is written: the job runs to its next complete checkpoint, ends `timeout`, and its
    continuation resumes from the newest complete checkpoint-N and trains to the end."""
    script, run_dir = job_script(tmp_path, "trltmo", trainer="--step-s 0.3", steps=60, save=10)
    first = submit(script)
    ckpt = run_dir / "checkpoints" / "checkpoint-10" / "trainer_state.json"
    deadline = time.monotonic() + 300
    while not ckpt.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ckpt.exists(), (run_dir / "logs" / f"job-{first}.log").read_text()
    subprocess.run(["scancel", "--batch", "--signal=USR1", first], check=True, timeout=30)
    while time.monotonic() < deadline:
        ends = [e for e in chain(run_dir) if e[1] == "end"]
        if len(ends) == 2:
            break
        time.sleep(1)
    ev = chain(run_dir)
    ends = [e for e in ev if e[1] == "end"]
    assert [e[3].split(":")[0] for e in ends] == ["timeout", "completed"], ev
    second = ends[1][0]
    assert ends[0][0] == first and second != first
    # After the warning the first job ran to its next complete checkpoint (a new checkpoint-N/trainer_state.json).
    assert "a checkpoint is complete" in (run_dir / "logs" / f"job-{first}.log").read_text()
    resumed = re.search(
        r"hpcrl: resuming from (\S+/checkpoint-(\d+))", (run_dir / "logs" / f"job-{second}.log").read_text()
    )
    assert resumed and int(resumed.group(2)) >= 20  # the checkpoint written after the warning, or later
    driver_log = (run_dir / "hpcrl" / "driver.log").read_text()
    assert f"resuming from {resumed.group(1)} at step {resumed.group(2)}" in driver_log
    assert leftovers(first) == [] and leftovers(second) == []


def test_a_stop_before_the_driver_starts_ends_the_job_without_starting_it(tmp_path, leftovers):
    """TERM to the batch shell alone (as `scancel --batch` gives it; a node failure's TERM reaches only what runs
    then) while the job waits for its server: no driver exists to pass it to, so the next phase must end the
    job with the stop's reason instead of starting the trainer (it ran to the end, or until Slurm's KILL)."""
    script, run_dir = job_script(tmp_path, "trlterm", serve="--startup-s 5")
    job = submit(script)
    log = run_dir / "logs" / f"job-{job}.log"
    deadline = time.monotonic() + 300
    while not (log.exists() and "hpcrl: phase vllm_server\n" in log.read_text()):
        assert time.monotonic() < deadline, "the job never reached its server's phase"
        time.sleep(0.2)
    (run_dir / "hpcrl" / "cancel").touch()  # as `hpcrl cancel` marks it: the TERM is the user's
    subprocess.run(["scancel", "--batch", "--signal=TERM", job], check=True, timeout=30)
    wait_for_state(job, TERMINAL_JOB_STATES, 300)
    text = log.read_text()
    assert [e[3] for e in chain(run_dir) if e[1] == "end"] == ["cancelled:143"], text
    assert "hpcrl: phase driver" not in text and not list((run_dir / "logs").glob("trainer-*")), text
    assert leftovers(job) == []
