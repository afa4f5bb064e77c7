"""The watchdog on recorded log streams: a real child process prints a fixture and the watchdog
must stop it with the reason's exit code and a breaker.json (fixtures: tests/data/logs/README.md).

No test asserts a duration; the time limits below are generous timeouts only.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpcrl.runtime.watchdog import Breaker

LOGS = Path(__file__).parent / "data" / "logs"
TIMEOUT = 120  # seconds; a guard against a hung test, not a measurement

# Prints a fixture line by line, then sleeps or exits. Writes its pid and a grandchild's pid
# first, so the test can check the whole process group was stopped.
FEEDER = r"""
import os, subprocess, sys, time, signal
fixture, pace, after, pidfile = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
grandchild = subprocess.Popen(["sleep", "300"])
open(pidfile + ".tmp", "w").write(f"{os.getpid()} {grandchild.pid}")
os.replace(pidfile + ".tmp", pidfile)  # whole or absent: the test polls for it
if after == "deaf":  # ignores SIGTERM, like a driver stuck in a collective
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if after == "usr1":
    def on_usr1(sig, frame):
        open(pidfile + ".usr1", "w").write("got SIGUSR1")
        grandchild.kill()
        sys.exit(7)
    signal.signal(signal.SIGUSR1, on_usr1)
if fixture != "-":
    for line in open(fixture, encoding="utf-8"):
        sys.stdout.write(line)
        sys.stdout.flush()
        time.sleep(pace)
if after.startswith("exit"):
    grandchild.kill()
    sys.exit(int(after[4:]))
time.sleep(300)
"""


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie nobody reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.fixture(autouse=True)
def _no_feeder_left(tmp_path):
    """The feeder and its `sleep 300` never outlive a test: the one killed watchdog's driver dies by
    PR_SET_PDEATHSIG, but its child is reparented (the job script's session sweep ends it in a job)."""
    yield
    pidfile = tmp_path / "pids"
    if not pidfile.exists():
        return
    for pid in (int(x) for x in pidfile.read_text().split()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if alive(pid) and (cmdline[:2] == [b"sleep", b"300"] or str(tmp_path / "feeder.py").encode() in cmdline):
            os.kill(pid, signal.SIGKILL)


def watch(
    tmp_path: Path, fixture: str, *opts: str, after: str = "sleep", pace: float = 0.001, wait: bool = True
) -> tuple[subprocess.CompletedProcess | subprocess.Popen, Path, Path]:
    feeder = tmp_path / "feeder.py"
    feeder.write_text(FEEDER)
    pidfile = tmp_path / "pids"
    run_dir = tmp_path / "run"
    src = str(LOGS / fixture) if fixture != "-" else "-"
    cmd = [
        sys.executable,
        "-m",
        "hpcrl.runtime.watchdog",
        "--run-dir",
        str(run_dir),
        "--kill-grace-seconds",
        "2",
        *opts,
        "--",
        sys.executable,
        str(feeder),
        src,
        str(pace),
        after,
        str(pidfile),
    ]
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE), run_dir, pidfile
    return subprocess.run(cmd, capture_output=True, timeout=TIMEOUT), run_dir, pidfile


def assert_group_stopped(pidfile: Path) -> None:
    child, grandchild = (int(x) for x in pidfile.read_text().split())
    deadline = time.monotonic() + 10
    while (alive(child) or alive(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child), "the driver was not stopped"
    assert not alive(grandchild), "the driver's process group was not stopped"


def breaker(run_dir: Path) -> dict:
    return json.loads((run_dir / "hpcrl" / "breaker.json").read_text())


@pytest.mark.parametrize(
    "fixture, key, first",
    [
        ("grpo_fast_zero_reward.log", "scores", 4),  # step 3 prints 0.00 (non-zero, rounded): not counted
        ("grpo_legacy_zero_reward.log", "objective/scores", 3),
        ("plain_dict_zero_reward.log", "scores", 3),
    ],
)
def test_zero_reward_trips_with_exit_90(tmp_path, fixture, key, first):
    proc, run_dir, pids = watch(tmp_path, fixture, "--zero-reward-steps", "10")
    assert proc.returncode == 90, proc.stderr.decode()
    assert_group_stopped(pids)
    b = breaker(run_dir)
    assert b["reason"] == "zero_reward" and b["exit_code"] == 90
    assert b["details"]["reward_key"] == key
    assert b["details"]["steps"] == list(range(first, first + 10))
    assert b["step"] == first + 9
    # The child's output reached the console and the log.
    assert b"Metrics" in proc.stdout or b"training_step" in proc.stdout
    assert (run_dir / "hpcrl" / "driver.log").read_bytes() == proc.stdout


def test_zero_reward_threshold_is_configurable(tmp_path):
    proc, run_dir, pids = watch(tmp_path, "grpo_fast_zero_reward.log", "--zero-reward-steps", "3")
    assert proc.returncode == 90
    assert breaker(run_dir)["details"]["steps"] == [4, 5, 6]
    assert_group_stopped(pids)


def test_nan_loss_trips_with_exit_91(tmp_path):
    proc, run_dir, pids = watch(tmp_path, "grpo_fast_nan_loss.log")
    assert proc.returncode == 91, proc.stderr.decode()
    assert_group_stopped(pids)
    b = breaker(run_dir)
    assert b["reason"] == "nan_loss" and b["step"] == 5
    assert b["details"]["losses"] == {"loss/policy_avg": "nan", "loss/total_avg": "nan"}


def test_silence_after_steps_is_a_hang_exit_92(tmp_path):
    proc, run_dir, pids = watch(tmp_path, "grpo_fast_healthy.log", "--hang-minutes", "0.02")
    assert proc.returncode == 92, proc.stderr.decode()
    assert_group_stopped(pids)
    b = breaker(run_dir)
    assert b["reason"] == "hang" and b["step"] == 5
    assert b["details"]["steps_seen"] == 5 and b["details"]["limit_minutes"] == 0.02


def test_silence_before_the_first_step_uses_the_startup_limit(tmp_path):
    proc, run_dir, pids = watch(tmp_path, "-", "--hang-minutes", "0.02", "--startup-minutes", "0.03")
    assert proc.returncode == 92
    assert_group_stopped(pids)
    b = breaker(run_dir)
    assert b["details"]["steps_seen"] == 0 and b["details"]["limit_minutes"] == 0.03
    assert "no step yet" in b["message"]


@pytest.mark.parametrize(
    "fixture, kind",
    [
        ("vllm_engine_dead.log", "vllm_engine_dead"),
        ("ray_node_dead.log", "ray_node_dead"),
    ],
)
def test_engine_or_node_death_trips_with_exit_93(tmp_path, fixture, kind):
    proc, run_dir, pids = watch(tmp_path, fixture, "--death-grace-seconds", "0.5")
    assert proc.returncode == 93, proc.stderr.decode()
    assert_group_stopped(pids)
    b = breaker(run_dir)
    assert b["reason"] == "engine_or_node_died" and b["details"]["kind"] == kind


@pytest.fixture
def worker_step():
    """`worker_step(s)`: the pid of a stand-in for the job's worker step (srun) that exits after s
    seconds, reaped at once as the batch shell reaps it; killed at the end of the test."""
    procs = []

    def start(exits_after: float) -> int:
        procs.append(subprocess.Popen(["sleep", str(exits_after)]))
        threading.Thread(target=procs[-1].wait, daemon=True).start()
        return procs[-1].pid

    yield start
    for p in procs:
        p.kill()


def test_a_dead_node_the_driver_notices_first_is_worker_died(tmp_path, monkeypatch, worker_step):
    """The race of issue 28: the driver logs Ray's node death and exits 1 at once, while the worker
    step's srun is still running (slurmctld slow) and ends 2 s later. Worker-died (95), not the
    dead-worker breaker (93): the run continues."""
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    step = worker_step(2)
    proc, run_dir, _ = watch(
        tmp_path, "ray_node_dead.log", "--worker-step-pid", str(step), "--worker-wait-seconds", "30", after="exit1"
    )
    assert proc.returncode == 95, proc.stderr.decode()
    assert not (run_dir / "hpcrl" / "breaker.json").exists()


def test_a_raylet_a_worker_blamed_is_worker_died(tmp_path, monkeypatch, worker_step):
    """The worker step still runs, but its task on n3 has written `n3 raylet-died` into the job's
    blame file (ray.sh's blame): 95."""
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    (tmp_path / "run" / "hpcrl").mkdir(parents=True)
    (tmp_path / "run" / "hpcrl" / "blame-4242").write_text("n3 raylet-died\n")
    proc, _, _ = watch(
        tmp_path,
        "ray_node_dead.log",
        "--worker-step-pid",
        str(worker_step(60)),
        "--worker-wait-seconds",
        "30",
        after="exit1",
    )
    assert proc.returncode == 95, proc.stderr.decode()


def test_an_engine_death_with_every_node_up_is_the_breaker(tmp_path, monkeypatch, worker_step):
    """A vLLM engine died while the worker step runs on for the whole wait and nobody blamed a raylet:
    the run's own failure, 93."""
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    proc, run_dir, _ = watch(
        tmp_path,
        "vllm_engine_dead.log",
        "--worker-step-pid",
        str(worker_step(60)),
        "--worker-wait-seconds",
        "1",
        after="exit1",
    )
    assert proc.returncode == 93 and breaker(run_dir)["reason"] == "engine_or_node_died"


def test_reward_key_reads_json_metric_lines_exit_90(tmp_path):
    """AReaL's reward key (the users' circuit breaker, seed 002) on JSON metric lines, named by --reward-key."""
    proc, run_dir, pids = watch(tmp_path, "areal_json_zero_reward.log", "--reward-key", "grpo_actor/task_reward/avg")
    assert proc.returncode == 90, proc.stderr.decode()
    assert_group_stopped(pids)
    b = breaker(run_dir)
    assert b["reason"] == "zero_reward" and b["details"]["reward_key"] == "grpo_actor/task_reward/avg"
    assert b["details"]["steps"] == list(range(4, 14)) and b["step"] == 13  # steps 1-3 earn 0.63-0.65


@pytest.mark.parametrize(
    "fixture, key, steps",
    [
        # Seed 002's AReaL (9af34d2b): three steps with reward, then exactly 0 ("0.0000e+00") from step 4.
        ("areal_console_zero_reward.log", "grpo_actor/task_reward/avg", list(range(4, 14))),
        # AReaL 4aef98d8 ("(AReaL)" header in colour, "ppo_actor" scope): two steps with reward, zeros from step 3.
        ("areal_console_4aef98d8_zero_reward.log", "ppo_actor/task_reward/avg", list(range(3, 13))),
    ],
)
def test_areal_console_stats_table_trips_exit_90(tmp_path, fixture, key, steps):
    """AReaL's own console output (StatsLogger's tables), no --reward-key: the zero reward trips the breaker."""
    proc, run_dir, pids = watch(tmp_path, fixture)
    assert proc.returncode == 90, proc.stderr.decode()
    assert (breaker(run_dir)["details"]["reward_key"], breaker(run_dir)["details"]["steps"]) == (key, steps)


def test_a_reward_key_never_seen_is_a_warning_in_the_log(tmp_path):
    """--reward-key names a key AReaL does not log (its key ends in /avg): after --zero-reward-steps steps the
    watchdog says so, on stderr and in driver.log, and the run goes on (exit 0)."""
    proc, run_dir, _ = watch(
        tmp_path,
        "areal_console_zero_reward.log",
        "--reward-key",
        "grpo_actor/task_reward/mean",
        "--zero-reward-steps",
        "5",
        after="exit0",
    )
    warning = "hpcrl-watchdog: warning: 5 training steps and the reward key grpo_actor/task_reward/mean in none of them"
    assert proc.returncode == 0 and warning in proc.stderr.decode()
    assert warning in (run_dir / "hpcrl" / "driver.log").read_text()


def test_verl_numpy2_values_are_read():
    """verl 1dda039b (numpy>=2) prints np.mean results as pprint.pformat does: `actor/grad_norm:np.float64(0.0)`."""
    b = Breaker(grad_norm_steps=2)
    assert b.line("(TaskRunner pid=7) step:1 - critic/score/mean:0.5 - actor/grad_norm:np.float64(0.0)", 0.0) is None
    assert (
        b.line("(TaskRunner pid=7) step:2 - critic/score/mean:0.5 - actor/grad_norm:np.float64(0.0)", 1.0).reason
        == "grad_norm_zero"
    )


@pytest.mark.parametrize(
    "fixture, opts, code, reason, steps",
    [
        # verl: actor/grad_norm exactly 0.0 from step 3 while the scores still vary.
        ("verl_grad_norm_zero.log", (), 96, "grad_norm_zero", list(range(3, 23))),
        ("verl_grad_norm_zero.log", ("--grad-norm-steps", "5"), 96, "grad_norm_zero", list(range(3, 8))),
        # OpenRLHF: group_reward_std exactly 0 from step 4 (every prompt's samples all earn 1.0).
        ("openrlhf_zero_variance.log", (), 97, "zero_variance", list(range(4, 24))),
        ("openrlhf_zero_variance.log", ("--zero-variance-steps", "3"), 97, "zero_variance", [4, 5, 6]),
    ],
)
def test_stalled_learning_breakers(tmp_path, fixture, opts, code, reason, steps):
    proc, run_dir, pids = watch(tmp_path, fixture, *opts)
    assert proc.returncode == code, proc.stderr.decode()
    assert_group_stopped(pids)
    b = breaker(run_dir)
    assert (b["reason"], b["exit_code"], b["details"]["steps"], b["step"]) == (reason, code, steps, steps[-1])


@pytest.mark.parametrize(
    "fixture, off",
    [("verl_grad_norm_zero.log", "--grad-norm-steps"), ("openrlhf_zero_variance.log", "--zero-variance-steps")],
)
def test_stalled_learning_breakers_can_be_turned_off(tmp_path, fixture, off):
    proc, run_dir, _ = watch(tmp_path, fixture, off, "0", after="exit0")
    assert proc.returncode == 0, proc.stderr.decode()
    assert not (run_dir / "hpcrl" / "breaker.json").exists()


def test_death_then_failing_exit_is_93(tmp_path):
    proc, run_dir, _ = watch(tmp_path, "vllm_engine_dead.log", "--death-grace-seconds", "60", after="exit1")
    assert proc.returncode == 93
    assert breaker(run_dir)["child_exit"] == 1


def test_death_line_then_clean_exit_passes_through(tmp_path):
    """vLLM can log 'died unexpectedly' at a clean shutdown; a driver exiting 0 is not tripped."""
    proc, run_dir, _ = watch(tmp_path, "vllm_engine_dead.log", "--death-grace-seconds", "60", after="exit0")
    assert proc.returncode == 0
    assert not (run_dir / "hpcrl" / "breaker.json").exists()


@pytest.mark.parametrize("after, code", [("exit0", 0), ("exit3", 3)])
def test_healthy_run_passes_the_exit_code_through(tmp_path, after, code):
    proc, run_dir, _ = watch(tmp_path, "grpo_fast_healthy.log", after=after)
    assert proc.returncode == code
    assert not (run_dir / "hpcrl" / "breaker.json").exists()
    assert b"Training finished" in (run_dir / "hpcrl" / "driver.log").read_bytes()


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists()


def _driver_talking(proc: subprocess.Popen) -> None:
    """Handshake: the driver's first line came out through the watchdog. The feeder installs its signal
    handlers before it prints, and the watchdog its forwarders before it pumps the driver's output."""
    ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT)
    assert ready and proc.stdout.readline(), f"no driver output through the watchdog in {TIMEOUT} s"


def test_sigusr1_is_forwarded_to_the_driver(tmp_path):
    proc, run_dir, pids = watch(tmp_path, "grpo_fast_healthy.log", after="usr1", wait=False)
    _wait_for(pids)
    _driver_talking(proc)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 7, err.decode()
    assert Path(str(pids) + ".usr1").read_text() == "got SIGUSR1"
    assert not (run_dir / "hpcrl" / "breaker.json").exists()


def test_sigterm_is_forwarded_and_the_signal_exit_reported(tmp_path):
    proc, run_dir, pids = watch(tmp_path, "grpo_fast_healthy.log", wait=False)
    _wait_for(pids)
    _driver_talking(proc)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 128 + signal.SIGTERM
    assert_group_stopped(pids)


def test_a_driver_deaf_to_sigterm_is_killed_after_the_grace(tmp_path):
    """TERM to the watchdog is forwarded; a driver that ignores it is SIGKILLed (with its group)
    after --kill-grace-seconds (2 here) instead of outliving the job."""
    proc, run_dir, pids = watch(tmp_path, "grpo_fast_healthy.log", after="deaf", wait=False)
    _wait_for(pids)
    _driver_talking(proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert b"ignored the stop signal for 2 s: killing its process group" in err
    assert proc.returncode == 128 + signal.SIGKILL
    assert_group_stopped(pids)


def test_the_driver_dies_with_a_killed_watchdog(tmp_path):
    """SIGKILL to the watchdog (which cannot forward it): the kernel kills the driver too
    (PR_SET_PDEATHSIG), so it is not left running with PPID 1."""
    proc, run_dir, pids = watch(tmp_path, "grpo_fast_healthy.log", after="deaf", wait=False)
    _wait_for(pids)
    child = int(pids.read_text().split()[0])
    proc.kill()
    proc.communicate(timeout=TIMEOUT)
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child), "the driver outlived its watchdog"
    grandchild = int(pids.read_text().split()[1])
    assert alive(grandchild)  # reparented: what _no_feeder_left ends (a job's session sweep, in a job)


def test_the_driver_shares_the_watchdogs_session_in_its_own_group(tmp_path):
    """`pkill -s <watchdog's session>` (what the job script does) reaches the driver's tree."""
    proc, run_dir, pids = watch(tmp_path, "grpo_fast_healthy.log", wait=False)
    _wait_for(pids)
    child = int(pids.read_text().split()[0])
    stat = lambda pid: Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # noqa: E731
    assert stat(child)[3] == stat(proc.pid)[3]  # same session id
    assert int(stat(child)[2]) == child != int(stat(proc.pid)[2])  # its own process group
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=TIMEOUT)
    assert_group_stopped(pids)


def test_an_old_breaker_file_is_archived(tmp_path):
    old = tmp_path / "run" / "hpcrl" / "breaker.json"
    old.parent.mkdir(parents=True)
    old.write_text('{"reason": "hang"}')
    proc, run_dir, _ = watch(tmp_path, "grpo_fast_healthy.log", after="exit0")
    assert proc.returncode == 0
    assert not old.exists()
    assert [p.name.startswith("breaker-") for p in old.parent.glob("breaker-*.json")] == [True]


BAD_LIMITS = (
    "hpcrl-watchdog: error: need a command, --zero-reward-steps >= 1, --hang-minutes > 0, "
    "--grad-norm-steps and --zero-variance-steps >= 0 and --grad-norm-floor >= 0"
)


@pytest.mark.parametrize(
    "args,message",
    [
        ([], "hpcrl-watchdog: error: give the command after --, e.g. --run-dir D -- python train.py"),
        (["--zero-reward-steps", "0", "--", "true"], BAD_LIMITS),
        (["--grad-norm-steps", "-1", "--", "true"], BAD_LIMITS),
    ],
)
def test_usage_errors_exit_2(tmp_path, args, message):
    proc = subprocess.run(
        [sys.executable, "-m", "hpcrl.runtime.watchdog", "--run-dir", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert (proc.returncode, proc.stderr.strip().splitlines()) == (2, [message])


def test_missing_command_is_127(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "hpcrl.runtime.watchdog", "--run-dir", str(tmp_path), "--", "/no/such/program"],
        capture_output=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 127 and b"cannot start" in proc.stderr


# ---------------------------------------------------------------- the decision logic alone


def feed(b: Breaker, fixture: str):
    for i, line in enumerate((LOGS / fixture).read_text().splitlines(keepends=True)):
        if trip := b.line(line, float(i)):
            return trip
    return None


def test_breaker_counts_only_consecutive_exact_zeros():
    assert feed(Breaker(zero_reward_steps=13), "grpo_fast_zero_reward.log") is None  # 12 zeros in the file
    assert feed(Breaker(zero_reward_steps=12), "grpo_fast_zero_reward.log").step == 15


def test_breaker_healthy_log_never_trips():
    b = Breaker(hang_s=100.0, startup_s=100.0)
    assert feed(b, "grpo_fast_healthy.log") is None
    assert b.steps == 5 and b.tick(b.last_progress + 50.0) is None
    assert b.tick(b.last_progress + 101.0).reason == "hang"


def test_breaker_death_waits_for_the_grace_period():
    b = Breaker(death_grace_s=10.0)
    assert feed(b, "vllm_engine_dead.log") is None
    seen = b.death[0]
    assert b.tick(seen + 5.0) is None
    assert b.tick(seen + 5.0, child_rc=0) is None  # a clean exit is not a death
    assert b.tick(seen + 11.0).reason == "engine_or_node_died"


def test_intentional_ray_kill_is_not_a_death():
    b = Breaker(death_grace_s=0.0)
    b.line("ray.exceptions.ActorDiedError: The actor died because it was killed by `ray.kill`.\n", 0.0)
    assert b.death is None


def test_output_without_steps_does_not_reset_the_hang_clock():
    """vLLM and Ray keep logging while a learner hangs in a collective: only steps count."""
    b = Breaker(hang_s=60.0, startup_s=60.0)
    for t in range(0, 120, 10):
        assert b.line(f"(LLMRayActor pid=1) INFO Avg generation throughput: 0.0 tokens/s {t}\n", float(t)) is None
    assert b.tick(61.0).reason == "hang"


def test_breaker_zero_variance_from_advantages_and_batch_range():
    """verl's advantages all 0, or one reward for the whole batch (min == max of the reward key)."""
    b = Breaker(zero_variance_steps=2)
    line = "step:{} - critic/score/mean:1.0 - critic/advantages/min:0.0 - critic/advantages/max:0.0"
    assert b.line(line.format(1), 0.0) is None
    assert b.line(line.format(2), 1.0).reason == "zero_variance"
    b = Breaker(zero_variance_steps=2, reward_keys=("task/reward/avg",))
    rec = '{{"step": {}, "task/reward/avg": 1.0, "task/reward/min": {}, "task/reward/max": 1.0}}'
    assert b.line(rec.format(1, 1.0), 0.0) is None
    assert b.line(rec.format(2, 0.0), 1.0) is None  # varied again: the count starts over
    assert b.line(rec.format(3, 1.0), 2.0) is None
    assert b.line(rec.format(4, 1.0), 3.0).reason == "zero_variance"


def test_a_nan_gradient_norm_is_not_a_flat_one():
    b = Breaker(grad_norm_steps=1)
    assert b.line("step:1 - actor/pg_loss:0.1 - actor/grad_norm:nan", 0.0) is None
    assert b.line("step:2 - actor/pg_loss:0.1 - actor/grad_norm:0.0", 1.0).reason == "grad_norm_zero"


# ---------------------------------------------------------------- a run directory that fails under the driver


def test_a_full_disk_keeps_the_driver_running(tmp_path):
    """Every driver.log write refused (/dev/full answers ENOSPC): the driver runs to its own end, the
    console still gets every line, and its exit code passes through."""
    proc, _run_dir, _ = watch(tmp_path, "grpo_fast_healthy.log", "--log", "/dev/full", after="exit0")
    lines = (LOGS / "grpo_fast_healthy.log").read_bytes().splitlines()
    assert (proc.returncode, proc.stdout.splitlines()) == (0, lines), proc.stderr[-2000:]


def test_a_driver_that_fails_on_a_full_disk_is_run_dir_full_88(tmp_path):
    proc, _run_dir, _ = watch(tmp_path, "grpo_fast_healthy.log", "--log", "/dev/full", after="exit3")
    assert proc.returncode == 88, proc.stderr[-2000:]


def test_a_log_that_cannot_be_written_stops_the_driver_run_dir_unwritable_89(tmp_path):
    """A stand-in for an I/O error (a log whose directory is gone: ENOENT, not ENOSPC): the driver,
    which would sleep 300 s (past the test's timeout), is stopped and the watchdog exits 89."""
    proc, _run_dir, _ = watch(tmp_path, "grpo_fast_healthy.log", "--log", str(tmp_path / "gone" / "driver.log"))
    assert proc.returncode == 89, proc.stderr[-2000:]


def test_the_watchdogs_worker_died_exit_ends_the_job_worker_died(tmp_path):
    """The batch script reads the watchdog's 95 as worker-died (hpcrl/contract.py END_REASONS) and
    chains a failure continuation; the stub driver stands in for the watchdog."""
    from stub_run import Stub

    stub = Stub(tmp_path, nodes=2)
    rc, out = stub.run(stub.render(), timeout=60, STUB_DRIVER_EXIT="95")
    assert rc == 95 and "continuation submitted" in out, out
    assert stub.events(tmp_path / "runs" / "grpo-olmo3-7b")[1][3] == "worker-died:95"
