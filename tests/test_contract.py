"""The job contract (hpcrl/contract.py) exists once: no second copy of the exit-code table in the
templates or the Python that reads a run, and the bash the templates get from it behaves as the table."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from helpers import bash_functions, rendered_script
from hpcrl import contract
from hpcrl.planning.run_plan import make_run_plan
from hpcrl.planning.describe import describe_job
from hpcrl.rendering.render import render_script

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = sorted((ROOT / "templates").glob("*.j2"))
PYTHON = sorted(p for p in (ROOT / "hpcrl").rglob("*.py") if p.name != "contract.py")
# The modules that start, stop or read a job's end (the code scan: elsewhere 90-97 are percentages).
ENDS = [p for p in PYTHON if p.parent.name in ("runtime", "jobs", "cli") or p.name.startswith("report")]
# The codes as docs/safety.md's exit-code table lists them, read by hand (an independent source).
SAFETY_DOC_CODES = {90, 91, 92, 93, 94, 95, 96, 97}


def _code_ints(path: Path) -> list[tuple[int, int]]:
    """(line, value) of every int literal in the driver's exit-code range, docstrings aside."""
    return [
        (n.lineno, n.value)
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Constant) and type(n.value) is int and n.value in SAFETY_DOC_CODES
    ]


def _reason_strings(path: Path) -> list[str]:
    reasons = {reason for _, reason in contract.BREAKERS.values()}
    return [
        n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant) and n.value in reasons
    ]


def test_the_codes_are_the_ones_docs_safety_md_lists():
    assert {code for code, _ in contract.BREAKERS.values()} | set(contract.RAY_DIED.values()) == SAFETY_DOC_CODES


@pytest.mark.parametrize("path", PYTHON, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_python_module_but_the_contract_holds_an_exit_code_or_breaker_reason(path):
    codes = _code_ints(path) if path in ENDS else []
    assert not codes and not _reason_strings(path), f"{path.relative_to(ROOT)}: use hpcrl.contract"


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_no_template_holds_an_exit_code_or_breaker_reason(path):
    text = path.read_text()
    assert not re.search(r"(?<![\w.$+-])9[0-7](?![\w.])", text), f"{path.name} spells out an exit code"
    assert "breaker-" not in text


def test_the_scan_sees_a_planted_copy(tmp_path):
    """The two checks above can fail: a copy of one row, in either language, is found."""
    planted = tmp_path / "m.py"
    planted.write_text('"""90 in a docstring is prose."""\nCODES = {"nan_loss": 91}\nR = "breaker-hang"\n')
    assert _code_ints(planted) == [(2, 91)] and _reason_strings(planted) == ["breaker-hang"]


def test_the_rendered_reason_case_answers_as_the_table(tmp_path):
    fn = bash_functions(rendered_script(), "reason_of")
    codes = list(range(256))
    out = subprocess.run(
        ["bash", "-c", fn + 'for c in "$@"; do reason_of "$c"; done', "-", *map(str, codes)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert dict(zip(codes, out)) == {c: contract.END_REASONS.get(c, contract.CRASHED) for c in codes}


def test_the_rendered_continue_case_continues_the_reasons_the_table_names(tmp_path):
    """Each reason through continue_chain's case: which kind and counter file it picks, or none."""
    fn = bash_functions(rendered_script(), "continue_chain")
    case = re.search(r"^    case \$reason in\n.*?^    esac\n", fn, re.S | re.M).group(0)
    probe = (
        'probe() { local reason=$1 kind="" counter=""\n'
        + case
        + '    echo "$kind ${counter##*/}"; }\nfor r in "$@"; do echo "$(probe "$r")"; done'
    )
    reasons = [
        *contract.LIMIT_REASONS,
        *contract.FAILURE_REASONS,
        "completed",
        "crashed",
        "cancelled",
        "breaker-hang",
        "setup-failed",
        "service-failed",
        "node-local-unsafe",
    ]
    out = subprocess.run(
        ["bash", "-c", "HPCRL_DIR=/x MAX_RESTARTS=1 MAX_FAILURE_RESTARTS=1\n" + probe, "-", *reasons],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    got = {r: line.strip() for r, line in zip(reasons, out)}
    want = {r: "" for r in reasons}
    want.update({r: "limit restarts" for r in ("timeout", "preempted")})
    want.update(
        {
            r: "failure failure-restarts"
            for r in ("ray-start-failed", "start-failed", "ray-head-died", "worker-died", "network-error")
        }
    )
    assert got == want


def test_the_port_block_of_a_job(tmp_path):
    """Job 4242's block starts at 10000 + 42 * 100 (docs/render.md: 100 ports per job, 200 blocks)."""
    assert contract.port_base(4242) == 14200
    out = subprocess.run(
        ["bash", "-c", f"SLURM_JOB_ID=4242; echo {contract.port_base_shell()}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "14200"


@pytest.mark.parametrize(
    "style,option", [("gpus-per-node", "--gpus-per-node=4"), ("gpus", "--gpus=12"), ("gres", "--gres=gpu:4")]
)
def test_gpu_request_per_style(style, option):
    """4 GPUs on each of 3 nodes, in each of Slurm's spellings (sbatch(1))."""
    assert contract.gpu_request_option(style, 4, 3) == option


def test_gpu_request_styles_are_the_profiles():
    from typing import get_args

    from hpcrl.profiles import Slurm

    assert set(get_args(Slurm.model_fields["gpu_request"].annotation)) == set(contract.GPU_REQUEST_STYLES)


def test_a_stack_mismatch_is_the_stack_check_s_exit_code_and_never_continues():
    from hpcrl.runtime import stack  # stdlib only, no hpcrl import: it cannot read the contract itself

    continued = [
        kind for kind, (reasons, _, _) in contract.CONTINUATIONS.items() if contract.STACK_MISMATCH[0] in reasons
    ]
    assert (contract.STACK_MISMATCH[1], continued) == (stack.STACK_MISMATCH_EXIT, [])


@pytest.mark.parametrize("code,ends", [(98, "FINISH stack-mismatch 98"), (1, None), (0, None)])
def test_the_job_ends_on_a_stack_mismatch_only_and_goes_on_when_the_check_cannot_run(code, ends):
    """The rendered stack_check with its check answering `code`: 98 ends the job as the contract says;
    any other failure of the check itself is a warning and the job goes on."""
    rp = make_run_plan("verl-grpo-qwen2.5-7b", nodes=4, cluster="isambard-ai")
    fn = bash_functions(render_script(describe_job(rp)), "stack_check")
    stubs = (
        'log() { echo "$*"; }\nfinish() { echo "FINISH $*"; exit "$2"; }\n'
        "driver_command() { DRIVER_ARGS=(a=1); }\n"
        f'python3() {{ echo "stack: answer"; return {code}; }}\nWORKDIR=/ PYTHON=python3 ENTRY_POINT=m STACK_EXPECT={{}}\n'
    )
    out = subprocess.run(["bash", "-c", stubs + fn + "stack_check; echo WENT-ON"], capture_output=True, text=True)
    finished = [ln for ln in out.stdout.splitlines() if ln.startswith("FINISH")]
    assert (finished[:1] or [None])[0] == ends and ("WENT-ON" in out.stdout) == (ends is None), out.stdout


def test_the_stack_check_runs_before_the_first_ray_start():
    script = render_script(describe_job(make_run_plan("verl-grpo-qwen2.5-7b", nodes=4, cluster="isambard-ai")))
    main = bash_functions(script, "main")
    first = bash_functions(script, "phase_stack_check")
    assert (
        main.index("phase_stack_check") < main.index("phase_head"),
        "    stack_check\n" in first,
        "ray_start" in first,
    ) == (True, True, False)


# squeue(1)'s JOB STATE CODES, read by hand from Slurm's man page (an independent source): the states
# a job does not leave, and those it may still leave (pending, running, held or requeued).
SQUEUE_ENDED = (
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "REVOKED",
    "SPECIAL_EXIT",
    "TIMEOUT",
)
SQUEUE_LIVE = (
    "CONFIGURING",
    "COMPLETING",
    "PENDING",
    "RESV_DEL_HOLD",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "REQUEUED",
    "RESIZING",
    "RUNNING",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
    "SUSPENDED",
)


def test_the_rendered_job_ended_knows_every_slurm_end_state(tmp_path):
    """The sweep's job_ended (templates/leftovers.sh.j2) answers from the contract's end states;
    squeue is a stub printing the state (no Slurm job can be put in each state here)."""
    fn = bash_functions(rendered_script(), "job_ended")
    (tmp_path / "squeue").write_text('#!/bin/bash\necho "$FAKE_STATE"\n')
    (tmp_path / "squeue").chmod(0o755)
    answers = {}
    for state in SQUEUE_ENDED + SQUEUE_LIVE:
        out = subprocess.run(
            ["bash", "-c", fn + 'job_ended 7 || echo "still may run"'],
            capture_output=True,
            text=True,
            env={"PATH": f"{tmp_path}:/usr/bin:/bin", "FAKE_STATE": state},
        )
        answers[state] = out.stdout.strip()
    assert answers == {**{s: s for s in SQUEUE_ENDED}, **{s: "still may run" for s in SQUEUE_LIVE}}


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_no_template_lists_slurm_end_states(path):
    """Prose may name one state; a line naming three is a copy of the contract's list."""
    lists = [
        line
        for line in path.read_text().splitlines()
        if len(set(re.findall(r"\b[A-Z_]+\b", line)) & set(SQUEUE_ENDED)) >= 3
    ]
    assert lists == [], path.name
