"""`hpcrl render`: the sbatch script of a run, to stdout or a file."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Optional

import typer

from hpcrl.cli.app import app
from hpcrl.cli.output import assumed, progress, warn
from hpcrl.cli.request import RunRequest, run_request_options
from hpcrl.errors import HpcrlError


def write_atomically(path: Path, text: str, mode: int = 0o755) -> None:
    """Write text to path through a temporary file in the same directory, then rename."""
    path = path.expanduser()
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise HpcrlError(f"-o {path}: directory {directory} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@app.command("render")
@run_request_options(smoke=True)
def render_cmd(
    request: RunRequest,
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the script here (mode 0755) instead of stdout"),
    as_json: bool = typer.Option(False, "--json", help="Print the script, its warnings and assumptions and its job description as JSON"),
) -> None:
    """Render the sbatch script: Ray across the job's nodes, then grpo_fast.py (or --smoke)."""
    from hpcrl.jobs.run_script import build

    progress(not as_json)
    built = build(request)
    if as_json:
        from hpcrl.cli.output import print_json

        if output is not None:
            write_atomically(output, built.text)
        print_json({"script": None if output else built.text, "written": str(output) if output else None,
                    "warnings": list(built.plan.warnings), "assumptions": list(built.plan.assumptions),
                    "job": built.job.to_json()})
        return
    for a in built.plan.assumptions:
        assumed(a)
    for w in built.plan.warnings:
        warn(w)
    if output is None:
        sys.stdout.write(built.text)
        return
    write_atomically(output, built.text)
    sys.stderr.write(f"hpcrl: wrote {output}\n")
