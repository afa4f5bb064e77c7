"""`hpcrl watch RUN` in a real terminal (tmux) against a job running on the local Slurm: the screen follows the
job step by step, and when the run ends the last frame stays with the end named. Content only: which step a
frame shows, never how long anything took."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time

import pytest
from lifecycle_harness import config, hpcrl, ok_json
from watch_harness import fake_open_instruct, frame_step

WIDTH, HEIGHT = 120, 45


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, timeout=30, check=True).stdout


def _screen_until(sock: str, check, what: str, deadline_s: float) -> str:
    end = time.monotonic() + deadline_s
    while True:
        text = _tmux(sock, "capture-pane", "-p", "-t", "watch")
        if check(text):
            return text
        if time.monotonic() > end:
            pytest.fail(f"gave up waiting for {what}; the screen:\n{text}")
        time.sleep(1)


def test_watch_in_a_terminal_follows_the_job_and_names_the_end(slurm, env):
    if shutil.which("tmux") is None:
        (pytest.fail if os.environ.get("HPCRL_REQUIRE_SLURM") == "1" else pytest.skip)(
            "tmux is not installed (.ci/run installs it; apt-get install tmux)"
        )
    fake_open_instruct(env, steps=20, pause=2)
    run_id = ok_json(hpcrl(env, "submit", "--json", "--config", str(config(env, "tty"))))["run_id"]
    sock = f"hpcrl-watch-{os.getpid()}"
    # The terminal's own size, as a user's: no COLUMNS from the harness.
    given = {k: v for k, v in env["env"].items() if k not in ("COLUMNS", "LINES")}
    command = " ".join(
        shlex.quote(w)
        for w in [
            "env",
            "-u",
            "COLUMNS",
            "-u",
            "LINES",
            *(f"{k}={v}" for k, v in given.items()),
            sys.executable,
            "-m",
            "hpcrl",
            "watch",
            run_id,
            "--every",
            "2",
        ]
    )
    try:
        _tmux(
            sock,
            "new-session",
            "-d",
            "-s",
            "watch",
            "-x",
            str(WIDTH),
            "-y",
            str(HEIGHT),
            f"cd {shlex.quote(str(env['tmp']))} && {command}; echo WATCH-EXIT=$?; sleep 600",
        )
        first = _screen_until(sock, lambda t: frame_step(t) is not None, "a frame with a step", 600)
        time.sleep(10)
        second = _screen_until(sock, lambda t: frame_step(t) is not None, "a frame with a step", 60)
        assert frame_step(second) > frame_step(first), (first, second)  # the step moved on the screen
        assert "reward (scores)" in second and "step time:" in second
        last = _screen_until(sock, lambda t: "WATCH-EXIT=" in t, "watch to end with the run", 600)
        print(last)  # docs/watch.md's example (pytest -s)
        assert f"run {run_id} ended: completed" in last and "WATCH-EXIT=0" in last, last
        assert frame_step(last) == 20
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, timeout=30)
        hpcrl(env, "cancel", run_id)
