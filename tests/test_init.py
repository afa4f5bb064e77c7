"""`hpcrl init` (issue 27 item 7): a commented starter config for a backend and cluster that plan reads as is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def hpcrl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpcrl", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "NO_COLOR": "1"},
    )


def test_init_then_plan_on_the_cluster_asked_for(tmp_path):
    assert hpcrl("init", "--backend", "verl", "--cluster", "berzelius", "-o", "run.yaml", cwd=tmp_path).returncode == 0
    text = (tmp_path / "run.yaml").read_text()
    assert text.startswith("# Starter config written by `hpcrl init --backend verl --cluster berzelius`")
    plan = hpcrl("plan", "--config", "run.yaml", "--json", cwd=tmp_path)
    assert plan.returncode == 0 and '"cluster": "berzelius:thin"' in plan.stdout, plan.stderr  # the default variant


def test_init_does_not_overwrite_and_refuses_an_unknown_backend_in_one_line(tmp_path):
    (tmp_path / "run.yaml").write_text("mine\n")
    again = hpcrl("init", "-o", "run.yaml", cwd=tmp_path)
    assert again.returncode == 2 and (tmp_path / "run.yaml").read_text() == "mine\n"
    bad = hpcrl("init", "--backend", "verll", "-o", "other.yaml", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr == "hpcrl: error: unknown backend 'verll'; closest: verl\n"
    assert not (tmp_path / "other.yaml").exists()
