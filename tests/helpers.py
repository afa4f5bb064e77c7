"""Helpers shared by several test modules (tests import these, never each other)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_hpcrl(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """`python -m hpcrl ARGS` (the worktree's code when PYTHONPATH points at it)."""
    return subprocess.run([sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True,
                          timeout=timeout, **kw)


def load_fit():
    """benchmarks/fit.py as a module: the fit/held-out split and the re-fit."""
    spec = importlib.util.spec_from_file_location("hpcrl_bench_fit", ROOT / "benchmarks" / "fit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_user_error(proc: subprocess.CompletedProcess, contains: str) -> str:
    """Exit 2, one line on stderr naming `contains`, no traceback; returns that line."""
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert contains in err, err
    return err
