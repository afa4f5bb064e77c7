"""Every command's --help at 80 columns shows each option name whole; the lazy command map is right."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from hpcrl.cli.app import app
from hpcrl.cli.commands import COMMANDS


def _tree() -> list[tuple[list[str], list[str]]]:
    """(command path, every option string) for every command and subcommand."""
    for module in set(COMMANDS.values()):
        importlib.import_module(f"hpcrl.cli.cmd_{module}")
    found = []

    def walk(cmd, path):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])
        else:
            found.append((path, [o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")]))

    walk(typer.main.get_command(app), [])
    return sorted(found)  # one order in every process (pytest-xdist's workers collect the same tests)


TREE = _tree()


def test_the_walk_finds_every_command_and_the_options_the_issue_named():
    paths = {" ".join(p) for p, _ in TREE}
    assert {"render", "plan-memory", "clusters show", "checkpoints prune", "report", "diagnose"} <= paths
    assert len(paths) == 22  # with `clusters exclude`, `init`, `watch`, `check-stack` and `versions`
    memory = dict((" ".join(p), o) for p, o in TREE)["plan-memory"]
    assert {"--no-gradient-checkpointing", "--vllm-gpu-memory-utilization", "--no-ref-policy"} <= set(memory)


@pytest.mark.parametrize("path,options", TREE, ids=[" ".join(p) for p, _ in TREE])
def test_help_at_80_columns_shows_every_option_name_whole(path, options):
    env = dict(os.environ, COLUMNS="80")
    out = subprocess.run(
        [sys.executable, "-m", "hpcrl", *path, "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    cut = [o for o in options if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text)]
    assert not cut, f"hpcrl {' '.join(path)} --help at 80 columns cuts or lacks {cut}:\n{text}"
    assert "…" not in text
    wide = [line for line in text.splitlines() if len(line) > 80]
    assert not wide, f"lines over 80 columns: {wide}"


def test_command_map_names_the_module_that_registers_each_command():
    for module in set(COMMANDS.values()):
        importlib.import_module(f"hpcrl.cli.cmd_{module}")
    registered = {c.name: c.callback.__module__ for c in app.registered_commands}
    for g in app.registered_groups:
        registered[g.name] = g.typer_instance.registered_commands[0].callback.__module__
    assert registered == {name: f"hpcrl.cli.cmd_{module}" for name, module in COMMANDS.items()}


def test_a_command_imports_its_own_module_only():
    code = (
        "import sys; from hpcrl.cli import main; main(['plan-disk', '--help']); "
        "print(sorted(m for m in sys.modules if m.startswith(('hpcrl.cli.cmd_', 'rich', 'jinja2', 'hpcrl.profiles'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "['hpcrl.cli.cmd_disk']"


RUNTIME_TOOLS = sorted(
    p.stem for p in (Path(__file__).resolve().parents[1] / "hpcrl" / "runtime").glob("*.py") if p.stem != "__init__"
)


def test_every_in_job_tool_is_walked():
    assert {"watchdog", "gpumon", "smoke", "preflight_probe", "classify", "wait_http", "ray_ready"} <= set(
        RUNTIME_TOOLS
    )


@pytest.mark.parametrize("tool", RUNTIME_TOOLS)
def test_in_job_tool_help_exits_0(tool):
    out = subprocess.run(
        [sys.executable, "-m", f"hpcrl.runtime.{tool}", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert f"hpcrl.runtime.{tool}" in out.stdout, out.stdout


def test_startup_benchmark_runs_and_reports_a_ratio():
    """The benchmark works (one repetition); its ratio is printed, never asserted (no timed test)."""
    import json

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "cli_startup.py"), "--repeat", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert set(r["median_cpu_ms"]) == {
        "libraries",
        "import pydantic, jinja2, yaml",
        "hpcrl render --nodes 16",
        "hpcrl --help",
    }
    assert r["ratio"] > 0 and r["repeat"] == 1


def test_nodes_is_dash_capital_n_in_plan_disk_as_in_plan():
    """`-N` is --nodes everywhere (docs/cli.md); `-n` is runs' --limit only."""
    import json as _json
    import subprocess as _sp
    import sys as _sys

    run = [_sys.executable, "-m", "hpcrl", "plan-disk", "--config", "grpo-olmo3-7b", "--json"]
    short = _sp.run(run + ["-N", "4"], capture_output=True, text=True, timeout=120)
    long = _sp.run(run + ["--nodes", "4"], capture_output=True, text=True, timeout=120)
    assert short.returncode == 0 and _json.loads(short.stdout) == _json.loads(long.stdout), short.stderr
