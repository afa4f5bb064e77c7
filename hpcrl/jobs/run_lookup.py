"""Finding a run's directory from what a user types: a run id, a prefix, a job id or a path."""

from __future__ import annotations

from pathlib import Path

from hpcrl.errors import HpcrlError, RegistryError, SlurmError
from hpcrl.jobs import lifecycle
from hpcrl.jobs.registry import Registry, Run, default_path
from hpcrl.jobs.registry_place import existing


def find_run_dir(
    run: str, registry: Path | None = None, require_hpcrl: bool = True, refresh: bool = True
) -> tuple[Path, Run | None]:
    """(run directory, registry row or None) for a run id, id prefix, job id or run directory path; a live
    row is brought up to date from Slurm first unless `refresh` is False (a reader that writes nothing)."""

    path = Path(run).expanduser()
    row, reg = None, None
    if path.is_dir() or "/" in run or run.startswith((".", "~")):
        if not path.is_dir():
            raise HpcrlError(f"{run}: no such run directory (give a run directory or a run id; see hpcrl runs)")
        path = path.resolve()
        try:  # the directory's registry row, when there is one, adds Slurm's job states
            if default_path(registry).exists():
                reg = Registry(registry)
                row = next(
                    (r for r in reg.list_runs() if r.state != "dry-run" and Path(r.run_dir).resolve() == path), None
                )
        except RegistryError:
            row = None
    else:
        if not existing(default_path(registry)):  # a reading command creates no registry
            raise RegistryError(
                f"unknown run {run!r}: no registry at {default_path(registry)}, so no runs yet "
                "(hpcrl submit records runs); give a run directory instead"
            )
        reg = Registry(registry, create=False)
        row = reg.find(run)  # an unknown id: one line listing the recent runs
        if row.state == "dry-run":
            raise HpcrlError(f"run {row.run_id} is a dry run: nothing was submitted, there is nothing to report")
        path = Path(row.run_dir)
        if not path.is_dir():
            raise HpcrlError(f"run {row.run_id}: its run directory {path} does not exist (moved or deleted?)")
    if refresh and row is not None and reg is not None and row.live:
        try:
            row = lifecycle.refresh(reg, [row])[0]
        except SlurmError:
            pass  # no Slurm here: report what the files say
    if require_hpcrl and not (path / "hpcrl").is_dir():
        raise HpcrlError(f"{path}: not an hpcrl run directory (no hpcrl/ inside; docs/run-dir.md)")
    return path, row


def newest_live_run(registry: Path | None = None) -> str:
    """The id of the newest run the registry holds as live (as last recorded: no Slurm query, nothing written)."""
    path = default_path(registry)
    if not path.exists():
        raise RegistryError(
            f"no registry at {path}, so no runs yet (hpcrl submit records runs); give RUN: a run id or a run directory"
        )
    live = Registry(registry, create=False).list_runs(1, live_only=True)
    if not live:
        raise HpcrlError(f"no live run in {path} (hpcrl runs lists them all); give RUN: a run id or a run directory")
    return live[0].run_id
