"""`hpcrl diagnose` and `hpcrl checkpoints list|prune`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from hpcrl.cli.app import app
from hpcrl.cli.output import console, print_json, table
from hpcrl.errors import HpcrlError

if TYPE_CHECKING:
    from hpcrl.logs.driver_cmdline import DriverCommand

GIB = 2**30  # as hpcrl.planning.disk.GIB, without importing the planner


@app.command("diagnose")
def diagnose_cmd(
    log: Path = typer.Argument(..., help="A log file, or a run directory (reads hpcrl/driver.log and breaker.json)"),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", help="Model (default: the run's or the log's; none is assumed)"
    ),
    backend: Optional[str] = typer.Option(
        None, "--backend", "-b", help="The run's backend (default: the run's, else the driver command in the log)"
    ),
    learner_gpus: Optional[int] = typer.Option(
        None, "--learner-gpus", help="Learner GPUs (default: from the run or log)"
    ),
    tokens_per_gpu: Optional[int] = typer.Option(
        None, "--tokens-per-gpu", help="Tokens per learner GPU micro-batch (default: from the run or log)"
    ),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="Cluster profile (default: the run's)"),
    as_json: bool = typer.Option(False, "--json", help="Print the diagnosis as JSON"),
) -> None:
    """Why did the run fail? Known failures in a log, with the fix computed by the planner in the backend's keys."""
    from hpcrl.logs.diagnose import Context, diagnose  # noqa: PLC0415
    from hpcrl.planning.backends import BACKENDS, get_backend  # noqa: PLC0415 - keeps `hpcrl --help` fast
    from hpcrl.profiles import resolve_profile  # noqa: PLC0415

    for flag, count in (("--learner-gpus", learner_gpus), ("--tokens-per-gpu", tokens_per_gpu)):
        if count is not None and count < 1:
            raise HpcrlError(f"{flag} must be a positive integer, got {count}")
    if backend is not None and backend not in BACKENDS:
        raise HpcrlError(f"--backend {backend!r}: valid: {', '.join(BACKENDS)}")
    if backend is not None and get_backend(backend).learner_from_plan and not log.is_dir():
        # a user's own script has no command line hpcrl can read
        raise HpcrlError(
            f"--backend {backend}: give the run directory, not {log}: its hpcrl/plan.json describes the "
            "script's learner"
        )

    path, breaker = log, None
    if log.is_dir():  # a run directory: the watchdog's driver log, else the newest Slurm job log
        logs = sorted((log / "logs").glob("*.log"), key=lambda p: p.stat().st_mtime)
        path = log / "hpcrl" / "driver.log" if (log / "hpcrl" / "driver.log").is_file() else (logs or [log])[-1]
        if not path.is_file():
            raise HpcrlError(f"{log}: no hpcrl/driver.log or logs/*.log in this directory; give a log file")
    elif not path.is_file():
        raise HpcrlError(f"{log}: no such log file or run directory")
    found = (log / "hpcrl" if log.is_dir() else path.parent) / "breaker.json"
    if found.is_file():
        try:
            breaker = json.loads(found.read_text())
        except (OSError, json.JSONDecodeError):
            breaker = None
    text = path.read_text(errors="replace")
    if log.is_dir():  # and the Ray logs the newest job kept per node (a raylet's OOM kill, a GCS crash)
        from hpcrl.jobs.run_dir import RunDir, kept_ray_logs

        for name, tail in kept_ray_logs(RunDir(log)):
            text += f"\n==> {name} <==\n{tail}\n"
    plan, command = _run_files(log) if log.is_dir() else (None, None)
    run_backend = backend or (plan or {}).get("backend")
    if _learner_from_plan(run_backend) and (learner_gpus or tokens_per_gpu):
        raise HpcrlError(
            f"--learner-gpus and --tokens-per-gpu do not apply to a {run_backend} run: its learner comes "
            "from the run's hpcrl/plan.json (re-render the run to change it)"
        )
    profile = resolve_profile(cluster)
    if cluster is None and plan and plan.get("cluster"):
        try:
            profile = resolve_profile(str(plan["cluster"]))
        except HpcrlError:  # a profile file the run was rendered with: the default's GPU facts then
            pass
    ctx = Context(
        profile,
        {"model": model, "learner_gpus": learner_gpus, "backend": backend, "tokens_per_gpu": tokens_per_gpu},
        command=command,
        plan=plan,
    )
    result = diagnose(text, ctx, breaker)
    if as_json:
        print_json({"log": str(path), "breaker": breaker, **result.to_dict()})
    elif result.findings:
        for i, f in enumerate(result.findings):
            console.print(f"[bold]{'Cause' if i == 0 else 'Also'}: {f.kind}[/]", highlight=False)
            console.print(f"  {f.cause}", highlight=False)
            console.print(f"  [bold]fix:[/] {f.fix}", highlight=False)
            for e in f.evidence:
                console.print(f"  {e}", style="dim", highlight=False, markup=False)
        if result.assumptions:
            console.print("Assumed: " + "; ".join(result.assumptions), style="dim", highlight=False)
    else:
        console.print(f"no known failure found in {path}; its last lines:", highlight=False)
        for line in result.last_lines:
            console.print(f"  {line}", highlight=False, markup=False)
    if not result.findings:
        # SystemExit, not typer.Exit: hpcrl.cli.main drops the code click returns for typer.Exit.
        raise SystemExit(2)


def _run_files(run_dir: Path) -> tuple[dict | None, DriverCommand | None]:
    """A run directory's plan.json and the driver command of its job.sbatch (None where absent)."""
    from hpcrl.logs.driver_cmdline import from_script  # noqa: PLC0415

    try:
        plan = json.loads((run_dir / "hpcrl" / "plan.json").read_text())
    except (OSError, ValueError):
        return None, None
    plan = plan if isinstance(plan, dict) else None
    try:
        script = (run_dir / "hpcrl" / "job.sbatch").read_text(errors="replace")
    except OSError:
        return plan, None
    from hpcrl.planning.backends import DEFAULT_BACKEND  # noqa: PLC0415

    backend = (plan or {}).get("backend") or DEFAULT_BACKEND
    return plan, None if _learner_from_plan(backend) else from_script(script, backend)


def _learner_from_plan(backend: str | None) -> bool:
    """Whether a run of `backend` is read from its plan.json rather than its command line (False: unknown name)."""
    from hpcrl.planning.backends import get_backend  # noqa: PLC0415

    try:
        return backend is not None and get_backend(str(backend)).learner_from_plan
    except HpcrlError:
        return False


checkpoints_app = typer.Typer(help="List and prune a run's checkpoints.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(checkpoints_app, name="checkpoints")


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def _cp_row(c, run_dir: Path, now: float) -> dict:
    return {
        "path": str(c.path.relative_to(run_dir)),
        "kind": c.kind,
        "step": c.step,
        "bytes": c.bytes,
        "gib": round(c.bytes / GIB, 3),
        "complete": c.complete,
        "why_incomplete": c.why_incomplete,
        "age_s": round(now - c.modified, 1),
    }


@checkpoints_app.command("list")
def checkpoints_list(
    run: str = typer.Argument(..., help="Run directory"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Checkpoints of a run: kind, step, size, whether complete, age."""
    import time  # noqa: PLC0415

    from hpcrl.jobs.run_lookup import find_run_dir  # noqa: PLC0415
    from hpcrl.logs.checkpoints import find_checkpoints  # noqa: PLC0415

    run_dir = find_run_dir(run, require_hpcrl=False)[0]
    now = time.time()
    cps = find_checkpoints(run_dir)
    rows = [_cp_row(c, run_dir, now) for c in cps]
    if as_json:
        print_json({"run_dir": str(run_dir), "checkpoints": rows, "total_bytes": sum(c.bytes for c in cps)})
        return
    if not cps:
        console.print(f"no checkpoints under {run_dir}")
        return
    t = table(f"Checkpoints in {run_dir}")
    for col in ("path", "kind", "step", "GiB", "complete", "age"):
        t.add_column(col, justify="right" if col in ("step", "GiB", "age") else "left")
    for r in rows:
        t.add_row(
            r["path"],
            r["kind"],
            str(r["step"]),
            f"{r['gib']:,.2f}",
            "yes" if r["complete"] else f"no: {r['why_incomplete']}",
            _age(r["age_s"]),
        )
    console.print(t)
    console.print(f"{len(cps)} checkpoints, {sum(c.bytes for c in cps) / GIB:,.1f} GiB")


@checkpoints_app.command("prune")
def checkpoints_prune(
    run: str = typer.Argument(..., help="Run directory"),
    keep: int = typer.Option(..., "--keep", help="Complete checkpoints to keep per series (newest first)"),
    yes: bool = typer.Option(False, "--yes", help="Delete; without it, only say what would be deleted"),
    recent_seconds: float = typer.Option(600.0, "--recent-seconds", help="Never touch one modified this recently"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Delete old checkpoints (dry run unless --yes); never the newest, an incomplete or a recent one."""
    import time  # noqa: PLC0415

    from hpcrl.jobs.run_lookup import find_run_dir  # noqa: PLC0415
    from hpcrl.logs.checkpoints import apply_prune, find_checkpoints, plan_prune  # noqa: PLC0415

    run_dir = find_run_dir(run, require_hpcrl=False)[0]
    now = time.time()
    plan = plan_prune(find_checkpoints(run_dir), keep, now, recent_seconds)
    deleted = apply_prune(plan, time.time, recent_seconds) if yes else []
    if as_json:
        print_json(
            {
                "run_dir": str(run_dir),
                "dry_run": not yes,
                "freed_bytes": plan.freed_bytes,
                "delete": [_cp_row(c, run_dir, now) for c in plan.delete],
                "deleted": [str(p.relative_to(run_dir)) for p in deleted],
                "keep": [{**_cp_row(c, run_dir, now), "reason": why} for c, why in plan.keep],
            }
        )
        return
    for c, why in plan.keep:
        console.print(f"keep    {c.path.relative_to(run_dir)}  ({why})", highlight=False)
    verb = "deleted" if yes else "would delete"
    for c in plan.delete:
        done = not yes or c.path in deleted
        console.print(
            f"{verb if done else 'skipped (changed)'}  {c.path.relative_to(run_dir)}  {c.bytes / GIB:,.2f} GiB",
            highlight=False,
        )
    if not plan.delete:
        console.print("nothing to prune")
    elif not yes:
        console.print(f"dry run: {plan.freed_bytes / GIB:,.1f} GiB would be freed; add --yes to delete")
    else:
        console.print(f"freed {sum(c.bytes for c in plan.delete if c.path in deleted) / GIB:,.1f} GiB")
