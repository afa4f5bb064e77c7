"""A framework's log format is its backend's (LogFormat, hpcrl/planning/backends/log_facts.py; issue 34).

Each backend's format reads a step of its framework (lines from tests/data, shaped after the frameworks' own output:
tests/data/logs/README.md), and without it nothing of that step is read; the union, read where a log's framework is not
known and by the in-job watchdog (its copy generated from the registry), still reads every one of them; and no module
that reads logs or runs in the job holds a framework's metric key or step line of its own, so the knowledge cannot drift
back. Expected values are read off the fixture's text with the test's own regexes.
"""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

import pytest

from hpcrl.logs.driver_log import Step, StepFormat, parse_steps
from hpcrl.logs.log_format import (
    KNOWN_FORMATS,
    backend_format,
    backends_union,
    known_formats_text,
    plan_format,
    run_format,
    union_format,
)
from hpcrl.logs.metric_keys import ROLES
from hpcrl.planning.backends import backend_names, get_backend
from hpcrl.planning.backends.log_facts import LogFormat
from hpcrl.runtime.watchdog import known_format

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


def _panel(lines: list[str]) -> list[str]:
    """The first Rich panel of metrics."""
    start = next(i for i, line in enumerate(lines) if "╭" in line)
    return lines[start : next(i for i in range(start, len(lines)) if "╰" in lines[i]) + 1]


def _first(marker: str):
    return lambda lines: [next(line for line in lines if marker in line)]


# backend -> (fixture, the lines of its first step, regex of that step's number, regex of its reward as printed, the
# reward key). A line without a step number of its own is the log's first step.
CASES = {
    "open-instruct": ("logs/grpo_fast_healthy.log", _panel, r"training_step: (\d+)", r"scores: (\S+)", "scores"),
    "verl": (
        "logs/verl_grad_norm_zero.log",
        _first("step:"),
        r"step:(\d+) ",
        r"critic/score/mean:(\S+)",
        "critic/score/mean",
    ),
    "openrlhf": (
        "logs/openrlhf_zero_variance.log",
        _first("Global step"),
        r"Global step (\d+):",
        r"'reward': ([^,]+)",
        "reward",
    ),
    "trl": ("trl/console_zero_reward.log", _first("{'loss'"), None, r"'reward': '([^']*)'", "reward"),
}


def _step_lines(backend: str) -> tuple[list[str], int, str]:
    """The lines of the fixture's first step, its number and its reward as printed (read off the text)."""
    path, pick, number, reward, _ = CASES[backend]
    with open(DATA / path, newline="") as f:  # a TRL log's carriage returns as the file has them
        lines = pick(f.read().split("\n"))
    text = "\n".join(lines)
    found = re.search(number, text) if number else None
    return lines, int(found.group(1)) if found else 1, re.search(reward, text).group(1)  # type: ignore[union-attr]


def test_every_backend_with_a_format_has_a_case_here():
    assert {n for n in backend_names() if get_backend(n).log_format is not None} == set(CASES)


@pytest.mark.parametrize("backend", list(CASES))
def test_a_backends_format_reads_its_frameworks_step(backend):
    lines, number, reward = _step_lines(backend)
    step = parse_steps(lines, run_format(backend))[0]
    key = CASES[backend][4]
    assert (step.number, step.reward_key, step.text[key]) == (number, key, reward)


@pytest.mark.parametrize("backend", list(CASES))
def test_without_the_backends_format_its_step_is_not_read(backend):
    """The reading is the backend's knowledge, not the reader's: an empty format reads none of it."""
    lines, _, _ = _step_lines(backend)
    assert parse_steps(lines, StepFormat()) == []


def _reading(step: Step) -> tuple:
    """What the breakers read of a step: its number, reward, loss, gradient norm and reward variance."""
    return step.number, step.reward_key, step.loss_key, step.grad_norm(), step.zero_variance(), step.values


@pytest.mark.parametrize("backend", list(CASES))
@pytest.mark.parametrize("reader", ["union", "watchdog"])
def test_the_union_reads_every_frameworks_step_as_its_backend_does(backend, reader):
    lines, _, _ = _step_lines(backend)
    own = [_reading(s) for s in parse_steps(lines, run_format(backend))]
    fmt = union_format() if reader == "union" else known_format()
    assert [_reading(s) for s in parse_steps(lines, fmt)] == own and own[0][1:4].count(None) < 3


def test_a_log_of_no_known_framework_is_read_with_the_union():
    union = union_format()
    # A user's script (custom: no format of its own), a plan.json that names no backend, a backend hpcrl lacks.
    assert run_format("custom") == union and plan_format({}) == union and plan_format(None) == union
    assert run_format("no-such-framework") == union
    assert plan_format({"backend": "verl"}) == backend_format("verl") != union


def test_the_watchdogs_copy_of_the_union_is_the_registrys():
    assert KNOWN_FORMATS.read_text() == known_formats_text(), (
        "a backend's LogFormat changed: regenerate hpcrl/runtime/known_log_formats.json with\n  python -c "
        "'from hpcrl.logs.log_format import write_known_formats; write_known_formats()'"
    )
    assert known_format() == union_format() and StepFormat.from_json(backends_union().to_json()) == backends_union()


def test_the_readers_format_is_the_backends_field_for_field():
    assert [f.name for f in fields(LogFormat)] == [f.name for f in fields(StepFormat) if f.name != "stats_tables"]


# --------------------------------------------------------------------------- no framework literal in logs/ or runtime/

NO_LITERALS = ("hpcrl/logs", "hpcrl/runtime")


def framework_literals() -> tuple[set[str], set[str]]:
    """(metric keys a backend names, text of its step lines and panel titles). Role names (hpcrl's own words for a
    metric: "reward", "loss", ...) are not a framework's, though a framework may log one as a key."""
    keys: set[str] = set()
    marks: set[str] = set()
    for name in backend_names():
        b = get_backend(name)
        fmt, m = b.log_format or LogFormat(), b.metric_facts
        keys.update(
            *(
                getattr(fmt, f.name)
                for f in fields(fmt)
                if f.name not in ("step_lines", "panel_titles", "advantage_ranges")
            )
        )
        keys.update(k for pair in fmt.advantage_ranges for k in pair)
        keys.update(*(getattr(m, f.name) for f in fields(m)))
        keys.update({b.diagnose_facts.stop_rate} - {""})
        marks.update(fmt.panel_titles)
        for pattern in fmt.step_lines:  # the literal text of a regex: "Global step", "step:"
            marks.update(
                t.strip()
                for t in re.findall(r"[A-Za-z][A-Za-z :]*", re.sub(r"\\.", "", pattern))
                if len(t.strip()) >= 5
            )
    return keys - set(ROLES), marks


def literal_findings(path: Path, keys: set[str], marks: set[str]) -> list[str]:
    """`file:line: literal` for each string in `path`'s code (docstrings and `__all__`'s names aside) that is a key or
    holds a mark."""
    tree = ast.parse(path.read_text())
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    docs |= {
        id(c)
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
        for c in ast.walk(n.value)
    }
    return [
        f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{n.lineno}: {n.value!r}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and id(n) not in docs
        and (n.value in keys or any(mark in n.value for mark in marks))
    ]


def test_the_literal_check_knows_the_frameworks_keys_and_lines():
    keys, marks = framework_literals()
    assert {
        "critic/score/mean",
        "group_reward_std",
        "frac_reward_zero_std",
        "val/advantages_min",
        "val/stop_rate",
    } <= keys
    assert {"Global step", "step:", "Metrics"} <= marks and "loss" not in keys


def test_the_literal_check_sees_a_planted_key(tmp_path):
    planted = tmp_path / "m.py"
    planted.write_text(
        '"""Reads critic/score/mean."""\nKEY = "critic/score/mean"\nLINE = re.compile(r"Global step (\\d+)")\n'
    )
    keys, marks = framework_literals()
    assert [f.split(": ", 1)[1] for f in literal_findings(planted, keys, marks)] == [
        "'critic/score/mean'",
        "'Global step (\\\\d+)'",
    ]


def test_no_module_that_reads_logs_or_runs_in_the_job_holds_a_frameworks_key_or_step_line():
    keys, marks = framework_literals()
    found = [
        f
        for layer in NO_LITERALS
        for path in sorted((ROOT / layer).rglob("*.py"))
        for f in literal_findings(path, keys, marks)
    ]
    assert found == [], "put the framework's keys and lines in its backend's LogFormat:\n" + "\n".join(found)
