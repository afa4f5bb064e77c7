"""What `submit`, `runs`, `status`, `cancel` and `logs` return: the data each command's `--json` prints.

The CLI (hpcrl/cli/cmd_runs.py) prints these dicts, as JSON or as tables; the Python API (hpcrl/api)
returns them. One function per command, so the two cannot drift apart.
"""

from __future__ import annotations

import os
from typing import Sequence

from hpcrl.errors import HpcrlError
from hpcrl.jobs import lifecycle, submission
from hpcrl.jobs.registry import Registry, Run, default_path
from hpcrl.jobs.registry_place import existing
from hpcrl.jobs.run_dir import readable_chain
from hpcrl.planning.request import RunRequest

Where = str | os.PathLike | None


def submit(
    request: RunRequest,
    *,
    script: Where = None,
    run_dir: str | None = None,
    dry_run: bool = False,
    keep_exclusions: bool = False,
    registry: Where = None,
    given: Sequence[str] = (),
) -> dict:
    """Render the request (or take the rendered `script`), write the run dir, sbatch it, record the run.
    `given`: the request's options the caller set besides --cluster, refused with a script."""
    if script is not None:
        # --cluster names the cluster a rendered script was made for; every other option would render one.
        if given:
            raise HpcrlError(f"give either a rendered SCRIPT or {', '.join(given)}, not both")
        sub = submission.from_script(script, run_dir=run_dir, cluster=request.cluster)
    else:
        from hpcrl.jobs.run_script import build

        sub = submission.from_run_script(build(request))
    reg = Registry(registry, create=True)
    done = lifecycle.submit(reg, sub, dry_run=dry_run, keep_exclusions=keep_exclusions)
    return {
        "run_id": done.run_id,
        "job_id": done.job_id,
        "dry_run": dry_run,
        "script": str(done.script_path),
        "run_dir": str(sub.run_dir.path),
        "log": str(done.log_path) if done.log_path else None,
        "command": done.command,
        "registry": str(reg.path),
        "warnings": [*sub.warnings, *done.warnings],
    }


def run_data(r: Run) -> dict:
    """A run as `runs`/`status --json` print it: its registry row, chain counts, and each job's log and failure."""
    d = r.to_dict()
    try:
        rd = lifecycle.RunDir(r.run_dir)
        d["restarts"] = rd.restart_count() if rd.restarts.exists() else None
        d["failure_restarts"] = rd.failure_restart_count()
        d["excluded_nodes"] = rd.excluded_nodes()
        chain = readable_chain(rd)
        logs = {j["job_id"]: str(rd.log(j["job_id"])) for j in d["jobs"]}
    except (OSError, ValueError, TypeError) as exc:  # a row no command could have written: shown, marked, not a crash
        d.update(restarts=None, failure_restarts=0, excluded_nodes=[], damaged=f"run dir {r.run_dir!r}: {exc}")
        d["state"], d["reason"] = "damaged", f"registry row damaged: {exc}"
        for j in d["jobs"]:
            j.update(log=None, failure=None)
        return d
    for j in d["jobs"]:
        j["log"] = logs[j["job_id"]]
        ev = chain.get(j["job_id"])
        j["failure"] = (
            {"reason": ev.failure, "excluded": list(ev.blamed), "continued": ev.next_job is not None}
            if ev and ev.failure
            else None
        )
        j["stack_check"] = ev.stack if ev else None  # the job's stack check could not run, or warned
    return d


def _existing(registry: Where) -> Registry | None:
    """The registry, or None when none exists yet (a reading command creates none)."""
    return Registry(registry, create=False) if existing(default_path(registry)) else None


def runs(*, limit: int = 20, registry: Where = None) -> dict:
    """The recorded runs, newest first (`limit` 0: all); no Slurm query."""
    if limit < 0:
        raise HpcrlError(f"--limit {limit}: give 0 (all runs) or a positive number")
    reg = _existing(registry)
    listed = reg.list_runs(limit or None) if reg else []
    return {"registry": str(default_path(registry)), "runs": [run_data(r) for r in listed]}


def repair(*, registry: Where = None) -> dict:
    """Rebuild a damaged registry from what can be read; the damaged file is kept beside it, renamed."""
    from hpcrl.jobs.registry_repair import repair as repair_registry

    done = repair_registry(registry)
    return {
        "registry": str(done.path),
        "moved_to": str(done.moved_to) if done.moved_to else None,
        "runs": done.runs,
        "jobs": done.jobs,
        "jobs_dropped": done.jobs_dropped,
    }


def status(run: str | None = None, *, all_runs: bool = False, registry: Where = None) -> dict:
    """Refresh run states (one batched Slurm query, following the job chain): `run` (an id, a unique prefix
    or one of its job ids), else the live runs (`all_runs`: the ended ones too)."""
    reg = Registry(registry, create=False) if run else _existing(registry)
    if reg is None:
        return {"registry": str(default_path(registry)), "runs": []}
    found = [reg.find(run)] if run else reg.list_runs(None if all_runs else 50, live_only=not all_runs)
    return {"registry": str(reg.path), "runs": [run_data(r) for r in lifecycle.refresh(reg, found)]}


def cancel(run: str, *, registry: Where = None) -> dict:
    """Write the run's cancel marker (no continuation), then scancel its live jobs."""
    reg = Registry(registry, create=False)
    return {"cancel_requested": True, **run_data(lifecycle.cancel(reg, reg.find(run)))}


def with_jobs(run: str, registry: Where = None) -> Run:
    """The run a user named, refused when Slurm never had a job of it (a dry run, a failed sbatch)."""
    r = Registry(registry, create=False).find(run)
    if not r.jobs:
        raise HpcrlError(f"run {r.run_id} has no Slurm jobs ({r.state}" + (f": {r.reason})" if r.reason else ")"))
    return r


def logs(run: str, *, registry: Where = None) -> dict:
    """Every job's log of the run, in chain order, with why a log is missing."""
    r = with_jobs(run, registry)
    rd = lifecycle.RunDir(r.run_dir)
    return {
        "run_id": r.run_id,
        "jobs": [
            {
                "job_id": job_id,
                "log": str(rd.log(job_id)),
                "text": text,
                "missing": None if text else lifecycle.missing_log(r, job_id),
            }
            for job_id, text in lifecycle.logs(r)
        ],
    }


__all__ = ["cancel", "logs", "run_data", "runs", "status", "submit", "with_jobs"]
