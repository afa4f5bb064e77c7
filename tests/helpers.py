"""Helpers shared by several test modules (tests import these, never each other)."""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).with_name("golden")
COLLECTIVE = ROOT / "hpcrl" / "runtime" / "preflight_collective.py"
# A node of a scripts/dev-slurm cluster: nK (the machine's) or cKnN (private instance K), as a regex.
NODE = r"(?:c\dn|n)\d+"
TERMINAL_JOB_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
    }
)


def run_hpcrl(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """`python -m hpcrl ARGS` (the worktree's code when PYTHONPATH points at it)."""
    return subprocess.run([sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, timeout=timeout, **kw)


def shipped_hpcrl(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m hpcrl ARGS` from the repository root, with the shipped profiles only."""
    env = {k: v for k, v in os.environ.items() if k != "HPCRL_CLUSTERS_DIR"}
    return subprocess.run(
        [sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, timeout=180, cwd=cwd or ROOT, env=env
    )


def load_fit():
    """benchmarks/fit.py as a module: the fit/held-out split and the re-fit."""
    spec = importlib.util.spec_from_file_location("hpcrl_bench_fit", ROOT / "benchmarks" / "fit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ok_json(proc: subprocess.CompletedProcess):
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def assert_user_error(proc: subprocess.CompletedProcess, contains: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcrl: error: ") and contains in lines[0], proc.stderr
    return lines[0]


# --------------------------------------------------------------------------- rendered scripts


def assert_golden(name: str, text: str) -> None:
    """text is tests/golden/<name> byte for byte; HPCRL_UPDATE_GOLDEN=1 rewrites it first, never under CI."""
    path = GOLDEN / name
    if os.environ.get("HPCRL_UPDATE_GOLDEN") == "1":
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(
                "HPCRL_UPDATE_GOLDEN=1 under CI: goldens are rewritten by a person, then reviewed", pytrace=False
            )
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path.name} missing: regenerate with HPCRL_UPDATE_GOLDEN=1"
    want = path.read_text()
    if text != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True), f"golden/{name}", "rendered"))
        pytest.fail(
            f"{name} differs from the golden; review, then regenerate with HPCRL_UPDATE_GOLDEN=1\n{diff}", pytrace=False
        )


def lint(text: str, tmp_path: Path, shellcheck: str) -> None:
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    out = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([shellcheck, "-S", "warning", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


# What each profile asks Slurm for, written out from clusters/<name>.yaml by hand: the GPU
# request style (slurm.gpu_request) and count (gpu.count_per_node), slurm.exclusive, slurm.mem,
# the default partition's max_time, slurm.default_partition, the variant's slurm.constraint.
PROFILE_OPTIONS = {
    "isambard-ai": lambda n: ["--gpus-per-node=4", "--exclusive", "--mem=0", "--time=24:00:00", "--partition=workq"],
    "berzelius": lambda n: [
        f"--gpus={8 * n}",
        "--exclusive",
        "--time=3-00:00:00",
        "--partition=berzelius",
        "--constraint=thin",
    ],
    "berzelius:fat": lambda n: [
        f"--gpus={8 * n}",
        "--exclusive",
        "--time=3-00:00:00",
        "--partition=berzelius",
        "--constraint=fat",
    ],
    "berzelius-hopper": lambda n: [
        f"--gpus={8 * n}",
        "--exclusive",
        "--time=2-00:00:00",
        "--partition=berzelius-hopper",
    ],
    "local-dev": lambda n: ["--gpus-per-node=4", "--time=01:00:00", "--partition=debug"],
}


def expected_sbatch(cluster: str, run: str, nodes: int, output: str) -> list[str]:
    return (
        [f"--job-name=hpcrl-{run}", f"--nodes={nodes}", "--ntasks-per-node=1"]
        + PROFILE_OPTIONS[cluster](nodes)
        + [f"--output={output}", "--open-mode=append", "--no-requeue"]
    )


def sbatch_options(text: str) -> tuple[list[str], str]:
    """The #SBATCH options but --signal, and --signal's lead (the plan's step estimate: derived)."""
    opts = re.findall(r"^#SBATCH (\S+)$", text, re.M)
    signal = [o for o in opts if o.startswith("--signal=")]
    assert len(signal) == 1 and re.fullmatch(r"--signal=B:USR1@\d+", signal[0]), signal
    return [o for o in opts if not o.startswith("--signal=")], signal[0]


def driver_words(text: str) -> list[str]:
    """The words of the DRIVER=( ... ) array, parsed independently of the renderer; the checkpoint
    interval's variable expanded as the first job's shell does (the script's own CKPT_EVERY=N line)."""
    block = re.search(r"^ *DRIVER=\(\n(.*?)^ *\)$", text, re.S | re.M)
    assert block, "no DRIVER=( ... ) block"
    every = re.search(r"^CKPT_EVERY=(\d+)$", text, re.M)
    return [w.replace("$CKPT_EVERY", every.group(1)) if every else w for w in shlex.split(block.group(1))]


# --------------------------------------------------------------------------- the local Slurm


def _run(args: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)


def scontrol_job(job_id: str) -> dict[str, str]:
    """`scontrol show job -o` as key -> value; empty once Slurm forgot the job."""
    res = _run(["scontrol", "show", "job", "-o", str(job_id)])
    if res.returncode != 0:
        return {}
    # Values never contain '=' followed by a key, but may contain spaces (Reason, Command):
    # split at each ' Key=' boundary.
    fields: dict[str, str] = {}
    for match in re.finditer(r"(?:^|\s)([A-Za-z][\w/:.]*)=(.*?)(?=\s[A-Za-z][\w/:.]*=|$)", res.stdout.strip()):
        fields.setdefault(match.group(1), match.group(2))
    return fields


def job_nodes(job_id: str) -> list[str]:
    """The nodes a job ran on, in Slurm's order (its batch host first)."""
    nodelist = scontrol_job(job_id).get("NodeList", "")
    return _run(["scontrol", "show", "hostnames", nodelist]).stdout.split() if nodelist else []


def submit(script_path: str | Path, *sbatch_args: str) -> str:
    """sbatch a script (from its own directory) and return the job id; fail on rejection."""
    script = Path(script_path)
    res = _run(["sbatch", "--parsable", *sbatch_args, str(script)], timeout=60)
    if res.returncode != 0:
        pytest.fail(f"sbatch {' '.join(sbatch_args)} {script} failed: {res.stderr.strip()}", pytrace=False)
    return res.stdout.strip().split(";")[0]


def wait_for_state(job_id: str, states: set[str] | frozenset[str], timeout: float) -> dict[str, str]:
    """Poll scontrol until the job's state is one of `states`; return its fields."""
    deadline = time.monotonic() + timeout
    fields: dict[str, str] = {}
    while time.monotonic() < deadline:
        fields = scontrol_job(job_id)
        if fields.get("JobState") in states:
            return fields
        time.sleep(0.5)
    _run(["scancel", str(job_id)])
    pytest.fail(
        f"job {job_id} not in {sorted(states)} after {timeout:.0f} s "
        f"(state {fields.get('JobState')}, reason {fields.get('Reason')}); cancelled it",
        pytrace=False,
    )


def slurm_nodes() -> dict[str, str] | None:
    """Node name -> state as sinfo prints it (the cluster SLURM_CONF names); None when no controller answers."""
    if shutil.which("sinfo") is None:
        return None
    try:
        res = _run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=15)
    except subprocess.TimeoutExpired:
        return None
    if res.returncode != 0:
        return None
    nodes: dict[str, str] = {}
    for line in res.stdout.splitlines():
        name, _, state = line.strip().partition(" ")
        if name:
            nodes[name] = state.strip().lower()  # a node in two partitions prints twice
    return nodes


def wait_for_job(job_id: str, timeout: float = 600) -> dict:
    return wait_for_state(job_id, TERMINAL_JOB_STATES, timeout)


class SbatchResult(NamedTuple):
    job_id: str
    state: str
    output: str


def run_sbatch_and_wait(script_path: str | Path, timeout: float = 120, *sbatch_args: str) -> SbatchResult:
    """Submit, wait until the job ends (cancelling it past `timeout` s) and read its output.

    The output file is the job's StdOut as Slurm expanded it (`#SBATCH --output`, or
    slurm-<id>.out in the directory sbatch ran from); "" if the job wrote none.
    """
    job_id = submit(script_path, *sbatch_args)
    fields = wait_for_state(job_id, TERMINAL_JOB_STATES, timeout)
    out_path = Path(fields.get("StdOut") or f"slurm-{job_id}.out")
    # slurmstepd closes the file before the state turns terminal; allow for NFS-like lag.
    for _ in range(20):
        if out_path.exists():
            break
        time.sleep(0.1)
    output = out_path.read_text(errors="replace") if out_path.exists() else ""
    return SbatchResult(job_id, fields["JobState"], output)


# --------------------------------------------------------------------------- the rendered smoke job on local-dev


RUN_NAME = "smoke3"


def render(
    tmp_path: Path, *sets: str, config: str | None = None, nodes: int = 3, profile: str | None = None
) -> tuple[Path, Path]:
    """`hpcrl render --cluster local-dev --nodes 3 --smoke` (the default 32B config's layout, or
    `config`'s) into tmp_path, with a private run root and no virtualenv to activate; return
    (script, run dir). More nodes than local-dev's partitions name (4) are allowed over the limit."""
    script = tmp_path / "smoke3.sbatch"
    if profile is not None:  # local-dev with some settings changed (profile: the YAML below `extends: local-dev`)
        (tmp_path / "local-dev-changed.yaml").write_text("extends: local-dev\n" + profile)
    cluster = ["--cluster-file", str(tmp_path / "local-dev-changed.yaml")] if profile else ["--cluster", "local-dev"]
    args = [
        sys.executable,
        "-m",
        "hpcrl",
        "render",
        *cluster,
        "--nodes",
        str(nodes),
        "--smoke",
        *(["--allow-over-limit"] if nodes > 4 else []),
        *(["--config", config] if config else []),
        "--set",
        f"hpcrl.run_root={tmp_path / 'runs'}",
        "--set",
        f"hpcrl.run_name={RUN_NAME}",
        # 10 minutes unless the test gives its own: on a loaded machine Ray may take minutes to come up, and the
        # time-limit warning must not come first (the config's env_setup, a venv this machine lacks, is only
        # warned about)
        *(() if any(s.startswith("hpcrl.time=") for s in sets) else ("--set", 'hpcrl.time="00:10:00"')),
        *(a for s in sets for a in ("--set", s)),
        "-o",
        str(script),
    ]
    env = {k: v for k, v in os.environ.items() if k != "HPCRL_CLUSTERS_DIR"}
    out = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    run_dir = tmp_path / "runs" / RUN_NAME
    (run_dir / "logs").mkdir(parents=True)  # as hpcrl submit does: Slurm opens --output there
    return script, run_dir


def events(run_dir: Path) -> list[list[str]]:
    return [ln.split("\t") for ln in (run_dir / "hpcrl" / "jobs.tsv").read_text().splitlines()]


def fault_bin(tmp_path: Path, **programs: str) -> Path:
    """A directory of executable stand-ins (name -> script text), to put first on the job's PATH."""
    fault = tmp_path / "faultbin"
    fault.mkdir()
    for name, text in programs.items():
        (fault / name).write_text(text)
        (fault / name).chmod(0o755)
    return fault


# --------------------------------------------------------------------------- the preflight collective


SECRET = "0123456789abcdef" * 4


def free_port(addr: str = "127.0.0.11") -> int:
    """A port nobody listens on at `addr` now, chosen by the kernel: tests running side by side (xdist
    workers, whose process ids are often consecutive) never share one, as ports derived from the pid did."""
    with socket.socket() as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def start_collective(r: int, n: int, port: int, timeout: float, secret: str = SECRET) -> subprocess.Popen:
    """The collective script itself as pretend node r of n at 127.0.0.1(r+1) (no Slurm needed)."""
    args = {
        "node": f"n{r + 1}",
        "node_rank": r,
        "nnodes": n,
        "nodes": [f"n{k + 1}" for k in range(n)],
        "master_addr": "127.0.0.11",
        "my_addr": f"127.0.0.1{r + 1}",
        "port": port,
        "timeout_s": timeout,
        "iters": 1,
        "sizes": {"tcp": [1 << 16, 1 << 20]},
    }
    env = dict(os.environ, HPCRL_COLLECTIVE_SECRET=secret)
    return subprocess.Popen(
        [sys.executable, str(COLLECTIVE), json.dumps(args)], stdout=subprocess.PIPE, text=True, env=env
    )


def collective_result(proc: subprocess.Popen) -> dict:
    out = proc.communicate(timeout=120)[0]
    return json.loads(re.search(r"^HPCRL-COLLECTIVE (.*)$", out, re.M).group(1))


# --------------------------------------------------------------------------- another user, the job's bash


OTHER_USER = "hpcrl-other"  # the second Unix user the shared-node tests make (tests/test_hardening.py's too)


def other_user() -> str:
    """A second, unprivileged Unix user (created here when running as root, as CI does)."""
    import pwd
    import shutil

    try:
        pwd.getpwnam(OTHER_USER)
        return OTHER_USER
    except KeyError:
        pass
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs a second Unix user: run as root (CI does) or create user hpcrl-other")
    made = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        try:  # another test process (pytest-xdist) made it first
            pwd.getpwnam(OTHER_USER)
        except KeyError:
            raise AssertionError(f"useradd {OTHER_USER} failed: {made.stderr.strip()}") from None
    return OTHER_USER


def as_other(*cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """cmd run as the other user (its own group only), from /."""
    import pwd

    user = other_user()
    return subprocess.run(
        list(cmd),
        user=user,
        group=pwd.getpwnam(user).pw_gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
    )


def rendered_script(**kw) -> str:
    """The job script of the shipped 7B example on local-dev's 3 nodes (kw: make_run_plan's)."""
    from hpcrl.planning.describe import describe_job
    from hpcrl.planning.run_plan import make_run_plan
    from hpcrl.rendering.render import render_script

    return render_script(describe_job(make_run_plan("grpo-olmo3-7b", nodes=3, cluster="local-dev", **kw)))


def bash_functions(script: str, *names: str) -> str:
    """The definitions of the named shell functions in a rendered script, to run them in bash alone."""
    out = []
    for name in names:
        found = re.search(rf"^{name}\(\) \{{\n.*?^\}}\n", script, re.S | re.M)
        assert found, f"no {name}() in the script"
        out.append(found.group(0))
    return "".join(out)
