"""The functions a `bash -c` in another step needs are found by the script itself (functions_of), not
kept by hand: the worker step's, the sweep step's and the leftover sweep's sets hold every function
the lists that shipped before held, and nothing they call is missing in a shell that has only them."""

from __future__ import annotations

import re
import subprocess

import pytest

from hpcrl.planning.describe import describe_job
from hpcrl.planning.run_plan import make_run_plan
from hpcrl.rendering.render import render_script

# The hand-kept lists of the script before functions_of (templates at 3b45d20): what each step used.
WORKER = {
    "node_entry",
    "node_ports",
    "node_dirs",
    "private_dir",
    "ray_version_problem",
    "kill_session",
    "kill_tagged",
    "remove_node_dirs",
    "lean_env",
    "keep_ray_logs",
    "job_ended",
    "sweep_left",
    "sweep_left_start",
    "blame",
    "ray_start",
    "ray_retry",
    "hpcrl_worker_cleanup",
    "hpcrl_worker",
}
SWEEP_NODE = {"sweep_node", "sweep_left", "job_ended", "keep_ray_logs"}
SWEEP_LEFT = {"job_ended", "keep_ray_logs", "sweep_left"}


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    rp = make_run_plan("grpo-olmo3-7b", nodes=3, cluster="local-dev", sets=["hpcrl.code_server=on"])
    path = tmp_path_factory.mktemp("worker") / "job.sbatch"
    text = render_script(describe_job(rp))
    assert text.rstrip().endswith('main "$@"')
    path.write_text(text.rstrip()[: -len('main "$@"')])  # the definitions, not the run
    return path


def _shipped(script, name: str) -> str:
    out = subprocess.run(
        ["bash", "-c", 'source "$1" && functions_of "$2"', "bash", str(script), name],
        capture_output=True,
        text=True,
        env={"SLURM_JOB_ID": "1", "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _names(definitions: str) -> set[str]:
    return set(re.findall(r"^([A-Za-z_][A-Za-z0-9_]*) \(\) $", definitions, re.M))


@pytest.mark.parametrize(
    "entry,before", [("hpcrl_worker", WORKER), ("sweep_node", SWEEP_NODE), ("sweep_left", SWEEP_LEFT)]
)
def test_a_step_gets_every_function_it_used_to(script, entry, before):
    assert before <= _names(_shipped(script, entry))


def test_the_worker_step_gets_the_services_functions(script):
    assert {"start_code_server", "wait_code_server"} <= _names(_shipped(script, "hpcrl_worker"))


def test_nothing_the_shipped_functions_call_is_missing(script):
    """In a shell with only the shipped definitions, every function name their bodies use is defined."""
    all_fns = subprocess.run(
        ["bash", "-c", 'source "$1" && compgen -A function', "bash", str(script)],
        capture_output=True,
        text=True,
        env={"SLURM_JOB_ID": "1", "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
        timeout=60,
    ).stdout.split()
    shipped = _shipped(script, "hpcrl_worker")
    defined = _names(shipped)
    used = {f for f in all_fns if re.search(rf"(^|[^A-Za-z0-9_]){re.escape(f)}([^A-Za-z0-9_]|$)", shipped, re.M)}
    assert used <= defined
