"""The stand-ins the Slurm tests will run for TRL's processes (no GPU, no vLLM, no TRL here): a `trl vllm-serve`
that answers GET /health after a model-load delay, and a trainer that waits for it, prints TRL's console
lines, saves checkpoint-N and resumes from one (tests/data/trl/*_standin.py say what each mirrors). Here they run
as plain processes on 127.0.0.1; the job-level tests (sbatch on the local Slurm) need the job description's
rendering, which TRL does not have yet.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from hpcrl.logs.driver_log import death_line, parse_steps
from hpcrl.logs.log_format import run_format

from helpers import free_port

DATA = Path(__file__).resolve().parent / "data" / "trl"
SERVER, TRAINER = DATA / "vllm_serve_standin.py", DATA / "trl_trainer_standin.py"


def server(port: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            str(SERVER),
            "--model",
            "Qwen/Qwen2.5-7B",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--tensor_parallel_size",
            "4",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def trainer(port: int, out: Path, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(TRAINER),
            "--vllm_mode",
            "server",
            "--vllm_server_host",
            "127.0.0.1",
            "--vllm_server_port",
            str(port),
            "--output_dir",
            str(out),
            "--logging_steps",
            "1",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_trainer_waits_for_the_servers_health_then_trains(tmp_path):
    port = free_port("127.0.0.1")
    srv = server(port, "--startup-s", "3")
    t0 = time.monotonic()
    try:
        out = trainer(port, tmp_path / "ck", "--max_steps", "3", "--save_steps", "100")
    finally:
        srv.kill()
        srv.wait()
    waited = time.monotonic() - t0
    assert out.returncode == 0 and len(parse_steps(out.stdout.splitlines(), run_format("trl"))) == 3
    assert waited >= 3  # not one step before the server answered /health


def test_the_trainer_gives_up_after_vllm_server_timeout_without_a_server(tmp_path):
    out = trainer(free_port("127.0.0.1"), tmp_path / "ck", "--max_steps", "3", "--vllm_server_timeout", "3")
    assert out.returncode != 0 and "did not answer /health within 3.0 s" in out.stderr


def test_a_server_that_dies_ends_the_trainer_and_says_why(tmp_path):
    port = free_port("127.0.0.1")
    srv = server(port, "--die-after-s", "1.5")
    assert "stand-in" in srv.stdout.readline()  # listening: the trainer connects before it dies
    try:
        out = trainer(port, tmp_path / "ck", "--max_steps", "200", "--save_steps", "100", "--step-s", "0.1")
    finally:
        srv_out = srv.communicate(timeout=30)[0]
    assert srv.returncode == 1 and out.returncode != 0
    assert [death_line(x) for x in srv_out.splitlines() if death_line(x)] == ["vllm_engine_dead"]


def test_a_continuation_resumes_from_the_newest_checkpoint(tmp_path):
    port = free_port("127.0.0.1")
    srv = server(port)
    try:
        first = trainer(port, tmp_path / "ck", "--max_steps", "6", "--save_steps", "2", "--save_total_limit", "2")
        done = sorted(p.name for p in (tmp_path / "ck").glob("checkpoint-*"))
        again = trainer(
            port,
            tmp_path / "ck",
            "--max_steps",
            "8",
            "--save_steps",
            "2",
            "--resume_from_checkpoint",
            str(tmp_path / "ck" / "checkpoint-6"),
        )
    finally:
        srv.kill()
        srv.wait()
    assert first.returncode == 0 and done == ["checkpoint-4", "checkpoint-6"]
    # steps 7 and 8 only: the continuation starts after checkpoint-6's global_step
    assert again.returncode == 0 and len(parse_steps(again.stdout.splitlines(), run_format("trl"))) == 2
    assert json.loads((tmp_path / "ck" / "checkpoint-8" / "trainer_state.json").read_text()) == {"global_step": 8}


def test_the_watchdog_trips_on_the_stand_ins_zero_rewards(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcrl.runtime.watchdog",
            "--run-dir",
            str(tmp_path / "run"),
            "--kill-grace-seconds",
            "2",
            "--",
            sys.executable,
            str(TRAINER),
            "--output_dir",
            str(tmp_path / "ck"),
            "--logging_steps",
            "1",
            "--max_steps",
            "50",
            "--zero-reward",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    breaker = json.loads((tmp_path / "run" / "hpcrl" / "breaker.json").read_text())
    assert out.returncode == 90 and (breaker["reason"], breaker["step"]) == ("zero_reward", 10)
