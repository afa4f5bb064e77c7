"""`hpcrl render`: the sbatch script of a run, to stdout or a file."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from hpcrl.cli.app import app
from hpcrl.cli.output import assumed, progress, warn
from hpcrl.cli.request import RunRequest, run_request_options
from hpcrl.cli.outfile import is_stdout, output_target, write_output


@app.command("render")
@run_request_options(smoke=True)
def render_cmd(
    request: RunRequest,
    output: Optional[Path] = typer.Option(
        None,
        "--output",
        "-o",
        help="Write the script to this file (mode 0755; a regular file or a link to one), - for stdout",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the script, its warnings and assumptions and its job description as JSON"
    ),
) -> None:
    """Render the sbatch script: Ray across the job's nodes, then grpo_fast.py (or --smoke)."""
    from hpcrl.jobs.run_script import build

    if is_stdout(output):
        output = None
    if output is not None:
        output_target(output, "-o")  # a path that cannot be written is refused before any planning
    progress(not as_json)
    built = build(request)
    if as_json:
        from hpcrl.cli.output import print_json

        if output is not None:
            write_output(output, built.text, "-o", mode=0o755)
        print_json(
            {
                "script": None if output else built.text,
                "written": str(output) if output else None,
                "warnings": list(built.plan.warnings),
                "assumptions": list(built.plan.assumptions),
                "job": built.job.to_json(),
            }
        )
        return
    if output is not None:  # first: a write that fails is the one line on stderr
        write_output(output, built.text, "-o", mode=0o755)
    for a in built.plan.assumptions:
        assumed(a)
    for w in built.plan.warnings:
        warn(w)
    if output is None:
        sys.stdout.write(built.text)
        return
    sys.stderr.write(f"hpcrl: wrote {output}\n")
