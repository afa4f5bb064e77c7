"""The smoke test's actor-environment check against a real local Ray (no Slurm needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# The driver's environment grows past what Ray's agent accepts (1 MiB: HTTP 413) after Ray is up,
# so the actor's runtime env fails at once; the check must say so, not wait out its timeout.
SCRIPT = r"""
import argparse, os
import ray
from hpcrl.runtime import smoke
# address="local": a new Ray of its own, never one a concurrent test (or a job) runs on this machine, which
# ray.init() with no address finds among the running processes and joins.
ray.init(address="local", num_cpus=2, include_dashboard=False)
os.environ["HPCRL_TEST_BIG"] = "x" * (2 << 20)
try:
    smoke.check_actor_env(ray, argparse.Namespace(actor_env=True, timeout=300))
    print("no failure")
except smoke.SmokeFailure as exc:
    print(exc)
finally:
    ray.shutdown()
"""


@pytest.mark.ray
def test_an_actor_that_fails_at_once_is_reported_with_its_failure():
    pytest.importorskip("ray")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=240)
    line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:]
    assert "failed to start: RuntimeEnvSetupError" in line and "413" in line, line
