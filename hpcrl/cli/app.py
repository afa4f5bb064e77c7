"""The Typer application object every command module registers on."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="hpcrl",
    help="Plan, render, submit and watch multi-node RL post-training jobs on Slurm.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
