"""The run directory: its paths and the job chain its `hpcrl/jobs.tsv` records (docs/run-dir.md).

Shared by the batch script (which appends the events), `submit` (which creates the directory)
and every command that reads a run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

from hpcrl import contract as C
from hpcrl.errors import RunDirUnreadable, SlurmError
from hpcrl.jobs import slurm
from hpcrl.jobs.registry import now


class RunDir:
    """Paths of one run directory (docs/run-dir.md; the names are hpcrl/contract.py's)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.meta = self.path / C.META
        self.script = self.meta / C.SCRIPT
        self.plan = self.meta / C.PLAN
        self.jobs_tsv = self.meta / C.JOBS_TSV
        self.restarts = self.meta / C.RESTARTS
        self.cancel = self.meta / C.CANCEL
        self.failure_restarts = self.meta / C.FAILURE_RESTARTS
        self.excluded = self.meta / C.EXCLUDED_NODES
        self.chain_lock = self.meta / C.CHAIN_LOCK

    def log(self, job_id: str) -> Path:
        return self.path / C.LOGS / C.JOB_LOG.format(job=job_id)

    def any_log(self, job_id: str) -> Path:
        """The job's log, else Slurm's own output file (a job that failed before its log began)."""
        log = self.log(job_id)
        slurm_out = self.path / C.LOGS / C.SLURM_LOG.format(job=job_id)
        return slurm_out if not log.exists() and slurm_out.exists() else log

    def create(self, mode: int | None = None) -> None:
        """The run directory and its sub-directories; with mode, the run directory and the ones
        holding logs and the Ray token get exactly that mode (the parents keep theirs)."""
        self.path.mkdir(parents=True, exist_ok=True)
        for sub in C.RUN_SUBDIRS:
            (self.path / sub).mkdir(exist_ok=True)
        if mode is not None:
            for d in (self.path, self.meta, self.path / C.LOGS):
                d.chmod(mode)

    def start_chain(self, script: str, plan: dict, *, overwrite_plan: bool, keep_exclusions: bool) -> None:
        """The script, the plan (kept when there is one and overwrite_plan is False), and a new
        chain's own record: no continuation counted, no node excluded (unless kept), no cancel marker."""
        # Every file submit writes is its owner's alone (sbatch reads the script; it needs no x bit).
        write_private(self.script, script)
        if overwrite_plan or not self.plan.exists():
            write_private(self.plan, json.dumps(plan, indent=2, sort_keys=True, default=str) + "\n")
        # A new chain gets its full max_restarts and max_failure_restarts.
        write_private(self.restarts, "0\n")
        write_private(self.failure_restarts, "0\n")
        if not keep_exclusions:
            self.excluded.unlink(missing_ok=True)
        self.cancel.unlink(missing_ok=True)  # a marker left by a cancelled earlier run would stop this one

    def append_event(self, job_id: str, event: str, detail: str = "-") -> None:
        # One short write in append mode: lines from the batch script and hpcrl never interleave.
        write_private(self.jobs_tsv, f"{job_id}\t{event}\t{now()}\t{detail}\n", append=True)

    def restart_count(self) -> int:
        return self._count(self.restarts)

    def failure_restart_count(self) -> int:
        return self._count(self.failure_restarts)

    def excluded_nodes(self) -> list[str]:
        """Nodes failure continuations excluded (hpcrl/excluded-nodes), in order, once each."""
        try:
            return list(dict.fromkeys(self.excluded.read_text().split()))
        except OSError:
            return []

    @staticmethod
    def _count(path: Path) -> int:
        try:
            return int(path.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0


def write_private(path: Path, text: str, *, append: bool = False) -> None:
    """Write (or append) text to a file only its owner can read, whatever the umask: the run dir is
    0700, but a file that leaves it (a copy, a moved run dir) keeps its own mode."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class JobEvents(NamedTuple):
    """What jobs.tsv says about one job."""

    start: str | None = None  # head node
    end_reason: str | None = None
    exit_code: int | None = None
    ended: str | None = None
    next_job: str | None = None
    next_submitted: str | None = None  # when this job submitted its continuation
    failure: str | None = None  # a failure continuation's reason (ray-start-failed, worker-died, ...)
    blamed: tuple[str, ...] = ()  # the nodes that continuation excludes
    stack: str | None = None  # the stack check's `stack` event: it could not run, or warned (contract.STACK_EVENT)


def read_chain(run_dir: RunDir) -> dict[str, JobEvents]:
    """jobs.tsv -> events per job id; malformed lines (a torn last line) are skipped."""
    from hpcrl.logs.report import failure_detail, read_events

    out: dict[str, JobEvents] = {}
    for job, event, stamp, detail in read_events(run_dir.jobs_tsv):
        ev = out.get(job, JobEvents())
        if event == "start":
            ev = ev._replace(start=detail)
        elif event == "end":
            reason, _, code = detail.partition(":")
            ev = ev._replace(
                end_reason=reason, exit_code=int(code) if code.lstrip("-").isdigit() else None, ended=stamp
            )
        elif event == "continue" and detail.isdigit():
            ev = ev._replace(next_job=detail, next_submitted=stamp)
        elif event == "failure":
            why, nodes = failure_detail(detail)
            ev = ev._replace(failure=why, blamed=tuple(nodes))
        elif event == C.STACK_EVENT and ev.stack is None:
            ev = ev._replace(stack=detail)
        out[job] = ev
    return out


def readable_chain(run_dir: RunDir) -> dict[str, JobEvents]:
    """read_chain, or no events when the run directory's file system fails (EIO): the jobs' ends
    then come from Slurm (their comment) and the reason from run_dir_problem."""
    try:
        return read_chain(run_dir)
    except (RunDirUnreadable, ValueError):  # ValueError: a damaged registry row's path (a NUL byte in it)
        return {}


def comment_end(job_id: str) -> JobEvents:
    """The end a job put in its Slurm comment when its run directory could not take it (none: no end)."""
    try:
        comment = slurm.job_comment(job_id)
    except SlurmError:
        return JobEvents()
    if not comment.startswith(C.END_COMMENT):
        return JobEvents()
    reason, _, code = comment[len(C.END_COMMENT) :].partition(":")
    return JobEvents(end_reason=reason, exit_code=int(code) if code.lstrip("-").isdigit() else None)


RAY_LOG_NAMES = (
    "raylet.out",
    "raylet.err",
    "gcs_server.out",
    "gcs_server.err",
    "dashboard_agent.log",
    "runtime_env_agent.log",
)


def kept_ray_logs(rd: RunDir, tail_lines: int = 300) -> list[tuple[str, str]]:
    """(path relative to the run dir, last lines) of the Ray logs the newest job kept per node in
    logs/ray/<job>/<node>/, and of its worker output files: what diagnose reads beside the driver's log."""
    root = rd.path / C.LOGS / "ray"
    jobs = (
        sorted((d for d in root.iterdir() if d.is_dir() and d.name.isdigit()), key=lambda d: int(d.name))
        if root.is_dir()
        else []
    )
    files: list[Path] = []
    if jobs:
        files += [
            f
            for node in sorted(jobs[-1].iterdir())
            if node.is_dir()
            for f in sorted(node.rglob("*"))
            if f.is_file() and (f.name in RAY_LOG_NAMES or f.suffix == ".err")
        ]
        files += sorted((rd.path / C.LOGS).glob(f"worker-*-{jobs[-1].name}.log"))
    out = []
    for f in files:
        try:
            lines = f.read_text(errors="replace").splitlines()[-tail_lines:]
        except OSError:
            continue
        out.append((str(f.relative_to(rd.path)), "\n".join(lines)))
    return out


def run_dir_problem(rd: RunDir) -> str | None:
    """Why the job cannot have written into its run directory: missing or not writable (a
    filesystem turned read-only, a quota, permissions); None when it can."""
    if not rd.path.is_dir():
        return "run-dir-missing"
    if not all(os.access(d, os.W_OK | os.X_OK) for d in (rd.path, rd.meta, rd.path / C.LOGS) if d.exists()):
        return C.RUN_DIR_UNWRITABLE
    try:  # a file system that fails (EIO) still answers stat and access: open a file
        os.close(os.open(rd.jobs_tsv, os.O_RDONLY))
    except FileNotFoundError:
        pass
    except OSError:
        return C.RUN_DIR_UNWRITABLE
    return None


__all__ = [
    "JobEvents",
    "RunDir",
    "comment_end",
    "kept_ray_logs",
    "write_private",
    "read_chain",
    "readable_chain",
    "run_dir_problem",
]
