"""`hpcrl check-stack`: the job's own stack check (hpcrl/runtime/stack.py), on the login node, before a
user queues.

The run is planned as `render` plans it (same config and flags); the expectation and the driver's
arguments are the ones the script would carry. The check runs in a Python environment the user names
(`--python PATH`, taken as is), or in the run's hpcrl.python after the profile's setup lines, its
modules and the run's hpcrl.env_setup, in the run's workdir, as the job runs it. Running those lines is
a side effect on this machine, so it lives here in jobs/ and the CLI only prints.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hpcrl.errors import HpcrlError
from hpcrl.planning.request import RunRequest
from hpcrl.runtime import stack
from hpcrl.shell import shq, shq_path

# Where the driver's run directory is said to be: the dry parse reads the arguments, writes nothing.
RUN_DIR_STAND_IN = "/tmp/hpcrl-check-stack/run"
# Beyond the probe and the framework's own parse (its expectation's timeout), what the whole check may take.
SLACK_S = 60.0


@dataclass(frozen=True)
class StackResult:
    """What the check said: its exit code (the job's meaning), its lines, and what it ran."""

    exit_code: int  # 0 ok or warnings, STACK_MISMATCH_EXIT, STACK_UNCHECKED_EXIT
    lines: tuple[str, ...]
    python: str
    env_setup: tuple[str, ...]
    target: str

    def to_dict(self) -> dict:
        return {
            "exit_code": self.exit_code,
            "mismatch": self.exit_code == stack.STACK_MISMATCH_EXIT,
            "unchecked": self.exit_code == stack.STACK_UNCHECKED_EXIT,
            "lines": list(self.lines),
            "python": self.python,
            "env_setup": list(self.env_setup),
            "target": self.target,
        }


def check_stack(
    req: RunRequest, python: str | None = None, probe_timeout: float = stack.PROBE_TIMEOUT_S
) -> StackResult:
    """Run the job's stack check for the run `req` describes; python: the training Python to check (None:
    the run's hpcrl.python after its setup lines)."""
    from hpcrl.jobs.run_script import _planned
    from hpcrl.planning.backends import stack_expect
    from hpcrl.contract import RAY_TOKEN_MIN

    if probe_timeout <= 0:
        raise HpcrlError(f"--probe-timeout {probe_timeout:g}: give a positive number of seconds")
    if python is not None:
        found = Path(python).expanduser() if "/" in python else Path(shutil.which(python) or python)
        if not found.exists():
            raise HpcrlError(
                f"--python {python}: no such file; give the training environment's python (e.g. ENV/bin/python)"
            )
        python = str(found)
    rp = _planned(req)
    cfg, backend, profile = rp.config, rp.backend, rp.profile
    expect = stack_expect.run_expectation(cfg, profile.node.arch, RAY_TOKEN_MIN if backend.uses_ray else None)
    if expect is None:
        raise HpcrlError(
            f"check-stack: hpcrl knows nothing of what a {cfg.hpcrl.backend} run's environment must "
            "hold (no install facts: a user's own script); nothing to check"
        )
    argv = stack_expect.driver_argv(backend.driver_command(rp), RUN_DIR_STAND_IN)
    hp = cfg.hpcrl
    if python is not None:
        setup: list[str] = []
        words = shq(python)
    else:
        setup = [*profile.setup, *(f"module load {m} 2>/dev/null || true" for m in profile.modules), *hp.env_setup]
        words = shq_path(hp.python)
    entry = hp.entry_point or backend.default_entry_point
    check = [
        sys.executable,
        str(Path(stack.__file__)),
        "--expect",
        json.dumps(expect),
        "--entry",
        entry,
        "--probe-timeout",
        f"{probe_timeout:g}",
    ]
    lines = [
        *setup,
        f"cd {shq_path(hp.workdir)} 2>/dev/null || true" if hp.workdir else ":",
        f"exec {' '.join(map(shq, check))} --python {words} -- {' '.join(map(shq, argv))}",
    ]
    budget = probe_timeout + max((t.get("parser") or {}).get("timeout_s", 120) for t in expect["tables"]) + SLACK_S
    try:
        proc = subprocess.run(
            ["bash", "-c", "\n".join(lines)], capture_output=True, text=True, timeout=budget, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return StackResult(
            stack.STACK_UNCHECKED_EXIT,
            (f"stack: unchecked: the check did not finish within {budget:.0f} s",),
            python or hp.python,
            tuple(setup),
            expect["version"],
        )
    said = tuple(ln for ln in proc.stdout.splitlines() if ln.startswith("stack:"))
    if proc.returncode not in (0, stack.STACK_MISMATCH_EXIT, stack.STACK_UNCHECKED_EXIT) or not said:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
        said = (*said, f"stack: unchecked: the check itself failed (exit {proc.returncode}): {tail}")
        code = stack.STACK_UNCHECKED_EXIT
    else:
        code = proc.returncode
    return StackResult(code, said, python or hp.python, tuple(setup), f"{hp.backend} {expect['version']}")


__all__ = ["StackResult", "check_stack"]
