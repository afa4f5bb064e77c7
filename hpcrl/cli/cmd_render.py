"""`hpcrl render`: the sbatch script of a run, to stdout or a file."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

import typer

from hpcrl.cli.app import app
from hpcrl.cli.output import warn
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
def render_cmd(
    nodes: Optional[int] = typer.Option(None, "--nodes", "-N", help="Nodes in the job (default: the config's)"),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="GPUs of one node for a job smaller than a node (1 up to the node's; default: the config's hpcrl.gpus, else whole nodes)"),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="Cluster profile; name:variant picks a node type"),
    cluster_file: Optional[Path] = typer.Option(None, "--cluster-file", help="Load this profile file instead"),
    config: Optional[str] = typer.Option(None, "--config", help="Run config file or shipped name (default grpo-olmo3-32b)"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the script here (mode 0755) instead of stdout"),
    sets: List[str] = typer.Option([], "--set", help="Override a config field: key=value (hpcrl.key=value for the hpcrl section)"),
    pins: List[str] = typer.Option([], "--pin", help="Fix a choice: learners=N, learner_nodes=N, tp=N, engines=N, util=F"),
    smoke: bool = typer.Option(False, "--smoke", help="Replace training by a Ray smoke test of the same layout"),
    allow_over_limit: bool = typer.Option(False, "--allow-over-limit", help="Warn instead of failing past partition limits"),
) -> None:
    """Render the sbatch script: Ray across the job's nodes, then grpo_fast.py (or --smoke)."""
    from hpcrl.jobs import node_excludes
    from hpcrl.planning.disk_check import check_run_disk
    from hpcrl.planning.run_plan import make_run_plan
    from hpcrl.rendering.render import render_script

    rp = node_excludes.apply(make_run_plan(config, nodes=nodes, cluster=cluster,
                                           cluster_file=str(cluster_file) if cluster_file else None,
                                           sets=sets, pins=pins, allow_over_limit=allow_over_limit, gpus=gpus))
    if not smoke:  # a smoke run writes no checkpoints
        check_run_disk(rp)
    text = render_script(rp, smoke=smoke)
    for w in rp.warnings:
        warn(w)
    if output is None:
        sys.stdout.write(text)
        return
    write_atomically(output, text)
    sys.stderr.write(f"hpcrl: wrote {output}\n")
