"""Layering: pure planning/rendering never imports side effects; the CLI starts light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "hpcrl"

# Pure layers: numbers in, numbers/text out.
PURE = ["models", "memory", "layout.py", "layout_colocated.py", "config.py", "run_plan.py", "render.py", "shell.py",
        "disk.py", "disk_budget.py", "disk_backends.py", "disk_check.py", "diagnose.py", "diagnose_context.py", "diagnose_fixes.py", "driver_cmdline.py", "driver_log.py", "report_markdown.py", "profiles.py", "planning/backends", "resources.py", "errors.py", "yamlfile.py"]
# What a pure module may not import: processes, Slurm, the registry, the CLI.
FORBIDDEN = {"subprocess", "hpcrl.jobs.slurm", "hpcrl.jobs.registry", "hpcrl.jobs.lifecycle", "hpcrl.jobs.preflight",
             "hpcrl.cli", "hpcrl.runtime", "sqlite3", "submitit", "pynvml"}
HEAVY = {"torch", "ray", "vllm", "deepspeed", "transformers", "matplotlib"}


def _modules(entry: str) -> list[Path]:
    path = PKG / entry
    if path.is_dir():
        return sorted(path.rglob("*.py"))
    return [path] if path.exists() else []


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", [p for e in PURE for p in _modules(e)], ids=lambda p: str(p.relative_to(PKG)))
def test_pure_module_has_no_side_effect_imports(path):
    bad = {n for n in _imports(path) for f in FORBIDDEN | HEAVY if n == f or n.startswith(f + ".")}
    assert not bad, f"{path.relative_to(PKG)} imports {sorted(bad)}"


def test_forbidden_detection_works(tmp_path):
    """The walker really sees imports (guards against a test that cannot fail)."""
    f = tmp_path / "m.py"
    f.write_text("import subprocess\nfrom hpcrl.jobs.slurm import submit\n")
    assert {"subprocess", "hpcrl.jobs.slurm"} <= _imports(f)


def test_cli_start_imports_no_heavy_framework():
    code = (
        "import sys, hpcrl.cli; "
        f"bad = [m for m in {sorted(HEAVY)!r} if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_modules_stay_small():
    big = [(p.relative_to(PKG), n) for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 450]
    assert not big, f"modules over 450 lines: {big}"
