"""`hpcrl watch [RUN]`: a running job, one screen, refreshed every few seconds until the run ends."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hpcrl.cli.app import app
from hpcrl.cli.output import console, print_json, table


@app.command("watch")
def watch_cmd(
    run: Optional[str] = typer.Argument(
        None, help="Run id (or a unique prefix, or one of its job ids), or a run directory; default the newest live run"
    ),
    once: bool = typer.Option(False, "--once", help="Print one frame and exit"),
    as_json: bool = typer.Option(False, "--json", help="Print one snapshot as JSON (stable schema) and exit"),
    every: float = typer.Option(5.0, "--every", help="Seconds between refreshes (one Slurm query each)"),
    registry: Optional[Path] = typer.Option(None, "--registry", help="Registry file (default $HPCRL_REGISTRY)"),
) -> None:
    """Follow a run: job state, time left, step and steps/h, step time against the plan, reward, GPU memory per
    node, disk, the next checkpoint against the time limit, the breaker. Reads only; ends when the run does."""
    from hpcrl.cli import watch_view
    from hpcrl.errors import HpcrlError
    from hpcrl.jobs.watch import Watcher, follow

    if every < 1:
        raise HpcrlError(f"--every {every:g}: give at least 1 second (each refresh asks Slurm once)")
    watcher = Watcher(run, registry)
    if as_json or once:
        snap = watcher.snapshot()
        if as_json:
            print_json(snap.to_dict())
        else:
            console.print(watch_view.frame(snap, table))
        return
    from rich.live import Live

    last = None
    try:
        with Live(console=console._get(), screen=True, auto_refresh=False) as live:
            for last in follow(watcher, every):
                live.update(watch_view.frame(last, table), refresh=True)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if last is not None:  # the run ended: its last frame stays on the terminal, with how it ended
        console.print(watch_view.frame(last, table))
