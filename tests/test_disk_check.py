"""render/submit refuse checkpoints that overflow the run root's quota, naming what fits."""

from __future__ import annotations

import re
import subprocess
import sys


def hpcrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, timeout=120)


# Berzelius' project quota is 2,000 GiB; OLMo 3 7B's ZeRO-3 state is 12 B x 7.3e9 = 88 GB.
OVERFLOW = ["--cluster", "berzelius:fat", "--nodes", "4", "--config", "grpo-olmo3-7b",
            "--set", "keep_last_n_checkpoints=-1", "--set", "checkpoint_state_freq=1"]


def test_render_refuses_overflowing_checkpoints_and_writes_nothing(tmp_path):
    out_file = tmp_path / "job.sh"
    out = hpcrl("render", *OVERFLOW, "-o", str(out_file))
    assert out.returncode == 2
    assert "quota is 2,000 GiB" in out.stderr and "would fit: --set keep_last_n_checkpoints=" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert not out_file.exists()


def test_each_suggested_setting_renders(tmp_path):
    err = hpcrl("render", *OVERFLOW).stderr
    suggestions = re.findall(r"--set (\w+=\d+)", err)
    assert suggestions
    for setting in suggestions:
        # A later --set of the same key wins, so the suggestion replaces the overflowing value.
        out = hpcrl("render", *OVERFLOW, "--set", setting)
        assert out.returncode == 0, (setting, out.stderr)


def test_force_disk_renders_anyway():
    out = hpcrl("render", *OVERFLOW, "--set", "hpcrl.force_disk=true")
    assert out.returncode == 0, out.stderr
    assert "#SBATCH --nodes=4" in out.stdout


def test_smoke_writes_no_checkpoints_so_is_not_refused():
    assert hpcrl("render", *OVERFLOW, "--smoke").returncode == 0
