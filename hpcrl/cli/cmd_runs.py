"""`hpcrl submit | runs | status | logs | cancel | preflight`: a run's life on Slurm."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from hpcrl.cli.app import app
from hpcrl.cli.output import console, err_console, print_json, progress, table, warn
from hpcrl.cli.request import RunRequest, option_names, run_request_options

REGISTRY_OPT = typer.Option(None, "--registry", help="Registry file (default $HPCRL_REGISTRY, else the user data dir)")
JSON_OPT = typer.Option(False, "--json", help="Print JSON (stable schema) instead of a table")


def _none_yet(d: dict) -> bool:
    """Say there are no runs when no registry exists yet (none was made); False if one exists."""
    if Path(d["registry"]).exists():
        return False
    typer.echo(f"0 runs: no registry at {d['registry']} yet (hpcrl submit records runs)")
    return True


@app.command("submit")
@run_request_options(smoke=True)
def submit_cmd(
    request: RunRequest,
    script: Optional[Path] = typer.Argument(None, help="An already rendered batch script (default: render --config)"),
    run_dir: Optional[str] = typer.Option(None, "--run-dir", help="Run directory of SCRIPT when it names none"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be submitted; nothing goes to Slurm"),
    keep_exclusions: bool = typer.Option(
        False,
        "--keep-exclusions",
        help="Keep the nodes earlier chains of this run dir excluded (default: a new "
        "chain starts with none and with its failure continuations uncounted)",
    ),
    registry: Optional[Path] = REGISTRY_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Render as `render` does with the same options (or take SCRIPT), write the run dir, sbatch it, record the run."""
    from hpcrl.jobs import run_results

    progress(not as_json and script is None)
    d = run_results.submit(
        request,
        script=script,
        run_dir=run_dir,
        dry_run=dry_run,
        keep_exclusions=keep_exclusions,
        registry=registry,
        given=option_names(request, but=("cluster",)),
    )
    if as_json:
        print_json(d)
        return
    for w in d["warnings"]:
        warn(w)
    if dry_run:
        typer.echo(f"dry run {d['run_id']}: would run  {' '.join(d['command'])}")
        typer.echo(f"script: {d['script']}")
        typer.echo(f"run dir: {d['run_dir']} (not written)")
        return
    typer.echo(f"run {d['run_id']}: job {d['job_id']}")
    typer.echo(f"log: {d['log']}")


def _runs_table(runs: list[dict], title: str):
    t = table(title)
    for col in ("run", "state", "reason", "cluster", "jobs", "latest job", "created", "run dir"):
        t.add_column(col, overflow="fold")
    for r in runs:
        last = r["jobs"][-1] if r["jobs"] else None
        t.add_row(
            r["run_id"],
            r["state"],
            r["reason"],
            r["cluster"],
            str(len(r["jobs"])),
            f"{last['job_id']} {last['state']}" if last else "-",
            r["created"],
            r["run_dir"],
        )
    return t


@app.command("runs")
def runs_cmd(
    limit: int = typer.Option(20, "--limit", "-n", help="How many runs, newest first (0: all)"),
    repair: bool = typer.Option(False, "--repair", help="Rebuild a damaged registry from what can be read"),
    registry: Optional[Path] = REGISTRY_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """List recorded runs from the registry (no Slurm query; `hpcrl status` refreshes)."""
    from hpcrl.jobs import run_results

    if repair:
        done = run_results.repair(registry=registry)
        if as_json:
            print_json(done)
            return
        moved = f"; the damaged file is now {done['moved_to']}" if done["moved_to"] else ""
        dropped = f" ({done['jobs_dropped']} jobs of lost runs dropped)" if done["jobs_dropped"] else ""
        typer.echo(f"registry {done['registry']}: kept {done['runs']} runs and {done['jobs']} jobs{dropped}{moved}")
        return

    d = run_results.runs(limit=limit, registry=registry)
    if as_json:
        print_json(d)
    elif not _none_yet(d):
        console.print(_runs_table(d["runs"], f"{len(d['runs'])} runs in {d['registry']}"))


@app.command("status")
def status_cmd(
    run: Optional[str] = typer.Argument(
        None, help="Run id (or a unique prefix, or one of its job ids); default all live runs"
    ),
    all_runs: bool = typer.Option(False, "--all", help="Show ended runs too"),
    registry: Optional[Path] = REGISTRY_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Refresh run states (one batched Slurm query, following the job chain) and show them."""
    from hpcrl.jobs import run_results, slurm

    d = run_results.status(run, all_runs=all_runs, registry=registry)
    if as_json:
        print_json(d)
        return
    if not run:
        if _none_yet(d):
            return
        # Without --all: the runs that were live before this refresh (some may have ended now).
        n = len(d["runs"])
        title = f"{n} run{'' if n == 1 else 's'}" + ("" if all_runs else " live before this refresh")
        console.print(_runs_table(d["runs"], title))
        return
    r = d["runs"][0]
    restarts = f", restarts {r['restarts']}/{r['max_restarts']}" if r["restarts"] is not None else ""
    if r["failure_restarts"]:
        restarts += f", after failures {r['failure_restarts']}" + (
            f" (excluded {', '.join(r['excluded_nodes'])})" if r["excluded_nodes"] else ""
        )
    console.print(
        f"[bold]{r['run_id']}[/] {r['state']}" + (f" ({r['reason']})" if r["reason"] else "") + restarts, soft_wrap=True
    )
    typer.echo(f"run dir: {r['run_dir']}")
    t = table()
    for col in ("#", "job", "state", "reason", "exit", "submitted", "ended", "log"):
        t.add_column(col, overflow="fold")
    for j in r["jobs"]:
        f = j["failure"]
        # No `continue` line yet: sbatch is under way while the job runs, failed once it has ended.
        sbatch = " -> continuing" if j["state"] in slurm.LIVE_STATES else " -> the continuation's sbatch failed"
        reason = j["reason"] + (
            ""
            if not f
            else sbatch
            if not f["continued"]
            else f" -> continued without {', '.join(f['excluded'])}"
            if f["excluded"]
            else " -> continued"
        )
        t.add_row(
            str(j["seq"]),
            j["job_id"],
            j["state"],
            reason,
            "" if j["exit_code"] is None else str(j["exit_code"]),
            j["submitted"],
            j["ended"] or "",
            j["log"],
        )
    console.print(t)
    for j in r["jobs"]:
        if j.get("stack_check"):
            typer.echo(f"job {j['job_id']}: stack check: {j['stack_check']}")


@app.command("logs")
def logs_cmd(
    run: str = typer.Argument(..., help="Run id (or a unique prefix, or one of its job ids)"),
    follow: bool = typer.Option(False, "--follow", "-f", help="Follow the newest log, across continuations"),
    poll: float = typer.Option(1.0, "--poll", help="Seconds between reads of the log while following"),
    registry: Optional[Path] = REGISTRY_OPT,
    as_json: bool = typer.Option(
        False, "--json", help="Print each job's log path and text as JSON (not with --follow)"
    ),
) -> None:
    """Print the log of every job of the run in order (job headers go to stderr)."""
    from hpcrl.errors import HpcrlError
    from hpcrl.jobs import lifecycle, run_results

    if as_json:
        if follow:
            raise HpcrlError("--json prints the logs as they are now; --follow streams them: give one of the two")
        print_json(run_results.logs(run, registry=registry))
        return
    r = run_results.with_jobs(run, registry)
    shown = None
    chunks = lifecycle.follow(r, poll_s=poll) if follow else lifecycle.logs(r)
    try:
        for job_id, text in chunks:
            if job_id != shown:
                sys.stdout.flush()
                err_console.print(f"==> job {job_id}: {lifecycle.RunDir(r.run_dir).log(job_id)} <==", soft_wrap=True)
                shown = job_id
                if not text and (why := lifecycle.missing_log(r, job_id)):
                    sys.stderr.write(f"hpcrl: {why}\n")
            sys.stdout.write(text)
            sys.stdout.flush()
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


@app.command("cancel")
def cancel_cmd(
    run: str = typer.Argument(..., help="Run id (or a unique prefix, or one of its job ids)"),
    registry: Optional[Path] = REGISTRY_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Stop a run: write its cancel marker (no continuation), then scancel its live jobs."""
    from hpcrl.jobs import run_results

    d = run_results.cancel(run, registry=registry)
    if as_json:
        print_json(d)
        return
    jobs = ", ".join(j["job_id"] for j in d["jobs"])
    typer.echo(f"run {d['run_id']}: cancel requested (jobs {jobs}); now {d['state']}")


_STYLE = {"ok": "green", "warn": "yellow", "fail": "red", "info": "dim"}


@app.command("preflight")
def preflight_cmd(
    nodes: int = typer.Option(
        1, "--nodes", "-N", help="Nodes to check in one job (2+ also measures the collective across them)"
    ),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="Cluster profile (default: the config's)"),
    partition: Optional[str] = typer.Option(None, "--partition", "-p", help="Partition (default: the profile's)"),
    config: Optional[str] = typer.Option(None, "--config", help="Run config: model, run root, training environment"),
    folder: Optional[str] = typer.Option(None, "--folder", help="submitit folder (default: under the run root)"),
    wait: float = typer.Option(900, "--wait", help="Seconds to wait for the probe before cancelling it"),
    write_exclude: bool = typer.Option(
        False, "--write-exclude", help="Add failing nodes to the cluster's exclude list"
    ),
    as_json: bool = JSON_OPT,
) -> None:
    """Check N compute nodes in one job (submitit): GPUs and their health, disks, model, imports,
    then an all-reduce and all-gather across them; name the bad nodes."""
    from hpcrl.jobs import preflight

    out = preflight.preflight(
        cluster, partition, config, nodes=nodes, folder=folder, wait_s=wait, write_exclude=write_exclude
    )
    if as_json:
        print_json(out)
    else:
        print_preflight(out)
    if not out["ok"]:
        raise typer.Exit(1)


def print_preflight(out: dict) -> None:
    """The preflight summary as tables: one node's checks, or one row per node; then the collective."""
    where = f"preflight on {out['cluster']}" + (f" partition {out['partition']}" if out["partition"] else "")
    if len(out["nodes"]) == 1:
        t = table(title=f"{where}, job {out['job_id']}")
        for col in ("check", "status", "detail"):
            t.add_column(col, overflow="fold")
        for r in (c for c in out["checks"] if c["node"] != "*"):
            t.add_row(r["check"], f"[{_STYLE[r['status']]}]{r['status']}[/]", r["detail"])
    else:
        t = table(title=f"{where}, job {out['job_id']}: {len(out['nodes'])} nodes")
        for col in ("node", "status", "why"):
            t.add_column(col, overflow="fold")
        for n in out["nodes"]:
            t.add_row(n["node"], f"[{_STYLE[n['status']]}]{n['status']}[/]", n["why"] or "-")
    console.print(t)
    coll = out["collective"]
    t = table(title=f"collective: {coll['method'] or 'not run'}" + (f" ({coll['note']})" if coll.get("note") else ""))
    for col in ("check", "status", "detail"):
        t.add_column(col, overflow="fold")
    for r in coll["checks"]:
        t.add_row(r["check"], f"[{_STYLE[r['status']]}]{r['status']}[/]", r["detail"])
    console.print(t)
    if out["failing_nodes"]:
        console.print(f"failing: {', '.join(out['failing_nodes'])}")
    if out["exclude"]:
        ex = out["exclude"]
        added = f"added {', '.join(ex['added'])} to" if ex["added"] else "nothing new for"
        console.print(f"{added} {ex['file']} (render/submit exclude {', '.join(ex['nodes']) or 'none'})")
