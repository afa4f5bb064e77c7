"""The Typer application object every command module registers on."""

from __future__ import annotations

import typer

from hpcrl import __version__

app = typer.Typer(
    name="hpcrl",
    help="Plan, render, submit and watch multi-node RL post-training jobs on Slurm.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain click help: never cuts an option name at 80 columns, and needs no Rich import.
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"hpcrl {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version"),
) -> None:
    """Plan, render, submit and watch multi-node RL post-training jobs on Slurm."""
