"""The submit/status/cancel harness on the real local Slurm: a private registry, run root, profile
and a fake open-instruct checkout (tests/test_lifecycle.py, tests/test_hardening.py), a second Unix
user, and the job's processes. Its fixtures are registered for every test module (conftest.py)."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from helpers import assert_user_error, ok_json  # noqa: F401 - the lifecycle tests import them from here

if TYPE_CHECKING:
    from hpcrl.jobs.run_dir import RunDir

NO_SBATCH = "hpcrl needs a Slurm login node (sbatch not found on PATH) — or the local dev cluster: scripts/dev-slurm up"

# A fake open_instruct/grpo_fast.py: resumes (exit 0) when it finds an earlier job's marker in
# --checkpoint_state_dir; otherwise writes its own marker and sleeps, or exits with --exit_code.
FAKE_GRPO = r"""
import os, sys
# The marker first, before anything slow: the time-limit warning may come seconds after start.
# Behaviour: --sleep/--exit_code (hand-written script), else the file fake_behaviour beside
# open_instruct/ (the rendered script passes only open-instruct's own flags).
try:
    conf = dict(w.split("=", 1) for w in open(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                           "..", "fake_behaviour")).read().split())
except OSError:
    conf = {}
def opt(name, default=None):
    argv = sys.argv[1:]
    return argv[argv.index(name) + 1] if name in argv[:-1] else conf.get(name.lstrip("-"), default)
ckpt, job = opt("--checkpoint_state_dir"), os.environ.get("SLURM_JOB_ID", "?")
os.makedirs(ckpt, exist_ok=True)
markers = sorted(f for f in os.listdir(ckpt) if f.startswith("marker-"))
if not markers:
    open(os.path.join(ckpt, f"marker-{job}"), "w").write("step 1\n")
import signal, time
if markers:
    open(os.path.join(ckpt, f"resumed-{job}"), "w").write(markers[-1])
    print(f"fake grpo_fast: job {job} resumed from {markers[-1]}", flush=True)
    sys.exit(0)
print(f"fake grpo_fast: job {job} wrote marker-{job}", flush=True)
code = int(opt("--exit_code", 0))
if conf.get("setsid_child") == "1":  # a daemon in a session of its own (setsid -f: its parent exits at once)
    import subprocess
    pid_file = os.path.join(ckpt, f"setsid-{job}")
    subprocess.run(["setsid", "-f", "sh", "-c", f"echo $$ >{pid_file}.tmp && mv {pid_file}.tmp {pid_file} && exec sleep 600"])
if conf.get("ignore_term") == "1":  # a driver deaf to SIGTERM: only SIGKILL ends it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: (print("fake grpo_fast: stopping at a safe point", flush=True), sys.exit(0)))
time.sleep(float(opt("--sleep", 0)))
print(f"fake grpo_fast: exit {code}", flush=True)
sys.exit(code)
"""

# HAND-WRITTEN: implements docs/run-dir.md (start/end/continue events, reasons, requeue rules).
SCRIPT = r"""#!/bin/bash
#SBATCH --job-name=hpcrl-test-{name}
#SBATCH --partition={partition}
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --time={time}
#SBATCH --signal=B:USR1@30
#SBATCH --output={run_dir}/logs/job-%j.log
#SBATCH --open-mode=append
# hpcrl-cluster: local-dev
RUN_DIR={run_dir}
MAX_RESTARTS={max_restarts}
META="$RUN_DIR/hpcrl"
event() {{ printf '%s\t%s\t%s\t%s\n' "$SLURM_JOB_ID" "$1" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$2" >>"$META/jobs.tsv"; }}
reason="" driver=""
stop_driver() {{ [ -n "$driver" ] && kill -TERM "$driver" 2>/dev/null; }}
on_usr1() {{ [ -z "$reason" ] && reason=timeout; stop_driver; }}
on_term() {{ if [ -z "$reason" ]; then if [ -e "$META/cancel" ]; then reason=cancelled; else reason=preempted; fi; fi; stop_driver; }}
trap on_usr1 USR1
trap on_term TERM
event start "$SLURMD_NODENAME"
echo "job $SLURM_JOB_ID on $SLURMD_NODENAME"
cd {workdir}
{python} open_instruct/grpo_fast.py --output_dir "$RUN_DIR/output" --checkpoint_state_dir "$RUN_DIR/checkpoints" {extra} &
driver=$!
[ -n "$reason" ] && stop_driver
while :; do wait "$driver"; rc=$?; kill -0 "$driver" 2>/dev/null || break; done
if [ -z "$reason" ]; then if [ "$rc" -eq 0 ]; then reason=completed; else reason=crashed; fi; fi
event end "$reason:$rc"
echo "job $SLURM_JOB_ID ended: $reason ($rc)"
if [ "$reason" = timeout ] || [ "$reason" = preempted ]; then
    n=$(cat "$META/restarts" 2>/dev/null || echo 0)
    if [ ! -e "$META/cancel" ] && [ "$n" -lt "$MAX_RESTARTS" ]; then
        if next=$(sbatch --parsable "$META/job.sbatch"); then
            echo $((n + 1)) >"$META/restarts"
            event continue "${{next%%;*}}"
        fi
    fi
fi
"""


# local-dev as scripts/dev-slurm runs it, with host RAM declared large enough for the planner
# (the emulated nodes share this machine's RAM; nothing here is real).
PROFILE = """\
name: lc-test
extends: local-dev
node: {ram_gib: 512}
"""

CONFIG = """\
hpcrl:
  cluster: lc-test
  nodes: {nodes}
  run_name: {name}
  workdir: {workdir}
  python: {python}
  run_root: {root}
  partition: {partition}
  time: "{time}"
  max_restarts: {max_restarts}
  stack_check: "off"  # the fake checkout is no open-instruct install (tests/test_stack_e2e.py runs the check)
model_name_or_path: Qwen/Qwen2.5-0.5B
max_prompt_token_length: 256
response_length: 256
pack_length: 1024
num_unique_prompts_rollout: 2
num_samples_per_prompt_rollout: 2
"""
KINDS = ["script", "config"]


@pytest.fixture
def env(tmp_path):
    """A private registry, run root, cluster profile and fake open-instruct checkout."""
    oi = tmp_path / "oi" / "open_instruct"
    oi.mkdir(parents=True)
    (oi / "grpo_fast.py").write_text(FAKE_GRPO)
    (tmp_path / "clusters").mkdir()
    (tmp_path / "clusters" / "lc-test.yaml").write_text(PROFILE)
    e = {k: v for k, v in os.environ.items() if not k.startswith("HPCRL_")}
    e.update(
        HPCRL_REGISTRY=str(tmp_path / "runs.db"),
        HPCRL_CLUSTERS_DIR=str(tmp_path / "clusters"),
        NO_COLOR="1",
        COLUMNS="250",
    )
    return {"tmp": tmp_path, "env": e, "workdir": tmp_path / "oi", "root": tmp_path / "runs"}


def behave(
    env, *, sleep: float = 300, exit_code: int = 0, ignore_term: bool = False, setsid_child: bool = False
) -> None:
    """What the fake grpo_fast.py does when it finds no earlier marker."""
    (env["workdir"] / "fake_behaviour").write_text(
        f"sleep={sleep} exit_code={exit_code} ignore_term={int(ignore_term)} setsid_child={int(setsid_child)}\n"
    )


def script(
    env, name: str, *, partition: str = "debug", time_: str = "00:10:00", extra: str = "", max_restarts: int = 2
) -> Path:
    """A HAND-WRITTEN script implementing docs/run-dir.md."""
    path = env["tmp"] / f"{name}.sbatch"
    path.write_text(
        SCRIPT.format(
            name=name,
            partition=partition,
            time=time_,
            run_dir=env["root"] / name,
            max_restarts=max_restarts,
            workdir=env["workdir"],
            python=sys.executable,
            extra=extra,
        )
    )
    return path


def config(
    env,
    name: str,
    *,
    partition: str = "debug",
    time_: str = "00:10:00",
    max_restarts: int = 2,
    nodes: int = 1,
    hpcrl_extra: str = "",
) -> Path:
    """A run config for the renderer, on the test profile, driving the fake open-instruct."""
    if not _has_renderer():  # CI (HPCRL_REQUIRE_SLURM=1) must run these, never skip them
        (pytest.fail if os.environ.get("HPCRL_REQUIRE_SLURM") == "1" else pytest.skip)(
            "the renderer (hpcrl/rendering/render.py) is not in this tree"
        )
    path = env["tmp"] / f"{name}.yaml"
    text = CONFIG.format(
        name=name,
        workdir=env["workdir"],
        python=sys.executable,
        partition=partition,
        time=time_,
        max_restarts=max_restarts,
        root=env["root"],
        nodes=nodes,
    )
    path.write_text(text.replace("hpcrl:\n", "hpcrl:\n" + hpcrl_extra, 1))
    return path


def submit_args(env, kind: str, name: str, **kw) -> list[str]:
    """`hpcrl submit` arguments for a run of either kind."""
    if kind == "config":
        return ["--config", str(config(env, name, **kw))]
    return [str(script(env, name, **kw))]


def hpcrl(env, *args: str, timeout: float = 120, path: str | None = None) -> subprocess.CompletedProcess:
    e = dict(env["env"], **({"PATH": path} if path is not None else {}))
    return subprocess.run(
        [sys.executable, "-m", "hpcrl", *args], env=e, capture_output=True, text=True, timeout=timeout, cwd=env["tmp"]
    )


def rows(env, table: str) -> list[dict]:
    conn = sqlite3.connect(env["env"]["HPCRL_REGISTRY"])
    conn.row_factory = sqlite3.Row
    return [dict(r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY rowid")]


def wait_status(env, run_id: str, until, what: str, deadline_s: float = 300) -> dict:
    """`hpcrl status RUN --json` until `until(run)` holds. Each call costs a Python start and the status
    work (~0.25 CPU-s), so the polls back off from 0.5 s to 3 s: a test waiting a minute costs ~25 calls."""
    end, pause = time.monotonic() + deadline_s, 0.5
    while time.monotonic() < end:
        run = ok_json(hpcrl(env, "status", run_id, "--json"))["runs"][0]
        if until(run):
            return run
        time.sleep(pause)
        pause = min(3.0, pause * 1.5)
    pytest.fail(f"run {run_id}: gave up waiting for {what}; last status {run}")


def submit(env, kind: str, name: str, **kw) -> dict:
    return ok_json(hpcrl(env, "submit", "--json", *submit_args(env, kind, name, **kw)))


def _has_renderer() -> bool:
    try:
        import hpcrl.rendering.render  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------- a second user, the job's processes

# The second Unix user of the shared-node tests: tests/helpers.py's (re-exported for the modules that take it here).
from helpers import as_other, other_user  # noqa: E402, F401


def job_processes(pattern: str) -> list[tuple[int, str]]:
    """(pid, args) of every process whose command line contains pattern."""
    out = subprocess.run(["ps", "-eww", "-o", "pid=,args="], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        pid, _, args = line.strip().partition(" ")
        if pattern in args and "ps -eww" not in args:
            found.append((int(pid), args))
    return found


def driver_started(rd: RunDir, job: str):
    return lambda _run: rd.log(job).exists() and f"wrote marker-{job}" in rd.log(job).read_text()


def nothing_of_the_job_left(run_dir: Path, job: str, settle_s: float) -> list[str]:
    """Processes still carrying the run dir or this job's node-local paths once `settle_s` passed."""

    def others(args: str) -> bool:
        """A process of another job of the run (a continuation already running): its log or node dir names it."""
        ids = set(re.findall(r"-(\d+)\.log\b", args)) | set(re.findall(r"\bhpcrl-(\d+)\.", args))
        return bool(ids) and job not in ids

    def left() -> list[str]:
        procs = [a for _p, a in job_processes(str(run_dir)) if not others(a)]
        procs += [a for _p, a in job_processes(f"hpcrl-{job}.")]
        dirs = [str(p) for p in Path("/tmp/hpcrl-local").glob(f"*/hpcrl-{job}.*")]
        return procs + dirs

    end = time.monotonic() + settle_s
    while (found := left()) and time.monotonic() < end:
        time.sleep(0.5)
    return found
