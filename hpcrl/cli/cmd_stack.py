"""`hpcrl check-stack` (the job's stack check, before queueing) and `hpcrl versions` (the framework and vLLM
releases hpcrl has read)."""

from __future__ import annotations

from typing import Optional

import typer

from hpcrl.cli.app import app
from hpcrl.cli.output import console, print_json, table
from hpcrl.cli.request import RunRequest, run_request_options
from hpcrl.runtime.stack import PROBE_TIMEOUT_S


@app.command("check-stack")
@run_request_options(smoke=False)
def check_stack_cmd(
    request: RunRequest,
    python: Optional[str] = typer.Option(
        None,
        "--python",
        help="The training environment's Python (ENV/bin/python); default: the run's hpcrl.python "
        "after the profile's setup, its modules and hpcrl.env_setup",
    ),
    probe_timeout: float = typer.Option(
        PROBE_TIMEOUT_S, "--probe-timeout", help="Seconds that Python may take to answer the probe (past it: unchecked)"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON"),
) -> None:
    """Run the job's stack check here, before queueing: exit 98 where the job would stop at it, else 0."""
    from hpcrl.jobs.check_stack import check_stack
    from hpcrl.runtime.stack import STACK_MISMATCH_EXIT

    result = check_stack(request, python, probe_timeout)
    if as_json:
        print_json(result.to_dict())
    else:
        for line in result.lines:
            typer.echo(line)
    raise typer.Exit(STACK_MISMATCH_EXIT if result.exit_code == STACK_MISMATCH_EXIT else 0)


@app.command("versions")
def versions_cmd(
    backend: Optional[str] = typer.Argument(None, help="One backend (default: every one with versions, and vLLM)"),
    as_json: bool = typer.Option(False, "--json", help="Print the table as JSON"),
) -> None:
    """The framework releases (and commits) hpcrl has read, per backend, and the vLLM releases it accounts for."""
    from hpcrl.planning.backends.release_list import release_list

    rows = release_list(backend)
    if as_json:
        print_json(rows)
        return
    t = table("Framework versions hpcrl has read")
    for col in ("backend", "version", "commit", "date", "default", "read from", "pins"):
        t.add_column(col, overflow="fold")
    for r in rows["frameworks"]:
        t.add_row(
            r["backend"],
            r["version"],
            r["commit"] or "-",
            r["date"],
            "yes" if r["default"] else "",
            r["source"],
            ", ".join(r["pins"]) or "-",
        )
    console.print(t)
    if rows["vllm"]:
        v = table("vLLM releases whose memory accounting hpcrl has read")
        for col in ("vLLM", "read from", "pinned by"):
            v.add_column(col, overflow="fold")
        for r in rows["vllm"]:
            v.add_row(r["version"], r["source"], ", ".join(r["pinned_by"]) or "-")
        console.print(v)
        typer.echo("Another patch release of a read minor gets the nearest read release's accounting, with a note.")
