"""A run's life: submit, follow the job chain, show its logs, cancel it.

The batch script and this module share one contract, docs/run-dir.md: the run directory
and its `hpcrl/jobs.tsv`, where every job of the chain records `start`, `end` (reason and
exit code) and `continue` (the next job's id). The registry is a cache of that file plus
what Slurm says; the file is the truth about reasons and continuations.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

from hpcrl.contract import COMPLETED, CRASHED, SLURM_STATE_REASONS
from hpcrl.errors import HpcrlError, RunDirUnreadable, SlurmError
from hpcrl.jobs import chain_lock, slurm
from hpcrl.jobs.path_safety import check_run_dir
from hpcrl.jobs.registry import Job, Registry, Run, dir_identity, now
from hpcrl.jobs.run_dir import (
    JobEvents,
    RunDir,
    comment_end,
    read_chain,
    readable_chain,
    run_dir_problem,
    write_private,
)
from hpcrl.jobs.submission import Submission

SUBMIT_STALE_S = 600  # a run still `submitting` after this long lost its submitting process


# --------------------------------------------------------------------------- submission


class Submitted(NamedTuple):
    run_id: str
    job_id: str | None
    script_path: Path
    log_path: Path | None
    command: list[str]
    warnings: tuple[str, ...] = ()  # the run root's, where the profile accepts a shared one


def submit(
    reg: Registry,
    sub: Submission,
    *,
    dry_run: bool = False,
    extra_args: list[str] | None = None,
    keep_exclusions: bool = False,
) -> Submitted:
    """Write the run dir, sbatch the script, record the run. Dry run: record only, touch no run dir.
    A new chain starts with no continuations counted and no node excluded; with keep_exclusions it
    keeps the nodes earlier chains excluded (and sbatch excludes them from its first job)."""
    extra = list(extra_args or [])
    command = ["sbatch", "--parsable", *extra, str(sub.run_dir.script)]
    # Before anything is recorded or written: a run root another user could steer is refused (the job
    # itself checks again at each start, continuations included).
    safety = check_run_dir(sub.run_dir.path, shared=sub.run_root_shared)
    if safety.problem:
        raise HpcrlError(safety.problem)
    _refresh_holders(reg, sub.run_dir.path)
    if dry_run:
        # The script goes next to the registry: a live run's job.sbatch must never be overwritten.
        out = reg.path.parent / "dry-run"
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HpcrlError(f"dry run: cannot make {out}: {exc.strerror or exc}; nothing recorded") from None
        # Refused as the real submit would be when a live run holds the run dir; a dry-run row holds nothing.
        run_id = reg.create_run(
            name=sub.name,
            cluster=sub.cluster,
            config_hash=sub.config_hash,
            script_path=str(sub.run_dir.script),
            run_dir=str(sub.run_dir.path),
            state="dry-run",
            max_restarts=sub.max_restarts,
            claim_run_dir=True,
        )
        path = out / f"{run_id}.sbatch"
        try:
            write_private(path, sub.script)
        except OSError as exc:
            reg.forget_run(run_id)  # a dry run that wrote nothing records nothing
            raise HpcrlError(f"dry run: cannot write {path}: {exc.strerror or exc}; nothing recorded") from None
        return Submitted(run_id, None, path, None, command, safety.warnings)
    slurm.require("sbatch")  # before anything is written: no run dir, no registry row
    # The run directory as the filesystem names it: two spellings (a symlink, `..`) are one run dir.
    rd = RunDir(os.path.realpath(sub.run_dir.path))
    # The registry row claims the run dir before anything is written into it: a second submit
    # into the same run dir at the same moment is refused instead of overwriting job.sbatch.
    run_id = reg.create_run(
        name=sub.name,
        cluster=sub.cluster,
        config_hash=sub.config_hash,
        script_path=str(rd.script),
        run_dir=str(rd.path),
        state="submitting",
        max_restarts=sub.max_restarts,
        claim_run_dir=True,
    )
    try:
        rd.create(sub.dir_mode)
        with chain_lock.held(rd) as lock:
            # Another registry's (or a hand sbatch's) live chain in this run dir: refused before any
            # of its files is touched.
            lock.refuse_live_owner()
            plan = sub.plan or {"plan": None, "script": sub.source, "note": "submitted as an already rendered script"}
            rd.start_chain(sub.script, plan, overwrite_plan=sub.plan is not None, keep_exclusions=keep_exclusions)
            if keep_exclusions and (excluded := rd.excluded_nodes()):
                extra = slurm.with_excluded(extra, excluded)
            job_id = slurm.submit(str(rd.script), extra)
            with contextlib.suppress(OSError):  # the job names itself at its start too
                lock.set_owner(job_id)
    except OSError as exc:
        reg.set_run(run_id, state="failed", reason=f"run dir: {exc.strerror}")
        raise HpcrlError(f"run dir {rd.path}: {exc.strerror} (run {run_id} recorded as failed)") from None
    except HpcrlError as exc:
        reg.set_run(run_id, state="failed", reason=str(exc))
        raise type(exc)(f"{exc} (run {run_id} recorded as failed)") from None
    # Recorded at once, job and state in one transaction; a job that cannot be recorded is
    # cancelled, so nothing runs that hpcrl does not know about.
    try:
        reg.add_job(run_id, job_id, run_state="pending")
    except HpcrlError as exc:
        raise HpcrlError(f"job {job_id} was queued but not recorded ({exc}); {_cancel_unrecorded(job_id)}") from None
    try:
        rd.append_event(job_id, "submitted")
    except OSError:
        pass  # the job writes its own start line; the registry has the job
    return Submitted(run_id, job_id, rd.script, rd.log(job_id), command, safety.warnings)


def _refresh_holders(reg: Registry, run_dir: str | os.PathLike) -> None:
    """Bring the runs recorded live in run_dir up to date from Slurm before the run dir is claimed:
    a job Slurm has ended no longer holds it, even if no `hpcrl status` has said so yet."""
    want = dir_identity(run_dir)
    held = [r for r in reg.list_runs(None, live_only=True) if dir_identity(r.run_dir).same(want)]
    if held:
        try:
            refresh(reg, held)
        except SlurmError:
            pass  # no Slurm to ask: the recorded state stands, and the claim names the holder


def _cancel_unrecorded(job_id: str) -> str:
    try:
        slurm.cancel(job_id)
    except SlurmError as exc:
        return f"scancel failed too ({exc}): cancel it yourself with scancel {job_id}"
    return "cancelled it so that nothing runs unrecorded"


# --------------------------------------------------------------------------- status


def _follow_chain(reg: Registry, run: Run, chain: dict[str, JobEvents]) -> Run:
    """Add continuation jobs named in jobs.tsv that the registry does not know yet."""
    known = {j.job_id for j in run.jobs}
    job = run.last_job.job_id if run.last_job else None
    added = False
    while job and (nxt := chain.get(job, JobEvents()).next_job) and nxt not in known:
        reg.add_job(run.run_id, nxt, submitted=chain[job].next_submitted)
        known.add(nxt)
        job, added = nxt, True
    return reg.get(run.run_id) if added else run


def _job_row(job: Job, state: slurm.JobState | None, ev: JobEvents, rd: RunDir | None = None) -> Job:
    new_state = state.state if state else job.state
    terminal = new_state not in slurm.LIVE_STATES
    if terminal and not ev.end_reason:
        ev = comment_end(job.job_id)
    if ev.end_reason:
        reason = ev.end_reason
    elif terminal:
        reason = SLURM_STATE_REASONS.get(new_state, new_state.lower())
        # No end line at all: a run dir the job could not write explains it better than "crashed".
        if rd is not None and reason in (CRASHED, "failed") and (problem := run_dir_problem(rd)):
            reason = problem
    else:
        reason = state.reason if state else job.reason  # Slurm's pending reason (Priority, ...)
    code = ev.exit_code if ev.exit_code is not None else (state.exit_code if state else job.exit_code)
    # COMPLETING: the batch script is over, Slurm waits for its processes (a cancelled job can stay
    # so for minutes): it has ended. Its own end line, when it wrote one, says when.
    done = terminal or new_state == "COMPLETING"
    ended = job.ended or ev.ended or (now() if done else None)
    return job._replace(state=new_state, reason=reason, exit_code=code, ended=ended)


def _run_state(run: Run, rd: RunDir) -> tuple[str, str]:
    last = run.last_job
    if last is None:
        return run.state, run.reason
    if last.state in slurm.PENDING_STATES:
        return "pending", last.reason
    if last.state in slurm.RUNNING_STATES:
        return "running", "cancelling" if rd.cancel.exists() else ""
    reason = last.reason or "unknown"
    if rd.cancel.exists() and reason != COMPLETED:
        reason = "cancelled"
    return "ended", reason


def _age_s(stamp: str) -> float:
    try:
        then = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return 0.0
    return (datetime.now(timezone.utc) - then).total_seconds()


def refresh(reg: Registry, runs: list[Run]) -> list[Run]:
    """Bring live runs up to date: chain from jobs.tsv, states from ONE batched Slurm query."""
    stale = [r for r in runs if r.state == "submitting" and not r.jobs and _age_s(r.created) > SUBMIT_STALE_S]
    for r in stale:  # the submitting process died between recording the run and sbatch returning
        reg.set_run(r.run_id, state="failed", reason="submit interrupted before sbatch returned a job id")
    if stale:
        runs = [reg.get(r.run_id) if r in stale else r for r in runs]
    live = [r for r in runs if r.live and r.jobs]
    if not live:
        return runs
    live = [_follow_chain(reg, r, readable_chain(RunDir(r.run_dir))) for r in live]
    ids = [j.job_id for r in live for j in r.jobs if j.state in slurm.LIVE_STATES]
    states = slurm.job_states(ids)
    updated: dict[str, Run] = {}
    for run in live:
        rd = RunDir(run.run_dir)
        # Read again after the query: a job that just ended may have written `continue` meanwhile.
        chain = readable_chain(rd)
        rows = [
            _job_row(j, states.get(j.job_id), chain.get(j.job_id, JobEvents()), rd)
            for j in run.jobs
            if j.job_id in states
        ]
        reg.update_jobs(rows)
        run = _follow_chain(reg, reg.get(run.run_id), chain)
        state, reason = _run_state(run, rd)
        if (state, reason) != (run.state, run.reason):
            reg.set_run(run.run_id, state=state, reason=reason)
        updated[run.run_id] = reg.get(run.run_id)
    return [updated.get(r.run_id, r) for r in runs]


# --------------------------------------------------------------------------- cancel


def cancel(reg: Registry, run: Run) -> Run:
    """Write the cancel marker (no continuation), then scancel every live job of the run."""
    if not run.live:
        raise HpcrlError(
            f"run {run.run_id} is {run.state}" + (f" ({run.reason})" if run.reason else "") + "; nothing to cancel"
        )
    rd = RunDir(run.run_dir)
    slurm.require("scancel")
    try:
        write_private(rd.cancel, f"{now()}\n")
    except OSError as exc:
        raise HpcrlError(f"cannot write {rd.cancel}: {exc.strerror}") from None
    run = _follow_chain(reg, run, readable_chain(rd))
    cancelled = 0
    for job in run.jobs:
        if job.state in slurm.LIVE_STATES:
            try:
                slurm.cancel(job.job_id)
            except SlurmError as exc:
                if not cancelled:
                    # Nothing was cancelled: the marker must not turn a later preemption into a cancel.
                    rd.cancel.unlink(missing_ok=True)
                    raise SlurmError(
                        f"{exc}; nothing was cancelled (run {run.run_id} is as it was): try again when Slurm answers"
                    ) from None
                raise SlurmError(
                    f"{exc}; job {job.job_id} was not cancelled, the earlier jobs were: "
                    f"try `hpcrl cancel {run.run_id}` again when Slurm answers"
                ) from None
            cancelled += 1
    reg.set_run(run.run_id, reason="cancelled")
    return refresh(reg, [reg.get(run.run_id)])[0]


# --------------------------------------------------------------------------- logs


def _chain_ids(run: Run, chain: dict[str, JobEvents]) -> list[str]:
    ids = [j.job_id for j in run.jobs]
    while ids and (nxt := chain.get(ids[-1], JobEvents()).next_job) and nxt not in ids:
        ids.append(nxt)
    return ids


def missing_log(run: Run, job_id: str) -> str | None:
    """Why a job of the run has no log to show, in words; None when it has one."""
    rd = RunDir(run.run_dir)
    path = rd.any_log(job_id)
    if path.exists():
        return None
    problem = run_dir_problem(rd)
    if problem == "run-dir-missing":
        return f"no log: the run directory {rd.path} does not exist (moved or deleted?)"
    if problem == "run-dir-unwritable":
        return f"no log: the job could not write {path}: the run directory {rd.path} is not writable"
    return f"no log yet at {path}"


def logs(run: Run) -> Iterator[tuple[str, str]]:
    """(job id, log text) of every job of the run, in chain order."""
    rd = RunDir(run.run_dir)
    yield from _read_logs(rd, _chain_ids(run, read_chain(rd)))


def _read_logs(rd: RunDir, ids: list[str]) -> Iterator[tuple[str, str]]:
    for jid in ids:
        path = rd.any_log(jid)
        try:
            yield jid, path.read_text(errors="replace") if path.exists() else ""
        except OSError as exc:  # EIO under the log: the run's reason in one line, not a traceback
            raise RunDirUnreadable(path, exc) from None


def follow(run: Run, *, poll_s: float = 1.0, slurm_every_s: float = 30.0) -> Iterator[tuple[str, str]]:
    """Yield (job id, new text) as the logs grow, across continuations, until the run ends.

    Slurm is asked only about the newest job, and at most every `slurm_every_s` seconds unless
    its `end` line appeared (then the question is only whether a continuation follows).
    """
    rd = RunDir(run.run_dir)
    ids = _chain_ids(run, read_chain(rd))
    for jid, text in _read_logs(rd, ids[:-1]):
        yield jid, text
    if not ids:
        return
    current, offset, next_ask = ids[-1], 0, 0.0

    def drain() -> bytes:
        path = rd.log(current)
        if not path.exists():
            return b""
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read()
        except OSError as exc:
            raise RunDirUnreadable(path, exc) from None

    while True:
        data = drain()
        if data:
            offset += len(data)
            yield current, data.decode(errors="replace")
        ev = read_chain(rd).get(current, JobEvents())
        if ev.next_job:
            current, offset = ev.next_job, 0
            yield current, ""  # tells the caller a new job's log begins
            continue
        if time.monotonic() >= next_ask:
            st = slurm.job_states([current])[current]
            if st.terminal and not read_chain(rd).get(current, JobEvents()).next_job:
                rest = drain()  # the last lines written before the job ended
                if rest:
                    yield current, rest.decode(errors="replace")
                return
            # After its `end` line a job only has to exit or name its continuation: ask again soon.
            next_ask = time.monotonic() + (max(poll_s, 2.0) if ev.end_reason else slurm_every_s)
        time.sleep(poll_s)


__all__ = [
    "JobEvents",
    "RunDir",
    "Submitted",
    "cancel",
    "follow",
    "logs",
    "missing_log",
    "read_chain",
    "refresh",
    "run_dir_problem",
    "submit",
]
