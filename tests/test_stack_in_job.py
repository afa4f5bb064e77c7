"""The job's stack_check as the rendered script runs it (issue 38 item 4): a training Python that cannot be probed
is recorded as a `stack` event and the job goes on; a Python under a path with a space is probed as one word; the
event reaches `report` and the chain `status` reads.

The function is cut from a script rendered for verl 0.9.1 and run by bash with the script's own helpers stood in
(log, record to a file, finish, driver_command); the check itself is the real hpcrl.runtime.stack. The stand-in
environment holds verl 0.9.1's install as metadata only (each package an empty folder that raises if imported).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from hpcrl.jobs.run_dir import RunDir, read_chain
from hpcrl.logs import report as rp

ROOT = Path(__file__).resolve().parents[1]
CHAIN = Path(__file__).parent / "data" / "runs" / "chain"
DISTS = {
    "verl": ("0.9.1", "verl"),
    "TransferQueue": ("0.1.10", "transfer_queue"),
    "ray": ("2.55.0", "ray"),
    "vllm": ("0.24.0", "vllm"),
    "torch": ("2.11.0", "torch"),
    "transformers": ("5.9.0", "transformers"),
}


def rendered(tmp_path: Path) -> str:
    out = tmp_path / "job.sbatch"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcrl",
            "render",
            "--config",
            "verl-grpo-qwen2.5-7b",
            "--set",
            "hpcrl.framework_version=0.9.1",
            "-o",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    return out.read_text()


def environment(tmp_path: Path, folder: str, sleep: int = 0) -> Path:
    site = tmp_path / "site"
    for name, (version, module) in DISTS.items():
        (site / f"{name}-{version}.dist-info").mkdir(parents=True)
        (site / f"{name}-{version}.dist-info" / "METADATA").write_text(f"Name: {name}\nVersion: {version}\n")
        (site / module).mkdir(exist_ok=True)
        (site / module / "__init__.py").write_text("raise ImportError('not to be imported')\n")
    python = tmp_path / folder / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nsleep {sleep}\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return python


def run_stack_check(script: str, tmp_path: Path, python: Path, probe_timeout: str = "60") -> tuple[str, str]:
    """(what the function printed, the events it recorded), with the script's helpers stood in."""
    expect = next(ln for ln in script.splitlines() if ln.startswith("STACK_EXPECT="))
    function = re.search(r"^stack_check\(\) \{\n.*?^\}\n", script, re.S | re.M).group(0)
    events = tmp_path / "events.tsv"
    harness = "\n".join(
        [
            "log() { printf 'hpcrl: %s\\n' \"$*\"; }",
            f'record() {{ printf \'%s\\t%s\\n\' "$1" "$2" >>{events}; }}',
            'finish() { echo "FINISH $1 $2"; exit 0; }',
            "driver_command() { DRIVER_ARGS=(trainer.nnodes=1); }",
            f"WORKDIR={tmp_path}",
            f"PYTHON='{python}'",
            "ENTRY_POINT=verl.trainer.main_ppo",
            expect,
            function,
            "stack_check",
            "echo AFTER",
        ]
    )
    out = subprocess.run(
        ["bash", "-c", harness],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT), HPCRL_STACK_PROBE_TIMEOUT=probe_timeout),
    )
    return out.stdout, events.read_text() if events.exists() else ""


def test_a_python_that_does_not_answer_is_recorded_unchecked_and_the_job_goes_on(tmp_path):
    python = environment(tmp_path, "cold fs", sleep=5)
    printed, events = run_stack_check(rendered(tmp_path), tmp_path, python, probe_timeout="1")
    assert (events, "FINISH" in printed, printed.rstrip().endswith("AFTER")) == (
        f"stack\tunchecked: the training Python {python} could not be probed (no answer within 1 s); the check "
        "could not run, the job goes on without it\n",
        False,
        True,
    )


def test_a_python_under_a_path_with_a_space_is_one_word_and_passes(tmp_path):
    printed, events = run_stack_check(rendered(tmp_path), tmp_path, environment(tmp_path, "my env"))
    assert ("hpcrl: stack: ok: " in printed, events, "FINISH" in printed) == (True, "", False), printed


def test_the_stack_event_reaches_report_and_the_chain(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(CHAIN, run)
    with open(run / "hpcrl" / "jobs.tsv", "a") as fh:  # after the fixture's torn last line
        fh.write(
            "\n102\tstack\t2026-03-02T11:05:40Z\tunchecked: the training Python /x/python could not be probed "
            "(no answer within 60 s); the check could not run, the job goes on without it\n"
        )
    jobs = {j["job_id"]: j["stack_check"] for j in rp.build_report(run)["jobs"]}
    chain = read_chain(RunDir(run))
    assert (
        jobs["101"],
        jobs["102"].startswith("unchecked: the training Python /x/python"),
        chain["102"].stack == jobs["102"],
        chain["101"].stack,
    ) == (None, True, True, None)


def test_preflight_runs_the_check_with_a_python_under_a_path_with_a_space(tmp_path):
    """`hpcrl preflight --config` ships stack.py to the node and runs it with the training Python."""
    from hpcrl.planning.backends import stack_expect
    from hpcrl.runtime import preflight_probe, stack, stack_parse

    python = environment(tmp_path, "my env")
    spec = {
        "stack_files": {Path(m.__file__).name: Path(m.__file__).read_text() for m in (stack, stack_parse)},
        "stack_expect": stack_expect.expectation("verl", "0.9.1", ray_min="2.52"),
        "stack_argv": [],
        "python": str(python),
        "env_setup": [],
        "workdir": str(tmp_path),
    }
    got = preflight_probe.stack_check(spec, 60)
    assert (got["rc"], got["lines"][0].startswith("stack: ok: ")) == (0, True), got
