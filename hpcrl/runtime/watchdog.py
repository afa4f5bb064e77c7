"""Circuit breaker around the training driver: `python -m hpcrl.runtime.watchdog --run-dir D -- CMD...`.

Runs CMD in its own process group, tees its stdout/stderr to the console and to a log in the
run directory, reads each training step's metrics from that output (hpcrl.logs.driver_log.StepParser)
and stops the run - SIGTERM to the group, SIGKILL after a grace period - writing
D/hpcrl/breaker.json and exiting with the breaker's code (hpcrl/contract.py; --help lists them) when:

  zero_reward          the mean reward is exactly 0 for K consecutive steps (--zero-reward-steps,
                       default 10)
  nan_loss             a loss is NaN or infinite
  hang                 no training step completes for M minutes (--hang-minutes; before the first
                       step --startup-minutes, since model loading and engine start-up take long)
  engine_or_node_died  a vLLM engine or Ray node/actor dies (and the driver does not finish cleanly
                       within --death-grace-seconds); unless the job's worker step shows a node
                       died (below)
  grad_norm_zero       the gradient norm is at most --grad-norm-floor for N consecutive steps
                       (--grad-norm-steps, default 20; 0 turns it off): the policy no longer changes
  zero_variance        every group of samples had zero reward variance for N consecutive steps
                       (--zero-variance-steps, default 20; 0 turns it off): GRPO's advantages are all zero

Steps are read in every backend's format at once (their union, known_log_formats.json beside this
module: below) and the formats no backend owns (JSON metric lines, one object per line; AReaL's tables).
The reward is the first known reward key a step logs, or the first of --reward-key KEY (repeatable)
when given; --reward-std-key KEY (repeatable) adds keys whose exact 0 means zero reward variance;
--loss-key KEY (repeatable) adds losses whose NaN or infinity trips nan_loss.

Every step's time and every checkpoint write's time go to D/hpcrl/step-times.jsonl
(hpcrl/logs/step_times.py): the watchdog's clock between step lines, and the framework's own timers
named by --step-time-key, --generation-time-key, --training-time-key, --checkpoint-time-key (metric
keys), --checkpoint-line (a regex with a group "s": a timer line of a checkpoint write) and
--checkpoint-marker (a file rewritten right after the step line once a checkpoint is complete).

The driver's log (--log, default D/hpcrl/driver.log) is a copy: when its file system is full
(ENOSPC, a quota) the lines are dropped, the console still gets them and the breakers still read
them, and the driver runs on; writing resumes once there is room again. A driver that fails while
the disk is full exits as run-dir-full (88), never as a crash. When the log cannot be written at
all (EIO, a read-only file system), the run directory is gone for the driver's checkpoints too:
the driver is stopped like a breaker stops it and the watchdog exits run-dir-unwritable (89).

A dead node is not the run's fault, however the driver notices it first: before it trips
engine_or_node_died, the watchdog waits up to --worker-wait-seconds for the worker step to say so
(its srun, --worker-step-pid, has exited, or a worker wrote a `raylet-died` line into the job's
blame file) and then exits with worker-died's code (95) instead, writing no breaker.json.

With --heartbeat FILE it sets FILE's modification time every WATCHDOG_BEAT_S seconds from its main
loop (FILE on node-local storage): a watchdog blocked on a hung run directory, or stopped, beats no
more, and the job script ends the job watchdog-hung (hpcrl/contract.py) when the beats stop.

Otherwise it exits with the driver's own code (128+N when a signal N ended it). SIGTERM,
SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 sent to the watchdog go to the driver's group, so
Slurm's pre-timeout signal reaches the driver; a driver still running --kill-grace-seconds
after a forwarded TERM, INT or HUP is killed (SIGKILL to its group). The driver runs in its
own process group inside the watchdog's session, and dies with the watchdog (PDEATHSIG).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from hpcrl.contract import (
    BLAME,
    BREAKER,
    BREAKERS,
    DRIVER_LOG,
    META,
    RAY_DIED,
    RUN_DIR_ENDS,
    RUN_DIR_FULL,
    RUN_DIR_UNWRITABLE,
    STEP_TIMES,
    WATCHDOG_BEAT_S,
    breaker_exit_code,
)
from hpcrl.logs.driver_log import GENERIC, Step, StepFormat, StepParser, death_line, reward_unseen
from hpcrl.logs.step_times import StepClock
from hpcrl.runtime.watchdog_io.driver_log_file import DriverLog, say
from hpcrl.runtime.watchdog_io.heartbeat import Heartbeat
from hpcrl.runtime.watchdog_io.step_recorder import TimeRecorder
from hpcrl.runtime.wait_http import pid_alive

# The union of every backend's log format (hpcrl/planning/backends/*.py LogFormat), generated from the registry by
# hpcrl/logs/log_format.py write_known_formats (tests/test_log_format.py fails when it is stale): this module runs
# where no backend can be imported. The watchdog reads every framework's steps in it, as it did before the formats
# moved into the backends, rather than the run's own format rendered onto its command line: that would change every
# job script for no breaker that trips differently on the frameworks' own logs, and stop it reading a key another
# framework's fork (or a user's script) logs.
KNOWN_FORMATS = Path(__file__).with_name("known_log_formats.json")


def known_format() -> StepFormat:
    """The format the watchdog reads a driver's output in: every backend's, then the ones no backend owns."""
    return StepFormat.union(StepFormat.from_json(json.loads(KNOWN_FORMATS.read_text())), GENERIC)


FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# Forwarded signals that ask the driver to stop: SIGKILL follows after --kill-grace-seconds.
STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass
class Trip:
    reason: str
    message: str
    step: int | None
    details: dict = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return breaker_exit_code(self.reason)


class Breaker:
    """The decisions, without processes: feed lines and clock ticks, get a Trip or None."""

    def __init__(
        self,
        zero_reward_steps: int = 10,
        hang_s: float = 3600.0,
        startup_s: float = 5400.0,
        death_grace_s: float = 15.0,
        now: float = 0.0,
        *,
        reward_keys: tuple[str, ...] = (),
        std_keys: tuple[str, ...] = (),
        grad_norm_steps: int = 20,
        grad_norm_floor: float = 1e-6,
        zero_variance_steps: int = 20,
        loss_keys: tuple[str, ...] = (),
        fmt: StepFormat | None = None,
    ):
        self.k, self.hang_s, self.startup_s, self.death_grace_s = zero_reward_steps, hang_s, startup_s, death_grace_s
        self.grad_n, self.grad_floor, self.var_n = grad_norm_steps, grad_norm_floor, zero_variance_steps
        self.parser = StepParser(fmt or known_format(), reward_keys, std_keys, loss_keys)
        self.steps = 0
        self.last_step: int | None = None
        self.last_progress = now
        self.zeros: list[int] = []
        self.flat: list[int] = []  # consecutive steps with a gradient norm at most the floor
        self.same: list[int] = []  # consecutive steps whose groups all had zero reward variance
        self.death: tuple[float, str, str] | None = None
        self.new_step: Step | None = None  # the step the last line completed, if any
        self.notes: list[str] = []  # warnings for the log (run() writes them), not trips

    def line(self, text: str, now: float) -> Trip | None:
        if self.death is None and (kind := death_line(text)):
            self.death = (now, kind, text.strip()[:500])
        step = self.new_step = self.parser.feed(text)
        if step is None:
            return None
        self.steps, self.last_step, self.last_progress = self.steps + 1, step.number, now
        if self.steps == self.k and (note := reward_unseen(self.parser, self.steps, self.k)):
            self.notes.append(note)
        if bad := step.bad_losses():
            return Trip(
                "nan_loss",
                f"loss is {', '.join(f'{k}={v}' for k, v in bad.items())} at step {step.number}",
                step.number,
                {"losses": {k: str(v) for k, v in bad.items()}},
            )
        if step.reward_key is not None:
            self.zeros = self.zeros + [step.number] if step.reward_is_exactly_zero() else []
            if len(self.zeros) >= self.k:
                return Trip(
                    "zero_reward",
                    f"mean reward ({step.reward_key}) exactly 0 for {len(self.zeros)} "
                    f"consecutive steps ({self.zeros[0]}-{self.zeros[-1]})",
                    step.number,
                    {"reward_key": step.reward_key, "steps": self.zeros, "threshold": self.k},
                )
        # A step that does not log the signal leaves its count as it is.
        if (g := step.grad_norm()) is not None:
            key, value = g
            self.flat = self.flat + [step.number] if math.isfinite(value) and abs(value) <= self.grad_floor else []
            if self.grad_n and len(self.flat) >= self.grad_n:
                return Trip(
                    "grad_norm_zero",
                    f"gradient norm ({key}) at most {self.grad_floor:g} for {len(self.flat)} "
                    f"consecutive steps ({self.flat[0]}-{self.flat[-1]}), last {value:g}: the policy no longer "
                    "changes",
                    step.number,
                    {"key": key, "steps": self.flat, "threshold": self.grad_n, "floor": self.grad_floor, "last": value},
                )
        if (v := step.zero_variance()) is not None:
            zero, evidence = v
            self.same = self.same + [step.number] if zero else []
            if self.var_n and len(self.same) >= self.var_n:
                return Trip(
                    "zero_variance",
                    f"every group had zero reward variance for {len(self.same)} consecutive "
                    f"steps ({self.same[0]}-{self.same[-1]}; {evidence}): GRPO's advantages are all zero, "
                    "nothing is learned",
                    step.number,
                    {"evidence": evidence, "steps": self.same, "threshold": self.var_n},
                )
        return None

    def tick(self, now: float, child_rc: int | None = None) -> Trip | None:
        """Time-based trips; child_rc is the driver's exit code once it has exited."""
        if self.death and (now - self.death[0] >= self.death_grace_s or child_rc not in (None, 0)):
            when, kind, line = self.death
            return Trip(
                "engine_or_node_died",
                f"{kind.replace('_', ' ')}: {line[:200]}",
                self.last_step,
                {"kind": kind, "line": line, "seen_s_ago": round(now - when, 1)},
            )
        limit = self.hang_s if self.steps else self.startup_s
        if child_rc is None and now - self.last_progress > limit:
            what = f"after step {self.last_step}" if self.steps else "since start (no step yet)"
            return Trip(
                "hang",
                f"no training step completed for {(now - self.last_progress) / 60:.1f} min {what}",
                self.last_step,
                {"limit_minutes": round(limit / 60, 3), "steps_seen": self.steps},
            )
        return None


def _child_setup() -> None:
    """In the driver, before exec: a process group of its own, and SIGKILL when the watchdog dies
    (prctl PR_SET_PDEATHSIG, Linux), so a killed watchdog cannot leave the driver running."""
    os.setpgid(0, 0)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _pump(pipe: IO[bytes], dest: IO[bytes], q: queue.Queue) -> None:
    for raw in iter(pipe.readline, b""):
        q.put((dest, raw))
    q.put((dest, None))


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(proc: subprocess.Popen, kill_grace_s: float) -> None:
    """SIGTERM to the driver's group, SIGKILL after the grace period; returns once it has exited."""
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=kill_grace_s)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def _archive_old_breaker(path: Path) -> None:
    """A breaker.json from an earlier attempt is kept, renamed, so it cannot be mistaken for this one."""
    try:
        if path.exists():
            stamp = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).strftime("%Y%m%dT%H%M%SZ")
            path.rename(path.with_name(f"breaker-{stamp}.json"))
    except OSError as exc:  # the run dir's own trouble is the driver log's to report
        say(f"cannot archive {path}: {exc.strerror}")


def write_breaker(path: Path, trip: Trip, **extra: object) -> None:
    data = {
        "reason": trip.reason,
        "exit_code": trip.exit_code,
        "message": trip.message,
        "step": trip.step,
        "details": trip.details,
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }
    text = json.dumps(data, indent=2, sort_keys=True, default=str, ensure_ascii=False) + "\n"
    tmp = path.with_suffix(".json.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as exc:  # a full or failed run dir: the record goes to the job's log instead
        say(f"cannot write {path} ({exc.strerror}); it would say: {text}")


def worker_step_death(step_pid: int | None, blame: Path, wait_s: float) -> str | None:
    """How the worker step shows that a node died (its srun exited, or a worker blamed its raylet),
    waited for up to wait_s when there is a worker step; None when it shows nothing."""
    deadline = time.monotonic() + (wait_s if step_pid is not None else 0.0)
    while True:
        if step_pid is not None and not pid_alive(step_pid):
            return f"the worker step (srun, pid {step_pid}) has exited"
        try:
            died = [
                ln.split()[0]
                for ln in blame.read_text(errors="replace").splitlines()
                if ln.split()[1:2] == ["raylet-died"]
            ]
        except OSError:
            died = []
        if died:
            return f"the raylet of {', '.join(dict.fromkeys(died))} died"
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)


def run(
    cmd: list[str],
    run_dir: Path,
    breaker: Breaker,
    *,
    log_path: Path | None = None,
    kill_grace_s: float = 30.0,
    drain_s: float = 5.0,
    clock: StepClock | None = None,
    marker: Path | None = None,
    worker_step_pid: int | None = None,
    worker_wait_s: float = 10.0,
    heartbeat: Path | None = None,
) -> int:
    """Run cmd under the breaker; the exit code the watchdog should exit with."""
    beat = Heartbeat(heartbeat)
    beat.beat(time.monotonic())
    hp = run_dir / META
    try:
        hp.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        say(f"cannot make {hp}: {exc.strerror}")
    times = TimeRecorder(clock or StepClock(os.environ.get("SLURM_JOB_ID", "-")), hp / STEP_TIMES, marker)
    breaker_path = hp / BREAKER
    _archive_old_breaker(breaker_path)
    log_path = log_path or hp / DRIVER_LOG
    env = {**os.environ, "PYTHONUNBUFFERED": os.environ.get("PYTHONUNBUFFERED", "1")}
    try:
        # Its own process group (signals reach the driver and its children, not the watchdog),
        # but the watchdog's session: whoever started the watchdog in a session of its own
        # (the job script does) can kill the whole tree with one `pkill -s`.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_child_setup, env=env)
    except OSError as exc:
        sys.stderr.write(f"hpcrl-watchdog: cannot start {cmd[0]!r}: {exc.strerror}\n")
        return 127
    stop_asked_at: list[float] = []  # when a forwarded TERM/INT/HUP first asked the driver to stop

    def forward(sig: int, _frame) -> None:
        _signal_group(proc.pid, sig)
        if sig in STOPPING and not stop_asked_at:
            stop_asked_at.append(time.monotonic())

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    q: queue.Queue = queue.Queue()
    for pipe, dest in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer)):
        threading.Thread(target=_pump, args=(pipe, dest, q), daemon=True).start()
    tail: collections.deque[str] = collections.deque(maxlen=30)
    open_streams, trip, exited_at, killed = 2, None, None, False
    breaker.last_progress = time.monotonic()
    log = DriverLog(log_path)
    broken = False  # the run dir failed under the running driver: stopped as a breaker stops it
    died: str | None = None  # how the worker step showed a dead node (worker-died, not a breaker)
    try:

        def tee(dest: IO[bytes], raw: bytes) -> None:
            try:
                dest.write(raw)
                dest.flush()
            except OSError:  # a closed console must not stop the breaker
                pass
            log.write(raw)
            tail.append(raw.decode("utf-8", "replace").rstrip("\n"))

        while trip is None and log.broken is None:
            try:
                dest, raw = q.get(timeout=0.1)
                if raw is None:
                    open_streams -= 1
                else:
                    tee(dest, raw)
                    text = raw.decode("utf-8", "replace")
                    beat.beat(time.monotonic())
                    trip = breaker.line(text, time.monotonic())
                    times.line(text, breaker.new_step)
                    while breaker.notes:
                        tee(sys.stderr.buffer, f"hpcrl-watchdog: warning: {breaker.notes.pop(0)}\n".encode())
                    continue
            except queue.Empty:
                pass
            rc = proc.poll()
            now = time.monotonic()
            beat.beat(now)
            times.tick(now)
            if rc is None and stop_asked_at and now - stop_asked_at[0] > kill_grace_s and not killed:
                # Asked to stop (TERM/INT/HUP), forwarded, ignored: nothing may outlive the job.
                sys.stderr.write(
                    f"hpcrl-watchdog: the driver ignored the stop signal for {kill_grace_s:g} s: "
                    "killing its process group\n"
                )
                _signal_group(proc.pid, signal.SIGKILL)
                killed = True
            if rc is not None:
                exited_at = exited_at or now
                # Descendants may hold the pipes open after the driver exits; stop reading soon after.
                if open_streams == 0 or now - exited_at > drain_s:
                    trip = breaker.tick(now, rc)
                    break
            trip = breaker.tick(now, rc)
        broken = trip is None and log.broken is not None and proc.poll() is None
        if broken:
            _stop(proc, kill_grace_s)
        if trip is not None and trip.reason == "engine_or_node_died":
            blame = hp / BLAME.format(job=os.environ.get("SLURM_JOB_ID", ""))
            died = worker_step_death(worker_step_pid, blame, worker_wait_s)
        if trip is not None:
            if died:
                sys.stderr.write(
                    f"hpcrl-watchdog: a node died ({died}): worker-died, not the run's fault "
                    f"({trip.message}); stopping the driver\n"
                )
            else:
                sys.stderr.write(
                    f"hpcrl-watchdog: tripped ({trip.reason}, exit {trip.exit_code}): {trip.message}; "
                    f"stopping the run (SIGTERM, SIGKILL after {kill_grace_s:g} s)\n"
                )
            sys.stderr.flush()
            _stop(proc, kill_grace_s)
            if not died:
                write_breaker(
                    breaker_path,
                    trip,
                    command=cmd,
                    child_pid=proc.pid,
                    log=str(log_path),
                    child_exit=proc.returncode,
                    last_lines=list(tail),
                )
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # what the driver printed while stopping
            try:
                dest, raw = q.get(timeout=0.05)
            except queue.Empty:
                break
            if raw:
                tee(dest, raw)
    finally:
        log.close()
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    if died:
        return RAY_DIED["worker-died"]
    if trip is not None:
        return trip.exit_code
    rc = proc.wait()
    if broken or (rc != 0 and log.broken is not None):
        return RUN_DIR_ENDS[RUN_DIR_UNWRITABLE]
    if rc != 0 and log.full():
        say(f"the driver exited with {rc} while {log.path.parent} had no room: {RUN_DIR_FULL}")
        return RUN_DIR_ENDS[RUN_DIR_FULL]
    return 128 - rc if rc < 0 else rc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    if "--" not in argv and not {"-h", "--help"} & set(argv):
        sys.stderr.write("hpcrl-watchdog: error: give the command after --, e.g. --run-dir D -- python train.py\n")
        return 2
    p = argparse.ArgumentParser(
        prog="python -m hpcrl.runtime.watchdog",
        description=__doc__.split("\n")[0],
        usage="%(prog)s --run-dir DIR [options] -- CMD [ARG ...]",
        epilog="exit codes of the breakers: " + ", ".join(f"{code} {name}" for name, (code, _) in BREAKERS.items()),
    )
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument("--zero-reward-steps", type=int, default=10)
    p.add_argument("--reward-key", action="append", default=[], help="the reward's metric key (repeatable, in order)")
    p.add_argument("--loss-key", action="append", default=[], help="a loss key whose NaN trips nan_loss (repeatable)")
    p.add_argument("--reward-std-key", action="append", default=[], help="a key whose exact 0 is zero reward variance")
    p.add_argument("--grad-norm-steps", type=int, default=20, help="steps of a ~0 gradient norm that trip (0: off)")
    p.add_argument("--grad-norm-floor", type=float, default=1e-6)
    p.add_argument(
        "--zero-variance-steps", type=int, default=20, help="steps of zero reward variance that trip (0: off)"
    )
    p.add_argument("--hang-minutes", type=float, default=60.0)
    p.add_argument("--startup-minutes", type=float, default=None, help="before the first step (default: max(90, hang))")
    p.add_argument("--death-grace-seconds", type=float, default=15.0)
    p.add_argument("--kill-grace-seconds", type=float, default=30.0)
    p.add_argument("--log", type=Path, default=None, help="default: RUN_DIR/hpcrl/driver.log")
    for what in ("step", "generation", "training", "checkpoint"):
        p.add_argument(
            f"--{what}-time-key",
            action="append",
            default=[],
            help=f"a metric key holding the {what}'s seconds (repeatable)",
        )
    p.add_argument("--checkpoint-line", default=None, help='a regex whose group "s" is a checkpoint write\'s seconds')
    p.add_argument(
        "--checkpoint-marker",
        type=Path,
        default=None,
        help="a file rewritten right after a step line once a checkpoint is complete",
    )
    p.add_argument("--worker-step-pid", type=int, default=None, help="the job's worker step (srun) on this node")
    p.add_argument(
        "--heartbeat",
        default="",
        help=f"a file whose time is set every {WATCHDOG_BEAT_S} s while the watchdog runs (node-local)",
    )
    p.add_argument(
        "--worker-wait-seconds",
        type=float,
        default=10.0,
        help="how long a node's death may take to show in the worker step before engine_or_node_died trips",
    )
    a = p.parse_args(argv[:split])
    cmd = argv[split + 1 :]
    if (
        not cmd
        or a.zero_reward_steps < 1
        or a.hang_minutes <= 0
        or min(a.grad_norm_steps, a.zero_variance_steps) < 0
        or not a.grad_norm_floor >= 0
    ):
        sys.stderr.write(
            "hpcrl-watchdog: error: need a command, --zero-reward-steps >= 1, --hang-minutes > 0, "
            "--grad-norm-steps and --zero-variance-steps >= 0 and --grad-norm-floor >= 0\n"
        )
        return 2
    startup = a.startup_minutes if a.startup_minutes is not None else max(90.0, a.hang_minutes)
    b = Breaker(
        a.zero_reward_steps,
        a.hang_minutes * 60,
        startup * 60,
        a.death_grace_seconds,
        reward_keys=tuple(a.reward_key),
        std_keys=tuple(a.reward_std_key),
        loss_keys=tuple(a.loss_key),
        grad_norm_steps=a.grad_norm_steps,
        grad_norm_floor=a.grad_norm_floor,
        zero_variance_steps=a.zero_variance_steps,
    )
    clock = StepClock(
        os.environ.get("SLURM_JOB_ID", "-"),
        step_keys=tuple(a.step_time_key),
        generation_keys=tuple(a.generation_time_key),
        training_keys=tuple(a.training_time_key),
        checkpoint_keys=tuple(a.checkpoint_time_key),
        checkpoint_line=a.checkpoint_line,
    )
    return run(
        cmd,
        a.run_dir,
        b,
        log_path=a.log,
        kill_grace_s=a.kill_grace_seconds,
        clock=clock,
        marker=a.checkpoint_marker,
        worker_step_pid=a.worker_step_pid,
        worker_wait_s=a.worker_wait_seconds,
        heartbeat=Path(a.heartbeat) if a.heartbeat else None,
    )


if __name__ == "__main__":
    sys.exit(main())
