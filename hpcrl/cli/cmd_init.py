"""`hpcrl init`: write a commented starter config for a backend and a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hpcrl.cli.app import app
from hpcrl.cli.output import console, print_json


@app.command("init")
def init_cmd(
    backend: Optional[str] = typer.Option(
        None, "--backend", help="Framework the run uses (default: hpcrl.backend's default)"
    ),
    cluster: str = typer.Option(
        "isambard-ai", "--cluster", "-c", help="Cluster profile; name:variant picks a node type"
    ),
    output: Path = typer.Option(
        Path("hpcrl-run.yaml"), "--output", "-o", help="File to write (a regular file or a link to one), - for stdout"
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite the file if it exists"),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON"),
) -> None:
    """Write a commented starter run config for a backend and cluster (from the shipped example)."""
    from hpcrl.cli.outfile import is_stdout, output_target, write_output
    from hpcrl.errors import HpcrlError
    from hpcrl.planning.backends import DEFAULT_BACKEND
    from hpcrl.planning.starter import starter_config

    backend = backend or DEFAULT_BACKEND

    if is_stdout(output) and as_json:
        raise HpcrlError("-o - writes the config to stdout and --json prints what was written there: give one")
    target = output_target(output, "-o")
    if target is not None and target.exists() and not force:
        raise HpcrlError(f"{output} exists; pass --force to overwrite it, or --output another file")
    text = starter_config(backend, cluster)
    write_output(output, text, "-o")
    if is_stdout(output):
        return
    if as_json:
        print_json({"written": str(output), "backend": backend, "cluster": cluster})
        return
    console.print(f"wrote {output}: next, hpcrl plan --config {output}", highlight=False)
