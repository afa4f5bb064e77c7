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


def _registry(path: Optional[Path], create: bool = False):
    """The registry; only submit creates it (reading commands create nothing)."""
    from hpcrl.jobs.registry import Registry

    return Registry(path, create=create)


def _none_yet(path: Optional[Path], as_json: bool) -> bool:
    """Say there are no runs when no registry exists yet (without making one); False if one exists."""
    from hpcrl.jobs.registry import default_path

    where = default_path(path)
    if where.exists():
        return False
    if as_json:
        print_json({"registry": str(where), "runs": []})
    else:
        typer.echo(f"0 runs: no registry at {where} yet (hpcrl submit records runs)")
    return True


@app.command("submit")
@run_request_options(smoke=True)
def submit_cmd(
    request: RunRequest,
    script: Optional[Path] = typer.Argument(None, help="An already rendered batch script (default: render --config)"),
    run_dir: Optional[str] = typer.Option(None, "--run-dir", help="Run directory of SCRIPT when it names none"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be submitted; nothing goes to Slurm"),
    keep_exclusions: bool = typer.Option(False, "--keep-exclusions",
                                         help="Keep the nodes earlier chains of this run dir excluded (default: a new "
                                              "chain starts with none and with its failure continuations uncounted)"),
    registry: Optional[Path] = REGISTRY_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Render as `render` does with the same options (or take SCRIPT), write the run dir, sbatch it, record the run."""
    from hpcrl.jobs import lifecycle

    if script is not None:
        # --cluster names the cluster a rendered script was made for; every other option would render one.
        if given := option_names(request, but=("cluster",)):
            from hpcrl.errors import HpcrlError

            raise HpcrlError(f"give either a rendered SCRIPT or {', '.join(given)}, not both")
        sub = lifecycle.from_script(script, run_dir=run_dir, cluster=request.cluster)
    else:
        from hpcrl.jobs.run_script import build

        progress(not as_json)
        sub = lifecycle.from_run_script(build(request))
    reg = _registry(registry, create=True)
    done = lifecycle.submit(reg, sub, dry_run=dry_run, keep_exclusions=keep_exclusions)
    if as_json:
        print_json({"run_id": done.run_id, "job_id": done.job_id, "dry_run": dry_run,
                    "script": str(done.script_path), "run_dir": str(sub.run_dir.path),
                    "log": str(done.log_path) if done.log_path else None, "command": done.command,
                    "registry": str(reg.path), "warnings": list(sub.warnings)})
        return
    for w in sub.warnings:
        warn(w)
    if dry_run:
        typer.echo(f"dry run {done.run_id}: would run  {' '.join(done.command)}")
        typer.echo(f"script: {done.script_path}")
        typer.echo(f"run dir: {sub.run_dir.path} (not written)")
        return
    typer.echo(f"run {done.run_id}: job {done.job_id}")
    typer.echo(f"log: {done.log_path}")


def _runs_table(runs, title: str):
    t = table(title)
    for col in ("run", "state", "reason", "cluster", "jobs", "latest job", "created", "run dir"):
        t.add_column(col, overflow="fold")
    for r in runs:
        last = r.last_job
        t.add_row(r.run_id, r.state, r.reason, r.cluster, str(len(r.jobs)),
                  f"{last.job_id} {last.state}" if last else "-", r.created, r.run_dir)
    return t


def _run_json(r) -> dict:
    from hpcrl.jobs.lifecycle import RunDir

    from hpcrl.jobs.run_dir import readable_chain

    d = r.to_dict()
    rd = RunDir(r.run_dir)
    d["restarts"] = rd.restart_count() if rd.restarts.exists() else None
    d["failure_restarts"] = rd.failure_restart_count()
    d["excluded_nodes"] = rd.excluded_nodes()
    chain = readable_chain(rd)
    for j in d["jobs"]:
        j["log"] = str(rd.log(j["job_id"]))
        ev = chain.get(j["job_id"])
        j["failure"] = ({"reason": ev.failure, "excluded": list(ev.blamed), "continued": ev.next_job is not None}
                        if ev and ev.failure else None)
    return d


@app.command("runs")
def runs_cmd(
    limit: int = typer.Option(20, "--limit", "-n", help="How many runs, newest first (0: all)"),
    repair: bool = typer.Option(False, "--repair", help="Rebuild a damaged registry from what can be read"),
    registry: Optional[Path] = REGISTRY_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """List recorded runs from the registry (no Slurm query; `hpcrl status` refreshes)."""
    if repair:
        from hpcrl.jobs.registry_repair import repair as repair_registry

        done = repair_registry(registry)
        if as_json:
            print_json({"registry": str(done.path), "moved_to": str(done.moved_to) if done.moved_to else None,
                        "runs": done.runs, "jobs": done.jobs, "jobs_dropped": done.jobs_dropped})
            return
        moved = f"; the damaged file is now {done.moved_to}" if done.moved_to else ""
        dropped = f" ({done.jobs_dropped} jobs of lost runs dropped)" if done.jobs_dropped else ""
        typer.echo(f"registry {done.path}: kept {done.runs} runs and {done.jobs} jobs{dropped}{moved}")
        return
    if limit < 0:
        from hpcrl.errors import HpcrlError

        raise HpcrlError(f"--limit {limit}: give 0 (all runs) or a positive number")
    if _none_yet(registry, as_json):
        return
    reg = _registry(registry)
    runs = reg.list_runs(limit or None)
    if as_json:
        print_json({"registry": str(reg.path), "runs": [_run_json(r) for r in runs]})
        return
    console.print(_runs_table(runs, f"{len(runs)} runs in {reg.path}"))


@app.command("status")
def status_cmd(
    run: Optional[str] = typer.Argument(None, help="Run id (or a unique prefix, or one of its job ids); default all live runs"),
    all_runs: bool = typer.Option(False, "--all", help="Show ended runs too"),
    registry: Optional[Path] = REGISTRY_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Refresh run states (one batched Slurm query, following the job chain) and show them."""
    from hpcrl.jobs import lifecycle

    if not run and _none_yet(registry, as_json):
        return
    reg = _registry(registry)
    runs = [reg.find(run)] if run else reg.list_runs(None if all_runs else 50, live_only=not all_runs)
    runs = lifecycle.refresh(reg, runs)
    if as_json:
        print_json({"registry": str(reg.path), "runs": [_run_json(r) for r in runs]})
        return
    if not run:
        # Without --all: the runs that were live before this refresh (some may have ended now).
        title = f"{len(runs)} run{'' if len(runs) == 1 else 's'}" + ("" if all_runs else " live before this refresh")
        console.print(_runs_table(runs, title))
        return
    r = runs[0]
    d = _run_json(r)
    restarts = f", restarts {d['restarts']}/{r.max_restarts}" if d["restarts"] is not None else ""
    if d["failure_restarts"]:
        restarts += f", after failures {d['failure_restarts']}" + (
            f" (excluded {', '.join(d['excluded_nodes'])})" if d["excluded_nodes"] else "")
    console.print(f"[bold]{r.run_id}[/] {r.state}" + (f" ({r.reason})" if r.reason else "") + restarts, soft_wrap=True)
    typer.echo(f"run dir: {r.run_dir}")
    t = table()
    for col in ("#", "job", "state", "reason", "exit", "submitted", "ended", "log"):
        t.add_column(col, overflow="fold")
    for j in d["jobs"]:
        f = j["failure"]
        # No `continue` line yet: sbatch is under way while the job runs, failed once it has ended.
        sbatch = " -> continuing" if j["state"] in lifecycle.slurm.LIVE_STATES else " -> the continuation's sbatch failed"
        reason = j["reason"] + ("" if not f else sbatch if not f["continued"] else
                                f" -> continued without {', '.join(f['excluded'])}" if f["excluded"] else " -> continued")
        t.add_row(str(j["seq"]), j["job_id"], j["state"], reason,
                  "" if j["exit_code"] is None else str(j["exit_code"]), j["submitted"], j["ended"] or "", j["log"])
    console.print(t)


@app.command("logs")
def logs_cmd(
    run: str = typer.Argument(..., help="Run id (or a unique prefix, or one of its job ids)"),
    follow: bool = typer.Option(False, "--follow", "-f", help="Follow the newest log, across continuations"),
    poll: float = typer.Option(1.0, "--poll", help="Seconds between reads of the log while following"),
    registry: Optional[Path] = REGISTRY_OPT,
) -> None:
    """Print the log of every job of the run in order (job headers go to stderr)."""
    from hpcrl.jobs import lifecycle

    from hpcrl.errors import HpcrlError

    reg = _registry(registry)
    r = reg.find(run)
    if not r.jobs:
        raise HpcrlError(f"run {r.run_id} has no Slurm jobs ({r.state}" + (f": {r.reason})" if r.reason else ")"))
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
    from hpcrl.jobs import lifecycle

    reg = _registry(registry)
    r = lifecycle.cancel(reg, reg.find(run))
    if as_json:
        print_json({"cancel_requested": True, **_run_json(r)})
        return
    jobs = ", ".join(j.job_id for j in r.jobs)
    typer.echo(f"run {r.run_id}: cancel requested (jobs {jobs}); now {r.state}")


_STYLE = {"ok": "green", "warn": "yellow", "fail": "red", "info": "dim"}


@app.command("preflight")
def preflight_cmd(
    nodes: int = typer.Option(1, "--nodes", "-N", help="Nodes to check in one job (2+ also measures the collective across them)"),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="Cluster profile (default: the config's)"),
    partition: Optional[str] = typer.Option(None, "--partition", "-p", help="Partition (default: the profile's)"),
    config: Optional[str] = typer.Option(None, "--config", help="Run config: model, run root, training environment"),
    folder: Optional[str] = typer.Option(None, "--folder", help="submitit folder (default: under the run root)"),
    wait: float = typer.Option(900, "--wait", help="Seconds to wait for the probe before cancelling it"),
    write_exclude: bool = typer.Option(False, "--write-exclude", help="Add failing nodes to the cluster's exclude list"),
    as_json: bool = JSON_OPT,
) -> None:
    """Check N compute nodes in one job (submitit): GPUs and their health, disks, model, imports,
    then an all-reduce and all-gather across them; name the bad nodes."""
    from hpcrl.jobs import preflight

    out = preflight.preflight(cluster, partition, config, nodes=nodes, folder=folder, wait_s=wait,
                              write_exclude=write_exclude)
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
