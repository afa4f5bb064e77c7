"""The job's Ray version check (templates/ray.sh.j2 ray_version_problem / ray_version) in bash alone, against
`ray` commands made here: a `ray` that is a Python console script is answered by its interpreter from the
installed distribution's metadata, without running the script or importing Ray; any other `ray` by
`ray --version`. The refusal of a Ray below 2.52 stays what it was (tests/test_hardening.py runs it in a job)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers import bash_functions, rendered_script

FUNCTIONS = bash_functions(rendered_script(), "ray_version_problem", "ray_version")


def site_with_ray(tmp_path: Path, version: str) -> Path:
    """A folder for PYTHONPATH with a `ray` distribution of `version` whose package cannot be imported."""
    site = tmp_path / "site"
    info = site / f"ray-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: ray\nVersion: {version}\n")
    (site / "ray").mkdir()
    (site / "ray" / "__init__.py").write_text("raise ImportError('the version check must not import Ray')\n")
    return site


def check(tmp_path: Path, ray_text: str, site: Path | None = None) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ray").write_text(ray_text)
    (bin_dir / "ray").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURMD_NODENAME": "n9", **({"PYTHONPATH": str(site)} if site else {})}
    return subprocess.run(
        ["bash", "-c", FUNCTIONS + "ray_version; echo problem=$(ray_version_problem)"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def console_script(marker: Path) -> str:
    """pip's console script for `ray`, which leaves a mark when it runs."""
    return f"#!{sys.executable}\nimport pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\nprint('ray, version 9.9.9')\n"


def test_a_console_script_is_answered_from_its_distribution_without_running_it(tmp_path):
    marker = tmp_path / "ran"
    out = check(tmp_path, console_script(marker), site_with_ray(tmp_path, "2.60.0"))
    assert out.stdout.splitlines() == ["ray, version 2.60.0", "problem="], out.stderr
    assert not marker.exists()


def test_an_old_ray_behind_a_console_script_is_still_refused(tmp_path):
    out = check(tmp_path, console_script(tmp_path / "ran"), site_with_ray(tmp_path, "2.40.0"))
    assert out.stdout.splitlines()[0] == "ray, version 2.40.0"
    assert "problem=Ray 2.40.0 on n9 ignores token authentication (needs Ray >= 2.52)" in out.stdout


def test_a_console_script_whose_interpreter_has_no_ray_distribution_answers_itself(tmp_path):
    venv = tmp_path / "venv"  # an interpreter with no ray installed: the metadata read fails
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    marker = tmp_path / "ran"
    script = console_script(marker).replace(f"#!{sys.executable}", f"#!{venv / 'bin' / 'python3'}")
    out = check(tmp_path, script)
    assert out.stdout.splitlines() == ["ray, version 9.9.9", "problem="] and marker.exists(), out.stderr


def test_a_wrapper_that_is_not_python_answers_ray_version_itself(tmp_path):
    out = check(tmp_path, "#!/bin/bash\necho 'ray, version 2.41.0'\n")
    assert out.stdout.splitlines()[0] == "ray, version 2.41.0"
    assert "problem=Ray 2.41.0 on n9 ignores token authentication" in out.stdout
